/* cmd_run.c — `cairn run`: generate from text, token ids or an interactive chat, with the
 * test/debug switches that make the engine's exactness observable from the command line
 * (per-position logprobs, arbitrary prefill splits, state dumps, snapshot round trips).
 *
 * Every prompt runs on one sequence; the last sampled token is never fed (so never recorded).
 * Several `;`-separated --prompt-ids run back to back on the same sequence with a reset between,
 * which is how tests prove a reset leaves nothing behind.
 *
 * --chat is a REPL on the shared reuse layer (seq_prompt: the reuse decision and the
 * checkpointing prefill, as the engine takes a prompt). It keeps the exact ids of the
 * conversation — every prompt id it fed and every id it generated — and never re-tokenizes a
 * reply: a turn's prompt is those ids plus the template's text after the last reply, so turn
 * N+1 reuses prompt + reply of turn N (all but the unfed last token). Ctrl-C stops the reply
 * under way, not the program. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "core/cluster.h"
#include "core/sampler.h"
#include "core/threads.h"
#include "core/util.h"
#include "models/chat.h"

typedef struct {
    const char *model_dir, *prompt, *prompt_ids, *dump_state;
    int chat, raw, jsonl, ignore_eos, validate_only;
    long n_gen, top_logprobs, echo_logprobs, ctx, threads, snapshot_at;
    long draft;                /* --spec mtp: drafts per speculative step (0: no speculation) */
    double expert_cache_mb;
    int mlock;
    int *chunks, nchunks;      /* --prefill-chunks sizes (heap) */
    int *report, nreport;      /* --weights-report positions (heap); report_on: the flag was given */
    int report_on;
    numerics num;
    sampler_params sp;
} run_opts;

/* What one run accumulates for the closing stats line. */
typedef struct {
    int prompt, generated, decode_steps;
    double prefill_s, decode_s;
} run_stats;

typedef struct {
    const run_opts *o;
    model *m;
    seq *s;
    sampler smp;
    run_stats st;
    float *logits, *lp;        /* [vocab] */
    float *rows;               /* [draft + 1][vocab] verify rows of a speculative step, or NULL */
    int *top;                  /* [top_logprobs] */
} runner;

static void usage(FILE *f) {
    fprintf(f,
            "usage: cairn run -m DIR [-p TEXT | --prompt-ids IDS | --chat] [options]\n"
            "\n"
            "  -m DIR                 checkpoint directory (config.json + safetensors + tokenizer.json)\n"
            "  -p TEXT                prompt, rendered with the model's chat template (see --raw)\n"
            "  --raw                  feed -p TEXT as plain tokens, without the chat template\n"
            "  --prompt-ids IDS       comma-separated token ids; ';' separates prompts that run one after\n"
            "                         another on the same sequence, reset in between\n"
            "  --chat                 interactive multi-turn chat on stdin (state reused across turns;\n"
            "                         /help, /reset, /exit; Ctrl-C stops the reply; with --format jsonl\n"
            "                         each turn first prints {\"turn\",\"prompt_ids\",\"reused\"})\n"
            "  -n N                   tokens to generate (default 256; 0 = prefill only)\n"
            "  --temperature T        0 = greedy (default 1.0)\n"
            "  --top-p P  --top-k K  --min-p P  --seed S   sampling filters and rng seed\n"
            "  --ignore-eos           keep generating after an end-of-sequence token\n"
            "  --spec mtp             speculative decoding: the checkpoint's MTP layer drafts, one forward\n"
            "                         call verifies (greedy output is bit-identical to plain decoding)\n"
            "  --draft K              drafts per speculative step with --spec (default 2, at most 8)\n"
            "  --format text|jsonl    text streams the reply; jsonl prints one object per token:\n"
            "                         {\"id\",\"text\",\"logprob\",\"top\":[{\"id\",\"logprob\"}...]}\n"
            "  --top-logprobs K       alternatives per token in jsonl output (default 0)\n"
            "  --numerics exact|qat   qat (default): activations rounded to BF16 where the official bf16\n"
            "                         inference holds them (residual stream, norms, projection outputs;\n"
            "                         KDA state, router, scores and logits stay f32), plus activation/KV\n"
            "                         QDQ as trained (DeepSeek V4), so logits match that inference;\n"
            "                         exact: every activation f32 (see README, Numerics)\n"
            "  --ctx N                context capacity (default: prompt + generation, chat 4096)\n"
            "  --threads N            worker threads (default: online cores)\n"
            "\n"
            "test / debug:\n"
            "  --echo-logprobs K      before generating, one JSON line per prompt position:\n"
            "                         {\"pos\":i,\"top\":[{\"id\",\"logprob\"}...]} (from every position's logits)\n"
            "  --prefill-chunks A,B   feed the prompt in forward calls of these sizes, the rest as one\n"
            "  --dump-state PATH      write the state snapshot (with rows) after the prefill\n"
            "  --snapshot-at K        after K prompt tokens: snapshot, serialize, free the sequence,\n"
            "                         restore into a new one and continue\n"
            "  --validate-only        open the model, validate every tensor (incl. MTP) and exit\n"
            "  --weights-report P,Q   open the model and print one JSON line: tensors validated, weight\n"
            "                         bytes a decode step reads, what one MTP draft step over one token\n"
            "                         reads and computes (draft_bytes, draft_flops; 0 without MTP\n"
            "                         drafting), FLOPs of a token at positions P, Q, ...\n"
            CLI_EXPERT_CACHE_HELP
            CLI_MLOCK_HELP
            "\n"
            "At exit a stats line is printed on stderr (prompt, generated, rss_mb, state bytes, tok/s).\n");
}

