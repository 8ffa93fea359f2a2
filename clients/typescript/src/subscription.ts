/**
 * One wanted subscription: its cursor, its delivery queue, its handler or
 * iterator, its acks. It outlives connections: the client resubscribes it
 * on every new connection from its cursor.
 *
 * Delivery is sequential: the next message goes to the handler (or the
 * iterator) only after the previous one was handled, so a cumulative ack
 * of the last handled seq never acks a message still in the works. A
 * handler that throws holds the subscription: its message and everything
 * after it come again from the server after a delay (a resubscribe from
 * the last handled seq), flagged `redelivered`.
 */

import { backoffDelay } from './backoff.js';
import { Cursor, type Since, type SubscribeReply } from './cursor.js';
import { HeraldError, isTransient } from './errors.js';
import { Emitter } from './observable.js';
import type { GapEvent, Json, Member, Message, Presence, ResetEvent, RoomEvent, SubscribeInfo } from './types.js';

export interface SubscribeOptions<T = unknown> {
  /** Resume after this position (e.g. one saved from `sub.position` before a page reload). */
  since?: Since;
  /**
   * Called for each message, in seq order, one at a time. The next one
   * waits until the returned promise settles; on acked channels the
   * message is acked after it resolves. Throwing holds the subscription
   * and has the message delivered again later. Without it, read the
   * subscription with `for await`.
   */
  onMessage?: (msg: Message<T>) => void | Promise<void>;
  /** Acked channels: `auto` (default) acks after the handler resolves; `manual`: call `msg.ack()`. */
  ack?: 'auto' | 'manual';
  /** Send a (cumulative) ack once this many handled messages are unacked. Default 50. */
  ackEvery?: number;
  /** ... or at the latest this long after the first unacked one was handled, ms. Default 200. */
  ackWithinMs?: number;
  /** Presence channels: this member's `info` (JSON, at most 1 KiB). */
  info?: Json;
  /**
   * Most messages queued for a slow handler. Above it the subscription
   * stops taking messages and resubscribes from where it stopped once the
   * queue is half empty (durable channels lose nothing; volatile messages
   * beyond it are dropped). Default 1,000.
   */
  maxQueued?: number;
}

export interface SubscriptionEvents {
  /** Every `ok` reply: the first subscribe and each resume. */
  subscribed: SubscribeInfo;
  truncated: ResetEvent;
  epoch_changed: ResetEvent;
  gap: GapEvent;
  join: Member;
  leave: Member;
  room: RoomEvent;
  /** The server ended the subscription (e.g. `room_closed`); it is not resumed. */
  unsubscribed: { channel: string; reason: string };
  /** A handler failure (the message comes again), a refused resubscribe, or the end of the client. */
  error: HeraldError;
}

/** What a subscription needs from its client. */
export interface Link {
  readonly connected: boolean;
  readonly clientId: string;
  sendSubscribe(sub: AnySubscription, frame: Record<string, unknown>): void;
  sendUnsubscribe(channel: string): void;
  sendAck(channel: string, seq: number): void;
  request(frame: Record<string, unknown>): Promise<Record<string, unknown>>;
  forget(sub: AnySubscription): void;
}

type Item =
  | { kind: 'message'; msg: Message<unknown> }
  | { kind: 'room'; ev: RoomEvent }
  | { kind: 'reset'; type: 'truncated' | 'epoch_changed'; ev: ResetEvent }
  | { kind: 'gap'; ev: GapEvent }
  | { kind: 'end'; reason: string };

const HOLD_BASE = { baseMs: 1000, maxMs: 30_000 };

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type AnySubscription = Subscription<any>;

export type SubscriptionStatus = 'subscribing' | 'active' | 'ended';

