/* persist.h — `--kv-dir DIR`: each slot's state survives an engine restart.
 *
 * After every turn the slot's full snapshot (rows included) is written to DIR/slot-N.cairnkv
 * through a temporary file and rename(2), so a reader sees the old file or the new one, never a
 * mix. The file format is snapshot_write's: versioned header, model fingerprint, layout hash,
 * payload checksum, record length written last. On start-up a file that is truncated, from
 * another model or shape, or corrupt is ignored with a log line: never trusted, never fatal.
 */
#ifndef CAIRN_PERSIST_H
#define CAIRN_PERSIST_H

#include <stddef.h>
#include <stdint.h>

#include "state.h"

/* Save s for slot. A state that is not usable (tainted) or empty removes the file instead, so a
 * restart never resumes something the engine itself stopped trusting. */
int persist_save(const char *dir, int slot, const state *s, uint64_t fingerprint, char *err, size_t errlen);
/* 1: s now holds the saved state; 0: no file; -1: file refused (err says why), s unchanged. */
int persist_load(const char *dir, int slot, state *s, uint64_t fingerprint, char *err, size_t errlen);

#endif
