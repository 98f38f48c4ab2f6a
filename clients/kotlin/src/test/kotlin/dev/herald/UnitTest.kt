package dev.herald

import dev.herald.client.Backoff
import dev.herald.client.Codes
import dev.herald.server.HeraldTokens
import org.json.JSONObject
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.util.Base64

class UnitTest {
    @Test
    fun backoffFullJitterWithinAGrowingWindow() {
        val b = Backoff(100, 800)
        val windows = listOf(100L, 200L, 400L, 800L, 800L, 800L)
        for (w in windows) {
            assertEquals(w, b.window())
            val d = b.next()
            assertTrue(d in 0 until w, "delay $d outside [0, $w)")
        }
        assertEquals(6, b.attempts)
        b.reset()
        assertEquals(100L, b.window())
    }

    @Test
    fun backoffJitters() {
        val b = Backoff(1000, 1000)
        val seen = (1..50).map { b.next() }.toSet()
        assertTrue(seen.size > 10, "50 delays gave only ${seen.size} distinct values: no jitter")
    }

    @Test
    fun backoffHonoursAfterMsAsAFloor() {
        val b = Backoff(10, 20)
        repeat(20) { assertTrue(b.next(1500) >= 1500) }
    }

    @Test
    fun closeCodeTable() {
        for (c in listOf(4000, 4001, 4002, 4003, 4004, 4005, 4499, 1000, 1006, 1011, Codes.NO_PING, Codes.TRANSPORT_CLOSED)) {
            assertTrue(Codes.shouldReconnect(c), "$c should reconnect")
        }
        for (c in listOf(4500, 4501, 4502, 4503, 4504, 4505, 4999)) assertFalse(Codes.shouldReconnect(c), "$c must not reconnect")
        assertTrue(Codes.shouldResubscribe(4003))
        assertFalse(Codes.shouldResubscribe(2000))
        assertTrue(Codes.isTemporary(111))
        assertFalse(Codes.isTemporary(103))
    }

    @Test
    fun channelNames() {
        assertTrue(Codes.isValidChannel("chat:room-1#alice,bob"))
        assertFalse(Codes.isValidChannel("bad name!"))
        assertFalse(Codes.isValidChannel(""))
        assertFalse(Codes.isValidChannel("a{b}"))
        assertFalse(Codes.isValidChannel("x".repeat(256)))
    }

    @Test
    fun hs256KnownVector() {
        // Computed independently (Python hmac/hashlib) for key "k3y" and claims {"sub":"alice"}.
        assertEquals(
            "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhbGljZSJ9.gXFwlu_470MYGFaMvKAOUgTHFpshmM0fMi3uQGhSOsE",
            HeraldTokens.sign("k3y", JSONObject().put("sub", "alice")),
        )
    }

    @Test
    fun connectionTokenClaims() {
        val t = HeraldTokens.connectionToken("s", "bob", 60, listOf("news"), mapOf("name" to "Bob"))
        val parts = t.split('.')
        assertEquals(3, parts.size)
        val claims = JSONObject(String(Base64.getUrlDecoder().decode(parts[1])))
        assertEquals("bob", claims.getString("sub"))
        assertEquals("news", claims.getJSONArray("channels").getString(0))
        assertEquals("Bob", claims.getJSONObject("info").getString("name"))
        val exp = claims.getLong("exp") - System.currentTimeMillis() / 1000
        assertTrue(exp in 58..61, "exp in $exp s")
        assertFalse(t.contains('='), "base64url without padding")
        val sub = JSONObject(String(Base64.getUrlDecoder().decode(HeraldTokens.subscriptionToken("s", "bob", "secret:x", 0).split('.')[1])))
        assertEquals("secret:x", sub.getString("channel"))
        assertFalse(sub.has("exp"))
    }
}
