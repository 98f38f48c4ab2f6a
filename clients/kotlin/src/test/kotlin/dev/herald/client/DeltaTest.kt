package dev.herald.client

import org.json.JSONObject
import org.junit.jupiter.api.Assertions.assertArrayEquals
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.Timeout
import java.util.concurrent.LinkedBlockingQueue
import java.util.concurrent.TimeUnit

/**
 * The Fossil delta applier on deltas made by the server's Rust crate (fossil-delta 0.2; the same
 * vectors as the JS SDK's test), and a subscription with delta compression rebuilding live
 * publications from them.
 */
@Timeout(30)
class DeltaTest {
    companion object {
        const val BOOK1 =
            """{"symbol":"HRLD-USD","seq":1,"bids":[{"price":"100.00","size":10},{"price":"99.50","size":20},{"price":"99.00","size":30}],"note":"é日本"}"""
        const val BOOK2 =
            """{"symbol":"HRLD-USD","seq":2,"bids":[{"price":"100.00","size":11},{"price":"99.50","size":20},{"price":"99.00","size":30}],"note":"é日本"}"""
        // fossil_delta::delta(BOOK2, BOOK1) and fossil_delta::delta("[1,2,3]", "short"), as the server makes them.
        const val DELTA_1_2 = "2D\nR@0,1:2Z@S,1:11D@10,25Lx3M;"
        const val DELTA_SHORT = "7\n7:[1,2,3]27P8_n;"
    }

    @Test
    fun rebuildsWhatTheServerEncoded() {
        assertEquals(BOOK2, Fossil.applyText(BOOK1, DELTA_1_2))
        assertEquals("[1,2,3]", Fossil.applyText("short", DELTA_SHORT))
        // The byte form: the same delta, multi-byte characters included.
        assertArrayEquals(BOOK2.toByteArray(), Fossil.apply(BOOK1.toByteArray(), DELTA_1_2.toByteArray()))
    }

    @Test
    fun checksumWrapsAndCountsTheTail() {
        // Bytes as big-endian words: 0x01020304 + 0x05000000 (the tail, left-aligned).
        assertEquals(0x06020304L, Fossil.checksum(byteArrayOf(1, 2, 3, 4, 5)))
        // Unsigned bytes, and the sum wraps at 32 bits.
        assertEquals(0xffffffffL, Fossil.checksum(byteArrayOf(-1, -1, -1, -1)))
        assertEquals(0xfffffffeL, Fossil.checksum(ByteArray(8) { -1 }))
    }

    @Test
    fun refusesAWrongBaseAndMalformedDeltas() {
        val bad = listOf(
            BOOK1.replace("HRLD", "XXXX") to DELTA_1_2, // another base of the same length: the checksum
            BOOK1.substring(0, 40) to DELTA_1_2, // a shorter base: a copy past its end
            BOOK1 to "2D\nR@0,", // cut short
            BOOK1 to "zz", // no newline after the size
            BOOK1 to "\n1:a;", // no size
            BOOK1 to "2D\nR?0,", // unknown command
            BOOK1 to "2D\nR@0", // copy without a comma
            BOOK1 to "3\n3:abc", // no checksum command
            BOOK1 to "4\n3:abc0;", // output shorter than its size
            BOOK1 to "2\n3:abc0;", // insert past the output size
            BOOK1 to "3\n9:abc;", // insert past the end of the delta
            BOOK1 to "~~~~~~\n", // a size past 32 bits
            BOOK1 to "3\n3:abc0;", // the checksum of "abc" is not 0
        )
        for ((base, delta) in bad) {
            assertThrows(DeltaException::class.java, { Fossil.applyText(base, delta) }, "applied ${JSONObject.quote(delta)}")
        }
    }

    @Test
    fun refusesAResultThatIsNoUtf8() {
        // A copy of the first byte of "é" alone: the checksum fits, the text does not.
        val base = "é".toByteArray()
        val out = byteArrayOf(base[0])
        val sum = Fossil.checksum(out)
        val digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~"
        var v = sum
        var enc = ""
        do { enc = digits[(v % 64).toInt()] + enc; v /= 64 } while (v > 0)
        val delta = "1\n1@0,$enc;"
        assertArrayEquals(out, Fossil.apply(base, delta.toByteArray()))
        assertThrows(DeltaException::class.java) { Fossil.applyText("é", delta) }
    }

    // --------------------------------------------------------------------------------------------
    // A subscription with delta compression (no connection: its methods are called as the client's
    // loop would call them).

    private class Sub(val sub: Subscription, val client: HeraldClient, val got: LinkedBlockingQueue<PublicationEvent>) {
        /** The publications delivered so far, waiting for the event thread to hand them over. */
        fun delivered(n: Int): List<Pair<Long, Any?>> {
            val out = ArrayList<Pair<Long, Any?>>()
            repeat(n) {
                val e = got.poll(5, TimeUnit.SECONDS) ?: throw AssertionError("only ${out.size} of $n publications within 5 s")
                out.add(e.offset to e.data)
            }
            // Let the event thread run whatever else was queued, then check nothing more came.
            client.dispatch {}
            val extra = got.poll(200, TimeUnit.MILLISECONDS)
            assertNull(extra, "a publication more than expected: ${extra?.offset}")
            return out
        }
    }

