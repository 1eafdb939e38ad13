//! The minimum send rate, as one rule with time passed in: how long what a server handed
//! over may wait for its client to take it.
//!
//! Every place where a server waits on its client to take what it sent uses this rule: a
//! socket that does not drain (`GuardedIo`), an h2 stream whose window stays shut
//! (`serve`), and a response body the server does not ask for its next frame (the layer's
//! own body, under any server).
//!
//! - [`Patience`] is the bucket: it starts at the grace period, a wait spends it, and
//!   what the client takes earns it back at `1 / rate` a byte, up to a cap. A wait longer
//!   than what is left is a client not taking what it was sent.
//! - [`SendPace`] hands a body's frames out in pieces no larger than what the client could
//!   take at the minimum rate within its patience, so that an honest slow reader is never
//!   handed more than it can take in time, and times the wait after each.

use std::num::NonZeroU64;
use std::time::{Duration, Instant};

use admission_http::MinDataRate;
use bytes::Bytes;

/// The largest piece of a body handed out at once: h2's default frame size.
pub(crate) const MAX_PIECE: usize = 16 * 1024;

/// The smallest piece (unless less is left): a client so slow that its patience is worth
/// less is handed this much, and must take it in time.
pub(crate) const MIN_PIECE: usize = 1024;

/// What a body may bank beyond the grace period: the time the bytes of h2's default
/// window (64 KiB) earn at the minimum rate. A client that takes a window at once and then
/// waits to open the next is kept if it keeps up on average; one that banks a fast start
/// holds its response at most this long after it stops.
pub(crate) const MAX_BANKED: usize = 64 * 1024;

/// How long a client may go on not taking what it was handed: spent while it waits,
/// earned back at `1 / rate` a byte taken, at most `grace + banked / rate`.
///
/// Kept small (a response body parks it between polls, moving it each time): times in
/// whole nanoseconds, the rate alone (the grace is only where it starts).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Patience {
    bytes_per_second: NonZeroU64,
    /// The most it holds, in nanoseconds.
    cap: u64,
    /// What is left, in nanoseconds.
    left: u64,
    /// Since when the wait in progress has gone on.
    since: Option<Instant>,
}

impl Patience {
    /// The grace period, banking up to what `banked` bytes take at the rate beyond it.
    pub(crate) fn new(rate: MinDataRate, banked: usize) -> Self {
        let bytes_per_second = NonZeroU64::new(rate.bytes_per_second()).unwrap_or(NonZeroU64::MIN);
        let grace = nanos(rate.grace());
        Self {
            bytes_per_second,
            cap: grace.saturating_add(taking(banked, bytes_per_second)),
            left: grace,
            since: None,
        }
    }

    /// A wait on the client begins at `now`, unless one is in progress.
    pub(crate) fn wait(&mut self, now: Instant) {
        self.since.get_or_insert(now);
    }

    /// The wait in progress (if any) ends at `now`: it spent what it lasted, and the
    /// client took `bytes`, which earn their time at the rate.
    pub(crate) fn taken(&mut self, now: Instant, bytes: usize) {
        let waited = self
            .since
            .take()
            .map_or(0, |since| nanos(now.saturating_duration_since(since)));
        self.left = (self.left.saturating_sub(waited))
            .saturating_add(taking(bytes, self.bytes_per_second))
            .min(self.cap);
    }

    /// Full again (what it banks at most), with no wait in progress: the client shows it
    /// keeps up. (The socket's rule, under the `tokio` feature.)
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn fill(&mut self) {
        self.left = self.cap;
        self.since = None;
    }

    /// When the wait in progress runs out: a millisecond past what is left, so that it is
    /// then over. `None` if no wait is in progress, or if what is left is as good as for
    /// ever (584 years or more: a grace period past what a clock counts), or past what
    /// the clock counts.
    pub(crate) fn due(&self) -> Option<Instant> {
        let since = self.since.filter(|_| self.left != u64::MAX)?;
        since.checked_add(Duration::from_nanos(self.left.saturating_add(1_000_000)))
    }

    /// What is left, not counting the wait in progress.
    pub(crate) fn left(&self) -> Duration {
        Duration::from_nanos(self.left)
    }

    /// Whether a wait is in progress.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn waiting(&self) -> bool {
        self.since.is_some()
    }

    /// The rate it keeps, in bytes per second.
    pub(crate) fn bytes_per_second(&self) -> u64 {
        self.bytes_per_second.get()
    }
}

