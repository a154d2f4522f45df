// Constrained decoding through the official clients on the random tiny model of each family (the
// most adversarial case: unconstrained, its output is noise). Structured outputs: 16 schemas x 200
// seeded generations, every reply parses and validates with ajv. Forced tool calls (OpenAI
// tool_choice required / named, parallel_tool_calls; Anthropic any / tool) come back as tool_calls
// / tool_use whose arguments validate against the tool's schema, streaming and not (thinking mode's
// reasoning-then-call grammar is covered by tests/c/test_tool_grammar.c: free reasoning from a
// random model rarely closes within a test's budget). Bad schemas and
// grammars are 400s that name the field and the keyword.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { mkdtempSync, readdirSync, readFileSync, symlinkSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { startServer, MODEL } from './serve_helper.mjs';

const GENERATIONS = 200;
const SLOTS = 2;
// A tool call costs ~100 tokens in DeepSeek V4's DSML; a random model adds parallel calls freely.
const CALL_BUDGET = 3000;

// Every schema bounds its strings and arrays: a random model never chooses to stop on its own.
const SCHEMAS = {
  flat: { type: 'object', properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 150 }, active: { type: 'boolean' } }, required: ['name', 'age', 'active'], additionalProperties: false },
  nested: { type: 'object', properties: { user: { type: 'object', properties: { id: { type: 'string', format: 'uuid' }, email: { type: 'string', format: 'email' } }, required: ['id', 'email'] }, meta: { type: 'object', properties: { created: { type: 'string', format: 'date-time' } }, required: ['created'] } }, required: ['user', 'meta'] },
  array_of_objects: { type: 'array', minItems: 1, maxItems: 4, items: { type: 'object', properties: { sku: { type: 'string', pattern: '^[A-Z]{3}-\\d{4}$' }, qty: { type: 'integer', minimum: 1, maximum: 99 } }, required: ['sku', 'qty'] } },
  enums: { type: 'object', properties: { color: { enum: ['red', 'green', 'blue'] }, size: { const: 'L' }, level: { enum: [1, 2, 3, null] } }, required: ['color', 'size', 'level'] },
  refs: { $defs: { point: { type: 'object', properties: { x: { type: 'number', minimum: -10, maximum: 10 }, y: { type: 'number', minimum: -10, maximum: 10 } }, required: ['x', 'y'] } }, type: 'object', properties: { a: { $ref: '#/$defs/point' }, b: { $ref: '#/$defs/point' } }, required: ['a', 'b'] },
  recursive: { $defs: { node: { type: 'object', properties: { v: { type: 'integer', minimum: 0, maximum: 9 }, next: { $ref: '#/$defs/node' } }, required: ['v'] } }, $ref: '#/$defs/node' },
  number_bounds: { type: 'object', properties: { p: { type: 'number', exclusiveMinimum: 0, maximum: 1 }, t: { type: 'integer', minimum: -40, exclusiveMaximum: 50 }, big: { type: 'integer', minimum: 1000000 }, f: { type: 'number' } }, required: ['p', 't', 'big', 'f'] },
  type_union: { type: 'object', properties: { v: { type: ['string', 'integer', 'null'], maxLength: 5 } }, required: ['v'] },
  any_of: { type: 'object', properties: { shape: { anyOf: [{ type: 'object', properties: { kind: { const: 'circle' }, r: { type: 'number', minimum: 0, maximum: 100 } }, required: ['kind', 'r'] }, { type: 'object', properties: { kind: { const: 'square' }, side: { type: 'integer', minimum: 1, maximum: 10 } }, required: ['kind', 'side'] }] } }, required: ['shape'] },
  one_of: { type: 'object', properties: { id: { oneOf: [{ type: 'string', maxLength: 6 }, { type: 'integer', minimum: 0 }] }, tagged: { oneOf: [{ type: 'object', properties: { t: { const: 'a' }, n: { type: 'integer', minimum: 0, maximum: 5 } }, required: ['t', 'n'] }, { type: 'object', properties: { t: { const: 'b' }, s: { type: 'string', maxLength: 3 } }, required: ['t', 's'] }] } }, required: ['id', 'tagged'] },
  all_of: { allOf: [{ type: 'object', properties: { a: { type: 'string', maxLength: 4 } }, required: ['a'] }, { properties: { b: { type: 'boolean' } }, required: ['b'] }] },
  tuple: { type: 'array', prefixItems: [{ type: 'string', maxLength: 3 }, { type: 'integer', minimum: 0, maximum: 100 }, { type: 'boolean' }], items: false },
  formats: { type: 'object', properties: { d: { type: 'string', format: 'date' }, t: { type: 'string', format: 'time' }, ip: { type: 'string', format: 'ipv4' } }, required: ['d', 't', 'ip'] },
  optional: { type: 'object', properties: { a: { type: 'integer', minimum: 0, maximum: 9 }, b: { type: 'string', maxLength: 3 }, c: { type: 'array', items: { type: 'boolean' }, maxItems: 3 } }, additionalProperties: false },
  nested_arrays: { type: 'array', maxItems: 3, items: { type: 'array', maxItems: 3, items: { enum: ['x', 'y', 'z'] } } },
  patterns: { type: 'object', properties: { code: { type: 'string', pattern: '^(ab|cd)[0-9]{2}\\.[a-z]?$' }, quoted: { type: 'string', pattern: '^["\\\\\\n]{1,3}$' }, hex: { type: 'string', pattern: '^#[0-9a-fA-F]{6}$' } }, required: ['code', 'quoted', 'hex'] },
};

