#include "openai.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/util.h"
#include "audio_in.h"
#include "constrain.h"
#include "params.h"
#include "sse.h"

#define OA_PROMPTS_MAX 16        /* prompts in one batched completions request */
#define OA_N_MAX 8                /* choices per prompt (n) */

/* One OpenAI request in flight; owned by the handler, or by the stream once streaming. A request
 * with n > 1 or a batch of prompts has one choice per (prompt, n): they run one after another on
 * the same engine, choice i with seed + i % n, and the response lists them by index. */
typedef struct {
    serve_ctx *sc;
    int chat;                     /* chat.completion vs text_completion */
    int stream, include_usage;
    int top_n;                    /* completions: alternatives per token in logprobs */
    int echo;                     /* completions: the prompt leads each choice's text */
    api_call call;                /* the choice running now */
    int n;                        /* choices per prompt */
    int choice, nchoices;         /* current index, total */
    turn_req *queued;             /* the requests of choices choice+1.. (nchoices - 1 slots) */
    cJSON *choices;               /* non-streaming: the finished choices */
    int prompt_tokens, completion_tokens, cached;   /* usage over every choice */
    char id[48];
    long created;
    struct MHD_Connection *conn;  /* for starting the next choice */
    int role_sent;                /* the current choice's first chunk went out */
    int lp_sent;                  /* scored tokens whose logprobs were sent */
    size_t lp_offset;             /* completions: text offset of the next one */
} oa_call;

/* ---- request validation -------------------------------------------------------------------- */

static int is_role(const char *r) {
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (!strcmp(r, roles[i])) return 1;
    return 0;
}

static int is_part(const cJSON *part, const char *type) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "type");
    return cJSON_IsString(t) && !strcmp(t->valuestring, type);
}

/* A user content with input_audio parts, for a model that takes audio (media != NULL): the list of
 * its text parts and decoded audio parts (audio_in.h), the frames appended to media. */
static cJSON *audio_content(const cJSON *c, int index, const char *role, sbuf *media, http_err *e) {
    if (!media)
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", "messages",
                            "messages[%d].content: input_audio parts need a model that takes audio input", index), NULL;
    if (strcmp(role, "user"))
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", "messages",
                            "messages[%d].content: input_audio parts belong in user messages", index), NULL;
    cJSON *out = cJSON_CreateArray();
    int k = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        cJSON *p = NULL;
        if (is_part(part, "input_audio")) p = audio_in_part(part, index, k, media, e);
        else if ((is_part(part, "text") || is_part(part, "input_text")) && cJSON_IsString(text)) {
            p = cJSON_CreateObject();
            cJSON_AddStringToObject(p, "type", "text");
            cJSON_AddStringToObject(p, "text", text->valuestring);
        } else
            http_err_set(e, 400, "invalid_request_error", "invalid_value", "messages",
                         "messages[%d].content[%d]: only text and input_audio parts are supported", index, k);
        if (!p) { cJSON_Delete(out); return NULL; }
        cJSON_AddItemToArray(out, p);
        k++;
    }
    return out;
}

static int has_audio(const cJSON *c) {
    const cJSON *part;
    cJSON_ArrayForEach(part, c) if (is_part(part, "input_audio")) return 1;
    return 0;
}

/* A message content (string, null, or a list of text parts) as one string. */
static char *content_text(const cJSON *c, int index, http_err *e) {
    if (!c || cJSON_IsNull(c)) return xstrdup("");
    if (cJSON_IsString(c)) return xstrdup(c->valuestring);
    if (!cJSON_IsArray(c)) {
        http_err_set(e, 400, "invalid_request_error", "invalid_value", "messages",
                     "messages[%d].content must be a string or a list of content parts", index);
        return NULL;
    }
    sbuf b = {0};
    sbuf_puts(&b, "");
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (cJSON_IsString(type) && (!strcmp(type->valuestring, "text") || !strcmp(type->valuestring, "input_text")) &&
            cJSON_IsString(text)) {
            sbuf_puts(&b, text->valuestring);
            continue;
        }
        sbuf_free(&b);
        http_err_set(e, 400, "invalid_request_error", "invalid_value", "messages",
                     "messages[%d].content: only text parts are supported by this model", index);
        return NULL;
    }
    return b.p;
}

static int check_tool_calls(const cJSON *calls, int index, http_err *e) {
    if (!cJSON_IsArray(calls)) goto bad;
    const cJSON *tc;
    cJSON_ArrayForEach(tc, calls) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || (args && !cJSON_IsString(args))) goto bad;
    }
    return 0;
bad:
    return http_err_set(e, 400, "invalid_request_error", "invalid_value", "messages",
                        "messages[%d].tool_calls must be a list of {id, type, function:{name, arguments}}", index);
}

