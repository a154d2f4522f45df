/* chat_glm.c — the GLM-4.5 … GLM-5 chat template and reply parser.
 *
 * Rendering follows the official chat_template.jinja exactly as Hugging Face evaluates it
 * (trim_blocks + lstrip_blocks), so tests compare it byte for byte with @huggingface/jinja:
 *   [gMASK]<sop>
 *   [<|system|>\n# Tools ... <tools>\n{tool json}\n...</tools>\n\nFor each function call ...]
 *   <|system|>TEXT   <|user|>TEXT   <|observation|><tool_response>TEXT</tool_response>...
 *   <|assistant|><think>R</think>CONTENT<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>
 *   cue: <|assistant|><think>   (thinking off: <|assistant|></think>)
 * Reasoning is kept only for assistant turns after the last user message (the template's rule;
 * earlier turns render a bare </think>). Tool JSON uses Python's json.dumps spacing (", ", ": ").
 *
 * Only the template's literals are written trusted; content, reasoning, tool responses, the tools
 * JSON, call names, argument keys and values are request data and written untrusted (chat.h).
 *
 * Reasoning: the template reads an assistant's reasoning_content (or <think> in its content) and
 * has thinking on or off (enable_thinking), nothing between: a `reasoning` field it would drop is
 * refused (chat_reasoning_content_only), and so is every reasoning effort but "none" (glm_efforts).
 *
 * Where the template leaves a case undefined we choose, and say so: a `developer` message renders
 * as a system message; null content renders as empty; tool-call arguments given as a JSON string
 * (the OpenAI shape) are parsed into the object the template iterates.
 *
 * Parsing a reply: text before </think> is reasoning (when the cue opened <think>), the rest is
 * content, both untrimmed; <tool_call> blocks become OpenAI tool_calls whose argument values are JSON when they
 * parse as JSON and strings otherwise (no schema is available here). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/sbuf.h"
#include "../core/util.h"
#include "chat.h"

/* ---- rendering -------------------------------------------------------------------------- */

static void put_visible(void *out, const char *s, int from_part) { sbuf_puts(out, s); }

/* visible_text() keeps a bare string part as text and skips every other part. */
static int other_part(void *out, const cJSON *part, int idx, char *err, size_t errlen) {
    if (cJSON_IsString(part)) sbuf_puts(out, part->valuestring);
    return 0;
}

/* The template's visible_text(): a string, or the text parts of an array; null is empty. */
static int visible_text(const cJSON *content, sbuf *out, int idx, char *err, size_t errlen) {
    chat_content_rule rule = {put_visible, other_part, out};
    return chat_content_walk(content, idx, &rule, err, errlen);
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Python str.strip() of s[0..n) as (start, length). */
static void strip(const char *s, size_t n, size_t *start, size_t *len) {
    size_t a = 0, z = n;
    while (a < z && is_space(s[a])) a++;
    while (z > a && is_space(s[z - 1])) z--;
    *start = a;
    *len = z - a;
}

/* Request text, as visible_text() renders it, written untrusted. */
static int untrusted_text(chat_prompt *p, const cJSON *content, int idx, char *err, size_t errlen) {
    size_t at = p->text.len;
    int rc = visible_text(content, &p->text, idx, err, errlen);
    chat_untrusted_since(p, at);
    return rc;
}

static void untrusted_stripped(chat_prompt *p, const char *s, size_t n) {
    size_t a, len;
    strip(s, n, &a, &len);
    chat_untrusted(p, s + a, len);
}

static void render_tools(chat_prompt *p, const cJSON *tools) {
    chat_trusted(p, "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                 "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n");
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        chat_untrusted_json(p, t);
        chat_trusted(p, "\n");
    }
    chat_trusted(p, "</tools>\n\nFor each function call, output the function name and arguments within the following "
              "XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}"
              "</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>");
}

static int render_tool_calls(chat_prompt *p, const cJSON *calls, int idx, char *err, size_t errlen) {
    const cJSON *item;
    int k = 0;
    cJSON_ArrayForEach(item, calls) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(item, "function"), *tc = fn ? fn : item;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(tc, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(tc, "arguments");
        if (!cJSON_IsString(name))
            return errf(err, errlen, "messages[%d].tool_calls[%d].function.name must be a string", idx, k);
        cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        const cJSON *obj = parsed ? parsed : args;
        if (args && !cJSON_IsObject(obj) && !(cJSON_IsString(args) && !parsed)) {
            cJSON_Delete(parsed);
            return errf(err, errlen, "messages[%d].tool_calls[%d].function.arguments must be a JSON object", idx, k);
        }
        chat_trusted(p, "<tool_call>");
        chat_untrusted_str(p, name->valuestring);
        /* arguments text that is not JSON at all — a call cut by max_tokens, sent back as this
         * server returned it (chat_cut_arguments) — is written as the text it is */
        if (!cJSON_IsObject(obj)) chat_untrusted_str(p, args ? args->valuestring : "");
        for (const cJSON *a = cJSON_IsObject(obj) ? obj->child : NULL; a; a = a->next) {
            chat_trusted(p, "<arg_key>");
            chat_untrusted_str(p, a->string);
            chat_trusted(p, "</arg_key><arg_value>");
            if (cJSON_IsString(a)) chat_untrusted_str(p, a->valuestring);
            else chat_untrusted_json(p, a);
            chat_trusted(p, "</arg_value>");
        }
        chat_trusted(p, "</tool_call>");
        cJSON_Delete(parsed);
        k++;
    }
    return 0;
}

static const char *find_in(const char *s, size_t n, const char *needle) { return chat_find(s, s + n, needle); }

static const char *rfind_in(const char *s, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = n >= m ? n - m + 1 : 0; i-- > 0;)
        if (!memcmp(s + i, needle, m)) return s + i;
    return NULL;
}

