/* chat_kimi_k3.c — the Kimi K3 chat format (XTML) and reply parser.
 *
 * K3 ships no jinja chat_template: prompts come from the release's Python encoder
 * (encoding_k3.py, build_chat_segments). This follows its format as the K3 technical report and
 * the encoder's public ports describe it. Markup is made of three special tokens, <|open|>,
 * <|sep|>, <|close|>, plus <|end_of_msg|> after every message:
 *   <|open|>message role="system" type="tool-declare"<|sep|># Tools\nHere are the available tools,
 *       described in JSONSchema.\n\n```json\n{compact, key-sorted tools}\n```<|close|>message<|sep|><|end_of_msg|>
 *   <|open|>message role="system" type="thinking-effort"<|sep|>`thinking_effort` guides ...
 *       `thinking_effort=max`.<|close|>message<|sep|><|end_of_msg|>            (thinking mode only)
 *   <|open|>message role="user"[ name="N"]<|sep|>TEXT<|close|>message<|sep|><|end_of_msg|>   (system alike;
 *       name: the message's non-empty "name", as the encoder writes it)
 *   <|open|>message role="assistant"<|sep|>[<|open|>think<|sep|>R<|close|>think<|sep|>]
 *       <|open|>response<|sep|>TEXT<|close|>response<|sep|>
 *       [<|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|>
 *           <|open|>argument key="K" type="string"<|sep|>V<|close|>argument<|sep|>...<|close|>call<|sep|>
 *        <|close|>tools<|sep|>]<|close|>message<|sep|><|end_of_msg|>
 *   <|open|>message role="tool" tool="NAME" index="1"<|sep|>TEXT<|close|>message<|sep|><|end_of_msg|>
 *   <|open|>message role="system" type="tool-choice"<|sep|>The system is invoked with
 *       `tool_choice=required`.\nYou MUST call tools in the next message.<|close|>message<|sep|><|end_of_msg|>
 *       (none: "You MUST NOT call any tools"; after the messages, a one-time option)
 *   cue: <|open|>message role="assistant"<|sep|><|open|>think<|sep|>   (thinking off: response)
 * The global options (tool declarations, thinking effort) come before every message. K3 keeps
 * thinking in history ("preserved thinking", technical report): in thinking mode every assistant
 * message has a think channel, empty when no reasoning is known; in instruct mode none has. So the
 * rendered history starts with exactly the previous prompt + the reply the model generated.
 * Argument values: strings raw, every other JSON type as json.dumps writes it (", " and ": ");
 * arguments that are not a JSON object go in a <|open|>json type="object"<|sep|> fallback block.
 * Attribute values escape & and " as XML entities (the encoder's public ports agree on these).
 *
 * Choices where the sources are silent, stated: `developer` renders as system; JSON is written
 * without ASCII escaping; a tool_choice naming one function renders the `required` option (the
 * encoder has no named form; the grammar, k3_tools, forces the function).
 * Effort: the encoder accepts thinking_effort low, high and max only (_VALID_THINKING_EFFORTS),
 * although the message it renders lists `medium` too, and apply_chat_template defaults it to max;
 * any other value (OpenAI's medium, minimal, xhigh) is refused, as the encoder refuses it.
 *   response_format (after the tool-choice option; the grammar still constrains the reply):
 *   <|open|>message role="system" type="response-format"<|sep|>The system is invoked with
 *       `response_format=json_object`.\nYour response must be raw JSON data without markdown code
 *       blocks (```json) or any additional formatting.<|close|>message<|sep|><|end_of_msg|>
 *   json_schema: `response_format=json_schema` and the same sentence, then "\nThe JSON data must
 *       match the following schema:\n```json\n{schema}\n```", the schema key-sorted compact JSON
 *       taken as the encoder's extract_response_schema does: json_schema.schema, else
 *       json_schema.json_schema, else json_schema itself (null when absent); type text: nothing.
 *
 * Only the format's literals are written trusted; content, reasoning, tool results, the tools
 * JSON, tool and argument names and argument values are request data, written untrusted (chat.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/sbuf.h"
#include "../core/util.h"
#include "chat.h"
#include "kimi_k3.h"

#define OPEN "<|open|>"
#define SEP "<|sep|>"
#define CLOSE "<|close|>"
#define EOM "<|end_of_msg|>"

/* ---- rendering -------------------------------------------------------------------------- */

