/* chat.c — the registry of chat templates, keyed by config.json model_type.
 *
 * Each family's template lives in its own file (chat_deepseek_v4.c, chat_glm.c). They are
 * referenced weakly so the binary still links while a family's template is being written; a
 * missing one simply is not found, and the caller reports the model as having no template. */
#include "chat.h"

#include <stdlib.h>
#include <string.h>

extern const chat_template deepseek_v4_chat __attribute__((weak));
extern const chat_template glm_chat __attribute__((weak));

/* GLM-5 checkpoints declare model_type glm_moe_dsa; the template is the same for every GLM. */
static const struct {
    const char *model_type;
    const chat_template *tpl;
} chat_registry[] = {
    {"deepseek_v4", &deepseek_v4_chat},
    {"glm_moe_dsa", &glm_chat},
    {"glm", &glm_chat},
};

const chat_template *chat_find(const char *model_type) {
    if (!model_type) return NULL;
    for (size_t i = 0; i < sizeof chat_registry / sizeof chat_registry[0]; i++)
        if (chat_registry[i].tpl && !strcmp(chat_registry[i].model_type, model_type)) return chat_registry[i].tpl;
    return NULL;
}

void chat_reply_free(chat_reply *r) {
    if (!r) return;
    free(r->reasoning);
    free(r->content);
    cJSON_Delete(r->tool_calls);
    memset(r, 0, sizeof *r);
}
