// The app's handle on one channel. It owns the channel's state and every transition of it, its
// recovery bookkeeping (StreamTracker), its retry and token-refresh timers, and its events. The
// client decides when to send subscribe / unsubscribe and reports what happened through the `_`
// methods below, each one named transition; it never writes the subscription's fields. Everything
// the app sees for a channel passes through `deliver`, so that is where the exactly-once, in-order
// rule is enforced.

import { Backoff } from './backoff.js';
import type {
  ClientInfo,
  HistoryResult,
  PresencePageOptions,
  PresenceResult,
  PresenceStatsResult,
  Publication,
  PublishResult,
  StreamPosition,
  SubscribeResult,
  TagFilter,
} from './codec.js';
import { ClientCode } from './codes.js';
import { Emitter } from './emitter.js';
import { HeraldError } from './errors.js';
import type {
  ChannelEvents,
  PresenceCountContext,
  PresenceEventContext,
  PublicationContext,
  UnsubscribedContext,
} from './events.js';
import { DeltaError, applyDeltaText } from './fossil.js';
import { StreamTracker } from './recovery.js';

export type SubscriptionState = 'subscribing' | 'subscribed' | 'unsubscribed';

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
  /**
   * Ask for delta compression: after the first live publication, each one comes as a Fossil delta
   * against the previous one and the SDK rebuilds it (the namespace must set `allow_delta`, or the
   * subscribe fails with 108). Recovered publications and history stay in full.
   */
  delta?: 'fossil';
  /**
   * Only publications whose tags match this filter are delivered, live and in recovery (the
   * namespace must set `allow_tags_filter`, or the subscribe fails with 108; a malformed filter
   * fails with 107). The offsets then have holes where the filter left publications out, which
   * the subscription does not treat as gaps.
   */
  tagsFilter?: TagFilter;
}

/**
 * Events of a subscription (`sub.on(event, fn)`); the `on…` options of `subscribe` are listeners
 * registered first.
 */
export interface SubscriptionEvents<T = unknown> extends ChannelEvents<T> {
  subscribed: SubscribedContext;
  recoveryFailed: RecoveryFailedContext;
  error: SubscriptionErrorContext;
}

/** What the subscription needs from the client; kept narrow so it is easy to fake in tests. */
export interface SubscriptionHost {
  removeSubscription(sub: Subscription<never>, code: number, reason: string): void;
  publish(channel: string, data: unknown): Promise<PublishResult>;
  history(channel: string, opts?: { since?: StreamPosition; limit?: number }): Promise<HistoryResult>;
  presence(channel: string, page?: PresencePageOptions): Promise<PresenceResult>;
  presenceStats(channel: string): Promise<PresenceStatsResult>;
  reportListenerError(channel: string, error: unknown): void;
}

export class Subscription<T = unknown> extends Emitter<SubscriptionEvents<T>> {
  readonly channel: string;
  private _state: SubscriptionState = 'subscribing';
  /** Position bookkeeping; see recovery.ts. */
  private readonly tracker: StreamTracker;
  /** The `since` sent with the subscribe now in flight. */
  private sentSince: StreamPosition | undefined;
  /**
   * One step toward being subscribed is under way: a subscribe (alone or in `connect.subs`), the
   * token fetch before one, or a resync's unsubscribe. The client starts no second one meanwhile.
   */
  private busy = false;
  /** Paces retries and resyncs so a misbehaving server cannot make us spin. */
  private readonly backoff = new Backoff({ minDelayMs: 200, maxDelayMs: 10_000 });
  private retryTimer: ReturnType<typeof setTimeout> | undefined;
  /** Fires `sub_refresh` ahead of the token's expiry. */
  private refreshTimer: ReturnType<typeof setTimeout> | undefined;
  private token: string | undefined;
  /** The next subscribe must fetch a token first (none yet, or the last one expired). */
  private needToken: boolean;
  private subscribedOnce = false;
  private waiters: Array<{ resolve: () => void; reject: (e: HeraldError) => void }> = [];
  private endError: HeraldError | undefined;

