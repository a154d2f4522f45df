/* tokenizer.c — Hugging Face tokenizer.json: added tokens, Split/ByteLevel pre-tokenizers, BPE.
 *
 * Encoding follows the reference pipeline step by step, because parity is defined as "the same
 * ids as @huggingface/tokenizers", and every shortcut that changes where text is cut changes ids:
 *   1. added tokens are cut out first (leftmost-longest; tokens with normalized=false in a first
 *      pass, normalized=true ones in a second pass over what is left, as the reference does);
 *   2. the normalizer runs on the remaining text (only no-op normalizers and NFC are accepted;
 *      NFC is treated as a passthrough, i.e. input text is assumed to already be NFC, which is
 *      what clients send in practice; a file with any other normalizer is refused at load);
 *   3. each pre-tokenizer Split cuts every current piece with its regex (PCRE2, UTF + UCP) and
 *      recombines the parts by its behavior; ByteLevel optionally adds a prefix space and cuts
 *      with the GPT-2 regex, then maps bytes to its printable alphabet;
 *   4. BPE merges each piece: lowest merge rank first, leftmost on equal rank.
 * BPE runs on ids, not strings: in ByteLevel mode each byte starts as the id of its alphabet
 * character; merges are a hash from (left id, right id) to (rank, merged id).
 *
 * Pieces are cached (raw bytes -> ids) because chat text repeats words a lot; the cache is
 * direct-mapped, bounded, and guarded by a mutex since one tokenizer serves many threads.
 *
 * Decoding precomputes each id's bytes: ByteLevel pieces map their characters back to bytes (a
 * piece with a character outside the alphabet decodes to its own UTF-8, as the reference does),
 * "<0xNN>" pieces decode to byte NN when the decoder has ByteFallback, added tokens decode to
 * their content.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"
#include "util.h"

#include <cjson/cJSON.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };

typedef struct {
    pcre2_code *re;
    int behavior;
    int invert;
} split_step;

typedef struct {
    char *content;
    int len, id;
    unsigned char special, single_word, lstrip, rstrip, normalized;
} added_token;

/* string -> id, open addressing; the map owns copies of its keys */
typedef struct {
    char **keys;
    int *lens, *vals;
    size_t cap;
} str_map;

typedef struct {
    uint64_t key;      /* (left << 32 | right) + 1; 0 = empty slot */
    int rank, merged;
} merge_slot;

#define CACHE_SLOTS 8192
#define CACHE_MAX_PIECE 48

typedef struct {
    char *key;
    int len, nids;
    int *ids;
} cache_slot;

struct tokenizer {
    int vocab;                  /* largest id + 1 */
    char **pieces;              /* id -> vocab string or added content (NULL for unused ids) */
    unsigned char **bytes;      /* id -> decoded bytes */
    int *nbytes;
    unsigned char *special;     /* id -> 1 if a special added token */
    size_t max_token_bytes;
    str_map vocab_map, added_map;
    added_token *added;
    int nadded;
    int *added_by_byte[256];    /* first byte -> indices into added, longest first, -1 ended */
    split_step *splits;
    int nsplits;
    int byte_level, prefix_space;
    pcre2_code *gpt2_re;        /* ByteLevel's own regex when use_regex is true */
    pcre2_code *word_re;        /* \w, for single_word added tokens */
    merge_slot *merges;
    size_t merge_cap;
    int byte_fallback, ignore_merges, fuse_unk, unk_id;
    int byte_id[256];           /* ByteLevel: id of each byte's alphabet character */
    int fallback_id[256];       /* byte_fallback: id of "<0xNN>", -1 if absent */
    cache_slot *cache;
    pthread_mutex_t cache_lock;
};

/* ---- UTF-8 --------------------------------------------------------------------------------- */

/* Total length a UTF-8 sequence with this lead byte has, 0 if it cannot lead one. */
static int utf8_need(unsigned c) {
    return c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
}

/* May byte c stand at position idx (>= 1) of a sequence led by `lead`? RFC 3629 ranges rule
 * out overlongs, surrogates and code points above U+10FFFF through the second byte. */
static int utf8_cont_ok(unsigned lead, int idx, unsigned c) {
    unsigned lo = 0x80, hi = 0xBF;
    if (idx == 1) {
        if (lead == 0xE0) lo = 0xA0;
        if (lead == 0xED) hi = 0x9F;
        if (lead == 0xF0) lo = 0x90;
        if (lead == 0xF4) hi = 0x8F;
    }
    return c >= lo && c <= hi;
}

/* Length of the valid UTF-8 character at s, or 0 if invalid or truncated. */
static int utf8_valid_len(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    int len = utf8_need(s[0]);
    if (len == 0 || (size_t)len > n) return 0;
    for (int i = 1; i < len; i++)
        if (!utf8_cont_ok(s[0], i, s[i])) return 0;
    return len;
}

static long utf8_invalid_at(const char *text, size_t n) {
    size_t i = 0;
    while (i < n) {
        int l = utf8_valid_len((const unsigned char *)text + i, n - i);
        if (!l) return (long)i;
        i += l;
    }
    return -1;
}

static int utf8_put(unsigned cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | cp >> 6); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    out[0] = (char)(0xE0 | cp >> 12);
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

static unsigned utf8_decode(const unsigned char *s, int len) {
    if (len == 1) return s[0];
    unsigned cp = s[0] & (0x7F >> len);
    for (int i = 1; i < len; i++) cp = cp << 6 | (s[i] & 0x3F);
    return cp;
}

