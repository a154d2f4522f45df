/* test_chat_glm.c — the GLM chat template: rendering, reply parsing, prefix stability.
 *
 * With no arguments it runs the unit checks. `test_chat_glm --render CASES.json` prints, as a JSON
 * array, the rendering of each case {messages, tools?, thinking} — tests/test_chat_glm_jinja.py
 * compares that with @huggingface/jinja evaluating the official template. */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "models/chat.h"
#include "chat_test.h"
#include "test.h"

extern const chat_template glm_chat;

static char *render_json(const char *messages_json, const char *tools_json, int thinking, char *err) {
    return chat_render_json(&glm_chat, messages_json, tools_json, (chat_opts){.thinking = thinking}, err, 256);
}

static void test_render_basic(void) {
    char err[256] = "";
    char *p = render_json("[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"}]", NULL,
                          1, err);
    CHECK(p && !strcmp(p, "[gMASK]<sop><|system|>Be brief.<|user|>Hi<|assistant|><think>"), "got %s", show(p));
    free(p);
    p = render_json("[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}]",
                    NULL, 0, err);
    CHECK(p && !strcmp(p, "[gMASK]<sop><|user|>ab<|assistant|></think>"), "got %s", show(p));
    free(p);
}

static void test_render_history(void) {
    char err[256] = "";
    /* Reasoning of an answered turn is dropped; the turn after the last user keeps it. */
    char *p = render_json("[{\"role\":\"user\",\"content\":\"q1\"},"
                          "{\"role\":\"assistant\",\"content\":\" a1 \",\"reasoning_content\":\"r1\"},"
                          "{\"role\":\"user\",\"content\":\"q2\"},"
                          "{\"role\":\"assistant\",\"content\":\"<think>\\nr2\\n</think>\\na2\"}]",
                          NULL, 1, err);
    CHECK(p && !strcmp(p, "[gMASK]<sop><|user|>q1<|assistant|></think>a1<|user|>q2<|assistant|><think>r2</think>a2"
                          "<|assistant|><think>"),
          "got %s", show(p));
    free(p);
}

static void test_render_tools(void) {
    char err[256] = "";
    char *p = render_json("[{\"role\":\"user\",\"content\":\"weather?\"},"
                          "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
                          "\"function\":{\"name\":\"get\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\",\\\"days\\\":2}\"}}]},"
                          "{\"role\":\"tool\",\"content\":\"sunny\"},{\"role\":\"tool\",\"content\":\"warm\"}]",
                          "[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{\"type\":\"object\"}}}]",
                          1, err);
    CHECK(starts_with(p, "[gMASK]<sop><|system|>\n# Tools\n\n"), "got %s", show(p));
    CHECK(p && strstr(p, "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get\", \"parameters\": "
                         "{\"type\": \"object\"}}}\n</tools>"),
          "tool json: %s", show(p));
    CHECK(p && strstr(p, "<|user|>weather?<|assistant|></think><tool_call>get<arg_key>city</arg_key><arg_value>Paris"
                         "</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call><|observation|>"
                         "<tool_response>sunny</tool_response><tool_response>warm</tool_response><|assistant|><think>"),
          "turns: %s", show(p));
    free(p);
}

static void test_render_errors(void) {
    char err[256] = "";
    char *p = render_json("[{\"role\":\"wizard\",\"content\":\"x\"}]", NULL, 1, err);
    CHECK(!p && strstr(err, "wizard"), "err %s", err);
    p = render_json("[{\"role\":\"user\",\"content\":5}]", NULL, 1, err);
    CHECK(!p && strstr(err, "messages[0].content"), "err %s", err);
    p = render_json("[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
                    "\"arguments\":\"[1]\"}}]}]",
                    NULL, 1, err);
    CHECK(!p && strstr(err, "arguments"), "err %s", err);
    p = render_json("[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
                    "\"arguments\":\"{\\\"q\\\":\\\"x\"}}]}]",
                    NULL, 1, err);
    CHECK(p && strstr(p, "<tool_call>f{\"q\":\"x</tool_call>"), "a cut call sent back is rendered as written: %s",
          p ? p : err);
    free(p);
    p = render_json("{\"role\":\"user\"}", NULL, 1, err);
    CHECK(!p && strstr(err, "array"), "err %s", err);
}