static int render_assistant(chat_prompt *p, const cJSON *msg, int idx, int after_last_user, char *err, size_t errlen) {
    sbuf text = {0}, reason = {0};
    if (chat_reasoning_content_only(msg, idx, err, errlen)) return -1;   /* the template reads m.reasoning_content */
    if (visible_text(cJSON_GetObjectItemCaseSensitive(msg, "content"), &text, idx, err, errlen)) return -1;
    const char *content = text.p ? text.p : "";
    size_t clen = text.len;
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(msg, "reasoning_content");
    if (cJSON_IsString(rc)) sbuf_puts(&reason, rc->valuestring);
    else if (find_in(content, clen, "</think>")) {
        /* reasoning = before first </think>, rstrip \n, after last <think>, lstrip \n */
        const char *end = find_in(content, clen, "</think>"), *start = content;
        const char *open = rfind_in(content, (size_t)(end - content), "<think>");
        while (end > content && end[-1] == '\n') end--;
        if (open && open + 7 <= end) start = open + 7;
        while (start < end && *start == '\n') start++;
        if (end > start) sbuf_put(&reason, start, (size_t)(end - start));
        const char *after = rfind_in(content, clen, "</think>") + 8;
        while (*after == '\n') after++;
        clen -= (size_t)(after - content);
        content = after;
    }
    chat_trusted(p, "<|assistant|>");
    size_t ra, rl;
    strip(reason.p ? reason.p : "", reason.len, &ra, &rl);
    if (after_last_user && rl) {
        chat_trusted(p, "<think>");
        chat_untrusted(p, reason.p + ra, rl);
        chat_trusted(p, "</think>");
    } else chat_trusted(p, "</think>");
    untrusted_stripped(p, content, clen);
    free(text.p);
    free(reason.p);
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    return cJSON_IsArray(calls) ? render_tool_calls(p, calls, idx, err, errlen) : 0;
}

static int render_message(chat_prompt *p, const cJSON *messages, int i, int last_user, char *err, size_t errlen) {
    const cJSON *msg = cJSON_GetArrayItem(messages, i);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (!cJSON_IsObject(msg) || !cJSON_IsString(role)) return errf(err, errlen, "messages[%d].role must be a string", i);
    const char *r = role->valuestring;
    if (!strcmp(r, "user")) {
        chat_trusted(p, "<|user|>");
        return untrusted_text(p, content, i, err, errlen);
    }
    if (!strcmp(r, "system") || !strcmp(r, "developer")) {
        chat_trusted(p, "<|system|>");
        return untrusted_text(p, content, i, err, errlen);
    }
    if (!strcmp(r, "assistant")) return render_assistant(p, msg, i, i > last_user, err, errlen);
    if (!strcmp(r, "tool")) {
        const cJSON *prev = i > 0 ? cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(messages, i - 1), "role") : NULL;
        if (!cJSON_IsString(prev) || strcmp(prev->valuestring, "tool")) chat_trusted(p, "<|observation|>");
        chat_trusted(p, "<tool_response>");
        if (untrusted_text(p, content, i, err, errlen)) return -1;
        chat_trusted(p, "</tool_response>");
        return 0;
    }
    return errf(err, errlen, "messages[%d].role '%s' is not one of system, developer, user, assistant, tool", i, r);
}

