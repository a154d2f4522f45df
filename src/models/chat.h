/* chat.h — chat templates: OpenAI-shaped messages -> the prompt text a family was trained on,
 * and a generated reply -> reasoning / content / tool calls.
 *
 * Messages are the OpenAI JSON shape (cJSON array of {role, content, reasoning_content?,
 * tool_calls?, tool_call_id?, name?}); roles system, developer, user, assistant, tool.
 *
 * INVARIANT (template stability, protocol issue): rendering the conversation
 * [..., user, assistant(reply)] + [user] produces text that starts with exactly the text the
 * previous turn's prompt + the assistant reply the model generated, as far as the family's
 * official template allows (DeepSeek V4 thinking mode drops historical reasoning by design).
 */
#ifndef CAIRN_CHAT_H
#define CAIRN_CHAT_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "../core/sbuf.h"

typedef struct {
    int thinking;                 /* 1 = thinking mode generation cue */
    const char *effort;           /* reasoning effort or NULL */
    const char *tool_choice;      /* "auto", "none", "required", or a function name to force; NULL = auto */
} chat_opts;

typedef struct {
    char *reasoning;              /* heap strings, NULL when absent */
    char *content;
    cJSON *tool_calls;            /* OpenAI tool_calls array or NULL */
} chat_reply;

typedef struct {
    const char *model_type;
    /* Heap string of the rendered prompt (ends with the generation cue), or NULL + err. */
    char *(*render)(const cJSON *messages, const cJSON *tools, const chat_opts *o, char *err, size_t errlen);
    /* Split a finished reply into reasoning / content / tool calls. */
    void (*parse)(const char *text, size_t n, int thinking, chat_reply *out);
    /* Byte length of the system-prompt prefix of a rendered prompt (checkpoint hint), 0 if none. */
    size_t (*system_prefix_bytes)(const char *prompt, size_t n);
} chat_template;

const chat_template *chat_find(const char *model_type);

/* JSON exactly as Python's json.dumps(ensure_ascii=False) writes it (", " and ": " separators,
 * non-ASCII kept): the official templates embed tool schemas and arguments that way, and a byte
 * of difference would change the prompt. */
void chat_json_py(sbuf *b, const cJSON *v);
void chat_json_py_string(sbuf *b, const char *s);
/* json.dumps(v, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys): compact JSON. */
void chat_json_compact(sbuf *b, const cJSON *v, int sort_keys);
void chat_reply_free(chat_reply *r);
/* An OpenAI tool call {id, type: "function", function: {name, arguments}} parsed from reply
 * `text`[0..n) as its k-th call; the id ("call_" + 24 hex) is a hash of the text and k, so
 * parsing the same reply again gives the same ids. */
cJSON *chat_tool_call(const char *name, const char *arguments_json, const char *text, size_t n, int k);

#endif
