// The app's handle on one channel. It owns the channel's recovery bookkeeping (StreamTracker) and
// the app's callbacks; the client decides when to send subscribe / unsubscribe and feeds replies and
// pushes in here. Everything the app sees for a channel passes through `deliver`, so that is where
// the exactly-once, in-order rule is enforced.

import { Backoff } from './backoff.js';
import type {
  ClientInfo,
  HistoryResult,
  PresenceResult,
  Publication,
  PublishResult,
  StreamPosition,
  SubscribeResult,
} from './codec.js';
import { ClientCode } from './codes.js';
import { HeraldError } from './errors.js';
import { StreamTracker } from './recovery.js';

export type SubscriptionState = 'subscribing' | 'subscribed' | 'unsubscribed';

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

export interface RecoveryFailedContext {
  channel: string;
  /** The position the SDK asked to recover from. */
  since: StreamPosition;
  /** The stream's current epoch and newest offset: reload state, then continue from here. */
  epoch: string;
  offset: number;
}

export interface SubscribedContext {
  channel: string;
  epoch: string;
  offset: number;
  recoverable: boolean;
  /** True when missed publications were recovered (they are delivered right after this event). */
  recovered: boolean;
  /** True for every subscribe after the first one (reconnects, resyncs). */
  resubscribed: boolean;
  /** What the server's subscribe proxy (the application's backend) returned, if anything. */
  data?: unknown;
}

export interface UnsubscribedContext {
  channel: string;
  code: number;
  reason: string;
}

export interface SubscriptionErrorContext {
  channel: string;
  error: HeraldError;
}

export interface SubscribeOptions<T = unknown> {
  /** Resume from a position the app stored earlier (e.g. from `sub.position` before a reload). */
  since?: StreamPosition;
  /** Subscription token (JWT) for channels that need one. */
  token?: string;
  /**
   * Sent with every `subscribe` of this channel: the server's subscribe proxy passes it to the
   * application's backend (docs/proxy.md).
   */
  data?: unknown;
  /**
   * Called for a subscription token: before subscribing (when `token` is not given), before the
   * token expires (the SDK then sends `sub_refresh`), and after the server ended the subscription
   * because it expired (`unsub` 4004) or refused an expired one (109). Return '' or null to give
   * up: the subscription ends.
   */
  getToken?: (channel: string) => string | null | undefined | Promise<string | null | undefined>;
  /** Every publication, exactly once, in offset order. */
  onPublication?: (ctx: PublicationContext<T>) => void;
  onJoin?: (ctx: PresenceEventContext) => void;
  onLeave?: (ctx: PresenceEventContext) => void;
  /**
   * The server could not recover missed publications (`recovered: false`): history no longer holds
   * them or the stream was recreated. The app must reload its state from its own source.
   */
  onRecoveryFailed?: (ctx: RecoveryFailedContext) => void;
  onSubscribed?: (ctx: SubscribedContext) => void;
  /** The subscription ended for good (by the server, an error, or `unsubscribe()`). */
  onUnsubscribed?: (ctx: UnsubscribedContext) => void;
  onError?: (ctx: SubscriptionErrorContext) => void;
}

/** What the subscription needs from the client; kept narrow so it is easy to fake in tests. */
export interface SubscriptionHost {
  removeSubscription(sub: Subscription<never>, code: number, reason: string): void;
  publish(channel: string, data: unknown): Promise<PublishResult>;
  history(channel: string, opts?: { since?: StreamPosition; limit?: number }): Promise<HistoryResult>;
  presence(channel: string): Promise<PresenceResult>;
  reportListenerError(channel: string, error: unknown): void;
}

export class Subscription<T = unknown> {
  readonly channel: string;
  /** @internal */
  _state: SubscriptionState = 'subscribing';
  /** @internal Position bookkeeping; see recovery.ts. */
  readonly _tracker: StreamTracker;
  /** @internal The `since` sent with the subscribe now in flight. */
  _sentSince: StreamPosition | undefined;
  /** @internal A subscribe or resync unsubscribe is in flight for this subscription. */
  _inflight = false;
  /** @internal Paces retries and resyncs so a misbehaving server cannot make us spin. */
  readonly _backoff = new Backoff({ minDelayMs: 200, maxDelayMs: 10_000 });
  /** @internal */
  _retryTimer: ReturnType<typeof setTimeout> | undefined;
  /** @internal Fires `sub_refresh` ahead of the token's expiry. */
  _refreshTimer: ReturnType<typeof setTimeout> | undefined;
  /** @internal The next subscribe must fetch a token first (none yet, or the last one expired). */
  _needToken: boolean;

  private readonly host: SubscriptionHost;
  private readonly opts: SubscribeOptions<T>;
  private subscribedOnce = false;
  private waiters: Array<{ resolve: () => void; reject: (e: HeraldError) => void }> = [];
  private endError: HeraldError | undefined;

  /** @internal Created by `Herald.subscribe`. */
  constructor(host: SubscriptionHost, channel: string, opts: SubscribeOptions<T>) {
    this.host = host;
    this.channel = channel;
    this.opts = opts;
    this._tracker = new StreamTracker(opts.since);
    this.token = opts.token;
    this._needToken = opts.token === undefined && opts.getToken !== undefined;
  }

  private token: string | undefined;

  get state(): SubscriptionState {
    return this._state;
  }

  /**
   * The last position delivered to the app. Store it to resume with `since` after a page reload.
   */
  get position(): StreamPosition | undefined {
    return this._tracker.position();
  }

  /** @internal The subscription token to send, if any. */
  get _token(): string | undefined {
    return this.token;
  }

  /** @internal Whether the subscription has its own token (so it cannot go in `connect.subs`). */
  get _hasOwnToken(): boolean {
    return this.token !== undefined || this.opts.getToken !== undefined;
  }

