//! The adaptive limit's evidence: `cargo run --release -p admission-bench --bin adaptive`.
//!
//! A deterministic virtual-time simulation (see `admission_bench::sim`) of a server
//! behind each limiter, side by side, on a fixed list of seeds; prints one table and a
//! targets block, and exits non-zero if a target of the default algorithm is missed.

use std::process::ExitCode;
use std::sync::Mutex;

use admission_bench::sim::{self, Limiter, Model, Outcomes, Scenario};
use admission_core::adaptive::{Aimd, Gradient};

const WORKERS: u64 = 64;
const MODEL: Model = Model {
    service: 0.010,
    deadline: 1.0,
    warmup: 5.0,
};
const SEEDS: [u64; 5] = [1, 2, 3, 4, 5];
/// Where the adaptive limiters start: far below and far above the server's 64.
const BELOW: u64 = 10;
const ABOVE: u64 = 256;
/// The adaptive rows (the first ones): targets are checked for each; missing one of the
/// default algorithm's fails the run.
const ADAPTIVE_ROWS: usize = 3;
/// The static sweep, in multiples of the server's concurrency.
const SWEEP: [f64; 7] = [0.9, 1.0, 1.0625, 1.125, 1.25, 1.5, 2.0];

fn scenarios() -> Vec<Scenario> {
    let steady = |name, load| Scenario {
        name,
        load,
        workers: vec![(0.0, WORKERS)],
        slowdown: Vec::new(),
        seconds: 15.0,
    };
    vec![
        steady("0.5x", 0.5),
        steady("2x", 2.0),
        steady("10x", 10.0),
        Scenario {
            name: "2x, capacity halves at 12 s, back at 22 s",
            load: 2.0,
            workers: vec![(0.0, WORKERS), (12.0, WORKERS / 2), (22.0, WORKERS)],
            slowdown: Vec::new(),
            seconds: 32.0,
        },
        // A dependency slows down: every request takes twice as long, so the server's
        // throughput halves, but it still runs 64 at once: the right limit stays 64.
        Scenario {
            name: "2x, service time doubles at 12 s, back at 22 s",
            load: 2.0,
            workers: vec![(0.0, WORKERS)],
            slowdown: vec![(12.0, 2.0), (22.0, 1.0)],
            seconds: 32.0,
        },
    ]
}

/// The limiters of one scenario, by name.
fn limiters() -> Vec<(String, Box<dyn Fn() -> Limiter + Sync>)> {
    let mut all: Vec<(String, Box<dyn Fn() -> Limiter + Sync>)> = vec![
        (
            format!("gradient from {BELOW}"),
            Box::new(|| Limiter::Adaptive(Box::new(Gradient::default()), BELOW)),
        ),
        (
            format!("gradient from {ABOVE}"),
            Box::new(|| Limiter::Adaptive(Box::new(Gradient::default()), ABOVE)),
        ),
        (
            format!("aimd from {BELOW}"),
            Box::new(|| Limiter::Adaptive(Box::new(Aimd::default()), BELOW)),
        ),
    ];
    for share in SWEEP {
        let limit = (share * WORKERS as f64).round() as u64;
        all.push((
            format!("static {limit}"),
            Box::new(move || Limiter::Static(limit)),
        ));
    }
    all.push((
        format!("static {} (4C)", 4 * WORKERS),
        Box::new(|| Limiter::Static(4 * WORKERS)),
    ));
    all.push(("no limit".into(), Box::new(|| Limiter::None)));
    all
}

struct Results {
    /// `[scenario][seed][limiter]`.
    runs: Vec<Vec<Vec<Outcomes>>>,
    names: Vec<String>,
}

