package dev.herald.client

import java.io.ByteArrayOutputStream
import java.nio.ByteBuffer
import java.nio.charset.CharacterCodingException
import java.nio.charset.CodingErrorAction

// Applying a Fossil delta (https://fossil-scm.org/home/doc/trunk/www/delta_format.wiki), the format
// of Herald's delta compression (docs/protocol.md). Only the applier: the server makes the deltas.
// Hand-written because no maintained Fossil delta library for the JVM is on Maven Central, and the
// applier is small; it checks the delta's own checksum, so a wrong base cannot go unnoticed.

/** A delta that cannot be applied to the base it was given. */
internal class DeltaException(message: String) : Exception(message)

internal object Fossil {
    private val VALUE = IntArray(128) { -1 }.also { v ->
        "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~".forEachIndexed { i, c -> v[c.code] = i }
    }

    /** Fossil's checksum: the sum of the bytes taken as big-endian 32-bit words (wrapping, unsigned). */
    fun checksum(b: ByteArray, n: Int = b.size): Long {
        var sum0 = 0; var sum1 = 0; var sum2 = 0; var sum3 = 0
        var i = 0
        while (i + 4 <= n) {
            sum0 += b[i].toInt() and 0xff
            sum1 += b[i + 1].toInt() and 0xff
            sum2 += b[i + 2].toInt() and 0xff
            sum3 += b[i + 3].toInt() and 0xff
            i += 4
        }
        sum3 += (sum2 shl 8) + (sum1 shl 16) + (sum0 shl 24)
        val left = n - i
        if (left >= 3) sum3 += (b[i + 2].toInt() and 0xff) shl 8
        if (left >= 2) sum3 += (b[i + 1].toInt() and 0xff) shl 16
        if (left >= 1) sum3 += (b[i].toInt() and 0xff) shl 24
        return sum3.toLong() and 0xffffffffL
    }

    /** Apply [delta] to [base]. Throws [DeltaException] when it does not fit. */
    fun apply(base: ByteArray, delta: ByteArray): ByteArray {
        var pos = 0
        fun int(): Long {
            var v = 0L
            val start = pos
            while (pos < delta.size) {
                val c = delta[pos].toInt() and 0xff
                val d = if (c < 128) VALUE[c] else -1
                if (d < 0) break
                v = v * 64 + d
                // Sizes, offsets and the checksum all fit in 32 bits; more is a broken delta.
                if (v > 0xffffffffL) throw DeltaException("delta: number too large")
                pos++
            }
            if (pos == start) throw DeltaException("delta: number expected")
            return v
        }
        fun next(): Int = if (pos < delta.size) delta[pos++].toInt() and 0xff else -1

        val size = int()
        if (next() != '\n'.code) throw DeltaException("delta: size not followed by a newline")
        if (size > Int.MAX_VALUE - 8) throw DeltaException("delta: output too large")
        // Grown as the commands fill it, so a bogus size alone allocates nothing.
        val out = ByteArrayOutputStream(minOf(size, 1L shl 16).toInt())
        while (pos < delta.size) {
            val count = int()
            when (next()) {
                '@'.code -> {
                    val offset = int()
                    if (next() != ','.code) throw DeltaException("delta: copy without a comma")
                    if (out.size() + count > size) throw DeltaException("delta: copy past the output size")
                    if (offset + count > base.size) throw DeltaException("delta: copy past the end of the base")
                    out.write(base, offset.toInt(), count.toInt())
                }
                ':'.code -> {
                    if (out.size() + count > size) throw DeltaException("delta: insert past the output size")
                    if (pos + count > delta.size) throw DeltaException("delta: insert past the end of the delta")
                    out.write(delta, pos, count.toInt())
                    pos += count.toInt()
                }
                ';'.code -> {
                    val result = out.toByteArray()
                    if (result.size.toLong() != size) throw DeltaException("delta: output size does not match")
                    if (count != checksum(result)) throw DeltaException("delta: bad checksum (not made from this base)")
                    return result
                }
                else -> throw DeltaException("delta: unknown command")
            }
        }
        throw DeltaException("delta: unterminated")
    }

    /** Apply a delta carried as text to a base held as text (both UTF-8 on the wire). */
    fun applyText(base: String, delta: String): String {
        val out = apply(base.toByteArray(Charsets.UTF_8), delta.toByteArray(Charsets.UTF_8))
        return try {
            Charsets.UTF_8.newDecoder()
                .onMalformedInput(CodingErrorAction.REPORT)
                .onUnmappableCharacter(CodingErrorAction.REPORT)
                .decode(ByteBuffer.wrap(out)).toString()
        } catch (_: CharacterCodingException) {
            throw DeltaException("delta: the result is not UTF-8")
        }
    }
}
