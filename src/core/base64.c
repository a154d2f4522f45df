/* base64.c — strict RFC 4648 decoding (base64.h). */
#include "base64.h"

#include <stdlib.h>

#include "util.h"

static int sextet(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

int base64_decode(const char *s, size_t len, unsigned char **out, size_t *outlen, char *err, size_t errlen) {
    *out = NULL;
    *outlen = 0;
    if (len % 4) return errf(err, errlen, "base64: length %zu is not a multiple of 4", len);
    size_t pad = len && s[len - 1] == '=' ? (len > 1 && s[len - 2] == '=' ? 2 : 1) : 0;
    unsigned char *buf = malloc(len / 4 * 3 + 1);
    if (!buf) return errf(err, errlen, "base64: out of memory for %zu bytes", len / 4 * 3);
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        unsigned v = 0;
        for (size_t j = 0; j < 4; j++) {
            int x = i + j >= len - pad ? 0 : sextet((unsigned char)s[i + j]);
            if (x < 0) {
                free(buf);
                return errf(err, errlen, "base64: invalid character 0x%02x at offset %zu", (unsigned char)s[i + j],
                            i + j);
            }
            v = v << 6 | (unsigned)x;
        }
        buf[o++] = (unsigned char)(v >> 16);
        buf[o++] = (unsigned char)(v >> 8);
        buf[o++] = (unsigned char)v;
    }
    *out = buf;
    *outlen = o - pad;
    return 0;
}