/* ---- flags -------------------------------------------------------------------------------- */

/* "a,b,c" of integers >= min (0 or 1) into a heap array. */
static int parse_list(const char *flag, const char *s, int min, int **out, int *n) {
    *n = 0;
    *out = xrealloc(*out, sizeof(int) * (strlen(s) / 2 + 1));
    for (const char *p = s; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < min || v > 1 << 30 || (*end && *end != ',')) {
            fprintf(stderr, "cairn run: bad value for %s: '%s' (expected integers >= %d: a,b,c)\n", flag, s, min);
            return -1;
        }
        (*out)[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return 0;
}

static int parse_flags(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_gen = 256;
    o->snapshot_at = -1;
    o->sp = (sampler_params){.temperature = 1.0f, .top_p = 1.0f};
    int spec = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d;
        long l;
        int takes = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); exit(0); }
        else if (!strcmp(a, "--chat")) { o->chat = 1; takes = 0; }
        else if (!strcmp(a, "--raw")) { o->raw = 1; takes = 0; }
        else if (!strcmp(a, "--ignore-eos")) { o->ignore_eos = 1; takes = 0; }
        else if (!strcmp(a, "--validate-only")) { o->validate_only = 1; takes = 0; }
        else if (!strcmp(a, "--mlock")) { o->mlock = 1; takes = 0; }
        else if (!v) { fprintf(stderr, "cairn run: %s needs a value (or unknown flag)\n", a); return -1; }
        else if (!strcmp(a, "-m")) o->model_dir = v;
        else if (!strcmp(a, "-p")) o->prompt = v;
        else if (!strcmp(a, "--prompt-ids")) o->prompt_ids = v;
        else if (!strcmp(a, "--dump-state")) o->dump_state = v;
        else if (!strcmp(a, "-n")) { if (cli_int("run", a, v, 0, 1 << 30, &o->n_gen)) return -1; }
        else if (!strcmp(a, "--top-logprobs")) { if (cli_int("run", a, v, 0, 1000, &o->top_logprobs)) return -1; }
        else if (!strcmp(a, "--echo-logprobs")) { if (cli_int("run", a, v, 1, 1000, &o->echo_logprobs)) return -1; }
        else if (!strcmp(a, "--ctx")) { if (cli_int("run", a, v, 1, 1 << 30, &o->ctx)) return -1; }
        else if (!strcmp(a, "--threads")) { if (cli_int("run", a, v, 1, 1024, &o->threads)) return -1; }
        else if (!strcmp(a, "--expert-cache-mb")) {
            if (cli_expert_cache_mb("run", v, &o->expert_cache_mb)) return -1;
        }
        else if (!strcmp(a, "--snapshot-at")) { if (cli_int("run", a, v, 1, 1 << 30, &o->snapshot_at)) return -1; }
        else if (!strcmp(a, "--top-k")) { if (cli_int("run", a, v, 0, 1 << 30, &l)) return -1; o->sp.top_k = (int)l; }
        else if (!strcmp(a, "--seed")) { if (cli_int("run", a, v, 0, 0x7fffffffffffffffL, &l)) return -1; o->sp.seed = (uint64_t)l; }
        else if (!strcmp(a, "--temperature")) { if (cli_float("run", a, v, &d)) return -1; o->sp.temperature = (float)d; }
        else if (!strcmp(a, "--top-p")) { if (cli_float("run", a, v, &d) || d <= 0 || d > 1) goto bad; o->sp.top_p = (float)d; }
        else if (!strcmp(a, "--min-p")) { if (cli_float("run", a, v, &d) || d < 0 || d > 1) goto bad; o->sp.min_p = (float)d; }
        else if (!strcmp(a, "--prefill-chunks")) { if (parse_list(a, v, 1, &o->chunks, &o->nchunks)) return -1; }
        else if (!strcmp(a, "--weights-report")) {
            if (parse_list(a, v, 0, &o->report, &o->nreport)) return -1;
            o->report_on = 1;
        }
        else if (!strcmp(a, "--spec")) { if (strcmp(v, "mtp")) goto bad; spec = 1; }
        else if (!strcmp(a, "--draft")) { if (cli_int("run", a, v, 1, SPEC_MAX_DRAFT, &o->draft)) return -1; }
        else if (!strcmp(a, "--format")) {
            if (strcmp(v, "text") && strcmp(v, "jsonl")) goto bad;
            o->jsonl = !strcmp(v, "jsonl");
        } else if (!strcmp(a, "--numerics")) {
            int n = cli_numerics(v);
            if (n < 0) goto bad;
            o->num = (numerics)n;
        } else { fprintf(stderr, "cairn run: unknown flag '%s' (see cairn run --help)\n", a); return -1; }
        i += takes;
        continue;
    bad:
        fprintf(stderr, "cairn run: bad value for %s: '%s'\n", a, v);
        return -1;
    }
    if (!o->model_dir) { fprintf(stderr, "cairn run: -m DIR is required (see cairn run --help)\n"); return -1; }
    if (o->draft && !spec) { fprintf(stderr, "cairn run: --draft needs --spec mtp\n"); return -1; }
    if (spec && !o->draft) o->draft = 2;
    if (!o->validate_only && !o->report_on && !o->chat + !o->prompt + !o->prompt_ids != 2) {
        fprintf(stderr, "cairn run: give exactly one of -p TEXT, --prompt-ids IDS or --chat\n");
        return -1;
    }
    return 0;
}

