//! Delivery accounting from offsets: what one subscription's application saw (new, duplicate,
//! out of order, gap), and the totals a worker reports once it knows which offsets were published.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What the application saw when one publication arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// First time this offset arrived, in order.
    New,
    /// First time, but after a higher offset (the stream went backwards).
    OutOfOrder,
    /// First time, and one or more offsets before it were skipped (a gap as the app sees it).
    Gap,
    /// This offset had already been delivered.
    Duplicate,
    /// At or before the subscription's starting point (published before it subscribed).
    Stale,
}

/// One subscription's view of a channel stream, kept across reconnects.
///
/// `seen` is a bitmap relative to `base` (the first offset this subscription is owed), so 10,000
/// subscribers of a 1,000-publication run cost 10,000 × 128 bytes.
#[derive(Debug, Clone, Default)]
pub struct SubAccount {
    /// First offset owed: the subscribe reply's `offset` + 1.
    pub base: u64,
    /// Highest offset delivered so far (`base - 1` before any).
    pub last: u64,
    seen: Vec<u64>,
    /// Counts of each kind of arrival.
    pub counts: Counts,
}

/// Counters of arrivals, summed over subscriptions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Distinct offsets delivered.
    pub unique: u64,
    /// Offsets delivered again.
    pub duplicates: u64,
    /// Distinct offsets that arrived after a higher one.
    pub out_of_order: u64,
    /// Times the stream jumped ahead (offset > last + 1).
    pub gap_events: u64,
    /// Offsets skipped over at those jumps (some may arrive later, out of order).
    pub gap_skipped: u64,
    /// Offsets at or before the subscription's start.
    pub stale: u64,
}

impl Counts {
    /// Adds another set of counts into this one.
    pub fn add(&mut self, o: &Counts) {
        self.unique += o.unique;
        self.duplicates += o.duplicates;
        self.out_of_order += o.out_of_order;
        self.gap_events += o.gap_events;
        self.gap_skipped += o.gap_skipped;
        self.stale += o.stale;
    }
}

impl SubAccount {
    /// A subscription whose subscribe reply said the newest offset was `reply_offset`.
    pub fn new(reply_offset: u64) -> Self {
        Self {
            base: reply_offset + 1,
            last: reply_offset,
            seen: Vec::new(),
            counts: Counts::default(),
        }
    }

    /// Records one arriving publication and says what the application saw.
    pub fn on_pub(&mut self, offset: u64) -> Seen {
        if offset < self.base {
            self.counts.stale += 1;
            return Seen::Stale;
        }
        let rel = (offset - self.base) as usize;
        let (word, bit) = (rel / 64, rel % 64);
        if word >= self.seen.len() {
            self.seen.resize(word + 1, 0);
        }
        if self.seen[word] & (1 << bit) != 0 {
            self.counts.duplicates += 1;
            return Seen::Duplicate;
        }
        self.seen[word] |= 1 << bit;
        self.counts.unique += 1;
        if offset < self.last {
            self.counts.out_of_order += 1;
            Seen::OutOfOrder
        } else if offset > self.last + 1 {
            self.counts.gap_events += 1;
            self.counts.gap_skipped += offset - self.last - 1;
            self.last = offset;
            Seen::Gap
        } else {
            self.last = offset;
            Seen::New
        }
    }

    /// Whether `offset` has been delivered.
    pub fn has(&self, offset: u64) -> bool {
        if offset < self.base {
            return false;
        }
        let rel = (offset - self.base) as usize;
        self.seen
            .get(rel / 64)
            .is_some_and(|w| w & (1 << (rel % 64)) != 0)
    }

    /// How many offsets of `first..=last` were delivered.
    pub fn delivered_in(&self, first: u64, last: u64) -> u64 {
        if last < first {
            return 0;
        }
        (first..=last).filter(|&o| self.has(o)).count() as u64
    }
}

/// Which offsets the publisher got back from the API for one channel.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expected {
    /// Stream epoch the publications got.
    pub epoch: String,
    /// Lowest offset published during the run.
    pub first: u64,
    /// Highest offset published during the run.
    pub last: u64,
    /// Publications that got an offset (equals last − first + 1 when nobody else published).
    pub count: u64,
}

/// Totals over a set of subscriptions, once the expected offsets are known.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// Subscriptions accounted.
    pub subscriptions: u64,
    /// Publications owed: for each subscription, the offsets published to its channel.
    pub expected: u64,
    /// Owed publications that arrived (each counted once).
    pub delivered: u64,
    /// Owed publications that never arrived.
    pub missing: u64,
    /// Subscriptions that missed at least one publication.
    pub subscriptions_missing: u64,
    /// Arrival counters.
    pub counts: Counts,
}

impl Delivery {
    /// Accounts one subscription of `channel` against what was published.
    pub fn add_sub(
        &mut self,
        sub: &SubAccount,
        channel: &str,
        expect: &BTreeMap<String, Expected>,
    ) {
        self.subscriptions += 1;
        self.counts.add(&sub.counts);
        if let Some(e) = expect.get(channel) {
            if e.count > 0 {
                let owed = e.last - e.first + 1;
                let got = sub.delivered_in(e.first, e.last);
                self.expected += owed;
                self.delivered += got;
                self.missing += owed - got;
                if got < owed {
                    self.subscriptions_missing += 1;
                }
            }
        }
    }

    /// Adds another worker's totals.
    pub fn add(&mut self, o: &Delivery) {
        self.subscriptions += o.subscriptions;
        self.expected += o.expected;
        self.delivered += o.delivered;
        self.missing += o.missing;
        self.subscriptions_missing += o.subscriptions_missing;
        self.counts.add(&o.counts);
    }

    /// Delivered as a percentage of expected (100 when nothing was owed).
    pub fn delivered_pct(&self) -> f64 {
        if self.expected == 0 {
            100.0
        } else {
            100.0 * self.delivered as f64 / self.expected as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_new_duplicate_reorder_gap_stale() {
        let mut s = SubAccount::new(10);
        assert_eq!(s.on_pub(11), Seen::New);
        assert_eq!(s.on_pub(12), Seen::New);
        assert_eq!(s.on_pub(12), Seen::Duplicate);
        assert_eq!(s.on_pub(15), Seen::Gap);
        assert_eq!(s.on_pub(13), Seen::OutOfOrder);
        assert_eq!(s.on_pub(10), Seen::Stale);
        assert_eq!(s.on_pub(16), Seen::New);
        assert_eq!(s.on_pub(200), Seen::Gap);
        assert_eq!(
            s.counts,
            Counts {
                unique: 6,
                duplicates: 1,
                out_of_order: 1,
                gap_events: 2,
                gap_skipped: 2 + 183,
                stale: 1
            }
        );
        assert_eq!(s.delivered_in(11, 16), 5);
        let mut expect = BTreeMap::new();
        expect.insert(
            "c".to_string(),
            Expected {
                epoch: "e".into(),
                first: 11,
                last: 20,
                count: 10,
            },
        );
        let mut d = Delivery::default();
        d.add_sub(&s, "c", &expect);
        assert_eq!(
            (d.expected, d.delivered, d.missing, d.subscriptions_missing),
            (10, 5, 5, 1)
        );
        assert!((d.delivered_pct() - 50.0).abs() < 1e-9);
    }
}
