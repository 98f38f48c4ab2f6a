// The event model shared by the client and its subscriptions. Both are `Emitter`s; the events a
// channel produces (publications, joins, leaves, its end) have the same names and payloads whether
// the app subscribed (`sub.on('publication', …)`) or the server did (`herald.on('publication', …)`).

import type { ClientInfo } from './codec.js';

export interface PublicationContext<T = unknown> {
  channel: string;
  offset: number;
  data: T;
  /** Publisher, when the publication came from a client connection. */
  info?: ClientInfo;
  /** The publisher's tags, when it set some. */
  tags?: Record<string, string>;
}

export interface PresenceEventContext {
  channel: string;
  info: ClientInfo;
}

/**
 * Publications `from`..`to` (offsets) were left out for this connection by the namespace's
 * backpressure policy (`conflate` or `drop_oldest`: it read too slowly). They are not recovered:
 * the next publication follows `to`.
 */
export interface SkippedContext {
  channel: string;
  from: number;
  to: number;
}

export interface UnsubscribedContext {
  channel: string;
  code: number;
  reason: string;
}

/** Events of one channel, emitted by a `Subscription` and by the client for server-side ones. */
export interface ChannelEvents<T = unknown> {
  /** Every publication, exactly once, in offset order. */
  publication: PublicationContext<T>;
  join: PresenceEventContext;
  leave: PresenceEventContext;
  /** The server left publications out (backpressure policy); the position moved past them. */
  skipped: SkippedContext;
  /** The subscription ended for good. */
  unsubscribed: UnsubscribedContext;
}
