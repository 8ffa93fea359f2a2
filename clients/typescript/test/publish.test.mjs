// Publishing: one idempotency key per publish, kept across retries, so a
// publish whose answer was lost with the connection has one effect; the
// offline queue is bounded and goes out in order; the HTTP helper retries
// under one key too.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import WebSocket from 'ws';
import { Herald, HeraldError, HeraldServer } from '../dist/index.js';
import { API_KEY, HeraldProcess, eventually, sleep } from './harness.mjs';
import { Proxy } from './proxy.mjs';

let herald;
let api;
before(async () => {
  herald = await new HeraldProcess().start();
  api = new HeraldServer({ url: herald.url, apiKey: API_KEY });
});
after(async () => herald?.dispose());

test('a publish whose answer is lost with the connection is sent again under its key: one effect', async () => {
  const proxy = await new Proxy(herald.port).start();
  const client = new Herald({ url: proxy.url, user: 'pat', WebSocket, backoff: { baseMs: 50, maxMs: 300 } });
  await eventually('connected', () => client.connected);
  proxy.blackholeReplies = true;
  const publishing = client.publish('chat:once', { text: 'exactly once' });
  // The server appended it; its answer went nowhere.
  await eventually('the message in the log', async () => (await api.history('chat:once')).head === 1);
  proxy.blackholeReplies = false;
  proxy.cutAll();
  const result = await publishing;
  assert.equal(result.seq, 1);
  assert.equal(result.duplicate, true, 'the retry was answered from the receipt');
  assert.match(result.idempotencyKey, /^pub-[0-9a-f]{32}$/);
  assert.equal(client.state.value.connects, 2);
  const history = await api.history('chat:once');
  assert.equal(history.messages.length, 1, 'one effect');
  assert.deepEqual(history.messages[0].data, { text: 'exactly once' });
  client.close();
  await proxy.close();
});

test('publishes made while the server is down wait and go out in order on reconnect', async () => {
  const client = new Herald({ url: herald.url, user: 'quinn', WebSocket, backoff: { baseMs: 50, maxMs: 300 } });
  await eventually('connected', () => client.connected);
  await herald.kill();
  await eventually('disconnected', () => !client.connected);
  const pending = [];
  for (let n = 1; n <= 30; n++) pending.push(client.publish('chat:queued', { n }));
  await herald.start();
  const results = await Promise.all(pending);
  assert.deepEqual(results.map((r) => r.seq), Array.from({ length: 30 }, (_, i) => i + 1), 'call order is log order');
  const history = await api.history('chat:queued');
  assert.deepEqual(history.messages.map((m) => m.data.n), Array.from({ length: 30 }, (_, i) => i + 1));
  client.close();
});

test('the offline queue is bounded; errors are typed', async () => {
  const client = new Herald({ url: 'http://127.0.0.1:9', user: 'rae', WebSocket, maxQueuedPublishes: 2, publishTimeoutMs: 300, backoff: { baseMs: 50, maxMs: 100 } });
  const a = client.publish('chat:x', 1);
  const b = client.publish('chat:x', 2, { idempotencyKey: 'my-key' });
  await assert.rejects(client.publish('chat:x', 3), (e) => e instanceof HeraldError && e.code === 'backlog');
  await Promise.all([
    assert.rejects(b, (e) => e instanceof HeraldError && e.code === 'timeout' && e.idempotencyKey === 'my-key' && e.retryable),
    assert.rejects(a, (e) => e.code === 'timeout'),
  ]);
  client.close();

  const ok = new Herald({ url: herald.url, user: 'rae', WebSocket });
  await assert.rejects(ok.publish('user:rae', 1), (e) => e instanceof HeraldError && e.code === 'forbidden' && !e.retryable);
  await assert.rejects(ok.publish('nope:x', 1), (e) => e.code === 'unknown_namespace');
  const first = await ok.publish('chat:keyed', { v: 1 }, { idempotencyKey: 'k-1' });
  const again = await ok.publish('chat:keyed', { v: 1 }, { idempotencyKey: 'k-1' });
  assert.deepEqual([again.seq, again.id, again.duplicate], [first.seq, first.id, true]);
  await assert.rejects(ok.publish('chat:keyed', { v: 2 }, { idempotencyKey: 'k-1' }), (e) => e.code === 'idempotency_key_reused');
  ok.close();
  await assert.rejects(ok.publish('chat:keyed', 1), (e) => e.code === 'closed');
});

