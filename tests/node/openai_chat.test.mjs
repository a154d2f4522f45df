// Five-turn chats through the official `openai` client, streaming and not, on the tiny model of
// each family: cached_tokens is present on every turn, equal to the engine's own reuse count (its
// CAIRN_PREFIX_LOG line) and from turn 2 the previous turn's whole record (followTurn), and every
// reply equals what a cold engine fed the same ids answers (a fresh server given only the warm
// server's reply ids, README "Replies are reused too").
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { copyFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer, MODEL_ID } from './serve_helper.mjs';

const QUESTIONS = ['Hello, who are you?', 'What is 2+2?', 'Name a colour.', 'And a number?', 'Thanks, bye.'];
const SYSTEM = { role: 'system', content: 'You are a terse assistant.' };
const PARAMS = { model: MODEL_ID, max_tokens: 8, temperature: 0 };

let warm;
const warmReplies = [];          // turn -> reply text from the non-streaming run
const warmFinish = [];

const warmKv = mkdtempSync(join(tmpdir(), 'cairn-warm-kv-'));
before(async () => { warm = await startServer(['--slots', '2', '--kv-dir', warmKv]); });
after(async () => { await warm.stop(); rmSync(warmKv, { recursive: true, force: true }); });

function client(server) {
  return new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
}

// The reuse of a turn that follows prev ({total: its prompt tokens, completion, finish}) in the
// same slot: the record holds prev's prompt and the fed reply (all of it after an EOS, all but the
// unfed last token after max_tokens), and the new prompt carries the reply as the ids the engine
// generated (--reply-ids, on by default), so the whole record is reused on every family.
function followTurn(reused, prev) {
  const record = prev.total + prev.completion - (prev.finish === 'length' ? 1 : 0);
  assert.equal(reused, record, `reuse ${reused} is not the previous turn's record (${record})`);
}

// The engine's reuse decision for the request just answered.
async function lastReuse(server, requestsSoFar) {
  const lines = await server.prefixLinesUntil(requestsSoFar);
  assert.equal(lines.length, requestsSoFar, `expected ${requestsSoFar} engine prefix lines:\n${server.log()}`);
  return lines[lines.length - 1];
}

test('non-streaming chat over 5 turns reports the engine reuse and grows it', async () => {
  const c = client(warm);
  const messages = [SYSTEM];
  let prevCached = -1;
  let prev = null;
  for (let turn = 0; turn < QUESTIONS.length; turn++) {
    messages.push({ role: 'user', content: QUESTIONS[turn] });
    const r = await c.chat.completions.create({ ...PARAMS, messages });
    const reply = r.choices[0].message.content;
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(typeof reply, 'string');
    assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
    if (r.usage.completion_tokens < 8) assert.equal(r.choices[0].finish_reason, 'stop');
    warmFinish.push(r.choices[0].finish_reason);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    const cached = r.usage.prompt_tokens_details.cached_tokens;
    const engine = await lastReuse(warm, turn + 1);
    assert.equal(cached, engine.reused, 'cached_tokens must be the engine reuse count');
    assert.equal(r.usage.prompt_tokens, engine.total);
    if (turn === 0) assert.equal(cached, 0);
    else {
      assert.ok(cached > 0, `turn ${turn + 1} reused nothing`);
      assert.ok(cached > prevCached, `reuse did not grow on turn ${turn + 1}: ${cached} <= ${prevCached}`);
      followTurn(cached, prev);
    }
    prevCached = cached;
    prev = { total: r.usage.prompt_tokens, completion: r.usage.completion_tokens, finish: r.choices[0].finish_reason };
    warmReplies.push(reply);
    messages.push({ role: 'assistant', content: reply });
  }
});

test('streaming chat over 5 turns gives the same replies and usage with cached_tokens', async () => {
  const server = await startServer(['--slots', '2']);
  try {
    const c = client(server);
    const messages = [SYSTEM];
    let prev = null;
    for (let turn = 0; turn < QUESTIONS.length; turn++) {
      messages.push({ role: 'user', content: QUESTIONS[turn] });
      const stream = await c.chat.completions.create({
        ...PARAMS, messages, stream: true, stream_options: { include_usage: true },
      });
      let text = '';
      let usage = null;
      let finish = null;
      let first = true;
      for await (const chunk of stream) {
        assert.equal(chunk.object, 'chat.completion.chunk');
        if (chunk.usage) usage = chunk.usage;
        if (!chunk.choices.length) continue;
        if (first) { assert.equal(chunk.choices[0].delta.role, 'assistant'); first = false; }
        text += chunk.choices[0].delta.content ?? '';
        finish = chunk.choices[0].finish_reason ?? finish;
      }
      assert.equal(finish, warmFinish[turn]);
      assert.ok(usage, 'include_usage must give a usage chunk');
      const engine = await lastReuse(server, turn + 1);
      assert.equal(usage.prompt_tokens_details.cached_tokens, engine.reused);
      if (turn > 0) {
        assert.ok(engine.reused > 0, `streaming turn ${turn + 1} reused nothing`);
        followTurn(engine.reused, prev);
      }
      prev = { total: usage.prompt_tokens, completion: usage.completion_tokens, finish };
      assert.equal(text, warmReplies[turn], `streamed reply of turn ${turn + 1} differs from the non-streamed one`);
      messages.push({ role: 'assistant', content: text });
    }
  } finally {
    await server.stop();
  }
});

