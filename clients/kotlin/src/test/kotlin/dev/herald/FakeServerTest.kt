package dev.herald

import dev.herald.client.ClientOptions
import dev.herald.client.ConnectedEvent
import dev.herald.client.ConnectingEvent
import dev.herald.client.DeltaTest
import dev.herald.client.DeltaType
import dev.herald.client.HeraldClient
import dev.herald.client.PublicationEvent
import dev.herald.client.SubscribeOptions
import dev.herald.client.TokenProvider
import mockwebserver3.MockResponse
import mockwebserver3.MockWebServer
import okhttp3.WebSocket
import okhttp3.WebSocketListener
import org.json.JSONObject
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.Timeout
import java.util.concurrent.LinkedBlockingQueue
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicInteger

/** Unit tests against a fake server (OkHttp's MockWebServer): exact frames the real node sends only under faults. */
@Timeout(30)
class FakeServerTest {
    private class Connect(val msg: JSONObject, val atNs: Long)

    private fun upgrade(connects: LinkedBlockingQueue<Connect>, onConnect: (WebSocket, Long) -> Unit) =
        MockResponse.Builder().webSocketUpgrade(object : WebSocketListener() {
            override fun onMessage(webSocket: WebSocket, text: String) {
                val m = JSONObject(text)
                if (m.has("connect")) {
                    connects.add(Connect(m, System.nanoTime()))
                    onConnect(webSocket, m.getLong("id"))
                }
            }

            override fun onClosing(webSocket: WebSocket, code: Int, reason: String) {
                webSocket.close(1000, null) // complete the client's close handshake
            }
        }).build()

    private fun take(q: LinkedBlockingQueue<Connect>, what: String) = q.poll(10, TimeUnit.SECONDS) ?: throw AssertionError("no $what within 10 s")

    @Test
    fun batchedFrameAndTokenExpiredCloseAskForAFreshToken() {
        MockWebServer().use { server ->
            server.start()
            val connects = LinkedBlockingQueue<Connect>()
            // One frame: the connect reply and a disconnect push (4004), then the close frame.
            server.enqueue(upgrade(connects) { ws, id ->
                ws.send("""{"id":$id,"connect":{"client":"c1","ping_interval":25}}""" + "\n" +
                    """{"disconnect":{"code":4004,"reason":"token expired","reconnect":true}}""")
                ws.close(4004, "token expired")
            })
            server.enqueue(upgrade(connects) { ws, id -> ws.send("""{"id":$id,"connect":{"client":"c2","ping_interval":25}}""") })
            val n = AtomicInteger()
            val rec = Recorder()
            val opts = ClientOptions().withTokenProvider(TokenProvider { "t${n.incrementAndGet()}" }).withReconnectDelays(10, 50)
            HeraldClient(server.url("/ws").toString(), opts, rec).use { c ->
                c.connect()
                assertEquals("c1", rec.next<ConnectedEvent>("first connected").client)
                assertEquals(4004, rec.next<ConnectingEvent>("reconnecting") { it.code != 0 }.code)
                assertEquals("c2", rec.next<ConnectedEvent>("second connected").client)
                assertEquals("t1", take(connects, "first connect").msg.getJSONObject("connect").getString("token"))
                assertEquals("t2", take(connects, "second connect").msg.getJSONObject("connect").getString("token"))
            }
        }
    }

    @Test
    fun afterMsIsAFloorEvenWhenTheCloseFrameIsLost() {
        MockWebServer().use { server ->
            server.start()
            val connects = LinkedBlockingQueue<Connect>()
            val pushedAt = LinkedBlockingQueue<Long>()
            // The disconnect push arrives, then the TCP connection drops without a close frame.
            server.enqueue(upgrade(connects) { ws, id ->
                ws.send("""{"id":$id,"connect":{"client":"c1","ping_interval":25}}""")
                Thread.sleep(100)
                pushedAt.add(System.nanoTime())
                ws.send("""{"disconnect":{"code":4000,"reason":"shutdown","reconnect":true,"after_ms":800}}""")
                Thread.sleep(100)
                ws.cancel()
            })
            server.enqueue(upgrade(connects) { ws, id -> ws.send("""{"id":$id,"connect":{"client":"c2","ping_interval":25}}""") })
            val rec = Recorder()
            HeraldClient(server.url("/ws").toString(), ClientOptions().withReconnectDelays(10, 20), rec).use { c ->
                c.connect()
                take(connects, "first connect")
                assertEquals(4000, rec.next<ConnectingEvent>("reconnecting") { it.code != 0 }.code, "the push's code stands in for the lost close code")
                val second = take(connects, "second connect")
                val waited = TimeUnit.NANOSECONDS.toMillis(second.atNs - pushedAt.poll(1, TimeUnit.SECONDS)!!)
                assertTrue(waited >= 800, "reconnected $waited ms after a push with after_ms 800")
            }
        }
    }

