// Recovery bookkeeping for one subscription: the (epoch, offset) we have handed to the app, and the
// decisions that make delivery exactly-once and in order.
//
// The server promises per-channel offset order and all-or-nothing recovery. The SDK still checks
// every publication against the position it tracks, because the cost is one comparison and the
// failure it guards against (a duplicate after a reconnect race, a hole after a broker hiccup) is
// exactly the one apps cannot see. Pure logic: no timers, no I/O.

import type { Publication, StreamPosition, SubscribeResult } from './codec.js';

/** What to do with one live publication. */
export type PubVerdict =
  /** Next in order: hand it to the app. */
  | 'deliver'
  /** At or before the position already delivered: drop it silently. */
  | 'duplicate'
  /** Something between the position and this offset is missing: resubscribe with `since`. */
  | 'gap';

export interface SubscribeOutcome {
  /** Recovered publications to hand to the app, in offset order, none already delivered. */
  publications: Publication[];
  /** True when we asked to recover and the server could not: the app must reload its state. */
  recoveryFailed: boolean;
  /** True when the recovered batch ends before the stream's newest offset (should not happen). */
  gap: boolean;
  /** Whether this reply recovered missed publications. */
  recovered: boolean;
}

export class StreamTracker {
  private epoch: string | undefined;
  private offset = 0;
  private recoverable = false;
  /**
   * The subscription has a tag filter: the server leaves out what it does not match, so offsets
   * have holes that are no gaps (continuity is the server's: it sends `unsub` 4003 when lost).
   */
  private readonly filtered: boolean;

  /** `since` lets an app resume from a position it persisted (e.g. across page loads). */
  constructor(since?: StreamPosition, filtered = false) {
    this.filtered = filtered;
    if (since && typeof since.epoch === 'string' && Number.isFinite(since.offset)) {
      this.epoch = since.epoch;
      this.offset = since.offset;
      this.recoverable = true;
    }
  }

  /** The position to send as `since` when (re)subscribing, if the channel can be recovered. */
  since(): StreamPosition | undefined {
    if (this.epoch === undefined || !this.recoverable) return undefined;
    return { epoch: this.epoch, offset: this.offset };
  }

  /** The last position handed to the app (for persisting), if known. */
  position(): StreamPosition | undefined {
    if (this.epoch === undefined) return undefined;
    return { epoch: this.epoch, offset: this.offset };
  }

  /**
   * Apply a subscribe result. `asked` is the `since` that was sent with this subscribe (undefined
   * for a fresh subscription).
   */
  applySubscribe(result: SubscribeResult, asked: StreamPosition | undefined): SubscribeOutcome {
    const epoch = String(result.epoch ?? '');
    const newest = typeof result.offset === 'number' ? result.offset : 0;
    this.recoverable = result.recoverable !== false;

    if (asked === undefined) {
      // Fresh subscription: the stream starts for us after the newest offset at reply time.
      this.epoch = epoch;
      this.offset = newest;
      return { publications: [], recoveryFailed: false, gap: false, recovered: false };
    }

    // A reply that claims recovery across an epoch change contradicts the protocol; treat it as
    // failed, because offsets of two epochs cannot be compared.
    const recovered = result.recovered === true && epoch === asked.epoch;
    if (!recovered) {
      this.epoch = epoch;
      this.offset = newest;
      return { publications: [], recoveryFailed: true, gap: false, recovered: false };
    }

    // Our own position may have moved past `asked` if live publications were delivered after the
    // subscribe was sent; compare against the position, not the request.
    if (this.epoch !== epoch) {
      this.epoch = epoch;
      this.offset = asked.offset;
    }
    const pubs = [...(result.publications ?? [])]
      .filter((p) => typeof p.offset === 'number')
      .sort((a, b) => a.offset - b.offset);
    const out: Publication[] = [];
    let gap = false;
    for (const p of pubs) {
      if (p.offset <= this.offset) continue; // duplicate of something already delivered
      if (p.offset !== this.offset + 1 && !this.filtered) {
        gap = true; // a hole inside the recovered batch: stop before it, resubscribe from here
        break;
      }
      out.push(p);
      this.offset = p.offset;
    }
    // A filtered recovery ends at its last match; the stream's newest is our position after it.
    if (this.filtered && newest > this.offset) this.offset = newest;
    if (!gap && newest > this.offset) gap = true;
    return { publications: out, recoveryFailed: false, gap, recovered: true };
  }

  /**
   * The server left `from..to` out (backpressure): move past them. 'gap' when `from` is not the
   * next offset (a hole before the skip: recover), 'duplicate' when it is all behind us.
   */
  applySkip(from: number, to: number): PubVerdict {
    if (!this.recoverable || this.epoch === undefined) return 'deliver';
    if (to <= this.offset) return 'duplicate';
    if (from > this.offset + 1 && !this.filtered) return 'gap';
    this.offset = to;
    return 'deliver';
  }

  /** Check one live publication and advance the position when it is delivered. */
  applyPublication(pub: Publication): PubVerdict {
    // Channels without history have no usable offsets; pass everything through.
    if (!this.recoverable || this.epoch === undefined) return 'deliver';
    // No offset: kept out of history (`skip_history`), live only; the position stays.
    if (typeof pub.offset !== 'number' || pub.offset === 0) return 'deliver';
    if (pub.offset <= this.offset) return 'duplicate';
    if (pub.offset !== this.offset + 1 && !this.filtered) return 'gap';
    this.offset = pub.offset;
    return 'deliver';
  }
}
