//! The tables the run prints, and the bounds it checks.

use super::*;

pub(crate) fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort();
    let rank = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[rank]
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// What a run saw: the clients' tallies, the slow wave's cuts, the probes, the layer's
/// snapshot once settled, and the handlers' own counts.
pub(crate) struct Run {
    pub(crate) tally: Arc<Tally>,
    pub(crate) cuts: SlowCuts,
    pub(crate) probes: Probes,
    pub(crate) snap: AdmissionSnapshot,
    pub(crate) elapsed: Duration,
    /// The most requests the handlers held at once, and of the noisy client's.
    pub(crate) app_max: u64,
    pub(crate) noisy_max: u64,
    /// Responses the handlers still hold, and connections still open.
    pub(crate) app_now: u64,
    pub(crate) connections_open: u64,
    pub(crate) refused_by_class: Vec<(String, u64)>,
}

impl Run {
    fn shed(&self, status: u16) -> u64 {
        self.tally.count(Outcome::Shed(status))
    }

    /// Responses with a status the run does not expect.
    fn other(&self) -> u64 {
        let outcomes = self.tally.outcomes.lock().unwrap();
        outcomes
            .iter()
            .filter(|(o, _)| matches!(o, Outcome::Shed(c) if ![503, 5031, 429, 413].contains(c)))
            .map(|(_, n)| n)
            .sum()
    }

    fn class(&self, name: &str) -> ClassTally {
        let by_class = self.tally.by_class.lock().unwrap();
        by_class.get(name).cloned().unwrap_or_default()
    }
}

/// The two tables: what happened, then by class.
pub(crate) fn print(run: &mut Run) {
    let tally = &run.tally;
    let (count, bytes, keyed) = (
        run.snap.gate.count,
        run.snap.gate.bytes.expect("bytes"),
        run.snap.gate.keyed.expect("keyed"),
    );
    let row = |what: &str, result: String| println!("  {what:<34} {result}");
    println!("\n  {:<34} result", "what");
    println!("  {:-<34} {:-<44}", "", "");
    row(
        "requests sent",
        tally.sent.load(Ordering::Relaxed).to_string(),
    );
    row(
        "admitted (200)",
        format!(
            "{} completed + {} hung up mid-stream",
            tally.count(Outcome::Admitted),
            tally.count(Outcome::HungUp)
        ),
    );
    row("shed 503 (count, class share)", run.shed(503).to_string());
    row("shed 503 (byte budget)", run.shed(5031).to_string());
    row("shed 429 (per-client cap)", run.shed(429).to_string());
    row("shed 413 (request too large)", run.shed(413).to_string());
    let failed = tally.count(Outcome::Failed);
    row(
        "errors",
        format!("{failed} failed, {} other statuses", run.other()),
    );
    let slowest = |cuts: &[Duration]| {
        cuts.iter()
            .max()
            .map_or("-".into(), |d| format!("{:.2} s", d.as_secs_f64()))
    };
    let cuts = &run.cuts;
    row(
        "slow uploads cut",
        format!(
            "{} / {TRICKLERS} answered 408, the last after {}",
            cuts.uploads_408.len(),
            slowest(&cuts.uploads_408)
        ),
    );
    row(
        "stalled readers cut",
        format!(
            "{} / {STALLED} cut before the end of the download",
            cuts.readers.len()
        ),
    );
    row(
        "h2 readers with a zero window",
        format!(
            "{} / {ZERO_WINDOW} streams reset, the last after {}",
            cuts.h2_readers.len(),
            slowest(&cuts.h2_readers)
        ),
    );
    row(
        "connections holding a place idle",
        format!(
            "{} / {} closed, the last after {}",
            cuts.holders.len(),
            HEAD_TRICKLERS + SILENT + KEPT_ALIVE,
            slowest(&cuts.holders)
        ),
    );
    row(
        "request bodies cut (snapshot)",
        run.snap.too_slow.to_string(),
    );
    row(
        "in-flight high-water: count",
        format!(
            "{} / {COUNT_LIMIT} (handlers saw {})",
            count.high_water, run.app_max
        ),
    );
    row(
        "in-flight high-water: bytes",
        format!(
            "{:.1} KiB / {} KiB budget, {} KiB max request",
            bytes.high_water as f64 / 1024.0,
            BYTE_BUDGET >> 10,
            MAX_REQUEST >> 10
        ),
    );
    row(
        "in-flight high-water: noisy client",
        format!(
            "{} / {PER_KEY} (keys at once: {})",
            run.noisy_max, keyed.keys_high_water
        ),
    );
    let probes = &mut run.probes;
    row(
        "liveness probes during the burst",
        format!(
            "{}/{} answered 200, p99 {}",
            probes.ok,
            probes.sent,
            ms(percentile(&mut probes.latency, 0.99))
        ),
    );
    for (what, latency) in [
        ("latency to head: admitted", &tally.admitted_latency),
        ("latency to head: shed", &tally.shed_latency),
    ] {
        let mut latency = latency.lock().unwrap().clone();
        row(
            what,
            format!(
                "p50 {}  p99 {}",
                ms(percentile(&mut latency, 0.50)),
                ms(percentile(&mut latency, 0.99))
            ),
        );
    }
    row(
        "ledgers after the run",
        format!(
            "count {}, bytes {}, keys {}",
            count.in_flight, bytes.in_flight, keyed.keys
        ),
    );
    row("wall time", format!("{:.2} s", run.elapsed.as_secs_f64()));

    println!(
        "\n  {:<10} {:>6} {:>9} {:>6} {:>12}  refused by count or share",
        "class", "sent", "admitted", "shed", "p99 to head"
    );
    println!(
        "  {:-<10} {:->6} {:->9} {:->6} {:->12}  {:-<20}",
        "", "", "", "", "", ""
    );
    for (name, refused) in &run.refused_by_class {
        let mut class = run.class(name);
        println!(
            "  {:<10} {:>6} {:>9} {:>6} {:>12}  {refused}",
            name,
            class.sent,
            class.admitted,
            class.shed,
            ms(percentile(&mut class.latency, 0.99)),
        );
    }
}

