//! `--held-out`: `Gradient` judged on seeds no change is tuned on, seed by seed, by
//! properties of the whole rather than by a pinned table. `--ablation`: the same seeds
//! with each mechanism turned off in turn, against all of them on.

use std::collections::BTreeMap;
use std::process::ExitCode;

use admission_bench::sim::Scenario;
use admission_core::adaptive::Mechanism;

use super::{Results, Rows, Target, side, simulate_with, starts, verdicts};

/// The first held-out seed. Seeds from here on are never tuned on: tune on 1-99, and
/// judge a change here.
const FIRST: u64 = 100;
/// How many CI judges (time: about five seconds a seed on two cores); `--seeds-held N`
/// judges more (up to 100, seeds 100-199).
const CI_SEEDS: u64 = 24;
/// At most this many missed targets per seed on average, over every scenario, start and
/// target (38 scenario-starts of 4 to 5 targets each: 176 a seed). The controller as it
/// was when these seeds were set aside missed 94 on the 24 CI runs (3.92 a seed): this
/// holds every change to no more than that.
const MISSES_PER_SEED: f64 = 4.0;
/// Every scenario-start meets all its targets on at least this share of the seeds (then:
/// the worst, C = 8 at 2x, on 10 of 24).
const EVERY_START_MEETS: f64 = 0.4;

/// One seed's misses: scenario, start (row), target.
type Misses = Vec<(usize, usize, Target)>;

/// `Gradient`'s misses, each seed judged alone.
fn misses_by_seed(scenarios: &[Scenario], results: &Results) -> Vec<Misses> {
    let seeds = results.runs.first().map_or(0, Vec::len);
    (0..seeds)
        .map(|k| {
            let one = Results {
                runs: results.runs.iter().map(|r| vec![r[k].clone()]).collect(),
                names: results.names.clone(),
            };
            verdicts(scenarios, &one)
                .into_iter()
                .filter(|v| v.gating && !v.met)
                .map(|v| (v.scenario, v.limiter, v.target))
                .collect()
        })
        .collect()
}

/// A scenario-start's misses: the seeds missing any target, and the misses by target.
#[derive(Default)]
struct StartMisses {
    seeds: usize,
    by_target: BTreeMap<&'static str, usize>,
}

/// What the properties read of a set of seeds' misses.
struct Summary {
    seeds: usize,
    total: usize,
    /// Per scenario-start (scenario, row) with a miss.
    starts: BTreeMap<(usize, usize), StartMisses>,
}

impl Summary {
    fn of(misses: &[Misses]) -> Self {
        let mut starts: BTreeMap<(usize, usize), StartMisses> = BTreeMap::new();
        for seed in misses {
            let mut seen = Vec::new();
            for &(s, l, target) in seed {
                let entry = starts.entry((s, l)).or_default();
                if !seen.contains(&(s, l)) {
                    seen.push((s, l));
                    entry.seeds += 1;
                }
                *entry.by_target.entry(target.label()).or_default() += 1;
            }
        }
        Self {
            seeds: misses.len(),
            total: misses.iter().map(Vec::len).sum(),
            starts,
        }
    }

    /// The share of seeds on which the worst scenario-start meets all its targets.
    fn worst_start(&self) -> f64 {
        1.0 - self.worst_seeds() as f64 / self.seeds.max(1) as f64
    }

    /// The most seeds any one scenario-start misses a target on.
    fn worst_seeds(&self) -> usize {
        self.starts.values().map(|m| m.seeds).max().unwrap_or(0)
    }

    fn per_seed(&self) -> f64 {
        self.total as f64 / self.seeds.max(1) as f64
    }

    /// The properties CI holds `Gradient` to; the reasons it fails them.
    fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.per_seed() > MISSES_PER_SEED {
            failures.push(format!(
                "{:.2} missed targets a seed, over the {MISSES_PER_SEED} allowed",
                self.per_seed()
            ));
        }
        if self.worst_start() < EVERY_START_MEETS {
            failures.push(format!(
                "a scenario-start meets its targets on {:.0}% of the seeds, under the {:.0}% asked",
                self.worst_start() * 100.0,
                EVERY_START_MEETS * 100.0
            ));
        }
        failures
    }
}

/// The first seed `--tuning` judges on: the tuning set past the default run's three.
const FIRST_TUNING: u64 = 4;

/// The held-out seeds asked for: `--seeds-held N` (at most 100), else CI's. With
/// `--tuning`, as many from the tuning seeds (4-99) instead, to try a change on.
fn seeds(args: &[String]) -> Vec<u64> {
    let (first, most) = if args.iter().any(|a| a == "--tuning") {
        (FIRST_TUNING, FIRST - FIRST_TUNING)
    } else {
        (FIRST, 100)
    };
    let count = args
        .iter()
        .position(|a| a == "--seeds-held")
        .and_then(|at| args.get(at + 1)?.parse().ok())
        .unwrap_or(CI_SEEDS)
        .clamp(1, most);
    (first..first + count).collect()
}

