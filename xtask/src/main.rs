//! The workspace's own automation. Run from anywhere in the workspace:
//!
//! - `cargo xtask loom`: the loom models of `admission-core`, built with
//!   `--cfg admission_loom` in release mode with debug assertions, in `target/loom`.
//! - `cargo xtask ci`: runs `.ci/run`, the one definition of what CI checks.
//! - `cargo xtask publish --dry-run`: packages and verifies the published crates
//!   (`admission-core`, `-http`, `-tower`, `-grpc`) and nothing else, each built from its
//!   package alone against the others' packages; without `--dry-run`, publishes them to
//!   crates.io in that order, each after what it depends on.
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
        Some("publish") => match &args[1..] {
            [] => publish(false),
            [flag] if flag == "--dry-run" => publish(true),
            _ => {
                eprintln!("usage: cargo xtask publish [--dry-run]");
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!("usage: cargo xtask <loom [test filter] | ci | publish [--dry-run]>");
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

/// The crates published to crates.io, each after the ones it depends on.
const PUBLISHED: [&str; 5] = [
    "admission-core",
    "admission-http",
    "admission-tower",
    "admission-grpc",
    "admission-redis",
];

fn publish(dry_run: bool) -> Result<(), String> {
    if dry_run {
        // One `cargo package` for the five: cargo packages them in dependency order and
        // verifies each by building it from its `.crate` alone, its dependencies on the
        // others resolved from the packages just made (not from the workspace, not from
        // crates.io, where they are not yet). A target directory of its own, fresh: cargo
        // reuses a stale extraction of a package at the same path (one made by an earlier
        // packaging of the same version, whatever changed since).
        let dir = env::temp_dir().join(format!("admission-publish-{}", std::process::id()));
        let mut cmd = cargo();
        cmd.arg("package").env("CARGO_TARGET_DIR", &dir);
        for krate in PUBLISHED {
            cmd.args(["-p", krate]);
        }
        let result = run("package and verify the published crates", &mut cmd);
        let _ = std::fs::remove_dir_all(&dir);
        return result;
    }
    for krate in PUBLISHED {
        // Cargo waits for each to appear in the index before it returns, so the next one
        // finds it.
        run(
            &format!("publish {krate}"),
            cargo().args(["publish", "-p", krate]),
        )?;
    }
    Ok(())
}

fn ci() -> Result<(), String> {
    // `.ci/run` is the one definition of CI; this runs it, so the two cannot drift.
    let mut cmd = Command::new("bash");
    cmd.arg(".ci/run").current_dir(root());
    run("ci", &mut cmd)
}
