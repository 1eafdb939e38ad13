//! Prints the ratio table from criterion's saved estimates:
//! `cargo run -p admission-bench --bin report` after `cargo bench -p admission-bench`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use admission_bench::report::{Instructions, KEYED_VARIANTS, LAYER_VARIANTS};

fn main() -> ExitCode {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let criterion = target.join("criterion");
    match admission_bench::report::read(&criterion) {
        Ok(medians) if !medians.is_empty() => {
            let cpu = std::fs::read_to_string("/proc/cpuinfo")
                .ok()
                .and_then(|info| {
                    info.lines()
                        .find(|l| l.starts_with("model name"))
                        .and_then(|l| l.split(':').nth(1))
                        .map(|s| s.trim().to_owned())
                })
                .unwrap_or_else(|| "unknown CPU".into());
            let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
            println!("admission-bench: medians and ratios ({cores} cores, {cpu})");
            print!("{}", admission_bench::report::table(&medians));
            // Instruction counts of the layer and of the keyed cycles, where valgrind and
            // the release builds of the loops are here (CI builds them before the report).
            // Their variants' names are distinct: one map serves every target.
            let layer = callgrind(&target, "layer_loop", LAYER_VARIANTS, "per call");
            let keyed = callgrind(&target, "keyed_loop", KEYED_VARIANTS, "per cycle");
            let instructions = match (layer, keyed) {
                (Some(mut layer), Some(keyed)) => {
                    layer.extend(keyed);
                    Some(layer)
                }
                (layer, keyed) => layer.or(keyed),
            };
            // The runs of the targets decided by a median of several (a missing or
            // unreadable one leaves those targets to the last run).
            let runs = admission_bench::report::read_runs(&criterion)
                .map_err(|err| eprintln!("runs not read: {err}"))
                .unwrap_or_default();
            print!(
                "{}",
                admission_bench::report::targets(&medians, instructions.as_ref(), &runs)
            );
            ExitCode::SUCCESS
        }
        Ok(_) => {
            eprintln!(
                "no estimates under {}: run the benches first",
                criterion.display()
            );
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("{err}");
            ExitCode::FAILURE
        }
    }
}

/// Prints the callgrind instructions `per` call of each of `variants` of the release
/// example `example`, and returns them; `None`, saying why, where the example is not built
/// or valgrind cannot run it.
fn callgrind(target: &Path, example: &str, variants: &[&str], per: &str) -> Option<Instructions> {
    let program = target.join("release/examples").join(example);
    if !program.exists() {
        eprintln!(
            "instructions not measured: no {} (cargo build --release -p admission-bench --example {example})",
            program.display()
        );
        return None;
    }
    let counts = admission_bench::report::instructions(&program, variants)
        .map_err(|err| eprintln!("instructions not measured: {err}"))
        .ok()?;
    let group = example.trim_end_matches("_loop");
    println!("\n{group}, callgrind instructions {per} ({example})");
    for (variant, n) in &counts {
        println!("  {variant:<38} {n:>10}");
    }
    Some(counts)
}
