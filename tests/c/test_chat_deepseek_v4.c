/* test_chat_deepseek_v4.c — the DeepSeek V4 template against renderings derived by hand from the
 * official encoder's rules, reply parsing (reasoning, content, DSML tool calls) and the
 * template-stability property. */
#include <stdlib.h>
#include <string.h>

#include "models/chat.h"
#include "models/model.h"
#include "chat_test.h"
#include "test.h"

#define BOS "<｜begin▁of▁sentence｜>"
#define EOS "<｜end▁of▁sentence｜>"
#define U "<｜User｜>"
#define A "<｜Assistant｜>"
#define DS "｜DSML｜"

extern const chat_template deepseek_v4_chat;
static const chat_template *T = &deepseek_v4_chat;

static const char *weather_tool =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}]";

#define WEATHER_CALL                                                                                   \
    "\n\n<" DS "tool_calls>\n<" DS "invoke name=\"get_weather\">\n<" DS "parameter name=\"city\" string=\"true\">" \
    "Paris</" DS "parameter>\n<" DS "parameter name=\"days\" string=\"false\">3</" DS "parameter>\n</" DS        \
    "invoke>\n</" DS "tool_calls>"

/* Render JSON messages (and tools); returns a heap prompt or NULL with err filled. */
static char *render(const char *messages, const char *tools, int thinking, const char *effort, const char *choice,
                    char *err, size_t errlen) {
    return chat_render_json(T, messages, tools, (chat_opts){.thinking = thinking, .effort = effort, .tool_choice = choice},
                            err, errlen);
}


static void expect_render(const char *what, const char *messages, const char *tools, int thinking, const char *want) {
    char err[256] = "";
    char *got = render(messages, tools, thinking, NULL, NULL, err, sizeof err);
    CHECK(got && !strcmp(got, want), "%s:\n got  [%s]\n want [%s] (%s)", what, got ? got : "NULL", want, err);
    free(got);
}

static void test_chat_mode(void) {
    expect_render("system + user, chat",
                  "[{\"role\":\"system\",\"content\":\"You are helpful.\"},{\"role\":\"user\",\"content\":\"Hi\"}]", NULL,
                  0, BOS "You are helpful." U "Hi" A "</think>");
    expect_render("multi-turn chat keeps answers, reasoning never shown",
                  "[{\"role\":\"user\",\"content\":\"Hi\"},"
                  "{\"role\":\"assistant\",\"content\":\"Hello!\",\"reasoning_content\":\"greet\"},"
                  "{\"role\":\"user\",\"content\":\"Bye\"}]",
                  NULL, 0, BOS U "Hi" A "</think>Hello!" EOS U "Bye" A "</think>");
    expect_render("content parts concatenate",
                  "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}]",
                  NULL, 0, BOS U "ab" A "</think>");
    expect_render("tool result parts join with blank lines",
                  "[{\"role\":\"tool\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}]",
                  NULL, 0, BOS U "<tool_result>a\n\nb</tool_result>" A "</think>");
}

static void test_thinking_drops_history(void) {
    expect_render("thinking: historical reasoning dropped, cue opens <think>",
                  "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"U1\"},"
                  "{\"role\":\"assistant\",\"content\":\"A1\",\"reasoning_content\":\"R1\"},"
                  "{\"role\":\"user\",\"content\":\"U2\"}]",
                  NULL, 1, BOS "S" U "U1" A "</think>A1" EOS U "U2" A "<think>");
    expect_render("thinking: developer turns before the last user turn are dropped",
                  "[{\"role\":\"developer\",\"content\":\"D\"},{\"role\":\"user\",\"content\":\"U1\"},"
                  "{\"role\":\"assistant\",\"content\":\"A1\"},{\"role\":\"user\",\"content\":\"U2\"}]",
                  NULL, 1, BOS U "U1" A "</think>A1" EOS U "U2" A "<think>");
    expect_render("chat: the same developer turn is kept, with no cue before the next user turn",
                  "[{\"role\":\"developer\",\"content\":\"D\"},{\"role\":\"user\",\"content\":\"U1\"},"
                  "{\"role\":\"assistant\",\"content\":\"A1\"},{\"role\":\"user\",\"content\":\"U2\"}]",
                  NULL, 0, BOS U "D" U "U1" A "</think>A1" EOS U "U2" A "</think>");
}

