// The personal channel (`[personal] subscribe` on the server): the client
// surfaces the server's subscription as a `subscribed` event with a
// Subscription that delivers (and acks: `user` is acked) like one from
// subscribe(), resumes through a server restart (kill -9) with nothing
// lost or doubled, and is declined without a listener.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import WebSocket from 'ws';
import { Herald, HeraldServer } from '../dist/index.js';
import { API_KEY, HeraldProcess, eventually } from './harness.mjs';

let herald;
let api;
before(async () => {
  herald = await new HeraldProcess({ extraConfig: '\n[personal]\nsubscribe = true\n' }).start();
  api = new HeraldServer({ url: herald.url, apiKey: API_KEY });
});
after(async () => herald?.dispose());

test('the personal channel arrives as a subscription, with its inbox, and survives a restart', async (t) => {
  await api.publish('user:pam', { n: 1 });
  const client = new Herald({ url: herald.url, user: 'pam', device: 'laptop', WebSocket });
  t.after(() => client.close());
  const seqs = [];
  const subs = [];
  client.on('subscribed', (sub) => {
    subs.push(sub);
    sub.handle((m) => {
      seqs.push(m.seq);
    });
  });
  await eventually('the inbox message', () => seqs.length === 1);
  assert.equal(subs.length, 1);
  assert.equal(subs[0].channel, 'user:pam');
  assert.equal(subs[0].serverSide, true);
  await api.publish('user:pam', { n: 2 });
  await eventually('a live message', () => seqs.length === 2);
  await herald.restart();
  for (let n = 3; n <= 5; n++) await api.publish('user:pam', { n });
  await eventually('every message after the restart', () => seqs.length >= 5);
  assert.deepEqual(seqs, [1, 2, 3, 4, 5], 'nothing lost, nothing doubled');
  assert.equal(subs.length, 1, 'the same subscription, resumed');
});

test('without a listener the client declines it', async (t) => {
  const client = new Herald({ url: herald.url, user: 'quinn', WebSocket });
  t.after(() => client.close());
  const other = client.subscribe('chat:quinn');
  await other.ready;
  const subscriptions = async () => {
    const text = await (await fetch(`${herald.url}/metrics`)).text();
    return Number(text.split('\n').find((l) => l.startsWith('herald_subscriptions '))?.split(' ')[1]);
  };
  await eventually('only chat:quinn left', async () => (await subscriptions()) === 1);
});
