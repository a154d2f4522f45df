#include "responses.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/util.h"
#include "openai.h"
#include "params.h"
#include "sse.h"
#include "think_budget.h"

/* ---- the store ---------------------------------------------------------------------------------- */

typedef struct {
    char id[48];
    cJSON *response;              /* the response object as returned */
    cJSON *conversation;          /* its input + output as normalized messages (no instructions) */
    uint64_t used;
} stored;

struct responses {
    pthread_mutex_t mu;
    stored e[RESPONSES_MAX];
    int n;
    uint64_t clock;
};

responses *responses_new(void) {
    responses *r = xcalloc(1, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    return r;
}

static void stored_free(stored *s) {
    cJSON_Delete(s->response);
    cJSON_Delete(s->conversation);
}

void responses_free(responses *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) stored_free(&r->e[i]);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static int find(responses *r, const char *id) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->e[i].id, id)) return i;
    return -1;
}

/* Takes ownership of both; the least recently used response goes when the store is full. */
static void store_put(responses *r, const char *id, cJSON *response, cJSON *conversation) {
    pthread_mutex_lock(&r->mu);
    int i = r->n;
    if (r->n < RESPONSES_MAX) {
        r->n++;
    } else {
        i = 0;
        for (int j = 1; j < r->n; j++)
            if (r->e[j].used < r->e[i].used) i = j;
        stored_free(&r->e[i]);
    }
    snprintf(r->e[i].id, sizeof r->e[i].id, "%s", id);
    r->e[i].response = response;
    r->e[i].conversation = conversation;
    r->e[i].used = ++r->clock;
    pthread_mutex_unlock(&r->mu);
}

/* A copy of what is stored under id (either may be NULL), or 0 when nothing is. */
static int store_get(responses *r, const char *id, cJSON **response, cJSON **conversation) {
    pthread_mutex_lock(&r->mu);
    int i = find(r, id);
    if (i >= 0) {
        r->e[i].used = ++r->clock;
        if (response) *response = cJSON_Duplicate(r->e[i].response, 1);
        if (conversation) *conversation = cJSON_Duplicate(r->e[i].conversation, 1);
    }
    pthread_mutex_unlock(&r->mu);
    return i >= 0;
}

static int store_delete(responses *r, const char *id) {
    pthread_mutex_lock(&r->mu);
    int i = find(r, id);
    if (i >= 0) {
        stored_free(&r->e[i]);
        r->e[i] = r->e[--r->n];
    }
    pthread_mutex_unlock(&r->mu);
    return i >= 0;
}

/* ---- the request -------------------------------------------------------------------------------- */

typedef struct {
    serve_ctx *sc;
    api_call call;
    int stream, store;
    char id[48], msg_id[48], rs_id[48];
    long created;
    cJSON *echo;                  /* request fields the response object repeats */
    cJSON *conversation;          /* normalized messages without the instructions */
    int seq;                      /* stream: sequence_number of the next event */
    int started, text_open, reasoning_open, outputs;
} rs_call;

static int bad(http_err *e, const char *param, const char *msg) {
    return http_err_set(e, 400, "invalid_request_error", "invalid_value", param, "%s", msg);
}

static int unsupported(http_err *e, const char *param, const char *msg) {
    return http_err_set(e, 400, "invalid_request_error", "unsupported_value", param, "%s", msg);
}

/* Text of an input message's content: a string, or input_text / output_text parts. */
static char *item_text(const cJSON *c, http_err *e) {
    if (cJSON_IsString(c)) return xstrdup(c->valuestring);
    if (!cJSON_IsArray(c)) {
        bad(e, "input", "a message's content must be a string or a list of input_text parts");
        return NULL;
    }
    sbuf b = {0};
    sbuf_puts(&b, "");
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type"), *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        if ((!strcmp(t, "input_text") || !strcmp(t, "output_text")) && cJSON_IsString(text)) {
            sbuf_puts(&b, text->valuestring);
            continue;
        }
        sbuf_free(&b);
        unsupported(e, "input", "only input_text and output_text content parts are supported by this model");
        return NULL;
    }
    return b.p;
}

static cJSON *message(const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    return m;
}