test('HeraldServer retries a publish under one key until the server is back: one effect', async () => {
  await herald.kill();
  const slow = new HeraldServer({ url: herald.url, apiKey: API_KEY, retries: 40, backoff: { baseMs: 100, maxMs: 250 } });
  const publishing = slow.publish('chat:api-retry', { text: 'hello' }, { idempotencyKey: 'order-42' });
  const starting = sleep(500).then(() => herald.start());
  const r = await publishing;
  await starting;
  assert.equal(r.seq, 1);
  assert.equal(r.idempotencyKey, 'order-42');
  const replay = await api.publish('chat:api-retry', { text: 'hello' }, { idempotencyKey: 'order-42' });
  assert.deepEqual([replay.seq, replay.id, replay.replayed], [1, r.id, true]);
  assert.equal((await api.history('chat:api-retry')).messages.length, 1);
  await assert.rejects(
    new HeraldServer({ url: herald.url, apiKey: 'wrong-key-0123456789' }).publish('chat:a', 1),
    (e) => e instanceof HeraldError && e.code === 'unauthorized' && e.status === 401,
  );
  const batch = await api.publishMany(['chat:b1', 'chat:b2'], { all: true }, { idempotencyKey: 'batch-1' });
  assert.deepEqual(batch.results.map((x) => x.seq), [1, 1]);
});

test('the HTTP helper schedules a message: once, at its time; a retried key schedules once; a cancel sticks', async () => {
  const at = Date.now() + 400;
  const a = await api.schedule('chat:ts-sched', { n: 1 }, { deliverAt: at, idempotencyKey: 'ts-sched-1' });
  assert.equal(a.channel, 'chat:ts-sched');
  assert.equal(a.deliver_at, at);
  assert.equal(a.replayed, false);
  const again = await api.schedule('chat:ts-sched', { n: 1 }, { deliverAt: at, idempotencyKey: 'ts-sched-1' });
  assert.equal(again.scheduled_id, a.scheduled_id);
  assert.equal(again.replayed, true);
  const gone = await api.schedule('chat:ts-sched', { n: 2 }, { delayMs: 60_000 });
  assert.deepEqual((await api.scheduled('chat:ts-sched')).map((s) => s.id), [a.scheduled_id, gone.scheduled_id]);
  assert.equal((await api.cancelScheduled(gone.scheduled_id))?.id, gone.scheduled_id);
  assert.equal(await api.cancelScheduled(gone.scheduled_id), null);
  await eventually('delivered', async () => (await api.history('chat:ts-sched')).head === 1);
  const history = await api.history('chat:ts-sched');
  assert.deepEqual(history.messages.map((m) => m.data), [{ n: 1 }]);
  assert.ok(history.messages[0].ts >= at, 'not before its time');
  assert.deepEqual(await api.scheduled('chat:ts-sched'), []);
});

test('publishMessages: many messages in one request, each answered on its own, a retry replays', async () => {
  const messages = [
    { channel: 'chat:many', data: { n: 1 }, meta: { k: 'v' } },
    { channel: 'nope:many', data: 2 },
    { channel: 'chat:many', data: { n: 3 }, idempotencyKey: 'mine' },
    { channel: 'chat:many', data: 4, delayMs: 100 },
  ];
  const results = await api.publishMessages(messages);
  assert.equal(results.length, 4);
  assert.deepEqual([results[0].seq, results[0].replayed], [1, false]);
  assert.equal(results[1].error.code, 'unknown_namespace');
  assert.deepEqual([results[2].seq, results[2].idempotencyKey], [2, 'mine']);
  assert.equal(typeof results[3].scheduled_id, 'string');
  // The same messages under the same keys: every one replays.
  const again = await api.publishMessages(messages.map((m, i) => ({ ...m, idempotencyKey: results[i].idempotencyKey })));
  assert.deepEqual(again.map((r) => r.seq ?? r.scheduled_id ?? r.error.code), results.map((r) => r.seq ?? r.scheduled_id ?? r.error.code));
  assert.deepEqual([again[0].replayed, again[2].replayed, again[3].replayed], [true, true, true]);
  await eventually('the scheduled one appended', async () => (await api.history('chat:many')).head === 3);
  const history = await api.history('chat:many');
  assert.deepEqual(history.messages.map((m) => m.data), [{ n: 1 }, { n: 3 }, 4]);
});

test('publishMessages: a message to several channels is answered per channel, and replays whole', async () => {
  const messages = [{ channels: ['chat:fan1', 'chat:fan2'], data: { fan: true } }, { channel: 'chat:fan1', data: 2 }];
  const [fanned, single] = await api.publishMessages(messages);
  // Keyed (every message here is), a message to several channels keeps
  // /publish's key protocol: appended after the request's one submission.
  assert.equal(single.seq, 1);
  assert.deepEqual(fanned.results.map((r) => [r.channel, r.seq]), [['chat:fan1', 2], ['chat:fan2', 1]]);
  assert.equal(fanned.replayed, false);
  const [again] = await api.publishMessages([{ ...messages[0], idempotencyKey: fanned.idempotencyKey }]);
  assert.equal(again.replayed, true);
  assert.deepEqual(again.results.map((r) => r.id), fanned.results.map((r) => r.id));
  assert.equal((await api.history('chat:fan2')).head, 1);
});
