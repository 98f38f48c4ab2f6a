import { describe, expect, it } from 'vitest';
import { StreamTracker } from '../../src/recovery.js';

const pub = (offset: number) => ({ offset, data: offset });

describe('StreamTracker', () => {
  it('starts a fresh subscription after the newest offset and delivers in order', () => {
    const t = new StreamTracker();
    expect(t.since()).toBeUndefined();
    const o = t.applySubscribe({ epoch: 'e1', offset: 10, recoverable: true }, undefined);
    expect(o).toEqual({ publications: [], recoveryFailed: false, gap: false, recovered: false });
    expect(t.position()).toEqual({ epoch: 'e1', offset: 10 });
    expect(t.applyPublication(pub(11))).toBe('deliver');
    expect(t.applyPublication(pub(12))).toBe('deliver');
    expect(t.since()).toEqual({ epoch: 'e1', offset: 12 });
  });

  it('drops duplicates and flags holes', () => {
    const t = new StreamTracker();
    t.applySubscribe({ epoch: 'e1', offset: 0, recoverable: true }, undefined);
    expect(t.applyPublication(pub(1))).toBe('deliver');
    expect(t.applyPublication(pub(1))).toBe('duplicate');
    expect(t.applyPublication(pub(3))).toBe('gap');
    // A hole does not move the position: recovery starts from the last delivered offset.
    expect(t.since()).toEqual({ epoch: 'e1', offset: 1 });
    expect(t.applyPublication(pub(2))).toBe('deliver');
  });

  it('moves past a skip (backpressure) without a resync, and flags a hole before one', () => {
    const t = new StreamTracker();
    t.applySubscribe({ epoch: 'e1', offset: 4, recoverable: true }, undefined);
    expect(t.applySkip(5, 9)).toBe('deliver');
    expect(t.since()).toEqual({ epoch: 'e1', offset: 9 });
    expect(t.applyPublication(pub(10))).toBe('deliver');
    expect(t.applySkip(3, 10)).toBe('duplicate');
    expect(t.applySkip(12, 14)).toBe('gap');
    expect(t.since()).toEqual({ epoch: 'e1', offset: 10 });
  });

  it('delivers recovered publications after the position, sorted and without duplicates', () => {
    const t = new StreamTracker();
    t.applySubscribe({ epoch: 'e1', offset: 4, recoverable: true }, undefined);
    t.applyPublication(pub(5));
    const asked = t.since();
    expect(asked).toEqual({ epoch: 'e1', offset: 5 });
    const o = t.applySubscribe(
      {
        epoch: 'e1',
        offset: 8,
        recoverable: true,
        recovered: true,
        publications: [pub(7), pub(4), pub(5), pub(6), pub(8), pub(6)],
      },
      asked,
    );
    expect(o.recovered).toBe(true);
    expect(o.recoveryFailed).toBe(false);
    expect(o.gap).toBe(false);
    expect(o.publications.map((p) => p.offset)).toEqual([6, 7, 8]);
    expect(t.position()).toEqual({ epoch: 'e1', offset: 8 });
    expect(t.applyPublication(pub(8))).toBe('duplicate');
    expect(t.applyPublication(pub(9))).toBe('deliver');
  });

  it('reports failed recovery and restarts from the new stream', () => {
    const t = new StreamTracker({ epoch: 'old', offset: 50 });
    expect(t.since()).toEqual({ epoch: 'old', offset: 50 });
    const o = t.applySubscribe({ epoch: 'new', offset: 3, recoverable: true, recovered: false }, t.since());
    expect(o.recoveryFailed).toBe(true);
    expect(o.publications).toEqual([]);
    expect(t.position()).toEqual({ epoch: 'new', offset: 3 });
    expect(t.applyPublication(pub(4))).toBe('deliver');
  });

  it('treats "recovered" across an epoch change as a failure', () => {
    const t = new StreamTracker({ epoch: 'a', offset: 5 });
    const o = t.applySubscribe(
      { epoch: 'b', offset: 2, recoverable: true, recovered: true, publications: [pub(1), pub(2)] },
      t.since(),
    );
    expect(o.recoveryFailed).toBe(true);
    expect(o.publications).toEqual([]);
  });

  it('stops a recovered batch at a hole and asks for a resync', () => {
    const t = new StreamTracker({ epoch: 'e', offset: 1 });
    const o = t.applySubscribe(
      { epoch: 'e', offset: 5, recoverable: true, recovered: true, publications: [pub(2), pub(3), pub(5)] },
      t.since(),
    );
    expect(o.publications.map((p) => p.offset)).toEqual([2, 3]);
    expect(o.gap).toBe(true);
    expect(t.since()).toEqual({ epoch: 'e', offset: 3 });
  });

  it('flags a recovered batch that ends before the newest offset', () => {
    const t = new StreamTracker({ epoch: 'e', offset: 1 });
    const o = t.applySubscribe(
      { epoch: 'e', offset: 4, recoverable: true, recovered: true, publications: [pub(2)] },
      t.since(),
    );
    expect(o.gap).toBe(true);
  });

  it('delivers a publication without offset (skip_history) and keeps the position', () => {
    const t = new StreamTracker();
    t.applySubscribe({ epoch: 'e1', offset: 3, recoverable: true }, undefined);
    expect(t.applyPublication({ offset: 0, data: 'live' })).toBe('deliver');
    expect(t.since()).toEqual({ epoch: 'e1', offset: 3 });
    expect(t.applyPublication(pub(4))).toBe('deliver');
    expect(t.applyPublication(pub(6))).toBe('gap');
  });

  it('with a tag filter, takes holes as left out by the filter, not as gaps', () => {
    const t = new StreamTracker(undefined, true);
    t.applySubscribe({ epoch: 'e1', offset: 3, recoverable: true }, undefined);
    expect(t.applyPublication(pub(6))).toBe('deliver');
    expect(t.applyPublication(pub(6))).toBe('duplicate');
    expect(t.applyPublication(pub(5))).toBe('duplicate');
    expect(t.applyPublication(pub(9))).toBe('deliver');
    expect(t.since()).toEqual({ epoch: 'e1', offset: 9 });
    expect(t.applySkip(12, 14)).toBe('deliver');
    expect(t.since()).toEqual({ epoch: 'e1', offset: 14 });
    // Recovery returns only the matches after the position; the stream's newest becomes it.
    const o = t.applySubscribe(
      { epoch: 'e1', offset: 30, recoverable: true, recovered: true, publications: [pub(20), pub(17)] },
      t.since(),
    );
    expect(o.publications.map((p) => p.offset)).toEqual([17, 20]);
    expect(o.gap).toBe(false);
    expect(t.since()).toEqual({ epoch: 'e1', offset: 30 });
    expect(t.applyPublication(pub(33))).toBe('deliver');
  });

  it('passes everything through on channels without history', () => {
    const t = new StreamTracker();
    t.applySubscribe({ epoch: '', offset: 0, recoverable: false }, undefined);
    expect(t.since()).toBeUndefined();
    expect(t.applyPublication(pub(0))).toBe('deliver');
    expect(t.applyPublication(pub(0))).toBe('deliver');
  });
});