/* ---- prompts ------------------------------------------------------------------------------ */

typedef struct {
    int *ids;
    int n;
} prompt;

/* "1,2,3;4,5" -> prompts; every id must be inside the vocabulary. */
static int parse_prompt_ids(const char *s, int vocab, prompt **out, int *np, char *err, size_t errlen) {
    *np = 0;
    *out = NULL;
    for (const char *p = s;;) {
        prompt pr = {xmalloc(sizeof(int) * (strlen(p) / 2 + 1)), 0};
        while (*p && *p != ';') {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v >= vocab || (*end && *end != ',' && *end != ';')) {
                free(pr.ids);
                return errf(err, errlen, "--prompt-ids: bad id near '%.20s' (ids are integers in [0, %d))", p, vocab);
            }
            pr.ids[pr.n++] = (int)v;
            p = *end == ',' ? end + 1 : end;
        }
        if (!pr.n) {
            free(pr.ids);
            return errf(err, errlen, "--prompt-ids: prompt %d is empty", *np + 1);
        }
        *out = xrealloc(*out, sizeof(prompt) * (*np + 1));
        (*out)[(*np)++] = pr;
        if (!*p) return 0;
        p++;
    }
}

static int encode(const model *m, const char *text, prompt *pr, char *err, size_t errlen) {
    if (!m->tok) return errf(err, errlen, "the model has no usable tokenizer.json (use --prompt-ids)");
    size_t len = strlen(text);
    int cap = (int)len + 16;
    pr->ids = xmalloc(sizeof(int) * cap);
    pr->n = tok_encode(m->tok, text, len, pr->ids, cap, err, errlen);
    if (pr->n < 0) return -1;
    if (pr->n > cap) return errf(err, errlen, "tokenizer produced more ids than bytes");
    return 0;
}

static const chat_template *model_template(const model *m, char *err, size_t errlen) {
    const chat_template *t = m->ops->chat;
    if (!t) errf(err, errlen, "family %s has no chat template (use --raw or --prompt-ids)", m->ops->name);
    return t;
}

/* Render messages with the chat template and tokenize the result, message text as plain text. */
static int render_ids(const model *m, const cJSON *messages, prompt *pr, char *err, size_t errlen) {
    const chat_template *t = model_template(m, err, errlen);
    if (!t) return -1;
    if (!m->tok) return errf(err, errlen, "the model has no usable tokenizer.json (use --prompt-ids)");
    chat_opts co = {0};
    chat_prompt p = {0};
    int rc = t->render(messages, NULL, &co, &p, err, errlen);
    if (!rc) rc = chat_prompt_encode(m->tok, &p, &pr->ids, &pr->n, err, errlen);
    chat_prompt_free(&p);
    return rc;
}

static int text_prompt(const run_opts *o, const model *m, prompt *pr, char *err, size_t errlen) {
    if (o->raw) return encode(m, o->prompt, pr, err, errlen);
    cJSON *msgs = cJSON_CreateArray(), *u = cJSON_CreateObject();
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", o->prompt);
    cJSON_AddItemToArray(msgs, u);
    int rc = render_ids(m, msgs, pr, err, errlen);
    cJSON_Delete(msgs);
    if (!rc && pr->n == 0) return errf(err, errlen, "the prompt encodes to no tokens");
    return rc;
}

/* ---- output ------------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence starting at s (n bytes left), 0 if invalid. */
static size_t utf8_valid(const unsigned char *s, size_t n) {
    size_t len = s[0] < 0x80 ? 1 : (s[0] & 0xe0) == 0xc0 ? 2 : (s[0] & 0xf0) == 0xe0 ? 3 : (s[0] & 0xf8) == 0xf0 ? 4 : 0;
    if (!len || len > n || (len == 2 && s[0] < 0xc2)) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return len;
}

/* Heap copy of n bytes with every byte that is not valid UTF-8 replaced by U+FFFD: a reply
 * goes back into the conversation, and templates and tokenizers want valid text. */
static char *utf8_sanitize(const char *s, size_t n) {
    char *out = xmalloc(3 * n + 1), *o = out;
    for (size_t i = 0; i < n;) {
        size_t len = utf8_valid((const unsigned char *)s + i, n - i);
        const char *piece = len ? s + i : "\xef\xbf\xbd";
        size_t out_len = len ? len : 3;
        memcpy(o, piece, out_len);
        o += out_len;
        i += len ? len : 1;
    }
    *o = 0;
    return out;
}

