// The Herald console: one page on the TypeScript client (herald-client.js,
// built from clients/typescript). It talks to the server that serves it:
// the WebSocket as a user, the HTTP API with the API key (outside dev
// mode), /metrics. Credentials stay in this tab's sessionStorage.
// Everything shown is set with textContent: message data is never HTML.
import { Herald, HeraldError, HeraldServer } from './herald-client.js';

const $ = (id) => document.getElementById(id);
const KEY_STORE = 'herald.console.api_key';

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : String(c ?? ''));
  return e;
}

function table(headers, rows, numeric = []) {
  const head = el('tr', {}, ...headers.map((h, i) => el('th', numeric.includes(i) ? { class: 'num' } : {}, h)));
  const body = rows.map((r) => el('tr', {}, ...r.map((c, i) => el('td', numeric.includes(i) ? { class: 'num' } : {}, c))));
  return el('table', {}, el('thead', {}, head), el('tbody', {}, ...body));
}

const show = (target, ...nodes) => $(target).replaceChildren(...nodes);
const failure = (e) => el('span', { class: 'error' }, e instanceof HeraldError ? `${e.code}: ${e.message}` : String(e));
const json = (v) => JSON.stringify(v);
const newKey = () => `console-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;

let session; // {dev, jwt, version}
let api;
let client;
const subs = new Map();

async function getSession(apiKey) {
  const headers = apiKey ? { authorization: `Bearer ${apiKey}` } : {};
  const res = await fetch('/console/session', { headers, cache: 'no-store' });
  if (res.status === 401) return undefined;
  if (!res.ok) throw new Error(`/console/session: HTTP ${res.status}`);
  return res.json();
}

async function start() {
  const saved = sessionStorage.getItem(KEY_STORE) ?? undefined;
  session = (await getSession(saved)) ?? undefined;
  $('login').hidden = false;
  $('api-key-row').hidden = !!session && (session.dev || !!saved);
  if (session?.dev) {
    $('mode').textContent = 'dev mode';
    $('token-row').hidden = true;
    $('login-hint').textContent = 'Dev mode: connect as any user, no token or API key needed. Never expose a dev server.';
  } else {
    $('user-row').hidden = true;
    $('login-hint').textContent =
      'This server needs the API key (for the HTTP API) and a user token (a JWT signed with the server’s key) for the WebSocket. ' +
      'They stay in this tab.';
  }
  $('login-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    void login().catch((e) => show('login-error', failure(e)));
  });
  if (session?.dev && new URLSearchParams(location.search).has('user')) {
    $('user').value = new URLSearchParams(location.search).get('user');
    await login();
  }
}

async function login() {
  let apiKey = sessionStorage.getItem(KEY_STORE) ?? undefined;
  if (!session?.dev) {
    apiKey = $('api-key').value.trim() || apiKey;
    session = await getSession(apiKey);
    if (!session) throw new Error('the API key was refused');
    sessionStorage.setItem(KEY_STORE, apiKey);
    if (!$('token').value.trim()) throw new Error('a user token is needed for the WebSocket');
  }
  api = new HeraldServer({ url: location.origin, apiKey, retries: 1 });
  const device = $('device').value.trim() || undefined;
  const opts = { url: location.origin, device };
  if (session.dev) opts.user = $('user').value.trim() || 'console';
  else opts.token = $('token').value.trim();
  client = new Herald(opts);
  client.state.subscribe((s) => {
    const pill = $('status');
    pill.dataset.status = s.status;
    pill.textContent = s.status + (s.error ? ` (${s.error.code}${s.error.closeCode ? ` ${s.error.closeCode}` : ''})` : '');
  });
  $('whoami').textContent = `${me()} · device ${device ?? '-'} · herald ${session.version ?? ''}`;
  $('inbox-user').value = me();
  $('ctl-user').value = me();
  $('cursors-channel').value = `user:${me()}`;
  $('login').hidden = true;
  $('app').hidden = false;
  $('pub-key').value = newKey();
  wire();
  void metricsLoop();
}

function wire() {
  $('subscribe-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const channel = $('sub-channel').value.trim();
    const since = $('sub-since').value;
    if (channel && !subs.has(channel)) subscribe(channel, since === '' ? undefined : { seq: Number(since) });
  });
  $('pub-newkey').addEventListener('click', () => ($('pub-key').value = newKey()));
  $('publish-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    void publish();
  });
  $('room-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    void showRoom();
  });
  $('room-create').addEventListener('click', () => void roomAction('create'));
  $('room-close').addEventListener('click', () => void roomAction('close'));
  $('inbox-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    void showInbox();
  });
  $('cursors-show').addEventListener('click', () => void showCursors());
  $('user-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    void showConnections();
  });
  const user = () => $('ctl-user').value.trim();
  $('ctl-disconnect').addEventListener('click', () => void userAction(() => api.disconnect(user(), { reconnect: true, reason: 'disconnected from the console' })));
  $('ctl-ban').addEventListener('click', () => void userAction(() => api.disconnect(user(), { reconnect: false, banSeconds: 60, reason: 'banned from the console' })));
  $('ctl-revoke').addEventListener('click', () => void userAction(() => api.revoke(user(), Date.now())));
  $('user-sub-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    void userAction(() => api.subscribeUser(user(), $('ctl-channel').value.trim()));
  });
  $('ctl-unsubscribe').addEventListener('click', () => void userAction(() => api.unsubscribeUser(user(), $('ctl-channel').value.trim())));
  $('channels-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    void showChannels();
  });
  $('ctl-nodes').addEventListener('click', () => void showNodes());
}

function subscribe(channel, since) {
  const rows = el('tbody');
  const meta = el('span', { class: 'meta' }, 'subscribing…');
  const box = el(
    'div',
    { class: 'sub', 'data-channel': channel },
    el('div', { class: 'sub-head' }, el('strong', {}, channel), meta,
      el('button', { class: 'quiet', onclick: () => { sub.unsubscribe(); box.remove(); subs.delete(channel); } }, 'Unsubscribe')),
    el('div', { class: 'sub-body' },
      el('table', {}, el('thead', {}, el('tr', {}, ...['seq', 'time', 'latency', 'data', 'id'].map((h) => el('th', {}, h)))), rows)),
  );
  $('subscriptions').prepend(box);
  const add = (tr) => {
    rows.prepend(tr);
    while (rows.children.length > 500) rows.lastChild.remove();
  };
  const event = (text) => add(el('tr', { class: 'event' }, el('td', { colspan: 5 }, text)));
  const sub = client.subscribe(channel, {
    since,
    onMessage: (m) => {
      const latency = Date.now() - m.ts;
      const tr = el('tr', { class: m.redelivered ? 'redelivered message' : 'message' },
        el('td', { class: 'num' }, m.seq ?? '–'),
        el('td', {}, new Date(m.ts).toLocaleTimeString()),
        el('td', { class: 'num' }, `${latency} ms`),
        el('td', { class: 'data' }, json(m.data) + (m.redelivered ? '  (redelivered)' : '')),
        el('td', { class: 'mono' }, m.id.slice(-12)));
      add(tr);
    },
  });
  subs.set(channel, sub);
  sub.on('subscribed', (i) => {
    meta.textContent = i.epoch === undefined ? 'volatile' : `head ${i.head} · first ${i.first}${i.cursor !== undefined ? ` · cursor ${i.cursor} · unread ${i.unread}` : ''}`;
  });
  sub.on('truncated', (e) => event(`truncated: retention removed messages; delivery continues at ${e.first}`));
  sub.on('epoch_changed', (e) => event(`epoch changed: the log was reset; delivery restarts at ${e.first}`));
  sub.on('gap', (e) => event(`gap: ${e.expected}..${e.got - 1} missing`));
  sub.on('join', (m) => event(`join: ${m.user} (${m.client_id})`));
  sub.on('leave', (m) => event(`leave: ${m.user} (${m.client_id})`));
  sub.on('room', (r) => event(`room #${r.seq}: ${r.state} v${r.version} (${r.reason}) host ${r.host}`));
  sub.on('unsubscribed', (u) => event(`unsubscribed by the server: ${u.reason}`));
  sub.on('error', (e) => event(`error ${e.code}: ${e.message}`));
}

