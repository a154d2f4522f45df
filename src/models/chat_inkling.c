/* chat_inkling.c — the Inkling message format and reply parser.
 *
 * No jinja template ships with Inkling; this follows the native renderer the serving stacks use
 * (vLLM's InklingChatRenderer, HF processing_inkling.py for the audio markers), token for token:
 *   every message   <|message_ROLE|>[name]<|content_TYPE|>TEXT<|end_message|>
 *                   ROLE system (also developer) / user / model / tool; TYPE text, thinking,
 *                   xml (tool declarations), invoke_tool_json (a tool call)
 *   tools first     <|message_system|>tool_declare<|content_xml|>[{"description":..,"name":..,
 *                   "parameters":..,"type":"function"},...]<|end_message|>  (compact JSON, keys sorted)
 *   effort          <|message_system|><|content_text|>Thinking effort level: E<|end_message|> before
 *                   the first message that is not system/developer (else at the end); E is the
 *                   effort with two decimals, trailing zeros dropped ("0.9", "0.99", "0.0")
 *   assistant       reasoning block (if any), text block (if non-empty), one block per tool call
 *                   <|message_model|>NAME<|content_invoke_tool_json|>{"name":"NAME","args":{..}}
 *                   <|end_message|>, then <|content_model_end_sampling|>
 *   tool result     <|message_tool|>NAME<|content_text|>TEXT<|end_message|>, NAME from the call id
 *   audio part      <|message_user|><|content_audio_input|> N x <|content_audio|> <|audio_end|>
 *                   <|end_message|>, N = the clip's DMel frame count (`input_audio.dmel_frames`,
 *                   which the gateway sets after decoding the clip)
 *   cue             <|message_model|>
 * Effort: reasoning_effort none 0.0, minimal 0.1, low 0.2, medium 0.7, high 0.9, xhigh/max 0.99;
 * thinking on without an effort is high (the renderer's default); thinking off is 0.0.
 * Reasoning is the assistant's reasoning_content; a `reasoning` field the renderer would drop is
 * refused (chat_reasoning_content_only).
 * Empty string content renders nothing; each text part of an array is its own block.
 *
 * Parsing a reply: the model opens each block with a content type (the cue carries none), so the
 * text is split at <|end_message|> / <|message_model|>; thinking blocks are reasoning, text blocks
 * content, invoke_tool_json blocks OpenAI tool_calls. Text without any marker is content; text
 * between a <|message_model|> and its (not yet generated) content type is not, so a streamed
 * tool call's name never shows up as content first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/sbuf.h"
#include "../core/util.h"
#include "chat.h"

#define END "<|end_message|>"
#define END_SAMPLING "<|content_model_end_sampling|>"

/* ---- compact JSON with sorted keys (serde_json::to_string of a sorted map) ------------------ */

static int cmp_key(const void *a, const void *b) {
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

static void json_sorted(sbuf *b, const cJSON *v) {
    if (cJSON_IsNumber(v) || cJSON_IsString(v) || cJSON_IsBool(v) || cJSON_IsNull(v) || !v) {
        if (cJSON_IsString(v)) chat_json_py_string(b, v->valuestring);
        else if (v) chat_json_py(b, v);
        else sbuf_puts(b, "null");
        return;
    }
    int obj = cJSON_IsObject(v), n = cJSON_GetArraySize(v), i = 0;
    const cJSON **kids = xmalloc((size_t)(n ? n : 1) * sizeof *kids);
    for (const cJSON *e = v->child; e; e = e->next) kids[i++] = e;
    if (obj) qsort(kids, (size_t)n, sizeof *kids, cmp_key);
    sbuf_puts(b, obj ? "{" : "[");
    for (i = 0; i < n; i++) {
        if (i) sbuf_puts(b, ",");
        if (obj) {
            chat_json_py_string(b, kids[i]->string);
            sbuf_puts(b, ":");
        }
        json_sorted(b, kids[i]);
    }
    sbuf_puts(b, obj ? "}" : "]");
    free(kids);
}

/* ---- rendering -------------------------------------------------------------------------- */

/* Markers are the template's own text; names and text came from the request (chat.h). */
static void marker(chat_prompt *p, const char *fmt, const char *word) {
    char m[96];
    snprintf(m, sizeof m, fmt, word);
    chat_trusted(p, m);
}

static void block(chat_prompt *p, const char *role, const char *name, const char *type, const char *text) {
    marker(p, "<|message_%s|>", role);
    if (name) chat_untrusted_str(p, name);
    marker(p, "<|content_%s|>", type);
    chat_untrusted_str(p, text);
    chat_trusted(p, END);
}

static int audio_block(chat_prompt *p, const char *role, const cJSON *part, int idx, char *err, size_t errlen) {
    const cJSON *frames = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(part, "input_audio"),
                                                           "dmel_frames");
    if (!cJSON_IsNumber(frames) || frames->valueint < 1)
        return errf(err, errlen, "messages[%d]: an input_audio part reached the template undecoded", idx);
    marker(p, "<|message_%s|>", role);
    chat_trusted(p, "<|content_audio_input|>");
    for (int k = 0; k < frames->valueint; k++) chat_trusted(p, "<|content_audio|>");
    chat_trusted(p, "<|audio_end|>" END);
    return 0;
}

