// Unit tests of the pure parts (cursor, backoff, close codes, tokens) and
// of the client's reactions to close codes, silence and the page's events,
// driven through a scripted WebSocket.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { backoffCeiling, backoffDelay } from '../dist/backoff.js';
import { closeAction, refusalAction } from '../dist/close.js';
import { Cursor } from '../dist/cursor.js';
import { Herald } from '../dist/index.js';
import { tokenExpiry } from '../dist/token.js';
import { eventually, sleep } from './harness.mjs';

test('cursor: a fresh durable subscription resumes from head; duplicates and gaps are judged by seq', () => {
  const c = new Cursor();
  assert.equal(c.since(), undefined);
  assert.deepEqual(c.onSubscribed({ epoch: 'E', first: 1, head: 7 }), { truncated: false, epochChanged: false });
  assert.deepEqual(c.since(), { seq: 7, epoch: 'E' });
  assert.deepEqual(c.onMessage(8), { kind: 'deliver' });
  assert.deepEqual(c.onMessage(8), { kind: 'duplicate' });
  assert.deepEqual(c.onMessage(5), { kind: 'duplicate' });
  assert.deepEqual(c.onMessage(11), { kind: 'gap', expected: 9 });
  assert.deepEqual(c.since(), { seq: 11, epoch: 'E' }, 'durable: resume after what was received');
});

test('cursor: truncation and epoch changes restart at first and are reported, even when the server omits the flag', () => {
  const t = new Cursor({ seq: 3, epoch: 'E' });
  assert.deepEqual(t.onSubscribed({ epoch: 'E', first: 10, head: 20, truncated: true }), { truncated: true, epochChanged: false });
  assert.deepEqual(t.onMessage(10), { kind: 'deliver' });
  const e = new Cursor({ seq: 50, epoch: 'OLD' });
  assert.deepEqual(e.onSubscribed({ epoch: 'NEW', first: 1, head: 3 }), { truncated: false, epochChanged: true });
  assert.deepEqual(e.since(), { seq: 0, epoch: 'NEW' });
  assert.deepEqual(e.onMessage(1), { kind: 'deliver' }, 'seq 1 of the new epoch is not a duplicate');
  const v = new Cursor();
  v.onSubscribed({});
  assert.deepEqual(v.onMessage(undefined), { kind: 'deliver' });
  assert.equal(v.since(), undefined, 'volatile channels have no position');
});

test('cursor: acked channels resume from the last handled seq and start where the server says', () => {
  const c = new Cursor();
  // Stored cursor 4, head 9: the server delivers 5..9 (unread 5).
  c.onSubscribed({ epoch: 'E', first: 1, head: 9, cursor: 4, unread: 5 });
  assert.equal(c.acked, true);
  assert.deepEqual(c.since(), { seq: 4, epoch: 'E' });
  for (const s of [5, 6, 7]) assert.deepEqual(c.onMessage(s), { kind: 'deliver' });
  c.onHandled(5);
  assert.deepEqual(c.since(), { seq: 5, epoch: 'E' }, 'acked: resume after what was handled');
  // Reconnect while 6 is being handled: 6 stays a duplicate, 7 comes again.
  c.onResubscribe(6);
  c.onSubscribed({ epoch: 'E', first: 1, head: 9, cursor: 5, unread: 4 });
  assert.deepEqual(c.onMessage(6), { kind: 'duplicate' });
  assert.deepEqual(c.onMessage(7), { kind: 'deliver' });
  // A failed handler: everything after the handled seq is taken again.
  c.onFailed();
  assert.deepEqual(c.onMessage(6), { kind: 'deliver' });
});

test('backoff: full jitter within a window that doubles up to the cap', () => {
  const o = { baseMs: 100, maxMs: 10_000 };
  assert.deepEqual([0, 1, 2, 3, 6, 7, 8, 1000].map((n) => backoffCeiling(n, o)), [100, 200, 400, 800, 6400, 10_000, 10_000, 10_000]);
  for (let attempt = 0; attempt < 10; attempt++) {
    const ceiling = backoffCeiling(attempt, o);
    const draws = Array.from({ length: 400 }, () => backoffDelay(attempt, o));
    assert.ok(draws.every((d) => d >= 0 && d <= ceiling));
    assert.ok(draws.some((d) => d < ceiling / 4) && draws.some((d) => d > (ceiling * 3) / 4), `attempt ${attempt} covers the window`);
  }
});