static int glm_render(const cJSON *messages, const cJSON *tools, const chat_opts *o, chat_prompt *p, char *err,
                      size_t errlen) {
    if (!cJSON_IsArray(messages)) return errf(err, errlen, "messages must be an array");
    chat_trusted(p, "[gMASK]<sop>");
    if (cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0) render_tools(p, tools);
    int n = cJSON_GetArraySize(messages), last_user = -1;
    for (int i = 0; i < n; i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(messages, i), "role");
        if (cJSON_IsString(role) && !strcmp(role->valuestring, "user")) last_user = i;
    }
    for (int i = 0; i < n; i++)
        if (render_message(p, messages, i, last_user, err, errlen)) return -1;
    chat_trusted(p, o && !o->thinking ? "<|assistant|></think>" : "<|assistant|><think>");
    return 0;
}

/* ---- parsing a reply -------------------------------------------------------------------- */

static char *dup_span(const char *s, size_t n) {
    char *out = xmalloc(n + 1);
    memcpy(out, s, n);
    out[n] = 0;
    return out;
}

static char *dup_stripped(const char *s, size_t n) {
    size_t a, len;
    strip(s, n, &a, &len);
    char *out = xmalloc(len + 1);
    memcpy(out, s + a, len);
    out[len] = 0;
    return out;
}

/* Text between open and close tags starting at *p (within end); advances *p past close.
 * A missing close tag (generation cut off) takes the rest. */
static int take_tag(const char **p, const char *end, const char *open, const char *close, const char **v,
                    size_t *vn) {
    const char *o = find_in(*p, (size_t)(end - *p), open);
    if (!o) return 0;
    const char *start = o + strlen(open), *c = find_in(start, (size_t)(end - start), close);
    *v = start;
    *vn = (size_t)((c ? c : end) - start);
    *p = c ? c + strlen(close) : end;
    return 1;
}

static cJSON *arg_value(const char *v, size_t n) {
    char *s = dup_stripped(v, n);
    const char *rest = NULL;
    cJSON *j = cJSON_ParseWithOpts(s, &rest, 1);
    if (!j) j = cJSON_CreateString(s);
    free(s);
    return j;
}

/* One <tool_call> body [s, end); cut: the reply ended inside it (no </tool_call>), so the
 * argument being written is passed on as far as it goes (chat_cut_arguments). */
static cJSON *parse_call(const char *s, const char *end, int cut, const char *text, size_t text_n, int k) {
    const char *name_end = find_in(s, (size_t)(end - s), "<arg_key>");
    size_t name_n = name_end ? (size_t)(name_end - s) : (size_t)(end - s);
    if (cut && !name_end) name_n = chat_cut_marker(s, chat_cut_marker(s, name_n, "<arg_key>"), "</tool_call>");
    char *name = dup_stripped(s, name_n);
    cJSON *args = cJSON_CreateObject();
    const char *p = s, *kv, *vv = NULL;
    size_t kn, vn = 0;
    char *key = NULL;
    int key_done = 0, value_done = 1;
    while (take_tag(&p, end, "<arg_key>", "</arg_key>", &kv, &kn)) {
        free(key);
        key_done = p > kv + kn;
        key = dup_stripped(kv, key_done ? kn : chat_cut_marker(kv, kn, "</arg_key>"));
        int has_value = key_done && take_tag(&p, end, "<arg_value>", "</arg_value>", &vv, &vn);
        if (!has_value) vv = NULL;
        value_done = has_value && p > vv + vn;
        if (!cut || value_done) cJSON_AddItemToObject(args, key, has_value ? arg_value(vv, vn) : cJSON_CreateString(""));
    }
    char *args_json = cJSON_PrintUnformatted(args);
    if (cut) {
        char *whole = args_json;
        int open = key && !value_done;
        size_t open_n = vv ? chat_cut_marker(vv, vn, "</arg_value>") : 0;
        args_json = !name_end ? xstrdup("") : chat_cut_arguments(whole, ",", ":", open ? key : NULL, key_done, vv, open_n, 0);
        free(whole);
    }
    cJSON *call = chat_tool_call(name, args_json, text, text_n, k);
    free(key);
    free(name);
    free(args_json);
    cJSON_Delete(args);
    return call;
}