  /** @internal Sent one by one (with `data`), never in `connect.subs`. */
  get _sentAlone(): boolean {
    return this._hasOwnToken || this.opts.data !== undefined;
  }

  /** @internal The `data` option, for the subscribe command. */
  get _data(): unknown {
    return this.opts.data;
  }

  /** @internal Whether a fresh token can be fetched. */
  get _canFetchToken(): boolean {
    return this.opts.getToken !== undefined;
  }

  /**
   * @internal Ask the app for a token. Resolves to the token, or undefined when the app gave none
   * (the caller ends the subscription). Rejects when `getToken` threw.
   */
  async _fetchToken(): Promise<string | undefined> {
    const token = await this.opts.getToken?.(this.channel);
    if (!token) return undefined;
    this.token = token;
    this._needToken = false;
    return token;
  }

  /**
   * Resolves once the subscription is active; rejects if it ends first, or if the client stops
   * (`disconnected`) before that.
   */
  ready(): Promise<void> {
    if (this._state === 'subscribed') return Promise.resolve();
    if (this._state === 'unsubscribed') {
      return Promise.reject(this.endError ?? new HeraldError(0, 'unsubscribed'));
    }
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  /** Stop receiving publications. The subscription object is finished after this. */
  unsubscribe(): void {
    if (this._state === 'unsubscribed') return;
    this.host.removeSubscription(this as Subscription<never>, ClientCode.UnsubscribeCalled, 'unsubscribe called');
  }

  publish(data: T): Promise<PublishResult> {
    return this.host.publish(this.channel, data);
  }

  history(opts?: { since?: StreamPosition; limit?: number }): Promise<HistoryResult> {
    return this.host.history(this.channel, opts);
  }

  presence(): Promise<PresenceResult> {
    return this.host.presence(this.channel);
  }

  /**
   * @internal A subscribe reply arrived (from `subscribe` or `connect.subs`). Returns true when a
   * hole was found and the client must resync the channel.
   */
  _applySubscribe(result: SubscribeResult): boolean {
    const asked = this._sentSince;
    this._sentSince = undefined;
    const outcome = this._tracker.applySubscribe(result, asked);
    this._state = 'subscribed';
    const resubscribed = this.subscribedOnce;
    this.subscribedOnce = true;

    if (outcome.recoveryFailed && asked) {
      this.call(this.opts.onRecoveryFailed, {
        channel: this.channel,
        since: asked,
        epoch: String(result.epoch),
        offset: result.offset,
      });
    }
    const subscribed: SubscribedContext = {
      channel: this.channel,
      epoch: String(result.epoch),
      offset: result.offset,
      recoverable: result.recoverable !== false,
      recovered: outcome.recovered,
      resubscribed,
    };
    if (result.data !== undefined) subscribed.data = result.data;
    this.call(this.opts.onSubscribed, subscribed);
    for (const w of this.waiters.splice(0)) w.resolve();
    for (const pub of outcome.publications) {
      // A callback may have unsubscribed us half-way through the batch.
      if (this._state !== 'subscribed') return false;
      this.deliver(pub);
    }
    return outcome.gap;
  }

  /**
   * @internal A live publication. Returns true when it revealed a hole (resync needed). Pushes that
   * arrive while we are (re)subscribing are dropped: they belong to the previous server-side
   * subscription, and the subscribe reply's recovery or the live stream after it covers them.
   */
  _applyPublication(pub: Publication): boolean {
    if (this._state !== 'subscribed') return false;
    const verdict = this._tracker.applyPublication(pub);
    if (verdict === 'gap') return true;
    if (verdict === 'deliver') {
      this._backoff.reset();
      this.deliver(pub);
    }
    return false;
  }

  /** @internal */
  _applyPresence(kind: 'join' | 'leave', info: ClientInfo): void {
    if (this._state !== 'subscribed') return;
    this.call(kind === 'join' ? this.opts.onJoin : this.opts.onLeave, { channel: this.channel, info });
  }

  /**
   * @internal The client stopped (disconnected for good). The subscription stays registered for a
   * later `connect()`, but nobody should wait on `ready()` for a connection that is not coming.
   */
  _clientStopped(error: HeraldError): void {
    for (const w of this.waiters.splice(0)) w.reject(error);
  }

  /** @internal A non-fatal problem worth telling the app about. */
  _reportError(error: HeraldError): void {
    this.call(this.opts.onError, { channel: this.channel, error });
  }

  /** @internal The subscription is over (error, server `unsub`, or `unsubscribe()`). */
  _end(code: number, reason: string, error?: HeraldError): void {
    if (this._state === 'unsubscribed') return;
    this._state = 'unsubscribed';
    if (this._retryTimer !== undefined) clearTimeout(this._retryTimer);
    this._retryTimer = undefined;
    if (this._refreshTimer !== undefined) clearTimeout(this._refreshTimer);
    this._refreshTimer = undefined;
    this.endError = error ?? new HeraldError(code, reason);
    if (error) this._reportError(error);
    for (const w of this.waiters.splice(0)) w.reject(this.endError);
    this.call(this.opts.onUnsubscribed, { channel: this.channel, code, reason });
  }

  private deliver(pub: Publication): void {
    const ctx: PublicationContext<T> = { channel: this.channel, offset: pub.offset, data: pub.data as T };
    if (pub.info) ctx.info = pub.info;
    this.call(this.opts.onPublication, ctx);
  }

  private call<A>(fn: ((arg: A) => void) | undefined, arg: A): void {
    if (!fn) return;
    try {
      fn(arg);
    } catch (e) {
      // The app's bug must not corrupt the position we track or stop the rest of a batch.
      this.host.reportListenerError(this.channel, e);
    }
  }
}
