/* safepath.h — file names that come from a request (slot save/restore), resolved inside one
 * directory and never outside it.
 *
 * A name is accepted only as a plain file name: 1..128 bytes of [A-Za-z0-9._-] that does not
 * start with '.'; so "../x", "/etc/passwd", "a/b", "." , ".." and "" are refused before the file
 * system is touched. The file is then opened relative to the directory's descriptor with
 * O_NOFOLLOW, so a symlink planted in the directory (pointing anywhere) is refused as well, and
 * renaming the directory's parents meanwhile cannot redirect the open. Errors name the file and
 * say why, so the HTTP layer can answer 400 with them.
 */
#ifndef CAIRN_SAFEPATH_H
#define CAIRN_SAFEPATH_H

#include <stddef.h>
#include <sys/types.h>

enum { SAFE_NAME_MAX = 128 };

/* 0 if name is a plain file name as above, else -1 with err. */
int safe_name_ok(const char *name, char *err, size_t errlen);
/* open(2) of dir/name with flags (O_NOFOLLOW | O_CLOEXEC added; new files get mode) after
 * safe_name_ok: the descriptor, or -1 with err (a symlink is "is a symbolic link"; a directory
 * or other non-regular file is refused too). */
int safe_open_in(const char *dir, const char *name, int flags, mode_t mode, char *err, size_t errlen);

#endif
