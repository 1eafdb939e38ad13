//! Reads criterion's saved estimates and prints medians and ratios, group by group.
//!
//! In each group (and, in `contended`, each of its `count_`, `bytes_` and `keyed_`
//! families) the row named `admission` (or `…_admission`) is ours and the row ending in
//! `floor` is the floor; every row shows its ratio to both. The targets of the bench
//! issue are checked at the end against ratios measured in the same run. The `scaling`
//! group has a table of its own: each bench across thread counts.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
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

fn family(group: &str, bench: &str) -> String {
    if group == "contended" {
        bench.split('_').next().unwrap_or(bench).to_owned()
    } else {
        String::new()
    }
}

/// The table: one block per group (family), medians and ratios.
pub fn table(medians: &Medians) -> String {
    let mut out = String::new();
    for (group, benches) in medians {
        if group == "scaling" {
            out.push_str(&scaling(benches));
            continue;
        }
        let mut families: BTreeMap<String, Vec<(&String, f64)>> = BTreeMap::new();
        for (bench, &ns) in benches {
            families
                .entry(family(group, bench))
                .or_default()
                .push((bench, ns));
        }
        for (fam, rows) in families {
            let title = if fam.is_empty() {
                group.clone()
            } else {
                format!("{group} / {fam}")
            };
            let ours = rows
                .iter()
                .find(|(b, _)| b.as_str() == "admission" || b.ends_with("_admission"))
                .map(|&(_, ns)| ns);
            let floor = rows
                .iter()
                .find(|(b, _)| b.ends_with("floor"))
                .map(|&(_, ns)| ns);
            let _ = writeln!(out, "\n{title}");
            let _ = writeln!(
                out,
                "  {:<38} {:>10} {:>9} {:>12}",
                "bench", "median", "x floor", "x admission"
            );
            for (bench, ns) in rows {
                let vs_floor = floor.map_or("-".into(), |f| format!("{:.2}", ns / f));
                let vs_ours = ours.map_or("-".into(), |o| format!("{:.2}", ns / o));
                let _ = writeln!(
                    out,
                    "  {bench:<38} {:>8.1}ns {vs_floor:>9} {vs_ours:>12}",
                    ns
                );
            }
        }
    }
    out
}

/// The `scaling` group: each bench (`<name>_t<threads>`) as a row, its median at each
/// thread count, and how much dearer one cycle is at the most threads than at one.
fn scaling(benches: &BTreeMap<String, f64>) -> String {
    let mut rows: BTreeMap<&str, BTreeMap<u64, f64>> = BTreeMap::new();
    for (bench, &ns) in benches {
        let parsed = bench
            .rsplit_once("_t")
            .and_then(|(name, n)| Some((name, n.parse::<u64>().ok()?)));
        if let Some((name, threads)) = parsed {
            rows.entry(name).or_default().insert(threads, ns);
        }
    }
    let counts: BTreeSet<u64> = rows.values().flat_map(|r| r.keys().copied()).collect();
    let mut out =
        String::from("\nscaling (one acquire-release cycle, slowest thread, by threads at once)\n");
    let _ = write!(out, "  {:<38}", "bench");
    for n in &counts {
        let _ = write!(out, " {:>10}", format!("{n} thr"));
    }
    let _ = writeln!(out, " {:>9}", "x 1 thr");
    for (name, by_threads) in rows {
        let _ = write!(out, "  {name:<38}");
        for n in &counts {
            match by_threads.get(n) {
                Some(ns) => {
                    let _ = write!(out, " {ns:>8.1}ns");
                }
                None => {
                    let _ = write!(out, " {:>10}", "-");
                }
            }
        }
        let growth = match (by_threads.first_key_value(), by_threads.last_key_value()) {
            (Some((1, one)), Some((&most, ns))) if most > 1 => format!("{:.2}", ns / one),
            _ => "-".into(),
        };
        let _ = writeln!(out, " {growth:>9}");
    }
    out
}

/// A target: `left / right` compared with `bound`.
struct Target {
    what: &'static str,
    left: (&'static str, &'static str),
    right: (&'static str, &'static str),
    at_most: f64,
}

