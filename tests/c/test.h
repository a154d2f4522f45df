/* test.h — the whole C test framework: CHECK prints a FAIL line with the condition and location
 * and counts it; TEST_END prints "N passed, N failed" and returns the exit code. */
#ifndef CAIRN_TEST_H
#define CAIRN_TEST_H

#include <stdio.h>

static int test_passed, test_failed;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (cond) test_passed++;                                              \
        else {                                                                \
            test_failed++;                                                    \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);            \
            printf(__VA_ARGS__);                                              \
            printf("\n");                                                     \
        }                                                                     \
    } while (0)

#define TEST_END()                                                            \
    (printf("%d passed, %d failed\n", test_passed, test_failed), test_failed ? 1 : 0)

#endif