/// Every bound the run checks, and what broke.
pub(crate) fn broken(run: &Run) -> Vec<&'static str> {
    let (count, bytes, keyed) = (
        run.snap.gate.count,
        run.snap.gate.bytes.expect("bytes"),
        run.snap.gate.keyed.expect("keyed"),
    );
    let cuts = &run.cuts;
    let mut broken = Vec::new();
    let mut check = |holds: bool, what| {
        if !holds {
            broken.push(what);
        }
    };
    let limit = COUNT_LIMIT as u64;
    check(
        count.high_water <= limit && run.app_max <= limit,
        "the count limit was exceeded",
    );
    check(
        bytes.high_water <= BYTE_BUDGET.max(MAX_REQUEST),
        "the byte budget was exceeded beyond the lone-request exemption",
    );
    check(
        run.noisy_max <= PER_KEY as u64,
        "the per-client cap was exceeded",
    );
    check(
        count.in_flight == 0 && bytes.in_flight == 0 && keyed.keys == 0,
        "a ledger did not return to zero (a leak)",
    );
    check(
        run.app_now == 0,
        "a handler's response was never finished or dropped",
    );
    check(
        run.probes.ok == run.probes.sent,
        "a liveness probe was not answered",
    );
    check(
        run.tally.count(Outcome::Failed) == 0 && run.other() == 0,
        "a client request failed or got an unexpected status",
    );
    check(
        run.shed(503) != 0
            && run.shed(5031) != 0
            && run.shed(429) != 0
            && run.shed(413) == TOO_LARGE as u64,
        "the burst did not exercise every refusal",
    );
    check(
        cuts.uploads_408.len() == TRICKLERS && run.snap.too_slow == TRICKLERS as u64,
        "a trickling upload was not cut with 408",
    );
    check(
        cuts.uploads_408.iter().all(|after| *after <= GRACE * 3),
        "a trickling upload held its permits past the grace period",
    );
    check(
        cuts.holders.len() == HEAD_TRICKLERS + SILENT + KEPT_ALIVE,
        "a connection doing nothing was not closed",
    );
    check(
        cuts.holders
            .iter()
            .all(|after| *after <= CONNECTION_BOUND + GRACE),
        "a connection doing nothing held its place past its bound",
    );
    check(
        run.connections_open == 0,
        "a connection was left open at the end",
    );
    check(
        cuts.readers.len() == STALLED,
        "a client that stopped reading was not cut",
    );
    check(
        cuts.h2_readers.len() == ZERO_WINDOW
            && cuts.h2_readers.iter().all(|after| *after <= GRACE * 2),
        "an h2 stream whose window stayed at 0 was not reset within the grace period",
    );
    let critical = run.class("critical");
    check(
        critical.shed == 0 && critical.failed == 0,
        "a critical request was refused",
    );
    check(critical.admitted != 0, "no critical request was sent");
    let shed_share = |c: &ClassTally| c.shed as f64 / c.sent.max(1) as f64;
    check(
        shed_share(&run.class("sheddable")) > shed_share(&run.class("default")),
        "sheddable traffic was not shed more than default traffic",
    );
    broken
}
