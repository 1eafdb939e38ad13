//! Prints the ratio table from criterion's saved estimates:
//! `cargo run -p admission-bench --bin report` after `cargo bench -p admission-bench`.

use std::path::PathBuf;
use std::process::ExitCode;

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
            // Instruction counts of the layer, where valgrind and the release build of
            // `layer_loop` are here (CI builds it before the report).
            let layer_loop = target.join("release/examples/layer_loop");
            let instructions = if layer_loop.exists() {
                admission_bench::report::instructions(
                    &layer_loop,
                    admission_bench::report::LAYER_VARIANTS,
                )
                .map_err(|err| eprintln!("instructions not measured: {err}"))
                .ok()
            } else {
                eprintln!(
                    "instructions not measured: no {} (cargo build --release -p admission-bench --example layer_loop)",
                    layer_loop.display()
                );
                None
            };
            if let Some(counts) = &instructions {
                println!("\nlayer, callgrind instructions per call (layer_loop)");
                for (variant, n) in counts {
                    println!("  {variant:<38} {n:>10}");
                }
            }
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
