//! The targets: what each scenario asks of a limiter, its figures, and the verdicts.

use admission_bench::sim::{Outcomes, Scenario};

use super::scenarios::starts;
use super::{ADAPTIVE_ROWS, Results};

/// The oracle of one seed: the static limit with the lowest p99 among those within 1% of
/// the best static goodput. Its index among the limiters.
pub(super) fn oracle(runs: &[Outcomes], names: &[String]) -> usize {
    let statics: Vec<usize> = (0..names.len())
        .filter(|&i| names[i].starts_with("static"))
        .collect();
    let best = statics.iter().map(|&i| runs[i].goodput).fold(0.0, f64::max);
    *statics
        .iter()
        .filter(|&&i| runs[i].goodput >= best - 0.01)
        .min_by(|&&a, &&b| runs[a].p99.total_cmp(&runs[b].p99))
        .unwrap()
}

pub(super) fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// A target: what it asks, and whether a higher figure is better.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Target {
    Goodput,
    Shed,
    P99,
    Queued,
    Follow,
    Window,
}

impl Target {
    pub(super) const ALL: [Target; 6] = [
        Self::Goodput,
        Self::Shed,
        Self::P99,
        Self::Queued,
        Self::Follow,
        Self::Window,
    ];

    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Goodput => "goodput >= 98%",
            Self::Shed => "shed <= 1% (light load)",
            Self::P99 => "p99 <= 1.25x the oracle's",
            Self::Queued => "queued p99 <= 1 S",
            Self::Follow => "limit in 0.75x-1.5x of C from 2 s after a change",
            Self::Window => "no 1-s window below 80% goodput",
        }
    }

    pub(super) fn applies(self, scenario: &Scenario) -> bool {
        match self {
            Self::Shed => scenario.light(0.5),
            Self::Follow => !scenario.changes().is_empty(),
            _ => true,
        }
    }

    /// Whether `figure` meets the target as stated.
    pub(super) fn met(self, figure: Figure) -> bool {
        match (self, figure) {
            (Self::Goodput, Figure::One(g)) => g >= 0.98,
            (Self::Shed, Figure::One(s)) => s <= 0.01,
            (Self::P99, Figure::One(r)) => r <= 1.25,
            (Self::Queued, Figure::One(q)) => q <= 1.0,
            (Self::Follow, Figure::Range(low, high)) => low >= 0.75 && high <= 1.5,
            (Self::Window, Figure::One(w)) => w >= 0.8,
            _ => unreachable!(),
        }
    }

    /// Whether `figure` is within 10% of `reference` (the feasibility rule).
    pub(super) fn near(self, figure: Figure, reference: Figure) -> bool {
        match (self, figure, reference) {
            (Self::Goodput | Self::Window, Figure::One(f), Figure::One(r)) => f >= r / 1.1,
            (_, Figure::One(f), Figure::One(r)) => f <= r * 1.1,
            _ => false,
        }
    }
}

/// A limiter's figure for a target in one scenario, worst seed.
#[derive(Debug, Clone, Copy)]
pub(super) enum Figure {
    One(f64),
    Range(f64, f64),
}

impl Figure {
    pub(super) fn show(self, target: Target) -> String {
        match (target, self) {
            (Target::Goodput | Target::Shed | Target::Window, Figure::One(v)) => {
                format!("{:.1}%", v * 100.0)
            }
            (Target::P99, Figure::One(v)) => format!("{v:.2}x"),
            (Target::Queued, Figure::One(v)) => format!("{v:.2} S"),
            (_, Figure::Range(low, high)) => format!("{low:.2}x-{high:.2}x"),
            (_, Figure::One(v)) => format!("{v:.2}"),
        }
    }
}

/// Limiter `l`'s figure for `target` in scenario `s`, over every seed (the worst).
pub(super) fn figure(
    scenario: &Scenario,
    results: &Results,
    s: usize,
    l: usize,
    target: Target,
) -> Figure {
    let names = &results.names[s];
    let seeds = &results.runs[s];
    let warm = scenario.warmup as usize;
    let worst_low = |f: &dyn Fn(&Outcomes) -> f64| {
        Figure::One(seeds.iter().map(|r| f(&r[l])).fold(f64::MAX, f64::min))
    };
    let worst_high = |f: &dyn Fn(&Outcomes) -> f64| {
        Figure::One(seeds.iter().map(|r| f(&r[l])).fold(0.0, f64::max))
    };
    match target {
        Target::Goodput => worst_low(&|o| o.goodput),
        Target::Shed => worst_high(&|o| o.shed),
        Target::Queued => worst_high(&|o| o.queued_p99),
        Target::Window => worst_low(&|o| {
            o.goodput_by_second[warm..]
                .iter()
                .copied()
                .fold(f64::MAX, f64::min)
        }),
        Target::P99 => Figure::One(
            seeds
                .iter()
                .map(|r| r[l].p99 / r[oracle(r, names)].p99)
                .fold(0.0, f64::max),
        ),
        Target::Follow => {
            let (mut low, mut high) = (f64::MAX, 0.0f64);
            let changes = scenario.changes();
            for (c, &change) in changes.iter().enumerate() {
                let until = changes.get(c + 1).copied().unwrap_or(scenario.seconds);
                let workers = scenario.workers_at(change) as f64;
                for r in seeds {
                    for second in (change as usize + 1)..(until as usize) {
                        let ratio = r[l].limit_by_second[second] / workers;
                        low = low.min(ratio);
                        high = high.max(ratio);
                    }
                }
            }
            Figure::Range(low, high)
        }
    }
}

