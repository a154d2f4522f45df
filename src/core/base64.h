/* base64.h — RFC 4648 base64 decoding (the standard alphabet, '=' padding), for audio and other
 * binary content that JSON requests carry as text.
 *
 * Strict: the length must be a multiple of 4 and padding may appear only at the end; anything else
 * is refused with the offset of the first bad character, so a corrupted upload is reported, never
 * silently decoded to different bytes. */
#ifndef CAIRN_BASE64_H
#define CAIRN_BASE64_H

#include <stddef.h>

/* *out is malloc'd (caller frees), *outlen its size. -1 + err on bad input or out of memory. */
int base64_decode(const char *s, size_t len, unsigned char **out, size_t *outlen, char *err, size_t errlen);

#endif
