/**
 * {@link Herald}: the realtime client. One WebSocket at a time, reconnected
 * with exponential backoff and full jitter; every subscription resumed from
 * its cursor; publishes kept (bounded) until the server answered them, and
 * sent again on reconnect under the same idempotency key, in order.
 *
 * Never: deliver a seq twice or out of order to a subscription, skip seqs
 * without an event, retry a publish under a different key, or keep
 * anything unbounded.
 */

import { backoffDelay, type BackoffOptions } from './backoff.js';
import { closeAction, refusalAction, type CloseAction, type DisconnectFrame } from './close.js';
import { HeraldError, isTransient } from './errors.js';
import { randomId, tabClientId } from './ids.js';
import { Emitter, Value, type Observable } from './observable.js';
import { Subscription, type AnySubscription, type Link, type SubscribeOptions } from './subscription.js';
import { expiresSoon } from './token.js';
import type { Json, Meta, PublishResult } from './types.js';

/** The part of the WebSocket API the client uses (the browser's, Node 22's, or the `ws` package's). */
export interface WebSocketLike {
  readonly readyState: number;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  send(data: string): void;
  close(code?: number, reason?: string): void;
}

export type WebSocketConstructor = new (url: string) => WebSocketLike;

export interface HeraldOptions {
  /** The server: `http(s)://host:port` or `ws(s)://host:port/ws`. In a page, relative to it. */
  url: string;
  /** A user token (JWT). */
  token?: string;
  /** Gives a token, called before connecting when there is none, when it expires, and after 4003. */
  getToken?: () => string | Promise<string>;
  /** Dev mode only: connect as this user without a token. */
  user?: string;
  /** The device id (each device of a user has its own cursor on acked channels). */
  device?: string;
  /** Presence member id; default: one per tab (sessionStorage), kept across reconnects and reloads. */
  clientId?: string;
  /** A WebSocket implementation where there is no global one (Node 20: `import WebSocket from 'ws'`). */
  WebSocket?: WebSocketConstructor;
  /** Reconnect delays. Default 250 ms doubling up to 10 s, full jitter. */
  backoff?: BackoffOptions;
  /** Extra wait before reconnecting after 4009 (rate limited), ms. Default 5,000. */
  rateLimitedDelayMs?: number;
  /** Send an application ping after this long without a frame from the server, ms. Default 30,000. */
  pingIntervalMs?: number;
  /** No frame within this long after a ping: the connection is dead, ms. Default 10,000. */
  pongTimeoutMs?: number;
  /** How long `publish` waits for the server's answer, connection included, ms. Default 30,000. */
  publishTimeoutMs?: number;
  /** How long other requests (`presence`) wait, ms. Default 10,000. */
  requestTimeoutMs?: number;
  /** Most publishes waiting for an answer; more are refused with `backlog`. Default 100. */
  maxQueuedPublishes?: number;
  /** Client frames per second (acks excepted), below the server's `client_frames_per_sec`. Default 50. */
  framesPerSecond?: number;
  /** Connect at once (default) or wait for `connect()`. */
  autoConnect?: boolean;
}

export type ConnectionStatus = 'connecting' | 'connected' | 'disconnected' | 'closed';

export interface ConnectionState {
  status: ConnectionStatus;
  /** Successful connections so far (`connects - 1` reconnects). */
  connects: number;
  /** Consecutive failed attempts. */
  attempt: number;
  /** While `disconnected`: when the next attempt starts (ms since the epoch). */
  retryAt?: number;
  /** The browser's view of the network; `true` where unknown. */
  online: boolean;
  /** Why the last connection ended or failed; when `closed`, why for good (absent after `close()`). */
  error?: HeraldError;
}

export interface PublishOptions {
  /** Default: a random key, so a retry across a reconnect has exactly one effect. */
  idempotencyKey?: string;
  meta?: Meta;
  /** Default `publishTimeoutMs`. */
  timeoutMs?: number;
}

export interface HeraldEvents {
  /** A server `error` frame not tied to a request (e.g. a refused ack). */
  error: HeraldError;
  /**
   * The server subscribed this connection (the personal channel, when the
   * server has `[personal] subscribe`), once per subscription: read it as
   * one from `subscribe()` (`sub.onMessage`, `for await`); it resumes on
   * every reconnect and `unsubscribe()` ends it. Without a listener the
   * client declines it (unsubscribes at once).
   */
  subscribed: Subscription<unknown>;
}