fn simulate(scenarios: &[Scenario]) -> Results {
    let limiters = limiters();
    let names = limiters.iter().map(|(n, _)| n.clone()).collect();
    let count = limiters.len();
    let jobs: Vec<(usize, usize, usize)> = (0..scenarios.len())
        .flat_map(|s| (0..SEEDS.len()).flat_map(move |k| (0..count).map(move |l| (s, k, l))))
        .collect();
    let results = Mutex::new(vec![None; jobs.len()]);
    let next = Mutex::new(0usize);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let index = {
                    let mut next = next.lock().unwrap();
                    *next += 1;
                    *next - 1
                };
                let Some(&(s, k, l)) = jobs.get(index) else {
                    break;
                };
                let outcome = sim::run(MODEL, &scenarios[s], (limiters[l].1)(), SEEDS[k]);
                results.lock().unwrap()[index] = Some(outcome);
            });
        }
    });
    let mut flat = results
        .into_inner()
        .unwrap()
        .into_iter()
        .map(Option::unwrap);
    let runs = (0..scenarios.len())
        .map(|_| {
            (0..SEEDS.len())
                .map(|_| (0..limiters.len()).map(|_| flat.next().unwrap()).collect())
                .collect()
        })
        .collect();
    Results { runs, names }
}

/// The oracle: the static limit with the lowest p99 among those within 1% of the best
/// static goodput. Its index among the limiters.
fn oracle(runs: &[Outcomes], names: &[String]) -> usize {
    let statics: Vec<usize> = (0..names.len())
        .filter(|&i| names[i].starts_with("static") && !names[i].ends_with("(4C)"))
        .collect();
    let best = statics.iter().map(|&i| runs[i].goodput).fold(0.0, f64::max);
    *statics
        .iter()
        .filter(|&&i| runs[i].goodput >= best - 0.01)
        .min_by(|&&a, &&b| runs[a].p99.total_cmp(&runs[b].p99))
        .unwrap()
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

fn main() -> ExitCode {
    let scenarios = scenarios();
    let started = std::time::Instant::now();
    let results = simulate(&scenarios);
    let s = MODEL.service;
    println!("adaptive concurrency: a server of C = {WORKERS} workers, exponential service times of mean S = {} ms,", s * 1e3);
    println!("FIFO queue inside the server; Poisson arrivals; shed requests are not retried; a client gives up");
    println!("(cancelling its request) at a deadline of {} S; measured after {} s of warm-up; goodput counts", MODEL.deadline / s, MODEL.warmup);
    println!("answers within the deadline as a share of the capacity present; adaptive limiters start at {BELOW}");
    println!(
        "or {ABOVE}, told neither C nor S. Seeds {SEEDS:?}; the table shows seed {}.",
        SEEDS[0]
    );
    for (index, scenario) in scenarios.iter().enumerate() {
        let runs = &results.runs[index][0];
        let best = oracle(runs, &results.names);
        println!();
        println!("{}", scenario.name);
        println!(
            "  {:<19} {:>8} {:>7} {:>7} {:>7} {:>10} {:>10}",
            "limiter", "goodput", "shed", "p50/S", "p99/S", "queued p99", "mean limit"
        );
        for (l, name) in results.names.iter().enumerate() {
            let o = &runs[l];
            let warm = MODEL.warmup as usize;
            let limit = mean(&o.limit_by_second[warm..]);
            let marker = if l == best { " (oracle)" } else { "" };
            println!(
                "  {:<19} {:>7.1}% {:>6.1}% {:>7.2} {:>7.2} {:>8.2} S {:>10}{marker}",
                name,
                o.goodput * 100.0,
                o.shed * 100.0,
                o.p50 / s,
                o.p99 / s,
                o.queued_p99 / s,
                if limit.is_nan() {
                    "-".to_owned()
                } else {
                    format!("{limit:.1}")
                },
            );
        }
        for change in scenario.changes() {
            let workers = scenario.workers_at(change);
            println!(
                "  the limit's 1-s averages around {change} s ({workers} workers, service time {}x), from {} s:",
                scenario.slowdown_at(change),
                change - 1.0
            );
            for (l, name) in results.names.iter().enumerate().take(ADAPTIVE_ROWS) {
                let by_second = &runs[l].limit_by_second;
                let from = change as usize - 1;
                let row: Vec<String> = by_second[from..from + 5]
                    .iter()
                    .map(|v| format!("{v:6.1}"))
                    .collect();
                println!("    {:<16} {}", name, row.join(" "));
            }
        }
    }

    println!();
    println!("(With no limit, clients cancel at the deadline what has not been answered; exponential service");
    println!(
        "times are memoryless, so the work lost to cancellation costs no goodput, but every answer"
    );
    println!("comes close to the deadline: the difference is in the latency columns.)");
    println!();
    println!("targets (every seed; worst seed shown):");
    let mut missed = false;
    for (l, name) in results.names.iter().enumerate().take(ADAPTIVE_ROWS) {
        let gating = name.starts_with("gradient");
        let lines = targets(&scenarios, &results, l);
        for (what, met, figure) in lines {
            let verdict = if met { "MET" } else { "MISSED" };
            let note = if gating {
                ""
            } else {
                "   (informational: outcomes only)"
            };
            println!("  {name:<18} {what:<66} {figure:<12} {verdict}{note}");
            missed |= gating && !met;
        }
    }
    println!();
    println!(
        "({} runs in {:.1} s)",
        scenarios.len() * SEEDS.len() * results.names.len(),
        started.elapsed().as_secs_f64()
    );
    if missed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The targets of limiter `l`: what, whether met on every seed, and the worst figure.
fn targets(scenarios: &[Scenario], results: &Results, l: usize) -> Vec<(String, bool, String)> {
    let s = MODEL.service;
    let warm = MODEL.warmup as usize;
    let mut lines = Vec::new();
    let overloaded: Vec<usize> = (0..scenarios.len())
        .filter(|&i| scenarios[i].load > 1.0)
        .collect();
    let light: Vec<usize> = (0..scenarios.len())
        .filter(|&i| scenarios[i].load <= 1.0)
        .collect();
    let each = |scenario: usize| results.runs[scenario].iter().map(|seeds| &seeds[l]);

    let worst_goodput = overloaded
        .iter()
        .flat_map(|&i| each(i).map(|o| o.goodput))
        .fold(f64::MAX, f64::min);
    lines.push((
        "goodput >= 98% of capacity, every overloaded scenario".into(),
        worst_goodput >= 0.98,
        format!("{:.1}%", worst_goodput * 100.0),
    ));
    let worst_shed = light
        .iter()
        .flat_map(|&i| each(i).map(|o| o.shed))
        .fold(0.0, f64::max);
    lines.push((
        "shed <= 1% at 0.5x".into(),
        worst_shed <= 0.01,
        format!("{:.2}%", worst_shed * 100.0),
    ));

    let mut worst_ratio: f64 = 0.0;
    for i in 0..scenarios.len() {
        for seed in &results.runs[i] {
            let oracle = &seed[oracle(seed, &results.names)];
            worst_ratio = worst_ratio.max(seed[l].p99 / oracle.p99);
        }
    }
    lines.push((
        "p99 latency <= 1.25x the oracle's, every scenario".into(),
        worst_ratio <= 1.25,
        format!("{worst_ratio:.2}x"),
    ));
    let worst_queued = (0..scenarios.len())
        .flat_map(|i| each(i).map(|o| o.queued_p99))
        .fold(0.0, f64::max);
    lines.push((
        "p99 time queued inside the server <= 1 S".into(),
        worst_queued <= s,
        format!("{:.2} S", worst_queued / s),
    ));

    let (mut worst_low, mut worst_high) = (f64::MAX, 0.0f64);
    for (i, scenario) in scenarios.iter().enumerate() {
        let changes = scenario.changes();
        for (c, &change) in changes.iter().enumerate() {
            let until = changes.get(c + 1).copied().unwrap_or(scenario.seconds);
            let workers = scenario.workers_at(change) as f64;
            for o in each(i) {
                for second in (change as usize + 1)..(until as usize) {
                    let ratio = o.limit_by_second[second] / workers;
                    worst_low = worst_low.min(ratio);
                    worst_high = worst_high.max(ratio);
                }
            }
        }
    }
    lines.push((
        "limit's 1-s average in 0.75x-1.5x of capacity, 2 s after a change".into(),
        worst_low >= 0.75 && worst_high <= 1.5,
        format!("{worst_low:.2}x-{worst_high:.2}x"),
    ));
    let worst_second = overloaded
        .iter()
        .flat_map(|&i| each(i).flat_map(|o| o.goodput_by_second[warm..].iter().copied()))
        .fold(f64::MAX, f64::min);
    lines.push((
        "no 1-s window after warm-up below 80% goodput (overloaded)".into(),
        worst_second >= 0.8,
        format!("{:.1}%", worst_second * 100.0),
    ));
    lines
}
