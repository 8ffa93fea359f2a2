// Tokens: a server that closes with 4003 when the token expires gets a
// reconnect with a fresh token from getToken, and the subscription resumes;
// refusals say why with Herald's error codes.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import WebSocket from 'ws';
import { Herald, HeraldError, HeraldServer } from '../dist/index.js';
import { API_KEY, HeraldProcess, eventually, recorder, token } from './harness.mjs';

let herald;
before(async () => {
  // Not dev: tokens only. Short heartbeat so the expiry check runs often.
  herald = await new HeraldProcess({ dev: false, extraConfig: '\n[limits]\nping_interval = "300ms"\nidle_timeout = "10s"\n' }).start();
});
after(async () => herald?.dispose());

test('after 4003 (token expired) the client reconnects with a fresh token and resumes', async () => {
  const api = new HeraldServer({ url: herald.url, apiKey: API_KEY });
  let issued = 0;
  const client = new Herald({
    url: herald.url,
    WebSocket,
    getToken: async () => {
      issued += 1;
      return token('tess', { ttlSec: 2 });
    },
    backoff: { baseMs: 50, maxMs: 300 },
  });
  const closes = [];
  client.state.subscribe((s) => s.error && closes.push(s.error.closeCode));
  const seqs = [];
  const sub = client.subscribe('chat:tok', { onMessage: (m) => void seqs.push(m.seq) });
  const rec = recorder(sub);
  await sub.ready;
  await api.publish('chat:tok', { n: 1 });
  await eventually('the server closed with 4003 and the client came back', () => closes.includes(4003) && client.state.value.connects >= 2, 15_000);
  await api.publish('chat:tok', { n: 2 });
  await eventually('both messages', () => seqs.length >= 2);
  assert.deepEqual(seqs, [1, 2]);
  assert.ok(issued >= 2, `getToken called ${issued} times`);
  assert.deepEqual(rec.events, []);
  client.close();
});

test('a refused token is a typed, final error; so is dev-only auth on a secure server', async () => {
  const expired = new Herald({ url: herald.url, WebSocket, token: token('uma', { ttlSec: -60 }) });
  await eventually('closed', () => expired.state.value.status === 'closed');
  const err = expired.state.value.error;
  assert.ok(err instanceof HeraldError);
  assert.equal(err.code, 'token_expired');
  assert.equal(err.status, 401);

  const bad = new Herald({ url: herald.url, WebSocket, token: 'not.a.token' });
  await eventually('closed', () => bad.state.value.status === 'closed');
  assert.equal(bad.state.value.error.code, 'unauthorized');

  const dev = new Herald({ url: herald.url, WebSocket, user: 'mallory' });
  const sub = dev.subscribe('chat:x');
  await assert.rejects(sub.ready, (e) => e.code === 'forbidden');
  assert.equal(dev.state.value.status, 'closed');
  assert.equal(dev.state.value.error.code, 'forbidden');

  // A token without the channel: the subscription is refused, the connection stays.
  const narrow = new Herald({ url: herald.url, WebSocket, token: token('vic', { channels: ['chat:ok'] }) });
  await assert.rejects(narrow.subscribe('chat:secret').ready, (e) => e instanceof HeraldError && e.code === 'forbidden' && e.channel === 'chat:secret');
  const ok = await narrow.subscribe('chat:ok').ready;
  assert.equal(ok.channel, 'chat:ok');
  assert.equal(narrow.state.value.status, 'connected');
  narrow.close();
});
