//! The no-load latency estimate, whether it is confirmed, and the service's shape: one
//! owner, changed only through the transitions below. The first samples, the rounds that
//! confirm them, the probes and the check propose a reading; the estimate decides what
//! it becomes. An estimate the user gave ([`Gradient::no_load`](super::Gradient::no_load))
//! takes none of them.

/// What the controller knows of the service at no load.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Estimate {
    /// The no-load latency, in seconds.
    latency: Option<f64>,
    /// Whether a probe, or a round with more in flight, has confirmed it.
    confirmed: bool,
    /// Given by the user: never measured, never probed.
    given: bool,
    /// The median latency over the mean at no load (a skewed service's is low).
    shape: Option<f64>,
}

impl Estimate {
    /// An estimate the user gave: confirmed, and fixed.
    pub(super) fn given(latency: f64) -> Self {
        Self {
            latency: Some(latency),
            confirmed: true,
            given: true,
            shape: None,
        }
    }

    /// The no-load latency, in seconds, once there is one.
    pub(super) fn latency(&self) -> Option<f64> {
        self.latency
    }

    /// Whether a probe, or a round with more in flight, has confirmed it.
    pub(super) fn confirmed(&self) -> bool {
        self.confirmed
    }

    /// Whether the user gave it.
    pub(super) fn is_given(&self) -> bool {
        self.given
    }

    /// The median latency over the mean at no load, once read.
    pub(super) fn shape(&self) -> Option<f64> {
        self.shape
    }

    /// The first samples' mean: the estimate, unconfirmed.
    pub(super) fn first(&mut self, mean: Option<f64>) {
        if !self.given {
            self.latency = mean;
        }
    }

    /// Unconfirmed, the rounds read at the same latency as the first samples: their
    /// mean, all of them merged.
    pub(super) fn averaged(&mut self, mean: Option<f64>) {
        if !self.given && !self.confirmed && mean.is_some() {
            self.latency = mean;
        }
    }

    /// Confirmed by a round with half as much again in flight and no queue, at
    /// `latency` (taken where higher: more samples of the long requests); the shape is
    /// `median` over the estimate where none was read yet.
    pub(super) fn confirm(&mut self, latency: f64, median: Option<f64>) {
        if self.given || self.confirmed {
            return;
        }
        self.confirmed = true;
        let estimate = self.latency.map_or(latency, |n| n.max(latency));
        self.latency = Some(estimate);
        if self.shape.is_none() {
            self.shape = median.map(|median| median / estimate);
        }
    }

    /// A probe in a descent read `latency` (below the estimate, or queued): the
    /// estimate is that reading, confirmed.
    pub(super) fn descended(&mut self, latency: f64) {
        if !self.given {
            (self.latency, self.confirmed) = (Some(latency), true);
        }
    }

    /// A probe ended reading `latency`, `margin` its noise: above the estimate beyond
    /// the margin, it is taken; within it, averaged in; `lower`, taken.
    pub(super) fn probed(&mut self, latency: f64, margin: f64, lower: bool) {
        if self.given {
            return;
        }
        self.latency = Some(match self.latency {
            Some(n) if latency > (1.0 + margin) * n => latency,
            Some(n) if !lower => (n + latency) / 2.0,
            _ => latency,
        });
        self.confirmed = true;
    }

    /// A probe read the service's shape (its median over its mean): averaged in.
    pub(super) fn shaped(&mut self, shape: f64) {
        self.shape = Some(self.shape.map_or(shape, |old| (old + shape) / 2.0));
    }

    /// A check found no queue at `latency`: the estimate rises to it.
    pub(super) fn checked(&mut self, latency: f64) {
        if !self.given && self.confirmed {
            self.latency = Some(self.latency.map_or(latency, |n| n.max(latency)));
        }
    }

    /// An estimate as a test needs it.
    #[cfg(all(test, not(admission_loom)))]
    pub(super) fn at(latency: Option<f64>, confirmed: bool, shape: Option<f64>) -> Self {
        Self {
            latency,
            confirmed,
            given: false,
            shape,
        }
    }

    /// Sets it, for a test.
    #[cfg(all(test, not(admission_loom)))]
    pub(super) fn set(&mut self, latency: Option<f64>, confirmed: bool) {
        (self.latency, self.confirmed) = (latency, confirmed);
    }

    /// Sets the shape, for a test.
    #[cfg(all(test, not(admission_loom)))]
    pub(super) fn set_shape(&mut self, shape: Option<f64>) {
        self.shape = shape;
    }
}

#[cfg(all(test, not(admission_loom), not(miri)))]
mod tests {
    use super::Estimate;

    #[test]
    fn a_given_estimate_takes_no_transition() {
        let mut given = Estimate::given(0.010);
        given.first(Some(0.020));
        given.averaged(Some(0.020));
        given.confirm(0.020, Some(0.010));
        given.descended(0.020);
        given.probed(0.020, 0.05, false);
        given.checked(0.020);
        assert_eq!(given.latency(), Some(0.010));
        assert!(given.confirmed() && given.is_given());
    }

    #[test]
    fn only_an_unconfirmed_estimate_is_averaged_or_confirmed_and_only_a_confirmed_one_checked() {
        let mut first = Estimate::default();
        first.first(Some(0.010));
        first.averaged(None);
        assert_eq!(first.latency(), Some(0.010));
        first.averaged(Some(0.012));
        assert_eq!(first.latency(), Some(0.012));
        // Unconfirmed, a check's reading is not taken.
        first.checked(0.020);
        assert_eq!(first.latency(), Some(0.012));
        // Confirmed at the higher of the two, the shape the median over it.
        first.confirm(0.015, Some(0.0075));
        assert_eq!(first.latency(), Some(0.015));
        assert_eq!(first.shape(), Some(0.5));
        // Confirmed, neither averaging nor a second confirmation moves it.
        first.averaged(Some(0.011));
        first.confirm(0.030, Some(0.001));
        assert_eq!((first.latency(), first.shape()), (Some(0.015), Some(0.5)));
        // A check rises to its reading, and never lowers the estimate.
        first.checked(0.018);
        assert_eq!(first.latency(), Some(0.018));
        first.checked(0.016);
        assert_eq!(first.latency(), Some(0.018));
    }

    #[test]
    fn a_probe_takes_a_reading_above_its_margin_averages_one_within_it_and_takes_a_lower_one() {
        let mut estimate = Estimate::at(Some(0.010), true, None);
        estimate.probed(0.0104, 0.05, false);
        assert!((estimate.latency().unwrap() - 0.0102).abs() < 1e-12);
        estimate.probed(0.020, 0.05, false);
        assert_eq!(estimate.latency(), Some(0.020));
        estimate.probed(0.015, 0.05, true);
        assert_eq!(estimate.latency(), Some(0.015));
    }
}
