package dev.herald.client

/**
 * Numeric codes of docs/protocol.md (reply errors, close codes, `unsub` codes) and the SDK's own
 * codes for things it notices itself (below 100, the same numbers as the JS and Go SDKs).
 */
object Codes {
    // Reply error codes (error.code in a command reply).
    const val ERR_INTERNAL = 100
    const val ERR_UNAUTHORIZED = 101
    const val ERR_UNKNOWN_NAMESPACE = 102
    const val ERR_PERMISSION_DENIED = 103
    const val ERR_UNKNOWN_METHOD = 104
    const val ERR_ALREADY_SUBSCRIBED = 105
    const val ERR_LIMIT_EXCEEDED = 106
    const val ERR_BAD_REQUEST = 107
    const val ERR_NOT_AVAILABLE = 108
    const val ERR_TOKEN_EXPIRED = 109
    const val ERR_TOO_MANY_REQUESTS = 110
    const val ERR_TEMPORARILY_UNAVAILABLE = 111
    const val ERR_BACKEND_UNAVAILABLE = 112

    // Close codes: 4000–4499 the client reconnects, 4500–4999 it does not.
    const val CLOSE_SHUTDOWN = 4000
    const val CLOSE_SLOW_CONSUMER = 4001
    const val CLOSE_NO_PONG = 4002
    const val CLOSE_INSUFFICIENT_STATE = 4003
    const val CLOSE_TOKEN_EXPIRED = 4004
    const val CLOSE_BACKEND_ERROR = 4005
    const val CLOSE_BAD_REQUEST = 4500
    const val CLOSE_UNAUTHORIZED = 4501
    const val CLOSE_DISCONNECTED_BY_API = 4502
    const val CLOSE_MESSAGE_TOO_LARGE = 4503
    const val CLOSE_CONNECTION_LIMIT = 4504
    const val CLOSE_REFUSED_BY_BACKEND = 4505

    // unsub push codes.
    const val UNSUB_SERVER = 2000
    const val UNSUB_RESUBSCRIBE = 4003
    const val UNSUB_TOKEN_EXPIRED = 4004

    // The SDK's own codes.
    const val CONNECT_CALLED = 0
    const val DISCONNECT_CALLED = 1
    const val TRANSPORT_CLOSED = 2
    const val NO_PING = 3
    const val CONNECT_TIMEOUT = 4
    const val NO_TOKEN = 5
    const val CONNECT_REJECTED = 6
    const val TIMEOUT = 7
    const val CONNECTION_LOST = 8
    const val NOT_CONNECTED = 9
    const val BAD_FRAME = 10
    const val ALREADY_SUBSCRIBED = 11
    const val UNSUBSCRIBE_CALLED = 12
    const val CLOSED = 13

    /** A reply error worth retrying later: 100, 110, 111, 112. */
    @JvmStatic
    fun isTemporary(code: Int): Boolean =
        code == ERR_INTERNAL || code == ERR_TOO_MANY_REQUESTS || code == ERR_TEMPORARILY_UNAVAILABLE ||
            code == ERR_BACKEND_UNAVAILABLE

    /** The close-code rule: 4500–4999 stay down; everything else (4000–4499, 1000, 1006 …) reconnects. */
    @JvmStatic
    fun shouldReconnect(closeCode: Int): Boolean = closeCode !in 4500..4999

    /** `unsub` codes in 4000–4499 mean "subscribe again with since". */
    @JvmStatic
    fun shouldResubscribe(unsubCode: Int): Boolean = unsubCode in 4000..4499

    private val CHANNEL = Regex("^[A-Za-z0-9_:.@=/#,-]{1,255}$")

    /** Whether a channel name is valid (1 to 255 bytes of `[A-Za-z0-9_:.@=/#,-]`). */
    @JvmStatic
    fun isValidChannel(channel: String): Boolean = CHANNEL.matches(channel)
}
