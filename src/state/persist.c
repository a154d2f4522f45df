/* persist.c — slot files for --kv-dir (see persist.h). */
#include "persist.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../core/util.h"

static void slot_path(char *out, size_t cap, const char *dir, int slot, const char *suffix) {
    snprintf(out, cap, "%s/slot-%d.cairnkv%s", dir, slot, suffix);
}

int persist_save(const char *dir, int slot, const state *s, uint64_t fingerprint, char *err, size_t errlen) {
    char path[4096], tmp[4200];
    slot_path(path, sizeof path, dir, slot, "");
    if (!state_usable(s) || s->len == 0) {
        if (unlink(path) && errno != ENOENT) return errf(err, errlen, "cannot remove %s: %s", path, strerror(errno));
        return 0;
    }
    snapshot *snap = state_snapshot(s, 1);
    if (!snap) return errf(err, errlen, "out of memory snapshotting slot %d", slot);
    slot_path(tmp, sizeof tmp, dir, slot, ".tmp");
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        snapshot_free(snap);
        return errf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
    }
    int rc = snapshot_write(snap, fingerprint, f, err, errlen);
    snapshot_free(snap);
    if (rc == 0 && fsync(fileno(f))) rc = errf(err, errlen, "fsync %s: %s", tmp, strerror(errno));
    if (fclose(f) && rc == 0) rc = errf(err, errlen, "closing %s: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path)) rc = errf(err, errlen, "rename %s -> %s: %s", tmp, path, strerror(errno));
    if (rc) unlink(tmp);
    return rc;
}

int persist_load(const char *dir, int slot, state *s, uint64_t fingerprint, char *err, size_t errlen) {
    char path[4096];
    slot_path(path, sizeof path, dir, slot, "");
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return 0;
        return errf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    }
    char why[256];
    snapshot *snap = snapshot_read(f, fingerprint, why, sizeof why);
    fclose(f);
    if (!snap) return errf(err, errlen, "%s: %s", path, why);
    int rc = state_restore(s, snap);
    snapshot_free(snap);
    if (rc != STATE_OK) return errf(err, errlen, "%s: saved state does not fit this model's shape (context size or layout)", path);
    return 1;
}
