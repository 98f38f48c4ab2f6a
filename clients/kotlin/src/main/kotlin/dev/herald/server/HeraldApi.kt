package dev.herald.server

import dev.herald.client.HistoryOptions
import dev.herald.client.HistoryResult
import dev.herald.client.PresenceResult
import dev.herald.client.PublishResult
import dev.herald.client.RawJson
import okhttp3.MediaType.Companion.toMediaType
import okhttp3.OkHttpClient
import okhttp3.Request
import okhttp3.RequestBody.Companion.toRequestBody
import org.json.JSONArray
import org.json.JSONObject
import java.io.IOException
import java.util.concurrent.TimeUnit

/** The server answered an API call with an error: HTTP [status] and the protocol's [code] (-1 when the body had none). */
class HeraldApiException(val status: Int, val code: Int, message: String) : IOException("herald api: HTTP $status, error $code: $message")

/** One channel's outcome in a broadcast: a position, or an error. */
data class BroadcastItem(val epoch: String?, val offset: Long?, val errorCode: Int?, val errorMessage: String?)

/** The answer to a broadcast: one item per channel in the request's order, and counts. */
data class BroadcastResult(val results: List<BroadcastItem>, val published: Int, val failed: Int)

/**
 * The server's HTTP API (docs/protocol.md, "Server HTTP API"), for application backends. Blocking
 * calls (run them off the UI thread); errors are [HeraldApiException] (or an [IOException] for the
 * network). The API key goes in the Authorization header only, never in messages.
 *
 * @param baseUrl the node's HTTP address, e.g. `http://127.0.0.1:8000`
 */
class HeraldApi @JvmOverloads constructor(
    baseUrl: String,
    private val apiKey: String,
    http: OkHttpClient? = null,
    timeoutMs: Long = 10_000,
) {
    private val base = baseUrl.trimEnd('/')
    private val http: OkHttpClient = (http ?: OkHttpClient()).newBuilder()
        .callTimeout(timeoutMs, TimeUnit.MILLISECONDS).build()

    /** Publish [data] (any JSON value: org.json types, Map, List, String, Number, Boolean, [RawJson]). */
    @JvmOverloads
    fun publish(channel: String, data: Any?, idempotencyKey: String? = null): PublishResult {
        val b = JSONObject().put("channel", channel).put("data", value(data))
        idempotencyKey?.let { b.put("idempotency_key", it) }
        val r = post("/api/publish", b)
        return PublishResult(r.optString("epoch", ""), r.optLong("offset", 0))
    }

    /** Publish [data] to many channels; retrying with the same [idempotencyKey] publishes only what failed. */
    @JvmOverloads
    fun broadcast(channels: List<String>, data: Any?, idempotencyKey: String? = null): BroadcastResult {
        val b = JSONObject().put("channels", JSONArray(channels)).put("data", value(data))
        idempotencyKey?.let { b.put("idempotency_key", it) }
        val r = post("/api/broadcast", b)
        val a = r.optJSONArray("results") ?: JSONArray()
        val items = (0 until a.length()).map { i ->
            val o = a.optJSONObject(i) ?: JSONObject()
            val e = o.optJSONObject("error")
            if (e != null) BroadcastItem(null, null, e.optInt("code", -1), e.optString("message", ""))
            else BroadcastItem(o.optString("epoch", ""), o.optLong("offset", 0), null, null)
        }
        return BroadcastResult(items, r.optInt("published", 0), r.optInt("failed", 0))
    }

    @JvmOverloads
    fun history(channel: String, options: HistoryOptions = HistoryOptions()): HistoryResult {
        val b = JSONObject().put("channel", channel)
        options.since?.let { b.put("since", it.toJson()) }
        if (options.limit > 0) b.put("limit", options.limit)
        val r = post("/api/history", b)
        val pubs = r.optJSONArray("publications") ?: JSONArray()
        val list = (0 until pubs.length()).mapNotNull { pubs.optJSONObject(it) }.map { p ->
            dev.herald.client.Publication(
                p.optLong("offset", 0), p.opt("data"),
                p.optJSONObject("info")?.let { dev.herald.client.ClientInfo(it.optString("user", ""), it.optString("client", ""), it.opt("info")) },
            )
        }
        return HistoryResult(r.optString("epoch", ""), r.optLong("offset", 0), list, r.optBoolean("incomplete", false))
    }

    fun presence(channel: String): PresenceResult {
        val r = post("/api/presence", JSONObject().put("channel", channel))
        val c = r.optJSONObject("clients") ?: JSONObject()
        val m = LinkedHashMap<String, dev.herald.client.ClientInfo>()
        for (k in c.keys()) c.optJSONObject(k)?.let { m[k] = dev.herald.client.ClientInfo(it.optString("user", ""), it.optString("client", ""), it.opt("info")) }
        return PresenceResult(m)
    }

    /** Disconnect every connection of [user] (close 4502 unless [code] says otherwise). */
    @JvmOverloads
    fun disconnectUser(user: String, code: Int? = null) {
        val b = JSONObject().put("user", user)
        code?.let { b.put("code", it) }
        post("/api/disconnect", b)
    }

    /** Disconnect one connection by its client id. */
    @JvmOverloads
    fun disconnectClient(client: String, code: Int? = null) {
        val b = JSONObject().put("client", client)
        code?.let { b.put("code", it) }
        post("/api/disconnect", b)
    }

    /** Subscribe every connection of [user] to [channel] (a server-side subscription). */
    fun subscribe(user: String, channel: String) {
        post("/api/subscribe", JSONObject().put("user", user).put("channel", channel))
    }

    /** End a server-side subscription (the client gets `unsub` 2000). */
    fun unsubscribe(user: String, channel: String) {
        post("/api/unsubscribe", JSONObject().put("user", user).put("channel", channel))
    }

    /** Any API call with a JSON body; answers the JSON result. */
    fun post(path: String, body: JSONObject): JSONObject {
        val req = Request.Builder().url(base + path)
            .header("Authorization", "Bearer $apiKey")
            .post(body.toString().toRequestBody(JSON))
            .build()
        http.newCall(req).execute().use { resp ->
            val text = resp.body.string()
            val o = try { if (text.isBlank()) JSONObject() else JSONObject(text) } catch (e: Exception) { null }
            if (!resp.isSuccessful) {
                val e = o?.optJSONObject("error")
                throw HeraldApiException(resp.code, e?.optInt("code", -1) ?: -1, e?.optString("message", "") ?: "non-JSON answer")
            }
            return o ?: throw HeraldApiException(resp.code, -1, "non-JSON answer")
        }
    }

    private fun value(v: Any?): Any = when (v) {
        null -> JSONObject.NULL
        is RawJson -> JSONArray("[${v.json}]").get(0)
        is Map<*, *> -> JSONObject(v)
        is Collection<*> -> JSONArray(v)
        else -> JSONObject.wrap(v) ?: v.toString()
    }

    companion object {
        private val JSON = "application/json".toMediaType()
    }
}
