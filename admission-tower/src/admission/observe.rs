//! What a layer reports where operators look: `metrics` (feature `metrics`) and `tracing`
//! events (feature `tracing`). Without either feature every type here is empty and every
//! method a no-op the compiler removes: the layer's code and layout are what they were.

#[cfg(feature = "tracing")]
use std::sync::Arc;

use admission_core::{Gate, Priority};
use admission_http::Rejection;

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
    pub(crate) fn new<K, H>(
        options: &Options,
        gate: &Gate<K, H>,
        classes: Option<&admission_core::Classes>,
    ) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            metrics: options
                .metrics
                .then(|| metrics_impl::LayerMetrics::new(&options.name, gate, classes)),
            #[cfg(feature = "tracing")]
            pressure: tracing_impl::Pressure::default(),
            #[cfg(feature = "tracing")]
            name: options.name.as_str().into(),
        }
    }

    /// Whether the layer must count every request (metrics need the permits to time).
    pub(crate) fn counts(&self) -> bool {
        #[cfg(feature = "metrics")]
        if self.metrics.is_some() {
            return true;
        }
        false
    }

    /// A request admitted (of class `priority`); what its permit carries.
    #[inline]
    #[allow(unused_variables)]
    pub(crate) fn admitted<K, H>(&self, gate: &Gate<K, H>, priority: Option<Priority>) -> Timer {
        #[cfg(feature = "tracing")]
        self.pressure.admitted(gate);
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            return metrics.admitted(priority);
        }
        Timer::default()
    }

    /// A request refused (or, in a dry run, that would have been).
    #[allow(unused_variables)]
    pub(crate) fn refused<K, H>(
        &self,
        gate: &Gate<K, H>,
        rejection: Rejection,
        priority: Option<Priority>,
        class: Option<&str>,
        dry_run: bool,
    ) {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            metrics.refused(rejection, priority);
        }
        #[cfg(feature = "tracing")]
        self.pressure
            .refused(&self.name, gate, rejection, class, dry_run);
    }

    /// Sets the layer's gauges from its ledgers.
    #[cfg(feature = "metrics")]
    pub(crate) fn record_gauges<K, H>(&self, gate: &Gate<K, H>) {
        if let Some(metrics) = &self.metrics {
            metrics.record_gauges(gate);
        }
    }
}

/// The dimension label of a rejection.
#[cfg(any(feature = "metrics", feature = "tracing"))]
fn dimension(rejection: Rejection) -> &'static str {
    match rejection {
        Rejection::Refused(refused) => refused.dimension(),
        _ => "invalid_content_length",
    }
}

#[cfg(feature = "metrics")]
mod metrics_impl {
    use std::time::Instant;

    use admission_core::{Classes, Gate, Priority};
    use admission_http::Rejection;
    use metrics::{Counter, Gauge, Histogram, Label, Unit};

    use super::Timer;

    /// The dimensions a refusal can name, in the order of `DIMENSIONS`.
    const DIMENSIONS: [&str; 8] = [
        "count",
        "closed",
        "bytes",
        "too_large",
        "key",
        "key_table",
        "too_slow",
        "invalid_content_length",
    ];

    fn dimension_index(rejection: Rejection) -> usize {
        let name = super::dimension(rejection);
        DIMENSIONS
            .iter()
            .position(|d| *d == name)
            .unwrap_or(DIMENSIONS.len() - 1)
    }

    /// Gauges of one dimension's ledger.
    struct Level {
        in_flight: Gauge,
        high_water: Gauge,
    }

    pub(super) struct LayerMetrics {
        /// By class index (one entry without classes).
        admitted: Vec<Counter>,
        /// By dimension, then class.
        refused: Vec<Vec<Counter>>,
        held: Histogram,
        requests: Level,
        limit_requests: Gauge,
        closed: Gauge,
        bytes: Option<(Level, Gauge, Gauge)>,
        keys: Option<(Gauge, Gauge, Gauge, Gauge)>,
    }

