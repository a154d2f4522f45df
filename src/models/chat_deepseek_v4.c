/* chat_deepseek_v4.c — the DeepSeek V4 chat template and reply parser.
 *
 * Rendering follows the rules of the official encoder (encoding_dsv4.py), applied to OpenAI
 * messages (protocol.md §2.7):
 *   BOS [effort paragraph] then per turn:
 *     system     TEXT [\n\n## Tools section]                (raw, no marker)
 *     developer  <｜User｜>TEXT [\n\n## Tools section]
 *     user       <｜User｜>BLOCK\n\nBLOCK...   consecutive user and tool messages merge into one
 *                turn; a tool message is the block <tool_result>TEXT</tool_result>, and the tool
 *                results of a turn are ordered as the preceding assistant issued the calls
 *     assistant  [REASONING</think>]CONTENT[\n\n<｜DSML｜tool_calls>...</｜DSML｜tool_calls>]EOS
 *   A user/developer turn followed by an assistant turn, or ending the prompt, is closed by
 *   <｜Assistant｜> plus <think> (thinking mode, for turns from the last user turn on) or </think>.
 * Thinking mode drops historical reasoning: an assistant turn before the last user turn renders
 * without its reasoning and its cue gets </think>, and developer turns before the last user turn
 * are dropped; both only when no tools are rendered (the encoder keeps everything then). The
 * "Reasoning Effort" paragraph exists in the encoder for effort max only (xhigh/max map to it);
 * low and high add nothing.
 *
 * Only the template's literals are written trusted; every string taken from the request (content,
 * reasoning, tool results, tool schemas, call names, argument names and values, a forced tool
 * name) is written untrusted (chat.h), so none of it can spell a marker token.
 *
 * Our choices where the encoder has no rule: request-level tools go to the first system or
 * developer message (else an empty system message is inserted first); tool_choice "none" renders
 * no tools section, "required" or a forced name appends one "You must call ..." sentence to it.
 * A conversation must end with a user, developer or tool message (the prompt then ends with the
 * generation cue); anything else is an error. Content given as parts concatenates the text parts
 * (tool results join them with blank lines, as the encoder does).
 *
 * Parsing a reply: reasoning up to </think> (thinking mode), content up to EOS or the DSML block,
 * then each complete <｜DSML｜invoke> becomes an OpenAI tool call (id "call_" + 24 random hex).
 * Arguments are rebuilt as the encoder does: string="true" values become JSON strings, others are
 * kept as the JSON text the model wrote (or quoted, if that text is not valid JSON). A DSML block
 * cut off mid-way is removed from the visible text, as are stray BOS/EOS/think markers. Empty
 * reasoning or content is reported as NULL.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "../core/sbuf.h"
#include "../core/util.h"
#include "chat.h"

#define BOS "<｜begin▁of▁sentence｜>"
#define EOS "<｜end▁of▁sentence｜>"
#define USER "<｜User｜>"
#define ASSISTANT "<｜Assistant｜>"
#define THINK "<think>"
#define THINK_END "</think>"
#define DSML "｜DSML｜"
#define CALLS_OPEN "<" DSML "tool_calls>"
#define CALLS_CLOSE "</" DSML "tool_calls>"
#define INVOKE_OPEN "<" DSML "invoke name=\""
#define INVOKE_CLOSE "</" DSML "invoke>"
#define PARAM_OPEN "<" DSML "parameter name=\""
#define PARAM_CLOSE "</" DSML "parameter>"

static const char effort_max_text[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

static const char tools_head[] =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    "\"" CALLS_OPEN "\" block like the following:\n\n" CALLS_OPEN "\n" INVOKE_OPEN "$TOOL_NAME\">\n" PARAM_OPEN
    "$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE" PARAM_CLOSE "\n...\n" INVOKE_CLOSE "\n" INVOKE_OPEN
    "$TOOL_NAME2\">\n...\n" INVOKE_CLOSE "\n" CALLS_CLOSE "\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by " THINK "), you MUST output your complete reasoning inside " THINK
    "..." THINK_END " BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after " THINK_END " with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";

static const char tools_tail[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

/* ---- conversation model: messages merged into turns ---------------------------------------- */