/// What a scenario asks of an adaptive limiter, target by target: the target as stated,
/// or (where no static limit meets every target that a static limit can) within 10% of
/// the reference static limit's figure.
#[derive(Clone, Copy)]
pub(super) enum Ask {
    Stated,
    Near(usize, Figure),
}

pub(super) fn asks(scenario: &Scenario, results: &Results, s: usize) -> Vec<(Target, Ask)> {
    let names = &results.names[s];
    let gating: Vec<Target> = Target::ALL
        .into_iter()
        .filter(|t| t.applies(scenario) && *t != Target::Follow)
        .collect();
    let statics: Vec<usize> = (0..names.len())
        .filter(|&i| names[i].starts_with("static"))
        .collect();
    let met = |l: usize| {
        gating
            .iter()
            .filter(|t| t.met(figure(scenario, results, s, l, **t)))
            .count()
    };
    let goodput = |l: usize| match figure(scenario, results, s, l, Target::Goodput) {
        Figure::One(g) => g,
        Figure::Range(..) => 0.0,
    };
    // The static limit meeting the most targets; of those, the best goodput.
    let reference = *statics
        .iter()
        .max_by(|&&a, &&b| met(a).cmp(&met(b)).then(goodput(a).total_cmp(&goodput(b))))
        .unwrap();
    let all_met = met(reference) == gating.len();
    Target::ALL
        .into_iter()
        .filter(|t| t.applies(scenario))
        .map(|t| {
            let reference_figure = figure(scenario, results, s, reference, t);
            let ask = if all_met || t == Target::Follow || t.met(reference_figure) {
                Ask::Stated
            } else {
                Ask::Near(reference, reference_figure)
            };
            (t, ask)
        })
        .collect()
}

/// One target of one adaptive limiter (`limiter`: its row) in one scenario, as a run
/// reads it over its seeds.
pub(super) struct Verdict {
    pub(super) scenario: usize,
    pub(super) limiter: usize,
    pub(super) target: Target,
    pub(super) figure: Figure,
    pub(super) ask: Ask,
    pub(super) met: bool,
    /// `Gradient`'s (the rows that gate the run).
    pub(super) gating: bool,
}

impl Verdict {
    /// How the run's report words it.
    pub(super) fn word(&self) -> &'static str {
        match (self.met, self.gating) {
            (true, _) => "MET",
            (false, true) => "MISSED",
            (false, false) => "missed",
        }
    }

    pub(super) fn start(&self) -> &'static str {
        side(self.limiter)
    }
}

/// An adaptive limiter's start, by its row: far `below` (the first) or far `above`.
pub(super) fn side(limiter: usize) -> &'static str {
    if limiter == 0 { "below" } else { "above" }
}

/// Every adaptive limiter's targets, scenario by scenario.
pub(super) fn verdicts(scenarios: &[Scenario], results: &Results) -> Vec<Verdict> {
    let mut all = Vec::new();
    for (s, scenario) in scenarios.iter().enumerate() {
        let asks = asks(scenario, results, s);
        for (l, name) in results.names[s].iter().enumerate().take(ADAPTIVE_ROWS) {
            let gating = name.starts_with("gradient");
            for &(target, ask) in &asks {
                let figure = figure(scenario, results, s, l, target);
                let met = match ask {
                    Ask::Stated => target.met(figure),
                    Ask::Near(_, reference) => target.near(figure, reference),
                };
                all.push(Verdict {
                    scenario: s,
                    limiter: l,
                    target,
                    figure,
                    ask,
                    met,
                    gating,
                });
            }
        }
    }
    all
}

/// The README's results table: a row per scenario and start of `Gradient`, a cell per
/// target (`*` where the target is a static limit's figure within 10%), and whether the
/// row meets them all, or misses one.
pub(super) fn table(scenarios: &[Scenario], verdicts: &[Verdict]) -> Vec<String> {
    let mut rows = Vec::new();
    for (s, scenario) in scenarios.iter().enumerate() {
        for l in 0..2 {
            let row: Vec<&Verdict> = verdicts
                .iter()
                .filter(|v| v.scenario == s && v.limiter == l && v.gating)
                .collect();
            let Some(first) = row.first() else { continue };
            let mut cells: [String; 6] = Default::default();
            for v in &row {
                let at = Target::ALL.iter().position(|t| *t == v.target).unwrap_or(0);
                cells[at] = v.figure.show(v.target);
                if matches!(v.ask, Ask::Near(..)) {
                    cells[at].push('*');
                }
            }
            let status = if row.iter().any(|v| !v.met) {
                "MISSED"
            } else {
                "MET"
            };
            let scenario_cell = if l == 0 { scenario.name.as_str() } else { "" };
            let start = starts(scenario)[l];
            rows.push(format!(
                "| {scenario_cell} | {} ({start}) | {} | {status} |",
                first.start(),
                cells.join(" | ")
            ));
        }
    }
    rows
}
