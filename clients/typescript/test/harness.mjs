// Test harness: a real `herald serve` process on a free port with a temp
// data dir, killed with SIGKILL and restarted on the same port and data;
// HS256 tokens; bounded waits. The binary is target/debug/herald (built by
// scripts/test before these tests), or $HERALD_BIN.
import { spawn, execFileSync } from 'node:child_process';
import { createHmac } from 'node:crypto';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const repo = join(dirname(fileURLToPath(import.meta.url)), '../../..');
export const API_KEY = 'ts-test-api-key-0123456789';
export const JWT_SECRET = 'ts-test-jwt-secret-0123456789abcdef0123';
/** Upper bound of any single wait. */
export const WAIT_MS = 20_000;

export function heraldBinary() {
  const bin = process.env.HERALD_BIN ?? join(repo, 'target/debug/herald');
  if (!existsSync(bin)) {
    execFileSync('cargo', ['build', '-p', 'herald'], { cwd: repo, stdio: 'inherit' });
  }
  return bin;
}

export async function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** Namespaces for the tests: the defaults, with acked redelivery after 1 s. */
const TEST_CONFIG = `
[presence]
lease_ttl = "3s"
sweep_interval = "200ms"

[namespaces.chat]
delivery = "durable"
client_publish = true

[namespaces.live]
delivery = "volatile"
client_publish = true

[namespaces.room]
delivery = "durable"
client_publish = true
presence = true
room = true

[namespaces.user]
delivery = "acked"
ack_timeout = "1s"
ack_backoff_max = "2s"
max_attempts = 10
`;

/**
 * A Herald process. `dev` (default true) accepts `?user=`; API keys and the
 * HS256 secret are always configured.
 */
export class HeraldProcess {
  /** `topConfig`: top-level keys (before the tables); `extraConfig`: tables appended. */
  constructor({ dev = true, topConfig = '', extraConfig = '', env = {} } = {}) {
    this.dev = dev;
    this.env = env;
    this.dir = mkdtempSync(join(tmpdir(), 'herald-ts-'));
    this.dataDir = join(this.dir, 'data');
    this.configFile = join(this.dir, 'herald.toml');
    writeFileSync(this.configFile, topConfig + TEST_CONFIG + extraConfig);
    this.proc = undefined;
    this.log = '';
  }

  get url() {
    return `http://127.0.0.1:${this.port}`;
  }

  async start() {
    this.port ??= await freePort();
    const args = ['serve', '--listen', `127.0.0.1:${this.port}`, '--data-dir', this.dataDir, '--config', this.configFile];
    if (this.dev) args.push('--dev');
    // SIGTERM closes every session at once unless a test asks for a drain.
    const env = { HERALD_DRAIN_PERIOD: '0s', ...process.env, HERALD_API_KEYS: API_KEY, HERALD_JWT_SECRET: JWT_SECRET, HERALD_LOG: 'warn', ...this.env };
    delete env.HERALD_DEV;
    const proc = spawn(heraldBinary(), args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
    this.proc = proc;
    const keep = (d) => (this.log = (this.log + d).slice(-20_000));
    proc.stdout.on('data', keep);
    proc.stderr.on('data', keep);
    const exited = new Promise((resolve) => proc.once('exit', resolve));
    this.exited = exited;
    const deadline = Date.now() + WAIT_MS;
    for (;;) {
      if (proc.exitCode !== null || proc.signalCode !== null) throw new Error(`herald exited (${proc.exitCode ?? proc.signalCode}) while starting: ${this.log}`);
      const res = await fetch(`${this.url}/healthz`).catch(() => undefined);
      if (res?.ok) break;
      if (Date.now() > deadline) throw new Error(`herald did not answer /healthz within ${WAIT_MS} ms: ${this.log}`);
      await sleep(50);
    }
    return this;
  }

  /** SIGKILL: no shutdown, no goodbye to clients. */
  async kill() {
    if (!this.proc || this.proc.exitCode !== null) return;
    this.proc.kill('SIGKILL');
    await this.exited;
  }

  /** A graceful stop (clients get 1001). */
  async stop() {
    if (!this.proc || this.proc.exitCode !== null) return;
    this.proc.kill('SIGTERM');
    await this.exited;
  }

  async restart() {
    await this.kill();
    return this.start();
  }

  async dispose() {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** Poll `fn` until it returns a truthy value (returned), within `ms`. */
export async function eventually(what, fn, ms = WAIT_MS) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for: ${what}${last ? ` (last error: ${last.message})` : ''}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const b64url = (x) => Buffer.from(typeof x === 'string' ? x : JSON.stringify(x)).toString('base64url');

/** An HS256 token for `sub`, valid for `ttlSec`, allowed everything unless told. */
export function token(sub, { ttlSec = 3600, channels = ['*'], publish = ['*'], device } = {}) {
  const claims = { sub, exp: Math.floor(Date.now() / 1000) + ttlSec, channels, publish };
  if (device) claims.device = device;
  const head = b64url({ alg: 'HS256', typ: 'JWT' });
  const body = b64url(claims);
  const sig = createHmac('sha256', JWT_SECRET).update(`${head}.${body}`).digest('base64url');
  return `${head}.${body}.${sig}`;
}

/** Collects what a subscription hands over, with its events. */
export function recorder(sub) {
  const rec = { seqs: [], messages: [], events: [] };
  for (const type of ['truncated', 'epoch_changed', 'gap', 'join', 'leave', 'room', 'unsubscribed', 'error']) {
    sub.on(type, (ev) => rec.events.push({ type, ev }));
  }
  return rec;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