test('close codes: which reconnect, how, and which do not', () => {
  const table = {
    1000: 'retry', 1001: 'retry', 1006: 'retry', 1009: 'fatal', 1011: 'retry', 4000: 'fatal', 4001: 'fatal',
    4003: 'refresh_token', 4004: 'retry', 4005: 'resume', 4008: 'resume', 4009: 'slow', 4010: 'resume', 4999: 'retry',
  };
  for (const [code, action] of Object.entries(table)) assert.equal(closeAction(Number(code)), action, `close ${code}`);
  assert.equal(closeAction(4008, { code: 4008, reason: 'x', reconnect: false }), 'fatal', 'the disconnect frame wins');
  assert.equal(closeAction(1006, { code: 4005, reason: 'resync', reconnect: true }), 'resume');
  assert.equal(refusalAction(401, 'token_expired'), 'refresh_token');
  assert.equal(refusalAction(401, 'unauthorized'), 'fatal');
  assert.equal(refusalAction(403, 'forbidden'), 'fatal');
  assert.equal(refusalAction(400, 'bad_request'), 'retry', 'credentials fine: the upgrade itself failed');
  assert.equal(refusalAction(503, 'too_many_connections'), 'retry');
});

test('token expiry is read from the JWT payload', () => {
  const payload = Buffer.from(JSON.stringify({ sub: 'a', exp: 1700000000 })).toString('base64url');
  assert.equal(tokenExpiry(`h.${payload}.s`), 1700000000);
  assert.equal(tokenExpiry('not-a-jwt'), undefined);
});

/** A scripted WebSocket: records what the client sends; the test plays the server. */
class FakeSocket {
  static all = [];
  constructor(url) {
    this.url = url;
    this.readyState = 0;
    this.sent = [];
    this.onopen = this.onmessage = this.onclose = this.onerror = null;
    FakeSocket.all.push(this);
    setTimeout(() => this.open(), 0);
  }
  open() {
    this.readyState = 1;
    this.onopen?.({});
  }
  send(text) {
    this.sent.push(JSON.parse(text));
  }
  close() {
    this.readyState = 3;
  }
  /** The server sends a frame. */
  frame(f) {
    this.onmessage?.({ data: JSON.stringify(f) });
  }
  /** The server closes. */
  serverClose(code, reason = '') {
    this.readyState = 3;
    this.onclose?.({ code, reason });
  }
  /** Answer the subscribe we got with an ok. */
  okSubscribe(extra = {}) {
    const sub = this.sent.find((f) => f.type === 'subscribe');
    this.frame({ type: 'ok', req: sub.req, channel: sub.channel, epoch: 'E', first: 1, head: 0, truncated: false, ...extra });
    return sub;
  }
}

function fakeClient(opts = {}) {
  FakeSocket.all = [];
  return new Herald({ url: 'http://fake:1', user: 'u', WebSocket: FakeSocket, backoff: { baseMs: 10, maxMs: 20 }, ...opts });
}

