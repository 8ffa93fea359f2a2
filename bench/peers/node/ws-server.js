// Plain Node `ws` peer: the floor for a JavaScript realtime server.
//
// WebSocket on /: the client sends {"sub": CHANNEL}; the server adds the
// socket to the channel's Set and answers {"ok": CHANNEL}. POST
// /publish/CHANNEL sends the body, unchanged, as one text frame to every
// socket in the set. A socket may also publish: {"pub": CHANNEL, "req": N,
// "data": ANY} sends JSON.stringify(data) to every socket in the set and
// answers {"ack": N} (a malformed publish: {"err": N, "why": ...}), the
// way an app acknowledges a client's message. No storage, no resume, no
// ordering guarantee beyond one process handling publishes in arrival order.
'use strict';

const http = require('http');
const { WebSocketServer } = require('ws');
const { port, httpHandler, pkgVersion } = require('./common');

const channels = new Map(); // channel -> Set<WebSocket>

function publish(channel, body) {
  const subs = channels.get(channel);
  if (!subs) return 0;
  for (const ws of subs) ws.send(body);
  return subs.size;
}

const versions = `ws ${pkgVersion('ws')} node ${process.version}`;
const server = http.createServer(httpHandler(versions, publish));
const wss = new WebSocketServer({ server, perMessageDeflate: false });

wss.on('connection', (ws) => {
  const mine = new Set();
  ws.on('message', (data) => {
    let msg;
    try {
      msg = JSON.parse(data);
    } catch {
      ws.close(4000, 'bad json');
      return;
    }
    if (typeof msg.pub === 'string') {
      if (!('data' in msg)) {
        ws.send(JSON.stringify({ err: msg.req, why: 'no data' }));
        return;
      }
      publish(msg.pub, JSON.stringify(msg.data));
      ws.send(`{"ack":${Number(msg.req)}}`);
      return;
    }
    if (typeof msg.sub !== 'string') return;
    let subs = channels.get(msg.sub);
    if (!subs) channels.set(msg.sub, (subs = new Set()));
    subs.add(ws);
    mine.add(msg.sub);
    ws.send(JSON.stringify({ ok: msg.sub }));
  });
  ws.on('close', () => {
    for (const ch of mine) {
      const subs = channels.get(ch);
      subs.delete(ws);
      if (subs.size === 0) channels.delete(ch);
    }
  });
});

// Like Herald and Socket.IO: ping every 25 s, drop peers that stay silent.
const heartbeat = setInterval(() => {
  for (const ws of wss.clients) {
    if (ws.isAlive === false) {
      ws.terminate();
      continue;
    }
    ws.isAlive = false;
    ws.ping();
  }
}, 25_000);
wss.on('connection', (ws) => {
  ws.isAlive = true;
  ws.on('pong', () => (ws.isAlive = true));
});
wss.on('close', () => clearInterval(heartbeat));

server.listen(port(), '127.0.0.1', () => console.log(`ws peer listening on ${server.address().port} (${versions})`));
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(0));
