//! A response body's send pace: its frames handed out in pieces its client
//! can take in time.
//!
//! Every place where a server waits on its client to take what it sent keeps
//! admission-http's [`Patience`] (the one rule of every minimum-rate bound): a socket
//! that does not drain (`GuardedIo`), an h2 stream whose window stays shut (`serve`), and
//! a response body the server does not ask for its next frame (the layer's own body,
//! under any server). [`SendPace`] is the body's part: it hands a body's frames out in
//! pieces no larger than what the client could take at the minimum rate within its
//! patience, so that an honest slow reader is never handed more than it can take in time,
//! and times the wait after each.

use std::time::Instant;

use admission_http::{MinDataRate, Patience};
use bytes::Bytes;

/// The largest piece of a body handed out at once: h2's default frame size.
pub(crate) const MAX_PIECE: usize = 16 * 1024;

/// The smallest piece (unless less is left): a client so slow that its patience is worth
/// less is handed this much, and must take it in time.
pub(crate) const MIN_PIECE: usize = 1024;

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
        let mut patience = rate.map(|rate| Patience::new(rate, Patience::BANKED));
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
            patience.moved(now, self.handed as u64);
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

    use super::{MAX_PIECE, MIN_PIECE, SendPace};

    fn rate() -> MinDataRate {
        MinDataRate::new(1_000, Duration::from_secs(2))
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
