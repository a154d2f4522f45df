// app.js — the chat page cairn serves at /. Plain DOM, no framework.
//
// What it is for: chatting with the model, and seeing the reuse the engine does. Every assistant
// message carries `prompt N · reused M · TTFT x s · y tok/s` (N and M from the reply's usage, TTFT
// measured here from sending to the first token, y the engine's decode speed from the reply's
// `timings`), and the panel charts each turn's TTFT beside an estimate of what a cold start on
// the same prompt would have cost: the turn's TTFT with its own prefill time (timings.prompt_ms)
// replaced by the engine's measured cost of prefilling the whole prompt (prefill_model).
//
// Invariants:
//  - Model output reaches the DOM only through the markdown renderer and DOMPurify (render_md),
//    or as textContent. Nothing else is ever assigned to innerHTML. Images in it are never loaded.
//  - Conversations live in localStorage (STORE_KEY) and are saved after every change, so a
//    reload shows exactly what was on screen (a reply cut off by the reload is kept as stopped).
//  - Every promise is awaited inside a try or has a catch: the page never leaves an unhandled
//    rejection, whatever the server answers.
import { marked } from './vendor/marked.esm.js';
import DOMPurify from './vendor/purify.es.mjs';

const STORE_KEY = 'cairn.conversations.v1';
const SETTINGS_KEY = 'cairn.settings.v1';
const KEY_KEY = 'cairn.apiKey';
const $ = (id) => document.getElementById(id);
const fmt = new Intl.NumberFormat('en-US');

// ---- state -----------------------------------------------------------------------------------

const store = load_store();
const settings = Object.assign({ temperature: 0.7, max_tokens: 512, seed: '', thinking: false, tools: '' },
  read_json(SETTINGS_KEY));
let api_key = localStorage.getItem(KEY_KEY) || '';
let model_id = null;
let prefill_rate = null;      // tokens per second over every prefill the engine ran (/metrics)
let running = null;           // { conv, msg, controller } while a reply streams
const views = new WeakMap();  // assistant message -> its element, to redraw it while it streams

function read_json(key) {
  try { return JSON.parse(localStorage.getItem(key)) || {}; } catch { return {}; }
}

function new_id() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

function new_conv() {
  return { id: new_id(), title: 'New chat', created: Date.now(), updated: Date.now(), system: '', messages: [] };
}

// A stored or imported conversation, reduced to the fields the page knows (anything else dropped).
function clean_conv(c) {
  if (!c || typeof c !== 'object' || !Array.isArray(c.messages)) return null;
  const msgs = [];
  for (const m of c.messages) {
    if (!m || !['user', 'assistant', 'tool'].includes(m.role) || typeof (m.content ?? '') !== 'string') return null;
    const x = { role: m.role, content: m.content ?? '' };
    if (m.role === 'assistant') {
      x.reasoning = typeof m.reasoning === 'string' ? m.reasoning : '';
      x.tool_calls = Array.isArray(m.tool_calls) ? m.tool_calls.filter((t) => t && t.function
        && typeof t.function.name === 'string') : [];
      x.stats = m.stats && typeof m.stats === 'object' ? m.stats : {};
    }
    if (m.role === 'tool') x.tool_call_id = String(m.tool_call_id ?? '');
    msgs.push(x);
  }
  return {
    id: typeof c.id === 'string' ? c.id : new_id(),
    title: typeof c.title === 'string' && c.title.trim() ? c.title.slice(0, 200) : 'Chat',
    created: Number(c.created) || Date.now(),
    updated: Number(c.updated) || Date.now(),
    system: typeof c.system === 'string' ? c.system : '',
    messages: msgs,
  };
}

function load_store() {
  const s = read_json(STORE_KEY);
  const convs = (Array.isArray(s.convs) ? s.convs : []).map(clean_conv).filter(Boolean);
  if (!convs.length) convs.push(new_conv());
  const current = convs.some((c) => c.id === s.current) ? s.current : convs[0].id;
  return { convs, current };
}

function save() {
  try {
    localStorage.setItem(STORE_KEY, JSON.stringify(store));
  } catch (e) {
    note(`Could not save conversations in this browser: ${e.message}`);
  }
}

