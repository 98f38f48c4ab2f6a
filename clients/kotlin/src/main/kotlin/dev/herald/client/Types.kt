package dev.herald.client

import org.json.JSONArray
import org.json.JSONObject

/**
 * JSON values in this SDK are org.json values (built into Android): [JSONObject], [JSONArray],
 * String, Number, Boolean, or [JSONObject.NULL]. Data you pass in may also be a Map, a List, or a
 * [RawJson] (sent as it is).
 */
class RawJson(val json: String) {
    override fun toString() = json
}

/** A position in a channel's stream: the epoch and the offset of the last publication seen. */
data class StreamPosition(val epoch: String, val offset: Long) {
    fun toJson(): JSONObject = JSONObject().put("epoch", epoch).put("offset", offset)

    companion object {
        @JvmStatic
        fun fromJson(o: JSONObject): StreamPosition = StreamPosition(o.optString("epoch", ""), o.optLong("offset", 0))
    }
}

/** Who a client is: `user`, `client` and the connection token's `info` claim (when it had one). */
data class ClientInfo(val user: String, val client: String, val info: Any?) {
    companion object {
        internal fun fromJson(o: JSONObject?): ClientInfo? =
            o?.let { ClientInfo(it.optString("user", ""), it.optString("client", ""), it.opt("info")) }
    }
}

/**
 * A publication: its [offset] in the stream (0 on channels without history, and for one kept out
 * of history with `skip_history`), [data], the publisher's [info] and [tags] (when it set some).
 */
data class Publication @JvmOverloads constructor(
    val offset: Long, val data: Any?, val info: ClientInfo?, val tags: Map<String, String>? = null,
) {
    companion object {
        internal fun fromJson(o: JSONObject): Publication =
            Publication(o.optLong("offset", 0), o.opt("data"), ClientInfo.fromJson(o.optJSONObject("info")), tags(o.optJSONObject("tags")))

        private fun tags(o: JSONObject?): Map<String, String>? =
            o?.let { t -> t.keySet().associateWith { t.optString(it, "") } }

        internal fun list(a: JSONArray?): List<Publication> =
            if (a == null) emptyList() else (0 until a.length()).mapNotNull { a.optJSONObject(it)?.let(::fromJson) }
    }
}

/** The answer to a publish: where the publication went. */
data class PublishResult(val epoch: String, val offset: Long)

/** The answer to a history call. [incomplete]: history no longer holds everything after `since`. */
data class HistoryResult(val epoch: String, val offset: Long, val publications: List<Publication>, val incomplete: Boolean)

/** The answer to a presence call: client id → who. */
data class PresenceResult(val clients: Map<String, ClientInfo>)

/** Options of [HeraldClient.history]. */
data class HistoryOptions @JvmOverloads constructor(val since: StreamPosition? = null, val limit: Int = 0)

internal object Json {
    fun value(v: Any?): Any = when (v) {
        null -> JSONObject.NULL
        is RawJson -> parse(v.json)
        is JSONObject, is JSONArray, is String, is Number, is Boolean -> v
        is StreamPosition -> v.toJson()
        is Map<*, *> -> JSONObject().also { o -> v.forEach { (k, x) -> o.put(k.toString(), value(x)) } }
        is Iterable<*> -> JSONArray().also { a -> v.forEach { a.put(value(it)) } }
        is Array<*> -> JSONArray().also { a -> v.forEach { a.put(value(it)) } }
        else -> JSONObject.wrap(v) ?: v.toString()
    }

    fun parse(s: String): Any {
        val t = s.trim()
        return when {
            t.startsWith("{") -> JSONObject(t)
            t.startsWith("[") -> JSONArray(t)
            else -> JSONArray("[$t]").get(0)
        }
    }

    fun publishResult(o: JSONObject) = PublishResult(o.optString("epoch", ""), o.optLong("offset", 0))

    fun historyResult(o: JSONObject) = HistoryResult(
        o.optString("epoch", ""), o.optLong("offset", 0), Publication.list(o.optJSONArray("publications")),
        o.optBoolean("incomplete", false),
    )

    fun presenceResult(o: JSONObject): PresenceResult {
        val c = o.optJSONObject("clients") ?: JSONObject()
        val m = LinkedHashMap<String, ClientInfo>()
        for (k in c.keys()) ClientInfo.fromJson(c.optJSONObject(k))?.let { m[k] = it }
        return PresenceResult(m)
    }
}