/* Template text is written with T (trusted); request data with chat_untrusted* (chat.h). */
#define T(lit) chat_trusted(p, lit)

/* key="value": the value is request data (a tool or argument name), entity-escaped. */
static void put_attr(chat_prompt *p, const char *key, const char *value, int untrusted) {
    sbuf_printf(&p->text, " %s=\"", key);
    size_t at = p->text.len;
    for (const char *c = value; *c; c++) {
        if (*c == '&') sbuf_puts(&p->text, "&amp;");
        else if (*c == '"') sbuf_puts(&p->text, "&quot;");
        else sbuf_put(&p->text, c, 1);
    }
    if (untrusted) chat_untrusted_since(p, at);
    T("\"");
}

static void close_tag(chat_prompt *p, const char *name) {
    T(CLOSE);
    T(name);
    T(SEP);
}

static void end_message(chat_prompt *p) { T(CLOSE "message" SEP EOM); }

/* <|open|>message role="ROLE"[ KEY="VALUE"]<|sep|>: KEY is `type` (a system option the format
 * names, trusted) or `name` (a user or system message's name, request data). */
static void open_message(chat_prompt *p, const char *role, const char *key, const char *value) {
    T(OPEN "message");
    put_attr(p, "role", role, 0);
    if (value) put_attr(p, key, value, !strcmp(key, "name"));
    T(SEP);
}

static void put_untrusted(void *p, const char *s, int from_part) { chat_untrusted_str(p, s); }

static int refuse_part(void *p, const cJSON *part, int idx, char *err, size_t errlen) {
    return errf(err, errlen, "messages[%d].content: only text parts are supported", idx);
}

/* A message's text, untrusted: a string, or the text parts of an array; null is empty. */
static int put_text(chat_prompt *p, const cJSON *content, int idx, char *err, size_t errlen) {
    chat_content_rule rule = {put_untrusted, refuse_part, p};
    return chat_content_walk(content, idx, &rule, err, errlen);
}

static void untrusted_compact(chat_prompt *p, const cJSON *v, int sort_keys) {
    size_t at = p->text.len;
    chat_json_compact(&p->text, v, sort_keys);
    chat_untrusted_since(p, at);
}

/* An argument value that is not a string: json.dumps(v, ensure_ascii=False). */
static void untrusted_py(chat_prompt *p, const cJSON *v) {
    size_t at = p->text.len;
    chat_json_py(&p->text, v);
    chat_untrusted_since(p, at);
}

static void render_options(chat_prompt *p, const cJSON *tools, int thinking, const char *effort) {
    if (cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0) {
        open_message(p, "system", "type", "tool-declare");
        T("# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n");
        untrusted_compact(p, tools, 1);
        T("\n```");
        end_message(p);
    }
    if (!thinking) return;
    open_message(p, "system", "type", "thinking-effort");
    T("`thinking_effort` guides on how much to think in your thinking channel (not including the response channel), "
      "supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with `thinking_effort=");
    T(effort);        /* one of the literals k3_render accepts */
    T("`.");
    end_message(p);
}

/* The one-time tool_choice option after the messages: none, or required (also for a named
 * function, which the grammar then forces); auto renders nothing. */
static void render_tool_choice(chat_prompt *p, const char *choice) {
    if (!choice || !strcmp(choice, "auto")) return;
    int none = !strcmp(choice, "none");
    open_message(p, "system", "type", "tool-choice");
    T(none ? "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message."
           : "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.");
    end_message(p);
}

/* The one-time response_format option after tool_choice (see the top of the file). */
static void render_response_format(chat_prompt *p, const cJSON *rf) {
    const cJSON *type = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : rf;
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    int object = !strcmp(t, "json_object");
    if (!object && strcmp(t, "json_schema")) return;
    open_message(p, "system", "type", "response-format");
    T(object ? "The system is invoked with `response_format=json_object`.\n"
             : "The system is invoked with `response_format=json_schema`.\n");
    T("Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting.");
    if (!object) {
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema"), *schema = NULL;
        if (cJSON_IsObject(js)) {
            schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
            if (!schema) schema = cJSON_GetObjectItemCaseSensitive(js, "json_schema");
            if (!schema) schema = js;
        }
        T("\nThe JSON data must match the following schema:\n```json\n");
        if (schema) untrusted_compact(p, schema, 1);
        else T("null");
        T("\n```");
    }
    end_message(p);
}