cJSON *openai_normalize_messages(const cJSON *messages, sbuf *media, http_err *e) {
    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0) {
        http_err_set(e, 400, "invalid_request_error", "invalid_value", "messages", "'messages' must be a non-empty list");
        return NULL;
    }
    cJSON *out = cJSON_CreateArray();
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role) || !is_role(role->valuestring)) {
            http_err_set(e, 400, "invalid_request_error", "invalid_value", "messages",
                         "messages[%d] needs a role of system, developer, user, assistant or tool", i);
            goto fail;
        }
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        int audio = cJSON_IsArray(content) && has_audio(content);
        cJSON *value = audio ? audio_content(content, i, role->valuestring, media, e) : NULL;
        char *text = audio ? NULL : content_text(content, i, e);
        if (!value && !text) goto fail;
        cJSON *n = cJSON_CreateObject();
        cJSON_AddStringToObject(n, "role", role->valuestring);
        cJSON_AddItemToObject(n, "content", value ? value : cJSON_CreateString(text));
        free(text);
        cJSON_AddItemToArray(out, n);
        const char *copy_str[] = {"reasoning_content", "reasoning", "tool_call_id", "name"};
        for (size_t k = 0; k < sizeof copy_str / sizeof copy_str[0]; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, copy_str[k]);
            if (!v || cJSON_IsNull(v)) continue;
            if (!cJSON_IsString(v)) {
                http_err_set(e, 400, "invalid_request_error", "invalid_value", "messages",
                             "messages[%d].%s must be a string", i, copy_str[k]);
                goto fail;
            }
            cJSON_AddStringToObject(n, copy_str[k], v->valuestring);
        }
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (calls && !cJSON_IsNull(calls)) {
            if (check_tool_calls(calls, i, e)) goto fail;
            if (cJSON_GetArraySize(calls)) cJSON_AddItemToObject(n, "tool_calls", cJSON_Duplicate(calls, 1));
        }
        i++;
    }
    return out;
fail:
    cJSON_Delete(out);
    return NULL;
}

int openai_render(serve_ctx *sc, const cJSON *messages, const cJSON *tools, const chat_opts *o, turn_req *rq,
                  http_err *e) {
    if (!sc->tpl)
        return http_err_set(e, 400, "invalid_request_error", "unsupported_model", NULL,
                            "model family '%s' has no chat template; use /v1/completions", sc->family);
    char err[256] = "";
    chat_prompt p = {0};
    if (sc->tpl->render(messages, tools, o, &p, err, sizeof err)) {
        chat_prompt_free(&p);
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", "messages", "cannot render the chat: %s", err);
    }
    rq->prompt_len = p.text.len;
    rq->prompt = sbuf_take(&p.text);
    rq->untrusted = p.untrusted;    /* message text is encoded as plain text by the engine */
    rq->nuntrusted = p.nuntrusted;
    rq->prefix_bytes = sc->tpl->system_prefix_bytes ? sc->tpl->system_prefix_bytes(rq->prompt, rq->prompt_len) : 0;
    rq->chat = 1;
    rq->thinking = o->thinking;
    if (!sc->replies || !sc->tok) return 0;
    sbuf ids = {0};
    int rc = replies_splice(sc->replies, sc->tok, sc->tpl, o, messages, rq->prompt, rq->prompt_len, rq->untrusted,
                            rq->nuntrusted, rq->prefix_bytes, &ids, &rq->ids_prefix, err, sizeof err);
    if (rc < 0)
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", "messages", "cannot tokenize the chat: %s", err);
    rq->ids_len = ids.len;
    rq->ids = rc > 0 ? sbuf_take(&ids) : NULL;
    return 0;
}

static int check_tools(const cJSON *tools, http_err *e) {
    if (!cJSON_IsArray(tools)) goto bad;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || !*name->valuestring) goto bad;
    }
    return 0;
bad:
    return http_err_set(e, 400, "invalid_request_error", "invalid_value", "tools",
                        "'tools' must be a list of {type:'function', function:{name, description, parameters}}");
}

static int tool_declared(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return 1;
    }
    return 0;
}

/* tool_choice: "auto" | "none" | "required" | {type:"function", function:{name}} (declared). */
static int parse_tool_choice(const cJSON *body, const cJSON *tools, chat_opts *o, http_err *e) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(body, "tool_choice");
    if (!tc || cJSON_IsNull(tc)) return 0;
    if (cJSON_IsString(tc) && (!strcmp(tc->valuestring, "auto") || !strcmp(tc->valuestring, "none") ||
                               !strcmp(tc->valuestring, "required"))) {
        o->tool_choice = tc->valuestring;
    } else {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tc, "function"), "name");
        if (!cJSON_IsString(n))
            return http_err_set(e, 400, "invalid_request_error", "invalid_value", "tool_choice",
                                "'tool_choice' must be auto, none, required or {type:'function', function:{name}}");
        o->tool_choice = n->valuestring;
    }
    int needs_tools = strcmp(o->tool_choice, "auto") && strcmp(o->tool_choice, "none");
    if (needs_tools && !tools)
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", "tool_choice",
                            "'tool_choice' %s needs 'tools'", o->tool_choice);
    if (needs_tools && strcmp(o->tool_choice, "required") && !tool_declared(tools, o->tool_choice))
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", "tool_choice",
                            "tool_choice names '%s', which is not in 'tools'", o->tool_choice);
    return 0;
}

