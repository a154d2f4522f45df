/* replies.h — the exact token ids of the assistant replies this server generated, so that a
 * reply coming back in a conversation's history is fed to the engine as the ids the engine
 * produced, not as a re-tokenization of its text (`--reply-ids`, on by default).
 *
 * Re-tokenizing a reply often gives other ids than the ones generated (BPE is not canonical
 * for sampled text, a stop string may cut a token, clients trim whitespace); the engine's
 * record then diverges at the reply and the whole reply is prefilled again. With the ids
 * spliced back, turn N+1 is exactly "a cold engine fed the same ids" and reuses prompt + reply.
 *
 * An entry is (text, ids): `text` is the message's rendered text — what the family's template
 * writes for that assistant message in a later prompt (found by rendering it between two probe
 * messages, so a template that strips or re-renders the answer is followed as it is) — and
 * `ids` are the ids the engine generated for it (cut where a stop string cut the reply; the text
 * the client saw, U+FFFD for bytes that were not UTF-8, is what was rendered). When an assistant
 * message comes back in a history, its rendered text is looked up; where the rendered prompt
 * has it, the ids go in its place. A message the server did not generate, or that the client
 * edited, renders to text no entry has, and is tokenized canonically like any other text.
 * Thinking-mode replies are not kept: the templates drop a past answer's reasoning by design, so
 * the generated ids do not stand for what they render.
 *
 * INVARIANTS
 *  - Bounded: at most REPLIES_MAX entries and REPLIES_BYTES of text and ids; the least
 *    recently used entry goes first.
 *  - Persistent with a directory: every entry is appended to DIR/reply_ids as a record with
 *    its own checksum under a header naming the tokenizer, so a restart finds the same entries.
 *    A torn tail, a bad checksum or another tokenizer's file is ignored (with a log line) and
 *    never trusted; the file is rewritten from memory when it holds twice the bound.
 *  - Thread-safe: one mutex, never held while calling out.
 */
#ifndef CAIRN_REPLIES_H
#define CAIRN_REPLIES_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/sbuf.h"
#include "../core/tokenizer.h"
#include "../models/chat.h"

enum { REPLIES_MAX = 4096, REPLIES_BYTES = 64 << 20 };

typedef struct replies replies;

/* dir NULL: memory only. tok_hash names the tokenizer the ids belong to. NULL + err only when
 * out of memory; an unreadable or foreign file is logged and replaced. */
replies *replies_open(const char *dir, uint64_t tok_hash);
void replies_close(replies *r);
int replies_count(replies *r);

/* What the template writes for one assistant message (normalized OpenAI shape) inside a
 * conversation, from the end of the generation cue before it (so marker text the template puts
 * between its cue and the content, which a model writes itself, belongs to the reply) to the end
 * of the message's variable text: heap string, or NULL when it cannot be told apart from its
 * surroundings. after (or NULL) gets a heap copy of what the template writes next. */
char *replies_rendered(const chat_template *tpl, const cJSON *msg, const chat_opts *o, size_t *len, char **after);

/* Remember the ids generated for an assistant message whose rendered text is text[0..n). */
void replies_put(replies *r, const char *text, size_t n, const int *ids, int nids);

/* The ids of `prompt` (rendered from the normalized `messages` with tpl and o; `untrusted` its
 * client-written spans, chat.h), with the ids of every remembered assistant reply spliced in
 * where its rendered text sits and the text in between encoded as the engine would encode it
 * (untrusted spans as plain text, tokenizer.h tok_encode_untrusted). Returns how many replies were spliced (0: *out untouched, send
 * the text), or -1 + err when the tokenizer refuses the text. *out gets the ids as the decimal
 * `ids=1` payload; *prefix_payload the payload bytes that cover the first prefix_bytes of the
 * prompt when those tokenize to a prefix of the ids (the system-prompt hint), else 0. */
int replies_splice(replies *r, const tokenizer *tok, const chat_template *tpl, const chat_opts *o,
                   const cJSON *messages, const char *prompt, size_t n, const tok_span *untrusted, int nuntrusted,
                   size_t prefix_bytes, sbuf *out, size_t *prefix_payload, char *err, size_t errlen);

#endif
