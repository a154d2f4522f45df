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

/* How a family writes tool calls, for grammars that force them (tool_grammar.c). Every field is
 * GBNF text — a sequence of literals, each special token spelled as its own literal so the token
 * mask lets the family's token through there (tokmask.h) — or "" for nothing:
 *   block_open CALL [call_sep CALL ...] block_close       the calls of one reply
 *   CALL = call_open "NAME" call_mid ARGS call_close      ARGS = ARG [arg_sep ARG ...] or none
 *   ARG  = arg_open "KEY" arg_mid JSON-VALUE arg_close
 * calls_start is the plain text that begins the calls (free content before them never contains
 * it) and think_end the text that ends reasoning. Argument values are always written as JSON
 * text, which every family's parser reads back with its type. */
typedef struct {
    const char *block_open, *call_sep, *block_close;
    const char *call_open, *call_mid, *call_close;
    const char *arg_open, *arg_mid, *arg_close, *arg_sep;
    const char *calls_start, *think_end;
} tool_syntax;

typedef struct {
    const char *model_type;
    const tool_syntax *tools;     /* NULL: calls cannot be forced by a grammar */
    /* Heap string of the rendered prompt (ends with the generation cue), or NULL + err. */
    char *(*render)(const cJSON *messages, const cJSON *tools, const chat_opts *o, char *err, size_t errlen);
    /* Split a finished reply into reasoning / content / tool calls. */
    void (*parse)(const char *text, size_t n, int thinking, chat_reply *out);
    /* Byte length of the system-prompt prefix of a rendered prompt (checkpoint hint), 0 if none. */
    size_t (*system_prefix_bytes)(const char *prompt, size_t n);
} chat_template;

const chat_template *chat_find(const char *model_type);

/* GBNF for a reply in template t's syntax that calls tools: choice "required" (any of tools),
 * a function name (that one), or "auto" (free content, then optionally calls). parallel 0 allows
 * exactly one call (at most one for "auto"). thinking: the reply starts with reasoning closed
 * by t->tools->think_end. Each call's arguments follow its function's `parameters` schema
 * (json_schema.h). -1 + err (naming the tool and keyword) when a schema cannot be compiled. */
int chat_tool_grammar(const chat_template *t, const cJSON *tools, const char *choice, int parallel, int thinking,
                      sbuf *out, char *err, size_t errlen);

/* JSON exactly as Python's json.dumps(ensure_ascii=False) writes it (", " and ": " separators,
 * non-ASCII kept): the official templates embed tool schemas and arguments that way, and a byte
 * of difference would change the prompt. */
void chat_json_py(sbuf *b, const cJSON *v);
void chat_json_py_string(sbuf *b, const char *s);
void chat_reply_free(chat_reply *r);

#endif
