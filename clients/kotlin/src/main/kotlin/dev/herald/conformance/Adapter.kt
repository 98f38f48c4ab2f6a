// Conformance adapter for the Kotlin/JVM SDK (clients/conformance/README.md, "The adapter contract").
// Commands as JSON lines on stdin, events as JSON lines on stdout (logs go to stderr). It only
// translates: reconnecting, backoff, recovery and token refresh are the SDK's own behaviour.
package dev.herald.conformance

import dev.herald.client.ClientListener
import dev.herald.client.ClientOptions
import dev.herald.client.ConnectedEvent
import dev.herald.client.ConnectingEvent
import dev.herald.client.DeltaType
import dev.herald.client.DisconnectedEvent
import dev.herald.client.ErrorEvent
import dev.herald.client.HeraldClient
import dev.herald.client.HeraldException
import dev.herald.client.HistoryOptions
import dev.herald.client.PresenceEvent
import dev.herald.client.PublicationEvent
import dev.herald.client.RecoveryFailedEvent
import dev.herald.client.ServerSubscribedEvent
import dev.herald.client.StreamPosition
import dev.herald.client.SubscribeOptions
import dev.herald.client.SubscribedEvent
import dev.herald.client.Subscription
import dev.herald.client.SubscriptionErrorEvent
import dev.herald.client.SubscriptionListener
import dev.herald.client.TagFilter
import dev.herald.client.TokenProvider
import dev.herald.client.UnsubscribedEvent
import org.json.JSONArray
import org.json.JSONObject
import java.util.concurrent.CompletableFuture
import java.util.concurrent.CompletionException
import java.util.concurrent.ConcurrentHashMap
import java.util.concurrent.ExecutionException
import java.util.concurrent.atomic.AtomicInteger
import kotlin.system.exitProcess

private val t0 = System.nanoTime()
private val stdout = System.out

private fun out(fields: JSONObject) {
    val line = JSONObject().put("t", (System.nanoTime() - t0) / 1_000_000)
    for (k in fields.keys()) line.put(k, fields.get(k))
    synchronized(stdout) {
        stdout.print(line.toString() + "\n")
        stdout.flush()
    }
}

private fun ev(name: String, vararg kv: Pair<String, Any?>): JSONObject {
    val o = JSONObject().put("event", name)
    for ((k, v) in kv) o.put(k, v ?: JSONObject.NULL)
    return o
}

private fun errorBody(t: Throwable): JSONObject {
    var e = t
    while ((e is CompletionException || e is ExecutionException) && e.cause != null) e = e.cause!!
    val code = if (e is HeraldException) e.code else -1
    return JSONObject().put("code", code).put("message", e.message ?: e.javaClass.simpleName)
}

private fun since(o: JSONObject?): StreamPosition? = o?.let { StreamPosition(it.getString("epoch"), it.getLong("offset")) }

/** The scenario's `tf` (the protocol's JSON shape) as the SDK's [TagFilter]. */
private fun tagFilter(o: JSONObject): TagFilter =
    if (o.has("op")) {
        val nodes = o.optJSONArray("nodes")
        TagFilter.Node(o.getString("op"), (0 until (nodes?.length() ?: 0)).map { tagFilter(nodes!!.getJSONObject(it)) })
    } else {
        val vals = o.optJSONArray("vals")
        TagFilter.Leaf(
            o.getString("key"), o.getString("cmp"), if (o.has("val")) o.getString("val") else null,
            vals?.let { v -> (0 until v.length()).map { v.getString(it) } },
        )
    }

private fun presence(name: String, e: PresenceEvent) = out(ev(name, "channel" to e.channel, "user" to e.info.user))

private class Adapter {
    var client: HeraldClient? = null
    val subs = ConcurrentHashMap<String, Subscription>()

