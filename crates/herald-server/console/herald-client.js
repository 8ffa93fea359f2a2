// @herald/client, bundled for the web console by clients/typescript/scripts/build.mjs
// from clients/typescript/src. Generated: do not edit; rebuild with `npm run build`.

// src/backoff.ts
function backoffCeiling(attempt, opts) {
  const exp = Math.min(Math.max(attempt, 0), 30);
  return Math.min(opts.maxMs, opts.baseMs * 2 ** exp);
}
function backoffDelay(attempt, opts, random = Math.random) {
  return Math.floor(random() * (backoffCeiling(attempt, opts) + 1));
}

// src/errors.ts
var CloseCode = {
  NORMAL: 1e3,
  GOING_AWAY: 1001,
  ABNORMAL: 1006,
  MESSAGE_TOO_BIG: 1009,
  INTERNAL: 1011,
  BAD_REQUEST: 4e3,
  UNAUTHORIZED: 4001,
  TOKEN_EXPIRED: 4003,
  IDLE_TIMEOUT: 4004,
  RESYNC: 4005,
  SLOW_CONSUMER: 4008,
  RATE_LIMITED: 4009,
  DRAINING: 4010,
  /** The backend disconnected this connection; reconnect (with backoff). */
  DISCONNECTED: 4011,
  /** The backend disconnected this connection for good (a ban): do not reconnect. */
  DISCONNECTED_FOR_GOOD: 4012
};
var TRANSIENT = /* @__PURE__ */ new Set([
  "unavailable",
  "shutting_down",
  "internal",
  "rate_limited",
  "too_many_connections",
  "idempotency_key_in_flight",
  "connection_lost",
  "timeout",
  "network"
]);
var HeraldError = class extends Error {
  code;
  status;
  closeCode;
  channel;
  idempotencyKey;
  problem;
  constructor(code, message, details = {}) {
    super(message, details.cause === void 0 ? void 0 : { cause: details.cause });
    this.name = "HeraldError";
    this.code = code;
    this.status = details.status;
    this.closeCode = details.closeCode;
    this.channel = details.channel;
    this.idempotencyKey = details.idempotencyKey;
    this.problem = details.problem;
  }
  /** Whether retrying the same request (with the same idempotency key) may succeed. */
  get retryable() {
    return TRANSIENT.has(this.code) || this.status !== void 0 && this.status >= 500;
  }
};
function isTransient(code) {
  return TRANSIENT.has(code);
}

// src/close.ts
function closeAction(code, disconnect) {
  const c = disconnect?.code ?? code;
  if (disconnect && !disconnect.reconnect) return "fatal";
  switch (c) {
    case CloseCode.MESSAGE_TOO_BIG:
    case CloseCode.BAD_REQUEST:
    case CloseCode.UNAUTHORIZED:
    case CloseCode.DISCONNECTED_FOR_GOOD:
      return "fatal";
    case CloseCode.TOKEN_EXPIRED:
      return "refresh_token";
    case CloseCode.RESYNC:
    case CloseCode.SLOW_CONSUMER:
    case CloseCode.DRAINING:
      return "resume";
    case CloseCode.RATE_LIMITED:
      return "slow";
    default:
      return "retry";
  }
}
function refusalAction(status, code) {
  if (code === "token_expired") return "refresh_token";
  if (status === 401 || status === 403) return "fatal";
  return "retry";
}

// src/ids.ts
function randomId(prefix) {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  let hex = "";
  for (const b of bytes) hex += b.toString(16).padStart(2, "0");
  return prefix + hex;
}
var CLIENT_ID_KEY = "herald.client_id";
function tabClientId() {
  let storage;
  try {
    storage = globalThis.sessionStorage;
  } catch {
  }
  const existing = storage?.getItem(CLIENT_ID_KEY);
  if (existing) return existing;
  const id = randomId("tab-");
  try {
    storage?.setItem(CLIENT_ID_KEY, id);
  } catch {
  }
  return id;
}

