// Server-side subscriptions, the personal channel and user-limited
// channels through the real centrifuge-js SDK, over the wire
// CENTRIFUGE_PROTOCOL names (wire.mjs), against a `herald serve` with
// `[personal] subscribe = true` and a `dm` namespace of user-limited
// channels.
import { test as nodeTest, before, after } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { Centrifuge, PROTOCOL, data, num } from './wire.mjs';
import { API_KEY, HeraldProcess, eventually, token } from '../../typescript/test/harness.mjs';

const test = (name, fn) => nodeTest(`${PROTOCOL}: ${name}`, fn);

let herald;
before(async () => {
  const extraConfig = `
[personal]
subscribe = true
namespace = "user"

[namespaces.dm]
delivery = "durable"
allow_user_limited = true
`;
  herald = await new HeraldProcess({ dev: false, extraConfig }).start();
});
after(async () => {
  await herald?.dispose();
});

const endpoint = () => `ws://127.0.0.1:${herald.port}/connection/websocket`;

function client(user, channels = ['*']) {
  return new Centrifuge(endpoint(), {
    websocket: WebSocket,
    token: token(user, { channels }),
    getToken: async () => token(user, { channels }),
    minReconnectDelay: 50,
    maxReconnectDelay: 300,
  });
}

async function publishHttp(channel, value) {
  const res = await fetch(`${herald.url}/api/v1/channels/${encodeURIComponent(channel)}/messages`, {
    method: 'POST',
    headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
    body: JSON.stringify({ data: value }),
  });
  assert.equal(res.status, 201, await res.text());
}

/** The client's server-side publications of `channel`, in order. */
function collect(c, channel) {
  const got = [];
  c.on('publication', (ctx) => {
    if (ctx.channel === channel) got.push({ offset: num(ctx.offset), data: data(ctx.data) });
  });
  return got;
}

const range = (from, to) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

test('token channels are server-side subscriptions, recovered after a kill -9 restart', async (t) => {
  const channel = 'chat:js-server-side';
  const c = client('js-ss', [channel, 'chat:*']);
  t.after(() => c.disconnect());
  const subscribed = [];
  c.on('subscribed', (ctx) => {
    if (ctx.channel === channel) subscribed.push(ctx);
  });
  const got = collect(c, channel);
  c.connect();
  await eventually('subscribed on connect', () => subscribed.length === 1);
  assert.equal(subscribed[0].recoverable, true);
  for (let i = 1; i <= 5; i++) await publishHttp(channel, i);
  await eventually('first 5', () => got.length >= 5);
  await herald.kill();
  await herald.start();
  for (let i = 6; i <= 10; i++) await publishHttp(channel, i);
  await eventually('recovered on reconnect', () => subscribed.length >= 2);
  assert.equal(subscribed.at(-1).wasRecovering, true);
  assert.equal(subscribed.at(-1).recovered, true);
  for (let i = 11; i <= 12; i++) await publishHttp(channel, i);
  await eventually('all 12', () => got.length >= 12);
  assert.deepEqual(got.map((p) => p.offset), range(1, 12), 'nothing missing, nothing doubled');
  assert.deepEqual(got.map((p) => p.data), range(1, 12));
});

test('the personal channel is subscribed on connect', async (t) => {
  const c = client('js-personal');
  t.after(() => c.disconnect());
  const got = collect(c, 'user:js-personal');
  const subscribed = new Promise((resolve) => c.on('subscribed', (ctx) => ctx.channel === 'user:js-personal' && resolve(ctx)));
  c.connect();
  await subscribed;
  await publishHttp('user:js-personal', { note: 'for you' });
  await eventually('the notification', () => got.length === 1);
  assert.deepEqual(got[0], { offset: 1, data: { note: 'for you' } });
});

test('a user-limited channel: its users subscribe, a third user is refused', async (t) => {
  const channel = 'dm:chat#js-a,js-b';
  const a = client('js-a');
  const c = client('js-c');
  t.after(() => {
    a.disconnect();
    c.disconnect();
  });
  a.connect();
  c.connect();
  const subA = a.newSubscription(channel);
  const readyA = new Promise((resolve) => subA.once('subscribed', resolve));
  subA.subscribe();
  await readyA;
  const subC = c.newSubscription(channel);
  const refused = new Promise((resolve) => subC.once('unsubscribed', resolve));
  subC.subscribe();
  const ctx = await refused;
  // The SDK unsubscribes on a permission error (103) and says so.
  assert.equal(subC.state, 'unsubscribed', JSON.stringify(ctx));
  assert.equal(ctx.code, 103, JSON.stringify(ctx));
});

/** A call of the backend's API. */
async function api(method, path, body) {
  const res = await fetch(`${herald.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  assert.equal(res.status, 202, text);
  return JSON.parse(text);
}

test('the backend subscribes and unsubscribes a connected user: server-side subscription events', async (t) => {
  const channel = 'chat:js-api-sub';
  for (let i = 1; i <= 2; i++) await publishHttp(channel, i);
  const c = client('js-api', ['chat:nothing']);
  t.after(() => c.disconnect());
  const subscribed = [];
  const unsubscribed = [];
  c.on('subscribed', (ctx) => ctx.channel === channel && subscribed.push(ctx));
  c.on('unsubscribed', (ctx) => ctx.channel === channel && unsubscribed.push(ctx));
  const got = collect(c, channel);
  const connected = new Promise((resolve) => c.once('connected', resolve));
  c.connect();
  await connected;
  await api('POST', '/api/v1/users/js-api/subscriptions', { channel, since: { seq: 1 } });
  await eventually('subscribed by the backend', () => subscribed.length === 1);
  assert.equal(subscribed[0].recoverable, true);
  await eventually('from after seq 1', () => got.length === 1);
  await publishHttp(channel, 3);
  await eventually('live', () => got.length === 2);
  assert.deepEqual(got.map((p) => p.offset), [2, 3]);
  await api('DELETE', `/api/v1/users/js-api/subscriptions/${encodeURIComponent(channel)}`);
  await eventually('unsubscribed by the backend', () => unsubscribed.length === 1);
  await publishHttp(channel, 4);
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(got.length, 2, 'nothing after the unsubscribe');
});

test('a disconnect with reconnect is followed by a reconnect; a ban stops the SDK', async (t) => {
  const c = client('js-dis', ['chat:*']);
  t.after(() => c.disconnect());
  const connects = [];
  c.on('connected', () => connects.push(Date.now()));
  const reasons = [];
  c.on('connecting', (ctx) => reasons.push(ctx.code));
  c.connect();
  await eventually('connected', () => connects.length === 1);
  await api('POST', '/api/v1/users/js-dis/disconnect', { reconnect: true });
  await eventually('reconnected', () => connects.length === 2);
  assert.ok(reasons.includes(3011), `force reconnect: ${reasons}`);
  const disconnected = new Promise((resolve) => c.once('disconnected', resolve));
  await api('POST', '/api/v1/users/js-dis/disconnect', { reconnect: false, ban_seconds: 60 });
  const ctx = await disconnected;
  assert.equal(ctx.code, 3503, JSON.stringify(ctx));
  assert.equal(c.state, 'disconnected');
});
