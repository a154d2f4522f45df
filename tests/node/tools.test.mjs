// Tool-call round trips through the official clients, once per family. A random tiny model never
// writes a tool call, so the engine here is tests/fake_engine.py replying with the family's own
// tool-call syntax (DeepSeek V4: a DSML block; GLM: <tool_call>NAME<arg_key>..</arg_key><arg_value>..
// </arg_value></tool_call>); the gateway, the family's real template and parser, and the clients are
// the real ones. Template stability: the prompt of the turn after the tool call must start with
// exactly the previous prompt + the reply the engine produced (the fake engine then reports it all
// reused), which holds only if the template re-renders the parsed call byte for byte.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, MODEL_ID, FAMILY, TOOL_SYNTAX, TOOL } from './serve_helper.mjs';

const SYNTAX = TOOL_SYNTAX;
if (!SYNTAX) throw new Error(`family ${FAMILY.name} describes no tool-call syntax: give its chat template a tool_example (chat.h)`);
const REPLY = SYNTAX.reply;

let server;
before(async () => { server = await startServer(['--slots', '2'], { FAKE_REPLY: REPLY }, { fake: true }); });
after(async () => { await server.stop(); });

function submits() { return server.fakeFrames().filter((f) => f.cmd === 'SUBMIT'); }

function assertExtends(prev, next) {
  assert.ok(next.prompt.startsWith(prev.prompt + REPLY),
    `the next prompt does not extend prompt + reply:\n--- expected prefix\n${prev.prompt + REPLY}\n--- got\n${next.prompt}`);
}

test('openai: tool call parsed, result sent back, prompt extends the previous turn exactly', async () => {
  const c = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  const messages = [{ role: 'user', content: 'Weather in Paris for 3 days?' }];
  const r = await c.chat.completions.create({ model: MODEL_ID, messages, tools: [TOOL], max_tokens: 200 });
  const msg = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(msg.content, 'Let me check.');
  assert.equal(msg.tool_calls.length, 1);
  const call = msg.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_[0-9a-f]{24}$/);
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris', days: 3 });
  const first = submits().at(-1);
  assert.ok(first.prompt.includes('get_weather'), 'the tools section was not rendered');

  messages.push(msg, { role: 'tool', tool_call_id: call.id, content: '{"forecast": "sunny"}' });
  const r2 = await c.chat.completions.create({ model: MODEL_ID, messages, tools: [TOOL], max_tokens: 200 });
  const second = submits().at(-1);
  assertExtends(first, second);
  assert.ok(second.prompt.includes(SYNTAX.result('{"forecast": "sunny"}')), second.prompt);
  assert.equal(r2.usage.prompt_tokens_details.cached_tokens, Buffer.byteLength(first.prompt + REPLY));
});

test('openai streaming: tool call arrives as tool_calls deltas, markers never leak into content', async () => {
  const c = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  const stream = await c.chat.completions.create({
    model: MODEL_ID, messages: [{ role: 'user', content: 'stream it' }], tools: [TOOL], max_tokens: 200, stream: true,
  });
  let content = '';
  let finish = null;
  const calls = [];
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    content += ch.delta.content ?? '';
    for (const tc of ch.delta.tool_calls ?? []) calls.push(tc);
    finish = ch.finish_reason ?? finish;
  }
  assert.equal(content, 'Let me check.');
  assert.ok(!content.includes(SYNTAX.marker));
  assert.equal(finish, 'tool_calls');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].index, 0);
  assert.equal(calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(calls[0].function.arguments), { city: 'Paris', days: 3 });
});

test('anthropic: tool_use block, tool_result back, prompt extends the previous turn exactly', async () => {
  const c = new Anthropic({ baseURL: server.url, apiKey: 'unused', maxRetries: 0 });
  const tools = [{ name: 'get_weather', description: 'Weather forecast for a city', input_schema: TOOL.function.parameters }];
  const messages = [{ role: 'user', content: 'Weather in Paris for 3 days, please?' }];
  const m = await c.messages.create({ model: MODEL_ID, max_tokens: 200, messages, tools });
  assert.equal(m.stop_reason, 'tool_use');
  assert.deepEqual(m.content.map((b) => b.type), ['text', 'tool_use']);
  const use = m.content[1];
  assert.equal(use.name, 'get_weather');
  assert.deepEqual(use.input, { city: 'Paris', days: 3 });
  const first = submits().at(-1);

  messages.push({ role: 'assistant', content: m.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny' }] });
  const stream = c.messages.stream({ model: MODEL_ID, max_tokens: 200, messages, tools });
  const final = await stream.finalMessage();
  const second = submits().at(-1);
  assertExtends(first, second);
  assert.ok(second.prompt.includes(SYNTAX.result('sunny')), second.prompt);
  assert.equal(final.usage.cache_read_input_tokens, Buffer.byteLength(first.prompt + REPLY));
  assert.equal(final.stop_reason, 'tool_use');
  assert.deepEqual(final.content.find((b) => b.type === 'tool_use').input, { city: 'Paris', days: 3 });
});
