/* test_config.c — typed config reads: values, dotted keys, defaults, and errors naming the key. */
#include "core/config.h"
#include "core/util.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *config_text =
    "{\"hidden_size\": 4096, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false,"
    " \"model_type\": \"deepseek_v4\", \"compress_ratios\": [0, 4, 128, 4],"
    " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 16, \"beta\": {\"fast\": 32}},"
    " \"Hidden_Size\": 1, \"ratio\": 2.5, \"huge\": 1e12, \"name_list\": \"x\","
    " \"mixed\": [1, \"2\"], \"nothing\": null}";

static cJSON *parse_dir_config(const char *root, const char *name, const char *text, char *err, size_t errlen) {
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    mkdir(dir, 0700);
    if (text) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        FILE *f = fopen(path, "w");
        if (!f) { perror(path); exit(2); }
        fputs(text, f);
        fclose(f);
    }
    return config_load(dir, err, errlen);
}

static void test_load(const char *root) {
    char err[256] = "";
    cJSON *c = parse_dir_config(root, "absent", NULL, err, sizeof err);
    CHECK(c == NULL && strstr(err, "cannot open") && strstr(err, "config.json"), "absent: %s", err);
    c = parse_dir_config(root, "bad", "{\"a\": ", err, sizeof err);
    CHECK(c == NULL && strstr(err, "not valid JSON"), "bad json: %s", err);
    c = parse_dir_config(root, "array", "[1]", err, sizeof err);
    CHECK(c == NULL && strstr(err, "not a JSON object"), "array: %s", err);
}

static void test_reads(const cJSON *c) {
    char err[256] = "";
    int i = 0, b = 1, n = 0, arr[8];
    double d = 0;
    const char *s = NULL;
    CHECK(config_int(c, "hidden_size", &i, err, sizeof err) == 0 && i == 4096, "int %d %s", i, err);
    CHECK(config_double(c, "rms_norm_eps", &d, err, sizeof err) == 0 && d == 1e-6, "double %g", d);
    CHECK(config_double(c, "hidden_size", &d, err, sizeof err) == 0 && d == 4096, "int as double %g", d);
    CHECK(config_bool(c, "tie_word_embeddings", &b, err, sizeof err) == 0 && b == 0, "bool %d", b);
    CHECK(config_string(c, "model_type", &s, err, sizeof err) == 0 && strcmp(s, "deepseek_v4") == 0, "string");
    CHECK(config_int_array(c, "compress_ratios", arr, 8, &n, err, sizeof err) == 0 && n == 4 && arr[0] == 0 &&
          arr[2] == 128, "array n=%d", n);
    CHECK(config_string(c, "rope_scaling.type", &s, err, sizeof err) == 0 && strcmp(s, "yarn") == 0, "dotted");
    CHECK(config_int(c, "rope_scaling.beta.fast", &i, err, sizeof err) == 0 && i == 32, "two dots %d", i);
    CHECK(config_get(c, "rope_scaling.factor") != NULL, "get dotted");
    CHECK(config_get(c, "rope_scaling.type.x") == NULL, "dot through a string");
    CHECK(config_get(c, "hidden_size.x") == NULL, "dot through a number");
}

static void test_defaults(const cJSON *c) {
    char err[256] = "";
    int i = 0, b = 0;
    double d = 0;
    CHECK(config_int_or(c, "num_nextn_predict_layers", 1, &i, err, sizeof err) == 0 && i == 1, "int default");
    CHECK(config_int_or(c, "hidden_size", 1, &i, err, sizeof err) == 0 && i == 4096, "int present");
    CHECK(config_double_or(c, "rope_scaling.mscale", 0.5, &d, err, sizeof err) == 0 && d == 0.5, "double dflt");
    CHECK(config_bool_or(c, "nothing", 1, &b, err, sizeof err) == 0 && b == 1, "null counts as absent");
    CHECK(config_int_or(c, "model_type", 1, &i, err, sizeof err) < 0 && strstr(err, "'model_type' must be an integer"),
          "present key of wrong type is still an error: %s", err);
}

