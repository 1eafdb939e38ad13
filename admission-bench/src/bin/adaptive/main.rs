//! The adaptive limit's evidence: `cargo run --release -p admission-bench --bin adaptive`.
//!
//! A deterministic virtual-time simulation (see `admission_bench::sim`) of a server
//! behind each limiter, side by side, across scenarios that vary the service-time
//! distribution, the server's concurrency `C` and service time `S`, the load's shape, the
//! capacity, and the clients' deadlines.
//!
//! Two sets of seeds. Seeds 1-99 are for trying changes: the default run prints one table
//! per scenario on seeds 1-3 (`--seeds 4,5,6` for others, `--quick` for one), then the
//! targets of each adaptive limiter, worst seed, and exits non-zero if `Gradient` misses
//! one; `--markdown` prints them as a table; `--trace NAME [below|above] [--seed N]`
//! prints each window `Gradient` sees in the first scenario whose name contains NAME.
//! Seeds 100-199 are held out: no change is tuned on them. `--held-out` judges
//! `Gradient` on them seed by seed, by properties of the whole (see `held_out.rs`), on the
//! first 24 (`--seeds-held N` for more); CI runs it with `--readme PATH`, which also
//! checks that the README's held-out section is this run's; with `--tuning`, the same
//! judgement on tuning seeds 4-27, to try a change on before it is judged. `--ablation`
//! runs the held-out seeds with each mechanism off in turn, and prints the README's
//! ablation table. `--strand [SEEDS] [SLOWDOWN]` runs the real-server figure's shape
//! with a flat service (32 workers of 40 ms, a quarter from 10 s, all from 20 s, the
//! service `SLOWDOWN` times slower from 20 s) and prints each phase's mean limit over
//! the workers, seed by seed (`--trace-one` traces seed `SEEDS` instead): where the
//! latency no longer answers to the limit, the law holds at its fixed point below the
//! server until a check finds no queue there (#74). `--flat` runs the flat-latency
//! scenarios instead of the main set (`--held-out --flat` judges them, apart).

use std::process::ExitCode;
use std::sync::Mutex;

use admission_bench::sim::{self, Limiter, Outcomes, Scenario};
use admission_core::adaptive::{Aimd, Gradient, Mechanism};

mod held_out;
mod scenarios;
mod targets;
mod trace;

use scenarios::{flat_scenarios, scenarios, starts};
use targets::{Ask, Target, figure, mean, oracle, side, table, verdicts};

/// The limiters of one scenario: the adaptive rows first, then the static sweep (in
/// multiples of the initial concurrency, without repeats), then no limit.
type Make = Box<dyn Fn() -> Limiter + Sync>;

/// The adaptive rows (the first of each scenario): targets are checked for each; missing
/// one of `Gradient`'s fails the run.
pub(crate) const ADAPTIVE_ROWS: usize = 3;
/// The static sweep, in multiples of the server's initial concurrency.
const SWEEP: [f64; 10] = [0.5, 0.75, 0.9, 1.0, 1.0625, 1.125, 1.25, 1.5, 2.0, 4.0];
/// Seeds for trying a change: three per scenario (any of 1-99 with `--seeds`).
const SEEDS: [u64; 3] = [1, 2, 3];

/// `Gradient` with the mechanisms in `off` turned off.
fn gradient(off: &[Mechanism]) -> Gradient {
    off.iter().fold(Gradient::default(), |g, &m| g.without(m))
}

/// Which limiters a run simulates.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rows {
    /// Every row of the report.
    All,
    /// Only what `Gradient` is judged by: its two starts and the static sweep (the
    /// references), without `Aimd` (informational) and no limit (a fifth of the time).
    Judged,
}

