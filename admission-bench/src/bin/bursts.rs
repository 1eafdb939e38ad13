//! The admission wait's evidence: `cargo run --release -p admission-bench --bin bursts`.
//!
//! The simulation of `admission_bench::sim` (a server of `C` workers with its own queue, a
//! real `CountLedger` in front, virtual time), under load that comes in bursts and under
//! sustained overload, with shedding at once beside waiting for a slot
//! (`CountLedger::set_max_waiting`, `CountLedger::acquire`): first come first served
//! throughout ("FIFO"); newest first once the queue has been waited in for 100 ms
//! ("LIFO"); and that with CoDel's short wait once the queue stands (5 ms: the default).
//! Static limits, the adaptive limit and no limit beside them. Prints one table per
//! scenario and the targets; exits non-zero if one is missed.

use std::process::ExitCode;
use std::time::Instant;

use admission_bench::sim::{self, Limiter, Outcomes, Scenario, Wait};
use admission_core::adaptive::Gradient;

const WORKERS: u64 = 10;
const SERVICE: f64 = 0.010;
/// The wait's bounds: as many waiters as a burst brings, each for at most 100 ms; the
/// default standing-queue rule (100 ms, 5 ms).
const WAIT: Wait = Wait::new(100, 0.100);
/// The same wait, with no short target once the queue stands (still newest first then).
const LIFO: Wait = Wait {
    target: None,
    ..WAIT
};
/// The standing-queue rule's target, for the targets below.
const TARGET: f64 = 0.005;
const SEEDS: [u64; 3] = [1, 2, 3];

/// A clock that never moves: the queue never stands, and is served first come first
/// served throughout.
fn frozen() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

#[derive(Clone, Copy, PartialEq)]
enum Row {
    Shed(u64),
    Wait(u64),
    Lifo(u64),
    Fifo(u64),
    Adaptive,
    AdaptiveWait,
    NoLimit,
}

impl Row {
    fn name(self) -> String {
        match self {
            Row::Shed(limit) => format!("shed at {limit}"),
            Row::Wait(limit) => format!("wait at {limit}"),
            Row::Lifo(limit) => format!("wait at {limit}, LIFO only"),
            Row::Fifo(limit) => format!("wait at {limit}, FIFO"),
            Row::Adaptive => "adaptive, shed".into(),
            Row::AdaptiveWait => "adaptive, wait".into(),
            Row::NoLimit => "no limit".into(),
        }
    }

    fn run(self, scenario: &Scenario, seed: u64) -> Outcomes {
        let limiter = |limit| Limiter::Static(limit);
        let adaptive = || Limiter::Adaptive(Box::new(Gradient::default()), WORKERS);
        match self {
            Row::Shed(limit) => sim::run(scenario, limiter(limit), seed),
            Row::Wait(limit) => sim::run_waiting(scenario, limiter(limit), Some(WAIT), seed),
            Row::Lifo(limit) => sim::run_waiting(scenario, limiter(limit), Some(LIFO), seed),
            Row::Fifo(limit) => {
                sim::run_waiting_with_clock(scenario, limiter(limit), LIFO, frozen, seed)
            }
            Row::Adaptive => sim::run(scenario, adaptive(), seed),
            Row::AdaptiveWait => sim::run_waiting(scenario, adaptive(), Some(WAIT), seed),
            Row::NoLimit => sim::run(scenario, Limiter::None, seed),
        }
    }
}

const ROWS: [Row; 9] = [
    Row::Shed(WORKERS),
    Row::Shed(4 * WORKERS),
    Row::Wait(WORKERS),
    Row::Lifo(WORKERS),
    Row::Fifo(WORKERS),
    Row::Wait(4 * WORKERS),
    Row::Adaptive,
    Row::AdaptiveWait,
    Row::NoLimit,
];