    fun makeClient(a: JSONObject): HeraldClient {
        val o = ClientOptions()
        if (a.has("min_reconnect_delay_ms")) o.minReconnectDelayMs = a.getLong("min_reconnect_delay_ms")
        if (a.has("max_reconnect_delay_ms")) o.maxReconnectDelayMs = a.getLong("max_reconnect_delay_ms")
        if (a.has("timeout_ms")) o.timeoutMs = a.getLong("timeout_ms")
        if (a.has("ping_grace_ms")) o.pingGraceMs = a.getLong("ping_grace_ms")
        if (a.has("token")) o.token = a.getString("token")
        val tokens = a.optJSONArray("tokens")
        if (tokens != null && tokens.length() > 0) {
            val next = AtomicInteger()
            o.tokenProvider = TokenProvider {
                val i = minOf(next.getAndIncrement(), tokens.length() - 1)
                out(ev("token_requested", "index" to i))
                tokens.getString(i)
            }
        }
        return HeraldClient(a.getString("url"), o, object : ClientListener {
            override fun onConnecting(event: ConnectingEvent) {
                // code 0: connect() was called; anything else: the connection was lost and it retries.
                if (event.code != 0) out(ev("disconnected", "code" to event.code, "reconnect" to true))
            }
            override fun onConnected(event: ConnectedEvent) = out(ev("connected", "client" to event.client))
            override fun onDisconnected(event: DisconnectedEvent) = out(ev("disconnected", "code" to event.code, "reconnect" to false))
            override fun onError(event: ErrorEvent) {
                val e = ev("error", "type" to event.type, "code" to event.error.code)
                event.channel?.let { e.put("channel", it) }
                out(e)
            }
            override fun onServerRecoveryFailed(event: RecoveryFailedEvent) =
                out(ev("recovery_failed", "channel" to event.channel, "since" to event.since.toJson()))
            override fun onServerSubscribed(event: ServerSubscribedEvent) = out(
                ev(
                    "subscribed", "channel" to event.channel, "server_side" to true, "epoch" to event.epoch,
                    "offset" to event.offset, "recovered" to event.recovered, "resubscribed" to event.recovering,
                ),
            )
            override fun onServerPublication(event: PublicationEvent) = publication(event)
            override fun onServerUnsubscribed(event: UnsubscribedEvent) = out(ev("unsubscribed", "channel" to event.channel, "code" to event.code))
            override fun onServerJoin(event: PresenceEvent) = presence("join", event)
            override fun onServerLeave(event: PresenceEvent) = presence("leave", event)
        })
    }

    fun publication(e: PublicationEvent) = out(
        ev("publication", "channel" to e.channel, "offset" to e.offset, "epoch" to e.epoch, "data" to (e.data ?: JSONObject.NULL))
            .also { o -> e.tags?.let { o.put("tags", JSONObject(it)) } },
    )

    fun subscribe(a: JSONObject) {
        val channel = a.getString("channel")
        val c = client ?: throw HeraldException(9, "connect first")
        val delta = when (val d = a.optString("delta", "")) {
            "" -> null
            "fossil" -> DeltaType.FOSSIL
            else -> throw HeraldException(-2, "unknown delta type $d")
        }
        val opts = SubscribeOptions(since(a.optJSONObject("since")), tagsFilter = a.optJSONObject("tf")?.let(::tagFilter), delta = delta)
        val sub = c.subscribe(channel, opts, object : SubscriptionListener {
            override fun onSubscribed(event: SubscribedEvent) = out(
                ev(
                    "subscribed", "channel" to channel, "server_side" to false, "epoch" to event.epoch,
                    "offset" to event.offset, "recovered" to event.recovered, "resubscribed" to event.resubscribed,
                ),
            )
            override fun onPublication(event: PublicationEvent) = publication(event)
            override fun onRecoveryFailed(event: RecoveryFailedEvent) =
                out(ev("recovery_failed", "channel" to channel, "since" to event.since.toJson()))
            override fun onUnsubscribed(event: UnsubscribedEvent) {
                subs.remove(channel)
                out(ev("unsubscribed", "channel" to channel, "code" to event.code))
            }
            override fun onJoin(event: PresenceEvent) = presence("join", event)
            override fun onLeave(event: PresenceEvent) = presence("leave", event)
            override fun onError(event: SubscriptionErrorEvent) =
                out(ev("error", "type" to "subscribe", "channel" to channel, "code" to event.error.code))
        })
        subs[channel] = sub
    }

