/* test_json_schema.c — JSON Schema -> GBNF: what the grammar accepts and rejects, and the errors
 * for what cannot be compiled (each names the keyword). The end-to-end check with ajv as the
 * independent validator is tests/node/structured.test.mjs. */
#include <stdlib.h>
#include <string.h>

#include "core/grammar.h"
#include "core/json_schema.h"
#include "test.h"

/* 1 complete, 0 prefix, -1 rejected; -2 the schema did not compile (err printed). */
static int match(const char *schema, const char *json) {
    sbuf g = {0};
    char err[400];
    if (json_schema_grammar(schema, strlen(schema), &g, err, sizeof err)) {
        printf("schema error: %s\n", err);
        return -2;
    }
    grammar *gr = grammar_parse(g.p, g.len, err, sizeof err);
    sbuf_free(&g);
    if (!gr) {
        printf("generated grammar does not parse: %s\n", err);
        return -2;
    }
    gm *m = gm_new(gr);
    int rc = gm_feed(m, json, strlen(json)) ? -1 : gm_accepting(m, gm_state(m));
    gm_free(m);
    grammar_free(gr);
    return rc;
}

static const char *error_of(const char *schema) {
    static char err[400];
    sbuf g = {0};
    err[0] = 0;
    if (!json_schema_grammar(schema, strlen(schema), &g, err, sizeof err)) strcpy(err, "");
    sbuf_free(&g);
    return err;
}

static void test_objects(void) {
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\",\"maxLength\":2}},"
                    "\"required\":[\"b\"]}";
    CHECK(match(s, "{\"a\":1,\"b\":\"xy\"}") == 1, "both");
    CHECK(match(s, "{ \"b\" : \"\" }") == 1, "required only, whitespace");
    CHECK(match(s, "{\"a\":1}") == -1, "missing required");
    CHECK(match(s, "{\"b\":\"x\",\"a\":1}") == -1, "declared order");
    CHECK(match(s, "{\"b\":\"xyz\"}") == -1, "maxLength");
    CHECK(match(s, "{\"b\":\"x\",\"c\":1}") == -1, "no undeclared keys");
    CHECK(match("{\"type\":\"object\"}", "{\"k\":[1,{\"z\":null}],\"j\":\"\\u00e9\"}") == 1, "free-form object");
    CHECK(match("{\"type\":\"object\",\"additionalProperties\":false}", "{}") == 1 &&
          match("{\"type\":\"object\",\"additionalProperties\":false}", "{\"a\":1}") == -1, "closed empty object");
    CHECK(match("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}}", "{\"a\":true,\"b\":false}") == 1 &&
          match("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}}", "{\"a\":1}") == -1, "typed map");
}

static void test_strings(void) {
    const char *s = "{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}";
    CHECK(match(s, "\"ab\"") == 1 && match(s, "\"a\"") == -1 && match(s, "\"abcd\"") == -1, "length bounds");
    CHECK(match(s, "\"é😀\"") == 1, "lengths count code points");
    CHECK(match(s, "\"\\n\\\"\"") == 1, "an escape is one character");
    CHECK(match(s, "\"\\ud83d\\ude00\"") == -1, "surrogate escapes are never generated");
    CHECK(match("{\"type\":\"string\"}", "\"a\nb\"") == -1, "raw control characters are not JSON");
    const char *date = "{\"type\":\"string\",\"format\":\"date\"}";
    CHECK(match(date, "\"2024-02-29\"") == 1 && match(date, "\"2023-02-29\"") == -1, "leap years");
    CHECK(match(date, "\"2000-02-29\"") == 1 && match(date, "\"1900-02-29\"") == -1, "centuries");
    CHECK(match(date, "\"2023-04-31\"") == -1 && match(date, "\"2023-13-01\"") == -1, "days per month, months");
    const char *dt = "{\"type\":\"string\",\"format\":\"date-time\"}";
    CHECK(match(dt, "\"2024-01-02T03:04:05.123Z\"") == 1 && match(dt, "\"2024-01-02T03:04:05\"") == -1, "date-time needs a zone");
    CHECK(match("{\"format\":\"uuid\"}", "\"123e4567-e89b-12d3-a456-426614174000\"") == 1, "uuid");
    CHECK(match("{\"format\":\"email\"}", "\"a.b@ex-1.org\"") == 1 && match("{\"format\":\"email\"}", "\"a@b\"") == -1, "email");
    CHECK(match("{\"format\":\"ipv4\"}", "\"255.0.10.1\"") == 1 && match("{\"format\":\"ipv4\"}", "\"256.0.0.1\"") == -1, "ipv4");
}

