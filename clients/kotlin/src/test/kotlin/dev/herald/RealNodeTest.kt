package dev.herald

import dev.herald.client.ClientListener
import dev.herald.client.ClientOptions
import dev.herald.client.Codes
import dev.herald.client.ConnectedEvent
import dev.herald.client.ConnectingEvent
import dev.herald.client.DeltaType
import dev.herald.client.DisconnectedEvent
import dev.herald.client.HeraldClient
import dev.herald.client.HistoryOptions
import dev.herald.client.PublicationEvent
import dev.herald.client.ReplyException
import dev.herald.client.ServerSubscribedEvent
import dev.herald.client.SkippedEvent
import dev.herald.client.SubscribeOptions
import dev.herald.client.SubscriptionListener
import dev.herald.client.UnsubscribedEvent
import dev.herald.client.history
import dev.herald.client.presence
import dev.herald.client.publish
import dev.herald.client.ready
import dev.herald.server.HeraldApi
import dev.herald.server.HeraldApiException
import dev.herald.server.HeraldTokens
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.json.JSONObject
import org.junit.jupiter.api.AfterAll
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Assertions.fail
import org.junit.jupiter.api.BeforeAll
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.TestInstance
import org.junit.jupiter.api.Timeout
import java.util.concurrent.LinkedBlockingQueue
import java.util.concurrent.TimeUnit

/** Every event a client reports, as strings, with bounded waits. */
class Recorder : ClientListener, SubscriptionListener {
    val events = LinkedBlockingQueue<Any>()
    override fun onConnecting(event: ConnectingEvent) { events.add(event) }
    override fun onConnected(event: ConnectedEvent) { events.add(event) }
    override fun onDisconnected(event: DisconnectedEvent) { events.add(event) }
    override fun onServerSubscribed(event: ServerSubscribedEvent) { events.add(event) }
    override fun onServerPublication(event: PublicationEvent) { events.add(event) }
    override fun onServerUnsubscribed(event: UnsubscribedEvent) { events.add(event) }
    override fun onPublication(event: PublicationEvent) { events.add(event) }
    override fun onSkipped(event: SkippedEvent) { events.add(event) }
    override fun onServerSkipped(event: SkippedEvent) { events.add(event) }

    inline fun <reified T> next(what: String, timeoutMs: Long = 10_000, pred: (T) -> Boolean = { true }): T {
        val deadline = System.currentTimeMillis() + timeoutMs
        while (true) {
            val left = deadline - System.currentTimeMillis()
            val e = if (left > 0) events.poll(left, TimeUnit.MILLISECONDS) else null
            if (e == null) fail<Unit>("no $what within $timeoutMs ms")
            if (e is T && pred(e)) return e
        }
    }
}

@TestInstance(TestInstance.Lifecycle.PER_CLASS)
@Timeout(60)
class RealNodeTest {
    private lateinit var node: HeraldNode
    private lateinit var api: HeraldApi

    @BeforeAll
    fun start() {
        node = HeraldNode(mapOf("HERALD_LIMITS__COMMANDS_PER_SECOND" to "10000", "HERALD_LIMITS__COMMAND_BURST" to "10000"))
        api = HeraldApi(node.http, HeraldNode.API_KEY)
    }

    @AfterAll
    fun stop() = node.close()

    @Test
    fun mintedTokenIsAcceptedAndCommandsWork() = runBlocking {
        val rec = Recorder()
        val token = HeraldTokens.connectionToken(HeraldNode.SECRET, "alice", 60, info = mapOf("name" to "Alice"))
        HeraldClient(node.ws, ClientOptions().withToken(token).withTimeoutMs(5000), rec).use { c ->
            c.connect()
            val connected = rec.next<ConnectedEvent>("connected")
            assertTrue(connected.client.isNotEmpty())
            assertTrue(connected.expiresInMs in 50_000..60_000, "expires_in ${connected.expiresInMs}")
            val sub = c.subscribe("room", listener = rec)
            withTimeout(10_000) { sub.ready() }
            for (i in 1..3) {
                val r = c.publish("room", mapOf("n" to i))
                assertEquals(i.toLong(), r.offset)
            }
            api.publish("room", mapOf("n" to 4))
            for (i in 1..4) {
                val p = rec.next<PublicationEvent>("publication $i")
                assertEquals(i.toLong(), p.offset)
                assertEquals(i, (p.data as JSONObject).getInt("n"))
            }
            val h = withTimeout(10_000) { c.history("room", HistoryOptions(limit = 2)) }
            assertEquals(listOf(3L, 4L), h.publications.map { it.offset })
            assertEquals(4L, h.offset)
            assertEquals(sub.position, dev.herald.client.StreamPosition(h.epoch, 4))
            val pr = withTimeout(10_000) { c.presence("room") }
            assertEquals("alice", pr.clients[c.clientId]?.user, "presence: ${pr.clients}")
            val e = assertThrows(ReplyException::class.java) { runBlocking { c.history("bad name!") } }
            assertEquals(107, e.code)
            // The server-side view of the same things.
            assertEquals(4, api.history("room").publications.size)
            assertEquals("alice", api.presence("room").clients.values.single().user)
        }
    }

