package dev.herald

import dev.herald.client.ClientOptions
import dev.herald.client.HeraldClient
import dev.herald.client.PublicationEvent
import dev.herald.client.ServerSubscribedEvent
import dev.herald.client.SkippedEvent
import dev.herald.client.StreamPosition
import mockwebserver3.MockResponse
import mockwebserver3.MockWebServer
import okhttp3.WebSocket
import okhttp3.WebSocketListener
import org.json.JSONObject
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.Timeout
import java.util.concurrent.LinkedBlockingQueue
import java.util.concurrent.TimeUnit

/**
 * The `skip` push (docs/protocol.md): publications the namespace's backpressure policy left out.
 * Against a fake server (MockWebServer), since a real node sends it only to a slow reader.
 */
@Timeout(30)
class SkipTest {
    private fun pub(offset: Int) = """{"pub":{"channel":"c","offset":$offset,"data":{"n":$offset}}}"""
    private fun skip(from: Int, to: Int, channel: String = "c") = """{"skip":{"channel":"$channel","from":$from,"to":$to}}"""

    /** A fake node: every frame the client sends goes to [frames]; [onFrame] answers it. */
    private fun node(frames: LinkedBlockingQueue<JSONObject>, onFrame: (WebSocket, JSONObject) -> Unit) =
        MockResponse.Builder().webSocketUpgrade(object : WebSocketListener() {
            override fun onMessage(webSocket: WebSocket, text: String) {
                val m = JSONObject(text)
                frames.add(m)
                onFrame(webSocket, m)
            }

            override fun onClosing(webSocket: WebSocket, code: Int, reason: String) {
                webSocket.close(1000, null)
            }
        }).build()

    /** The connect reply subscribing "c" (sent in connect.subs) at offset 0, then [pushes]. */
    private fun subscribedThen(vararg pushes: String): (WebSocket, JSONObject) -> Unit = { ws, m ->
        val id = m.optLong("id")
        when {
            m.has("connect") -> {
                ws.send("""{"id":$id,"connect":{"client":"c1","ping_interval":25,"subs":{"c":{"epoch":"e","offset":0,"recoverable":true}}}}""")
                for (p in pushes) ws.send(p)
            }
            m.has("unsubscribe") -> ws.send("""{"id":$id,"unsubscribe":{}}""")
            // A resubscribe recovers 4..7 from history (the skip was the connection's queue, not the log).
            m.has("subscribe") -> ws.send(
                """{"id":$id,"subscribe":{"epoch":"e","offset":7,"recoverable":true,"recovered":true,"publications":[""" +
                    (4..7).joinToString(",") { """{"offset":$it,"data":{"n":$it}}""" } + "]}}",
            )
        }
    }

    /** Publications and skips handed to the app until publication [last], each bounded. */
    private fun eventsUntil(rec: Recorder, last: Long): List<String> {
        val out = ArrayList<String>()
        while (true) {
            when (val e = rec.next<Any>("publication $last (so far: $out)") { it is PublicationEvent || it is SkippedEvent }) {
                is PublicationEvent -> { out.add("pub ${e.offset}"); if (e.offset == last) return out }
                is SkippedEvent -> out.add("skip ${e.from}..${e.to}")
            }
        }
    }

    /** Frames the client sent within [ms] (a bounded wait for ones that must not come). */
    private fun framesWithin(frames: LinkedBlockingQueue<JSONObject>, ms: Long): List<JSONObject> {
        val out = ArrayList<JSONObject>()
        val deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(ms)
        while (true) {
            val left = deadline - System.nanoTime()
            out.add((if (left > 0) frames.poll(left, TimeUnit.NANOSECONDS) else null) ?: return out)
        }
    }

