// The Herald client: connection state machine, command round trips, reconnect, token refresh, and
// routing of pushes to subscriptions.
//
// States: disconnected → connecting → connected, and back to connecting whenever the connection is
// lost for a reason that allows a reconnect (close code 4000–4499, network errors, missing pings).
// Only `disconnect()`, a 4500–4999 close or a rejected `connect` lead to `disconnected`.
//
// Everything that reacts to incoming frames runs synchronously, in frame order: a `connect` reply
// and the publications batched behind it in the same frame must be applied in exactly that order,
// or recovery could deliver out of order. That is why replies go to plain callbacks, not promises.

import { Backoff } from './backoff.js';
import { ClientCode, ErrorCode, isTemporaryError, shouldReconnect, shouldResubscribe, UnsubCode } from './codes.js';
import {
  PONG,
  decodeFrame,
  encodeCommand,
  type ConnectResult,
  type HistoryResult,
  type PresencePageOptions,
  type PresenceResult,
  type PresenceStatsResult,
  type Publication,
  type PublishResult,
  type RefreshResult,
  type ReplyErrorBody,
  type RpcResult,
  type ServerMessage,
  type StreamPosition,
  type SubscribeResult,
} from './codec.js';
import { EmulatedWebSocket } from './emulation.js';
import { Emitter } from './emitter.js';
import { ConnectionError, HeraldError, ReplyError, TimeoutError, UsageError } from './errors.js';
import type { ChannelEvents, PublicationContext } from './events.js';
import { Subscription, type SubscribeOptions, type SubscriptionHost } from './subscription.js';
import { Transport, resolveWebSocket, type WebSocketConstructor } from './transport.js';

export type ConnectionState = 'disconnected' | 'connecting' | 'connected';

export interface HeraldOptions {
  /** Connection token (JWT). */
  token?: string;
  /**
   * Called for a token on the first connect, before the token expires (the SDK then sends
   * `refresh`), and after the server closed with 4004 (token expired). Return '' or null to refuse.
   */
  getToken?: () => string | null | undefined | Promise<string | null | undefined>;
  /**
   * Sent as `connect.data` on every connect: the application's connect proxy receives it (with the
   * cookies and headers the server is configured to forward). A function is called per connect.
   */
  data?: unknown | (() => unknown);
  /** Client name and version, sent in `connect` (shown in server logs). */
  name?: string;
  version?: string;
  /** WebSocket implementation; defaults to the global one (browser, Node 22+) or `ws` in Node. */
  WebSocket?: WebSocketConstructor;
  /** WebSocket subprotocol(s) to request, e.g. 'herald.v1.json'. Default: none. */
  protocols?: string | string[];
  /**
   * How to reach the server. 'auto': WebSocket, and while a WebSocket has never opened (a proxy
   * that blocks it), WebSocket emulation over HTTP (SSE down, POST up) for the next attempt; the
   * two alternate until one opens. Once a WebSocket has opened, later reconnects stay on it.
   * 'websocket' or 'emulation' use only that one. Delivery guarantees are the same on both.
   * Default: 'auto', or 'websocket' when a `WebSocket` implementation is passed.
   */
  transport?: 'auto' | 'websocket' | 'emulation';
  /** Reconnect backoff window bounds, ms. Defaults 500 and 20000. */
  minReconnectDelayMs?: number;
  maxReconnectDelayMs?: number;
  /** Timeout for `connect` and every command, ms. Default 10000. */
  timeoutMs?: number;
  /** Extra time past `ping_interval` before a silent connection counts as dead, ms. Default 10000. */
  pingGraceMs?: number;
  /** Randomness for jitter; injectable for tests. */
  random?: () => number;
}

export interface ConnectedContext {
  client: string;
  node: string;
  /** Seconds between server pings. */
  pingInterval: number;
  /** Seconds until the connection token expires, when it does. */
  expiresIn?: number;
  /** What carries the connection: a WebSocket, or WebSocket emulation over HTTP. */
  transport: 'websocket' | 'emulation';
  /** What the application's connect proxy returned for the client, when it returned something. */
  data?: unknown;
}

export interface StateContext {
  code: number;
  reason: string;
}

export type ErrorType = 'transport' | 'connect' | 'token' | 'refresh' | 'subscribe' | 'protocol' | 'listener';

export interface ErrorContext {
  type: ErrorType;
  error: HeraldError;
  channel?: string;
}

/** Typed events of the client; `publication`, `join`, `leave`, `unsubscribed` as for a `Subscription`. */
export interface HeraldEvents extends ChannelEvents {
  /** Every state change. */
  state: { oldState: ConnectionState; newState: ConnectionState };
  /** The client is (re)connecting; `code`/`reason` say why (a close code or a ClientCode). */
  connecting: StateContext;
  connected: ConnectedContext;
  /** The client stopped and will not reconnect on its own. */
  disconnected: StateContext;
  error: ErrorContext;
  /**
   * Server-side subscriptions: channels the server subscribed this connection to (token `channels`
   * claim, the connect proxy's `channels`, the personal channel, or the server API). `subscribed` /
   * `unsubscribed` mark their lifetime; their publications, joins and leaves arrive as client
   * events, in offset order without duplicates. After a reconnect the client asks for them again
   * with `since`: the publications missed meanwhile arrive as `publication` events before live
   * ones (`recovered: true`), or `recovered: false` says some were lost and the app reloads.
   */
  subscribed: ServerSubscribedContext;
}