static void expect_err(int rc, const char *err, const char *sub, const char *what) {
    CHECK(rc < 0, "%s accepted", what);
    CHECK(strstr(err, sub) != NULL, "%s: '%s' lacks '%s'", what, err, sub);
}

static void test_errors(const cJSON *c) {
    char err[256] = "";
    int i, n, arr[2];
    double d;
    const char *s;
    expect_err(config_int(c, "vocab_size", &i, err, sizeof err), err, "config.json: missing key 'vocab_size'", "miss");
    expect_err(config_int(c, "rope_scaling.original", &i, err, sizeof err), err,
               "missing key 'rope_scaling.original'", "missing dotted");
    expect_err(config_int(c, "hidden_size ", &i, err, sizeof err), err, "missing key", "trailing space");
    expect_err(config_int(c, "nothing", &i, err, sizeof err), err, "missing key 'nothing'", "null required");
    expect_err(config_int(c, "ratio", &i, err, sizeof err), err, "'ratio' must be an integer", "fraction");
    expect_err(config_int(c, "huge", &i, err, sizeof err), err, "'huge' must be an integer", "out of int range");
    expect_err(config_int(c, "model_type", &i, err, sizeof err), err, "'model_type' must be an integer", "str");
    expect_err(config_double(c, "model_type", &d, err, sizeof err), err, "'model_type' must be a number", "dbl");
    expect_err(config_bool(c, "hidden_size", &i, err, sizeof err), err, "'hidden_size' must be true or false", "b");
    expect_err(config_string(c, "hidden_size", &s, err, sizeof err), err, "'hidden_size' must be a string", "s");
    expect_err(config_int_array(c, "name_list", arr, 2, &n, err, sizeof err), err, "must be an array", "arr type");
    expect_err(config_int_array(c, "compress_ratios", arr, 2, &n, err, sizeof err), err,
               "'compress_ratios' has 4 entries, at most 2", "arr too long");
    expect_err(config_int_array(c, "mixed", arr, 2, &n, err, sizeof err), err, "'mixed'[1] must be an integer",
               "arr element");
    /* Keys match exactly: "Hidden_Size" is a different key, not a case-blind alias. */
    CHECK(config_int(c, "Hidden_Size", &i, err, sizeof err) == 0 && i == 1, "case-sensitive %d", i);
}

/* Table-driven reads: every field filled, the first bad key named. */
static void test_tables(const cJSON *c) {
    char err[256] = "";
    int hidden = 0, exact = 0, missing = -7;
    double eps = 0, factor = 0, d;
    const config_int_field ints[] = {{"hidden_size", &hidden}, {"Hidden_Size", &exact}};
    CHECK(config_ints(c, ints, 2, err, sizeof err) == 0 && hidden == 4096 && exact == 1, "int table (%s)", err);
    const config_double_field dbls[] = {{"rms_norm_eps", &eps}, {"rope_scaling.factor", &factor}};
    CHECK(config_doubles(c, dbls, 2, err, sizeof err) == 0 && eps == 1e-6 && factor == 16, "double table (%s)", err);
    const config_int_field bad[] = {{"hidden_size", &hidden}, {"vocab_size", &missing}, {"ratio", &exact}};
    expect_err(config_ints(c, bad, 3, err, sizeof err), err, "missing key 'vocab_size'", "int table: first bad key");
    CHECK(missing == -7, "a missing key leaves its field alone");
    const config_double_field bad_d[] = {{"model_type", &d}};
    expect_err(config_doubles(c, bad_d, 1, err, sizeof err), err, "'model_type' must be a number", "double table");
}

int main(void) {
    char root[] = "/tmp/cairn_cfg_XXXXXX";
    if (!mkdtemp(root)) { perror("mkdtemp"); return 2; }
    char err[256] = "";
    test_load(root);
    cJSON *c = parse_dir_config(root, "good", config_text, err, sizeof err);
    CHECK(c != NULL, "good config rejected: %s", err);
    if (c) {
        test_reads(c);
        test_defaults(c);
        test_errors(c);
        test_tables(c);
        cJSON_Delete(c);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return TEST_END();
}
