//! Growth: with no queue and the work filling the limit, the limit grows faster round
//! after round (√limit, then half the limit, then the limit), so a server four times
//! larger is found in four rounds; capacity that comes back is climbed at once.

use super::{Gradient, Law, Mechanism, Round};

/// Under half the limit the last probe began at, a round with no queue at all and every
/// slot busy is capacity come back: as sure as a second round with no queue.
const BACK: f64 = 0.5;

/// What growth keeps.
#[derive(Debug, Clone, Copy)]
pub(super) struct Growth {
    /// Rounds in a row that found no queue and grew the limit while the work filled it.
    streak: u32,
    /// Rounds since the limit last grew by a sure step.
    since_sure: u32,
}

impl Default for Growth {
    fn default() -> Self {
        Self {
            streak: 0,
            since_sure: u32::MAX,
        }
    }
}

/// Rounds a scheduled probe waits after the limit last grew by a sure step: a probe as
/// the limit lands, after capacity came back, would cut it again within the same second.
const SETTLE: u32 = 10;

impl Growth {
    /// The limit stops growing: a cut, an overload, a probe, or a limit the work did not
    /// fill. The next round with no queue starts again at √limit.
    pub(super) fn stop(&mut self) {
        self.streak = 0;
    }

    /// A check found the limit below the server: the next steps up are sure, as after a
    /// second round in a row with no queue.
    pub(super) fn room(&mut self) {
        self.streak = self.streak.max(2);
    }

    /// Whether the limit is growing: a round with no queue since it last stopped.
    pub(super) fn growing(&self) -> bool {
        self.streak > 0
    }

    /// Whether a step up is sure: a second round in a row with no queue.
    pub(super) fn sure(&self) -> bool {
        self.streak >= 2
    }

    /// The limit took a step: a sure one up (`sure_growth`) starts the settling over.
    pub(super) fn stepped(&mut self, sure_growth: bool) {
        self.since_sure = if sure_growth {
            0
        } else {
            self.since_sure.saturating_add(1)
        };
    }

    /// Whether the limit has settled since it last grew by a sure step (`Settle`).
    pub(super) fn settled(&self) -> bool {
        self.since_sure >= SETTLE
    }

    /// Sets the counts, for a test of another mechanism.
    #[cfg(all(test, not(admission_loom)))]
    pub(super) fn set(&mut self, streak: u32, since_sure: u32) {
        (self.streak, self.since_sure) = (streak, since_sure);
    }

    /// Rounds since the last sure step up, for a test.
    #[cfg(all(test, not(admission_loom)))]
    pub(super) fn since_sure(&self) -> u32 {
        self.since_sure
    }
}

impl Gradient {
    /// Whether a scheduled probe may come: the limit has settled since it last grew by
    /// a sure step (`Settle`).
    pub(super) fn settled(&self) -> bool {
        self.growth.settled() || !self.on(Mechanism::Settle)
    }

    /// The target of a round with no queue that the work filled: the law's, or (where
    /// the latency is at most the knee, or capacity is coming back) a step that grows
    /// round after round. The larger steps only where the round held the limit full, as
    /// a ramp does: a load at the server's capacity nears any limit now and then, and a
    /// doubled limit there only lengthens the queue's tail.
    pub(super) fn grow(&mut self, round: &Round, law: &Law) -> f64 {
        let limit = round.limit;
        let back = self.on(Mechanism::CapacityBack)
            && law.latency <= law.noload * (1.0 + law.noise)
            && self.probes.from().is_some_and(|from| limit < BACK * from);
        if self.stale.rising_twice() || back {
            self.growth.streak = self.growth.streak.max(1);
        }
        if law.latency > law.knee && !self.stale.rising_twice() {
            // Within the noise of the knee: the law's step alone.
            if law.queued {
                self.growth.streak = 0;
            }
            return law.target;
        }
        self.growth.streak += 1;
        let full = round.max_in_flight >= round.window_limit;
        let ramp = self.on(Mechanism::Ramp);
        let step = match self.growth.streak {
            2 if full && ramp => limit / 2.0,
            3.. if full && ramp => limit,
            _ => limit.sqrt(),
        };
        law.target.max(limit + step.max(limit.sqrt()))
    }
}

#[cfg(all(test, not(admission_loom), not(miri)))]
mod tests;
