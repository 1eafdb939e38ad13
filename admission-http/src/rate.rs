//! The minimum data rate, and the one rule every minimum-rate bound keeps, with time
//! passed in.

use std::num::NonZeroU64;
use std::time::{Duration, Instant};

/// The slowest a peer may move a transfer: at least `bytes_per_second` on average, after
/// a `grace` period, counted only while the transfer waits on the peer. [`Patience`]
/// keeps it: the grace period to start with, spent while waiting, earned back at
/// `1 / rate` a byte.
///
/// The default is Kestrel's: 240 bytes per second after 5 s. A body that sends at that
/// rate takes 273 s for 64 KiB: the rate cuts only what is barely moving, and the byte
/// reservation (see [`MeteredBody::paced`](crate::MeteredBody::paced)) bounds what a
/// body just above it holds.
///
/// ```
/// use std::time::Duration;
/// use admission_http::MinDataRate;
///
/// let rate = MinDataRate::default();
/// assert_eq!((rate.bytes_per_second(), rate.grace()), (240, Duration::from_secs(5)));
/// // What a body that has sent nothing yet may hold ahead: the grace period at the rate.
/// assert_eq!(rate.grace_bytes(), 1_200);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinDataRate {
    bytes_per_second: u64,
    grace: Duration,
}

impl Default for MinDataRate {
    fn default() -> Self {
        Self::new(240, Duration::from_secs(5))
    }
}

impl MinDataRate {
    /// At least `bytes_per_second` (0 is taken as 1) after `grace`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_http::MinDataRate;
    ///
    /// let rate = MinDataRate::new(1_000, Duration::from_secs(2));
    /// assert_eq!(rate.grace_bytes(), 2_000);
    /// ```
    pub const fn new(bytes_per_second: u64, grace: Duration) -> Self {
        Self {
            bytes_per_second: if bytes_per_second == 0 {
                1
            } else {
                bytes_per_second
            },
            grace,
        }
    }

    /// The minimum rate, in bytes per second.
    ///
    /// ```
    /// use admission_http::MinDataRate;
    ///
    /// assert_eq!(MinDataRate::default().bytes_per_second(), 240);
    /// ```
    pub const fn bytes_per_second(&self) -> u64 {
        self.bytes_per_second
    }

    /// How long a body may wait before the rate applies.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_http::MinDataRate;
    ///
    /// assert_eq!(MinDataRate::default().grace(), Duration::from_secs(5));
    /// ```
    pub const fn grace(&self) -> Duration {
        self.grace
    }

    /// What the grace period is worth at the minimum rate: the most a body that has sent
    /// nothing may hold of the byte budget.
    ///
    /// ```
    /// use admission_http::MinDataRate;
    ///
    /// assert_eq!(MinDataRate::default().grace_bytes(), 240 * 5);
    /// ```
    pub fn grace_bytes(&self) -> u64 {
        bytes_in(self.bytes_per_second, self.grace)
    }
}

pub(crate) fn bytes_in(bytes_per_second: u64, period: Duration) -> u64 {
    let bytes = bytes_per_second as f64 * period.as_secs_f64();
    if bytes >= u64::MAX as f64 {
        u64::MAX
    } else {
        bytes as u64
    }
}

/// How long a peer may go on keeping a transfer waiting, at a [`MinDataRate`]: a bucket
/// of time that starts at the grace period, is spent while the transfer waits on the
/// peer, and is earned back at `1 / rate` for each byte the peer moves, up to the grace
/// period plus what [`banked`](Self::new) bytes earn. A wait longer than what is left is
/// a peer below the rate.
///
/// One rule for every direction: a request body the server waits to receive
/// ([`MeteredBody::paced`](crate::MeteredBody::paced)), and, in admission-tower, a
/// socket that does not drain, an h2 stream whose window stays shut and a response body
/// its server does not ask for. A peer that moved a burst and then stops is kept at most
/// `grace + banked / rate`; one that trickles below the rate runs out as its waits
/// outgrow what it earns.
///
/// It reads no clock: each call is given the time, so the owner chooses the clock (and a
/// test a paused one). It is small (32 bytes) and `Copy`, to be parked between polls.
///
/// ```
/// use std::time::{Duration, Instant};
/// use admission_http::{MinDataRate, Patience};
///
/// let start = Instant::now();
/// // 1,000 bytes a second after 2 s, banking up to 4,000 bytes' worth beyond them.
/// let mut patience = Patience::new(MinDataRate::new(1_000, Duration::from_secs(2)), 4_000);
/// patience.wait(start);
/// // A second spent waiting, then 500 bytes moved: half a second earned back.
/// patience.moved(start + Duration::from_secs(1), 500);
/// assert_eq!(patience.left(), Duration::from_millis(1_500));
/// patience.wait(start + Duration::from_secs(1));
/// assert_eq!(patience.due(), Some(start + Duration::from_millis(2_501)));
/// assert!(!patience.run_out(start + Duration::from_millis(2_500)));
/// assert!(patience.run_out(start + Duration::from_millis(2_501)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Patience {
    bytes_per_second: NonZeroU64,
    /// The most it holds, in nanoseconds.
    cap: u64,
    /// What is left, in nanoseconds, not counting the wait in progress.
    left: u64,
    /// Since when the wait in progress has gone on.
    since: Option<Instant>,
}

