#include "malloc_tune.h"

#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/util.h"

#define TCACHE_TUNABLE "glibc.malloc.tcache_count"
/* GLIBC_TUNABLES as the user set it ("" = unset), carried across the re-execution so that the
 * engine child gets it back. */
#define SAVED_TUNABLES "CAIRN_SERVE_SAVED_GLIBC_TUNABLES"

static void restore_tunables(const char *saved) {
    if (*saved) setenv("GLIBC_TUNABLES", saved, 1);
    else unsetenv("GLIBC_TUNABLES");
}

void malloc_tune_exec(int argc, char **argv) {
    const char *saved = getenv(SAVED_TUNABLES);
    if (saved) {                        /* the re-executed run: glibc has read the tunable */
        char *user = xstrdup(saved);
        restore_tunables(user);
        unsetenv(SAVED_TUNABLES);
        free(user);
        return;
    }
    const char *set = getenv("GLIBC_TUNABLES");
    if (set && strstr(set, TCACHE_TUNABLE "=")) return;
    char *user = xstrdup(set ? set : "");
    size_t n = strlen(user) + sizeof ":" TCACHE_TUNABLE "=0";
    char *tuned = xcalloc(n, 1);
    snprintf(tuned, n, "%s%s" TCACHE_TUNABLE "=0", user, *user ? ":" : "");
    char **again = xcalloc((size_t)argc + 2, sizeof *again);
    again[0] = program_invocation_name;
    memcpy(again + 1, argv, (size_t)argc * sizeof *argv);
    setenv(SAVED_TUNABLES, user, 1);
    setenv("GLIBC_TUNABLES", tuned, 1);
    execv("/proc/self/exe", again);
    fprintf(stderr, "cairn serve: cannot run again with glibc's per-thread malloc cache off (/proc/self/exe: %s); "
            "going on with it on, which holds more memory under many connections\n", strerror(errno));
    unsetenv(SAVED_TUNABLES);
    restore_tunables(user);
    free(again);
    free(tuned);
    free(user);
}

void malloc_tune_process(void) { mallopt(M_ARENA_MAX, 1); }