/* Rust's char::is_whitespace (Unicode White_Space), used by lstrip/rstrip. */
static int is_unicode_space(unsigned cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

/* ---- GPT-2 byte alphabet ------------------------------------------------------------------- */

/* Printable bytes stand for themselves; the other 68 map to U+0100.. in byte order. */
static unsigned byte_cp[256];
static int cp_to_byte[0x144];

static void byte_alphabet_init(void) {
    unsigned next = 0x100;
    for (int i = 0; i < 0x144; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_cp[b] = printable ? (unsigned)b : next++;
        cp_to_byte[byte_cp[b]] = b;
    }
}

/* ---- hash tables ------------------------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, int n) { return fnv64(FNV64_INIT, s, (size_t)n); }

static void str_map_init(str_map *m, size_t n) {
    m->cap = 16;
    while (m->cap < n * 2) m->cap <<= 1;
    m->keys = xcalloc(m->cap, sizeof(char *));
    m->lens = xcalloc(m->cap, sizeof(int));
    m->vals = xcalloc(m->cap, sizeof(int));
}

static void str_map_free(str_map *m) {
    for (size_t i = 0; m->keys && i < m->cap; i++) free(m->keys[i]);
    free(m->keys);
    free(m->lens);
    free(m->vals);
}

static size_t str_map_slot(const str_map *m, const char *s, int n) {
    size_t i = hash_bytes(s, n) & (m->cap - 1);
    while (m->keys[i] && !(m->lens[i] == n && memcmp(m->keys[i], s, (size_t)n) == 0)) i = (i + 1) & (m->cap - 1);
    return i;
}

/* the map is sized at init for all keys it will get, so it never fills */
static void str_map_put(str_map *m, const char *s, int n, int val) {
    size_t i = str_map_slot(m, s, n);
    if (!m->keys[i]) m->keys[i] = memcpy(xmalloc((size_t)n + 1), s, (size_t)n + 1);
    m->lens[i] = n;
    m->vals[i] = val;
}

static int str_map_get(const str_map *m, const char *s, int n) {
    size_t i = str_map_slot(m, s, n);
    return m->keys[i] ? m->vals[i] : -1;
}

static uint64_t merge_key(int a, int b) { return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1; }

static merge_slot *merge_find(const tokenizer *t, int a, int b) {
    uint64_t k = merge_key(a, b);
    size_t i = (k * 0x9E3779B97F4A7C15ULL >> 20) & (t->merge_cap - 1);
    while (t->merges[i].key && t->merges[i].key != k) i = (i + 1) & (t->merge_cap - 1);
    return &t->merges[i];
}

/* ---- loading ----------------------------------------------------------------------------- */

static const char *json_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int json_flag(const cJSON *o, const char *key) {
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key));
}

static pcre2_code *regex_compile(const char *pat, int literal, const char *what, char *err, size_t errlen) {
    int code;
    PCRE2_SIZE at;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opts, &code, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        errf(err, errlen, "%s: regex does not compile at offset %zu: %s", what, (size_t)at, (char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  /* optional: the interpreter is the fallback */
    return re;
}

static int max_id_of(const cJSON *vocab, const cJSON *added, char *err, size_t errlen) {
    int max = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 1e9 || e->valuedouble != (int)e->valuedouble)
            return errf(err, errlen, "tokenizer.json: model.vocab[\"%s\"] is not a valid id", e->string) - 1;
        max = MAX(max, e->valueint);
    }
    cJSON_ArrayForEach(e, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 1e9 || !json_str(e, "content"))
            return errf(err, errlen, "tokenizer.json: an added_tokens entry lacks a valid id or content") - 1;
        max = MAX(max, id->valueint);
    }
    /* Tables are sized by the largest id: a vocabulary whose ids leave most of their range unused
     * (an id of 10^9 among 30 entries) is not a tokenizer, and would cost gigabytes to load. */
    long entries = cJSON_GetArraySize(vocab) + (added ? cJSON_GetArraySize(added) : 0);
    if (max >= 2 * entries + 1024)
        return errf(err, errlen, "tokenizer.json: id %d is far beyond the %ld entries (ids must be nearly dense)",
                    max, entries) - 1;
    return max;
}

static void load_vocab(tokenizer *t, const cJSON *vocab) {
    str_map_init(&t->vocab_map, (size_t)cJSON_GetArraySize(vocab));
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        int id = e->valueint;
        if (!t->pieces[id]) t->pieces[id] = xstrdup(e->string);
        str_map_put(&t->vocab_map, e->string, (int)strlen(e->string), id);
    }
}

static int vocab_id(const tokenizer *t, const char *s) { return str_map_get(&t->vocab_map, s, (int)strlen(s)); }

static int merge_parts(const cJSON *m, const char **a, const char **b, char *buf, size_t bufsz) {
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2) {
        *a = cJSON_GetArrayItem(m, 0)->valuestring;
        *b = cJSON_GetArrayItem(m, 1)->valuestring;
        return *a && *b ? 0 : -1;
    }
    if (!cJSON_IsString(m) || strlen(m->valuestring) >= bufsz) return -1;
    strcpy(buf, m->valuestring);
    char *sp = strchr(buf, ' ');
    if (!sp || strchr(sp + 1, ' ')) return -1;
    *sp = 0;
    *a = buf;
    *b = sp + 1;
    return 0;
}

static int load_merges(tokenizer *t, const cJSON *merges, char *err, size_t errlen) {
    int n = cJSON_GetArraySize(merges);
    t->merge_cap = 16;
    while (t->merge_cap < (size_t)n * 2) t->merge_cap <<= 1;
    t->merges = xcalloc(t->merge_cap, sizeof(merge_slot));
    char buf[1024], joined[1024];
    int rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        const char *a, *b;
        if (merge_parts(m, &a, &b, buf, sizeof buf))
            return errf(err, errlen, "tokenizer.json: model.merges[%d] is not \"a b\" or [a, b]", rank);
        int ia = vocab_id(t, a), ib = vocab_id(t, b);
        if (strlen(a) + strlen(b) >= sizeof joined)
            return errf(err, errlen, "tokenizer.json: model.merges[%d] is too long", rank);
        size_t la = strlen(a);
        memcpy(joined, a, la);
        strcpy(joined + la, b);
        int im = vocab_id(t, joined);
        if (ia < 0 || ib < 0 || im < 0)
            return errf(err, errlen, "tokenizer.json: model.merges[%d] (\"%s\" + \"%s\") uses a piece missing from model.vocab",
                        rank, a, b);
        merge_slot *s = merge_find(t, ia, ib);
        s->key = merge_key(ia, ib);   /* a repeated pair takes the later rank, like the reference */
        s->rank = rank++;
        s->merged = im;
    }
    return 0;
}