// Small on purpose: the tiny DeepSeek V4 model has 1024 positions and its tools section is long.
const TOOLS = [
  { type: 'function', function: { name: 'weather', parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 6 }, days: { type: 'integer', minimum: 1, maximum: 7 } }, required: ['city'] } } },
  { type: 'function', function: { name: 'add', parameters: { type: 'object', properties: { xs: { type: 'array', items: { type: 'integer', minimum: -9, maximum: 9 }, minItems: 1, maxItems: 3 } }, required: ['xs'] } } },
];
const TOOL_SCHEMA = Object.fromEntries(TOOLS.map((t) => [t.function.name, t.function.parameters]));
const ANTHROPIC_TOOLS = TOOLS.map((t) => ({ name: t.function.name, input_schema: t.function.parameters }));

const ajv = new Ajv2020({ allErrors: true, strictTypes: false, strictTuples: false });
addFormats(ajv);
const validators = new Map();
function validator(schema) {
  if (!validators.has(schema)) validators.set(schema, ajv.compile(schema));
  return validators.get(schema);
}
function assertValid(schema, value, what) {
  const v = validator(schema);
  assert.ok(v(value), `${what} does not validate: ${JSON.stringify(value)}\n${ajv.errorsText(v.errors)}`);
}

// The tiny DeepSeek V4 model declares 1024 positions and its tools section alone takes ~900 tokens,
// so this file serves the same weights with the position limit raised (config.json only).
function roomyModel() {
  const cfg = JSON.parse(readFileSync(join(MODEL, 'config.json'), 'utf8'));
  if (cfg.max_position_embeddings >= 4096) return MODEL;
  const dir = mkdtempSync(join(tmpdir(), 'cairn-ctx-'));
  for (const f of readdirSync(MODEL)) if (f !== 'config.json') symlinkSync(join(MODEL, f), join(dir, f));
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...cfg, max_position_embeddings: 4096 }));
  return dir;
}
const SERVED = roomyModel();
const MODEL_ID = basename(SERVED);

let server, openai, anthropic;
before(async () => {
  // the gateway's token cap raised to the budget: a forced reply of many calls must not be cut
  server = await startServer(['--slots', String(SLOTS), '--max-tokens', String(CALL_BUDGET)], {}, { model: SERVED });
  openai = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  anthropic = new Anthropic({ baseURL: server.url, apiKey: 'unused', maxRetries: 0 });
});
after(async () => { await server.stop(); if (SERVED !== MODEL) rmSync(SERVED, { recursive: true, force: true }); });

