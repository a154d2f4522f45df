#include "replies.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/util.h"

/* File layout: FILE_MAGIC, u64 tokenizer hash, then records of
 *   u32 REC_MAGIC, u64 key, u32 text bytes, u32 ids, text, i32 ids[], u64 fnv64 of all before it
 * in the record. Little-endian host order: the file belongs to this machine's --kv-dir. */
static const char FILE_MAGIC[8] = "CRNRID1\n";
#define REC_MAGIC 0x31444952u     /* "RID1" */
#define REC_HEAD (4 + 8 + 4 + 4)

typedef struct {
    uint64_t key;                 /* hash of text */
    char *text;
    size_t n;
    int *ids;
    int nids;
    uint64_t used;                /* LRU clock */
} entry;

struct replies {
    pthread_mutex_t mu;
    entry *e;
    int count, cap;
    size_t bytes;
    uint64_t clock;
    uint64_t tok_hash;
    char *path;                   /* NULL: memory only */
    int fd;
    int file_records;
};

static uint64_t text_key(const char *text, size_t n) { return fnv64(FNV64_INIT, text, n); }

static size_t entry_bytes(const entry *x) { return x->n + (size_t)x->nids * sizeof(int); }

static void entry_free(entry *x) {
    free(x->text);
    free(x->ids);
}

static void drop(replies *r, int i) {
    r->bytes -= entry_bytes(&r->e[i]);
    entry_free(&r->e[i]);
    r->e[i] = r->e[--r->count];
}

static int find_exact(replies *r, uint64_t key, const char *text, size_t n) {
    for (int i = 0; i < r->count; i++)
        if (r->e[i].key == key && r->e[i].n == n && !memcmp(r->e[i].text, text, n)) return i;
    return -1;
}

/* Insert (or refresh) in memory; evicts least recently used entries beyond the bounds. */
static void insert(replies *r, uint64_t key, const char *text, size_t n, const int *ids, int nids) {
    int i = find_exact(r, key, text, n);
    if (i >= 0) drop(r, i);
    while (r->count && (r->count >= REPLIES_MAX || r->bytes + n + (size_t)nids * sizeof(int) > REPLIES_BYTES)) {
        int old = 0;
        for (int j = 1; j < r->count; j++)
            if (r->e[j].used < r->e[old].used) old = j;
        drop(r, old);
    }
    if (r->count == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->e = xrealloc(r->e, sizeof *r->e * (size_t)r->cap);
    }
    entry *x = &r->e[r->count++];
    x->key = key;
    x->text = xmalloc(n + 1);
    memcpy(x->text, text, n);
    x->text[n] = 0;
    x->n = n;
    x->ids = xmalloc(sizeof(int) * (size_t)(nids ? nids : 1));
    memcpy(x->ids, ids, sizeof(int) * (size_t)nids);
    x->nids = nids;
    x->used = ++r->clock;
    r->bytes += entry_bytes(x);
}

/* ---- persistence ------------------------------------------------------------------------------ */

