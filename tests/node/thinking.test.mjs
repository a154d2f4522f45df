// Reasoning split through the official clients, once per family: in thinking mode the prompt ends
// with the family's thinking cue (its assistant marker + <think>, or the family's own, below), the
// reply is REASONING, the end-of-reasoning markup, ANSWER, and the gateway must hand the reasoning
// out separately (OpenAI reasoning_content, Anthropic thinking blocks), streaming or not, without
// ever leaking the markup; in chat mode the prompt ends with the chat cue (marker + </think>).
// The engine is tests/fake_engine.py (it replies in 3-byte pieces, so the
// marker and multibyte characters arrive split across frames).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, MODEL_ID, FAMILY } from './serve_helper.mjs';

const REASONING = 'Let me think… 2+2 is 4.';
const ANSWER = 'The answer is 4.';
const ASSISTANT = FAMILY.turns.assistant;
// Kimi K3 (XTML) has no <think> tags: the cue opens the assistant message and its think or
// response channel, and the reply closes the think channel and opens the response one.
const K3_ASSISTANT = '<|open|>message role="assistant"<|sep|>';
const FORMAT = {
  kimi_k3: {
    think: `${K3_ASSISTANT}<|open|>think<|sep|>`, chat: `${K3_ASSISTANT}<|open|>response<|sep|>`,
    reply: `${REASONING}<|close|>think<|sep|><|open|>response<|sep|>${ANSWER}<|close|>response<|sep|><|close|>message<|sep|>`,
  },
  // Inkling: the prompt always ends with the model header; the effort line tells the modes apart,
  // and the reply is a thinking block then a text block.
  inkling: {
    think: '<|message_model|>', chat: '<|message_model|>',
    effort: { think: 'Thinking effort level: 0.9<|end_message|>', chat: 'Thinking effort level: 0.0<|end_message|>' },
    reply: `<|content_thinking|>${REASONING}<|end_message|><|message_model|><|content_text|>${ANSWER}<|end_message|>`,
  },
}[FAMILY.name] ?? { think: `${ASSISTANT}<think>`, chat: `${ASSISTANT}</think>`, reply: `${REASONING}</think>${ANSWER}` };

let server;
before(async () => {
  server = await startServer([], { FAKE_REPLY: FORMAT.reply }, { fake: true });
});
after(async () => { await server.stop(); });

// OpenAI's reasoning_effort where the family's format takes 'high' (descriptor efforts: null = any);
// GLM's template has thinking only on or off, so there the boolean extension turns it on.
const THINK_ON = FAMILY.efforts === null || FAMILY.efforts.includes('high') ? { reasoning_effort: 'high' } : { enable_thinking: true };

const lastPrompt = () => server.fakeFrames().filter((f) => f.cmd === 'SUBMIT').at(-1).prompt;

test('openai: reasoning_content separated, streaming and not', async () => {
  const c = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  const messages = [{ role: 'user', content: 'What is 2+2?' }];
  const r = await c.chat.completions.create({ model: MODEL_ID, messages, ...THINK_ON, max_tokens: 100 });
  assert.ok(lastPrompt().endsWith(FORMAT.think) && lastPrompt().includes(FORMAT.effort?.think ?? ''),
    'thinking mode must end the prompt with the thinking cue');
  assert.equal(r.choices[0].message.content, ANSWER);
  assert.equal(r.choices[0].message.reasoning_content, REASONING);

  const stream = await c.chat.completions.create({ model: MODEL_ID, messages, ...THINK_ON, max_tokens: 100, stream: true });
  let reasoning = '';
  let content = '';
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    reasoning += d.reasoning_content ?? '';
    content += d.content ?? '';
  }
  assert.equal(reasoning, REASONING);
  assert.equal(content, ANSWER);

  await c.chat.completions.create({ model: MODEL_ID, messages, max_tokens: 100 });
  assert.ok(lastPrompt().endsWith(FORMAT.chat) && lastPrompt().includes(FORMAT.effort?.chat ?? ''),
    'chat mode must end the prompt with the chat cue');
});

test('anthropic: thinking block then text block, streaming and not', async () => {
  const c = new Anthropic({ baseURL: server.url, apiKey: 'unused', maxRetries: 0 });
  const req = { model: MODEL_ID, max_tokens: 2048, thinking: { type: 'enabled', budget_tokens: 1024 },
    messages: [{ role: 'user', content: 'What is 2+2?' }] };
  const m = await c.messages.create(req);
  assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(m.content[0].thinking, REASONING);
  assert.equal(m.content[1].text, ANSWER);
  assert.equal(m.stop_reason, 'end_turn');

  const final = await c.messages.stream(req).finalMessage();
  assert.deepEqual(final.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(final.content[0].thinking, REASONING);
  assert.ok(final.content[0].signature, 'a thinking block carries a signature');
  assert.equal(final.content[1].text, ANSWER);
});
