//! The adaptive limit over time, in the simulator: a server of 64 workers at 10 ms under
//! twice its load falls to a quarter of its workers at 12 s and comes back at 22 s.
//! `Gradient`, started far below and far above, against the server's concurrency, and
//! the goodput of each second beside two static limits (right for the whole server, and
//! right for the quarter).

use std::error::Error;
use std::path::Path;
use std::time::Duration;

use admission_bench::sim::{self, Limiter, Outcomes, Scenario};
use admission_core::adaptive::Gradient;
use plotters::chart::SeriesLabelPosition;

use crate::plot::{self, BLUE, GREEN, GREY, Line, ORANGE, Panel, RED};
use crate::{Mode, progress, real};

const WORKERS: u64 = 64;
const QUARTER: u64 = WORKERS / 4;
/// When the workers change: 64, 16 from 12 s, 64 again from 22 s.
const CHANGES: [f64; 2] = [12.0, 22.0];
/// The band the limit is held to, from 2 s after each change: 0.75x to 1.5x of the
/// server's concurrency (the simulator's target).
const BAND: (f64, f64) = (0.75, 1.5);
const SETTLE: f64 = 2.0;
/// Of the seconds from 2 s after a change, the share the limit must spend in its band,
/// over the seeds checked (the simulator's own target asks every second of every seed,
/// which it meets on most held-out seeds, not all).
const IN_BAND: f64 = 0.9;

fn scenario() -> Scenario {
    Scenario {
        workers: vec![(0.0, WORKERS), (CHANGES[0], QUARTER), (CHANGES[1], WORKERS)],
        seconds: 32.0,
        warmup: 5.0,
        ..Scenario::steady("capacity to a quarter and back", WORKERS, 0.010, 2.0)
    }
}

/// What the figure and its check need.
pub(crate) struct Figure {
    /// Of the seconds after each change settles, the share with the limit in its band,
    /// over every seed and both starts.
    pub(crate) in_band: f64,
    /// On the real server, each phase's mean limit over its settled part (from 2 s after
    /// the change), against the slots then.
    pub(crate) real: Vec<(f64, f64)>,
}

