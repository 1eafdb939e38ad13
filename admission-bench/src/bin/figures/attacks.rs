//! Figure 4: the legitimate clients' goodput and p99, quiet and under every connection
//! attack, for `AdmissionLayer::serve` and for `axum::serve` with the layer alone. The
//! run is admission-tower's `attacks` example's own code, included by path.

use std::error::Error;
use std::path::Path;
use std::time::Duration;

use plotters::style::RGBColor;

use crate::plot::{self, BLUE, Bars, ORANGE};
use crate::{Mode, alone, progress};

// The example's run, its attacks, its clients and its h2 frames. The figure reads part of
// what they keep.
#[path = "../../../../admission-tower/examples/attacks/suite.rs"]
#[allow(dead_code)]
mod suite;

use suite::Server;

/// Both servers' runs.
pub(crate) struct Figure {
    runs: Vec<(Server, suite::Compared)>,
}

const SERVERS: [Server; 2] = [Server::Serve, Server::AxumServe];

/// Each server on a runtime of its own: its capacity, then a quiet and an attacked run
/// of `run` each (15 s, or 5 s short: long enough for a zero-window stream's 5 s grace).
pub(crate) fn figure(mode: Mode, out: &Path) -> Result<Figure, Box<dyn Error>> {
    let run = match mode {
        Mode::Full => Duration::from_secs(15),
        Mode::Short => Duration::from_secs(5),
    };
    let mut runs = Vec::new();
    for (i, server) in SERVERS.into_iter().enumerate() {
        progress("connection attacks", i + 1, SERVERS.len());
        runs.push((server, alone(suite::compare(server, true, run, || 0))?));
    }
    let figure = Figure { runs };
    draw(&figure, out)?;
    Ok(figure)
}

fn short(server: Server) -> &'static str {
    match server {
        Server::Serve => "serve",
        Server::AxumServe => "axum::serve",
    }
}

/// The quiet run's bar in a light shade of the server's color, the attacked run's (named
/// "+ attacks", after the server's) in the color itself.
fn shades(server: Server) -> (RGBColor, RGBColor) {
    match server {
        Server::Serve => (RGBColor(158, 202, 225), BLUE),
        Server::AxumServe => (RGBColor(253, 208, 162), ORANGE),
    }
}

fn draw(figure: &Figure, out: &Path) -> Result<(), Box<dyn Error>> {
    let quiet_and_attacked = |pick: &dyn Fn(&suite::load::Outcome) -> f64| {
        figure
            .runs
            .iter()
            .flat_map(|(server, run)| {
                let (light, full) = shades(*server);
                [
                    (short(*server).to_owned(), pick(&run.quiet), light),
                    ("+ attacks".to_owned(), pick(&run.attacked), full),
                ]
            })
            .collect()
    };
    plot::bars(
        &out.join("attacks.svg"),
        &[
            Bars {
                title: "Legitimate goodput, quiet and with the attacks",
                unit: "200 OK a second",
                bars: quiet_and_attacked(&|run| run.goodput),
            },
            Bars {
                title: "Legitimate p99 (from the scheduled time)",
                unit: "milliseconds",
                bars: quiet_and_attacked(&|run| run.p99_ms),
            },
            Bars {
                title: "Permits held past a zero-window stream's allowance",
                unit: "permits, once the attacks open nothing more",
                bars: figure
                    .runs
                    .iter()
                    .map(|(server, run)| {
                        (
                            short(*server).to_owned(),
                            run.held_past_allowance as f64,
                            shades(*server).1,
                        )
                    })
                    .collect(),
            },
        ],
    )
}

/// The claims the figure makes, checked on its data: under both servers the attacked
/// goodput is at least 95% of the quiet one, p99 at most 1.5x, and no permit is held past
/// a zero-window stream's allowance (the layer's own body keeps the send rate); under
/// `serve` every connection bound held too (its zero-window streams reset), while under
/// `axum::serve` they stay open, holding nothing (what `serve` adds).
pub(crate) fn check(figure: &Figure) -> Vec<Result<String, String>> {
    let mut checks = Vec::new();
    for (server, run) in &figure.runs {
        let goodput = run.attacked.goodput / run.quiet.goodput;
        let p99 = run.attacked.p99_ms / run.quiet.p99_ms;
        let line = format!(
            "{} under attack: goodput {:.1}% of quiet, p99 {p99:.2}x, {} permits held past their allowance, {} zero-window streams open past it",
            server.name(),
            100.0 * goodput,
            run.held_past_allowance,
            run.seen.held_past_reset()
        );
        let kept = goodput >= 0.95 && p99 <= 1.5 && run.held_past_allowance == 0;
        let met = match server {
            Server::Serve => kept && run.seen.wrong().is_none(),
            Server::AxumServe => kept && run.seen.held_past_reset() > 0,
        };
        checks.push(if met { Ok(line) } else { Err(line) });
    }
    checks
}
