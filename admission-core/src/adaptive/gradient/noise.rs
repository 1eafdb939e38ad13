//! Telling a change from noise: the service's spread, how many samples a decision
//! needs, and how far a reading may stray before it counts.

use crate::adaptive::Window;

/// Each window's weight in the service's spread: about the last hundred windows count.
const SPREAD_DECAY: f64 = 0.99;
/// The spread is taken as at least an exponential's (CV 1: an estimate from few samples
/// reads low) and at most 4 (beyond it, more samples would not make a round steadier).
const CV_FLOOR: f64 = 1.0;
const CV_CEILING: f64 = 4.0;
/// Samples per unit of CV²: 100 × CV² gives a mean within about 10% (one standard error).
pub(super) const SAMPLES_PER_CV2: f64 = 100.0;
/// A spread is trusted as measured from this many samples: fewer read a heavy tail low.
pub(super) const SPREAD_SAMPLES: f64 = 100.0;
/// A reading is a change when it strays three standard errors from what it is compared
/// with (one in several hundred by chance) ...
const MARGIN_SIGMAS: f64 = 3.0;
/// ... and at least 5%: no service is steadier than that over a few rounds.
const MARGIN_FLOOR: f64 = 0.05;
/// A round reads as queued when its latency is above the knee by two standard errors:
/// a queue's first sign, acted on with smoothing.
pub(super) const QUEUE_SIGMAS: f64 = 2.0;
/// Half as long again as that is a queue beyond doubt: acted on at once.
pub(super) const BEYOND_DOUBT: f64 = 1.5;

/// The latencies' spread over the last hundred windows or so (decaying sums of the
/// sampled squares: count, µs, and units of 1024 µs²): the service's, steadier than one
/// round's.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ServiceSpread {
    count: f64,
    total: f64,
    squares: f64,
}

impl ServiceSpread {
    pub(super) fn observe(&mut self, window: &Window) {
        self.count = SPREAD_DECAY * self.count + window.spread.samples as f64;
        self.total = SPREAD_DECAY * self.total + window.spread.total as f64;
        self.squares = SPREAD_DECAY * self.squares + window.spread.squares as f64;
    }

    /// The coefficient of variation as measured, once it holds `least` samples' spread.
    pub(super) fn measured_cv(&self, least: f64) -> Option<f64> {
        if self.count < least || self.total <= 0.0 {
            return None;
        }
        let mean = self.total / self.count;
        let square = self.squares * 1024.0 / self.count;
        Some((square - mean * mean).max(0.0).sqrt() / mean)
    }

    /// The coefficient of variation, taken as between 1 and 4.
    pub(super) fn cv(&self) -> f64 {
        self.measured_cv(1.0)
            .map_or(CV_FLOOR, |cv| cv.clamp(CV_FLOOR, CV_CEILING))
    }

    /// Samples enough for a mean within about 10%.
    pub(super) fn enough(&self) -> u64 {
        let cv = self.cv();
        (SAMPLES_PER_CV2 * cv * cv) as u64
    }

    /// A spread measured from a thousand samples of mean 1 ms, with this CV.
    #[cfg(all(test, not(admission_loom)))]
    pub(super) fn with_cv(cv: f64) -> Self {
        let (count, mean) = (1000.0, 1000.0);
        Self {
            count,
            total: count * mean,
            squares: count * mean * mean * (1.0 + cv * cv) / 1024.0,
        }
    }
}

/// How far a reading whose relative noise is `noise` may stray before it counts as a
/// change.
pub(super) fn margin(noise: f64) -> f64 {
    (MARGIN_SIGMAS * noise).max(MARGIN_FLOOR)
}

/// Whether `latency` stands above `knee` by more than a round's noise allows.
pub(super) fn queued(latency: f64, knee: f64, noise: f64) -> bool {
    latency > knee * (1.0 + QUEUE_SIGMAS * noise)
}

/// Whether `latency` stands above `knee` beyond doubt: half as long again as a queue's
/// first sign.
pub(super) fn beyond_doubt(latency: f64, knee: f64, noise: f64) -> bool {
    latency > BEYOND_DOUBT * knee * (1.0 + QUEUE_SIGMAS * noise)
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;

    #[test]
    fn a_reading_within_its_noise_of_the_knee_is_not_a_queue() {
        // 2% noise: up to 4% above the knee is noise, 5% is a queue.
        assert!(!queued(1.04, 1.0, 0.02));
        assert!(queued(1.05, 1.0, 0.02));
        // Beyond doubt is half as long again as that.
        assert!(!beyond_doubt(1.55, 1.0, 0.02));
        assert!(beyond_doubt(1.57, 1.0, 0.02));
    }

    #[test]
    fn a_margin_is_three_standard_errors_and_never_under_five_percent() {
        assert_eq!(margin(0.001), MARGIN_FLOOR);
        assert!((margin(0.1) - 0.3).abs() < 1e-12);
    }

    #[test]
    fn the_spread_decays_and_is_clamped_until_measured() {
        let mut spread = ServiceSpread::default();
        assert_eq!(spread.measured_cv(1.0), None);
        assert_eq!(spread.cv(), CV_FLOOR);
        assert_eq!(spread.enough(), 100);
        // Latencies of 1 ms and 3 ms alike: a CV of 0.5, taken as 1 for the count.
        let mut window = Window::new(8, std::time::Duration::from_millis(100));
        for ms in [1, 3].repeat(50) {
            window.add(
                std::time::Duration::from_millis(ms),
                crate::adaptive::Outcome::Success,
                1,
            );
        }
        spread.observe(&window);
        let cv = spread.measured_cv(SPREAD_SAMPLES).unwrap();
        assert!((cv - 0.5).abs() < 0.01, "{cv}");
        assert_eq!(spread.cv(), CV_FLOOR);
        // A window's weight fades: after a second, the first counts 0.99 of a window.
        spread.observe(&Window::new(8, std::time::Duration::from_millis(100)));
        assert!(spread.measured_cv(SPREAD_SAMPLES).is_none());
        assert!(spread.measured_cv(99.0).is_some());
    }
}
