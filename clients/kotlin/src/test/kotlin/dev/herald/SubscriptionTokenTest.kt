package dev.herald

import dev.herald.client.ClientOptions
import dev.herald.client.HeraldClient
import dev.herald.client.PublicationEvent
import dev.herald.client.SubscribeOptions
import dev.herald.client.SubscribedEvent
import dev.herald.client.SubscriptionListener
import dev.herald.client.SubscriptionTokenProvider
import dev.herald.client.UnsubscribedEvent
import dev.herald.server.HeraldApi
import dev.herald.server.HeraldTokens
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.Timeout
import java.util.concurrent.LinkedBlockingQueue
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicInteger

/** Channels that need a subscription token: a provider's tokens are refreshed with sub_refresh; a fixed one ends with its expiry. */
@Timeout(60)
class SubscriptionTokenTest {
    private class Events : SubscriptionListener {
        val q = LinkedBlockingQueue<Any>()
        override fun onSubscribed(event: SubscribedEvent) { q.add(event) }
        override fun onPublication(event: PublicationEvent) { q.add(event) }
        override fun onUnsubscribed(event: UnsubscribedEvent) { q.add(event) }
        fun take(what: String, ms: Long = 10_000): Any = q.poll(ms, TimeUnit.MILLISECONDS) ?: throw AssertionError("no $what within $ms ms")
    }

    @Test
    fun providerTokensAreRefreshedBeforeExpiry() {
        HeraldNode(mapOf("HERALD_DEFAULT_NAMESPACE__SUBSCRIBE" to "token")).use { node ->
            val api = HeraldApi(node.http, HeraldNode.API_KEY)
            val connToken = HeraldTokens.connectionToken(HeraldNode.SECRET, "carol", 120)
            HeraldClient(node.ws, ClientOptions().withToken(connToken)).use { c ->
                c.connect()
                val calls = AtomicInteger()
                val ev = Events()
                c.subscribe("vip", SubscribeOptions(tokenProvider = SubscriptionTokenProvider { ch ->
                    calls.incrementAndGet()
                    HeraldTokens.subscriptionToken(HeraldNode.SECRET, "carol", ch, 3)
                }), ev)
                assertTrue(ev.take("subscribed") is SubscribedEvent)
                Thread.sleep(4500) // past the first token's expiry
                api.publish("vip", "still here")
                val p = ev.take("publication after the first token expired")
                assertTrue(p is PublicationEvent && p.data == "still here", "got $p")
                assertTrue(calls.get() >= 2, "the provider was asked ${calls.get()} times")
                assertTrue(ev.q.none { it is UnsubscribedEvent || it is SubscribedEvent }, "sub_refresh kept the subscription (no unsub 4004, no resubscribe): ${ev.q}")
            }
            // A fixed token: the server ends the subscription at its expiry (4004); the same token is refused (109).
            HeraldClient(node.ws, ClientOptions().withToken(connToken)).use { c ->
                c.connect()
                val ev = Events()
                c.subscribe("vip", SubscribeOptions(token = HeraldTokens.subscriptionToken(HeraldNode.SECRET, "carol", "vip", 2)), ev)
                assertTrue(ev.take("subscribed") is SubscribedEvent)
                var e: Any
                do { e = ev.take("unsubscribed", 8000) } while (e !is UnsubscribedEvent)
                assertEquals(109, e.code)
            }
        }
    }
}