/* How many " | " the grammar of a schema holds. */
static int alternatives(const char *schema) {
    sbuf g = {0};
    char err[400];
    if (json_schema_grammar(schema, strlen(schema), &g, err, sizeof err)) return -1;
    int n = 0;
    for (const char *at = g.p; (at = strstr(at, " | ")); at += 3) n++;
    sbuf_free(&g);
    return n;
}

static void test_patterns(void) {
    const char *p = "{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d+$\"}";
    CHECK(match(p, "\"AB-12\"") == 1 && match(p, "\"Ab-12\"") == -1 && match(p, "\"AB-\"") == -1, "anchored");
    const char *u = "{\"pattern\":\"ab\"}";
    CHECK(match(u, "\"xxabyy\"") == 1 && match(u, "\"xaxb\"") == -1, "unanchored: contains a match");
    const char *q = "{\"pattern\":\"^[\\\"\\\\\\\\]+$\"}";
    CHECK(match(q, "\"\\\"\\\\\"") == 1, "quote and backslash members are written escaped");
    CHECK(match("{\"pattern\":\"^a.c$\"}", "\"a\\nc\"") == -1 && match("{\"pattern\":\"^a.c$\"}", "\"a€c\"") == 1, "dot");
    CHECK(match("{\"pattern\":\"^(ab|c)*?$\"}", "\"abcab\"") == 1, "groups, alternation, lazy");
    /* an atom that can match nothing may still be repeated a bounded number of times */
    CHECK(match("{\"pattern\":\"^(ab|){2,3}x{0,}(y?z)+$\"}", "\"ababxxyzz\"") == 1, "bounded repetition of a nullable group");
    const char *c0 = "{\"pattern\":\"^[\\u0001-\\u001f]$\"}";    /* the C0 controls but NUL */
    CHECK(match(c0, "\"\\u0001\"") == 1 && match(c0, "\"\\u000b\"") == 1 && match(c0, "\"\\u001f\"") == 1 &&
              match(c0, "\"\\n\"") == 1 && match(c0, "\"\\b\"") == 1,
          "controls written as JSON writes them");
    CHECK(match(c0, "\"\\u000a\"") == -1 && match(c0, "\"\\u0008\"") == -1 && match(c0, "\"\\u001F\"") == -1 &&
              match(c0, "\"\\u0000\"") == -1 && match(c0, "\"\\u0020\"") == -1 && match(c0, "\"\\u0010\\u0011\"") == -1,
          "one spelling per control, none outside the class");
    int dot = alternatives("{\"pattern\":\"^.$\"}") - alternatives("{\"pattern\":\"^a$\"}");
    CHECK(dot > 0 && dot <= 10, "a dot is %d alternatives (the controls grouped by hex digit, not one each)", dot);
    const char *ws = "{\"pattern\":\"^\\\\S\\\\s$\"}";
    CHECK(match(ws, "\"x \"") == 1 && match(ws, "\"x\xc2\xa0\"") == 1, "\\s includes U+00A0 as ECMAScript says");
    CHECK(match(ws, "\"\xc2\xa0 \"") == -1 && match(ws, "\"xy\"") == -1, "\\S excludes all of \\s");
}