/* JSON string of n bytes; bytes that are not valid UTF-8 (a random model can emit half a
 * character) become U+FFFD, so every line stays valid JSON. */
static void json_string(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t len = utf8_valid((const unsigned char *)s + i, n - i);
        if (!len) { fputs("\\ufffd", f); i++; continue; }
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fwrite(s + i, 1, len, f);
        i += len;
    }
    fputc('"', f);
}

/* "top":[...] of the k most likely ids under logprobs lp. */
static void json_top(runner *r, const float *lp, int k) {
    int vocab = r->m->vocab_size;
    if (k > 0) top_logprobs(lp, vocab, k, r->top);
    printf("\"top\":[");
    for (int i = 0; i < k; i++) printf("%s{\"id\":%d,\"logprob\":%.9g}", i ? "," : "", r->top[i], lp[r->top[i]]);
    printf("]");
}

static void echo_positions(runner *r, const float *all, int pos0, int n) {
    int vocab = r->m->vocab_size, k = (int)MIN(r->o->echo_logprobs, vocab);
    for (int i = 0; i < n; i++) {
        log_softmax(all + (size_t)i * vocab, vocab, r->lp);
        printf("{\"pos\":%d,", pos0 + i);
        json_top(r, r->lp, k);
        printf("}\n");
    }
    fflush(stdout);
}

/* Generated text to stdout. On a terminal, control characters other than newline and tab (C0,
 * DEL, C1) are shown as their Unicode control pictures / U+FFFD instead of being sent raw: a
 * random or hostile model must not move the cursor, clear the screen or retitle the window.
 * Piped output stays byte-exact. */
static void put_text(const char *p, size_t n) {
    static int tty = -1;
    if (tty < 0) tty = isatty(1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (!tty || c == '\n' || c == '\t' || (c >= 0x20 && c != 0x7f && !(c == 0xc2 && i + 1 < n &&
                                                                          (unsigned char)p[i + 1] >= 0x80 &&
                                                                          (unsigned char)p[i + 1] <= 0x9f))) {
            fputc(c, stdout);
        } else if (c == 0xc2) {
            fputs("\xef\xbf\xbd", stdout);
            i++;
        } else {
            unsigned pic = c == 0x7f ? 0x2421 : 0x2400 + c;
            fputc(0xe0 | (pic >> 12), stdout);
            fputc(0x80 | ((pic >> 6) & 0x3f), stdout);
            fputc(0x80 | (pic & 0x3f), stdout);
        }
    }
}

static void emit_token(runner *r, tok_stream *ts, int id) {
    char buf[256];
    size_t nb = r->m->tok ? tok_stream_put(ts, id, buf, sizeof buf) : 0;
    if (!r->o->jsonl) {
        put_text(buf, nb);
        fflush(stdout);
        return;
    }
    log_softmax(r->logits, r->m->vocab_size, r->lp);
    printf("{\"id\":%d,\"text\":", id);
    if (r->m->tok) json_string(stdout, buf, nb);
    else printf("null");
    printf(",\"logprob\":%.9g,", r->lp[id]);
    json_top(r, r->lp, (int)MIN(r->o->top_logprobs, r->m->vocab_size));
    printf("}\n");
    fflush(stdout);
}

/* ---- prefill ------------------------------------------------------------------------------ */

/* Snapshot the state, serialize it to a memory FILE, drop the sequence and restore into a new
 * one: continuing must then be indistinguishable from never having stopped. fmemopen over a
 * fixed buffer, because snapshot_write seeks back to finish its header and an open_memstream
 * would shrink to that position. */
static int snapshot_roundtrip(runner *r, char *err, size_t errlen) {
    snapshot *snap = state_snapshot(&r->s->st, 1);
    if (!snap) return errf(err, errlen, "out of memory taking a snapshot");
    size_t cap = snapshot_bytes(snap) + 4096;
    char *buf = malloc(cap);
    FILE *mf = buf ? fmemopen(buf, cap, "w+b") : NULL;
    int rc = mf ? snapshot_write(snap, r->m->fingerprint, mf, err, errlen) : errf(err, errlen, "no memory FILE");
    snapshot_free(snap);
    int ctx = r->s->st.cap;
    seq_free(r->s);
    r->s = NULL;
    snap = NULL;
    if (!rc) {
        rewind(mf);
        snap = snapshot_read(mf, r->m->fingerprint, err, errlen);
    }
    if (mf) fclose(mf);
    free(buf);
    if (!snap) return -1;
    r->s = seq_new(r->m, ctx, err, errlen);
    rc = r->s ? state_restore(&r->s->st, snap) : -1;
    snapshot_free(snap);
    if (r->s && rc) return errf(err, errlen, "state_restore failed (%d)", rc);
    return r->s ? 0 : -1;
}