/// A time in whole nanoseconds (about 584 years at most: longer is as good as for ever).
fn nanos(time: Duration) -> u64 {
    u64::try_from(time.as_nanos()).unwrap_or(u64::MAX)
}

/// How long `bytes` take at `bytes_per_second`, in nanoseconds.
fn taking(bytes: usize, bytes_per_second: NonZeroU64) -> u64 {
    match (bytes as u64).checked_mul(1_000_000_000) {
        Some(scaled) => scaled / bytes_per_second,
        None => {
            let nanos =
                u128::from(bytes as u64) * 1_000_000_000 / u128::from(bytes_per_second.get());
            u64::try_from(nanos).unwrap_or(u64::MAX)
        }
    }
}

/// A response body's pace: its frames handed out in pieces the client can take in time,
/// and the wait after each timed. Without a rate, pieces of the largest size and no time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendPace {
    patience: Option<Patience>,
    /// The size of the piece last handed out, still to be asked past.
    handed: usize,
}

impl SendPace {
    /// A response whose head went out at `now`: its body waits on the client from then
    /// (a body not asked for at all is not being taken either).
    pub(crate) fn new(rate: Option<MinDataRate>, now: Instant) -> Self {
        let mut patience = rate.map(|rate| Patience::new(rate, MAX_BANKED));
        if let Some(patience) = &mut patience {
            patience.wait(now);
        }
        Self {
            patience,
            handed: 0,
        }
    }

    /// The body is asked for its next frame at `now`: what it handed out has gone on.
    pub(crate) fn asked(&mut self, now: Instant) {
        // (Not waiting, it handed out nothing since it was last asked: nothing changes.)
        if let Some(patience) = &mut self.patience {
            patience.taken(now, self.handed);
        }
        self.handed = 0;
    }

    /// Hands the next piece of `held` out at `now` (all of it, if it fits).
    pub(crate) fn hand(&mut self, held: &mut Bytes, now: Instant) -> Bytes {
        let piece = held.split_to(self.piece().min(held.len()));
        self.handed(piece.len(), now);
        piece
    }

    /// A frame of `bytes` (trailers: 0) went out at `now`: the body waits on the client.
    pub(crate) fn handed(&mut self, bytes: usize, now: Instant) {
        self.handed = bytes;
        if let Some(patience) = &mut self.patience {
            patience.wait(now);
        }
    }

    /// When the body must have been asked again, if it waits on the client.
    pub(crate) fn due(&self) -> Option<Instant> {
        self.patience.as_ref()?.due()
    }

