// Presence and rooms across two clients: join/leave events, the presence
// listing, room state events, and a stable client_id that keeps the
// membership across a lost connection (no leave/join pair).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import WebSocket from 'ws';
import { Herald, HeraldServer } from '../dist/index.js';
import { API_KEY, HeraldProcess, eventually, recorder, sleep } from './harness.mjs';
import { Proxy } from './proxy.mjs';

let herald;
let api;
before(async () => {
  herald = await new HeraldProcess().start();
  api = new HeraldServer({ url: herald.url, apiKey: API_KEY });
});
after(async () => herald?.dispose());

test('two clients see each other join and leave; the room goes live with its host', async () => {
  await api.createRoom('room:standup', { host: 'alice', attributes: { topic: 'daily' }, gracePeriodSec: 60 });
  const alice = new Herald({ url: herald.url, user: 'alice', clientId: 'alice-tab', WebSocket });
  const bob = new Herald({ url: herald.url, user: 'bob', clientId: 'bob-tab', WebSocket });
  const a = alice.subscribe('room:standup', { since: { seq: 0 }, info: { name: 'Alice' } });
  const aRec = recorder(a);
  const aInfo = await a.ready;
  assert.equal(aInfo.clientId, 'alice-tab');
  await eventually('the room is live', () => aRec.events.some((e) => e.type === 'room' && e.ev.state === 'live'));
  const created = aRec.events.find((e) => e.type === 'room' && e.ev.reason === 'created');
  assert.equal(created.ev.host, 'alice');
  assert.deepEqual(created.ev.attributes, { topic: 'daily' });

  const b = bob.subscribe('room:standup');
  await b.ready;
  await eventually('alice sees bob join', () => aRec.events.some((e) => e.type === 'join' && e.ev.user === 'bob'));
  const join = aRec.events.find((e) => e.type === 'join' && e.ev.user === 'bob');
  assert.equal(join.ev.client_id, 'bob-tab');

  const listing = await b.presence();
  assert.equal(listing.count, 2);
  const byUser = listing.members.map((m) => [m.user, m.client_id, m.info]).sort();
  assert.deepEqual(byUser, [['alice', 'alice-tab', { name: 'Alice' }], ['bob', 'bob-tab', undefined]]);
  const http = await api.presence('room:standup');
  assert.deepEqual(http.members.map((m) => m.user).sort(), ['alice', 'bob']);
  const room = await api.room('room:standup');
  assert.equal(room.state, 'live');
  assert.equal(room.member_count, 2);

  b.unsubscribe();
  await eventually('alice sees bob leave', () => aRec.events.some((e) => e.type === 'leave' && e.ev.user === 'bob'));
  assert.equal((await a.presence()).count, 1);

  await api.closeRoom('room:standup');
  await eventually('the subscription ended', () => a.status === 'ended');
  const closed = aRec.events.filter((e) => e.type === 'room').at(-1);
  assert.equal(closed.ev.state, 'closed');
  assert.deepEqual(aRec.events.at(-1), { type: 'unsubscribed', ev: { channel: 'room:standup', reason: 'room_closed' } });
  alice.close();
  bob.close();
});

test('a client that loses its connection comes back as the same member: no leave, no join', async () => {
  await api.createRoom('room:keep', { host: 'carol' });
  const proxy = await new Proxy(herald.port).start();
  const carol = new Herald({ url: herald.url, user: 'carol', WebSocket });
  const dave = new Herald({ url: proxy.url, user: 'dave', WebSocket, backoff: { baseMs: 50, maxMs: 200 } });
  assert.match(dave.clientId, /^tab-[0-9a-f]{32}$/, 'one id per client (per tab in a browser)');
  const c = carol.subscribe('room:keep');
  const cRec = recorder(c);
  await c.ready;
  await dave.subscribe('room:keep').ready;
  await eventually('carol sees dave', () => cRec.events.some((e) => e.type === 'join' && e.ev.user === 'dave'));
  const joinsBefore = cRec.events.filter((e) => e.type === 'join').length;

  proxy.cutAll(); // no close frame: the server keeps dave's lease
  await eventually('dave reconnected', () => dave.state.value.connects === 2 && dave.connected);
  await sleep(1000);
  const members = (await c.presence()).members.filter((m) => m.user === 'dave');
  assert.equal(members.length, 1);
  assert.equal(members[0].client_id, dave.clientId);
  assert.equal(cRec.events.filter((e) => e.type === 'leave').length, 0, 'no leave');
  assert.equal(cRec.events.filter((e) => e.type === 'join').length, joinsBefore, 'no second join');
  dave.close();
  await eventually('a clean close leaves at once', () => cRec.events.some((e) => e.type === 'leave' && e.ev.user === 'dave'));
  carol.close();
  await proxy.close();
});
