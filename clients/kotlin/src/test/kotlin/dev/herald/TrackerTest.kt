package dev.herald.client

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test

class TrackerTest {
    private fun reply(epoch: String, offset: Long, recovered: Boolean?, vararg pubs: Long) =
        SubscribeReply(epoch, offset, true, recovered, pubs.map { Publication(it, it, null) }, null, null, null)

    @Test
    fun recoversExactlyTheMissedOnes() {
        val t = StreamTracker(null)
        t.applySubscribe(reply("e", 3, null), null)
        assertEquals(StreamPosition("e", 3), t.since())
        assertEquals(Verdict.DELIVER, t.applyPublication(Publication(4, null, null)))
        assertEquals(Verdict.DUPLICATE, t.applyPublication(Publication(4, null, null)))
        assertEquals(Verdict.GAP, t.applyPublication(Publication(6, null, null)))
        val out = t.applySubscribe(reply("e", 7, true, 3, 4, 5, 6, 7), StreamPosition("e", 4))
        assertTrue(out.recovered)
        assertFalse(out.gap)
        assertEquals(listOf(5L, 6L, 7L), out.publications.map { it.offset })
    }

    @Test
    fun epochChangeIsAFailedRecovery() {
        val t = StreamTracker(StreamPosition("old", 9))
        val out = t.applySubscribe(reply("new", 2, true, 1, 2), StreamPosition("old", 9))
        assertTrue(out.recoveryFailed)
        assertTrue(out.publications.isEmpty())
        assertEquals(StreamPosition("new", 2), t.since())
    }

    @Test
    fun holeInTheRecoveredBatchIsAGap() {
        val t = StreamTracker(StreamPosition("e", 1))
        val out = t.applySubscribe(reply("e", 5, true, 2, 4, 5), StreamPosition("e", 1))
        assertTrue(out.gap)
        assertEquals(listOf(2L), out.publications.map { it.offset })
    }
}
