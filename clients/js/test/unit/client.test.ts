// State machine, reconnect, recovery and token handling of the client, against an in-memory socket
// and fake timers. The test plays the server.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { Herald, type HeraldOptions } from '../../src/client.js';
import { ClientCode } from '../../src/codes.js';
import { ConnectionError, ReplyError, TimeoutError, UsageError } from '../../src/errors.js';
import type { WebSocketConstructor } from '../../src/transport.js';
import { FakeSocket } from './fake-socket.js';

function client(opts: HeraldOptions = {}): Herald {
  return new Herald('ws://test/ws', {
    WebSocket: FakeSocket as unknown as WebSocketConstructor,
    random: () => 0.5,
    minReconnectDelayMs: 1000,
    maxReconnectDelayMs: 8000,
    ...opts,
  });
}

/** Let pending promise callbacks (getToken, call()) run without moving the clock. */
const flush = () => vi.advanceTimersByTimeAsync(0);

function record(h: Herald): string[] {
  const log: string[] = [];
  h.on('connecting', (c) => log.push(`connecting:${c.code}`));
  h.on('connected', () => log.push('connected'));
  h.on('disconnected', (c) => log.push(`disconnected:${c.code}`));
  return log;
}

beforeEach(() => {
  vi.useFakeTimers();
  FakeSocket.reset();
});
afterEach(() => {
  vi.useRealTimers();
});