int openai_effort(const serve_ctx *sc, const char *effort, const char *param, http_err *e) {
    static const char *const ok[] = {"none", "minimal", "low", "medium", "high", "xhigh", "max"};
    int known = 0;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) known |= !strcmp(effort, ok[i]);
    if (!known)
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", param,
                            "'%s' must be one of none, minimal, low, medium, high, xhigh, max", param);
    char list[128];
    if (sc->tpl && strcmp(effort, "none") && !chat_effort_accepted(sc->tpl, effort, list, sizeof list))
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", param,
                            "'%s' '%s' is not accepted by this model's chat format (it takes %s%s)", param, effort, list,
                            strcmp(list, "none") ? "" : "; it has no effort levels, thinking is only on or off: "
                                                        "the thinking / enable_thinking booleans");
    return 0;
}

/* Thinking mode: reasoning_effort (anything but "none" turns it on), or the boolean extensions
 * `thinking` / `enable_thinking`. Off by default. */
static int parse_thinking(const serve_ctx *sc, const cJSON *body, chat_opts *o, http_err *e) {
    const char *effort = NULL;
    /* OpenAI caps no reasoning tokens; the `reasoning` object some proxies take (OpenRouter's
     * {effort, max_tokens}) is no Chat Completions field, and ignoring its cap would be silent */
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(body, "reasoning");
    if (r && !cJSON_IsNull(r))
        return http_err_set(e, 400, "invalid_request_error", "unsupported_parameter", "reasoning",
                            "'reasoning' is not a Chat Completions field: use reasoning_effort (a reasoning "
                            "token budget is Anthropic's thinking.budget_tokens, on /v1/messages)");
    if (param_str(body, "reasoning_effort", &effort, e)) return -1;
    if (effort) {
        if (openai_effort(sc, effort, "reasoning_effort", e)) return -1;
        o->thinking = strcmp(effort, "none") != 0;
        o->effort = o->thinking ? effort : NULL;
    }
    if (param_bool(body, "thinking", &o->thinking, e)) return -1;
    if (param_bool(body, "enable_thinking", &o->thinking, e)) return -1;
    return 0;
}

static int parse_stream(const cJSON *body, oa_call *k, http_err *e) {
    if (param_bool(body, "stream", &k->stream, e)) return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(body, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so))
            return http_err_set(e, 400, "invalid_request_error", "invalid_value", "stream_options", "'stream_options' must be an object");
        if (param_bool(so, "include_usage", &k->include_usage, e)) return -1;
    }
    return 0;
}

/* Fields every OpenAI generation endpoint shares. */
static int parse_common(serve_ctx *sc, const cJSON *body, oa_call *k, http_err *e) {
    if (!cJSON_IsObject(body)) return http_err_set(e, 400, "invalid_request_error", "invalid_json", NULL, "the body must be a JSON object");
    if (param_model(sc, body, e)) return -1;
    long n = 1;
    if (param_int(body, "n", 1, OA_N_MAX, &n, NULL, e)) return -1;
    k->n = (int)n;
    if (param_penalties(body, sc->tok ? tok_vocab_size(sc->tok) : 1 << 30, &k->call.rq, e)) return -1;
    const char *user = NULL;
    if (param_str(body, "user", &user, e)) return -1;
    if (param_slot(sc, body, user, &k->call.rq, e)) return -1;
    if (param_sampling(body, 2.0, &k->call.rq, e)) return -1;
    if (param_stops(body, "stop", &k->call.rq, e)) return -1;
    return parse_stream(body, k, e);
}

/* Every choice's request: one per (prompt, n), in the order of their indexes, choice i of a
 * prompt with seed + i. prompts[0..np) are consumed; the first becomes k->call.rq. */
static void plan_choices(oa_call *k, turn_req *prompts, int np) {
    k->nchoices = np * k->n;
    k->queued = xcalloc((size_t)k->nchoices, sizeof *k->queued);
    for (int c = 1; c < k->nchoices; c++) {
        turn_req_copy(&k->queued[c - 1], &prompts[c / k->n]);
        k->queued[c - 1].seed += (unsigned long long)(c % k->n);
    }
    k->call.rq = prompts[0];
    for (int i = 1; i < np; i++) turn_req_free(&prompts[i]);
}

