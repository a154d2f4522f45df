// /v1/messages through the official `@anthropic-ai/sdk` client on the tiny model: streaming and
// not, multi-turn with cache_read_input_tokens from the engine, the same text either way.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, MODEL_ID } from './serve_helper.mjs';

let server;
let c;
before(async () => {
  server = await startServer(['--slots', '2']);
  c = new Anthropic({ baseURL: server.url, apiKey: 'unused', maxRetries: 0 });
});
after(async () => { await server.stop(); });

const PARAMS = { model: MODEL_ID, max_tokens: 6, temperature: 0, system: 'Be brief.' };
const TURNS = ['Hi there', 'How are you?', 'Tell me a word.'];

test('messages: non-streaming and streaming agree, cache reads come from the engine', async () => {
  const plain = [];
  const reasons = [];
  const messages = [];
  for (const [i, q] of TURNS.entries()) {
    messages.push({ role: 'user', content: q });
    const m = await c.messages.create({ ...PARAMS, messages });
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.ok(m.usage.output_tokens >= 1 && m.usage.output_tokens <= 6);
    if (m.usage.output_tokens < 6) assert.equal(m.stop_reason, 'end_turn');
    else assert.ok(['max_tokens', 'end_turn'].includes(m.stop_reason));
    assert.equal(m.content[0].type, 'text');
    const engine = (await server.prefixLinesUntil(i + 1))[i];
    assert.equal(m.usage.cache_read_input_tokens, engine.reused);
    assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, engine.total);
    if (i > 0) assert.ok(m.usage.cache_read_input_tokens > 0, `turn ${i + 1} reused nothing`);
    plain.push(m.content[0].text);
    reasons.push(m.stop_reason);
    messages.push({ role: 'assistant', content: m.content[0].text });
  }

  const streamed = await startServer(['--slots', '1']);
  try {
    const s = new Anthropic({ baseURL: streamed.url, apiKey: 'unused', maxRetries: 0 });
    const msgs = [];
    for (const [i, q] of TURNS.entries()) {
      msgs.push({ role: 'user', content: q });
      const events = [];
      const stream = s.messages.stream({ ...PARAMS, messages: msgs });
      stream.on('streamEvent', (e) => events.push(e.type));
      const final = await stream.finalMessage();
      assert.equal(events[0], 'message_start');
      assert.equal(events.at(-1), 'message_stop');
      assert.ok(events.includes('content_block_delta'));
      assert.equal(final.content[0].text, plain[i], `streamed turn ${i + 1} differs`);
      assert.equal(final.stop_reason, reasons[i]);
      const engine = (await streamed.prefixLinesUntil(i + 1))[i];
      assert.equal(final.usage.cache_read_input_tokens, engine.reused);
      if (i > 0) assert.ok(final.usage.cache_read_input_tokens > 0);
      msgs.push({ role: 'assistant', content: final.content[0].text });
    }
  } finally {
    await streamed.stop();
  }
});

test('messages: stop_sequences end the reply and are reported', async () => {
  const messages = [{ role: 'user', content: TURNS[0] }];
  const full = await c.messages.create({ ...PARAMS, messages });
  const text = full.content[0].text;
  const stop = [...text].slice(1, 3).join('');
  const m = await c.messages.create({ ...PARAMS, messages, stop_sequences: [stop] });
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, stop);
  assert.equal(m.content[0].text, text.slice(0, text.indexOf(stop)));
});

test('messages: errors come back in the Anthropic shape', async () => {
  await assert.rejects(c.messages.create({ model: 'claude-nope', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e.status === 404 && e.error?.type === 'error' && e.error?.error?.type === 'not_found_error');
  await assert.rejects(c.messages.create({ ...PARAMS, messages: [{ role: 'system', content: 'x' }] }),
    (e) => e.status === 400 && e.error?.error?.type === 'invalid_request_error');
});
