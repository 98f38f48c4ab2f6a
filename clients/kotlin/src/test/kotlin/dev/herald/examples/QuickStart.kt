// Quick start: connect to a node started with `herald serve --dev`, subscribe to "chat",
// publish to it, print what arrives.
package dev.herald.examples

import dev.herald.client.ClientListener
import dev.herald.client.ConnectedEvent
import dev.herald.client.DisconnectedEvent
import dev.herald.client.HeraldClient
import dev.herald.client.PublicationEvent
import dev.herald.client.SubscriptionListener
import dev.herald.client.publish
import dev.herald.client.ready
import kotlinx.coroutines.channels.Channel
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout

fun main(args: Array<String>) = runBlocking {
    val url = args.firstOrNull() ?: "ws://127.0.0.1:8000/ws"
    val received = Channel<PublicationEvent>(16)

    val client = HeraldClient(url, listener = object : ClientListener {
        override fun onConnected(event: ConnectedEvent) = println("connected as ${event.client}")
        override fun onDisconnected(event: DisconnectedEvent) = println("disconnected for good: ${event.code} ${event.reason}")
    })
    client.use {
        client.connect()
        val sub = client.subscribe("chat", listener = object : SubscriptionListener {
            override fun onPublication(event: PublicationEvent) { received.trySend(event) }
        })
        withTimeout(10_000) {
            sub.ready()
            val pos = client.publish("chat", mapOf("text" to "hello"))
            println("published at offset ${pos.offset}")
            val p = received.receive()
            println("received ${p.data} (offset ${p.offset})")
        }
    }
}