function save_settings() {
  localStorage.setItem(SETTINGS_KEY, JSON.stringify(settings));
}

const current = () => store.convs.find((c) => c.id === store.current);

// ---- server ----------------------------------------------------------------------------------

function headers() {
  const h = { 'Content-Type': 'application/json' };
  if (api_key) h.Authorization = `Bearer ${api_key}`;
  return h;
}

// The message of an error reply in either API's envelope, or the status line.
async function error_text(res) {
  try {
    const j = await res.json();
    return j?.error?.message || `HTTP ${res.status}`;
  } catch {
    return `HTTP ${res.status} ${res.statusText}`;
  }
}

async function connect() {
  set_status('connecting', 'connecting…');
  try {
    const res = await fetch('v1/models', { headers: headers() });
    if (res.status === 401) {
      set_status('locked', 'needs an API key');
      ask_key(api_key ? 'That key was refused.' : '');
      return false;
    }
    if (!res.ok) throw new Error(await error_text(res));
    const j = await res.json();
    model_id = j.data?.[0]?.id ?? null;
    $('model-name').textContent = model_id ?? '';
    set_status('ok', 'ready');
    $('key-state').textContent = api_key ? '(saved in this browser)' : '';
    await refresh_rate();
    render_chart();
    return true;
  } catch (e) {
    set_status('down', `server unreachable: ${e.message}`);
    return false;
  }
}

// The engine's prefill rate from its counters: prefilled tokens / engine seconds spent on them.
async function refresh_rate() {
  try {
    const res = await fetch('metrics', { headers: headers() });
    if (!res.ok) return;
    const text = await res.text();
    const value = (name) => {
      const m = text.match(new RegExp(`^${name} ([0-9.eE+-]+)$`, 'm'));
      return m ? Number(m[1]) : NaN;
    };
    const tokens = value('cairn_prompt_tokens_prefilled_total');
    const seconds = value('cairn_prefill_seconds_total');
    prefill_rate = tokens > 0 && seconds > 0 ? tokens / seconds : null;
  } catch {
    prefill_rate = null;
  }
}

function set_status(kind, text) {
  const s = $('status');
  s.className = `status ${kind}`;
  s.title = text;
  s.textContent = text;
}

function ask_key(problem) {
  const d = $('key-dialog');
  $('key-dialog-error').textContent = problem;
  $('key-dialog-input').value = '';
  if (!d.open) d.showModal();
}

// ---- markdown --------------------------------------------------------------------------------

marked.setOptions({ gfm: true, breaks: false });

// Links open in a new tab and carry no referrer; DOMPurify has already dropped javascript: URLs.
// Images in model output are never loaded (a tracking pixel would tell a third party what was
// read, and the CSP refuses other origins anyway): each becomes a link the reader may follow.
DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'IMG') {
    const a = node.ownerDocument.createElement('a');
    a.className = 'image-link';
    a.textContent = `image: ${node.getAttribute('alt') || node.getAttribute('src') || '(no source)'}`;
    if (node.hasAttribute('src')) a.setAttribute('href', node.getAttribute('src'));
    node.replaceWith(a);
    node = a;
  }
  if (node.tagName === 'A' && node.hasAttribute('href')) {
    node.setAttribute('target', '_blank');
    node.setAttribute('rel', 'noopener noreferrer nofollow');
  }
});

const PURIFY = { USE_PROFILES: { html: true }, FORBID_TAGS: ['style', 'form', 'input', 'button', 'textarea', 'select'],
  FORBID_ATTR: ['style'] };