/* The assistant message a function_call item belongs to: the last message when it is an
 * assistant one (a reply's text and its calls are one turn), else a new one. */
static cJSON *assistant_for_call(cJSON *msgs) {
    int n = cJSON_GetArraySize(msgs);
    cJSON *last = n ? cJSON_GetArrayItem(msgs, n - 1) : NULL;
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(last, "role");
    if (last && cJSON_IsString(role) && !strcmp(role->valuestring, "assistant")) return last;
    cJSON *m = message("assistant", "");
    cJSON_AddItemToArray(msgs, m);
    return m;
}

/* input (string or items) -> OpenAI-shaped messages appended to msgs. */
static int translate_input(const cJSON *input, cJSON *msgs, http_err *e) {
    if (cJSON_IsString(input)) {
        cJSON_AddItemToArray(msgs, message("user", input->valuestring));
        return 0;
    }
    if (!cJSON_IsArray(input)) return bad(e, "input", "'input' must be a string or a list of input items");
    const cJSON *it;
    cJSON_ArrayForEach(it, input) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        const char *t = cJSON_IsString(type) ? type->valuestring : "message";
        if (!cJSON_IsObject(it)) return bad(e, "input", "input items must be objects");
        if (!strcmp(t, "message")) {
            static const char *const roles[] = {"user", "system", "developer", "assistant"};
            int ok = 0;
            for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) ok |= cJSON_IsString(role) && !strcmp(role->valuestring, roles[i]);
            if (!ok) return bad(e, "input", "a message item needs a role of user, system, developer or assistant");
            char *text = item_text(cJSON_GetObjectItemCaseSensitive(it, "content"), e);
            if (!text) return -1;
            cJSON_AddItemToArray(msgs, message(role->valuestring, text));
            free(text);
        } else if (!strcmp(t, "function_call")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(it, "arguments");
            if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsString(args))
                return bad(e, "input", "a function_call item needs string call_id, name and arguments");
            cJSON *m = assistant_for_call(msgs), *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
            if (!calls) calls = cJSON_AddArrayToObject(m, "tool_calls");
            cJSON *tc = cJSON_CreateObject(), *fn = cJSON_AddObjectToObject(tc, "function");
            cJSON_AddStringToObject(tc, "id", id->valuestring);
            cJSON_AddStringToObject(tc, "type", "function");
            cJSON_AddStringToObject(fn, "name", name->valuestring);
            cJSON_AddStringToObject(fn, "arguments", args->valuestring);
            cJSON_AddItemToArray(calls, tc);
        } else if (!strcmp(t, "function_call_output")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id");
            const cJSON *out = cJSON_GetObjectItemCaseSensitive(it, "output");
            if (!cJSON_IsString(id) || !cJSON_IsString(out))
                return bad(e, "input", "a function_call_output item needs string call_id and output");
            cJSON *m = message("tool", out->valuestring);
            cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
            cJSON_AddItemToArray(msgs, m);
        } else if (!strcmp(t, "reasoning")) {
            continue;             /* the templates drop a past turn's reasoning */
        } else {
            return http_err_set(e, 400, "invalid_request_error", "unsupported_value", "input",
                                "input items of type '%s' are not supported (message, function_call, "
                                "function_call_output, reasoning are)", t);
        }
    }
    return 0;
}

/* Responses tools {type:"function", name, description, parameters} -> chat tools. */
static cJSON *translate_tools(const cJSON *tools, http_err *e) {
    if (!cJSON_IsArray(tools)) {
        bad(e, "tools", "'tools' must be a list");
        return NULL;
    }
    cJSON *out = cJSON_CreateArray();
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type"), *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function")) {
            cJSON_Delete(out);
            unsupported(e, "tools", "only function tools are supported (no built-in tools)");
            return NULL;
        }
        if (!cJSON_IsString(name) || !*name->valuestring) {
            cJSON_Delete(out);
            bad(e, "tools", "a function tool needs a name");
            return NULL;
        }
        cJSON *ct = cJSON_CreateObject(), *fn = cJSON_AddObjectToObject(ct, "function");
        cJSON_AddStringToObject(ct, "type", "function");
        cJSON_AddStringToObject(fn, "name", name->valuestring);
        const char *copy[] = {"description", "parameters"};
        for (size_t i = 0; i < 2; i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(t, copy[i]);
            if (v && !cJSON_IsNull(v)) cJSON_AddItemToObject(fn, copy[i], cJSON_Duplicate(v, 1));
        }
        cJSON_AddItemToArray(out, ct);
    }
    return out;
}

