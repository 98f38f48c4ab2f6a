// Wire format of docs/protocol.md: JSON messages, several per text frame separated by "\n".
// This module only turns frames into typed messages and commands into text; it knows nothing of
// connections or state, so it is easy to test on its own.

/** Where a subscriber stands in a channel's stream. */
export interface StreamPosition {
  epoch: string;
  offset: number;
}

/**
 * A subscription's tag filter (`subscribe` param `tf`): a leaf compares one tag, an inner node
 * combines its `nodes` with `op`. See docs/protocol.md, "Tags and tag filters".
 */
export type TagFilter =
  | {
      key: string;
      cmp: 'eq' | 'neq' | 'in' | 'nin' | 'ex' | 'nex' | 'starts' | 'ends' | 'contains' | 'lt' | 'lte' | 'gt' | 'gte';
      val?: string;
      vals?: string[];
    }
  | { op: 'and' | 'or' | 'not'; nodes: TagFilter[] };

/** Who published, or who joined / left. */
export interface ClientInfo {
  user: string;
  client: string;
  /** The `info` claim of the connection token, when the server passes it on. */
  info?: unknown;
  [extra: string]: unknown;
}

export interface Publication<T = unknown> {
  /** Offset in the channel's stream (0 when the publication has none: kept out of history). */
  offset: number;
  data: T;
  info?: ClientInfo;
  /** The publisher's tags, when it set some (docs/protocol.md, "Tags and tag filters"). */
  tags?: Record<string, string>;
  /**
   * Set on live publications of a subscription with delta compression: `data` is then text, the
   * publication's JSON (false) or a Fossil delta from the previous one's (true). The SDK turns it
   * back into the value before the app sees it.
   */
  delta?: boolean;
}

export interface ReplyErrorBody {
  code: number;
  message: string;
}

export interface SubscribeResult {
  epoch: string;
  /** Newest offset of the stream when the reply was sent. */
  offset: number;
  recoverable: boolean;
  recovered?: boolean;
  publications?: Publication[];
  /** Seconds until the subscription token expires (`sub_refresh` extends it). */
  expires_in?: number;
  /** What the application's subscribe proxy returned for this subscription. */
  data?: unknown;
  /** Live publications come with delta compression (asked for with `delta: 'fossil'`). */
  delta?: boolean;
}

export interface ConnectResult {
  client: string;
  node: string;
  /** Seconds between server pings. */
  ping_interval: number;
  /** Seconds until the connection token expires. */
  expires_in?: number;
  /** One entry per channel of `connect.subs` (and per channel the token subscribed). */
  subs?: Record<string, SubscribeResult | { error: ReplyErrorBody }>;
  /** What the application's connect proxy returned for the client. */
  data?: unknown;
}

export interface RpcResult<T = unknown> {
  /** The application backend's answer (absent when it returned none). */
  data?: T;
}

export interface PublishResult {
  epoch: string;
  offset: number;
}

export interface HistoryResult {
  epoch: string;
  offset: number;
  publications: Publication[];
}

export interface PresenceResult {
  clients: Record<string, ClientInfo>;
  /** Only on a page (`limit` given) with more after it: pass it back to get the next page. */
  cursor?: string;
}

/** One page of `presence`: up to `limit` (1 to 1000) clients, in client-id order. */
export interface PresencePageOptions {
  limit: number;
  /** The previous page's `cursor`. */
  cursor?: string;
}

/** Counts of a channel's presence, without its member list. */
export interface PresenceStatsResult {
  num_clients: number;
  num_users: number;
}

export interface RefreshResult {
  expires_in?: number;
}

/** One change of a `presence_batch` push. */
export interface PresenceChange {
  kind: 'join' | 'leave';
  info: ClientInfo;
}

/** A message from the server, classified. */
export type ServerMessage =
  | { type: 'reply'; id: number; method?: string; result?: unknown; error?: ReplyErrorBody }
  | { type: 'ping' }
  | { type: 'pub'; channel: string; pub: Publication }
  | { type: 'join'; channel: string; info: ClientInfo }
  | { type: 'leave'; channel: string; info: ClientInfo }
  /** Several joins and leaves of one channel, in order (a namespace's `join_leave_batch_ms`). */
  | { type: 'presence_batch'; channel: string; changes: PresenceChange[] }
  /** A channel's presence counts (a namespace's `join_leave_counts`). */
  | { type: 'presence_count'; channel: string; numClients: number; numUsers: number }
  | { type: 'unsub'; channel: string; code: number; reason: string }
  /** Publications from..to were left out by the namespace's backpressure policy. */
  | { type: 'skip'; channel: string; from: number; to: number }
  | { type: 'disconnect'; code: number; reason: string; reconnect: boolean; afterMs?: number }
  /** The server subscribed this connection (server API `subscribe`); not a reply, it has no id. */
  | { type: 'subscribed'; channel: string; result: SubscribeResult }
  | { type: 'unknown'; raw: unknown }
  | { type: 'invalid'; text: string; reason: string };

/** Encode one command. Ids are chosen by the caller (positive, unique among pending commands). */
export function encodeCommand(id: number, method: string, params: object): string {
  return JSON.stringify({ id, [method]: params });
}

/** The reply to a server ping. */
export const PONG = '{}';

/**
 * Split a text frame into messages. Empty lines (a trailing "\n", "\r\n" endings) are skipped; a
 * line that is not valid JSON becomes an `invalid` message instead of throwing, so one bad line
 * cannot hide the good ones batched with it.
 */