fn limiters(scenario: &Scenario, off: &[Mechanism], rows: Rows) -> Vec<(String, Make)> {
    let c = scenario.workers[0].1;
    let [below, above] = starts(scenario);
    let (one, two) = (off.to_vec(), off.to_vec());
    let mut all: Vec<(String, Make)> = vec![
        (
            format!("gradient from {below}"),
            Box::new(move || Limiter::Adaptive(Box::new(gradient(&one)), below)),
        ),
        (
            format!("gradient from {above}"),
            Box::new(move || Limiter::Adaptive(Box::new(gradient(&two)), above)),
        ),
    ];
    if rows == Rows::All {
        all.push((
            format!("aimd from {below}"),
            Box::new(move || Limiter::Adaptive(Box::new(Aimd::default()), below)),
        ));
    }
    let mut statics: Vec<u64> = SWEEP
        .iter()
        .map(|share| ((share * c as f64).round() as u64).max(1))
        .collect();
    statics.dedup();
    for limit in statics {
        all.push((
            format!("static {limit}"),
            Box::new(move || Limiter::Static(limit)),
        ));
    }
    if rows == Rows::All {
        all.push(("no limit".into(), Box::new(|| Limiter::None)));
    }
    all
}

/// `[scenario][seed][limiter]`, and each scenario's limiter names.
struct Results {
    runs: Vec<Vec<Vec<Outcomes>>>,
    names: Vec<Vec<String>>,
}

fn simulate(scenarios: &[Scenario], seeds: &[u64]) -> Results {
    simulate_with(scenarios, seeds, &[], None, Rows::All)
}

/// `simulate`, with `Gradient`'s mechanisms in `off` turned off; given `base` (a run of
/// the same scenarios and seeds), only `Gradient`'s rows are run and the others taken
/// from it.
fn simulate_with(
    scenarios: &[Scenario],
    seeds: &[u64],
    off: &[Mechanism],
    base: Option<&Results>,
    rows: Rows,
) -> Results {
    let limiters: Vec<_> = scenarios.iter().map(|s| limiters(s, off, rows)).collect();
    let names = limiters
        .iter()
        .map(|l| l.iter().map(|(n, _)| n.clone()).collect())
        .collect();
    let mut jobs: Vec<(usize, usize, usize)> = Vec::new();
    for (s, list) in limiters.iter().enumerate() {
        for k in 0..seeds.len() {
            jobs.extend((0..list.len()).map(|l| (s, k, l)));
        }
    }
    let results = Mutex::new(vec![None; jobs.len()]);
    let next = Mutex::new(0usize);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let index = {
                        let mut next = next.lock().unwrap();
                        *next += 1;
                        *next - 1
                    };
                    let Some(&(s, k, l)) = jobs.get(index) else {
                        break;
                    };
                    let outcome = match base {
                        Some(base) if l >= 2 => base.runs[s][k][l].clone(),
                        _ => sim::run(&scenarios[s], (limiters[s][l].1)(), seeds[k]),
                    };
                    results.lock().unwrap()[index] = Some(outcome);
                }
            });
        }
    });
    let mut flat = results
        .into_inner()
        .unwrap()
        .into_iter()
        .map(Option::unwrap);
    let runs = limiters
        .iter()
        .map(|list| {
            (0..seeds.len())
                .map(|_| (0..list.len()).map(|_| flat.next().unwrap()).collect())
                .collect()
        })
        .collect();
    Results { runs, names }
}

