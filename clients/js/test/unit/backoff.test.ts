import { describe, expect, it } from 'vitest';
import { Backoff } from '../../src/backoff.js';

describe('Backoff (exponential, full jitter, bounded)', () => {
  it('grows the window exponentially up to the bound', () => {
    const b = new Backoff({ minDelayMs: 100, maxDelayMs: 1000, random: () => 0.5 });
    const windows: number[] = [];
    for (let i = 0; i < 7; i++) {
      windows.push(b.window());
      b.next();
    }
    expect(windows).toEqual([100, 200, 400, 800, 1000, 1000, 1000]);
  });

  it('draws each delay uniformly from [0, window): full jitter', () => {
    const low = new Backoff({ minDelayMs: 100, maxDelayMs: 1000, random: () => 0 });
    const high = new Backoff({ minDelayMs: 100, maxDelayMs: 1000, random: () => 0.9999 });
    for (let i = 0; i < 6; i++) {
      expect(low.next()).toBe(0);
    }
    expect([high.next(), high.next(), high.next(), high.next(), high.next()]).toEqual([99, 199, 399, 799, 999]);
  });

  it('never exceeds the bound with real randomness, even after many failures', () => {
    const b = new Backoff({ minDelayMs: 500, maxDelayMs: 20_000 });
    let max = 0;
    let sum = 0;
    for (let i = 0; i < 2000; i++) {
      const d = b.next();
      expect(d).toBeGreaterThanOrEqual(0);
      expect(Number.isFinite(d)).toBe(true);
      max = Math.max(max, d);
      sum += d;
    }
    expect(max).toBeLessThan(20_000);
    // Full jitter over a saturated window averages about half the bound.
    expect(sum / 2000).toBeGreaterThan(8_000);
    expect(sum / 2000).toBeLessThan(12_000);
  });

  it('honours a server after_ms as a floor', () => {
    const b = new Backoff({ minDelayMs: 100, maxDelayMs: 1000, random: () => 0.5 });
    expect(b.next(3000)).toBe(3000);
    // A floor below the jittered delay does not shorten it.
    const c = new Backoff({ minDelayMs: 1000, maxDelayMs: 1000, random: () => 0.9 });
    expect(c.next(10)).toBe(900);
  });

  it('starts over from the smallest window after reset()', () => {
    const b = new Backoff({ minDelayMs: 100, maxDelayMs: 10_000, random: () => 0.9999 });
    b.next();
    b.next();
    b.next();
    expect(b.attempts).toBe(3);
    b.reset();
    expect(b.attempts).toBe(0);
    expect(b.next()).toBe(99);
  });

  it('clamps nonsense options', () => {
    const b = new Backoff({ minDelayMs: -5, maxDelayMs: -10, factor: 0, random: () => 0.5 });
    expect(b.window()).toBe(1);
    expect(b.next()).toBe(0);
  });
});
