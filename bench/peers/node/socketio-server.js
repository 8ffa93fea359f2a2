// Socket.IO 4.8 peer, WebSocket transport only (what a Socket.IO app gets
// when clients skip long-polling).
//
// A client emits "subscribe" with a channel name and an acknowledgement;
// the server joins the socket to the room of that name and acknowledges.
// POST /publish/CHANNEL emits "msg" with the parsed body to the room; so
// does a client's "publish" event (channel, data, ack), acknowledged once
// the emit returned. No connection state recovery: nothing is stored.
//
//   node socketio-server.js PORT [REDIS_URL]
//
// Without REDIS_URL: the in-memory adapter, one process. With it:
// @socket.io/redis-adapter on the `redis` client, so several processes on
// that Redis share rooms: `io.to(room).emit` goes through Redis pub/sub to
// every process, each emitting to its own sockets in the room (a publish on
// one process reaches subscribers on another).
'use strict';

const http = require('http');
const { Server } = require('socket.io');
const { port, httpHandler, pkgVersion } = require('./common');

const redisUrl = process.argv[3];

let io;
function publish(channel, body) {
  const data = JSON.parse(body);
  io.to(channel).emit('msg', data);
  return null;
}

const versions =
  `socket.io ${pkgVersion('socket.io')}` +
  (redisUrl ? ` @socket.io/redis-adapter ${pkgVersion('@socket.io/redis-adapter')} redis ${pkgVersion('redis')}` : '') +
  ` node ${process.version}`;
const server = http.createServer(httpHandler(versions, publish));
io = new Server(server, { transports: ['websocket'], serveClient: false, perMessageDeflate: false });

io.on('connection', (socket) => {
  socket.on('subscribe', (channel, ack) => {
    if (typeof channel !== 'string') return;
    socket.join(channel);
    if (typeof ack === 'function') ack('ok');
  });
  socket.on('publish', (channel, data, ack) => {
    if (typeof channel !== 'string') return;
    io.to(channel).emit('msg', data);
    if (typeof ack === 'function') ack('ok');
  });
});

// With the Redis adapter, listen only once both Redis connections are up
// (a client that connected earlier could miss a cross-process emit).
async function main() {
  if (redisUrl) {
    const { createClient } = require('redis');
    const { createAdapter } = require('@socket.io/redis-adapter');
    const pubClient = createClient({ url: redisUrl });
    const subClient = pubClient.duplicate();
    for (const c of [pubClient, subClient]) c.on('error', (e) => console.error(`redis: ${e}`));
    await Promise.all([pubClient.connect(), subClient.connect()]);
    io.adapter(createAdapter(pubClient, subClient));
  }
  server.listen(port(), '127.0.0.1', () => console.log(`socket.io peer listening on ${server.address().port} (${versions})`));
}
main().catch((e) => {
  console.error(e);
  process.exit(1);
});
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(0));
