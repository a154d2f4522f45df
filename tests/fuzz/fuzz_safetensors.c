/* fuzz_safetensors — st_open on a checkpoint directory whose shard (and index) come from the
 * input: the safetensors header parser, offset/overlap checks, the index weight_map, and the
 * fingerprint. A bad file is refused with a message; every tensor of a file that opens lies in
 * its mapping with nbytes == numel * dtype size (checked here by reading its first and last byte).
 *
 * Input: byte 0 bit 0 = with index; then (index mode) a 2-byte little-endian index length, the
 * index JSON, and the rest is the shard. Files go to a private directory under $TMPDIR (or /tmp). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/safetensors.h"

static char dir[256];
static volatile unsigned char sink;   /* keeps the tensor reads */

static void put(const char *name, const uint8_t *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f)) abort();
}

static void drop(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
}

static void cleanup(void) {
    static const char *names[] = {"config.json", "model.safetensors", "model-00001-of-00001.safetensors",
                                  "model.safetensors.index.json"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) drop(names[i]);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/cairn-fuzz-st-%d", tmp ? tmp : "/tmp", (int)getpid());
    if (mkdtemp(strcat(dir, "-XXXXXX")) == NULL) abort();
    put("config.json", (const uint8_t *)"{}", 2);
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int with_index = data[0] & 1;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    drop("model.safetensors");
    drop("model-00001-of-00001.safetensors");
    drop("model.safetensors.index.json");
    if (with_index) {
        if (n < 2) return 0;
        size_t il = (size_t)(p[0] | p[1] << 8);
        p += 2, n -= 2;
        if (il > n) il = n;
        put("model.safetensors.index.json", p, il);
        put("model-00001-of-00001.safetensors", p + il, n - il);
    } else {
        put("model.safetensors", p, n);
    }
    char err[512];
    st_file *f = st_open(dir, 0, err, sizeof err);
    if (!f) return 0;
    for (int i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_at(f, i);
        if (t->nbytes) sink ^= ((const unsigned char *)t->data)[0] ^ ((const unsigned char *)t->data)[t->nbytes - 1];
        if (st_find(f, t->name) != t) abort();
        st_expect(f, t->name, DT_BF16, 1, (const int64_t[]){1}, err, sizeof err);
    }
    st_fingerprint(f);
    st_close(f);
    return 0;
}
