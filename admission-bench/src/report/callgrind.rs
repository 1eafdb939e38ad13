//! Instructions per call of the loop binaries, under callgrind.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Instructions per call, by loop variant.
pub type Instructions = BTreeMap<String, u64>;

/// The `layer_loop` variants the targets compare in instructions: the layer (bare, off,
/// count limit, tower's pair), and the count permit (ours, tokio's owned one, the floor);
/// a thousand tenants' requests with a per-key cap, with fair shares and without; and,
/// printed beside them, a response with a body with the minimum send rate kept and
/// without.
pub const LAYER_VARIANTS: &[&str] = &[
    "bare",
    "disabled",
    "ours",
    "theirs",
    "body",
    "body_untimed",
    "count",
    "tokio_owned",
    "floor",
    "per_key_1000",
    "fair_1000",
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
pub(super) fn instructions_by(
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
pub(super) fn refs(stderr: &str) -> Option<u64> {
    stderr
        .lines()
        .find_map(|line| line.split_once("refs:").map(|(_, n)| n.replace(',', "")))
        .and_then(|n| n.trim().parse().ok())
}
