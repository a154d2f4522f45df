/* chat.h — chat templates: OpenAI-shaped messages -> the prompt text a family was trained on,
 * and a generated reply -> reasoning / content / tool calls.
 *
 * Messages are the OpenAI JSON shape (cJSON array of {role, content, reasoning_content?, reasoning?,
 * tool_calls?, tool_call_id?, name?}); roles system, developer, user, assistant, tool. An assistant's
 * reasoning comes as reasoning_content (DeepSeek, vLLM before 0.10, GLM's template) or reasoning
 * (vLLM and OpenRouter now): a template whose official encoder reads both takes chat_reasoning; one
 * that reads reasoning_content only refuses a `reasoning` it would drop (chat_reasoning_content_only).
 *
 * INVARIANT (template stability, protocol issue): rendering the conversation
 * [..., user, assistant(reply)] + [user] produces text that starts with exactly the text the
 * previous turn's prompt + the assistant reply the model generated, as far as the family's
 * official template allows (DeepSeek V4 thinking mode drops historical reasoning by design).
 *
 * INVARIANT (no forged turns): a template renders into a chat_prompt, writing its own text with
 * chat_trusted and everything that came from the request — message content, reasoning, tool
 * results, tool and argument names, argument values, tool schemas, a forced tool name — with
 * chat_untrusted / chat_untrusted_json / chat_untrusted_since. The prompt is then encoded with
 * chat_prompt_encode (or, across the engine protocol, its untrusted spans travel with the text:
 * wire.h), so text a client wrote never becomes a role marker, end-of-sequence or tool-call
 * token, whatever it spells. Template text is trusted only when it is a literal of the template.
 * Untrusted bytes are cut by the tokenizer exactly like the text around them, so content that
 * spells no control token gets the ids a whole-prompt encode would give (reuse is unaffected).
 * Raw prompts (/v1/completions, `cairn run --raw`, SUBMIT without spans) keep matching control
 * tokens: whoever writes the raw template is trusted with it.
 */
#ifndef CAIRN_CHAT_H
#define CAIRN_CHAT_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "../core/sbuf.h"
#include "../core/tokenizer.h"

typedef struct {
    int thinking;                 /* 1 = thinking mode generation cue */
    const char *effort;           /* reasoning effort or NULL */
    const char *tool_choice;      /* "auto", "none", "required", or a function name to force; NULL = auto */
    const cJSON *response_format; /* the request's response_format (OpenAI chat), NULL when none; templates
                                   * that render it (Kimi K3) read type json_object / json_schema */
} chat_opts;

typedef struct {
    char *reasoning;              /* heap strings, NULL when absent */
    char *content;
    cJSON *tool_calls;            /* OpenAI tool_calls array or NULL */
    int cut_call;                 /* 1: the reply ended inside its last tool call (chat_cut_arguments) */
} chat_reply;

/* How a family writes tool calls, for grammars that force them (tool_grammar.c). Every field
 * but the last two is GBNF text — a sequence of literals, each special token spelled as its own
 * literal so the token mask lets the family's token through there (tokmask.h) — and NULL or ""
 * means nothing:
 *   forced reply    [THINK] CALLS
 *   auto reply      [THINK] text_open TEXT (text_close | text_calls CALLS)   (or CALLS alone when
 *                   text_open is set: the text is then a block that may be absent)
 *   auto + content  [THINK] (text_open CONTENT text_close | CALLS)
 *   THINK = think_open REASONING think_close        (no think_close: think_end as a literal)
 *   CALLS = block_open CALL [call_sep CALL ...] block_close
 *   CALL  = call_open NAME [call_index] call_mid [JSON-NAME call_name_json] ARGS call_close
 *   ARGS  = ARG [arg_sep ARG ...] or none; ARG = arg_open KEY arg_mid [TYPE arg_type] VALUE arg_close
 * NAME and KEY are spelled per name_spelling / key_spelling; JSON-NAME is the name again as a
 * JSON string (families whose call body repeats it). call_index is a printf format with one %d,
 * the call's 1-based index in the reply (each index then has its own head). A reply carries at
 * most max_calls parallel calls (0: TOOL_CALLS_MAX; a syntax whose calls are long sets fewer, so
 * a forced reply ends within the gateway's token cap). With arg_type set, TYPE is the value's JSON type name and a string
 * value is written raw (json_schema_tagged_rules); otherwise every value is JSON text, which
 * every family's parser reads back with its type. sorted_args: arguments in byte order of their
 * keys (the family's template sorts them) instead of the order `properties` declares.
 * calls_start is the plain text that begins the calls (free content before them never contains
 * it) and think_end the plain text that ends reasoning. */
