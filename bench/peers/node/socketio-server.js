// Socket.IO 4.8 peer, WebSocket transport only (what a Socket.IO app gets
// when clients skip long-polling).
//
// A client emits "subscribe" with a channel name and an acknowledgement;
// the server joins the socket to the room of that name and acknowledges.
// POST /publish/CHANNEL emits "msg" with the parsed body to the room; so
// does a client's "publish" event (channel, data, ack), acknowledged once
// the emit returned. The in-memory adapter, no connection state recovery:
// nothing is stored.
'use strict';

const http = require('http');
const { Server } = require('socket.io');
const { port, httpHandler, pkgVersion } = require('./common');

let io;
function publish(channel, body) {
  const data = JSON.parse(body);
  io.to(channel).emit('msg', data);
  return null;
}

const versions = `socket.io ${pkgVersion('socket.io')} node ${process.version}`;
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

server.listen(port(), '127.0.0.1', () => console.log(`socket.io peer listening on ${server.address().port} (${versions})`));
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(0));