/// Runs the scenario (seeds from 100, held out from tuning), draws the first seed, and
/// measures the share of settled seconds in the band over all of them.
pub(crate) fn figure(mode: Mode, out: &Path) -> Result<Figure, Box<dyn Error>> {
    let scenario = scenario();
    let seeds: Vec<u64> = (100..100 + mode.seeds()).collect();
    let starts = [
        (WORKERS / 6, "Gradient from 10"),
        (4 * WORKERS, "Gradient from 256"),
    ];
    let total = seeds.len() * starts.len() + 2;
    let mut done = 0;
    let mut runs: Vec<(u64, &str, Outcomes)> = Vec::new();
    for &seed in &seeds {
        for &(start, name) in &starts {
            done += 1;
            progress("adaptive limit", done, total);
            let limiter = Limiter::Adaptive(Box::new(Gradient::default()), start);
            runs.push((seed, name, sim::run(&scenario, limiter, seed)));
        }
    }
    let statics: Vec<(u64, Outcomes)> = [WORKERS, QUARTER]
        .into_iter()
        .map(|limit| {
            done += 1;
            progress("adaptive limit", done, total);
            (limit, sim::run(&scenario, Limiter::Static(limit), seeds[0]))
        })
        .collect();

    let (mut settled, mut inside) = (0usize, 0usize);
    for (_, _, outcomes) in &runs {
        for (second, &limit) in outcomes.limit_by_second.iter().enumerate() {
            // The second [t, t + 1): settled if it starts 2 s or more after the last
            // change and no change falls inside it.
            let t = second as f64;
            let settled_now = CHANGES
                .iter()
                .rev()
                .find(|&&at| at <= t)
                .is_some_and(|&at| {
                    t >= at + SETTLE && CHANGES.iter().all(|&c| c <= at || c >= t + 1.0)
                });
            if !settled_now || t + 1.0 > scenario.seconds {
                continue;
            }
            let c = scenario.workers_at(t + 0.5) as f64;
            settled += 1;
            inside += usize::from(limit >= BAND.0 * c && limit <= BAND.1 * c);
        }
    }
    let phase = match mode {
        Mode::Full => Duration::from_secs(10),
        Mode::Short => Duration::from_secs(6),
    };
    progress("adaptive limit (real server)", 0, 1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let samples = runtime.block_on(real::adaptive(phase));
    progress("adaptive limit (real server)", 1, 1);
    let real_phases = settled_phases(&samples, phase);
    let phase = phase.as_secs_f64();
    plot::panels(
        &out.join("adaptive-limit-real.svg"),
        &[Panel {
            title: "The adaptive limit on a real server whose workers fall to a quarter and come back",
            x: ("seconds", 0.0..3.0 * phase),
            y: ("requests in flight", 0.0..140.0),
            lines: vec![
                Line {
                    name: "the server's workers".into(),
                    points: samples.iter().map(|&(t, _, slots)| (t, slots)).collect(),
                    color: GREY,
                    reference: true,
                },
                Line {
                    name: "Gradient, started at 4x".into(),
                    points: samples.iter().map(|&(t, limit, _)| (t, limit)).collect(),
                    color: BLUE,
                    reference: false,
                },
            ],
            legend: SeriesLabelPosition::UpperRight,
            log_y: false,
            markers: false,
        }],
    )?;
    let figure = Figure {
        in_band: inside as f64 / settled.max(1) as f64,
        real: real_phases,
    };

    let capacity: Vec<(f64, f64)> = (0..=320)
        .map(|i| {
            let t = f64::from(i) / 10.0;
            (t, scenario.workers_at(t) as f64)
        })
        .collect();
    let by_second = |values: &[f64], scale: f64| -> Vec<(f64, f64)> {
        values
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(s, v)| (s as f64 + 0.5, v * scale))
            .collect()
    };
    let first: Vec<&(u64, &str, Outcomes)> = runs.iter().filter(|r| r.0 == seeds[0]).collect();
    let mut limits = vec![Line {
        name: "the server's concurrency (workers)".into(),
        points: capacity,
        color: GREY,
        reference: true,
    }];
    let (mut goodput, mut latency) = (Vec::new(), Vec::new());
    let adaptive = first.iter().map(|r| ((*r.1).to_owned(), &r.2, false));
    let fixed = statics
        .iter()
        .map(|(limit, outcomes)| (format!("static limit {limit}"), outcomes, true));
    for ((name, outcomes, reference), color) in
        adaptive.chain(fixed).zip([BLUE, ORANGE, GREEN, RED])
    {
        let line = |values: &[f64], scale| Line {
            name: name.clone(),
            points: by_second(values, scale),
            color,
            reference,
        };
        if !reference {
            limits.push(line(&outcomes.limit_by_second, 1.0));
        }
        goodput.push(line(&outcomes.goodput_by_second, 100.0));
        latency.push(line(&outcomes.latency_by_second, 1e3));
    }
    plot::panels(
        &out.join("adaptive-limit-simulated.svg"),
        &[
            Panel {
                title: "Gradient's limit follows the server as it falls to a quarter and comes back (simulated, 2x load)",
                x: ("seconds", 0.0..32.0),
                y: ("requests in flight", 0.0..280.0),
                lines: limits,
                legend: SeriesLabelPosition::UpperRight,
                log_y: false,
                markers: false,
            },
            Panel {
                title: "Goodput each second: a static limit right for the quarter loses the rest",
                x: ("seconds", 0.0..32.0),
                y: ("% of what could be answered", 0.0..110.0),
                lines: goodput,
                legend: SeriesLabelPosition::MiddleRight,
                log_y: false,
                markers: false,
            },
            Panel {
                title: "Mean latency each second: one right for the whole queues the quarter",
                x: ("seconds", 0.0..32.0),
                y: ("milliseconds", 0.0..60.0),
                lines: latency,
                legend: SeriesLabelPosition::UpperRight,
                log_y: false,
                markers: false,
            },
        ],
    )?;
    Ok(figure)
}

