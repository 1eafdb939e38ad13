//! Waiting for what a test expects to become true.

#![allow(unreachable_pub)]

use std::time::Duration;

/// Waits (at most 5 s) for `condition`, polling every 5 ms; `what` names it if it never
/// holds.
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
