// The backend in control, seen from the TypeScript client: a server-side
// subscribe arrives as a `subscribed` subscription delivering from the
// requested position, an unsubscribe ends it, a disconnect with
// `reconnect: true` is followed by a reconnect and one with `reconnect:
// false` (a ban) closes the client for good; HeraldServer's calls list the
// user's connections, the channels and the nodes.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import WebSocket from 'ws';
import { Herald, HeraldServer, closeAction, CloseCode } from '../dist/index.js';
import { API_KEY, HeraldProcess, eventually } from './harness.mjs';

let herald;
let api;
before(async () => {
  herald = await new HeraldProcess().start();
  api = new HeraldServer({ url: herald.url, apiKey: API_KEY });
});
after(async () => herald?.dispose());

test('a server-side subscribe and unsubscribe reach the client as a subscription', async (t) => {
  for (let n = 1; n <= 3; n++) await api.publish('chat:ts-ctl', { n });
  const client = new Herald({ url: herald.url, user: 'tsa', device: 'web', WebSocket });
  t.after(() => client.close());
  await eventually('connected', () => client.state.value.status === 'connected');
  const subs = [];
  const seqs = [];
  let ended;
  client.on('subscribed', (sub) => {
    subs.push(sub);
    sub.on('unsubscribed', (e) => (ended = e.reason));
    sub.handle((m) => {
      seqs.push(m.seq);
    });
  });
  await api.subscribeUser('tsa', 'chat:ts-ctl', { since: { seq: 1 } });
  await eventually('the messages after seq 1', () => seqs.length === 2);
  assert.deepEqual(seqs, [2, 3]);
  assert.equal(subs[0].channel, 'chat:ts-ctl');
  assert.equal(subs[0].serverSide, true);
  const conns = await api.connections('tsa');
  assert.equal(conns.length, 1);
  assert.deepEqual(conns[0].subscriptions, ['chat:ts-ctl']);
  const page = await api.channels({ pattern: 'chat:ts-*' });
  assert.deepEqual(page.channels, [{ channel: 'chat:ts-ctl', subscribers: 1 }]);
  await api.unsubscribeUser('tsa', 'chat:ts-ctl');
  await eventually('the subscription ended', () => ended !== undefined);
  assert.equal(ended, 'unsubscribed by the server');
  assert.equal(subs[0].status, 'ended');
  assert.equal((await api.nodes()).length, 1);
});

test('a disconnect with reconnect is followed by a reconnect; a ban closes the client for good', async (t) => {
  const client = new Herald({ url: herald.url, user: 'tsb', WebSocket, backoff: { baseMs: 50, maxMs: 200 } });
  t.after(() => client.close());
  await eventually('connected', () => client.state.value.status === 'connected');
  await api.disconnect('tsb', { reconnect: true, reason: 'log in again' });
  await eventually('reconnected', () => client.state.value.connects === 2 && client.state.value.status === 'connected');
  const r = await api.disconnect('tsb', { reconnect: false, banSeconds: 60 });
  assert.ok(r.banned_until_ms > Date.now());
  await eventually('closed for good', () => client.state.value.status === 'closed');
  assert.equal(client.state.value.error?.code, 'disconnected');
  assert.equal(client.state.value.error?.closeCode, CloseCode.DISCONNECTED_FOR_GOOD);
  assert.equal(closeAction(CloseCode.DISCONNECTED), 'retry');
  assert.equal(closeAction(CloseCode.DISCONNECTED_FOR_GOOD), 'fatal');
  // A new client of the banned user is refused before the upgrade, for good.
  const again = new Herald({ url: herald.url, user: 'tsb', WebSocket });
  t.after(() => again.close());
  await eventually('refused', () => again.state.value.status === 'closed');
  assert.equal(again.state.value.error?.code, 'banned');
});