/* reasoning {effort, summary, generate_summary, context, mode}: effort is honoured (openai_effort);
 * the reasoning comes back as reasoning_text, never summarised, so a summary is refused; which past
 * reasoning a turn renders is the family template's rule, which context "auto" leaves it; mode only
 * "standard". OpenAI has no cap on reasoning tokens (nothing like Anthropic's budget_tokens), so a
 * key such as max_tokens is refused as unknown rather than ignored. */
static int check_reasoning(const cJSON *r, http_err *e) {
    static const struct { const char *key, *allowed; } opts[] = {
        {"effort", NULL}, {"summary", ""}, {"generate_summary", ""}, {"context", "auto"}, {"mode", "standard"}};
    /* allowed: NULL honoured as given, "" only null, else null or that value */
    if (!r || cJSON_IsNull(r)) return 0;
    if (!cJSON_IsObject(r)) return bad(e, "reasoning", "'reasoning' must be an object");
    const cJSON *f;
    cJSON_ArrayForEach(f, r) {
        size_t i = 0;
        while (i < sizeof opts / sizeof *opts && strcmp(opts[i].key, f->string)) i++;
        if (i == sizeof opts / sizeof *opts)
            return http_err_set(e, 400, "invalid_request_error", "unsupported_parameter", "reasoning",
                                "reasoning.%s is not supported here (reasoning takes effort)", f->string);
        if (!opts[i].allowed || cJSON_IsNull(f) || (cJSON_IsString(f) && *opts[i].allowed && !strcmp(f->valuestring, opts[i].allowed)))
            continue;
        if (!*opts[i].allowed)
            return http_err_set(e, 400, "invalid_request_error", "unsupported_value", "reasoning",
                                "reasoning.%s is not supported here (the reasoning is returned as written)", f->string);
        return http_err_set(e, 400, "invalid_request_error", "unsupported_value", "reasoning",
                            "reasoning.%s may only be '%s' here", f->string, opts[i].allowed);
    }
    return 0;
}

/* Fields honoured as the spec defines them; the rest of the spec's fields are refused when they
 * ask for something else than the default. */
static int check_fields(const cJSON *body, http_err *e) {
    static const char *const known[] = {"model", "input", "instructions", "previous_response_id", "store", "stream",
                                        "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
                                        "parallel_tool_calls", "text", "reasoning", "metadata", "user", "truncation",
                                        "include", "top_logprobs", "seed", NULL};
    if (param_only_fields(body, known, "by /v1/responses here", e)) return -1;
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(body, "tool_choice")) && !cJSON_IsNull(v) &&
        !(cJSON_IsString(v) && (!strcmp(v->valuestring, "auto") || !strcmp(v->valuestring, "none"))))
        return unsupported(e, "tool_choice", "forcing a tool ('required' or a named tool) needs constrained decoding, "
                                             "which this server does not have yet: use auto or none");
    if ((v = cJSON_GetObjectItemCaseSensitive(body, "parallel_tool_calls")) && cJSON_IsFalse(v))
        return unsupported(e, "parallel_tool_calls", "limiting a reply to one tool call needs constrained decoding");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(body, "text"), "format");
    const cJSON *ft = cJSON_GetObjectItemCaseSensitive(fmt, "type");
    if (fmt && !(cJSON_IsString(ft) && !strcmp(ft->valuestring, "text")))
        return unsupported(e, "text", "structured output formats (json_object, json_schema) need constrained decoding");
    if ((v = cJSON_GetObjectItemCaseSensitive(body, "truncation")) && !cJSON_IsNull(v) &&
        !(cJSON_IsString(v) && !strcmp(v->valuestring, "disabled")))
        return unsupported(e, "truncation", "only 'disabled' truncation: a prompt that does not fit is an error");
    if ((v = cJSON_GetObjectItemCaseSensitive(body, "include")) && cJSON_GetArraySize(v) > 0)
        return unsupported(e, "include", "no extra output data can be included");
    if ((v = cJSON_GetObjectItemCaseSensitive(body, "top_logprobs")) && !cJSON_IsNull(v) &&
        !(cJSON_IsNumber(v) && v->valuedouble == 0))
        return unsupported(e, "top_logprobs", "logprobs are offered on /v1/chat/completions, not /v1/responses");
    if ((v = cJSON_GetObjectItemCaseSensitive(body, "metadata")) && !cJSON_IsNull(v) && !cJSON_IsObject(v))
        return bad(e, "metadata", "'metadata' must be an object of strings");
    return check_reasoning(cJSON_GetObjectItemCaseSensitive(body, "reasoning"), e);
}