static void test_effort(void) {
    char err[256] = "";
    const char *msgs = "[{\"role\":\"user\",\"content\":\"Q\"}]";
    char *max = render(msgs, NULL, 1, "max", NULL, err, sizeof err);
    CHECK(starts_with(max, BOS "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"),
          "max effort paragraph after BOS: %s", max ? max : err);
    CHECK(max && strstr(max, "left unchecked.\n\n" U "Q" A "<think>"), "paragraph ends with a blank line: %s", max);
    free(max);
    char *xhigh = render(msgs, NULL, 1, "xhigh", NULL, err, sizeof err);
    CHECK(xhigh && strstr(xhigh, "Reasoning Effort:"), "xhigh maps to max");
    free(xhigh);
    char *high = render(msgs, NULL, 1, "high", NULL, err, sizeof err);
    CHECK(high && !strcmp(high, BOS U "Q" A "<think>"), "high adds nothing: %s", high ? high : err);
    free(high);
    char *chat = render(msgs, NULL, 0, "max", NULL, err, sizeof err);
    CHECK(chat && !strcmp(chat, BOS U "Q" A "</think>"), "no paragraph without thinking: %s", chat ? chat : err);
    free(chat);
    char *bad = render(msgs, NULL, 1, "banana", NULL, err, sizeof err);
    CHECK(!bad && strstr(err, "banana"), "unknown effort is an error naming it: %s", err);
    free(bad);
}

static const char *tools_tail_want =
    "### Available Tool Schemas\n\n"
    "{\"name\": \"get_weather\", \"description\": \"Weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

static void test_tools_and_results(void) {
    char err[256] = "";
    /* tools appended to the system message; thinking keeps all reasoning because tools exist */
    const char *conv =
        "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"Weather?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"need tool\",\"tool_calls\":[{\"id\":\"c1\","
        "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\","
        "\\\"days\\\":3}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"}]";
    char *p = render(conv, weather_tool, 1, NULL, NULL, err, sizeof err);
    CHECK(starts_with(p, BOS "S\n\n## Tools\n\nYou have access to a set of tools"),
          "tools section follows the system text: %s", p ? p : err);
    const char *tail = U "Weather?" A "<think>need tool</think>" WEATHER_CALL EOS U "<tool_result>sunny</tool_result>" A
                         "<think>";
    char *want_end = malloc(strlen(tools_tail_want) + strlen(tail) + 1);
    strcpy(want_end, tools_tail_want);
    strcat(want_end, tail);
    CHECK(p && strlen(p) > strlen(want_end) && !strcmp(p + strlen(p) - strlen(want_end), want_end),
          "tool schemas (Python JSON spacing), DSML call, tool result:\n got [%s]\n want end [%s]", p, want_end);
    free(want_end);
    free(p);

    /* without a system message an empty one carries the tools */
    p = render("[{\"role\":\"user\",\"content\":\"Q\"}]", weather_tool, 0, NULL, NULL, err, sizeof err);
    CHECK(starts_with(p, BOS "\n\n## Tools\n\n"), "inserted system message: %s", p ? p : err);
    CHECK(p && strstr(p, "tool calls.\n" U "Q" A "</think>"), "tools then the user turn: %s", p);
    free(p);
    p = render("[{\"role\":\"user\",\"content\":\"Q\"}]", weather_tool, 0, NULL, "required", err, sizeof err);
    CHECK(p && strstr(p, "tool calls.\n\nYou must call at least one tool in this reply.\n" U), "required: %s", p);
    free(p);
    p = render("[{\"role\":\"user\",\"content\":\"Q\"}]", weather_tool, 0, NULL, "get_weather", err, sizeof err);
    CHECK(p && strstr(p, "You must call the tool \"get_weather\" in this reply.\n" U), "forced tool: %s", p);
    free(p);
    p = render("[{\"role\":\"user\",\"content\":\"Q\"}]", weather_tool, 0, NULL, "none", err, sizeof err);
    CHECK(p && !strcmp(p, BOS U "Q" A "</think>"), "tool_choice none renders no tools: %s", p ? p : err);
    free(p);

    /* results merge into one user turn, ordered as the calls were made; a user text joins them */
    expect_render("tool results merged and ordered",
                  "[{\"role\":\"user\",\"content\":\"Q\"},"
                  "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":["
                  "{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},"
                  "{\"id\":\"b\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"x\\\":[1,2.5]}\"}}]},"
                  "{\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":\"B\"},"
                  "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"A\"},"
                  "{\"role\":\"user\",\"content\":\"thanks\"}]",
                  NULL, 0,
                  BOS U "Q" A "</think>\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n\n</" DS "invoke>\n<" DS
                  "invoke name=\"g\">\n<" DS "parameter name=\"x\" string=\"false\">[1, 2.5]</" DS "parameter>\n</" DS
                  "invoke>\n</" DS "tool_calls>" EOS U "<tool_result>A</tool_result>\n\n<tool_result>B</tool_result>\n\nthanks" A
                  "</think>");
}