/// Checks that the section of the README at `path` between `<!-- NAME -->` and
/// `<!-- /NAME -->` is `lines` (blank lines around them aside).
fn check_section(path: &str, name: &str, lines: &[String]) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    let (open, close) = (format!("<!-- {name} -->"), format!("<!-- /{name} -->"));
    let section = text
        .split_once(&open)
        .and_then(|(_, rest)| rest.split_once(&close))
        .map(|(inside, _)| inside.trim())
        .ok_or(format!("no section between {open} and {close}"))?;
    let expected = lines.join("\n");
    if section == expected.trim() {
        println!("{path}: its {name} section is this run's");
        Ok(())
    } else {
        println!("{path}: its {name} section is not this run's; this run's:\n{expected}");
        Err(format!("the {name} section is not this run's"))
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--strand") {
        let seeds: u64 = args.get(at + 1).and_then(|n| n.parse().ok()).unwrap_or(50);
        let slow: f64 = args.get(at + 2).and_then(|n| n.parse().ok()).unwrap_or(1.0);
        if args.iter().any(|a| a == "--trace-one") {
            return trace::trace_scenario(&strand_scenario(slow), true, seeds);
        }
        return strand(seeds, slow);
    }
    if let Some(at) = args.iter().position(|a| a == "--trace") {
        let name = args.get(at + 1).map_or("", String::as_str);
        let above = args.get(at + 2).is_some_and(|a| a == "above");
        let seed = args
            .iter()
            .position(|a| a == "--seed")
            .and_then(|at| args.get(at + 1)?.parse().ok())
            .unwrap_or(SEEDS[0]);
        return trace::trace(name, above, seed);
    }
    let quick = std::env::args().any(|a| a == "--quick");
    // `--seeds 4,5,6`: other seeds than CI's (held out from tuning).
    let chosen: Option<Vec<u64>> = args
        .iter()
        .position(|a| a == "--seeds")
        .and_then(|at| args.get(at + 1))
        .map(|list| {
            list.split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect()
        })
        .filter(|list: &Vec<u64>| !list.is_empty());
    let seeds: &[u64] = match &chosen {
        Some(list) => list,
        None if quick => &SEEDS[..1],
        None => &SEEDS,
    };
    let scenarios = if args.iter().any(|a| a == "--flat") {
        flat_scenarios()
    } else {
        scenarios()
    };
    if args.iter().any(|a| a == "--held-out") {
        return held_out::run(&scenarios, &args);
    }
    if args.iter().any(|a| a == "--ablation") {
        return held_out::ablation(&scenarios, &args);
    }
    let started = std::time::Instant::now();
    let results = simulate(&scenarios, seeds);
    println!(
        "adaptive concurrency: a server of C workers with service times of mean S, its own FIFO queue;"
    );
    println!(
        "Poisson arrivals; shed requests are not retried; a client gives up (cancelling its request, the"
    );
    println!(
        "limit told `Gone`) at its deadline, 100 S unless the scenario says otherwise. Measured after"
    );
    println!(
        "the warm-up (5 s unless the scenario says otherwise). Goodput counts answers as a share of what"
    );
    println!(
        "could be answered (second by second, the arrivals or the capacity, whichever is fewer). Adaptive"
    );
    println!(
        "limiters start far below (C/6, at least 2) and far above (4C), told neither C nor S."
    );
    println!(
        "Seeds {seeds:?}; the tables show seed {}; the targets, the worst seed.",
        seeds[0]
    );
    for (s, scenario) in scenarios.iter().enumerate() {
        let runs = &results.runs[s][0];
        let names = &results.names[s];
        let best = oracle(runs, names);
        let service = scenario.service;
        println!();
        println!(
            "{} (C = {}, S = {} ms, {:?}, deadline {} S, {} s after {} s of warm-up)",
            scenario.name,
            scenario.workers[0].1,
            service * 1e3,
            scenario.distribution,
            (scenario.deadline / service).round(),
            scenario.seconds - scenario.warmup,
            scenario.warmup
        );
        println!(
            "  {:<19} {:>8} {:>7} {:>7} {:>7} {:>10} {:>10}",
            "limiter", "goodput", "shed", "p50/S", "p99/S", "queued p99", "mean limit"
        );
        for (l, name) in names.iter().enumerate() {
            let o = &runs[l];
            let warm = scenario.warmup as usize;
            let limit = mean(&o.limit_by_second[warm..]);
            let marker = if l == best { " (oracle)" } else { "" };
            println!(
                "  {:<19} {:>7.1}% {:>6.1}% {:>7.2} {:>7.2} {:>8.2} S {:>10}{marker}",
                name,
                o.goodput * 100.0,
                o.shed * 100.0,
                o.p50 / service,
                o.p99 / service,
                o.queued_p99,
                if limit.is_nan() {
                    "-".to_owned()
                } else {
                    format!("{limit:.1}")
                },
            );
        }
        for change in scenario.changes() {
            println!(
                "  the limit's 1-s averages from {} s ({} workers from {change} s):",
                change - 1.0,
                scenario.workers_at(change),
            );
            for (l, name) in names.iter().enumerate().take(ADAPTIVE_ROWS) {
                let by_second = &runs[l].limit_by_second;
                let from = change as usize - 1;
                let to = (from + 6).min(by_second.len());
                let row: Vec<String> = by_second[from..to]
                    .iter()
                    .map(|v| format!("{v:6.1}"))
                    .collect();
                println!("    {:<18} {}", name, row.join(" "));
            }
        }
    }

    println!();
    println!(
        "targets, scenario by scenario (worst seed). Where no static limit meets every target a static"
    );
    println!(
        "limit can, the reference is the static limit that meets the most (then the best goodput), and a"
    );
    println!(
        "target it misses asks for its figure within 10%; following a change always applies as stated."
    );
    let verdicts = verdicts(&scenarios, &results);
    let mut missed = Vec::new();
    for (s, scenario) in scenarios.iter().enumerate() {
        println!();
        println!("{}", scenario.name);
        if std::env::var_os("ADAPTIVE_DEBUG").is_some() {
            for (l, name) in results.names[s].iter().enumerate().skip(ADAPTIVE_ROWS) {
                let row: Vec<String> = Target::ALL
                    .into_iter()
                    .filter(|t| t.applies(scenario))
                    .map(|t| figure(scenario, &results, s, l, t).show(t))
                    .collect();
                println!("    {name:<18} {}", row.join("  "));
            }
        }
        for v in verdicts.iter().filter(|v| v.scenario == s) {
            let name = &results.names[s][v.limiter];
            let how = match v.ask {
                Ask::Stated => String::new(),
                Ask::Near(reference, reference_figure) => format!(
                    " (within 10% of {}: {})",
                    results.names[s][reference],
                    reference_figure.show(v.target)
                ),
            };
            println!(
                "  {name:<18} {:<50} {:<12} {}{how}",
                v.target.label(),
                v.figure.show(v.target),
                v.word()
            );
            if v.gating && !v.met {
                missed.push(format!("{}: {name}: {}", scenario.name, v.target.label()));
            }
        }
    }
    let table = table(&scenarios, &verdicts);
    println!();
    println!(
        "({} runs in {:.1} s; aimd rows are informational: it reads outcomes only)",
        results
            .runs
            .iter()
            .map(|r| r.len() * r[0].len())
            .sum::<usize>(),
        started.elapsed().as_secs_f64()
    );
    if args.iter().any(|a| a == "--markdown") {
        println!();
        println!("{}", table.join("\n"));
    }
    if missed.is_empty() {
        println!("every target of gradient: MET");
        ExitCode::SUCCESS
    } else {
        println!("gradient MISSED {} targets:", missed.len());
        for line in &missed {
            println!("  {line}");
        }
        ExitCode::FAILURE
    }
}