async function publish() {
  const channel = $('pub-channel').value.trim();
  const key = $('pub-key').value.trim() || undefined;
  let data;
  try {
    data = JSON.parse($('pub-data').value);
  } catch (e) {
    return show('pub-result', failure(new Error(`data is not JSON: ${e.message}`)));
  }
  show('pub-result', 'publishing…');
  try {
    const r = $('pub-via').value === 'http'
      ? await api.publish(channel, data, { idempotencyKey: key })
      : await client.publish(channel, data, { idempotencyKey: key });
    const dup = r.duplicate ?? r.replayed;
    show('pub-result', el('span', { class: 'mono', id: 'pub-ok' }, `seq ${r.seq ?? '–'} · id ${r.id} · ${dup ? 'duplicate: nothing appended' : 'appended'} · key ${r.idempotencyKey}`));
  } catch (e) {
    show('pub-result', failure(e));
  }
}

async function showRoom() {
  const name = $('room-name').value.trim();
  try {
    const [room, presence] = await Promise.all([api.room(name), api.presence(name)]);
    const kv = [
      ['state', room.state], ['version', room.version], ['host', room.host], ['attributes', json(room.attributes)],
      ['grace period', `${room.grace_period} s`], ['grace until', room.grace_until_ms ? new Date(room.grace_until_ms).toLocaleTimeString() : '–'],
      ['members', presence.count],
    ];
    show('room-view', table(['', ''], kv), el('h3', {}, 'Presence'),
      table(['user', 'client id', 'device', 'info'], (presence.members ?? []).map((m) => [m.user, m.client_id, m.device ?? '', m.info ? json(m.info) : ''])));
  } catch (e) {
    show('room-view', failure(e));
  }
}

