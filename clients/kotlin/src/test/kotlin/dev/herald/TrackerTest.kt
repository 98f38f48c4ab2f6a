package dev.herald.client

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.json.JSONObject

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
    fun skipMovesThePositionIgnoresStaleOnesAndRevealsHoles() {
        val t = StreamTracker(null)
        t.applySubscribe(reply("e", 3, null), null)
        assertEquals(Verdict.DELIVER, t.applySkip(4, 7))
        assertEquals(StreamPosition("e", 7), t.since())
        assertEquals(Verdict.DUPLICATE, t.applySkip(5, 7))
        assertEquals(Verdict.DELIVER, t.applyPublication(Publication(8, null, null)))
        assertEquals(Verdict.GAP, t.applySkip(10, 12))
        assertEquals(StreamPosition("e", 8), t.since())
        // With a tag filter, offsets have holes that are no gaps: the skip just moves the position.
        val f = StreamTracker(StreamPosition("e", 3), filtered = true)
        assertEquals(Verdict.DELIVER, f.applySkip(10, 12))
        assertEquals(StreamPosition("e", 12), f.since())
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

    @Test
    fun publicationWithoutOffsetMovesNothing() {
        val t = StreamTracker(null)
        t.applySubscribe(reply("e", 4, null), null)
        // skip_history: no offset (0), delivered live, the position stays at 4.
        assertEquals(Verdict.DELIVER, t.applyPublication(Publication(0, null, null)))
        assertEquals(StreamPosition("e", 4), t.since())
        assertEquals(Verdict.DELIVER, t.applyPublication(Publication(5, null, null)))
    }

    @Test
    fun filteredHolesAreNoGaps() {
        val t = StreamTracker(null, filtered = true)
        t.applySubscribe(reply("e", 4, null), null)
        assertEquals(Verdict.DELIVER, t.applyPublication(Publication(7, null, null)))
        assertEquals(Verdict.DUPLICATE, t.applyPublication(Publication(6, null, null)))
        // Recovery returns the matches only; the position then is the stream's newest.
        val out = t.applySubscribe(reply("e", 12, true, 9, 11), StreamPosition("e", 7))
        assertFalse(out.gap)
        assertEquals(listOf(9L, 11L), out.publications.map { it.offset })
        assertEquals(StreamPosition("e", 12), t.since())
    }

    @Test
    fun tagFilterJson() {
        val f = TagFilter.Node(
            "and",
            listOf(TagFilter.Leaf("kind", "eq", ""), TagFilter.Leaf("lang", "in", values = listOf("en")), TagFilter.Leaf("d", "nex")),
        )
        val want = """{"op":"and","nodes":[{"key":"kind","cmp":"eq","val":""},{"key":"lang","cmp":"in","vals":["en"]},{"key":"d","cmp":"nex"}]}"""
        assertTrue(JSONObject(want).similar(f.toJson()), f.toJson().toString())
    }
}
