/* tokenizer.h — Hugging Face `tokenizer.json` (byte-level BPE) encode/decode.
 *
 * Supports what the four families ship: `added_tokens` (special and normal) matched before
 * everything else, a normalizer (none / NFC passthrough where declared), the pre_tokenizer
 * `Sequence` of `Split` (regex with Unicode classes, via PCRE2) and `ByteLevel`, BPE `merges`
 * (both "a b" strings and [a, b] pairs), `byte_fallback` and `ignore_merges` where declared,
 * and the ByteLevel decoder.
 *
 * INVARIANT: tok_encode produces exactly the ids that the reference `@huggingface/tokenizers`
 * produces for the same tokenizer.json and text (tests/test_tokenizer_parity.* checks it), with
 * no BOS/post-processor added (callers add template tokens themselves).
 */
#ifndef CAIRN_TOKENIZER_H
#define CAIRN_TOKENIZER_H

#include <stddef.h>

typedef struct tokenizer tokenizer;

tokenizer *tok_load(const char *path, char *err, size_t errlen);   /* path to tokenizer.json */
/* The same from the file's text (len bytes); name is for messages. */
tokenizer *tok_load_text(const char *text, size_t len, const char *name, char *err, size_t errlen);
void tok_free(tokenizer *t);

int tok_vocab_size(const tokenizer *t);      /* largest id + 1 */
/* Encode n bytes of UTF-8 text. Returns the number of ids (may exceed max: then only max were
 * written, and the caller can retry with a larger buffer), or -1 with err. */
int tok_encode(const tokenizer *t, const char *text, size_t n, int *ids, int max, char *err, size_t errlen);
/* Encode with special tokens treated as plain text (Hugging Face's split_special_tokens=True). */
int tok_encode_plain(const tokenizer *t, const char *text, size_t n, int *ids, int max, char *err, size_t errlen);

/* A byte range [start, start + len) of a text. */
typedef struct {
    size_t start, len;
} tok_span;
/* Encode a chat prompt whose untrusted spans (message content, names, tool results: anything a
 * client wrote) must not become control tokens: no added token, special or not, matches if any of
 * its bytes lies in an untrusted span (official tokenizers mark some role markers non-special,
 * so special-only would not protect them). Text is otherwise cut exactly as tok_encode cuts it,
 * so a prompt whose untrusted text holds no added-token text gets the same ids as tok_encode.
 * Spans must be non-empty and ascending without overlap (else -1); parts past n are ignored. */
int tok_encode_untrusted(const tokenizer *t, const char *text, size_t n, const tok_span *untrusted, int nuntrusted,
                         int *ids, int max, char *err, size_t errlen);
int tok_id(const tokenizer *t, const char *token);          /* exact vocab/added token lookup, -1 if absent */
const char *tok_piece(const tokenizer *t, int id);          /* raw vocab string (byte-level alphabet) */
int tok_is_special(const tokenizer *t, int id);
/* The added tokens (special or not) as they appear in text, i in [0, tok_added_count). */
int tok_added_count(const tokenizer *t);
const char *tok_added_text(const tokenizer *t, int i);
size_t tok_max_token_bytes(const tokenizer *t);             /* longest decoded token, in bytes */

/* Streaming decoder: feed ids one at a time, get the bytes they add. Bytes are produced as soon
 * as they are known; a multibyte UTF-8 character whose bytes span several tokens comes out whole
 * once complete (so every chunk it returns is valid UTF-8 unless the model itself emits invalid
 * bytes, which are passed through at finish). */
typedef struct {
    const tokenizer *t;
    unsigned char pending[8];
    int npending;
} tok_stream;
void tok_stream_init(tok_stream *s, const tokenizer *t);
/* Appends the decoded bytes of id to out (capacity cap); returns bytes written. A cap of
 * tok_max_token_bytes(t) + 4 always suffices (one token plus up to 3 held bytes); bytes beyond
 * cap are dropped. */
size_t tok_stream_put(tok_stream *s, int id, char *out, size_t cap);
size_t tok_stream_finish(tok_stream *s, char *out, size_t cap);
/* Decode a whole id sequence (heap string, NUL-terminated; *len gets the byte count). */
char *tok_decode(const tokenizer *t, const int *ids, int n, size_t *len);

#endif
