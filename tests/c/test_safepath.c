/* test_safepath.c — request-given file names stay inside their directory: traversal, absolute
 * paths, separators, hidden names and symlinks are refused; plain names open and create. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/safepath.h"
#include "test.h"

static void test_names(void) {
    char err[256];
    const char *bad[] = {"", "..", ".", "../x", "../../etc/passwd", "/etc/passwd", "a/b", ".hidden", "a\\b", "a b",
                         "x\n", "caf\xc3\xa9", "%2e%2e"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(safe_name_ok(bad[i], err, sizeof err) < 0 && err[0], "'%s' refused", bad[i]);
    char longname[SAFE_NAME_MAX + 2];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    CHECK(safe_name_ok(longname, err, sizeof err) < 0, "a name over %d bytes is refused", SAFE_NAME_MAX);
    longname[SAFE_NAME_MAX] = 0;
    CHECK(safe_name_ok(longname, err, sizeof err) == 0, "%d bytes are fine", SAFE_NAME_MAX);
    const char *good[] = {"slot-1.bin", "a", "chat_2024.state", "A.B-C_d"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        CHECK(safe_name_ok(good[i], err, sizeof err) == 0, "'%s' accepted: %s", good[i], err);
}

static void test_open(void) {
    char dir[] = "/tmp/cairn-safepath-XXXXXX", path[256], err[256];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    int fd = safe_open_in(dir, "new.state", O_WRONLY | O_CREAT | O_EXCL, 0600, err, sizeof err);
    CHECK(fd >= 0, "create: %s", err);
    if (fd >= 0) CHECK(write(fd, "x", 1) == 1 && close(fd) == 0, "write");
    snprintf(path, sizeof path, "%s/new.state", dir);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600, "created inside dir with mode 0600");
    fd = safe_open_in(dir, "new.state", O_RDONLY, 0, err, sizeof err);
    CHECK(fd >= 0, "reopen: %s", err);
    if (fd >= 0) close(fd);
    char link[300];
    snprintf(link, sizeof link, "%s/evil", dir);
    CHECK(symlink("/etc/passwd", link) == 0, "symlink");
    CHECK(safe_open_in(dir, "evil", O_RDONLY, 0, err, sizeof err) < 0 && strstr(err, "symbolic link"),
          "a symlink inside the directory is refused: %s", err);
    CHECK(safe_open_in(dir, "evil", O_WRONLY | O_CREAT | O_TRUNC, 0600, err, sizeof err) < 0,
          "a symlink is not followed for writing either");
    char sub[300];
    snprintf(sub, sizeof sub, "%s/sub", dir);
    CHECK(mkdir(sub, 0700) == 0, "mkdir");
    CHECK(safe_open_in(dir, "sub", O_RDONLY, 0, err, sizeof err) < 0, "a directory is not a file: %s", err);
    CHECK(safe_open_in(dir, "../etc", O_RDONLY, 0, err, sizeof err) < 0, "traversal refused before any open");
    CHECK(safe_open_in(dir, "missing", O_RDONLY, 0, err, sizeof err) < 0 && strstr(err, "missing"), "missing: %s", err);
    unlink(link);
    unlink(path);
    rmdir(sub);
    rmdir(dir);
}

int main(void) {
    test_names();
    test_open();
    return TEST_END();
}
