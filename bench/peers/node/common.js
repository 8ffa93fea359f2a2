// Shared by the peer servers: port from argv, the /version and /publish
// HTTP routes, and a bounded request body reader.
'use strict';

const fs = require('fs');
const path = require('path');

const MAX_BODY = 256 * 1024;

function port() {
  const p = Number(process.argv[2] || process.env.PORT);
  if (!Number.isInteger(p) || p <= 0) {
    console.error(`usage: node ${process.argv[1]} PORT`);
    process.exit(2);
  }
  return p;
}

// POST /publish/<channel> with a JSON body: calls publish(channel, body)
// and answers 201 once the fan-out call returned. GET /version: versions.
function httpHandler(versions, publish) {
  return (req, res) => {
    if (req.method === 'GET' && req.url === '/version') {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end(versions + '\n');
      return;
    }
    const m = req.method === 'POST' && /^\/publish\/([^/?]+)$/.exec(req.url);
    if (!m) {
      res.writeHead(404);
      res.end();
      return;
    }
    const channel = decodeURIComponent(m[1]);
    const chunks = [];
    let size = 0;
    req.on('data', (c) => {
      size += c.length;
      if (size > MAX_BODY) {
        res.writeHead(413);
        res.end();
        req.destroy();
        return;
      }
      chunks.push(c);
    });
    req.on('end', () => {
      if (size > MAX_BODY) return;
      let receivers;
      try {
        receivers = publish(channel, Buffer.concat(chunks).toString('utf8'));
      } catch (e) {
        res.writeHead(400, { 'content-type': 'text/plain' });
        res.end(String(e));
        return;
      }
      res.writeHead(201, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ receivers }));
    });
  };
}

// Installed version of a dependency (some packages do not export their
// package.json).
function pkgVersion(name) {
  const file = path.join(__dirname, 'node_modules', name, 'package.json');
  return JSON.parse(fs.readFileSync(file, 'utf8')).version;
}

module.exports = { port, httpHandler, pkgVersion };
