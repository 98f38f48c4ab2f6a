package dev.herald.client

import okhttp3.OkHttpClient
import okhttp3.Request
import okhttp3.Response
import okhttp3.WebSocket
import okhttp3.WebSocketListener
import org.json.JSONObject
import java.util.concurrent.CompletableFuture
import java.util.concurrent.CopyOnWriteArrayList
import java.util.concurrent.CountDownLatch
import java.util.concurrent.ExecutorService
import java.util.concurrent.Executors
import java.util.concurrent.ScheduledFuture
import java.util.concurrent.ScheduledThreadPoolExecutor
import java.util.concurrent.ThreadFactory
import java.util.concurrent.TimeUnit
import java.util.logging.Level
import java.util.logging.Logger

/**
 * A connection to a Herald node (docs/protocol.md). Create it, add listeners, call [connect]: it
 * keeps one WebSocket open, reconnects with exponential backoff and full jitter (honouring the
 * server's `after_ms`), stops for good on the permanent close codes 4500–4999, recovers
 * subscriptions with `since`, follows server-side subscriptions, refreshes its token before expiry
 * and notices a dead connection when the server's pings stop.
 *
 * Thread-safe: all state lives on one internal thread; events reach listeners on another
 * ("herald-events"), in order, and futures complete there too.
 */
