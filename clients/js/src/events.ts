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
}

export interface PresenceEventContext {
  channel: string;
  info: ClientInfo;
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
  /** The subscription ended for good. */
  unsubscribed: UnsubscribedContext;
}
