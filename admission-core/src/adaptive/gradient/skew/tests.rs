//! A skewed service: its rounds span its long requests, and it is read by its median.

use super::super::estimate::Estimate;
use super::super::testing::{skewed, window};
use super::*;

#[test]
fn a_window_whose_median_is_under_half_its_mean_spans_its_long_requests() {
    let gradient = Gradient::default();
    let w = skewed(100);
    let mean = w.mean_latency().unwrap().as_secs_f64();
    let reach = gradient.reach(&w, mean);
    assert!(reach > 0.040, "{reach}");
    // An even service's round spans its mean.
    let w = window(100, &[(5.0, 50), (7.0, 50)]);
    assert_eq!(gradient.reach(&w, 0.006), 0.006);
}

#[test]
fn only_a_skewed_service_is_read_by_its_median() {
    let w = skewed(100);
    let mean = w.mean_latency().unwrap().as_secs_f64();
    let mut gradient = Gradient {
        estimate: Estimate::at(None, false, Some(0.9)),
        ..Gradient::default()
    };
    assert_eq!(gradient.read_latency(&w, 0.005, mean), mean);
    gradient.estimate.set_shape(Some(0.2));
    let read = gradient.read_latency(&w, 0.005, mean);
    // The estimate's share above its median (80% of 5 ms), plus the median (about 1 ms).
    assert!((0.0045..0.0055).contains(&read), "{read}");
    let gradient = gradient.without(Mechanism::Skew);
    assert_eq!(gradient.read_latency(&w, 0.005, mean), mean);
}
