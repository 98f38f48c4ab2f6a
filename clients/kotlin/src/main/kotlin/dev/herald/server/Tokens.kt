package dev.herald.server

import org.json.JSONArray
import org.json.JSONObject
import java.util.Base64
import javax.crypto.Mac
import javax.crypto.spec.SecretKeySpec

/**
 * HS256 tokens as docs/protocol.md ("Tokens") describes them: a connection token (`sub`, `exp`,
 * `channels`, `info`) and a subscription token (`sub`, `channel`, `exp`), signed with the node's
 * `token_hmac_secret`. `aud` / `iss` are added when given (needed where the node configures
 * `token_audience` / `token_issuer`).
 */
object HeraldTokens {
    /**
     * A connection token for [user] ("" for anonymous). [expiresInSeconds] ≤ 0: no `exp`.
     * [channels]: subscribed by the server at connect. [info]: shown in presence and publications.
     */
    @JvmStatic
    @JvmOverloads
    fun connectionToken(
        secret: String, user: String, expiresInSeconds: Long = 3600, channels: List<String>? = null,
        info: Map<String, Any?>? = null, audience: String? = null, issuer: String? = null,
    ): String {
        val c = JSONObject().put("sub", user)
        if (expiresInSeconds > 0) c.put("exp", nowSeconds() + expiresInSeconds)
        if (channels != null) c.put("channels", JSONArray(channels))
        if (info != null) c.put("info", JSONObject(info))
        audience?.let { c.put("aud", it) }
        issuer?.let { c.put("iss", it) }
        return sign(secret, c)
    }

    /** A subscription token for [user] on [channel]. [expiresInSeconds] ≤ 0: no `exp` (a permanent subscription). */
    @JvmStatic
    @JvmOverloads
    fun subscriptionToken(
        secret: String, user: String, channel: String, expiresInSeconds: Long = 3600,
        audience: String? = null, issuer: String? = null,
    ): String {
        val c = JSONObject().put("sub", user).put("channel", channel)
        if (expiresInSeconds > 0) c.put("exp", nowSeconds() + expiresInSeconds)
        audience?.let { c.put("aud", it) }
        issuer?.let { c.put("iss", it) }
        return sign(secret, c)
    }

    /** Sign any claims (HS256, header `{"alg":"HS256","typ":"JWT"}`). */
    @JvmStatic
    fun sign(secret: String, claims: JSONObject): String {
        require(secret.isNotEmpty()) { "empty HMAC secret" }
        val enc = Base64.getUrlEncoder().withoutPadding()
        val header = enc.encodeToString("""{"alg":"HS256","typ":"JWT"}""".toByteArray(Charsets.UTF_8))
        val payload = enc.encodeToString(claims.toString().toByteArray(Charsets.UTF_8))
        val input = "$header.$payload"
        val mac = Mac.getInstance("HmacSHA256")
        mac.init(SecretKeySpec(secret.toByteArray(Charsets.UTF_8), "HmacSHA256"))
        return input + "." + enc.encodeToString(mac.doFinal(input.toByteArray(Charsets.UTF_8)))
    }

    private fun nowSeconds() = System.currentTimeMillis() / 1000
}