typedef struct {
    chat_prompt *p;
    const char *role;
} blocks_ctx;

/* A string renders one text block (none when empty), every text part one block. */
static void text_block(void *ctx, const char *s, int from_part) {
    blocks_ctx *c = ctx;
    if (from_part || *s) block(c->p, c->role, NULL, "text", s);
}

static int audio_or_refuse(void *ctx, const cJSON *part, int idx, char *err, size_t errlen) {
    blocks_ctx *c = ctx;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "input_audio"))
        return audio_block(c->p, c->role, part, idx, err, errlen);
    return errf(err, errlen, "messages[%d].content: part type '%s' is not supported (text, input_audio)", idx,
                cJSON_IsString(type) ? type->valuestring : "?");
}

/* One block per text / audio part of the content. */
static int content_blocks(chat_prompt *b, const char *role, const cJSON *content, int idx, char *err, size_t errlen) {
    blocks_ctx ctx = {b, role};
    chat_content_rule rule = {text_block, audio_or_refuse, &ctx};
    return chat_content_walk(content, idx, &rule, err, errlen);
}

static void render_tools(chat_prompt *p, const cJSON *tools) {
    cJSON *specs = cJSON_CreateArray();
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function"), *f = fn ? fn : t;
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(f, "description");
        cJSON *s = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "description", cJSON_IsString(desc) ? desc->valuestring : "");
        cJSON_AddItemToObject(s, "name", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(f, "name"), 1));
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        cJSON_AddItemToObject(s, "parameters", params ? cJSON_Duplicate(params, 1) : cJSON_CreateNull());
        cJSON_AddStringToObject(s, "type", "function");
        cJSON_AddItemToArray(specs, s);
    }
    chat_trusted(p, "<|message_system|>tool_declare<|content_xml|>");
    size_t at = p->text.len;
    json_sorted(&p->text, specs);
    chat_untrusted_since(p, at);
    chat_trusted(p, END);
    cJSON_Delete(specs);
}

static void render_effort(chat_prompt *p, const chat_opts *o) {
    static const struct { const char *name; const char *level; } levels[] = {
        {"none", "0.0"}, {"minimal", "0.1"}, {"low", "0.2"}, {"medium", "0.7"}, {"high", "0.9"}, {"xhigh", "0.99"},
        {"max", "0.99"}};
    const char *level = o && o->thinking ? "0.9" : "0.0";
    for (size_t i = 0; o && o->thinking && o->effort && i < sizeof levels / sizeof *levels; i++)
        if (!strcmp(o->effort, levels[i].name)) level = levels[i].level;
    marker(p, "<|message_system|><|content_text|>Thinking effort level: %s" END, level);
}

/* {"name":NAME,"args":{sorted}}; arguments may be an object or its JSON text (the OpenAI shape), or
 * text that is not JSON at all (a call cut by max_tokens, sent back as returned), written as is. */