// Run async jobs with at most `width` in flight (one per engine slot).
async function pool(jobs, width = SLOTS) {
  const out = new Array(jobs.length);
  let next = 0;
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < jobs.length) {
      const i = next++;
      out[i] = await jobs[i]();
    }
  }));
  return out;
}

const user = (text) => [{ role: 'user', content: text }];

test(`structured outputs: ${Object.keys(SCHEMAS).length} schemas x ${GENERATIONS} seeded generations all parse and validate`, async () => {
  assert.ok(Object.keys(SCHEMAS).length >= 15);
  for (const [name, schema] of Object.entries(SCHEMAS)) {
    const jobs = Array.from({ length: GENERATIONS }, (_, i) => async () => {
      const r = await openai.chat.completions.create({
        model: MODEL_ID, messages: user(`Give me ${name} #${i}`), max_tokens: 400, temperature: 1, seed: i + 1,
        response_format: { type: 'json_schema', json_schema: { name, schema, strict: true } },
      });
      return r.choices[0];
    });
    const choices = await pool(jobs);
    const distinct = new Set();
    for (const [i, ch] of choices.entries()) {
      assert.equal(ch.finish_reason, 'stop', `${name} seed ${i + 1} did not finish: ${JSON.stringify(ch.message.content)}`);
      let value;
      assert.doesNotThrow(() => { value = JSON.parse(ch.message.content); }, `${name} seed ${i + 1}: ${ch.message.content}`);
      assertValid(schema, value, `${name} seed ${i + 1}`);
      distinct.add(ch.message.content);
    }
    // seeded sampling at temperature 1 explores the grammar: not one answer repeated
    assert.ok(distinct.size > 1, `${name}: every generation was identical`);
  }
});

test('structured outputs stream: the concatenated deltas parse and validate', async () => {
  const schema = SCHEMAS.nested;
  for (let seed = 1; seed <= 10; seed++) {
    const stream = await openai.chat.completions.create({
      model: MODEL_ID, messages: user('nested'), max_tokens: 400, temperature: 1, seed, stream: true,
      response_format: { type: 'json_schema', json_schema: { name: 'nested', schema } },
    });
    let text = '', finish = null;
    for await (const chunk of stream) {
      const ch = chunk.choices[0];
      if (ch?.delta?.content) text += ch.delta.content;
      if (ch?.finish_reason) finish = ch.finish_reason;
    }
    assert.equal(finish, 'stop');
    assertValid(schema, JSON.parse(text), `stream seed ${seed}`);
  }
});

test('json_object: replies that finish are JSON objects', async () => {
  let finished = 0;
  for (let seed = 1; seed <= 20; seed++) {
    const r = await openai.chat.completions.create({
      model: MODEL_ID, messages: user('json please'), max_tokens: 300, temperature: 1, seed,
      response_format: { type: 'json_object' },
    });
    const ch = r.choices[0];
    if (ch.finish_reason !== 'stop') continue;
    finished++;
    const v = JSON.parse(ch.message.content);
    assert.ok(v && typeof v === 'object' && !Array.isArray(v), ch.message.content);
  }
  assert.ok(finished > 0, 'no json_object reply finished within 300 tokens');
});

function checkCalls(calls, { only, single }) {
  assert.ok(calls && calls.length >= 1, 'no tool call');
  if (single) assert.equal(calls.length, 1);
  for (const c of calls) {
    if (only) assert.equal(c.name, only);
    assert.ok(TOOL_SCHEMA[c.name], `unknown tool ${c.name}`);
    assertValid(TOOL_SCHEMA[c.name], c.args, `arguments of ${c.name}`);
  }
}

