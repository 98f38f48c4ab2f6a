// The subscription's own state machine, driven directly through its transitions (no client, no
// socket): what each transition does to the state, the position and the events the app sees.
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { SubscribeResult } from '../../src/codec.js';
import { ClientCode } from '../../src/codes.js';
import { HeraldError } from '../../src/errors.js';
import { type SubscribeOptions, Subscription, type SubscriptionHost } from '../../src/subscription.js';

/** A host that only records what the subscription asks of it. */
class RecordingHost implements SubscriptionHost {
  removed: Array<{ channel: string; code: number }> = [];
  listenerErrors: unknown[] = [];
  removeSubscription(sub: Subscription<never>, code: number): void {
    this.removed.push({ channel: sub.channel, code });
  }
  publish(): never {
    throw new Error('not used');
  }
  history(): never {
    throw new Error('not used');
  }
  presence(): never {
    throw new Error('not used');
  }
  presenceStats(): never {
    throw new Error('not used');
  }
  reportListenerError(_channel: string, error: unknown): void {
    this.listenerErrors.push(error);
  }
}

function subscription(opts: SubscribeOptions<number> = {}): { sub: Subscription<number>; host: RecordingHost } {
  const host = new RecordingHost();
  return { sub: new Subscription<number>(host, 'chat', opts), host };
}

/** Every event the subscription emits, in order, as short strings. */
function record(sub: Subscription<number>): string[] {
  const log: string[] = [];
  sub.on('subscribed', (c) => log.push(`subscribed:${c.offset}:${c.recovered}:${c.resubscribed}`));
  sub.on('publication', (p) => log.push(`pub:${p.offset}`));
  sub.on('recoveryFailed', (c) => log.push(`recoveryFailed:${c.since.offset}->${c.epoch}:${c.offset}`));
  sub.on('unsubscribed', (c) => log.push(`unsubscribed:${c.code}`));
  sub.on('error', (c) => log.push(`error:${c.error.code}`));
  return log;
}

const pub = (offset: number) => ({ offset, data: offset });
const reply = (r: Partial<SubscribeResult>): SubscribeResult => ({ epoch: 'e1', offset: 0, recoverable: true, ...r });

/** Subscribe fresh at `offset` and return the subscription, subscribed. */
function subscribedAt(offset: number, opts: SubscribeOptions<number> = {}) {
  const s = subscription(opts);
  s.sub._subscribeSent();
  s.sub._replyArrived();
  s.sub._applySubscribe(reply({ offset }));
  return s;
}

afterEach(() => {
  vi.useRealTimers();
});

