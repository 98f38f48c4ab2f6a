@file:JvmName("HeraldCoroutines")

package dev.herald.client

import kotlinx.coroutines.future.await

/** Kotlin: publish and suspend until the server answers (throws [HeraldException]). */
suspend fun HeraldClient.publish(channel: String, data: Any?): PublishResult = publishAsync(channel, data).await()

/** Kotlin: read a channel's history. */
suspend fun HeraldClient.history(channel: String, options: HistoryOptions = HistoryOptions()): HistoryResult =
    historyAsync(channel, options).await()

/** Kotlin: who is subscribed to a channel now. */
suspend fun HeraldClient.presence(channel: String): PresenceResult = presenceAsync(channel).await()

/** Kotlin: call the application's backend through the rpc proxy; its answer's `data`. */
suspend fun HeraldClient.rpc(method: String, data: Any? = null): Any? = rpcAsync(method, data).await()

/** Kotlin: suspend until the subscription is subscribed. */
suspend fun Subscription.ready(): Subscription = readyAsync().await()

suspend fun Subscription.publish(data: Any?): PublishResult = publishAsync(data).await()
suspend fun Subscription.history(options: HistoryOptions = HistoryOptions()): HistoryResult = historyAsync(options).await()
suspend fun Subscription.presence(): PresenceResult = presenceAsync().await()
