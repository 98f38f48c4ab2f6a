package dev.herald.client

/** The client is (re)connecting: [code] is [Codes.CONNECT_CALLED] after connect(), else why the last connection was lost. */
data class ConnectingEvent(val code: Int, val reason: String)

/** A `connect` reply arrived: [client] is the server's id for this connection. */
data class ConnectedEvent(val client: String, val node: String, val pingIntervalMs: Long, val expiresInMs: Long, val data: Any?)

/** The client stopped for good (until connect() again): a permanent close code, a refusing reply's code, or [Codes.DISCONNECT_CALLED]. */
data class DisconnectedEvent(val code: Int, val reason: String)

/** A non-fatal error: [type] is "connect", "token", "refresh", "subscribe" or "protocol". */
data class ErrorEvent(val type: String, val error: HeraldException, val channel: String?)

/**
 * The server subscribed the connection to a channel (token `channels`, connect proxy, `POST /api/subscribe`).
 * [recovering]: the SDK asked to recover it (after a reconnect); [recovered]: it did.
 */
data class ServerSubscribedEvent(
    val channel: String, val epoch: String, val offset: Long, val recoverable: Boolean,
    val recovering: Boolean, val recovered: Boolean,
)

/**
 * A publication handed to the app, exactly once and in order. [epoch] is "" on channels without
 * history. [offset] is 0 for one kept out of history (`skip_history`): live only, it moves no
 * position. [tags]: the publisher's tags, when it set some.
 */
data class PublicationEvent @JvmOverloads constructor(
    val channel: String, val offset: Long, val epoch: String, val data: Any?, val info: ClientInfo?,
    val tags: Map<String, String>? = null,
)

/**
 * The server left publications [from]..[to] of [channel] out for this connection: the namespace's
 * `backpressure` is `conflate` or `drop_oldest` and the client read too slowly. They are not
 * recovered; the position moves to [to] and the next publication is [to] + 1 (sent in full).
 */
data class SkippedEvent(val channel: String, val from: Long, val to: Long)

/** A presence change (`join`/`leave` push). */
data class PresenceEvent(val channel: String, val info: ClientInfo)

/** A subscription ended for good: an `unsub` push (2000: API unsubscribe), a refusal's code, or [Codes.UNSUBSCRIBE_CALLED]. */
data class UnsubscribedEvent(val channel: String, val code: Int, val reason: String)

/** A subscribe reply: fresh, after a reconnect or a resubscribe ([resubscribed]). [recovered]: missed publications were recovered. */
data class SubscribedEvent(
    val channel: String, val epoch: String, val offset: Long, val recoverable: Boolean,
    val recovered: Boolean, val resubscribed: Boolean, val data: Any?,
)

/** The SDK asked to recover from [since] and the server could not: the app should reload its state. */
data class RecoveryFailedEvent(val channel: String, val since: StreamPosition, val epoch: String, val offset: Long)

/** A subscription's non-fatal error (it retries) or the error that ended it. */
data class SubscriptionErrorEvent(val channel: String, val error: HeraldException)

/**
 * The client's events. Every method has an empty default, so Java and Kotlin implement only what they need.
 * They run on one thread of the client's ("herald-events"), in order; do not block it for long.
 */
interface ClientListener {
    fun onConnecting(event: ConnectingEvent) {}
    fun onConnected(event: ConnectedEvent) {}
    fun onDisconnected(event: DisconnectedEvent) {}
    fun onError(event: ErrorEvent) {}
    /** Server-side subscriptions only (the app's own subscriptions have [SubscriptionListener]). */
    fun onServerSubscribed(event: ServerSubscribedEvent) {}
    /** Server-side subscriptions: the SDK asked to recover the channel and the server could not (once per failure, just before [onServerSubscribed]). */
    fun onServerRecoveryFailed(event: RecoveryFailedEvent) {}
    fun onServerPublication(event: PublicationEvent) {}
    /** Server-side subscriptions: publications left out by the namespace's backpressure policy (see [SkippedEvent]). */
    fun onServerSkipped(event: SkippedEvent) {}
    fun onServerJoin(event: PresenceEvent) {}
    fun onServerLeave(event: PresenceEvent) {}
    fun onServerUnsubscribed(event: UnsubscribedEvent) {}
}

/** A subscription's events, on the client's event thread, in order. */
interface SubscriptionListener {
    fun onSubscribed(event: SubscribedEvent) {}
    fun onPublication(event: PublicationEvent) {}
    fun onRecoveryFailed(event: RecoveryFailedEvent) {}
    /** Publications left out by the namespace's backpressure policy, not recovered (see [SkippedEvent]). */
    fun onSkipped(event: SkippedEvent) {}
    fun onJoin(event: PresenceEvent) {}
    fun onLeave(event: PresenceEvent) {}
    fun onUnsubscribed(event: UnsubscribedEvent) {}
    fun onError(event: SubscriptionErrorEvent) {}
}

/** Gives a subscription token for a channel. Called on a background thread; may block. Return null to end the subscription ([Codes.NO_TOKEN]); throw to retry with backoff. */
fun interface SubscriptionTokenProvider {
    @Throws(Exception::class)
    fun getToken(channel: String): String?
}

/** Gives the client a connection token. Called on a background thread; may block (bounded by the client's timeout). Return null to stop the client ([Codes.NO_TOKEN]); throw to retry with backoff. */
fun interface TokenProvider {
    @Throws(Exception::class)
    fun getToken(): String?
}