typedef struct {
    char *text;              /* the message's text (request data); a tool result is wrapped in
                              * <tool_result>...</tool_result> when rendered */
    const char *call_id;     /* tool results: the call they answer ("" if none) */
    int is_result;
} block;

typedef enum { TURN_SYSTEM, TURN_DEVELOPER, TURN_USER, TURN_ASSISTANT } turn_kind;

typedef struct {
    turn_kind kind;
    const cJSON *msg;        /* system, developer, assistant: the message */
    int idx;                 /* index in messages of the (first) message, for errors */
    block *blocks;           /* user: merged user texts and tool results */
    int n_blocks;
    int has_tools;           /* the tools section is rendered in this turn */
    int dropped;             /* thinking-mode history drop removed this turn */
} turn;

typedef struct {
    turn *t;
    int n;
} conversation;

static void conversation_free(conversation *c) {
    for (int i = 0; i < c->n; i++) {
        for (int j = 0; j < c->t[i].n_blocks; j++) free(c->t[i].blocks[j].text);
        free(c->t[i].blocks);
    }
    free(c->t);
}

static turn *add_turn(conversation *c, turn_kind kind, const cJSON *msg, int idx) {
    c->t = xrealloc(c->t, (size_t)(c->n + 1) * sizeof *c->t);
    turn *t = &c->t[c->n++];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->msg = msg;
    t->idx = idx;
    return t;
}

/* A message's content as text: a string, its text parts joined by `sep`, or "" for null/absent. */
static int content_text(const cJSON *msg, sbuf *out, const char *sep, int idx, char *err, size_t errlen) {
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (!content || cJSON_IsNull(content)) return 0;
    if (cJSON_IsString(content)) {
        sbuf_puts(out, content->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(content))
        return errf(err, errlen, "messages[%d].content must be a string, an array of parts or null", idx);
    const cJSON *part;
    int k = 0;
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return errf(err, errlen, "messages[%d].content[%d]: only text parts are supported", idx, k);
        if (k) sbuf_puts(out, sep);
        sbuf_puts(out, text->valuestring);
        k++;
    }
    return 0;
}

static int add_block(conversation *c, const cJSON *msg, int is_result, int idx, char *err, size_t errlen) {
    sbuf text = {0};
    /* the encoder joins the text parts of a tool result with blank lines */
    if (content_text(msg, &text, is_result ? "\n\n" : "", idx, err, errlen)) {
        free(text.p);
        return -1;
    }
    turn *t = c->n && c->t[c->n - 1].kind == TURN_USER ? &c->t[c->n - 1] : add_turn(c, TURN_USER, NULL, idx);
    t->blocks = xrealloc(t->blocks, (size_t)(t->n_blocks + 1) * sizeof *t->blocks);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(msg, "tool_call_id");
    t->blocks[t->n_blocks++] = (block){sbuf_take(&text), cJSON_IsString(id) ? id->valuestring : "", is_result};
    return 0;
}

static int build_turns(const cJSON *messages, conversation *c, char *err, size_t errlen) {
    static const struct {
        const char *role;
        turn_kind kind;
    } plain[] = {{"system", TURN_SYSTEM}, {"developer", TURN_DEVELOPER}, {"assistant", TURN_ASSISTANT}};
    int idx = 0;
    const cJSON *msg;
    cJSON_ArrayForEach(msg, messages) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsObject(msg) || !cJSON_IsString(role))
            return errf(err, errlen, "messages[%d].role must be a string", idx);
        const char *r = role->valuestring;
        int known = 0;
        for (size_t k = 0; k < sizeof plain / sizeof *plain; k++)
            if (!strcmp(r, plain[k].role)) {
                add_turn(c, plain[k].kind, msg, idx);
                known = 1;
            }
        if (!known && (!strcmp(r, "user") || !strcmp(r, "tool"))) {
            if (add_block(c, msg, !strcmp(r, "tool"), idx, err, errlen)) return -1;
            known = 1;
        }
        if (!known)
            return errf(err, errlen, "messages[%d].role '%s' is not one of system, developer, user, assistant, tool",
                        idx, r);
        idx++;
    }
    return 0;
}

