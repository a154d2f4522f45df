#include "anthropic.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/util.h"
#include "constrain.h"
#include "openai.h"
#include "params.h"
#include "sse.h"

/* Blocks a stream can have open. */
enum { BLOCK_NONE, BLOCK_THINKING, BLOCK_TEXT };

typedef struct {
    serve_ctx *sc;
    int stream;
    api_call call;
    char id[48];
    int started;
    int block, index;             /* the open block and its index */
} am_call;

static int bad(http_err *e, const char *param, const char *msg) {
    return http_err_set(e, 400, "invalid_request_error", "invalid_value", param, "%s", msg);
}

/* ---- request translation ------------------------------------------------------------------- */

static void add_message(cJSON *out, const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(out, m);
}

/* Text of a string or a list of text blocks (tool_result content, system). NULL if neither. */
static char *blocks_text(const cJSON *c) {
    if (cJSON_IsString(c)) return xstrdup(c->valuestring);
    if (!c || cJSON_IsNull(c)) return xstrdup("");
    if (!cJSON_IsArray(c)) return NULL;
    sbuf b = {0};
    sbuf_puts(&b, "");
    const cJSON *blk;
    cJSON_ArrayForEach(blk, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(blk, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(blk, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
            sbuf_free(&b);
            return NULL;
        }
        sbuf_puts(&b, text->valuestring);
    }
    return b.p;
}

static cJSON *tool_call_json(const cJSON *blk, http_err *e) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(blk, "id");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(blk, "name");
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(blk, "input");
    if (!cJSON_IsString(id) || !cJSON_IsString(name) || (input && !cJSON_IsObject(input))) {
        bad(e, "messages", "a tool_use block needs string id and name and an object input");
        return NULL;
    }
    cJSON *tc = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    cJSON_AddStringToObject(tc, "id", id->valuestring);
    cJSON_AddStringToObject(tc, "type", "function");
    cJSON_AddStringToObject(fn, "name", name->valuestring);
    char *args = input ? cJSON_PrintUnformatted(input) : xstrdup("{}");
    cJSON_AddStringToObject(fn, "arguments", args);
    free(args);
    cJSON_AddItemToObject(tc, "function", fn);
    return tc;
}

/* One assistant message's blocks -> {role:assistant, content, reasoning_content, tool_calls}. */
static int assistant_blocks(cJSON *out, const cJSON *blocks, http_err *e) {
    sbuf text = {0}, thinking = {0};
    sbuf_puts(&text, "");
    sbuf_puts(&thinking, "");
    cJSON *calls = cJSON_CreateArray();
    const cJSON *blk;
    cJSON_ArrayForEach(blk, blocks) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(blk, "type");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        const cJSON *v;
        if (!strcmp(t, "text") && cJSON_IsString(v = cJSON_GetObjectItemCaseSensitive(blk, "text"))) {
            sbuf_puts(&text, v->valuestring);
        } else if (!strcmp(t, "thinking") && cJSON_IsString(v = cJSON_GetObjectItemCaseSensitive(blk, "thinking"))) {
            sbuf_puts(&thinking, v->valuestring);
        } else if (!strcmp(t, "redacted_thinking")) {
            continue;
        } else if (!strcmp(t, "tool_use")) {
            cJSON *tc = tool_call_json(blk, e);
            if (!tc) goto fail;
            cJSON_AddItemToArray(calls, tc);
        } else {
            bad(e, "messages", "assistant content blocks must be text, thinking or tool_use");
            goto fail;
        }
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "content", text.p);
    if (thinking.len) cJSON_AddStringToObject(m, "reasoning_content", thinking.p);
    if (cJSON_GetArraySize(calls)) cJSON_AddItemToObject(m, "tool_calls", calls);
    else cJSON_Delete(calls);
    cJSON_AddItemToArray(out, m);
    sbuf_free(&text);
    sbuf_free(&thinking);
    return 0;
fail:
    cJSON_Delete(calls);
    sbuf_free(&text);
    sbuf_free(&thinking);
    return -1;
}

/* One user message's blocks: tool results become tool messages (first, as they answer the
 * previous assistant turn), the text a user message. */
