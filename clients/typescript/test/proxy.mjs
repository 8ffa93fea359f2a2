// A TCP proxy between a client and Herald, to lose replies and cut
// connections the way a network does (no close frame, no FIN from Herald).
import { createServer, connect } from 'node:net';
import { freePort } from './harness.mjs';

export class Proxy {
  constructor(targetPort) {
    this.targetPort = targetPort;
    this.pairs = new Set();
    /** While true, bytes from Herald to the client are dropped. */
    this.blackholeReplies = false;
  }

  get url() {
    return `http://127.0.0.1:${this.port}`;
  }

  async start() {
    this.port = await freePort();
    this.server = createServer((client) => {
      const upstream = connect(this.targetPort, '127.0.0.1');
      const pair = { client, upstream };
      this.pairs.add(pair);
      client.on('data', (d) => upstream.write(d));
      upstream.on('data', (d) => {
        if (!this.blackholeReplies) client.write(d);
      });
      const end = () => {
        this.pairs.delete(pair);
        client.destroy();
        upstream.destroy();
      };
      client.on('close', end);
      upstream.on('close', end);
      client.on('error', end);
      upstream.on('error', end);
    });
    await new Promise((resolve) => this.server.listen(this.port, '127.0.0.1', resolve));
    return this;
  }

  /** Cut every connection abruptly (a reset, as when the network goes away). */
  cutAll() {
    for (const { client, upstream } of this.pairs) {
      client.resetAndDestroy();
      upstream.resetAndDestroy();
    }
    this.pairs.clear();
  }

  get connections() {
    return this.pairs.size;
  }

  async close() {
    this.cutAll();
    await new Promise((resolve) => this.server.close(resolve));
  }
}