/* Position of call id `id` in an assistant's tool_calls (0 when absent, like the encoder). */
static int call_order(const cJSON *calls, const char *id) {
    int k = 0;
    const cJSON *call;
    cJSON_ArrayForEach(call, calls) {
        const cJSON *cid = cJSON_GetObjectItemCaseSensitive(call, "id");
        if (cJSON_IsString(cid) && *id && !strcmp(cid->valuestring, id)) return k;
        k++;
    }
    return 0;
}

/* Tool results of a user turn follow the order in which the previous assistant made the calls:
 * a stable insertion sort over the result slots (other blocks keep their places), as the
 * encoder's sorted() does. */
static void sort_results(turn *t, const cJSON *calls) {
    int *slot = xmalloc((size_t)t->n_blocks * sizeof *slot), n = 0;
    for (int j = 0; j < t->n_blocks; j++)
        if (t->blocks[j].is_result) slot[n++] = j;
    for (int a = 1; a < n; a++) {
        block moving = t->blocks[slot[a]];
        int key = call_order(calls, moving.call_id), b = a;
        for (; b > 0 && call_order(calls, t->blocks[slot[b - 1]].call_id) > key; b--)
            t->blocks[slot[b]] = t->blocks[slot[b - 1]];
        t->blocks[slot[b]] = moving;
    }
    free(slot);
}

static void order_tool_results(conversation *c) {
    const cJSON *calls = NULL;
    for (int i = 0; i < c->n; i++) {
        turn *t = &c->t[i];
        if (t->kind == TURN_ASSISTANT) {
            const cJSON *tc = cJSON_GetObjectItemCaseSensitive(t->msg, "tool_calls");
            if (cJSON_IsArray(tc) && cJSON_GetArraySize(tc) > 0) calls = tc;
        }
        if (t->kind == TURN_USER && calls) sort_results(t, calls);
    }
}

static int last_user_turn(const conversation *c) {
    for (int i = c->n - 1; i >= 0; i--)
        if (!c->t[i].dropped && (c->t[i].kind == TURN_USER || c->t[i].kind == TURN_DEVELOPER)) return i;
    return -1;
}

/* ---- rendering ----------------------------------------------------------------------------- */

static int render_tools(chat_prompt *p, const cJSON *tools, const char *tool_choice, char *err, size_t errlen) {
    chat_trusted(p, tools_head);
    int k = 0;
    const cJSON *tool;
    cJSON_ArrayForEach(tool, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
        if (!cJSON_IsObject(fn)) return errf(err, errlen, "tools[%d].function must be an object", k);
        if (k) chat_trusted(p, "\n");
        chat_untrusted_json(p, fn);
        k++;
    }
    chat_trusted(p, tools_tail);
    if (tool_choice && !strcmp(tool_choice, "required"))
        chat_trusted(p, "\nYou must call at least one tool in this reply.\n");
    else if (tool_choice && strcmp(tool_choice, "auto")) {
        chat_trusted(p, "\nYou must call the tool \"");
        chat_untrusted_str(p, tool_choice);
        chat_trusted(p, "\" in this reply.\n");
    }
    return 0;
}

/* One tool call in DSML; arguments that are not a JSON object are passed whole as "arguments". */
static int render_call(chat_prompt *p, const cJSON *call, int idx, int k, char *err, size_t errlen) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    if (!cJSON_IsString(name))
        return errf(err, errlen, "messages[%d].tool_calls[%d].function.name must be a string", idx, k);
    cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : cJSON_Duplicate(args, 1);
    if (!cJSON_IsObject(parsed)) {
        cJSON_Delete(parsed);
        parsed = cJSON_CreateObject();
        if (cJSON_IsString(args)) cJSON_AddStringToObject(parsed, "arguments", args->valuestring);
    }
    chat_trusted(p, INVOKE_OPEN);
    chat_untrusted_str(p, name->valuestring);
    chat_trusted(p, "\">\n");
    for (const cJSON *a = parsed->child; a; a = a->next) {
        chat_trusted(p, PARAM_OPEN);
        chat_untrusted_str(p, a->string);
        chat_trusted(p, cJSON_IsString(a) ? "\" string=\"true\">" : "\" string=\"false\">");
        if (cJSON_IsString(a)) chat_untrusted_str(p, a->valuestring);
        else chat_untrusted_json(p, a);
        chat_trusted(p, PARAM_CLOSE);
        if (a->next) chat_trusted(p, "\n");
    }
    chat_trusted(p, "\n" INVOKE_CLOSE);
    cJSON_Delete(parsed);
    return 0;
}

