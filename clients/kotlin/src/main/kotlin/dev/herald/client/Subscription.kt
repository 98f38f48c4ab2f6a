package dev.herald.client

import java.util.concurrent.CompletableFuture
import java.util.concurrent.CopyOnWriteArrayList
import java.util.concurrent.ScheduledFuture

/**
 * A subscription made with [HeraldClient.subscribe]. It lasts across reconnects: the SDK
 * resubscribes with `since` and hands every missed publication to the app once, in order
 * ([SubscribedEvent.recovered] true), or reports [RecoveryFailedEvent] once when the server could
 * not recover (the app reloads its state).
 */
class Subscription internal constructor(private val client: HeraldClient, val channel: String, internal val options: SubscribeOptions) {
    private val listeners = CopyOnWriteArrayList<SubscriptionListener>()

    // Loop thread only.
    internal val tracker = StreamTracker(options.since, filtered = options.tagsFilter != null)
    private var sentSince: StreamPosition? = null
    internal var busy = false
    private val backoff = Backoff(200, 10_000)
    private var retryTimer: ScheduledFuture<*>? = null
    private var subscribedOnce = false
    internal var token: String? = options.token
    internal var needToken = options.token == null && options.tokenProvider != null
    internal var fetching = false
    internal var refreshTimer: ScheduledFuture<*>? = null
    private var readyFutures = ArrayList<CompletableFuture<Subscription>>()
    /** With [SubscribeOptions.delta]: the last live publication in text form, the next delta's base. */
    private var deltaBase: DeltaBase? = null
    @Volatile private var publicState = SubscriptionState.SUBSCRIBING
    internal var state: SubscriptionState = SubscriptionState.SUBSCRIBING
        set(v) {
            if (field == v) return
            field = v
            publicState = v
            notifyChanged()
        }

    fun addListener(l: SubscriptionListener) { listeners.add(l) }
    fun removeListener(l: SubscriptionListener) { listeners.remove(l) }

    /** The state now. */
    fun getState(): SubscriptionState = publicState

    /** The position handed to the app so far (null before the first subscribe reply). */
    val position: StreamPosition? get() = client.onLoopSync { tracker.position() }

    /** End the subscription (an [UnsubscribedEvent] with [Codes.UNSUBSCRIBE_CALLED]). */
    fun unsubscribe() = client.unsubscribe(this)

    /** Completes when subscribed; fails when the subscription ends or the client is disconnected. */
    fun readyAsync(): CompletableFuture<Subscription> {
        val f = CompletableFuture<Subscription>()
        val posted = client.post {
            readyFutures.add(f)
            notifyChanged()
        }
        if (!posted) f.completeExceptionally(ConnectionException(Codes.CLOSED, "client is closed"))
        return f
    }

    fun publishAsync(data: Any?) = client.publishAsync(channel, data)
    @JvmOverloads
    fun historyAsync(options: HistoryOptions = HistoryOptions()) = client.historyAsync(channel, options)
    fun presenceAsync() = client.presenceAsync(channel)

    // ------------------------------------------------------------------------------------------
    // Loop thread

    internal fun notifyChanged() {
        if (readyFutures.isEmpty()) return
        val err: HeraldException? = when {
            state == SubscriptionState.SUBSCRIBED -> null
            state == SubscriptionState.UNSUBSCRIBED -> UsageException(Codes.UNSUBSCRIBE_CALLED, "subscription ended")
            client.getState() == ClientState.DISCONNECTED -> ConnectionException(Codes.NOT_CONNECTED, "client is disconnected")
            else -> return
        }
        val fs = readyFutures
        readyFutures = ArrayList()
        client.dispatch { for (f in fs) if (err == null) f.complete(this) else f.completeExceptionally(err) }
    }

    internal fun sentAlone() =
        options.token != null || options.tokenProvider != null || options.data != null || options.tagsFilter != null ||
            options.delta != null

    internal fun needsSubscribe() = state == SubscriptionState.SUBSCRIBING && !busy && !fetching && retryTimer == null

    internal fun subscribeSent(): StreamPosition? {
        val since = tracker.since()
        state = SubscriptionState.SUBSCRIBING
        sentSince = since
        busy = true
        return since
    }

