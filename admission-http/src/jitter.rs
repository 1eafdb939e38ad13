//! Retry delays spread by a random part.

use std::time::Duration;

/// `delay` plus a uniformly drawn part of `jitter` (none when `jitter` is zero): the
/// retry delay of one refusal, so that clients shed together do not all come back in the
/// same instant. The draw is from the standard library's randomly keyed hasher: not for
/// anything but spreading retries.
///
/// ```
/// use std::time::Duration;
/// use admission_http::jittered;
///
/// let (delay, jitter) = (Duration::from_secs(1), Duration::from_secs(2));
/// let drawn = jittered(delay, jitter);
/// assert!(delay <= drawn && drawn <= delay + jitter);
/// assert_eq!(jittered(delay, Duration::ZERO), delay);
/// ```
pub fn jittered(delay: Duration, jitter: Duration) -> Duration {
    let nanos = u64::try_from(jitter.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return delay;
    }
    // Uniform in 0..=nanos by the multiply-shift reduction of a 64-bit draw.
    let drawn = ((u128::from(next_random()) * (u128::from(nanos) + 1)) >> 64) as u64;
    delay.saturating_add(Duration::from_nanos(drawn))
}

/// A random 64-bit draw: the standard library's SipHash under keys of its own (each
/// `RandomState` on a thread takes the next keys of a randomly seeded sequence), over no
/// input. Called on the refusal path only.
fn next_random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::hash::RandomState::new().build_hasher().finish()
}