static void test_numbers(void) {
    const char *i = "{\"type\":\"integer\",\"minimum\":-12,\"exclusiveMaximum\":130}";
    CHECK(match(i, "-12") == 1 && match(i, "-13") == -1 && match(i, "129") == 1 && match(i, "130") == -1, "integer bounds");
    CHECK(match(i, "0") == 1 && match(i, "-0") == -1 && match(i, "007") == -1, "no -0, no leading zeros");
    const char *n = "{\"type\":\"number\",\"exclusiveMinimum\":-1,\"maximum\":2}";
    CHECK(match(n, "-0.5") == 1 && match(n, "-1") == -1 && match(n, "-1.0") == -1, "exclusive lower");
    CHECK(match(n, "2") == 1 && match(n, "2.00") == 1 && match(n, "2.01") == -1 && match(n, "1.999") == 1, "inclusive upper");
    CHECK(match("{\"type\":\"number\"}", "-1.5e-3") == 1 && match("{\"type\":\"number\"}", "1.") == 0, "free numbers");
    CHECK(match("{\"type\":\"integer\",\"minimum\":1000}", "99999") == 1 && match("{\"type\":\"integer\",\"minimum\":1000}", "999") == 0,
          "open above");
}

static void test_combinators(void) {
    const char *r = "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"const\":1},\"next\":{\"$ref\":\"#/$defs/n\"}},"
                    "\"required\":[\"v\"]}},\"$ref\":\"#/$defs/n\"}";
    CHECK(match(r, "{\"v\":1,\"next\":{\"v\":1,\"next\":{\"v\":1}}}") == 1, "recursive $ref");
    CHECK(match("{\"enum\":[\"a\",1,null,[true]]}", "[true]") == 1 && match("{\"enum\":[\"a\",1]}", "2") == -1, "enum");
    CHECK(match("{\"type\":[\"string\",\"null\"]}", "null") == 1 && match("{\"type\":[\"string\",\"null\"]}", "1") == -1, "unions");
    CHECK(match("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"boolean\"}]}", "true") == 1, "anyOf");
    const char *all = "{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},{\"properties\":{\"b\":{\"type\":"
                      "\"integer\"}},\"required\":[\"b\"]}]}";
    CHECK(match(all, "{\"a\":1,\"b\":2}") == 1 && match(all, "{\"a\":1}") == -1, "allOf merges objects");
    const char *t = "{\"prefixItems\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"items\":false}";
    CHECK(match(t, "[1,\"x\"]") == 1 && match(t, "[1]") == -1 && match(t, "[1,\"x\",2]") == -1, "tuples");
    const char *a = "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":2}";
    CHECK(match(a, "[]") == -1 && match(a, "[1]") == 1 && match(a, "[1, 2]") == 1 && match(a, "[1,2,3]") == -1, "item counts");
    CHECK(match("true", "{\"x\":[]}") == 1, "schema true: any value");
}