impl Patience {
    /// What a transfer banks by default beyond the grace period: the bytes of h2's
    /// default window (64 KiB). A peer that moves a window at once and then waits to move
    /// the next is kept if it keeps up on average.
    pub const BANKED: u64 = 64 * 1024;

    /// The grace period of `rate`, banking up to what `banked` bytes earn beyond it.
    pub fn new(rate: MinDataRate, banked: u64) -> Self {
        let bytes_per_second = NonZeroU64::new(rate.bytes_per_second()).unwrap_or(NonZeroU64::MIN);
        let grace = nanos(rate.grace());
        Self {
            bytes_per_second,
            cap: grace.saturating_add(taking(banked, bytes_per_second)),
            left: grace,
            since: None,
        }
    }

    /// A wait on the peer begins at `now`, unless one is in progress.
    pub fn wait(&mut self, now: Instant) {
        self.since.get_or_insert(now);
    }

    /// The wait in progress (if any) ends at `now`: it spent what it lasted, and the peer
    /// moved `bytes`, which earn their time at the rate.
    pub fn moved(&mut self, now: Instant, bytes: u64) {
        let waited = nanos(self.waited(now));
        self.since = None;
        self.left = (self.left.saturating_sub(waited))
            .saturating_add(taking(bytes, self.bytes_per_second))
            .min(self.cap);
    }

    /// Full again (the most it banks), with no wait in progress: the peer shows it keeps
    /// up (a socket whose write went through at once).
    pub fn fill(&mut self) {
        self.left = self.cap;
        self.since = None;
    }

    /// How long the wait in progress has gone on at `now` (zero if none).
    pub fn waited(&self, now: Instant) -> Duration {
        self.since
            .map_or(Duration::ZERO, |since| now.saturating_duration_since(since))
    }

    /// Whether the wait in progress has outlasted what is left at `now`.
    pub fn run_out(&self, now: Instant) -> bool {
        self.since.is_some() && nanos(self.waited(now)) > self.left
    }

    /// What is left at `now`, the wait in progress spent.
    pub fn remaining(&self, now: Instant) -> Duration {
        Duration::from_nanos(self.left.saturating_sub(nanos(self.waited(now))))
    }

    /// When the wait in progress runs out: a millisecond past what is left, so that it is
    /// then over. `None` if no wait is in progress, or if what is left is as good as for
    /// ever (584 years or more: a grace period past what a clock counts), or past what
    /// the clock counts.
    pub fn due(&self) -> Option<Instant> {
        let since = self.since.filter(|_| self.left != u64::MAX)?;
        since.checked_add(Duration::from_nanos(self.left.saturating_add(1_000_000)))
    }

    /// What is left, not counting the wait in progress.
    pub fn left(&self) -> Duration {
        Duration::from_nanos(self.left)
    }

    /// Whether a wait is in progress.
    pub fn waiting(&self) -> bool {
        self.since.is_some()
    }

    /// The rate it keeps, in bytes per second.
    pub fn bytes_per_second(&self) -> u64 {
        self.bytes_per_second.get()
    }
}

/// A time in whole nanoseconds (about 584 years at most: longer is as good as for ever).
fn nanos(time: Duration) -> u64 {
    u64::try_from(time.as_nanos()).unwrap_or(u64::MAX)
}

