//! The receive path: one core NATS subscription per hosted channel (on its delivery subject),
//! the control subscription, and what happens when the connection comes back.
//!
//! `read_channel → deliver → handler.on_publication`: each channel has its own task, so a
//! channel's messages reach the hub in the order the stream republished them (offset order),
//! and unsubscribing is dropping that task's subscription. Every publication received counts as
//! seen for the channel's watermark (see `publish.rs`: a NATS that comes back behind).
//!
//! A subscription that falls behind makes the client drop messages (a slow-consumer event); each
//! such event leads to a catch-up of every hosted channel that starts after it. Events are
//! coalesced, at most one catch-up a second, but none is dropped: one that arrives within the
//! second after a catch-up schedules another for the end of that second ([`SlowConsumerGate`]).

use std::sync::Arc;
use std::time::Duration;

use async_nats::{Event, Message, Subscriber};
use futures_util::StreamExt;
use herald_broker::{Backoff, BrokerError, ControlMessage};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::broker::Inner;
use crate::codec::{decode_delivery, traced_publication, Delivery};
use crate::metrics::inc;
use crate::presence;

/// A hosted channel's subscription task.
pub(crate) struct ChannelTask {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// `Broker::subscribe`: subscribe the delivery subject and return once the server has it
/// (a request round trip, not a flush), so that a history read made afterwards misses nothing
/// and a presence change another node sends afterwards arrives.
pub(crate) async fn subscribe(inner: &Arc<Inner>, channel: &str) -> Result<(), BrokerError> {
    inner.ensure_connected()?;
    let subject = inner.subjects.delivery(channel);
    let subscriber = inner
        .timed("subscribe", inner.client.subscribe(subject))
        .await?
        .map_err(|e| BrokerError::unavailable(format!("subscribe {channel}: {e}")).caused_by(e))?;
    // On failure `subscriber` drops here, which unsubscribes.
    inner.round_trip(&format!("subscribe {channel}")).await?;
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(read_channel(
        inner.clone(),
        channel.to_owned(),
        subscriber,
        stopped,
    ));
    let previous = inner
        .channels
        .lock()
        .expect("channels lock")
        .insert(channel.to_owned(), ChannelTask { stop, task });
    if let Some(previous) = previous {
        // The hub never subscribes twice; should it, keep exactly one subscription.
        warn!(%channel, "subscribed twice; replacing the earlier subscription");
        stop_task(previous).await;
    } else {
        inner.metrics.subscribed_channels.inc();
    }
    Ok(())
}

/// `Broker::unsubscribe`: stop the channel's task; returns once nothing more is delivered.
pub(crate) async fn unsubscribe(inner: &Inner, channel: &str) -> Result<(), BrokerError> {
    let entry = inner
        .channels
        .lock()
        .expect("channels lock")
        .remove(channel);
    if let Some(entry) = entry {
        inner.metrics.subscribed_channels.dec();
        stop_task(entry).await;
    }
    Ok(())
}

async fn stop_task(entry: ChannelTask) {
    let _ = entry.stop.send(());
    let _ = entry.task.await;
}

/// One channel's receive loop.
async fn read_channel(
    inner: Arc<Inner>,
    channel: String,
    mut subscriber: Subscriber,
    mut stopped: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            biased;
            _ = &mut stopped => break,
            message = subscriber.next() => match message {
                Some(message) => deliver(&inner, &channel, message),
                None => break,
            },
        }
    }
    // Waits for room in the client's command queue; dropping would only try once.
    let _ = tokio::time::timeout(Duration::from_secs(1), subscriber.unsubscribe()).await;
}

/// Hand one delivery-subject message to the hub.
fn deliver(inner: &Inner, channel: &str, message: Message) {
    let Some(handler) = inner.handler.get() else {
        return;
    };
    match decode_delivery(message.headers.as_ref(), &message.payload) {
        Delivery::Publications(stored) => {
            // A group-committed message holds several, in offset order.
            inner
                .watermarks
                .observe(channel, &stored.epoch, stored.last());
            let traced = traced_publication(message.headers.as_ref());
            for p in stored.publications {
                inc(&inner.metrics.received_publications);
                match traced {
                    Some((offset, tp)) if offset == p.offset => {
                        handler.on_traced_publication(channel, &stored.epoch, p, tp)
                    }
                    _ => handler.on_publication(channel, &stored.epoch, p),
                }
            }
        }
        Delivery::Unstored(p) => {
            inc(&inner.metrics.received_publications);
            handler.on_publication(channel, "", p);
        }
        Delivery::Presence(joined, who) => {
            inc(&inner.metrics.received_presence);
            handler.on_presence_change(channel, joined, who);
        }
        Delivery::Marker => {}
        Delivery::Unknown => {
            inc(&inner.metrics.received_invalid);
            debug!(%channel, subject = %message.subject, "ignored a message that is not Herald's");
        }
    }
}