enum { NAME_RAW, NAME_ATTR, NAME_JSON };       /* as is; XML attribute (&amp; &quot;); JSON string */
enum { TOOL_CALLS_MAX = 8 };
typedef struct {
    const char *block_open, *call_sep, *block_close;
    const char *call_open, *call_index, *call_mid, *call_name_json, *call_close;
    const char *arg_open, *arg_mid, *arg_type, *arg_close, *arg_sep;
    int name_spelling, key_spelling, sorted_args, max_calls;
    const char *text_open, *text_close, *text_calls;
    const char *think_open, *think_close;
    const char *calls_start, *think_end;
} tool_syntax;

/* The family's tool-call syntax written out for one call, get_weather(city="Paris", days=3) with
 * the tool get_weather(city: string, days: integer): what its model writes and how its template
 * shows the tool's answer. Clients and tests (through `cairn families`) take the syntax from here
 * instead of knowing the family; a scripted engine replaying `reply` must parse back to that call.
 *   reply        the model's text for the call (after any reasoning)
 *   marker       a piece of the call syntax that never survives into parsed content
 *   result       the next prompt's rendering of a tool answer, "%s" standing for the answer
 *   think_start  what the model writes to open reasoning when the prompt's cue does not (or NULL)
 *   think_end    what closes reasoning (NULL: "</think>"), as the template writes it up to the answer
 * The engine takes a reasoning budget's markers from think_start and think_end (serve/think_budget.h),
 * with tool_syntax.think_end as the text reasoning ends at. */
typedef struct {
    const char *reply, *marker, *result, *think_start, *think_end;
} tool_example;

/* A rendered prompt: its text and the byte spans of it that came from the request. A zeroed
 * chat_prompt is empty; spans are ascending, disjoint, non-empty and adjacent ones are merged. */
typedef struct {
    sbuf text;
    tok_span *untrusted;
    int nuntrusted, cap;
} chat_prompt;

void chat_trusted(chat_prompt *p, const char *template_text);
void chat_untrusted(chat_prompt *p, const char *s, size_t n);
void chat_untrusted_str(chat_prompt *p, const char *s);
void chat_untrusted_json(chat_prompt *p, const cJSON *v);   /* chat_json_py of request data */
/* Marks p->text[start..] untrusted: for request data a template wrote with sbuf calls. */
void chat_untrusted_since(chat_prompt *p, size_t start);
void chat_prompt_free(chat_prompt *p);
/* Into a zeroed *out: p from byte `from` on, its untrusted spans clipped and shifted with it. */
void chat_prompt_tail(const chat_prompt *p, size_t from, chat_prompt *out);
/* Ids of the prompt, untrusted spans encoded as plain text (tok_encode_untrusted). *ids is heap. */
int chat_prompt_encode(const tokenizer *t, const chat_prompt *p, int **ids, int *n, char *err, size_t errlen);

/* A family's template; its descriptor (model.h family_ops.chat) points at it. */
typedef struct {
    const tool_syntax *tools;     /* NULL: calls cannot be forced by a grammar */
    const tool_example *example;  /* NULL: the template renders no tool calls */
    /* Render into a zeroed *out (the text ends with the generation cue): 0, or -1 + err (out may
     * hold partial text; the caller frees it either way). */
    int (*render)(const cJSON *messages, const cJSON *tools, const chat_opts *o, chat_prompt *out, char *err,
                  size_t errlen);
    /* Split a finished reply into reasoning / content / tool calls. */
    void (*parse)(const char *text, size_t n, int thinking, chat_reply *out);
    /* Byte length of the system-prompt prefix of a rendered prompt (checkpoint hint), 0 if none. */
    size_t (*system_prefix_bytes)(const char *prompt, size_t n);
    /* 1: renders input_audio parts {"input_audio": {"dmel_frames": N}} as N audio placeholders,
     * whose frames the engine takes as media (model.h set_media). */
    int audio;
    /* The reasoning efforts the format accepts besides "none" (thinking off), NULL-terminated (an
     * empty list: thinking is only on or off); NULL: any the APIs name (the template maps them or
     * adds nothing). The gateway refuses another one naming its field. */
    const char *const *efforts;
} chat_template;

/* 1 when t's format accepts effort (NULL: no effort asked); else 0 and list = the accepted ones,
 * "none" (thinking off) first. */