    fn describe() {
        use metrics::{describe_counter, describe_gauge, describe_histogram};
        describe_counter!(
            "admission_admitted_total",
            "Requests admitted by the layer (bypassed routes are not counted)."
        );
        describe_counter!(
            "admission_refused_total",
            "Requests refused by the layer, by the dimension that refused."
        );
        describe_histogram!(
            "admission_permit_held_seconds",
            Unit::Seconds,
            "How long an admitted request held its permit: admission to the end of its response body."
        );
        describe_gauge!(
            "admission_in_flight_requests",
            "Requests in flight through the layer's gate."
        );
        describe_gauge!(
            "admission_limit_requests",
            "The count limit in force (+Inf: none)."
        );
        describe_gauge!(
            "admission_high_water_requests",
            "The most requests in flight at once since the gate was built."
        );
        describe_gauge!(
            "admission_closed",
            "1 while the layer is closed or draining."
        );
        describe_gauge!(
            "admission_in_flight_bytes",
            Unit::Bytes,
            "Request body bytes charged in flight."
        );
        describe_gauge!(
            "admission_high_water_bytes",
            Unit::Bytes,
            "The most request body bytes charged at once."
        );
        describe_gauge!(
            "admission_limit_bytes",
            Unit::Bytes,
            "The byte budget in force (+Inf: none)."
        );
        describe_gauge!(
            "admission_limit_request_bytes",
            Unit::Bytes,
            "The largest body one request may have (+Inf: none)."
        );
        describe_gauge!(
            "admission_in_flight_keys",
            "Distinct keys with requests in flight."
        );
        describe_gauge!(
            "admission_high_water_keys",
            "The most distinct keys with requests in flight at once."
        );
        describe_gauge!(
            "admission_limit_per_key_requests",
            "The per-key cap in force (+Inf: none)."
        );
        describe_gauge!(
            "admission_limit_keys",
            "The most distinct keys the layer tracks (+Inf: no bound)."
        );
    }

    /// A limit as a gauge value: 0 (none) is +Inf.
    fn limit(value: u64) -> f64 {
        if value == 0 {
            f64::INFINITY
        } else {
            value as f64
        }
    }