/// The control subscription's loop (the one subscription every node always holds).
pub(crate) async fn read_control(
    inner: Arc<Inner>,
    mut subscriber: Subscriber,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let message = tokio::select! {
            message = subscriber.next() => message,
            _ = shutdown.changed() => break,
        };
        let Some(message) = message else { break };
        match serde_json::from_slice::<ControlMessage>(&message.payload) {
            Ok(control) => {
                inc(&inner.metrics.received_control);
                if let Some(handler) = inner.handler.get() {
                    handler.on_control(control);
                }
            }
            Err(err) => {
                inc(&inner.metrics.received_invalid);
                debug!(cause = %err, "ignored a bad control message");
            }
        }
    }
}

/// Connection events: count them, and after a reconnect restore state and tell the hub.
pub(crate) async fn watch_connection(
    inner: Arc<Inner>,
    mut events: mpsc::UnboundedReceiver<Event>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut lost = false;
    let mut slow = SlowConsumerGate::new(SLOW_CONSUMER_WINDOW);
    loop {
        let deferred = slow.deferred();
        let event = tokio::select! {
            event = events.recv() => event,
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep_until(deferred.unwrap_or_else(Instant::now)),
                if deferred.is_some() =>
            {
                if slow.due(Instant::now()) {
                    slow_catch_up(&inner);
                }
                continue;
            }
        };
        match event {
            None => return,
            Some(Event::Disconnected) => {
                lost = true;
                warn!("lost the connection to NATS; publishing fails until it is back");
            }
            Some(Event::Connected) if lost => {
                lost = false;
                inc(&inner.metrics.reconnects);
                info!("reconnected to NATS; catching up");
                let inner = inner.clone();
                let shutdown = shutdown.clone();
                // Off this loop, so that another disconnect is seen meanwhile.
                tokio::spawn(async move { recover(inner, shutdown).await });
            }
            Some(Event::SlowConsumer(_)) => {
                // The client dropped messages of a subscription that fell behind: the hub may
                // have missed publications it will not notice until the next one arrives.
                // Catch up now, or, within a second of the last catch-up, once that second ends.
                if slow.event(Instant::now()) {
                    slow_catch_up(&inner);
                }
            }
            Some(_) => {}
        }
    }
}

/// Slow-consumer catch-ups at most this often.
const SLOW_CONSUMER_WINDOW: Duration = Duration::from_secs(1);

fn slow_catch_up(inner: &Inner) {
    warn!("NATS subscription fell behind and dropped messages; catching up");
    inc(&inner.metrics.catchups);
    if let Some(handler) = inner.handler.get() {
        handler.on_reconnected();
    }
}

/// When slow-consumer events lead to catch-ups: every event is followed by a catch-up that starts
/// after it (messages dropped after a catch-up read history are caught by the next one), and
/// catch-ups are at least `window` apart. Events within the window after a catch-up share one
/// deferred catch-up at the window's end.
#[derive(Debug)]
struct SlowConsumerGate {
    window: Duration,
    /// When the last catch-up started.
    last: Option<Instant>,
    /// A catch-up owed at this time.
    deferred: Option<Instant>,
}

impl SlowConsumerGate {
    fn new(window: Duration) -> Self {
        SlowConsumerGate {
            window,
            last: None,
            deferred: None,
        }
    }

    /// An event at `now`: `true` to catch up now; `false` when one is deferred (see
    /// [`deferred`](Self::deferred)).
    fn event(&mut self, now: Instant) -> bool {
        if self.deferred.is_some() {
            // The deferred catch-up starts after this event: it covers it.
            return false;
        }
        match self.last {
            Some(last) if now < last + self.window => {
                self.deferred = Some(last + self.window);
                false
            }
            _ => {
                self.last = Some(now);
                true
            }
        }
    }