static int parse_chat(serve_ctx *sc, const cJSON *body, oa_call *k, http_err *e) {
    static const char *const budget[] = {"max_completion_tokens", "max_tokens", NULL};
    if (parse_common(sc, body, k, e) || param_max_tokens(sc, body, budget, 0, &k->call.rq, e)) return -1;
    int logprobs = 0;
    long top = 0;
    if (param_bool(body, "logprobs", &logprobs, e)) return -1;
    if (param_int(body, "top_logprobs", 0, 20, &top, NULL, e)) return -1;
    if (top && !logprobs)
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    k->call.rq.logprobs = logprobs;
    k->call.rq.top_logprobs = (int)top;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
    if (tools && cJSON_IsNull(tools)) tools = NULL;
    if (tools && check_tools(tools, e)) return -1;
    if (tools && cJSON_GetArraySize(tools) == 0) tools = NULL;
    chat_opts o = {0};
    int parallel = 1;
    if (parse_tool_choice(body, tools, &o, e) || parse_thinking(sc, body, &o, e)) return -1;
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(body, "response_format");
    o.response_format = cJSON_IsObject(rf) ? rf : NULL;     /* validated with the grammar (constrain.c) */
    if (param_bool(body, "parallel_tool_calls", &parallel, e)) return -1;
    sbuf media = {0};
    cJSON *msgs = openai_normalize_messages(cJSON_GetObjectItemCaseSensitive(body, "messages"),
                                            sc->tpl && sc->tpl->audio ? &media : NULL, e);
    int rc = msgs ? openai_render(sc, msgs, tools, &o, &k->call.rq, e) : -1;
    cJSON_Delete(msgs);
    k->call.rq.media_len = media.len;           /* the DMel frames travel after the span table */
    k->call.rq.media = sbuf_take(&media);
    constrain_opts c = {.response_format = 1, .tools = tools, .tool_choice = o.tool_choice, .parallel = parallel,
                        .thinking = o.thinking};
    if (rc || constrain_request(sc, body, &c, &k->call.rq, e)) return -1;
    turn_req one = k->call.rq;
    plan_choices(k, &one, 1);
    return 0;
}

/* One completions prompt: a string or a list of token ids. */
static int parse_prompt(serve_ctx *sc, const cJSON *p, turn_req *rq, http_err *e) {
    if (cJSON_IsString(p)) {
        if (!*p->valuestring) return http_err_set(e, 400, "invalid_request_error", "invalid_value", "prompt", "'prompt' is empty");
        rq->prompt = xstrdup(p->valuestring);
        rq->prompt_len = strlen(rq->prompt);
        return 0;
    }
    if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) == 0)
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", "prompt",
                            "'prompt' must be a string, a non-empty list of token ids, or a list of those");
    int vocab = sc->tok ? tok_vocab_size(sc->tok) : 1 << 30;
    sbuf b = {0};
    const cJSON *id;
    cJSON_ArrayForEach(id, p) {
        double d = id->valuedouble;
        if (!cJSON_IsNumber(id) || !(d >= 0 && d < vocab) || d != floor(d)) {   /* range first: (long)1e300 is UB */
            sbuf_free(&b);
            return http_err_set(e, 400, "invalid_request_error", "invalid_value", "prompt",
                                "'prompt' token ids must be integers in [0, %d)", vocab);
        }
        sbuf_printf(&b, "%s%ld", b.len ? " " : "", (long)d);
    }
    rq->prompt = b.p;
    rq->prompt_len = b.len;
    rq->prompt_is_ids = 1;
    return 0;
}

static int parse_completion(serve_ctx *sc, const cJSON *body, oa_call *k, http_err *e) {
    static const char *const budget[] = {"max_tokens", NULL};
    if (parse_common(sc, body, k, e) || param_max_tokens(sc, body, budget, 0, &k->call.rq, e)) return -1;
    if (param_bool(body, "echo", &k->echo, e)) return -1;
    const char *suffix = NULL;
    if (param_str(body, "suffix", &suffix, e)) return -1;
    if (suffix && *suffix) return http_err_set(e, 400, "invalid_request_error", "invalid_value", "suffix", "'suffix' is not supported");
    long best_of, lp = 0;
    int has_lp = 0;
    if (param_int(body, "best_of", 1, 1, &best_of, NULL, e)) return -1;
    if (param_int(body, "logprobs", 0, ENG_TOPK_MAX, &lp, &has_lp, e)) return -1;
    if (k->echo && has_lp)
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", "echo",
                            "'echo' with 'logprobs' needs the prompt's logprobs, which the engine does not score");
    k->call.rq.logprobs = has_lp;
    k->call.rq.top_logprobs = (int)lp;
    k->top_n = (int)lp;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    if (!p) return http_err_set(e, 400, "invalid_request_error", "invalid_value", "prompt", "'prompt' is required");
    constrain_opts c = {.response_format = 1};
    if (constrain_request(sc, body, &c, &k->call.rq, e)) return -1;
    /* A list whose members are strings or lists is a batch (one prompt each). */
    int batch = cJSON_IsArray(p) && (cJSON_IsString(p->child) || cJSON_IsArray(p->child));
    int np = batch ? cJSON_GetArraySize(p) : 1;
    if (np > OA_PROMPTS_MAX)
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", "prompt",
                            "at most %d prompts in one request", OA_PROMPTS_MAX);
    turn_req *prompts = xcalloc((size_t)np, sizeof *prompts);
    for (int i = 0; i < np; i++) {
        turn_req_copy(&prompts[i], &k->call.rq);
        if (parse_prompt(sc, batch ? cJSON_GetArrayItem(p, i) : p, &prompts[i], e)) {
            for (int j = 0; j <= i; j++) turn_req_free(&prompts[j]);
            free(prompts);
            return -1;
        }
    }
    turn_req_free(&k->call.rq);
    plan_choices(k, prompts, np);
    free(prompts);
    return 0;
}