static int render_call(chat_prompt *p, const cJSON *item, int idx, int k, char *err, size_t errlen) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(item, "function"), *tc = fn ? fn : item;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(tc, "name"), *args = cJSON_GetObjectItemCaseSensitive(tc, "arguments");
    if (!cJSON_IsString(name)) return errf(err, errlen, "messages[%d].tool_calls[%d].function.name must be a string", idx, k);
    cJSON *parsed = cJSON_IsString(args) && *args->valuestring ? cJSON_Parse(args->valuestring) : NULL;
    const cJSON *obj = parsed ? parsed : args;
    if (obj && !cJSON_IsObject(obj) && !(cJSON_IsString(args) && !parsed)) {
        cJSON_Delete(parsed);
        return errf(err, errlen, "messages[%d].tool_calls[%d].function.arguments must be a JSON object", idx, k);
    }
    chat_trusted(p, "<|message_model|>");
    chat_untrusted_str(p, name->valuestring);
    chat_trusted(p, "<|content_invoke_tool_json|>");
    size_t at = p->text.len;
    sbuf *b = &p->text;
    sbuf_puts(b, "{\"name\":");
    chat_json_py_string(b, name->valuestring);
    sbuf_puts(b, ",\"args\":");
    if (cJSON_IsObject(obj)) json_sorted(b, obj);
    else if (cJSON_IsString(args) && *args->valuestring) sbuf_puts(b, args->valuestring);   /* a cut call, as returned */
    else sbuf_puts(b, "{}");
    sbuf_puts(b, "}");
    chat_untrusted_since(p, at);
    chat_trusted(p, END);
    cJSON_Delete(parsed);
    return 0;
}

static int render_assistant(chat_prompt *b, const cJSON *msg, int idx, char *err, size_t errlen) {
    if (chat_reasoning_content_only(msg, idx, err, errlen)) return -1;   /* the renderer reads reasoning_content */
    const cJSON *reason = cJSON_GetObjectItemCaseSensitive(msg, "reasoning_content");
    if (cJSON_IsString(reason) && *reason->valuestring) block(b, "model", NULL, "thinking", reason->valuestring);
    if (content_blocks(b, "model", cJSON_GetObjectItemCaseSensitive(msg, "content"), idx, err, errlen)) return -1;
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls"), *c;
    int k = 0;
    if (cJSON_IsArray(calls)) cJSON_ArrayForEach(c, calls)
        if (render_call(b, c, idx, k++, err, errlen)) return -1;
    chat_trusted(b, END_SAMPLING);
    return 0;
}

/* The name of the call with this id among the assistant turns before message i ("" if unknown). */
static const char *call_name(const cJSON *messages, int i, const char *id) {
    for (int j = i - 1; id && j >= 0; j--) {
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(messages, j), "tool_calls"), *c;
        cJSON_ArrayForEach(c, calls) {
            const cJSON *cid = cJSON_GetObjectItemCaseSensitive(c, "id");
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn ? fn : c, "name");
            if (cJSON_IsString(cid) && cJSON_IsString(name) && !strcmp(cid->valuestring, id)) return name->valuestring;
        }
    }
    return "";
}

static int render_tool_result(chat_prompt *b, const cJSON *messages, int i, char *err, size_t errlen) {
    const cJSON *msg = cJSON_GetArrayItem(messages, i), *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(msg, "tool_call_id");
    sbuf text = {0};
    if (cJSON_IsString(content)) sbuf_puts(&text, content->valuestring);
    else if (cJSON_IsArray(content)) {
        const cJSON *part;
        cJSON_ArrayForEach(part, content) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsString(t)) {
                free(text.p);
                return errf(err, errlen, "messages[%d].content: a tool result takes text parts only", i);
            }
            sbuf_puts(&text, t->valuestring);
        }
    }
    block(b, "tool", call_name(messages, i, cJSON_IsString(id) ? id->valuestring : NULL), "text", text.p ? text.p : "");
    free(text.p);
    return 0;
}

