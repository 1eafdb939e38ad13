//! Draws the figures of the README and the bench README as SVG, from runs it makes
//! itself, and checks that each figure's data has the shape its claim needs.
//!
//! `cargo run --release -p admission-bench --bin figures` writes `docs/figures/`;
//! `-- --short` (CI) runs fewer seeds, writes to `target/figures/` and checks the same
//! claims; `-- --only adaptive|load|attacks` draws one group. Both exit non-zero if a claim fails. A progress line goes to stderr.
//! `-- --real-adaptive-loop N` runs only the adaptive figure's real server, `N` times
//! (default 200), and prints the spread of each phase's settled mean (not in CI).

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

mod adaptive;
mod attacks;
mod load;
mod plot;
mod real;

/// How much a run does.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Every figure from six seeds, written to `docs/figures/`.
    Full,
    /// Two seeds, written to `target/figures/`: CI's check.
    Short,
}

impl Mode {
    fn seeds(self) -> u64 {
        match self {
            Mode::Full => 6,
            Mode::Short => 2,
        }
    }
}

/// Says on stderr which figure runs and how far along it is.
pub(crate) fn progress(figure: &str, done: usize, total: usize) {
    eprintln!("figures: {figure}: run {done} of {total}");
}

/// Runs `run` on a runtime of its own, dropped after it with whatever it left behind (an
/// unlimited server's backlog), so that no run shares the machine with the one before.
pub(crate) fn alone<T>(run: impl Future<Output = T>) -> Result<T, Box<dyn Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let out = runtime.block_on(run);
    runtime.shutdown_background();
    Ok(out)
}

fn main() -> ExitCode {
    let started = Instant::now();
    if let Some(at) = std::env::args().position(|a| a == "--real-adaptive-loop") {
        let runs = std::env::args()
            .nth(at + 1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(200);
        return match adaptive::real_loop(runs) {
            Ok(0) => ExitCode::SUCCESS,
            Ok(_) => ExitCode::FAILURE,
            Err(err) => {
                eprintln!("figures: {err}");
                ExitCode::FAILURE
            }
        };
    }
    let mode = if std::env::args().any(|a| a == "--short") {
        Mode::Short
    } else {
        Mode::Full
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = match mode {
        Mode::Full => root.join("docs/figures"),
        Mode::Short => root.join("target/figures"),
    };
    if let Err(err) = std::fs::create_dir_all(&out) {
        eprintln!("figures: cannot make {}: {err}", out.display());
        return ExitCode::FAILURE;
    }
    // `--only NAME` draws one figure group: adaptive, load or attacks.
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1));
    let wanted = |name: &str| only.is_none_or(|only| only == name);
    let mut checks = Vec::new();
    if wanted("adaptive") {
        match adaptive::figure(mode, &out) {
            Ok(figure) => checks.extend(adaptive::check(&figure)),
            Err(err) => checks.push(Err(format!("adaptive limit: {err}"))),
        }
    }
    if wanted("load") {
        match load::figure(mode, &out) {
            Ok(figure) => checks.extend(load::check(&figure)),
            Err(err) => checks.push(Err(format!("offered load: {err}"))),
        }
    }
    if wanted("attacks") {
        match attacks::figure(mode, &out) {
            Ok(figure) => checks.extend(attacks::check(&figure)),
            Err(err) => checks.push(Err(format!("connection attacks: {err}"))),
        }
    }
    if checks.is_empty() {
        eprintln!("figures: --only takes adaptive, load or attacks");
        return ExitCode::FAILURE;
    }
    println!(
        "figures in {} ({:.0} s)",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    let mut failed = false;
    for check in checks {
        match check {
            Ok(line) => println!("  MET    {line}"),
            Err(line) => {
                println!("  FAILED {line}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
