// Reconnect delays: exponential backoff with full jitter, bounded above.
//
// Full jitter (delay uniform in [0, min(max, min·factor^attempt)]) spreads a crowd of clients that
// lost the same server at the same moment over the whole window, which is what stops a deploy from
// turning into a reconnect storm. A server hint (`after_ms`) is a floor: the server has already
// jittered it, and we never come back earlier than it asked.

export interface BackoffOptions {
  /** Upper bound of the first window, ms. Default 500. */
  minDelayMs?: number;
  /** The window never grows past this, ms. Default 20000. */
  maxDelayMs?: number;
  /** Growth per failed attempt. Default 2. */
  factor?: number;
  /** Source of randomness in [0, 1); injectable for tests. */
  random?: () => number;
}

export class Backoff {
  private attempt = 0;
  private readonly min: number;
  private readonly max: number;
  private readonly factor: number;
  private readonly random: () => number;

  constructor(opts: BackoffOptions = {}) {
    this.min = Math.max(1, opts.minDelayMs ?? 500);
    this.max = Math.max(this.min, opts.maxDelayMs ?? 20_000);
    this.factor = Math.max(1, opts.factor ?? 2);
    this.random = opts.random ?? Math.random;
  }

  /** How many delays were handed out since the last reset. */
  get attempts(): number {
    return this.attempt;
  }

  /** The upper bound of the window for the current attempt. */
  window(): number {
    // Cap the exponent so factor^attempt cannot overflow to Infinity after many failures.
    const exp = Math.min(this.attempt, 64);
    return Math.min(this.max, this.min * this.factor ** exp);
  }

  /** The next delay in ms; `floorMs` (a server `after_ms`) is honoured as a minimum. */
  next(floorMs?: number): number {
    const window = this.window();
    this.attempt++;
    const jittered = Math.floor(this.random() * window);
    const floor = typeof floorMs === 'number' && floorMs > 0 ? floorMs : 0;
    return Math.max(floor, jittered);
  }

  /** A connection succeeded: start again from the smallest window. */
  reset(): void {
    this.attempt = 0;
  }
}
