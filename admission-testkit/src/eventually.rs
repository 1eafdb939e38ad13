//! Waiting for what a test expects to become true.

use std::time::Duration;

/// Waits (at most 5 s) for `condition`, polling every few milliseconds; `what` names it
/// if it never holds.
pub async fn eventually(what: &str, condition: impl FnMut() -> bool) {
    eventually_within(what, Duration::from_secs(5), condition).await;
}

/// Waits at most `within` for `condition`, polling every few milliseconds; `what` names
/// it if it never holds.
pub async fn eventually_within(what: &str, within: Duration, condition: impl FnMut() -> bool) {
    assert!(
        holds_within(within, condition).await,
        "not within {within:?}: {what}"
    );
}

/// Whether `condition` holds within `within`, polled every 2 ms.
pub async fn holds_within(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while !condition() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    true
}