/* Where forward calls end: after each --prefill-chunks size, at --snapshot-at, and at n. */
static int segment_ends(const run_opts *o, int n, int *ends) {
    int ne = 0, at = 0;
    for (int i = 0; i < o->nchunks && at + o->chunks[i] < n; i++) ends[ne++] = at += o->chunks[i];
    ends[ne++] = n;
    if (o->snapshot_at > 0 && o->snapshot_at < n) {
        int k = (int)o->snapshot_at, i = ne;
        while (i > 0 && ends[i - 1] > k) { ends[i] = ends[i - 1]; i--; }
        if (i > 0 && ends[i - 1] == k) memmove(ends + i, ends + i + 1, sizeof(int) * (ne - i));
        else { ends[i] = k; ne++; }
    }
    return ne;
}

static int prefill(runner *r, const prompt *pr, char *err, size_t errlen) {
    const run_opts *o = r->o;
    int vocab = r->m->vocab_size;
    if (o->snapshot_at > pr->n) return errf(err, errlen, "--snapshot-at %ld is beyond the prompt (%d tokens)", o->snapshot_at, pr->n);
    int *ends = xmalloc(sizeof(int) * (o->nchunks + 2));
    int ne = segment_ends(o, pr->n, ends);
    float *all = o->echo_logprobs ? malloc(sizeof(float) * pr->n * vocab) : NULL;
    if (o->echo_logprobs && !all) {
        free(ends);
        return errf(err, errlen, "out of memory for %d x %d echo logits", pr->n, vocab);
    }
    double t0 = now_seconds();
    int rc = 0;
    for (int i = 0, at = 0; i < ne && !rc; at = ends[i++]) {
        int k = ends[i] - at, usual = r->s->chunk;
        /* With --prefill-chunks each segment is one forward call, as the flag says, even past the
         * sequence's usual call size: that is how tests reach the families' internal passes. */
        if (o->nchunks) r->s->chunk = MAX(usual, k);
        rc = all ? seq_feed_all(r->s, pr->ids + at, k, all + (size_t)at * vocab, err, errlen)
                 : seq_feed(r->s, pr->ids + at, k, ends[i] == pr->n ? r->logits : NULL, err, errlen);
        r->s->chunk = usual;
        if (!rc && ends[i] == o->snapshot_at) rc = snapshot_roundtrip(r, err, errlen);
    }
    r->st.prefill_s += now_seconds() - t0;
    r->st.prompt += pr->n;
    if (!rc && all) {
        memcpy(r->logits, all + (size_t)(pr->n - 1) * vocab, sizeof(float) * vocab);
        echo_positions(r, all, 0, pr->n);
    }
    free(all);
    free(ends);
    return rc;
}

static int dump_state(runner *r, char *err, size_t errlen) {
    snapshot *snap = state_snapshot(&r->s->st, 1);
    if (!snap) return errf(err, errlen, "out of memory taking a snapshot for --dump-state");
    FILE *f = fopen(r->o->dump_state, "wb");
    int rc = f ? snapshot_write(snap, r->m->fingerprint, f, err, errlen)
               : errf(err, errlen, "cannot create %s", r->o->dump_state);
    if (f && fclose(f) && !rc) rc = errf(err, errlen, "error writing %s", r->o->dump_state);
    snapshot_free(snap);
    return rc;
}

/* ---- generation --------------------------------------------------------------------------- */

/* Set by SIGINT while --chat generates: the reply stops, the program does not. */
static volatile sig_atomic_t interrupted;

/* Emit one chosen token (r->logits: the row it was chosen from). Returns 1 when the reply ends
 * with it (EOS, n_gen reached or interrupted). */
static int emit_reply_token(runner *r, tok_stream *ts, int id, long g, prompt *reply, int *eos) {
    int stop = model_is_eos(r->m, id) && !r->o->ignore_eos;
    if (!stop || r->o->jsonl) emit_token(r, ts, id);
    r->st.generated++;
    if (reply) reply->ids[reply->n++] = id;
    if (eos) *eos = stop;
    return stop || g + 1 == r->o->n_gen || interrupted;
}

/* One speculative step after `id` was emitted as token g: feeds id and the kept drafts (never
 * past n_gen), emits the drafts and leaves the next chosen token in *id with r->logits its row.
 * An EOS among the kept drafts ends the reply: the state is cut back to before it, as plain
 * decoding never feeds an EOS. Returns 1 when the reply ended, -1 on failure. */
static int spec_step(runner *r, tok_stream *ts, int *id, long *g, prompt *reply, int *eos, char *err, size_t errlen) {
    int V = r->m->vocab_size, want = (int)MIN(r->o->draft, r->o->n_gen - *g - 2), out[SPEC_MAX_DRAFT + 1], n, kept;
    double t0 = now_seconds();
    int rc = seq_spec_step(r->s, *id, want, &r->smp, out, &n, id, r->rows, &kept, err, errlen);
    r->st.decode_s += now_seconds() - t0;
    if (rc) return -1;
    r->st.decode_steps += n;        /* tokens fed, as a plain step feeds one */
    for (int i = 1; i < n; i++) {
        memcpy(r->logits, r->rows + (size_t)(i - 1) * V, sizeof(float) * (size_t)V);
        if (emit_reply_token(r, ts, out[i], ++*g, reply, eos)) {
            state_truncate(&r->s->st, r->s->st.len - (n - i));
            return 1;
        }
    }
    memcpy(r->logits, r->rows + (size_t)(n - 1) * V, sizeof(float) * (size_t)V);
    return 0;
}