static const cJSON *call_function(const cJSON *call) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
    return fn ? fn : call;
}

static int render_call(chat_prompt *p, const cJSON *call, int idx, int k, char *err, size_t errlen) {
    const cJSON *fn = call_function(call), *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    if (!cJSON_IsString(name)) return errf(err, errlen, "messages[%d].tool_calls[%d].function.name must be a string", idx, k);
    char index[16];
    snprintf(index, sizeof index, "%d", k + 1);
    T(OPEN "call");
    put_attr(p, "tool", name->valuestring, 1);
    put_attr(p, "index", index, 0);
    T(SEP);
    cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
    const cJSON *obj = parsed ? parsed : args;
    if (!args || cJSON_IsObject(obj)) {
        for (const cJSON *a = obj ? obj->child : NULL; a; a = a->next) {
            const char *type = cJSON_IsString(a) ? "string" : cJSON_IsNumber(a) ? "number" : cJSON_IsBool(a) ? "boolean"
                               : cJSON_IsNull(a) ? "null" : cJSON_IsArray(a) ? "array" : "object";
            T(OPEN "argument");
            put_attr(p, "key", a->string, 1);
            put_attr(p, "type", type, 0);
            T(SEP);
            if (cJSON_IsString(a)) chat_untrusted_str(p, a->valuestring);
            else untrusted_py(p, a);
            close_tag(p, "argument");
        }
    } else {
        T(OPEN "json");
        put_attr(p, "type", "object", 0);
        T(SEP);
        if (cJSON_IsString(args)) chat_untrusted_str(p, args->valuestring);
        else untrusted_py(p, args);
        close_tag(p, "json");
    }
    cJSON_Delete(parsed);
    close_tag(p, "call");
    return 0;
}

static int render_assistant(chat_prompt *p, const cJSON *msg, int idx, int thinking, char *err, size_t errlen) {
    open_message(p, "assistant", NULL, NULL);
    if (thinking) {
        const char *r = chat_reasoning(msg);      /* the encoder reads reasoning_content, else reasoning */
        T(OPEN "think" SEP);
        if (r) chat_untrusted_str(p, r);
        close_tag(p, "think");
    }
    T(OPEN "response" SEP);
    if (put_text(p, cJSON_GetObjectItemCaseSensitive(msg, "content"), idx, err, errlen)) return -1;
    close_tag(p, "response");
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls"), *c;
    if (cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0) {
        T(OPEN "tools" SEP);
        int k = 0;
        cJSON_ArrayForEach(c, calls) if (render_call(p, c, idx, k++, err, errlen)) return -1;
        close_tag(p, "tools");
    }
    end_message(p);
    return 0;
}

/* A tool result repeats its call's tool/index: found by tool_call_id in the latest assistant
 * message with tool calls, else by its position among the results that follow that message. */
