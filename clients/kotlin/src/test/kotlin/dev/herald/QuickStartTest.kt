package dev.herald

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.Timeout
import java.io.ByteArrayOutputStream
import java.io.File
import java.io.PrintStream

/** The README's quick start is src/test/kotlin/dev/herald/examples/QuickStart.kt, and it works against a real node. */
@Timeout(60)
class QuickStartTest {
    private val file = File("src/test/kotlin/dev/herald/examples/QuickStart.kt")

    @Test
    fun readmeBlockIsTheExampleFile() {
        val readme = File("README.md").readText()
        val block = Regex("```kotlin\n(// Quick start:.*?)```", RegexOption.DOT_MATCHES_ALL).find(readme)?.groupValues?.get(1)
        assertEquals(file.readText(), block, "README.md's quick start block must equal ${file.path}")
    }

    @Test
    fun quickStartRunsAgainstARealNode() {
        HeraldNode().use { node ->
            val buf = ByteArrayOutputStream()
            val old = System.out
            System.setOut(PrintStream(buf, true))
            try {
                dev.herald.examples.main(arrayOf(node.ws))
            } finally {
                System.setOut(old)
            }
            val out = buf.toString()
            assertTrue(out.contains("connected as "), out)
            assertTrue(out.contains("published at offset 1"), out)
            assertTrue(out.contains("received {\"text\":\"hello\"} (offset 1)"), out)
        }
    }
}