    @Test
    fun aDeltaThatDoesNotApplyResubscribesWithSince() {
        val other = DeltaTest.BOOK1.replace("HRLD", "XXXX")
        MockWebServer().use { server ->
            server.start()
            val frames = LinkedBlockingQueue<JSONObject>()
            var subscribes = 0
            server.enqueue(MockResponse.Builder().webSocketUpgrade(object : WebSocketListener() {
                override fun onMessage(webSocket: WebSocket, text: String) {
                    val m = JSONObject(text)
                    frames.add(m)
                    val id = m.optLong("id")
                    when {
                        m.has("connect") -> webSocket.send("""{"id":$id,"connect":{"client":"c1","ping_interval":25}}""")
                        m.has("unsubscribe") -> webSocket.send("""{"id":$id,"unsubscribe":{}}""")
                        m.has("subscribe") && ++subscribes == 1 -> {
                            webSocket.send("""{"id":$id,"subscribe":{"epoch":"e","offset":4,"recoverable":true,"delta":true}}""")
                            // 5 in full, 6 a delta against it, 7 in full, 8 a delta made from 5's text, not 7's (its checksum fails).
                            for ((offset, data, delta) in listOf(
                                Triple(5, DeltaTest.BOOK1, false), Triple(6, DeltaTest.DELTA_1_2, true),
                                Triple(7, other, false), Triple(8, DeltaTest.DELTA_1_2, true),
                            )) {
                                val pub = JSONObject().put("channel", "book").put("offset", offset).put("data", data).put("delta", delta)
                                webSocket.send(JSONObject().put("pub", pub).toString())
                            }
                        }
                        m.has("subscribe") -> webSocket.send(
                            """{"id":$id,"subscribe":{"epoch":"e","offset":8,"recoverable":true,"recovered":true,"delta":true,""" +
                                """"publications":[{"offset":8,"data":{"seq":8}}]}}""",
                        )
                    }
                }

                override fun onClosing(webSocket: WebSocket, code: Int, reason: String) {
                    webSocket.close(1000, null)
                }
            }).build())
            val rec = Recorder()
            HeraldClient(server.url("/ws").toString(), ClientOptions().withReconnectDelays(10, 50), rec).use { c ->
                c.subscribe("book", SubscribeOptions(delta = DeltaType.FOSSIL), rec)
                c.connect()
                fun frame(what: String, pred: (JSONObject) -> Boolean): JSONObject {
                    val deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10)
                    while (true) {
                        val left = deadline - System.nanoTime()
                        val m = (if (left > 0) frames.poll(left, TimeUnit.NANOSECONDS) else null)
                            ?: throw AssertionError("no $what within 10 s (client events: ${rec.events})")
                        if (pred(m)) return m
                    }
                }
                val connect = frame("connect") { it.has("connect") }.getJSONObject("connect")
                assertFalse(connect.has("subs"), "a delta subscription is sent alone, not in connect.subs: $connect")
                val first = frame("subscribe") { it.has("subscribe") }.getJSONObject("subscribe")
                assertEquals("fossil", first.getString("delta"))
                assertFalse(first.has("since"))
                // The delta at 8 does not apply: unsubscribe, then subscribe with since the last delivered (7).
                frame("unsubscribe") { it.has("unsubscribe") }
                val again = frame("second subscribe") { it.has("subscribe") }.getJSONObject("subscribe")
                assertEquals("fossil", again.getString("delta"))
                assertTrue(JSONObject("""{"epoch":"e","offset":7}""").similar(again.getJSONObject("since")), again.toString())
                val got = (1..4).map { rec.next<PublicationEvent>("publication $it") }
                assertEquals(listOf(5L, 6L, 7L, 8L), got.map { it.offset })
                assertTrue(JSONObject(DeltaTest.BOOK1).similar(got[0].data))
                assertTrue(JSONObject(DeltaTest.BOOK2).similar(got[1].data))
                assertTrue(JSONObject(other).similar(got[2].data))
                assertTrue(JSONObject("""{"seq":8}""").similar(got[3].data), "8 recovered in full: ${got[3].data}")
            }
        }
    }
}