/* ---- responses ----------------------------------------------------------------------------- */

static cJSON *usage_json(const oa_call *k) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", k->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", k->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", k->prompt_tokens + k->completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", k->cached);
    return u;
}

/* The finished choice counts: its completion, and its prompt once per prompt (the first of its n
 * choices, which is also the one whose reuse the prompt's cached tokens are). */
static void account(oa_call *k) {
    const turn *t = &k->call.t;
    if (k->choice % k->n == 0) {
        k->prompt_tokens += t->prompt_tokens;
        k->cached += t->reused;
    }
    k->completion_tokens += t->completion_tokens;
}

/* completions echo: the prompt as text (token-id prompts decoded). */
static char *echo_text(const oa_call *k) {
    size_t len;
    return turn_prompt_text(k->sc, &k->call.rq, &len);
}

/* usage, and beside it llama.cpp's `timings` from the engine's own clocks: prompt_n tokens were
 * prefilled in prompt_ms (cache_n came from the state), decoding ran at predicted_per_second.
 * The chat page's per-message line reads it; clients that do not know the field ignore it. */
static void add_usage(cJSON *r, const oa_call *k) {
    const turn *t = &k->call.t;     /* with several choices: the last one's clocks */
    cJSON_AddItemToObject(r, "usage", usage_json(k));
    cJSON *tm = cJSON_AddObjectToObject(r, "timings");
    int prefilled = t->prompt_tokens - t->reused;
    cJSON_AddNumberToObject(tm, "cache_n", t->reused);
    cJSON_AddNumberToObject(tm, "prompt_n", prefilled);
    cJSON_AddNumberToObject(tm, "prompt_ms", t->prefill_s * 1e3);
    if (t->prefill_s > 0) cJSON_AddNumberToObject(tm, "prompt_per_second", prefilled / t->prefill_s);
    cJSON_AddNumberToObject(tm, "predicted_n", t->completion_tokens);
    cJSON_AddNumberToObject(tm, "predicted_per_second", t->tok_s);
}

/* One generated token for the logprob tables: the DATA frame that carried its logprobs, plus
 * any following frames without logprobs (bytes the engine's decoder released late). */
typedef struct {
    const eng_token *k;
    size_t off, len;
} scored_token;

/* The scored tokens of the reply so far (after a stop string, only those up to the cut). Heap array. */
static int scored_tokens(const turn *t, scored_token **out) {
    scored_token *v = xcalloc((size_t)t->ntoks + 1, sizeof *v);
    int n = 0;
    size_t cum = 0;
    for (int i = 0; i < t->ntoks && (!t->out.stopped || cum < t->out.len); i++) {
        const eng_token *k = &t->toks[i];
        if (k->has_lp || n == 0) v[n++] = (scored_token){k, k->off, k->len};
        else v[n - 1].len += k->len;
        cum += k->len;
    }
    *out = v;
    return n;
}

static char *token_string(const turn *t, const scored_token *st) {
    return utf8_clean(t->raw.p + st->off, st->len, NULL);
}

static cJSON *raw_bytes_json(const char *p, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)p[i]));
    return a;
}

/* A token's own bytes (not the U+FFFD its text shows when they are not UTF-8 alone): from the
 * tokenizer when the frame named the id, else the bytes the frames delivered for it. */
static cJSON *token_bytes_json(const turn *t, int id, const char *fallback, size_t n) {
    size_t len = 0;
    char *raw = id >= 0 && t->sc->tok && id < tok_vocab_size(t->sc->tok) ? tok_decode(t->sc->tok, &id, 1, &len) : NULL;
    cJSON *a = raw ? raw_bytes_json(raw, len) : raw_bytes_json(fallback, n);
    free(raw);
    return a;
}

/* Characters (code points) of UTF-8 text: OpenAI's text_offset counts characters, not bytes. */
static size_t utf8_chars(const char *s) {
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) n += (*p & 0xC0) != 0x80;
    return n;
}

static int by_logprob_desc(const void *a, const void *b) {
    float x = ((const float *)a)[1], y = ((const float *)b)[1];
    return (x < y) - (x > y);
}

/* The engine's top-k table is unsorted: sort (id, lp) pairs, best first. Returns the count. */
static int sorted_top(const eng_token *k, float pairs[][2], int limit) {
    for (int j = 0; j < k->k; j++) { pairs[j][0] = (float)k->top_ids[j]; pairs[j][1] = k->top_lps[j]; }
    qsort(pairs, (size_t)k->k, sizeof pairs[0], by_logprob_desc);
    return MIN(k->k, limit);
}