    /** Runs a command; answers its result (a JSONObject) or a future of it. */
    fun run(name: String, a: JSONObject): CompletableFuture<JSONObject> {
        val c = client
        fun need() = c ?: throw HeraldException(9, "connect first")
        return when (name) {
            "connect" -> {
                val cl = c ?: makeClient(a).also { client = it }
                cl.connect()
                CompletableFuture.completedFuture(JSONObject())
            }
            "subscribe" -> { subscribe(a); CompletableFuture.completedFuture(JSONObject()) }
            "unsubscribe" -> { subs[a.getString("channel")]?.unsubscribe(); CompletableFuture.completedFuture(JSONObject()) }
            "publish" -> need().publishAsync(a.getString("channel"), a.opt("data"))
                .thenApply { JSONObject().put("epoch", it.epoch).put("offset", it.offset) }
            "history" -> need().historyAsync(a.getString("channel"), HistoryOptions(since(a.optJSONObject("since")), a.optInt("limit", 0)))
                .thenApply { r ->
                    val pubs = JSONArray()
                    for (p in r.publications) {
                        val o = JSONObject().put("offset", p.offset).put("data", p.data ?: JSONObject.NULL)
                        p.info?.let { o.put("info", JSONObject().put("user", it.user).put("client", it.client)) }
                        pubs.put(o)
                    }
                    JSONObject().put("epoch", r.epoch).put("offset", r.offset).put("publications", pubs)
                }
            "presence" -> need().presenceAsync(a.getString("channel")).thenApply { r ->
                val cs = JSONObject()
                for ((id, info) in r.clients) cs.put(id, JSONObject().put("user", info.user).put("client", info.client))
                JSONObject().put("clients", cs)
            }
            "rpc" -> need().rpcAsync(a.getString("method"), a.opt("data")).thenApply { JSONObject().put("data", it ?: JSONObject.NULL) }
            "disconnect" -> { need().disconnect(); CompletableFuture.completedFuture(JSONObject()) }
            else -> throw HeraldException(-2, "unknown command $name")
        }
    }

    fun handle(cmd: JSONObject) {
        val id = cmd.opt("id") ?: JSONObject.NULL
        val f = try {
            run(cmd.optString("cmd"), cmd.optJSONObject("args") ?: JSONObject())
        } catch (t: Throwable) {
            CompletableFuture.failedFuture(t)
        }
        f.whenComplete { r, t ->
            if (t != null) out(ev("result", "id" to id, "ok" to false, "error" to errorBody(t)))
            else out(ev("result", "id" to id, "ok" to true, "result" to r))
        }
    }
}

fun main() {
    val adapter = Adapter()
    out(ev("ready", "sdk" to "kotlin"))
    val reader = System.`in`.bufferedReader()
    while (true) {
        val line = reader.readLine() ?: break // stdin closed
        if (line.isBlank()) continue
        val cmd = try {
            JSONObject(line)
        } catch (e: Exception) {
            out(ev("result", "id" to null, "ok" to false, "error" to JSONObject().put("code", -3).put("message", "bad JSON")))
            continue
        }
        if (cmd.optString("cmd") == "exit") {
            adapter.client?.close()
            out(ev("result", "id" to cmd.opt("id"), "ok" to true, "result" to JSONObject()))
            exitProcess(0)
        }
        adapter.handle(cmd)
    }
    adapter.client?.close()
    exitProcess(0)
}
