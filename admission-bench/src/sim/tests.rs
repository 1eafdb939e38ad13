use super::scenario::{exponential, normal};
use super::*;

const S: f64 = 0.01;

fn steady(workers: u64, load: f64, seconds: f64) -> Scenario {
    Scenario {
        deadline: 10.0,
        warmup: 10.0,
        seconds,
        ..Scenario::steady("steady", workers, S, load)
    }
}

fn near(what: &str, value: f64, expected: f64, tolerance: f64) {
    assert!(
        (value - expected).abs() <= tolerance,
        "{what}: {value} (expected {expected} +- {tolerance})"
    );
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// A limit of one request per worker makes the server a loss system (M/M/C/C): it
/// sheds what Erlang's B formula says, and whatever is admitted is served at once.
#[test]
fn a_limit_at_the_workers_sheds_what_erlang_b_says() {
    let outcomes = run(&steady(10, 0.5, 130.0), Limiter::Static(10), 1);
    // B(10 servers, 5 erlangs) = 0.01838.
    near("shed", outcomes.shed, 0.01838, 0.004);
    // Below capacity, what could be answered is what arrived.
    near("goodput", outcomes.goodput, 1.0 - 0.01838, 0.006);
    // No wait: latency is the service time, exponential with mean 10 ms.
    assert_eq!(outcomes.queued_p99, 0.0);
    near("p50", outcomes.p50, S * 2f64.ln(), 0.0005);
    near("p99", outcomes.p99, S * 100f64.ln(), 0.004);
    // The limit's area second by second (the last is cut short by the run's end).
    let (last, whole) = outcomes.limit_by_second.split_last().unwrap();
    assert!(whole.iter().all(|limit| (limit - 10.0).abs() < 1e-9));
    assert!(*last > 9.9 && *last <= 10.0, "{last}");
}

/// Unlimited, one worker at half load queues as M/M/1 does: time in the system
/// exponential with mean 2 S, a wait longer than t with probability 0.5 e^(-t / 2 S).
#[test]
fn one_unlimited_worker_queues_as_m_m_1_says() {
    let outcomes = run(&steady(1, 0.5, 610.0), Limiter::None, 2);
    let mean_time = 2.0 * S;
    near("p50", outcomes.p50, mean_time * 2f64.ln(), 0.08 * mean_time);
    near(
        "p99",
        outcomes.p99,
        mean_time * 100f64.ln(),
        0.4 * mean_time,
    );
    // In multiples of S.
    near("queued p99", outcomes.queued_p99, 2.0 * 50f64.ln(), 0.8);
    near("goodput", outcomes.goodput, 1.0, 0.01);
    assert_eq!(outcomes.shed, 0.0);
    assert!(outcomes.limit_by_second.iter().all(|limit| limit.is_nan()));
    // Twice as slow throughout, at half the load: the same queue in multiples of the
    // slower service time, so the wait reads the same once scaled back, and the time
    // in the system is twice as long.
    let slowed = Scenario {
        slowdown: vec![(0.0, 2.0)],
        ..steady(1, 0.25, 610.0)
    };
    let outcomes = run(&slowed, Limiter::None, 2);
    near(
        "slowed p50",
        outcomes.p50,
        2.0 * mean_time * 2f64.ln(),
        0.16 * mean_time,
    );
    near("queued p99", outcomes.queued_p99, 2.0 * 50f64.ln(), 0.8);
}

/// Only what follows the warm-up is measured: service three times as slow from its
/// end sheds what B(10 servers, 15 erlangs) says, not what the first seconds did.
#[test]
fn only_what_follows_the_warm_up_is_measured() {
    let slowed = Scenario {
        slowdown: vec![(10.0, 3.0)],
        ..steady(10, 0.5, 70.0)
    };
    let outcomes = run(&slowed, Limiter::Static(10), 6);
    near("shed", outcomes.shed, 0.4103, 0.02);
}

/// An adaptive limit runs on the simulation's clock: from a limit of 1 it finds the
/// ten workers.
#[test]
fn an_adaptive_limit_runs_on_the_simulated_clock() {
    let algorithm = Box::new(admission_core::adaptive::Gradient::default());
    let outcomes = run(&steady(10, 0.9, 40.0), Limiter::Adaptive(algorithm, 1), 7);
    let settled = &outcomes.limit_by_second[30..39];
    assert!(settled.iter().all(|limit| *limit >= 8.0), "{settled:?}");
}

/// Overloaded three times over with no limit, clients give up at their deadline: no
/// latency is longer, and the server still does a full day's work.
#[test]
fn a_client_gives_up_at_its_deadline() {
    let scenario = Scenario {
        deadline: 0.05,
        ..steady(2, 3.0, 40.0)
    };
    let outcomes = run(&scenario, Limiter::None, 3);
    near("p99", outcomes.p99, scenario.deadline, 1e-6);
    near("goodput", outcomes.goodput, 1.0, 0.05);
}

/// What could be answered follows the scenario second by second: the capacity
/// present while overloaded (workers doubling halve the share five permits serve; a
/// slowdown slows the permits and the capacity alike), the arrivals while not.
#[test]
fn goodput_is_a_share_of_what_could_be_answered_second_by_second() {
    let scenario = Scenario {
        load: vec![(0.0, 3.0), (180.0, 0.2)],
        workers: vec![(0.0, 10), (60.0, 20)],
        slowdown: vec![(120.0, 1.5)],
        deadline: 0.1,
        ..steady(10, 3.0, 240.0)
    };
    assert_eq!(scenario.changes(), [60.0, 120.0]);
    // A slowdown from the start is no change.
    let slow_from_start = Scenario {
        slowdown: vec![(0.0, 2.0)],
        ..scenario.clone()
    };
    assert_eq!(slow_from_start.changes(), [60.0]);
    assert_eq!(
        [0.0, 59.9, 60.0, 119.0, 150.0].map(|t| scenario.workers_at(t)),
        [10, 10, 20, 20, 20]
    );
    assert_eq!(
        [0.0, 119.9, 120.0].map(|t| scenario.slowdown_at(t)),
        [1.0, 1.0, 1.5]
    );
    assert_eq!(
        [0.0, 179.9, 180.0].map(|t| scenario.load_at(t)),
        [3.0, 3.0, 0.2]
    );
    let outcomes = run(&scenario, Limiter::Static(5), 4);
    let by_second = &outcomes.goodput_by_second;
    near("before", mean(&by_second[10..60]), 0.5, 0.02);
    near("doubled", mean(&by_second[65..120]), 0.25, 0.01);
    near("slowed", mean(&by_second[125..180]), 0.25, 0.01);
    // 200 a second at 15 ms is 3 erlangs on 5 permits: B(5, 3) = 0.110 are shed.
    near("light", mean(&by_second[185..240]), 0.89, 0.02);
    // The second of each change is the new capacity's from its first millisecond.
    near("second 60", by_second[60], 0.25, 0.05);
}

/// A drift grows the service time linearly, and counts as a change from its start.
#[test]
fn a_drift_slows_the_service_linearly() {
    let scenario = Scenario {
        slowdown: vec![(0.0, 2.0)],
        drift: Some((10.0, 30.0, 3.0)),
        ..steady(4, 0.5, 40.0)
    };
    assert_eq!(scenario.changes(), [10.0]);
    assert_eq!(
        [5.0, 10.0, 20.0, 30.0, 35.0].map(|t| scenario.slowdown_at(t)),
        [2.0, 2.0, 4.0, 6.0, 6.0]
    );
    assert!(!scenario.light(1.0));
    assert!(steady(4, 0.5, 10.0).light(0.5));
    assert!(!steady(4, 0.6, 10.0).light(0.5));
}

/// Arrivals follow the load's steps: a second at 0 has none, a second at twice the
/// rate twice as many.
#[test]
fn arrivals_follow_the_load_steps() {
    let scenario = Scenario {
        load: vec![(0.0, 1.0), (100.0, 0.0), (200.0, 2.0)],
        ..steady(10, 1.0, 300.0)
    };
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(9);
    let (mut t, mut counts) = (0.0, [0u64; 3]);
    loop {
        t = next_arrival(&mut rng, &scenario, 1000.0, t);
        if t >= 300.0 {
            break;
        }
        counts[(t / 100.0) as usize] += 1;
    }
    assert_eq!(counts[1], 0);
    near("first", counts[0] as f64, 100_000.0, 1500.0);
    near("third", counts[2] as f64, 200_000.0, 2000.0);
    let silent = Scenario {
        load: vec![(0.0, 0.0)],
        ..scenario
    };
    assert_eq!(next_arrival(&mut rng, &silent, 1000.0, 0.0), f64::INFINITY);
}

/// Each distribution has the mean asked for, and the spread it names.
#[test]
fn the_service_distributions() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
    let mut moments = |service: Service, draws: usize| {
        let values: Vec<f64> = (0..draws).map(|_| service.draw(&mut rng, 2.0)).collect();
        let m = mean(&values);
        let var = values.iter().map(|v| (v - m).powi(2)).sum::<f64>() / draws as f64;
        (m, var.sqrt() / m)
    };
    let (m, cv) = moments(Service::Exponential, 200_000);
    near("exponential mean", m, 2.0, 0.02);
    near("exponential cv", cv, 1.0, 0.02);
    let (m, cv) = moments(Service::Lognormal { cv: 2.0 }, 400_000);
    near("lognormal mean", m, 2.0, 0.04);
    near("lognormal cv", cv, 2.0, 0.25);
    let (m, _) = moments(Service::Pareto { shape: 2.5 }, 400_000);
    near("pareto mean", m, 2.0, 0.04);
    let mixture = Service::Mixture {
        share: 0.1,
        factor: 25.0,
    };
    let (m, cv) = moments(mixture, 400_000);
    near("mixture mean", m, 2.0, 0.04);
    // A tenth 25 times longer: E[X²] = 2 (0.9 a² + 0.1 (25 a)²), a = 2 / 3.4.
    let a: f64 = 2.0 / 3.4;
    let expected = (2.0 * (0.9 * a * a + 0.1 * 625.0 * a * a) - 4.0).sqrt() / 2.0;
    near("mixture cv", cv, expected, 0.05);
    // Flat, with a timer's jitter: the mean asked for, every draw within the jitter.
    let flat = Service::Constant { jitter: 0.025 };
    let (m, cv) = moments(flat, 100_000);
    near("constant mean", m, 2.0, 0.001);
    assert!(cv < 0.01, "constant cv {cv}");
    let base = 2.0 / 1.0125;
    let draws: Vec<f64> = (0..10_000).map(|_| flat.draw(&mut rng, 2.0)).collect();
    assert!(draws.iter().all(|d| (base..=base * 1.025).contains(d)));
    let draws: Vec<f64> = (0..10_000).map(|_| normal(&mut rng)).collect();
    near("normal mean", mean(&draws), 0.0, 0.03);
}

