// In a real browser: Debian's headless Chromium driven by puppeteer-core.
// A test page on the bundle the console ships resumes across a server
// crash; a page with the browser's own EventSource resumes two channels
// across a kill -9 through Last-Event-ID; the console page loads,
// connects and shows a published message (screenshot in
// target/test-artifacts/console.png).
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import puppeteer from 'puppeteer-core';
import { HeraldServer } from '../../dist/index.js';
import { API_KEY, HeraldProcess, freePort, repo, token } from '../harness.mjs';

const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const WAIT = { timeout: 20_000, polling: 50 };

let herald;
let browser;
let profile;
let pages;
let pagesUrl;

before(async () => {
  herald = await new HeraldProcess().start();
  // The test page and the console's bundle, from another origin than Herald.
  const files = {
    '/page.html': ['text/html', readFileSync(join(import.meta.dirname, 'page.html'))],
    '/sse.html': ['text/html', readFileSync(join(import.meta.dirname, 'sse.html'))],
    '/herald-client.js': ['text/javascript', readFileSync(join(repo, 'crates/herald-server/console/herald-client.js'))],
  };
  const port = await freePort();
  pages = createServer((req, res) => {
    const f = files[new URL(req.url, 'http://x').pathname];
    res.writeHead(f ? 200 : 404, { 'content-type': f?.[0] ?? 'text/plain' }).end(f?.[1] ?? 'not found');
  });
  await new Promise((r) => pages.listen(port, '127.0.0.1', r));
  pagesUrl = `http://127.0.0.1:${port}`;
  profile = mkdtempSync(join(tmpdir(), 'herald-chromium-'));
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    userDataDir: profile,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
});

after(async () => {
  await browser?.close();
  await new Promise((r) => (pages ? pages.close(r) : r()));
  await herald?.dispose();
  if (profile) rmSync(profile, { recursive: true, force: true });
});

test('in Chromium: subscribe, receive, server killed and restarted, resume: the complete sequence in order', async () => {
  const api = new HeraldServer({ url: herald.url, apiKey: API_KEY });
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(`${pagesUrl}/page.html?server=${encodeURIComponent(herald.url)}`);
  await page.waitForFunction('window.ready === true || window.failed', WAIT);
  assert.equal(await page.evaluate('window.failed'), undefined);

  for (let n = 1; n <= 10; n++) await api.publish('chat:browser', { n });
  await page.waitForFunction('window.seqs.length >= 10', WAIT);
  await herald.kill();
  await page.waitForFunction("window.client.state.value.status !== 'connected'", WAIT);
  await herald.start();
  for (let n = 11; n <= 25; n++) await api.publish('chat:browser', { n });
  await page.waitForFunction('window.seqs.length >= 25', WAIT);

  const seqs = await page.evaluate('window.seqs');
  assert.deepEqual(seqs, Array.from({ length: 25 }, (_, i) => i + 1), 'every seq once, in order');
  assert.ok((await page.evaluate('window.connects')) >= 2, 'it reconnected');
  assert.deepEqual(await page.evaluate('window.events'), []);
  assert.deepEqual(errors, []);
  await page.close();
});

test('in Chromium: EventSource on two channels, server killed with -9 and restarted, publishes in between: every message once, in order', async () => {
  const api = new HeraldServer({ url: herald.url, apiKey: API_KEY });
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(`${pagesUrl}/sse.html?server=${encodeURIComponent(herald.url)}`);
  await page.waitForFunction('window.ready === true', WAIT);

  const publish = async (from, to) => {
    for (let n = from; n <= to; n++) {
      await api.publish('chat:sse-a', { n });
      await api.publish('chat:sse-b', { n });
    }
  };
  await publish(1, 10);
  await page.waitForFunction('window.got.length >= 20', WAIT);
  await herald.kill();
  await page.waitForFunction('window.events.readyState !== EventSource.OPEN', WAIT);
  await herald.start();
  // Before the browser's reconnect (retry: 2 s) and after it.
  await publish(11, 20);
  await page.waitForFunction('window.opens >= 2', WAIT);
  await publish(21, 25);
  await page.waitForFunction('window.got.length >= 50', WAIT);

  const got = await page.evaluate('window.got');
  for (const channel of ['chat:sse-a', 'chat:sse-b']) {
    const mine = got.filter((m) => m.channel === channel);
    assert.deepEqual(mine.map((m) => m.seq), Array.from({ length: 25 }, (_, i) => i + 1), `${channel}: every seq once, in order`);
    assert.deepEqual(mine.map((m) => m.data.n), Array.from({ length: 25 }, (_, i) => i + 1));
  }
  assert.equal(got.length, 50, 'nothing doubled');
  assert.deepEqual(errors, []);
  await page.close();
});

