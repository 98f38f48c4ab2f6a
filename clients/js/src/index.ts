// Public API of the Herald SDK (browser-safe: no imports outside this package).
export { Herald } from './client.js';
export type {
  ConnectionState,
  ConnectedContext,
  ErrorContext,
  ErrorType,
  HeraldEvents,
  HeraldOptions,
  ServerSubscribedContext,
  StateContext,
} from './client.js';
export { Subscription } from './subscription.js';
export type {
  RecoveryFailedContext,
  SubscribeOptions,
  SubscribedContext,
  SubscriptionErrorContext,
  SubscriptionEvents,
  SubscriptionState,
} from './subscription.js';
export type {
  ChannelEvents,
  PresenceCountContext,
  PresenceEventContext,
  PublicationContext,
  SkippedContext,
  UnsubscribedContext,
} from './events.js';
export type {
  ClientInfo,
  ConnectResult,
  HistoryResult,
  PresencePageOptions,
  PresenceResult,
  PresenceStatsResult,
  Publication,
  PublishResult,
  RpcResult,
  StreamPosition,
  SubscribeResult,
  TagFilter,
} from './codec.js';
export { ClientCode, CloseCode, ErrorCode, UnsubCode } from './codes.js';
export { ConnectionError, HeraldError, ReplyError, TimeoutError, UsageError } from './errors.js';
export { Backoff } from './backoff.js';
export { withPusherCatchUp } from './pusher-catch-up.js';
export type { PusherLike } from './pusher-catch-up.js';
export type { BackoffOptions } from './backoff.js';
export { setDefaultWebSocket } from './transport.js';
export type { WebSocketConstructor, WebSocketLike } from './transport.js';