static int render_tool_result(chat_prompt *p, const cJSON *messages, int i, char *err, size_t errlen) {
    const cJSON *msg = cJSON_GetArrayItem(messages, i), *calls = NULL;
    int first = i;
    while (first > 0) {
        const cJSON *prev = cJSON_GetArrayItem(messages, first - 1);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(prev, "role");
        first--;
        if (cJSON_IsString(role) && !strcmp(role->valuestring, "assistant")) {
            calls = cJSON_GetObjectItemCaseSensitive(prev, "tool_calls");
            break;
        }
    }
    if (!cJSON_IsArray(calls) || !cJSON_GetArraySize(calls))
        return errf(err, errlen, "messages[%d]: a tool result must follow an assistant message with tool_calls", i);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(msg, "tool_call_id");
    int k = -1, n = cJSON_GetArraySize(calls);
    for (int c = 0; cJSON_IsString(id) && c < n; c++) {
        const cJSON *cid = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, c), "id");
        if (cJSON_IsString(cid) && !strcmp(cid->valuestring, id->valuestring)) k = c;
    }
    if (k < 0 && !cJSON_IsString(id)) k = i - first - 1;
    if (k < 0 || k >= n)
        return errf(err, errlen, "messages[%d]: tool_call_id matches no tool call of the preceding assistant message", i);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(call_function(cJSON_GetArrayItem(calls, k)), "name");
    char index[16];
    snprintf(index, sizeof index, "%d", k + 1);
    T(OPEN "message");
    put_attr(p, "role", "tool", 0);
    put_attr(p, "tool", cJSON_IsString(name) ? name->valuestring : "", 1);
    put_attr(p, "index", index, 0);
    T(SEP);
    if (put_text(p, cJSON_GetObjectItemCaseSensitive(msg, "content"), i, err, errlen)) return -1;
    end_message(p);
    return 0;
}

static int render_message(chat_prompt *p, const cJSON *messages, int i, int thinking, char *err, size_t errlen) {
    const cJSON *msg = cJSON_GetArrayItem(messages, i);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
    if (!cJSON_IsObject(msg) || !cJSON_IsString(role)) return errf(err, errlen, "messages[%d].role must be a string", i);
    const char *r = role->valuestring;
    if (!strcmp(r, "assistant")) return render_assistant(p, msg, i, thinking, err, errlen);
    if (!strcmp(r, "tool")) return render_tool_result(p, messages, i, err, errlen);
    if (strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "developer"))
        return errf(err, errlen, "messages[%d].role '%s' is not one of system, developer, user, assistant, tool", i, r);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(msg, "name");
    int named = cJSON_IsString(name) && *name->valuestring;   /* the encoder: if message.get("name") */
    open_message(p, strcmp(r, "user") ? "system" : "user", "name", named ? name->valuestring : NULL);
    if (put_text(p, cJSON_GetObjectItemCaseSensitive(msg, "content"), i, err, errlen)) return -1;
    end_message(p);
    return 0;
}

static int k3_render(const cJSON *messages, const cJSON *tools, const chat_opts *o, chat_prompt *p, char *err,
                     size_t errlen) {
    int thinking = !o || o->thinking;
    const char *effort = o && o->effort ? o->effort : "max";
    if (!cJSON_IsArray(messages)) return errf(err, errlen, "messages must be an array");
    char list[64];
    if (!chat_effort_accepted(&kimi_k3_chat, effort, list, sizeof list))
        return errf(err, errlen, "reasoning effort '%s' is not supported by Kimi K3 (%s)", effort, list);
    render_options(p, tools, thinking, effort);
    int n = cJSON_GetArraySize(messages);
    for (int i = 0; i < n; i++)
        if (render_message(p, messages, i, thinking, err, errlen)) return -1;
    render_tool_choice(p, o ? o->tool_choice : NULL);
    render_response_format(p, o ? o->response_format : NULL);
    open_message(p, "assistant", NULL, NULL);
    T(thinking ? OPEN "think" SEP : OPEN "response" SEP);
    return 0;
}

#undef T

/* ---- parsing a reply -------------------------------------------------------------------- */

/* Does [s, end) start with lit? (The reply text is not NUL-terminated: never read past end.) */
static int starts(const char *s, const char *end, const char *lit) {
    size_t n = strlen(lit);
    return (size_t)(end - s) >= n && !memcmp(s, lit, n);
}

static const char *find_last(const char *s, const char *end, const char *needle) {
    const char *last = NULL;
    for (const char *p = s; (p = chat_find(p, end, needle)); p++) last = p;
    return last;
}

static char *span(const char *s, const char *e) {
    char *out = xmalloc((size_t)(e - s) + 1);
    memcpy(out, s, (size_t)(e - s));
    out[e - s] = 0;
    return out;
}

