/* chat_test.h — what the chat-template tests share: rendering JSON messages (and tools) through
 * one template, and two small string checks. Static, like test.h: each test is one program. */
#ifndef CAIRN_CHAT_TEST_H
#define CAIRN_CHAT_TEST_H

#include <string.h>

#include "models/chat.h"

/* The prompt tpl renders for messages/tools (JSON text) under o: heap text, or NULL with err. */
static char *chat_render_json(const chat_template *tpl, const char *messages, const char *tools, chat_opts o,
                              char *err, size_t errlen) {
    cJSON *m = cJSON_Parse(messages), *t = tools ? cJSON_Parse(tools) : NULL;
    chat_prompt p = {0};
    char *out = tpl->render(m, t, &o, &p, err, errlen) ? NULL : sbuf_take(&p.text);
    chat_prompt_free(&p);
    cJSON_Delete(m);
    cJSON_Delete(t);
    return out;
}

static inline const char *show(const char *s) { return s ? s : "(null)"; }

static inline int starts_with(const char *s, const char *prefix) { return s && !strncmp(s, prefix, strlen(prefix)); }

#endif