/// The real-server figure's shape in the simulator (32 workers of a flat 40 ms, a quarter
/// from 10 s, all from 20 s, 2x, from 4C), on `seeds` seeds: each phase's mean limit over
/// the workers, from 2 s after its step.
fn strand_scenario(slow: f64) -> Scenario {
    Scenario {
        slowdown: vec![(0.0, 1.0), (20.0, slow)],
        workers: vec![(0.0, 32), (10.0, 8), (20.0, 32)],
        distribution: sim::Service::Constant { jitter: 0.025 },
        seconds: 30.0,
        warmup: 0.0,
        ..Scenario::steady("strand", 32, 0.040, 2.0)
    }
}

fn strand(seeds: u64, slow: f64) -> ExitCode {
    let scenario = strand_scenario(slow);
    let mut worst = f64::INFINITY;
    for seed in 1..=seeds {
        let o = sim::run(
            &scenario,
            Limiter::Adaptive(Box::new(Gradient::default()), 128),
            seed,
        );
        let phase = |from: usize, to: usize, c: f64| {
            let limits = &o.limit_by_second[from..to.min(o.limit_by_second.len())];
            limits.iter().sum::<f64>() / limits.len() as f64 / c
        };
        let (a, b, c) = (phase(2, 10, 32.0), phase(12, 20, 8.0), phase(22, 30, 32.0));
        let min_last = o.limit_by_second[22..]
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        worst = worst.min(c);
        println!("seed {seed:3}: {a:5.2} {b:5.2} {c:5.2}  (last phase's lowest {min_last:5.1})");
    }
    println!("worst last phase: {worst:.2}");
    ExitCode::SUCCESS
}
