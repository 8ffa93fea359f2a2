/** Shapes shared by the realtime client and the HTTP helper. */

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** Message metadata: a map of strings (at most 16 entries). */
export type Meta = Record<string, string>;

/** A message delivered to a subscription. */
export interface Message<T = unknown> {
  channel: string;
  /** Per channel, gap-free from 1. Absent on volatile channels. */
  seq?: number;
  /** Globally unique, time-ordered (UUIDv7). */
  id: string;
  /** Server time of the append, ms since the Unix epoch. */
  ts: number;
  data: T;
  meta?: Meta;
  /**
   * This seq was handed to the application before (the server redelivered
   * an unacked message, or it comes again after its handler failed or the
   * connection was lost before its ack).
   */
  redelivered: boolean;
  /** The server's delivery attempt number, on redeliveries. */
  attempt?: number;
  /**
   * Acked channels: acknowledge this message and every one before it
   * (cumulative). Needed only with `ack: 'manual'`; otherwise the client
   * acks when the handler resolves. A no-op elsewhere.
   */
  ack(): void;
}

/** A presence member. */
export interface Member {
  client_id: string;
  user: string;
  device?: string;
  info?: Json;
}

export interface Presence {
  count: number;
  members: Member[];
}

export type RoomState = 'open' | 'live' | 'grace' | 'closed';

/** A room's state change, in order with the room's messages. */
export interface RoomEvent {
  channel: string;
  seq: number;
  id: string;
  ts: number;
  state: RoomState;
  version: number;
  host: string;
  attributes: Record<string, Json>;
  grace_until_ms?: number;
  /** `created`, `host_joined`, `host_left`, `grace_expired`, `api`. */
  reason: string;
}

/** The server's reply to a subscribe (initial or resume). */
export interface SubscribeInfo {
  channel: string;
  /** Absent (and `first`, `head` too) on volatile channels. */
  epoch?: string;
  first?: number;
  head?: number;
  truncated: boolean;
  epochChanged: boolean;
  /** Acked channels: the stored cursor and what will be delivered. */
  cursor?: number;
  unread?: number;
  /** Presence channels: this client's member id. */
  clientId?: string;
}

/** `truncated` / `epoch_changed`: messages were skipped; delivery continues at `first`. */
export interface ResetEvent {
  channel: string;
  epoch: string;
  first: number;
  head: number;
}

/** Seqs `expected..got-1` never arrived and no reset explained it (the server promises this does not happen). */
export interface GapEvent {
  channel: string;
  expected: number;
  got: number;
}

/** A publish's result. */
export interface PublishResult {
  channel: string;
  /** Absent on volatile channels. */
  seq?: number;
  id: string;
  /** The idempotency key matched an earlier publish: nothing new was appended. */
  duplicate: boolean;
  idempotencyKey: string;
}
