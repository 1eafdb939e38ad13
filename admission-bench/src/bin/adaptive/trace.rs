//! `--trace`: each window `Gradient` sees in one scenario, and what it answers.

use std::process::ExitCode;

use admission_bench::sim::{self, Limiter};
use admission_core::adaptive::{Algorithm, Gradient, Window};

use super::scenarios::scenarios;

/// `Gradient`, printing each window it sees and what it answers.
#[derive(Debug)]
struct Traced {
    inner: Gradient,
    clock: f64,
}

impl Algorithm for Traced {
    fn update(&mut self, window: &Window) -> u64 {
        let next = self.inner.update(window);
        self.clock += window.elapsed.as_secs_f64();
        let mean = window.mean_latency().unwrap_or_default().as_secs_f64() * 1e3;
        let noload = self
            .inner
            .no_load_latency()
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3;
        // The phase, from the controller's `Debug` (probing, or not).
        let debug = format!("{:?}", self.inner);
        let phase = debug
            .split("phase: ")
            .nth(1)
            .and_then(|rest| rest.split([' ', ',', '{']).next())
            .unwrap_or("");
        println!(
            "{:8.3} s  limit {:5}  samples {:6}  in flight <= {:5}  mean {:8.2} ms  cv {:5.2}  -> {:5}  no-load {:8.2} ms  {phase}",
            self.clock,
            window.limit,
            window.samples,
            window.max_in_flight,
            mean,
            window.latency_cv().unwrap_or(0.0),
            next,
            noload
        );
        next
    }
}

pub(super) fn trace(name: &str, above: bool, seed: u64) -> ExitCode {
    let all = scenarios().into_iter().chain(super::flat_scenarios());
    let Some(scenario) = all.into_iter().find(|s| s.name.contains(name)) else {
        eprintln!("no scenario's name contains {name:?}");
        return ExitCode::FAILURE;
    };
    trace_scenario(&scenario, above, seed)
}

pub(super) fn trace_scenario(scenario: &sim::Scenario, above: bool, seed: u64) -> ExitCode {
    let scenario = scenario.clone();
    let c = scenario.workers[0].1;
    let initial = if above { 4 * c } else { (c / 6).max(2) };
    println!("{}: gradient from {initial}, seed {seed}", scenario.name);
    let traced = Traced {
        inner: Gradient::default(),
        clock: 0.0,
    };
    let o = sim::run(
        &scenario,
        Limiter::Adaptive(Box::new(traced), initial),
        seed,
    );
    println!(
        "goodput {:.1}%, shed {:.1}%, p99 {:.2} S, queued p99 {:.2} S",
        o.goodput * 100.0,
        o.shed * 100.0,
        o.p99 / scenario.service,
        o.queued_p99
    );
    for (second, (goodput, limit)) in o
        .goodput_by_second
        .iter()
        .zip(&o.limit_by_second)
        .enumerate()
    {
        println!(
            "second {second:3}: goodput {:6.1}%  limit {limit:7.1}",
            goodput * 100.0
        );
    }
    ExitCode::SUCCESS
}