static int load_model(tokenizer *t, const cJSON *model, char *err, size_t errlen) {
    const char *type = json_str(model, "type");
    if (type && strcmp(type, "BPE") != 0)
        return errf(err, errlen, "tokenizer.json: model.type \"%s\" is not supported (only BPE)", type);
    const char *cont = json_str(model, "continuing_subword_prefix"), *suffix = json_str(model, "end_of_word_suffix");
    if ((cont && *cont) || (suffix && *suffix))
        return errf(err, errlen, "tokenizer.json: model.continuing_subword_prefix/end_of_word_suffix are not supported");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsArray(merges)) return errf(err, errlen, "tokenizer.json: model.merges missing or not an array");
    if (load_merges(t, merges, err, errlen)) return -1;
    t->byte_fallback = json_flag(model, "byte_fallback");
    t->ignore_merges = json_flag(model, "ignore_merges");
    t->fuse_unk = json_flag(model, "fuse_unk");
    const char *unk = json_str(model, "unk_token");
    t->unk_id = unk ? vocab_id(t, unk) : -1;
    if (unk && t->unk_id < 0) return errf(err, errlen, "tokenizer.json: model.unk_token \"%s\" is not in the vocab", unk);
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        t->fallback_id[b] = vocab_id(t, s);
    }
    return 0;
}

static int by_length_desc(const void *a, const void *b, void *ctx) {
    const added_token *added = ctx;
    int x = *(const int *)a, y = *(const int *)b;
    if (added[x].len != added[y].len) return added[y].len - added[x].len;
    return x - y;
}

static void index_added(tokenizer *t) {
    int *count = xcalloc(256, sizeof(int));
    for (int i = 0; i < t->nadded; i++) count[(unsigned char)t->added[i].content[0]]++;
    for (int c = 0; c < 256; c++) {
        if (!count[c]) continue;
        int *list = xmalloc(sizeof(int) * (size_t)(count[c] + 1)), k = 0;
        for (int i = 0; i < t->nadded; i++)
            if ((unsigned char)t->added[i].content[0] == c) list[k++] = i;
        qsort_r(list, (size_t)k, sizeof(int), by_length_desc, t->added);
        list[k] = -1;
        t->added_by_byte[c] = list;
    }
    free(count);
}

static int load_added(tokenizer *t, const cJSON *added, char *err, size_t errlen) {
    int n = cJSON_GetArraySize(added);
    t->added = xcalloc((size_t)(n ? n : 1), sizeof(added_token));
    str_map_init(&t->added_map, (size_t)n);
    const cJSON *e;
    cJSON_ArrayForEach(e, added) {
        const char *content = json_str(e, "content");
        if (!*content) return errf(err, errlen, "tokenizer.json: added token %d has empty content",
                                   cJSON_GetObjectItemCaseSensitive(e, "id")->valueint);
        added_token *a = &t->added[t->nadded++];
        a->content = xstrdup(content);
        a->len = (int)strlen(content);
        a->id = cJSON_GetObjectItemCaseSensitive(e, "id")->valueint;
        a->special = (unsigned char)json_flag(e, "special");
        a->single_word = (unsigned char)json_flag(e, "single_word");
        a->lstrip = (unsigned char)json_flag(e, "lstrip");
        a->rstrip = (unsigned char)json_flag(e, "rstrip");
        a->normalized = (unsigned char)json_flag(e, "normalized");
        str_map_put(&t->added_map, a->content, a->len, a->id);
        free(t->pieces[a->id]);
        t->pieces[a->id] = xstrdup(content);
        t->special[a->id] = a->special;
    }
    index_added(t);
    return 0;
}

static int load_normalizer(const cJSON *n, char *err, size_t errlen) {
    if (!n || cJSON_IsNull(n)) return 0;
    const char *type = json_str(n, "type");
    if (type && strcmp(type, "Sequence") == 0) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(n, "normalizers"))
            if (load_normalizer(e, err, errlen)) return -1;
        return 0;
    }
    if (type && strcmp(type, "NFC") == 0) return 0;
    return errf(err, errlen, "tokenizer.json: normalizer \"%s\" is not supported (only none/Sequence/NFC)",
                type ? type : "?");
}

static int split_behavior(const char *s) {
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (s && strcmp(s, names[i]) == 0) return i;
    return -1;
}

static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int load_pre_step(tokenizer *t, const cJSON *p, char *err, size_t errlen) {
    const char *type = json_str(p, "type");
    if (t->byte_level)
        return errf(err, errlen, "tokenizer.json: pre_tokenizer steps after ByteLevel are not supported");
    if (type && strcmp(type, "ByteLevel") == 0) {
        t->byte_level = 1;
        t->prefix_space = json_flag(p, "add_prefix_space");
        const cJSON *use_regex = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
        if (!cJSON_IsFalse(use_regex)) {
            t->gpt2_re = regex_compile(GPT2_PATTERN, 0, "ByteLevel", err, errlen);
            if (!t->gpt2_re) return -1;
        }
        return 0;
    }
    if (!type || strcmp(type, "Split") != 0)
        return errf(err, errlen, "tokenizer.json: pre_tokenizer \"%s\" is not supported (only Sequence/Split/ByteLevel)",
                    type ? type : "?");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
    const char *rx = json_str(pat, "Regex"), *lit = json_str(pat, "String");
    int behavior = split_behavior(json_str(p, "behavior"));
    if ((!rx && !lit) || behavior < 0)
        return errf(err, errlen, "tokenizer.json: Split pre_tokenizer needs pattern.Regex/String and a known behavior");
    split_step *s = &t->splits[t->nsplits];
    s->re = regex_compile(rx ? rx : lit, !rx, "Split pattern", err, errlen);
    if (!s->re) return -1;
    s->behavior = behavior;
    s->invert = json_flag(p, "invert");
    t->nsplits++;
    return 0;
}

