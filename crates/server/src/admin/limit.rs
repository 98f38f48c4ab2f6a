//! How fast the admin password can be guessed: failed logins (and failed bearer tokens) are
//! counted per source address and over all sources within a window. Past either limit, every
//! attempt from that source (or from anywhere) is refused without looking at the password, a
//! correct one included, until the window that started with the first counted failure ends. So
//! parallel guesses cannot outrun the limit, and a correct password from another address does not
//! lift a lockout. Failures are logged as one summary line per window, never one per attempt.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

/// Source entries kept before expired ones are swept.
const SWEEP_ABOVE: usize = 256;

/// An attempt refused because a limit is reached: when to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Locked {
    /// Until the window ends (at least a second).
    pub retry_after: Duration,
}

impl Locked {
    /// Whole seconds, rounded up, for `Retry-After`.
    pub fn seconds(&self) -> u64 {
        let ms = self.retry_after.as_millis() as u64;
        ms.div_ceil(1000).max(1)
    }
}

/// Failures counted from the first one, for one window.
#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    failures: u32,
}

impl Window {
    fn new(now: Instant) -> Self {
        Window {
            start: now,
            failures: 0,
        }
    }

    /// Forget the failures of a window that has ended.
    fn roll(&mut self, now: Instant, length: Duration) {
        if now >= self.start + length {
            *self = Window::new(now);
        }
    }

    fn fail(&mut self, now: Instant) {
        if self.failures == 0 {
            self.start = now;
        }
        self.failures += 1;
    }

    fn locked(&self, limit: u32, now: Instant, length: Duration) -> Option<Locked> {
        (self.failures >= limit).then(|| Locked {
            retry_after: (self.start + length)
                .saturating_duration_since(now)
                .max(Duration::from_secs(1)),
        })
    }
}

/// What happened since the last summary line.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Wrong passwords or tokens.
    pub failures: u64,
    /// Attempts refused without a look at the password (a limit was reached).
    pub refused: u64,
    /// Distinct source addresses of those.
    pub sources: usize,
}

struct State {
    all: Window,
    sources: HashMap<IpAddr, Window>,
    since_summary: Summary,
    seen: HashSet<IpAddr>,
}

/// The failed-login limits of one node.
pub struct LoginLimit {
    per_source: u32,
    overall: u32,
    window: Duration,
    state: Mutex<State>,
}

impl LoginLimit {
    /// At most `per_source` failures per source address and `overall` in all per `window`.
    pub fn new(per_source: u32, overall: u32, window: Duration) -> Self {
        LoginLimit {
            per_source: per_source.max(1),
            overall: overall.max(1),
            window: window.max(Duration::from_secs(1)),
            state: Mutex::new(State {
                all: Window::new(Instant::now()),
                sources: HashMap::new(),
                since_summary: Summary::default(),
                seen: HashSet::new(),
            }),
        }
    }

    /// The window, which is also how often a summary line is written.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Run `verify` (does the password match?) for an attempt from `source`, unless a limit is
    /// reached; a `false` counts as a failure. Checking and counting happen under one lock, so
    /// parallel attempts cannot all pass the check before any is counted.
    pub fn attempt(
        &self,
        source: IpAddr,
        now: Instant,
        verify: impl FnOnce() -> bool,
    ) -> Result<bool, Locked> {
        let source = source_key(source);
        let mut guard = self.state.lock().expect("login limit lock");
        let state = &mut *guard;
        state.all.roll(now, self.window);
        let mut locked = state.all.locked(self.overall, now, self.window);
        if locked.is_none() {
            if let Some(w) = state.sources.get_mut(&source) {
                w.roll(now, self.window);
                locked = w.locked(self.per_source, now, self.window);
            }
        }
        if let Some(locked) = locked {
            state.since_summary.refused += 1;
            state.seen.insert(source);
            return Err(locked);
        }
        let ok = verify();
        if !ok {
            if state.sources.len() >= SWEEP_ABOVE && !state.sources.contains_key(&source) {
                let window = self.window;
                state.sources.retain(|_, w| now < w.start + window);
            }
            state
                .sources
                .entry(source)
                .or_insert_with(|| Window::new(now))
                .fail(now);
            state.all.fail(now);
            state.since_summary.failures += 1;
            state.seen.insert(source);
        }
        Ok(ok)
    }