/// `--without Descent,Ramp`: mechanisms to turn off together.
fn without(args: &[String]) -> Vec<Mechanism> {
    let Some(list) = args
        .iter()
        .position(|a| a == "--without")
        .and_then(|at| args.get(at + 1))
    else {
        return Vec::new();
    };
    Mechanism::ALL
        .into_iter()
        .filter(|m| list.split(',').any(|name| name.trim() == format!("{m:?}")))
        .collect()
}

fn seed_range(seeds: &[u64]) -> String {
    format!("{}-{}", seeds[0], seeds[seeds.len() - 1])
}

/// `--held-out`: the table of misses and the properties' verdict; non-zero if one fails.
pub(crate) fn run(scenarios: &[Scenario], args: &[String]) -> ExitCode {
    let started = std::time::Instant::now();
    let seeds = seeds(args);
    let off = without(args);
    let results = simulate_with(scenarios, &seeds, &off, None, Rows::Judged);
    let summary = Summary::of(&misses_by_seed(scenarios, &results));
    let mut lines = vec![
        "| scenario | start | seeds missing a target | targets missed (seeds) |".to_owned(),
        "|---|---|---|---|".to_owned(),
    ];
    for (&(s, l), misses) in &summary.starts {
        let count = misses.seeds;
        let targets: Vec<String> = misses
            .by_target
            .iter()
            .map(|(t, n)| format!("{t} ({n})"))
            .collect();
        lines.push(format!(
            "| {} | {} ({}) | {count} of {} | {} |",
            scenarios[s].name,
            side(l),
            starts(&scenarios[s])[l],
            summary.seeds,
            targets.join("; ")
        ));
    }
    lines.push(String::new());
    lines.push(format!(
        "Over seeds {}: {} missed targets, {:.2} a seed (at most {MISSES_PER_SEED} asked); the worst scenario-start meets all its targets on {:.0}% of the seeds (at least {:.0}% asked).",
        seed_range(&seeds),
        summary.total,
        summary.per_seed(),
        summary.worst_start() * 100.0,
        EVERY_START_MEETS * 100.0
    ));
    for line in &lines {
        println!("{line}");
    }
    println!("({:.0} s)", started.elapsed().as_secs_f64());
    let mut failures = summary.failures();
    if let Some(path) = readme(args) {
        if let Err(e) = super::check_section(path, "held-out", &lines) {
            failures.push(format!("{path}: {e}"));
        }
    }
    verdict(failures)
}

/// `--ablation`: each mechanism off in turn, on the held-out seeds.
pub(crate) fn ablation(scenarios: &[Scenario], args: &[String]) -> ExitCode {
    let started = std::time::Instant::now();
    let seeds = seeds(args);
    let base = simulate_with(scenarios, &seeds, &[], None, Rows::Judged);
    let all_on = Summary::of(&misses_by_seed(scenarios, &base));
    let mut lines = vec![
        "| mechanism off | missed targets | seeds a scenario-start misses on, at worst | |"
            .to_owned(),
        "|---|---|---|---|".to_owned(),
        format!(
            "| none (every mechanism on) | {} | {} of {} | |",
            all_on.total,
            all_on.worst_seeds(),
            all_on.seeds
        ),
    ];
    for mechanism in Mechanism::ALL {
        let results = simulate_with(scenarios, &seeds, &[mechanism], Some(&base), Rows::Judged);
        let off = Summary::of(&misses_by_seed(scenarios, &results));
        let earns = if off.total > all_on.total {
            "earns its place"
        } else {
            "EARNS NOTHING"
        };
        lines.push(format!(
            "| {mechanism:?} | {} ({:+}) | {} of {} | {earns} |",
            off.total,
            off.total as i64 - all_on.total as i64,
            off.worst_seeds(),
            off.seeds
        ));
        println!("{}", lines.last().unwrap());
    }
    println!();
    println!("on seeds {}:", seed_range(&seeds));
    for line in &lines {
        println!("{line}");
    }
    println!("({:.0} s)", started.elapsed().as_secs_f64());
    ExitCode::SUCCESS
}

fn readme(args: &[String]) -> Option<&str> {
    let at = args.iter().position(|a| a == "--readme")?;
    args.get(at + 1).map(String::as_str)
}

fn verdict(failures: Vec<String>) -> ExitCode {
    if failures.is_empty() {
        println!("gradient on the held-out seeds: every property MET");
        return ExitCode::SUCCESS;
    }
    for failure in failures {
        println!("FAILED: {failure}");
    }
    ExitCode::FAILURE
}