describe('connection state machine', () => {
  it('sends connect first and becomes connected on the reply', async () => {
    const h = client({ token: 'T', name: 'test', version: '1' });
    const log = record(h);
    expect(h.state).toBe('disconnected');
    h.connect();
    expect(h.state).toBe('connecting');
    await flush();
    const s = FakeSocket.last();
    expect(s.url).toBe('ws://test/ws');
    s.open();
    expect(s.commands()).toEqual([{ id: 1, connect: { token: 'T', name: 'test', version: '1' } }]);
    s.accept({ client: 'abc' });
    expect(h.state).toBe('connected');
    expect(h.clientId).toBe('abc');
    expect(log).toEqual([`connecting:${ClientCode.ConnectCalled}`, 'connected']);
  });

  it('queues commands made while connecting and sends them after connect', async () => {
    const h = client();
    h.connect();
    await flush();
    const p = h.publish('chat', { text: 'hi' });
    const s = FakeSocket.last();
    s.open();
    expect(s.countOf('publish')).toBe(0);
    s.accept();
    await flush();
    expect(s.cmd('publish').params).toEqual({ channel: 'chat', data: { text: 'hi' } });
    s.reply('publish', { epoch: 'e', offset: 1 });
    await expect(p).resolves.toEqual({ epoch: 'e', offset: 1 });
  });

  it('sends presence pages and presence_stats with their params', async () => {
    const h = client();
    h.connect();
    await flush();
    const s = FakeSocket.last();
    s.accept();
    const all = h.presence('room');
    expect(s.cmd('presence').params).toEqual({ channel: 'room' });
    s.reply('presence', { clients: {} });
    await expect(all).resolves.toEqual({ clients: {} });
    const first = h.presence('room', { limit: 2 });
    expect(s.cmd('presence').params).toEqual({ channel: 'room', limit: 2 });
    const a = { user: 'u', client: 'a' };
    s.reply('presence', { clients: { a }, cursor: 'a' });
    await expect(first).resolves.toEqual({ clients: { a }, cursor: 'a' });
    const next = h.presence('room', { limit: 2, cursor: 'a' });
    expect(s.cmd('presence').params).toEqual({ channel: 'room', limit: 2, cursor: 'a' });
    s.reply('presence', { clients: {} });
    await expect(next).resolves.toEqual({ clients: {} });
    const stats = h.presenceStats('room');
    expect(s.cmd('presence_stats').params).toEqual({ channel: 'room' });
    s.reply('presence_stats', { num_clients: 3, num_users: 2 });
    await expect(stats).resolves.toEqual({ num_clients: 3, num_users: 2 });
  });

  it('rejects calls made while disconnected with a typed error', async () => {
    const h = client();
    const err = await h.publish('chat', 1).catch((e) => e);
    expect(err).toBeInstanceOf(ConnectionError);
    expect(err.code).toBe(ClientCode.NotConnected);
  });

  it('turns error replies into ReplyError with the protocol code', async () => {
    const h = client();
    h.connect();
    await flush();
    FakeSocket.last().accept();
    const p = h.publish('chat', 1);
    FakeSocket.last().replyError('publish', 103, 'permission denied');
    const err = await p.catch((e) => e);
    expect(err).toBeInstanceOf(ReplyError);
    expect(err.code).toBe(103);
    expect(err.message).toBe('permission denied');
  });

  it('times out a command with no reply', async () => {
    const h = client({ timeoutMs: 500 });
    h.connect();
    await flush();
    FakeSocket.last().accept();
    const p = h.history('chat');
    const check = expect(p).rejects.toBeInstanceOf(TimeoutError);
    await vi.advanceTimersByTimeAsync(600);
    await check;
  });

  it('reconnects after a server close in 4000–4499, honouring after_ms', async () => {
    const h = client();
    const log = record(h);
    h.connect();
    await flush();
    FakeSocket.last().accept();
    const s = FakeSocket.last();
    s.push({ disconnect: { code: 4000, reason: 'shutdown', reconnect: true, after_ms: 3000 } });
    s.serverClose(4000, 'shutdown');
    expect(h.state).toBe('connecting');
    expect(log.at(-1)).toBe('connecting:4000');
    await vi.advanceTimersByTimeAsync(2999);
    expect(FakeSocket.instances).toHaveLength(1);
    await vi.advanceTimersByTimeAsync(1);
    expect(FakeSocket.instances).toHaveLength(2);
  });

  it('stays down after a close in 4500–4999 and says why', async () => {
    const h = client();
    const log = record(h);
    h.connect();
    await flush();
    FakeSocket.last().accept();
    FakeSocket.last().push({ disconnect: { code: 4501, reason: 'unauthorized', reconnect: false } });
    FakeSocket.last().serverClose(4501, 'unauthorized');
    expect(h.state).toBe('disconnected');
    expect(log.at(-1)).toBe('disconnected:4501');
    await vi.advanceTimersByTimeAsync(60_000);
    expect(FakeSocket.instances).toHaveLength(1);
  });

  it('reports the disconnect push code when a proxy swallowed the close code', async () => {
    const h = client();
    const seen: Array<{ code: number; reason: string }> = [];
    h.on('disconnected', (c) => seen.push(c));
    h.connect();
    await flush();
    FakeSocket.last().accept();
    FakeSocket.last().push({ disconnect: { code: 4502, reason: 'kicked', reconnect: false } });
    FakeSocket.last().serverClose(1006);
    expect(seen).toEqual([{ code: 4502, reason: 'kicked' }]);
  });

  it('reconnects after network failures with growing, jittered, bounded delays', async () => {
    const h = client({ random: () => 0.9999 });
    h.connect();
    await flush();
    const delays: number[] = [];
    for (let i = 0; i < 6; i++) {
      const n = FakeSocket.instances.length;
      FakeSocket.last().serverClose(1006);
      let waited = 0;
      while (FakeSocket.instances.length === n) {
        await vi.advanceTimersByTimeAsync(1);
        waited++;
      }
      delays.push(waited);
    }
    // Windows 1000, 2000, 4000, 8000, 8000, 8000 (bounded), each drawn at the top of the window.
    expect(delays).toEqual([999, 1999, 3999, 7999, 7999, 7999]);
    expect(h.state).toBe('connecting');
  });

  it('resets the backoff after a successful connect', async () => {
    const h = client({ random: () => 0.9999 });
    h.connect();
    await flush();
    FakeSocket.last().serverClose(1006);
    await vi.advanceTimersByTimeAsync(1000);
    FakeSocket.last().serverClose(1006);
    await vi.advanceTimersByTimeAsync(2000);
    FakeSocket.last().accept();
    FakeSocket.last().serverClose(1006);
    await vi.advanceTimersByTimeAsync(998);
    expect(FakeSocket.instances).toHaveLength(3);
    await vi.advanceTimersByTimeAsync(1);
    expect(FakeSocket.instances).toHaveLength(4);
  });

  it('answers pings and closes a connection that went silent', async () => {
    const h = client({ pingGraceMs: 2000 });
    const log = record(h);
    h.connect();
    await flush();
    const s = FakeSocket.last();
    s.accept({ ping_interval: 5 });
    s.push({});
    expect(s.sent.at(-1)).toBe('{}');
    // Frames keep it alive.
    await vi.advanceTimersByTimeAsync(6000);
    s.push({});
    await vi.advanceTimersByTimeAsync(6000);
    expect(h.state).toBe('connected');
    // Then silence past ping_interval + grace.
    await vi.advanceTimersByTimeAsync(1100);
    expect(h.state).toBe('connecting');
    expect(s.terminated).toBe(true);
    expect(log.at(-1)).toBe(`connecting:${ClientCode.NoPing}`);
    await vi.advanceTimersByTimeAsync(1000);
    expect(FakeSocket.instances).toHaveLength(2);
  });

  it('gives up on a connect that gets no reply and tries again', async () => {
    const h = client({ timeoutMs: 1000 });
    h.connect();
    await flush();
    FakeSocket.last().open();
    await vi.advanceTimersByTimeAsync(1000);
    expect(FakeSocket.instances[0].terminated).toBe(true);
    await vi.advanceTimersByTimeAsync(1000);
    expect(FakeSocket.instances).toHaveLength(2);
  });

  it('disconnect() stops everything and fails in-flight commands', async () => {
    const h = client();
    const log = record(h);
    h.connect();
    await flush();
    FakeSocket.last().accept();
    const p = h.publish('chat', 1);
    h.disconnect();
    expect(h.state).toBe('disconnected');
    expect(log.at(-1)).toBe(`disconnected:${ClientCode.DisconnectCalled}`);
    const err = await p.catch((e) => e);
    expect(err).toBeInstanceOf(ConnectionError);
    expect(FakeSocket.last().closedByClient).toBeDefined();
    await vi.advanceTimersByTimeAsync(60_000);
    expect(FakeSocket.instances).toHaveLength(1);
  });

  it('fails in-flight commands with ConnectionError when the connection drops', async () => {
    const h = client();
    h.connect();
    await flush();
    FakeSocket.last().accept();
    const p = h.publish('chat', 1);
    FakeSocket.last().serverClose(1006);
    const err = await p.catch((e) => e);
    expect(err).toBeInstanceOf(ConnectionError);
    expect(err.code).toBe(ClientCode.ConnectionLost);
  });

  it('stops on a connect error that retrying cannot fix', async () => {
    const h = client();
    const log = record(h);
    h.connect();
    await flush();
    FakeSocket.last().open();
    FakeSocket.last().replyError('connect', 101, 'unauthorized');
    expect(h.state).toBe('disconnected');
    expect(log.at(-1)).toBe('disconnected:101');
  });

  it('retries a temporarily unavailable connect', async () => {
    const h = client();
    h.connect();
    await flush();
    FakeSocket.last().open();
    FakeSocket.last().replyError('connect', 111, 'busy');
    expect(h.state).toBe('connecting');
    await vi.advanceTimersByTimeAsync(1000);
    expect(FakeSocket.instances).toHaveLength(2);
  });

  it('requests a subprotocol only when asked', async () => {
    const a = client({ protocols: 'herald.v1.json' });
    a.connect();
    await flush();
    expect(FakeSocket.last().protocols).toBe('herald.v1.json');
    const b = client();
    b.connect();
    await flush();
    expect(FakeSocket.last().protocols).toBeUndefined();
  });
});