    /// When the deferred catch-up is due, if one is owed.
    fn deferred(&self) -> Option<Instant> {
        self.deferred
    }

    /// At `now`: `true` (once) when the deferred catch-up is due, to run it now.
    fn due(&mut self, now: Instant) -> bool {
        match self.deferred {
            Some(at) if now >= at => {
                self.deferred = None;
                self.last = Some(now);
                true
            }
            _ => false,
        }
    }
}

/// After a reconnect: the client has re-sent every subscription; make sure the streams exist
/// (the server may have restarted without them), that the re-subscriptions are in effect (flush),
/// then let the hub catch up every hosted channel from history and re-store presence.
async fn recover(inner: Arc<Inner>, shutdown: watch::Receiver<bool>) {
    inner.tails.clear();
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        if *shutdown.borrow() {
            return;
        }
        if inner.ensure_connected().is_err() {
            // Disconnected again: the next Connected event starts over.
            return;
        }
        let ready = async {
            inner.streams.ensure().await?;
            inner.round_trip("resubscribe").await
        };
        match ready.await {
            Ok(()) => break,
            Err(err) => {
                debug!(cause = %err, "JetStream not ready after reconnect; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
    let hosted = inner.channels.lock().expect("channels lock").len() as u64;
    inner.metrics.resubscriptions.inc_by(hosted);
    inc(&inner.metrics.catchups);
    if let Some(handler) = inner.handler.get() {
        handler.on_reconnected();
    }
    presence::refresh_all(&inner).await;
}

/// Background task: re-read the boot id, and notice a stream that was deleted and created again
/// while this node stayed connected (an operator, or another node after a loss), and forget the cached tails, which
/// point at sequences of the old stream. Without a reconnect nothing else would tell: sequences
/// restart at 1 in a new stream, so an old tail's sequence could match a new message by chance.
/// Checked every few seconds; a publish that meets a missing stream clears them at once.
pub(crate) async fn watch_streams(inner: Arc<Inner>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(STREAM_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut known: [Option<i128>; 2] = [None, None];
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if inner.ensure_connected().is_err() {
            continue;
        }
        let now = inner.streams.created().await;
        let replaced = known
            .iter()
            .zip(&now)
            .any(|(before, after)| matches!((before, after), (Some(b), Some(a)) if a != b));
        if replaced {
            warn!("a Herald stream was recreated; forgetting cached channel tails");
            inner.tails.clear();
        }
        for (k, n) in known.iter_mut().zip(now) {
            if n.is_some() {
                *k = n;
            }
        }
        // The boot id may change while this node stays connected (on a cluster, the servers
        // holding the boot stream restarted); re-read it so that this node stamps what the
        // others check against (see the `boot` module).
        if let Err(err) = inner.boot.confirm(&inner).await {
            debug!(cause = %err, "boot id check failed");
        }
    }
}

/// How often [`watch_streams`] looks.
const STREAM_CHECK: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slow_consumer_event_is_followed_by_a_catch_up() {
        let window = Duration::from_secs(1);
        let mut gate = SlowConsumerGate::new(window);
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        assert!(gate.event(t0), "the first catches up at once");
        assert_eq!(gate.deferred(), None);

        // A second one within the window is not dropped: it is owed at the window's end.
        assert!(!gate.event(ms(300)));
        assert_eq!(gate.deferred(), Some(ms(1000)));
        // More before then share it.
        assert!(!gate.event(ms(900)));
        assert_eq!(gate.deferred(), Some(ms(1000)));
        assert!(!gate.due(ms(999)), "not before it is due");
        assert!(gate.due(ms(1000)), "the deferred catch-up runs");
        assert!(!gate.due(ms(1001)), "once");
        assert_eq!(gate.deferred(), None);

        // The deferred catch-up opened a new window.
        assert!(!gate.event(ms(1500)));
        assert_eq!(gate.deferred(), Some(ms(2000)));
        assert!(gate.due(ms(2100)));
        // Past the window an event catches up at once again.
        assert!(gate.event(ms(3200)));
        assert_eq!(gate.deferred(), None);
    }
}
