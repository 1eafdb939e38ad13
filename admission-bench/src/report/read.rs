//! Criterion's saved estimates, read into medians by group and bench.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// Medians in nanoseconds, by group and bench.
pub type Medians = BTreeMap<String, BTreeMap<String, f64>>;

/// Reads `<criterion>/<group>/<bench>/new/estimates.json` for every bench present.
///
/// # Errors
///
/// A message naming the file that could not be read or parsed.
pub fn read(criterion: &Path) -> Result<Medians, String> {
    let mut medians = Medians::new();
    let groups = fs::read_dir(criterion).map_err(|e| {
        format!(
            "{}: {e} (run `cargo bench -p admission-bench` first)",
            criterion.display()
        )
    })?;
    for group in groups.flatten().filter(|e| e.path().is_dir()) {
        let group_name = group.file_name().to_string_lossy().into_owned();
        if group_name == "report" {
            continue;
        }
        for bench in fs::read_dir(group.path()).into_iter().flatten().flatten() {
            let file = bench.path().join("new").join("estimates.json");
            let Ok(text) = fs::read_to_string(&file) else {
                continue;
            };
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
            let median = json["median"]["point_estimate"]
                .as_f64()
                .ok_or_else(|| format!("{}: no median.point_estimate", file.display()))?;
            medians
                .entry(group_name.clone())
                .or_default()
                .insert(bench.file_name().to_string_lossy().into_owned(), median);
        }
    }
    Ok(medians)
}

/// Medians by run: criterion's `base` (the plain run) and every baseline saved under a
/// name beginning with `run` (`--save-baseline run2`, ...), for the targets decided by
/// the median of several runs.
pub type Runs = BTreeMap<String, Medians>;

/// Reads every run of every bench present (see [`Runs`]).
///
/// # Errors
///
/// As [`read`].
pub fn read_runs(criterion: &Path) -> Result<Runs, String> {
    let mut runs = Runs::new();
    let groups = fs::read_dir(criterion).map_err(|e| format!("{}: {e}", criterion.display()))?;
    for group in groups.flatten().filter(|e| e.path().is_dir()) {
        let group_name = group.file_name().to_string_lossy().into_owned();
        for bench in fs::read_dir(group.path()).into_iter().flatten().flatten() {
            for run in fs::read_dir(bench.path()).into_iter().flatten().flatten() {
                let run_name = run.file_name().to_string_lossy().into_owned();
                if run_name != "base" && !run_name.starts_with("run") {
                    continue;
                }
                let file = run.path().join("estimates.json");
                let Ok(text) = fs::read_to_string(&file) else {
                    continue;
                };
                let json: serde_json::Value =
                    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
                if let Some(median) = json["median"]["point_estimate"].as_f64() {
                    runs.entry(run_name)
                        .or_default()
                        .entry(group_name.clone())
                        .or_default()
                        .insert(bench.file_name().to_string_lossy().into_owned(), median);
                }
            }
        }
    }
    Ok(runs)
}