static void record(sbuf *b, const entry *x) {
    size_t start = b->len;
    uint32_t magic = REC_MAGIC, tn = (uint32_t)x->n, ni = (uint32_t)x->nids;
    sbuf_put(b, (const char *)&magic, 4);
    sbuf_put(b, (const char *)&x->key, 8);
    sbuf_put(b, (const char *)&tn, 4);
    sbuf_put(b, (const char *)&ni, 4);
    sbuf_put(b, x->text, x->n);
    sbuf_put(b, (const char *)x->ids, sizeof(int) * (size_t)x->nids);
    uint64_t sum = fnv64(FNV64_INIT, b->p + start, b->len - start);
    sbuf_put(b, (const char *)&sum, 8);
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Replace the file with the entries in memory (tmp + rename, so a crash leaves one or the other). */
static void rewrite(replies *r) {
    sbuf b = {0}, tmp = {0};
    sbuf_put(&b, FILE_MAGIC, sizeof FILE_MAGIC);
    sbuf_put(&b, (const char *)&r->tok_hash, 8);
    for (int i = 0; i < r->count; i++) record(&b, &r->e[i]);
    sbuf_printf(&tmp, "%s.tmp", r->path);
    int fd = open(tmp.p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write_all(fd, b.p, b.len) || fsync(fd) || rename(tmp.p, r->path)) {
        fprintf(stderr, "cairn serve: cannot write %s: reply ids are kept in memory only\n", r->path);
        if (fd >= 0) close(fd);
        unlink(tmp.p);
        free(r->path);
        r->path = NULL;
    } else {
        close(fd);
        if (r->fd >= 0) close(r->fd);
        r->fd = open(r->path, O_WRONLY | O_APPEND | O_CLOEXEC);
        r->file_records = r->count;
    }
    sbuf_free(&b);
    sbuf_free(&tmp);
}

/* Load every intact record; stops at the first that fails its checks. Returns records read. */
static int load(replies *r, const char *p, size_t len) {
    size_t at = sizeof FILE_MAGIC + 8;
    int n = 0;
    while (at + REC_HEAD + 8 <= len) {
        uint32_t magic, tn, ni;
        uint64_t key, sum;
        memcpy(&magic, p + at, 4);
        memcpy(&key, p + at + 4, 8);
        memcpy(&tn, p + at + 12, 4);
        memcpy(&ni, p + at + 16, 4);
        size_t body = REC_HEAD + (size_t)tn + 4 * (size_t)ni;
        if (magic != REC_MAGIC || tn > REPLIES_BYTES || ni > REPLIES_BYTES / 4 || at + body + 8 > len) break;
        memcpy(&sum, p + at + body, 8);
        if (sum != fnv64(FNV64_INIT, p + at, body)) break;
        int *ids = xmalloc(4 * (size_t)(ni ? ni : 1));
        memcpy(ids, p + at + REC_HEAD + tn, 4 * (size_t)ni);
        insert(r, key, p + at + REC_HEAD, tn, ids, (int)ni);
        free(ids);
        at += body + 8;
        n++;
    }
    if (at != len) fprintf(stderr, "cairn serve: %s: ignoring a damaged tail at byte %zu of %zu\n", r->path, at, len);
    return n;
}

replies *replies_open(const char *dir, uint64_t tok_hash) {
    replies *r = xcalloc(1, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    r->tok_hash = tok_hash;
    r->fd = -1;
    if (!dir) return r;
    sbuf path = {0};
    sbuf_printf(&path, "%s/reply_ids", dir);
    r->path = sbuf_take(&path);
    size_t len = 0;
    char err[256];
    char *p = access(r->path, F_OK) == 0 ? read_file(r->path, &len, err, sizeof err) : NULL;
    uint64_t h = 0;
    if (p && len >= sizeof FILE_MAGIC + 8) memcpy(&h, p + sizeof FILE_MAGIC, 8);
    if (p && (len < sizeof FILE_MAGIC + 8 || memcmp(p, FILE_MAGIC, sizeof FILE_MAGIC) || h != tok_hash))
        fprintf(stderr, "cairn serve: %s is not a reply-id file for this tokenizer: starting a new one\n", r->path);
    else if (p)
        r->file_records = load(r, p, len);
    free(p);
    rewrite(r);
    return r;
}

void replies_close(replies *r) {
    if (!r) return;
    for (int i = 0; i < r->count; i++) entry_free(&r->e[i]);
    free(r->e);
    if (r->fd >= 0) close(r->fd);
    free(r->path);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

int replies_count(replies *r) {
    pthread_mutex_lock(&r->mu);
    int n = r->count;
    pthread_mutex_unlock(&r->mu);
    return n;
}

void replies_put(replies *r, const char *text, size_t n, const int *ids, int nids) {
    if (!n || !nids || n + (size_t)nids * sizeof(int) > REPLIES_BYTES / 4) return;
    pthread_mutex_lock(&r->mu);
    insert(r, text_key(text, n), text, n, ids, nids);
    if (r->path) {
        if (r->file_records >= 2 * REPLIES_MAX) {
            rewrite(r);
        } else {
            sbuf b = {0};
            record(&b, &r->e[r->count - 1]);
            if (r->fd < 0 || write_all(r->fd, b.p, b.len))
                fprintf(stderr, "cairn serve: cannot append to %s\n", r->path);
            r->file_records++;
            sbuf_free(&b);
        }
    }
    pthread_mutex_unlock(&r->mu);
}

/* ---- the rendered text of a message ----------------------------------------------------------- */

/* [user "."] + msg + [user "."] (msg NULL: the first user message alone), with the generation cue. */
static char *render_probe(const chat_template *tpl, const cJSON *msg, const chat_opts *o) {
    cJSON *m = cJSON_CreateArray(), *u = cJSON_CreateObject();
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", ".");
    if (msg) {
        cJSON_AddItemToArray(m, cJSON_Duplicate(u, 1));
        cJSON_AddItemToArray(m, cJSON_Duplicate(msg, 1));
    }
    cJSON_AddItemToArray(m, u);
    char err[128];
    chat_prompt p = {0};
    char *text = tpl->render(m, NULL, o, &p, err, sizeof err) ? NULL : sbuf_take(&p.text);
    chat_prompt_free(&p);
    cJSON_Delete(m);
    return text;
}

/* Where the reply starts in full: right after the generation cue of the turn before it, when the
 * message's fixed text goes past the cue (Inkling writes the content type the model is to write
 * itself after its cue), else at the message's variable text (cp). */
static size_t reply_start(const chat_template *tpl, const chat_opts *o, const char *full, size_t cp) {
    char *cue = render_probe(tpl, NULL, o);
    size_t n = cue ? strlen(cue) : 0, start = cue && n < cp && !strncmp(full, cue, n) ? n : cp;
    free(cue);
    return start;
}

/* Render [user, msg, user] and the same with msg's content replaced by a one-byte sentinel: the
 * message's text is what lies between their common prefix and common suffix, provided the
 * sentinel version is exactly prefix + sentinel + suffix (else the sentinel touched the text's
 * edge, and the next sentinel is tried). It starts where the reply starts (reply_start). */
char *replies_rendered(const chat_template *tpl, const cJSON *msg, const chat_opts *o, size_t *len, char **after) {
    static const char *const sentinels[] = {"\x01", "\x02"};
    char *full = render_probe(tpl, msg, o), *out = NULL;
    for (size_t k = 0; full && !out && k < sizeof sentinels / sizeof sentinels[0]; k++) {
        cJSON *probe = cJSON_Duplicate(msg, 1);
        cJSON_DeleteItemFromObjectCaseSensitive(probe, "content");
        cJSON_DeleteItemFromObjectCaseSensitive(probe, "tool_calls");
        cJSON_DeleteItemFromObjectCaseSensitive(probe, "reasoning_content");
        cJSON_DeleteItemFromObjectCaseSensitive(probe, "reasoning");
        cJSON_AddStringToObject(probe, "content", sentinels[k]);
        char *mark = render_probe(tpl, probe, o);
        cJSON_Delete(probe);
        size_t nf = full ? strlen(full) : 0, nm = mark ? strlen(mark) : 0, cp = 0, cs = 0;
        while (mark && cp < nf && cp < nm && full[cp] == mark[cp]) cp++;
        while (mark && cs < nf - cp && cs < nm - cp && full[nf - 1 - cs] == mark[nm - 1 - cs]) cs++;
        if (mark && nm == cp + 1 + cs && mark[cp] == sentinels[k][0] && nf > cp + cs) {
            size_t start = reply_start(tpl, o, full, cp);
            *len = nf - start - cs;
            out = xmalloc(*len + 1);
            memcpy(out, full + start, *len);
            out[*len] = 0;
            if (after) *after = xstrdup(full + nf - cs);
        }
        free(mark);
    }
    free(full);
    return out;
}

/* ---- splicing --------------------------------------------------------------------------------- */

/* The ids remembered for rendered text text[0..n), as a heap copy. 0 when none. */
static int lookup(replies *r, const char *text, size_t n, int **ids, int *nids) {
    uint64_t key = text_key(text, n);
    pthread_mutex_lock(&r->mu);
    int i = find_exact(r, key, text, n);
    if (i >= 0) {
        entry *x = &r->e[i];
        x->used = ++r->clock;
        *ids = xmalloc(sizeof(int) * (size_t)x->nids);
        memcpy(*ids, x->ids, sizeof(int) * (size_t)x->nids);
        *nids = x->nids;
    }
    pthread_mutex_unlock(&r->mu);
    return i >= 0;
}

/* The prompt's text [from, to) as the engine encodes it: the untrusted spans inside it (shifted
 * to the segment) as plain text. A segment boundary is where a remembered reply starts or ends,
 * so no span is cut in a way that changes how its bytes are encoded. */
typedef struct {
    const tokenizer *tok;
    const char *prompt;
    const tok_span *spans;
    int nspans;
} segmenter;

static int encode(const segmenter *sg, size_t from, size_t to, int **ids, char *err, size_t errlen) {
    tok_span *sub = xmalloc(sizeof *sub * (size_t)(sg->nspans ? sg->nspans : 1));
    int ns = 0;
    for (int i = 0; i < sg->nspans; i++) {
        size_t a = MAX(sg->spans[i].start, from), b = MIN(sg->spans[i].start + sg->spans[i].len, to);
        if (a < b) sub[ns++] = (tok_span){a - from, b - a};
    }
    int cap = (int)(to - from) + 16;
    *ids = xmalloc(sizeof(int) * (size_t)cap);
    int k = tok_encode_untrusted(sg->tok, sg->prompt + from, to - from, sub, ns, *ids, cap, err, errlen);
    if (k > cap) {
        *ids = xrealloc(*ids, sizeof(int) * (size_t)k);
        k = tok_encode_untrusted(sg->tok, sg->prompt + from, to - from, sub, ns, *ids, k, err, errlen);
    }
    free(sub);
    if (k < 0) {
        free(*ids);
        *ids = NULL;
    }
    return k;
}

static void put_ids(sbuf *b, const int *ids, int n) {
    for (int i = 0; i < n; i++) sbuf_printf(b, "%s%d", b->len ? " " : "", ids[i]);
}

/* Append the ids of prompt[from..to). On the first segment, note the payload bytes of the
 * system-prompt prefix if it encodes to a prefix of the segment's ids. */
static int put_text(const segmenter *sg, size_t from, size_t to, size_t prefix_bytes, sbuf *out,
                    size_t *prefix_payload, char *err, size_t errlen) {
    if (from == to) return 0;
    int *ids, *pre = NULL;
    int k = encode(sg, from, to, &ids, err, errlen);
    if (k < 0) return -1;
    int kp = from == 0 && prefix_bytes && prefix_bytes < to ? encode(sg, 0, prefix_bytes, &pre, err, errlen) : -1;
    if (kp > 0 && kp < k && !memcmp(pre, ids, sizeof(int) * (size_t)kp)) {
        put_ids(out, ids, kp);
        *prefix_payload = out->len;
        put_ids(out, ids + kp, k - kp);
    } else {
        put_ids(out, ids, k);
    }
    free(pre);
    free(ids);
    return 0;
}

int replies_splice(replies *r, const tokenizer *tok, const chat_template *tpl, const chat_opts *o,
                   const cJSON *messages, const char *prompt, size_t n, const tok_span *untrusted, int nuntrusted,
                   size_t prefix_bytes, sbuf *out, size_t *prefix_payload, char *err, size_t errlen) {
    segmenter sg = {tok, prompt, untrusted, nuntrusted};
    sbuf b = {0};
    size_t cursor = 0, pp = 0;
    int spliced = 0, rc = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role) || strcmp(role->valuestring, "assistant")) continue;
        size_t len;
        char *text = replies_rendered(tpl, m, o, &len, NULL);
        int *ids = NULL, nids = 0;
        const char *at = text ? memmem(prompt + cursor, n - cursor, text, len) : NULL;
        if (at && lookup(r, text, len, &ids, &nids)) {
            rc = put_text(&sg, cursor, (size_t)(at - prompt), prefix_bytes, &b, &pp, err, errlen);
            put_ids(&b, ids, nids);
            cursor = (size_t)(at - prompt) + len;
            spliced++;
        }
        free(ids);
        free(text);
        if (rc) break;
    }
    if (!rc && spliced) rc = put_text(&sg, cursor, n, prefix_bytes, &b, &pp, err, errlen);
    if (rc || !spliced) {
        sbuf_free(&b);
        return rc ? -1 : 0;
    }
    *out = b;
    *prefix_payload = pp;
    return spliced;
}
