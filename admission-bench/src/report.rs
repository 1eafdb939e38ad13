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
use std::process::Command;

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

/// A target: `left / right` compared with `at_most`: the ratio of wall-clock medians in
/// this run, or, where the target says so, of callgrind's instructions per call.
struct Target {
    what: &'static str,
    left: (&'static str, &'static str),
    right: (&'static str, &'static str),
    at_most: f64,
    /// The `layer_loop` variants that measure the same two in instructions, printed
    /// beside the wall clock (or deciding, with `by_instructions`).
    instructions: Option<(&'static str, &'static str)>,
    by_instructions: bool,
    /// A floor measured in the same run (the least any design can do), printed as its
    /// own ratio to `right`: how far below the alternative anything can get.
    floor: Option<(&'static str, &'static str)>,
    /// Decided by the median of the ratios of every run (see [`Runs`]): for figures that
    /// swing from one run to the next.
    runs: bool,
    /// A `layer_loop` variant measuring the floor in instructions, printed as its own
    /// ratio to the right-hand variant: what the instruction target is argued from.
    count_floor: Option<&'static str>,
    /// Decided by the difference of instructions per call (at most this many added),
    /// not by a ratio.
    added_at_most: Option<u64>,
}

impl Target {
    /// The same target, with `floor`'s ratio to the alternative printed beside it.
    const fn floor(self, floor: (&'static str, &'static str)) -> Self {
        Self {
            floor: Some(floor),
            ..self
        }
    }

    /// The same target, decided by the median of its ratio over every run.
    const fn median_of_runs(self) -> Self {
        Self { runs: true, ..self }
    }
}

/// How many runs a target decided by their median asks for.
pub const RUNS: usize = 5;

/// A target decided by the wall clock alone.
const fn wall(
    what: &'static str,
    left: (&'static str, &'static str),
    right: (&'static str, &'static str),
    at_most: f64,
) -> Target {
    Target {
        what,
        left,
        right,
        at_most,
        instructions: None,
        by_instructions: false,
        floor: None,
        runs: false,
        count_floor: None,
        added_at_most: None,
    }
}

/// A keyed target at 0.5x, decided by the `keyed_loop` variants' instructions, with the
/// keyed floor's own count printed beside it; the `keyed` group's wall clock beside.
const fn keyed(
    what: &'static str,
    (left, right): (&'static str, &'static str),
    instructions: (&'static str, &'static str),
) -> Target {
    Target {
        what,
        left: ("keyed", left),
        right: ("keyed", right),
        at_most: 0.5,
        instructions: Some(instructions),
        by_instructions: true,
        floor: None,
        runs: false,
        count_floor: Some("keyed_floor"),
        added_at_most: None,
    }
}

