package dev.herald

import java.io.File
import java.net.HttpURLConnection
import java.net.ServerSocket
import java.net.URI
import java.util.concurrent.TimeUnit

/**
 * The real herald binary on a free loopback port (HERALD_BIN, default target/debug/herald at the
 * repository root; a relative path is taken from the repository root). Killed by [close], and by a
 * shutdown hook should the JVM end first.
 */
class HeraldNode(env: Map<String, String> = emptyMap()) : AutoCloseable {
    val port: Int = ServerSocket(0).use { it.localPort }
    private val log = File.createTempFile("herald-node", ".log")
    private val proc: Process
    private val hook = Thread { kill() }

    val http get() = "http://127.0.0.1:$port"
    val ws get() = "ws://127.0.0.1:$port/ws"

    init {
        val pb = ProcessBuilder(binary().path, "serve", "--dev", "--port", port.toString())
            .redirectErrorStream(true).redirectOutput(log)
        pb.environment()["RUST_LOG"] = "warn"
        pb.environment()["HERALD_API_KEY"] = API_KEY
        pb.environment()["HERALD_TOKEN_HMAC_SECRET"] = SECRET
        pb.environment().putAll(env)
        proc = pb.start()
        Runtime.getRuntime().addShutdownHook(hook)
        val deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20)
        while (true) {
            if (!proc.isAlive) { kill(); error("herald exited at start (${proc.exitValue()}):\n${log.readText().take(2000)}") }
            val ok = runCatching {
                val c = URI("$http/health").toURL().openConnection() as HttpURLConnection
                c.connectTimeout = 500; c.readTimeout = 500
                c.responseCode == 200
            }.getOrDefault(false)
            if (ok) break
            if (System.nanoTime() > deadline) { kill(); error("herald did not answer /health within 20 s:\n${log.readText().take(2000)}") }
            Thread.sleep(50)
        }
    }

    private fun kill() {
        proc.destroy()
        if (!proc.waitFor(3, TimeUnit.SECONDS)) proc.destroyForcibly().waitFor(3, TimeUnit.SECONDS)
    }

    override fun close() {
        kill()
        runCatching { Runtime.getRuntime().removeShutdownHook(hook) }
        log.delete()
    }

    companion object {
        const val API_KEY = "test-api-key"
        const val SECRET = "test-hmac-secret"

        fun binary(): File {
            val repo = File(System.getProperty("user.dir")).absoluteFile.parentFile.parentFile // clients/kotlin → repository root
            val p = System.getenv("HERALD_BIN") ?: "target/debug/herald"
            val f = if (File(p).isAbsolute) File(p) else File(repo, p)
            check(f.canExecute()) { "no herald binary at $f (cargo build -p herald-server, or set HERALD_BIN)" }
            return f
        }
    }
}
