//! What a layer reports where operators look: `metrics` (feature `metrics`) and `tracing`
//! events (feature `tracing`). Without either feature every type here is empty and every
//! method a no-op the compiler removes: the layer's code and layout are what they were.

#[cfg(feature = "tracing")]
use std::sync::Arc;

use admission_core::{Gate, Priority};
use admission_http::Refusal;

/// The layer's reporting: built once, shared by every clone of the layer.
#[derive(Default)]
pub(crate) struct Observer {
    #[cfg(feature = "metrics")]
    metrics: Option<metrics_impl::LayerMetrics>,
    #[cfg(feature = "tracing")]
    pressure: tracing_impl::Pressure,
    #[cfg(feature = "tracing")]
    name: Arc<str>,
}

/// What an admitted request carries until its permit is released: with `metrics`, the
/// instant it was admitted and where its hold time goes; otherwise nothing at all.
#[derive(Default)]
pub(crate) struct Timer {
    #[cfg(feature = "metrics")]
    held: Option<(std::time::Instant, metrics::Histogram)>,
}

#[cfg(feature = "metrics")]
impl Drop for Timer {
    fn drop(&mut self) {
        if let Some((since, held)) = self.held.take() {
            held.record(since.elapsed().as_secs_f64());
        }
    }
}

/// The options the builder collects.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// The `name` label and tracing field.
    pub(crate) name: String,
    /// Whether this layer records metrics (with the `metrics` feature).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) metrics: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            name: "admission".to_owned(),
            metrics: true,
        }
    }
}

impl Observer {
    /// The reporting of a layer named `options.name` over `gate`, with `classes` if it
    /// has priority classes. Metric handles are registered here, with the recorder
    /// installed at this moment.
    #[allow(unused_variables)]
    pub(crate) fn new(
        options: &Options,
        gate: &Gate,
        classes: Option<&admission_core::Classes>,
        memory: Option<u64>,
    ) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            metrics: options
                .metrics
                .then(|| metrics_impl::LayerMetrics::new(&options.name, gate, classes, memory)),
            #[cfg(feature = "tracing")]
            pressure: tracing_impl::Pressure::default(),
            #[cfg(feature = "tracing")]
            name: options.name.as_str().into(),
        }
    }

    /// A request admitted (of class `priority`); what its permit carries.
    #[inline]
    #[allow(unused_variables)]
    pub(crate) fn admitted(&self, gate: &Gate, priority: Option<Priority>) -> Timer {
        #[cfg(feature = "tracing")]
        self.pressure.admitted(gate);
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            return metrics.admitted(priority);
        }
        Timer::default()
    }

    /// A request admitted after waiting `waited` for a count slot.
    #[cfg(feature = "tokio")]
    #[allow(unused_variables)]
    pub(crate) fn waited(&self, waited: std::time::Duration) {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            metrics.waited(waited);
        }
    }

    /// A request let go because its client went away.
    pub(crate) fn gone(&self) {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            metrics.gone();
        }
    }

    /// What reports the layer's stalled responses (from the sweep that takes their
    /// permits back, which holds it apart from the layer).
    pub(crate) fn stall_report(&self) -> StallReport {
        StallReport {
            #[cfg(feature = "metrics")]
            counter: self
                .metrics
                .as_ref()
                .map(metrics_impl::LayerMetrics::stalled),
            #[cfg(feature = "tracing")]
            name: self.name.clone(),
        }
    }

    /// A request refused (or, in a dry run, that would have been).
    #[allow(unused_variables)]
    pub(crate) fn refused(
        &self,
        gate: &Gate,
        refusal: Refusal,
        priority: Option<Priority>,
        class: Option<&str>,
        retry: bool,
        dry_run: bool,
    ) {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            metrics.refused(refusal, priority, retry);
        }
        #[cfg(feature = "tracing")]
        self.pressure
            .refused(&self.name, gate, refusal, class, dry_run);
    }

    /// Sets the layer's gauges from its ledgers.
    #[cfg(feature = "metrics")]
    pub(crate) fn record_gauges(&self, gate: &Gate) {
        if let Some(metrics) = &self.metrics {
            metrics.record_gauges(gate);
        }
    }
}

/// Reports a layer's stalled responses: `admission_stalled_total` with `metrics`, a
/// debug event with `tracing`; nothing without either.
#[derive(Default)]
pub(crate) struct StallReport {
    #[cfg(feature = "metrics")]
    counter: Option<metrics::Counter>,
    #[cfg(feature = "tracing")]
    name: Arc<str>,
}

impl StallReport {
    /// A response's permits went because its client did not take it.
    pub(crate) fn stalled(&self) {
        #[cfg(feature = "metrics")]
        if let Some(counter) = &self.counter {
            counter.increment(1);
        }
        #[cfg(feature = "tracing")]
        tracing::debug!(
            name = %self.name,
            "response not taken at the minimum send rate: its permits are released"
        );
    }
}

/// The dimension label of a refusal.
#[cfg(any(feature = "metrics", feature = "tracing"))]
fn dimension(refusal: Refusal) -> &'static str {
    match refusal {
        Refusal::Refused(refused) => refused.dimension(),
        _ => "invalid_content_length",
    }
}

#[cfg(feature = "metrics")]
#[path = "metrics.rs"]
mod metrics_impl;

#[cfg(feature = "tracing")]
#[path = "tracing.rs"]
mod tracing_impl;
