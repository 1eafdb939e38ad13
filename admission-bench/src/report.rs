//! Reads criterion's saved estimates and prints medians and ratios, group by group.
//!
//! In each group (and, in `contended`, each of its `count_`, `bytes_` and `keyed_`
//! families) the row named `admission` (or `…_admission`) is ours and the row ending in
//! `floor` is the floor; every row shows its ratio to both. The targets of the bench
//! issue are checked at the end against ratios measured in the same run.

use std::collections::BTreeMap;
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
