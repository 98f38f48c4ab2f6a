//! Retry pacing, one helper for every retry loop of the node (broker reconnects, catch-up reads,
//! webhook deliveries, the PostgreSQL and Kafka consumers' retries): a delay that doubles from `min` up to `max`, optionally with ±25 % jitter
//! so that many nodes or channels retrying at once spread out instead of arriving together.

use std::time::Duration;

/// See the module docs.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
    jitter: bool,
    /// `max` was handed out already.
    spent: bool,
}

impl Backoff {
    /// Delays from `min` (at least 1 ms) doubling up to `max`, with ±25 % jitter.
    pub fn new(min: Duration, max: Duration) -> Self {
        let min = min.max(Duration::from_millis(1));
        Backoff {
            min,
            max: max.max(min),
            next: min,
            jitter: true,
            spent: false,
        }
    }

    /// The same, without jitter: the delays are exactly `min`, `2 × min`, … `max`.
    pub fn exact(self) -> Self {
        Backoff {
            jitter: false,
            ..self
        }
    }

    /// The next delay to wait.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.spent |= base >= self.max;
        self.next = self.next.saturating_mul(2).min(self.max);
        self.jittered(base)
    }

    /// The delay before retry number `attempt` (0: the first, `min`), without changing this
    /// backoff: for a client that asks by attempt number (async-nats' reconnect callback).
    pub fn delay_for_attempt(&self, attempt: u32) -> Duration {
        // 2^31 × 1 ms is weeks: any `max` a config gives is reached before the shift saturates.
        let base = self.min.saturating_mul(1 << attempt.min(31)).min(self.max);
        self.jittered(base)
    }

    fn jittered(&self, base: Duration) -> Duration {
        if self.jitter {
            base.mul_f64(0.75 + rand::random::<f64>() * 0.5)
        } else {
            base
        }
    }

    /// The next delay, or `None` once `max` was handed out: for a loop that tries a bounded
    /// number of times (`min`, `2 × min`, … `max`, then gives up).
    pub fn next_delay_until_max(&mut self) -> Option<Duration> {
        (!self.spent).then(|| self.next_delay())
    }

    /// Start again from `min` (after a success).
    pub fn reset(&mut self) {
        self.next = self.min;
        self.spent = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_max_then_stays() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(400)).exact();
        let got: Vec<_> = (0..5).map(|_| b.next_delay()).collect();
        assert_eq!(got, [ms(100), ms(200), ms(400), ms(400), ms(400)]);
        b.reset();
        assert_eq!(b.next_delay(), ms(100));
    }

    #[test]
    fn a_bounded_loop_ends_after_max() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(400)).exact();
        let got: Vec<_> = std::iter::from_fn(|| b.next_delay_until_max()).collect();
        assert_eq!(got, [ms(100), ms(200), ms(400)]);
    }

    #[test]
    fn attempts_by_number_double_up_to_max() {
        let ms = Duration::from_millis;
        let b = Backoff::new(ms(50), ms(2000)).exact();
        let got: Vec<_> = (0..8).map(|n| b.delay_for_attempt(n)).collect();
        assert_eq!(
            got,
            [
                ms(50),
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(2000),
                ms(2000)
            ]
        );
        assert_eq!(b.delay_for_attempt(u32::MAX), ms(2000), "no overflow");
        let mut huge = Backoff::new(Duration::MAX - Duration::from_secs(1), Duration::MAX).exact();
        huge.next_delay();
        assert_eq!(huge.next_delay(), Duration::MAX, "doubling saturates");
    }

    #[test]
    fn jitter_stays_within_a_quarter() {
        let mut b = Backoff::new(Duration::from_millis(1000), Duration::from_secs(60));
        let d = b.next_delay();
        assert!(
            d >= Duration::from_millis(750) && d <= Duration::from_millis(1250),
            "{d:?}"
        );
    }
}
