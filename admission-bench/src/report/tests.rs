use std::fs;
use std::path::Path;

use super::callgrind::{instructions_by, refs};
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
    let dir = std::env::temp_dir().join(format!("admission-report-{}-{name}", std::process::id()));
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
    let stderr = "==7175== Collected : 38109923\n==7175== \n==7175== I   refs:      38,109,923\n";
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
    let line = |text: &str, what: &str| text.lines().find(|l| l.contains(what)).unwrap().to_owned();
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