describe('subscriptions and recovery', () => {
  async function connected(h: Herald, result: Record<string, unknown> = {}): Promise<FakeSocket> {
    h.connect();
    await flush();
    const s = FakeSocket.last();
    s.accept(result);
    return s;
  }

  it('validates channel names and refuses a second subscription to a channel', () => {
    const h = client();
    expect(() => h.subscribe('bad channel')).toThrow(UsageError);
    expect(() => h.subscribe('x'.repeat(256))).toThrow(UsageError);
    h.subscribe('ns:room#alice,bob');
    expect(() => h.subscribe('ns:room#alice,bob')).toThrow(UsageError);
  });

  it('sends subscriptions made before connecting inside the connect command', async () => {
    const h = client();
    h.subscribe('chat');
    h.subscribe('counter', { since: { epoch: 'E', offset: 4 } });
    h.connect();
    await flush();
    const s = FakeSocket.last();
    s.open();
    expect(s.cmd('connect').params).toEqual({ subs: { chat: {}, counter: { since: { epoch: 'E', offset: 4 } } } });
    expect(s.countOf('subscribe')).toBe(0);
  });

  it('subscribes with a command when already connected and delivers live publications', async () => {
    const h = client();
    const s = await connected(h);
    const got: number[] = [];
    const sub = h.subscribe<number>('chat', { onPublication: (p) => got.push(p.data) });
    expect(sub.state).toBe('subscribing');
    expect(s.cmd('subscribe').params).toEqual({ channel: 'chat' });
    s.reply('subscribe', { epoch: 'e', offset: 2, recoverable: true });
    await sub.ready();
    expect(sub.state).toBe('subscribed');
    s.push({ pub: { channel: 'chat', offset: 3, data: 3 } });
    s.push({ pub: { channel: 'chat', offset: 4, data: 4 } });
    expect(got).toEqual([3, 4]);
    expect(sub.position).toEqual({ epoch: 'e', offset: 4 });
  });

  it('sends a tag filter as tf, hands tags to the app, and takes filtered holes as no gaps', async () => {
    const h = client();
    const s = await connected(h);
    const got: Array<[number, number, unknown]> = [];
    const tagsFilter = { key: 'kind', cmp: 'eq', val: 'goal' } as const;
    const sub = h.subscribe<number>('match', {
      tagsFilter,
      onPublication: (p) => got.push([p.offset, p.data, p.tags]),
    });
    expect(s.cmd('subscribe').params).toEqual({ channel: 'match', tf: tagsFilter });
    s.reply('subscribe', { epoch: 'e', offset: 2, recoverable: true });
    await sub.ready();
    s.push({ pub: { channel: 'match', offset: 5, data: 5, tags: { kind: 'goal' } } });
    // No offset: a publication kept out of history, delivered without moving the position.
    s.push({ pub: { channel: 'match', data: 0, tags: { kind: 'goal' } } });
    s.push({ pub: { channel: 'match', offset: 9, data: 9, tags: { kind: 'goal' } } });
    expect(got).toEqual([
      [5, 5, { kind: 'goal' }],
      [0, 0, { kind: 'goal' }],
      [9, 9, { kind: 'goal' }],
    ]);
    expect(sub.position).toEqual({ epoch: 'e', offset: 9 });
    expect(s.countOf('unsubscribe')).toBe(0);
  });

  it('restores every subscription with since in one connect after a reconnect, and recovers', async () => {
    const h = client();
    const chat: number[] = [];
    const counter: number[] = [];
    h.subscribe<number>('chat', { onPublication: (p) => chat.push(p.offset) });
    h.subscribe<number>('counter', { onPublication: (p) => counter.push(p.offset) });
    const s = await connected(h, {
      subs: {
        chat: { epoch: 'A', offset: 10, recoverable: true },
        counter: { epoch: 'B', offset: 0, recoverable: true },
      },
    });
    s.push({ pub: { channel: 'chat', offset: 11, data: 0 } });
    s.push({ pub: { channel: 'counter', offset: 1, data: 0 } });
    s.serverClose(1006);

    await vi.advanceTimersByTimeAsync(1000);
    const s2 = FakeSocket.last();
    s2.open();
    expect(s2.commands()).toHaveLength(1);
    expect(s2.cmd('connect').params.subs).toEqual({
      chat: { since: { epoch: 'A', offset: 11 } },
      counter: { since: { epoch: 'B', offset: 1 } },
    });
    // Recovered batch includes one already delivered (11) and arrives unsorted; then live ones,
    // batched in the same frame, one of them a duplicate.
    const reply = {
      id: s2.cmd('connect').id,
      connect: {
        client: 'c2',
        node: 'n',
        ping_interval: 25,
        subs: {
          chat: {
            epoch: 'A',
            offset: 14,
            recoverable: true,
            recovered: true,
            publications: [13, 11, 12, 14].map((o) => ({ offset: o, data: o })),
          },
          counter: { epoch: 'B', offset: 1, recoverable: true, recovered: true, publications: [] },
        },
      },
    };
    s2.push(
      [
        JSON.stringify(reply),
        '{"pub":{"channel":"chat","offset":14,"data":14}}',
        '{"pub":{"channel":"chat","offset":15,"data":15}}',
        '{"pub":{"channel":"counter","offset":2,"data":2}}',
      ].join('\n'),
    );
    expect(chat).toEqual([11, 12, 13, 14, 15]);
    expect(counter).toEqual([1, 2]);
    expect(s2.countOf('subscribe')).toBe(0);
  });

  it('calls onRecoveryFailed with the channel when the server cannot recover', async () => {
    const h = client();
    const failed: unknown[] = [];
    const got: number[] = [];
    h.subscribe<number>('chat', {
      onRecoveryFailed: (ctx) => failed.push(ctx),
      onPublication: (p) => got.push(p.offset),
    });
    const s = await connected(h, { subs: { chat: { epoch: 'A', offset: 5, recoverable: true } } });
    s.push({ pub: { channel: 'chat', offset: 6, data: 0 } });
    s.serverClose(4000);
    await vi.advanceTimersByTimeAsync(1000);
    FakeSocket.last().accept({ subs: { chat: { epoch: 'Z', offset: 2, recoverable: true, recovered: false } } });
    expect(failed).toEqual([{ channel: 'chat', since: { epoch: 'A', offset: 6 }, epoch: 'Z', offset: 2 }]);
    // Live publications of the new stream flow on.
    FakeSocket.last().push({ pub: { channel: 'chat', offset: 3, data: 0 } });
    expect(got).toEqual([6, 3]);
  });

  it('takes a skip push (backpressure) as moving past, without a resync, and says so', async () => {
    const h = client();
    const got: number[] = [];
    const skipped: { from: number; to: number }[] = [];
    const sub = h.subscribe<number>('chat', { onPublication: (p) => got.push(p.offset) });
    sub.on('skipped', (k) => skipped.push({ from: k.from, to: k.to }));
    const s = await connected(h, { subs: { chat: { epoch: 'A', offset: 1, recoverable: true } } });
    s.push({ pub: { channel: 'chat', offset: 2, data: 0 } });
    s.push({ skip: { channel: 'chat', from: 3, to: 8 } });
    s.push({ pub: { channel: 'chat', offset: 9, data: 0 } });
    await vi.advanceTimersByTimeAsync(200);
    expect(got).toEqual([2, 9]);
    expect(skipped).toEqual([{ from: 3, to: 8 }]);
    expect(s.countOf('unsubscribe')).toBe(0);
    expect(s.countOf('subscribe')).toBe(0);
  });

  it('resubscribes from its position when it sees a hole in the offsets', async () => {
    const h = client();
    const got: number[] = [];
    h.subscribe<number>('chat', { onPublication: (p) => got.push(p.offset) });
    const s = await connected(h, { subs: { chat: { epoch: 'A', offset: 1, recoverable: true } } });
    s.push({ pub: { channel: 'chat', offset: 2, data: 0 } });
    s.push({ pub: { channel: 'chat', offset: 4, data: 0 } }); // 3 is missing
    s.push({ pub: { channel: 'chat', offset: 5, data: 0 } }); // ignored while resyncing
    await vi.advanceTimersByTimeAsync(200);
    expect(s.cmd('unsubscribe').params).toEqual({ channel: 'chat' });
    expect(s.countOf('subscribe')).toBe(0); // waits for the unsubscribe reply
    s.reply('unsubscribe', {});
    expect(s.cmd('subscribe').params).toEqual({ channel: 'chat', since: { epoch: 'A', offset: 2 } });
    s.reply('subscribe', {
      epoch: 'A',
      offset: 5,
      recoverable: true,
      recovered: true,
      publications: [3, 4, 5].map((o) => ({ offset: o, data: 0 })),
    });
    expect(got).toEqual([2, 3, 4, 5]);
  });

  it('resubscribes on an unsub push with a resubscribe code, ends on others', async () => {
    const h = client();
    const ended: unknown[] = [];
    h.subscribe('a');
    h.subscribe('b', { onUnsubscribed: (c) => ended.push(c) });
    const s = await connected(h, {
      subs: { a: { epoch: 'A', offset: 1, recoverable: true }, b: { epoch: 'B', offset: 1, recoverable: true } },
    });
    s.push({ unsub: { channel: 'a', code: 4003, reason: 'insufficient state' } });
    await vi.advanceTimersByTimeAsync(200);
    expect(s.cmd('subscribe').params).toEqual({ channel: 'a', since: { epoch: 'A', offset: 1 } });
    s.push({ unsub: { channel: 'b', code: 2000, reason: 'unsubscribed by server' } });
    expect(ended).toEqual([{ channel: 'b', code: 2000, reason: 'unsubscribed by server' }]);
    expect(h.getSubscription('b')).toBeUndefined();
  });

  it('ends a subscription the server refuses, with a typed error', async () => {
    const h = client();
    const s = await connected(h);
    const errors: number[] = [];
    const sub = h.subscribe('secret', { onError: (c) => errors.push(c.error.code) });
    const ready = sub.ready().catch((e) => e);
    s.replyError('subscribe', 103, 'permission denied');
    const err = await ready;
    expect(err).toBeInstanceOf(ReplyError);
    expect(err.code).toBe(103);
    expect(errors).toEqual([103]);
    expect(sub.state).toBe('unsubscribed');
    expect(h.getSubscription('secret')).toBeUndefined();
  });

  it('retries a subscribe that failed temporarily', async () => {
    const h = client();
    const s = await connected(h);
    h.subscribe('chat');
    s.replyError('subscribe', 111, 'try later');
    expect(s.countOf('subscribe')).toBe(1);
    await vi.advanceTimersByTimeAsync(200);
    expect(s.countOf('subscribe')).toBe(2);
  });

  it('unsubscribe() tells the server and stops delivery', async () => {
    const h = client();
    const got: number[] = [];
    const sub = h.subscribe<number>('chat', { onPublication: (p) => got.push(p.offset) });
    const s = await connected(h, { subs: { chat: { epoch: 'A', offset: 0, recoverable: true } } });
    sub.unsubscribe();
    expect(s.cmd('unsubscribe').params).toEqual({ channel: 'chat' });
    s.push({ pub: { channel: 'chat', offset: 1, data: 0 } });
    expect(got).toEqual([]);
    expect(sub.state).toBe('unsubscribed');
    // The channel can be subscribed again.
    expect(() => h.subscribe('chat')).not.toThrow();
  });

  it('routes join and leave to the subscription', async () => {
    const h = client();
    const events: string[] = [];
    h.subscribe('chat', {
      onJoin: (c) => events.push(`join:${c.info.user}`),
      onLeave: (c) => events.push(`leave:${c.info.user}`),
    });
    const s = await connected(h, { subs: { chat: { epoch: 'A', offset: 0, recoverable: true } } });
    s.push(
      '{"join":{"channel":"chat","info":{"user":"ann","client":"1"}}}\n{"leave":{"channel":"chat","info":{"user":"bob","client":"2"}}}',
    );
    expect(events).toEqual(['join:ann', 'leave:bob']);
  });

  it('turns a presence_batch push into the same join and leave events, in order', async () => {
    const h = client();
    const events: string[] = [];
    h.subscribe('chat', {
      onJoin: (c) => events.push(`join:${c.info.user}`),
      onLeave: (c) => events.push(`leave:${c.info.user}`),
    });
    const s = await connected(h, { subs: { chat: { epoch: 'A', offset: 0, recoverable: true } } });
    s.push({
      presence_batch: {
        channel: 'chat',
        changes: [
          { join: { user: 'ann', client: '1' } },
          { join: { user: 'bob', client: '2' } },
          { leave: { user: 'ann', client: '1' } },
        ],
      },
    });
    expect(events).toEqual(['join:ann', 'join:bob', 'leave:ann']);
  });

  it('turns a presence_count push into a presenceCount event', async () => {
    const h = client();
    const counts: number[] = [];
    const sub = h.subscribe('crowd');
    sub.on('presenceCount', (c) => counts.push(c.numClients, c.numUsers));
    const s = await connected(h, { subs: { crowd: { epoch: 'A', offset: 0, recoverable: true } } });
    s.push({ presence_count: { channel: 'crowd', num_clients: 20000, num_users: 19000 } });
    s.push({ presence_count: { channel: 'elsewhere', num_clients: 1, num_users: 1 } });
    expect(counts).toEqual([20000, 19000]);
  });

  it('keeps delivering when an app callback throws', async () => {
    const h = client();
    const errors: string[] = [];
    h.on('error', (e) => errors.push(e.type));
    const got: number[] = [];
    h.subscribe<number>('chat', {
      onPublication: (p) => {
        got.push(p.offset);
        if (p.offset === 1) throw new Error('app bug');
      },
    });
    const s = await connected(h, { subs: { chat: { epoch: 'A', offset: 0, recoverable: true } } });
    s.push({ pub: { channel: 'chat', offset: 1, data: 0 } });
    s.push({ pub: { channel: 'chat', offset: 2, data: 0 } });
    expect(got).toEqual([1, 2]);
    expect(errors).toEqual(['listener']);
  });

  it('a later connect() after disconnect() recovers subscriptions from where they were', async () => {
    const h = client();
    h.subscribe('chat');
    const s = await connected(h, { subs: { chat: { epoch: 'A', offset: 7, recoverable: true } } });
    s.push({ pub: { channel: 'chat', offset: 8, data: 0 } });
    h.disconnect();
    h.connect();
    await flush();
    FakeSocket.last().open();
    expect(FakeSocket.last().cmd('connect').params.subs).toEqual({ chat: { since: { epoch: 'A', offset: 8 } } });
  });
});

