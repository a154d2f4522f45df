/* config.c — typed, dotted-key reads from config.json.
 *
 * Every accessor resolves the key the same way (config_get), then checks the JSON type, so a
 * message always says which key was missing or which key had the wrong type.
 */
#include "config.h"

#include "util.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

cJSON *config_load(const char *dir, char *err, size_t errlen) {
    size_t n = strlen(dir) + sizeof "/config.json";
    char *path = xmalloc(n);
    snprintf(path, n, "%s/config.json", dir);
    size_t len;
    char *text = read_file(path, &len, err, errlen);
    cJSON *c = NULL;
    if (text) {
        c = cJSON_ParseWithLength(text, len);
        if (!c) errf(err, errlen, "%s: not valid JSON", path);
        else if (!cJSON_IsObject(c)) {
            errf(err, errlen, "%s: not a JSON object", path);
            cJSON_Delete(c);
            c = NULL;
        }
    }
    free(text);
    free(path);
    return c;
}

/* Walks "a.b.c" one object level per segment, matching names exactly (cJSON's default is case-blind). */
const cJSON *config_get(const cJSON *c, const char *key) {
    const cJSON *cur = c;
    const char *seg = key;
    while (cur) {
        const char *dot = strchr(seg, '.');
        size_t len = dot ? (size_t)(dot - seg) : strlen(seg);
        if (!cJSON_IsObject(cur)) return NULL;
        const cJSON *next = NULL;
        for (const cJSON *e = cur->child; e && !next; e = e->next)
            if (strlen(e->string) == len && memcmp(e->string, seg, len) == 0) next = e;
        cur = next;
        if (!dot) break;
        seg = dot + 1;
    }
    return cur;
}

static int missing(const char *key, char *err, size_t errlen) {
    return errf(err, errlen, "config.json: missing key '%s'", key);
}

static int wrong_type(const char *key, const char *what, char *err, size_t errlen) {
    return errf(err, errlen, "config.json: '%s' must be %s", key, what);
}

/* JSON numbers are doubles; an int must be integral and fit in int. */
static int as_int(const cJSON *v, int *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (d != floor(d) || d < INT_MIN || d > INT_MAX) return -1;
    *out = (int)d;
    return 0;
}

int config_int_or(const cJSON *c, const char *key, int dflt, int *out, char *err, size_t errlen) {
    const cJSON *v = config_get(c, key);
    if (!v || cJSON_IsNull(v)) { *out = dflt; return 0; }
    return as_int(v, out) ? wrong_type(key, "an integer", err, errlen) : 0;
}

int config_int(const cJSON *c, const char *key, int *out, char *err, size_t errlen) {
    const cJSON *v = config_get(c, key);
    if (!v || cJSON_IsNull(v)) return missing(key, err, errlen);
    return as_int(v, out) ? wrong_type(key, "an integer", err, errlen) : 0;
}

int config_double_or(const cJSON *c, const char *key, double dflt, double *out, char *err, size_t errlen) {
    const cJSON *v = config_get(c, key);
    if (!v || cJSON_IsNull(v)) { *out = dflt; return 0; }
    if (!cJSON_IsNumber(v)) return wrong_type(key, "a number", err, errlen);
    *out = v->valuedouble;
    return 0;
}

int config_double(const cJSON *c, const char *key, double *out, char *err, size_t errlen) {
    const cJSON *v = config_get(c, key);
    if (!v || cJSON_IsNull(v)) return missing(key, err, errlen);
    return config_double_or(c, key, 0, out, err, errlen);
}

int config_bool_or(const cJSON *c, const char *key, int dflt, int *out, char *err, size_t errlen) {
    const cJSON *v = config_get(c, key);
    if (!v || cJSON_IsNull(v)) { *out = dflt; return 0; }
    if (!cJSON_IsBool(v)) return wrong_type(key, "true or false", err, errlen);
    *out = cJSON_IsTrue(v);
    return 0;
}

int config_bool(const cJSON *c, const char *key, int *out, char *err, size_t errlen) {
    const cJSON *v = config_get(c, key);
    if (!v || cJSON_IsNull(v)) return missing(key, err, errlen);
    return config_bool_or(c, key, 0, out, err, errlen);
}

int config_string(const cJSON *c, const char *key, const char **out, char *err, size_t errlen) {
    const cJSON *v = config_get(c, key);
    if (!v || cJSON_IsNull(v)) return missing(key, err, errlen);
    if (!cJSON_IsString(v)) return wrong_type(key, "a string", err, errlen);
    *out = v->valuestring;
    return 0;
}

int config_int_array(const cJSON *c, const char *key, int *out, int max, int *n, char *err, size_t errlen) {
    const cJSON *v = config_get(c, key);
    if (!v || cJSON_IsNull(v)) return missing(key, err, errlen);
    if (!cJSON_IsArray(v)) return wrong_type(key, "an array of integers", err, errlen);
    int count = cJSON_GetArraySize(v);
    if (count > max) return errf(err, errlen, "config.json: '%s' has %d entries, at most %d allowed", key, count, max);
    int i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++)
        if (as_int(e, &out[i])) return errf(err, errlen, "config.json: '%s'[%d] must be an integer", key, i);
    *n = count;
    return 0;
}

int config_ints(const cJSON *c, const config_int_field *f, size_t n, char *err, size_t errlen) {
    for (size_t i = 0; i < n; i++)
        if (config_int(c, f[i].key, f[i].out, err, errlen)) return -1;
    return 0;
}

int config_doubles(const cJSON *c, const config_double_field *f, size_t n, char *err, size_t errlen) {
    for (size_t i = 0; i < n; i++)
        if (config_double(c, f[i].key, f[i].out, err, errlen)) return -1;
    return 0;
}
