package dev.herald.client

import okhttp3.OkHttpClient

/**
 * Options of a [HeraldClient]. Every field is optional; Java sets them with setters
 * (`new ClientOptions().setToken(t)` chains, as every setter-like `withX` returns this).
 */
class ClientOptions {
    /** The connection token (JWT); null for anonymous connections or when [tokenProvider] gives tokens. */
    var token: String? = null
    /** Called for a token on the first connect (when [token] is null), before the token expires (the client then sends `refresh`), and after 4004 / error 109. */
    var tokenProvider: TokenProvider? = null
    /** Sent in `connect` (shown in server logs). */
    var name: String? = null
    var version: String? = null
    /** Sent as `connect.data` (for the connect proxy); any JSON value. */
    var data: Any? = null
    /** Headers added to the WebSocket upgrade (e.g. a cookie for the connect proxy). */
    var headers: Map<String, String> = emptyMap()
    /** Backoff window bounds: the delay of attempt n is uniform in [0, min(max, min·2^n)). */
    var minReconnectDelayMs: Long = 500
    var maxReconnectDelayMs: Long = 20_000
    /** Bounds the dial, the connect command and every command. */
    var timeoutMs: Long = 10_000
    /** Silence past the server's ping_interval after which the connection counts as dead. */
    var pingGraceMs: Long = 10_000
    /** The OkHttp client to use (shared connection pool, proxies, TLS); by default one of the client's own. */
    var okHttpClient: OkHttpClient? = null

    fun withToken(v: String?) = apply { token = v }
    fun withTokenProvider(v: TokenProvider?) = apply { tokenProvider = v }
    fun withName(v: String?) = apply { name = v }
    fun withVersion(v: String?) = apply { version = v }
    fun withData(v: Any?) = apply { data = v }
    fun withHeaders(v: Map<String, String>) = apply { headers = v }
    fun withReconnectDelays(minMs: Long, maxMs: Long) = apply { minReconnectDelayMs = minMs; maxReconnectDelayMs = maxMs }
    fun withTimeoutMs(v: Long) = apply { timeoutMs = v }
    fun withPingGraceMs(v: Long) = apply { pingGraceMs = v }
    fun withOkHttpClient(v: OkHttpClient?) = apply { okHttpClient = v }
}

/** Options of [HeraldClient.subscribe]. */
class SubscribeOptions @JvmOverloads constructor(
    /** Recover from this position (publications after it). */
    val since: StreamPosition? = null,
    /** A subscription token (JWT) for channels that need one. */
    val token: String? = null,
    /** `subscribe.data` for the subscribe proxy. */
    val data: Any? = null,
    /**
     * Gives subscription tokens: for the first subscribe (without [token]), ahead of the token's
     * expiry (the client then sends `sub_refresh`), and after `unsub` 4004 / error 109.
     */
    val tokenProvider: SubscriptionTokenProvider? = null,
    /**
     * Only publications whose tags match this filter are delivered, live and in recovery (sent as
     * `tf`; docs/protocol.md, "Tags and tag filters"). The namespace must set `allow_tags_filter`
     * (else the subscribe fails with 108; a malformed filter with 107). Offsets then have holes
     * where the filter left publications out, which the subscription does not take for gaps.
     */
    val tagsFilter: TagFilter? = null,
    /**
     * Delta compression ([DeltaType.FOSSIL], sent as `delta`; docs/protocol.md, "Delta
     * compression"): after the first live publication in full, each one comes as a Fossil delta
     * against the previous one and the SDK rebuilds it, so listeners see whole publications as
     * ever. The namespace must set `allow_delta` (else the subscribe fails with 108). Recovered
     * publications and history stay in full. Such a subscription is sent alone, never in
     * `connect.subs`.
     */
    val delta: DeltaType? = null,
)

/** The delta formats of [SubscribeOptions.delta]; [wire] is the protocol's name. */
enum class DeltaType(val wire: String) { FOSSIL("fossil") }

/** The client's state. */
enum class ClientState { DISCONNECTED, CONNECTING, CONNECTED }

/** A subscription's state. */
enum class SubscriptionState { SUBSCRIBING, SUBSCRIBED, UNSUBSCRIBED }