int chat_effort_accepted(const chat_template *t, const char *effort, char *list, size_t n);

/* GBNF (a whole grammar, rule root) for a reply in template t's syntax that calls tools: choice
 * "required" (any of tools), a function name (that one), or "auto": then either content — the
 * rule named `content`, which the caller appends, or free text (content NULL) — followed by
 * optional calls, or calls alone. parallel 0 allows exactly one call (at most one for "auto").
 * thinking: the reply starts with reasoning closed by t->tools->think_end. Each call's arguments
 * follow its function's `parameters` schema (json_schema.h). -1 + err (naming the tool and the
 * keyword) when a schema cannot be compiled. Rule names used: root, reasoning*, text*, call*,
 * tool<N>*. */
int chat_tool_grammar(const chat_template *t, const cJSON *tools, const char *choice, int parallel, int thinking,
                      const char *content, sbuf *out, char *err, size_t errlen);
/* Rules for a reply that reasons before answering in syntax sx: appends the rules it needs to
 * g (names reasoning*) and to root the GBNF that writes the reasoning and its end; the answer
 * follows (for content, after sx->text_open). -1 when sx's texts are not valid UTF-8. */
int chat_think_rules(const tool_syntax *sx, sbuf *g, sbuf *root);

/* JSON exactly as Python's json.dumps(ensure_ascii=False) writes it (", " and ": " separators,
 * non-ASCII kept): the official templates embed tool schemas and arguments that way, and a byte
 * of difference would change the prompt. */
void chat_json_py(sbuf *b, const cJSON *v);
void chat_json_py_string(sbuf *b, const char *s);
/* json.dumps(v, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys): compact JSON. */
void chat_json_compact(sbuf *b, const cJSON *v, int sort_keys);
void chat_reply_free(chat_reply *r);

/* The reasoning of assistant message msg as encoders that read both fields take it:
 * reasoning_content when it is a string, else reasoning; NULL when neither is. */
const char *chat_reasoning(const cJSON *msg);
/* For a template that renders reasoning_content only: -1 + err naming messages[idx].reasoning when
 * msg carries a `reasoning` the template would drop (absent, or not equal to reasoning_content). */
int chat_reasoning_content_only(const cJSON *msg, int idx, char *err, size_t errlen);

/* The one walker over a message's content, for every template: absent or null is empty; a string
 * is one text (from_part 0); in an array each {"type": "text", "text": S} part gives S
 * (from_part 1) and every other part goes to the template's rule `other`, which renders it, skips
 * it (0) or refuses it (-1 with err). Content of any other JSON type is refused, naming
 * messages[idx]. */
typedef struct {
    void (*text)(void *ctx, const char *s, int from_part);
    int (*other)(void *ctx, const cJSON *part, int idx, char *err, size_t errlen);
    void *ctx;
} chat_content_rule;
int chat_content_walk(const cJSON *content, int idx, const chat_content_rule *rule, char *err, size_t errlen);
/* An OpenAI tool call {id, type: "function", function: {name, arguments}} parsed from reply
 * `text`[0..n) as its k-th call; the id ("call_" + 24 hex) is a hash of the text and k, so
 * parsing the same reply again gives the same ids. */
cJSON *chat_tool_call(const char *name, const char *arguments_json, const char *text, size_t n, int k);
/* The arguments of a tool call the end of the reply cut off, as far as the model wrote them and
 * left open, never completed: a prefix of the JSON the whole call would have had (what OpenAI
 * sends for a call cut by max_tokens). `done` is the JSON object of the arguments finished before
 * the cut, in the family's own spacing (item_sep / key_sep between them); `key` the argument
 * being written (NULL: the cut fell between arguments), key_done once its name was closed;
 * `value` its value text so far (NULL: not begun), value_string when the family's syntax marks
 * it a string (written as an open JSON string), else JSON text that is kept as written — unless
 * it cannot begin a JSON value, then it too is taken as a string. Heap string. */
/* n once a trailing, cut-off start of `marker` (a proper prefix of it) is removed from s[0..n):
 * a reply that ends inside a marker written as several tokens. */
size_t chat_cut_marker(const char *s, size_t n, const char *marker);
/* The first needle in [s, end), or NULL (memmem: one call, not a compare per byte). */
const char *chat_find(const char *s, const char *end, const char *needle);
char *chat_cut_arguments(const char *done, const char *item_sep, const char *key_sep, const char *key, int key_done,
                         const char *value, size_t value_n, int value_string);

#endif