static int user_blocks(cJSON *out, const cJSON *blocks, http_err *e) {
    sbuf text = {0};
    int has_text = 0;
    sbuf_puts(&text, "");
    const cJSON *blk;
    cJSON_ArrayForEach(blk, blocks) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(blk, "type");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        const cJSON *v;
        if (!strcmp(t, "text") && cJSON_IsString(v = cJSON_GetObjectItemCaseSensitive(blk, "text"))) {
            sbuf_puts(&text, v->valuestring);
            has_text = 1;
        } else if (!strcmp(t, "tool_result")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(blk, "tool_use_id");
            char *result = blocks_text(cJSON_GetObjectItemCaseSensitive(blk, "content"));
            if (!cJSON_IsString(id) || !result) {
                free(result);
                sbuf_free(&text);
                return bad(e, "messages", "a tool_result block needs a tool_use_id and text content");
            }
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "tool");
            cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
            cJSON_AddStringToObject(m, "content", result);
            cJSON_AddItemToArray(out, m);
            free(result);
        } else {
            sbuf_free(&text);
            return bad(e, "messages", "user content blocks must be text or tool_result (images are not supported)");
        }
    }
    if (has_text) add_message(out, "user", text.p);
    sbuf_free(&text);
    return 0;
}

static cJSON *translate_messages(const cJSON *body, http_err *e) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) {
        bad(e, "messages", "'messages' must be a non-empty list");
        return NULL;
    }
    cJSON *out = cJSON_CreateArray();
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(body, "system");
    if (sys && !cJSON_IsNull(sys)) {
        char *s = blocks_text(sys);
        if (!s) { bad(e, "system", "'system' must be a string or a list of text blocks"); goto fail; }
        if (*s) add_message(out, "system", s);
        free(s);
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        int user = cJSON_IsString(role) && !strcmp(role->valuestring, "user");
        int assistant = cJSON_IsString(role) && !strcmp(role->valuestring, "assistant");
        if (!user && !assistant) { bad(e, "messages", "each message needs role user or assistant"); goto fail; }
        if (cJSON_IsString(content)) add_message(out, role->valuestring, content->valuestring);
        else if (!cJSON_IsArray(content)) { bad(e, "messages", "message content must be a string or a list of blocks"); goto fail; }
        else if (user ? user_blocks(out, content, e) : assistant_blocks(out, content, e)) goto fail;
    }
    /* The same validation as the OpenAI endpoint gives both APIs one notion of a good message. */
    cJSON *norm = openai_normalize_messages(out, NULL, e);
    cJSON_Delete(out);
    return norm;
fail:
    cJSON_Delete(out);
    return NULL;
}

static cJSON *translate_tools(const cJSON *tools, http_err *e) {
    if (!cJSON_IsArray(tools)) { bad(e, "tools", "'tools' must be a list"); return NULL; }
    cJSON *out = cJSON_CreateArray();
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(t, "description");
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(t, "input_schema");
        if (!cJSON_IsString(name) || !*name->valuestring || !cJSON_IsObject(schema)) {
            cJSON_Delete(out);
            bad(e, "tools", "each tool needs a name and an input_schema object");
            return NULL;
        }
        cJSON *ft = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        cJSON_AddStringToObject(ft, "type", "function");
        cJSON_AddStringToObject(fn, "name", name->valuestring);
        if (cJSON_IsString(desc)) cJSON_AddStringToObject(fn, "description", desc->valuestring);
        cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(schema, 1));
        cJSON_AddItemToObject(ft, "function", fn);
        cJSON_AddItemToArray(out, ft);
    }
    return out;
}

/* tool_choice {type: auto|any|none|tool, name, disable_parallel_tool_use} -> chat_opts.tool_choice
 * and *parallel. */
static int translate_tool_choice(const cJSON *body, const cJSON *tools, chat_opts *o, int *parallel, http_err *e) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(body, "tool_choice");
    if (!tc || cJSON_IsNull(tc)) return 0;
    int single = 0;
    if (param_bool(tc, "disable_parallel_tool_use", &single, e)) return -1;
    *parallel = !single;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(tc, "type");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(tc, "name");
    if (!cJSON_IsString(type)) return bad(e, "tool_choice", "'tool_choice' needs a type");
    const char *t = type->valuestring;
    if (!strcmp(t, "auto") || !strcmp(t, "none")) o->tool_choice = t;
    else if (!strcmp(t, "any")) o->tool_choice = "required";
    else if (!strcmp(t, "tool") && cJSON_IsString(name)) o->tool_choice = name->valuestring;
    else return bad(e, "tool_choice", "'tool_choice' type must be auto, any, none or tool (with a name)");
    if (strcmp(o->tool_choice, "auto") && strcmp(o->tool_choice, "none") && !tools)
        return bad(e, "tool_choice", "'tool_choice' needs 'tools'");
    return 0;
}