/* Chat logprobs {content:[...]} of scored tokens [from, to). */
static cJSON *chat_logprobs(const turn *t, const scored_token *toks, int from, int to) {
    cJSON *lp = cJSON_CreateObject(), *content = cJSON_AddArrayToObject(lp, "content");
    for (int i = from; i < to; i++) {
        const eng_token *k = toks[i].k;
        cJSON *e = cJSON_CreateObject();
        char *s = token_string(t, &toks[i]);
        cJSON_AddStringToObject(e, "token", s);
        cJSON_AddNumberToObject(e, "logprob", k->has_lp ? k->lp : 0);
        cJSON_AddItemToObject(e, "bytes", token_bytes_json(t, k->tok, t->raw.p + toks[i].off, toks[i].len));
        free(s);
        cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
        float pairs[ENG_TOPK_MAX][2];
        int m = sorted_top(k, pairs, t->rq->top_logprobs);
        for (int j = 0; j < m; j++) {
            cJSON *alt = cJSON_CreateObject();
            char *a = turn_token_text(t, (int)pairs[j][0]);
            cJSON_AddStringToObject(alt, "token", a);
            cJSON_AddNumberToObject(alt, "logprob", pairs[j][1]);
            cJSON_AddItemToObject(alt, "bytes", token_bytes_json(t, (int)pairs[j][0], a, strlen(a)));
            free(a);
            cJSON_AddItemToArray(top, alt);
        }
        cJSON_AddItemToArray(content, e);
    }
    cJSON_AddNullToObject(lp, "refusal");
    return lp;
}

/* Completions logprobs {tokens, token_logprobs, top_logprobs, text_offset} of scored tokens
 * [from, to); *offset is the text offset of token `from` and is advanced past `to`. */
static cJSON *completion_logprobs(const turn *t, const scored_token *toks, int from, int to, int top_n,
                                  size_t *offset) {
    cJSON *lp = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(lp, "tokens"), *lps = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(lp, "top_logprobs"), *offs = cJSON_AddArrayToObject(lp, "text_offset");
    for (int i = from; i < to; i++) {
        const eng_token *k = toks[i].k;
        char *s = token_string(t, &toks[i]);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(s));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(k->has_lp ? k->lp : 0));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*offset));
        *offset += utf8_chars(s);
        free(s);
        cJSON *top = cJSON_CreateObject();
        float pairs[ENG_TOPK_MAX][2];
        int m = sorted_top(k, pairs, top_n);
        for (int j = 0; j < m; j++) {
            char *a = turn_token_text(t, (int)pairs[j][0]);
            if (!cJSON_GetObjectItemCaseSensitive(top, a)) cJSON_AddNumberToObject(top, a, pairs[j][1]);
            free(a);
        }
        cJSON_AddItemToArray(tops, top);
    }
    return lp;
}

/* The logprobs of the scored tokens not sent yet, in the endpoint's shape; NULL when none are
 * asked for or none are new. keep_last holds the last one back: while generating, frames that
 * come later may still add bytes to it. */
static cJSON *logprobs_since(oa_call *k, int keep_last) {
    if (!k->call.rq.logprobs) return NULL;
    scored_token *toks;
    int n = scored_tokens(&k->call.t, &toks);
    int upto = keep_last ? n - 1 : n;
    cJSON *lp = NULL;
    if (upto > k->lp_sent || (upto == 0 && !k->stream)) {
        lp = k->chat ? chat_logprobs(&k->call.t, toks, k->lp_sent, upto)
                     : completion_logprobs(&k->call.t, toks, k->lp_sent, upto, k->top_n, &k->lp_offset);
        k->lp_sent = upto;
    }
    free(toks);
    return lp;
}

static cJSON *envelope(const oa_call *k) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", k->id);
    cJSON_AddStringToObject(r, "object", k->chat ? (k->stream ? "chat.completion.chunk" : "chat.completion")
                                                 : "text_completion");
    cJSON_AddNumberToObject(r, "created", (double)k->created);
    cJSON_AddStringToObject(r, "model", k->sc->model_id);
    return r;
}

static cJSON *chat_choice(oa_call *k) {
    chat_reply cr;
    turn_parse(&k->call.t, &cr);
    int ncalls = cr.tool_calls ? cJSON_GetArraySize(cr.tool_calls) : 0;
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", k->choice);
    cJSON *msg = cJSON_AddObjectToObject(ch, "message");
    cJSON_AddStringToObject(msg, "role", "assistant");
    if (ncalls && !(cr.content && *cr.content)) cJSON_AddNullToObject(msg, "content");
    else cJSON_AddStringToObject(msg, "content", cr.content ? cr.content : "");
    cJSON_AddNullToObject(msg, "refusal");
    if (cr.reasoning && *cr.reasoning) cJSON_AddStringToObject(msg, "reasoning_content", cr.reasoning);
    if (ncalls) cJSON_AddItemToObject(msg, "tool_calls", cJSON_Duplicate(cr.tool_calls, 1));
    cJSON *lp = logprobs_since(k, 0);
    if (lp) cJSON_AddItemToObject(ch, "logprobs", lp);
    else cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddStringToObject(ch, "finish_reason", turn_finish_reason(&k->call.t, ncalls > 0));
    chat_reply_free(&cr);
    return ch;
}