/* A message's content as request data. */
static int untrusted_content(chat_prompt *p, const cJSON *msg, int idx, char *err, size_t errlen) {
    size_t at = p->text.len;
    int rc = content_text(msg, &p->text, "", idx, err, errlen);
    chat_untrusted_since(p, at);
    return rc;
}

static int render_assistant(chat_prompt *p, const cJSON *msg, int idx, int with_reasoning, char *err, size_t errlen) {
    if (with_reasoning) {
        const char *r = chat_reasoning(msg);
        if (r) chat_untrusted_str(p, r);
        chat_trusted(p, THINK_END);
    }
    if (untrusted_content(p, msg, idx, err, errlen)) return -1;
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    if (cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0) {
        chat_trusted(p, "\n\n" CALLS_OPEN "\n");
        int k = 0;
        const cJSON *call;
        cJSON_ArrayForEach(call, calls) {
            if (k) chat_trusted(p, "\n");
            if (render_call(p, call, idx, k, err, errlen)) return -1;
            k++;
        }
        chat_trusted(p, "\n" CALLS_CLOSE);
    }
    chat_trusted(p, EOS);
    return 0;
}

typedef enum { EFFORT_UNKNOWN = -1, EFFORT_PLAIN, EFFORT_MAX } effort_kind;

/* xhigh/max map to the encoder's "max" (the paragraph); the other known values add nothing. */
static effort_kind effort_of(const char *effort) {
    static const char *plain[] = {"none", "minimal", "low", "medium", "high"};
    if (!effort) return EFFORT_PLAIN;
    if (!strcmp(effort, "xhigh") || !strcmp(effort, "max")) return EFFORT_MAX;
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++)
        if (!strcmp(effort, plain[i])) return EFFORT_PLAIN;
    return EFFORT_UNKNOWN;
}

/* Attach request-level tools to the first system/developer turn, or insert an empty system turn. */
static void place_tools(conversation *c) {
    for (int i = 0; i < c->n; i++)
        if (c->t[i].kind == TURN_SYSTEM || c->t[i].kind == TURN_DEVELOPER) {
            c->t[i].has_tools = 1;
            return;
        }
    turn inserted = *add_turn(c, TURN_SYSTEM, NULL, 0);
    memmove(c->t + 1, c->t, (size_t)(c->n - 1) * sizeof *c->t);
    c->t[0] = inserted;
    c->t[0].has_tools = 1;
}

typedef struct {
    int thinking, drop, last_user;
    const cJSON *tools;
    const char *tool_choice;
} render_ctx;

static int render_turn(chat_prompt *p, const conversation *c, int i, const render_ctx *x, char *err, size_t errlen) {
    const turn *t = &c->t[i];
    int idx = t->idx;
    switch (t->kind) {
    case TURN_ASSISTANT:
        return render_assistant(p, t->msg, idx, x->thinking && (!x->drop || i > x->last_user), err, errlen);
    case TURN_USER:
        chat_trusted(p, USER);
        for (int j = 0; j < t->n_blocks; j++) {
            if (j) chat_trusted(p, "\n\n");
            if (t->blocks[j].is_result) chat_trusted(p, "<tool_result>");
            chat_untrusted_str(p, t->blocks[j].text);
            if (t->blocks[j].is_result) chat_trusted(p, "</tool_result>");
        }
        break;
    case TURN_DEVELOPER:
    case TURN_SYSTEM:
        if (t->kind == TURN_DEVELOPER) chat_trusted(p, USER);
        if (t->msg && untrusted_content(p, t->msg, idx, err, errlen)) return -1;
        if (t->has_tools) {
            chat_trusted(p, "\n\n");
            if (render_tools(p, x->tools, x->tool_choice, err, errlen)) return -1;
        }
        break;
    }
    return 0;
}