    private fun frame(frames: LinkedBlockingQueue<JSONObject>, what: String, pred: (JSONObject) -> Boolean): JSONObject {
        val deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10)
        while (true) {
            val left = deadline - System.nanoTime()
            val m = (if (left > 0) frames.poll(left, TimeUnit.NANOSECONDS) else null) ?: throw AssertionError("no $what within 10 s")
            if (pred(m)) return m
        }
    }

    @Test
    fun aSkipMovesThePositionWithoutResubscribing() {
        MockWebServer().use { server ->
            server.start()
            val frames = LinkedBlockingQueue<JSONObject>()
            server.enqueue(node(frames, subscribedThen(pub(1), pub(2), pub(3), skip(4, 7), pub(8))))
            val rec = Recorder()
            HeraldClient(server.url("/ws").toString(), ClientOptions().withReconnectDelays(10, 50), rec).use { c ->
                val sub = c.subscribe("c", listener = rec)
                c.connect()
                assertEquals(listOf("pub 1", "pub 2", "pub 3", "skip 4..7", "pub 8"), eventsUntil(rec, 8))
                assertEquals(StreamPosition("e", 8), sub.position)
                // A resubscribe would come within the first backoff step (at most 200 ms).
                val sent = framesWithin(frames, 600).filter { it.has("subscribe") || it.has("unsubscribe") }
                assertEquals(emptyList<JSONObject>(), sent, "no unsubscribe/subscribe after a skip")
            }
        }
    }

    @Test
    fun aStaleSkipIsIgnored() {
        MockWebServer().use { server ->
            server.start()
            val frames = LinkedBlockingQueue<JSONObject>()
            // 5..7 and 2..3 end at or behind the position (7 after the first skip): no event, no move.
            server.enqueue(node(frames, subscribedThen(pub(1), pub(2), pub(3), skip(4, 7), skip(5, 7), skip(2, 3), pub(8), pub(9))))
            val rec = Recorder()
            HeraldClient(server.url("/ws").toString(), ClientOptions().withReconnectDelays(10, 50), rec).use { c ->
                c.subscribe("c", listener = rec)
                c.connect()
                assertEquals(listOf("pub 1", "pub 2", "pub 3", "skip 4..7", "pub 8", "pub 9"), eventsUntil(rec, 9))
            }
        }
    }

    @Test
    fun aSkipPastTheNextOffsetIsAGapRecoveredWithSince() {
        MockWebServer().use { server ->
            server.start()
            val frames = LinkedBlockingQueue<JSONObject>()
            // 4 and 5 were neither delivered nor skipped: a hole before the skip.
            server.enqueue(node(frames, subscribedThen(pub(1), pub(2), pub(3), skip(6, 7))))
            val rec = Recorder()
            HeraldClient(server.url("/ws").toString(), ClientOptions().withReconnectDelays(10, 50), rec).use { c ->
                val sub = c.subscribe("c", listener = rec)
                c.connect()
                frame(frames, "unsubscribe") { it.has("unsubscribe") }
                val again = frame(frames, "subscribe") { it.has("subscribe") }.getJSONObject("subscribe")
                assertTrue(JSONObject("""{"epoch":"e","offset":3}""").similar(again.optJSONObject("since")), again.toString())
                assertEquals((1..7).map { "pub $it" }, eventsUntil(rec, 7), "4..7 recovered, no skipped event")
                assertEquals(StreamPosition("e", 7), sub.position)
            }
        }
    }

    @Test
    fun aServerSideSubscriptionSkipMovesThePositionARecoveryStartsFrom() {
        MockWebServer().use { server ->
            server.start()
            val frames = LinkedBlockingQueue<JSONObject>()
            // "news" is the server's subscription (the client asked for none), at offset 3.
            server.enqueue(node(frames) { ws, m ->
                if (!m.has("connect")) return@node
                ws.send("""{"id":${m.getLong("id")},"connect":{"client":"c1","ping_interval":25,"subs":{"news":{"epoch":"e","offset":3,"recoverable":true}}}}""")
                ws.send("""{"pub":{"channel":"news","offset":4,"data":4}}""")
                ws.send(skip(5, 7, "news"))
                ws.send(skip(6, 7, "news")) // stale
                ws.close(4000, "shutdown")
            })
            server.enqueue(node(frames) { ws, m ->
                if (!m.has("connect")) return@node
                ws.send("""{"id":${m.getLong("id")},"connect":{"client":"c2","ping_interval":25,"subs":{"news":{"epoch":"e","offset":7,"recoverable":true,"recovered":true}}}}""")
                ws.send("""{"pub":{"channel":"news","offset":8,"data":8}}""")
            })
            val rec = Recorder()
            HeraldClient(server.url("/ws").toString(), ClientOptions().withReconnectDelays(10, 50), rec).use { c ->
                c.connect()
                assertEquals(3, rec.next<ServerSubscribedEvent>("server-side subscription").offset)
                assertEquals(listOf("pub 4"), eventsUntil(rec, 4))
                assertEquals(SkippedEvent("news", 5, 7), rec.next<SkippedEvent>("skipped 5..7"))
                frame(frames, "first connect") { it.has("connect") }
                val second = frame(frames, "second connect") { it.has("connect") }.getJSONObject("connect")
                val since = second.optJSONObject("subs")?.optJSONObject("news")?.optJSONObject("since")
                assertTrue(JSONObject("""{"epoch":"e","offset":7}""").similar(since), "recovers from the skip's end: $second")
                assertEquals(listOf("pub 8"), eventsUntil(rec, 8), "the stale skip made no event")
            }
        }
    }
}