async function roomAction(what) {
  const name = $('room-name').value.trim();
  try {
    if (what === 'create') await api.createRoom(name, { host: me() });
    else await api.closeRoom(name);
    await showRoom();
  } catch (e) {
    show('room-view', failure(e));
  }
}

/** This console's user: the dev user name, or the token's `sub`. */
function me() {
  if (session.dev) return $('user').value.trim() || 'console';
  try {
    const part = $('token').value.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
    return JSON.parse(atob(part)).sub;
  } catch {
    return 'console';
  }
}

async function showInbox() {
  try {
    const inbox = await api.inbox($('inbox-user').value.trim());
    const rows = inbox.channels.flatMap((c) =>
      c.devices.length
        ? c.devices.map((d) => [c.channel, c.head, d.device ?? '–', d.cursor, d.unread, new Date(d.acked_at).toLocaleTimeString()])
        : [[c.channel, c.head, '(no device yet)', 0, c.unread_without_cursor, '']]);
    show('inbox-view', table(['channel', 'head', 'device', 'cursor', 'unread', 'acked at'], rows, [1, 3, 4]));
  } catch (e) {
    show('inbox-view', failure(e));
  }
}

async function showCursors() {
  try {
    const c = await api.cursors($('cursors-channel').value.trim());
    const rows = c.cursors.map((x) => [x.user, x.device ?? '–', x.cursor, x.unread, new Date(x.acked_at).toLocaleTimeString()]);
    show('inbox-view', el('p', {}, `${c.channel}: head ${c.head}, first ${c.first}`), table(['user', 'device', 'cursor', 'unread', 'acked at'], rows, [2, 3]));
  } catch (e) {
    show('inbox-view', failure(e));
  }
}

async function showConnections() {
  try {
    const list = await api.connections($('ctl-user').value.trim());
    const rows = list.map((c) => [c.id, c.device ?? '–', c.protocol, new Date(c.connected_at_ms).toLocaleTimeString(), c.remote ?? '–', c.subscriptions.join(' ')]);
    show('users-view', table(['connection', 'device', 'protocol', 'since', 'remote', 'subscriptions'], rows));
  } catch (e) {
    show('users-view', failure(e));
  }
}

/** An action on the user, then the connections as they are now. */
async function userAction(call) {
  try {
    const r = await call();
    show('users-view', el('p', {}, `${r.action} ${r.user}: done on every node`));
  } catch (e) {
    show('users-view', failure(e));
  }
}

async function showChannels() {
  try {
    const pattern = $('ctl-pattern').value.trim() || undefined;
    const page = await api.channels({ pattern, limit: 100 });
    const rows = page.channels.map((c) => [c.channel, c.subscribers]);
    show('users-view', table(['channel', 'subscribers'], rows, [1]), el('p', {}, page.next ? `more after ${page.next}` : ''));
  } catch (e) {
    show('users-view', failure(e));
  }
}