async function openaiCalls(body, stream) {
  const req = { model: MODEL_ID, messages: user('use a tool'), tools: TOOLS, max_tokens: CALL_BUDGET, temperature: 1, ...body };
  if (!stream) {
    const r = await openai.chat.completions.create(req);
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    return r.choices[0].message.tool_calls.map((c) => ({ name: c.function.name, args: JSON.parse(c.function.arguments) }));
  }
  const s = await openai.chat.completions.create({ ...req, stream: true });
  const calls = [];
  let finish = null;
  for await (const chunk of s) {
    const ch = chunk.choices[0];
    if (ch?.finish_reason) finish = ch.finish_reason;
    for (const d of ch?.delta?.tool_calls ?? []) {
      calls[d.index] ??= { name: '', args: '' };
      if (d.function?.name) calls[d.index].name += d.function.name;
      if (d.function?.arguments) calls[d.index].args += d.function.arguments;
    }
  }
  assert.equal(finish, 'tool_calls');
  return calls.map((c) => ({ name: c.name, args: JSON.parse(c.args) }));
}

for (const stream of [false, true]) {
  test(`openai forced tool calls (${stream ? 'stream' : 'non-stream'}): required, named, parallel_tool_calls false`, async () => {
    for (let seed = 1; seed <= 5; seed++) {
      checkCalls(await openaiCalls({ tool_choice: 'required', seed }, stream), {});
      checkCalls(await openaiCalls({ tool_choice: { type: 'function', function: { name: 'add' } }, seed }, stream), { only: 'add' });
      checkCalls(await openaiCalls({ tool_choice: 'required', parallel_tool_calls: false, seed }, stream), { single: true });
    }
  });
}

test('openai tool_choice auto with parallel_tool_calls false: at most one call', async () => {
  for (let seed = 1; seed <= 10; seed++) {
    const r = await openai.chat.completions.create({
      model: MODEL_ID, messages: user('maybe a tool'), tools: TOOLS, parallel_tool_calls: false, max_tokens: 60,
      temperature: 1, seed,
    });
    assert.ok((r.choices[0].message.tool_calls ?? []).length <= 1);
  }
});

test('tool_choice auto with response_format: the reply is the schema\'s JSON or valid tool calls', async () => {
  const schema = SCHEMAS.flat;
  let json = 0, calls = 0;
  for (let seed = 1; seed <= 12; seed++) {
    const r = await openai.chat.completions.create({
      model: MODEL_ID, messages: user(`answer or call (${seed})`), tools: TOOLS, max_tokens: CALL_BUDGET, temperature: 1, seed,
      response_format: { type: 'json_schema', json_schema: { name: 'flat', schema } },
    });
    const ch = r.choices[0];
    if (ch.message.tool_calls?.length) {
      calls++;
      assert.equal(ch.finish_reason, 'tool_calls');
      checkCalls(ch.message.tool_calls.map((c) => ({ name: c.function.name, args: JSON.parse(c.function.arguments) })), {});
    } else {
      json++;
      assert.equal(ch.finish_reason, 'stop');
      assertValid(schema, JSON.parse(ch.message.content), `seed ${seed}`);
    }
  }
  assert.ok(json + calls === 12);
});


for (const stream of [false, true]) {
  test(`anthropic tool_choice any / tool (${stream ? 'stream' : 'non-stream'}) gives tool_use blocks that validate`, async () => {
    for (let seed = 1; seed <= 4; seed++) {
      for (const tool_choice of [{ type: 'any' }, { type: 'tool', name: 'weather' }, { type: 'any', disable_parallel_tool_use: true }]) {
        const req = { model: MODEL_ID, max_tokens: CALL_BUDGET, messages: user(`use a tool (${seed})`), tools: ANTHROPIC_TOOLS, tool_choice, temperature: 1 };
        const m = stream ? await anthropic.messages.stream(req).finalMessage() : await anthropic.messages.create(req);
        assert.equal(m.stop_reason, 'tool_use');
        const uses = m.content.filter((b) => b.type === 'tool_use').map((b) => ({ name: b.name, args: b.input }));
        checkCalls(uses, { only: tool_choice.name, single: !!tool_choice.disable_parallel_tool_use });
      }
    }
  });
}

