package dev.herald.client

import java.util.concurrent.ThreadLocalRandom

/**
 * Reconnect delays: exponential backoff with full jitter. The delay of attempt n is uniform in
 * `[0, min(max, min·2^n))`; a server hint (`after_ms`) is a floor. Thread-safe.
 */
class Backoff @JvmOverloads constructor(minMs: Long = 500, maxMs: Long = 20_000) {
    val minMs: Long = if (minMs > 0) minMs else 500
    val maxMs: Long = maxOf(if (maxMs > 0) maxMs else 20_000, this.minMs)
    private var attempt = 0

    /** Delays handed out since the last [reset]. */
    @get:Synchronized
    val attempts: Int get() = attempt

    /** Upper bound of the window for the current attempt. */
    @Synchronized
    fun window(): Long {
        val w = minMs.toDouble() * Math.pow(2.0, minOf(attempt, 62).toDouble())
        return if (w >= maxMs) maxMs else w.toLong()
    }

    /** The next delay in ms, counting an attempt; [floorMs] (the server's after_ms) is a minimum. */
    @Synchronized
    @JvmOverloads
    fun next(floorMs: Long = 0): Long {
        val w = window()
        attempt++
        val d = (ThreadLocalRandom.current().nextDouble() * w).toLong()
        return maxOf(d, floorMs)
    }

    /** Start again from the smallest window (after a successful connection). */
    @Synchronized
    fun reset() {
        attempt = 0
    }
}
