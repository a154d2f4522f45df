/* test_chat_inkling.c — the Inkling message format: rendering (the expected strings are the ones
 * vLLM's Inkling renderer produces for the same conversations), tool declarations and calls,
 * audio blocks, reply parsing, and prefix stability across turns. */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "models/chat.h"
#include "chat_test.h"
#include "test.h"

extern const chat_template inkling_chat;

static char *render(const char *messages_json, const char *tools_json, int thinking, const char *effort, char *err) {
    return chat_render_json(&inkling_chat, messages_json, tools_json, (chat_opts){.thinking = thinking, .effort = effort},
                            err, 256);
}

static void test_system_effort_user(void) {
    char err[256] = "";
    char *p = render("[{\"role\":\"system\",\"content\":\"Be concise.\"},{\"role\":\"user\",\"content\":\"Hello\"}]",
                     NULL, 1, "high", err);
    const char *want = "<|message_system|><|content_text|>Be concise.<|end_message|>"
                       "<|message_system|><|content_text|>Thinking effort level: 0.9<|end_message|>"
                       "<|message_user|><|content_text|>Hello<|end_message|><|message_model|>";
    CHECK(p && !strcmp(p, want), "got %s (%s)", show(p), err);
    free(p);
    p = render("[{\"role\":\"user\",\"content\":\"Hi\"}]", NULL, 0, NULL, err);
    CHECK(p && !strcmp(p, "<|message_system|><|content_text|>Thinking effort level: 0.0<|end_message|>"
                          "<|message_user|><|content_text|>Hi<|end_message|><|message_model|>"), "got %s", show(p));
    free(p);
    p = render("[{\"role\":\"system\",\"content\":\"S\"}]", NULL, 1, "xhigh", err);
    CHECK(p && strstr(p, "<|content_text|>S<|end_message|><|message_system|><|content_text|>Thinking effort level: 0.99"),
          "effort after trailing system messages: %s", show(p));
    free(p);
}

static void test_assistant_tools_and_results(void) {
    char err[256] = "";
    const char *msgs = "[{\"role\":\"user\",\"content\":\"read it\"},"
                       "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"think\",\"tool_calls\":[{\"id\":\"call-1\","
                       "\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"arguments\":\"{\\\"z\\\":1,\\\"path\\\":\\\"a.txt\\\"}\"}}]},"
                       "{\"role\":\"tool\",\"tool_call_id\":\"call-1\",\"content\":\"data\"}]";
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"description\":\"Read\","
                        "\"parameters\":{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\"}}}}}]";
    char *p = render(msgs, tools, 0, NULL, err);
    const char *want =
        "<|message_system|>tool_declare<|content_xml|>[{\"description\":\"Read\",\"name\":\"read_file\",\"parameters\":"
        "{\"properties\":{\"path\":{\"type\":\"string\"}},\"type\":\"object\"},\"type\":\"function\"}]<|end_message|>"
        "<|message_system|><|content_text|>Thinking effort level: 0.0<|end_message|>"
        "<|message_user|><|content_text|>read it<|end_message|>"
        "<|message_model|><|content_thinking|>think<|end_message|>"
        "<|message_model|>read_file<|content_invoke_tool_json|>{\"name\":\"read_file\",\"args\":{\"path\":\"a.txt\",\"z\":1}}"
        "<|end_message|><|content_model_end_sampling|>"
        "<|message_tool|>read_file<|content_text|>data<|end_message|><|message_model|>";
    CHECK(p && !strcmp(p, want), "got %s (%s)", show(p), err);
    free(p);
    p = render("[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]", NULL, 0, NULL, err);
    CHECK(!p && strstr(err, "image_url"), "unsupported part refused: %s", err);
    free(p);
}

static void test_audio_block(void) {
    char err[256] = "";
    char *p = render("[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\",\"input_audio\":{\"dmel_frames\":3}},"
                     "{\"type\":\"text\",\"text\":\"what is said?\"}]}]", NULL, 0, NULL, err);
    CHECK(p && strstr(p, "<|message_user|><|content_audio_input|><|content_audio|><|content_audio|><|content_audio|>"
                         "<|audio_end|><|end_message|><|message_user|><|content_text|>what is said?<|end_message|>"),
          "got %s", show(p));
    free(p);
    p = render("[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\",\"input_audio\":{\"data\":\"AAAA\"}}]}]", NULL,
               0, NULL, err);
    CHECK(!p && strstr(err, "undecoded"), "an audio part without frames is refused: %s", err);
    free(p);
}

static void test_parse(void) {
    chat_reply r;
    const char *t = "<|content_thinking|>hmm<|end_message|><|message_model|><|content_text|>Answer.<|end_message|>";
    inkling_chat.parse(t, strlen(t), 1, &r);
    CHECK(r.reasoning && !strcmp(r.reasoning, "hmm") && r.content && !strcmp(r.content, "Answer.") && !r.tool_calls,
          "reasoning %s content %s", show(r.reasoning), show(r.content));
    chat_reply_free(&r);
    t = "<|content_text|>ok<|end_message|><|message_model|>get<|content_invoke_tool_json|>{\"name\":\"get\",\"args\":{\"k\":2}}"
        "<|end_message|><|content_model_end_sampling|>";
    inkling_chat.parse(t, strlen(t), 0, &r);
    const cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(r.tool_calls, 0), "function");
    CHECK(fn && !strcmp(cJSON_GetObjectItem(fn, "name")->valuestring, "get") &&
              !strcmp(cJSON_GetObjectItem(fn, "arguments")->valuestring, "{\"k\":2}") && !strcmp(show(r.content), "ok"),
          "tool call parsed");
    chat_reply_free(&r);
    inkling_chat.parse("plain", 5, 0, &r);
    CHECK(r.content && !strcmp(r.content, "plain") && !r.reasoning, "plain text is content");
    chat_reply_free(&r);
}

/* The next turn's prompt starts with this turn's prompt plus the reply as generated. */
static void test_prefix_stability(void) {
    char err[256] = "";
    char *p1 = render("[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"Q1\"}]", NULL, 1, NULL, err);
    const char *gen = "<|content_thinking|>r<|end_message|><|message_model|><|content_text|>A1<|end_message|>";
    char *p2 = render("[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"Q1\"},"
                      "{\"role\":\"assistant\",\"content\":\"A1\",\"reasoning_content\":\"r\"},{\"role\":\"user\",\"content\":\"Q2\"}]",
                      NULL, 1, NULL, err);
    CHECK(p1 && p2 && !strncmp(p2, p1, strlen(p1)) && !strncmp(p2 + strlen(p1), gen, strlen(gen)), "p1 %s p2 %s", show(p1),
          show(p2));
    CHECK(p1 && inkling_chat.system_prefix_bytes(p1, strlen(p1)) == (size_t)(strstr(p1, "<|message_user|>") - p1),
          "system prefix ends at the first user message");
    free(p1);
    free(p2);
}

int main(void) {
    test_system_effort_user();
    test_assistant_tools_and_results();
    test_audio_block();
    test_parse();
    test_prefix_stability();
    return TEST_END();
}
