/**
 * {@link HeraldServer}: the HTTP API for backends (Node 20+, or anything
 * with `fetch`): publish with retries under one idempotency key, history,
 * delivery cursors, inboxes, presence and rooms; and the backend's
 * actions on users (connections, disconnect and ban, revoke, server-side
 * subscribe and unsubscribe, member removal) and the channel and node lists.
 *
 * Retries: a publish is retried after a network error, a 5xx, a 429 or
 * `409 idempotency_key_in_flight`, always under the same key, so however
 * many attempts it takes it has exactly one effect (docs/guarantees.md).
 * Reads are retried the same way. Room writes are not retried (their
 * compare-and-set tells a retry from a conflict only with `ifMatch`).
 */

import { backoffDelay, type BackoffOptions } from './backoff.js';
import { HeraldError } from './errors.js';
import { randomId } from './ids.js';
import type { Json, Member, Meta, RoomState } from './types.js';

export interface HeraldServerOptions {
  /** `http(s)://host:port` of a Herald node. */
  url: string;
  /** An API key (`Authorization: Bearer`); not needed against a `--dev` server. */
  apiKey?: string;
  /** Attempts after the first, for publishes and reads. Default 4. */
  retries?: number;
  /** Waits between attempts (full jitter); `Retry-After` is honoured. Default 200 ms doubling to 5 s. */
  backoff?: BackoffOptions;
  /** Per attempt, ms. Default 10,000. */
  timeoutMs?: number;
  /** A `fetch` implementation; default the global one. */
  fetch?: typeof fetch;
}

export interface ApiPublishResult {
  channel: string;
  /** Absent on volatile channels. */
  seq?: number;
  id: string;
  epoch: string;
  /** The server answered from the idempotency receipt: an earlier attempt had stored it. */
  replayed: boolean;
  idempotencyKey: string;
}

/** A publish accepted for later delivery (`202`). */
export interface ScheduledResult {
  scheduled_id: string;
  channel: string;
  /** When it is appended, ms since the Unix epoch. */
  deliver_at: number;
  /** The server answered from the schedule's idempotency receipt: an earlier attempt had stored it. */
  replayed: boolean;
  idempotencyKey: string;
}

/**
 * One message of {@link HeraldServer.publishMessages}: the single publish's
 * arguments in one object, with `channel`; or {@link HeraldServer.publishBatch}'s,
 * with `channels` (the same message to each, one key for all).
 */
export interface BatchMessage {
  channel?: string;
  channels?: string[];
  data: Json | unknown;
  meta?: Meta;
  /** Generated when not given, so a retry of the whole request appends this message once. */
  idempotencyKey?: string;
  /** Scheduled delivery: ms since the Unix epoch, or a Date (or `delayMs`). */
  deliverAt?: number | Date;
  delayMs?: number;
}

/** What became of a message on one channel: appended, scheduled or refused. */
export type ChannelResult =
  | { channel: string; seq?: number; id: string; epoch: string; replayed?: boolean }
  | { scheduled_id: string; channel: string; deliver_at: number; replayed?: boolean }
  | { channel: string; error: { code: string; detail: string } };

/**
 * What became of one message of {@link HeraldServer.publishMessages}: appended
 * (`seq` absent on volatile channels), scheduled, or refused on its own
 * (`error`, with the code the single publish would answer); a message with
 * `channels` has one {@link ChannelResult} per channel in `results`.
 */
export type BatchResult =
  | { channel: string; seq?: number; id: string; epoch: string; replayed: boolean; idempotencyKey: string }
  | { scheduled_id: string; channel: string; deliver_at: number; replayed: boolean; idempotencyKey: string }
  | { channel: string; error: { code: string; detail: string }; idempotencyKey: string }
  | { results: ChannelResult[]; replayed: boolean; idempotencyKey: string };

/** A pending schedule, as `GET /api/v1/scheduled` lists it. */
export interface ScheduledEntry {
  id: string;
  channel: string;
  deliver_at: number;
  created_at: number;
  /** Bytes of `data`. */
  size: number;
}