/* The value of attribute key="..." inside a tag header [s, e), entities decoded. */
static char *attr_value(const char *s, const char *e, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, " %s=\"", key);
    const char *v = chat_find(s, e, pat);
    if (!v) return xstrdup("");
    v += strlen(pat);
    const char *q = chat_find(v, e, "\"");
    sbuf b = {0};
    static const char *ent[][2] = {{"&amp;", "&"}, {"&quot;", "\""}, {"&lt;", "<"}, {"&gt;", ">"}};
    const char *stop = q ? q : e;
    for (const char *p = v; p < stop;) {
        size_t i;
        for (i = 0; i < 4 && !starts(p, stop, ent[i][0]); i++) {}
        if (i < 4) { sbuf_puts(&b, ent[i][1]); p += strlen(ent[i][0]); }
        else sbuf_put(&b, p++, 1);
    }
    char *out = sbuf_take(&b);
    return out ? out : xstrdup("");
}

/* One <|open|>call ...<|sep|> ... <|close|>call<|sep|> block [s, e) -> an OpenAI tool call.
 * cut: the reply ended inside it, and the argument it ended in is passed on as far as it was
 * written (chat_cut_arguments); k3_parse has already dropped a tag whose header was cut. */
static cJSON *parse_call(const char *s, const char *e, int cut, const char *text, size_t n, int k) {
    const char *body = chat_find(s, e, SEP);
    body = body ? body + strlen(SEP) : e;
    char *name = attr_value(s, body, "tool");
    cJSON *args = cJSON_CreateObject();
    char *raw = NULL, *open_key = NULL, *open_val = NULL;
    int open_string = 0;
    for (const char *p = body, *a; (a = chat_find(p, e, OPEN "argument")) || (a = chat_find(p, e, OPEN "json"));) {
        int json = starts(a, e, OPEN "json");
        const char *v = chat_find(a, e, SEP), *ve;
        v = v ? v + strlen(SEP) : e;
        ve = chat_find(v, e, json ? CLOSE "json" SEP : CLOSE "argument" SEP);
        int closed = ve != NULL;
        if (!ve) ve = e;
        if (json) {
            free(raw);
            raw = span(v, closed ? ve : v + chat_cut_marker(v, (size_t)(ve - v), CLOSE "json" SEP));
        }
        else {
            char *key = attr_value(a, v, "key"), *type = attr_value(a, v, "type"), *val = span(v, ve);
            if (cut && !closed) {
                val[chat_cut_marker(val, strlen(val), CLOSE "argument" SEP)] = 0;
                open_key = key, open_val = val, open_string = !strcmp(type, "string");
                free(type);
                break;
            }
            cJSON *j = strcmp(type, "string") ? cJSON_Parse(val) : NULL;
            cJSON_AddItemToObject(args, key, j ? j : cJSON_CreateString(val));
            free(key);
            free(type);
            free(val);
        }
        p = ve < e ? ve + 1 : e;
    }
    char *args_json = raw ? raw : cJSON_PrintUnformatted(args);
    if (cut && !raw) {
        char *whole = args_json;
        args_json = body == e ? xstrdup("")
                              : chat_cut_arguments(whole, ",", ":", open_key, 1, open_val,
                                                   open_val ? strlen(open_val) : 0, open_string);
        free(whole);
    }
    cJSON *call = chat_tool_call(name, args_json, text, n, k);
    free(open_key);
    free(open_val);
    free(name);
    free(args_json);
    cJSON_Delete(args);
    return call;
}

/* Reasoning and content are returned exactly as generated, so a non-streamed reply equals the
 * concatenation of the streamed deltas. A reply cut off mid-channel keeps what it has; a tag
 * still open at the end (<|open|>.. or <|close|>.. without its <|sep|>: more text may complete
 * it while streaming) is markup, never content. */