    /// What happened since the last call, if anything; starts counting anew.
    pub fn take_summary(&self) -> Option<Summary> {
        let mut state = self.state.lock().expect("login limit lock");
        let mut summary = std::mem::take(&mut state.since_summary);
        summary.sources = std::mem::take(&mut state.seen).len();
        (summary.failures + summary.refused > 0).then_some(summary)
    }

    /// Write the summary line once per window while the node runs (`this` is dropped with it).
    pub fn spawn_summaries(this: Weak<LoginLimit>) {
        tokio::spawn(async move {
            loop {
                let every = match this.upgrade() {
                    Some(limit) => limit.window,
                    None => return,
                };
                tokio::time::sleep(every).await;
                let Some(limit) = this.upgrade() else { return };
                if let Some(s) = limit.take_summary() {
                    tracing::warn!(
                        failed = s.failures,
                        refused = s.refused,
                        sources = s.sources,
                        window_s = every.as_secs(),
                        "admin: {} failed logins and {} refused by the login limit from {} \
                         addresses in the last {} s",
                        s.failures,
                        s.refused,
                        s.sources,
                        every.as_secs()
                    );
                }
            }
        });
    }
}

/// The address a limit is kept for: an IPv4 address, or an IPv6 address's /64 (one host often
/// holds a whole /64, and would otherwise get 2^64 separate allowances).
fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut s = v6.segments();
                s[4..].fill(0);
                IpAddr::from(s)
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        [10, 0, 0, last].into()
    }

    #[test]
    fn a_source_is_locked_after_its_failures_until_the_window_ends() {
        let limit = LoginLimit::new(3, 100, Duration::from_secs(10));
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(limit.attempt(ip(1), t0, || false), Ok(false));
        }
        let locked = limit.attempt(ip(1), t0, || true).unwrap_err();
        assert_eq!(locked.seconds(), 10, "the correct password is refused too");
        assert_eq!(
            limit.attempt(ip(2), t0, || true),
            Ok(true),
            "others are not"
        );
        let later = t0 + Duration::from_secs(10);
        assert_eq!(limit.attempt(ip(1), later, || true), Ok(true));
    }

    #[test]
    fn the_overall_limit_locks_everyone_even_with_the_correct_password() {
        let limit = LoginLimit::new(3, 4, Duration::from_secs(10));
        let t0 = Instant::now();
        for i in 0..4 {
            assert_eq!(limit.attempt(ip(i), t0, || false), Ok(false));
        }
        let mut called = false;
        let at = t0 + Duration::from_secs(4);
        let locked = limit.attempt(ip(99), at, || {
            called = true;
            true
        });
        assert_eq!(locked.unwrap_err().seconds(), 6);
        assert!(!called, "the password is not even compared while locked");
        assert_eq!(
            limit.attempt(ip(99), t0 + Duration::from_secs(10), || true),
            Ok(true)
        );
    }

    #[test]
    fn summaries_count_failures_refusals_and_sources() {
        let limit = LoginLimit::new(1, 100, Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(limit.take_summary(), None);
        let _ = limit.attempt(ip(1), t0, || false);
        let _ = limit.attempt(ip(1), t0, || false);
        let _ = limit.attempt(ip(2), t0, || false);
        let _ = limit.attempt(ip(3), t0, || true);
        assert_eq!(
            limit.take_summary(),
            Some(Summary {
                failures: 2,
                refused: 1,
                sources: 2
            })
        );
        assert_eq!(limit.take_summary(), None, "counted anew");
    }

    #[test]
    fn ipv6_sources_are_counted_per_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        assert_eq!(source_key(a), source_key(b));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(source_key(mapped), ip(1));
    }
}