static int render_message(chat_prompt *b, const cJSON *messages, int i, char *err, size_t errlen) {
    const cJSON *msg = cJSON_GetArrayItem(messages, i);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
    if (!cJSON_IsObject(msg) || !cJSON_IsString(role)) return errf(err, errlen, "messages[%d].role must be a string", i);
    const char *r = role->valuestring;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (!strcmp(r, "system") || !strcmp(r, "developer")) return content_blocks(b, "system", content, i, err, errlen);
    if (!strcmp(r, "user")) return content_blocks(b, "user", content, i, err, errlen);
    if (!strcmp(r, "assistant")) return render_assistant(b, msg, i, err, errlen);
    if (!strcmp(r, "tool")) return render_tool_result(b, messages, i, err, errlen);
    return errf(err, errlen, "messages[%d].role '%s' is not one of system, developer, user, assistant, tool", i, r);
}

static int is_system(const cJSON *msg) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
    return cJSON_IsString(role) && (!strcmp(role->valuestring, "system") || !strcmp(role->valuestring, "developer"));
}

static int inkling_render(const cJSON *messages, const cJSON *tools, const chat_opts *o, chat_prompt *out, char *err,
                          size_t errlen) {
    if (!cJSON_IsArray(messages)) return errf(err, errlen, "messages must be an array");
    if (cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0) render_tools(out, tools);
    int n = cJSON_GetArraySize(messages), effort_done = 0;
    for (int i = 0; i < n; i++) {
        if (!effort_done && !is_system(cJSON_GetArrayItem(messages, i))) {
            render_effort(out, o);
            effort_done = 1;
        }
        if (render_message(out, messages, i, err, errlen)) return -1;
    }
    if (!effort_done) render_effort(out, o);
    chat_trusted(out, "<|message_model|>");
    return 0;
}

/* ---- parsing a reply -------------------------------------------------------------------- */

static void append(char **dst, const char *s, size_t n) {
    size_t old = *dst ? strlen(*dst) : 0;
    *dst = xrealloc(*dst, old + n + 1);
    memcpy(*dst + old, s, n);
    (*dst)[old + n] = 0;
}

/* One call: NAME, then its JSON body. cut: the reply ended inside the body (no END after it),
 * so the arguments are the text written after "args": — as far as the model went, not
 * completed (chat_cut_arguments' rule). */
static void add_call(chat_reply *out, const char *name, size_t nn, const char *body, size_t bn, int cut, int k) {
    char *js = xmalloc(bn + 1);
    memcpy(js, body, bn);
    js[bn] = 0;
    cJSON *j = cJSON_Parse(js), *args = cJSON_GetObjectItemCaseSensitive(j, "args");
    const cJSON *jname = cJSON_GetObjectItemCaseSensitive(j, "name");
    const char *written = strstr(js, "\"args\":");
    char id[32], *args_json = cJSON_IsObject(args) ? cJSON_PrintUnformatted(args)
                            : cut ? xstrdup(written ? written + 7 : "")
                                  : xstrdup("{}");
    out->cut_call = cut;
    uint64_t h = fnv64(FNV64_INIT, body, bn);
    snprintf(id, sizeof id, "call_%016llx%08x", (unsigned long long)h, (unsigned)(fnv64(h, &k, sizeof k) & 0xffffffffu));
    cJSON *call = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    cJSON_AddStringToObject(call, "id", id);
    cJSON_AddStringToObject(call, "type", "function");
    char *nm = xmalloc(nn + 1);
    memcpy(nm, name, nn);
    nm[nn] = 0;
    cJSON_AddStringToObject(fn, "name", nn || !cJSON_IsString(jname) ? nm : jname->valuestring);
    cJSON_AddStringToObject(fn, "arguments", args_json);
    cJSON_AddItemToObject(call, "function", fn);
    if (!out->tool_calls) out->tool_calls = cJSON_CreateArray();
    cJSON_AddItemToArray(out->tool_calls, call);
    free(nm);
    free(args_json);
    free(js);
    cJSON_Delete(j);
}