static void k3_parse(const char *text, size_t n, int thinking, chat_reply *out) {
    memset(out, 0, sizeof *out);
    const char *p = text, *end = text + n, *m;
    const char *lo = find_last(p, end, OPEN), *lc = find_last(p, end, CLOSE), *tag = lo > lc ? lo : lc;
    if (tag && !chat_find(tag, end, SEP)) end = tag;
    if ((m = chat_find(p, end, CLOSE "message" SEP))) end = m;
    if ((m = chat_find(p, end, EOM))) end = m;
    if (thinking) {
        const char *r = chat_find(p, end, CLOSE "think" SEP);
        out->reasoning = span(p, r ? r : end);
        if (!r) return;
        p = r + strlen(CLOSE "think" SEP);
    }
    if (starts(p, end, OPEN "response" SEP)) p += strlen(OPEN "response" SEP);
    const char *tools = chat_find(p, end, OPEN "tools" SEP), *ce = chat_find(p, tools ? tools : end, CLOSE "response" SEP);
    out->content = span(p, ce ? ce : tools ? tools : end);
    if (!tools) return;
    out->tool_calls = cJSON_CreateArray();
    const char *c = tools, *ce2;
    for (int k = 0; (c = chat_find(c, end, OPEN "call")); k++) {
        ce2 = chat_find(c, end, CLOSE "call" SEP);
        out->cut_call = !ce2;
        cJSON_AddItemToArray(out->tool_calls, parse_call(c, ce2 ? ce2 : end, !ce2, text, n, k));
        c = ce2 ? ce2 + strlen(CLOSE "call" SEP) : end;
    }
    if (!*out->content) { free(out->content); out->content = NULL; }
}

/* The stable head of a prompt: the global option messages and system messages before the first
 * user message. */
static size_t k3_system_prefix_bytes(const char *prompt, size_t n) {
    const char *user = chat_find(prompt, prompt + n, OPEN "message role=\"user\"" SEP);
    return user ? (size_t)(user - prompt) : 0;
}

/* The tools channel as render_call writes it: the response channel closed first, each value
 * tagged with its JSON type and a string written raw, the call indexes 1, 2, ... */
#define LIT(tok) "\"" tok "\""
static const tool_syntax k3_tools = {
    .block_open = LIT(CLOSE) " \"response\" " LIT(SEP) " " LIT(OPEN) " \"tools\" " LIT(SEP),
    .block_close = LIT(CLOSE) " \"tools\" " LIT(SEP) " " LIT(CLOSE) " \"message\" " LIT(SEP),
    .call_open = LIT(OPEN) " \"call tool=\\\"\"",
    .call_index = "\"\\\" index=\\\"%d\\\"\"",
    .call_mid = LIT(SEP),
    .call_close = LIT(CLOSE) " \"call\" " LIT(SEP),
    .arg_open = LIT(OPEN) " \"argument key=\\\"\"",
    .arg_mid = "\"\\\" type=\\\"\"",
    .arg_type = "\"\\\"\" " LIT(SEP),
    .arg_close = LIT(CLOSE) " \"argument\" " LIT(SEP),
    .name_spelling = NAME_ATTR,
    .key_spelling = NAME_ATTR,
    .max_calls = 4,            /* ~120 tokens a call on a small vocabulary */
    .text_close = LIT(CLOSE) " \"response\" " LIT(SEP) " " LIT(CLOSE) " \"message\" " LIT(SEP),
    .think_close = LIT(CLOSE) " \"think\" " LIT(SEP) " " LIT(OPEN) " \"response\" " LIT(SEP),
    .calls_start = CLOSE "response" SEP,
    .think_end = CLOSE "think" SEP,
};
#undef LIT

/* XTML: the response channel closes, the tools channel holds typed arguments (strings raw, numbers
 * compact JSON); the EOS (<|end_of_msg|>) is not part of the text. In thinking mode the prompt
 * leaves the think channel open; the reply closes it and opens the response one. */
static const tool_example k3_example = {
    .reply = "Let me check.<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
             "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|>"
             "<|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|>"
             "<|close|>tools<|sep|><|close|>message<|sep|>",
    .marker = "<|",
    .result = "<|open|>message role=\"tool\" tool=\"get_weather\" index=\"1\"<|sep|>%s<|close|>message<|sep|><|end_of_msg|>",
    .think_end = "<|close|>think<|sep|><|open|>response<|sep|>",
};

static const char *const k3_efforts[] = {"low", "high", "max", NULL};     /* _VALID_THINKING_EFFORTS */

const chat_template kimi_k3_chat = {
    .example = &k3_example,
    .tools = &k3_tools,
    .render = k3_render,
    .parse = k3_parse,
    .system_prefix_bytes = k3_system_prefix_bytes,
    .efforts = k3_efforts,
};