static int load_pre_tokenizer(tokenizer *t, const cJSON *p, char *err, size_t errlen) {
    if (!p || cJSON_IsNull(p)) return 0;
    const char *type = json_str(p, "type");
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
    int n = type && strcmp(type, "Sequence") == 0 ? cJSON_GetArraySize(steps) : 1;
    t->splits = xcalloc((size_t)n, sizeof(split_step));
    if (n == 1 && !(type && strcmp(type, "Sequence") == 0)) return load_pre_step(t, p, err, errlen);
    const cJSON *e;
    cJSON_ArrayForEach(e, steps)
        if (load_pre_step(t, e, err, errlen)) return -1;
    return 0;
}

/* Decoder kinds we understand: ByteLevel, ByteFallback, Fuse (a no-op when concatenating). */
static int load_decoder(const cJSON *d, int *byte_level, int *byte_fallback, char *err, size_t errlen) {
    if (!d || cJSON_IsNull(d)) return 0;
    const char *type = json_str(d, "type");
    if (type && strcmp(type, "Sequence") == 0) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(d, "decoders"))
            if (load_decoder(e, byte_level, byte_fallback, err, errlen)) return -1;
        return 0;
    }
    if (type && strcmp(type, "ByteLevel") == 0) *byte_level = 1;
    else if (type && strcmp(type, "ByteFallback") == 0) *byte_fallback = 1;
    else if (!type || strcmp(type, "Fuse") != 0)
        return errf(err, errlen, "tokenizer.json: decoder \"%s\" is not supported (ByteLevel/ByteFallback/Fuse)",
                    type ? type : "?");
    return 0;
}

static int hex_digit(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* NN of a "<0xNN>" byte-fallback piece, or -1. */
static int fallback_byte(const char *p) {
    if (strlen(p) != 6 || strncmp(p, "<0x", 3) != 0 || p[5] != '>') return -1;
    int hi = hex_digit(p[3]), lo = hex_digit(p[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Bytes one id decodes to, per the decoder (see the file comment). */
static void decode_piece(const tokenizer *t, int id, int byte_level, int byte_fallback, unsigned char *out, int *n) {
    const char *p = t->pieces[id];
    size_t len = strlen(p);
    int fb = byte_fallback ? fallback_byte(p) : -1;
    int added = str_map_get(&t->added_map, p, (int)len) == id;
    *n = 0;
    if (!added && fb >= 0) {
        out[(*n)++] = (unsigned char)fb;
        return;
    }
    for (size_t i = 0; byte_level && !added && i < len;) {
        int l = utf8_valid_len((const unsigned char *)p + i, len - i);
        unsigned cp = l ? utf8_decode((const unsigned char *)p + i, l) : 0xFFFF;
        if (cp >= 0x144 || cp_to_byte[cp] < 0) break;
        out[(*n)++] = (unsigned char)cp_to_byte[cp];
        i += (size_t)l;
        if (i == len) return;
    }
    memcpy(out, p, len);
    *n = (int)len;
}

static int load_decoding(tokenizer *t, const cJSON *decoder, char *err, size_t errlen) {
    int byte_level = 0, byte_fallback = 0;
    if (load_decoder(decoder, &byte_level, &byte_fallback, err, errlen)) return -1;
    t->bytes = xcalloc((size_t)t->vocab, sizeof(unsigned char *));
    t->nbytes = xcalloc((size_t)t->vocab, sizeof(int));
    for (int id = 0; id < t->vocab; id++) {
        if (!t->pieces[id]) continue;
        t->bytes[id] = xmalloc(strlen(t->pieces[id]) + 1);
        decode_piece(t, id, byte_level, byte_fallback, t->bytes[id], &t->nbytes[id]);
        t->max_token_bytes = MAX(t->max_token_bytes, (size_t)t->nbytes[id]);
    }
    return 0;
}

static void load_byte_ids(tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char s[4];
        int n = utf8_put(byte_cp[b], s);
        t->byte_id[b] = str_map_get(&t->vocab_map, s, n);
    }
}

static int load_json(tokenizer *t, const cJSON *root, char *err, size_t errlen) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab)) return errf(err, errlen, "tokenizer.json: model.vocab missing or not an object");
    if (added && !cJSON_IsArray(added)) return errf(err, errlen, "tokenizer.json: added_tokens is not an array");
    int max = max_id_of(vocab, added, err, errlen);
    if (max < -1) return -1;
    if (max < 0) return errf(err, errlen, "tokenizer.json: empty vocabulary");
    t->vocab = max + 1;
    t->pieces = xcalloc((size_t)t->vocab, sizeof(char *));
    t->special = xcalloc((size_t)t->vocab, 1);
    load_vocab(t, vocab);
    if (load_model(t, model, err, errlen) || load_added(t, added, err, errlen)) return -1;
    if (load_normalizer(cJSON_GetObjectItemCaseSensitive(root, "normalizer"), err, errlen)) return -1;
    if (load_pre_tokenizer(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), err, errlen)) return -1;
    load_byte_ids(t);
    t->word_re = regex_compile("\\w", 0, "word class", err, errlen);
    if (!t->word_re) return -1;
    return load_decoding(t, cJSON_GetObjectItemCaseSensitive(root, "decoder"), err, errlen);
}