/** A request kept until answered: publishes and `presence`. */
interface Job {
  frame: Record<string, unknown>;
  /** `data` serialised once, so every retry sends the same bytes. */
  data?: string;
  publish: boolean;
  key?: string;
  req?: number;
  tries: number;
  timer: ReturnType<typeof setTimeout>;
  retryTimer?: ReturnType<typeof setTimeout>;
  resolve(frame: Record<string, unknown>): void;
  reject(e: HeraldError): void;
}

type Pending = { sub: AnySubscription } | { job: Job } | { ping: true } | { ignore: true };

const OPEN = 1;

export class Herald extends Emitter<HeraldEvents> {
  /** The connection state, observable. */
  readonly state: Observable<ConnectionState>;
  readonly clientId: string;

  #opts: Required<Pick<HeraldOptions, 'rateLimitedDelayMs' | 'pingIntervalMs' | 'pongTimeoutMs' | 'publishTimeoutMs' | 'requestTimeoutMs' | 'maxQueuedPublishes' | 'framesPerSecond'>> & HeraldOptions;
  #backoff: Required<BackoffOptions>;
  #state: Value<ConnectionState>;
  #WS: WebSocketConstructor;
  #ws: WebSocketLike | undefined;
  /** Bumped per socket: events of an older socket are ignored. */
  #gen = 0;
  #opened = false;
  #healthy = false;
  #disconnect: DisconnectFrame | undefined;
  #subs = new Map<string, AnySubscription>();
  #pending = new Map<number, Pending>();
  #jobs: Job[] = [];
  #nextReq = 1;
  #retryTimer: ReturnType<typeof setTimeout> | undefined;
  #tick: ReturnType<typeof setInterval> | undefined;
  #lastRx = 0;
  #pingDeadline = 0;
  #token: string | undefined;
  #refresh = false;
  #freshToken = false;
  #closed = false;
  // Pacing: a token bucket in front of the socket.
  #tokens = 0;
  #lastRefill = 0;
  #out: string[] = [];
  #drainTimer: ReturnType<typeof setTimeout> | undefined;
  #unlisten: (() => void)[] = [];