    /** Apply a subscribe reply; true when a gap remains (resubscribe from the position). */
    internal fun applySubscribe(r: SubscribeReply): Boolean {
        val asked = sentSince
        sentSince = null
        // A new server-side subscription: its first live publication comes in full.
        deltaBase = null
        val out = tracker.applySubscribe(r, asked)
        val resubscribed = subscribedOnce
        subscribedOnce = true
        if (out.recoveryFailed && asked != null) {
            val ev = RecoveryFailedEvent(channel, asked, r.epoch, r.offset)
            emit { it.onRecoveryFailed(ev) }
        }
        val ev = SubscribedEvent(channel, r.epoch, r.offset, r.recoverable, out.recovered, resubscribed, r.data)
        state = SubscriptionState.SUBSCRIBED
        emit { it.onSubscribed(ev) }
        for (p in out.publications) deliver(p)
        return out.gap
    }

    /**
     * A live publication; true when a gap was seen, or a delta could not be applied (resubscribe:
     * `since` recovers it in full). [delta]: the push's `delta` field (null when absent, plain data).
     */
    internal fun applyPublication(p0: Publication, delta: Boolean? = null): Boolean {
        if (state != SubscriptionState.SUBSCRIBED) return false
        val p = if (delta != null) {
            undelta(p0, delta) ?: return true
        } else {
            deltaBase = null // plain data (queued with the subscribe reply): no base after it
            p0
        }
        when (tracker.applyPublication(p)) {
            Verdict.GAP -> return true
            Verdict.DELIVER -> { backoff.reset(); deliver(p) }
            Verdict.DUPLICATE -> {}
        }
        return false
    }

    /** A `skip` push; true when it reveals a hole before it (resubscribe with since). */
    internal fun applySkip(from: Long, to: Long): Boolean {
        if (state != SubscriptionState.SUBSCRIBED) return false
        return when (tracker.applySkip(from, to)) {
            Verdict.GAP -> true
            Verdict.DUPLICATE -> false
            Verdict.DELIVER -> {
                // The skipped run held the next delta's base; the publication after it comes in full.
                deltaBase = null
                val ev = SkippedEvent(channel, from, to)
                emit { it.onSkipped(ev) }
                false
            }
        }
    }

    internal fun applyPresence(join: Boolean, ev: PresenceEvent) {
        if (state != SubscriptionState.SUBSCRIBED) return
        emit { if (join) it.onJoin(ev) else it.onLeave(ev) }
    }

    /**
     * A publication in text form made whole: its data parsed, after applying its delta to the base
     * held. Null when that cannot be done (no base for it, or the delta does not fit).
     */
    private fun undelta(p: Publication, delta: Boolean): Publication? {
        val base = deltaBase
        deltaBase = null
        var text = p.data as? String ?: return null
        if (delta) {
            if (base == null || base.offset + 1 != p.offset) return null
            text = try { Fossil.applyText(base.text, text) } catch (_: DeltaException) { return null }
        }
        val data = try { Json.parse(text) } catch (_: org.json.JSONException) { return null }
        deltaBase = DeltaBase(p.offset, text)
        return p.copy(data = data)
    }

    private class DeltaBase(val offset: Long, val text: String)

    private fun deliver(p: Publication) {
        val epoch = if (tracker.recoverable) tracker.epoch else ""
        val ev = PublicationEvent(channel, p.offset, epoch, p.data, p.info, p.tags)
        emit { it.onPublication(ev) }
    }

    internal fun connectionLost() {
        busy = false
        cancelRetry()
        cancelRefresh()
        if (state == SubscriptionState.SUBSCRIBED) state = SubscriptionState.SUBSCRIBING
    }

    internal fun retryLater(f: () -> Unit) {
        if (retryTimer != null) return
        retryTimer = client.schedule(backoff.next()) {
            retryTimer = null
            f()
        }
    }

    internal fun cancelRefresh() {
        refreshTimer?.cancel(false)
        refreshTimer = null
    }

    internal fun cancelRetry() {
        retryTimer?.cancel(false)
        retryTimer = null
    }

    internal fun reportError(e: HeraldException) {
        val ev = SubscriptionErrorEvent(channel, e)
        emit { it.onError(ev) }
    }

    internal fun end(code: Int, reason: String, err: HeraldException?) {
        if (state == SubscriptionState.UNSUBSCRIBED) return
        cancelRetry()
        cancelRefresh()
        if (err != null) reportError(err)
        state = SubscriptionState.UNSUBSCRIBED
        val ev = UnsubscribedEvent(channel, code, reason)
        emit { it.onUnsubscribed(ev) }
    }

    private fun emit(f: (SubscriptionListener) -> Unit) {
        client.dispatch { for (l in listeners) try { f(l) } catch (_: Throwable) {} }
    }
}