// A forced call cut by max_tokens: OpenAI says length and sends the arguments as far as the model
// wrote them (as OpenAI does), Anthropic says max_tokens with the members written completely, the
// Responses API is incomplete — never tool_calls / tool_use with made-up {} arguments. Greedy, so a
// cut reply is a prefix of the uncut one.
test('a forced tool call cut by max_tokens reports the cut and only what was written', async () => {
  // arguments as written so far: they either do not parse yet, or they are the uncut call's
  const asWritten = (args, whole, what) => {
    assert.notEqual(args, '{}', `${what}: made-up empty arguments`);
    let parsed;
    try { parsed = JSON.parse(args); } catch { return 1; }
    assert.deepEqual(parsed, whole, `${what}: complete-looking arguments ${args}`);
    return 0;
  };
  const base = { model: MODEL_ID, messages: user('use the weather tool'), tools: TOOLS, tool_choice: { type: 'function', function: { name: 'weather' } }, temperature: 0 };
  const ant = { model: MODEL_ID, messages: user('use the weather tool'), tools: ANTHROPIC_TOOLS, tool_choice: { type: 'tool', name: 'weather' }, temperature: 0 };
  const whole = await openai.chat.completions.create({ ...base, max_tokens: CALL_BUDGET });
  assert.equal(whole.choices[0].finish_reason, 'tool_calls');
  const calls = whole.choices[0].message.tool_calls.map((c) => ({ name: c.function.name, args: JSON.parse(c.function.arguments) }));
  const wholeA = await anthropic.messages.create({ ...ant, max_tokens: CALL_BUDGET });
  assert.equal(wholeA.stop_reason, 'tool_use');
  const uses = wholeA.content.filter((b) => b.type === 'tool_use');
  const n = Math.min(whole.usage.completion_tokens, wholeA.usage.output_tokens);
  let cutInArgs = 0;
  for (const max_tokens of [1, Math.floor(n / 3), Math.floor(n / 2), Math.floor((3 * n) / 4), n - 1].filter((m, i, a) => m >= 1 && a.indexOf(m) === i)) {
    const what = `max_tokens ${max_tokens} of ${n}`;
    const r = await openai.chat.completions.create({ ...base, max_tokens });
    const ch = r.choices[0];
    assert.equal(ch.finish_reason, 'length', what);
    for (const [i, c] of (ch.message.tool_calls ?? []).entries()) {
      assert.ok(calls[i].name.startsWith(c.function.name), `${what}: ${c.function.name} does not start ${calls[i].name}`);
      cutInArgs += asWritten(c.function.arguments, calls[i].args, `${what} call ${i}`);
    }
    const s = await openai.chat.completions.create({ ...base, max_tokens, stream: true });
    let finish = null;
    const streamed = [];
    for await (const chunk of s) {
      const c = chunk.choices[0];
      if (c?.finish_reason) finish = c.finish_reason;
      for (const d of c?.delta?.tool_calls ?? []) streamed[d.index] = (streamed[d.index] ?? '') + (d.function?.arguments ?? '');
    }
    assert.equal(finish, 'length', what);
    assert.deepEqual(streamed, (ch.message.tool_calls ?? []).map((c) => c.function.arguments), `${what}: stream and not agree`);
    const m = await anthropic.messages.create({ ...ant, max_tokens });
    assert.equal(m.stop_reason, 'max_tokens', what);
    for (const [i, b] of m.content.filter((b) => b.type === 'tool_use').entries()) {
      assert.ok(uses[i].name.startsWith(b.name), what);
      for (const [key, v] of Object.entries(b.input)) assert.deepEqual(v, uses[i].input[key], `${what}: input member ${key} was not written so`);
    }
    const events = await anthropic.messages.create({ ...ant, max_tokens, stream: true });
    let stop = null, block = -1;
    const partial = [];
    for await (const ev of events) {
      if (ev.type === 'message_delta') stop = ev.delta.stop_reason;
      if (ev.type === 'content_block_start' && ev.content_block.type === 'tool_use') partial[++block] = '';
      if (ev.type === 'content_block_delta' && ev.delta.type === 'input_json_delta') partial[block] += ev.delta.partial_json;
    }
    assert.equal(stop, 'max_tokens', what);
    for (const [i, p] of partial.entries()) if (p !== '') asWritten(p, uses[i].input, `${what} anthropic stream block ${i}`);
  }
  assert.ok(cutInArgs > 0, 'no cut fell inside the arguments');
  const resp = await openai.responses.create({ model: MODEL_ID, input: 'Hello', max_output_tokens: 2, temperature: 0 });
  assert.equal(resp.status, 'incomplete');
  assert.equal(resp.incomplete_details.reason, 'max_output_tokens');
  assert.equal(resp.output.at(-1).status, 'incomplete');
});