const TARGETS: &[Target] = &[
    Target {
        what: "count permit within 1.5x of the floor",
        left: ("count", "admission"),
        right: ("count", "floor"),
        at_most: 1.5,
    },
    Target {
        what: "count permit 2x cheaper than tokio's owned permit",
        left: ("count", "admission"),
        right: ("count", "tokio_try_acquire_owned"),
        at_most: 0.5,
    },
    Target {
        what: "byte permit within 1.5x of the floor",
        left: ("bytes", "admission"),
        right: ("bytes", "floor"),
        at_most: 1.5,
    },
    Target {
        what: "byte permit 2x cheaper than tokio's owned many-permit",
        left: ("bytes", "admission"),
        right: ("bytes", "tokio_try_acquire_many_owned"),
        at_most: 0.5,
    },
    Target {
        what: "keyed (existing key) 2x cheaper than DashMap + semaphore",
        left: ("keyed", "admission"),
        right: ("keyed", "dashmap_semaphore"),
        at_most: 0.5,
    },
    Target {
        what: "contended count 2x cheaper than tokio's owned permit",
        left: ("contended", "count_admission"),
        right: ("contended", "count_tokio_try_acquire_owned"),
        at_most: 0.5,
    },
    Target {
        what: "contended bytes 2x cheaper than tokio's owned many-permit",
        left: ("contended", "bytes_admission"),
        right: ("contended", "bytes_tokio_try_acquire_many_owned"),
        at_most: 0.5,
    },
    Target {
        what: "contended keyed 2x cheaper than DashMap + semaphore",
        left: ("contended", "keyed_admission"),
        right: ("contended", "keyed_dashmap_semaphore"),
        at_most: 0.5,
    },
    Target {
        what: "layer no dearer than LoadShed + ConcurrencyLimit",
        left: ("layer", "admission"),
        right: ("layer", "load_shed_concurrency_limit"),
        at_most: 1.0,
    },
    Target {
        what: "layer, every limit disabled, within 1.2x of the bare service",
        left: ("layer", "disabled"),
        right: ("layer", "bare"),
        at_most: 1.2,
    },
];

/// What recording an adaptive limit's sample adds to a request, in nanoseconds (the
/// sampled permit less the plain one, measured in the same run), beyond the clock reads.
const ADAPTIVE_ADDED_NS: f64 = 25.0;

/// The targets, each with its measured ratio and MET / MISSED (or not measured).
pub fn targets(medians: &Medians) -> String {
    let get = |(g, b): (&str, &str)| medians.get(g).and_then(|m| m.get(b)).copied();
    let mut out = String::from("\ntargets (ratio of medians in this run)\n");
    for t in TARGETS {
        let line = match (get(t.left), get(t.right)) {
            (Some(l), Some(r)) => {
                let ratio = l / r;
                let verdict = if ratio <= t.at_most { "MET" } else { "MISSED" };
                format!(
                    "  {:<6} {:<58} {ratio:.2} (want <= {:.2})",
                    verdict, t.what, t.at_most
                )
            }
            _ => format!("  {:<6} {}", "n/a", t.what),
        };
        let _ = writeln!(out, "{line}");
    }
    let adaptive = |bench| get(("adaptive", bench));
    if let (Some(sampled), Some(plain)) = (adaptive("sampled"), adaptive("admission")) {
        let added = sampled - plain;
        let verdict = if added <= ADAPTIVE_ADDED_NS {
            "MET"
        } else {
            "MISSED"
        };
        let clock =
            adaptive("two_clock_reads").map_or("not measured".into(), |c| format!("{c:.1} ns"));
        let contended = match (
            adaptive("contended_sampled"),
            adaptive("contended_admission"),
        ) {
            (Some(s), Some(p)) => format!("{:.1} ns", s - p),
            _ => "not measured".into(),
        };
        let _ = writeln!(
            out,
            "  {verdict:<6} {:<58} {added:.1} ns (want <= {ADAPTIVE_ADDED_NS:.0} ns; plus the two clock reads, {clock}; with two threads on one ledger: {contended})",
            "adaptive sample's added cost per request"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_rows_gather_thread_counts_and_growth() {
        let mut medians = Medians::new();
        let scaling = medians.entry("scaling".into()).or_default();
        scaling.insert("count_admission_t1".into(), 10.0);
        scaling.insert("count_admission_t2".into(), 25.0);
        scaling.insert("keyed_admission_t1".into(), 40.0);
        let table = table(&medians);
        let row = |name: &str| {
            table
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no row {name} in\n{table}"))
                .split_whitespace()
                .skip(1)
                .collect::<Vec<_>>()
        };
        assert_eq!(row("count_admission"), ["10.0ns", "25.0ns", "2.50"]);
        // Measured at one thread count only: no growth to show.
        assert_eq!(row("keyed_admission"), ["40.0ns", "-", "-"]);
        assert!(table.contains("1 thr") && table.contains("2 thr"));
    }
}