    /// The next piece's size: what the client could take at the minimum rate within its
    /// patience, between `MIN_PIECE` and `MAX_PIECE`.
    pub(crate) fn piece(&self) -> usize {
        let Some(patience) = &self.patience else {
            return MAX_PIECE;
        };
        // Whole milliseconds: a piece's size need not be finer.
        let millis = u64::try_from(patience.left().as_millis()).unwrap_or(u64::MAX);
        let takes = millis.saturating_mul(patience.bytes_per_second()) / 1_000;
        usize::try_from(takes)
            .unwrap_or(MAX_PIECE)
            .clamp(MIN_PIECE, MAX_PIECE)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use admission_http::MinDataRate;
    use bytes::Bytes;

    use std::num::NonZeroU64;

    use super::{MAX_PIECE, MIN_PIECE, Patience, SendPace, taking};

    fn rate() -> MinDataRate {
        MinDataRate::new(1_000, Duration::from_secs(2))
    }

    #[test]
    fn patience_starts_at_the_grace_period_and_a_wait_spends_it() {
        let start = Instant::now();
        let mut patience = Patience::new(rate(), 0);
        assert_eq!(patience.left(), Duration::from_secs(2));
        assert_eq!(patience.due(), None, "no wait in progress");
        patience.wait(start);
        patience.wait(start + Duration::from_secs(1)); // the same wait
        assert_eq!(patience.due(), Some(start + Duration::from_millis(2_001)));
        patience.taken(start + Duration::from_millis(1_500), 0);
        assert_eq!(patience.left(), Duration::from_millis(500));
        assert!(!patience.waiting());
    }

    #[test]
    fn what_the_client_takes_earns_patience_back_up_to_the_cap() {
        let start = Instant::now();
        let mut patience = Patience::new(rate(), 4_000);
        patience.wait(start);
        patience.taken(start + Duration::from_secs(1), 500);
        assert_eq!(patience.left(), Duration::from_millis(1_500));
        // Taken at once: no wait, all earned.
        patience.taken(start, 2_000);
        assert_eq!(patience.left(), Duration::from_millis(3_500));
        patience.taken(start, 1 << 20);
        assert_eq!(
            patience.left(),
            Duration::from_secs(6),
            "grace + 4,000 bytes"
        );
        let mut socket = Patience::new(rate(), 0);
        socket.taken(start, 1 << 20);
        assert_eq!(
            socket.left(),
            Duration::from_secs(2),
            "no banking: the grace"
        );
        // A wait that spent most of it, then a write taken at once: full again.
        socket.wait(start);
        socket.taken(start + Duration::from_millis(1_500), 0);
        assert_eq!(socket.left(), Duration::from_millis(500));
        socket.wait(start);
        socket.fill();
        assert_eq!(
            (socket.left(), socket.due()),
            (Duration::from_secs(2), None)
        );
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
        let mut patience = Patience::new(MinDataRate::new(1, Duration::MAX), usize::MAX);
        patience.wait(now);
        assert_eq!(patience.due(), None);
        patience.taken(now + Duration::from_secs(1), usize::MAX);
        assert_eq!(
            patience.left(),
            Duration::from_nanos(u64::MAX),
            "as good as for ever"
        );
    }

    #[test]
    fn a_body_waits_from_its_head_and_pieces_grow_as_they_are_asked_past() {
        let now = Instant::now();
        let mut pace = SendPace::new(Some(rate()), now);
        assert_eq!(pace.due(), Some(now + Duration::from_millis(2_001)));
        pace.asked(now);
        assert_eq!(pace.due(), None, "asked: not waiting");
        let mut held = Bytes::from(vec![0; 1 << 20]);
        let sizes: Vec<usize> = (0..5)
            .map(|_| {
                let piece = pace.hand(&mut held, now).len();
                pace.asked(now);
                piece
            })
            .collect();
        assert_eq!(sizes, [2_000, 4_000, 8_000, 16_000, MAX_PIECE]);
        assert_eq!(held.len(), (1 << 20) - 30_000 - MAX_PIECE);
        let mut unpaced = SendPace::new(None, now);
        assert_eq!(unpaced.hand(&mut held, now).len(), MAX_PIECE, "no rate");
        assert_eq!(unpaced.due(), None, "no rate: no time");
    }

    #[test]
    fn a_slow_client_is_handed_the_smallest_piece_and_what_fits_goes_whole() {
        let start = Instant::now();
        let mut pace = SendPace::new(Some(rate()), start);
        // The head waited 1.5 s of its 2 s: 500 ms is worth 500 bytes.
        let asked = start + Duration::from_millis(1_500);
        pace.asked(asked);
        let mut held = Bytes::from(vec![0; 10_000]);
        assert_eq!(pace.hand(&mut held, asked).len(), MIN_PIECE);
        assert_eq!(pace.due(), Some(asked + Duration::from_millis(501)));
        // Asked past after 200 ms: 1,024 bytes earn 1.024 s.
        pace.asked(asked + Duration::from_millis(200));
        assert_eq!(
            pace.due(),
            None,
            "asked: the wait is over, 1.324 s left for the next"
        );
        let mut last = Bytes::from_static(b"abc");
        assert_eq!(pace.hand(&mut last, asked).len(), 3);
        assert!(last.is_empty(), "what fits goes whole");
        assert_eq!(
            pace.due(),
            Some(asked + Duration::from_millis(1_325)),
            "1.324 s, and the millisecond past it"
        );
    }

    #[test]
    fn what_a_body_banks_is_bounded() {
        let now = Instant::now();
        let mut pace = SendPace::new(Some(rate()), now);
        let mut held = Bytes::from(vec![0; 1 << 20]);
        while !held.is_empty() {
            pace.asked(now);
            pace.hand(&mut held, now);
        }
        pace.asked(now);
        pace.handed(0, now);
        let banked = Duration::from_secs(2) + Duration::from_secs_f64(65_536.0 / 1_000.0);
        assert_eq!(pace.due(), Some(now + banked + Duration::from_millis(1)));
    }
}