export interface HistoryMessage {
  /** `message`, or `room` for a room's state change. */
  type: 'message' | 'room';
  seq: number;
  id: string;
  ts: number;
  data: Json;
  meta?: Meta;
}

export interface History {
  channel: string;
  epoch: string;
  first: number;
  head: number;
  messages: HistoryMessage[];
}

export interface ChannelCursors {
  channel: string;
  epoch: string;
  first: number;
  head: number;
  cursors: { user: string; device: string | null; cursor: number; unread: number; acked_at: number }[];
}

export interface Inbox {
  user: string;
  channels: {
    channel: string;
    epoch: string;
    first: number;
    head: number;
    unread_without_cursor: number;
    devices: { device: string | null; cursor: number; unread: number; acked_at: number }[];
  }[];
}

export interface Room {
  room: string;
  state: RoomState;
  version: number;
  host: string;
  attributes: Record<string, Json>;
  grace_period: number;
  grace_until_ms?: number;
  created_at_ms: number;
  updated_at_ms: number;
  member_count: number;
  members: Member[];
}

/** One open connection of a user ({@link HeraldServer.connections}). */
export interface UserConnection {
  /** `{node}/{n}`: unique in the deployment; {@link HeraldServer.disconnect} takes it. */
  id: string;
  device?: string;
  node: string;
  /** `herald`, `centrifugo` or `centrifugo_protobuf`. */
  protocol: string;
  connected_at_ms: number;
  /** The client's address as the proxy in front reports it. */
  remote?: string;
  subscriptions: string[];
}

/** What an action on a user stored; its connections are told on every node right after. */
export interface ActionResult {
  user: string;
  action: string;
  banned_until_ms?: number;
  issued_before_ms?: number;
}

/** One node of the deployment ({@link HeraldServer.nodes}). */
export interface NodeInfo {
  id: string;
  version: string;
  started_at_ms: number;
  connections: number;
  subscriptions: number;
  /** `ok`, or why the node's engine refuses work. */
  engine: string;
  reported_at_ms: number;
}

interface Call {
  method: string;
  path: string;
  body?: unknown;
  headers?: Record<string, string>;
  retry: boolean;
  key?: string;
}

export class HeraldServer {
  #url: string;
  #opts: HeraldServerOptions;
  #backoff: Required<BackoffOptions>;

  constructor(opts: HeraldServerOptions) {
    this.#url = opts.url.replace(/\/+$/, '');
    this.#opts = opts;
    this.#backoff = { baseMs: 200, maxMs: 5000, ...opts.backoff };
  }

  /** Publish one message. Retried under one idempotency key (generated when not given). */
  async publish(channel: string, data: Json | unknown, opts: { idempotencyKey?: string; meta?: Meta } = {}): Promise<ApiPublishResult> {
    const key = opts.idempotencyKey ?? randomId('api-');
    const body = opts.meta ? { data, meta: opts.meta } : { data };
    const { json, replayed } = await this.#call({ method: 'POST', path: `/api/v1/channels/${enc(channel)}/messages`, body, retry: true, key });
    return { ...(json as Omit<ApiPublishResult, 'replayed' | 'idempotencyKey'>), replayed, idempotencyKey: key };
  }