static int render_turns(chat_prompt *p, conversation *c, const render_ctx *x, effort_kind effort, char *err,
                        size_t errlen) {
    chat_trusted(p, BOS);
    int first = 1, last = -1;
    for (int i = 0; i < c->n; i++)
        if (!c->t[i].dropped) last = i;
    for (int i = 0; i < c->n; i++) {
        const turn *t = &c->t[i];
        if (t->dropped) continue;
        if (first && x->thinking && effort == EFFORT_MAX) chat_trusted(p, effort_max_text);
        first = 0;
        if (render_turn(p, c, i, x, err, errlen)) return -1;
        int next = i + 1;
        while (next < c->n && c->t[next].dropped) next++;
        int asks = t->kind == TURN_USER || t->kind == TURN_DEVELOPER;
        if (asks && (next >= c->n || c->t[next].kind == TURN_ASSISTANT)) {
            chat_trusted(p, ASSISTANT);
            chat_trusted(p, x->thinking && (!x->drop || i >= x->last_user) ? THINK : THINK_END);
        }
    }
    if (last < 0 || (c->t[last].kind != TURN_USER && c->t[last].kind != TURN_DEVELOPER))
        return errf(err, errlen, "the conversation must end with a user, developer or tool message");
    return 0;
}

static int dsv4_render(const cJSON *messages, const cJSON *tools, const chat_opts *o, chat_prompt *p, char *err,
                       size_t errlen) {
    static const chat_opts defaults = {0};
    if (!o) o = &defaults;
    if (!cJSON_IsArray(messages)) return errf(err, errlen, "messages must be an array");
    if (tools && !cJSON_IsArray(tools) && !cJSON_IsNull(tools)) return errf(err, errlen, "tools must be an array");
    effort_kind effort = effort_of(o->effort);
    if (effort == EFFORT_UNKNOWN)
        return errf(err, errlen, "reasoning effort '%s' is not one of none, minimal, low, medium, high, xhigh, max",
                    o->effort);
    conversation c = {0};
    int rc = -1;
    if (build_turns(messages, &c, err, errlen)) goto done;
    order_tool_results(&c);
    render_ctx x = {.thinking = o->thinking, .tools = tools, .tool_choice = o->tool_choice};
    int with_tools = cJSON_GetArraySize(tools) > 0 && !(o->tool_choice && !strcmp(o->tool_choice, "none"));
    if (with_tools) place_tools(&c);
    x.drop = o->thinking && !with_tools;
    if (x.drop) {
        int lu = last_user_turn(&c);
        for (int i = 0; i < lu; i++)
            if (c.t[i].kind == TURN_DEVELOPER) c.t[i].dropped = 1;
    }
    x.last_user = last_user_turn(&c);
    rc = render_turns(p, &c, &x, effort, err, errlen);
done:
    conversation_free(&c);
    return rc;
}

/* ---- parsing a reply ----------------------------------------------------------------------- */