export class Subscription<T = unknown> extends Emitter<SubscriptionEvents> implements AsyncIterable<Message<T>> {
  readonly channel: string;
  /** Resolves with the first `ok` reply; rejects if the server refuses the subscription. */
  readonly ready: Promise<SubscribeInfo>;
  /** The latest `ok` reply. */
  info: SubscribeInfo | undefined;
  status: SubscriptionStatus = 'subscribing';
  /** Why the subscription failed, if it did. */
  error: HeraldError | undefined;

  #link: Link;
  #opts: SubscribeOptions<T>;
  #cursor: Cursor;
  #queue: Item[] = [];
  /** The `ok` reply of the current subscribe arrived; messages before it are leftovers. */
  #confirmed = false;
  /** A subscribe is on the wire (not yet answered) on this connection. */
  #sent = false;
  /** Dropping everything until the resubscribe: after a handler failure or a full queue. */
  #held = false;
  #holdTimer: ReturnType<typeof setTimeout> | undefined;
  #failures = 0;
  #pumping = false;
  /** The seq being handled now (the handler has it, or the iterator consumer). */
  #inProgress: number | undefined;
  /** Highest seq ever handed to the application (for the `redelivered` flag). */
  #maxHanded = 0;
  #ackedSent = 0;
  #ackTimer: ReturnType<typeof setTimeout> | undefined;
  #resolveReady!: (info: SubscribeInfo) => void;
  #rejectReady!: (e: HeraldError) => void;
  // Iterator hand-off: one message waiting for the consumer, one consumer waiting for a message.
  #offer: { msg: Message<T>; done: (ok: boolean) => void } | undefined;
  #waiter: ((r: IteratorResult<Message<T>>) => void) | undefined;
  #waiterFail: ((e: unknown) => void) | undefined;
  #current: { done: (ok: boolean) => void } | undefined;
  #iterating = false;

  /**
   * Made by the server (the personal channel; `Herald`'s `subscribed`
   * event), not by `subscribe()`: the server makes it again on every
   * connection, so the client never sends its subscribe.
   */
  readonly serverSide: boolean;

  constructor(link: Link, channel: string, opts: SubscribeOptions<T>, serverSide = false) {
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
    // Awaiting `ready` is optional: its rejection is also an `error` event.
    this.ready.catch(() => {});
  }

  /** Where to resume this subscription later: the last handled seq and its epoch. */
  get position(): Since | undefined {
    const seq = this.#cursor.handled;
    if (seq === undefined) return undefined;
    return this.#cursor.epoch === undefined ? { seq } : { seq, epoch: this.#cursor.epoch };
  }

  /** Members of this presence channel, from the server. */
  async presence(): Promise<Presence> {
    const r = await this.#link.request({ type: 'presence', channel: this.channel });
    return { count: Number(r.count ?? 0), members: (r.members as Member[] | undefined) ?? [] };
  }