async function showNodes() {
  try {
    const nodes = await api.nodes();
    const rows = nodes.map((n) => [n.id, n.version, new Date(n.started_at_ms).toLocaleString(), n.connections, n.subscriptions, n.engine]);
    show('users-view', table(['node', 'version', 'started', 'connections', 'subscriptions', 'engine'], rows, [3, 4]));
  } catch (e) {
    show('users-view', failure(e));
  }
}

/** Key figures from /metrics, with per-second rates between scrapes. */
const METRICS = [
  ['herald_connections', 'connections'],
  ['herald_subscriptions', 'subscriptions'],
  ['herald_published_total', 'published', true],
  ['herald_delivered_total', 'delivered', true],
  ['herald_dedup_hits_total', 'idempotent replays'],
  ['herald_acks_total', 'acks', true],
  ['herald_redeliveries_total', 'redeliveries'],
  ['herald_slow_consumer_disconnects_total', 'slow consumers'],
  ['herald_presence_joins_total', 'presence joins'],
  ['herald_room_changes_total', 'room changes'],
  ['herald_engine_errors_total', 'engine errors'],
];

function parseMetrics(text) {
  const values = new Map();
  const buckets = [];
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || !line) continue;
    const m = /^([a-z_]+)(\{le="([^"]+)"\})? ([0-9.e+-]+)/.exec(line);
    if (!m) continue;
    if (m[1] === 'herald_publish_latency_seconds_bucket') buckets.push([Number(m[3] === '+Inf' ? Infinity : m[3]), Number(m[4])]);
    else values.set(m[1], Number(m[4]));
  }
  return { values, buckets };
}

function quantile(buckets, q) {
  const total = buckets.at(-1)?.[1] ?? 0;
  if (!total) return undefined;
  return buckets.find(([, n]) => n >= q * total)?.[0];
}

/** `GET /api/v1/consumers` as a table, one row per partition; the card is
 * shown only when the server has consumers. */
async function showConsumers() {
  const key = sessionStorage.getItem(KEY_STORE);
  const res = await fetch('/api/v1/consumers', { headers: key ? { authorization: `Bearer ${key}` } : {}, cache: 'no-store' });
  if (!res.ok) return;
  const { consumers } = await res.json();
  $('consumers-card').hidden = consumers.length === 0;
  const rows = consumers.flatMap((c) =>
    c.partitions.map((p) => [
      c.name,
      p.partition,
      p.owned ? `here (token ${p.token})` : 'elsewhere',
      p.lag ?? '–',
      p.last_id ?? '–',
      p.parked_rows ?? '–',
      p.last_error ? `${new Date(p.last_error.at).toLocaleTimeString()} ${p.last_error.message}` : '',
    ]));
  show('consumers-view', table(['consumer', 'partition', 'owner', 'lag', 'last id', 'parked', 'last error'], rows, [1, 3, 5]));
}

async function metricsLoop() {
  let prev;
  for (;;) {
    try {
      await showConsumers();
      const text = await (await fetch('/metrics', { cache: 'no-store' })).text();
      const now = { at: Date.now(), ...parseMetrics(text) };
      const rows = METRICS.map(([name, label, rate]) => {
        const v = now.values.get(name) ?? 0;
        const per = rate && prev ? ` (${((v - (prev.values.get(name) ?? 0)) / ((now.at - prev.at) / 1000)).toFixed(1)}/s)` : '';
        return [label, `${v}${per}`];
      });
      const p50 = quantile(now.buckets, 0.5);
      const p99 = quantile(now.buckets, 0.99);
      const ms = (s) => (s === undefined ? '–' : s === Infinity ? '> max' : `≤ ${(s * 1000).toFixed(1)} ms`);
      rows.push(['publish latency p50', ms(p50)], ['publish latency p99', ms(p99)]);
      $('metrics').replaceChildren(...rows.map(([k, v]) => el('tr', {}, el('td', {}, k), el('td', { class: 'num', 'data-metric': k }, v))));
      prev = now;
    } catch {
      // The server is restarting: the next scrape will tell.
    }
    await new Promise((r) => setTimeout(r, 2000));
  }
}

void start().catch((e) => {
  $('login').hidden = false;
  show('login-error', failure(e));
});