function render_md(el, text) {
  el.innerHTML = DOMPurify.sanitize(marked.parse(text), PURIFY);
  for (const pre of el.querySelectorAll('pre')) {
    const code = pre.querySelector('code');
    const lang = /language-([\w+#.-]+)/.exec(code?.className ?? '')?.[1] ?? '';
    const bar = document.createElement('div');
    bar.className = 'code-bar';
    const label = document.createElement('span');
    label.textContent = lang || 'code';
    const copy = button('Copy', 'copy', () => copy_text((code ?? pre).textContent, copy));
    bar.append(label, copy);
    pre.before(bar);
    const wrap = document.createElement('div');
    wrap.className = 'code-block';
    bar.before(wrap);
    wrap.append(bar, pre);
  }
}

async function copy_text(text, btn) {
  let ok = false;
  try {
    await navigator.clipboard.writeText(text);
    ok = true;
  } catch {
    // No clipboard permission (or not a secure context): copy through a selection.
    const t = document.createElement('textarea');
    t.value = text;
    document.body.append(t);
    t.select();
    try { ok = document.execCommand('copy'); } catch { ok = false; }
    t.remove();
  }
  const was = btn.textContent;
  btn.textContent = ok ? 'Copied' : 'Copy failed';
  setTimeout(() => { btn.textContent = was; }, 1200);
}

// ---- rendering -------------------------------------------------------------------------------

function button(text, cls, onclick, title) {
  const b = document.createElement('button');
  b.type = 'button';
  b.className = cls;
  b.textContent = text;
  if (title) b.title = title;
  b.addEventListener('click', onclick);
  return b;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function render_all() {
  render_list();
  render_messages();
  render_chart();
  const c = current();
  $('conv-title').textContent = c.title;
  $('system').value = c.system;
  document.title = c.messages.length ? `${c.title} · cairn` : 'cairn';
}

function render_list() {
  const ul = $('conv-list');
  ul.replaceChildren();
  for (const c of [...store.convs].sort((a, b) => b.updated - a.updated)) {
    const li = el('li', c.id === store.current ? 'conv active' : 'conv');
    li.dataset.id = c.id;
    const name = button(c.title, 'conv-name', () => select_conv(c.id), c.title);
    const rename = button('✎', 'icon small', () => rename_conv(c, li), 'Rename');
    rename.setAttribute('aria-label', 'Rename');
    const del = button('×', 'icon small', () => delete_conv(c), 'Delete');
    del.setAttribute('aria-label', 'Delete');
    li.append(name, rename, del);
    ul.append(li);
  }
}

function render_messages() {
  const box = $('messages');
  const c = current();
  box.replaceChildren();
  if (!c.messages.length) {
    const empty = el('div', 'empty');
    empty.append(el('div', 'empty-title', 'Ask anything.'),
      el('p', null, 'Each reply shows how much of the prompt the engine reused from the state it already '
        + 'holds, and how soon the first token came. The second message is never slower than the first.'));
    box.append(empty);
    return;
  }
  const last_user = c.messages.map((m) => m.role).lastIndexOf('user');
  const last_asst = c.messages.map((m) => m.role).lastIndexOf('assistant');
  c.messages.forEach((m, i) => {
    if (m.role === 'user') box.append(user_view(c, m, i === last_user && !running));
    else if (m.role === 'tool') box.append(tool_result_view(m));
    else box.append(assistant_view(c, m, i === last_asst && i === c.messages.length - 1 && !running));
  });
  box.scrollTop = box.scrollHeight;
}

function user_view(c, m, editable) {
  const d = el('div', 'msg user');
  const body = el('div', 'bubble', m.content);
  d.append(body);
  if (editable) {
    const actions = el('div', 'actions');
    actions.append(button('Edit', 'link', () => edit_last(c, m, d), 'Edit and resend'));
    d.append(actions);
  }
  return d;
}

function tool_result_view(m) {
  const d = el('div', 'msg tool');
  const det = el('details', 'tool-result');
  det.append(el('summary', null, `Tool result${m.tool_call_id ? ` · ${m.tool_call_id}` : ''}`), el('pre', null, m.content));
  d.append(det);
  return d;
}

function assistant_view(c, m, last) {
  const d = el('div', 'msg assistant');
  views.set(m, d);
  fill_assistant(d, m);
  if (last) {
    const actions = el('div', 'actions');
    actions.append(button('Regenerate', 'link', () => regenerate(c), 'Generate this reply again'),
      button('Copy', 'link', (ev) => copy_text(m.content, ev.target)));
    d.append(actions);
  }
  return d;
}

// (Re)draw one assistant message in place: thinking, content, tool calls, stats.
function fill_assistant(d, m) {
  const keep = d.querySelector(':scope > .actions');
  const was_open = d.querySelector('details.thinking')?.open;
  d.replaceChildren();
  if (m.reasoning) {
    const det = el('details', 'thinking');
    det.open = was_open ?? (running?.msg === m && !m.content);
    det.append(el('summary', null, running?.msg === m && !m.content ? 'Thinking…' : 'Thought'));
    const body = el('div', 'md');
    render_md(body, m.reasoning);
    det.append(body);
    d.append(det);
  }
  if (m.content) {
    const body = el('div', 'md');
    render_md(body, m.content);
    d.append(body);
  } else if (running?.msg === m && !m.reasoning && !m.tool_calls?.length) {
    d.append(el('div', 'typing', '…'));
  } else if (!m.reasoning && !m.tool_calls?.length && !m.stats?.error) {
    d.append(el('div', 'muted', m.stats?.stopped ? '(stopped before any text)' : '(no text)'));
  }
  for (const t of m.tool_calls ?? []) {
    const det = el('details', 'tool-call');
    det.open = true;
    const sum = el('summary');
    sum.append(el('span', 'tag', 'tool call'), el('code', null, t.function.name));
    let args = t.function.arguments ?? '';
    try { args = JSON.stringify(JSON.parse(args), null, 2); } catch { /* shown as sent */ }
    det.append(sum, el('pre', null, args));
    d.append(det);
  }
  if (m.stats?.error) d.append(el('div', 'error', m.stats.error));
  const line = stats_line(m.stats);
  if (line) d.append(line);
  if (keep) d.append(keep);
}

const secs = (s) => `${s < 0.1 ? s.toFixed(3) : s < 10 ? s.toFixed(2) : s.toFixed(1)} s`;

// `prompt 1,204 · reused 1,180 · TTFT 0.21 s · 18.4 tok/s`, with a bar of the reused share.
function stats_line(s) {
  if (!s || (s.prompt === undefined && s.ttft === undefined)) return null;
  const line = el('div', 'stats');
  if (s.prompt !== undefined) {
    const meter = el('span', 'meter');
    meter.title = `${fmt.format(s.reused)} of ${fmt.format(s.prompt)} prompt tokens came from the engine's state`;
    const fill = el('span', 'meter-fill');
    fill.style.width = `${s.prompt ? (100 * s.reused) / s.prompt : 0}%`;
    meter.append(fill);
    line.append(meter);
  }
  const parts = [];
  if (s.prompt !== undefined) parts.push(['prompt', `prompt ${fmt.format(s.prompt)}`], ['reused', `reused ${fmt.format(s.reused)}`]);
  if (s.ttft !== undefined) parts.push(['ttft', `TTFT ${secs(s.ttft)}`]);
  if (s.tok_s) parts.push(['speed', `${s.tok_s.toFixed(1)} tok/s`]);
  if (s.stopped) parts.push(['stopped', 'stopped']);
  parts.forEach(([k, text], i) => {
    if (i) line.append(el('span', 'sep', ' · '));
    const span = el('span', `stat-${k}`, text);
    line.append(span);
  });
  return line;
}

// ---- the reuse chart -------------------------------------------------------------------------

const SVG = 'http://www.w3.org/2000/svg';

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function render_chart() {
  const turns = current().messages.filter((m) => m.role === 'assistant' && m.stats?.ttft !== undefined
    && m.stats.prompt !== undefined);
  const box = $('chart');
  const summary = $('reuse-summary');
  box.replaceChildren();
  summary.replaceChildren();
  if (!turns.length) {
    box.append(el('div', 'chart-empty', 'Send a message: each finished turn adds a pair of bars here.'));
    return;
  }
  const W = 300, H = 170, L = 38, B = 22, T = 10;
  const model = prefill_model();
  const cold = (s) => cold_ttft(s, model);
  const top = Math.max(...turns.map((m) => Math.max(m.stats.ttft, cold(m.stats) ?? 0)), 1e-3);
  const g = svg('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart-svg', role: 'img',
    'aria-label': 'time to first token per turn, warm and estimated cold' });
  const y = (v) => T + (H - T - B) * (1 - v / top);
  for (const f of [0, 0.5, 1]) {
    g.append(svg('line', { x1: L, x2: W, y1: y(top * f), y2: y(top * f), class: 'grid' }));
    g.append(svg('text', { x: L - 4, y: y(top * f) + 3, class: 'axis', 'text-anchor': 'end' }, secs(top * f)));
  }
  const slot = (W - L) / turns.length;
  const bw = Math.max(2, Math.min(18, slot / 3));
  turns.forEach((m, i) => {
    const x = L + slot * i + slot / 2;
    const s = m.stats;
    const warm = svg('rect', { x: x - bw - 1, y: y(s.ttft), width: bw, height: H - B - y(s.ttft), class: 'bar warm' });
    warm.append(svg('title', {}, `turn ${i + 1}: TTFT ${secs(s.ttft)}, ${fmt.format(s.reused)} of ${fmt.format(s.prompt)} tokens reused`));
    g.append(warm);
    if (cold(s) !== null) {
      const c = svg('rect', { x: x + 1, y: y(cold(s)), width: bw, height: H - B - y(cold(s)), class: 'bar cold' });
      c.append(svg('title', {}, `turn ${i + 1}: a cold prefill of all ${fmt.format(s.prompt)} tokens ≈ ${secs(cold(s))}`));
      g.append(c);
    }
    if (turns.length <= 16 || i % Math.ceil(turns.length / 16) === 0)
      g.append(svg('text', { x, y: H - 6, class: 'axis', 'text-anchor': 'middle' }, String(i + 1)));
  });
  box.append(g);
  const legend = el('div', 'legend');
  legend.append(el('span', 'key warm', 'warm TTFT (measured)'), el('span', 'key cold', 'cold prefill (estimated)'));
  box.append(legend);
  const s = turns.at(-1).stats;
  const line = el('p', 'last-turn');
  line.append(`Last turn: ${secs(s.ttft)} to the first token with ${fmt.format(s.reused)} of ${fmt.format(s.prompt)} prompt tokens reused`);
  if (cold(s) !== null) line.append(`; a cold start would need ≈ ${secs(cold(s))}.`);
  else line.append('.');
  summary.append(line);
  const how = el('p', 'muted model-note');
  if (!model) how.textContent = 'The engine has not reported a prefill time yet, so there is no cold estimate.';
  else if (model.from === 'fit')
    how.textContent = `Cold estimate: the turn's TTFT with its own prefill replaced by ${ms(model.a)} + `
      + `${ms(model.b)} per prompt token, fitted to ${model.n} prefills the engine timed.`;
  else
    how.textContent = `Cold estimate: the turn's TTFT with its own prefill replaced by the prompt at `
      + `${fmt.format(Math.round(1 / model.b))} tok/s, the engine's prefill rate so far.`;
  summary.append(how);
}

const ms = (s) => `${(s * 1000).toPrecision(3)} ms`;

// The engine's cost of prefilling n tokens, t(n) = a + b·n seconds, fitted by least squares to
// the prefills it timed for this browser's turns (timings: prompt_n tokens in prompt_ms). The
// fixed part matters: a short tail still costs a pass over the weights, so a plain tokens per
// second rate taken over warm turns would overstate what one long cold prefill costs. With fewer
// than two distinct sizes (or a fit that makes no sense) it is a rate: the samples', else the
// engine's over all its prefills (/metrics).
function prefill_model() {
  const pts = store.convs.flatMap((c) => c.messages)
    .filter((m) => m.stats?.prefill_n > 0 && m.stats.prefill_s > 0).map((m) => [m.stats.prefill_n, m.stats.prefill_s]);
  const n = pts.length;
  const sum = (f) => pts.reduce((acc, p) => acc + f(p), 0);
  const sx = sum((p) => p[0]), sy = sum((p) => p[1]), sxx = sum((p) => p[0] * p[0]), sxy = sum((p) => p[0] * p[1]);
  const den = n * sxx - sx * sx;
  if (n >= 2 && den > 0) {
    const b = (n * sxy - sx * sy) / den, a = (sy - b * sx) / n;
    if (b > 0 && a >= 0) return { from: 'fit', a, b, n };
  }
  if (n) return { from: 'rate', a: 0, b: sy / sx, n };
  return prefill_rate ? { from: 'rate', a: 0, b: 1 / prefill_rate, n: 0 } : null;
}

// What the turn's TTFT would have been had nothing been reused, or null without a model.
function cold_ttft(s, model) {
  if (!model || s.ttft === undefined || s.prompt === undefined) return null;
  const own = s.prefill_s ?? model.a + model.b * (s.prompt - s.reused);
  return Math.max(s.ttft - own, 0) + model.a + model.b * s.prompt;
}

// ---- generation ------------------------------------------------------------------------------

// The request's messages: the system prompt, then the history without the page's own fields.
function api_messages(c) {
  const out = [];
  if (c.system.trim()) out.push({ role: 'system', content: c.system });
  for (const m of c.messages) {
    if (m.role === 'assistant' && m.stats?.error && !m.content && !m.tool_calls?.length) continue;
    const x = { role: m.role, content: m.content };
    if (m.role === 'assistant' && m.reasoning) x.reasoning_content = m.reasoning;
    if (m.role === 'assistant' && m.tool_calls?.length) x.tool_calls = m.tool_calls;
    if (m.role === 'tool') x.tool_call_id = m.tool_call_id;
    out.push(x);
  }
  return out;
}

// The generation fields, or a message saying which setting is wrong.
function request_options() {
  const o = {};
  const temp = Number(settings.temperature);
  if (!Number.isFinite(temp) || temp < 0 || temp > 2) return { error: 'Temperature must be between 0 and 2.' };
  o.temperature = temp;
  const max = Number(settings.max_tokens);
  if (!Number.isInteger(max) || max < 1) return { error: 'Max tokens must be a whole number of at least 1.' };
  o.max_tokens = max;
  if (String(settings.seed).trim() !== '') {
    const seed = Number(settings.seed);
    if (!Number.isInteger(seed)) return { error: 'Seed must be a whole number (or empty for a random one).' };
    o.seed = seed;
  }
  if (settings.thinking) o.thinking = true;      /* every family's thinking mode (GLM's has no effort levels) */
  if (settings.tools.trim()) {
    try {
      const tools = JSON.parse(settings.tools);
      if (!Array.isArray(tools)) throw new Error('it must be a JSON list');
      o.tools = tools;
    } catch (e) {
      return { error: `Tools: ${e.message}` };
    }
  }
  return { o };
}

// Server-sent events from a fetch body: calls on(data) for every `data:` line's JSON.
async function read_sse(res, on) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl).replace(/\r$/, '');
      buf = buf.slice(nl + 1);
      if (!line.startsWith('data:')) continue;
      const data = line.slice(5).trim();
      if (data === '[DONE]') return;
      on(JSON.parse(data));
    }
  }
}