describe('Subscription transitions', () => {
  it('subscribing → subscribed: a fresh subscribe sends no since, starts at the reply, resolves ready()', async () => {
    const { sub } = subscription();
    const log = record(sub);
    expect(sub.state).toBe('subscribing');
    expect(sub._needsSubscribe).toBe(true);
    expect(sub._subscribeSent()).toBeUndefined();
    expect(sub._busy).toBe(true);
    expect(sub._needsSubscribe).toBe(false);
    sub._replyArrived();
    expect(sub._applySubscribe(reply({ offset: 10 }))).toBe(false);
    expect(sub.state).toBe('subscribed');
    expect(sub.position).toEqual({ epoch: 'e1', offset: 10 });
    await expect(sub.ready()).resolves.toBeUndefined();
    expect(log).toEqual(['subscribed:10:false:false']);
  });

  it('moves the position only through applied publications, and reports a hole instead of delivering', () => {
    const { sub } = subscribedAt(10);
    const log = record(sub);
    expect(sub._applyPublication(pub(11))).toBe(false);
    expect(sub._applyPublication(pub(12))).toBe(false);
    expect(sub._applyPublication(pub(12))).toBe(false); // duplicate: dropped
    expect(sub.position).toEqual({ epoch: 'e1', offset: 12 });
    expect(sub._applyPublication(pub(14))).toBe(true); // 13 is missing: resync
    expect(sub.position).toEqual({ epoch: 'e1', offset: 12 });
    expect(log).toEqual(['pub:11', 'pub:12']);
    // The position a resubscribe asks for is the last one delivered, not the one after the hole.
    sub._resubscribing();
    expect(sub.state).toBe('subscribing');
    expect(sub._subscribeSent()).toEqual({ epoch: 'e1', offset: 12 });
  });

  it('drops pushes while (re)subscribing: they belong to the previous server-side subscription', () => {
    const { sub } = subscribedAt(5);
    const log = record(sub);
    sub._connectionLost();
    expect(sub.state).toBe('subscribing');
    expect(sub._applyPublication(pub(6))).toBe(false);
    sub._applyPresence('join', { user: 'u', client: 'c' });
    expect(sub.position).toEqual({ epoch: 'e1', offset: 5 });
    expect(log).toEqual([]);
  });

  it('resubscribe with recovery: asks from the position, delivers the missed ones after subscribed', () => {
    const { sub } = subscribedAt(5);
    const log = record(sub);
    sub._connectionLost();
    expect(sub._subscribeSent()).toEqual({ epoch: 'e1', offset: 5 });
    const gap = sub._applySubscribe(reply({ offset: 7, recovered: true, publications: [pub(7), pub(6)] }));
    expect(gap).toBe(false);
    expect(log).toEqual(['subscribed:7:true:true', 'pub:6', 'pub:7']);
    expect(sub.position).toEqual({ epoch: 'e1', offset: 7 });
  });

  it('a hole inside a recovered batch stops delivery before it and asks for a resync', () => {
    const { sub } = subscribedAt(5);
    const log = record(sub);
    sub._connectionLost();
    sub._subscribeSent();
    const gap = sub._applySubscribe(reply({ offset: 8, recovered: true, publications: [pub(6), pub(8)] }));
    expect(gap).toBe(true);
    expect(log).toEqual(['subscribed:8:true:true', 'pub:6']);
    expect(sub.position).toEqual({ epoch: 'e1', offset: 6 });
  });

  it('failed recovery: recoveryFailed with the position asked, then the new stream', () => {
    const { sub } = subscription({ since: { epoch: 'old', offset: 40 } });
    const log = record(sub);
    expect(sub._subscribeSent()).toEqual({ epoch: 'old', offset: 40 });
    sub._applySubscribe(reply({ epoch: 'e2', offset: 3, recovered: false }));
    expect(log).toEqual(['recoveryFailed:40->e2:3', 'subscribed:3:false:false']);
    expect(sub.position).toEqual({ epoch: 'e2', offset: 3 });
    sub._applyPublication(pub(4));
    expect(log.at(-1)).toBe('pub:4');
  });

  it('→ unsubscribed: ends once, rejects ready(), drops later pushes, reports the error first', async () => {
    const { sub } = subscribedAt(1);
    const log = record(sub);
    sub._end(103, 'permission denied', new HeraldError(103, 'permission denied'));
    sub._end(0, 'again');
    expect(sub.state).toBe('unsubscribed');
    expect(log).toEqual(['error:103', 'unsubscribed:103']);
    await expect(sub.ready()).rejects.toMatchObject({ code: 103 });
    expect(sub._applyPublication(pub(2))).toBe(false);
    sub._resubscribing();
    expect(sub.state).toBe('unsubscribed');
    expect(sub._needsSubscribe).toBe(false);
    expect(log).toHaveLength(2);
  });

  it('unsubscribe() asks the host to remove it, once it is over it does nothing', () => {
    const { sub, host } = subscribedAt(1);
    sub.unsubscribe();
    expect(host.removed).toEqual([{ channel: 'chat', code: ClientCode.UnsubscribeCalled }]);
    expect(sub.state).toBe('subscribed'); // the host decides; it ends the subscription
    sub._end(ClientCode.UnsubscribeCalled, 'unsubscribe called');
    sub.unsubscribe();
    expect(host.removed).toHaveLength(1);
  });

  it('a throwing listener is reported to the host and neither stops the batch nor the position', () => {
    const seen: number[] = [];
    const { sub, host } = subscribedAt(0, {
      onPublication: (p) => {
        if (p.offset === 1) throw new Error('app bug');
        seen.push(p.offset);
      },
    });
    const alsoSeen: number[] = [];
    sub.on('publication', (p) => alsoSeen.push(p.offset));
    sub._applyPublication(pub(1));
    sub._applyPublication(pub(2));
    expect(seen).toEqual([2]);
    expect(alsoSeen).toEqual([1, 2]);
    expect(host.listenerErrors).toHaveLength(1);
    expect(sub.position).toEqual({ epoch: 'e1', offset: 2 });
  });

  it('option callbacks and on() listeners receive the same events; off() removes a listener', () => {
    const fromOption: number[] = [];
    const fromOn: number[] = [];
    const { sub } = subscribedAt(0, { onPublication: (p) => fromOption.push(p.offset) });
    const off = sub.on('publication', (p) => fromOn.push(p.offset));
    sub._applyPublication(pub(1));
    off();
    sub._applyPublication(pub(2));
    expect(fromOption).toEqual([1, 2]);
    expect(fromOn).toEqual([1]);
  });
});