const TARGETS: &[Target] = &[
    wall(
        "count permit within 1.5x of the floor",
        ("count", "admission"),
        ("count", "floor"),
        1.5,
    ),
    // By instructions: the wall clock of two operations this short swings with the
    // process (the bare compare-exchange floor itself reads 0.41x of tokio's permit). The
    // floor is printed beside the ratio: what a permit that is not a bare counter is
    // measured against.
    Target {
        what: "count permit 2x cheaper than tokio's owned permit (instructions)",
        left: ("count", "admission"),
        right: ("count", "tokio_try_acquire_owned"),
        at_most: 0.5,
        instructions: Some(("count", "tokio_owned")),
        by_instructions: true,
        floor: None,
        runs: false,
        count_floor: Some("floor"),
        added_at_most: None,
    },
    wall(
        "byte permit within 1.5x of the floor",
        ("bytes", "admission"),
        ("bytes", "floor"),
        1.5,
    ),
    wall(
        "byte permit 2x cheaper than tokio's owned many-permit",
        ("bytes", "admission"),
        ("bytes", "tokio_try_acquire_many_owned"),
        0.5,
    ),
    // The keyed cycles by instructions too: their wall clock swings with the process more
    // than the difference being decided (0.59-0.64 in quiet runs when 0.5 was missed).
    keyed(
        "keyed (existing key) 2x cheaper than DashMap + semaphore",
        ("admission", "dashmap_semaphore"),
        ("existing", "dashmap"),
    )
    .floor(("keyed", "floor")),
    keyed(
        "keyed, a Key from a header, 2x cheaper than DashMap + sem.",
        ("admission_key_header", "dashmap_key_header"),
        ("key_header", "dashmap_key_header"),
    ),
    keyed(
        "keyed, a Key from a peer address, 2x cheaper than DashMap",
        ("admission_key_peer", "dashmap_key_peer"),
        ("key_peer", "dashmap_key_peer"),
    ),
    wall(
        "keyed first-seen key 0.6x of Mutex<HashMap>",
        ("keyed", "admission_first_seen"),
        ("keyed", "mutex_hashmap_first_seen"),
        0.6,
    ),
    wall(
        "contended count 2x cheaper than tokio's owned permit",
        ("contended", "count_admission"),
        ("contended", "count_tokio_try_acquire_owned"),
        0.5,
    ),
    wall(
        "contended bytes 2x cheaper than tokio's owned many-permit",
        ("contended", "bytes_admission"),
        ("contended", "bytes_tokio_try_acquire_many_owned"),
        0.5,
    )
    .median_of_runs(),
    wall(
        "contended keyed 2x cheaper than DashMap + semaphore",
        ("contended", "keyed_admission"),
        ("contended", "keyed_dashmap_semaphore"),
        0.5,
    )
    .floor(("contended", "keyed_floor"))
    .median_of_runs(),
    Target {
        what: "layer 0.9x of LoadShed + ConcurrencyLimit (instructions)",
        left: ("layer", "admission"),
        right: ("layer", "load_shed_concurrency_limit"),
        at_most: 0.9,
        instructions: Some(("ours", "theirs")),
        by_instructions: true,
        floor: None,
        runs: false,
        count_floor: None,
        added_at_most: None,
    },
    // An absolute bound: the bare service's wall clock swings between 20 and 26 ns from
    // one process to the next, more than the difference being decided.
    Target {
        what: "layer turned off within 100 instructions of bare",
        left: ("layer", "disabled"),
        right: ("layer", "bare"),
        at_most: 0.0,
        instructions: Some(("disabled", "bare")),
        by_instructions: true,
        floor: None,
        runs: false,
        count_floor: None,
        added_at_most: Some(100),
    },
];

/// What recording an adaptive limit's sample adds to a request, in nanoseconds (the
/// sampled permit less the plain one, measured in the same run), beyond the clock reads.
const ADAPTIVE_ADDED_NS: f64 = 25.0;

/// Instructions per call, by loop variant.
pub type Instructions = BTreeMap<String, u64>;

/// The `layer_loop` variants the targets compare in instructions: the layer (bare, off,
/// count limit, tower's pair) and the count permit (ours, tokio's owned one, the floor).
pub const LAYER_VARIANTS: &[&str] = &[
    "bare",
    "disabled",
    "ours",
    "theirs",
    "count",
    "tokio_owned",
    "floor",
];

/// The `keyed_loop` variants the keyed targets compare in instructions: the existing and
/// the first-seen key's cycle with `u64` keys, the `Mutex<HashMap>`'s first-seen cycle, the
/// DashMap + semaphore port and the keyed floor; and the layer's path, a `Key` from a
/// header value or a peer address, ours and the port's.
pub const KEYED_VARIANTS: &[&str] = &[
    "existing",
    "first_seen",
    "mutex_first_seen",
    "dashmap",
    "keyed_floor",
    "key_header",
    "dashmap_key_header",
    "key_peer",
    "dashmap_key_peer",
];

/// Instructions per call of each of `variants` of the loop binary at `program`
/// (`layer_loop` or `keyed_loop`, which take a variant and a number of calls), under
/// callgrind: the difference between runs of 200,000 and 100,000 calls, over 100,000 (so
/// start-up and set-up cancel out). Deterministic for one build.
///
/// # Errors
///
/// A message if valgrind cannot be run or its output has no instruction total.
pub fn instructions(program: &Path, variants: &[&str]) -> Result<Instructions, String> {
    instructions_by(Path::new("valgrind"), program, variants)
}

