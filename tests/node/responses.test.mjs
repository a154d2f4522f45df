// The Responses API through the official `openai` client's `responses` resource, on the tiny model
// of each family: text replies with instructions, a previous_response_id chain that reuses the
// whole previous turn every time (the stored response's exact ids), the streamed event sequence,
// retrieve / delete / store:false, function calls (scripted engine: a random model never writes
// one) and their results, and the fields this server refuses with a 400.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, MODEL_ID, FAMILY, TOOL_SYNTAX } from './serve_helper.mjs';

const SYNTAX = TOOL_SYNTAX;

const MAX = 8;
let server;
before(async () => { server = await startServer(['--slots', '2']); });
after(async () => { await server.stop(); });

function client(s) { return new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused', maxRetries: 0 }); }

// The engine's record after a response: its prompt and every fed output token (a reply cut by the
// budget left its last token unfed).
function record(r) {
  return r.usage.input_tokens + r.usage.output_tokens - (r.usage.output_tokens === MAX ? 1 : 0);
}

test('text, instructions and a previous_response_id chain that reuses the whole previous turn', async () => {
  const c = client(server);
  let prev = null;
  for (let turn = 0; turn < 5; turn++) {
    const r = await c.responses.create({
      model: MODEL_ID, input: `Question ${turn}?`, max_output_tokens: MAX, temperature: 0,
      instructions: 'Answer briefly.', ...(prev ? { previous_response_id: prev.id } : {}),
    });
    assert.equal(r.object, 'response');
    assert.ok(r.id.startsWith('resp_'));
    assert.ok(['completed', 'incomplete'].includes(r.status));
    if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');
    const msg = r.output.find((o) => o.type === 'message');
    assert.equal(msg.role, 'assistant');
    assert.equal(msg.content[0].type, 'output_text');
    assert.equal(r.output_text, msg.content[0].text, 'the SDK joins output_text the same way');
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
    const cached = r.usage.input_tokens_details.cached_tokens;
    if (prev) assert.equal(cached, record(prev), `turn ${turn + 1} did not reuse the whole previous turn`);
    else assert.equal(cached, 0);
    assert.equal(r.previous_response_id, prev ? prev.id : null);
    prev = r;
  }
  const again = await c.responses.retrieve(prev.id);
  assert.deepEqual(again.output, prev.output);
  assert.equal(again.usage.input_tokens, prev.usage.input_tokens);
});

test('streamed events arrive in order and add up to the final response', async () => {
  const c = client(server);
  const first = await c.responses.create({ model: MODEL_ID, input: 'Hello', max_output_tokens: MAX, temperature: 0 });
  const stream = await c.responses.create({
    model: MODEL_ID, input: 'And then?', previous_response_id: first.id, max_output_tokens: MAX, temperature: 0,
    stream: true,
  });
  const types = [];
  let text = '';
  let done = null;
  let seq = -1;
  for await (const ev of stream) {
    types.push(ev.type);
    assert.ok(ev.sequence_number > seq, 'sequence numbers grow');
    seq = ev.sequence_number;
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') done = ev.response;
  }
  assert.deepEqual(types.slice(0, 2), ['response.created', 'response.in_progress']);
  for (const t of ['response.output_item.added', 'response.content_part.added', 'response.output_text.done',
    'response.content_part.done', 'response.output_item.done']) assert.ok(types.includes(t), `${t} missing: ${types}`);
  assert.ok(done, `no final event: ${types}`);
  assert.equal(text, done.output.find((o) => o.type === 'message').content[0].text);
  assert.equal(done.usage.input_tokens_details.cached_tokens, record(first));
});

test('retrieve, delete and store:false', async () => {
  const c = client(server);
  const kept = await c.responses.create({ model: MODEL_ID, input: 'keep me', max_output_tokens: 2 });
  const gone = await c.responses.create({ model: MODEL_ID, input: 'do not keep', max_output_tokens: 2, store: false });
  assert.equal(gone.store, false);
  await assert.rejects(c.responses.retrieve(gone.id), (e) => e.status === 404);
  assert.equal((await c.responses.retrieve(kept.id)).id, kept.id);
  await c.responses.delete(kept.id);
  await assert.rejects(c.responses.retrieve(kept.id), (e) => e.status === 404);
  await assert.rejects(c.responses.create({ model: MODEL_ID, input: 'x', previous_response_id: kept.id }),
    (e) => e.status === 404);
});

test('fields this server cannot honour are a 400 naming them', async () => {
  const c = client(server);
  const cases = [
    [{ tool_choice: 'required', tools: [{ type: 'function', name: 'f', parameters: { type: 'object' } }] }, 'tool_choice'],
    [{ text: { format: { type: 'json_object' } } }, 'text'],
    [{ tools: [{ type: 'web_search' }] }, 'tools'],
    [{ include: ['message.output_text.logprobs'] }, 'include'],
    [{ input: [{ type: 'input_image', image_url: 'x' }] }, 'input'],
    [{ frobnicate: 1 }, 'frobnicate'],
  ];
  for (const [extra, param] of cases) {
    await assert.rejects(c.responses.create({ model: MODEL_ID, input: 'x', max_output_tokens: 2, ...extra }),
      (e) => e.status === 400 && e.param === param, JSON.stringify(extra));
  }
});

test('function calls come out as function_call items and their outputs go back in', async () => {
  const fake = await startServer(['--slots', '1'], { FAKE_REPLY: SYNTAX.reply }, { fake: true });
  try {
    const c = client(fake);
    const tools = [{
      type: 'function', name: 'get_weather', description: 'Weather forecast for a city',
      parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } } },
    }];
    const r = await c.responses.create({ model: MODEL_ID, input: 'Weather in Paris?', tools, max_output_tokens: 200 });
    const call = r.output.find((o) => o.type === 'function_call');
    assert.ok(call, JSON.stringify(r.output));
    assert.equal(call.name, 'get_weather');
    assert.deepEqual(JSON.parse(call.arguments), { city: 'Paris', days: 3 });
    assert.ok(call.call_id);
    const next = await c.responses.create({
      model: MODEL_ID, previous_response_id: r.id, tools, max_output_tokens: 20,
      input: [{ type: 'function_call_output', call_id: call.call_id, output: 'sunny' }],
    });
    assert.equal(next.object, 'response');
    const submits = fake.fakeFrames().filter((f) => f.cmd === 'SUBMIT');
    const last = submits[submits.length - 1].prompt;
    assert.ok(last.includes(SYNTAX.result('sunny')), last);
    assert.ok(last.startsWith(submits[submits.length - 2].prompt + SYNTAX.reply), 'the next prompt extends prompt + reply');
  } finally {
    await fake.stop();
  }
});