/* Sample up to n_gen tokens from r->logits; every sampled token but the last is fed back (with
 * --spec, in speculative steps while at least two tokens remain). If reply is non-NULL every
 * sampled id (an ending EOS included) is appended to it and *eos says whether an EOS ended the
 * reply. */
static int generate(runner *r, prompt *reply, int *eos, char *err, size_t errlen) {
    tok_stream ts;
    if (r->m->tok) tok_stream_init(&ts, r->m->tok);
    if (eos) *eos = 0;
    int id = r->o->n_gen ? sampler_pick(&r->smp, r->logits) : 0;
    for (long g = 0; g < r->o->n_gen; g++) {
        if (emit_reply_token(r, &ts, id, g, reply, eos)) break;
        if (r->o->draft && r->o->n_gen - g >= 3) {
            int rc = spec_step(r, &ts, &id, &g, reply, eos, err, errlen);
            if (rc < 0) return -1;
            if (rc) break;
            continue;
        }
        double t0 = now_seconds();
        int rc = seq_feed(r->s, &id, 1, r->logits, err, errlen);
        r->st.decode_s += now_seconds() - t0;
        r->st.decode_steps++;
        if (rc) return -1;
        id = sampler_pick(&r->smp, r->logits);
    }
    if (r->m->tok && !r->o->jsonl) {
        char buf[64];
        put_text(buf, tok_stream_finish(&ts, buf, sizeof buf));
    }
    if (!r->o->jsonl) printf("\n");
    fflush(stdout);
    return 0;
}

static int run_prompt(runner *r, prompt *pr, char *err, size_t errlen) {
    if (prefill(r, pr, err, errlen)) return -1;
    if (r->o->dump_state && dump_state(r, err, errlen)) return -1;
    return r->o->n_gen ? generate(r, NULL, NULL, err, errlen) : 0;
}

/* ---- chat --------------------------------------------------------------------------------- */

enum { CHAT_CKPT_MB = 256 };   /* checkpoint memory of the REPL (e.g. a /reset under a kept system prompt) */

/* The conversation as the template sees it (messages) and as the state holds it (ids: every id
 * fed or generated, in order, so a reply is never re-tokenized). */
typedef struct {
    cJSON *msgs;
    int *ids;
    int n, cap;
    int turn;
    int eos_id;                /* the EOS that ended the last reply (it is in ids), -1 if none */
    char placeholder[48];      /* stands for the last reply when the template renders the next turn */
} chat_conv;

static void conv_push(chat_conv *c, const int *ids, int n) {
    if (c->n + n > c->cap) {
        c->cap = MAX(2 * c->cap, c->n + n + 256);
        c->ids = xrealloc(c->ids, sizeof(int) * c->cap);
    }
    memcpy(c->ids + c->n, ids, sizeof(int) * n);
    c->n += n;
}

static void conv_add(chat_conv *c, const char *role, const char *content) {
    cJSON *msg = cJSON_CreateObject();
    cJSON_AddStringToObject(msg, "role", role);
    cJSON_AddStringToObject(msg, "content", content);
    cJSON_AddItemToArray(c->msgs, msg);
}

static void conv_reset(chat_conv *c) {
    cJSON_Delete(c->msgs);
    c->msgs = cJSON_CreateArray();
    c->n = 0;
    c->eos_id = -1;
}

/* The ids the template adds after the last reply: render the conversation with that reply's
 * content replaced by a placeholder no user can type, and encode what follows it (its untrusted
 * spans as plain text). When an EOS ended the reply and the template writes that very token next,
 * it is already in c->ids (the model generated it), so its text is skipped; an EOS the template
 * does not write is dropped from c->ids (it was never fed). */
static int turn_tail(const model *m, chat_conv *c, prompt *out, char *err, size_t errlen) {
    cJSON *last = cJSON_GetArrayItem(c->msgs, cJSON_GetArraySize(c->msgs) - 2);
    cJSON *real = cJSON_DetachItemFromObject(last, "content");
    cJSON_AddStringToObject(last, "content", c->placeholder);
    chat_opts co = {0};
    chat_prompt p = {0};
    int rc = m->ops->chat->render(c->msgs, NULL, &co, &p, err, errlen);
    cJSON_DeleteItemFromObject(last, "content");
    cJSON_AddItemToObject(last, "content", real);
    const char *at = rc ? NULL : strstr(p.text.p, c->placeholder);
    if (!rc && (!at || strstr(at + 1, c->placeholder)))
        rc = errf(err, errlen, "the chat template did not render the last reply where the REPL can find it");
    if (!rc) {
        size_t from = (size_t)(at - p.text.p) + strlen(c->placeholder);
        char *eos = c->eos_id >= 0 ? tok_decode(m->tok, &c->eos_id, 1, NULL) : NULL;
        if (eos && *eos && !strncmp(p.text.p + from, eos, strlen(eos))) from += strlen(eos);
        else if (c->eos_id >= 0) c->n--;
        free(eos);
        chat_prompt tail = {0};
        chat_prompt_tail(&p, from, &tail);
        rc = chat_prompt_encode(m->tok, &tail, &out->ids, &out->n, err, errlen);
        chat_prompt_free(&tail);
    }
    chat_prompt_free(&p);
    return rc;
}