test('every warm reply equals a cold engine fed the same ids', async () => {
  const messages = [SYSTEM];
  for (let turn = 0; turn < QUESTIONS.length; turn++) {
    messages.push({ role: 'user', content: QUESTIONS[turn] });
    const coldKv = mkdtempSync(join(tmpdir(), 'cairn-cold-kv-'));
    copyFileSync(join(warmKv, 'reply_ids'), join(coldKv, 'reply_ids'));
    const cold = await startServer(['--slots', '1', '--kv-dir', coldKv]);
    try {
      const r = await client(cold).chat.completions.create({ ...PARAMS, messages });
      assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0, 'a cold server cannot reuse');
      assert.equal(r.choices[0].message.content, warmReplies[turn], `turn ${turn + 1}: warm and cold differ`);
    } finally {
      await cold.stop();
      rmSync(coldKv, { recursive: true, force: true });
    }
    messages.push({ role: 'assistant', content: warmReplies[turn] });
  }
});

test('two conversations alternating on two slots both keep reusing', async () => {
  const c = client(warm);
  const convs = [[{ role: 'system', content: 'Conversation A.' }], [{ role: 'system', content: 'Conversation B is another one.' }]];
  const before = warm.prefixLines().length;
  const prev = [null, null];
  for (let turn = 0; turn < 3; turn++) {
    for (const [k, msgs] of convs.entries()) {
      msgs.push({ role: 'user', content: `turn ${turn} of ${k}` });
      const r = await c.chat.completions.create({ ...PARAMS, messages: msgs });
      msgs.push({ role: 'assistant', content: r.choices[0].message.content });
      const engine = await lastReuse(warm, before + 2 * turn + k + 1);
      if (turn > 0) {
        assert.ok(r.usage.prompt_tokens_details.cached_tokens > 0, `conversation ${k} lost its state on turn ${turn}`);
        // It kept what followTurn allows on top of its own previous turn, which only its own slot holds.
        followTurn(engine.reused, prev[k]);
      }
      prev[k] = { total: r.usage.prompt_tokens, completion: r.usage.completion_tokens, finish: r.choices[0].finish_reason };
    }
  }
  const slots = warm.prefixLines().slice(before).map((l) => l.slot);
  assert.deepEqual(slots.filter((_, i) => i % 2 === 0), [slots[0], slots[0], slots[0]]);
  assert.deepEqual(slots.filter((_, i) => i % 2 === 1), [slots[1], slots[1], slots[1]]);
  assert.notEqual(slots[0], slots[1]);
});

test('stop strings end the reply early and never reach the client', async () => {
  const c = client(warm);
  const messages = [SYSTEM, { role: 'user', content: QUESTIONS[0] }];
  const full = await c.chat.completions.create({ ...PARAMS, messages, max_tokens: 8 });
  const text = full.choices[0].message.content;
  const cut = [...text].slice(2, 4).join('');
  assert.ok(cut.length > 0);
  const r = await c.chat.completions.create({ ...PARAMS, messages, max_tokens: 8, stop: [cut] });
  assert.equal(r.choices[0].message.content, text.slice(0, text.indexOf(cut)));
  assert.equal(r.choices[0].finish_reason, 'stop');
});

test('models endpoint lists the served model', async () => {
  const list = await client(warm).models.list();
  const ids = [];
  for await (const m of list) ids.push(m.id);
  assert.deepEqual(ids, [MODEL_ID]);
});

test('chat logprobs: one entry per generated token, alternatives sorted, greedy picks the best', async () => {
  const r = await client(warm).chat.completions.create({
    ...PARAMS, messages: [SYSTEM, { role: 'user', content: 'logprobs please' }], max_tokens: 5, logprobs: true, top_logprobs: 3,
  });
  const entries = r.choices[0].logprobs.content;
  assert.equal(entries.length, r.usage.completion_tokens);
  for (const e of entries) {
    assert.ok(e.logprob <= 0);
    assert.ok(e.top_logprobs.length >= 1 && e.top_logprobs.length <= 3);
    const lps = e.top_logprobs.map((a) => a.logprob);
    assert.deepEqual(lps, [...lps].sort((a, b) => b - a), 'alternatives must be sorted best first');
    assert.ok(Math.abs(lps[0] - e.logprob) < 1e-5, 'greedy token is not the most likely one');
  }
  // Streaming hands out the same entries, spread over the chunks.
  const stream = await client(warm).chat.completions.create({
    ...PARAMS, messages: [SYSTEM, { role: 'user', content: 'logprobs please' }], max_tokens: 5, logprobs: true,
    top_logprobs: 3, stream: true,
  });
  const streamed = [];
  for await (const chunk of stream) streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
  assert.deepEqual(streamed, entries);
});