/* thinking (the Messages API's ThinkingConfigParam):
 *   {type: "enabled", budget_tokens: N, display?}  thinking on, the reply's reasoning capped at N
 *       tokens by the engine (SUBMIT think_budget): N is an integer >= 1024 and below max_tokens,
 *       as the API requires; display null or "summarized" (the reasoning comes back as written)
 *   {type: "disabled"}                             thinking off (also when thinking is absent)
 * "adaptive" and "between_tools" leave it to the model whether to think, which the templates'
 * thinking cue does not (it always opens reasoning), and display "omitted" would need redacted
 * blocks: those, unknown types and unknown keys are refused naming the field. */
static int parse_thinking(const serve_ctx *sc, const cJSON *body, chat_opts *o, turn_req *rq, http_err *e) {
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(body, "thinking"), *f;
    if (!th || cJSON_IsNull(th)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(th, "type");
    if (!cJSON_IsObject(th) || !cJSON_IsString(type)) return bad(e, "thinking", "'thinking' must be an object with a type");
    const char *t = type->valuestring;
    if (strcmp(t, "enabled") && strcmp(t, "disabled"))
        return http_err_set(e, 400, "invalid_request_error", "invalid_value", "thinking.type",
                            "thinking.type '%s' is not supported here: use 'enabled' (with budget_tokens) or 'disabled'", t);
    int enabled = !strcmp(t, "enabled");
    cJSON_ArrayForEach(f, th) {
        int known = !strcmp(f->string, "type") || (enabled && (!strcmp(f->string, "budget_tokens") || !strcmp(f->string, "display")));
        if (!known)
            return http_err_set(e, 400, "invalid_request_error", "invalid_value", "thinking",
                                "thinking.%s is not a field of thinking type '%s'", f->string, t);
    }
    if (!enabled) return 0;
    const cJSON *display = cJSON_GetObjectItemCaseSensitive(th, "display");
    if (display && !cJSON_IsNull(display) && !(cJSON_IsString(display) && !strcmp(display->valuestring, "summarized")))
        return bad(e, "thinking.display", "thinking.display must be 'summarized' or null here ('omitted' is not supported)");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(th, "budget_tokens");
    const cJSON *max = cJSON_GetObjectItemCaseSensitive(body, "max_tokens");
    if (!cJSON_IsNumber(n) || n->valuedouble != floor(n->valuedouble) || n->valuedouble < 1024)
        return bad(e, "thinking.budget_tokens", "thinking.budget_tokens must be an integer of at least 1024");
    if (!(n->valuedouble < max->valuedouble))       /* param_max_tokens checked max_tokens is there */
        return bad(e, "thinking.budget_tokens", "max_tokens must be greater than thinking.budget_tokens");
    if (!sc->tpl) return bad(e, "thinking", "this model has no chat template, so no thinking mode");
    o->thinking = 1;
    rq->think_budget = (int)n->valuedouble;      /* below max_tokens <= 2^30 */
    return 0;
}

static int parse_request(serve_ctx *sc, const cJSON *body, am_call *k, http_err *e) {
    static const char *const budget[] = {"max_tokens", NULL};
    if (!cJSON_IsObject(body)) return bad(e, NULL, "the body must be a JSON object");
    if (param_model(sc, body, e) || param_max_tokens(sc, body, budget, 1, &k->call.rq, e)) return -1;
    if (param_sampling(body, 1.0, &k->call.rq, e) || param_stops(body, "stop_sequences", &k->call.rq, e)) return -1;
    if (param_bool(body, "stream", &k->stream, e)) return -1;
    const char *user = NULL;
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(body, "metadata");
    if (meta && param_str(meta, "user_id", &user, e)) return -1;
    if (param_slot(sc, body, user, &k->call.rq, e)) return -1;
    const cJSON *oc = cJSON_GetObjectItemCaseSensitive(body, "output_config");
    if (oc && !cJSON_IsNull(oc))    /* its effort and format would reshape the reply: not honoured */
        return bad(e, "output_config", "output_config (effort, format) is not supported here: use thinking, and "
                                       "tools or a grammar for structured output");
    chat_opts o = {0};
    if (parse_thinking(sc, body, &o, &k->call.rq, e)) return -1;
    cJSON *tools = NULL;
    const cJSON *atools = cJSON_GetObjectItemCaseSensitive(body, "tools");
    if (atools && !cJSON_IsNull(atools) && !(tools = translate_tools(atools, e))) return -1;
    if (tools && cJSON_GetArraySize(tools) == 0) { cJSON_Delete(tools); tools = NULL; }
    cJSON *msgs = NULL;
    int rc = -1, parallel = 1;
    if (!translate_tool_choice(body, tools, &o, &parallel, e) && (msgs = translate_messages(body, e)))
        rc = openai_render(sc, msgs, tools, &o, &k->call.rq, e);
    constrain_opts c = {.tools = tools, .tool_choice = o.tool_choice, .parallel = parallel, .thinking = o.thinking};
    if (!rc) rc = constrain_request(sc, body, &c, &k->call.rq, e);
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    return rc;
}

/* ---- responses ----------------------------------------------------------------------------- */

/* A reply cut by the budget is max_tokens even when it holds tool calls: the last of them may
 * be unfinished (chat_reply.cut_call). */
static const char *stop_reason(const turn *t, int ncalls) {
    if (t->out.stopped) return "stop_sequence";
    if (t->length_limited) return "max_tokens";
    if (ncalls) return "tool_use";
    return "end_turn";
}

/* The same input numbers at message_start and at the end: the engine reports its reuse when it
 * accepts the request (ACCEPT), before the prefill. */
static cJSON *usage_json(const turn *t, int final) {
    cJSON *u = cJSON_CreateObject();
    int reused = t->reused;
    cJSON_AddNumberToObject(u, "input_tokens", t->prompt_tokens - reused);
    cJSON_AddNumberToObject(u, "output_tokens", final ? t->completion_tokens : 0);
    cJSON_AddNumberToObject(u, "cache_read_input_tokens", reused);
    cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
    return u;
}

/* The members of a JSON object that `prefix` (the arguments of a call cut off mid-way) wrote
 * out completely, as an object: the input of a cut tool_use holds what the model wrote and
 * nothing it did not (the stream sends the prefix itself). */
static cJSON *written_members(const char *prefix) {
    size_t last = 0;             /* bytes up to the end of the last complete member */
    int depth = 0, in_string = 0;
    for (size_t i = 0; prefix[i]; i++) {
        char c = prefix[i];
        if (in_string) {
            if (c == '\\' && prefix[i + 1]) i++;
            else if (c == '"') in_string = 0;
        } else if (c == '"') in_string = 1;
        else if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') {
            if (--depth == 0) return cJSON_Parse(prefix);   /* the object was closed after all */
        } else if (c == ',' && depth == 1) last = i;
    }
    char *closed = xmalloc(last + 2);
    memcpy(closed, prefix, last);
    memcpy(closed + last, "}", 2);
    cJSON *o = last ? cJSON_Parse(closed) : NULL;
    free(closed);
    return o;
}