export function decodeFrame(text: string): ServerMessage[] {
  const out: ServerMessage[] = [];
  for (const rawLine of text.split('\n')) {
    const line = rawLine.trim();
    if (line === '') continue;
    let value: unknown;
    try {
      value = JSON.parse(line);
    } catch (e) {
      out.push({ type: 'invalid', text: line, reason: (e as Error).message });
      continue;
    }
    out.push(classify(value, line));
  }
  return out;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Turn one parsed JSON value into a typed message. Exported for tests. */
export function classify(value: unknown, text = ''): ServerMessage {
  if (!isObject(value)) return { type: 'invalid', text, reason: 'message is not a JSON object' };

  // A reply carries the id of the command it answers; the result sits under the method's name.
  if ('id' in value) {
    const id = value.id;
    if (typeof id !== 'number' || !Number.isInteger(id) || id <= 0) {
      return { type: 'invalid', text, reason: 'reply id is not a positive integer' };
    }
    if (isObject(value.error)) {
      const err = value.error;
      return {
        type: 'reply',
        id,
        error: {
          code: typeof err.code === 'number' ? err.code : 0,
          message: typeof err.message === 'string' ? err.message : '',
        },
      };
    }
    const method = Object.keys(value).find((k) => k !== 'id');
    return { type: 'reply', id, method, result: method === undefined ? {} : value[method] };
  }

  const keys = Object.keys(value);
  if (keys.length === 0) return { type: 'ping' };

  if (isObject(value.pub)) {
    const p = value.pub;
    if (typeof p.channel !== 'string') return { type: 'invalid', text, reason: 'pub without channel' };
    const pub: Publication = { offset: typeof p.offset === 'number' ? p.offset : 0, data: p.data };
    if (isObject(p.info)) pub.info = p.info as ClientInfo;
    if (typeof p.delta === 'boolean') pub.delta = p.delta;
    if (isObject(p.tags)) pub.tags = p.tags as Record<string, string>;
    return { type: 'pub', channel: p.channel, pub };
  }
  for (const kind of ['join', 'leave'] as const) {
    const body = value[kind];
    if (isObject(body)) {
      if (typeof body.channel !== 'string') {
        return { type: 'invalid', text, reason: `${kind} without channel` };
      }
      const info = (isObject(body.info) ? body.info : { user: '', client: '' }) as ClientInfo;
      return { type: kind, channel: body.channel, info };
    }
  }
  if (isObject(value.presence_batch)) {
    const b = value.presence_batch;
    if (typeof b.channel !== 'string' || !Array.isArray(b.changes)) {
      return { type: 'invalid', text, reason: 'presence_batch without channel or changes' };
    }
    const changes: PresenceChange[] = [];
    for (const c of b.changes) {
      const kind = isObject(c) ? (isObject(c.join) ? 'join' : isObject(c.leave) ? 'leave' : undefined) : undefined;
      if (kind === undefined) return { type: 'invalid', text, reason: 'presence_batch change without join or leave' };
      changes.push({ kind, info: (c as Record<string, unknown>)[kind] as ClientInfo });
    }
    return { type: 'presence_batch', channel: b.channel, changes };
  }
  if (isObject(value.presence_count)) {
    const c = value.presence_count;
    if (typeof c.channel !== 'string' || typeof c.num_clients !== 'number' || typeof c.num_users !== 'number') {
      return { type: 'invalid', text, reason: 'presence_count without channel, num_clients or num_users' };
    }
    return { type: 'presence_count', channel: c.channel, numClients: c.num_clients, numUsers: c.num_users };
  }
  if (isObject(value.skip)) {
    const k = value.skip;
    if (typeof k.channel !== 'string' || typeof k.from !== 'number' || typeof k.to !== 'number' || k.from > k.to) {
      return { type: 'invalid', text, reason: 'skip without channel, from or to' };
    }
    return { type: 'skip', channel: k.channel, from: k.from, to: k.to };
  }
  if (isObject(value.unsub)) {
    const u = value.unsub;
    if (typeof u.channel !== 'string') return { type: 'invalid', text, reason: 'unsub without channel' };
    return {
      type: 'unsub',
      channel: u.channel,
      code: typeof u.code === 'number' ? u.code : 0,
      reason: typeof u.reason === 'string' ? u.reason : '',
    };
  }
  if (isObject(value.subscribe)) {
    const b = value.subscribe;
    if (typeof b.channel !== 'string') return { type: 'invalid', text, reason: 'subscribe push without channel' };
    const { channel, ...result } = b;
    return { type: 'subscribed', channel, result: result as unknown as SubscribeResult };
  }
  if (isObject(value.disconnect)) {
    const d = value.disconnect;
    const code = typeof d.code === 'number' ? d.code : 0;
    const msg: ServerMessage = {
      type: 'disconnect',
      code,
      reason: typeof d.reason === 'string' ? d.reason : '',
      // When the server leaves the flag out, the close-code rule decides.
      reconnect: typeof d.reconnect === 'boolean' ? d.reconnect : !(code >= 4500 && code <= 4999),
    };
    if (typeof d.after_ms === 'number' && d.after_ms >= 0) msg.afterMs = d.after_ms;
    return msg;
  }
  // Unknown pushes are allowed: the protocol may add fields and pushes; old clients ignore them.
  return { type: 'unknown', raw: value };
}