static void test_render_errors(void) {
    char err[256] = "";
    char *p = render("[{\"role\":\"user\",\"content\":\"Q\"},{\"role\":\"assistant\",\"content\":\"A\"}]", NULL, 0, NULL,
                     NULL, err, sizeof err);
    CHECK(!p && strstr(err, "must end with"), "ending on an assistant turn: %s", err);
    free(p);
    p = render("[{\"role\":\"robot\",\"content\":\"Q\"}]", NULL, 0, NULL, NULL, err, sizeof err);
    CHECK(!p && strstr(err, "messages[0]") && strstr(err, "robot"), "unknown role: %s", err);
    free(p);
    p = render("[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]", NULL, 0, NULL, NULL, err, sizeof err);
    CHECK(!p && strstr(err, "messages[0].content[0]"), "non-text part: %s", err);
    free(p);
    p = render("{\"role\":\"user\"}", NULL, 0, NULL, NULL, err, sizeof err);
    CHECK(!p && strstr(err, "array"), "messages not an array: %s", err);
    free(p);
    p = render("[{\"role\":\"user\",\"content\":\"Q\"}]", "[{\"type\":\"function\"}]", 0, NULL, NULL, err, sizeof err);
    CHECK(!p && strstr(err, "tools[0].function"), "tool without function: %s", err);
    free(p);
}

static int is_call_id(const char *id) {
    if (strlen(id) != 29 || strncmp(id, "call_", 5)) return 0;
    for (const char *c = id + 5; *c; c++)
        if (!strchr("0123456789abcdef", *c)) return 0;
    return 1;
}

static void parse(const char *text, int thinking, chat_reply *r) { T->parse(text, strlen(text), thinking, r); }

static const char *call_field(const chat_reply *r, int k, const char *field) {
    const cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(r->tool_calls, k), "function");
    const cJSON *v = cJSON_GetObjectItem(fn, field);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static void test_parse(void) {
    chat_reply r;
    parse("R1</think>Answer" EOS, 1, &r);
    CHECK(r.reasoning && !strcmp(r.reasoning, "R1") && r.content && !strcmp(r.content, "Answer") && !r.tool_calls,
          "thinking reply: [%s] [%s]", r.reasoning, r.content);
    chat_reply_free(&r);

    parse("still thinking", 1, &r);
    CHECK(r.reasoning && !strcmp(r.reasoning, "still thinking") && !r.content, "cut-off thinking is all reasoning");
    chat_reply_free(&r);

    parse("Let me check." WEATHER_CALL EOS, 0, &r);
    CHECK(r.content && !strcmp(r.content, "Let me check."), "content before the DSML block: [%s]", r.content);
    CHECK(cJSON_GetArraySize(r.tool_calls) == 1, "one call");
    CHECK(!strcmp(call_field(&r, 0, "name"), "get_weather"), "name");
    CHECK(!strcmp(call_field(&r, 0, "arguments"), "{\"city\": \"Paris\", \"days\": 3}"), "arguments: %s",
          call_field(&r, 0, "arguments"));
    const cJSON *id = cJSON_GetObjectItem(cJSON_GetArrayItem(r.tool_calls, 0), "id");
    CHECK(cJSON_IsString(id) && is_call_id(id->valuestring), "id call_<24 hex>: %s", id ? id->valuestring : "-");
    chat_reply_free(&r);

    parse("\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n<" DS "parameter name=\"o\" string=\"false\">"
          "{\"u\": [1, true]}</" DS "parameter>\n<" DS "parameter name=\"s\" string=\"true\">a \"q\"\nb</" DS
          "parameter>\n<" DS "parameter name=\"bad\" string=\"false\">abc</" DS "parameter>\n</" DS "invoke>\n<" DS
          "invoke name=\"g\">\n\n</" DS "invoke>\n</" DS "tool_calls>" EOS,
          0, &r);
    CHECK(!r.content, "no content before the calls");
    CHECK(cJSON_GetArraySize(r.tool_calls) == 2, "two calls");
    CHECK(!strcmp(call_field(&r, 0, "arguments"), "{\"o\": {\"u\": [1, true]}, \"s\": \"a \\\"q\\\"\\nb\", \"bad\": \"abc\"}"),
          "JSON values kept, strings escaped, invalid JSON quoted: %s", call_field(&r, 0, "arguments"));
    CHECK(!strcmp(call_field(&r, 1, "arguments"), "{}"), "no parameters: %s", call_field(&r, 1, "arguments"));
    const char *id0 = cJSON_GetObjectItem(cJSON_GetArrayItem(r.tool_calls, 0), "id")->valuestring;
    const char *id1 = cJSON_GetObjectItem(cJSON_GetArrayItem(r.tool_calls, 1), "id")->valuestring;
    CHECK(strcmp(id0, id1), "distinct ids");
    chat_reply_free(&r);

    parse("Sure.\n\n<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n<" DS "param", 0, &r);
    CHECK(r.content && !strcmp(r.content, "Sure.") && cJSON_GetArraySize(r.tool_calls) == 1 && r.cut_call &&
              !strcmp(call_field(&r, 0, "name"), "f") && !strcmp(call_field(&r, 0, "arguments"), "{"),
          "a cut-off call keeps what was written (arguments left open): [%s]", r.content);
    chat_reply_free(&r);
    parse("<" DS "tool_calls>\n<" DS "invoke name=\"f\">\n<" DS "parameter name=\"s\" string=\"true\">a \"b</" DS "para", 0, &r);
    CHECK(r.cut_call && !strcmp(call_field(&r, 0, "arguments"), "{\"s\": \"a \\\"b"),
          "cut inside a string value, before its close marker: %s", r.tool_calls ? call_field(&r, 0, "arguments") : "-");
    chat_reply_free(&r);
    parse("Sure.\n\n<" DS "tool", 0, &r);
    CHECK(r.content && !strcmp(r.content, "Sure."), "cut-off block start removed: [%s]", r.content);
    chat_reply_free(&r);
    parse("a<think>b" EOS, 0, &r);
    CHECK(r.content && !strcmp(r.content, "ab") && !r.reasoning, "markers removed in chat mode: [%s]", r.content);
    chat_reply_free(&r);
    parse("<1 < 2<think></think" BOS "<</think>x<", 0, &r);
    CHECK(r.content && !strcmp(r.content, "<1 < 2</think<x<"), "only whole markers removed, every other '<' kept: [%s]",
          r.content);
    chat_reply_free(&r);
}