/// [`instructions`], with `valgrind` the program to run.
fn instructions_by(
    valgrind: &Path,
    program: &Path,
    variants: &[&str],
) -> Result<Instructions, String> {
    let total = |variant: &str, calls: u64| -> Result<u64, String> {
        let output = Command::new(valgrind)
            .args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
            .arg(program)
            .args([variant, &calls.to_string()])
            .output()
            .map_err(|e| format!("valgrind: {e}"))?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            return Err(format!("valgrind {variant}: {stderr}"));
        }
        refs(&stderr)
            .ok_or_else(|| format!("valgrind {variant}: no instruction total in\n{stderr}"))
    };
    variants
        .iter()
        .map(|&v| {
            let (more, fewer) = (total(v, 200_000)?, total(v, 100_000)?);
            // A run's set-up can cost more than 100,000 calls where hashing is seeded at
            // random per process (where the keys land moves the work): then this variant
            // is not measured, rather than the report failing.
            let calls = more.checked_sub(fewer).ok_or_else(|| {
                format!("{v}: {more} instructions for 200,000 calls, {fewer} for 100,000")
            })?;
            Ok((v.to_owned(), calls / 100_000))
        })
        .collect()
}

/// The instruction total in callgrind's summary (`==1== I   refs:      38,109,923`).
fn refs(stderr: &str) -> Option<u64> {
    stderr
        .lines()
        .find_map(|line| line.split_once("refs:").map(|(_, n)| n.replace(',', "")))
        .and_then(|n| n.trim().parse().ok())
}

