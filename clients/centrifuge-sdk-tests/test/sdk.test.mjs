// Herald's Centrifugo endpoint driven by the real centrifuge-js SDK (pinned
// in package-lock.json), against a real `herald serve` process (the
// TypeScript client's harness: free port, temp data dir, HS256 tokens),
// over the wire CENTRIFUGE_PROTOCOL names (wire.mjs).
import { test as nodeTest, before, after } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { Centrifuge, PROTOCOL, data, num, payload } from './wire.mjs';
import { API_KEY, HeraldProcess, eventually, token } from '../../typescript/test/harness.mjs';

let herald;
before(async () => {
  herald = await new HeraldProcess({ dev: false }).start();
});
after(async () => {
  await herald?.dispose();
});

// Every test's name says the wire.
const test = (name, fn) => nodeTest(`${PROTOCOL}: ${name}`, fn);

const endpoint = () => `ws://127.0.0.1:${herald.port}/connection/websocket`;

/** An SDK client for `user` with a real token (and a fresh one on refresh). */
function client(user, { ttlSec = 3600, onToken } = {}) {
  return new Centrifuge(endpoint(), {
    websocket: WebSocket,
    token: token(user, { ttlSec }),
    getToken: async () => {
      onToken?.();
      return token(user, { ttlSec });
    },
    minReconnectDelay: 50,
    maxReconnectDelay: 300,
  });
}