static cJSON *completion_choice(oa_call *k) {
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", k->choice);
    if (k->echo) {
        char *echo = echo_text(k);
        sbuf b = {0};
        sbuf_puts(&b, echo);
        sbuf_puts(&b, k->call.t.out.text);
        cJSON_AddStringToObject(ch, "text", b.p);
        sbuf_free(&b);
        free(echo);
    } else {
        cJSON_AddStringToObject(ch, "text", k->call.t.out.text);
    }
    cJSON *lp = logprobs_since(k, 0);
    if (lp) cJSON_AddItemToObject(ch, "logprobs", lp);
    else cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddStringToObject(ch, "finish_reason", turn_finish_reason(&k->call.t, 0));
    return ch;
}

/* The finished choice is counted; the next one (if any) begins. 1 = it began, 0 = that was the
 * last, -1 = it could not begin (e says why). */
static int next_choice(oa_call *k, struct MHD_Connection *c, http_err *e) {
    account(k);
    if (k->choice + 1 >= k->nchoices) return 0;
    turn_end(&k->call.t);
    turn_req_free(&k->call.rq);
    sse_sent_free(&k->call.sent);
    memset(&k->call.sent, 0, sizeof k->call.sent);
    k->call.rq = k->queued[k->choice];
    memset(&k->queued[k->choice], 0, sizeof k->queued[k->choice]);
    k->choice++;
    k->role_sent = 0;
    k->lp_sent = 0;
    k->lp_offset = 0;
    return turn_begin(&k->call.t, k->sc, &k->call.rq, c, now_seconds(), e) ? -1 : 1;
}

/* ---- streaming ----------------------------------------------------------------------------- */

/* A chunk with one choice; `delta` (chat) or `text` (completions) is consumed. */
static cJSON *chunk(const oa_call *k, cJSON *delta, const char *text, const char *finish) {
    cJSON *r = envelope(k), *choices = cJSON_AddArrayToObject(r, "choices"), *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", k->choice);
    if (k->chat) cJSON_AddItemToObject(ch, "delta", delta ? delta : cJSON_CreateObject());
    else cJSON_AddStringToObject(ch, "text", text ? text : "");
    cJSON_AddNullToObject(ch, "logprobs");
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
    else cJSON_AddNullToObject(ch, "finish_reason");
    cJSON_AddItemToArray(choices, ch);
    if (k->include_usage && k->chat) cJSON_AddNullToObject(r, "usage");   /* completions chunks have none */
    return r;
}

/* The new reasoning and content as chunks, the logprobs of the tokens scored since the last
 * chunk riding on the last of them. Tokens whose text is still held back (an incomplete
 * character, a possible marker or stop string) keep their logprobs for the chunk that brings
 * the text; only at the end can logprobs come in a chunk of their own. */
static void emit_text(oa_call *k, sbuf *out, const char *reasoning, const char *content, int final) {
    cJSON *chunks[2];
    int n = 0;
    if (!k->chat) {
        if (*content) chunks[n++] = chunk(k, NULL, content, NULL);
    } else {
        const char *keys[2] = {"reasoning_content", "content"}, *texts[2] = {reasoning, content};
        for (int i = 0; i < 2; i++) {
            if (!*texts[i]) continue;
            cJSON *d = cJSON_CreateObject();
            cJSON_AddStringToObject(d, keys[i], texts[i]);
            chunks[n++] = chunk(k, d, NULL, NULL);
        }
    }
    cJSON *lp = n || final ? logprobs_since(k, !final) : NULL;
    if (lp && n == 0) chunks[n++] = chunk(k, NULL, NULL, NULL);
    if (lp)
        cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(chunks[n - 1], "choices"), 0),
                                               "logprobs", lp);
    for (int i = 0; i < n; i++) sse_data(out, chunks[i]);
}

/* The end of the current choice: its tool calls and finish reason. */
static void emit_end(oa_call *k, sbuf *out, const chat_reply *cr) {
    int ncalls = cr->tool_calls ? cJSON_GetArraySize(cr->tool_calls) : 0;
    if (ncalls) {
        cJSON *d = cJSON_CreateObject(), *calls = cJSON_Duplicate(cr->tool_calls, 1), *c;
        int i = 0;
        cJSON_ArrayForEach(c, calls) cJSON_AddNumberToObject(c, "index", i++);
        cJSON_AddItemToObject(d, "tool_calls", calls);
        sse_data(out, chunk(k, d, NULL, NULL));
    }
    sse_data(out, chunk(k, NULL, NULL, turn_finish_reason(&k->call.t, ncalls > 0)));
}

/* After the last choice: the usage chunk (when asked for) and [DONE]. */
static void emit_last(oa_call *k, sbuf *out) {
    if (k->include_usage) {
        cJSON *r = envelope(k);
        cJSON_AddArrayToObject(r, "choices");
        add_usage(r, k);
        sse_data(out, r);
    }
    sbuf_puts(out, "data: [DONE]\n\n");
}

static void call_free(oa_call *k) {
    api_call_end(&k->call);
    for (int i = k->choice; i + 1 < k->nchoices; i++) turn_req_free(&k->queued[i]);
    free(k->queued);
    cJSON_Delete(k->choices);
    free(k);
}