static void test_errors(void) {
    struct { const char *schema, *want; } cases[] = {
        {"{\"type\":\"object\",\"patternProperties\":{}}", "unsupported keyword 'patternProperties'"},
        {"{\"properties\":{\"a\":{\"not\":{}}}}", "at /properties/a: unsupported keyword 'not'"},
        {"{\"uniqueItems\":true}", "uniqueItems"},
        {"{\"type\":\"string\",\"format\":\"hostname\"}", "unsupported format 'hostname'"},
        {"{\"pattern\":\"(?=x)\"}", "lookaround"},
        {"{\"pattern\":\"^(ab|)*l\"}", "repeats something that can match the empty string"},
        {"{\"pattern\":\"(b*)+\"}", "repeats something that can match the empty string"},
        {"{\"pattern\":\"((c?)(d{0,2})){1,}\"}", "repeats something that can match the empty string"},
        {"{\"pattern\":\"(a)\\\\1\"}", "backreferences"},
        {"{\"pattern\":\"a\\\\bc\"}", "\\b"},
        {"{\"pattern\":\"a\",\"maxLength\":3}", "'pattern' together with"},
        {"{\"$ref\":\"#/$defs/missing\"}", "does not point into the schema"},
        {"{\"$ref\":\"other.json\"}", "only references inside the schema"},
        {"{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "'oneOf' is supported only"},
        {"{\"type\":\"number\",\"minimum\":0.5}", "number bounds must be integers"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "leave no value"},
        {"{\"type\":\"integer\",\"minimum\":-5,\"maximum\":-4e70}", "leave no value of at most 16 digits"},
        {"{\"type\":\"integer\",\"minimum\":1e20}", "leave no value of at most 16 digits"},
        {"{\"$ref\":\"#\"}", "$ref '#' refers back to itself before matching anything"},
        {"{\"anyOf\":[{\"type\":\"null\"},{\"$ref\":\"#\"}]}", "refers back to itself"},
        {"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}",
         "$ref '#/$defs/a' refers back to itself"},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":true}", "draft-04"},
        {"{\"type\":\"strnig\"}", "unknown type 'strnig'"},
        {"{\"minLength\":3,\"maxLength\":2}", "below 'minLength'"},
        {"{\"enum\":[1],\"type\":\"string\"}", "no 'enum' value has the schema's 'type'"},
        {"false", "nothing validates"},
        {"{\"allOf\":[{\"minLength\":1},{\"minLength\":2}]}", "more than one branch"},
        {"[1", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *e = error_of(cases[i].schema);
        CHECK(strstr(e, cases[i].want) != NULL, "%s -> '%s', want '%s'", cases[i].schema, e, cases[i].want);
    }
}

/* Tagged form (json_schema_tagged_rules) with tag close "|": 1 complete, 0 prefix, -1 rejected. */
static int tagged(const char *schema, const char *text) {
    cJSON *s = cJSON_Parse(schema);
    sbuf g = {0};
    char err[400];
    int rc = -2;
    if (json_schema_tagged_rules(s, s, "root", "\"|\"", &g, err, sizeof err)) printf("schema error: %s\n", err);
    else {
        grammar *gr = grammar_parse(g.p, g.len, err, sizeof err);
        if (!gr) printf("tagged grammar does not parse: %s\n%s\n", err, g.p);
        gm *m = gr ? gm_new(gr) : NULL;
        if (m) rc = gm_feed(m, text, strlen(text)) ? -1 : gm_accepting(m, gm_state(m));
        gm_free(m);
        grammar_free(gr);
    }
    sbuf_free(&g);
    cJSON_Delete(s);
    return rc;
}

static void test_tagged(void) {
    const char *s = "{\"type\":\"string\",\"maxLength\":3}";
    CHECK(tagged(s, "string|a\"\\") == 1, "a raw string: quotes and backslashes as themselves");
    CHECK(tagged(s, "string|\"ab\"") == -1, "maxLength counts raw characters");
    CHECK(tagged(s, "string|a\nb") == 1 && tagged(s, "number|1") == -1, "newline raw; wrong type tag");
    s = "{\"type\":[\"integer\",\"null\"],\"minimum\":0,\"maximum\":9}";
    CHECK(tagged(s, "number|7") == 1 && tagged(s, "null|null") == 1 && tagged(s, "number|10") == -1, "type list");
    CHECK(tagged("{\"enum\":[\"x y\",2,true]}", "string|x y") == 1 && tagged("{\"enum\":[\"x y\",2,true]}", "number|2") == 1 &&
              tagged("{\"enum\":[\"x y\",2,true]}", "boolean|true") == 1 && tagged("{\"enum\":[\"x y\",2,true]}", "string|\"x y\"") == -1,
          "enum values tagged, strings raw");
    CHECK(tagged("{\"type\":\"string\",\"pattern\":\"^[\\\"a]{2}$\"}", "string|\"a") == 1, "pattern raw");
    CHECK(tagged("{\"type\":\"string\",\"format\":\"date\"}", "string|2024-02-29") == 1, "format raw");
    s = "{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":2}";
    CHECK(tagged(s, "array|[\"a\",\"b\"]") == 1 && tagged(s, "array|[a]") == -1, "strings inside containers stay JSON");
    s = "{\"$defs\":{\"s\":{\"type\":\"string\",\"maxLength\":2}},\"anyOf\":[{\"$ref\":\"#/$defs/s\"},"
        "{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/s\"}}]}";
    CHECK(tagged(s, "string|ab") == 1 && tagged(s, "array|[\"ab\"]") == 1 && tagged(s, "array|[ab]") == -1,
          "one $ref target raw at the top, JSON inside");
    CHECK(tagged("true", "object|{\"a\":1}") == 1 && tagged("true", "string|free") == 1 && tagged("true", "null|null") == 1,
          "any value: every type tagged");
}

int main(void) {
    test_objects();
    test_strings();
    test_patterns();
    test_numbers();
    test_combinators();
    test_errors();
    test_tagged();
    return TEST_END();
}