static int parse(rs_call *k, const cJSON *body, http_err *e) {
    serve_ctx *sc = k->sc;
    turn_req *rq = &k->call.rq;
    static const char *const budget[] = {"max_output_tokens", NULL};
    if (!cJSON_IsObject(body)) return http_err_set(e, 400, "invalid_request_error", "invalid_json", NULL, "the body must be a JSON object");
    if (check_fields(body, e) || param_model(sc, body, e) || param_max_tokens(sc, body, budget, 0, rq, e) ||
        param_sampling(body, 2.0, rq, e) || param_bool(body, "stream", &k->stream, e))
        return -1;
    k->store = 1;
    const char *instructions = NULL, *prev = NULL, *user = NULL, *effort = NULL;
    if (param_bool(body, "store", &k->store, e) || param_str(body, "instructions", &instructions, e) ||
        param_str(body, "previous_response_id", &prev, e) || param_str(body, "user", &user, e) ||
        param_slot(sc, body, user, rq, e) ||
        param_str(cJSON_GetObjectItemCaseSensitive(body, "reasoning"), "effort", &effort, e) ||
        (effort && openai_effort(sc, effort, "reasoning.effort", e)))
        return -1;
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(body, "input");
    if (!input) return bad(e, "input", "'input' is required");
    cJSON *raw = cJSON_CreateArray();
    if (prev) {
        cJSON *conv = NULL;
        if (!store_get(sc->responses, prev, NULL, &conv)) {
            cJSON_Delete(raw);
            return http_err_set(e, 404, "invalid_request_error", "not_found", "previous_response_id",
                                "Previous response with id '%s' not found (not stored, or deleted)", prev);
        }
        cJSON_Delete(raw);
        raw = conv;
    }
    if (translate_input(input, raw, e)) {
        cJSON_Delete(raw);
        return -1;
    }
    k->conversation = openai_normalize_messages(raw, NULL, e);
    cJSON_Delete(raw);
    if (!k->conversation) return -1;
    cJSON *msgs = cJSON_Duplicate(k->conversation, 1);
    if (instructions) cJSON_InsertItemInArray(msgs, 0, message("system", instructions));
    chat_opts o = {.thinking = effort && strcmp(effort, "none"), .effort = effort && strcmp(effort, "none") ? effort : NULL};
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(body, "tools");
    cJSON *ctools = tools && !cJSON_IsNull(tools) && cJSON_GetArraySize(tools) ? translate_tools(tools, e) : NULL;
    int rc = tools && !cJSON_IsNull(tools) && cJSON_GetArraySize(tools) && !ctools
                 ? -1
                 : openai_render(sc, msgs, ctools, &o, rq, e);
    cJSON_Delete(msgs);
    cJSON_Delete(ctools);
    if (rc) return -1;
    k->echo = cJSON_CreateObject();
    cJSON_AddItemToObject(k->echo, "instructions", instructions ? cJSON_CreateString(instructions) : cJSON_CreateNull());
    cJSON_AddItemToObject(k->echo, "previous_response_id", prev ? cJSON_CreateString(prev) : cJSON_CreateNull());
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(body, "metadata");
    cJSON_AddItemToObject(k->echo, "metadata", meta && cJSON_IsObject(meta) ? cJSON_Duplicate(meta, 1) : cJSON_CreateObject());
    cJSON_AddItemToObject(k->echo, "tools", tools && cJSON_IsArray(tools) ? cJSON_Duplicate(tools, 1) : cJSON_CreateArray());
    cJSON_AddItemToObject(k->echo, "reasoning_effort", effort ? cJSON_CreateString(effort) : cJSON_CreateNull());
    return 0;
}

