/** What a closed connection means: reconnect how, or give up. Pure logic. */

import { CloseCode } from './errors.js';

/** A `disconnect` frame, sent by the server right before it closes. */
export interface DisconnectFrame {
  code: number;
  reason: string;
  reconnect: boolean;
}

export type CloseAction =
  /** Reconnect with exponential backoff. */
  | 'retry'
  /** Reconnect at once (backoff starts over) and resume with `since`: 4005, 4008, 4010. */
  | 'resume'
  /** Reconnect with a fresh token from `getToken`: 4003. */
  | 'refresh_token'
  /** Reconnect, slower than usual: 4009. */
  | 'slow'
  /** Do not reconnect: the same connection would fail the same way. */
  | 'fatal';

/**
 * Decide from the close code and the `disconnect` frame before it (which
 * wins when it forbids reconnecting). See docs/protocol.md, "Close codes".
 */
export function closeAction(code: number | undefined, disconnect?: DisconnectFrame): CloseAction {
  const c = disconnect?.code ?? code;
  if (disconnect && !disconnect.reconnect) return 'fatal';
  switch (c) {
    case CloseCode.MESSAGE_TOO_BIG:
    case CloseCode.BAD_REQUEST:
    case CloseCode.UNAUTHORIZED:
    case CloseCode.DISCONNECTED_FOR_GOOD:
      return 'fatal';
    case CloseCode.TOKEN_EXPIRED:
      return 'refresh_token';
    case CloseCode.RESYNC:
    case CloseCode.SLOW_CONSUMER:
    case CloseCode.DRAINING:
      return 'resume';
    case CloseCode.RATE_LIMITED:
      return 'slow';
    default:
      // 1001 shutdown, 1006 lost, 1011 internal, 4004 idle, 4011
      // disconnected by the backend, anything new.
      return 'retry';
  }
}

/**
 * What a refused WebSocket upgrade means, from the HTTP status and problem
 * code of the same URL fetched without the upgrade (a browser's WebSocket
 * does not expose the refusal). A server that accepts the credentials
 * answers the plain GET with `400` (not an upgrade).
 */
export function refusalAction(status: number, code: string | undefined): CloseAction {
  if (code === 'token_expired') return 'refresh_token';
  if (status === 401 || status === 403) return 'fatal';
  return 'retry';
}
