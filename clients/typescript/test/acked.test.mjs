// Acked channels (`user:` namespace, ack_timeout 1 s in the test config):
// acks after the handler resolves, batched; a failed handler gets its
// message again, flagged; the server's redeliveries are deduplicated; acks
// that could not be sent before a crash go out after the resume.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import WebSocket from 'ws';
import { Herald, HeraldServer } from '../dist/index.js';
import { API_KEY, HeraldProcess, eventually, recorder, sleep } from './harness.mjs';

let herald;
let api;
before(async () => {
  herald = await new HeraldProcess().start();
  api = new HeraldServer({ url: herald.url, apiKey: API_KEY });
});
after(async () => herald?.dispose());

async function cursorOf(channel, user, device) {
  const { cursors } = await api.cursors(channel);
  return cursors.find((c) => c.user === user && c.device === device)?.cursor ?? 0;
}

async function metric(name) {
  const text = await (await fetch(`${herald.url}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  return Number(line?.split(' ')[1] ?? NaN);
}

test('a failed handler gets its message again, flagged redelivered, and the cursor reaches the head', async () => {
  for (let n = 1; n <= 5; n++) await api.publish('user:ann', { n });
  const client = new Herald({ url: herald.url, user: 'ann', device: 'phone', WebSocket });
  const calls = [];
  let failed = false;
  const sub = client.subscribe('user:ann', {
    ackWithinMs: 50,
    onMessage: async (m) => {
      calls.push({ seq: m.seq, redelivered: m.redelivered });
      if (m.seq === 3 && !failed) {
        failed = true;
        throw new Error('database down');
      }
    },
  });
  const rec = recorder(sub);
  const info = await sub.ready;
  assert.equal(info.cursor, 0);
  assert.equal(info.unread, 5, 'the offline inbox');
  await eventually('seq 5 handled', () => sub.position?.seq === 5);
  assert.deepEqual(calls, [
    { seq: 1, redelivered: false },
    { seq: 2, redelivered: false },
    { seq: 3, redelivered: false },
    { seq: 3, redelivered: true },
    { seq: 4, redelivered: false },
    { seq: 5, redelivered: false },
  ]);
  const errors = rec.events.filter((e) => e.type === 'error');
  assert.equal(errors.length, 1);
  assert.equal(errors[0].ev.code, 'handler_failed');
  assert.equal(errors[0].ev.cause.message, 'database down');
  await eventually('the cursor at 5', async () => (await cursorOf('user:ann', 'ann', 'phone')) === 5);
  client.close();
});

test("the server's redeliveries of unacked messages are dropped as duplicates; a manual ack stops them", async () => {
  for (let n = 1; n <= 3; n++) await api.publish('user:ben', { n });
  const before = await metric('herald_redeliveries_total');
  const client = new Herald({ url: herald.url, user: 'ben', device: 'web', WebSocket });
  const got = [];
  const sub = client.subscribe('user:ben', { ack: 'manual', ackWithinMs: 20, onMessage: (m) => void got.push(m) });
  await eventually('3 messages', () => got.length >= 3);
  // Unacked for over ack_timeout (1 s): the server sends them again.
  await eventually('server redeliveries', async () => (await metric('herald_redeliveries_total')) >= before + 3, 10_000);
  await sleep(200);
  assert.deepEqual(got.map((m) => m.seq), [1, 2, 3], 'each seq once');
  assert.equal(await cursorOf('user:ben', 'ben', 'web'), 0, 'nothing acked yet');
  got[2].ack(); // cumulative: 1..3
  await eventually('the cursor at 3', async () => (await cursorOf('user:ben', 'ben', 'web')) === 3);
  const settled = await metric('herald_redeliveries_total');
  await sleep(2500);
  assert.equal(await metric('herald_redeliveries_total'), settled, 'no redelivery after the ack');
  assert.equal(sub.position?.seq, 3);
  client.close();
});

test('acks batched before a crash are sent after the resume; nothing is handled twice', async () => {
  const client = new Herald({ url: herald.url, user: 'cat', device: 'tab', WebSocket, backoff: { baseMs: 50, maxMs: 500 } });
  const seqs = [];
  // Acks wait for 100 messages or 60 s: none is sent before the crash.
  const sub = client.subscribe('user:cat', { ackEvery: 100, ackWithinMs: 60_000, onMessage: (m) => void seqs.push(m.seq) });
  await sub.ready;
  for (let n = 1; n <= 10; n++) await api.publish('user:cat', { n });
  await eventually('10 handled', () => sub.position?.seq === 10);
  assert.equal(await cursorOf('user:cat', 'cat', 'tab'), 0);
  await herald.restart();
  for (let n = 11; n <= 12; n++) await api.publish('user:cat', { n });
  await eventually('12 handled', () => sub.position?.seq === 12);
  // The resume said "since 10": 1..10 were not sent again. The 10 handled
  // ones are acked at once on the new connection (they were due).
  await eventually('the cursor at 10 or more', async () => (await cursorOf('user:cat', 'cat', 'tab')) >= 10);
  assert.deepEqual(seqs, Array.from({ length: 12 }, (_, i) => i + 1));
  sub.flushAcks();
  await eventually('the cursor at 12', async () => (await cursorOf('user:cat', 'cat', 'tab')) === 12);
  client.close();
});