  /** One message to several channels, exactly once as a whole under one key. */
  async publishMany(
    channels: string[],
    data: Json | unknown,
    opts: { idempotencyKey?: string; meta?: Meta } = {},
  ): Promise<{ results: Omit<ApiPublishResult, 'replayed' | 'idempotencyKey'>[]; replayed: boolean; idempotencyKey: string }> {
    const key = opts.idempotencyKey ?? randomId('api-');
    const body = opts.meta ? { channels, data, meta: opts.meta } : { channels, data };
    const { json, replayed } = await this.#call({ method: 'POST', path: '/api/v1/publish', body, retry: true, key });
    return { results: (json as { results: ApiPublishResult[] }).results, replayed, idempotencyKey: key };
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
  async publishMessages(messages: BatchMessage[]): Promise<BatchResult[]> {
    const keys = messages.map((m) => m.idempotencyKey ?? randomId('api-'));
    const body = {
      messages: messages.map((m, i) => {
        const out: Record<string, unknown> = { data: m.data, idempotency_key: keys[i] };
        if (m.channel !== undefined) out.channel = m.channel;
        if (m.channels !== undefined) out.channels = m.channels;
        if (m.meta) out.meta = m.meta;
        if (m.deliverAt !== undefined) out.deliver_at = m.deliverAt instanceof Date ? m.deliverAt.getTime() : m.deliverAt;
        if (m.delayMs !== undefined) out.delay_ms = m.delayMs;
        return out;
      }),
    };
    const { json } = await this.#call({ method: 'POST', path: '/api/v1/messages', body, retry: true });
    const results = (json as { results: Record<string, unknown>[] }).results;
    return results.map((r, i) => {
      const out = { ...r, idempotencyKey: keys[i] } as Record<string, unknown>;
      if ('results' in r) {
        out.replayed = (r.results as { replayed?: boolean }[]).every((c) => c.replayed === true);
      } else if (!('error' in r)) {
        out.replayed = r.replayed === true;
      }
      return out as BatchResult;
    });
  }

  /**
   * Schedule one message: stored now, appended exactly once at `deliverAt`
   * (ms since the Unix epoch, or a Date) or after `delayMs`. Retried under
   * one idempotency key (generated when not given): a retry schedules once.
   */
  async schedule(
    channel: string,
    data: Json | unknown,
    opts: { deliverAt?: number | Date; delayMs?: number; idempotencyKey?: string; meta?: Meta },
  ): Promise<ScheduledResult> {
    if ((opts.deliverAt === undefined) === (opts.delayMs === undefined)) {
      throw new HeraldError('bad_request', 'give deliverAt or delayMs, not both');
    }
    const key = opts.idempotencyKey ?? randomId('api-');
    const body: Record<string, unknown> = { data };
    if (opts.meta) body.meta = opts.meta;
    if (opts.deliverAt !== undefined) body.deliver_at = opts.deliverAt instanceof Date ? opts.deliverAt.getTime() : opts.deliverAt;
    if (opts.delayMs !== undefined) body.delay_ms = opts.delayMs;
    const { json, replayed } = await this.#call({ method: 'POST', path: `/api/v1/channels/${enc(channel)}/messages`, body, retry: true, key });
    return { ...(json as Omit<ScheduledResult, 'replayed' | 'idempotencyKey'>), replayed, idempotencyKey: key };
  }

  /** Pending schedules of a channel, in delivery order (at most `limit`, default 100). */
  async scheduled(channel: string, opts: { limit?: number } = {}): Promise<ScheduledEntry[]> {
    const limit = opts.limit === undefined ? '' : `&limit=${opts.limit}`;
    const json = (await this.#get(`/api/v1/scheduled?channel=${enc(channel)}${limit}`)) as { scheduled: ScheduledEntry[] };
    return json.scheduled;
  }

  /** Cancel a pending schedule; `null` when there is none with this id (never made, delivered or cancelled). */
  async cancelScheduled(id: string): Promise<ScheduledEntry | null> {
    try {
      return (await this.#call({ method: 'DELETE', path: `/api/v1/scheduled/${enc(id)}`, retry: false })).json as ScheduledEntry;
    } catch (e) {
      if (e instanceof HeraldError && e.status === 404) return null;
      throw e;
    }
  }

  /** Messages after `after` (default 0), at most `limit` (default 100). */
  async history(channel: string, opts: { after?: number; limit?: number } = {}): Promise<History> {
    return this.#get(`/api/v1/channels/${enc(channel)}/messages${query({ after: opts.after, limit: opts.limit })}`) as Promise<History>;
  }

  /** Delivery receipts of an acked channel: every subscriber's cursor. */
  async cursors(channel: string, opts: { limit?: number } = {}): Promise<ChannelCursors> {
    return this.#get(`/api/v1/channels/${enc(channel)}/cursors${query(opts)}`) as Promise<ChannelCursors>;
  }

  /** A user's acked channels with each device's cursor and unread count. */
  async inbox(user: string, opts: { limit?: number } = {}): Promise<Inbox> {
    return this.#get(`/api/v1/users/${enc(user)}/inbox${query(opts)}`) as Promise<Inbox>;
  }

  /** Members of a presence channel (`count: true`: only the count). */
  async presence(channel: string, opts: { count?: boolean; limit?: number } = {}): Promise<{ channel: string; count: number; members?: Member[] }> {
    const q = query({ count: opts.count ? 1 : undefined, limit: opts.limit });
    return this.#get(`/api/v1/channels/${enc(channel)}/presence${q}`) as Promise<{ channel: string; count: number; members?: Member[] }>;
  }

  async createRoom(room: string, opts: { host: string; attributes?: Record<string, Json>; gracePeriodSec?: number }): Promise<Room> {
    const body: Record<string, unknown> = { host: opts.host };
    if (opts.attributes) body.attributes = opts.attributes;
    if (opts.gracePeriodSec !== undefined) body.grace_period = opts.gracePeriodSec;
    return (await this.#call({ method: 'PUT', path: `/api/v1/rooms/${enc(room)}`, body, retry: false })).json as Room;
  }

  async room(room: string): Promise<Room> {
    return this.#get(`/api/v1/rooms/${enc(room)}`) as Promise<Room>;
  }

  /** Change the state and/or replace the attributes; with `ifMatch` only from that version (else 412). */
  async updateRoom(room: string, change: { state?: RoomState; attributes?: Record<string, Json> }, opts: { ifMatch?: number } = {}): Promise<Room> {
    const headers = opts.ifMatch === undefined ? undefined : { 'if-match': `"${opts.ifMatch}"` };
    return (await this.#call({ method: 'PATCH', path: `/api/v1/rooms/${enc(room)}`, body: change, headers, retry: false })).json as Room;
  }

  /** Close the room for good. */
  async closeRoom(room: string, opts: { ifMatch?: number } = {}): Promise<Room> {
    const headers = opts.ifMatch === undefined ? undefined : { 'if-match': `"${opts.ifMatch}"` };
    return (await this.#call({ method: 'DELETE', path: `/api/v1/rooms/${enc(room)}`, headers, retry: false })).json as Room;
  }

  /** A user's open connections on every node. */
  async connections(user: string): Promise<UserConnection[]> {
    return ((await this.#get(`/api/v1/users/${enc(user)}/connections`)) as { connections: UserConnection[] }).connections;
  }

  /**
   * Close a user's connections (all, one `device`'s, or one `connection`).
   * `reconnect: false` closes with a code clients do not reconnect after;
   * `banSeconds` also refuses the user (or the device) until then.
   * Idempotent, so retried like a read.
   */
  async disconnect(
    user: string,
    opts: { reconnect: boolean; device?: string; connection?: string; reason?: string; banSeconds?: number },
  ): Promise<ActionResult> {
    const body: Record<string, unknown> = { reconnect: opts.reconnect };
    if (opts.device !== undefined) body.device = opts.device;
    if (opts.connection !== undefined) body.connection = opts.connection;
    if (opts.reason !== undefined) body.reason = opts.reason;
    if (opts.banSeconds !== undefined) body.ban_seconds = opts.banSeconds;
    return (await this.#call({ method: 'POST', path: `/api/v1/users/${enc(user)}/disconnect`, body, retry: true })).json as ActionResult;
  }

  /** Refuse the user's tokens issued before `issuedBefore` (default now) and close their connections as expired. */
  async revoke(user: string, issuedBefore: number | Date = Date.now()): Promise<ActionResult> {
    const body = { issued_before_ms: issuedBefore instanceof Date ? issuedBefore.getTime() : issuedBefore };
    return (await this.#call({ method: 'POST', path: `/api/v1/users/${enc(user)}/revoke`, body, retry: true })).json as ActionResult;
  }

  /** Subscribe every open connection of the user (or of `device`) to `channel`, from after `since` or live. */
  async subscribeUser(user: string, channel: string, opts: { device?: string; since?: { seq: number; epoch?: string } } = {}): Promise<ActionResult> {
    const body: Record<string, unknown> = { channel };
    if (opts.device !== undefined) body.device = opts.device;
    if (opts.since !== undefined) body.since = opts.since;
    return (await this.#call({ method: 'POST', path: `/api/v1/users/${enc(user)}/subscriptions`, body, retry: true })).json as ActionResult;
  }

  /** Unsubscribe the user's connections from `channel`. */
  async unsubscribeUser(user: string, channel: string): Promise<ActionResult> {
    return (await this.#call({ method: 'DELETE', path: `/api/v1/users/${enc(user)}/subscriptions/${enc(channel)}`, retry: true })).json as ActionResult;
  }

  /** Remove a member from a room: unsubscribed, lease ended, rejoin refused. */
  async removeMember(room: string, user: string): Promise<ActionResult> {
    return (await this.#call({ method: 'DELETE', path: `/api/v1/rooms/${enc(room)}/members/${enc(user)}`, retry: true })).json as ActionResult;
  }

  /** One page of the channels with a subscriber on some node (`pattern`: `*` matches any run of characters). */
  async channels(opts: { pattern?: string; limit?: number; after?: string } = {}): Promise<{ channels: { channel: string; subscribers: number }[]; next?: string }> {
    const parts: string[] = [];
    if (opts.pattern !== undefined) parts.push(`pattern=${enc(opts.pattern)}`);
    if (opts.limit !== undefined) parts.push(`limit=${opts.limit}`);
    if (opts.after !== undefined) parts.push(`after=${enc(opts.after)}`);
    const q = parts.length ? `?${parts.join('&')}` : '';
    return this.#get(`/api/v1/channels${q}`) as Promise<{ channels: { channel: string; subscribers: number }[]; next?: string }>;
  }

  /** Every node of the deployment. */
  async nodes(): Promise<NodeInfo[]> {
    return ((await this.#get('/api/v1/nodes')) as { nodes: NodeInfo[] }).nodes;
  }

  async #get(path: string): Promise<unknown> {
    return (await this.#call({ method: 'GET', path, retry: true })).json;
  }

  async #call(c: Call): Promise<{ json: unknown; replayed: boolean }> {
    const f = this.#opts.fetch ?? fetch;
    const retries = c.retry ? (this.#opts.retries ?? 4) : 0;
    const headers: Record<string, string> = { ...c.headers };
    if (this.#opts.apiKey) headers.authorization = `Bearer ${this.#opts.apiKey}`;
    if (c.body !== undefined) headers['content-type'] = 'application/json';
    if (c.key) headers['idempotency-key'] = c.key;
    const body = c.body === undefined ? undefined : JSON.stringify(c.body);
    for (let attempt = 0; ; attempt++) {
      let err: HeraldError;
      let retryAfterMs = 0;
      try {
        const res = await f(this.#url + c.path, {
          method: c.method,
          headers,
          body,
          signal: AbortSignal.timeout(this.#opts.timeoutMs ?? 10_000),
        });
        const text = await res.text();
        const json = text ? JSON.parse(text) : undefined;
        if (res.ok) return { json, replayed: res.headers.get('idempotent-replayed') === 'true' };
        const p = (json ?? {}) as { code?: string; detail?: string; title?: string };
        err = new HeraldError(p.code ?? `http_${res.status}`, p.detail ?? p.title ?? `HTTP ${res.status}`, {
          status: res.status,
          problem: json as Record<string, unknown>,
          idempotencyKey: c.key,
        });
        retryAfterMs = Number(res.headers.get('retry-after') ?? 0) * 1000;
        const again = res.status >= 500 || res.status === 429 || p.code === 'idempotency_key_in_flight';
        if (!again) throw err;
      } catch (e) {
        if (e instanceof HeraldError && !e.retryable) throw e;
        err = e instanceof HeraldError ? e : new HeraldError('network', `${c.method} ${c.path} failed: ${String(e)}`, { cause: e, idempotencyKey: c.key });
      }
      if (attempt >= retries) throw err;
      const wait = Math.min(30_000, Math.max(retryAfterMs, backoffDelay(attempt, this.#backoff)));
      await new Promise((r) => setTimeout(r, wait));
    }
  }
}

function enc(s: string): string {
  return encodeURIComponent(s);
}

function query(q: Record<string, number | undefined>): string {
  const parts = Object.entries(q)
    .filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${k}=${v}`);
  return parts.length ? `?${parts.join('&')}` : '';
}