    private fun subscribed(tagsFilter: TagFilter? = null): Sub {
        val client = HeraldClient("ws://127.0.0.1:9/ws")
        val got = LinkedBlockingQueue<PublicationEvent>()
        val sub = Subscription(client, "book", SubscribeOptions(tagsFilter = tagsFilter, delta = DeltaType.FOSSIL))
        sub.addListener(object : SubscriptionListener {
            override fun onPublication(event: PublicationEvent) { got.add(event) }
        })
        sub.subscribeSent()
        assertFalse(sub.applySubscribe(SubscribeReply("e", 4, true, null, emptyList(), null, null, null)))
        return Sub(sub, client, got)
    }

    private fun assertJson(want: String, got: Any?) =
        assertTrue(got is JSONObject && got.similar(JSONObject(want)), "got $got, want $want")

    @Test
    fun isSentAloneWithItsDeltaOption() {
        val client = HeraldClient("ws://127.0.0.1:9/ws")
        client.use {
            assertTrue(Subscription(client, "book", SubscribeOptions(delta = DeltaType.FOSSIL)).sentAlone())
            assertFalse(Subscription(client, "book", SubscribeOptions()).sentAlone())
        }
    }

    @Test
    fun parsesTheFullTextAndAppliesDeltasToTheTextItHolds() {
        val s = subscribed()
        s.client.use {
            assertFalse(s.sub.applyPublication(Publication(5, BOOK1, null), false))
            assertFalse(s.sub.applyPublication(Publication(6, DELTA_1_2, null), true))
            // A full one again (the server found no smaller delta), then a delta against it.
            assertFalse(s.sub.applyPublication(Publication(7, BOOK1, null), false))
            assertFalse(s.sub.applyPublication(Publication(8, DELTA_1_2, null), true))
            val got = s.delivered(4)
            assertEquals(listOf(5L, 6L, 7L, 8L), got.map { it.first })
            assertJson(BOOK1, got[0].second)
            assertJson(BOOK2, got[1].second)
            assertJson(BOOK1, got[2].second)
            assertJson(BOOK2, got[3].second)
        }
    }

    @Test
    fun aFullTextThatIsNoJsonResyncs() {
        val s = subscribed()
        s.client.use {
            assertTrue(s.sub.applyPublication(Publication(5, "{not json", null), false))
            s.delivered(0)
        }
    }

    @Test
    fun aScalarTextIsItsValue() {
        val s = subscribed()
        s.client.use {
            assertFalse(s.sub.applyPublication(Publication(5, "\"short\"", null), false))
            assertEquals(listOf(5L to "short"), s.delivered(1))
        }
    }

    @Test
    fun resyncsOnADeltaWithoutBaseOrOneThatDoesNotApply() {
        // No base at all: the first live one is a delta.
        subscribed().let { s ->
            s.client.use {
                assertTrue(s.sub.applyPublication(Publication(5, DELTA_1_2, null), true))
                s.delivered(0)
            }
        }
        // The base is another text: the checksum fails.
        subscribed().let { s ->
            s.client.use {
                val other = BOOK1.replace("HRLD", "XXXX")
                assertFalse(s.sub.applyPublication(Publication(5, other, null), false))
                assertTrue(s.sub.applyPublication(Publication(6, DELTA_1_2, null), true))
                assertJson(other, s.delivered(1).single().second)
            }
        }
        // The base is of another offset than the one before the delta (with a tag filter, where
        // holes in the offsets are no gaps, so only the base's offset tells).
        subscribed(TagFilter.Leaf("k", "ex")).let { s ->
            s.client.use {
                assertFalse(s.sub.applyPublication(Publication(5, BOOK1, null), false))
                assertTrue(s.sub.applyPublication(Publication(7, DELTA_1_2, null), true))
                s.delivered(1)
            }
        }
        // A plain publication (without `delta`) leaves no base behind it.
        subscribed().let { s ->
            s.client.use {
                assertFalse(s.sub.applyPublication(Publication(5, JSONObject(BOOK1), null), null))
                assertTrue(s.sub.applyPublication(Publication(6, DELTA_1_2, null), true))
                s.delivered(1)
            }
        }
        subscribed().let { s ->
            s.client.use {
                assertFalse(s.sub.applyPublication(Publication(5, BOOK1, null), false))
                // Without an offset (skip_history), so only the rule, not the offsets, drops the base.
                assertFalse(s.sub.applyPublication(Publication(0, JSONObject("{}"), null), null))
                assertTrue(s.sub.applyPublication(Publication(6, DELTA_1_2, null), true))
                s.delivered(2)
            }
        }
        // A new subscribe reply forgets the base: its first live publication comes in full.
        subscribed().let { s ->
            s.client.use {
                assertFalse(s.sub.applyPublication(Publication(5, BOOK1, null), false))
                s.sub.subscribeSent()
                s.sub.applySubscribe(SubscribeReply("e", 5, true, true, emptyList(), null, null, null))
                assertTrue(s.sub.applyPublication(Publication(6, DELTA_1_2, null), true))
                s.delivered(1)
            }
        }
    }
}