  constructor(opts: HeraldOptions) {
    super();
    this.#opts = {
      rateLimitedDelayMs: 5000,
      pingIntervalMs: 30_000,
      pongTimeoutMs: 10_000,
      publishTimeoutMs: 30_000,
      requestTimeoutMs: 10_000,
      maxQueuedPublishes: 100,
      framesPerSecond: 50,
      ...opts,
    };
    this.#backoff = { baseMs: 250, maxMs: 10_000, ...opts.backoff };
    const WS = opts.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    if (!WS) throw new TypeError('no WebSocket implementation: pass one as `WebSocket` (e.g. the `ws` package)');
    this.#WS = WS;
    this.#token = opts.token;
    this.clientId = opts.clientId ?? tabClientId();
    const online = (globalThis as { navigator?: { onLine?: boolean } }).navigator?.onLine !== false;
    this.#state = new Value<ConnectionState>({ status: 'disconnected', connects: 0, attempt: 0, online });
    this.state = this.#state;
    this.#listenToPage();
    if (opts.autoConnect !== false) this.connect();
  }

  get connected(): boolean {
    return this.#state.value.status === 'connected';
  }

  /** Connect now (also cuts a reconnect wait short). */
  connect(): void {
    if (this.#closed || this.#ws) return;
    clearTimeout(this.#retryTimer);
    this.#retryTimer = undefined;
    void this.#open();
  }

  /**
   * Subscribe to `channel`. The subscription lives until `unsubscribe()`,
   * the server ends it, or the client closes; it resumes by itself after
   * every reconnect. Read it with `onMessage` or `for await`.
   */
  subscribe<T = unknown>(channel: string, opts: SubscribeOptions<T> = {}): Subscription<T> {
    if (this.#closed) throw new HeraldError('closed', 'the client is closed');
    if (this.#subs.has(channel)) {
      throw new HeraldError('already_subscribed', `already subscribed to ${channel} on this client`, { channel });
    }
    const sub = new Subscription<T>(this.#link, channel, opts);
    this.#subs.set(channel, sub);
    sub._subscribe();
    return sub;
  }

  /**
   * Publish over the socket (the namespace must allow client publishes).
   * Made while disconnected, it waits for the connection (bounded by
   * `maxQueuedPublishes` and the timeout); publishes go out in call order.
   * If the connection is lost before the answer, it is sent again under
   * the same idempotency key: one effect, and the answer says `duplicate`.
   */
  publish(channel: string, data: Json | unknown, opts: PublishOptions = {}): Promise<PublishResult> {
    const key = opts.idempotencyKey ?? randomId('pub-');
    if (this.#jobs.filter((j) => j.publish).length >= this.#opts.maxQueuedPublishes) {
      return Promise.reject(
        new HeraldError('backlog', 'too many publishes waiting for the server', { channel, idempotencyKey: key }),
      );
    }
    const frame: Record<string, unknown> = { type: 'publish', channel, idempotency_key: key };
    if (opts.meta) frame.meta = opts.meta;
    return this.#enqueue(frame, opts.timeoutMs ?? this.#opts.publishTimeoutMs, JSON.stringify(data) ?? 'null', key).then(
      (r) => {
        const out: PublishResult = { channel, id: String(r.id), duplicate: !!r.duplicate, idempotencyKey: key };
        if (typeof r.seq === 'number') out.seq = r.seq;
        return out;
      },
    );
  }

  /** Close for good: code 1000, every subscription ends, waiting requests fail with `closed`. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const sub of [...this.#subs.values()]) sub.flushAcks();
    const ws = this.#ws;
    this.#dropSocket();
    try {
      ws?.close(1000, 'client closed');
    } catch {
      // Already closing.
    }
    this.#shutdown(new HeraldError('closed', 'the client was closed'), undefined);
  }

  // ---- the link subscriptions use ----

  #link: Link = ((client: Herald): Link => ({
    get connected() {
      return client.connected;
    },
    get clientId() {
      return client.clientId;
    },
    sendSubscribe: (sub, frame) => void client.#send(frame, { sub }),
    sendUnsubscribe: (channel) => void client.#send({ type: 'unsubscribe', channel }, { ignore: true }),
    sendAck: (channel, seq) => client.#sendNow(JSON.stringify({ type: 'ack', channel, seq })),
    request: (frame) => client.#enqueue(frame, client.#opts.requestTimeoutMs),
    forget: (sub) => {
      if (client.#subs.get(sub.channel) === sub) client.#subs.delete(sub.channel);
    },
  }))(this);

  // ---- connection lifecycle ----

  async #open(): Promise<void> {
    const gen = ++this.#gen;
    this.#ws = undefined;
    this.#healthy = false;
    this.#setState({ status: 'connecting', retryAt: undefined });
    let url: string;
    try {
      url = await this.#url();
    } catch (e) {
      const err = e instanceof HeraldError ? e : new HeraldError('token_unavailable', 'getToken failed', { cause: e });
      if (gen === this.#gen && !this.#closed) this.#afterFailure('retry', err);
      return;
    }
    if (gen !== this.#gen || this.#closed) return;
    const ws = new this.#WS(url);
    this.#ws = ws;
    this.#opened = false;
    this.#disconnect = undefined;
    ws.onopen = () => gen === this.#gen && this.#onOpen();
    ws.onmessage = (ev) => gen === this.#gen && this.#onFrame(ev.data);
    ws.onclose = (ev) => gen === this.#gen && void this.#onClose(ev.code, ev.reason, url);
    ws.onerror = () => {}; // a close event follows
  }

  async #url(): Promise<string> {
    const o = this.#opts;
    this.#freshToken = false;
    if (o.getToken && (this.#refresh || !this.#token || expiresSoon(this.#token, Date.now(), 5000))) {
      this.#token = await o.getToken();
      this.#refresh = false;
      this.#freshToken = true;
    }
    const base = (globalThis as { location?: { href: string } }).location?.href;
    const u = new URL(o.url, base);
    u.protocol = u.protocol.replace(/^http/, 'ws');
    if (u.pathname === '/' || u.pathname === '') u.pathname = '/ws';
    if (this.#token) u.searchParams.set('token', this.#token);
    else if (o.user) u.searchParams.set('user', o.user);
    if (o.device) u.searchParams.set('device', o.device);
    return u.toString();
  }

  #onOpen(): void {
    this.#opened = true;
    this.#lastRx = Date.now();
    this.#pingDeadline = 0;
    this.#tokens = this.#opts.framesPerSecond;
    this.#lastRefill = Date.now();
    const s = this.#state.value;
    this.#setState({ status: 'connected', connects: s.connects + 1, error: undefined });
    const period = Math.max(250, Math.min(this.#opts.pingIntervalMs, this.#opts.pongTimeoutMs) / 4);
    this.#tick = setInterval(() => this.#onTick(), period);
    for (const sub of this.#subs.values()) sub._subscribe();
    for (const job of this.#jobs) if (job.req === undefined && !job.retryTimer) this.#sendJob(job);
  }

  async #onClose(code: number, reason: string, url: string): Promise<void> {
    const opened = this.#opened;
    const disconnect = this.#disconnect;
    this.#dropSocket();
    if (this.#closed) return;
    const closeCode = disconnect?.code ?? code;
    let err = new HeraldError(opened ? 'connection_lost' : 'network', reason || disconnect?.reason || 'connection closed', {
      closeCode,
    });
    let action: CloseAction;
    if (opened) {
      action = closeAction(code, disconnect);
    } else {
      // The upgrade failed; a browser does not say why. Ask the server.
      const refusal = await this.#probe(url);
      if (this.#closed || this.#ws) return;
      action = refusal ? refusalAction(refusal.status, refusal.code) : 'retry';
      if (refusal && action !== 'retry') {
        err = new HeraldError(refusal.code ?? 'unauthorized', refusal.detail ?? `upgrade refused: HTTP ${refusal.status}`, {
          status: refusal.status,
        });
        // An unauthorized token may be replaced by a fresh one, once.
        if (action === 'fatal' && refusal.status === 401 && this.#opts.getToken && !this.#freshToken) {
          action = 'refresh_token';
        }
      }
    }
    if (action === 'fatal' && opened) {
      err = new HeraldError('disconnected', `the server closed the connection: ${closeCode} ${reason || disconnect?.reason || ''}`.trim(), {
        closeCode,
      });
    }
    this.#afterFailure(action, err);
  }

  #afterFailure(action: CloseAction, err: HeraldError): void {
    if (action === 'refresh_token' && !this.#opts.getToken) action = 'fatal';
    if (action === 'fatal') return this.#shutdown(err, err);
    const s = this.#state.value;
    let attempt = this.#healthy ? 0 : s.attempt;
    let delay: number;
    if (action === 'resume' || action === 'refresh_token') {
      if (action === 'refresh_token') this.#refresh = true;
      attempt = 0;
      delay = backoffDelay(0, this.#backoff);
    } else {
      delay = backoffDelay(attempt, this.#backoff);
      if (action === 'slow') delay += this.#opts.rateLimitedDelayMs;
    }
    this.#setState({ status: 'disconnected', attempt: attempt + 1, retryAt: Date.now() + delay, error: err });
    this.#retryTimer = setTimeout(() => {
      this.#retryTimer = undefined;
      void this.#open();
    }, delay);
  }

  /** Forget the current socket: pending replies will not come, paced frames are not sent. */
  #dropSocket(): void {
    this.#gen++;
    const ws = this.#ws;
    this.#ws = undefined;
    if (ws) ws.onopen = ws.onmessage = ws.onclose = null;
    clearInterval(this.#tick);
    clearTimeout(this.#drainTimer);
    this.#drainTimer = undefined;
    this.#out = [];
    for (const p of this.#pending.values()) if ('job' in p) p.job.req = undefined;
    this.#pending.clear();
    for (const sub of this.#subs.values()) sub._onDisconnected();
  }

  /** Abandon a socket that stopped answering; reconnect. */
  #abandon(): void {
    const ws = this.#ws;
    if (!ws) return;
    this.#dropSocket();
    try {
      ws.close(1000, 'no answer to ping');
    } catch {
      // Nothing to close.
    }
    this.#afterFailure('retry', new HeraldError('timeout', 'the connection stopped answering'));
  }

  #shutdown(err: HeraldError, stateError: HeraldError | undefined): void {
    this.#closed = true;
    clearTimeout(this.#retryTimer);
    for (const off of this.#unlisten) off();
    this.#unlisten = [];
    for (const job of [...this.#jobs]) this.#settle(job, err);
    for (const sub of [...this.#subs.values()]) {
      if (stateError) sub._fail(err);
      else sub._close();
    }
    this.#setState({ status: 'closed', retryAt: undefined, error: stateError });
  }

  /** The refusal of a failed upgrade: the same URL fetched over HTTP. */
  async #probe(url: string): Promise<{ status: number; code?: string; detail?: string } | undefined> {
    if (typeof fetch !== 'function') return undefined;
    try {
      const res = await fetch(url.replace(/^ws/, 'http'), { cache: 'no-store' });
      const body = (await res.json().catch(() => ({}))) as { code?: string; detail?: string };
      return { status: res.status, code: body.code, detail: body.detail };
    } catch {
      return undefined; // the server is not there
    }
  }

  // ---- frames ----

  #onFrame(data: unknown): void {
    this.#lastRx = Date.now();
    this.#pingDeadline = 0;
    if (!this.#healthy) {
      // The server accepted us and works: the backoff starts over.
      this.#healthy = true;
      if (this.#state.value.attempt) this.#setState({ attempt: 0 });
    }
    let f: Record<string, unknown>;
    try {
      f = JSON.parse(String(data));
    } catch {
      return this.emit('error', new HeraldError('protocol', 'a frame that is not JSON'));
    }
    const sub = typeof f.channel === 'string' ? this.#subs.get(f.channel) : undefined;
    switch (f.type) {
      case 'message':
      case 'room':
        return sub?._onMessage(f);
      case 'join':
      case 'leave':
        return sub?._onPresence(f.type, f);
      case 'unsubscribed':
        return sub?._onUnsubscribed(String(f.reason ?? ''));
      case 'subscribed':
        return this.#onServerSubscribed(f, sub);
      case 'disconnect':
        this.#disconnect = { code: Number(f.code), reason: String(f.reason ?? ''), reconnect: f.reconnect !== false };
        return;
      case 'ok':
      case 'error':
      case 'pong':
        return this.#onReply(f);
    }
  }

  /** A `subscribed` frame: a subscription the server made (see `HeraldEvents`). */
  #onServerSubscribed(f: Record<string, unknown>, known: AnySubscription | undefined): void {
    const reply = { ...f, type: 'ok' };
    if (known) {
      // Made again on a new connection: its reply resumes it.
      if (known.serverSide) known._onReply(reply);
      return;
    }
    const channel = String(f.channel ?? '');
    if (!this.listens('subscribed')) {
      this.#link.sendUnsubscribe(channel);
      return;
    }
    // Made from a position: delivery starts after `since`, not the head.
    const since = typeof f.since === 'number' ? { seq: f.since, epoch: f.epoch as string | undefined } : undefined;
    const sub = new Subscription<unknown>(this.#link, channel, since ? { since } : {}, true);
    this.#subs.set(channel, sub);
    sub._subscribe();
    sub._onReply(reply);
    this.emit('subscribed', sub);
  }

  #onReply(f: Record<string, unknown>): void {
    const p = typeof f.req === 'number' ? this.#pending.get(f.req) : undefined;
    if (p) this.#pending.delete(f.req as number);
    if (p && 'sub' in p) return p.sub._onReply(f);
    if (p && 'job' in p) {
      const job = p.job;
      job.req = undefined;
      if (f.type === 'ok') return this.#settle(job, undefined, f);
      const code = String(f.code ?? 'internal');
      const err = new HeraldError(code, String(f.message ?? code), {
        channel: f.channel as string | undefined,
        idempotencyKey: job.key,
      });
      if (!isTransient(code)) return this.#settle(job, err);
      // Same request, same key, later.
      job.retryTimer = setTimeout(() => {
        job.retryTimer = undefined;
        this.#sendJob(job);
      }, 250 + backoffDelay(job.tries++, this.#backoff));
      return;
    }
    if (!p && f.type === 'error') {
      this.emit('error', new HeraldError(String(f.code ?? 'internal'), String(f.message ?? ''), { channel: f.channel as string }));
    }
  }

  // ---- requests ----

  #enqueue(frame: Record<string, unknown>, timeoutMs: number, data?: string, key?: string): Promise<Record<string, unknown>> {
    if (this.#closed) return Promise.reject(new HeraldError('closed', 'the client is closed'));
    return new Promise((resolve, reject) => {
      const job: Job = {
        frame,
        data,
        publish: data !== undefined,
        key,
        tries: 0,
        resolve,
        reject,
        timer: setTimeout(() => {
          const what = job.req === undefined ? 'waiting for a connection' : 'waiting for the answer';
          this.#settle(job, new HeraldError('timeout', `timed out ${what}`, { channel: frame.channel as string, idempotencyKey: key }));
        }, timeoutMs),
      };
      this.#jobs.push(job);
      this.#sendJob(job);
    });
  }

  #sendJob(job: Job): void {
    if (!this.connected || !this.#jobs.includes(job)) return;
    let body = JSON.stringify(job.frame);
    if (job.data !== undefined) body = body.slice(0, -1) + `,"data":${job.data}}`;
    job.req = this.#sendText(body, { job });
  }

  #settle(job: Job, err?: HeraldError, reply?: Record<string, unknown>): void {
    const i = this.#jobs.indexOf(job);
    if (i < 0) return;
    this.#jobs.splice(i, 1);
    clearTimeout(job.timer);
    clearTimeout(job.retryTimer);
    if (job.req !== undefined) this.#pending.set(job.req, { ignore: true });
    if (err) job.reject(err);
    else job.resolve(reply!);
  }

  // ---- sending ----

  /** Send a request frame (paced), with a fresh `req`. */
  #send(frame: Record<string, unknown>, pending: Pending): number | undefined {
    return this.#sendText(JSON.stringify(frame), pending);
  }

  /** `body` is a frame's JSON object text; a fresh `req` is put first. */
  #sendText(body: string, pending: Pending): number | undefined {
    if (!this.#ws || !this.#opened) return undefined;
    const req = this.#nextReq++;
    this.#pending.set(req, pending);
    this.#out.push(`{"req":${req},${body.slice(1)}`);
    this.#drain();
    return req;
  }

  #drain(): void {
    const now = Date.now();
    const rate = this.#opts.framesPerSecond;
    this.#tokens = Math.min(rate, this.#tokens + ((now - this.#lastRefill) * rate) / 1000);
    this.#lastRefill = now;
    while (this.#out.length && this.#tokens >= 1) {
      this.#tokens -= 1;
      this.#sendNow(this.#out.shift()!);
    }
    if (this.#out.length && !this.#drainTimer) {
      this.#drainTimer = setTimeout(() => {
        this.#drainTimer = undefined;
        this.#drain();
      }, Math.ceil(1000 / rate));
    }
  }

  #sendNow(text: string): void {
    if (this.#ws?.readyState === OPEN) this.#ws.send(text);
  }

  // ---- liveness ----

  #onTick(): void {
    const now = Date.now();
    if (this.#pingDeadline && now > this.#pingDeadline) return this.#abandon();
    if (!this.#pingDeadline && now - this.#lastRx >= this.#opts.pingIntervalMs) this.#ping(this.#opts.pongTimeoutMs);
  }

  /** An application ping: any frame before the deadline proves the connection alive. */
  #ping(timeoutMs: number): void {
    if (!this.connected) return;
    const deadline = Date.now() + timeoutMs;
    if (!this.#pingDeadline || deadline < this.#pingDeadline) this.#pingDeadline = deadline;
    this.#send({ type: 'ping' }, { ping: true });
  }

  /** The page came back, or the network did: check the connection now, or reconnect now. */
  #check(): void {
    if (this.#closed) return;
    if (this.connected) this.#ping(Math.min(this.#opts.pongTimeoutMs, 5000));
    else if (this.#retryTimer) this.connect();
  }

  #listenToPage(): void {
    const g = globalThis as unknown as {
      addEventListener?: (t: string, f: () => void) => void;
      removeEventListener?: (t: string, f: () => void) => void;
      document?: { visibilityState?: string; addEventListener(t: string, f: () => void): void; removeEventListener(t: string, f: () => void): void };
    };
    const on = (target: typeof g.document | typeof g, type: string, fn: () => void) => {
      if (!target?.addEventListener) return;
      target.addEventListener(type, fn);
      this.#unlisten.push(() => target.removeEventListener?.(type, fn));
    };
    on(g.document, 'visibilitychange', () => g.document?.visibilityState === 'visible' && this.#check());
    on(g, 'online', () => {
      this.#setState({ online: true });
      this.#check();
    });
    on(g, 'offline', () => {
      this.#setState({ online: false });
      this.#check();
    });
  }

  #setState(patch: Partial<ConnectionState>): void {
    this.#state.set({ ...this.#state.value, ...patch });
  }

}