test('a raw GBNF grammar field constrains chat and completions', async () => {
  const grammar = 'root ::= "id-" [0-9]{3} ("-" [a-z]{2})?';
  for (let seed = 1; seed <= 10; seed++) {
    const r = await openai.chat.completions.create({ model: MODEL_ID, messages: user('id'), max_tokens: 50, temperature: 1, seed, grammar });
    assert.match(r.choices[0].message.content, /^id-[0-9]{3}(-[a-z]{2})?$/);
    const c = await openai.completions.create({ model: MODEL_ID, prompt: 'The id is', max_tokens: 50, temperature: 1, seed, grammar });
    assert.match(c.choices[0].text, /^id-[0-9]{3}(-[a-z]{2})?$/);
  }
});

async function status(path, body) {
  const r = await fetch(`${server.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

test('unsupported schemas, bad grammars and conflicting constraints are 400s naming what is wrong', async () => {
  const chat = (extra) => status('/v1/chat/completions', { model: MODEL_ID, messages: user('x'), max_tokens: 5, ...extra });
  const rf = (schema) => ({ response_format: { type: 'json_schema', json_schema: { name: 's', schema } } });
  const cases = [
    [rf({ type: 'object', patternProperties: { a: {} } }), 'response_format', /patternProperties/],
    [rf({ type: 'string', minLength: 2, pattern: 'a' }), 'response_format', /pattern/],
    [rf({ type: 'array', uniqueItems: true }), 'response_format', /uniqueItems/],
    [rf({ oneOf: [{ type: 'number' }, { type: 'integer' }] }), 'response_format', /oneOf/],
    [rf({ type: 'string', format: 'hostname' }), 'response_format', /hostname/],
    [rf({ type: 'string', pattern: '(?=a)b' }), 'response_format', /lookaround/],
    [rf({ $ref: 'http://example.com/s.json' }), 'response_format', /\$ref/],
    [{ response_format: { type: 'yaml' } }, 'response_format', /yaml/],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'bad name!', schema: {} } } }, 'response_format', /name/],
    [{ grammar: 'root ::= missing' }, 'grammar', /missing/],
    [{ grammar: 'root ::= root "x"' }, 'grammar', /left-recursive/],
    [{ grammar: 'root ::= "a"', response_format: { type: 'json_object' } }, 'response_format', /cannot be combined/],
    [{ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { not: {} } } } } }], tool_choice: 'required' }, 'tools', /'not'/],
  ];
  for (const [extra, param, re] of cases) {
    const r = await chat(extra);
    assert.equal(r.status, 400, JSON.stringify(extra));
    assert.equal(r.body.error.param, param, JSON.stringify(r.body));
    assert.match(r.body.error.message, re);
  }
  const a = await status('/v1/messages', { model: MODEL_ID, max_tokens: 5, messages: user('x'), grammar: 'root ::= (' });
  assert.equal(a.status, 400);
  assert.match(JSON.stringify(a.body), /grammar/);
});