async function generate(c) {
  const opts = request_options();
  if (opts.error) {
    note(opts.error);
    return;
  }
  note('');
  const body = { messages: api_messages(c), stream: true, stream_options: { include_usage: true }, ...opts.o };
  if (model_id) body.model = model_id;
  const msg = { role: 'assistant', content: '', reasoning: '', tool_calls: [], stats: {} };
  c.messages.push(msg);
  c.updated = Date.now();
  const controller = new AbortController();
  running = { conv: c, msg, controller };
  set_running(true);
  render_all();
  const t0 = performance.now();
  let t_first = null, usage = null, timings = null, frame = 0;
  const redraw = () => {
    if (frame) return;
    frame = requestAnimationFrame(() => {
      frame = 0;
      if (views.has(msg)) fill_assistant(views.get(msg), msg);
      const box = $('messages');
      box.scrollTop = box.scrollHeight;
    });
  };
  try {
    const res = await fetch('v1/chat/completions', { method: 'POST', headers: headers(), body: JSON.stringify(body),
      signal: controller.signal });
    if (res.status === 401) ask_key('The server refused the key.');
    if (!res.ok) throw new Error(await error_text(res));
    await read_sse(res, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message || 'the server reported an error');
      if (chunk.usage) usage = chunk.usage;
      if (chunk.timings) timings = chunk.timings;
      const d = chunk.choices?.[0]?.delta;
      if (!d) return;
      if (d.reasoning_content) msg.reasoning += d.reasoning_content;
      if (d.content) msg.content += d.content;
      for (const t of d.tool_calls ?? []) {
        const i = t.index ?? msg.tool_calls.length;
        const cur = msg.tool_calls[i] ?? (msg.tool_calls[i] = { id: '', type: 'function', function: { name: '', arguments: '' } });
        if (t.id) cur.id = t.id;
        if (t.function?.name) cur.function.name += t.function.name;
        if (t.function?.arguments) cur.function.arguments += t.function.arguments;
      }
      if (d.reasoning_content || d.content || d.tool_calls) {
        if (t_first === null) t_first = performance.now();
        redraw();
      }
    });
  } catch (e) {
    if (e.name === 'AbortError') msg.stats.stopped = true;
    else msg.stats.error = `Error: ${e.message}`;
  }
  if (frame) cancelAnimationFrame(frame);
  const s = msg.stats;
  if (t_first !== null) s.ttft = (t_first - t0) / 1000;
  if (usage) {
    s.prompt = usage.prompt_tokens;
    s.reused = usage.prompt_tokens_details?.cached_tokens ?? 0;
    s.completion = usage.completion_tokens;
  }
  // The engine's decode speed: the stream arrives in bursts, so timing it here would measure
  // the gateway's polling rather than the model.
  if (timings?.predicted_per_second > 0) s.tok_s = timings.predicted_per_second;
  if (timings?.prompt_ms > 0) {
    s.prefill_n = timings.prompt_n;
    s.prefill_s = timings.prompt_ms / 1000;
  }
  running = null;
  if (usage) await refresh_rate();
  save();
  render_all();
  set_running(false);   // last: the page is idle only once everything above is on screen
  $('input').focus();
}

