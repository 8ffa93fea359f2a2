// Resume across a server crash: the client keeps its cursor, reconnects
// with backoff and resumes from the last seq it handled; publishes made
// while it was away all arrive, in order, none twice.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import WebSocket from 'ws';
import { Herald, HeraldServer } from '../dist/index.js';
import { API_KEY, HeraldProcess, eventually, recorder } from './harness.mjs';

const range = (a, b) => Array.from({ length: b - a + 1 }, (_, i) => a + i);

let herald;
before(async () => {
  herald = await new HeraldProcess().start();
});
after(async () => herald?.dispose());

test('resumes after the server is killed and restarted, with publishes in between: nothing missing, nothing doubled', async () => {
  const api = new HeraldServer({ url: herald.url, apiKey: API_KEY });
  const client = new Herald({ url: herald.url, user: 'alice', WebSocket, backoff: { baseMs: 50, maxMs: 500 } });
  const states = [];
  client.state.subscribe((s) => states.push(s.status));
  const seen = [];
  const sub = client.subscribe('chat:resume', { onMessage: (m) => void seen.push({ seq: m.seq, n: m.data.n }) });
  const rec = recorder(sub);
  const info = await sub.ready;
  assert.equal(info.head, 0);

  for (const n of range(1, 20)) await api.publish('chat:resume', { n });
  await eventually('the first 20 messages', () => seen.length >= 20);

  await herald.kill();
  await eventually('the client sees the connection gone', () => client.state.value.status !== 'connected');
  await herald.start();
  // Published while the client is still away (its backoff is running or
  // it is resubscribing): it must catch up on these from the log.
  for (const n of range(21, 40)) await api.publish('chat:resume', { n });
  await eventually('all 40 messages', () => seen.length >= 40);
  for (const n of range(41, 50)) await api.publish('chat:resume', { n });
  await eventually('all 50 messages', () => seen.length >= 50);

  assert.deepEqual(seen.map((m) => m.seq), range(1, 50), 'every seq once, in order');
  assert.deepEqual(seen.map((m) => m.n), range(1, 50));
  assert.equal(client.state.value.connects, 2);
  assert.ok(states.includes('disconnected'), `states: ${states}`);
  assert.deepEqual(rec.events, [], 'no reset, gap or error');
  assert.deepEqual(sub.position?.seq, 50);
  client.close();
  assert.equal(client.state.value.status, 'closed');
});

test('async iteration resumes too, and a saved position resumes a new client', async () => {
  const api = new HeraldServer({ url: herald.url, apiKey: API_KEY });
  const client = new Herald({ url: herald.url, user: 'bob', WebSocket, backoff: { baseMs: 50, maxMs: 500 } });
  const sub = client.subscribe('chat:iter', { since: { seq: 0 } });
  const got = [];
  const reading = (async () => {
    for await (const msg of sub) {
      got.push(msg.seq);
      if (got.length === 10) break;
    }
  })();
  for (const n of range(1, 5)) await api.publish('chat:iter', { n });
  await eventually('5 messages', () => got.length >= 5);
  await herald.restart();
  for (const n of range(6, 10)) await api.publish('chat:iter', { n });
  await reading;
  assert.deepEqual(got, range(1, 10));
  assert.equal(sub.status, 'ended', 'leaving the loop ends the subscription');
  const position = sub.position;
  // 9 was handled; 10 was being handled when the loop broke: not handled.
  assert.deepEqual(position?.seq, 9);
  client.close();

  // A new client (a reloaded page) resumes from the saved position.
  for (const n of range(11, 12)) await api.publish('chat:iter', { n });
  const again = new Herald({ url: herald.url, user: 'bob', WebSocket });
  const seqs = [];
  const sub2 = again.subscribe('chat:iter', { since: position, onMessage: (m) => void seqs.push(m.seq) });
  const info = await sub2.ready;
  assert.equal(info.truncated, false);
  assert.equal(info.epochChanged, false);
  await eventually('the rest', () => seqs.length >= 3);
  assert.deepEqual(seqs, [10, 11, 12]);
  again.close();
});

test('a new data directory is a new epoch: the client is told, never silently', async () => {
  const other = await new HeraldProcess().start();
  try {
    const api = new HeraldServer({ url: other.url, apiKey: API_KEY });
    const client = new Herald({ url: other.url, user: 'carol', WebSocket, backoff: { baseMs: 50, maxMs: 500 } });
    const seen = [];
    const sub = client.subscribe('chat:epoch', { onMessage: (m) => void seen.push(m.data.n) });
    const rec = recorder(sub);
    await sub.ready;
    for (const n of range(1, 3)) await api.publish('chat:epoch', { n });
    await eventually('3 messages', () => seen.length >= 3);
    await other.kill();
    const { rmSync } = await import('node:fs');
    rmSync(other.dataDir, { recursive: true, force: true });
    await other.start();
    await api.publish('chat:epoch', { n: 100 });
    await eventually('the new log', () => seen.includes(100));
    const changed = rec.events.filter((e) => e.type === 'epoch_changed');
    assert.equal(changed.length, 1, JSON.stringify(rec.events));
    assert.equal(changed[0].ev.first, 1);
    assert.deepEqual(seen, [1, 2, 3, 100]);
    client.close();
  } finally {
    await other.dispose();
  }
});
