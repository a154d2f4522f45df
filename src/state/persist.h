/* persist.h — `--kv-dir DIR`: each slot's state survives an engine restart, and a turn costs
 * only the bytes of the positions it added.
 *
 * THE FILES (mode 0600: they hold conversations; these names, and each one's .tmp, are all that
 * is ever written in DIR). DIR/slot-N.cairnkv holds the slot's ROWS parts append-only, one RECORD per position
 * in order:
 *     int32 id | the ROWS rows completed at this position | uint64 chain
 * A span-1 part contributes a row at every position; a span-r part the row that position pos
 * completes, i.e. when (pos+1) % r == 0. `chain` is the running FNV-1a checksum of every record
 * so far, seeded by the file's identity block (magic, version, model fingerprint, layout hash),
 * so any prefix of the records is checksummed on its own. The record layout is a function of the
 * part layout, which the layout hash names. The header ends with the COMMIT pair (count, chain of
 * record count-1), written only after the appended records are fsync'ed: a write torn anywhere
 * reads as the previous count. Rows are functions of the ids before them, so the first count
 * records are a complete all-ROWS state of count positions.
 *
 * What cannot be appended — RING slots, RECUR summaries, the partly filled last row of a span-r
 * part — goes to the TAIL file DIR/slot-N.cairnkv.tail, rewritten through a temporary file and
 * rename(2) after the rows are durable. It is tagged with the length L it belongs to and the
 * chain value at L-1, which binds it to exactly those ids and rows. Loading resumes at L (rows
 * past it are ignored), or at count when the layout needs no tail there. A state with RING or
 * RECUR parts and no matching tail file does not resume.
 *
 * CHECKPOINTS: DIR/slot-N.cairnkv.ckpt holds the deepest PERSIST_CHECKPOINTS light checkpoints
 * (state.h snapshots without rows: RING and RECUR parts at a turn boundary) the slot made and its
 * record still holds, so a restarted slot of a state that cannot truncate can still rewind to
 * them (an edited or regenerated turn). Rewritten whole after each save (temporary file, fsync,
 * rename); each checkpoint carries snapshot_write's own fingerprint, layout hash and checksum,
 * and loading puts them back into the store only if every one verifies and is a prefix of the
 * resumed record (state_restore checks that again before using one).
 *
 * A TURN: the module remembers, per slot, the ids and chain values of the records it wrote or
 * loaded (12 bytes a position). Saving finds the common prefix k of those ids and the state's
 * record; if the state diverged below the file's count, the commit drops to k first (fsync'ed
 * before anything is overwritten); then records k..len-1 are appended and committed. That
 * memory is trusted only while the file is the one it last left (device, inode, size); otherwise,
 * and for a slot this process has not loaded, the file is rewritten from scratch once.
 *
 * INVARIANTS
 *  - At every instant of a save (a crash can stop it anywhere), the files load as the old state,
 *    the new one, or — while diverged records are being overwritten — their common prefix; or
 *    load refuses them. Never as a mix of two histories.
 *  - Load verifies magic, version, fingerprint, layout, every record's chain, ids >= 0, and the
 *    tail's length, chain and checksum. Anything wrong: refused with a one-line reason, the state
 *    still empty. A persisted file is never trusted, never fatal.
 *  - A state that is tainted or empty removes both files.
 * One thread saves and loads (the engine's); the per-slot memory is not locked.
 */
#ifndef CAIRN_PERSIST_H
#define CAIRN_PERSIST_H

#include <stddef.h>
#include <stdint.h>

#include "state.h"
#include "store.h"

#define PERSIST_CHECKPOINTS 4    /* checkpoints kept beside each slot */

/* Save s for slot: append what the file lacks, then rewrite the tail file if the layout has one. */
int persist_save(const char *dir, int slot, const state *s, uint64_t fingerprint, char *err, size_t errlen);
/* Load slot's files into s, which must be empty (len 0): its rows are then garbage, so records
 * stream straight into the part buffers with no second copy of a possibly huge state.
 * 1: s now holds the saved state; 0: nothing saved; -1: refused (err says why), s still empty. */
int persist_load(const char *dir, int slot, state *s, uint64_t fingerprint, char *err, size_t errlen);
/* After persist_save: rewrite slot's checkpoint file from cs (owner slot, held by s's record;
 * cs NULL or none held: the file is removed). */
int persist_save_checkpoints(const char *dir, int slot, const store *cs, const state *s, uint64_t fingerprint,
                             char *err, size_t errlen);
/* After persist_load resumed slot into s: put its saved checkpoints back into cs. Returns how many
 * the store kept; 0 when there is no file; -1 with err when the file is refused (nothing kept). */
int persist_load_checkpoints(const char *dir, int slot, store *cs, const state *s, uint64_t fingerprint, char *err,
                             size_t errlen);
/* Forget what this process knows about slot files (frees it). The next save of each slot
 * rewrites its file from scratch, as after a restart. */
void persist_forget(void);

#endif