describe('tokens', () => {
  it('calls getToken for the first connect only, then refreshes before expiry', async () => {
    let n = 0;
    const getToken = vi.fn(async () => `tok${++n}`);
    const h = client({ getToken });
    h.connect();
    await flush();
    expect(getToken).toHaveBeenCalledTimes(1);
    const s = FakeSocket.last();
    s.open();
    expect(s.cmd('connect').params.token).toBe('tok1');
    s.accept({ expires_in: 60, ping_interval: 0 });
    // Refresh 10 s before expiry.
    await vi.advanceTimersByTimeAsync(49_999);
    expect(getToken).toHaveBeenCalledTimes(1);
    await vi.advanceTimersByTimeAsync(1);
    expect(getToken).toHaveBeenCalledTimes(2);
    expect(s.cmd('refresh').params).toEqual({ token: 'tok2' });
    s.reply('refresh', { expires_in: 8 });
    await vi.advanceTimersByTimeAsync(6000); // a quarter of 8 s early
    expect(getToken).toHaveBeenCalledTimes(3);
    // A plain reconnect reuses the current token.
    s.serverClose(1006);
    await vi.advanceTimersByTimeAsync(1000);
    FakeSocket.last().open();
    expect(getToken).toHaveBeenCalledTimes(3);
    expect(FakeSocket.last().cmd('connect').params.token).toBe('tok3');
  });

  it('gets a new token after close 4004', async () => {
    let n = 0;
    const getToken = vi.fn(async () => `tok${++n}`);
    const h = client({ getToken });
    h.connect();
    await flush();
    FakeSocket.last().accept();
    FakeSocket.last().push({ disconnect: { code: 4004, reason: 'token expired', reconnect: true } });
    FakeSocket.last().serverClose(4004, 'token expired');
    expect(h.state).toBe('connecting');
    await vi.advanceTimersByTimeAsync(1000);
    expect(getToken).toHaveBeenCalledTimes(2);
    FakeSocket.last().open();
    expect(FakeSocket.last().cmd('connect').params.token).toBe('tok2');
  });

  it('gets a new token when connect answers 109 token expired', async () => {
    let n = 0;
    const getToken = vi.fn(async () => `tok${++n}`);
    const h = client({ getToken });
    h.connect();
    await flush();
    FakeSocket.last().open();
    FakeSocket.last().replyError('connect', 109, 'token expired');
    await vi.advanceTimersByTimeAsync(1000);
    expect(getToken).toHaveBeenCalledTimes(2);
  });

  it('stops when getToken returns no token, retries when it throws', async () => {
    const failing = client({
      getToken: vi.fn().mockRejectedValueOnce(new Error('auth service down')).mockResolvedValueOnce(''),
    });
    const log = record(failing);
    failing.connect();
    await flush();
    expect(failing.state).toBe('connecting');
    expect(FakeSocket.instances).toHaveLength(0);
    await vi.advanceTimersByTimeAsync(1000);
    expect(failing.state).toBe('disconnected');
    expect(log.at(-1)).toBe(`disconnected:${ClientCode.NoToken}`);
  });
});

