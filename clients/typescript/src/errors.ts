/**
 * Typed errors. Every error the client reports is a {@link HeraldError}
 * whose `code` is one of Herald's stable error codes (docs/protocol.md,
 * "Error codes") when the server said so, or one of the client's own codes
 * below when the failure happened on this side.
 */

/** Herald's error codes, as the server sends them. */
export type ServerErrorCode =
  | 'bad_request'
  | 'bad_json'
  | 'bad_channel'
  | 'bad_data'
  | 'idempotency_key_required'
  | 'conflict'
  | 'precondition_failed'
  | 'channel_closed'
  | 'idempotency_key_invalid'
  | 'unauthorized'
  | 'token_expired'
  | 'forbidden'
  | 'origin_not_allowed'
  | 'not_found'
  | 'method_not_allowed'
  | 'request_timeout'
  | 'headers_too_large'
  | 'unknown_namespace'
  | 'not_supported'
  | 'already_subscribed'
  | 'not_subscribed'
  | 'idempotency_key_in_flight'
  | 'payload_too_large'
  | 'idempotency_key_reused'
  | 'too_many_subscriptions'
  | 'rate_limited'
  | 'internal'
  | 'unavailable'
  | 'shutting_down'
  | 'too_many_connections';

/** Codes of failures seen on the client's side. */
export type ClientErrorCode =
  /** The connection was lost while the request was in flight; it may or may not have taken effect. */
  | 'connection_lost'
  /** No reply within the request's timeout. */
  | 'timeout'
  /** Too many publishes waiting for a connection (`maxQueuedPublishes`). */
  | 'backlog'
  /** The client was closed by the application. */
  | 'closed'
  /** The server closed the connection for good (a close code or `disconnect` frame that forbids reconnecting). */
  | 'disconnected'
  /** A network failure (HTTP helper: no response). */
  | 'network'
  /** `getToken` failed. */
  | 'token_unavailable'
  /** The server sent something that is not a Herald frame. */
  | 'protocol'
  /** The application's message handler threw or rejected. */
  | 'handler_failed';

export type ErrorCode = ServerErrorCode | ClientErrorCode;

/** WebSocket close codes Herald uses (docs/protocol.md, "Close codes"). */
export const CloseCode = {
  NORMAL: 1000,
  GOING_AWAY: 1001,
  ABNORMAL: 1006,
  MESSAGE_TOO_BIG: 1009,
  INTERNAL: 1011,
  BAD_REQUEST: 4000,
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
  DISCONNECTED_FOR_GOOD: 4012,
} as const;

/** Server conditions that pass: the same request may succeed later. */
const TRANSIENT: ReadonlySet<string> = new Set([
  'unavailable',
  'shutting_down',
  'internal',
  'rate_limited',
  'too_many_connections',
  'idempotency_key_in_flight',
  'connection_lost',
  'timeout',
  'network',
]);

export interface HeraldErrorDetails {
  /** HTTP status (HTTP API, or a refused WebSocket upgrade). */
  status?: number;
  /** WebSocket close code. */
  closeCode?: number;
  channel?: string;
  /** The idempotency key of a publish whose outcome is unknown: retry with it for exactly one effect. */
  idempotencyKey?: string;
  /** The problem+json document of an HTTP error. */
  problem?: Record<string, unknown>;
  cause?: unknown;
}

export class HeraldError extends Error {
  readonly code: ErrorCode | (string & {});
  readonly status?: number;
  readonly closeCode?: number;
  readonly channel?: string;
  readonly idempotencyKey?: string;
  readonly problem?: Record<string, unknown>;

  constructor(code: ErrorCode | (string & {}), message: string, details: HeraldErrorDetails = {}) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    this.name = 'HeraldError';
    this.code = code;
    this.status = details.status;
    this.closeCode = details.closeCode;
    this.channel = details.channel;
    this.idempotencyKey = details.idempotencyKey;
    this.problem = details.problem;
  }

  /** Whether retrying the same request (with the same idempotency key) may succeed. */
  get retryable(): boolean {
    return TRANSIENT.has(this.code) || (this.status !== undefined && this.status >= 500);
  }
}

/** Whether a server error code names a passing condition. */
export function isTransient(code: string): boolean {
  return TRANSIENT.has(code);
}
