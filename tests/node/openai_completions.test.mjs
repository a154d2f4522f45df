// /v1/completions through the official `openai` client on the tiny model: token-id prompts,
// logprobs per generated token, and agreement between a text prompt and its token ids.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, MODEL_ID } from './serve_helper.mjs';

let server;
let c;
before(async () => {
  server = await startServer(['--slots', '2']);
  c = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => { await server.stop(); });

const IDS = [0, 17, 300, 301, 42, 99, 512, 7];

test('token-id prompt with logprobs gives one entry per generated token', async () => {
  const r = await c.completions.create({ model: MODEL_ID, prompt: IDS, max_tokens: 6, temperature: 0, logprobs: 3 });
  assert.equal(r.object, 'text_completion');
  const ch = r.choices[0];
  assert.equal(r.usage.prompt_tokens, IDS.length);
  assert.equal(r.usage.completion_tokens, 6);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
  const lp = ch.logprobs;
  assert.equal(lp.tokens.length, 6);
  assert.equal(lp.token_logprobs.length, 6);
  assert.equal(lp.top_logprobs.length, 6);
  assert.equal(lp.tokens.join(''), ch.text);
  for (let i = 0; i < 6; i++) {
    assert.ok(lp.token_logprobs[i] <= 0, `logprob ${lp.token_logprobs[i]} > 0`);
    const alts = Object.values(lp.top_logprobs[i]);
    assert.ok(alts.length >= 1 && alts.length <= 3, `top_logprobs[${i}] has ${alts.length} entries`);
    // Greedy decoding: the chosen token is the most likely one.
    assert.ok(Math.abs(Math.max(...alts) - lp.token_logprobs[i]) < 1e-5, `token ${i} is not the argmax`);
    if (i > 0) assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
  }
});

test('the same ids as a nested list and a repeated request agree', async () => {
  const a = await c.completions.create({ model: MODEL_ID, prompt: IDS, max_tokens: 5, temperature: 0 });
  const b = await c.completions.create({ model: MODEL_ID, prompt: [IDS], max_tokens: 5, temperature: 0 });
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.ok(b.usage.prompt_tokens_details.cached_tokens >= 0);
});

test('a text prompt works and honours max_tokens', async () => {
  const r = await c.completions.create({ model: MODEL_ID, prompt: 'Once upon a time', max_tokens: 4, temperature: 0 });
  assert.equal(r.usage.completion_tokens, 4);
  assert.equal(r.choices[0].finish_reason, 'length');
});

test('bad token ids and unsupported options are 400s the client surfaces', async () => {
  await assert.rejects(c.completions.create({ model: MODEL_ID, prompt: [1, 2, 1e9], max_tokens: 2 }),
    (e) => e.status === 400 && /token ids/.test(e.message));
  await assert.rejects(c.completions.create({ model: MODEL_ID, prompt: 'x', max_tokens: 2, echo: true, logprobs: 1 }),
    (e) => e.status === 400 && e.param === 'echo');
  const echoed = await c.completions.create({ model: MODEL_ID, prompt: 'x', max_tokens: 2, echo: true });
  assert.ok(echoed.choices[0].text.startsWith('x'));
  await assert.rejects(c.completions.create({ model: 'not-this-one', prompt: 'x', max_tokens: 2 }),
    (e) => e.status === 404);
});

test('streamed completion equals the non-streamed one and ends with usage', async () => {
  const params = { model: MODEL_ID, prompt: IDS, max_tokens: 6, temperature: 0 };
  const plain = await c.completions.create(params);
  const stream = await c.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'text_completion');
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices) text += ch.text;
  }
  assert.equal(text, plain.choices[0].text);
  assert.equal(usage.completion_tokens, plain.usage.completion_tokens);

  const withLp = await c.completions.create({ ...params, logprobs: 2 });
  const lpStream = await c.completions.create({ ...params, logprobs: 2, stream: true });
  const tokens = [];
  const lps = [];
  const offsets = [];
  for await (const chunk of lpStream) {
    for (const ch of chunk.choices) {
      tokens.push(...(ch.logprobs?.tokens ?? []));
      lps.push(...(ch.logprobs?.token_logprobs ?? []));
      offsets.push(...(ch.logprobs?.text_offset ?? []));
    }
  }
  assert.deepEqual(tokens, withLp.choices[0].logprobs.tokens);
  assert.deepEqual(lps, withLp.choices[0].logprobs.token_logprobs);
  assert.deepEqual(offsets, withLp.choices[0].logprobs.text_offset);
  assert.equal(typeof usage.prompt_tokens_details.cached_tokens, 'number');
});
