//! The `tracing` feature: a layer's events.

use std::sync::atomic::{AtomicBool, Ordering};

use admission_core::{Gate, Refused};
use admission_http::Refusal;

/// Whether a saturation warning has been given for the count and byte ledgers since
/// each was last well below its limit (half of it): the hysteresis that keeps a ledger
/// flapping at its limit from flooding the log.
#[derive(Default)]
pub(super) struct Pressure {
    count_warned: AtomicBool,
    bytes_warned: AtomicBool,
}

/// Whether `in_flight` is well below `limit` (at most half; 0 is no limit).
fn well_below(in_flight: u64, limit: u64) -> bool {
    limit != 0 && in_flight <= limit / 2
}

impl Pressure {
    /// On admission: re-arms a warning once its ledger is well below its limit again.
    /// Two relaxed loads (one flag per ledger) per admission while nothing was warned.
    #[inline]
    pub(super) fn admitted(&self, gate: &Gate) {
        // Relaxed: a log's hysteresis, ordering nothing.
        if self.count_warned.load(Ordering::Relaxed) {
            let count = gate.count();
            if well_below(count.in_flight(), count.capacity()) {
                self.count_warned.store(false, Ordering::Relaxed);
            }
        }
        if self.bytes_warned.load(Ordering::Relaxed) {
            if let Some(bytes) = gate.bytes() {
                if well_below(bytes.in_flight(), bytes.budget()) {
                    self.bytes_warned.store(false, Ordering::Relaxed);
                }
            }
        }
    }

    pub(super) fn refused(
        &self,
        name: &str,
        gate: &Gate,
        refusal: Refusal,
        class: Option<&str>,
        dry_run: bool,
    ) {
        tracing::debug!(
            name = name,
            dimension = super::dimension(refusal),
            status = refusal.status().as_u16(),
            class,
            dry_run,
            "admission refused a request"
        );
        // The swap in each guard is the hysteresis: only the refusal that finds no
        // warning pending gives one.
        match refusal {
            Refusal::Refused(Refused::Count)
                if !self.count_warned.swap(true, Ordering::Relaxed) =>
            {
                let count = gate.count();
                tracing::warn!(
                    name = name,
                    in_flight = count.in_flight(),
                    limit = count.capacity(),
                    "admission: the count limit is reached, shedding requests (warned \
                     again once in flight has fallen to half the limit)"
                );
            }
            Refusal::Refused(Refused::Bytes)
                if !self.bytes_warned.swap(true, Ordering::Relaxed) =>
            {
                if let Some(bytes) = gate.bytes() {
                    tracing::warn!(
                        name = name,
                        in_flight = bytes.in_flight(),
                        limit = bytes.budget(),
                        "admission: the byte budget is reached, shedding requests \
                         (warned again once in flight has fallen to half the budget)"
                    );
                }
            }
            _ => {}
        }
    }
}
