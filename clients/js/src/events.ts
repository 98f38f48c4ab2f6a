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

/** A channel's presence counts, pushed once per batch (a namespace's `join_leave_counts`). */
export interface PresenceCountContext {
  channel: string;
  numClients: number;
  numUsers: number;
}

/** Events of one channel, emitted by a `Subscription` and by the client for server-side ones. */
export interface ChannelEvents<T = unknown> {
  /** Every publication, exactly once, in offset order. */
  publication: PublicationContext<T>;
  join: PresenceEventContext;
  leave: PresenceEventContext;
  /** The channel's presence counts (namespaces with `join_leave_counts`, instead of join/leave). */
  presenceCount: PresenceCountContext;
  /** The server left publications out (backpressure policy); the position moved past them. */
  skipped: SkippedContext;
  /** The subscription ended for good. */
  unsubscribed: UnsubscribedContext;
}