describe('Subscription tokens and timers', () => {
  it('invalidating a token needs getToken; fetching one clears the need and marks the subscription busy meanwhile', async () => {
    expect(subscription({ token: 'fixed' }).sub._invalidateToken()).toBe(false);

    let give: (t: string) => void = () => {};
    const { sub } = subscription({ getToken: () => new Promise<string>((r) => (give = r)) });
    expect(sub._needsToken).toBe(true);
    const fetched = sub._fetchTokenToSubscribe();
    expect(sub._busy).toBe(true);
    give('T1');
    await expect(fetched).resolves.toBe('T1');
    expect(sub._busy).toBe(false);
    expect(sub._needsToken).toBe(false);
    expect(sub._token).toBe('T1');
    expect(sub._invalidateToken()).toBe(true);
    expect(sub._needsToken).toBe(true);
  });

  it('getToken returning nothing resolves to undefined and keeps the need for a token', async () => {
    const { sub } = subscription({ getToken: () => '' });
    await expect(sub._fetchTokenToSubscribe()).resolves.toBeUndefined();
    expect(sub._needsToken).toBe(true);
    expect(sub._busy).toBe(false);
  });

  it('one retry at a time; a lost connection cancels it', async () => {
    vi.useFakeTimers();
    const { sub } = subscription();
    let runs = 0;
    sub._retryLater(() => runs++);
    sub._retryLater(() => runs++); // already pending: ignored
    expect(sub._needsSubscribe).toBe(false);
    await vi.advanceTimersByTimeAsync(10_000);
    expect(runs).toBe(1);
    sub._retryLater(() => runs++);
    sub._connectionLost();
    expect(sub._needsSubscribe).toBe(true);
    await vi.advanceTimersByTimeAsync(20_000);
    expect(runs).toBe(1);
  });

  it('schedules the token refresh ahead of expiry, only with getToken, and not after the end', async () => {
    vi.useFakeTimers();
    let refreshes = 0;
    const fixed = subscription({ token: 'T' }).sub;
    fixed._scheduleTokenRefresh(60, () => refreshes++);
    const { sub } = subscription({ getToken: () => 'T' });
    sub._scheduleTokenRefresh(60, () => refreshes++);
    await vi.advanceTimersByTimeAsync(49_999);
    expect(refreshes).toBe(0);
    await vi.advanceTimersByTimeAsync(1);
    expect(refreshes).toBe(1); // 10 s before the 60 s expiry
    sub._scheduleTokenRefresh(60, () => refreshes++);
    sub._end(0, 'done');
    await vi.advanceTimersByTimeAsync(120_000);
    expect(refreshes).toBe(1);
  });
});