    @Test
    fun wrongKeyTokenStopsAfterOneAttempt() {
        val rec = Recorder()
        val bad = HeraldTokens.connectionToken("not-the-secret", "mallory", 60)
        HeraldClient(node.ws, ClientOptions().withToken(bad).withReconnectDelays(50, 100), rec).use { c ->
            c.connect()
            val d = rec.next<DisconnectedEvent>("disconnected")
            assertEquals(101, d.code)
            Thread.sleep(500)
            assertTrue(rec.events.none { it is ConnectedEvent || it is DisconnectedEvent || (it is ConnectingEvent && it.code != 0) }, "after: ${rec.events}")
        }
    }

    @Test
    fun serverSideSubscriptionAndApiDisconnect() {
        val rec = Recorder()
        val token = HeraldTokens.connectionToken(HeraldNode.SECRET, "bob", 60)
        HeraldClient(node.ws, ClientOptions().withToken(token), rec).use { c ->
            c.connect()
            rec.next<ConnectedEvent>("connected")
            api.subscribe("bob", "news")
            val s = rec.next<ServerSubscribedEvent>("server-side subscribed")
            assertEquals("news", s.channel)
            api.publish("news", "hello")
            val p = rec.next<PublicationEvent>("server-side publication")
            assertEquals("hello", p.data)
            api.unsubscribe("bob", "news")
            assertEquals(Codes.UNSUB_SERVER, rec.next<UnsubscribedEvent>("unsubscribed").code)
            api.disconnectUser("bob")
            assertEquals(4502, rec.next<DisconnectedEvent>("disconnected").code)
            assertEquals(dev.herald.client.ClientState.DISCONNECTED, c.getState())
        }
    }

    @Test
    fun broadcastIsIdempotent() {
        val key = "k-" + System.nanoTime()
        val first = api.broadcast(listOf("b1", "b2"), JSONObject().put("x", 1), key)
        assertEquals(2, first.published)
        val again = api.broadcast(listOf("b1", "b2"), JSONObject().put("x", 1), key)
        assertEquals(first.results, again.results)
        assertEquals(1, api.history("b1").publications.size)
        val e = assertThrows(HeraldApiException::class.java) { api.publish("bad name!", 1) }
        assertEquals(400, e.status)
        assertEquals(107, e.code)
        val wrong = HeraldApi(node.http, "wrong-key")
        val u = assertThrows(HeraldApiException::class.java) { wrong.publish("room", 1) }
        assertEquals(401, u.status)
        assertTrue(!u.message!!.contains("wrong-key"), "the API key must not appear in errors")
    }

    @Test
    fun concurrentPublishersFromManyThreads() {
        val rec = Recorder()
        HeraldClient(node.ws, ClientOptions().withTimeoutMs(10_000), rec).use { c ->
            c.connect()
            val sub = c.subscribe("busy", listener = rec)
            sub.readyAsync().get(10, TimeUnit.SECONDS)
            val threads = 8
            val each = 40
            val pool = java.util.concurrent.Executors.newFixedThreadPool(threads)
            try {
                val futures = (0 until threads).map { t ->
                    pool.submit<List<Long>> { (0 until each).map { i -> c.publishAsync("busy", mapOf("t" to t, "i" to i)).get(10, TimeUnit.SECONDS).offset } }
                }
                val offsets = futures.flatMap { it.get(30, TimeUnit.SECONDS) }.sorted()
                assertEquals((1L..threads * each).toList(), offsets)
            } finally {
                pool.shutdownNow()
            }
            for (i in 1..threads * each) assertEquals(i.toLong(), rec.next<PublicationEvent>("publication $i").offset)
        }
    }

    @Test
    fun commandsFailAtOnceWhileDisconnected() {
        HeraldClient(node.ws).use { c ->
            val e = assertThrows(Exception::class.java) { c.publishAsync("room", 1).get(5, TimeUnit.SECONDS) }
            assertEquals(Codes.NOT_CONNECTED, (e.cause as dev.herald.client.HeraldException).code)
            assertNull(c.clientId)
        }
    }

    @Test
    fun deltaWhereTheNamespaceDoesNotAllowItEndsWith108() {
        // This node's namespace does not set allow_delta (the conformance suite runs deltas on one that does).
        val ended = LinkedBlockingQueue<UnsubscribedEvent>()
        HeraldClient(node.ws).use { c ->
            c.connect()
            c.subscribe("book", SubscribeOptions(delta = DeltaType.FOSSIL), object : SubscriptionListener {
                override fun onUnsubscribed(event: UnsubscribedEvent) { ended.add(event) }
            })
            val e = ended.poll(10, TimeUnit.SECONDS) ?: fail("the subscription did not end within 10 s")
            assertEquals(108, e.code)
        }
    }
}
