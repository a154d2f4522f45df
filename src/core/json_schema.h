/* json_schema.h — JSON Schema -> GBNF (grammar.h), for structured outputs and tool arguments.
 *
 * The grammar generates exactly JSON texts that validate (compact apart from optional
 * whitespace after structural characters); where the schema allows more than the grammar can say
 * exactly, the grammar is STRICTER, never looser: an object with declared `properties` gets no
 * undeclared keys (whatever additionalProperties says), `prefixItems` are all generated, and
 * `\uXXXX` escapes never write surrogates (so minLength/maxLength count code points exactly, as
 * validators do). Anything that cannot be expressed that way is an error naming the keyword.
 *
 * SUPPORTED: type (one or a list), enum, const, properties, required, additionalProperties,
 * items, prefixItems, minItems, maxItems, anyOf, oneOf (branches of distinct types, distinct
 * constants, or objects told apart by a required const property), allOf (objects merged, or one
 * branch), $ref to "#", "#/$defs/..." and "#/definitions/..." (recursion allowed), minLength,
 * maxLength, pattern (see below), format (date, time, date-time, uuid, email, ipv4),
 * minimum/maximum/exclusiveMinimum/exclusiveMaximum on integers, and on numbers when the bounds
 * are integers. Annotations (title, description, default, examples, $schema, $id, $comment,
 * deprecated, readOnly, writeOnly) are ignored.
 *
 * PATTERN SUBSET (ECMAScript syntax, as validators run it): literals, escapes \d \D \w \W \s \S
 * \t \n \r \f \v \uXXXX and escaped punctuation, [classes] with ranges and ^, `.`, groups ( ) and
 * (?: ), alternation |, quantifiers * + ? {m} {m,} {m,n} (lazy forms too), ^ at the start and $
 * at the end (an unanchored side may have any text around the match). Not supported:
 * backreferences, lookaround, \b, named groups, and pattern combined with minLength/maxLength.
 *
 * Generated strings without maxLength, arrays without maxItems and free-form objects are
 * unbounded; integers are at most 16 digits, fractions 15, exponents 3.
 */
#ifndef CAIRN_JSON_SCHEMA_H
#define CAIRN_JSON_SCHEMA_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "sbuf.h"

/* Append GBNF rules to out: `name ::= <the schema's JSON value>` plus helper rules whose names
 * start with name + "-". name must be a valid rule name ([A-Za-z0-9_-]); $ref resolves against
 * root (the document the schema is part of; the schema itself when it stands alone). -1 + err
 * (naming the keyword and where it is, as a JSON pointer) when the schema cannot be compiled. */
int json_schema_rules(const cJSON *root, const cJSON *schema, const char *name, sbuf *out, char *err, size_t errlen);

/* Tagged form, for tool-call syntaxes that write an argument's JSON type beside its value (a
 * type="..." attribute): `name ::=` alternatives, each the literal JSON type name of the
 * value (string, number, boolean, null, array, object; integers are "number") followed by
 * tag_close (GBNF) and then the value, a string's text written RAW (no quotes, no escapes: the
 * characters themselves, NUL and the C0 controls other than tab, LF, CR never generated);
 * values inside arrays and objects stay JSON. */
int json_schema_tagged_rules(const cJSON *root, const cJSON *schema, const char *name, const char *tag_close, sbuf *out,
                             char *err, size_t errlen);

/* The pattern subset above, as a GBNF expression for the CONTENT of a JSON string (between the
 * quotes; characters the JSON text must escape are written escaped), or with raw set for the
 * string itself (every character as itself). char_rule names a rule for one string character
 * of the same kind (used for the unanchored sides). */
int json_pattern_expr(const char *re, const char *char_rule, int raw, sbuf *e, char *err, size_t errlen);

/* A whole grammar whose root is the schema (text is the schema's JSON). The fuzz entry point. */
int json_schema_grammar(const char *text, size_t len, sbuf *out, char *err, size_t errlen);

#endif
