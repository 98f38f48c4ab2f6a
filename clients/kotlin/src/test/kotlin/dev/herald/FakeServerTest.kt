package dev.herald

import dev.herald.client.ClientOptions
import dev.herald.client.ConnectedEvent
import dev.herald.client.ConnectingEvent
import dev.herald.client.HeraldClient
import dev.herald.client.TokenProvider
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
}
