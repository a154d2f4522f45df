/* cmd_families.c — `cairn families`: the registry as JSON on stdout, one object per family in
 * registration order. Tests and tools take family facts from here (never from names), so a new
 * family gets every family-parametrized test by registering. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static cJSON *string_list(const char *const *list, int max) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; list && (max < 0 || i < max) && list[i]; i++) cJSON_AddItemToArray(a, cJSON_CreateString(list[i]));
    return a;
}

static cJSON *describe(const family_ops *f) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", f->name);
    cJSON_AddItemToObject(o, "aliases", string_list(f->aliases, -1));
    cJSON_AddItemToObject(o, "model_types", string_list(f->model_types, -1));
    cJSON_AddBoolToObject(o, "chat_template", f->chat != NULL);
    cJSON *t = cJSON_AddObjectToObject(o, "turns");
    cJSON_AddItemToObject(t, "start", string_list(f->turns.start, FAMILY_MAX_TOKENS));
    if (f->turns.user) cJSON_AddStringToObject(t, "user", f->turns.user);
    else cJSON_AddNullToObject(t, "user");
    if (f->turns.assistant) cJSON_AddStringToObject(t, "assistant", f->turns.assistant);
    else cJSON_AddNullToObject(t, "assistant");
    cJSON_AddItemToObject(t, "boundaries", string_list(f->turns.boundaries, FAMILY_MAX_TOKENS));
    cJSON_AddBoolToObject(o, "truncates", f->truncates);
    if (f->chat && f->chat->efforts) cJSON_AddItemToObject(o, "efforts", string_list(f->chat->efforts, -1));
    else cJSON_AddNullToObject(o, "efforts");
    const tool_syntax *sx = f->chat ? f->chat->tools : NULL;
    if (sx && sx->think_end) cJSON_AddStringToObject(o, "reasoning_end", sx->think_end);
    else cJSON_AddNullToObject(o, "reasoning_end");
    const tool_example *x = f->chat ? f->chat->example : NULL;
    if (!x) {
        cJSON_AddNullToObject(o, "tool_example");
        return o;
    }
    cJSON *e = cJSON_AddObjectToObject(o, "tool_example");
    const struct { const char *key, *value; } fields[] = {{"reply", x->reply}, {"marker", x->marker},
        {"result", x->result}, {"think_start", x->think_start}, {"think_end", x->think_end}};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        if (fields[i].value) cJSON_AddStringToObject(e, fields[i].key, fields[i].value);
        else cJSON_AddNullToObject(e, fields[i].key);
    }
    return o;
}

int cmd_families(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: cairn families\nPrints every registered model family as a JSON array: name, aliases, "
               "model_types,\nchat_template, turns {start, user, assistant, boundaries}, truncates, efforts (the reasoning\n"
               "efforts its chat format takes besides none; null: any), reasoning_end (the text its parser ends\n"
               "reasoning at, chat.h tool_syntax.think_end, or null), tool_example\n"
               "{reply, marker, result, think_start, think_end} (chat.h tool_example) or null.\n");
        return 0;
    }
    if (argc > 1) { fprintf(stderr, "cairn families: takes no arguments (got '%s')\n", argv[1]); return 2; }
    cJSON *all = cJSON_CreateArray();
    for (int i = 0; i < family_count(); i++) cJSON_AddItemToArray(all, describe(family_at(i)));
    char *text = cJSON_Print(all);
    puts(text);
    free(text);
    cJSON_Delete(all);
    return 0;
}