// src/observable.ts
var Value = class {
  #value;
  #subscribers = /* @__PURE__ */ new Set();
  constructor(value) {
    this.#value = value;
  }
  get value() {
    return this.#value;
  }
  set(value) {
    this.#value = value;
    for (const fn of [...this.#subscribers]) fn(value);
  }
  subscribe(fn) {
    this.#subscribers.add(fn);
    fn(this.#value);
    return () => this.#subscribers.delete(fn);
  }
};
var Emitter = class {
  #listeners = /* @__PURE__ */ new Map();
  /** Adds a listener; returns the function that removes it. */
  on(type, fn) {
    let set = this.#listeners.get(type);
    if (!set) this.#listeners.set(type, set = /* @__PURE__ */ new Set());
    set.add(fn);
    return () => this.off(type, fn);
  }
  off(type, fn) {
    this.#listeners.get(type)?.delete(fn);
  }
  /** Whether anyone listens to `type`. */
  listens(type) {
    return (this.#listeners.get(type)?.size ?? 0) > 0;
  }
  emit(type, arg) {
    const set = this.#listeners.get(type);
    if (!set) return;
    for (const fn of [...set]) {
      try {
        fn(arg);
      } catch (e) {
        setTimeout(() => {
          throw e;
        });
      }
    }
  }
};

// src/cursor.ts
var Cursor = class {
  received;
  handled;
  epoch;
  /** The channel is acked (the `ok` reply carried a `cursor`). */
  acked = false;
  constructor(since) {
    if (since) {
      this.received = this.handled = since.seq;
      this.epoch = since.epoch || void 0;
    }
  }
  /** The `since` to send with a (re)subscribe. */
  since() {
    const seq = this.acked ? this.handled : this.received;
    if (seq === void 0) return void 0;
    return this.epoch === void 0 ? { seq } : { seq, epoch: this.epoch };
  }
  /**
   * A new connection (or a resubscribe) is about to subscribe again. On
   * acked channels the queue is dropped and the server resends from
   * `handled`; `inProgress` (the seq the application is handling now)
   * stays a duplicate so it is not handed over twice.
   */
  onResubscribe(inProgress) {
    if (this.acked) this.received = Math.max(this.handled ?? 0, inProgress ?? 0);
  }
  /**
   * Apply a subscribe reply. Returns the discontinuity the application
   * must hear about. On an epoch change the caller drops its queue too.
   */
  onSubscribed(r) {
    if (r.epoch === void 0) {
      this.received = this.handled = this.epoch = void 0;
      return { truncated: false, epochChanged: false };
    }
    const epochChanged = !!r.epoch_changed || this.epoch !== void 0 && this.epoch !== r.epoch;
    const truncated = !!r.truncated;
    const first = r.first ?? 1;
    const head = r.head ?? 0;
    this.epoch = r.epoch;
    if (r.cursor !== void 0) {
      this.acked = true;
      const start = head - (r.unread ?? 0);
      this.handled = start;
      this.received = epochChanged ? start : Math.max(start, this.received ?? 0);
    } else if (epochChanged) {
      this.received = this.handled = first - 1;
    } else if (truncated) {
      this.received = first - 1;
    } else if (this.received === void 0) {
      this.received = this.handled = head;
    }
    return { truncated, epochChanged };
  }
  /** Judge an arriving message by its seq; advances `received` when accepted. */
  onMessage(seq) {
    if (seq === void 0) return { kind: "deliver" };
    const pos = this.received;
    if (pos !== void 0 && seq <= pos) return { kind: "duplicate" };
    this.received = seq;
    if (pos === void 0 || seq === pos + 1) return { kind: "deliver" };
    return { kind: "gap", expected: pos + 1 };
  }
  /** The application handled `seq` (and, cumulatively, everything before it). */
  onHandled(seq) {
    if (this.handled === void 0 || seq > this.handled) this.handled = seq;
    if (this.received === void 0 || this.handled > this.received) this.received = this.handled;
  }
  /** The handler failed: everything after `handled` must be accepted again. */
  onFailed() {
    this.received = this.handled;
  }
};

// src/subscription.ts
var HOLD_BASE = { baseMs: 1e3, maxMs: 3e4 };
var Subscription = class extends Emitter {
  channel;
  /** Resolves with the first `ok` reply; rejects if the server refuses the subscription. */
  ready;
  /** The latest `ok` reply. */
  info;
  status = "subscribing";
  /** Why the subscription failed, if it did. */
  error;
  #link;
  #opts;
  #cursor;
  #queue = [];
  /** The `ok` reply of the current subscribe arrived; messages before it are leftovers. */
  #confirmed = false;
  /** A subscribe is on the wire (not yet answered) on this connection. */
  #sent = false;
  /** Dropping everything until the resubscribe: after a handler failure or a full queue. */
  #held = false;
  #holdTimer;
  #failures = 0;
  #pumping = false;
  /** The seq being handled now (the handler has it, or the iterator consumer). */
  #inProgress;
  /** Highest seq ever handed to the application (for the `redelivered` flag). */
  #maxHanded = 0;
  #ackedSent = 0;
  #ackTimer;
  #resolveReady;
  #rejectReady;
  // Iterator hand-off: one message waiting for the consumer, one consumer waiting for a message.
  #offer;
  #waiter;
  #waiterFail;
  #current;
  #iterating = false;
  /**
   * Made by the server (the personal channel; `Herald`'s `subscribed`
   * event), not by `subscribe()`: the server makes it again on every
   * connection, so the client never sends its subscribe.
   */
  serverSide;
  constructor(link, channel, opts, serverSide = false) {
    super();
    this.#link = link;
    this.channel = channel;
    this.serverSide = serverSide;
    this.#opts = opts;
    this.#cursor = new Cursor(opts.since);
    this.ready = new Promise((resolve, reject) => {
      this.#resolveReady = resolve;
      this.#rejectReady = reject;
    });
    this.ready.catch(() => {
    });
  }
  /** Where to resume this subscription later: the last handled seq and its epoch. */
  get position() {
    const seq = this.#cursor.handled;
    if (seq === void 0) return void 0;
    return this.#cursor.epoch === void 0 ? { seq } : { seq, epoch: this.#cursor.epoch };
  }
  /** Members of this presence channel, from the server. */
  async presence() {
    const r = await this.#link.request({ type: "presence", channel: this.channel });
    return { count: Number(r.count ?? 0), members: r.members ?? [] };
  }
  /**
   * Acknowledge `seq` and everything before it (acked channels; for
   * `ack: 'manual'`). Sent batched, like automatic acks.
   */
  ack(seq) {
    if (!this.#cursor.acked || seq > (this.#cursor.received ?? 0)) return;
    this.#cursor.onHandled(seq);
    this.#scheduleAck();
  }
  /** Send pending acks now. */
  flushAcks() {
    clearTimeout(this.#ackTimer);
    this.#ackTimer = void 0;
    const handled = this.#cursor.handled ?? 0;
    if (this.#cursor.acked && this.#confirmed && this.#link.connected && handled > this.#ackedSent) {
      this.#link.sendAck(this.channel, handled);
      this.#ackedSent = handled;
    }
  }
  /** Stop: acks what was handled, leaves presence, ends iteration. */
  unsubscribe() {
    if (this.status === "ended") return;
    this.flushAcks();
    if (this.#confirmed || this.#sent) this.#link.sendUnsubscribe(this.channel);
    this.#end();
  }
  /**
   * Set the message handler (as `SubscribeOptions.onMessage`) after the
   * fact: for a subscription the server made (`Herald`'s `subscribed`
   * event). One consumer per subscription: a handler or an iterator.
   */
  handle(onMessage) {
    if (this.#opts.onMessage || this.#iterating) {
      throw new TypeError("a subscription has one consumer: an onMessage handler or one iterator");
    }
    this.#opts = { ...this.#opts, onMessage };
    void this.#pump();
  }
  [Symbol.asyncIterator]() {
    if (this.#opts.onMessage || this.#iterating) {
      throw new TypeError("a subscription has one consumer: an onMessage handler or one iterator");
    }
    this.#iterating = true;
    return {
      next: () => {
        this.#current?.done(true);
        this.#current = void 0;
        return new Promise((resolve, reject) => {
          this.#waiter = resolve;
          this.#waiterFail = reject;
          this.#serveIterator();
        });
      },
      return: async () => {
        this.#current?.done(false);
        this.#current = void 0;
        this.unsubscribe();
        return { value: void 0, done: true };
      }
    };
  }
  // ---- called by the client ----
  /** A connection is up (or a hold is over): subscribe from the cursor. */
  _subscribe() {
    if (this.status === "ended" || this.#holdTimer !== void 0 || !this.#link.connected) return;
    this.#confirmed = false;
    this.#held = false;
    if (this.#cursor.acked) this.#queue = this.#queue.filter((i) => i.kind !== "message");
    this.#cursor.onResubscribe(this.#inProgress);
    if (this.serverSide) return;
    const frame = { type: "subscribe", channel: this.channel, client_id: this.#link.clientId };
    const since = this.#cursor.since();
    if (since) frame.since = since;
    if (this.#opts.info !== void 0) frame.info = this.#opts.info;
    this.#sent = true;
    this.#link.sendSubscribe(this, frame);
  }
  _onDisconnected() {
    this.#confirmed = false;
    this.#sent = false;
    clearTimeout(this.#ackTimer);
    this.#ackTimer = void 0;
  }
  /** The reply to our subscribe. */
  _onReply(frame) {
    this.#sent = false;
    if (this.status === "ended") return;
    if (frame.type !== "ok") {
      const err = new HeraldError(String(frame.code ?? "internal"), String(frame.message ?? "subscribe refused"), {
        channel: this.channel
      });
      if (this.status === "subscribing" && !this.info) return this._fail(err);
      if (isTransient(err.code)) return this.#hold(err);
      return this._fail(err);
    }
    const r = frame;
    const reset = this.#cursor.onSubscribed(r);
    if (reset.epochChanged) {
      this.#queue = this.#queue.filter((i) => i.kind !== "message");
      this.#maxHanded = 0;
    }
    this.#confirmed = true;
    this.#failures = 0;
    if (r.cursor !== void 0) this.#ackedSent = r.cursor;
    const info = {
      channel: this.channel,
      epoch: r.epoch,
      first: r.first,
      head: r.head,
      truncated: reset.truncated,
      epochChanged: reset.epochChanged,
      cursor: r.cursor,
      unread: r.unread,
      clientId: r.client_id
    };
    this.info = info;
    if (this.status === "subscribing") {
      this.status = "active";
      this.#resolveReady(info);
    }
    this.emit("subscribed", info);
    if (r.epoch !== void 0 && (reset.truncated || reset.epochChanged)) {
      const ev = { channel: this.channel, epoch: r.epoch, first: r.first ?? 1, head: r.head ?? 0 };
      if (reset.truncated) this.#queue.push({ kind: "reset", type: "truncated", ev });
      if (reset.epochChanged) this.#queue.push({ kind: "reset", type: "epoch_changed", ev });
    }
    this.flushAcks();
    void this.#pump();
  }
  /** A `message` or `room` frame for this channel. */
  _onMessage(frame) {
    const seq = typeof frame.seq === "number" ? frame.seq : void 0;
    if (this.status === "ended" || this.#held) return;
    if (seq !== void 0 && !this.#confirmed) return;
    const verdict = this.#cursor.onMessage(seq);
    if (verdict.kind === "duplicate") {
      if (frame.redelivered && seq !== void 0 && seq <= (this.#cursor.handled ?? 0)) this.#scheduleAck();
      return;
    }
    if (verdict.kind === "gap") {
      this.#queue.push({ kind: "gap", ev: { channel: this.channel, expected: verdict.expected, got: seq } });
    }
    if (frame.type === "room") {
      const d = frame.data ?? {};
      this.#queue.push({ kind: "room", ev: { ...d, channel: this.channel, seq, id: String(frame.id), ts: Number(frame.ts) } });
    } else {
      const msg = {
        channel: this.channel,
        id: String(frame.id ?? ""),
        ts: Number(frame.ts ?? 0),
        data: frame.data,
        redelivered: !!frame.redelivered || seq !== void 0 && seq <= this.#maxHanded,
        ack: () => seq !== void 0 && this.ack(seq)
      };
      if (seq !== void 0) msg.seq = seq;
      if (frame.meta) msg.meta = frame.meta;
      if (typeof frame.attempt === "number") msg.attempt = frame.attempt;
      this.#queue.push({ kind: "message", msg });
    }
    if (this.#queue.length > (this.#opts.maxQueued ?? 1e3)) {
      if (seq === void 0) {
        this.#queue.pop();
      } else {
        this.#held = true;
      }
    }
    void this.#pump();
  }
  _onPresence(type, frame) {
    if (this.status !== "ended") this.emit(type, frame.member);
  }
  _onUnsubscribed(reason) {
    if (this.status === "ended") return;
    this.#queue.push({ kind: "end", reason });
    this.#link.forget(this);
    void this.#pump();
  }
  /** Fail for good: the subscription is not resumed. */
  _fail(err) {
    if (this.status === "ended") return;
    this.error = err;
    this.#rejectReady(err);
    this.emit("error", err);
    this.#end();
  }
  /** The client closed: end quietly (iterators finish). */
  _close() {
    this.#end();
  }
  // ---- internals ----
  #end() {
    if (this.status === "ended") return;
    this.status = "ended";
    this.#queue = [];
    clearTimeout(this.#holdTimer);
    clearTimeout(this.#ackTimer);
    this.#rejectReady(this.error ?? new HeraldError("closed", "unsubscribed", { channel: this.channel }));
    this.#link.forget(this);
    this.#offer?.done(false);
    this.#offer = void 0;
    this.#serveIterator();
  }
  /** An `error` event; with nobody listening, a console warning (a failure is never silent). */
  #report(err) {
    if (this.listens("error")) this.emit("error", err);
    else console.warn(`herald: ${err.message}`, err.cause ?? err);
  }
  /** Stop taking messages and subscribe again after a delay. */
  #hold(err) {
    this.#held = true;
    this.#cursor.onFailed();
    this.#queue = this.#queue.filter((i) => i.kind !== "message");
    this.#report(err);
    const delay = HOLD_BASE.baseMs + backoffDelay(this.#failures++, HOLD_BASE);
    clearTimeout(this.#holdTimer);
    this.#holdTimer = setTimeout(() => {
      this.#holdTimer = void 0;
      this.#resubscribe();
    }, delay);
  }
  #resubscribe() {
    if (this.status === "ended") return;
    if (this.#link.connected && (this.#confirmed || this.#sent)) {
      this.flushAcks();
      this.#link.sendUnsubscribe(this.channel);
    }
    this._subscribe();
  }
  #scheduleAck() {
    if (!this.#cursor.acked) return;
    const unacked = (this.#cursor.handled ?? 0) - this.#ackedSent;
    if (unacked <= 0) return;
    if (unacked >= (this.#opts.ackEvery ?? 50)) return this.flushAcks();
    this.#ackTimer ??= setTimeout(() => this.flushAcks(), this.#opts.ackWithinMs ?? 200);
  }
  async #pump() {
    if (this.#pumping) return;
    this.#pumping = true;
    try {
      let item;
      while (this.status !== "ended" && (item = this.#queue.shift())) {
        await this.#dispatch(item);
        if (this.#held && this.#holdTimer === void 0 && this.#queue.length <= (this.#opts.maxQueued ?? 1e3) / 2) {
          this.#resubscribe();
        }
      }
    } finally {
      this.#pumping = false;
    }
  }
  async #dispatch(item) {
    switch (item.kind) {
      case "gap":
        return this.emit("gap", item.ev);
      case "reset":
        return this.emit(item.type, item.ev);
      case "room":
        this.emit("room", item.ev);
        return this.#cursor.onHandled(item.ev.seq);
      case "end":
        this.emit("unsubscribed", { channel: this.channel, reason: item.reason });
        return this.#end();
      case "message":
        return this.#handle(item.msg);
    }
  }
  async #handle(msg) {
    const seq = msg.seq;
    if (seq !== void 0) {
      this.#inProgress = seq;
      this.#maxHanded = Math.max(this.#maxHanded, seq);
    }
    let ok;
    let failure;
    try {
      if (this.#opts.onMessage) {
        await this.#opts.onMessage(msg);
        ok = true;
      } else {
        ok = await new Promise((done) => {
          this.#offer = { msg, done };
          this.#serveIterator();
        });
      }
    } catch (e) {
      ok = false;
      failure = e;
    }
    this.#inProgress = void 0;
    if (this.status === "ended") return;
    if (seq === void 0) {
      if (failure !== void 0) this.#report(new HeraldError("handler_failed", `the handler failed on ${this.channel}`, { channel: this.channel, cause: failure }));
      return;
    }
    if (ok) {
      if (!this.#cursor.acked || this.#opts.ack !== "manual") {
        this.#cursor.onHandled(seq);
        this.#scheduleAck();
      }
    } else if (failure !== void 0) {
      const err = new HeraldError("handler_failed", `the handler failed on ${this.channel} seq ${seq}`, {
        channel: this.channel,
        cause: failure
      });
      this.#hold(err);
    }
  }
  #serveIterator() {
    const waiter = this.#waiter;
    if (!waiter) return;
    if (this.#offer) {
      this.#current = this.#offer;
      const { msg } = this.#offer;
      this.#offer = void 0;
      this.#waiter = this.#waiterFail = void 0;
      waiter({ value: msg, done: false });
    } else if (this.status === "ended") {
      const fail = this.#waiterFail;
      this.#waiter = this.#waiterFail = void 0;
      if (this.error) fail(this.error);
      else waiter({ value: void 0, done: true });
    }
  }
};

// src/token.ts
function tokenExpiry(token) {
  const part = token.split(".")[1];
  if (!part) return void 0;
  try {
    const b64 = part.replace(/-/g, "+").replace(/_/g, "/");
    const text = atob(b64.padEnd(b64.length + (4 - b64.length % 4) % 4, "="));
    const exp = JSON.parse(text).exp;
    return typeof exp === "number" ? exp : void 0;
  } catch {
    return void 0;
  }
}
function expiresSoon(token, now, marginMs) {
  const exp = tokenExpiry(token);
  return exp !== void 0 && exp * 1e3 <= now + marginMs;
}

// src/client.ts
var OPEN = 1;
var Herald = class extends Emitter {
  /** The connection state, observable. */
  state;
  clientId;
  #opts;
  #backoff;
  #state;
  #WS;
  #ws;
  /** Bumped per socket: events of an older socket are ignored. */
  #gen = 0;
  #opened = false;
  #healthy = false;
  #disconnect;
  #subs = /* @__PURE__ */ new Map();
  #pending = /* @__PURE__ */ new Map();
  #jobs = [];
  #nextReq = 1;
  #retryTimer;
  #tick;
  #lastRx = 0;
  #pingDeadline = 0;
  #token;
  #refresh = false;
  #freshToken = false;
  #closed = false;
  // Pacing: a token bucket in front of the socket.
  #tokens = 0;
  #lastRefill = 0;
  #out = [];
  #drainTimer;
  #unlisten = [];
  constructor(opts) {
    super();
    this.#opts = {
      rateLimitedDelayMs: 5e3,
      pingIntervalMs: 3e4,
      pongTimeoutMs: 1e4,
      publishTimeoutMs: 3e4,
      requestTimeoutMs: 1e4,
      maxQueuedPublishes: 100,
      framesPerSecond: 50,
      ...opts
    };
    this.#backoff = { baseMs: 250, maxMs: 1e4, ...opts.backoff };
    const WS = opts.WebSocket ?? globalThis.WebSocket;
    if (!WS) throw new TypeError("no WebSocket implementation: pass one as `WebSocket` (e.g. the `ws` package)");
    this.#WS = WS;
    this.#token = opts.token;
    this.clientId = opts.clientId ?? tabClientId();
    const online = globalThis.navigator?.onLine !== false;
    this.#state = new Value({ status: "disconnected", connects: 0, attempt: 0, online });
    this.state = this.#state;
    this.#listenToPage();
    if (opts.autoConnect !== false) this.connect();
  }
  get connected() {
    return this.#state.value.status === "connected";
  }
  /** Connect now (also cuts a reconnect wait short). */
  connect() {
    if (this.#closed || this.#ws) return;
    clearTimeout(this.#retryTimer);
    this.#retryTimer = void 0;
    void this.#open();
  }
  /**
   * Subscribe to `channel`. The subscription lives until `unsubscribe()`,
   * the server ends it, or the client closes; it resumes by itself after
   * every reconnect. Read it with `onMessage` or `for await`.
   */
  subscribe(channel, opts = {}) {
    if (this.#closed) throw new HeraldError("closed", "the client is closed");
    if (this.#subs.has(channel)) {
      throw new HeraldError("already_subscribed", `already subscribed to ${channel} on this client`, { channel });
    }
    const sub = new Subscription(this.#link, channel, opts);
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
  publish(channel, data, opts = {}) {
    const key = opts.idempotencyKey ?? randomId("pub-");
    if (this.#jobs.filter((j) => j.publish).length >= this.#opts.maxQueuedPublishes) {
      return Promise.reject(
        new HeraldError("backlog", "too many publishes waiting for the server", { channel, idempotencyKey: key })
      );
    }
    const frame = { type: "publish", channel, idempotency_key: key };
    if (opts.meta) frame.meta = opts.meta;
    return this.#enqueue(frame, opts.timeoutMs ?? this.#opts.publishTimeoutMs, JSON.stringify(data) ?? "null", key).then(
      (r) => {
        const out = { channel, id: String(r.id), duplicate: !!r.duplicate, idempotencyKey: key };
        if (typeof r.seq === "number") out.seq = r.seq;
        return out;
      }
    );
  }
  /** Close for good: code 1000, every subscription ends, waiting requests fail with `closed`. */
  close() {
    if (this.#closed) return;
    this.#closed = true;
    for (const sub of [...this.#subs.values()]) sub.flushAcks();
    const ws = this.#ws;
    this.#dropSocket();
    try {
      ws?.close(1e3, "client closed");
    } catch {
    }
    this.#shutdown(new HeraldError("closed", "the client was closed"), void 0);
  }
  // ---- the link subscriptions use ----
  #link = /* @__PURE__ */ ((client) => ({
    get connected() {
      return client.connected;
    },
    get clientId() {
      return client.clientId;
    },
    sendSubscribe: (sub, frame) => void client.#send(frame, { sub }),
    sendUnsubscribe: (channel) => void client.#send({ type: "unsubscribe", channel }, { ignore: true }),
    sendAck: (channel, seq) => client.#sendNow(JSON.stringify({ type: "ack", channel, seq })),
    request: (frame) => client.#enqueue(frame, client.#opts.requestTimeoutMs),
    forget: (sub) => {
      if (client.#subs.get(sub.channel) === sub) client.#subs.delete(sub.channel);
    }
  }))(this);
  // ---- connection lifecycle ----
  async #open() {
    const gen = ++this.#gen;
    this.#ws = void 0;
    this.#healthy = false;
    this.#setState({ status: "connecting", retryAt: void 0 });
    let url;
    try {
      url = await this.#url();
    } catch (e) {
      const err = e instanceof HeraldError ? e : new HeraldError("token_unavailable", "getToken failed", { cause: e });
      if (gen === this.#gen && !this.#closed) this.#afterFailure("retry", err);
      return;
    }
    if (gen !== this.#gen || this.#closed) return;
    const ws = new this.#WS(url);
    this.#ws = ws;
    this.#opened = false;
    this.#disconnect = void 0;
    ws.onopen = () => gen === this.#gen && this.#onOpen();
    ws.onmessage = (ev) => gen === this.#gen && this.#onFrame(ev.data);
    ws.onclose = (ev) => gen === this.#gen && void this.#onClose(ev.code, ev.reason, url);
    ws.onerror = () => {
    };
  }
  async #url() {
    const o = this.#opts;
    this.#freshToken = false;
    if (o.getToken && (this.#refresh || !this.#token || expiresSoon(this.#token, Date.now(), 5e3))) {
      this.#token = await o.getToken();
      this.#refresh = false;
      this.#freshToken = true;
    }
    const base = globalThis.location?.href;
    const u = new URL(o.url, base);
    u.protocol = u.protocol.replace(/^http/, "ws");
    if (u.pathname === "/" || u.pathname === "") u.pathname = "/ws";
    if (this.#token) u.searchParams.set("token", this.#token);
    else if (o.user) u.searchParams.set("user", o.user);
    if (o.device) u.searchParams.set("device", o.device);
    return u.toString();
  }
  #onOpen() {
    this.#opened = true;
    this.#lastRx = Date.now();
    this.#pingDeadline = 0;
    this.#tokens = this.#opts.framesPerSecond;
    this.#lastRefill = Date.now();
    const s = this.#state.value;
    this.#setState({ status: "connected", connects: s.connects + 1, error: void 0 });
    const period = Math.max(250, Math.min(this.#opts.pingIntervalMs, this.#opts.pongTimeoutMs) / 4);
    this.#tick = setInterval(() => this.#onTick(), period);
    for (const sub of this.#subs.values()) sub._subscribe();
    for (const job of this.#jobs) if (job.req === void 0 && !job.retryTimer) this.#sendJob(job);
  }
  async #onClose(code, reason, url) {
    const opened = this.#opened;
    const disconnect = this.#disconnect;
    this.#dropSocket();
    if (this.#closed) return;
    const closeCode = disconnect?.code ?? code;
    let err = new HeraldError(opened ? "connection_lost" : "network", reason || disconnect?.reason || "connection closed", {
      closeCode
    });
    let action;
    if (opened) {
      action = closeAction(code, disconnect);
    } else {
      const refusal = await this.#probe(url);
      if (this.#closed || this.#ws) return;
      action = refusal ? refusalAction(refusal.status, refusal.code) : "retry";
      if (refusal && action !== "retry") {
        err = new HeraldError(refusal.code ?? "unauthorized", refusal.detail ?? `upgrade refused: HTTP ${refusal.status}`, {
          status: refusal.status
        });
        if (action === "fatal" && refusal.status === 401 && this.#opts.getToken && !this.#freshToken) {
          action = "refresh_token";
        }
      }
    }
    if (action === "fatal" && opened) {
      err = new HeraldError("disconnected", `the server closed the connection: ${closeCode} ${reason || disconnect?.reason || ""}`.trim(), {
        closeCode
      });
    }
    this.#afterFailure(action, err);
  }
  #afterFailure(action, err) {
    if (action === "refresh_token" && !this.#opts.getToken) action = "fatal";
    if (action === "fatal") return this.#shutdown(err, err);
    const s = this.#state.value;
    let attempt = this.#healthy ? 0 : s.attempt;
    let delay;
    if (action === "resume" || action === "refresh_token") {
      if (action === "refresh_token") this.#refresh = true;
      attempt = 0;
      delay = backoffDelay(0, this.#backoff);
    } else {
      delay = backoffDelay(attempt, this.#backoff);
      if (action === "slow") delay += this.#opts.rateLimitedDelayMs;
    }
    this.#setState({ status: "disconnected", attempt: attempt + 1, retryAt: Date.now() + delay, error: err });
    this.#retryTimer = setTimeout(() => {
      this.#retryTimer = void 0;
      void this.#open();
    }, delay);
  }
  /** Forget the current socket: pending replies will not come, paced frames are not sent. */
  #dropSocket() {
    this.#gen++;
    const ws = this.#ws;
    this.#ws = void 0;
    if (ws) ws.onopen = ws.onmessage = ws.onclose = null;
    clearInterval(this.#tick);
    clearTimeout(this.#drainTimer);
    this.#drainTimer = void 0;
    this.#out = [];
    for (const p of this.#pending.values()) if ("job" in p) p.job.req = void 0;
    this.#pending.clear();
    for (const sub of this.#subs.values()) sub._onDisconnected();
  }
  /** Abandon a socket that stopped answering; reconnect. */
  #abandon() {
    const ws = this.#ws;
    if (!ws) return;
    this.#dropSocket();
    try {
      ws.close(1e3, "no answer to ping");
    } catch {
    }
    this.#afterFailure("retry", new HeraldError("timeout", "the connection stopped answering"));
  }
  #shutdown(err, stateError) {
    this.#closed = true;
    clearTimeout(this.#retryTimer);
    for (const off of this.#unlisten) off();
    this.#unlisten = [];
    for (const job of [...this.#jobs]) this.#settle(job, err);
    for (const sub of [...this.#subs.values()]) {
      if (stateError) sub._fail(err);
      else sub._close();
    }
    this.#setState({ status: "closed", retryAt: void 0, error: stateError });
  }
  /** The refusal of a failed upgrade: the same URL fetched over HTTP. */
  async #probe(url) {
    if (typeof fetch !== "function") return void 0;
    try {
      const res = await fetch(url.replace(/^ws/, "http"), { cache: "no-store" });
      const body = await res.json().catch(() => ({}));
      return { status: res.status, code: body.code, detail: body.detail };
    } catch {
      return void 0;
    }
  }
  // ---- frames ----
  #onFrame(data) {
    this.#lastRx = Date.now();
    this.#pingDeadline = 0;
    if (!this.#healthy) {
      this.#healthy = true;
      if (this.#state.value.attempt) this.#setState({ attempt: 0 });
    }
    let f;
    try {
      f = JSON.parse(String(data));
    } catch {
      return this.emit("error", new HeraldError("protocol", "a frame that is not JSON"));
    }
    const sub = typeof f.channel === "string" ? this.#subs.get(f.channel) : void 0;
    switch (f.type) {
      case "message":
      case "room":
        return sub?._onMessage(f);
      case "join":
      case "leave":
        return sub?._onPresence(f.type, f);
      case "unsubscribed":
        return sub?._onUnsubscribed(String(f.reason ?? ""));
      case "subscribed":
        return this.#onServerSubscribed(f, sub);
      case "disconnect":
        this.#disconnect = { code: Number(f.code), reason: String(f.reason ?? ""), reconnect: f.reconnect !== false };
        return;
      case "ok":
      case "error":
      case "pong":
        return this.#onReply(f);
    }
  }
  /** A `subscribed` frame: a subscription the server made (see `HeraldEvents`). */
  #onServerSubscribed(f, known) {
    const reply = { ...f, type: "ok" };
    if (known) {
      if (known.serverSide) known._onReply(reply);
      return;
    }
    const channel = String(f.channel ?? "");
    if (!this.listens("subscribed")) {
      this.#link.sendUnsubscribe(channel);
      return;
    }
    const since = typeof f.since === "number" ? { seq: f.since, epoch: f.epoch } : void 0;
    const sub = new Subscription(this.#link, channel, since ? { since } : {}, true);
    this.#subs.set(channel, sub);
    sub._subscribe();
    sub._onReply(reply);
    this.emit("subscribed", sub);
  }
  #onReply(f) {
    const p = typeof f.req === "number" ? this.#pending.get(f.req) : void 0;
    if (p) this.#pending.delete(f.req);
    if (p && "sub" in p) return p.sub._onReply(f);
    if (p && "job" in p) {
      const job = p.job;
      job.req = void 0;
      if (f.type === "ok") return this.#settle(job, void 0, f);
      const code = String(f.code ?? "internal");
      const err = new HeraldError(code, String(f.message ?? code), {
        channel: f.channel,
        idempotencyKey: job.key
      });
      if (!isTransient(code)) return this.#settle(job, err);
      job.retryTimer = setTimeout(() => {
        job.retryTimer = void 0;
        this.#sendJob(job);
      }, 250 + backoffDelay(job.tries++, this.#backoff));
      return;
    }
    if (!p && f.type === "error") {
      this.emit("error", new HeraldError(String(f.code ?? "internal"), String(f.message ?? ""), { channel: f.channel }));
    }
  }
  // ---- requests ----
  #enqueue(frame, timeoutMs, data, key) {
    if (this.#closed) return Promise.reject(new HeraldError("closed", "the client is closed"));
    return new Promise((resolve, reject) => {
      const job = {
        frame,
        data,
        publish: data !== void 0,
        key,
        tries: 0,
        resolve,
        reject,
        timer: setTimeout(() => {
          const what = job.req === void 0 ? "waiting for a connection" : "waiting for the answer";
          this.#settle(job, new HeraldError("timeout", `timed out ${what}`, { channel: frame.channel, idempotencyKey: key }));
        }, timeoutMs)
      };
      this.#jobs.push(job);
      this.#sendJob(job);
    });
  }
  #sendJob(job) {
    if (!this.connected || !this.#jobs.includes(job)) return;
    let body = JSON.stringify(job.frame);
    if (job.data !== void 0) body = body.slice(0, -1) + `,"data":${job.data}}`;
    job.req = this.#sendText(body, { job });
  }
  #settle(job, err, reply) {
    const i = this.#jobs.indexOf(job);
    if (i < 0) return;
    this.#jobs.splice(i, 1);
    clearTimeout(job.timer);
    clearTimeout(job.retryTimer);
    if (job.req !== void 0) this.#pending.set(job.req, { ignore: true });
    if (err) job.reject(err);
    else job.resolve(reply);
  }
  // ---- sending ----
  /** Send a request frame (paced), with a fresh `req`. */
  #send(frame, pending) {
    return this.#sendText(JSON.stringify(frame), pending);
  }
  /** `body` is a frame's JSON object text; a fresh `req` is put first. */
  #sendText(body, pending) {
    if (!this.#ws || !this.#opened) return void 0;
    const req = this.#nextReq++;
    this.#pending.set(req, pending);
    this.#out.push(`{"req":${req},${body.slice(1)}`);
    this.#drain();
    return req;
  }
  #drain() {
    const now = Date.now();
    const rate = this.#opts.framesPerSecond;
    this.#tokens = Math.min(rate, this.#tokens + (now - this.#lastRefill) * rate / 1e3);
    this.#lastRefill = now;
    while (this.#out.length && this.#tokens >= 1) {
      this.#tokens -= 1;
      this.#sendNow(this.#out.shift());
    }
    if (this.#out.length && !this.#drainTimer) {
      this.#drainTimer = setTimeout(() => {
        this.#drainTimer = void 0;
        this.#drain();
      }, Math.ceil(1e3 / rate));
    }
  }
  #sendNow(text) {
    if (this.#ws?.readyState === OPEN) this.#ws.send(text);
  }
  // ---- liveness ----
  #onTick() {
    const now = Date.now();
    if (this.#pingDeadline && now > this.#pingDeadline) return this.#abandon();
    if (!this.#pingDeadline && now - this.#lastRx >= this.#opts.pingIntervalMs) this.#ping(this.#opts.pongTimeoutMs);
  }
  /** An application ping: any frame before the deadline proves the connection alive. */
  #ping(timeoutMs) {
    if (!this.connected) return;
    const deadline = Date.now() + timeoutMs;
    if (!this.#pingDeadline || deadline < this.#pingDeadline) this.#pingDeadline = deadline;
    this.#send({ type: "ping" }, { ping: true });
  }
  /** The page came back, or the network did: check the connection now, or reconnect now. */
  #check() {
    if (this.#closed) return;
    if (this.connected) this.#ping(Math.min(this.#opts.pongTimeoutMs, 5e3));
    else if (this.#retryTimer) this.connect();
  }
  #listenToPage() {
    const g = globalThis;
    const on = (target, type, fn) => {
      if (!target?.addEventListener) return;
      target.addEventListener(type, fn);
      this.#unlisten.push(() => target.removeEventListener?.(type, fn));
    };
    on(g.document, "visibilitychange", () => g.document?.visibilityState === "visible" && this.#check());
    on(g, "online", () => {
      this.#setState({ online: true });
      this.#check();
    });
    on(g, "offline", () => {
      this.#setState({ online: false });
      this.#check();
    });
  }
  #setState(patch) {
    this.#state.set({ ...this.#state.value, ...patch });
  }
};

// src/server.ts
var HeraldServer = class {
  #url;
  #opts;
  #backoff;
  constructor(opts) {
    this.#url = opts.url.replace(/\/+$/, "");
    this.#opts = opts;
    this.#backoff = { baseMs: 200, maxMs: 5e3, ...opts.backoff };
  }
  /** Publish one message. Retried under one idempotency key (generated when not given). */
  async publish(channel, data, opts = {}) {
    const key = opts.idempotencyKey ?? randomId("api-");
    const body = opts.meta ? { data, meta: opts.meta } : { data };
    const { json, replayed } = await this.#call({ method: "POST", path: `/api/v1/channels/${enc(channel)}/messages`, body, retry: true, key });
    return { ...json, replayed, idempotencyKey: key };
  }
  /** One message to several channels, exactly once as a whole under one key. */
  async publishMany(channels, data, opts = {}) {
    const key = opts.idempotencyKey ?? randomId("api-");
    const body = opts.meta ? { channels, data, meta: opts.meta } : { channels, data };
    const { json, replayed } = await this.#call({ method: "POST", path: "/api/v1/publish", body, retry: true, key });
    return { results: json.results, replayed, idempotencyKey: key };
  }
  /**
   * Many messages in one request (`POST /api/v1/messages`): one result per
   * message, in order; one bad message fails alone. Every message carries
   * an idempotency key (generated when not given), so the request is
   * retried whole after a network error or a 5xx and each message still
   * has exactly one effect. A result with a retryable `error.code`
   * (`unavailable`, `shutting_down`, `internal`, `idempotency_key_in_flight`)
   * may be sent again under its `idempotencyKey`.
   */
  async publishMessages(messages) {
    const keys = messages.map((m) => m.idempotencyKey ?? randomId("api-"));
    const body = {
      messages: messages.map((m, i) => {
        const out = { data: m.data, idempotency_key: keys[i] };
        if (m.channel !== void 0) out.channel = m.channel;
        if (m.channels !== void 0) out.channels = m.channels;
        if (m.meta) out.meta = m.meta;
        if (m.deliverAt !== void 0) out.deliver_at = m.deliverAt instanceof Date ? m.deliverAt.getTime() : m.deliverAt;
        if (m.delayMs !== void 0) out.delay_ms = m.delayMs;
        return out;
      })
    };
    const { json } = await this.#call({ method: "POST", path: "/api/v1/messages", body, retry: true });
    const results = json.results;
    return results.map((r, i) => {
      const out = { ...r, idempotencyKey: keys[i] };
      if ("results" in r) {
        out.replayed = r.results.every((c) => c.replayed === true);
      } else if (!("error" in r)) {
        out.replayed = r.replayed === true;
      }
      return out;
    });
  }
  /**
   * Schedule one message: stored now, appended exactly once at `deliverAt`
   * (ms since the Unix epoch, or a Date) or after `delayMs`. Retried under
   * one idempotency key (generated when not given): a retry schedules once.
   */
  async schedule(channel, data, opts) {
    if (opts.deliverAt === void 0 === (opts.delayMs === void 0)) {
      throw new HeraldError("bad_request", "give deliverAt or delayMs, not both");
    }
    const key = opts.idempotencyKey ?? randomId("api-");
    const body = { data };
    if (opts.meta) body.meta = opts.meta;
    if (opts.deliverAt !== void 0) body.deliver_at = opts.deliverAt instanceof Date ? opts.deliverAt.getTime() : opts.deliverAt;
    if (opts.delayMs !== void 0) body.delay_ms = opts.delayMs;
    const { json, replayed } = await this.#call({ method: "POST", path: `/api/v1/channels/${enc(channel)}/messages`, body, retry: true, key });
    return { ...json, replayed, idempotencyKey: key };
  }
  /** Pending schedules of a channel, in delivery order (at most `limit`, default 100). */
  async scheduled(channel, opts = {}) {
    const limit = opts.limit === void 0 ? "" : `&limit=${opts.limit}`;
    const json = await this.#get(`/api/v1/scheduled?channel=${enc(channel)}${limit}`);
    return json.scheduled;
  }
  /** Cancel a pending schedule; `null` when there is none with this id (never made, delivered or cancelled). */
  async cancelScheduled(id) {
    try {
      return (await this.#call({ method: "DELETE", path: `/api/v1/scheduled/${enc(id)}`, retry: false })).json;
    } catch (e) {
      if (e instanceof HeraldError && e.status === 404) return null;
      throw e;
    }
  }
  /** Messages after `after` (default 0), at most `limit` (default 100). */
  async history(channel, opts = {}) {
    return this.#get(`/api/v1/channels/${enc(channel)}/messages${query({ after: opts.after, limit: opts.limit })}`);
  }
  /** Delivery receipts of an acked channel: every subscriber's cursor. */
  async cursors(channel, opts = {}) {
    return this.#get(`/api/v1/channels/${enc(channel)}/cursors${query(opts)}`);
  }
  /** A user's acked channels with each device's cursor and unread count. */
  async inbox(user, opts = {}) {
    return this.#get(`/api/v1/users/${enc(user)}/inbox${query(opts)}`);
  }
  /** Members of a presence channel (`count: true`: only the count). */
  async presence(channel, opts = {}) {
    const q = query({ count: opts.count ? 1 : void 0, limit: opts.limit });
    return this.#get(`/api/v1/channels/${enc(channel)}/presence${q}`);
  }
  async createRoom(room, opts) {
    const body = { host: opts.host };
    if (opts.attributes) body.attributes = opts.attributes;
    if (opts.gracePeriodSec !== void 0) body.grace_period = opts.gracePeriodSec;
    return (await this.#call({ method: "PUT", path: `/api/v1/rooms/${enc(room)}`, body, retry: false })).json;
  }
  async room(room) {
    return this.#get(`/api/v1/rooms/${enc(room)}`);
  }
  /** Change the state and/or replace the attributes; with `ifMatch` only from that version (else 412). */
  async updateRoom(room, change, opts = {}) {
    const headers = opts.ifMatch === void 0 ? void 0 : { "if-match": `"${opts.ifMatch}"` };
    return (await this.#call({ method: "PATCH", path: `/api/v1/rooms/${enc(room)}`, body: change, headers, retry: false })).json;
  }
  /** Close the room for good. */
  async closeRoom(room, opts = {}) {
    const headers = opts.ifMatch === void 0 ? void 0 : { "if-match": `"${opts.ifMatch}"` };
    return (await this.#call({ method: "DELETE", path: `/api/v1/rooms/${enc(room)}`, headers, retry: false })).json;
  }
  /** A user's open connections on every node. */
  async connections(user) {
    return (await this.#get(`/api/v1/users/${enc(user)}/connections`)).connections;
  }
  /**
   * Close a user's connections (all, one `device`'s, or one `connection`).
   * `reconnect: false` closes with a code clients do not reconnect after;
   * `banSeconds` also refuses the user (or the device) until then.
   * Idempotent, so retried like a read.
   */
  async disconnect(user, opts) {
    const body = { reconnect: opts.reconnect };
    if (opts.device !== void 0) body.device = opts.device;
    if (opts.connection !== void 0) body.connection = opts.connection;
    if (opts.reason !== void 0) body.reason = opts.reason;
    if (opts.banSeconds !== void 0) body.ban_seconds = opts.banSeconds;
    return (await this.#call({ method: "POST", path: `/api/v1/users/${enc(user)}/disconnect`, body, retry: true })).json;
  }
  /** Refuse the user's tokens issued before `issuedBefore` (default now) and close their connections as expired. */
  async revoke(user, issuedBefore = Date.now()) {
    const body = { issued_before_ms: issuedBefore instanceof Date ? issuedBefore.getTime() : issuedBefore };
    return (await this.#call({ method: "POST", path: `/api/v1/users/${enc(user)}/revoke`, body, retry: true })).json;
  }
  /** Subscribe every open connection of the user (or of `device`) to `channel`, from after `since` or live. */
  async subscribeUser(user, channel, opts = {}) {
    const body = { channel };
    if (opts.device !== void 0) body.device = opts.device;
    if (opts.since !== void 0) body.since = opts.since;
    return (await this.#call({ method: "POST", path: `/api/v1/users/${enc(user)}/subscriptions`, body, retry: true })).json;
  }
  /** Unsubscribe the user's connections from `channel`. */
  async unsubscribeUser(user, channel) {
    return (await this.#call({ method: "DELETE", path: `/api/v1/users/${enc(user)}/subscriptions/${enc(channel)}`, retry: true })).json;
  }
  /** Remove a member from a room: unsubscribed, lease ended, rejoin refused. */
  async removeMember(room, user) {
    return (await this.#call({ method: "DELETE", path: `/api/v1/rooms/${enc(room)}/members/${enc(user)}`, retry: true })).json;
  }
  /** One page of the channels with a subscriber on some node (`pattern`: `*` matches any run of characters). */
  async channels(opts = {}) {
    const parts = [];
    if (opts.pattern !== void 0) parts.push(`pattern=${enc(opts.pattern)}`);
    if (opts.limit !== void 0) parts.push(`limit=${opts.limit}`);
    if (opts.after !== void 0) parts.push(`after=${enc(opts.after)}`);
    const q = parts.length ? `?${parts.join("&")}` : "";
    return this.#get(`/api/v1/channels${q}`);
  }
  /** Every node of the deployment. */
  async nodes() {
    return (await this.#get("/api/v1/nodes")).nodes;
  }
  async #get(path) {
    return (await this.#call({ method: "GET", path, retry: true })).json;
  }
  async #call(c) {
    const f = this.#opts.fetch ?? fetch;
    const retries = c.retry ? this.#opts.retries ?? 4 : 0;
    const headers = { ...c.headers };
    if (this.#opts.apiKey) headers.authorization = `Bearer ${this.#opts.apiKey}`;
    if (c.body !== void 0) headers["content-type"] = "application/json";
    if (c.key) headers["idempotency-key"] = c.key;
    const body = c.body === void 0 ? void 0 : JSON.stringify(c.body);
    for (let attempt = 0; ; attempt++) {
      let err;
      let retryAfterMs = 0;
      try {
        const res = await f(this.#url + c.path, {
          method: c.method,
          headers,
          body,
          signal: AbortSignal.timeout(this.#opts.timeoutMs ?? 1e4)
        });
        const text = await res.text();
        const json = text ? JSON.parse(text) : void 0;
        if (res.ok) return { json, replayed: res.headers.get("idempotent-replayed") === "true" };
        const p = json ?? {};
        err = new HeraldError(p.code ?? `http_${res.status}`, p.detail ?? p.title ?? `HTTP ${res.status}`, {
          status: res.status,
          problem: json,
          idempotencyKey: c.key
        });
        retryAfterMs = Number(res.headers.get("retry-after") ?? 0) * 1e3;
        const again = res.status >= 500 || res.status === 429 || p.code === "idempotency_key_in_flight";
        if (!again) throw err;
      } catch (e) {
        if (e instanceof HeraldError && !e.retryable) throw e;
        err = e instanceof HeraldError ? e : new HeraldError("network", `${c.method} ${c.path} failed: ${String(e)}`, { cause: e, idempotencyKey: c.key });
      }
      if (attempt >= retries) throw err;
      const wait = Math.min(3e4, Math.max(retryAfterMs, backoffDelay(attempt, this.#backoff)));
      await new Promise((r) => setTimeout(r, wait));
    }
  }
};
function enc(s) {
  return encodeURIComponent(s);
}
function query(q) {
  const parts = Object.entries(q).filter(([, v]) => v !== void 0).map(([k, v]) => `${k}=${v}`);
  return parts.length ? `?${parts.join("&")}` : "";
}
export {
  CloseCode,
  Herald,
  HeraldError,
  HeraldServer,
  Subscription,
  closeAction
};
