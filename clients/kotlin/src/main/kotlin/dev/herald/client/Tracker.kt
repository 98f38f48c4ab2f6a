package dev.herald.client

import org.json.JSONObject

internal class SubscribeReply(
    val epoch: String, val offset: Long, val recoverable: Boolean, val recovered: Boolean?,
    val publications: List<Publication>, val expiresIn: Double?, val data: Any?, val error: ReplyException?,
) {
    companion object {
        fun fromJson(o: JSONObject): SubscribeReply {
            val err = o.optJSONObject("error")?.let { ReplyException(it.optInt("code", -1), it.optString("message", "")) }
            return SubscribeReply(
                o.optString("epoch", ""), o.optLong("offset", 0), o.optBoolean("recoverable", true),
                if (o.has("recovered")) o.optBoolean("recovered") else null,
                Publication.list(o.optJSONArray("publications")),
                if (o.has("expires_in")) o.optDouble("expires_in") else null, o.opt("data"), err,
            )
        }
    }
}

internal class SubscribeOutcome(
    val publications: List<Publication> = emptyList(), val recoveryFailed: Boolean = false,
    val gap: Boolean = false, val recovered: Boolean = false,
)

internal enum class Verdict { DELIVER, DUPLICATE, GAP }

/**
 * The recovery bookkeeping of one subscription: the (epoch, offset) handed to the app. No I/O, no
 * locking. [filtered]: the subscription has a tag filter, so the server leaves out what it does not
 * match and offsets have holes that are no gaps (continuity is the server's: `unsub` 4003).
 */
internal class StreamTracker(since: StreamPosition?, private val filtered: Boolean = false) {
    var epoch = since?.epoch ?: ""
    var known = since != null
    var offset = since?.offset ?: 0L
    var recoverable = since != null

    fun since(): StreamPosition? = if (known && recoverable) StreamPosition(epoch, offset) else null

    fun position(): StreamPosition? = if (known) StreamPosition(epoch, offset) else null

    fun applySubscribe(r: SubscribeReply, asked: StreamPosition?): SubscribeOutcome {
        recoverable = r.recoverable
        if (asked == null) {
            epoch = r.epoch; offset = r.offset; known = true
            return SubscribeOutcome()
        }
        // A "recovery" across an epoch change counts as failed: offsets of two epochs do not compare.
        val recovered = r.recovered == true && r.epoch == asked.epoch
        if (!recovered) {
            epoch = r.epoch; offset = r.offset; known = true
            return SubscribeOutcome(recoveryFailed = true)
        }
        if (!known || epoch != r.epoch) {
            epoch = r.epoch; offset = asked.offset; known = true
        }
        val out = ArrayList<Publication>()
        var gap = false
        for (p in r.publications.sortedBy { it.offset }) {
            if (p.offset <= offset) continue // already delivered
            if (p.offset != offset + 1 && !filtered) {
                gap = true
                break
            }
            out.add(p)
            offset = p.offset
        }
        // A filtered recovery ends at its last match; the stream's newest is our position after it.
        if (filtered && r.offset > offset) offset = r.offset
        if (!gap && r.offset > offset) gap = true
        return SubscribeOutcome(out, gap = gap, recovered = true)
    }

    /**
     * A `skip` push: [from]..[to] were left out by the backpressure policy and are not recovered.
     * DELIVER: the position moves to [to]; DUPLICATE: all at or behind it (stale); GAP: [from] is
     * past the next offset (a hole before the skip: recover it).
     */
    fun applySkip(from: Long, to: Long): Verdict {
        if (!recoverable || !known) return Verdict.DELIVER
        if (to <= offset) return Verdict.DUPLICATE
        if (from > offset + 1 && !filtered) return Verdict.GAP
        offset = to
        return Verdict.DELIVER
    }

    fun applyPublication(p: Publication): Verdict {
        if (!recoverable || !known) return Verdict.DELIVER
        // No offset (0): kept out of history (`skip_history`), live only; the position stays.
        if (p.offset == 0L) return Verdict.DELIVER
        if (p.offset <= offset) return Verdict.DUPLICATE
        if (p.offset != offset + 1 && !filtered) return Verdict.GAP
        offset = p.offset
        return Verdict.DELIVER
    }
}