    impl LayerMetrics {
        pub(super) fn new<K, H>(name: &str, gate: &Gate<K, H>, classes: Option<&Classes>) -> Self {
            describe();
            let base = vec![Label::new("name", name.to_owned())];
            let with = |extra: &[(&'static str, &str)]| {
                let mut labels = base.clone();
                labels.extend(extra.iter().map(|(k, v)| Label::new(*k, (*v).to_owned())));
                labels
            };
            let class_names: Vec<Option<&str>> = match classes {
                Some(classes) => classes.iter().map(|(name, _)| Some(name)).collect(),
                None => vec![None],
            };
            let admitted = class_names
                .iter()
                .map(|class| match class {
                    Some(class) => {
                        metrics::counter!("admission_admitted_total", with(&[("class", class)]))
                    }
                    None => metrics::counter!("admission_admitted_total", base.clone()),
                })
                .collect();
            let refused = DIMENSIONS
                .iter()
                .map(|dimension| {
                    class_names
                        .iter()
                        .map(|class| {
                            let labels = match class {
                                Some(class) => with(&[("dimension", dimension), ("class", class)]),
                                None => with(&[("dimension", dimension)]),
                            };
                            metrics::counter!("admission_refused_total", labels)
                        })
                        .collect()
                })
                .collect();
            let gauge = |name: &'static str| metrics::gauge!(name, base.clone());
            Self {
                admitted,
                refused,
                held: metrics::histogram!("admission_permit_held_seconds", base.clone()),
                requests: Level {
                    in_flight: gauge("admission_in_flight_requests"),
                    high_water: gauge("admission_high_water_requests"),
                },
                limit_requests: gauge("admission_limit_requests"),
                closed: gauge("admission_closed"),
                bytes: gate.bytes().map(|_| {
                    let level = Level {
                        in_flight: gauge("admission_in_flight_bytes"),
                        high_water: gauge("admission_high_water_bytes"),
                    };
                    (
                        level,
                        gauge("admission_limit_bytes"),
                        gauge("admission_limit_request_bytes"),
                    )
                }),
                keys: gate.keyed().map(|_| {
                    (
                        gauge("admission_in_flight_keys"),
                        gauge("admission_high_water_keys"),
                        gauge("admission_limit_per_key_requests"),
                        gauge("admission_limit_keys"),
                    )
                }),
            }
        }

        #[inline]
        pub(super) fn admitted(&self, priority: Option<Priority>) -> Timer {
            let class = priority.map_or(0, Priority::index);
            if let Some(counter) = self.admitted.get(class) {
                counter.increment(1);
            }
            Timer {
                held: Some((Instant::now(), self.held.clone())),
            }
        }

        pub(super) fn refused(&self, rejection: Rejection, priority: Option<Priority>) {
            let class = priority.map_or(0, Priority::index);
            let counter = self
                .refused
                .get(dimension_index(rejection))
                .and_then(|by_class| by_class.get(class));
            if let Some(counter) = counter {
                counter.increment(1);
            }
        }

        pub(super) fn record_gauges<K, H>(&self, gate: &Gate<K, H>) {
            let snap = gate.snapshot();
            self.requests.in_flight.set(snap.count.in_flight as f64);
            self.requests.high_water.set(snap.count.high_water as f64);
            self.limit_requests.set(limit(snap.count.capacity));
            self.closed.set(if snap.closed { 1.0 } else { 0.0 });
            if let (Some((level, budget, max)), Some(bytes), Some(ledger)) =
                (&self.bytes, snap.bytes, gate.bytes())
            {
                level.in_flight.set(bytes.in_flight as f64);
                level.high_water.set(bytes.high_water as f64);
                budget.set(limit(bytes.capacity));
                max.set(limit(ledger.max_charge()));
            }
            if let (Some((in_flight, high_water, cap, max_keys)), Some(keyed)) =
                (&self.keys, snap.keyed)
            {
                in_flight.set(keyed.keys as f64);
                high_water.set(keyed.keys_high_water as f64);
                cap.set(limit(keyed.cap));
                max_keys.set(limit(keyed.max_keys));
            }
        }
    }

    /// `Refused` is matched by name above; keep the list in step with it.
    #[cfg(test)]
    #[test]
    fn every_refusal_has_a_dimension_label() {
        use admission_core::Refused;
        for refused in [
            Refused::Count,
            Refused::Closed,
            Refused::Bytes,
            Refused::TooLarge,
            Refused::Key,
            Refused::KeyTable,
        ] {
            let index = dimension_index(Rejection::Refused(refused));
            assert_eq!(DIMENSIONS[index], refused.dimension());
        }
        assert_eq!(
            DIMENSIONS[dimension_index(Rejection::InvalidContentLength)],
            "invalid_content_length"
        );
    }
}

#[cfg(feature = "tracing")]
mod tracing_impl {
    use std::sync::atomic::{AtomicBool, Ordering};

    use admission_core::{Gate, Refused};
    use admission_http::Rejection;

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
        pub(super) fn admitted<K, H>(&self, gate: &Gate<K, H>) {
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

        pub(super) fn refused<K, H>(
            &self,
            name: &str,
            gate: &Gate<K, H>,
            rejection: Rejection,
            class: Option<&str>,
            dry_run: bool,
        ) {
            tracing::debug!(
                name = name,
                dimension = super::dimension(rejection),
                status = rejection.status().as_u16(),
                class,
                dry_run,
                "admission refused a request"
            );
            // The swap in each guard is the hysteresis: only the refusal that finds no
            // warning pending gives one.
            match rejection {
                Rejection::Refused(Refused::Count)
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
                Rejection::Refused(Refused::Bytes)
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
}