static void stream_done(void *ctx) { call_free(ctx); }

/* A choice's first chunk: the assistant role (chat), or the echoed prompt (completions). */
static void emit_start(oa_call *k, sbuf *out) {
    if (k->chat) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddStringToObject(d, "content", "");
        sse_data(out, chunk(k, d, NULL, NULL));
    } else if (k->echo) {
        char *echo = echo_text(k);
        sse_data(out, chunk(k, NULL, echo, NULL));
        free(echo);
    }
    k->role_sent = 1;
    k->call.last_write = now_seconds();
}

static int stream_pump(void *ctx, sbuf *out) {
    oa_call *k = ctx;
    if (!k->role_sent) {
        emit_start(k, out);
        if (out->len) return STREAM_MORE;
    }
    int r = sse_wait(&k->call.t, &k->call.last_write, out, ": keep-alive\n\n");
    if (r == TURN_GONE) return STREAM_ABORT;
    if (r == TURN_DONE && k->call.t.status == GEN_ERROR) {
        sse_error(out, &k->call.t, API_OPENAI);
        return STREAM_END;
    }
    char *reasoning, *content;
    chat_reply cr;
    sse_deltas(&k->call.t, &k->call.sent, &reasoning, &content, &cr);
    emit_text(k, out, reasoning, content, r == TURN_DONE);
    if (*reasoning || *content) k->call.last_write = now_seconds();
    free(reasoning);
    free(content);
    int more = 0;
    if (r == TURN_DONE) {
        emit_end(k, out, &cr);
        turn_summarize(&k->call.t, k->call.ri);
        http_err e = {0};
        more = next_choice(k, k->conn, &e);
        if (more < 0) {
            char *body = http_err_body(&e, API_OPENAI);
            sbuf_printf(out, "data: %s\n\n", body);
            free(body);
        } else if (more == 0) {
            emit_last(k, out);
        }
    }
    chat_reply_free(&cr);
    return r == TURN_DONE && more <= 0 ? STREAM_END : STREAM_MORE;
}

/* ---- handlers ------------------------------------------------------------------------------ */

static enum MHD_Result fail(struct MHD_Connection *c, oa_call *k, const http_err *e) {
    k->call.ri->status = e->status;
    enum MHD_Result r = e->status == 499 ? MHD_NO : http_send_error(c, API_OPENAI, e);
    call_free(k);
    return r;
}

static enum MHD_Result run(oa_call *k, struct MHD_Connection *c) {
    http_err e = {0};
    k->conn = c;
    if (turn_begin(&k->call.t, k->sc, &k->call.rq, c, k->call.ri->t0, &e)) return fail(c, k, &e);
    turn_make_id(k->id, sizeof k->id, k->chat ? "chatcmpl-" : "cmpl-");
    k->created = (long)time(NULL);
    if (k->stream) {
        k->call.ri->status = 200;
        k->call.last_write = now_seconds();
        return http_send_stream(c, stream_pump, stream_done, k);
    }
    k->choices = cJSON_CreateArray();
    for (int more = 1; more > 0;) {
        if (turn_complete(&k->call.t, &e)) return fail(c, k, &e);
        cJSON_AddItemToArray(k->choices, k->chat ? chat_choice(k) : completion_choice(k));
        if ((more = next_choice(k, c, &e)) < 0) return fail(c, k, &e);
    }
    k->call.ri->status = 200;
    cJSON *body = envelope(k);
    cJSON_AddItemToObject(body, "choices", k->choices);
    k->choices = NULL;
    add_usage(body, k);
    enum MHD_Result r = http_send_json(c, 200, body);
    call_free(k);
    return r;
}

static oa_call *call_new(serve_ctx *sc, req_info *ri, int chat) {
    oa_call *k = xcalloc(1, sizeof *k);
    k->sc = sc;
    k->chat = chat;
    k->call.ri = ri;
    req_info_ref(ri);
    return k;
}

enum MHD_Result openai_chat(serve_ctx *sc, struct MHD_Connection *c, const cJSON *body, req_info *ri) {
    oa_call *k = call_new(sc, ri, 1);
    http_err e = {0};
    if (parse_chat(sc, body, k, &e)) return fail(c, k, &e);
    return run(k, c);
}

enum MHD_Result openai_completions(serve_ctx *sc, struct MHD_Connection *c, const cJSON *body, req_info *ri) {
    oa_call *k = call_new(sc, ri, 0);
    http_err e = {0};
    if (parse_completion(sc, body, k, &e)) return fail(c, k, &e);
    return run(k, c);
}

int openai_request(serve_ctx *sc, int chat, const cJSON *body, turn_req *rq, http_err *e) {
    oa_call k = {.sc = sc, .chat = chat};
    int rc = chat ? parse_chat(sc, body, &k, e) : parse_completion(sc, body, &k, e);
    *rq = k.call.rq;
    for (int i = 0; i + 1 < k.nchoices; i++) turn_req_free(&k.queued[i]);   /* the first choice's only */
    free(k.queued);
    return rc;
}
