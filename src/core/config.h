/* config.h — typed reads from config.json (cJSON), with errors that name the missing key.
 *
 * Family loaders parse config.json into their own typed struct with these helpers. A missing
 * required key or a value of the wrong type is an error naming the key; unknown keys are ignored.
 * Nested keys are written with dots: "rope_scaling.factor".
 */
#ifndef CAIRN_CONFIG_H
#define CAIRN_CONFIG_H

#include <cjson/cJSON.h>
#include <stddef.h>

cJSON *config_load(const char *dir, char *err, size_t errlen);   /* parses DIR/config.json */

/* Required values: return 0, or -1 with err "config.json: missing key 'x'" / "... 'x' must be an integer". */
int config_int(const cJSON *c, const char *key, int *out, char *err, size_t errlen);
int config_double(const cJSON *c, const char *key, double *out, char *err, size_t errlen);
int config_bool(const cJSON *c, const char *key, int *out, char *err, size_t errlen);
int config_string(const cJSON *c, const char *key, const char **out, char *err, size_t errlen);
/* Tables of required values: each entry's key read into its field; the first missing or
 * mistyped key is the error. A family lists its config as data instead of a chain of calls. */
typedef struct {
    const char *key;
    int *out;
} config_int_field;
typedef struct {
    const char *key;
    double *out;
} config_double_field;
int config_ints(const cJSON *c, const config_int_field *f, size_t n, char *err, size_t errlen);
int config_doubles(const cJSON *c, const config_double_field *f, size_t n, char *err, size_t errlen);
/* Integer array: *n gets the length; out must hold max entries. */
int config_int_array(const cJSON *c, const char *key, int *out, int max, int *n, char *err, size_t errlen);

/* Optional values: return the default when the key is absent (a present key of the wrong type is still an error). */
int config_int_or(const cJSON *c, const char *key, int dflt, int *out, char *err, size_t errlen);
int config_double_or(const cJSON *c, const char *key, double dflt, double *out, char *err, size_t errlen);
int config_bool_or(const cJSON *c, const char *key, int dflt, int *out, char *err, size_t errlen);

const cJSON *config_get(const cJSON *c, const char *key);   /* dotted lookup, NULL if absent */

#endif