fn main() -> ExitCode {
    let started = Instant::now();
    // 100 requests at once every 50 ms: 2,000 a second in bursts, against 1,000 served.
    let bursts = Scenario {
        bursts: Some((0.050, 100)),
        deadline: 1.0,
        ..Scenario::steady(
            "bursts: 100 at once every 50 ms (2x)",
            WORKERS,
            SERVICE,
            2.0,
        )
    };
    let sustained = Scenario {
        deadline: 1.0,
        ..Scenario::steady("sustained 5x (Poisson)", WORKERS, SERVICE, 5.0)
    };
    println!(
        "the admission wait: a server of {WORKERS} workers, S = {} ms, its own FIFO queue;",
        SERVICE * 1e3
    );
    println!(
        "the wait lets {} wait, each for at most {} ms; clients give up at 1 s; seeds {SEEDS:?} (tables: seed 1).",
        WAIT.max_waiting,
        WAIT.max_wait * 1e3
    );
    println!(
        "Latencies are of admitted requests, from arrival; \"before work\" is the p99 from arrival to a"
    );
    println!("worker (the wait for a slot and the server's own queue), in service times S;");
    println!("\"refused p99\" is the p99 from arrival to refusal of the shed.");
    let mut results = Vec::new();
    for scenario in [&bursts, &sustained] {
        println!();
        println!(
            "{} (after {} s of warm-up, {} s)",
            scenario.name,
            scenario.warmup,
            scenario.seconds - scenario.warmup
        );
        println!(
            "  {:<22} {:>8} {:>7} {:>9} {:>9} {:>11} {:>12}",
            "limiter", "goodput", "shed", "p50 ms", "p99 ms", "before work", "refused p99"
        );
        let mut rows = Vec::new();
        for row in ROWS {
            let runs: Vec<Outcomes> = SEEDS.iter().map(|&seed| row.run(scenario, seed)).collect();
            let first = &runs[0];
            println!(
                "  {:<22} {:>7.1}% {:>6.1}% {:>9.1} {:>9.1} {:>9.2} S {:>9.1} ms",
                row.name(),
                first.goodput * 100.0,
                first.shed * 100.0,
                first.p50 * 1e3,
                first.p99 * 1e3,
                first.queued_p99,
                first.refused_p99 * 1e3
            );
            rows.push((row, runs));
        }
        results.push(rows);
    }

    // The targets (worst seed).
    let worst = |rows: &[(Row, Vec<Outcomes>)], row: Row, f: fn(&Outcomes) -> f64, high: bool| {
        let runs = &rows.iter().find(|(r, _)| *r == row).expect("a row").1;
        let figures = runs.iter().map(f);
        if high {
            figures.fold(f64::NEG_INFINITY, f64::max)
        } else {
            figures.fold(f64::INFINITY, f64::min)
        }
    };
    let mut missed = 0;
    let mut target = |label: String, figure: String, met: bool| {
        println!(
            "  {label:<72} {figure:<14} {}",
            if met { "MET" } else { "MISSED" }
        );
        if !met {
            missed += 1;
        }
    };
    println!();
    println!("targets (worst seed)");
    let burst_rows = &results[0];
    let goodput = worst(burst_rows, Row::Wait(WORKERS), |o| o.goodput, false);
    let shed = worst(burst_rows, Row::Shed(WORKERS), |o| o.goodput, true);
    target(
        format!(
            "bursts: the wait at {WORKERS} serves >= 85% of capacity (shed at once: {:.0}%)",
            shed * 100.0
        ),
        format!("{:.1}%", goodput * 100.0),
        goodput >= 0.85,
    );
    let sustained_rows = &results[1];
    let waited = worst(sustained_rows, Row::Wait(WORKERS), |o| o.goodput, false);
    let shed = worst(sustained_rows, Row::Shed(WORKERS), |o| o.goodput, false);
    target(
        format!(
            "sustained 5x: the wait's goodput within 1% of shedding at once ({:.1}%)",
            shed * 100.0
        ),
        format!("{:.1}%", waited * 100.0),
        waited >= shed - 0.01,
    );
    let waited = worst(sustained_rows, Row::Wait(WORKERS), |o| o.p99, true);
    let shed = worst(sustained_rows, Row::Shed(WORKERS), |o| o.p99, true);
    target(
        format!(
            "sustained 5x: the wait's p99 within shedding's ({:.1} ms) + twice the target",
            shed * 1e3
        ),
        format!("{:.1} ms", waited * 1e3),
        waited <= shed + 2.0 * TARGET,
    );
    let refused = worst(sustained_rows, Row::Wait(WORKERS), |o| o.refused_p99, true);
    target(
        format!(
            "sustained 5x: the wait refuses within the target ({:.0} ms) + 3 ms, p99",
            TARGET * 1e3
        ),
        format!("{:.1} ms", refused * 1e3),
        refused <= TARGET + 0.003,
    );
    println!();
    println!("({:.1} s)", started.elapsed().as_secs_f64());
    if missed == 0 {
        println!("every target: MET");
        ExitCode::SUCCESS
    } else {
        println!("MISSED {missed} targets");
        ExitCode::FAILURE
    }
}