tokenizer *tok_load_text(const char *text, size_t len, const char *name, char *err, size_t errlen) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, byte_alphabet_init);
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        errf(err, errlen, "%s: invalid JSON near byte %ld", name, at ? (long)(at - text) : -1L);
        return NULL;
    }
    tokenizer *t = xcalloc(1, sizeof *t);
    pthread_mutex_init(&t->cache_lock, NULL);
    t->cache = xcalloc(CACHE_SLOTS, sizeof(cache_slot));
    t->unk_id = -1;
    int rc = load_json(t, root, err, errlen);
    cJSON_Delete(root);
    if (rc) {
        tok_free(t);
        return NULL;
    }
    return t;
}

tokenizer *tok_load(const char *path, char *err, size_t errlen) {
    size_t len;
    char *text = read_file(path, &len, err, errlen);
    if (!text) return NULL;
    tokenizer *t = tok_load_text(text, len, path, err, errlen);
    free(text);
    return t;
}

void tok_free(tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->vocab; i++) {
        free(t->pieces[i]);
        if (t->bytes) free(t->bytes[i]);
    }
    free(t->pieces);
    free(t->bytes);
    free(t->nbytes);
    free(t->special);
    str_map_free(&t->vocab_map);
    str_map_free(&t->added_map);
    for (int i = 0; i < t->nadded; i++) free(t->added[i].content);
    free(t->added);
    for (int c = 0; c < 256; c++) free(t->added_by_byte[c]);
    for (int i = 0; i < t->nsplits; i++) pcre2_code_free(t->splits[i].re);
    free(t->splits);
    pcre2_code_free(t->gpt2_re);
    pcre2_code_free(t->word_re);
    free(t->merges);
    for (int i = 0; t->cache && i < CACHE_SLOTS; i++) {
        free(t->cache[i].key);
        free(t->cache[i].ids);
    }
    free(t->cache);
    pthread_mutex_destroy(&t->cache_lock);
    free(t);
}

/* ---- encoding: output, BPE ----------------------------------------------------------------- */

typedef struct {
    int *ids;
    int max, n;
} id_out;

static void emit(id_out *o, int id) {
    if (o->n < o->max) o->ids[o->n] = id;
    o->n++;
}

typedef struct { int rank, pos, left, right, merged; } merge_cand;

/* Scratch for one encode call, sized for the longest piece it can meet (the whole text). */
typedef struct {
    int *sym, *next, *prev;
    merge_cand *heap;
    int nheap;
    char *mapped;               /* ByteLevel alphabet form of a piece, for ignore_merges */
    pcre2_match_data *md;
    int *range_a, *range_b, nrange;    /* current pre-token pieces (offsets into the segment) */
    int *part_a, *part_b, *part_m;     /* one Split's parts of one piece */
    char *prefixed;             /* piece with ByteLevel's prefix space */
    int *piece_ids;             /* one piece's ids, for the cache */
} work;