static cJSON *tool_use_block(const cJSON *call, int with_input, int cut) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(call, "id");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "tool_use");
    cJSON_AddStringToObject(b, "id", cJSON_IsString(id) ? id->valuestring : "toolu_0");
    cJSON_AddStringToObject(b, "name", cJSON_IsString(name) ? name->valuestring : "");
    cJSON *input = !with_input || !cJSON_IsString(args) ? NULL
                 : cut ? written_members(args->valuestring)
                       : cJSON_Parse(args->valuestring);
    cJSON_AddItemToObject(b, "input", input ? input : cJSON_CreateObject());
    return b;
}

static void set_stop_sequence(cJSON *o, const turn *t) {
    if (t->out.stopped && t->out.stop_index >= 0) cJSON_AddStringToObject(o, "stop_sequence", t->rq->stops[t->out.stop_index]);
    else cJSON_AddNullToObject(o, "stop_sequence");
}

static cJSON *message_json(am_call *k, int final) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", k->id);
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "model", k->sc->model_id);
    cJSON *content = cJSON_AddArrayToObject(m, "content");
    if (!final) {
        cJSON_AddNullToObject(m, "stop_reason");
        cJSON_AddNullToObject(m, "stop_sequence");
        cJSON_AddItemToObject(m, "usage", usage_json(&k->call.t, 0));
        return m;
    }
    chat_reply cr;
    turn_parse(&k->call.t, &cr);
    int ncalls = cr.tool_calls ? cJSON_GetArraySize(cr.tool_calls) : 0;
    if (cr.reasoning && *cr.reasoning) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddStringToObject(b, "thinking", cr.reasoning);
        cJSON_AddStringToObject(b, "signature", "cairn-local");
        cJSON_AddItemToArray(content, b);
    }
    if ((cr.content && *cr.content) || (!ncalls && !(cr.reasoning && *cr.reasoning))) {   /* as the stream has it */
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", cr.content ? cr.content : "");
        cJSON_AddItemToArray(content, b);
    }
    const cJSON *call;
    cJSON_ArrayForEach(call, cr.tool_calls) cJSON_AddItemToArray(content, tool_use_block(call, 1, cr.cut_call && !call->next));
    cJSON_AddStringToObject(m, "stop_reason", stop_reason(&k->call.t, ncalls));
    set_stop_sequence(m, &k->call.t);
    cJSON_AddItemToObject(m, "usage", usage_json(&k->call.t, 1));
    chat_reply_free(&cr);
    return m;
}