/// How long `bytes` take at `bytes_per_second`, in nanoseconds.
fn taking(bytes: u64, bytes_per_second: NonZeroU64) -> u64 {
    match bytes.checked_mul(1_000_000_000) {
        Some(scaled) => scaled / bytes_per_second,
        None => {
            let nanos = u128::from(bytes) * 1_000_000_000 / u128::from(bytes_per_second.get());
            u64::try_from(nanos).unwrap_or(u64::MAX)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;
    use std::time::{Duration, Instant};

    use super::{MinDataRate, Patience, taking};

    fn rate() -> MinDataRate {
        MinDataRate::new(1_000, Duration::from_secs(2))
    }

    #[test]
    fn patience_starts_at_the_grace_period_and_a_wait_spends_it() {
        let start = Instant::now();
        let mut patience = Patience::new(rate(), 0);
        assert_eq!(patience.left(), Duration::from_secs(2));
        assert_eq!(patience.due(), None, "no wait in progress");
        assert!(
            !patience.run_out(start + Duration::from_secs(60)),
            "not waiting"
        );
        patience.wait(start);
        patience.wait(start + Duration::from_secs(1)); // the same wait
        assert!(patience.waiting());
        assert_eq!(patience.bytes_per_second(), 1_000);
        assert_eq!(patience.due(), Some(start + Duration::from_millis(2_001)));
        assert_eq!(
            patience.remaining(start + Duration::from_millis(500)),
            Duration::from_millis(1_500)
        );
        assert!(!patience.run_out(start + Duration::from_secs(2)));
        assert!(patience.run_out(start + Duration::from_millis(2_001)));
        patience.moved(start + Duration::from_millis(1_500), 0);
        assert_eq!(patience.left(), Duration::from_millis(500));
        assert!(!patience.waiting());
    }

    #[test]
    fn what_the_peer_moves_earns_patience_back_up_to_the_cap() {
        let start = Instant::now();
        let mut patience = Patience::new(rate(), 4_000);
        patience.wait(start);
        patience.moved(start + Duration::from_secs(1), 500);
        assert_eq!(patience.left(), Duration::from_millis(1_500));
        // Moved at once: no wait, all earned.
        patience.moved(start, 2_000);
        assert_eq!(patience.left(), Duration::from_millis(3_500));
        patience.moved(start, 1 << 20);
        assert_eq!(
            patience.left(),
            Duration::from_secs(6),
            "grace + 4,000 bytes"
        );
        let mut socket = Patience::new(rate(), 0);
        socket.moved(start, 1 << 20);
        assert_eq!(
            socket.left(),
            Duration::from_secs(2),
            "no banking: the grace"
        );
        // A wait that spent most of it, then a write taken at once: full again.
        socket.wait(start);
        socket.moved(start + Duration::from_millis(1_500), 0);
        assert_eq!(socket.left(), Duration::from_millis(500));
        socket.wait(start);
        socket.fill();
        assert_eq!(
            (socket.left(), socket.due()),
            (Duration::from_secs(2), None)
        );
    }

    #[test]
    fn a_trickle_below_the_rate_runs_out_and_one_at_it_does_not() {
        let start = Instant::now();
        // 100 bytes every 200 ms: 500 bytes a second, half of the rate.
        let (mut slow, mut even) = (Patience::new(rate(), 0), Patience::new(rate(), 0));
        let mut now = start;
        let mut slow_out = None;
        for step in 1..=100u32 {
            slow.wait(now);
            even.wait(now);
            now += Duration::from_millis(200);
            if slow_out.is_none() && slow.run_out(now) {
                slow_out = Some(step);
            }
            assert!(!even.run_out(now), "at the rate: never out");
            slow.moved(now, 100);
            even.moved(now, 200);
        }
        // Each step spends 200 ms and earns 100 back: the grace's 2 s runs out in the 20th.
        assert_eq!(slow_out, Some(20));
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn bytes_past_what_nanoseconds_scale_to_in_a_u64_still_take_their_time() {
        // 2^40 bytes at 2^30 bytes a second: 1,024 s, though 2^40 x 10^9 is past u64.
        let rate = NonZeroU64::new(1 << 30).unwrap();
        assert_eq!(taking(1 << 40, rate), 1_024 * 1_000_000_000);
        assert_eq!(taking(1_000, rate), 931, "and below it, the same rule");
    }

    #[test]
    fn a_grace_period_beyond_the_clock_is_no_deadline_and_no_panic() {
        let now = Instant::now();
        let mut patience = Patience::new(MinDataRate::new(1, Duration::MAX), u64::MAX);
        patience.wait(now);
        assert_eq!(patience.due(), None);
        assert!(!patience.run_out(now + Duration::from_secs(1 << 40)));
        patience.moved(now + Duration::from_secs(1), u64::MAX);
        assert_eq!(
            patience.left(),
            Duration::from_nanos(u64::MAX),
            "as good as for ever"
        );
    }
}
