//! Per-connection command rate limit: a token bucket.

use std::time::Instant;

/// Allows `rate` commands per second with bursts of `burst`.
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(rate: u32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            rate: f64::from(rate.max(1)),
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    /// Whether the bucket would be full at `now` (unused long enough to forget).
    pub fn is_full(&self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens + elapsed * self.rate >= self.burst
    }

    /// Take one token if there is one.
    pub fn try_take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn burst_then_refill() {
        let start = Instant::now();
        let mut b = TokenBucket::new(10, 3);
        assert!((0..3).all(|_| b.try_take(start)));
        assert!(!b.try_take(start));
        assert!(b.try_take(start + Duration::from_millis(100)));
        assert!(!b.try_take(start + Duration::from_millis(100)));
    }
}
