// The SDK's Fossil delta applier on deltas made by the server's Rust crate (fossil-delta 0.2), and
// a subscription with delta compression rebuilding live publications from them.
import { describe, expect, it } from 'vitest';
import { DeltaError, applyDeltaText } from '../../src/fossil.js';
import { Subscription, type SubscriptionHost } from '../../src/subscription.js';

const BOOK1 =
  '{"symbol":"HRLD-USD","seq":1,"bids":[{"price":"100.00","size":10},{"price":"99.50","size":20},{"price":"99.00","size":30}],"note":"é日本"}';
const BOOK2 =
  '{"symbol":"HRLD-USD","seq":2,"bids":[{"price":"100.00","size":11},{"price":"99.50","size":20},{"price":"99.00","size":30}],"note":"é日本"}';
// fossil_delta::delta(BOOK2, BOOK1) and fossil_delta::delta("[1,2,3]", "short"), as the server makes them.
const DELTA_1_2 = '2D\nR@0,1:2Z@S,1:11D@10,25Lx3M;';
const DELTA_SHORT = '7\n7:[1,2,3]27P8_n;';

describe('applyDeltaText', () => {
  it('rebuilds what the server encoded, multi-byte characters included', () => {
    expect(applyDeltaText(BOOK1, DELTA_1_2)).toBe(BOOK2);
    expect(applyDeltaText('short', DELTA_SHORT)).toBe('[1,2,3]');
  });

  it('refuses a delta applied to another base (checksum) and malformed ones', () => {
    expect(() => applyDeltaText(BOOK1.replace('HRLD', 'XXXX'), DELTA_1_2)).toThrow(DeltaError);
    expect(() => applyDeltaText(BOOK1.slice(0, 40), DELTA_1_2)).toThrow(DeltaError);
    expect(() => applyDeltaText(BOOK1, '2D\nR@0,')).toThrow(DeltaError);
    expect(() => applyDeltaText(BOOK1, 'zz')).toThrow(DeltaError);
    expect(() => applyDeltaText(BOOK1, '2D\nR?0,')).toThrow(DeltaError);
  });
});

class Host implements SubscriptionHost {
  removeSubscription(): void {}
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
    throw error;
  }
}

function subscribed() {
  const sub = new Subscription<unknown>(new Host(), 'book', { delta: 'fossil' });
  const got: Array<[number, unknown]> = [];
  sub.on('publication', (p) => got.push([p.offset, p.data]));
  sub._subscribeSent();
  sub._replyArrived();
  sub._applySubscribe({ epoch: 'e', offset: 4, recoverable: true, delta: true });
  return { sub, got };
}

describe('a subscription with delta compression', () => {
  it('is sent alone with its delta option', () => {
    const sub = new Subscription(new Host(), 'book', { delta: 'fossil' });
    expect(sub._sentAlone).toBe(true);
    expect(sub._delta).toBe('fossil');
  });

  it('parses the full text and applies deltas to the text it holds', () => {
    const { sub, got } = subscribed();
    expect(sub._applyPublication({ offset: 5, data: BOOK1, delta: false })).toBe(false);
    expect(sub._applyPublication({ offset: 6, data: DELTA_1_2, delta: true })).toBe(false);
    expect(got).toEqual([
      [5, JSON.parse(BOOK1)],
      [6, JSON.parse(BOOK2)],
    ]);
  });

  it('keeps the tags of publications it rebuilds', () => {
    const sub = new Subscription<unknown>(new Host(), 'book', { delta: 'fossil' });
    const tags: Array<Record<string, string> | undefined> = [];
    sub.on('publication', (p) => tags.push(p.tags));
    sub._subscribeSent();
    sub._replyArrived();
    sub._applySubscribe({ epoch: 'e', offset: 4, recoverable: true, delta: true });
    sub._applyPublication({ offset: 5, data: BOOK1, delta: false, tags: { side: 'bid' } });
    sub._applyPublication({ offset: 6, data: DELTA_1_2, delta: true, tags: { side: 'ask' } });
    expect(tags).toEqual([{ side: 'bid' }, { side: 'ask' }]);
  });

  it('resyncs on a delta it has no base for, or one that does not apply', () => {
    const first = subscribed();
    expect(first.sub._applyPublication({ offset: 5, data: DELTA_1_2, delta: true })).toBe(true);
    expect(first.got).toEqual([]);

    const second = subscribed();
    const other = BOOK1.replace('HRLD', 'XXXX');
    second.sub._applyPublication({ offset: 5, data: other, delta: false });
    expect(second.sub._applyPublication({ offset: 6, data: DELTA_1_2, delta: true })).toBe(true);
    expect(second.got).toEqual([[5, JSON.parse(other)]]);

    // A plain publication (queued with the reply) leaves no base behind it.
    const third = subscribed();
    third.sub._applyPublication({ offset: 5, data: JSON.parse(BOOK1) });
    expect(third.sub._applyPublication({ offset: 6, data: DELTA_1_2, delta: true })).toBe(true);
  });
});