describe('frame handling edge cases', () => {
  it('drops the rest of a frame when a listener restarts the connection', async () => {
    const h = client();
    const got: number[] = [];
    h.subscribe<number>('chat', {
      onPublication: (p) => {
        got.push(p.offset);
        if (p.offset === 1) {
          h.disconnect();
          h.connect();
        }
      },
    });
    h.connect();
    await flush();
    FakeSocket.last().accept({ subs: { chat: { epoch: 'A', offset: 0, recoverable: true } } });
    const first = FakeSocket.last();
    first.push('{"pub":{"channel":"chat","offset":1,"data":0}}\n{"pub":{"channel":"chat","offset":2,"data":0}}');
    expect(got).toEqual([1]);
    expect(FakeSocket.instances).toHaveLength(2);
    FakeSocket.last().open();
    // The new connection recovers from offset 1: offset 2 will come through recovery, once.
    expect(FakeSocket.last().cmd('connect').params.subs).toEqual({ chat: { since: { epoch: 'A', offset: 1 } } });
  });

  it('stops instead of looping when a fixed token has expired', async () => {
    const h = client({ token: 'old' });
    const log = record(h);
    h.connect();
    await flush();
    FakeSocket.last().open();
    FakeSocket.last().replyError('connect', 109, 'token expired');
    expect(h.state).toBe('disconnected');
    expect(log.at(-1)).toBe('disconnected:109');
  });

  it('ignores a late reply to a command that timed out', async () => {
    const h = client({ timeoutMs: 100 });
    h.connect();
    await flush();
    const s = FakeSocket.last();
    s.accept({ ping_interval: 0 });
    const p = h.publish('chat', 1).catch((e) => e);
    await vi.advanceTimersByTimeAsync(150);
    expect(await p).toBeInstanceOf(TimeoutError);
    expect(() => s.reply('publish', { epoch: 'e', offset: 1 })).not.toThrow();
    expect(h.state).toBe('connected');
  });
});

