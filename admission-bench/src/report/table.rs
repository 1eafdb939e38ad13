//! The medians as tables: ratios to ours and to the floor, and the scaling table.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::Medians;

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
