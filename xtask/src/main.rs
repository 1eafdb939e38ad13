//! The workspace's own automation. Run from anywhere in the workspace:
//!
//! - `cargo xtask loom`: the loom models of `admission-core`, built with
//!   `--cfg admission_loom` in release mode with debug assertions, in `target/loom`.
//! - `cargo xtask ci`: runs `.ci/run`, the one definition of what CI checks.
//!
//! Keep this crate free of dependencies: it is compiled on every call.

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("loom") => loom(&args[1..]),
        Some("ci") => ci(),
        _ => {
            eprintln!("usage: cargo xtask <loom [test filter] | ci>");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err}");
            ExitCode::FAILURE
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one folder below the workspace root")
        .to_path_buf()
}

fn cargo() -> Command {
    let mut cmd = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

fn run(what: &str, cmd: &mut Command) -> Result<(), String> {
    println!("==> {what}");
    let start = Instant::now();
    let status = cmd
        .status()
        .map_err(|err| format!("{what}: could not start: {err}"))?;
    println!("<== {what}: {:.1}s", start.elapsed().as_secs_f64());
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

fn loom(filter: &[String]) -> Result<(), String> {
    let mut cmd = cargo();
    cmd.args(["test", "--release", "-p", "admission-core", "--lib"])
        .args(["--target-dir", "target/loom"])
        .arg("--")
        .args(filter)
        .env(
            "RUSTFLAGS",
            "--cfg admission_loom -C debug-assertions -C overflow-checks",
        )
        .env(
            "LOOM_MAX_PREEMPTIONS",
            env::var("LOOM_MAX_PREEMPTIONS").unwrap_or_else(|_| "3".into()),
        );
    run("loom models", &mut cmd)
}

fn ci() -> Result<(), String> {
    // `.ci/run` is the one definition of CI; this runs it, so the two cannot drift.
    let mut cmd = Command::new("bash");
    cmd.arg(".ci/run").current_dir(root());
    run("ci", &mut cmd)
}