describe('ready()', () => {
  it('rejects a subscription waiter when the client stops, keeps the subscription', async () => {
    const h = client();
    const sub = h.subscribe('chat');
    h.connect();
    await flush();
    const ready = sub.ready().catch((e) => e);
    FakeSocket.last().open();
    FakeSocket.last().replyError('connect', 101, 'unauthorized');
    const err = await ready;
    expect(err).toBeInstanceOf(ConnectionError);
    expect(err.closeCode).toBe(101);
    expect(h.getSubscription('chat')).toBe(sub);
  });
});

describe('server-side subscriptions', () => {
  it('reports token channels from connect and the API subscribe push, and their publications', async () => {
    const h = client();
    const events: string[] = [];
    h.on('subscribed', (c) => events.push(`subscribed:${c.channel}`));
    h.on('unsubscribed', (c) => events.push(`unsubscribed:${c.channel}:${c.code}`));
    h.on('publication', (p) => events.push(`pub:${p.channel}:${p.offset}`));
    h.subscribe('mine');
    h.connect();
    await flush();
    const s = FakeSocket.last();
    s.accept({
      subs: {
        mine: { epoch: 'M', offset: 0, recoverable: true },
        'user:ann': { epoch: 'U', offset: 5, recoverable: true },
      },
    });
    s.push({ subscribe: { channel: 'news', epoch: 'N', offset: 1, recoverable: true } });
    s.push({ pub: { channel: 'user:ann', offset: 6, data: 0 } });
    s.push({ pub: { channel: 'news', offset: 2, data: 0 } });
    s.push({ pub: { channel: 'stranger', offset: 1, data: 0 } }); // not subscribed: dropped
    s.push({ unsub: { channel: 'news', code: 2000, reason: 'unsubscribed by the server' } });
    s.push({ pub: { channel: 'news', offset: 3, data: 0 } }); // after unsub: dropped
    expect(events).toEqual([
      'subscribed:user:ann',
      'subscribed:news',
      'pub:user:ann:6',
      'pub:news:2',
      'unsubscribed:news:2000',
    ]);
  });

  it('asks for them with since after a reconnect and delivers what was missed once, in order', async () => {
    const h = client();
    const events: string[] = [];
    h.on('subscribed', (c) => events.push(`subscribed:${c.channel}:${c.recovered}`));
    h.on('publication', (p) => events.push(`pub:${p.channel}:${p.offset}`));
    h.connect();
    await flush();
    let s = FakeSocket.last();
    s.accept({ subs: { 'user:ann': { epoch: 'U', offset: 5, recoverable: true } } });
    s.push({ pub: { channel: 'user:ann', offset: 6, data: 0 } });
    s.push({ pub: { channel: 'user:ann', offset: 6, data: 0 } }); // a duplicate: dropped
    s.serverClose(1006);
    await vi.advanceTimersByTimeAsync(8000);
    s = FakeSocket.last();
    s.open();
    expect(s.cmd('connect').params.subs).toEqual({ 'user:ann': { since: { epoch: 'U', offset: 6 } } });
    s.accept({
      subs: {
        'user:ann': {
          epoch: 'U',
          offset: 8,
          recoverable: true,
          recovered: true,
          publications: [
            { offset: 7, data: 0 },
            { offset: 8, data: 0 },
          ],
        },
      },
    });
    s.push({ pub: { channel: 'user:ann', offset: 8, data: 0 } }); // already recovered: dropped
    s.push({ pub: { channel: 'user:ann', offset: 9, data: 0 } });
    expect(events).toEqual([
      'subscribed:user:ann:undefined',
      'pub:user:ann:6',
      'subscribed:user:ann:true',
      'pub:user:ann:7',
      'pub:user:ann:8',
      'pub:user:ann:9',
    ]);
  });

  it('sends the data option in connect and reports the connect proxy data', async () => {
    let n = 0;
    const h = client({ data: () => ({ attempt: ++n }) });
    let data: unknown;
    h.on('connected', (c) => (data = c.data));
    h.connect();
    await flush();
    const s = FakeSocket.last();
    s.open();
    expect(s.cmd('connect').params.data).toEqual({ attempt: 1 });
    s.accept({ data: { name: 'Ann' } });
    expect(data).toEqual({ name: 'Ann' });
  });

  it('does not report publications of a channel it just unsubscribed from', async () => {
    const h = client();
    const seen: string[] = [];
    h.on('publication', (p) => seen.push(p.channel));
    const sub = h.subscribe('chat');
    h.connect();
    await flush();
    FakeSocket.last().accept({ subs: { chat: { epoch: 'A', offset: 0, recoverable: true } } });
    sub.unsubscribe();
    FakeSocket.last().push({ pub: { channel: 'chat', offset: 1, data: 0 } });
    expect(seen).toEqual([]);
  });
});