function set_running(on) {
  $('send').hidden = on;
  $('stop').hidden = !on;
  document.body.classList.toggle('running', on);
}

function stop() {
  running?.controller.abort();
}

// Pending tool calls of the last assistant message: the composer answers them first.
function pending_tool_call(c) {
  const i = c.messages.map((m) => m.role).lastIndexOf('assistant');
  if (i < 0) return null;
  const answered = new Set(c.messages.slice(i + 1).filter((m) => m.role === 'tool').map((m) => m.tool_call_id));
  return c.messages[i].tool_calls?.find((t) => !answered.has(t.id)) ?? null;
}

function update_composer() {
  const c = current();
  const t = pending_tool_call(c);
  $('input').placeholder = t ? `Result of ${t.function.name} (sent as the tool's answer)`
    : 'Message cairn';
}

async function send_input() {
  if (running) return;
  const input = $('input');
  const text = input.value;
  if (!text.trim()) return;
  const c = current();
  const pending = pending_tool_call(c);
  if (pending) c.messages.push({ role: 'tool', tool_call_id: pending.id, content: text });
  else c.messages.push({ role: 'user', content: text });
  if (c.title === 'New chat' && !pending) c.title = text.trim().split('\n')[0].slice(0, 60);
  input.value = '';
  autosize();
  save();
  update_composer();
  if (pending_tool_call(c)) return render_all();   // more calls to answer before the model goes on
  await generate(c);
  update_composer();
}