/// Each phase's mean limit over its settled part (from `SETTLE` in), and the workers
/// then, from the real server's samples (time, limit, workers).
fn settled_phases(samples: &[(f64, f64, f64)], phase: Duration) -> Vec<(f64, f64)> {
    let phase = phase.as_secs_f64();
    (0..3)
        .map(|i| {
            let from = i as f64 * phase + SETTLE;
            let settled: Vec<&(f64, f64, f64)> = samples
                .iter()
                .filter(|(t, ..)| *t >= from && *t < (i + 1) as f64 * phase)
                .collect();
            let mean = settled.iter().map(|s| s.1).sum::<f64>() / settled.len().max(1) as f64;
            (mean, settled.first().map_or(0.0, |s| s.2))
        })
        .collect()
}

/// Whether a phase's settled mean is in its band: from 0.75x of the workers `c` to 1.5x
/// of `c + √c` (the law keeps √c queued: on a few workers, a large share).
fn in_band(mean: f64, slots: f64) -> bool {
    mean >= BAND.0 * slots && mean <= BAND.1 * (slots + slots.sqrt())
}

/// `--real-adaptive-loop N`: the real-server run of the adaptive figure, `N` times (6-s
/// phases), each run's settled means on a line, then each phase's spread and the runs
/// out of band. Not in CI: it is how a rare failure (a limit stranded below the server,
/// #74) is looked for.
pub(crate) fn real_loop(runs: usize) -> Result<usize, Box<dyn Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let phase = Duration::from_secs(6);
    let mut means: [Vec<f64>; 3] = Default::default();
    let mut out = 0;
    for run in 1..=runs {
        let samples = runtime.block_on(real::adaptive(phase));
        let phases = settled_phases(&samples, phase);
        let ok = phases.iter().all(|&(mean, slots)| in_band(mean, slots));
        out += usize::from(!ok);
        let line: Vec<String> = phases
            .iter()
            .map(|(mean, slots)| format!("{mean:5.1} for {slots:2.0}"))
            .collect();
        println!(
            "run {run:3}: {}{}",
            line.join(", "),
            if ok { "" } else { "  OUT OF BAND" }
        );
        for (i, (mean, _)) in phases.iter().enumerate() {
            means[i].push(*mean);
        }
    }
    for (i, phase) in means.iter_mut().enumerate() {
        phase.sort_by(f64::total_cmp);
        let at = |q: f64| phase[((phase.len() - 1) as f64 * q).round() as usize];
        println!(
            "phase {}: settled mean lowest {:.1}, p5 {:.1}, median {:.1}, p95 {:.1}, highest {:.1}",
            i + 1,
            at(0.0),
            at(0.05),
            at(0.5),
            at(0.95),
            at(1.0)
        );
    }
    println!("{out} of {runs} runs out of band");
    Ok(out)
}

/// The claims the figures make, checked on their data: the limit inside its band after
/// each step, in the simulator (most settled seconds) and on the real server (each
/// phase's mean).
pub(crate) fn check(figure: &Figure) -> Vec<Result<String, String>> {
    let simulated = format!(
        "adaptive limit, simulated: {:.0}% of the seconds from 2 s after each change in 0.75x-1.5x of the server (at least {:.0}% asked)",
        100.0 * figure.in_band,
        100.0 * IN_BAND
    );
    let phases: Vec<String> = figure
        .real
        .iter()
        .map(|(mean, slots)| format!("{mean:.1} for {slots:.0}"))
        .collect();
    let real = format!(
        "adaptive limit, real server: each phase's settled mean from 0.75x of the workers c to 1.5x of c + √c ({})",
        phases.join(", ")
    );
    // The law keeps √c above the server's concurrency c as its queue: on a real server of
    // a few workers that is a large share, so the band's top is 1.5x of c + √c there.
    let real_ok = figure
        .real
        .iter()
        .all(|&(mean, slots)| in_band(mean, slots));
    vec![
        if figure.in_band >= IN_BAND {
            Ok(simulated)
        } else {
            Err(simulated)
        },
        if real_ok { Ok(real) } else { Err(real) },
    ]
}