/* ---- streaming ----------------------------------------------------------------------------- */

static cJSON *typed(const char *type) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

static void block_stop(am_call *k, sbuf *out) {
    if (k->block == BLOCK_NONE) return;
    if (k->block == BLOCK_THINKING) {
        cJSON *ev = typed("content_block_delta"), *d = typed("signature_delta");
        cJSON_AddNumberToObject(ev, "index", k->index);
        cJSON_AddStringToObject(d, "signature", "cairn-local");
        cJSON_AddItemToObject(ev, "delta", d);
        sse_event(out, "content_block_delta", ev);
    }
    cJSON *ev = typed("content_block_stop");
    cJSON_AddNumberToObject(ev, "index", k->index);
    sse_event(out, "content_block_stop", ev);
    k->block = BLOCK_NONE;
    k->index++;
}

static void block_start(am_call *k, sbuf *out, cJSON *block) {
    cJSON *ev = typed("content_block_start");
    cJSON_AddNumberToObject(ev, "index", k->index);
    cJSON_AddItemToObject(ev, "content_block", block);
    sse_event(out, "content_block_start", ev);
}

/* Append text to a thinking or text block, opening it first when another one is open. */
static void block_text(am_call *k, sbuf *out, int kind, const char *text) {
    if (!*text) return;
    const char *field = kind == BLOCK_THINKING ? "thinking" : "text";
    if (k->block != kind) {
        block_stop(k, out);
        cJSON *b = typed(field);
        cJSON_AddStringToObject(b, field, "");
        if (kind == BLOCK_THINKING) cJSON_AddStringToObject(b, "signature", "");
        block_start(k, out, b);
        k->block = kind;
    }
    cJSON *ev = typed("content_block_delta"), *d = typed(kind == BLOCK_THINKING ? "thinking_delta" : "text_delta");
    cJSON_AddNumberToObject(ev, "index", k->index);
    cJSON_AddStringToObject(d, field, text);
    cJSON_AddItemToObject(ev, "delta", d);
    sse_event(out, "content_block_delta", ev);
    k->call.last_write = now_seconds();
}

static void stream_end(am_call *k, sbuf *out, const chat_reply *cr) {
    int ncalls = cr->tool_calls ? cJSON_GetArraySize(cr->tool_calls) : 0;
    if (!ncalls && k->index == 0 && k->block == BLOCK_NONE) {   /* an empty reply still has one text block */
        cJSON *b = typed("text");
        cJSON_AddStringToObject(b, "text", "");
        block_start(k, out, b);
        k->block = BLOCK_TEXT;
    }
    block_stop(k, out);
    const cJSON *call;
    cJSON_ArrayForEach(call, cr->tool_calls) {
        block_start(k, out, tool_use_block(call, 0, 0));
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(call, "function"), "arguments");
        cJSON *ev = typed("content_block_delta"), *d = typed("input_json_delta");
        cJSON_AddNumberToObject(ev, "index", k->index);
        cJSON_AddStringToObject(d, "partial_json", cJSON_IsString(args) ? args->valuestring : "{}");
        cJSON_AddItemToObject(ev, "delta", d);
        sse_event(out, "content_block_delta", ev);
        k->block = BLOCK_TEXT;
        block_stop(k, out);
    }
    cJSON *ev = typed("message_delta"), *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "stop_reason", stop_reason(&k->call.t, ncalls));
    set_stop_sequence(d, &k->call.t);
    cJSON_AddItemToObject(ev, "delta", d);
    cJSON_AddItemToObject(ev, "usage", usage_json(&k->call.t, 1));
    sse_event(out, "message_delta", ev);
    sse_event(out, "message_stop", typed("message_stop"));
}