/// The targets, each with its measured ratio and MET / MISSED (or not measured). Those
/// with instruction counts show them beside the wall clock; `instructions` is `None`
/// where callgrind could not be run. Those decided by the median of several runs take
/// it from `runs`, and say how many there were.
pub fn targets(medians: &Medians, instructions: Option<&Instructions>, runs: &Runs) -> String {
    let get = |(g, b): (&str, &str)| medians.get(g).and_then(|m| m.get(b)).copied();
    let count = |v: &str| instructions.and_then(|i| i.get(v)).copied();
    let mut out = String::from(
        "\ntargets (ratio of medians in this run; of instructions per call where so marked)\n",
    );
    for t in TARGETS {
        let mut ratios: Vec<f64> = runs
            .values()
            .filter(|_| t.runs)
            .filter_map(|run| {
                let get = |(g, b): (&str, &str)| run.get(g).and_then(|m| m.get(b)).copied();
                get(t.left).zip(get(t.right)).map(|(l, r)| l / r)
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        let wall = match ratios.len() {
            0 => get(t.left).zip(get(t.right)).map(|(l, r)| l / r),
            n => Some((ratios[(n - 1) / 2] + ratios[n / 2]) / 2.0),
        };
        let counted = t.instructions.map(|(l, r)| {
            count(l)
                .zip(count(r))
                .map(|(l, r)| (l, r, l as f64 / r as f64))
        });
        let decisive = if t.by_instructions {
            counted.flatten().map(|(.., ratio)| ratio)
        } else {
            wall
        };
        let added = t
            .added_at_most
            .zip(counted.flatten())
            .map(|(most, (l, r, _))| (most, l.saturating_sub(r)));
        let mut line = match (t.added_at_most, added, decisive) {
            (Some(_), Some((most, added)), _) => {
                let verdict = if added <= most { "MET" } else { "MISSED" };
                format!("  {verdict:<6} {:<58} {added} (want <= {most}", t.what)
            }
            (Some(_), None, _) | (None, _, None) => {
                format!("  {:<6} {:<58} (not measured", "n/a", t.what)
            }
            (None, _, Some(ratio)) => {
                let verdict = if ratio <= t.at_most { "MET" } else { "MISSED" };
                format!(
                    "  {verdict:<6} {:<58} {ratio:.2} (want <= {:.2}",
                    t.what, t.at_most
                )
            }
        };
        match counted {
            Some(Some((l, r, ratio))) if !t.by_instructions => {
                let _ = write!(line, "; instructions {l}/{r} = {ratio:.2}");
            }
            Some(Some((l, r, _))) => {
                let _ = write!(line, "; instructions {l}/{r}");
            }
            Some(None) => line.push_str("; instructions not measured"),
            None => {}
        }
        if let (true, Some(wall)) = (t.by_instructions, wall) {
            let _ = write!(line, "; wall clock {wall:.2}");
        }
        if t.runs {
            let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
            let _ = match ratios.len() {
                0 | 1 => write!(line, "; one run, of the {RUNS} the target asks for"),
                n if n < RUNS => write!(
                    line,
                    "; median of {n} runs, of the {RUNS} the target asks for: {}",
                    each.join(" ")
                ),
                n => write!(line, "; median of {n} runs: {}", each.join(" ")),
            };
        }
        if let Some(floor) = t.floor.and_then(|f| get(f).zip(get(t.right))) {
            let _ = write!(line, "; the floor {:.2}", floor.0 / floor.1);
        }
        let right = t.instructions.and_then(|(_, r)| count(r));
        if let Some((floor, right)) = t.count_floor.and_then(count).zip(right) {
            let _ = write!(
                line,
                "; the floor {floor}/{right} = {:.2}",
                floor as f64 / right as f64
            );
        }
        line.push(')');
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

    /// Medians of one group.
    fn group(name: &str, benches: &[(&str, f64)]) -> Medians {
        let benches = benches.iter().map(|&(b, ns)| (b.to_owned(), ns)).collect();
        Medians::from([(name.to_owned(), benches)])
    }

    /// The cells of `bench`'s row in `text` (after its name), joined by spaces.
    fn row(text: &str, bench: &str) -> String {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("{bench} ")))
            .unwrap_or_else(|| panic!("no row {bench} in\n{text}"))
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn scaling_rows_gather_thread_counts_and_growth() {
        let medians = group(
            "scaling",
            &[
                ("count_admission_t1", 10.0),
                ("count_admission_t2", 25.0),
                ("keyed_admission_t1", 40.0),
            ],
        );
        let table = table(&medians);
        assert_eq!(row(&table, "count_admission"), "10.0ns 25.0ns 2.50");
        // Measured at one thread count only: no growth to show.
        assert_eq!(row(&table, "keyed_admission"), "40.0ns - -");
        assert!(table.contains("1 thr") && table.contains("2 thr"));
    }

    /// A directory of its own under the system's temporary one, emptied.
    fn scratch(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("admission-report-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn estimate(dir: &Path, path: &str, json: &str) {
        let file = dir.join(path).join("estimates.json");
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        fs::write(file, json).unwrap();
    }

    #[test]
    fn criterions_medians_are_read_by_group_bench_and_run() {
        let dir = scratch("read");
        let median = |ns: f64| format!(r#"{{"median": {{"point_estimate": {ns}}}}}"#);
        estimate(&dir, "layer/bare/new", &median(27.0));
        estimate(&dir, "layer/bare/base", &median(27.0));
        estimate(&dir, "layer/bare/run2", &median(28.5));
        // A baseline not named for a run, criterion's own report, a bench without an
        // estimate: none is read.
        estimate(&dir, "layer/bare/before-change", &median(99.0));
        estimate(&dir, "report/bare/new", &median(99.0));
        fs::create_dir_all(dir.join("layer/unfinished")).unwrap();
        let medians = read(&dir).unwrap();
        assert_eq!(medians, group("layer", &[("bare", 27.0)]));
        let runs = read_runs(&dir).unwrap();
        let expected: Runs = [
            ("base".to_owned(), group("layer", &[("bare", 27.0)])),
            ("run2".to_owned(), group("layer", &[("bare", 28.5)])),
        ]
        .into();
        assert_eq!(runs, expected);
        // A file that does not parse, or a missing directory, is an error naming it.
        estimate(&dir, "layer/broken/new", "{");
        let error = read(&dir).unwrap_err();
        assert!(error.contains("broken"), "{error}");
        let error = read(&dir.join("absent")).unwrap_err();
        assert!(error.contains("run `cargo bench"), "{error}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn each_group_and_family_is_a_block_of_ratios_to_ours_and_the_floor() {
        let mut medians = group(
            "contended",
            &[
                ("count_admission", 10.0),
                ("count_floor", 5.0),
                ("count_tokio_try_acquire_owned", 20.0),
                ("keyed_admission", 30.0),
                ("keyed_dashmap_semaphore", 45.0),
            ],
        );
        medians.extend(group(
            "count",
            &[("admission", 8.0), ("floor", 4.0), ("mutex", 24.0)],
        ));
        let table = table(&medians);
        let block = |title: &str| {
            let start = table
                .find(&format!("\n{title}\n"))
                .unwrap_or_else(|| panic!("no block {title} in\n{table}"));
            let rest = &table[start + title.len() + 2..];
            rest[..rest.find("\n\n").unwrap_or(rest.len())].to_owned()
        };
        let count = block("contended / count");
        assert_eq!(
            row(&count, "count_tokio_try_acquire_owned"),
            "20.0ns 4.00 2.00"
        );
        assert!(!count.contains("keyed"), "{count}");
        let keyed = block("contended / keyed");
        assert_eq!(row(&keyed, "keyed_dashmap_semaphore"), "45.0ns - 1.50");
        assert_eq!(row(&block("count"), "mutex"), "24.0ns 6.00 3.00");
    }

    #[cfg(unix)]
    #[test]
    fn instructions_per_call_are_the_difference_of_two_runs() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("valgrind");
        // A stand-in for valgrind: 3 instructions a call and 1000 to start, as callgrind
        // would report them; the variant `fails` fails.
        let fake = dir.join("valgrind");
        fs::write(
            &fake,
            "#!/bin/sh\n[ \"$4\" = fails ] && { echo broken >&2; exit 1; }\n\
             echo \"==1== I   refs:      $(( $5 * 3 + 1000 ))\" >&2\n",
        )
        .unwrap();
        fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();
        let counts = instructions_by(&fake, Path::new("layer_loop"), &["ours"]).unwrap();
        assert_eq!(counts, Instructions::from([("ours".to_owned(), 3)]));
        let error = instructions_by(&fake, Path::new("layer_loop"), &["fails"]).unwrap_err();
        assert!(error.contains("valgrind fails: broken"), "{error}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_adaptive_samples_cost_is_what_it_adds_to_an_admission() {
        let line = |sampled: f64| {
            let medians = group(
                "adaptive",
                &[
                    ("admission", 20.0),
                    ("sampled", sampled),
                    ("two_clock_reads", 30.0),
                ],
            );
            let text = targets(&medians, None, &Runs::new());
            text.lines()
                .find(|l| l.contains("adaptive sample"))
                .unwrap()
                .to_owned()
        };
        let met = line(24.0);
        assert!(
            met.trim_start().starts_with("MET") && met.contains(" 4.0 ns"),
            "{met}"
        );
        assert!(met.contains("two clock reads, 30.0 ns"), "{met}");
        let missed = line(60.0);
        assert!(
            missed.trim_start().starts_with("MISSED") && missed.contains(" 40.0 ns"),
            "{missed}"
        );
    }

    #[test]
    fn callgrind_totals_are_read_from_its_summary() {
        let stderr =
            "==7175== Collected : 38109923\n==7175== \n==7175== I   refs:      38,109,923\n";
        assert_eq!(refs(stderr), Some(38_109_923));
        assert_eq!(refs("==1== no summary\n"), None);
    }

    #[test]
    fn a_target_by_instructions_is_decided_by_them_with_the_wall_clock_beside() {
        let medians = group(
            "layer",
            &[
                ("admission", 100.0),
                ("load_shed_concurrency_limit", 100.0),
                ("disabled", 110.0),
                ("bare", 100.0),
            ],
        );
        let counts: Instructions = [
            ("ours", 450),
            ("theirs", 600),
            ("disabled", 400),
            ("bare", 250),
        ]
        .into_iter()
        .map(|(v, n)| (v.to_owned(), n))
        .collect();
        let line =
            |text: &str, what: &str| text.lines().find(|l| l.contains(what)).unwrap().to_owned();
        let with = targets(&medians, Some(&counts), &Runs::new());
        // 450/600 = 0.75 decides, though the wall clock says 1.00.
        let shed = line(&with, "LoadShed");
        assert!(
            shed.trim_start().starts_with("MET") && shed.contains("0.75"),
            "{shed}"
        );
        assert!(
            shed.contains("instructions 450/600; wall clock 1.00"),
            "{shed}"
        );
        // Decided by the instructions added: 150, over the 100 allowed.
        let off = line(&with, "turned off");
        assert!(
            off.trim_start().starts_with("MISSED") && off.contains(" 150 (want <= 100"),
            "{off}"
        );
        let near: Instructions = [("disabled", 350), ("bare", 250)]
            .into_iter()
            .map(|(v, n)| (v.to_owned(), n))
            .collect();
        let met = line(&targets(&medians, Some(&near), &Runs::new()), "turned off");
        assert!(met.trim_start().starts_with("MET"), "{met}");
        // The count permit against tokio's, with the floor's own ratio beside it.
        let permit: Instructions = [("count", 30), ("tokio_owned", 140), ("floor", 16)]
            .into_iter()
            .map(|(v, n)| (v.to_owned(), n))
            .collect();
        let count = line(
            &targets(&medians, Some(&permit), &Runs::new()),
            "count permit 2x",
        );
        assert!(
            count.trim_start().starts_with("MET") && count.contains(" 0.21 "),
            "{count}"
        );
        assert!(count.contains("the floor 16/140 = 0.11"), "{count}");
        // Without callgrind, the instruction target is not measured rather than guessed.
        let without = targets(&medians, None, &Runs::new());
        assert!(line(&without, "LoadShed").trim_start().starts_with("n/a"));
        assert!(line(&without, "turned off").trim_start().starts_with("n/a"));
    }

    #[test]
    fn the_contended_keyed_target_is_decided_by_the_median_of_its_runs() {
        let keyed = |ours: f64| {
            group(
                "contended",
                &[
                    ("keyed_admission", ours),
                    ("keyed_dashmap_semaphore", 100.0),
                ],
            )
        };
        let line = |runs: &Runs| {
            let text = targets(&keyed(45.0), None, runs);
            text.lines()
                .find(|l| l.contains("contended keyed"))
                .unwrap()
                .to_owned()
        };
        // The last run alone (45.0) would pass; the median of five (0.60) does not.
        let five: Runs = [
            ("base", 30.0),
            ("run2", 60.0),
            ("run3", 70.0),
            ("run4", 45.0),
        ]
        .into_iter()
        .chain([("run5", 65.0)])
        .map(|(run, ours)| (run.to_owned(), keyed(ours)))
        .collect();
        let decided = line(&five);
        assert!(
            decided.trim_start().starts_with("MISSED") && decided.contains(" 0.60 "),
            "{decided}"
        );
        assert!(
            decided.contains("median of 5 runs: 0.30 0.45 0.60 0.65 0.70"),
            "{decided}"
        );
        // An even count takes the mean of the middle two; fewer than five say so.
        let two: Runs = [("base", 30.0), ("run2", 50.0)]
            .into_iter()
            .map(|(run, ours)| (run.to_owned(), keyed(ours)))
            .collect();
        let fewer = line(&two);
        assert!(
            fewer.trim_start().starts_with("MET") && fewer.contains(" 0.40 "),
            "{fewer}"
        );
        assert!(fewer.contains("median of 2 runs, of the 5"), "{fewer}");
        // No runs saved: the last run decides, and the line says it is one.
        let one = line(&Runs::new());
        assert!(
            one.trim_start().starts_with("MET") && one.contains(" 0.45 "),
            "{one}"
        );
        assert!(one.contains("one run, of the 5"), "{one}");
    }

    #[test]
    fn the_targets_that_swing_are_decided_by_the_median_of_their_runs() {
        // Each line's last run alone would miss (1.25 times its bound); the median of its
        // five passes.
        let cases: [(&str, &str, &str, &str, f64); 2] = [
            (
                "contended",
                "keyed_admission",
                "keyed_dashmap_semaphore",
                "contended keyed",
                0.5,
            ),
            (
                "contended",
                "bytes_admission",
                "bytes_tokio_try_acquire_many_owned",
                "contended bytes",
                0.5,
            ),
        ];
        for (group_name, ours, theirs, what, want) in cases {
            let at = |ratio: f64| group(group_name, &[(ours, ratio * 100.0), (theirs, 100.0)]);
            let last = want * 1.25;
            let ratios = [last, 0.8 * want, 0.9 * want, 0.9 * want, last];
            let runs: Runs = ["base", "run2", "run3", "run4", "run5"]
                .into_iter()
                .zip(ratios)
                .map(|(run, ratio)| (run.to_owned(), at(ratio)))
                .collect();
            let text = targets(&at(last), None, &runs);
            let line = text.lines().find(|l| l.contains(what)).unwrap();
            assert!(line.trim_start().starts_with("MET"), "{line}");
            assert!(line.contains("median of 5 runs"), "{line}");
            let alone = targets(&at(last), None, &Runs::new());
            let alone = alone.lines().find(|l| l.contains(what)).unwrap();
            assert!(alone.trim_start().starts_with("MISSED"), "{alone}");
        }
    }

    #[test]
    fn a_keyed_target_is_decided_by_instructions_with_both_floors_beside_it() {
        let line = |medians: &Medians, counts: Option<&Instructions>| {
            let text = targets(medians, counts, &Runs::new());
            text.lines()
                .find(|l| l.contains("keyed (existing key)"))
                .unwrap()
                .to_owned()
        };
        let medians = group(
            "keyed",
            &[
                ("admission", 30.0),
                ("dashmap_semaphore", 40.0),
                ("floor", 22.0),
            ],
        );
        let counts = |ours: u64| -> Instructions {
            [("existing", ours), ("dashmap", 360), ("keyed_floor", 40)]
                .into_iter()
                .map(|(v, n)| (v.to_owned(), n))
                .collect()
        };
        // The wall clock says 0.75; the instructions decide.
        let met = line(&medians, Some(&counts(120)));
        assert!(met.trim_start().starts_with("MET"), "{met}");
        assert!(
            met.contains("0.33") && met.contains("instructions 120/360"),
            "{met}"
        );
        assert!(met.contains("wall clock 0.75"), "{met}");
        assert!(met.contains("the floor 0.55"), "{met}");
        assert!(met.contains("the floor 40/360 = 0.11"), "{met}");
        let missed = line(&medians, Some(&counts(200)));
        assert!(missed.trim_start().starts_with("MISSED"), "{missed}");
        // Without instruction counts it is not decided.
        let unmeasured = line(&medians, None);
        assert!(unmeasured.trim_start().starts_with("n/a"), "{unmeasured}");
        // No floor in the run: the line says nothing of the wall clock's.
        let no_floor = line(
            &group("keyed", &[("admission", 30.0), ("dashmap_semaphore", 40.0)]),
            Some(&counts(120)),
        );
        assert!(!no_floor.contains("the floor 0."), "{no_floor}");
    }

    #[test]
    fn the_layer_s_key_paths_have_targets_of_their_own() {
        let counts: Instructions = [
            ("key_header", 230),
            ("dashmap_key_header", 660),
            ("key_peer", 240),
            ("dashmap_key_peer", 460),
        ]
        .into_iter()
        .map(|(v, n)| (v.to_owned(), n))
        .collect();
        let text = targets(&Medians::new(), Some(&counts), &Runs::new());
        let header = text.lines().find(|l| l.contains("from a header")).unwrap();
        assert!(header.trim_start().starts_with("MET"), "{header}");
        assert!(header.contains("230/660"), "{header}");
        let peer = text.lines().find(|l| l.contains("peer address")).unwrap();
        assert!(peer.trim_start().starts_with("MISSED"), "{peer}");
    }
}