/* render(history + reply + new user) starts with render(history) + the reply text. */
static void check_stable(const char *what, const char *history, const char *tools, int thinking, const char *reply,
                         const char *next) {
    char err[256] = "";
    char *p1 = render(history, tools, thinking, NULL, NULL, err, sizeof err);
    chat_reply r;
    parse(reply, thinking, &r);
    cJSON *msgs = cJSON_Parse(history), *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "role", "assistant");
    if (r.content) cJSON_AddStringToObject(a, "content", r.content);
    else cJSON_AddNullToObject(a, "content");
    if (r.reasoning) cJSON_AddStringToObject(a, "reasoning_content", r.reasoning);
    if (r.tool_calls) cJSON_AddItemToObject(a, "tool_calls", cJSON_Duplicate(r.tool_calls, 1));
    cJSON_AddItemToArray(msgs, a);
    cJSON_AddItemToArray(msgs, cJSON_Parse(next));
    char *json = cJSON_PrintUnformatted(msgs);
    char *p2 = render(json, tools, thinking, NULL, NULL, err, sizeof err);
    size_t n1 = p1 ? strlen(p1) : 0, nr = strlen(reply);
    CHECK(p1 && p2 && !strncmp(p2, p1, n1) && !strncmp(p2 + n1, reply, nr), "%s:\n p1 [%s]\n p2 [%s] (%s)", what, p1,
          p2, err);
    free(p1);
    free(p2);
    free(json);
    cJSON_Delete(msgs);
    chat_reply_free(&r);
}

static void test_stability(void) {
    const char *hist = "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"U1\"}]";
    check_stable("chat text reply", hist, NULL, 0, "Hello there!" EOS, "{\"role\":\"user\",\"content\":\"U2\"}");
    check_stable("chat tool-call reply", hist, weather_tool, 0, "Checking." WEATHER_CALL EOS,
                 "{\"role\":\"tool\",\"tool_call_id\":\"x\",\"content\":\"sunny\"}");
    check_stable("thinking with tools keeps reasoning", hist, weather_tool, 1, "hmm</think>It is sunny." EOS,
                 "{\"role\":\"user\",\"content\":\"U2\"}");
}

static void test_system_prefix(void) {
    char err[256] = "";
    char *p = render("[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"U\"}]", NULL, 0, NULL, NULL,
                     err, sizeof err);
    CHECK(p && T->system_prefix_bytes(p, strlen(p)) == strlen(BOS "S"), "prefix = BOS + system");
    free(p);
    CHECK(T->system_prefix_bytes(BOS "abc", strlen(BOS "abc")) == 0, "no turn marker: 0");
    CHECK(family_for_model_type("deepseek_v4")->chat == T, "the deepseek_v4 descriptor carries this template");
}

int main(void) {
    test_chat_mode();
    test_thinking_drops_history();
    test_effort();
    test_tools_and_results();
    test_render_errors();
    test_parse();
    test_stability();
    test_system_prefix();
    return TEST_END();
}
