/* families.c — the one registry: every family is one line here (its descriptor, model.h).
 * Lookups by name/alias and by config.json model_type read the same table, so they cannot
 * disagree; removing a line removes the family from the engine, the gateway, the CLI, the
 * benches and (through `cairn families`) the tests. */
#include <stdio.h>
#include <string.h>

#include "../core/config.h"
#include "../core/util.h"
#include "model.h"

extern const family_ops deepseek_v4_ops;
extern const family_ops glm_ops;
extern const family_ops kimi_k3_ops;

static const family_ops *const registry[] = {
    &deepseek_v4_ops,
    &glm_ops,
    &kimi_k3_ops,
};

int family_count(void) { return (int)(sizeof registry / sizeof *registry); }

const family_ops *family_at(int i) { return i >= 0 && i < family_count() ? registry[i] : NULL; }

static int listed(const char *const *list, const char *s) {
    for (; list && *list; list++)
        if (!strcmp(*list, s)) return 1;
    return 0;
}

const family_ops *family_find(const char *name) {
    for (int i = 0; name && i < family_count(); i++)
        if (!strcmp(registry[i]->name, name) || listed(registry[i]->aliases, name)) return registry[i];
    return NULL;
}

const family_ops *family_for_model_type(const char *model_type) {
    for (int i = 0; model_type && i < family_count(); i++)
        if (listed(registry[i]->model_types, model_type)) return registry[i];
    return NULL;
}

const family_ops *family_of_dir(const char *dir, char *err, size_t errlen) {
    cJSON *c = config_load(dir, err, errlen);
    if (!c) return NULL;
    const char *type;
    const family_ops *f = NULL;
    if (!config_string(c, "model_type", &type, err, errlen) && !(f = family_for_model_type(type)))
        errf(err, errlen, "config.json: unsupported model_type '%s'", type);
    cJSON_Delete(c);
    return f;
}