/* ---- the response object ------------------------------------------------------------------------ */

static cJSON *usage_json(const turn *t) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", t->prompt_tokens);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens", t->reused);
    cJSON_AddNumberToObject(u, "output_tokens", t->completion_tokens);
    int reasoning = think_budget_count(t->sc->tpl, t->sc->tok, t->ids, t->nids, t->rq->thinking);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens", reasoning);
    cJSON_AddNumberToObject(u, "total_tokens", t->prompt_tokens + t->completion_tokens);
    return u;
}

static cJSON *text_part(const char *text) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "output_text");
    cJSON_AddStringToObject(p, "text", text);
    cJSON_AddArrayToObject(p, "annotations");
    return p;
}

static cJSON *message_item(const rs_call *k, const char *text, const char *status) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "id", k->msg_id);
    cJSON_AddStringToObject(m, "status", status);
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON *content = cJSON_AddArrayToObject(m, "content");
    if (text) cJSON_AddItemToArray(content, text_part(text));
    return m;
}

static cJSON *reasoning_item(const rs_call *k, const char *text) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "type", "reasoning");
    cJSON_AddStringToObject(r, "id", k->rs_id);
    cJSON_AddArrayToObject(r, "summary");
    cJSON *content = cJSON_AddArrayToObject(r, "content");
    if (text) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "reasoning_text");
        cJSON_AddStringToObject(p, "text", text);
        cJSON_AddItemToArray(content, p);
    }
    return r;
}

static cJSON *call_item(const cJSON *tc, int i, const char *args, const char *status) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(tc, "id"), *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    cJSON *c = cJSON_CreateObject();
    char fid[64];
    snprintf(fid, sizeof fid, "fc_%s_%d", cJSON_IsString(id) ? id->valuestring : "call", i);
    cJSON_AddStringToObject(c, "type", "function_call");
    cJSON_AddStringToObject(c, "id", fid);
    cJSON_AddStringToObject(c, "call_id", cJSON_IsString(id) ? id->valuestring : fid);
    cJSON_AddStringToObject(c, "name", cJSON_IsString(name) ? name->valuestring : "");
    cJSON_AddStringToObject(c, "arguments", args);
    cJSON_AddStringToObject(c, "status", status);
    return c;
}

static const char *call_args(const cJSON *tc) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tc, "function"), "arguments");
    return cJSON_IsString(a) ? a->valuestring : "{}";
}

/* The token budget ended the reply (the response is incomplete, max_output_tokens). */
static int cut_off(const rs_call *k) { return k->call.t.length_limited && !k->call.t.out.stopped; }

/* The status of a finished reply's output item: the last one is where a cut by the budget fell
 * (a call's arguments then stop where the model was, chat_reply.cut_call). */
static const char *item_status(const rs_call *k, int last) { return last && cut_off(k) ? "incomplete" : "completed"; }

/* The output items of a finished reply. */
static cJSON *output_items(const rs_call *k, const chat_reply *cr) {
    cJSON *out = cJSON_CreateArray();
    int ncalls = cr->tool_calls ? cJSON_GetArraySize(cr->tool_calls) : 0;
    if (cr->reasoning && *cr->reasoning) cJSON_AddItemToArray(out, reasoning_item(k, cr->reasoning));
    if ((cr->content && *cr->content) || !ncalls)
        cJSON_AddItemToArray(out, message_item(k, cr->content ? cr->content : "", item_status(k, !ncalls)));
    for (int i = 0; i < ncalls; i++) {
        const cJSON *tc = cJSON_GetArrayItem(cr->tool_calls, i);
        cJSON_AddItemToArray(out, call_item(tc, i, call_args(tc), item_status(k, i == ncalls - 1)));
    }
    return out;
}