test('client: 4001, 1009 and 4000 end the client; 4005 and 4008 reconnect and resume with since', async () => {
  for (const code of [4001, 1009, 4000]) {
    const c = fakeClient();
    await eventually('open', () => c.connected);
    FakeSocket.all[0].serverClose(code, 'bye');
    assert.equal(c.state.value.status, 'closed');
    assert.equal(c.state.value.error.code, 'disconnected');
    assert.equal(c.state.value.error.closeCode, code);
    await sleep(50);
    assert.equal(FakeSocket.all.length, 1, `no reconnect after ${code}`);
  }
  for (const code of [4005, 4008]) {
    const c = fakeClient();
    const seqs = [];
    c.subscribe('chat:a', { onMessage: (m) => void seqs.push(m.seq) });
    await eventually('open', () => c.connected && FakeSocket.all[0].sent.length === 1);
    const s = FakeSocket.all[0];
    s.okSubscribe();
    s.frame({ type: 'message', channel: 'chat:a', seq: 1, id: 'i1', ts: 1, data: {} });
    s.frame({ type: 'disconnect', code, reason: 'x', reconnect: true });
    s.serverClose(code);
    assert.equal(c.state.value.status, 'disconnected');
    await eventually('resubscribed', () => FakeSocket.all[1]?.sent.some((f) => f.type === 'subscribe'));
    const again = FakeSocket.all[1].sent.find((f) => f.type === 'subscribe');
    assert.deepEqual(again.since, { seq: 1, epoch: 'E' });
    c.close();
  }
});

test('client: after 4009 the reconnect waits at least rateLimitedDelayMs', async () => {
  const c = fakeClient({ rateLimitedDelayMs: 300 });
  await eventually('open', () => c.connected);
  const t0 = Date.now();
  FakeSocket.all[0].serverClose(4009, 'rate limited');
  assert.ok(c.state.value.retryAt - t0 >= 300);
  await eventually('reconnected', () => FakeSocket.all.length === 2 && c.connected);
  assert.ok(Date.now() - t0 >= 300);
  c.close();
});

test('client: a silent connection gets an application ping; no answer means reconnect', async () => {
  const c = fakeClient({ pingIntervalMs: 100, pongTimeoutMs: 200 });
  await eventually('open', () => c.connected);
  const s = FakeSocket.all[0];
  const ping = await eventually('a ping', () => s.sent.find((f) => f.type === 'ping'));
  s.frame({ type: 'pong', req: ping.req });
  await sleep(50);
  assert.equal(FakeSocket.all.length, 1, 'answered: same connection');
  await eventually('the unanswered ping abandons the socket', () => FakeSocket.all.length === 2, 3000);
  assert.equal(s.readyState, 3, 'the silent socket was closed');
  c.close();
});

test('client: back from the background or the network, it checks the connection at once', async () => {
  const page = new EventTarget();
  const doc = new EventTarget();
  doc.visibilityState = 'hidden';
  Object.assign(globalThis, { document: doc, addEventListener: page.addEventListener.bind(page), removeEventListener: page.removeEventListener.bind(page) });
  try {
    const c = fakeClient({ pingIntervalMs: 60_000 });
    await eventually('open', () => c.connected);
    const s = FakeSocket.all[0];
    doc.visibilityState = 'visible';
    doc.dispatchEvent(new Event('visibilitychange'));
    assert.equal(s.sent.filter((f) => f.type === 'ping').length, 1, 'a ping when the page is visible again');
    page.dispatchEvent(new Event('offline'));
    assert.equal(c.state.value.online, false);
    page.dispatchEvent(new Event('online'));
    assert.equal(c.state.value.online, true);
    // Disconnected and waiting: `online` reconnects without waiting.
    const slow = fakeClient({ backoff: { baseMs: 60_000, maxMs: 60_000 } });
    await eventually('open', () => slow.connected);
    FakeSocket.all[0].serverClose(1006);
    page.dispatchEvent(new Event('online'));
    await eventually('reconnected at once', () => FakeSocket.all.length === 2 && slow.connected, 2000);
    c.close();
    slow.close();
  } finally {
    delete globalThis.document;
    delete globalThis.addEventListener;
    delete globalThis.removeEventListener;
  }
});

test('client: frames are paced below the server limit; acks are not', async () => {
  const c = fakeClient({ framesPerSecond: 10 });
  await eventually('open', () => c.connected);
  const s = FakeSocket.all[0];
  for (let i = 0; i < 15; i++) void c.publish('chat:p', i).catch(() => {});
  assert.equal(s.sent.length, 10, 'a burst of the rate');
  await eventually('the rest within a second', () => s.sent.length === 15, 2000);
  assert.deepEqual(s.sent.map((f) => f.data), [...Array(15).keys()], 'in order');
  c.close();
});