/* Stop markers the model may leave at the end of its turn. */
static size_t trim_stop_markers(const char *s, size_t n) {
    static const char *markers[] = {"<|endoftext|>", "<|user|>", "<|observation|>"};
    for (size_t i = 0; i < sizeof markers / sizeof *markers; i++) {
        size_t m = strlen(markers[i]);
        if (n >= m && !memcmp(s + n - m, markers[i], m)) return trim_stop_markers(s, n - m);
    }
    return n;
}

/* Reasoning and content are returned exactly as generated (no trimming), so a non-streamed reply
 * equals the concatenation of the streamed deltas. */
static void glm_parse(const char *text, size_t n, int thinking, chat_reply *out) {
    memset(out, 0, sizeof *out);
    n = trim_stop_markers(text, n);
    const char *body = text, *end = text + n, *close = find_in(text, n, "</think>");
    if (thinking && !close) { out->reasoning = dup_span(text, n); return; }
    if (close) {
        const char *r = text, *open = find_in(text, (size_t)(close - text), "<think>");
        if (open) r = open + 7;
        if (close > r) out->reasoning = dup_span(r, (size_t)(close - r));
        body = close + 8;
    }
    const char *first_call = find_in(body, (size_t)(end - body), "<tool_call>");
    out->content = dup_span(body, (size_t)((first_call ? first_call : end) - body));
    if (!first_call) return;
    out->tool_calls = cJSON_CreateArray();
    const char *p = first_call, *v;
    size_t vn;
    for (int k = 0; take_tag(&p, end, "<tool_call>", "</tool_call>", &v, &vn); k++) {
        out->cut_call = p == v + vn;   /* no </tool_call>: the reply ended inside it */
        cJSON_AddItemToArray(out->tool_calls, parse_call(v, v + vn, out->cut_call, text, n, k));
    }
    size_t a, len;
    strip(out->content, strlen(out->content), &a, &len);
    if (!len) { free(out->content); out->content = NULL; }
}

/* The system part of a prompt: everything before the first user turn, when a system turn exists. */
static size_t glm_system_prefix_bytes(const char *prompt, size_t n) {
    const char *user = find_in(prompt, n, "<|user|>");
    if (!user || !find_in(prompt, (size_t)(user - prompt), "<|system|>")) return 0;
    return (size_t)(user - prompt);
}

/* render_tool_calls' layout; every value as JSON text, which arg_value reads back typed. */
static const tool_syntax glm_tools = {
    .block_open = "", .call_sep = "", .block_close = "",
    .call_open = "\"<tool_call>\"", .call_mid = "", .call_close = "\"</tool_call>\"",
    .arg_open = "\"<arg_key>\"", .arg_mid = "\"</arg_key>\" \"<arg_value>\"", .arg_close = "\"</arg_value>\"",
    .arg_sep = "",
    .calls_start = "<tool_call>",
    .think_end = "</think>",
};

/* The template renders the content stripped, then each call with no whitespace between tags. */
static const tool_example glm_example = {
    .reply = "Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
             "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
    .marker = "tool_call",
    .result = "<|observation|><tool_response>%s</tool_response>",
};

/* The template's only switch is enable_thinking: no OpenAI effort level maps onto it, so only
 * "none" (thinking off) is accepted as an effort; thinking on comes without one. */
static const char *const glm_efforts[] = {NULL};

const chat_template glm_chat = {
    .efforts = glm_efforts,
    .tools = &glm_tools,
    .example = &glm_example,
    .render = glm_render,
    .parse = glm_parse,
    .system_prefix_bytes = glm_system_prefix_bytes,
};