static void inkling_parse(const char *text, size_t n, int thinking, chat_reply *out) {
    static const char *types[] = {"<|content_thinking|>", "<|content_text|>", "<|content_invoke_tool_json|>"};
    memset(out, 0, sizeof *out);
    const char *p = text, *end = text + n;
    for (const char *tail[] = {END_SAMPLING, "<|endoftext|>"}, **t = tail; t < tail + 2; t++)
        if ((size_t)(end - p) >= strlen(*t) && !memcmp(end - strlen(*t), *t, strlen(*t))) end -= strlen(*t);
    int k = 0;
    while (p < end) {
        int header = (size_t)(end - p) >= 17 && !memcmp(p, "<|message_model|>", 17);
        if (header) p += 17;
        int type = -1;
        const char *at = NULL;
        for (int i = 0; i < 3; i++) {
            const char *f = chat_find(p, end, types[i]);
            if (f && (!at || f < at)) at = f, type = i;
        }
        const char *stop = chat_find(p, end, END);
        if (!at || (stop && stop < at)) {
            /* after a message header, text before its content type is a name still arriving (a
             * tool call's): not content. Text with no header at all is plain content. */
            if (header && !stop) break;
            append(&out->content, p, (size_t)((stop ? stop : end) - p));
            p = stop ? stop + strlen(END) : end;
            continue;
        }
        const char *body = at + strlen(types[type]), *close = chat_find(body, end, END);
        size_t bn = (size_t)((close ? close : end) - body);
        if (!close && type == 2) bn = chat_cut_marker(body, bn, END);   /* a call cut inside its END */
        if (type == 0) append(&out->reasoning, body, bn);
        else if (type == 1) append(&out->content, body, bn);
        else add_call(out, p, (size_t)(at - p), body, bn, !close, k++);
        p = close ? close + strlen(END) : end;
    }
}

/* The system part: everything before the first user message, when system messages lead. */
static size_t inkling_system_prefix_bytes(const char *prompt, size_t n) {
    const char *user = chat_find(prompt, prompt + n, "<|message_user|>");
    if (!user || !chat_find(prompt, user, "<|message_system|>")) return 0;
    return (size_t)(user - prompt);
}

/* render_call's blocks: the name, then {"name":NAME,"args":{...}} with the arguments sorted as
 * json_sorted writes them; text and reasoning as their own blocks, each block after the first
 * opened by <|message_model|> (the cue opens the first). */
static const tool_syntax inkling_tools = {
    .call_sep = "\"<|message_model|>\"",
    .call_mid = "\"<|content_invoke_tool_json|>\" \"{\\\"name\\\":\"",
    .call_name_json = "\",\\\"args\\\":{\"",
    .call_close = "\"}}\" \"" END "\"",
    .arg_mid = "\":\"",
    .arg_sep = "\",\"",
    .key_spelling = NAME_JSON,
    .sorted_args = 1,
    .text_open = "\"<|content_text|>\"",
    .text_close = "\"" END "\"",
    .text_calls = "\"" END "\" \"<|message_model|>\"",
    .think_open = "\"<|content_thinking|>\"",
    .think_close = "\"" END "\" \"<|message_model|>\"",
    .calls_start = END,
    .think_end = END,
};

/* A text block, then the call as its own model message (name, then the JSON payload); the model
 * opens its thinking block itself. */
static const tool_example inkling_example = {
    .reply = "<|content_text|>Let me check.<|end_message|><|message_model|>get_weather<|content_invoke_tool_json|>"
             "{\"name\":\"get_weather\",\"args\":{\"city\":\"Paris\",\"days\":3}}<|end_message|>",
    .marker = "content_invoke",
    .result = "<|message_tool|>get_weather<|content_text|>%s<|end_message|>",
    .think_start = "<|content_thinking|>",
    .think_end = "<|end_message|><|message_model|>",
};

const chat_template inkling_chat = {
    .example = &inkling_example,
    .tools = &inkling_tools,
    .render = inkling_render,
    .parse = inkling_parse,
    .system_prefix_bytes = inkling_system_prefix_bytes,
    .audio = 1,
};