/* The response object; output NULL = in progress (empty output). */
static cJSON *response_json(const rs_call *k, cJSON *output, int done) {
    const turn *t = &k->call.t;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", k->id);
    cJSON_AddStringToObject(r, "object", "response");
    cJSON_AddNumberToObject(r, "created_at", (double)k->created);
    int incomplete = done && cut_off(k);
    cJSON_AddStringToObject(r, "status", !done ? "in_progress" : incomplete ? "incomplete" : "completed");
    cJSON_AddNullToObject(r, "error");
    if (incomplete) cJSON_AddStringToObject(cJSON_AddObjectToObject(r, "incomplete_details"), "reason", "max_output_tokens");
    else cJSON_AddNullToObject(r, "incomplete_details");
    cJSON_AddItemToObject(r, "instructions", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(k->echo, "instructions"), 1));
    cJSON_AddNumberToObject(r, "max_output_tokens", k->call.rq.max_tokens);
    cJSON_AddStringToObject(r, "model", k->sc->model_id);
    cJSON_AddItemToObject(r, "output", output ? output : cJSON_CreateArray());
    cJSON_AddBoolToObject(r, "parallel_tool_calls", 1);
    cJSON_AddItemToObject(r, "previous_response_id",
                          cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(k->echo, "previous_response_id"), 1));
    cJSON *rs = cJSON_AddObjectToObject(r, "reasoning");
    cJSON_AddItemToObject(rs, "effort", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(k->echo, "reasoning_effort"), 1));
    cJSON_AddNullToObject(rs, "summary");
    cJSON_AddBoolToObject(r, "store", k->store);
    cJSON_AddNumberToObject(r, "temperature", k->call.rq.temperature);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(cJSON_AddObjectToObject(r, "text"), "format"), "type", "text");
    cJSON_AddStringToObject(r, "tool_choice", "auto");
    cJSON_AddItemToObject(r, "tools", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(k->echo, "tools"), 1));
    cJSON_AddNumberToObject(r, "top_p", k->call.rq.top_p);
    cJSON_AddStringToObject(r, "truncation", "disabled");
    if (done) cJSON_AddItemToObject(r, "usage", usage_json(t));
    else cJSON_AddNullToObject(r, "usage");
    cJSON_AddItemToObject(r, "metadata", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(k->echo, "metadata"), 1));
    return r;
}

/* The finished response; stored with its conversation (input + this reply) when asked. */
static cJSON *finish(rs_call *k) {
    chat_reply cr;
    turn_parse(&k->call.t, &cr);
    cJSON *r = response_json(k, output_items(k, &cr), 1);
    if (k->store) {
        cJSON *conv = cJSON_Duplicate(k->conversation, 1), *m = message("assistant", cr.content ? cr.content : "");
        if (cr.reasoning && *cr.reasoning) cJSON_AddStringToObject(m, "reasoning_content", cr.reasoning);
        if (cr.tool_calls && cJSON_GetArraySize(cr.tool_calls))
            cJSON_AddItemToObject(m, "tool_calls", cJSON_Duplicate(cr.tool_calls, 1));
        cJSON_AddItemToArray(conv, m);
        store_put(k->sc->responses, k->id, cJSON_Duplicate(r, 1), conv);
    }
    chat_reply_free(&cr);
    return r;
}

/* ---- streaming ---------------------------------------------------------------------------------- */

static void event(rs_call *k, sbuf *out, const char *type, cJSON *ev) {
    cJSON_AddStringToObject(ev, "type", type);
    cJSON_AddNumberToObject(ev, "sequence_number", k->seq++);
    sse_event(out, type, ev);
}

static void item_event(rs_call *k, sbuf *out, const char *type, int index, cJSON *item) {
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddNumberToObject(ev, "output_index", index);
    cJSON_AddItemToObject(ev, "item", item);
    event(k, out, type, ev);
}

/* A delta or done event of item item_id's content part 0. */
static void part_event(rs_call *k, sbuf *out, const char *type, const char *item_id, int index, const char *key,
                       cJSON *value) {
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddStringToObject(ev, "item_id", item_id);
    cJSON_AddNumberToObject(ev, "output_index", index);
    cJSON_AddNumberToObject(ev, "content_index", 0);
    cJSON_AddItemToObject(ev, key, value);
    event(k, out, type, ev);
}