static void print_turn(const runner *r, const chat_conv *c, int reused) {
    fprintf(stderr, "[reused %d of %d prompt tokens]\n", reused, c->n);
    if (!r->o->jsonl) return;
    printf("{\"turn\":%d,\"prompt_ids\":[", c->turn);
    for (int i = 0; i < c->n; i++) printf("%s%d", i ? "," : "", c->ids[i]);
    printf("],\"reused\":%d}\n", reused);
    fflush(stdout);
}

/* One turn: the new prompt ids (the whole rendering on the first turn, else the exact ids so far
 * plus the template's tail), the shared reuse path, then the reply. */
static int chat_turn(runner *r, chat_conv *c, store *cs, char *err, size_t errlen) {
    interrupted = 0;           /* from here a Ctrl-C stops this turn's reply */
    prompt add = {NULL, 0};
    int rc = c->n ? turn_tail(r->m, c, &add, err, errlen) : render_ids(r->m, c->msgs, &add, err, errlen);
    if (!rc) conv_push(c, add.ids, add.n);
    free(add.ids);
    if (rc) return -1;
    if (c->n > r->s->st.cap) return errf(err, errlen, "conversation (%d tokens) exceeds --ctx %d", c->n, r->s->st.cap);
    reuse_result rr;
    double t0 = now_seconds();
    if (seq_prompt(r->s, cs, c->ids, c->n, 0, r->logits, &rr, err, errlen)) return -1;
    r->st.prefill_s += now_seconds() - t0;
    r->st.prompt += c->n - rr.reused;
    c->turn++;
    print_turn(r, c, rr.reused);
    prompt reply = {xmalloc(sizeof(int) * (r->o->n_gen + 1)), 0};
    int eos = 0;
    rc = generate(r, &reply, &eos, err, errlen);
    if (interrupted) fprintf(stderr, "[reply stopped]\n");
    conv_push(c, reply.ids, reply.n);
    c->eos_id = eos ? reply.ids[reply.n - 1] : -1;
    size_t n = 0;
    char *raw = r->m->tok ? tok_decode(r->m->tok, reply.ids, reply.n - eos, &n) : xstrdup("");
    char *text = utf8_sanitize(raw, n);
    conv_add(c, "assistant", text);
    free(raw);
    free(text);
    free(reply.ids);
    return rc;
}

static void on_sigint(int sig) { interrupted = 1; }

static const char chat_help[] =
    "commands: /help this text, /reset start a new conversation, /exit quit (or Ctrl-D);\n"
    "Ctrl-C stops the reply being written. Anything else is your next message.\n";

static int chat_repl(runner *r, char *err, size_t errlen) {
    if (!model_template(r->m, err, errlen)) return -1;
    if (!r->m->tok) return errf(err, errlen, "--chat needs a usable tokenizer.json");
    chat_conv c = {.msgs = cJSON_CreateArray(), .eos_id = -1};
    snprintf(c.placeholder, sizeof c.placeholder, "cairn-reply-%016llx",
             (unsigned long long)(fnv64(FNV64_INIT, &r, sizeof r) ^ (uint64_t)(now_seconds() * 1e9)));
    struct sigaction sa = {.sa_handler = on_sigint, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    store *cs = store_new((size_t)CHAT_CKPT_MB << 20);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    for (;;) {
        fprintf(stderr, "> ");
        if ((len = getline(&line, &cap, stdin)) < 0) break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!len) continue;
        if (!strcmp(line, "/exit")) break;
        if (!strcmp(line, "/help")) { fputs(chat_help, stderr); continue; }
        if (!strcmp(line, "/reset")) { conv_reset(&c); fprintf(stderr, "[new conversation]\n"); continue; }
        conv_add(&c, "user", line);
        if ((rc = chat_turn(r, &c, cs, err, errlen))) break;
    }
    signal(SIGINT, SIG_DFL);
    store_free(cs);
    free(line);
    free(c.ids);
    cJSON_Delete(c.msgs);
    return rc;
}

/* ---- main --------------------------------------------------------------------------------- */

/* Decimals that keep three significant digits of a rate (at least two; never an exponent, so
 * 0.00417 tok/s of a real-shape decode step is not printed as 0.00). */
static int rate_decimals(double v) {
    int d = 2;
    for (double x = v; x > 0 && x < 10 && d < 9; x *= 10) d++;
    return d;
}