/* Copy of [s, e) without BOS/EOS/think markers (the encoder never lets them into text). */
static char *clean_text(const char *s, const char *e) {
    static const char *markers[] = {BOS, EOS, THINK, THINK_END};    /* each starts with '<' */
    sbuf b = {0};
    while (s < e) {
        const char *lt = memchr(s, '<', (size_t)(e - s));
        sbuf_put(&b, s, (size_t)((lt ? lt : e) - s));
        if (!lt) break;
        s = lt;
        size_t skip = 0;
        for (size_t k = 0; k < sizeof markers / sizeof *markers && !skip; k++)
            if ((size_t)(e - s) >= strlen(markers[k]) && !memcmp(s, markers[k], strlen(markers[k])))
                skip = strlen(markers[k]);
        if (skip) s += skip;
        else sbuf_put(&b, s++, 1);
    }
    if (!b.len) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* Length of text once a trailing, cut-off start of the DSML block ("<｜DSML｜tool_c...") and the
 * "\n\n" before it are removed. */
static size_t cut_partial_block(const char *s, size_t n) {
    static const char open[] = "\n\n" CALLS_OPEN;
    for (size_t k = 1; k < sizeof open - 1 && k <= n; k++)
        if (!memcmp(s + n - k, open, k) && k >= 4) return n - k;
    return n;
}

static void random_call_id(char out[32]) {
    unsigned char r[12];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {    /* no entropy source: clock + counter */
        static uint64_t counter;
        double t = now_seconds();
        uint64_t h = fnv64(FNV64_INIT, &t, sizeof t);
        counter++;
        h = fnv64(h, &counter, sizeof counter);
        for (size_t i = 0; i < sizeof r; i++, h = fnv64(h, &i, sizeof i)) r[i] = (unsigned char)h;
    }
    memcpy(out, "call_", 5);
    for (size_t i = 0; i < sizeof r; i++) snprintf(out + 5 + 2 * i, 3, "%02x", r[i]);
}

/* Parameters of one invoke body as the encoder's argument JSON: {"k": v, ...}. cut: the reply
 * ended inside the invoke, and the parameter it ended in is passed on as far as it was written
 * (chat_cut_arguments), never completed. */
static char *invoke_arguments(const char *p, const char *end, int cut) {
    sbuf b = {0};
    sbuf_puts(&b, "{");
    int n = 0;
    const char *q, *open_val = NULL;
    char *open_key = NULL;
    int key_done = 0, open_string = 0;
    size_t open_n = 0;
    while ((q = chat_find(p, end, PARAM_OPEN))) {
        const char *name = q + strlen(PARAM_OPEN), *name_end = chat_find(name, end, "\"");
        const char *attr = name_end ? name_end + 1 : end, *val = name_end ? chat_find(attr, end, ">") : NULL;
        const char *val_end = val ? chat_find(val + 1, end, PARAM_CLOSE) : NULL;
        if (!val_end) {
            if (cut) {
                open_key = strndup(name, (size_t)((name_end ? name_end : end) - name));
                key_done = name_end != NULL;
                if (val) {
                    open_val = val + 1;
                    open_n = chat_cut_marker(open_val, (size_t)(end - open_val), PARAM_CLOSE);
                    open_string = chat_find(attr, val, "string=\"true\"") != NULL;
                }
            }
            break;
        }
        val++;
        int is_string = chat_find(attr, val, "string=\"true\"") != NULL;
        char *key = strndup(name, (size_t)(name_end - name)), *raw = strndup(val, (size_t)(val_end - val));
        cJSON *json = is_string ? NULL : cJSON_ParseWithOpts(raw, NULL, 1);
        if (n++) sbuf_puts(&b, ", ");
        chat_json_py_string(&b, key);
        sbuf_puts(&b, ": ");
        if (json) sbuf_puts(&b, raw);
        else chat_json_py_string(&b, raw);
        cJSON_Delete(json);
        free(key);
        free(raw);
        p = val_end + strlen(PARAM_CLOSE);
    }
    sbuf_puts(&b, "}");
    if (!cut) return b.p;
    char *args = chat_cut_arguments(b.p, ", ", ": ", open_key, key_done, open_val, open_n, open_string);
    free(open_key);
    sbuf_free(&b);
    return args;
}

/* Invokes between p and end as OpenAI tool calls; one the reply's end cut off (no closing
 * invoke and no block close after it) is the last, with its arguments as far as they go. */
static cJSON *parse_calls(const char *p, const char *end, int block_closed, chat_reply *out) {
    cJSON *calls = cJSON_CreateArray();
    const char *q;
    while ((q = chat_find(p, end, INVOKE_OPEN))) {
        const char *name = q + strlen(INVOKE_OPEN), *name_end = chat_find(name, end, "\">");
        const char *close = name_end ? chat_find(name_end, end, INVOKE_CLOSE) : NULL;
        if (!close && block_closed) break;
        const char *stop = close ? close : end;
        char *fname = strndup(name, (size_t)((name_end ? name_end : end) - name));
        char *args = name_end ? invoke_arguments(name_end + 2, stop, !close) : xstrdup("");
        if (!name_end) fname[chat_cut_marker(fname, strlen(fname), "\">")] = 0;
        char id[32];
        random_call_id(id);
        cJSON *call = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        cJSON_AddStringToObject(call, "id", id);
        cJSON_AddStringToObject(call, "type", "function");
        cJSON_AddStringToObject(fn, "name", fname);
        cJSON_AddStringToObject(fn, "arguments", args);
        cJSON_AddItemToObject(call, "function", fn);
        cJSON_AddItemToArray(calls, call);
        free(fname);
        free(args);
        out->cut_call = !close;
        if (!close) break;
        p = close + strlen(INVOKE_CLOSE);
    }
    if (cJSON_GetArraySize(calls) == 0) {
        cJSON_Delete(calls);
        return NULL;
    }
    return calls;
}

static void dsv4_parse(const char *text, size_t n, int thinking, chat_reply *out) {
    memset(out, 0, sizeof *out);
    const char *p = text, *end = text + n;
    const char *block = chat_find(text, end, CALLS_OPEN);
    if (thinking) {
        const char *close = chat_find(text, block ? block : end, THINK_END);
        const char *r_end = close ? close : block ? block : end;
        out->reasoning = clean_text(text, r_end);
        p = close ? close + strlen(THINK_END) : r_end;
    }
    const char *eos = chat_find(p, block ? block : end, EOS);
    const char *c_end = eos ? eos : block ? block : end;
    if (block && c_end == block && c_end - p >= 2 && !memcmp(c_end - 2, "\n\n", 2)) c_end -= 2;
    if (!block && !eos) c_end = p + cut_partial_block(p, (size_t)(end - p));
    out->content = clean_text(p, c_end);
    if (block) {
        const char *close = chat_find(block, end, CALLS_CLOSE);
        out->tool_calls = parse_calls(block + strlen(CALLS_OPEN), close ? close : end, close != NULL, out);
    }
}

/* Bytes before the first <｜User｜> or <｜Assistant｜>: BOS, effort paragraph, system text, tools. */
static size_t dsv4_system_prefix_bytes(const char *prompt, size_t n) {
    const char *end = prompt + n, *u = chat_find(prompt, end, USER), *a = chat_find(prompt, end, ASSISTANT);
    const char *first = !u ? a : !a ? u : u < a ? u : a;
    return first ? (size_t)(first - prompt) : 0;
}

/* DSML as render_call writes it; every value as JSON (string="false"), which the parser keeps. */
static const tool_syntax dsv4_tools = {
    .block_open = "\"\\n\\n\" \"<\" \"" DSML "\" \"tool_calls>\" \"\\n\"",
    .call_sep = "\"\\n\"",
    .block_close = "\"\\n\" \"</\" \"" DSML "\" \"tool_calls>\"",
    .call_open = "\"<\" \"" DSML "\" \"invoke name=\\\"\"",
    .call_mid = "\"\\\">\" \"\\n\"",
    .call_close = "\"\\n\" \"</\" \"" DSML "\" \"invoke>\"",
    .arg_open = "\"<\" \"" DSML "\" \"parameter name=\\\"\"",
    .arg_mid = "\"\\\" string=\\\"false\\\">\"",
    .arg_close = "\"</\" \"" DSML "\" \"parameter>\"",
    .arg_sep = "\"\\n\"",
    .calls_start = CALLS_OPEN,
    .think_end = THINK_END,
};

static const tool_example dsv4_example = {
    .reply = "Let me check.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
             "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
             "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
    .marker = "DSML",
    .result = "<tool_result>%s</tool_result>",
};

const chat_template deepseek_v4_chat = {
    .tools = &dsv4_tools,
    .example = &dsv4_example,
    .render = dsv4_render,
    .parse = dsv4_parse,
    .system_prefix_bytes = dsv4_system_prefix_bytes,
};