  private readonly host: SubscriptionHost;
  private readonly opts: SubscribeOptions<T>;
  /** The text of the last live publication in text form: the base of the next delta. */
  private deltaBase: { offset: number; text: string } | undefined;

  /** @internal Created by `Herald.subscribe`. */
  constructor(host: SubscriptionHost, channel: string, opts: SubscribeOptions<T>) {
    super();
    this.host = host;
    this.channel = channel;
    this.opts = opts;
    this.tracker = new StreamTracker(opts.since, opts.tagsFilter !== undefined);
    this.token = opts.token;
    this.needToken = opts.token === undefined && opts.getToken !== undefined;
    if (opts.onSubscribed) this.on('subscribed', opts.onSubscribed);
    if (opts.onPublication) this.on('publication', opts.onPublication);
    if (opts.onJoin) this.on('join', opts.onJoin);
    if (opts.onLeave) this.on('leave', opts.onLeave);
    if (opts.onRecoveryFailed) this.on('recoveryFailed', opts.onRecoveryFailed);
    if (opts.onUnsubscribed) this.on('unsubscribed', opts.onUnsubscribed);
    if (opts.onError) this.on('error', opts.onError);
  }

  get state(): SubscriptionState {
    return this._state;
  }

  /**
   * The last position delivered to the app. Store it to resume with `since` after a page reload.
   */
  get position(): StreamPosition | undefined {
    return this.tracker.position();
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

  /** Everyone subscribed, or one page of them (see `Herald.presence`). */
  presence(page?: PresencePageOptions): Promise<PresenceResult> {
    return this.host.presence(this.channel, page);
  }

  /** How many clients and distinct users are subscribed, without the member list. */
  presenceStats(): Promise<PresenceStatsResult> {
    return this.host.presenceStats(this.channel);
  }

  // ---------------------------------------------------------------------------------------------
  // For the client: what to send

  /** @internal The subscription token to send, if any. */
  get _token(): string | undefined {
    return this.token;
  }

  /** @internal Whether the subscription has its own token (so it cannot go in `connect.subs`). */
  get _hasOwnToken(): boolean {
    return this.token !== undefined || this.opts.getToken !== undefined;
  }

  /** @internal Sent one by one (with `data` or `delta`), never in `connect.subs`. */
  get _sentAlone(): boolean {
    return (
      this._hasOwnToken ||
      this.opts.data !== undefined ||
      this.opts.delta !== undefined ||
      this.opts.tagsFilter !== undefined
    );
  }

  /** @internal The `tagsFilter` option, for the subscribe command (`tf`). */
  get _tagsFilter(): TagFilter | undefined {
    return this.opts.tagsFilter;
  }

  /** @internal The `delta` option, for the subscribe command. */
  get _delta(): 'fossil' | undefined {
    return this.opts.delta;
  }

  /** @internal The `data` option, for the subscribe command. */
  get _data(): unknown {
    return this.opts.data;
  }

  /** @internal Whether a fresh token can be fetched. */
  get _canFetchToken(): boolean {
    return this.opts.getToken !== undefined;
  }

  /** @internal The next subscribe must fetch a token first. */
  get _needsToken(): boolean {
    return this.needToken;
  }

  /** @internal A subscribe, token fetch or resync unsubscribe is in flight. */
  get _busy(): boolean {
    return this.busy;
  }

  /** @internal Subscribing with nothing in flight and no retry scheduled: the client should send. */
  get _needsSubscribe(): boolean {
    return this._state === 'subscribing' && !this.busy && this.retryTimer === undefined;
  }

  // ---------------------------------------------------------------------------------------------
  // For the client: transitions. Each method is one named step of the subscription's life.

  /**
   * @internal → subscribing, with a subscribe in flight (alone or in `connect.subs`). Returns the
   * `since` to send: the position held, when the channel can be recovered.
   */
  _subscribeSent(): StreamPosition | undefined {
    const since = this.tracker.since();
    this._state = 'subscribing';
    this.sentSince = since;
    this.busy = true;
    return since;
  }

  /** @internal A resync's unsubscribe is in flight (the subscribe follows its reply). */
  _unsubscribeSent(): void {
    this.busy = true;
  }

  /** @internal The subscribe or unsubscribe in flight was answered, or failed. */
  _replyArrived(): void {
    this.busy = false;
  }

  /**
   * @internal → subscribed: a subscribe reply arrived (from `subscribe` or `connect.subs`).
   * Delivers recovered publications. Returns true when a hole was found and the client must resync
   * the channel.
   */
  _applySubscribe(result: SubscribeResult): boolean {
    const asked = this.sentSince;
    this.sentSince = undefined;
    // A new server-side subscription: its first live publication comes in full.
    this.deltaBase = undefined;
    const outcome = this.tracker.applySubscribe(result, asked);
    this._state = 'subscribed';
    const resubscribed = this.subscribedOnce;
    this.subscribedOnce = true;

    if (outcome.recoveryFailed && asked) {
      this.emit('recoveryFailed', {
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
    this.emit('subscribed', subscribed);
    for (const w of this.waiters.splice(0)) w.resolve();
    for (const pub of outcome.publications) {
      // A listener may have unsubscribed us half-way through the batch.
      if (this._state !== 'subscribed') return false;
      this.deliver(pub);
    }
    return outcome.gap;
  }

  /**
   * @internal A live publication: the only way the position moves between subscribe replies (all
   * offset and epoch checks are the tracker's). Returns true when it revealed a hole (resync
   * needed). Pushes that arrive while we are (re)subscribing are dropped: they belong to the
   * previous server-side subscription, and the subscribe reply's recovery or the live stream after
   * it covers them.
   */
  _applyPublication(pub: Publication): boolean {
    if (this._state !== 'subscribed') return false;
    if (pub.delta !== undefined) {
      const full = this.undelta(pub);
      if (full === undefined) return true;
      pub = full;
    } else {
      this.deltaBase = undefined;
    }
    const verdict = this.tracker.applyPublication(pub);
    if (verdict === 'gap') return true;
    if (verdict === 'deliver') {
      this.backoff.reset();
      this.deliver(pub);
    }
    return false;
  }

  /**
   * @internal The server left `from..to` out (backpressure policy): the position moves past them
   * and `skipped` says so. Returns true when it revealed a hole before them (resync needed).
   */
  _applySkip(from: number, to: number): boolean {
    if (this._state !== 'subscribed') return false;
    const verdict = this.tracker.applySkip(from, to);
    if (verdict === 'gap') return true;
    if (verdict === 'deliver') this.emit('skipped', { channel: this.channel, from, to });
    return false;
  }

  /** @internal */
  _applyPresence(kind: 'join' | 'leave', info: ClientInfo): void {
    if (this._state !== 'subscribed') return;
    this.emit(kind, { channel: this.channel, info });
  }

  /** @internal A `presence_count` push for this channel. */
  _applyPresenceCount(ctx: PresenceCountContext): void {
    if (this._state !== 'subscribed') return;
    this.emit('presenceCount', ctx);
  }

  /**
   * @internal → subscribing: the channel must be subscribed again from the position held (a hole,
   * or the server ended it with a resubscribe code). Live pushes are dropped until the reply.
   */
  _resubscribing(): void {
    if (this._state === 'subscribed') this._state = 'subscribing';
  }

  /**
   * @internal The connection is gone: nothing is in flight any more and a pending retry is moot.
   * The subscription survives (→ subscribing); the next `connect` restores it with `since`.
   */
  _connectionLost(): void {
    this.busy = false;
    this.cancelRetry();
    if (this._state === 'subscribed') this._state = 'subscribing';
  }

  /**
   * @internal The token expired, or will and could not be refreshed: the next subscribe fetches a
   * fresh one. Returns false (and changes nothing) when there is no `getToken` to fetch it with.
   */
  _invalidateToken(): boolean {
    if (!this._canFetchToken) return false;
    this.needToken = true;
    return true;
  }

  /**
   * @internal Ask the app for a token. Resolves to the token, or undefined when the app gave none
   * (the caller ends the subscription). Rejects when `getToken` threw.
   */
  async _fetchToken(): Promise<string | undefined> {
    const token = await this.opts.getToken?.(this.channel);
    if (!token) return undefined;
    this.token = token;
    this.needToken = false;
    return token;
  }

  /** @internal `_fetchToken` for the subscribe to come: the subscription is busy meanwhile. */
  async _fetchTokenToSubscribe(): Promise<string | undefined> {
    this.busy = true;
    try {
      return await this._fetchToken();
    } finally {
      this.busy = false;
    }
  }

  /** @internal Run `fn` after this subscription's backoff delay, unless a retry is already pending. */
  _retryLater(fn: () => void): void {
    if (this.retryTimer !== undefined) return;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = undefined;
      fn();
    }, this.backoff.next());
  }

  /**
   * @internal Call `refresh` ahead of the token's expiry (10 s early, or a quarter of a short
   * lifetime), replacing any earlier schedule. A fixed token cannot be refreshed: then nothing is
   * scheduled and the server ends the subscription with `unsub` 4004.
   */
  _scheduleTokenRefresh(expiresInSec: number, refresh: () => void): void {
    this.cancelRefresh();
    if (!this._canFetchToken) return;
    const ms = expiresInSec * 1000;
    const delay = Math.max(0, ms - Math.min(10_000, ms / 4));
    this.refreshTimer = setTimeout(() => {
      this.refreshTimer = undefined;
      refresh();
    }, delay);
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
    this.emit('error', { channel: this.channel, error });
  }

  /** @internal → unsubscribed, for good (error, server `unsub`, or `unsubscribe()`). */
  _end(code: number, reason: string, error?: HeraldError): void {
    if (this._state === 'unsubscribed') return;
    this._state = 'unsubscribed';
    this.cancelRetry();
    this.cancelRefresh();
    this.endError = error ?? new HeraldError(code, reason);
    if (error) this._reportError(error);
    for (const w of this.waiters.splice(0)) w.reject(this.endError);
    this.emit('unsubscribed', { channel: this.channel, code, reason });
  }

  // ---------------------------------------------------------------------------------------------

  /** The app's listener threw: that must not corrupt the position we track or stop a batch. */
  protected override onListenerError(_event: keyof SubscriptionEvents<T>, error: unknown): void {
    this.host.reportListenerError(this.channel, error);
  }

  /**
   * A publication in text form made whole: its data parsed, after applying its delta to the base
   * held. `undefined` when that cannot be done (no base for it, or the delta does not fit): the
   * channel must be resynced, which recovers the publication in full.
   */
  private undelta(pub: Publication): Publication | undefined {
    const base = this.deltaBase;
    this.deltaBase = undefined;
    if (typeof pub.data !== 'string') return undefined;
    let text = pub.data;
    if (pub.delta) {
      if (!base || base.offset + 1 !== pub.offset) return undefined;
      try {
        text = applyDeltaText(base.text, text);
      } catch (e) {
        if (e instanceof DeltaError) return undefined;
        throw e;
      }
    }
    let data: unknown;
    try {
      data = JSON.parse(text);
    } catch {
      return undefined;
    }
    this.deltaBase = { offset: pub.offset, text };
    const whole: Publication = { offset: pub.offset, data };
    if (pub.info) whole.info = pub.info;
    if (pub.tags) whole.tags = pub.tags;
    return whole;
  }

  private deliver(pub: Publication): void {
    const ctx: PublicationContext<T> = { channel: this.channel, offset: pub.offset, data: pub.data as T };
    if (pub.info) ctx.info = pub.info;
    if (pub.tags) ctx.tags = pub.tags;
    this.emit('publication', ctx);
  }

  private cancelRetry(): void {
    if (this.retryTimer !== undefined) clearTimeout(this.retryTimer);
    this.retryTimer = undefined;
  }

  private cancelRefresh(): void {
    if (this.refreshTimer !== undefined) clearTimeout(this.refreshTimer);
    this.refreshTimer = undefined;
  }
}
