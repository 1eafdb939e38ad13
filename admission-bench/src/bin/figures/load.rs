//! Goodput and p99 latency against offered load (0.5x to 5x of the measured capacity),
//! and capacity served under bursts, for the four servers of `real`.

use std::collections::BTreeMap;
use std::error::Error;
use std::path::Path;
use std::time::Duration;

use plotters::chart::SeriesLabelPosition;

use crate::plot::{self, Bars, Line, Panel};
use crate::real::{self, Run, Schedule, Server};
use crate::{Mode, alone, progress};

/// Offered load, as multiples of the measured capacity.
fn loads(mode: Mode) -> &'static [f64] {
    match mode {
        Mode::Full => &[0.5, 0.8, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0],
        Mode::Short => &[0.5, 2.0, 5.0],
    }
}

fn seconds(mode: Mode) -> (Duration, Duration) {
    match mode {
        Mode::Full => (Duration::from_millis(500), Duration::from_secs(3)),
        Mode::Short => (Duration::from_millis(300), Duration::from_millis(1_200)),
    }
}

/// What the figures and their checks need.
pub(crate) struct Figure {
    pub(crate) capacity: f64,
    /// By server, the runs at each offered load.
    pub(crate) by_load: BTreeMap<&'static str, Vec<(f64, Run)>>,
    /// By server, the run under bursts.
    pub(crate) bursts: Vec<(Server, Run)>,
}

pub(crate) fn figure(mode: Mode, out: &Path) -> Result<Figure, Box<dyn Error>> {
    let capacity = alone(real::capacity())?;
    let (warmup, measured) = seconds(mode);
    let total = Server::ALL.len() * (loads(mode).len() + 1);
    let mut done = 0;
    let mut by_load: BTreeMap<&'static str, Vec<(f64, Run)>> = BTreeMap::new();
    for server in Server::ALL {
        for &load in loads(mode) {
            done += 1;
            progress("offered load (real server)", done, total);
            let schedule = Schedule::even(load * capacity);
            let run = alone(real::run(server, schedule, warmup, measured))?;
            by_load.entry(server.name()).or_default().push((load, run));
        }
    }
    let mut bursts = Vec::new();
    for server in Server::ALL {
        done += 1;
        progress("offered load (real server)", done, total);
        // 100 at once every 50 ms: twice the capacity of 10 workers at 10 ms.
        let schedule = Schedule {
            every: Duration::from_millis(50),
            count: 100,
        };
        bursts.push((
            server,
            alone(real::run(server, schedule, warmup, measured))?,
        ));
    }
    let figure = Figure {
        capacity,
        by_load,
        bursts,
    };
    draw(&figure, out)?;
    Ok(figure)
}

fn draw(figure: &Figure, out: &Path) -> Result<(), Box<dyn Error>> {
    let line = |server: Server, pick: &dyn Fn(&Run) -> f64| Line {
        name: server.name().to_owned(),
        points: figure.by_load[server.name()]
            .iter()
            .map(|(load, run)| (*load, pick(run)))
            .collect(),
        color: server.color(),
        reference: false,
    };
    let most = loads_of(figure).fold(0.0, f64::max);
    plot::panels(
        &out.join("goodput-and-latency.svg"),
        &[
            Panel {
                title: "Goodput against offered load (a real server on loopback, 10 workers of 10 ms)",
                x: ("offered load, x capacity", 0.0..most + 0.2),
                y: ("% of what could be answered in time", 0.0..110.0),
                lines: Server::ALL
                    .iter()
                    .map(|&s| line(s, &|run| 100.0 * run.goodput))
                    .collect(),
                legend: SeriesLabelPosition::LowerLeft,
                log_y: false,
                markers: true,
            },
            Panel {
                title: "p99 latency from each request's scheduled time (clients give up at 1 s)",
                x: ("offered load, x capacity", 0.0..most + 0.2),
                y: ("milliseconds (log scale)", 5.0..2_000.0),
                lines: Server::ALL
                    .iter()
                    .map(|&s| line(s, &|run| (1e3 * run.p99).max(5.0)))
                    .collect(),
                legend: SeriesLabelPosition::MiddleRight,
                log_y: true,
                markers: true,
            },
        ],
    )?;
    plot::bars(
        &out.join("bursts.svg"),
        &[
            Bars {
                title: "Capacity served under bursts of 100 every 50 ms",
                unit: "goodput, % of capacity",
                bars: figure
                    .bursts
                    .iter()
                    .map(|(s, run)| {
                        (
                            s.short().to_owned(),
                            100.0 * run.goodput.min(1.1),
                            s.color(),
                        )
                    })
                    .collect(),
            },
            Bars {
                title: "p99 latency, from the scheduled time",
                unit: "milliseconds",
                bars: figure
                    .bursts
                    .iter()
                    .map(|(s, run)| (s.short().to_owned(), 1e3 * run.p99, s.color()))
                    .collect(),
            },
        ],
    )?;
    Ok(())
}

fn loads_of(figure: &Figure) -> impl Iterator<Item = f64> + '_ {
    figure.by_load.values().flatten().map(|(load, _)| *load)
}

/// The claims the figures make, checked on their data: at the highest offered load this
/// layer answers at least 80% of capacity with a p99 under 250 ms while no limit's p99
/// reaches the give-up time; under bursts the wait serves at least 1.5x what shedding
/// at once does.
pub(crate) fn check(figure: &Figure) -> Vec<Result<String, String>> {
    let at_most = |server: Server| {
        figure.by_load[server.name()]
            .iter()
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(load, run)| (*load, *run))
            .expect("runs")
    };
    let (load, shed) = at_most(Server::Shed);
    let (_, none) = at_most(Server::NoLimit);
    let overload = format!(
        "offered {load}x of {:.0}/s: this layer answers {:.0}% at p99 {:.0} ms; no limit {:.0}% at p99 {:.0} ms",
        figure.capacity,
        100.0 * shed.goodput,
        1e3 * shed.p99,
        100.0 * none.goodput,
        1e3 * none.p99
    );
    let bursts = |server: Server| {
        figure
            .bursts
            .iter()
            .find(|(s, _)| *s == server)
            .map(|(_, run)| run.goodput)
            .unwrap_or(0.0)
    };
    let (wait, shedding) = (bursts(Server::Wait), bursts(Server::Shed));
    let burst = format!(
        "bursts on a real server: the wait serves {:.0}% of capacity, shedding at once {:.0}%",
        100.0 * wait,
        100.0 * shedding
    );
    vec![
        if shed.goodput >= 0.8 && shed.p99 < 0.25 && none.p99 >= 0.9 {
            Ok(overload)
        } else {
            Err(overload)
        },
        if wait >= 1.5 * shedding {
            Ok(burst)
        } else {
            Err(burst)
        },
    ]
}
