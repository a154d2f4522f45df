// Starts `cairn serve` on a free loopback port for the node tests and stops it again.
// Environment (set by tests/test_node.py): CAIRN = the binary, CAIRN_MODEL = the tiny model dir
// (one per family: every file runs once per family), FAKE_ENGINE = tests/fake_engine.py (a
// scripted engine for replies a random model cannot give). FAMILY is the model's family
// descriptor as `cairn families` prints it (name, turns, truncates, ...), found by the model's
// config.json model_type: the tests take family facts from it, never from names.
import { spawn, execFileSync } from 'node:child_process';
import { readFileSync, existsSync, mkdtempSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const CAIRN = process.env.CAIRN;
export const MODEL = process.env.CAIRN_MODEL;
export const FAKE_ENGINE = process.env.FAKE_ENGINE;
export const MODEL_ID = MODEL ? MODEL.split('/').filter(Boolean).pop() : undefined;
const MODEL_TYPE = MODEL ? JSON.parse(readFileSync(join(MODEL, 'config.json'), 'utf8')).model_type : undefined;
export const FAMILY = MODEL_TYPE && CAIRN
  ? JSON.parse(execFileSync(CAIRN, ['families'], { encoding: 'utf8' })).find((f) => f.model_types.includes(MODEL_TYPE))
  : undefined;
if (MODEL && CAIRN && !FAMILY) throw new Error(`no registered family loads model_type ${MODEL_TYPE}`);

const D = '｜DSML｜';
// Each family's own tool-call syntax (by family name), for replies a scripted engine gives: a random tiny model
// never writes a tool call. reply = what the model writes; result(text) = how the template
// renders a tool's answer in the next prompt; thinkEnd = what closes the reasoning when it is not </think>.
export const TOOL_SYNTAX = {
  deepseek_v4: {
    reply: `Let me check.\n\n<${D}tool_calls>\n<${D}invoke name="get_weather">\n`
      + `<${D}parameter name="city" string="true">Paris</${D}parameter>\n`
      + `<${D}parameter name="days" string="false">3</${D}parameter>\n</${D}invoke>\n</${D}tool_calls>`,
    marker: 'DSML',
    result: (text) => `<tool_result>${text}</tool_result>`,
  },
  // The template renders the content stripped, then each call with no whitespace between tags.
  glm: {
    reply: 'Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>'
      + '<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>',
    marker: 'tool_call',
    result: (text) => `<|observation|><tool_response>${text}</tool_response>`,
  },
  // XTML: the response channel closes, the tools channel holds typed arguments (strings raw,
  // numbers compact JSON); the EOS (<|end_of_msg|>) is not part of the text.
  kimi_k3: {
    reply: 'Let me check.<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
      + '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
      + '<|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|>'
      + '<|close|>tools<|sep|><|close|>message<|sep|>',
    marker: '<|',
    // In thinking mode the prompt leaves the think channel open; the reply closes it and opens the response one.
    thinkEnd: '<|close|>think<|sep|><|open|>response<|sep|>',
    result: (text) => `<|open|>message role="tool" tool="get_weather" index="1"<|sep|>${text}<|close|>message<|sep|><|end_of_msg|>`,
  },
};

export const TOOL = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Weather forecast for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
  },
};

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

const PREFIX_LINE = /^prefix: slot (\d+) reused (\d+)\/(\d+) \((\w+)\)$/gm;
const HANG_GUARD_MS = 60000;    // turns a line that never comes into a failure; no test is timed

// Returns { url, port, log(), fakeFrames(), prefixLines(), prefixLinesUntil(n), stop() }.
export async function startServer(args = [], env = {}, { fake = false } = {}) {
  if (!CAIRN || !MODEL) throw new Error('CAIRN and CAIRN_MODEL must be set (run through tests/test_node.py)');
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'cairn-node-'));
  const fakeLog = join(dir, 'fake.jsonl');
  const argv = ['serve', '-m', MODEL, '--port', String(port), ...args];
  if (fake) argv.push('--engine', FAKE_ENGINE);
  const child = spawn(CAIRN, argv, {
    env: { ...process.env, CAIRN_PREFIX_LOG: '1', FAKE_LOG: fakeLog, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let log = '';
  child.stdout.on('data', (d) => { log += d; });
  child.stderr.on('data', (d) => { log += d; });
  let exited = null;
  child.on('exit', (code) => { exited = code; });
  const url = `http://127.0.0.1:${port}`;
  const prefixLines = () => [...log.matchAll(PREFIX_LINE)]
    .map((m) => ({ slot: +m[1], reused: +m[2], total: +m[3], kind: m[4] }));
  for (let i = 0; ; i++) {
    if (exited !== null) throw new Error(`server exited (${exited}) at start-up:\n${log}`);
    try {
      const r = await fetch(`${url}/health`);
      if (r.status === 200) break;
    } catch { /* not listening yet */ }
    if (i > 1200) throw new Error(`server never became healthy:\n${log}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    url,
    port,
    log: () => log,
    // The engine's own reuse decisions, one per request, in order: [{slot, reused, total, kind}].
    prefixLines,
    // The same once there are at least n. The engine's stderr and the HTTP reply travel separately,
    // so a reply can reach the client before the line its request made the engine write.
    prefixLinesUntil: async (n) => {
      for (let waited = 0; prefixLines().length < n; waited += 10) {
        if (waited > HANG_GUARD_MS) throw new Error(`expected ${n} engine prefix lines:\n${log}`);
        await new Promise((r) => setTimeout(r, 10));
      }
      return prefixLines();
    },
    fakeFrames: () => (existsSync(fakeLog)
      ? readFileSync(fakeLog, 'utf8').trim().split('\n').filter(Boolean).map((l) => JSON.parse(l)) : []),
    stop: () => new Promise((resolve) => {
      if (exited !== null) return resolve(exited);
      child.once('exit', (code) => resolve(code));
      child.kill('SIGTERM');
    }),
  };
}
