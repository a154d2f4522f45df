// Anthropic thinking.budget_tokens through the official `@anthropic-ai/sdk` client on the tiny
// model (the real engine). A reply that runs past the budget must come back as a thinking block
// closed the family's way and then a text block (the answer written after the forced close); one
// that ends before it (the random GLM model samples one of its three end ids within a few hundred
// tokens; DeepSeek V4's tiny model has 1024 positions, so its slot fills first) must end on its
// own, its reasoning never cut. Kimi K3's greedy reply runs past the budget, so there the forced
// close is seen through the SDK; the exact counts on every family are asserted over the engine
// protocol (tests/test_think_budget.py). Every family: the same request twice is identical, the
// next turn's cache read is the engine's reuse, and budgets the Messages API refuses are a 400 the
// SDK raises as BadRequestError. (Thinking replies are not in the gateway's reply-id memory, so a
// history re-tokenizes the reasoning text; the engine-level test feeds the emitted ids back and
// sees the whole record reused.)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, MODEL_ID, FAMILY } from './serve_helper.mjs';

const BUDGET = 1024;
const MAX = BUDGET + 40;
// A family whose model opens reasoning itself (tool_example.think_start) rarely does so at random.
const CUE_OPENS = !FAMILY.tool_example?.think_start;

let server;
let c;
before(async () => {
  server = await startServer(['--max-tokens', String(MAX), '--slots', '1']);   // one slot: every turn meets the state
  c = new Anthropic({ baseURL: server.url, apiKey: 'unused', maxRetries: 0 });
});
after(async () => { await server.stop(); });

const ASK = [{ role: 'user', content: 'What is 2+2?' }];
const REQ = { model: MODEL_ID, max_tokens: MAX, temperature: 0, thinking: { type: 'enabled', budget_tokens: BUDGET } };

test('a reply past the budget has its reasoning closed and an answer; warm == cold; the next turn reuses it', async () => {
  const m = await c.messages.create({ ...REQ, messages: ASK });
  const types = m.content.map((b) => b.type);
  assert.ok(m.usage.output_tokens <= MAX);
  if (m.usage.output_tokens > BUDGET && (CUE_OPENS || types.includes('thinking'))) {
    assert.equal(types[0], 'thinking', 'the reply starts in reasoning');
    assert.ok(types.includes('text'), `reasoning closed at the budget, an answer after it: ${types}`);
  } else {
    assert.ok(m.usage.output_tokens <= BUDGET || !types.includes('thinking'), 'nothing to force');
    assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason), m.stop_reason);
  }

  const again = await c.messages.create({ ...REQ, messages: ASK });
  assert.deepEqual(again.content, m.content, 'the same request twice gives the same reply');

  const next = [...ASK, { role: 'assistant', content: m.content }, { role: 'user', content: 'And 3+3?' }];
  const m2 = await c.messages.create({ ...REQ, messages: next });
  const engine = (await server.prefixLinesUntil(3))[2];
  assert.equal(m2.usage.cache_read_input_tokens, engine.reused, 'the cache read is the engine reuse');
  assert.ok(engine.reused > 0, 'the second turn continues from the engine state');
});

test('budgets the Messages API refuses are a 400 naming thinking.budget_tokens', async () => {
  for (const [thinking, max] of [[{ type: 'enabled', budget_tokens: 1000 }, MAX], [{ type: 'enabled', budget_tokens: MAX }, MAX]]) {
    await assert.rejects(c.messages.create({ model: MODEL_ID, max_tokens: max, thinking, messages: ASK }), (e) => {
      assert.ok(e instanceof Anthropic.BadRequestError, String(e));
      assert.match(e.message, /thinking\.budget_tokens/);
      return true;
    });
  }
});
