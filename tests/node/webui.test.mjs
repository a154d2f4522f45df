// The chat page at / in a real browser: Debian's chromium, headless, driven by puppeteer-core,
// once per family (test_node.py). The first test chats with the real engine on the tiny model —
// three turns, a reply stopped mid-stream, regenerate, edit of the last message, reload — and
// asserts on the DOM: the `prompt N · reused M` line of every reply (reuse rising turn by turn,
// regenerate reusing all but the last prompt token), the reuse chart, the restored conversation.
// The others use tests/fake_engine.py for replies a random model cannot give (hostile markdown,
// thinking, tool calls) and for the API key. Every test fails on any console error, uncaught
// exception or unhandled promise rejection in the page. Screenshots go to build/.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import puppeteer from 'puppeteer-core';
import { startServer, FAMILY, MODEL, TOOL_SYNTAX, TOOL } from './serve_helper.mjs';

const BUILD = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'build');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const HANG_GUARD_MS = 120000;   // a wait that never ends becomes a failure; nothing here is timed

let browser;
let profile;
before(async () => {
  // The machine has no network: without these chromium stalls on refused connections.
  profile = mkdtempSync(join(tmpdir(), 'cairn-chromium-'));
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    userDataDir: profile,
    protocolTimeout: HANG_GUARD_MS,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      '--disable-dev-shm-usage'],
  });
});
after(async () => {
  await browser?.close();
  if (profile) rmSync(profile, { recursive: true, force: true });
});

// A page that records every console error, uncaught exception and unhandled rejection.
async function openPage(url, { width = 1440, height = 900, expectErrors = () => false } = {}) {
  const page = await browser.newPage();
  page.setDefaultTimeout(HANG_GUARD_MS);
  await page.setViewport({ width, height });
  const problems = [];
  page.on('console', (m) => {
    if (m.type() === 'error' && !expectErrors(m.text())) problems.push(`console: ${m.text()}`);
  });
  page.on('pageerror', (e) => problems.push(`uncaught: ${e.message}`));
  await page.evaluateOnNewDocument(() => {
    window.__rejections = [];
    window.addEventListener('unhandledrejection', (e) => window.__rejections.push(String(e.reason?.stack ?? e.reason)));
  });
  await page.goto(url, { waitUntil: 'load' });
  page.problems = async () => [...problems, ...(await page.evaluate(() => window.__rejections)).map((r) => `unhandled rejection: ${r}`)];
  return page;
}

async function ready(page) {
  await page.waitForSelector('#status.ok');
}

async function setField(page, selector, value) {
  await page.$eval(selector, (e, v) => {
    e.value = v;
    e.dispatchEvent(new Event('input', { bubbles: true }));
    e.dispatchEvent(new Event('change', { bubbles: true }));
  }, String(value));
}

// Type a message and send it with Enter; resolves once the reply finished (its stats line or an
// error is shown and the Stop button is gone).
async function send(page, text) {
  const before = await page.$$eval('.msg.assistant', (l) => l.length);
  await page.focus('#input');
  await page.keyboard.type(text);
  await page.keyboard.press('Enter');
  await finished(page, before + 1);
}

async function finished(page, count) {
  await page.waitForFunction((n) => document.querySelectorAll('.msg.assistant').length === n
    && !document.body.classList.contains('running'), {}, count);
}

// The stats of every assistant message, read back from the DOM.
async function stats(page) {
  return page.$$eval('.msg.assistant', (list) => list.map((m) => {
    const num = (cls) => {
      const t = m.querySelector(`.stat-${cls}`)?.textContent;
      return t === undefined ? null : Number(t.replace(/[^0-9.]/g, ''));
    };
    return { prompt: num('prompt'), reused: num('reused'), ttft: num('ttft'), tok_s: num('speed'),
      stopped: !!m.querySelector('.stat-stopped'), error: m.querySelector('.error')?.textContent ?? null,
      text: m.querySelector('.md')?.textContent.trim() ?? '' };
  }));
}

