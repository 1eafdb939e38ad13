//! The `metrics` feature: what a layer records.

use std::time::Instant;

use admission_core::{Classes, Gate, Priority};
use admission_http::Refusal;
use metrics::{Counter, Gauge, Histogram, Label, Unit};

use super::Timer;

/// The dimensions a refusal can name, in the order of `DIMENSIONS`.
const DIMENSIONS: [&str; 9] = [
    "count",
    "class",
    "closed",
    "bytes",
    "too_large",
    "key",
    "key_table",
    "too_slow",
    "invalid_content_length",
];

fn dimension_index(refusal: Refusal) -> usize {
    let name = super::dimension(refusal);
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
    /// Requests let go because their client went away.
    gone: Counter,
    /// Responses whose permits went because their client did not take them.
    stalled: Counter,
    /// Refusals of requests that said they were retries.
    refused_retries: Counter,
    /// How long requests admitted after waiting for a slot waited.
    waited: Histogram,
    /// Requests waiting for a slot, read at render.
    waiting: Gauge,
    requests: Level,
    limit_requests: Gauge,
    closed: Gauge,
    memory: Option<(Gauge, u64)>,
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
    describe_counter!(
        "admission_refused_retries_total",
        "Of the refused requests, those that said they were retries (with `retries`)."
    );
    describe_counter!(
        "admission_gone_total",
        "Requests let go because their client went away while they waited for a slot or their handler ran."
    );
    describe_counter!(
        "admission_stalled_total",
        "Responses whose permits the layer took back because their client did not take them at the minimum send rate."
    );
    describe_histogram!(
        "admission_permit_held_seconds",
        Unit::Seconds,
        "How long an admitted request held its permit: admission to the end of its response body."
    );
    describe_histogram!(
        "admission_wait_seconds",
        Unit::Seconds,
        "How long a request admitted after waiting for a count slot waited (layers with a wait)."
    );
    describe_gauge!(
        "admission_waiting_requests",
        "Requests waiting for a count slot (layers with a wait)."
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
        "admission_memory_limit_bytes",
        Unit::Bytes,
        "The memory limit a byte budget stated as a share was sized from."
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

/// A limit as a gauge value: none is +Inf.
fn limit(value: Option<u64>) -> f64 {
    value.map_or(f64::INFINITY, |value| value as f64)
}

impl LayerMetrics {
    pub(super) fn new(
        name: &str,
        gate: &Gate,
        classes: Option<&Classes>,
        memory: Option<u64>,
    ) -> Self {
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
            gone: metrics::counter!("admission_gone_total", base.clone()),
            stalled: metrics::counter!("admission_stalled_total", base.clone()),
            refused_retries: metrics::counter!("admission_refused_retries_total", base.clone()),
            waited: metrics::histogram!("admission_wait_seconds", base.clone()),
            waiting: gauge("admission_waiting_requests"),
            requests: Level {
                in_flight: gauge("admission_in_flight_requests"),
                high_water: gauge("admission_high_water_requests"),
            },
            limit_requests: gauge("admission_limit_requests"),
            closed: gauge("admission_closed"),
            memory: memory.map(|bytes| (gauge("admission_memory_limit_bytes"), bytes)),
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

    pub(super) fn gone(&self) {
        self.gone.increment(1);
    }

    /// Where the layer's stalled responses are counted.
    pub(super) fn stalled(&self) -> Counter {
        self.stalled.clone()
    }

    pub(super) fn waited(&self, waited: std::time::Duration) {
        self.waited.record(waited.as_secs_f64());
    }

    pub(super) fn refused(&self, refusal: Refusal, priority: Option<Priority>, retry: bool) {
        if retry {
            self.refused_retries.increment(1);
        }
        let class = priority.map_or(0, Priority::index);
        let counter = self
            .refused
            .get(dimension_index(refusal))
            .and_then(|by_class| by_class.get(class));
        if let Some(counter) = counter {
            counter.increment(1);
        }
    }

    pub(super) fn record_gauges(&self, gate: &Gate) {
        if let Some((gauge, bytes)) = &self.memory {
            gauge.set(*bytes as f64);
        }
        let snap = gate.snapshot();
        self.requests.in_flight.set(snap.count.in_flight as f64);
        self.waiting.set(gate.count().waiting() as f64);
        self.requests.high_water.set(snap.count.high_water as f64);
        self.limit_requests.set(limit(snap.count.capacity));
        self.closed.set(if snap.closed { 1.0 } else { 0.0 });
        if let (Some((level, budget, max)), Some(bytes), Some(ledger)) =
            (&self.bytes, snap.bytes, gate.bytes())
        {
            level.in_flight.set(bytes.in_flight as f64);
            level.high_water.set(bytes.high_water as f64);
            budget.set(limit(bytes.capacity));
            max.set(limit(Some(ledger.max_charge()).filter(|&max| max != 0)));
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
        Refused::Class,
        Refused::Closed,
        Refused::Bytes,
        Refused::TooLarge,
        Refused::Key,
        Refused::KeyTable,
    ] {
        let index = dimension_index(Refusal::Refused(refused));
        assert_eq!(DIMENSIONS[index], refused.dimension());
    }
    assert_eq!(
        DIMENSIONS[dimension_index(Refusal::InvalidContentLength)],
        "invalid_content_length"
    );
}