async function regenerate(c) {
  if (running) return;
  while (c.messages.length && c.messages.at(-1).role === 'assistant') c.messages.pop();
  save();
  await generate(c);
}

function edit_last(c, m, view) {
  const box = el('div', 'edit');
  const ta = el('textarea');
  ta.value = m.content;
  ta.rows = Math.min(10, m.content.split('\n').length + 1);
  const send = button('Save and send', 'primary', async () => {
    if (!ta.value.trim() || running) return;
    m.content = ta.value;
    c.messages.splice(c.messages.indexOf(m) + 1);
    save();
    await generate(c);
  });
  send.classList.add('edit-send');
  box.append(ta, el('div', 'edit-buttons'));
  box.lastChild.append(button('Cancel', 'link', () => render_messages()), send);
  view.replaceChildren(box);
  ta.focus();
}

// ---- conversations ---------------------------------------------------------------------------

function select_conv(id) {
  if (running) stop();
  store.current = id;
  save();
  render_all();
  update_composer();
  document.body.classList.remove('show-sidebar');
}

function rename_conv(c, li) {
  const input = el('input', 'rename');
  input.value = c.title;
  const done = (keep) => {
    if (keep && input.value.trim()) c.title = input.value.trim().slice(0, 200);
    save();
    render_all();
  };
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter') done(true);
    if (e.key === 'Escape') done(false);
  });
  input.addEventListener('blur', () => done(true));
  li.replaceChildren(input);
  input.focus();
  input.select();
}