static void test_parse(void) {
    chat_reply r;
    const char *t = "  plan it \n</think>\nThe answer.<|user|>";
    glm_chat.parse(t, strlen(t), 1, &r);
    CHECK(r.reasoning && !strcmp(r.reasoning, "  plan it \n"), "reasoning %s", show(r.reasoning));
    CHECK(r.content && !strcmp(r.content, "\nThe answer."), "content %s", show(r.content));
    CHECK(!r.tool_calls, "no tool calls");
    chat_reply_free(&r);

    t = "cut off mid thought";
    glm_chat.parse(t, strlen(t), 1, &r);
    CHECK(r.reasoning && !strcmp(r.reasoning, t) && !r.content, "unfinished reasoning");
    chat_reply_free(&r);

    t = "Plain.";
    glm_chat.parse(t, strlen(t), 0, &r);
    CHECK(!r.reasoning && r.content && !strcmp(r.content, "Plain."), "plain %s", show(r.content));
    chat_reply_free(&r);

    t = "r</think><tool_call>get<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>n</arg_key>"
        "<arg_value>3</arg_value></tool_call><tool_call>ping</tool_call><tool_call>half<arg_key>q</arg_key><arg_value>x";
    glm_chat.parse(t, strlen(t), 1, &r);
    CHECK(!r.content, "content absent with tool calls: %s", show(r.content));
    CHECK(cJSON_GetArraySize(r.tool_calls) == 3, "three calls");
    const cJSON *c0 = cJSON_GetArrayItem(r.tool_calls, 0), *f0 = cJSON_GetObjectItem(c0, "function");
    CHECK(!strcmp(cJSON_GetObjectItem(f0, "name")->valuestring, "get"), "name");
    CHECK(!strcmp(cJSON_GetObjectItem(f0, "arguments")->valuestring, "{\"city\":\"Paris\",\"n\":3}"), "args %s",
          cJSON_GetObjectItem(f0, "arguments")->valuestring);
    const char *id = cJSON_GetObjectItem(c0, "id")->valuestring;
    CHECK(starts_with(id, "call_") && strlen(id) == 29, "id %s", id);
    CHECK(strcmp(id, cJSON_GetObjectItem(cJSON_GetArrayItem(r.tool_calls, 1), "id")->valuestring), "ids differ");
    const cJSON *f2 = cJSON_GetObjectItem(cJSON_GetArrayItem(r.tool_calls, 2), "function");
    CHECK(!strcmp(cJSON_GetObjectItem(f2, "arguments")->valuestring, "{\"q\":\"x") && r.cut_call,
          "a call the reply's end cut keeps what was written, left open: %s", cJSON_GetObjectItem(f2, "arguments")->valuestring);
    chat_reply_free(&r);
}

/* Rendering the conversation with the generated reply appended must extend the previous prompt. */
static void test_prefix_stability(void) {
    char err[256] = "";
    char *p1 = render_json("[{\"role\":\"user\",\"content\":\"weather?\"}]", NULL, 1, err);
    const char *reply = "look it up</think><tool_call>get<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>";
    chat_reply r;
    glm_chat.parse(reply, strlen(reply), 1, &r);
    cJSON *msgs = cJSON_Parse("[{\"role\":\"user\",\"content\":\"weather?\"}]"), *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "role", "assistant");
    cJSON_AddStringToObject(a, "content", r.content ? r.content : "");
    cJSON_AddStringToObject(a, "reasoning_content", r.reasoning);
    cJSON_AddItemToObject(a, "tool_calls", cJSON_Duplicate(r.tool_calls, 1));
    cJSON_AddItemToArray(msgs, a);
    cJSON_AddItemToArray(msgs, cJSON_Parse("{\"role\":\"tool\",\"content\":\"sunny\"}"));
    chat_opts o = {.thinking = 1};
    chat_prompt cp = {0};
    char *p2 = glm_chat.render(msgs, NULL, &o, &cp, err, sizeof err) ? NULL : sbuf_take(&cp.text);
    chat_prompt_free(&cp);
    size_t n1 = strlen(p1);
    CHECK(p2 && !strncmp(p2, p1, n1) && !strncmp(p2 + n1, reply, strlen(reply)), "p1+reply not a prefix of %s", show(p2));
    free(p1);
    free(p2);
    cJSON_Delete(msgs);
    chat_reply_free(&r);

    p1 = render_json("[{\"role\":\"user\",\"content\":\"hi\"}]", NULL, 0, err);
    p2 = render_json("[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"Hello!\"},"
                     "{\"role\":\"user\",\"content\":\"more\"}]",
                     NULL, 0, err);
    CHECK(starts_with(p2, "[gMASK]<sop><|user|>hi<|assistant|></think>Hello!<|user|>") && starts_with(p2, p1),
          "non-thinking stability: %s", show(p2));
    free(p1);
    free(p2);
}

static void test_system_prefix(void) {
    const char *p = "[gMASK]<sop><|system|>S<|user|>u<|assistant|><think>";
    CHECK(glm_chat.system_prefix_bytes(p, strlen(p)) == strlen("[gMASK]<sop><|system|>S"), "system prefix");
    p = "[gMASK]<sop><|user|>u<|assistant|><think>";
    CHECK(glm_chat.system_prefix_bytes(p, strlen(p)) == 0, "no system part");
}

static int render_cases(const char *path) {
    char err[256];
    size_t len;
    char *text = read_file(path, &len, err, sizeof err);
    cJSON *cases = text ? cJSON_Parse(text) : NULL, *out = cJSON_CreateArray();
    free(text);
    if (!cJSON_IsArray(cases)) { fprintf(stderr, "%s: not a JSON array of cases\n", path); return 2; }
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        chat_opts o = {.thinking = cJSON_IsTrue(cJSON_GetObjectItem(c, "thinking"))};
        chat_prompt cp = {0};
        char *p = glm_chat.render(cJSON_GetObjectItem(c, "messages"), cJSON_GetObjectItem(c, "tools"), &o, &cp, err,
                                  sizeof err) ? NULL : sbuf_take(&cp.text);
        chat_prompt_free(&cp);
        cJSON_AddItemToArray(out, p ? cJSON_CreateString(p) : cJSON_CreateNull());
        if (!p) fprintf(stderr, "render: %s\n", err);
        free(p);
    }
    char *s = cJSON_Print(out);
    puts(s);
    free(s);
    cJSON_Delete(out);
    cJSON_Delete(cases);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--render")) return render_cases(argv[2]);
    test_render_basic();
    test_render_history();
    test_render_tools();
    test_render_errors();
    test_parse();
    test_prefix_stability();
    test_system_prefix();
    return TEST_END();
}