static void call_free(am_call *k) {
    api_call_end(&k->call);
    free(k);
}

static void stream_done(void *ctx) { call_free(ctx); }

static int stream_pump(void *ctx, sbuf *out) {
    am_call *k = ctx;
    if (!k->started) {
        cJSON *ev = typed("message_start");
        cJSON_AddItemToObject(ev, "message", message_json(k, 0));
        sse_event(out, "message_start", ev);
        sse_event(out, "ping", typed("ping"));
        k->started = 1;
        k->call.last_write = now_seconds();
        return STREAM_MORE;
    }
    int r = sse_wait(&k->call.t, &k->call.last_write, out, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
    if (r == TURN_GONE) return STREAM_ABORT;
    if (r == TURN_DONE && k->call.t.status == GEN_ERROR) {
        sse_error(out, &k->call.t, API_ANTHROPIC);
        return STREAM_END;
    }
    char *reasoning, *content;
    chat_reply cr;
    sse_deltas(&k->call.t, &k->call.sent, &reasoning, &content, &cr);
    block_text(k, out, BLOCK_THINKING, reasoning);
    block_text(k, out, BLOCK_TEXT, content);
    free(reasoning);
    free(content);
    if (r == TURN_DONE) {
        stream_end(k, out, &cr);
        turn_summarize(&k->call.t, k->call.ri);
    }
    chat_reply_free(&cr);
    return r == TURN_DONE ? STREAM_END : STREAM_MORE;
}

/* ---- handler ------------------------------------------------------------------------------- */

static enum MHD_Result fail(struct MHD_Connection *c, am_call *k, const http_err *e) {
    k->call.ri->status = e->status;
    enum MHD_Result r = e->status == 499 ? MHD_NO : http_send_error(c, API_ANTHROPIC, e);
    call_free(k);
    return r;
}

static am_call *call_new(serve_ctx *sc, req_info *ri) {
    am_call *k = xcalloc(1, sizeof *k);
    k->sc = sc;
    k->call.ri = ri;
    req_info_ref(ri);
    return k;
}

enum MHD_Result anthropic_count_tokens(serve_ctx *sc, struct MHD_Connection *c, const cJSON *body, req_info *ri) {
    am_call *k = call_new(sc, ri);
    http_err e = {0};
    cJSON *probe = cJSON_Duplicate(body, 1);
    if (cJSON_IsObject(probe) && !cJSON_GetObjectItemCaseSensitive(probe, "max_tokens"))
        cJSON_AddNumberToObject(probe, "max_tokens", 1 << 30);   /* count_tokens takes no budget: any
                                                                   * thinking budget is below this one */
    int rc = parse_request(sc, probe, k, &e);
    cJSON_Delete(probe);
    if (rc) return fail(c, k, &e);
    long n = turn_count_tokens(sc, &k->call.rq, &e);
    if (n < 0) return fail(c, k, &e);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "input_tokens", (double)n);
    ri->status = 200;
    ri->prompt_tokens = (int)n;
    call_free(k);
    return http_send_json(c, 200, r);
}

enum MHD_Result anthropic_messages(serve_ctx *sc, struct MHD_Connection *c, const cJSON *body, req_info *ri) {
    am_call *k = call_new(sc, ri);
    http_err e = {0};
    if (parse_request(sc, body, k, &e)) return fail(c, k, &e);
    if (turn_begin(&k->call.t, sc, &k->call.rq, c, ri->t0, &e)) return fail(c, k, &e);
    turn_make_id(k->id, sizeof k->id, "msg_");
    if (k->stream) {
        ri->status = 200;
        k->call.last_write = now_seconds();
        return http_send_stream(c, stream_pump, stream_done, k);
    }
    if (turn_complete(&k->call.t, &e)) return fail(c, k, &e);
    ri->status = 200;
    enum MHD_Result r = http_send_json(c, 200, message_json(k, 1));
    call_free(k);
    return r;
}

int anthropic_request(serve_ctx *sc, const cJSON *body, turn_req *rq, http_err *e) {
    am_call k = {.sc = sc};
    int rc = parse_request(sc, body, &k, e);
    *rq = k.call.rq;
    return rc;
}