function delete_conv(c) {
  if (!confirm(`Delete “${c.title}”?`)) return;
  if (running?.conv === c) stop();
  store.convs = store.convs.filter((x) => x !== c);
  if (!store.convs.length) store.convs.push(new_conv());
  if (store.current === c.id) store.current = store.convs[0].id;
  save();
  render_all();
}

function export_all() {
  const data = JSON.stringify({ format: 'cairn-conversations', version: 1, convs: store.convs }, null, 2);
  const a = el('a');
  a.href = URL.createObjectURL(new Blob([data], { type: 'application/json' }));
  a.download = `cairn-conversations-${new Date().toISOString().slice(0, 10)}.json`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

async function import_file(file) {
  try {
    const j = JSON.parse(await file.text());
    const list = Array.isArray(j) ? j : j.convs;
    if (!Array.isArray(list)) throw new Error('expected a cairn export (an object with "convs") or a list');
    const convs = list.map(clean_conv);
    const bad = convs.indexOf(null);
    if (bad >= 0) throw new Error(`conversation ${bad + 1} is not in the expected shape`);
    const ids = new Set(store.convs.map((c) => c.id));
    for (const c of convs) {
      if (ids.has(c.id)) c.id = new_id();
      store.convs.push(c);
    }
    if (convs.length) store.current = convs[0].id;
    save();
    render_all();
    note(`Imported ${convs.length} conversation${convs.length === 1 ? '' : 's'}.`);
  } catch (e) {
    note(`Import failed: ${e.message}`);
  }
}

function note(text) {
  $('composer-note').textContent = text;
}

// ---- wiring ----------------------------------------------------------------------------------

function autosize() {
  const t = $('input');
  t.style.height = 'auto';
  t.style.height = `${Math.min(t.scrollHeight, 220)}px`;
}

function bind_setting(id, key, parse = (v) => v) {
  const input = $(id);
  if (input.type === 'checkbox') input.checked = !!settings[key];
  else input.value = settings[key];
  input.addEventListener(input.type === 'checkbox' ? 'change' : 'input', () => {
    settings[key] = input.type === 'checkbox' ? input.checked : parse(input.value);
    save_settings();
  });
}

function wire() {
  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    send_input();
  });
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send_input();
    }
  });
  $('input').addEventListener('input', autosize);
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Escape' && running) stop();
  });
  $('stop').addEventListener('click', stop);
  $('new-chat').addEventListener('click', () => {
    const c = new_conv();
    store.convs.push(c);
    select_conv(c.id);
    $('input').focus();
  });
  $('export').addEventListener('click', export_all);
  $('import-button').addEventListener('click', () => $('import').click());
  $('import').addEventListener('change', (e) => {
    const f = e.target.files[0];
    e.target.value = '';
    if (f) import_file(f);
  });
  $('toggle-sidebar').addEventListener('click', () => document.body.classList.toggle('show-sidebar'));
  $('toggle-panel').addEventListener('click', () => document.body.classList.toggle('show-panel'));
  $('scrim').addEventListener('click', () => document.body.classList.remove('show-panel', 'show-sidebar'));
  $('system').addEventListener('input', () => {
    current().system = $('system').value;
    save();
  });
  bind_setting('temperature', 'temperature');
  bind_setting('max-tokens', 'max_tokens');
  bind_setting('seed', 'seed');
  bind_setting('thinking', 'thinking');
  bind_setting('tools', 'tools');
  $('tools').addEventListener('input', () => {
    $('tools-error').textContent = request_options().error?.startsWith('Tools') ? request_options().error : '';
  });
  $('api-key').value = api_key;
  $('api-key').addEventListener('change', () => {
    api_key = $('api-key').value.trim();
    localStorage.setItem(KEY_KEY, api_key);
    connect();
  });
  $('key-form').addEventListener('submit', () => {
    api_key = $('key-dialog-input').value.trim();
    localStorage.setItem(KEY_KEY, api_key);
    $('api-key').value = api_key;
    connect();
  });
  // A reply cut off by leaving the page is kept as it stood, marked stopped.
  window.addEventListener('pagehide', () => {
    if (!running) return;
    running.msg.stats.stopped = true;
    save();
  });
}

wire();
render_all();
update_composer();
connect();