class HeraldClient @JvmOverloads constructor(
    val url: String,
    options: ClientOptions = ClientOptions(),
    listener: ClientListener? = null,
) : AutoCloseable {
    private val opts = options
    private val timeoutMs = if (options.timeoutMs > 0) options.timeoutMs else 10_000
    private val pingGraceMs = if (options.pingGraceMs > 0) options.pingGraceMs else 10_000
    private val backoff = Backoff(options.minReconnectDelayMs, options.maxReconnectDelayMs)
    private val ownHttp = options.okHttpClient == null
    private val http: OkHttpClient = (options.okHttpClient ?: OkHttpClient()).newBuilder()
        .connectTimeout(timeoutMs, TimeUnit.MILLISECONDS)
        .readTimeout(0, TimeUnit.MILLISECONDS)
        .build()
    private val listeners = CopyOnWriteArrayList<ClientListener>()

    internal val loop = ScheduledThreadPoolExecutor(1, daemon("herald-client")).apply { removeOnCancelPolicy = true }
    private val events: ExecutorService = Executors.newSingleThreadExecutor(daemon("herald-events"))
    private val tokenExec: ExecutorService = Executors.newSingleThreadExecutor(daemon("herald-token"))
    @Volatile private var loopThread: Thread? = null
    @Volatile private var eventsThread: Thread? = null

    // Everything below is touched on the loop thread only.
    private var state = ClientState.DISCONNECTED
    @Volatile private var publicState = ClientState.DISCONNECTED
    @Volatile private var publicClientId: String? = null
    private var closed = false
    private var conn: Conn? = null
    private var attemptSeq = 0L
    internal val subs = LinkedHashMap<String, Subscription>()
    private val serverSubs = HashSet<String>()
    private val serverPositions = HashMap<String, StreamPosition>()
    private val serverNoHistory = HashMap<String, Boolean>()
    private val pending = HashMap<Long, Pending>()
    private val waiters = ArrayList<Waiter>()
    private var nextId = 0L
    private var token: String? = options.token
    private var needToken = options.token == null
    private var disconnectPush: DisconnectPush? = null
    private var pingIntervalMs = 0L
    private var lastSeen = 0L
    private var pingTimer: ScheduledFuture<*>? = null
    private var connectTimer: ScheduledFuture<*>? = null
    private var reconnectTimer: ScheduledFuture<*>? = null
    private var refreshTimer: ScheduledFuture<*>? = null

    init {
        if (listener != null) listeners.add(listener)
        loop.execute { loopThread = Thread.currentThread() }
        events.execute { eventsThread = Thread.currentThread() }
    }

    private class Pending(val method: String, val cb: (JSONObject?, HeraldException?) -> Unit, val timer: ScheduledFuture<*>?)
    private class Waiter(val method: String, val params: JSONObject, val future: CompletableFuture<JSONObject>, var timer: ScheduledFuture<*>?)
    private class DisconnectPush(val code: Int, val reason: String, val reconnect: Boolean, val afterMs: Long)

    /** Add a listener (events from now on). */
    fun addListener(l: ClientListener) { listeners.add(l) }
    fun removeListener(l: ClientListener) { listeners.remove(l) }

    /** The state now (Java: getState()). */
    fun getState(): ClientState = publicState

    /** The server's id for the current connection (null while not connected). */
    val clientId: String? get() = publicClientId

    /** Start connecting and return at once; the client keeps reconnecting until [disconnect], [close] or a permanent close. */
    fun connect() {
        onLoopSync {
            if (closed) throw ConnectionException(Codes.CLOSED, "client is closed")
            if (state == ClientState.DISCONNECTED) {
                backoff.reset()
                setState(ClientState.CONNECTING)
                emit { it.onConnecting(ConnectingEvent(Codes.CONNECT_CALLED, "connect called")) }
                startAttempt()
            }
        }
    }

    /** Close the connection and stop reconnecting. Subscriptions stay registered: a later [connect] restores and recovers them. */
    fun disconnect() {
        onLoopSync { if (state != ClientState.DISCONNECTED) stop(Codes.DISCONNECT_CALLED, "disconnect called") }
    }

    /**
     * Disconnect for good and release the client's threads (waits a few seconds at most for the close
     * handshake and for queued events). The client cannot be used afterwards.
     */
    override fun close() {
        var c: Conn? = null
        val ok = runCatching {
            onLoopSync {
                if (closed) return@onLoopSync
                c = conn
                if (state != ClientState.DISCONNECTED) stop(Codes.DISCONNECT_CALLED, "client closed")
                closed = true
                for (s in subs.values) { s.cancelRetry(); s.cancelRefresh() }
            }
        }.isSuccess
        c?.closedLatch?.await(1, TimeUnit.SECONDS)
        c?.ws?.cancel()
        if (!ok) return
        loop.shutdownNow()
        tokenExec.shutdownNow()
        events.shutdown()
        // From a listener (the events thread itself) there is nothing to wait for.
        if (Thread.currentThread() !== eventsThread) events.awaitTermination(1, TimeUnit.SECONDS)
        if (ownHttp) {
            http.dispatcher.executorService.shutdown()
            http.connectionPool.evictAll()
        }
    }

    // ------------------------------------------------------------------------------------------
    // Subscriptions

    /**
     * Subscribe to [channel]; the subscription lasts across reconnects (recovering missed publications)
     * until [Subscription.unsubscribe] or the server ends it. Throws [UsageException] for a bad name or
     * a second subscription to one channel.
     */
    @JvmOverloads
    fun subscribe(channel: String, options: SubscribeOptions = SubscribeOptions(), listener: SubscriptionListener? = null): Subscription {
        if (!Codes.isValidChannel(channel)) throw UsageException(Codes.ERR_BAD_REQUEST, "invalid channel name")
        val s = Subscription(this, channel, options)
        if (listener != null) s.addListener(listener)
        onLoopSync {
            if (closed) throw ConnectionException(Codes.CLOSED, "client is closed")
            if (subs.containsKey(channel)) throw UsageException(Codes.ALREADY_SUBSCRIBED, "already subscribed to $channel")
            subs[channel] = s
            if (state == ClientState.CONNECTED) sendSubscribe(s)
        }
        return s
    }

    /** The subscription to [channel], if any. */
    fun getSubscription(channel: String): Subscription? = onLoopSync { subs[channel] }

    // ------------------------------------------------------------------------------------------
    // Commands. Each waits while the client is connecting (up to the timeout) and fails at once while disconnected.

    /** Publish [data] (any JSON value) to [channel]. */
    fun publishAsync(channel: String, data: Any?): CompletableFuture<PublishResult> =
        call("publish", JSONObject().put("channel", channel).put("data", Json.value(data))).thenApply(Json::publishResult)

    /** Read a channel's history. */
    @JvmOverloads
    fun historyAsync(channel: String, options: HistoryOptions = HistoryOptions()): CompletableFuture<HistoryResult> {
        val p = JSONObject().put("channel", channel)
        options.since?.let { p.put("since", it.toJson()) }
        if (options.limit > 0) p.put("limit", options.limit)
        return call("history", p).thenApply(Json::historyResult)
    }

    /** Who is subscribed to [channel] now. */
    fun presenceAsync(channel: String): CompletableFuture<PresenceResult> =
        call("presence", JSONObject().put("channel", channel)).thenApply(Json::presenceResult)

    /** Call the application's backend through the server's rpc proxy; completes with its `data` (null when none). */
    @JvmOverloads
    fun rpcAsync(method: String, data: Any? = null): CompletableFuture<Any?> {
        val p = JSONObject().put("method", method)
        if (data != null) p.put("data", Json.value(data))
        return call("rpc", p).thenApply { r -> r.opt("data").takeUnless { it == null } }
    }

    /** Send any command; completes with its raw result. */
    fun call(method: String, params: JSONObject): CompletableFuture<JSONObject> {
        val f = CompletableFuture<JSONObject>()
        try {
            loop.execute { callOnLoop(Waiter(method, params, f, null)) }
        } catch (e: java.util.concurrent.RejectedExecutionException) {
            f.completeExceptionally(ConnectionException(Codes.CLOSED, "client is closed"))
        }
        return f
    }

    private fun callOnLoop(w: Waiter) {
        when (state) {
            ClientState.CONNECTED -> request(w.method, w.params) { r, e -> complete(w.future, r, e) }
            ClientState.CONNECTING -> {
                waiters.add(w)
                w.timer = schedule(timeoutMs) {
                    if (waiters.remove(w)) complete(w.future, null, CommandTimeoutException("${w.method} (waiting for a connection)"))
                }
            }
            ClientState.DISCONNECTED -> complete(
                w.future, null,
                if (closed) ConnectionException(Codes.CLOSED, "client is closed")
                else ConnectionException(Codes.NOT_CONNECTED, "client is disconnected; call connect() first"),
            )
        }
    }

    private fun <T> complete(f: CompletableFuture<T>, r: T?, e: HeraldException?) {
        dispatch { if (e != null) f.completeExceptionally(e) else f.complete(r) }
    }

    // ------------------------------------------------------------------------------------------
    // Connection attempts (loop thread)

    private inner class Conn(val seq: Long) : WebSocketListener() {
        @Volatile var ws: WebSocket? = null
        val closedLatch = CountDownLatch(1)

        override fun onOpen(webSocket: WebSocket, response: Response) {
            post { if (conn === this && seq == attemptSeq) sendConnect() }
        }

        override fun onMessage(webSocket: WebSocket, text: String) {
            post {
                if (conn !== this) return@post
                lastSeen = System.nanoTime()
                for (line in text.split('\n')) {
                    if (conn !== this) break // a message ended this connection; the rest belongs to a gone one
                    if (line.isBlank()) continue
                    val m = try {
                        JSONObject(line)
                    } catch (e: Exception) {
                        reportError("protocol", ConnectionException(Codes.BAD_FRAME, "bad message from server"), null)
                        continue
                    }
                    onServerMessage(m)
                }
            }
        }

        override fun onMessage(webSocket: WebSocket, bytes: okio.ByteString) {
            post { if (conn === this) reportError("protocol", ConnectionException(Codes.BAD_FRAME, "binary frame from server"), null) }
        }

        override fun onClosing(webSocket: WebSocket, code: Int, reason: String) {
            webSocket.close(1000, null)
            post { lost(code, reason) }
        }

        override fun onClosed(webSocket: WebSocket, code: Int, reason: String) {
            closedLatch.countDown()
            post { lost(code, reason) }
        }

        override fun onFailure(webSocket: WebSocket, t: Throwable, response: Response?) {
            closedLatch.countDown()
            val code = if (t is java.net.SocketTimeoutException) Codes.CONNECT_TIMEOUT else Codes.TRANSPORT_CLOSED
            val why = if (response != null) "upgrade refused: HTTP ${response.code}" else "transport: ${t.javaClass.simpleName}"
            post { lost(code, why) }
        }

        private fun lost(code: Int, reason: String) {
            if (conn !== this) return
            conn = null
            connectionLost(code, reason)
        }
    }

    private fun startAttempt() {
        cancel(reconnectTimer).also { reconnectTimer = null }
        attemptSeq++
        val seq = attemptSeq
        val provider = opts.tokenProvider
        if (provider != null && (needToken || token == null)) {
            setConnectTimer()
            try {
                tokenExec.execute {
                    var tok: String? = null
                    var err: Exception? = null
                    try { tok = provider.getToken() } catch (e: Exception) { err = e }
                    post {
                        if (seq != attemptSeq || state != ClientState.CONNECTING) return@post
                        when {
                            err != null -> {
                                reportError("token", ConnectionException(Codes.NO_TOKEN, "token provider failed: ${err.javaClass.simpleName}"), null)
                                cancel(connectTimer); connectTimer = null
                                scheduleReconnect(-1)
                            }
                            tok.isNullOrEmpty() -> stop(Codes.NO_TOKEN, "token provider returned no token")
                            else -> { token = tok; needToken = false; openSocket(seq) }
                        }
                    }
                }
            } catch (e: java.util.concurrent.RejectedExecutionException) { /* closed */ }
            return
        }
        setConnectTimer()
        openSocket(seq)
    }

    private fun setConnectTimer() {
        cancel(connectTimer)
        connectTimer = schedule(timeoutMs) {
            connectTimer = null
            if (state == ClientState.CONNECTING) {
                val c = conn
                if (c != null) abort(Codes.CONNECT_TIMEOUT, "connect timed out")
                else { attemptSeq++; connectionLost(Codes.CONNECT_TIMEOUT, "token provider timed out") }
            }
        }
    }

    private fun openSocket(seq: Long) {
        val rb = Request.Builder().url(url)
        for ((k, v) in opts.headers) rb.header(k, v)
        val c = Conn(seq)
        conn = c
        disconnectPush = null
        c.ws = http.newWebSocket(rb.build(), c)
    }

    private fun send(text: String): Boolean {
        val ws = conn?.ws ?: return false
        if (!ws.send(text)) {
            abort(Codes.TRANSPORT_CLOSED, "outbound queue full")
            return false
        }
        return true
    }

    /** Send a command; [cb] runs on the loop with its result or error, exactly once. */
    internal fun request(method: String, params: JSONObject, cb: (JSONObject?, HeraldException?) -> Unit) {
        val id = ++nextId
        val text = JSONObject().put("id", id).put(method, params).toString()
        if (!send(text)) {
            cb(null, ConnectionException(Codes.CONNECTION_LOST, "not connected"))
            return
        }
        val timer = schedule(timeoutMs) {
            val p = pending.remove(id)
            p?.cb?.invoke(null, CommandTimeoutException(method))
        }
        pending[id] = Pending(method, cb, timer)
    }

    private fun sendConnect() {
        val subsParam = JSONObject()
        val included = ArrayList<Subscription>()
        for (s in subs.values) {
            if (s.sentAlone() || s.state == SubscriptionState.UNSUBSCRIBED) continue
            val since = s.subscribeSent()
            subsParam.put(s.channel, if (since != null) JSONObject().put("since", since.toJson()) else JSONObject())
            included.add(s)
        }
        for ((ch, pos) in serverPositions) {
            if (subsParam.has(ch)) continue
            subsParam.put(ch, if (serverNoHistory[ch] == true) JSONObject() else JSONObject().put("since", pos.toJson()))
        }
        val p = JSONObject()
        token?.let { p.put("token", it) }
        opts.name?.let { p.put("name", it) }
        opts.version?.let { p.put("version", it) }
        opts.data?.let { p.put("data", Json.value(it)) }
        if (subsParam.length() > 0) p.put("subs", subsParam)
        request("connect", p) { r, e -> onConnectReply(r, e, included) }
    }

    private fun onConnectReply(r: JSONObject?, err: HeraldException?, included: List<Subscription>) {
        cancel(connectTimer); connectTimer = null
        for (s in included) s.busy = false
        if (err != null || r == null) {
            when (err) {
                is ReplyException -> {
                    reportError("connect", err, null)
                    if (err.code == Codes.ERR_TOKEN_EXPIRED && opts.tokenProvider != null) {
                        needToken = true
                        abort(err.code, err.serverMessage)
                    } else if (err.isTemporary) {
                        abort(err.code, err.serverMessage)
                    } else {
                        stop(err.code, err.serverMessage)
                    }
                }
                is CommandTimeoutException -> abort(Codes.CONNECT_TIMEOUT, "connect timed out")
                else -> {} // the socket closed already; connectionLost handled it
            }
            return
        }
        backoff.reset()
        val clientId = r.optString("client", "")
        pingIntervalMs = (r.optDouble("ping_interval", 0.0) * 1000).toLong()
        lastSeen = System.nanoTime()
        armPingWatch()
        val expiresInMs = if (r.has("expires_in")) (r.optDouble("expires_in", 0.0) * 1000).toLong() else 0L
        if (expiresInMs > 0) scheduleRefresh(expiresInMs)
        publicClientId = clientId
        setState(ClientState.CONNECTED)
        val ev = ConnectedEvent(clientId, r.optString("node", ""), pingIntervalMs, expiresInMs, r.opt("data"))
        emit { it.onConnected(ev) }

        val results = r.optJSONObject("subs") ?: JSONObject()
        val requested = included.map { it.channel }.toSet()
        for (ch in serverPositions.keys.toList()) {
            val res = results.optJSONObject(ch)
            if (res == null || res.has("error")) { serverPositions.remove(ch); serverNoHistory.remove(ch) }
        }
        for (ch in results.keys()) {
            val o = results.optJSONObject(ch) ?: continue
            if (ch in requested || o.has("error")) continue
            val res = SubscribeReply.fromJson(o)
            serverSubs.add(ch)
            val held = if (serverNoHistory[ch] == true) null else serverPositions[ch]
            val recovered = res.recovered == true && held != null && held.epoch == res.epoch
            val sev = ServerSubscribedEvent(ch, res.epoch, res.offset, res.recoverable, held != null, recovered)
            serverNoHistory[ch] = !res.recoverable
            if (!recovered) serverPositions[ch] = StreamPosition(res.epoch, res.offset)
            if (held != null && !recovered && res.recoverable) {
                val fev = RecoveryFailedEvent(ch, held, res.epoch, res.offset)
                emit { it.onServerRecoveryFailed(fev) }
            }
            emit { it.onServerSubscribed(sev) }
            if (recovered) {
                for (p in res.publications.sortedBy { it.offset }) serverPublication(ch, p)
                val pos = serverPositions[ch]
                if (pos != null && pos.offset < res.offset) serverPositions[ch] = pos.copy(offset = res.offset)
            }
        }
        for (s in included) {
            if (subs[s.channel] !== s || state != ClientState.CONNECTED) continue
            val o = results.optJSONObject(s.channel)
            when {
                o == null -> sendSubscribe(s)
                o.has("error") -> onSubscribeError(s, SubscribeReply.fromJson(o).error!!)
                else -> applySubscribe(s, SubscribeReply.fromJson(o))
            }
        }
        for (s in subs.values.toList()) {
            if (state != ClientState.CONNECTED) break
            if (s.needsSubscribe()) sendSubscribe(s)
        }
    }

    private fun scheduleReconnect(afterMs: Long) {
        val d = backoff.next(if (afterMs > 0) afterMs else 0)
        cancel(reconnectTimer)
        reconnectTimer = schedule(d) {
            reconnectTimer = null
            if (state == ClientState.CONNECTING) startAttempt()
        }
    }

    /** Give up on the current connection (no ping, timeout, retryable connect error). */
    private fun abort(code: Int, reason: String) {
        val c = conn ?: return
        conn = null
        c.ws?.cancel()
        connectionLost(code, reason)
    }

    /** The connection is gone (conn already cleared): reconnect or stop. */
    private fun connectionLost(code0: Int, reason0: String) {
        val push = disconnectPush
        disconnectPush = null
        var code = code0
        var reason = reason0
        // The push and the close frame carry the same code; a proxy may have eaten the close code.
        if (code !in 4000..4999 && push != null) code = push.code
        if (push != null && push.reason.isNotEmpty()) reason = push.reason
        teardown(code, reason)
        if (state == ClientState.DISCONNECTED) return
        if (code == Codes.CLOSE_TOKEN_EXPIRED) needToken = true
        val reconnect = (push == null || push.reconnect) && Codes.shouldReconnect(code)
        if (!reconnect) {
            stop(code, reason)
            return
        }
        if (state != ClientState.CONNECTING) {
            setState(ClientState.CONNECTING)
            emit { it.onConnecting(ConnectingEvent(code, reason)) }
        }
        scheduleReconnect(push?.afterMs ?: -1)
    }

    /** The final stop: close everything and emit onDisconnected. */
    private fun stop(code: Int, reason: String) {
        attemptSeq++
        conn?.let { c ->
            conn = null
            val ws = c.ws
            if (ws != null) {
                ws.close(1000, "client disconnect")
                schedule(1000) { ws.cancel() }
            }
        }
        teardown(code, reason)
        cancel(reconnectTimer); reconnectTimer = null
        if (state == ClientState.DISCONNECTED) return
        setState(ClientState.DISCONNECTED)
        val ev = DisconnectedEvent(code, reason)
        emit { it.onDisconnected(ev) }
    }

    /** Forget the dead connection: timers, in-flight commands, server-side subscriptions. */
    private fun teardown(code: Int, reason: String) {
        cancel(connectTimer); connectTimer = null
        cancel(pingTimer); pingTimer = null
        cancel(refreshTimer); refreshTimer = null
        publicClientId = null
        serverSubs.clear()
        val pend = ArrayList(pending.values)
        pending.clear()
        for (s in subs.values) s.connectionLost()
        for (p in pend) {
            p.timer?.cancel(false)
            p.cb(null, ConnectionException(Codes.CONNECTION_LOST, "connection lost: $reason", code))
        }
    }

    // ------------------------------------------------------------------------------------------
    // Incoming messages (loop thread)

    private fun onServerMessage(m: JSONObject) {
        if (m.has("id")) {
            val p = pending.remove(m.optLong("id")) ?: return // a late reply to a command that timed out
            p.timer?.cancel(false)
            val e = m.optJSONObject("error")
            if (e != null) {
                p.cb(null, ReplyException(e.optInt("code", -1), e.optString("message", "")))
            } else {
                p.cb(m.optJSONObject(p.method) ?: JSONObject(), null)
            }
            return
        }
        if (m.length() == 0) { // ping
            send("{}")
            return
        }
        m.optJSONObject("pub")?.let { o ->
            val ch = o.optString("channel")
            val pub = Publication.fromJson(o)
            val s = subs[ch]
            if (s == null) {
                if (ch in serverSubs) serverPublication(ch, pub)
            } else if (s.applyPublication(pub, if (o.has("delta")) o.optBoolean("delta") else null)) {
                resync(s, true)
            }
            return
        }
        m.optJSONObject("skip")?.let { o ->
            val ch = o.optString("channel")
            val from = o.optLong("from", -1)
            val to = o.optLong("to", -1)
            if (from < 0 || to < from) {
                reportError("protocol", ConnectionException(Codes.BAD_FRAME, "skip without channel, from or to"), ch)
                return
            }
            val s = subs[ch]
            if (s == null) {
                if (ch in serverSubs) serverSkip(ch, from, to)
            } else if (s.applySkip(from, to)) {
                resync(s, true)
            }
            return
        }
        val join = m.optJSONObject("join")
        val leave = m.optJSONObject("leave")
        if (join != null || leave != null) {
            val o = join ?: leave!!
            val ch = o.optString("channel")
            val ev = PresenceEvent(ch, ClientInfo.fromJson(o.optJSONObject("info")) ?: ClientInfo("", "", null))
            val s = subs[ch]
            if (s != null) s.applyPresence(join != null, ev)
            else if (ch in serverSubs) emit { if (join != null) it.onServerJoin(ev) else it.onServerLeave(ev) }
            return
        }
        m.optJSONObject("subscribe")?.let { o ->
            val ch = o.optString("channel")
            if (subs.containsKey(ch)) return
            val r = SubscribeReply.fromJson(o)
            serverSubs.add(ch)
            serverPositions[ch] = StreamPosition(r.epoch, r.offset)
            serverNoHistory[ch] = !r.recoverable
            val ev = ServerSubscribedEvent(ch, r.epoch, r.offset, r.recoverable, false, false)
            emit { it.onServerSubscribed(ev) }
            return
        }
        m.optJSONObject("unsub")?.let { o ->
            val ch = o.optString("channel")
            val code = o.optInt("code", 0)
            val reason = o.optString("reason", "")
            val s = subs[ch]
            if (s == null) {
                serverPositions.remove(ch)
                serverNoHistory.remove(ch)
                if (serverSubs.remove(ch)) {
                    val ev = UnsubscribedEvent(ch, code, reason)
                    emit { it.onServerUnsubscribed(ev) }
                }
                return
            }
            if (Codes.shouldResubscribe(code)) {
                if (code == Codes.UNSUB_TOKEN_EXPIRED && s.options.tokenProvider != null) s.needToken = true
                resync(s, false)
            } else {
                subs.remove(ch)
                s.end(code, reason, null)
            }
            return
        }
        m.optJSONObject("disconnect")?.let { o ->
            // The close frame that follows ends the connection.
            disconnectPush = DisconnectPush(
                o.optInt("code", 0), o.optString("reason", ""), o.optBoolean("reconnect", true),
                if (o.has("after_ms")) o.optLong("after_ms", -1) else -1,
            )
            return
        }
        // Unknown pushes are ignored (compatible extensions).
    }

    /** Deliver a publication of a server-side subscription once, in order. */
    private fun serverPublication(channel: String, p: Publication) {
        val pos = serverPositions[channel]
        var epoch = ""
        if (pos != null && serverNoHistory[channel] != true) {
            epoch = pos.epoch
            if (p.offset > 0) {
                if (p.offset <= pos.offset) return // already delivered
                serverPositions[channel] = pos.copy(offset = p.offset)
            }
        }
        val ev = PublicationEvent(channel, p.offset, epoch, p.data, p.info, p.tags)
        emit { it.onServerPublication(ev) }
    }

    /**
     * A server-side subscription's `skip`: move its position to [to] (a reconnect recovers from there)
     * and tell the app; a stale one is ignored. As for its publications ([serverPublication]), a hole
     * before it is not looked for: the client does not resubscribe the server's subscriptions.
     */
    private fun serverSkip(channel: String, from: Long, to: Long) {
        val pos = serverPositions[channel]
        if (pos != null && serverNoHistory[channel] != true) {
            if (to <= pos.offset) return
            serverPositions[channel] = pos.copy(offset = to)
        }
        val ev = SkippedEvent(channel, from, to)
        emit { it.onServerSkipped(ev) }
    }

    // ------------------------------------------------------------------------------------------
    // Subscriptions (loop thread)

    internal fun sendSubscribe(s: Subscription) {
        if (state != ClientState.CONNECTED || s.busy || s.fetching || s.state == SubscriptionState.UNSUBSCRIBED) return
        if (s.needToken) {
            fetchSubscriptionToken(s)
            return
        }
        val since = s.subscribeSent()
        val p = JSONObject().put("channel", s.channel)
        since?.let { p.put("since", it.toJson()) }
        s.token?.let { p.put("token", it) }
        s.options.data?.let { p.put("data", Json.value(it)) }
        s.options.tagsFilter?.let { p.put("tf", it.toJson()) }
        s.options.delta?.let { p.put("delta", it.wire) }
        request("subscribe", p) { r, e ->
            s.busy = false
            if (subs[s.channel] !== s) return@request // unsubscribed meanwhile
            if (e != null) onSubscribeError(s, e)
            else applySubscribe(s, SubscribeReply.fromJson(r!!))
        }
    }

    private fun applySubscribe(s: Subscription, r: SubscribeReply) {
        if (r.expiresIn != null && r.expiresIn > 0) scheduleSubRefresh(s, (r.expiresIn * 1000).toLong())
        if (s.applySubscribe(r) && subs[s.channel] === s) resync(s, true)
    }

    /** Ask the subscription's token provider (on the token thread), then subscribe. */
    private fun fetchSubscriptionToken(s: Subscription) {
        val provider = s.options.tokenProvider ?: return
        s.fetching = true
        val submitted = runCatching {
            tokenExec.execute {
                var tok: String? = null
                var err: Exception? = null
                try { tok = provider.getToken(s.channel) } catch (e: Exception) { err = e }
                post {
                    s.fetching = false
                    if (subs[s.channel] !== s) return@post
                    when {
                        err != null -> {
                            val e = ConnectionException(Codes.NO_TOKEN, "subscription token provider failed: ${err.javaClass.simpleName}")
                            s.reportError(e)
                            reportError("subscribe", e, s.channel)
                            s.retryLater { sendSubscribe(s) }
                        }
                        tok.isNullOrEmpty() -> {
                            subs.remove(s.channel)
                            s.end(Codes.NO_TOKEN, "subscription token provider returned no token", null)
                        }
                        else -> {
                            s.token = tok
                            s.needToken = false
                            sendSubscribe(s)
                        }
                    }
                }
            }
        }.isSuccess
        if (!submitted) s.fetching = false
    }

    /** Send `sub_refresh` with a fresh subscription token ahead of the current one's expiry. */
    private fun scheduleSubRefresh(s: Subscription, expiresInMs: Long) {
        s.cancelRefresh()
        val provider = s.options.tokenProvider ?: return // a fixed token: the server ends it with unsub 4004
        val delay = maxOf(expiresInMs - minOf(10_000L, expiresInMs / 4), 0)
        s.refreshTimer = schedule(delay) {
            s.refreshTimer = null
            val c = conn ?: return@schedule
            runCatching {
                tokenExec.execute {
                    var tok: String? = null
                    var err: Exception? = null
                    try { tok = provider.getToken(s.channel) } catch (e: Exception) { err = e }
                    post {
                        if (conn !== c || subs[s.channel] !== s || s.state != SubscriptionState.SUBSCRIBED) return@post
                        if (err != null || tok.isNullOrEmpty()) {
                            val e = ConnectionException(Codes.NO_TOKEN, "subscription token provider gave no token for sub_refresh")
                            s.reportError(e)
                            s.needToken = true // if it expires first: unsub 4004, then a fresh subscribe
                            return@post
                        }
                        s.token = tok
                        request("sub_refresh", JSONObject().put("channel", s.channel).put("token", tok)) { r, e ->
                            if (e != null) {
                                if (e !is ConnectionException) s.reportError(e)
                                s.needToken = true
                                return@request
                            }
                            if (r != null && r.has("expires_in") && conn === c && subs[s.channel] === s) {
                                val ms = (r.optDouble("expires_in", 0.0) * 1000).toLong()
                                if (ms > 0) scheduleSubRefresh(s, ms)
                            }
                        }
                    }
                }
            }
        }
    }

    private fun onSubscribeError(s: Subscription, err: HeraldException) {
        if (err is ConnectionException && err.code != Codes.BAD_FRAME) return // the next connect restores it
        if (err is ReplyException && err.code == Codes.ERR_TOKEN_EXPIRED && s.options.tokenProvider != null) {
            s.needToken = true
            s.retryLater { sendSubscribe(s) }
            return
        }
        if (err is CommandTimeoutException || (err is ReplyException && err.isTemporary) || err is ConnectionException) {
            s.reportError(err)
            reportError("subscribe", err, s.channel)
            s.retryLater { sendSubscribe(s) }
            return
        }
        subs.remove(s.channel)
        reportError("subscribe", err, s.channel)
        s.end(err.code, err.message ?: "", err)
    }

    /**
     * Subscribe again with since (after a gap, or an unsub with a resubscribe code). When the server
     * still holds the subscription ([serverSubscribed]), unsubscribe first.
     */
    internal fun resync(s: Subscription, serverSubscribed: Boolean) {
        if (s.state == SubscriptionState.SUBSCRIBED) s.state = SubscriptionState.SUBSCRIBING
        if (state != ClientState.CONNECTED || s.busy) return
        s.retryLater {
            if (!serverSubscribed) {
                sendSubscribe(s)
                return@retryLater
            }
            s.busy = true
            request("unsubscribe", JSONObject().put("channel", s.channel)) { _, e ->
                s.busy = false
                if (subs[s.channel] !== s || e is ConnectionException) return@request
                sendSubscribe(s)
            }
        }
    }

    internal fun unsubscribe(s: Subscription) {
        onLoopSync {
            if (subs[s.channel] !== s) return@onLoopSync
            subs.remove(s.channel)
            val serverKnows = state == ClientState.CONNECTED && (s.state == SubscriptionState.SUBSCRIBED || s.busy)
            s.end(Codes.UNSUBSCRIBE_CALLED, "unsubscribe called", null)
            if (serverKnows) request("unsubscribe", JSONObject().put("channel", s.channel)) { _, _ -> }
        }
    }

    // ------------------------------------------------------------------------------------------
    // Pings and token refresh

    /** The server pings every ping_interval; anything received counts as life. Past ping_interval + grace of silence the connection is dead. */
    private fun armPingWatch() {
        cancel(pingTimer); pingTimer = null
        if (pingIntervalMs <= 0) return
        val limitNs = TimeUnit.MILLISECONDS.toNanos(pingIntervalMs + pingGraceMs)
        val wait = maxOf(TimeUnit.NANOSECONDS.toMillis(lastSeen + limitNs - System.nanoTime()), 0)
        pingTimer = schedule(wait) {
            pingTimer = null
            if (conn == null) return@schedule
            if (System.nanoTime() - lastSeen >= limitNs) abort(Codes.NO_PING, "no ping from server") else armPingWatch()
        }
    }

    private fun scheduleRefresh(expiresInMs: Long) {
        cancel(refreshTimer); refreshTimer = null
        if (opts.tokenProvider == null) return // a fixed token cannot be refreshed; the server will close with 4004
        // 10 s early, or a quarter of the lifetime for short-lived tokens.
        val delay = maxOf(expiresInMs - minOf(10_000L, expiresInMs / 4), 0)
        refreshTimer = schedule(delay) { refreshTimer = null; refreshToken() }
    }

    private fun refreshToken() {
        val c = conn ?: return
        val provider = opts.tokenProvider ?: return
        if (closed) return
        try {
            tokenExec.execute {
                var tok: String? = null
                var err: Exception? = null
                try { tok = provider.getToken() } catch (e: Exception) { err = e }
                post {
                    if (err != null) {
                        reportError("refresh", ConnectionException(Codes.NO_TOKEN, "token provider failed: ${err.javaClass.simpleName}"), null)
                        if (conn === c) refreshTimer = schedule(2000) { refreshTimer = null; refreshToken() }
                        return@post
                    }
                    if (conn !== c || state != ClientState.CONNECTED) {
                        if (!tok.isNullOrEmpty()) { token = tok; needToken = false }
                        return@post
                    }
                    if (tok.isNullOrEmpty()) {
                        stop(Codes.NO_TOKEN, "token provider returned no token")
                        return@post
                    }
                    token = tok
                    request("refresh", JSONObject().put("token", tok)) { r, e ->
                        if (e != null) {
                            if (e !is ConnectionException) reportError("refresh", e, null)
                            needToken = true // the reconnect after 4004 fetches a fresh one
                            return@request
                        }
                        if (r != null && r.has("expires_in") && conn === c) {
                            val ms = (r.optDouble("expires_in", 0.0) * 1000).toLong()
                            if (ms > 0) scheduleRefresh(ms)
                        }
                    }
                }
            }
        } catch (e: java.util.concurrent.RejectedExecutionException) { /* closed */ }
    }

    // ------------------------------------------------------------------------------------------
    // Helpers

    private fun setState(s: ClientState) {
        if (state == s) return
        state = s
        publicState = s
        when (s) {
            ClientState.CONNECTED -> {
                val ws = ArrayList(waiters); waiters.clear()
                for (w in ws) { w.timer?.cancel(false); callOnLoop(w) }
            }
            ClientState.DISCONNECTED -> {
                val ws = ArrayList(waiters); waiters.clear()
                for (w in ws) { w.timer?.cancel(false); callOnLoop(w) }
                for (sub in subs.values) sub.notifyChanged()
            }
            else -> {}
        }
    }

    internal fun schedule(ms: Long, f: () -> Unit): ScheduledFuture<*>? = try {
        loop.schedule({ runSafely(f) }, ms, TimeUnit.MILLISECONDS)
    } catch (e: java.util.concurrent.RejectedExecutionException) {
        null
    }

    private fun cancel(f: ScheduledFuture<*>?) { f?.cancel(false) }

    internal fun post(f: () -> Unit): Boolean = try {
        loop.execute { runSafely(f) }
        true
    } catch (_: java.util.concurrent.RejectedExecutionException) {
        false
    }

    private fun runSafely(f: () -> Unit) {
        try { f() } catch (t: Throwable) { log.log(Level.SEVERE, "herald: internal error", t) }
    }

    /** Run [f] on the loop thread and wait for it (directly when already there). */
    internal fun <T> onLoopSync(f: () -> T): T {
        if (Thread.currentThread() === loopThread) return f()
        val fut = try {
            loop.submit<T> { f() }
        } catch (e: java.util.concurrent.RejectedExecutionException) {
            throw ConnectionException(Codes.CLOSED, "client is closed")
        }
        try {
            return fut.get()
        } catch (e: java.util.concurrent.ExecutionException) {
            throw e.cause ?: e
        }
    }

    internal fun dispatch(f: () -> Unit) {
        try {
            events.execute { try { f() } catch (t: Throwable) { log.log(Level.WARNING, "herald: listener threw", t) } }
        } catch (_: java.util.concurrent.RejectedExecutionException) {}
    }

    private fun emit(f: (ClientListener) -> Unit) {
        dispatch { for (l in listeners) try { f(l) } catch (t: Throwable) { log.log(Level.WARNING, "herald: listener threw", t) } }
    }

    internal fun reportError(type: String, e: HeraldException, channel: String?) {
        val ev = ErrorEvent(type, e, channel)
        emit { it.onError(ev) }
    }

    companion object {
        private val log = Logger.getLogger("dev.herald.client")

        private fun daemon(name: String) = ThreadFactory { r -> Thread(r, name).apply { isDaemon = true } }
    }
}