async function api(method, path, body) {
  const res = await fetch(`${herald.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : undefined };
}

async function publishHttp(channel, data) {
  const r = await api('POST', `/api/v1/channels/${channel}/messages`, { data });
  assert.equal(r.status, 201, JSON.stringify(r.body));
  return r.body;
}

/** Every publication a subscription hands over, in order. */
function collect(sub) {
  const got = [];
  sub.on('publication', (ctx) => got.push(ctx));
  return got;
}

function subscribed(sub) {
  return new Promise((resolve) => sub.once('subscribed', resolve));
}

const offsets = (got) => got.map((p) => num(p.offset));
const range = (from, to) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

test('connect, subscribe and receive in order, data byte for byte, id and meta in tags', async (t) => {
  const c = client('js-order');
  t.after(() => c.disconnect());
  const sub = c.newSubscription('chat:order');
  const got = collect(sub);
  const ready = subscribed(sub);
  sub.subscribe();
  c.connect();
  const ctx = await ready;
  assert.equal(ctx.recoverable, true);
  assert.equal(ctx.positioned, true);
  const ids = [];
  for (let i = 1; i <= 20; i++) ids.push((await publishHttp('chat:order', { i, text: `line\n${i}` })).id);
  await eventually('20 publications', () => got.length >= 20);
  assert.deepEqual(offsets(got), range(1, 20));
  assert.deepEqual(
    got.map((p) => data(p.data)),
    range(1, 20).map((i) => ({ i, text: `line\n${i}` })),
  );
  assert.deepEqual(
    got.map((p) => p.tags.herald_id),
    ids,
  );
});

/** Publish `n` over HTTP while `gone` is in effect, then check the
 *  subscription recovered everything exactly once. */
async function recoversAfter(t, name, gone) {
  const channel = `chat:${name}`;
  const c = client(`js-${name}`);
  t.after(() => c.disconnect());
  const sub = c.newSubscription(channel);
  const got = collect(sub);
  const subscribes = [];
  sub.on('subscribed', (ctx) => subscribes.push(ctx));
  sub.subscribe();
  c.connect();
  await eventually('subscribed', () => subscribes.length === 1);
  for (let i = 1; i <= 5; i++) await publishHttp(channel, i);
  await eventually('first 5', () => got.length >= 5);
  await gone(c, async () => {
    for (let i = 6; i <= 15; i++) await publishHttp(channel, i);
  });
  await eventually('resubscribed', () => subscribes.length >= 2);
  for (let i = 16; i <= 20; i++) await publishHttp(channel, i);
  await eventually('all 20', () => got.length >= 20);
  const again = subscribes.at(-1);
  assert.equal(again.wasRecovering, true);
  assert.equal(again.recovered, true);
  assert.deepEqual(offsets(got), range(1, 20), 'nothing missing, nothing doubled');
  assert.deepEqual(
    got.map((p) => data(p.data)),
    range(1, 20),
  );
}

test('a killed connection reconnects and recovers completely', async (t) => {
  await recoversAfter(t, 'killed', async (c, meanwhile) => {
    const reconnecting = new Promise((resolve) => c.once('connecting', resolve));
    // The SDK's socket dies without a close frame.
    c._transport._transport.terminate();
    await reconnecting;
    await meanwhile();
  });
});

test('disconnect() then connect() recovers completely', async (t) => {
  await recoversAfter(t, 'reconnect', async (c, meanwhile) => {
    c.disconnect();
    await meanwhile();
    c.connect();
  });
});

test('a server restart (kill -9) is followed by a complete recovery', async (t) => {
  await recoversAfter(t, 'restart', async (_c, meanwhile) => {
    await herald.kill();
    await herald.start();
    await meanwhile();
  });
});

test('publish from the SDK reaches subscribers and history', async (t) => {
  const a = client('js-pub-a');
  const b = client('js-pub-b');
  t.after(() => {
    a.disconnect();
    b.disconnect();
  });
  const subA = a.newSubscription('chat:sdkpub');
  const subB = b.newSubscription('chat:sdkpub');
  const got = collect(subB);
  const ready = Promise.all([subscribed(subA), subscribed(subB)]);
  subA.subscribe();
  subB.subscribe();
  a.connect();
  b.connect();
  await ready;
  for (let i = 1; i <= 5; i++) await subA.publish(payload({ from: 'sdk', i }));
  await eventually('5 on the other client', () => got.length >= 5);
  assert.deepEqual(offsets(got), range(1, 5));
  const h = await api('GET', '/api/v1/channels/chat:sdkpub/messages?after=0&limit=10');
  assert.deepEqual(
    h.body.messages.map((m) => m.data),
    range(1, 5).map((i) => ({ from: 'sdk', i })),
  );
  // The SDK's history call, with a position and a limit.
  const hist = await subA.history({ limit: 2, since: { offset: 2, epoch: h.body.epoch } });
  assert.deepEqual(
    hist.publications.map((p) => num(p.offset)),
    [3, 4],
  );
  assert.equal(num(hist.offset), 5);
  assert.equal(hist.epoch, h.body.epoch);
});

test('presence in a room: join, presence, stats, leave, then the room closes', async (t) => {
  const room = 'room:js1';
  assert.equal((await api('PUT', `/api/v1/rooms/${room}`, { host: 'host' })).status, 201);
  const a = client('js-alice');
  const b = client('js-bob');
  t.after(() => {
    a.disconnect();
    b.disconnect();
  });
  const subA = a.newSubscription(room, { joinLeave: true });
  const joins = [];
  const leaves = [];
  subA.on('join', (ctx) => joins.push(ctx.info.user));
  subA.on('leave', (ctx) => leaves.push(ctx.info.user));
  const unsubscribed = new Promise((resolve) => subA.once('unsubscribed', resolve));
  const readyA = subscribed(subA);
  subA.subscribe();
  a.connect();
  await readyA;
  const subB = b.newSubscription(room);
  const readyB = subscribed(subB);
  subB.subscribe();
  b.connect();
  await readyB;
  await eventually('bob joined', () => joins.includes('js-bob'));
  const presence = await subA.presence();
  const users = Object.values(presence.clients).map((i) => i.user).sort();
  assert.deepEqual(users, ['js-alice', 'js-bob']);
  const stats = await subA.presenceStats();
  assert.equal(stats.numClients, 2);
  assert.equal(stats.numUsers, 2);
  subB.unsubscribe();
  await eventually('bob left', () => leaves.includes('js-bob'));
  // Closing the room ends the subscription for good.
  assert.equal((await api('DELETE', `/api/v1/rooms/${room}`)).status, 200);
  const ctx = await unsubscribed;
  assert.equal(ctx.code, 2000);
  assert.equal(subA.state, 'unsubscribed');
});

test('token refresh keeps the connection', async (t) => {
  let refreshed = 0;
  const c = client('js-refresh', { ttlSec: 2, onToken: () => refreshed++ });
  t.after(() => c.disconnect());
  const sub = c.newSubscription('chat:refresh');
  const got = collect(sub);
  const ready = subscribed(sub);
  sub.subscribe();
  c.connect();
  await ready;
  const disconnects = [];
  c.on('disconnected', (ctx) => disconnects.push(ctx));
  c.on('connecting', (ctx) => disconnects.push(ctx));
  await eventually('two refreshes', () => refreshed >= 2);
  await publishHttp('chat:refresh', 'still here');
  await eventually('a publication after the refreshes', () => got.length === 1);
  assert.equal(c.state, 'connected');
  assert.deepEqual(disconnects, [], 'the connection never dropped');
});

test('acked channel: the offline inbox is the first recovery, the recover offset acks', async (t) => {
  const user = 'js-inbox';
  const channel = `user:${user}`;
  for (let i = 1; i <= 3; i++) await publishHttp(channel, i);
  const c = client(user);
  t.after(() => c.disconnect());
  const sub = c.newSubscription(channel);
  const got = collect(sub);
  sub.subscribe();
  c.connect();
  await eventually('the inbox', () => got.length >= 3);
  assert.deepEqual(offsets(got), [1, 2, 3]);
  // Away: 4 and 5 wait; back, the SDK recovers from 3, which acks 1..=3.
  c.disconnect();
  for (let i = 4; i <= 5; i++) await publishHttp(channel, i);
  const recovered = new Promise((resolve) => sub.once('subscribed', resolve));
  c.connect();
  assert.equal((await recovered).recovered, true);
  await eventually('4 and 5', () => got.length >= 5);
  assert.deepEqual(offsets(got), [1, 2, 3, 4, 5]);
  // A new client (no position) gets what was not acked yet: 4 and 5.
  const other = client(user);
  t.after(() => other.disconnect());
  const sub2 = other.newSubscription(channel);
  const got2 = collect(sub2);
  sub2.subscribe();
  other.connect();
  await eventually('the unacked rest', () => got2.length >= 2);
  assert.deepEqual(offsets(got2), [4, 5]);
});