/** The `subscribed` event: a server-side subscription took effect. */
export interface ServerSubscribedContext {
  channel: string;
  epoch: string;
  offset: number;
  recoverable: boolean;
  /** After a reconnect: whether every publication missed meanwhile was delivered. */
  recovered?: boolean;
}

type ReplyCallback = (err: HeraldError | undefined, result: unknown) => void;

interface Pending {
  cb: ReplyCallback;
  timer: ReturnType<typeof setTimeout>;
}

interface Waiter {
  run: () => void;
  fail: (e: HeraldError) => void;
  timer: ReturnType<typeof setTimeout>;
}

type Disconnect = Extract<ServerMessage, { type: 'disconnect' }>;

// Names: at most 255 bytes of [A-Za-z0-9_:.@=/#,-] (docs/protocol.md). All allowed characters are ASCII,
// so length in characters equals length in bytes.
const CHANNEL_RE = /^[A-Za-z0-9_:.@=/#,-]{1,255}$/;

export class Herald extends Emitter<HeraldEvents> {
  readonly url: string;
  private readonly opts: HeraldOptions;
  private readonly backoff: Backoff;
  private readonly timeoutMs: number;
  private readonly pingGraceMs: number;

  private _state: ConnectionState = 'disconnected';
  /** With `transport: 'auto'`: whether attempts use WebSocket emulation (a WebSocket did not open). */
  private emulating = false;
  /** Whether a WebSocket ever opened: then WebSocket works here and 'auto' no longer falls back. */
  private webSocketOpened = false;
  private transport: Transport | undefined;
  private readonly subs = new Map<string, Subscription<never>>();
  /** Channels the server subscribed this connection to (see the `subscribed` event). */
  private readonly serverSubs = new Set<string>();
  /**
   * Where each server-side subscription stands, kept across reconnects so that the next `connect`
   * asks for them with `since`. Forgotten when the server ends one.
   */
  private readonly serverPositions = new Map<string, StreamPosition>();
  private readonly pending = new Map<number, Pending>();
  private waiters: Waiter[] = [];
  private nextId = 1;

  private token: string | undefined;
  private needToken: boolean;
  /** Bumped whenever a connection attempt starts or is abandoned; stale async steps compare it. */
  private attemptSeq = 0;
  private disconnectPush: Disconnect | undefined;
  private _clientId: string | undefined;

  private pingIntervalMs = 0;
  private lastSeen = 0;
  private pingTimer: ReturnType<typeof setTimeout> | undefined;
  private connectTimer: ReturnType<typeof setTimeout> | undefined;
  private reconnectTimer: ReturnType<typeof setTimeout> | undefined;
  private refreshTimer: ReturnType<typeof setTimeout> | undefined;
  private removeOnline: (() => void) | undefined;

  private readonly host: SubscriptionHost;

  constructor(url: string, opts: HeraldOptions = {}) {
    super();
    this.url = url;
    this.opts = opts;
    this.token = opts.token;
    this.needToken = opts.token === undefined;
    this.timeoutMs = opts.timeoutMs ?? 10_000;
    this.pingGraceMs = opts.pingGraceMs ?? 10_000;
    this.backoff = new Backoff({
      minDelayMs: opts.minReconnectDelayMs,
      maxDelayMs: opts.maxReconnectDelayMs,
      random: opts.random,
    });
    this.host = {
      removeSubscription: (sub, code, reason) => this.removeSubscription(sub, code, reason),
      publish: (ch, data) => this.publish(ch, data),
      history: (ch, o) => this.history(ch, o),
      presence: (ch, o) => this.presence(ch, o),
      presenceStats: (ch) => this.presenceStats(ch),
      reportListenerError: (channel, e) => this.reportError('listener', toHeraldError(e), channel),
    };
  }

  get state(): ConnectionState {
    return this._state;
  }

  /** The server's id for the current connection, once connected. */
  get clientId(): string | undefined {
    return this._clientId;
  }

  // ---------------------------------------------------------------------------------------------
  // Public API

  /** Start connecting (and keep reconnecting) until `disconnect()`. Idempotent. */
  connect(): void {
    if (this._state !== 'disconnected') return;
    this.backoff.reset();
    this.setState('connecting');
    this.emit('connecting', { code: ClientCode.ConnectCalled, reason: 'connect called' });
    this.watchOnline();
    void this.startAttempt();
  }

  /** Close the connection and stop reconnecting. Subscriptions stay registered: a later `connect()`
   * restores and recovers them. */
  disconnect(): void {
    if (this._state === 'disconnected') return;
    this.stop(ClientCode.DisconnectCalled, 'disconnect called');
  }

  /** Resolves when connected; rejects if the client ends up disconnected first. */
  ready(): Promise<void> {
    if (this._state === 'connected') return Promise.resolve();
    if (this._state === 'disconnected') {
      return Promise.reject(new ConnectionError(ClientCode.NotConnected, 'client is disconnected'));
    }
    return new Promise((resolve, reject) => {
      const offC = this.once('connected', () => {
        offD();
        resolve();
      });
      const offD = this.once('disconnected', (ctx) => {
        offC();
        reject(new ConnectionError(ctx.code, ctx.reason));
      });
    });
  }

  /**
   * Subscribe to a channel. Returns at once; the subscribe is sent when connected (in the `connect`
   * command itself when connecting) and restored with recovery after every reconnect.
   */
  subscribe<T = unknown>(channel: string, opts: SubscribeOptions<T> = {}): Subscription<T> {
    if (typeof channel !== 'string' || !CHANNEL_RE.test(channel)) {
      throw new UsageError(ErrorCode.BadRequest, `invalid channel name: ${JSON.stringify(channel)}`);
    }
    if (this.subs.has(channel)) {
      throw new UsageError(ClientCode.AlreadySubscribed, `already subscribed to ${channel}`);
    }
    const sub = new Subscription<T>(this.host, channel, opts);
    this.subs.set(channel, sub as unknown as Subscription<never>);
    if (this._state === 'connected') this.sendSubscribe(sub as unknown as Subscription<never>);
    return sub;
  }

  /** The active subscription to a channel, if any. */
  getSubscription<T = unknown>(channel: string): Subscription<T> | undefined {
    return this.subs.get(channel) as unknown as Subscription<T> | undefined;
  }

  /** All active subscriptions. */
  subscriptions(): Subscription[] {
    return [...this.subs.values()] as unknown as Subscription[];
  }

  /** Publish to a channel (where the namespace allows client publishing). */
  publish(channel: string, data: unknown): Promise<PublishResult> {
    return this.call<PublishResult>('publish', { channel, data });
  }

  /** Read a channel's history. */
  history(channel: string, opts: { since?: StreamPosition; limit?: number } = {}): Promise<HistoryResult> {
    const params: Record<string, unknown> = { channel };
    if (opts.since) params.since = opts.since;
    if (opts.limit !== undefined) params.limit = opts.limit;
    return this.call<HistoryResult>('history', params);
  }

  /**
   * Call the application's backend through the server's RPC proxy: `data` goes to it with
   * `method`, and its answer's `data` is what this resolves to. Rejects with a `ReplyError`: 108
   * when the server has no RPC proxy, 112 (temporary) when the backend is unreachable or slow,
   * 1000–1999 for the backend's own errors. Waits while connecting, like `call`.
   */
  async rpc<R = unknown>(method: string, data?: unknown): Promise<R | undefined> {
    const params: Record<string, unknown> = { method };
    if (data !== undefined) params.data = data;
    const r = await this.call<RpcResult<R>>('rpc', params);
    return r.data;
  }

  /**
   * Who is subscribed to a channel now: everyone, or with `page` up to `page.limit` clients after
   * `page.cursor` (the previous page's `cursor`, absent on the last page).
   */
  presence(channel: string, page?: PresencePageOptions): Promise<PresenceResult> {
    const params: Record<string, unknown> = { channel };
    if (page) {
      params.limit = page.limit;
      if (page.cursor !== undefined) params.cursor = page.cursor;
    }
    return this.call<PresenceResult>('presence', params);
  }

  /** How many clients and distinct users are subscribed to a channel, without the member list. */
  presenceStats(channel: string): Promise<PresenceStatsResult> {
    return this.call<PresenceStatsResult>('presence_stats', { channel });
  }

  /**
   * Send any command and get its result. Waits while the client is connecting; fails at once when
   * it is disconnected.
   */
  call<R = unknown>(method: string, params: object): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      const run = (): void => this.request(method, params, (err, result) => (err ? reject(err) : resolve(result as R)));
      if (this._state === 'connected') {
        run();
      } else if (this._state === 'connecting') {
        const waiter: Waiter = {
          run,
          fail: reject,
          timer: setTimeout(() => {
            this.waiters = this.waiters.filter((w) => w !== waiter);
            reject(new TimeoutError(`timed out waiting for a connection to send ${method}`));
          }, this.timeoutMs),
        };
        this.waiters.push(waiter);
      } else {
        reject(new ConnectionError(ClientCode.NotConnected, 'client is disconnected; call connect() first'));
      }
    });
  }

  // ---------------------------------------------------------------------------------------------
  // Connection attempts

  private async startAttempt(): Promise<void> {
    this.clearTimer('reconnectTimer');
    const attempt = ++this.attemptSeq;

    if (this.opts.getToken && (this.needToken || this.token === undefined)) {
      let token: string | null | undefined;
      try {
        token = await this.opts.getToken();
      } catch (e) {
        if (attempt !== this.attemptSeq || this._state !== 'connecting') return;
        this.reportError('token', new HeraldError(ClientCode.NoToken, `getToken failed: ${errMessage(e)}`));
        this.scheduleReconnect();
        return;
      }
      if (attempt !== this.attemptSeq || this._state !== 'connecting') return;
      if (!token) {
        this.stop(ClientCode.NoToken, 'getToken returned no token');
        return;
      }
      this.token = token;
      this.needToken = false;
    }

    let transport: Transport;
    let opened = false;
    const mode = this.opts.transport ?? (this.opts.WebSocket ? 'websocket' : 'auto');
    const emulating = mode === 'emulation' || (mode === 'auto' && this.emulating);
    try {
      const impl = emulating ? EmulatedWebSocket : resolveWebSocket(this.opts.WebSocket);
      transport = new Transport(this.url, impl, emulating ? undefined : this.opts.protocols, {
        onOpen: () => {
          opened = true;
          if (!emulating) this.webSocketOpened = true;
          if (this.transport === transport) this.sendConnect();
        },
        onText: (text) => {
          if (this.transport === transport) this.onFrame(text);
        },
        onClose: (code, reason) => {
          if (this.transport !== transport) return;
          this.transport = undefined;
          // Never opened: perhaps this way is blocked, so the next attempt tries the other one,
          // unless a WebSocket has worked before (then the server or the network is down).
          if (!opened && mode === 'auto') this.emulating = !emulating && !this.webSocketOpened;
          this.connectionLost(code, reason);
        },
        onError: () => {
          // A `close` always follows; the error event itself carries nothing useful in browsers.
        },
      });
    } catch (e) {
      // No WebSocket in this runtime, or a URL it refuses: in 'auto', emulation is next.
      if (mode === 'auto') this.emulating = !emulating && !this.webSocketOpened;
      this.reportError('transport', new ConnectionError(ClientCode.TransportClosed, errMessage(e)));
      this.scheduleReconnect();
      return;
    }
    this.transport = transport;
    this.disconnectPush = undefined;
    this.connectTimer = setTimeout(() => {
      this.connectTimer = undefined;
      this.abort(ClientCode.ConnectTimeout, 'connect timed out');
    }, this.timeoutMs);
  }

  private sendConnect(): void {
    // Restore every subscription in this one round trip; each carries `since` when it can recover.
    const subs: Record<string, { since?: StreamPosition }> = {};
    const included: Subscription<never>[] = [];
    for (const sub of this.subs.values()) {
      // Subscriptions with their own token or data cannot go in `connect.subs`; they are sent one
      // by one.
      if (sub._sentAlone) continue;
      const since = sub._subscribeSent();
      subs[sub.channel] = since ? { since } : {};
      included.push(sub);
    }
    // Server-side subscriptions of the last connection: named with `since`, the server recovers
    // what was missed (it subscribes them again itself when it still grants them).
    for (const [channel, since] of this.serverPositions) {
      if (!(channel in subs)) subs[channel] = { since };
    }
    const params: Record<string, unknown> = {};
    if (this.token !== undefined) params.token = this.token;
    if (this.opts.name !== undefined) params.name = this.opts.name;
    if (this.opts.version !== undefined) params.version = this.opts.version;
    const data = typeof this.opts.data === 'function' ? (this.opts.data as () => unknown)() : this.opts.data;
    if (data !== undefined) params.data = data;
    if (Object.keys(subs).length > 0) params.subs = subs;
    this.request('connect', params, (err, result) => this.onConnectReply(err, result as ConnectResult, included));
  }

  private onConnectReply(err: HeraldError | undefined, r: ConnectResult, included: Subscription<never>[]): void {
    this.clearTimer('connectTimer');
    for (const sub of included) sub._replyArrived();
    if (err) {
      if (err instanceof ReplyError) {
        this.reportError('connect', err);
        if (err.code === ErrorCode.TokenExpired && this.opts.getToken) {
          this.needToken = true;
          this.abort(err.code, err.message);
        } else if (isTemporaryError(err.code)) {
          this.abort(err.code, err.message);
        } else {
          this.stop(err.code, err.message);
        }
      } else if (err instanceof TimeoutError) {
        this.abort(ClientCode.ConnectTimeout, 'connect timed out');
      }
      // A ConnectionError means the socket already closed; connectionLost() handled it.
      return;
    }

    this.backoff.reset();
    this._clientId = r.client;
    this.pingIntervalMs = typeof r.ping_interval === 'number' && r.ping_interval > 0 ? r.ping_interval * 1000 : 0;
    this.lastSeen = Date.now();
    this.armPingWatch();
    if (typeof r.expires_in === 'number' && r.expires_in > 0) this.scheduleRefresh(r.expires_in);
    this.setState('connected');
    const ctx: ConnectedContext = {
      client: r.client,
      node: r.node,
      pingInterval: r.ping_interval,
      transport: this.transport?.emulated ? 'emulation' : 'websocket',
    };
    if (r.expires_in !== undefined) ctx.expiresIn = r.expires_in;
    if (r.data !== undefined) ctx.data = r.data;
    this.emit('connected', ctx);
    if (this._state !== 'connected') return; // a listener disconnected us

    const results = r.subs ?? {};
    const requested = new Set(included.map((s) => s.channel));
    for (const channel of this.serverPositions.keys()) {
      const res = results[channel];
      // No longer granted (or refused as a client subscription): forget it.
      if (res === undefined || 'error' in res) this.serverPositions.delete(channel);
    }
    for (const [channel, res] of Object.entries(results)) {
      if (requested.has(channel) || 'error' in res) continue;
      this.serverSubs.add(channel);
      const event: ServerSubscribedContext = {
        channel,
        epoch: res.epoch,
        offset: res.offset,
        recoverable: res.recoverable !== false,
      };
      if (res.recovered !== undefined) event.recovered = res.recovered;
      // Recovered publications continue from the position held; otherwise start from the reply's.
      const held = this.serverPositions.get(channel);
      if (!res.recovered || !held || held.epoch !== res.epoch) {
        this.serverPositions.set(channel, { epoch: res.epoch, offset: res.offset });
      }
      this.emit('subscribed', event);
      if (this._state !== 'connected') return;
      if (res.recovered) {
        for (const pub of res.publications ?? []) this.serverPublication(channel, pub);
        const pos = this.serverPositions.get(channel);
        if (pos && pos.offset < res.offset) pos.offset = res.offset;
      }
    }
    if (this._state !== 'connected') return;
    for (const sub of included) {
      if (this.subs.get(sub.channel) !== sub || this._state !== 'connected') continue;
      const res = results[sub.channel];
      if (res === undefined) {
        // The server did not answer for this channel in `connect`: ask again explicitly.
        this.sendSubscribe(sub);
      } else if ('error' in res) {
        this.onSubscribeError(sub, new ReplyError(res.error.code, res.error.message));
      } else {
        this.applySubscribe(sub, res);
      }
    }
    // Subscriptions created while `connect` was in flight, or with their own token.
    for (const sub of this.subs.values()) {
      if (this._state !== 'connected') break;
      if (sub._needsSubscribe) this.sendSubscribe(sub);
    }
    for (const w of this.waiters.splice(0)) {
      clearTimeout(w.timer);
      w.run();
    }
  }

  private scheduleReconnect(afterMs?: number): void {
    this.clearTimer('reconnectTimer');
    const delay = this.backoff.next(afterMs);
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = undefined;
      if (this._state === 'connecting') void this.startAttempt();
    }, delay);
  }

  /** We gave up on the current socket ourselves (no ping, timeout, retryable connect error). */
  private abort(code: number, reason: string): void {
    const t = this.transport;
    if (!t) return;
    this.transport = undefined;
    t.close(true);
    this.connectionLost(code, reason);
  }

  /** The socket is gone. Decide between reconnecting and stopping. */
  private connectionLost(closeCode: number, closeReason: string): void {
    const push = this.disconnectPush;
    this.disconnectPush = undefined;
    // The close frame and the `disconnect` push carry the same code; a proxy may have eaten the
    // close frame's code (1006), so the push wins when the close code is not a Herald one.
    const isHerald = closeCode >= 4000 && closeCode <= 4999;
    const code = isHerald ? closeCode : (push?.code ?? closeCode);
    const reason = push?.reason || closeReason || (isHerald ? '' : 'transport closed');
    this.teardown(code, reason);
    if (this._state === 'disconnected') return;

    if (code === 4004) this.needToken = true;
    const reconnect = (push ? push.reconnect : true) && shouldReconnect(code);
    if (!reconnect) {
      this.stop(code, reason);
      return;
    }
    if (this._state !== 'connecting') {
      this.setState('connecting');
      this.emit('connecting', { code, reason });
    }
    this.scheduleReconnect(push?.afterMs);
  }

  /** Final stop: close everything, fail what waits, emit `disconnected`. */
  private stop(code: number, reason: string): void {
    this.attemptSeq++;
    const t = this.transport;
    this.transport = undefined;
    t?.close();
    this.teardown(code, reason);
    this.clearTimer('reconnectTimer');
    const stopped = new ConnectionError(ClientCode.NotConnected, `client disconnected: ${reason}`, code);
    for (const w of this.waiters.splice(0)) {
      clearTimeout(w.timer);
      w.fail(stopped);
    }
    for (const sub of this.subs.values()) sub._clientStopped(stopped);
    this.removeOnline?.();
    this.removeOnline = undefined;
    if (this._state === 'disconnected') return;
    this.setState('disconnected');
    this.emit('disconnected', { code, reason });
  }

  /** Forget the dead connection: timers, in-flight commands, server-side subscription state. */
  private teardown(code: number, reason: string): void {
    this.clearTimer('connectTimer');
    this.clearTimer('pingTimer');
    this.clearTimer('refreshTimer');
    this._clientId = undefined;
    this.serverSubs.clear();
    const pending = [...this.pending.values()];
    this.pending.clear();
    for (const sub of this.subs.values()) sub._connectionLost();
    for (const p of pending) {
      clearTimeout(p.timer);
      p.cb(new ConnectionError(ClientCode.ConnectionLost, `connection lost: ${reason}`, code), undefined);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Incoming frames

  private onFrame(text: string): void {
    this.lastSeen = Date.now();
    const transport = this.transport;
    for (const msg of decodeFrame(text)) {
      // A message may have ended this connection (a listener called disconnect(), or even
      // disconnect() and connect()); the rest of the frame belongs to a connection we no longer have.
      if (this.transport !== transport) return;
      this.onMessage(msg);
    }
  }

  private onMessage(msg: ServerMessage): void {
    switch (msg.type) {
      case 'reply': {
        const p = this.pending.get(msg.id);
        if (!p) return; // late reply to a command that already timed out
        this.pending.delete(msg.id);
        clearTimeout(p.timer);
        if (msg.error) p.cb(new ReplyError(msg.error.code, msg.error.message), undefined);
        else p.cb(undefined, msg.result ?? {});
        return;
      }
      case 'ping':
        this.transport?.send(PONG);
        return;
      case 'pub': {
        const sub = this.subs.get(msg.channel);
        if (!sub) {
          // Neither ours nor the server's: a late one from a channel we just unsubscribed.
          if (!this.serverSubs.has(msg.channel)) return;
          this.serverPublication(msg.channel, msg.pub);
          return;
        }
        if (sub._applyPublication(msg.pub)) this.resync(sub, true);
        return;
      }
      case 'skip': {
        const sub = this.subs.get(msg.channel);
        if (sub) {
          if (sub._applySkip(msg.from, msg.to)) this.resync(sub, true);
          return;
        }
        const pos = this.serverPositions.get(msg.channel);
        if (!this.serverSubs.has(msg.channel) || (pos && msg.to <= pos.offset)) return;
        if (pos) pos.offset = msg.to;
        this.emit('skipped', { channel: msg.channel, from: msg.from, to: msg.to });
        return;
      }
      case 'join':
      case 'leave': {
        const sub = this.subs.get(msg.channel);
        if (sub) sub._applyPresence(msg.type, msg.info);
        else if (this.serverSubs.has(msg.channel)) this.emit(msg.type, { channel: msg.channel, info: msg.info });
        return;
      }
      case 'presence_batch': {
        // The same per-member events as single join/leave pushes, in the batch's order.
        const sub = this.subs.get(msg.channel);
        for (const change of msg.changes) {
          if (sub) sub._applyPresence(change.kind, change.info);
          else if (this.serverSubs.has(msg.channel))
            this.emit(change.kind, { channel: msg.channel, info: change.info });
        }
        return;
      }
      case 'presence_count': {
        const ctx = { channel: msg.channel, numClients: msg.numClients, numUsers: msg.numUsers };
        const sub = this.subs.get(msg.channel);
        if (sub) sub._applyPresenceCount(ctx);
        else if (this.serverSubs.has(msg.channel)) this.emit('presenceCount', ctx);
        return;
      }
      case 'subscribed': {
        if (this.subs.has(msg.channel)) return; // ours already; the server would not do this
        this.serverSubs.add(msg.channel);
        const r = msg.result;
        const epoch = String(r.epoch ?? '');
        const offset = typeof r.offset === 'number' ? r.offset : 0;
        this.serverPositions.set(msg.channel, { epoch, offset });
        this.emit('subscribed', { channel: msg.channel, epoch, offset, recoverable: r.recoverable !== false });
        return;
      }
      case 'unsub': {
        const sub = this.subs.get(msg.channel);
        if (!sub) {
          this.serverPositions.delete(msg.channel);
          if (this.serverSubs.delete(msg.channel)) {
            this.emit('unsubscribed', { channel: msg.channel, code: msg.code, reason: msg.reason });
          }
          return;
        }
        if (shouldResubscribe(msg.code)) {
          // 4004: the subscription token expired; the resubscribe needs a fresh one.
          if (msg.code === UnsubCode.TokenExpired) sub._invalidateToken();
          this.resync(sub, false);
        } else {
          this.subs.delete(sub.channel);
          sub._end(msg.code, msg.reason);
        }
        return;
      }
      case 'disconnect':
        // Remember why; the close frame that follows ends the connection.
        this.disconnectPush = msg;
        return;
      case 'invalid':
        this.reportError('protocol', new HeraldError(ClientCode.BadFrame, `bad message from server: ${msg.reason}`));
        return;
      case 'unknown':
        return; // newer servers may send pushes we do not know; ignoring them is the contract
    }
  }

  /** A publication of a server-side subscription: once each, in offset order. */
  private serverPublication(channel: string, pub: Publication): void {
    const pos = this.serverPositions.get(channel);
    if (pos && pub.offset > 0) {
      if (pub.offset <= pos.offset) return; // already delivered (recovered, then live again)
      pos.offset = pub.offset;
    }
    const ctx: PublicationContext = { channel, offset: pub.offset, data: pub.data };
    if (pub.info) ctx.info = pub.info;
    if (pub.tags) ctx.tags = pub.tags;
    this.emit('publication', ctx);
  }

  // ---------------------------------------------------------------------------------------------
  // Subscriptions

  private sendSubscribe(sub: Subscription<never>): void {
    if (this._state !== 'connected' || sub._busy || sub.state === 'unsubscribed') return;
    if (sub._needsToken) {
      this.fetchSubscriptionToken(sub);
      return;
    }
    const since = sub._subscribeSent();
    const params: Record<string, unknown> = { channel: sub.channel };
    if (since) params.since = since;
    if (sub._token !== undefined) params.token = sub._token;
    if (sub._data !== undefined) params.data = sub._data;
    if (sub._delta !== undefined) params.delta = sub._delta;
    if (sub._tagsFilter !== undefined) params.tf = sub._tagsFilter;
    this.request('subscribe', params, (err, result) => {
      sub._replyArrived();
      if (this.subs.get(sub.channel) !== sub) return; // unsubscribed meanwhile
      if (err) this.onSubscribeError(sub, err);
      else this.applySubscribe(sub, result as SubscribeResult);
    });
  }

  private applySubscribe(sub: Subscription<never>, result: SubscribeResult): void {
    if (typeof result.expires_in === 'number') this.scheduleSubRefresh(sub, result.expires_in);
    if (sub._applySubscribe(result) && this.subs.get(sub.channel) === sub) this.resync(sub, true);
  }

  /** Get a subscription token from the app, then subscribe. */
  private fetchSubscriptionToken(sub: Subscription<never>): void {
    sub._fetchTokenToSubscribe().then(
      (token) => {
        if (this.subs.get(sub.channel) !== sub) return;
        if (token === undefined) {
          this.subs.delete(sub.channel);
          sub._end(ClientCode.NoToken, 'getToken returned no token');
          return;
        }
        this.sendSubscribe(sub);
      },
      (e: unknown) => {
        if (this.subs.get(sub.channel) !== sub) return;
        const err = new HeraldError(ClientCode.NoToken, `getToken failed: ${errMessage(e)}`);
        sub._reportError(err);
        this.reportError('subscribe', err, sub.channel);
        this.retrySubscribe(sub, () => this.sendSubscribe(sub));
      },
    );
  }

  /** Send `sub_refresh` ahead of the subscription token's expiry, as for the connection token. */
  private scheduleSubRefresh(sub: Subscription<never>, expiresInSec: number): void {
    sub._scheduleTokenRefresh(expiresInSec, () => {
      if (this.subs.get(sub.channel) !== sub || sub.state !== 'subscribed') return;
      sub._fetchToken().then(
        (token) => {
          if (!token || this.subs.get(sub.channel) !== sub || sub.state !== 'subscribed') return;
          this.request('sub_refresh', { channel: sub.channel, token }, (err, result) => {
            if (err) {
              // It will expire: the server sends unsub 4004 and the resubscribe fetches a token.
              if (!(err instanceof ConnectionError)) this.reportError('refresh', err, sub.channel);
              sub._invalidateToken();
              return;
            }
            const r = result as { expires_in?: number };
            if (typeof r.expires_in === 'number') this.scheduleSubRefresh(sub, r.expires_in);
          });
        },
        (e: unknown) => {
          sub._invalidateToken();
          this.reportError(
            'refresh',
            new HeraldError(ClientCode.NoToken, `getToken failed: ${errMessage(e)}`),
            sub.channel,
          );
        },
      );
    });
  }

  private onSubscribeError(sub: Subscription<never>, err: HeraldError): void {
    if (err instanceof ConnectionError) return; // the next connect restores it
    if (err instanceof ReplyError && err.code === ErrorCode.TokenExpired && sub._invalidateToken()) {
      this.retrySubscribe(sub, () => this.sendSubscribe(sub));
      return;
    }
    if (err instanceof TimeoutError || (err instanceof ReplyError && err.temporary)) {
      sub._reportError(err);
      this.reportError('subscribe', err, sub.channel);
      this.retrySubscribe(sub, () => this.sendSubscribe(sub));
      return;
    }
    this.subs.delete(sub.channel);
    this.reportError('subscribe', err, sub.channel);
    sub._end(err.code, err.message, err);
  }

  /**
   * Re-establish a channel from the position we hold: after a hole in the offsets, or when the
   * server ended the subscription with a resubscribe code. If the server still has us subscribed,
   * unsubscribe first (and wait for it) so the new subscribe cannot meet "already subscribed".
   */
  private resync(sub: Subscription<never>, serverSubscribed: boolean): void {
    sub._resubscribing();
    if (this._state !== 'connected' || sub._busy) return;
    this.retrySubscribe(sub, () => {
      if (!serverSubscribed) {
        this.sendSubscribe(sub);
        return;
      }
      sub._unsubscribeSent();
      this.request('unsubscribe', { channel: sub.channel }, (err) => {
        sub._replyArrived();
        if (this.subs.get(sub.channel) !== sub || err instanceof ConnectionError) return;
        this.sendSubscribe(sub);
      });
    });
  }

  /** Run `fn` after the subscription's own backoff delay (first retry is quick). */
  private retrySubscribe(sub: Subscription<never>, fn: () => void): void {
    sub._retryLater(() => {
      if (this.subs.get(sub.channel) === sub && this._state === 'connected') fn();
    });
  }

  private removeSubscription(sub: Subscription<never>, code: number, reason: string): void {
    if (this.subs.get(sub.channel) !== sub) return;
    this.subs.delete(sub.channel);
    const serverKnows = this._state === 'connected' && (sub.state === 'subscribed' || sub._busy);
    sub._end(code, reason);
    if (serverKnows) {
      // Fire and forget: if it fails the connection is gone, and with it the server-side state.
      this.request('unsubscribe', { channel: sub.channel }, () => {});
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Commands, pings, token refresh

  private request(method: string, params: object, cb: ReplyCallback): void {
    const t = this.transport;
    const id = this.nextId++;
    if (!t?.send(encodeCommand(id, method, params))) {
      cb(new ConnectionError(ClientCode.ConnectionLost, 'not connected'), undefined);
      return;
    }
    const timer = setTimeout(() => {
      if (this.pending.delete(id)) cb(new TimeoutError(`no reply to ${method} within ${this.timeoutMs} ms`), undefined);
    }, this.timeoutMs);
    this.pending.set(id, { cb, timer });
  }

  /**
   * Dead-connection detection: the server pings every `ping_interval`; anything received counts as
   * a sign of life. Rather than re-arming a timer per frame, one timer checks `lastSeen` and
   * re-arms itself for the remaining time.
   */
  private armPingWatch(): void {
    this.clearTimer('pingTimer');
    if (this.pingIntervalMs <= 0) return;
    const limit = this.pingIntervalMs + this.pingGraceMs;
    const wait = Math.max(0, this.lastSeen + limit - Date.now());
    this.pingTimer = setTimeout(() => {
      this.pingTimer = undefined;
      if (!this.transport) return;
      if (Date.now() - this.lastSeen >= limit) this.abort(ClientCode.NoPing, 'no ping from server');
      else this.armPingWatch();
    }, wait);
  }

  private scheduleRefresh(expiresInSec: number): void {
    this.clearTimer('refreshTimer');
    if (!this.opts.getToken) return; // a fixed token cannot be refreshed; the server will close 4004
    const ms = expiresInSec * 1000;
    // Refresh ahead of expiry: 10 s early, or a quarter of the lifetime for short-lived tokens.
    const delay = Math.max(0, ms - Math.min(10_000, ms / 4));
    this.refreshTimer = setTimeout(() => {
      this.refreshTimer = undefined;
      void this.refreshToken();
    }, delay);
  }

  private async refreshToken(): Promise<void> {
    const transport = this.transport;
    const getToken = this.opts.getToken;
    if (!getToken || !transport) return;
    let token: string | null | undefined;
    try {
      token = await getToken();
    } catch (e) {
      this.reportError('refresh', new HeraldError(ClientCode.NoToken, `getToken failed: ${errMessage(e)}`));
      // Try again shortly; if the token expires first, the server closes with 4004 and we reconnect.
      if (this.transport === transport) {
        this.refreshTimer = setTimeout(() => void this.refreshToken(), 2000);
      }
      return;
    }
    if (this.transport !== transport || this._state !== 'connected') {
      // The connection changed under us; the token is still good for the next connect.
      if (token) {
        this.token = token;
        this.needToken = false;
      }
      return;
    }
    if (!token) {
      this.stop(ClientCode.NoToken, 'getToken returned no token');
      return;
    }
    this.token = token;
    this.request('refresh', { token }, (err, result) => {
      if (err) {
        if (err instanceof ConnectionError) return;
        this.reportError('refresh', err);
        this.needToken = true; // make the reconnect after 4004 fetch a fresh one
        return;
      }
      const r = result as RefreshResult;
      if (typeof r.expires_in === 'number' && r.expires_in > 0) this.scheduleRefresh(r.expires_in);
    });
  }

  // ---------------------------------------------------------------------------------------------
  // Small helpers

  private setState(newState: ConnectionState): void {
    const oldState = this._state;
    if (oldState === newState) return;
    this._state = newState;
    this.emit('state', { oldState, newState });
  }

  private clearTimer(name: 'pingTimer' | 'connectTimer' | 'reconnectTimer' | 'refreshTimer'): void {
    const t = this[name];
    if (t !== undefined) clearTimeout(t);
    this[name] = undefined;
  }

  private reportError(type: ErrorType, error: HeraldError, channel?: string): void {
    const ctx: ErrorContext = { type, error };
    if (channel !== undefined) ctx.channel = channel;
    if (this.listenerCount('error') > 0) this.emit('error', ctx);
    else if (type === 'listener') console.error('Herald: a callback threw', error);
  }

  protected override onListenerError(event: keyof HeraldEvents, error: unknown): void {
    if (event === 'error') super.onListenerError(event, error);
    else this.reportError('listener', toHeraldError(error));
  }

  /** In browsers, try at once when the network comes back instead of waiting out the backoff. */
  private watchOnline(): void {
    const g = globalThis as { addEventListener?: unknown; removeEventListener?: unknown; window?: unknown };
    if (this.removeOnline || typeof g.window === 'undefined' || typeof g.addEventListener !== 'function') return;
    const onOnline = (): void => {
      if (this._state === 'connecting' && this.reconnectTimer !== undefined) void this.startAttempt();
    };
    (g.addEventListener as (t: string, f: () => void) => void)('online', onOnline);
    this.removeOnline = () => (g.removeEventListener as (t: string, f: () => void) => void)('online', onOnline);
  }
}

function errMessage(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

function toHeraldError(e: unknown): HeraldError {
  if (e instanceof HeraldError) return e;
  const err = new HeraldError(0, errMessage(e));
  if (e instanceof Error && e.stack) err.stack = e.stack;
  return err;
}

export type { ReplyErrorBody };