#[test]
fn the_draws_and_the_percentiles() {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(5);
    let draws: Vec<f64> = (0..100_000).map(|_| exponential(&mut rng, 2.0)).collect();
    assert!(draws.iter().all(|d| *d > 0.0));
    near("mean", mean(&draws), 2.0, 0.02);
    let mut values = [5.0, 1.0, 4.0, 2.0, 3.0];
    assert_eq!(
        [0.0, 0.5, 0.74, 1.0].map(|p| percentile(&mut values, p)),
        [1.0, 3.0, 4.0, 5.0]
    );
    assert_eq!(percentile(&mut [], 0.5), 0.0);
}

/// Bursts: 20 at once every 100 ms against 4 workers of 10 ms (capacity 400/s, 200
/// arrivals/s). Shed at once at 4, each burst loses all but 4: 40/s served; waiting,
/// every request of the burst is served within the burst's 50 ms.
#[test]
fn bursts_arrive_together_and_a_wait_serves_what_shedding_loses() {
    let scenario = Scenario {
        bursts: Some((0.1, 20)),
        ..steady(4, 1.0, 20.0)
    };
    let shed = run(&scenario, Limiter::Static(4), 5);
    assert!(
        (shed.goodput - 0.2).abs() < 0.01,
        "4 of each 20: {}",
        shed.goodput
    );
    assert!((shed.shed - 0.8).abs() < 0.01, "{}", shed.shed);
    let wait = Wait::new(20, 0.1);
    let waited = run_waiting(&scenario, Limiter::Static(4), Some(wait), 5);
    assert!(waited.goodput > 0.99, "{}", waited.goodput);
    assert_eq!(waited.shed, 0.0);
    // Beyond `max_waiting`, shed at once: 4 admitted, 8 waiting, 8 shed.
    let fewer = Wait::new(8, 0.1);
    let some = run_waiting(&scenario, Limiter::Static(4), Some(fewer), 5);
    assert!((some.goodput - 0.6).abs() < 0.01, "{}", some.goodput);
}