static void close_reasoning(rs_call *k, sbuf *out, const char *text) {
    if (!k->reasoning_open) return;
    part_event(k, out, "response.reasoning_text.done", k->rs_id, k->outputs - 1, "text", cJSON_CreateString(text));
    item_event(k, out, "response.output_item.done", k->outputs - 1, reasoning_item(k, text));
    k->reasoning_open = 0;
}

static void stream_text(rs_call *k, sbuf *out, const char *reasoning, const char *content) {
    if (*reasoning) {
        if (!k->reasoning_open) {
            item_event(k, out, "response.output_item.added", k->outputs++, reasoning_item(k, NULL));
            k->reasoning_open = 1;
        }
        part_event(k, out, "response.reasoning_text.delta", k->rs_id, k->outputs - 1, "delta", cJSON_CreateString(reasoning));
    }
    if (*content) {
        if (!k->text_open) {
            close_reasoning(k, out, k->call.sent.reasoning.p ? k->call.sent.reasoning.p : "");
            item_event(k, out, "response.output_item.added", k->outputs++, message_item(k, NULL, "in_progress"));
            part_event(k, out, "response.content_part.added", k->msg_id, k->outputs - 1, "part", text_part(""));
            k->text_open = 1;
        }
        part_event(k, out, "response.output_text.delta", k->msg_id, k->outputs - 1, "delta", cJSON_CreateString(content));
    }
}

static void stream_end(rs_call *k, sbuf *out) {
    chat_reply cr;
    turn_parse(&k->call.t, &cr);
    const char *text = cr.content ? cr.content : "";
    int ncalls = cr.tool_calls ? cJSON_GetArraySize(cr.tool_calls) : 0;
    close_reasoning(k, out, cr.reasoning ? cr.reasoning : "");
    if (!k->text_open && !ncalls) {      /* an empty reply still has its message */
        item_event(k, out, "response.output_item.added", k->outputs++, message_item(k, NULL, "in_progress"));
        part_event(k, out, "response.content_part.added", k->msg_id, k->outputs - 1, "part", text_part(""));
        k->text_open = 1;
    }
    if (k->text_open) {
        part_event(k, out, "response.output_text.done", k->msg_id, k->outputs - 1, "text", cJSON_CreateString(text));
        part_event(k, out, "response.content_part.done", k->msg_id, k->outputs - 1, "part", text_part(text));
        item_event(k, out, "response.output_item.done", k->outputs - 1, message_item(k, text, item_status(k, !ncalls)));
    }
    for (int i = 0; i < ncalls; i++) {
        const cJSON *tc = cJSON_GetArrayItem(cr.tool_calls, i);
        cJSON *item = call_item(tc, i, "", "in_progress");
        char item_id[80];
        snprintf(item_id, sizeof item_id, "%s", cJSON_GetObjectItemCaseSensitive(item, "id")->valuestring);
        int index = k->outputs++;
        item_event(k, out, "response.output_item.added", index, item);
        cJSON *ev = cJSON_CreateObject();
        cJSON_AddStringToObject(ev, "item_id", item_id);
        cJSON_AddNumberToObject(ev, "output_index", index);
        cJSON_AddStringToObject(ev, "delta", call_args(tc));
        event(k, out, "response.function_call_arguments.delta", ev);
        ev = cJSON_CreateObject();
        cJSON_AddStringToObject(ev, "item_id", item_id);
        cJSON_AddNumberToObject(ev, "output_index", index);
        cJSON_AddStringToObject(ev, "arguments", call_args(tc));
        event(k, out, "response.function_call_arguments.done", ev);
        item_event(k, out, "response.output_item.done", index, call_item(tc, i, call_args(tc), item_status(k, i == ncalls - 1)));
    }
    chat_reply_free(&cr);
    cJSON *r = finish(k);
    const char *status = cJSON_GetObjectItemCaseSensitive(r, "status")->valuestring;
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddItemToObject(ev, "response", r);
    event(k, out, !strcmp(status, "incomplete") ? "response.incomplete" : "response.completed", ev);
}