test('the console loads, connects, subscribes and shows a published message', async () => {
  const api = new HeraldServer({ url: herald.url, apiKey: API_KEY });
  const page = await browser.newPage();
  await page.setViewport({ width: 1400, height: 900 });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => m.type() === 'error' && errors.push(m.text()));
  await page.goto(`${herald.url}/console/?user=ada`);
  await page.waitForFunction("document.getElementById('status').dataset.status === 'connected'", WAIT);

  // Subscribe from the page's form.
  await page.$eval('#sub-channel', (e) => (e.value = 'chat:console'));
  await page.click('#subscribe-form button[type=submit]');
  await page.waitForFunction("document.querySelector('.sub[data-channel=\"chat:console\"] .meta')?.textContent.startsWith('head')", WAIT);

  // Publish from the page (over the socket), and once from a backend.
  await page.$eval('#pub-channel', (e) => (e.value = 'chat:console'));
  await page.$eval('#pub-data', (e) => (e.value = '{"text": "hello from the console"}'));
  await page.click('#publish-form button[type=submit]');
  await page.waitForFunction("document.getElementById('pub-ok')?.textContent.startsWith('seq 1')", WAIT);
  await api.publish('chat:console', { text: 'hello from a backend <b>not bold</b>' });
  await page.waitForFunction(
    "document.querySelectorAll('.sub[data-channel=\"chat:console\"] tr.message').length >= 2",
    WAIT,
  );
  const rows = await page.$$eval('.sub[data-channel="chat:console"] tr.message', (trs) => trs.map((tr) => [...tr.children].map((td) => td.textContent)));
  assert.equal(rows.length, 2);
  assert.equal(rows[0][0], '2');
  assert.match(rows[0][3], /not bold/);
  assert.equal(rows[1][0], '1');
  assert.match(rows[1][3], /hello from the console/);
  assert.match(rows[1][2], /^\d+ ms$/, 'latency shown');
  assert.equal(await page.$('.sub b'), null, 'message data is text, never HTML');

  // Room, presence, inbox, metrics.
  await page.click('#room-create');
  await page.waitForFunction("document.getElementById('room-view').textContent.includes('open')", WAIT);
  await page.$eval('#sub-channel', (e) => (e.value = 'room:demo'));
  await page.$eval('#sub-since', (e) => (e.value = '0'));
  await page.click('#subscribe-form button[type=submit]');
  // ada is the host: her joining makes the room live.
  await page.waitForFunction("document.querySelector('.sub[data-channel=\"room:demo\"]')?.textContent.includes('live')", WAIT);
  await page.click('#room-form button[type=submit]');
  await page.waitForFunction("document.getElementById('room-view').textContent.includes('live')", WAIT);
  assert.match(await page.$eval('#room-view', (e) => e.textContent), /ada/, 'ada is listed in presence');
  await api.publish('user:ada', { note: 'for your inbox' });
  await page.click('#inbox-form button[type=submit]');
  await page.waitForFunction("document.getElementById('inbox-view').textContent.includes('user:ada')", WAIT);
  const metric = (name) => `Number(document.querySelector('[data-metric="${name}"]')?.textContent.split(' ')[0])`;
  await page.waitForFunction(`${metric('connections')} >= 1 && ${metric('subscriptions')} >= 2 && ${metric('room changes')} >= 2`, WAIT);

  // Users and nodes: ada's connection with its subscriptions, the active
  // channels, this node.
  await page.click('#user-form button[type=submit]');
  await page.waitForFunction("document.getElementById('users-view').textContent.includes('room:demo')", WAIT);
  await page.$eval('#ctl-pattern', (e) => (e.value = 'chat:*'));
  await page.click('#channels-form button[type=submit]');
  await page.waitForFunction("document.getElementById('users-view').textContent.includes('chat:console')", WAIT);
  await page.click('#ctl-nodes');
  await page.waitForFunction("document.getElementById('users-view').textContent.includes('herald-')", WAIT);

  const dir = join(repo, 'target/test-artifacts');
  mkdirSync(dir, { recursive: true });
  await page.screenshot({ path: join(dir, 'console.png'), fullPage: true });
  assert.deepEqual(errors, []);
  await page.close();
});

test('outside dev mode the console asks for the API key and a user token, and works with them', async () => {
  const secure = await new HeraldProcess({ dev: false, topConfig: 'console = "on"\n' }).start();
  const page = await browser.newPage();
  try {
    await page.goto(`${secure.url}/console/`);
    await page.waitForSelector('#login:not([hidden])', WAIT);
    assert.equal(await page.$eval('#api-key-row', (e) => e.hidden), false, 'asks for the API key');
    assert.equal(await page.$eval('#token-row', (e) => e.hidden), false, 'asks for a user token');
    await page.type('#api-key', 'a-wrong-key-0123456789');
    await page.type('#token', token('eve'));
    await page.click('#login-form button[type=submit]');
    await page.waitForFunction("document.getElementById('login-error').textContent.includes('refused')", WAIT);
    await page.$eval('#api-key', (e) => (e.value = ''));
    await page.type('#api-key', API_KEY);
    await page.click('#login-form button[type=submit]');
    await page.waitForFunction("document.getElementById('status').dataset.status === 'connected'", WAIT);
    assert.match(await page.$eval('#whoami', (e) => e.textContent), /^eve /, 'the user is the token\'s sub');
    await page.$eval('#pub-channel', (e) => (e.value = 'chat:secure'));
    await page.$eval('#pub-via', (e) => (e.value = 'http'));
    await page.click('#publish-form button[type=submit]');
    await page.waitForFunction("document.getElementById('pub-ok')?.textContent.startsWith('seq 1')", WAIT);
  } finally {
    await page.close();
    await secure.dispose();
  }
});