static int cand_less(const merge_cand *x, const merge_cand *y) {
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static void heap_push(work *w, merge_cand c) {
    int i = w->nheap++;
    while (i > 0 && cand_less(&c, &w->heap[(i - 1) / 2])) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = c;
}

static merge_cand heap_pop(work *w) {
    merge_cand top = w->heap[0], last = w->heap[--w->nheap];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= w->nheap) break;
        if (c + 1 < w->nheap && cand_less(&w->heap[c + 1], &w->heap[c])) c++;
        if (!cand_less(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    w->heap[i] = last;
    return top;
}

static void push_pair(const tokenizer *t, work *w, int pos) {
    int nx = w->next[pos];
    if (nx < 0) return;
    merge_slot *m = merge_find(t, w->sym[pos], w->sym[nx]);
    if (m->key) heap_push(w, (merge_cand){m->rank, pos, w->sym[pos], w->sym[nx], m->merged});
}

/* Initial symbols of a piece; returns their count. Unknown characters become byte-fallback
 * ids, the unk id (fused if asked), or are dropped, as in the reference BPE. */
static int bpe_symbols(const tokenizer *t, work *w, const unsigned char *s, int n) {
    int k = 0;
    for (int i = 0; i < n;) {
        int l = t->byte_level ? 1 : MAX(1, utf8_valid_len(s + i, (size_t)(n - i)));
        int id = t->byte_level ? t->byte_id[s[i]] : str_map_get(&t->vocab_map, (const char *)s + i, l);
        if (id >= 0) {
            w->sym[k++] = id;
        } else if (t->byte_fallback && !t->byte_level) {
            int all = 1;
            for (int j = 0; j < l; j++) all &= t->fallback_id[s[i + j]] >= 0;
            for (int j = 0; j < l && all; j++) w->sym[k++] = t->fallback_id[s[i + j]];
            if (!all && t->unk_id >= 0) w->sym[k++] = t->unk_id;
        } else if (t->unk_id >= 0 && !(t->fuse_unk && k > 0 && w->sym[k - 1] == t->unk_id)) {
            w->sym[k++] = t->unk_id;
        }
        i += l;
    }
    return k;
}

static void bpe_merge(const tokenizer *t, work *w, int k) {
    for (int i = 0; i < k; i++) {
        w->prev[i] = i - 1;
        w->next[i] = i + 1 < k ? i + 1 : -1;
    }
    w->nheap = 0;
    for (int i = 0; i + 1 < k; i++) push_pair(t, w, i);
    while (w->nheap) {
        merge_cand c = heap_pop(w);
        int nx = w->next[c.pos];
        if (w->sym[c.pos] != c.left || nx < 0 || w->sym[nx] != c.right) continue;
        w->sym[c.pos] = c.merged;
        w->sym[nx] = -1;
        w->next[c.pos] = w->next[nx];
        if (w->next[nx] >= 0) w->prev[w->next[nx]] = c.pos;
        if (w->prev[c.pos] >= 0) push_pair(t, w, w->prev[c.pos]);
        push_pair(t, w, c.pos);
    }
}

/* The whole piece as one vocab id (ignore_merges), or -1. */
static int whole_piece_id(const tokenizer *t, work *w, const unsigned char *s, int n) {
    if (!t->byte_level) return str_map_get(&t->vocab_map, (const char *)s, n);
    int m = 0;
    for (int i = 0; i < n; i++) m += utf8_put(byte_cp[s[i]], w->mapped + m);
    return str_map_get(&t->vocab_map, w->mapped, m);
}

static int cache_get(tokenizer *t, const char *s, int n, id_out *o) {
    cache_slot *c = &t->cache[hash_bytes(s, n) & (CACHE_SLOTS - 1)];
    int hit = 0;
    pthread_mutex_lock(&t->cache_lock);
    if (c->key && c->len == n && memcmp(c->key, s, (size_t)n) == 0) {
        for (int i = 0; i < c->nids; i++) emit(o, c->ids[i]);
        hit = 1;
    }
    pthread_mutex_unlock(&t->cache_lock);
    return hit;
}

static void cache_put(tokenizer *t, const char *s, int n, const int *ids, int nids) {
    cache_slot *c = &t->cache[hash_bytes(s, n) & (CACHE_SLOTS - 1)];
    char *key = xmalloc((size_t)n);
    int *copy = xmalloc(sizeof(int) * (size_t)(nids ? nids : 1));
    memcpy(key, s, (size_t)n);
    memcpy(copy, ids, sizeof(int) * (size_t)nids);
    pthread_mutex_lock(&t->cache_lock);
    free(c->key);
    free(c->ids);
    c->key = key;
    c->len = n;
    c->ids = copy;
    c->nids = nids;
    pthread_mutex_unlock(&t->cache_lock);
}

static void bpe_piece(const tokenizer *tc, work *w, const char *s, int n, id_out *o) {
    tokenizer *t = (tokenizer *)tc;   /* only the cache, which has its own lock, is written */
    if (n <= 0) return;
    if (n <= CACHE_MAX_PIECE && cache_get(t, s, n, o)) return;
    int whole = t->ignore_merges ? whole_piece_id(t, w, (const unsigned char *)s, n) : -1;
    int nids = 0;
    if (whole >= 0) {
        w->piece_ids[nids++] = whole;
    } else {
        int k = bpe_symbols(t, w, (const unsigned char *)s, n);
        bpe_merge(t, w, k);
        for (int i = 0; i < k; i = w->next[i]) {
            w->piece_ids[nids++] = w->sym[i];
            if (w->next[i] < 0) break;
        }
    }
    for (int i = 0; i < nids; i++) emit(o, w->piece_ids[i]);
    if (n <= CACHE_MAX_PIECE) cache_put(t, s, n, w->piece_ids, nids);
}

/* ---- encoding: pre-tokenization ------------------------------------------------------------ */

/* All regex matches in s[0..n) as parts covering it: (start, end, is_match) in order. */
static int regex_parts(const pcre2_code *re, work *w, const char *s, int n, int invert) {
    int np = 0, prev = 0;
    size_t off = 0;
    while (off <= (size_t)n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, (size_t)n, off, PCRE2_NO_UTF_CHECK, w->md, NULL);
        if (rc < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
        int a = (int)ov[0], b = (int)ov[1];
        if (a > prev) w->part_a[np] = prev, w->part_b[np] = a, w->part_m[np++] = invert;
        if (b > a) w->part_a[np] = a, w->part_b[np] = b, w->part_m[np++] = !invert;
        prev = MAX(prev, b);
        if (b > a) {
            off = (size_t)b;
        } else {   /* empty match: step one character */
            if (a >= n) break;
            off = (size_t)a + (size_t)MAX(1, utf8_valid_len((const unsigned char *)s + a, (size_t)(n - a)));
        }
    }
    if (prev < n) w->part_a[np] = prev, w->part_b[np] = n, w->part_m[np++] = invert;
    return np;
}

static void range_add(work *w, int base, int a, int b) {
    if (b <= a) return;
    w->range_a[w->nrange] = base + a;
    w->range_b[w->nrange++] = base + b;
}

/* Recombines one piece's parts by the Split behavior (HF SplitDelimiterBehavior). */
static void split_combine(work *w, int behavior, int np, int base) {
    int first = w->nrange;
    for (int i = 0; i < np; i++) {
        int a = w->part_a[i], b = w->part_b[i], m = w->part_m[i];
        int prev_m = i > 0 && w->part_m[i - 1];
        switch (behavior) {
        case SPLIT_REMOVED:
            if (!m) range_add(w, base, a, b);
            break;
        case SPLIT_ISOLATED:
            range_add(w, base, a, b);
            break;
        case SPLIT_MERGED_PREV:
            if (m && !prev_m && w->nrange > first) w->range_b[w->nrange - 1] = base + b;
            else range_add(w, base, a, b);
            break;
        case SPLIT_MERGED_NEXT:
            if (m && i + 1 < np && !w->part_m[i + 1]) w->part_a[i + 1] = a;
            else range_add(w, base, a, b);
            break;
        case SPLIT_CONTIGUOUS:
            if (i > 0 && m == prev_m && w->nrange > first) w->range_b[w->nrange - 1] = base + b;
            else range_add(w, base, a, b);
            break;
        }
    }
}

/* Applies every Split step; leaves the pieces in w->range_a/b. */
static void pre_split(const tokenizer *t, work *w, const char *s, int n, int *tmp_a, int *tmp_b) {
    w->nrange = 0;
    range_add(w, 0, 0, n);
    for (int k = 0; k < t->nsplits; k++) {
        int count = w->nrange;
        memcpy(tmp_a, w->range_a, sizeof(int) * (size_t)count);
        memcpy(tmp_b, w->range_b, sizeof(int) * (size_t)count);
        w->nrange = 0;
        for (int r = 0; r < count; r++) {
            const split_step *st = &t->splits[k];
            int np = regex_parts(st->re, w, s + tmp_a[r], tmp_b[r] - tmp_a[r], st->invert);
            split_combine(w, st->behavior, np, tmp_a[r]);
        }
    }
}

/* ByteLevel for one piece: optional prefix space, optional GPT-2 regex, then BPE. */
static void byte_level_piece(const tokenizer *t, work *w, const char *s, int n, id_out *o) {
    if (t->prefix_space && s[0] != ' ') {
        w->prefixed[0] = ' ';
        memcpy(w->prefixed + 1, s, (size_t)n);
        s = w->prefixed;
        n++;
    }
    if (!t->gpt2_re) {
        bpe_piece(t, w, s, n, o);
        return;
    }
    int np = regex_parts(t->gpt2_re, w, s, n, 0);
    for (int i = 0; i < np; i++) bpe_piece(t, w, s + w->part_a[i], w->part_b[i] - w->part_a[i], o);
}

static void encode_plain_text(const tokenizer *t, work *w, const char *s, int n, id_out *o) {
    if (n <= 0) return;
    int *tmp = xmalloc(sizeof(int) * 2 * (size_t)(n + 1));
    pre_split(t, w, s, n, tmp, tmp + n + 1);
    for (int r = 0; r < w->nrange; r++) {
        const char *p = s + w->range_a[r];
        int len = w->range_b[r] - w->range_a[r];
        if (t->byte_level) byte_level_piece(t, w, p, len, o);
        else bpe_piece(t, w, p, len, o);
    }
    free(tmp);
}

/* ---- encoding: added tokens ---------------------------------------------------------------- */

static int is_word_char_at(const tokenizer *t, work *w, const char *s, int n, int at) {
    if (at < 0 || at >= n) return 0;
    int rc = pcre2_match(t->word_re, (PCRE2_SPTR)s, (size_t)n, (size_t)at, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, w->md, NULL);
    return rc >= 0;
}

static int char_start_before(const char *s, int at) {
    int i = at - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    return i;
}

/* How added tokens are cut in one encode call: `plain` drops special tokens everywhere; the
 * untrusted spans (sorted, disjoint, offsets into the whole text) match no added token at all. */
typedef struct {
    int plain;
    const tok_span *untrusted;
    int nuntrusted;
} cut_rules;

/* Does [a, b) of the whole text touch an untrusted span? Binary search for the first span that
 * ends after a. */
static int touches_untrusted(const cut_rules *c, size_t a, size_t b) {
    int lo = 0, hi = c->nuntrusted;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (c->untrusted[mid].start + c->untrusted[mid].len <= a) lo = mid + 1;
        else hi = mid;
    }
    return lo < c->nuntrusted && c->untrusted[lo].start < b;
}

/* Leftmost-longest added token of this pass at or after `from` that lies wholly in trusted text
 * (s starts at byte `base` of the whole text); -1 if none. */
static int find_added(const tokenizer *t, const cut_rules *c, const char *s, size_t base, int n, int from,
                      int normalized, int *at) {
    for (int i = from; i < n; i++) {
        const int *list = t->added_by_byte[(unsigned char)s[i]];
        for (int k = 0; list && list[k] >= 0; k++) {
            const added_token *a = &t->added[list[k]];
            if (a->normalized == normalized && a->len <= n - i && memcmp(s + i, a->content, (size_t)a->len) == 0 &&
                !touches_untrusted(c, base + (size_t)i, base + (size_t)i + (size_t)a->len)) {
                *at = i;
                return list[k];
            }
        }
    }
    return -1;
}

static int space_len_at(const char *s, int n, int at) {
    int l = utf8_valid_len((const unsigned char *)s + at, (size_t)(n - at));
    return l && is_unicode_space(utf8_decode((const unsigned char *)s + at, l)) ? l : 0;
}

/* One pass of added-token cutting (pass 0: normalized=false tokens, pass 1: normalized=true).
 * Like the reference, a match that is then discarded (a special token in plain mode, a
 * single_word token inside a word) still consumes its text, which stays plain text. Text in an
 * untrusted span never matches, so it is cut exactly as the text around it. */
static void encode_added_pass(const tokenizer *t, work *w, const cut_rules *c, const char *s, size_t base, int n,
                              int pass, id_out *o) {
    int done = 0, from = 0, at;
    for (;;) {
        int k = find_added(t, c, s, base, n, from, pass, &at);
        if (k < 0) break;
        const added_token *a = &t->added[k];
        int start = at, stop = at + a->len;
        from = stop;
        if (c->plain && a->special) continue;
        if (a->single_word && (is_word_char_at(t, w, s, n, at > 0 ? char_start_before(s, at) : -1) ||
                               is_word_char_at(t, w, s, n, stop)))
            continue;
        if (a->lstrip)
            while (start > done) {
                int ch = char_start_before(s, start);
                if (!space_len_at(s, n, ch)) break;
                start = ch;
            }
        if (a->rstrip)
            for (int l; stop < n && (l = space_len_at(s, n, stop));) stop += l;
        if (pass == 0) encode_added_pass(t, w, c, s + done, base + (size_t)done, start - done, 1, o);
        else encode_plain_text(t, w, s + done, start - done, o);
        emit(o, a->id);
        done = from = stop;
    }
    if (pass == 0) encode_added_pass(t, w, c, s + done, base + (size_t)done, n - done, 1, o);
    else encode_plain_text(t, w, s + done, n - done, o);
}

static void work_init(work *w, size_t n) {
    size_t cap = n + 2;
    w->sym = xmalloc(sizeof(int) * cap);
    w->next = xmalloc(sizeof(int) * cap);
    w->prev = xmalloc(sizeof(int) * cap);
    w->piece_ids = xmalloc(sizeof(int) * cap);
    w->heap = xmalloc(sizeof(merge_cand) * 2 * cap);
    w->mapped = xmalloc(2 * cap);
    w->prefixed = xmalloc(cap);
    w->range_a = xmalloc(sizeof(int) * cap);
    w->range_b = xmalloc(sizeof(int) * cap);
    w->part_a = xmalloc(sizeof(int) * 2 * cap);
    w->part_b = xmalloc(sizeof(int) * 2 * cap);
    w->part_m = xmalloc(sizeof(int) * 2 * cap);
    w->md = pcre2_match_data_create(4, NULL);
}

static void work_free(work *w) {
    free(w->sym); free(w->next); free(w->prev); free(w->piece_ids); free(w->heap);
    free(w->mapped); free(w->prefixed);
    free(w->range_a); free(w->range_b); free(w->part_a); free(w->part_b); free(w->part_m);
    pcre2_match_data_free(w->md);
}

static int encode(const tokenizer *t, const char *text, size_t n, int *ids, int max, const cut_rules *c,
                  char *err, size_t errlen) {
    if (n > (size_t)INT32_MAX / 4) return errf(err, errlen, "text too long to tokenize (%zu bytes)", n);
    long bad = utf8_invalid_at(text, n);
    if (bad >= 0) return errf(err, errlen, "text is not valid UTF-8 (byte offset %ld)", bad);
    work w;
    work_init(&w, n);
    id_out o = {ids, max, 0};
    encode_added_pass(t, &w, c, text, 0, (int)n, 0, &o);
    work_free(&w);
    return o.n;
}

int tok_encode(const tokenizer *t, const char *text, size_t n, int *ids, int max, char *err, size_t errlen) {
    cut_rules c = {0};
    return encode(t, text, n, ids, max, &c, err, errlen);
}

int tok_encode_plain(const tokenizer *t, const char *text, size_t n, int *ids, int max, char *err, size_t errlen) {
    cut_rules c = {.plain = 1};
    return encode(t, text, n, ids, max, &c, err, errlen);
}

int tok_encode_untrusted(const tokenizer *t, const char *text, size_t n, const tok_span *untrusted, int nuntrusted,
                         int *ids, int max, char *err, size_t errlen) {
    for (int i = 0; i < nuntrusted; i++)
        if (untrusted[i].len == 0 || (i && untrusted[i].start < untrusted[i - 1].start + untrusted[i - 1].len))
            return errf(err, errlen, "untrusted span %d is empty or not after the previous one", i);
    cut_rules c = {.untrusted = untrusted, .nuntrusted = nuntrusted};
    return encode(t, text, n, ids, max, &c, err, errlen);
}

/* ---- lookups ------------------------------------------------------------------------------- */

int tok_vocab_size(const tokenizer *t) { return t->vocab; }

int tok_id(const tokenizer *t, const char *token) {
    int n = (int)strlen(token);
    int id = str_map_get(&t->added_map, token, n);
    return id >= 0 ? id : str_map_get(&t->vocab_map, token, n);
}

const char *tok_piece(const tokenizer *t, int id) {
    return id >= 0 && id < t->vocab ? t->pieces[id] : NULL;
}

int tok_is_special(const tokenizer *t, int id) {
    return id >= 0 && id < t->vocab && t->special[id];
}

size_t tok_max_token_bytes(const tokenizer *t) { return t->max_token_bytes; }

int tok_added_count(const tokenizer *t) { return t->nadded; }
const char *tok_added_text(const tokenizer *t, int i) { return i >= 0 && i < t->nadded ? t->added[i].content : NULL; }

/* ---- decoding ------------------------------------------------------------------------------ */

void tok_stream_init(tok_stream *s, const tokenizer *t) {
    s->t = t;
    s->npending = 0;
}

static void out_put(char *out, size_t cap, size_t *w, const unsigned char *b, int n) {
    for (int i = 0; i < n; i++)
        if (*w < cap) out[(*w)++] = (char)b[i];
}

/* Adds one byte: a complete character is written out, a valid prefix waits in pending, and
 * bytes that can never become valid UTF-8 are written out as they are. */
static void stream_byte(tok_stream *s, unsigned char b, char *out, size_t cap, size_t *w) {
    s->pending[s->npending++] = b;
    while (s->npending) {
        int need = utf8_need(s->pending[0]), ok = need > 0;
        for (int i = 1; ok && i < s->npending; i++) ok = utf8_cont_ok(s->pending[0], i, s->pending[i]);
        if (ok && s->npending < need) return;
        if (ok) {
            out_put(out, cap, w, s->pending, need);
            s->npending = 0;
            return;
        }
        /* invalid: the first byte goes out alone, the rest is reconsidered */
        out_put(out, cap, w, s->pending, 1);
        memmove(s->pending, s->pending + 1, (size_t)--s->npending);
    }
}

size_t tok_stream_put(tok_stream *s, int id, char *out, size_t cap) {
    size_t w = 0;
    if (id < 0 || id >= s->t->vocab || !s->t->bytes[id]) return 0;
    for (int i = 0; i < s->t->nbytes[id]; i++) stream_byte(s, s->t->bytes[id][i], out, cap, &w);
    return w;
}

size_t tok_stream_finish(tok_stream *s, char *out, size_t cap) {
    size_t w = 0;
    out_put(out, cap, &w, s->pending, s->npending);
    s->npending = 0;
    return w;
}

char *tok_decode(const tokenizer *t, const int *ids, int n, size_t *len) {
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->vocab) total += (size_t)t->nbytes[ids[i]];
    char *s = xmalloc(total + 1), *p = s;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->vocab && t->bytes[ids[i]]) {
            memcpy(p, t->bytes[ids[i]], (size_t)t->nbytes[ids[i]]);
            p += t->nbytes[ids[i]];
        }
    *p = 0;
    if (len) *len = total;
    return s;
}