static void call_free(rs_call *k) {
    api_call_end(&k->call);
    cJSON_Delete(k->echo);
    cJSON_Delete(k->conversation);
    free(k);
}

static void stream_done(void *ctx) { call_free(ctx); }

static int stream_pump(void *ctx, sbuf *out) {
    rs_call *k = ctx;
    if (!k->started) {
        cJSON *ev = cJSON_CreateObject();
        cJSON_AddItemToObject(ev, "response", response_json(k, NULL, 0));
        event(k, out, "response.created", ev);
        ev = cJSON_CreateObject();
        cJSON_AddItemToObject(ev, "response", response_json(k, NULL, 0));
        event(k, out, "response.in_progress", ev);
        k->started = 1;
        k->call.last_write = now_seconds();
        return STREAM_MORE;
    }
    int r = sse_wait(&k->call.t, &k->call.last_write, out, ": keep-alive\n\n");
    if (r == TURN_GONE) return STREAM_ABORT;
    if (r == TURN_DONE && k->call.t.status == GEN_ERROR) {
        http_err e;
        turn_error(&k->call.t, &e);
        cJSON *ev = cJSON_CreateObject();
        cJSON_AddStringToObject(ev, "code", e.code ? e.code : "server_error");
        cJSON_AddStringToObject(ev, "message", e.message);
        cJSON_AddNullToObject(ev, "param");
        event(k, out, "error", ev);
        return STREAM_END;
    }
    char *reasoning, *content;
    chat_reply cr;
    sse_deltas(&k->call.t, &k->call.sent, &reasoning, &content, &cr);
    stream_text(k, out, reasoning, content);
    if (*reasoning || *content) k->call.last_write = now_seconds();
    free(reasoning);
    free(content);
    chat_reply_free(&cr);
    if (r == TURN_DONE) {
        stream_end(k, out);
        turn_summarize(&k->call.t, k->call.ri);
        return STREAM_END;
    }
    return STREAM_MORE;
}

/* ---- handlers ----------------------------------------------------------------------------------- */

static enum MHD_Result fail(struct MHD_Connection *c, rs_call *k, const http_err *e) {
    k->call.ri->status = e->status;
    enum MHD_Result r = e->status == 499 ? MHD_NO : http_send_error(c, API_OPENAI, e);
    call_free(k);
    return r;
}

enum MHD_Result responses_create(serve_ctx *sc, struct MHD_Connection *c, const cJSON *body, req_info *ri) {
    rs_call *k = xcalloc(1, sizeof *k);
    k->sc = sc;
    k->call.ri = ri;
    req_info_ref(ri);
    http_err e = {0};
    if (parse(k, body, &e)) return fail(c, k, &e);
    if (turn_begin(&k->call.t, sc, &k->call.rq, c, ri->t0, &e)) return fail(c, k, &e);
    turn_make_id(k->id, sizeof k->id, "resp_");
    turn_make_id(k->msg_id, sizeof k->msg_id, "msg_");
    turn_make_id(k->rs_id, sizeof k->rs_id, "rs_");
    k->created = (long)time(NULL);
    if (k->stream) {
        ri->status = 200;
        k->call.last_write = now_seconds();
        return http_send_stream(c, stream_pump, stream_done, k);
    }
    if (turn_complete(&k->call.t, &e)) return fail(c, k, &e);
    ri->status = 200;
    enum MHD_Result r = http_send_json(c, 200, finish(k));
    call_free(k);
    return r;
}

enum MHD_Result responses_by_id(serve_ctx *sc, struct MHD_Connection *c, const char *id, int del, req_info *ri) {
    cJSON *r = NULL;
    int found = del ? store_delete(sc->responses, id) : store_get(sc->responses, id, &r, NULL);
    if (!found) {
        http_err e;
        http_err_set(&e, 404, "invalid_request_error", "not_found", "response_id",
                     "Response with id '%s' not found (not stored, or deleted)", id);
        ri->status = 404;
        return http_send_error(c, API_OPENAI, &e);
    }
    if (del) {
        r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "id", id);
        cJSON_AddStringToObject(r, "object", "response");
        cJSON_AddBoolToObject(r, "deleted", 1);
    }
    ri->status = 200;
    return http_send_json(c, 200, r);
}
