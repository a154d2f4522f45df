// Starts `cairn serve` on a free loopback port for the node tests and stops it again.
// Environment (set by tests/test_node.py): CAIRN = the binary, CAIRN_MODEL = the tiny model dir
// (one per family: every file runs once per family), FAKE_ENGINE = tests/fake_engine.py (a
// scripted engine for replies a random model cannot give). FAMILY is the model's family
// descriptor as `cairn families` prints it (name, turns, truncates, ...), found by the model's
// config.json model_type: the tests take family facts from it, never from names.
import { spawn, execFileSync } from 'node:child_process';
import { readFileSync, existsSync, mkdtempSync, rmSync } from 'node:fs';
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

// The family's tool-call syntax from its descriptor (`cairn families` tool_example, chat.h), for
// replies a scripted engine gives: a random tiny model never writes a tool call. reply = what the
// model writes for get_weather(city="Paris", days=3); result(text) = how the template renders a
// tool's answer in the next prompt; thinkEnd = what closes the reasoning when it is not </think>,
// thinkStart = what opens it when the prompt's cue does not. Undefined for a family without one.
const EXAMPLE = FAMILY?.tool_example;
export const TOOL_SYNTAX = EXAMPLE && {
  reply: EXAMPLE.reply,
  marker: EXAMPLE.marker,
  result: (text) => EXAMPLE.result.replace('%s', text),
  thinkStart: EXAMPLE.think_start ?? undefined,
  thinkEnd: EXAMPLE.think_end ?? undefined,
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

// Returns { url, port, log(), fakeFrames(), prefixLines(), prefixLinesUntil(n), stop() }. `model`
// serves another model directory than CAIRN_MODEL.
export async function startServer(args = [], env = {}, { fake = false, model = MODEL } = {}) {
  if (!CAIRN || !MODEL) throw new Error('CAIRN and CAIRN_MODEL must be set (run through tests/test_node.py)');
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'cairn-node-'));
  const fakeLog = join(dir, 'fake.jsonl');
  const argv = ['serve', '-m', model, '--port', String(port), ...args];
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
    // Ends the server and removes its scratch directory (the fake engine's log).
    stop: () => new Promise((resolve) => {
      const done = (code) => { rmSync(dir, { recursive: true, force: true }); resolve(code); };
      if (exited !== null) return done(exited);
      child.once('exit', done);
      child.kill('SIGTERM');
    }),
  };
}
