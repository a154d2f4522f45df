/* safepath.c — see safepath.h. */
#include "safepath.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

int safe_name_ok(const char *name, char *err, size_t errlen) {
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > SAFE_NAME_MAX)
        return errf(err, errlen, "file name must be 1 to %d characters", SAFE_NAME_MAX);
    if (name[0] == '.') return errf(err, errlen, "file name '%s' must not start with '.'", name);
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                 c == '-';
        if (!ok) return errf(err, errlen, "file name '%.*s' may only hold letters, digits, '.', '_' and '-'", (int)n, name);
    }
    return 0;
}

int safe_open_in(const char *dir, const char *name, int flags, mode_t mode, char *err, size_t errlen) {
    if (safe_name_ok(name, err, errlen)) return -1;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return errf(err, errlen, "cannot open directory %s: %s", dir, strerror(errno));
    int fd = openat(dfd, name, flags | O_NOFOLLOW | O_CLOEXEC, mode);
    int e = errno;
    close(dfd);
    if (fd < 0)
        return errf(err, errlen, "%s: %s", name, e == ELOOP ? "is a symbolic link" : strerror(e));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return errf(err, errlen, "%s is not a regular file", name);
    }
    return fd;
}
