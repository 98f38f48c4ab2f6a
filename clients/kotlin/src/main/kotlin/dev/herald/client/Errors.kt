package dev.herald.client

/** Every failure the SDK reports carries a [code]: a protocol code (reply error, close code) or one of [Codes]' SDK codes. */
open class HeraldException(val code: Int, message: String, cause: Throwable? = null) : Exception(message, cause)

/** The server answered a command with an error (`error.code`, e.g. 103, 107, or an application code 1000–1999). */
class ReplyException(code: Int, val serverMessage: String) : HeraldException(code, "herald: error $code: $serverMessage") {
    /** Worth retrying later (100, 110, 111, 112). */
    val isTemporary: Boolean get() = Codes.isTemporary(code)
}

/** The connection was lost, the client is disconnected or closed; [closeCode] is the close code when one is known. */
class ConnectionException @JvmOverloads constructor(code: Int, message: String, val closeCode: Int = 0) :
    HeraldException(code, "herald: $message")

/** A command got no reply within the client's timeout ([Codes.TIMEOUT]). */
class CommandTimeoutException(val method: String) : HeraldException(Codes.TIMEOUT, "herald: no reply to $method in time")

/** A call the SDK refuses before sending anything (bad channel name, already subscribed …). */
class UsageException(code: Int, message: String) : HeraldException(code, "herald: $message")
