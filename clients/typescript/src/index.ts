/**
 * @herald/client: Herald's client for browsers and Node.
 *
 * - {@link Herald}: the realtime client (WebSocket): reconnects, resumes
 *   every subscription from its last seq, drops duplicates, acks, publishes
 *   exactly once, presence and rooms.
 * - {@link HeraldServer}: the HTTP API for backends.
 *
 * No runtime dependencies: the platform's `WebSocket` and `fetch` (Node 20:
 * pass the `ws` package's WebSocket). See docs/clients.md.
 */

export { Herald } from './client.js';
export type {
  ConnectionState,
  ConnectionStatus,
  HeraldEvents,
  HeraldOptions,
  PublishOptions,
  WebSocketConstructor,
  WebSocketLike,
} from './client.js';
export { Subscription } from './subscription.js';
export type { SubscribeOptions, SubscriptionEvents, SubscriptionStatus } from './subscription.js';
export { HeraldServer } from './server.js';
export type {
  ApiPublishResult,
  BatchMessage,
  BatchResult,
  ChannelCursors,
  History,
  HistoryMessage,
  HeraldServerOptions,
  Inbox,
  Room,
  ScheduledEntry,
  ScheduledResult,
} from './server.js';
export { HeraldError, CloseCode } from './errors.js';
export type { ClientErrorCode, ErrorCode, HeraldErrorDetails, ServerErrorCode } from './errors.js';
export { closeAction } from './close.js';
export type { CloseAction } from './close.js';
export type { Observable } from './observable.js';
export type { BackoffOptions } from './backoff.js';
export type { Since } from './cursor.js';
export type * from './types.js';