static void print_stats(const runner *r) {
    const state *st = r->s ? &r->s->st : NULL;
    double prefill = r->st.prefill_s > 0 ? r->st.prompt / r->st.prefill_s : 0;
    double decode = r->st.decode_s > 0 ? r->st.decode_steps / r->st.decode_s : 0;
    fprintf(stderr,
            "cairn: prompt=%d generated=%d rss_mb=%.1f state_bytes_per_token=%zu state_fixed_bytes=%zu "
            "prefill_tok_s=%.*f decode_tok_s=%.*f locked_bytes=%zu\n",
            r->st.prompt, r->st.generated, rss_bytes() / 1048576.0, st ? state_bytes_per_token(st) : 0,
            st ? state_fixed_bytes(st) : 0, rate_decimals(prefill), prefill, rate_decimals(decode), decode,
            r->m->locked_bytes);
    if (experts_cached(r->m->experts)) {
        char line[1024];
        experts_stats_line(r->m->experts, line, sizeof line);
        fprintf(stderr, "cairn: %s\n", line);
    }
    if (cluster_size() > 1) {
        char line[512];
        experts_parallel_line(r->m->experts, line, sizeof line);
        fprintf(stderr, "cairn: %s\n", line);
    }
}

static int run_model(runner *r, prompt *prompts, int np, char *err, size_t errlen) {
    const run_opts *o = r->o;
    int longest = 0;
    for (int i = 0; i < np; i++) longest = MAX(longest, prompts[i].n);
    long ctx = o->ctx ? o->ctx : o->chat ? 4096 : longest + o->n_gen;
    ctx = MIN(ctx, r->m->max_ctx);
    if (!(r->s = seq_new(r->m, (int)ctx, err, errlen))) return -1;
    for (int i = 0; i < np; i++) {
        if (i) state_reset(&r->s->st);
        if (run_prompt(r, &prompts[i], err, errlen)) return -1;
    }
    return o->chat ? chat_repl(r, err, errlen) : 0;
}

static int load_prompts(const run_opts *o, const model *m, prompt **prompts, int *np, char *err, size_t errlen) {
    *np = 0;
    *prompts = NULL;
    if (o->prompt_ids) return parse_prompt_ids(o->prompt_ids, m->vocab_size, prompts, np, err, errlen);
    if (!o->prompt) return 0;
    *prompts = xcalloc(1, sizeof(prompt));
    *np = 1;
    return text_prompt(o, m, &(*prompts)[0], err, errlen);
}

/* The tensor table's accounting (core/tensor_table.h) as one JSON line, for checks from outside. */
static void print_weights_report(const model *m, const int *pos, int n) {
    printf("{\"validated\":%d,\"decode_bytes\":%zu,\"draft_bytes\":%zu,\"draft_flops\":%.17g,\"token_flops\":{",
           m->n_validated, model_decode_bytes(m), tt_draft_bytes(&m->weights), tt_draft_flops(&m->weights));
    for (int i = 0; i < n; i++) printf("%s\"%d\":%.17g", i ? "," : "", pos[i], model_token_flops(m, pos[i]));
    printf("}}\n");
}

int cmd_run(int argc, char **argv) {
    run_opts o;
    if (parse_flags(argc, argv, &o)) return 2;
    if (o.threads) pool_set_threads((int)o.threads);
    char err[512] = "";
    model *m = model_open(o.model_dir, o.num, isatty(2), err, sizeof err);
    if (!m) { fprintf(stderr, "cairn run: %s\n", err); return 1; }
    if (o.mlock) cli_mlock("run", m);
    if (cli_expert_cache("run", m, o.expert_cache_mb, NULL)) {
        model_close(m);
        free(o.chunks);
        free(o.report);
        return 1;
    }
    if (o.validate_only || o.report_on) {
        if (o.report_on) print_weights_report(m, o.report, o.nreport);
        else printf("cairn: validated %d tensors\n", m->n_validated);
        model_close(m);
        free(o.chunks);
        free(o.report);
        return 0;
    }
    if (o.draft && !(m->draft_layers && m->ops->draft)) {
        fprintf(stderr, "cairn run: --spec mtp: %s has no MTP layer this engine can draft with\n", o.model_dir);
        model_close(m);
        free(o.chunks);
        return 1;
    }
    m->spec_mtp = o.draft > 0;
    runner r = {.o = &o, .m = m};
    r.logits = xmalloc(sizeof(float) * m->vocab_size);
    r.rows = o.draft ? xmalloc(sizeof(float) * (size_t)(o.draft + 1) * m->vocab_size) : NULL;
    r.lp = xmalloc(sizeof(float) * m->vocab_size);
    r.top = xmalloc(sizeof(int) * (MAX(o.top_logprobs, o.echo_logprobs) + 1));
    sampler_init(&r.smp, &o.sp, m->vocab_size);
    prompt *prompts;
    int np, rc = load_prompts(&o, m, &prompts, &np, err, sizeof err);
    if (!rc) rc = run_model(&r, prompts, np, err, sizeof err);
    if (rc) fprintf(stderr, "cairn run: %s\n", err);
    print_stats(&r);
    for (int i = 0; i < np; i++) free(prompts[i].ids);
    free(prompts);
    sampler_free(&r.smp);
    free(r.logits);
    free(r.rows);
    free(r.lp);
    free(r.top);
    seq_free(r.s);
    model_close(m);
    free(o.chunks);
    return rc ? 1 : 0;
}