test('chat on the tiny model: reuse rises, stop, regenerate, edit, reload', async (t) => {
  // One slot, so routing cannot send a regenerate to an empty slot: what is measured is the
  // engine's reuse. Replies of the stopped turn may run to the end of the context.
  const server = await startServer(['--slots', '1', '--max-tokens', '4096']);
  try {
    const page = await openPage(`${server.url}/`);
    await ready(page);
    assert.match(await page.$eval('#model-name', (e) => e.textContent), /tiny/);
    await setField(page, '#temperature', 0);
    await setField(page, '#max-tokens', 12);
    await setField(page, '#system', 'You are terse.');

    await send(page, 'Hello! Who are you?');
    await send(page, 'Tell me about stones.');
    await send(page, 'And cairns?');
    let s = await stats(page);
    assert.equal(s.length, 3);
    for (const m of s) {
      assert.equal(m.error, null);
      assert.ok(m.prompt > 0 && m.ttft > 0 && m.tok_s > 0 && m.reused <= m.prompt, JSON.stringify(s));
    }
    assert.ok(s[1].reused > s[0].reused && s[2].reused > s[1].reused, `reuse must rise turn by turn: ${JSON.stringify(s)}`);
    assert.ok(s[1].reused >= s[0].prompt - 1 && s[2].reused >= s[1].prompt - 1,
      `each turn reuses at least the previous prompt: ${JSON.stringify(s)}`);
    // the chart: one warm bar per finished turn, and a cold estimate beside each
    assert.equal(await page.$$eval('#chart rect.warm', (l) => l.length), 3);
    assert.equal(await page.$$eval('#chart rect.cold', (l) => l.length), 3);
    assert.match(await page.$eval('#reuse-summary .model-note', (e) => e.textContent),
      /^Cold estimate: the turn's TTFT with its own prefill replaced by (\S+ ms \+ \S+ ms per prompt token, fitted to 3 prefills|the prompt at [0-9,]+ tok\/s)/);

    // A reply stopped once it is streaming: Stop is pressed from inside the page the moment the
    // first text shows, since the tiny models decode thousands of tokens a second. So that the
    // reply is still streaming when the Stop arrives, the page's requests get a logit_bias that
    // bans every special token (the end-of-turn ones among them): the reply would otherwise end
    // after a few dozen tokens, sooner than a busy machine's browser renders them (CI saw eight
    // replies in a row end first), and now runs on towards the end of the context. Should one
    // still end first, that reply is one more turn and the next attempt, with another seed, tries again.
    await setField(page, '#max-tokens', 4096);
    await setField(page, '#temperature', 1);
    const ban = Object.fromEntries(JSON.parse(readFileSync(join(MODEL, 'tokenizer.json'), 'utf8'))
      .added_tokens.map((a) => [String(a.id), -100]));
    const banSpecials = (r) => {
      if (r.isInterceptResolutionHandled()) return;
      if (r.method() !== 'POST' || !r.url().endsWith('/v1/chat/completions')) return r.continue();
      r.continue({ postData: JSON.stringify({ ...JSON.parse(r.postData()), logit_bias: ban }) });
    };
    await page.setRequestInterception(true);
    page.on('request', banSpecials);
    for (let seed = 1; seed <= 8; seed++) {
      await setField(page, '#seed', seed);
      const n = (await stats(page)).length + 1;
      await page.evaluate(() => {
        const box = document.getElementById('messages');
        window.__stopper = new MutationObserver(() => {
          const md = box.querySelector('.msg.assistant:last-child .md');
          if (md?.textContent.length && !document.getElementById('stop').hidden) {
            window.__stopper.disconnect();
            document.getElementById('stop').click();
          }
        });
        window.__stopper.observe(box, { childList: true, subtree: true, characterData: true });
      });
      await page.focus('#input');
      await page.keyboard.type(`Tell me a long story, take ${seed}.`);
      await page.keyboard.press('Enter');
      await finished(page, n);
      await page.evaluate(() => window.__stopper.disconnect());
      s = await stats(page);
      if (s.at(-1).stopped) break;
    }
    page.off('request', banSpecials);
    await page.setRequestInterception(false);
    t.diagnostic(`stopped on attempt ${s.length - 3}: ${s.at(-1).text.length} characters streamed before Stop`);
    assert.ok(s.at(-1).stopped && s.at(-1).text.length > 0 && s.at(-1).error === null, JSON.stringify(s));
    assert.equal(await page.$eval('#send', (e) => e.hidden), false);
    const turns = s.length;

    // Regenerate: the same prompt again, all of it but the last token reused (a checkpoint
    // restore on DeepSeek V4, a truncation on GLM).
    await setField(page, '#max-tokens', 12);
    await setField(page, '#temperature', 0);
    await page.click('.msg.assistant:last-of-type .actions button');
    await finished(page, turns);
    s = await stats(page);
    assert.equal(s.length, turns);
    assert.ok(!s.at(-1).stopped && s.at(-1).error === null, JSON.stringify(s.at(-1)));
    assert.equal(s.at(-1).reused, s.at(-1).prompt - 1, `regenerate: ${JSON.stringify(s.at(-1))}`);

    // Edit the last user message and resend: everything before it is reused.
    const before = s;
    const edit = await page.$$('.msg.user .actions button');
    assert.equal(edit.length, 1, 'only the last user message is editable');
    await edit[0].click();
    await page.waitForSelector('.edit textarea');
    await page.$eval('.edit textarea', (t) => { t.value = 'Write a short poem instead.'; });
    await page.click('.edit .edit-send');
    await finished(page, turns);
    s = await stats(page);
    assert.equal(s.at(-1).error, null);
    assert.ok(s.at(-1).reused >= before.at(-2).prompt, `edit keeps the history: ${JSON.stringify(s)}`);
    assert.equal(await page.$$eval('.msg.user .bubble', (l) => l.at(-1).textContent), 'Write a short poem instead.');
    await page.screenshot({ path: join(BUILD, `webui-${FAMILY.name}-1440.png`) });

    // Reload: the conversation comes back as it was, stats and chart included.
    const shown = await page.$eval('#messages', (e) => e.innerText);
    await page.reload({ waitUntil: 'load' });
    await ready(page);
    assert.equal(await page.$eval('#messages', (e) => e.innerText), shown);
    assert.deepEqual(await stats(page), s);
    assert.equal(await page.$$eval('#chart rect.warm', (l) => l.length), turns);
    assert.equal(await page.$eval('#system', (e) => e.value), 'You are terse.');
    assert.deepEqual(await page.problems(), []);

    // The phone layout: one column, the drawers closed, nothing wider than the screen.
    await page.setViewport({ width: 375, height: 812, isMobile: true, hasTouch: true });
    const layout = await page.evaluate(() => ({
      overflow: document.documentElement.scrollWidth - window.innerWidth,
      sidebar: document.getElementById('sidebar').getBoundingClientRect().right,
      input: document.getElementById('input').getBoundingClientRect().width,
    }));
    assert.ok(layout.overflow <= 0 && layout.sidebar <= 0 && layout.input > 200, JSON.stringify(layout));
    await page.screenshot({ path: join(BUILD, `webui-${FAMILY.name}-375.png`) });
    await page.click('#toggle-panel');
    await page.waitForFunction(() => document.getElementById('panel').getBoundingClientRect().left < window.innerWidth - 300);
    await page.screenshot({ path: join(BUILD, `webui-${FAMILY.name}-375-panel.png`) });
    assert.deepEqual(await page.problems(), []);
    await page.close();
  } finally {
    await server.stop();
  }
});

const HOSTILE = [
  'Look: <script>window.__xss = "script"</script>',
  '<img src="x" onerror="window.__xss = \'img\'"> <svg onload="window.__xss = \'svg\'"><circle r="2"/></svg>',
  '[click me](javascript:window.__xss=%22md-link%22) and <a href="javascript:window.__xss=\'a\'">raw link</a>',
  '<iframe src="javascript:parent.__xss=\'iframe\'"></iframe><form action="javascript:x"><button>go</button></form>',
  '',
  '<a href="https://example.com/" onclick="window.__xss=\'onclick\'">safe link</a> **bold**',
  '',
  '```js',
  'console.log("<b>not bold</b>")',
  '```',
].join('\n');

test('model output cannot inject script: <script>, onerror, javascript: links render inert', async () => {
  const server = await startServer([], { FAKE_REPLY: HOSTILE }, { fake: true });
  try {
    // Chrome reports every inline handler it meets while parsing (even in DOMPurify's inert
    // document, where nothing runs) as a CSP violation: those reports are the CSP at work.
    const csp = /^Executing inline event handler violates the following Content Security Policy/;
    const page = await openPage(`${server.url}/`, { expectErrors: (t) => csp.test(t) });
    await ready(page);
    await send(page, 'say something nasty');
    const dom = await page.$eval('.msg.assistant .md', (md) => ({
      scripts: md.querySelectorAll('script, iframe, form, object, embed').length,
      handlers: [...md.querySelectorAll('*')].flatMap((e) => [...e.attributes].map((a) => a.name))
        .filter((n) => n.startsWith('on')),
      hrefs: [...md.querySelectorAll('a')].map((a) => a.getAttribute('href')),
      strong: md.querySelector('strong')?.textContent,
      code: md.querySelector('.code-block pre code')?.textContent,
      copy: !!md.querySelector('.code-block .code-bar button'),
      images: md.querySelectorAll('img').length,
      imageLinks: [...md.querySelectorAll('a.image-link')].map((a) => a.getAttribute('href')),
      text: md.textContent,
    }));
    assert.equal(dom.scripts, 0, 'no script, iframe or form element survives');
    assert.deepEqual(dom.handlers, [], 'no event handler attribute survives');
    assert.ok(dom.hrefs.every((h) => h === null || !/^\s*javascript:/i.test(h)), JSON.stringify(dom.hrefs));
    assert.ok(dom.hrefs.includes('https://example.com/'), 'ordinary links are kept');
    assert.equal(dom.strong, 'bold', 'markdown is rendered');
    assert.equal(dom.code, 'console.log("<b>not bold</b>")\n', 'code blocks show their source as text');
    assert.equal(dom.images, 0, 'images in model output are links, never loaded');
    assert.ok(dom.imageLinks.includes('x'), JSON.stringify(dom.imageLinks));
    assert.ok(dom.copy, 'code blocks have a copy button');
    for (const a of await page.$$('.msg.assistant .md a')) {
      const href = await a.evaluate((e) => e.getAttribute('href'));
      if (href === null) await a.click();   // a link whose javascript: URL was dropped: clicking does nothing
    }
    assert.equal(await page.evaluate(() => window.__xss), undefined, 'no injected code ran');
    // the user's own text is never markup either
    await send(page, '<img src=x onerror="window.__xss=\'user\'">');
    assert.equal(await page.$$eval('.msg.user .bubble img', (l) => l.length), 0);
    assert.equal(await page.evaluate(() => window.__xss), undefined);
    assert.deepEqual(await page.problems(), []);
    await page.close();
  } finally {
    await server.stop();
  }
});

test('thinking is a collapsible block; tool calls are shown and answered with a tool result', async () => {
  const syntax = TOOL_SYNTAX;
  assert.ok(syntax, `no tool-call syntax known for family ${FAMILY.name}`);
  const server = await startServer([], { FAKE_REPLY: `${syntax.thinkStart ?? ''}Weighing it up.${syntax.thinkEnd ?? '</think>'}${syntax.reply}` }, { fake: true });
  try {
    const page = await openPage(`${server.url}/`);
    await ready(page);
    await page.click('#thinking');
    await page.$eval('details.tools', (d) => { d.open = true; });
    await setField(page, '#tools', JSON.stringify([TOOL]));
    await send(page, 'Weather in Paris?');
    const m = await page.$eval('.msg.assistant', (e) => ({
      thinking: e.querySelector('details.thinking')?.textContent,
      open: e.querySelector('details.thinking')?.open,
      content: e.querySelector(':scope > .md')?.textContent.trim(),
      call: e.querySelector('details.tool-call summary code')?.textContent,
      args: e.querySelector('details.tool-call pre')?.textContent,
    }));
    assert.match(m.thinking, /Weighing it up\./);
    assert.equal(m.open, false, 'a finished thought is folded away');
    assert.equal(m.content, 'Let me check.');
    assert.equal(m.call, 'get_weather');
    assert.deepEqual(JSON.parse(m.args), { city: 'Paris', days: 3 });
    await page.click('details.thinking summary');
    assert.equal(await page.$eval('details.thinking', (d) => d.open), true);

    // The composer now answers the call; the request carries it as a tool message.
    assert.match(await page.$eval('#input', (e) => e.placeholder), /get_weather/);
    await send(page, '{"forecast": "sunny"}');
    const prompt = server.fakeFrames().filter((f) => f.cmd === 'SUBMIT').at(-1).prompt;
    assert.ok(prompt.includes(syntax.result('{"forecast": "sunny"}')), prompt);
    assert.equal(await page.$$eval('.msg.tool', (l) => l.length), 1);
    assert.deepEqual(await page.problems(), []);
    await page.close();
  } finally {
    await server.stop();
  }
});

test('conversations: new, rename, delete, export and import', async () => {
  const server = await startServer([], { FAKE_REPLY: 'Noted.' }, { fake: true });
  try {
    const page = await openPage(`${server.url}/`);
    await ready(page);
    await page.evaluate(() => localStorage.clear());
    await page.reload({ waitUntil: 'load' });
    await ready(page);
    await send(page, 'first conversation');
    await page.click('#new-chat');
    await send(page, 'second conversation');
    const titles = () => page.$$eval('#conv-list .conv-name', (l) => l.map((b) => b.textContent));
    assert.deepEqual(await titles(), ['second conversation', 'first conversation']);

    await page.click('#conv-list .conv.active button[title="Rename"]');
    await page.$eval('#conv-list input.rename', (i) => { i.value = 'Renamed'; });
    await page.keyboard.press('Enter');
    assert.deepEqual(await titles(), ['Renamed', 'first conversation']);
    assert.equal(await page.$eval('#conv-title', (e) => e.textContent), 'Renamed');

    const exported = await page.evaluate(() => localStorage.getItem('cairn.conversations.v1'));
    page.once('dialog', (d) => d.accept());
    await page.click('#conv-list .conv.active button[title="Delete"]');
    assert.deepEqual(await titles(), ['first conversation']);

    const dir = mkdtempSync(join(tmpdir(), 'cairn-import-'));
    const file = join(dir, 'export.json');
    writeFileSync(file, JSON.stringify({ format: 'cairn-conversations', version: 1,
      convs: JSON.parse(exported).convs.filter((c) => c.title === 'Renamed') }));
    const input = await page.$('#import');
    await input.uploadFile(file);
    await page.waitForFunction(() => document.querySelectorAll('#conv-list .conv').length === 2);
    assert.match(await page.$eval('#composer-note', (e) => e.textContent), /Imported 1 conversation/);
    assert.equal(await page.$eval('#conv-title', (e) => e.textContent), 'Renamed');
    assert.equal(await page.$$eval('.msg.user .bubble', (l) => l[0].textContent), 'second conversation');

    writeFileSync(file, '{"convs": [{"messages": "nope"}]}');
    await input.uploadFile(file);
    await page.waitForFunction(() => /Import failed/.test(document.getElementById('composer-note').textContent));
    assert.equal(await page.$$eval('#conv-list .conv', (l) => l.length), 2, 'a bad file changes nothing');
    rmSync(dir, { recursive: true, force: true });
    assert.deepEqual(await page.problems(), []);
    await page.close();
  } finally {
    await server.stop();
  }
});

test('with --api-key the page asks for the key and then works', async () => {
  const server = await startServer(['--api-key', 'sekrit'], { FAKE_REPLY: 'Welcome.' }, { fake: true });
  try {
    // The browser itself logs each 401 reply as a console error: those are expected here.
    const page = await openPage(`${server.url}/`, { expectErrors: (t) => /401/.test(t) });
    await page.waitForSelector('#key-dialog[open]');
    await page.type('#key-dialog-input', 'wrong');
    await page.click('#key-dialog-save');
    await page.waitForFunction(() => document.getElementById('key-dialog').open
      && /refused/.test(document.getElementById('key-dialog-error').textContent));
    await page.$eval('#key-dialog-input', (i) => { i.value = ''; });
    await page.type('#key-dialog-input', 'sekrit');
    await page.click('#key-dialog-save');
    await ready(page);
    await send(page, 'hello');
    const [m] = await stats(page);
    assert.equal(m.error, null);
    assert.equal(m.text, 'Welcome.');
    assert.deepEqual(await page.problems(), []);
    await page.close();
  } finally {
    await server.stop();
  }
});

test('a reply that fails mid-stream shows the error, and editing the message goes on', async () => {
  // The scripted engine dies two tokens into any prompt that mentions the word; the gateway
  // ends the stream with an error event and restarts it.
  const server = await startServer([], { FAKE_CRASH_ON: 'kaboom' }, { fake: true });
  try {
    // When the engine dies before the reply's first byte went out, the gateway answers 503
    // (engine restarting) instead of a stream with an error event, and the browser logs that
    // reply as a console error: expected until the engine is back, and only until then.
    let restarting = true;
    const page = await openPage(`${server.url}/`, { expectErrors: (t) => restarting && /\b503\b/.test(t) });
    await ready(page);
    await setField(page, '#max-tokens', 5);
    await send(page, 'say kaboom');
    let [m] = await stats(page);
    assert.ok(m.error && /error|restart/i.test(m.error), JSON.stringify(m));
    assert.equal(m.stopped, false);
    // The gateway restarts the engine; until it is back a request would be refused with 503.
    for (let waited = 0; (await fetch(`${server.url}/health`)).status !== 200; waited += 20) {
      if (waited > HANG_GUARD_MS) throw new Error('the engine never came back');
      await new Promise((r) => setTimeout(r, 20));
    }
    restarting = false;
    await page.click('.msg.user .actions button');
    await page.waitForSelector('.edit textarea');
    await page.$eval('.edit textarea', (t) => { t.value = 'say hello'; });
    await page.click('.edit .edit-send');
    await finished(page, 1);
    [m] = await stats(page);
    assert.equal(m.error, null);
    assert.match(m.text, /^w0 w1 w2/);
    assert.deepEqual(await page.problems(), []);
    await page.close();
  } finally {
    await server.stop();
  }
});