  /**
   * Acknowledge `seq` and everything before it (acked channels; for
   * `ack: 'manual'`). Sent batched, like automatic acks.
   */
  ack(seq: number): void {
    if (!this.#cursor.acked || seq > (this.#cursor.received ?? 0)) return;
    this.#cursor.onHandled(seq);
    this.#scheduleAck();
  }

  /** Send pending acks now. */
  flushAcks(): void {
    clearTimeout(this.#ackTimer);
    this.#ackTimer = undefined;
    const handled = this.#cursor.handled ?? 0;
    if (this.#cursor.acked && this.#confirmed && this.#link.connected && handled > this.#ackedSent) {
      this.#link.sendAck(this.channel, handled);
      this.#ackedSent = handled;
    }
  }

  /** Stop: acks what was handled, leaves presence, ends iteration. */
  unsubscribe(): void {
    if (this.status === 'ended') return;
    this.flushAcks();
    if (this.#confirmed || this.#sent) this.#link.sendUnsubscribe(this.channel);
    this.#end();
  }

  /**
   * Set the message handler (as `SubscribeOptions.onMessage`) after the
   * fact: for a subscription the server made (`Herald`'s `subscribed`
   * event). One consumer per subscription: a handler or an iterator.
   */
  handle(onMessage: (msg: Message<T>) => void | Promise<void>): void {
    if (this.#opts.onMessage || this.#iterating) {
      throw new TypeError('a subscription has one consumer: an onMessage handler or one iterator');
    }
    this.#opts = { ...this.#opts, onMessage };
    void this.#pump();
  }

  [Symbol.asyncIterator](): AsyncIterator<Message<T>> {
    if (this.#opts.onMessage || this.#iterating) {
      throw new TypeError('a subscription has one consumer: an onMessage handler or one iterator');
    }
    this.#iterating = true;
    return {
      next: () => {
        // Asking for the next message means the previous one was handled.
        this.#current?.done(true);
        this.#current = undefined;
        return new Promise((resolve, reject) => {
          this.#waiter = resolve;
          this.#waiterFail = reject;
          this.#serveIterator();
        });
      },
      return: async () => {
        // `break` or a throw in the loop body: the current message is not
        // handled; the subscription ends with the loop.
        this.#current?.done(false);
        this.#current = undefined;
        this.unsubscribe();
        return { value: undefined, done: true };
      },
    };
  }

  // ---- called by the client ----

  /** A connection is up (or a hold is over): subscribe from the cursor. */
  _subscribe(): void {
    if (this.status === 'ended' || this.#holdTimer !== undefined || !this.#link.connected) return;
    this.#confirmed = false;
    this.#held = false;
    if (this.#cursor.acked) this.#queue = this.#queue.filter((i) => i.kind !== 'message');
    this.#cursor.onResubscribe(this.#inProgress);
    // The server's `subscribed` frame is its reply (`_onReply`).
    if (this.serverSide) return;
    const frame: Record<string, unknown> = { type: 'subscribe', channel: this.channel, client_id: this.#link.clientId };
    const since = this.#cursor.since();
    if (since) frame.since = since;
    if (this.#opts.info !== undefined) frame.info = this.#opts.info;
    this.#sent = true;
    this.#link.sendSubscribe(this, frame);
  }

  _onDisconnected(): void {
    this.#confirmed = false;
    this.#sent = false;
    clearTimeout(this.#ackTimer);
    this.#ackTimer = undefined;
  }

  /** The reply to our subscribe. */
  _onReply(frame: Record<string, unknown>): void {
    this.#sent = false;
    if (this.status === 'ended') return;
    if (frame.type !== 'ok') {
      const err = new HeraldError(String(frame.code ?? 'internal'), String(frame.message ?? 'subscribe refused'), {
        channel: this.channel,
      });
      if (this.status === 'subscribing' && !this.info) return this._fail(err);
      if (isTransient(err.code)) return this.#hold(err);
      return this._fail(err);
    }
    const r = frame as SubscribeReply & { client_id?: string };
    const reset = this.#cursor.onSubscribed(r);
    if (reset.epochChanged) {
      this.#queue = this.#queue.filter((i) => i.kind !== 'message');
      this.#maxHanded = 0;
    }
    this.#confirmed = true;
    this.#failures = 0;
    if (r.cursor !== undefined) this.#ackedSent = r.cursor;
    const info: SubscribeInfo = {
      channel: this.channel,
      epoch: r.epoch,
      first: r.first,
      head: r.head,
      truncated: reset.truncated,
      epochChanged: reset.epochChanged,
      cursor: r.cursor,
      unread: r.unread,
      clientId: r.client_id,
    };
    this.info = info;
    if (this.status === 'subscribing') {
      this.status = 'active';
      this.#resolveReady(info);
    }
    this.emit('subscribed', info);
    if (r.epoch !== undefined && (reset.truncated || reset.epochChanged)) {
      const ev = { channel: this.channel, epoch: r.epoch, first: r.first ?? 1, head: r.head ?? 0 };
      if (reset.truncated) this.#queue.push({ kind: 'reset', type: 'truncated', ev });
      if (reset.epochChanged) this.#queue.push({ kind: 'reset', type: 'epoch_changed', ev });
    }
    // Acks that waited when the connection was lost go out now.
    this.flushAcks();
    void this.#pump();
  }

  /** A `message` or `room` frame for this channel. */
  _onMessage(frame: Record<string, unknown>): void {
    const seq = typeof frame.seq === 'number' ? frame.seq : undefined;
    if (this.status === 'ended' || this.#held) return;
    if (seq !== undefined && !this.#confirmed) return;
    const verdict = this.#cursor.onMessage(seq);
    if (verdict.kind === 'duplicate') {
      // A redelivery of something handled: our ack did not reach the
      // server yet (or was lost with a connection); send it.
      if (frame.redelivered && seq !== undefined && seq <= (this.#cursor.handled ?? 0)) this.#scheduleAck();
      return;
    }
    if (verdict.kind === 'gap') {
      this.#queue.push({ kind: 'gap', ev: { channel: this.channel, expected: verdict.expected, got: seq! } });
    }
    if (frame.type === 'room') {
      const d = (frame.data ?? {}) as Omit<RoomEvent, 'channel' | 'seq' | 'id' | 'ts'>;
      this.#queue.push({ kind: 'room', ev: { ...d, channel: this.channel, seq: seq!, id: String(frame.id), ts: Number(frame.ts) } });
    } else {
      const msg: Message<unknown> = {
        channel: this.channel,
        id: String(frame.id ?? ''),
        ts: Number(frame.ts ?? 0),
        data: frame.data,
        redelivered: !!frame.redelivered || (seq !== undefined && seq <= this.#maxHanded),
        ack: () => seq !== undefined && this.ack(seq),
      };
      if (seq !== undefined) msg.seq = seq;
      if (frame.meta) msg.meta = frame.meta as Message['meta'];
      if (typeof frame.attempt === 'number') msg.attempt = frame.attempt;
      this.#queue.push({ kind: 'message', msg });
    }
    if (this.#queue.length > (this.#opts.maxQueued ?? 1000)) {
      if (seq === undefined) {
        this.#queue.pop(); // volatile: best effort
      } else {
        // Stop taking messages; resubscribe from what is queued once the
        // handler has caught up (see #pump).
        this.#held = true;
      }
    }
    void this.#pump();
  }

  _onPresence(type: 'join' | 'leave', frame: Record<string, unknown>): void {
    if (this.status !== 'ended') this.emit(type, frame.member as Member);
  }

  _onUnsubscribed(reason: string): void {
    if (this.status === 'ended') return;
    this.#queue.push({ kind: 'end', reason });
    this.#link.forget(this);
    void this.#pump();
  }

  /** Fail for good: the subscription is not resumed. */
  _fail(err: HeraldError): void {
    if (this.status === 'ended') return;
    this.error = err;
    this.#rejectReady(err);
    this.emit('error', err);
    this.#end();
  }

  /** The client closed: end quietly (iterators finish). */
  _close(): void {
    this.#end();
  }

  // ---- internals ----

  #end(): void {
    if (this.status === 'ended') return;
    this.status = 'ended';
    this.#queue = [];
    clearTimeout(this.#holdTimer);
    clearTimeout(this.#ackTimer);
    this.#rejectReady(this.error ?? new HeraldError('closed', 'unsubscribed', { channel: this.channel }));
    this.#link.forget(this);
    this.#offer?.done(false);
    this.#offer = undefined;
    this.#serveIterator();
  }

  /** An `error` event; with nobody listening, a console warning (a failure is never silent). */
  #report(err: HeraldError): void {
    if (this.listens('error')) this.emit('error', err);
    else console.warn(`herald: ${err.message}`, err.cause ?? err);
  }

  /** Stop taking messages and subscribe again after a delay. */
  #hold(err: HeraldError): void {
    this.#held = true;
    this.#cursor.onFailed();
    this.#queue = this.#queue.filter((i) => i.kind !== 'message');
    this.#report(err);
    const delay = HOLD_BASE.baseMs + backoffDelay(this.#failures++, HOLD_BASE);
    clearTimeout(this.#holdTimer);
    this.#holdTimer = setTimeout(() => {
      this.#holdTimer = undefined;
      this.#resubscribe();
    }, delay);
  }

  #resubscribe(): void {
    if (this.status === 'ended') return;
    if (this.#link.connected && (this.#confirmed || this.#sent)) {
      this.flushAcks();
      this.#link.sendUnsubscribe(this.channel);
    }
    this._subscribe();
  }

  #scheduleAck(): void {
    if (!this.#cursor.acked) return;
    const unacked = (this.#cursor.handled ?? 0) - this.#ackedSent;
    if (unacked <= 0) return;
    if (unacked >= (this.#opts.ackEvery ?? 50)) return this.flushAcks();
    this.#ackTimer ??= setTimeout(() => this.flushAcks(), this.#opts.ackWithinMs ?? 200);
  }

  async #pump(): Promise<void> {
    if (this.#pumping) return;
    this.#pumping = true;
    try {
      let item: Item | undefined;
      while (this.status !== 'ended' && (item = this.#queue.shift())) {
        await this.#dispatch(item);
        if (this.#held && this.#holdTimer === undefined && this.#queue.length <= (this.#opts.maxQueued ?? 1000) / 2) {
          // A full queue drained: take messages again from where we stopped.
          this.#resubscribe();
        }
      }
    } finally {
      this.#pumping = false;
    }
  }

  async #dispatch(item: Item): Promise<void> {
    switch (item.kind) {
      case 'gap':
        return this.emit('gap', item.ev);
      case 'reset':
        return this.emit(item.type, item.ev);
      case 'room':
        this.emit('room', item.ev);
        return this.#cursor.onHandled(item.ev.seq);
      case 'end':
        this.emit('unsubscribed', { channel: this.channel, reason: item.reason });
        return this.#end();
      case 'message':
        return this.#handle(item.msg as Message<T>);
    }
  }

  async #handle(msg: Message<T>): Promise<void> {
    const seq = msg.seq;
    if (seq !== undefined) {
      this.#inProgress = seq;
      this.#maxHanded = Math.max(this.#maxHanded, seq);
    }
    let ok: boolean;
    let failure: unknown;
    try {
      if (this.#opts.onMessage) {
        await this.#opts.onMessage(msg);
        ok = true;
      } else {
        ok = await new Promise<boolean>((done) => {
          this.#offer = { msg, done };
          this.#serveIterator();
        });
      }
    } catch (e) {
      ok = false;
      failure = e;
    }
    this.#inProgress = undefined;
    if (this.status === 'ended') return;
    if (seq === undefined) {
      // Volatile: nothing to come again; say so and go on.
      if (failure !== undefined) this.#report(new HeraldError('handler_failed', `the handler failed on ${this.channel}`, { channel: this.channel, cause: failure }));
      return;
    }
    if (ok) {
      if (!this.#cursor.acked || this.#opts.ack !== 'manual') {
        this.#cursor.onHandled(seq);
        this.#scheduleAck();
      }
    } else if (failure !== undefined) {
      const err = new HeraldError('handler_failed', `the handler failed on ${this.channel} seq ${seq}`, {
        channel: this.channel,
        cause: failure,
      });
      this.#hold(err);
    }
  }

  #serveIterator(): void {
    const waiter = this.#waiter;
    if (!waiter) return;
    if (this.#offer) {
      this.#current = this.#offer;
      const { msg } = this.#offer;
      this.#offer = undefined;
      this.#waiter = this.#waiterFail = undefined;
      waiter({ value: msg, done: false });
    } else if (this.status === 'ended') {
      const fail = this.#waiterFail!;
      this.#waiter = this.#waiterFail = undefined;
      if (this.error) fail(this.error);
      else waiter({ value: undefined, done: true });
    }
  }
}
