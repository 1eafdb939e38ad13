//! A byte budget from the machine's memory, on the wire: a ballast inside the server grows
//! toward the process's limit, and uploads are refused (503 + `Retry-After`) before the
//! process's use passes the limit; freed, uploads are admitted again. Under a limit laid
//! out in files by the test, and, where the machine lets the test make one, under a real
//! memory cgroup.

#![cfg(target_os = "linux")]

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use admission_core::memory::{MemoryErrorKind, MemoryLimit, MemorySource, resident_at};
use admission_testkit::Scratch;
use admission_tower::{AdmissionLayer, BuildError, MemoryShare};
use http::StatusCode;
use support::{Seen, app, post, send, serve};
use tokio::time::{Instant, sleep};
use tower::Layer;

const MIB: u64 = 1 << 20;

/// A tree laid out as Linux's `/` whose cgroup limit is `limit`, and whose
/// `proc/self/status` is this process's own (a link), so that what is resident is real;
/// removed when dropped.
fn root_with_limit(limit: u64) -> Scratch {
    let root = Scratch::new("admission-memory-wire");
    root.write("proc/meminfo", "MemTotal: 1073741824 kB\n");
    root.write("proc/self/cgroup", "0::/\n");
    root.write("sys/fs/cgroup/memory.max", &format!("{limit}\n"));
    let status = root.path().join("proc/self/status");
    std::os::unix::fs::symlink("/proc/self/status", status).unwrap();
    root
}

fn resident() -> u64 {
    resident_at(Path::new("/")).unwrap()
}

/// Memory that is resident: every page written.
fn ballast(bytes: u64) -> Vec<u8> {
    vec![0x5a; bytes as usize]
}

/// An upload of 256 KiB: its status.
async fn upload(addr: std::net::SocketAddr) -> (StatusCode, bool) {
    let response = send(addr, post("/upload", vec![1; 256 << 10])).await;
    let retry_after = response.headers().contains_key(http::header::RETRY_AFTER);
    (response.status(), retry_after)
}

/// Waits (at most 5 s) until the layer's byte budget satisfies `condition`.
async fn budget_until(layer: &AdmissionLayer, what: &str, condition: impl Fn(u64) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let ledger = layer.gate().bytes().unwrap().clone();
    while !condition(ledger.budget()) {
        assert!(
            Instant::now() < deadline,
            "{what}: budget {}",
            ledger.budget()
        );
        sleep(Duration::from_millis(10)).await;
    }
}

/// The scenario, under whatever limit `share` reads: uploads admitted; a ballast grown
/// to near the limit, and uploads refused before the process passes it; the ballast
/// freed, and uploads admitted again.
async fn ballast_is_shed_for(share: MemoryShare, limit: u64) {
    let layer = AdmissionLayer::builder()
        .bytes_share(share.following_use_every(Duration::from_millis(20)))
        .max_request_bytes(MIB)
        .build()
        .unwrap();
    assert_eq!(layer.snapshot().memory.map(|m| m.bytes()), Some(limit));
    let seen = Arc::new(Seen::default());
    let addr = serve(layer.layer(app(seen.clone()))).await;
    // One request holds a charge, so that the budget, not the lone-request exemption,
    // decides the next (`/stream` answers at once and holds its charge while it streams).
    let holder = send(addr, post("/stream", vec![1; 64 << 10])).await;
    assert_eq!(holder.status(), StatusCode::OK);
    assert_eq!(upload(addr).await.0, StatusCode::OK);

    // The rest of the process grows into the margin (a tenth of the limit), 4 MiB deep.
    let room = (limit as f64 * 0.9) as u64 - resident();
    let weight = ballast(room + 4 * MIB);
    budget_until(&layer, "tightened below an upload", |budget| {
        budget < 256 << 10
    })
    .await;
    let (status, retry_after) = upload(addr).await;
    assert_eq!(
        (status, retry_after),
        (StatusCode::SERVICE_UNAVAILABLE, true)
    );
    assert!(resident() < limit, "the process stays below its limit");

    drop(weight);
    budget_until(&layer, "back", |budget| budget >= 4 * MIB).await;
    assert_eq!(upload(addr).await.0, StatusCode::OK);
    drop(holder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ballast_toward_the_limit_sheds_uploads_before_the_limit_and_not_after() {
    let limit = resident() + 160 * MIB;
    let root = root_with_limit(limit);
    ballast_is_shed_for(MemoryShare::of(0.25).read_from(root.path()), limit).await;
}

#[test]
fn a_budget_is_a_share_of_the_limit_read_at_build_and_errors_say_which_file() {
    let root = root_with_limit(400 * MIB);
    let layer = AdmissionLayer::builder()
        .bytes_share(MemoryShare::of(0.25).read_from(root.path()))
        .build()
        .unwrap();
    assert_eq!(layer.gate().bytes().unwrap().budget(), 100 * MIB);
    let memory = layer.snapshot().memory.unwrap();
    assert_eq!(memory, MemoryLimit::new(400 * MIB, MemorySource::CgroupV2));

    let share =
        |s: f64| AdmissionLayer::builder().bytes_share(MemoryShare::of(s).read_from(root.path()));
    assert_eq!(share(0.0).build().unwrap_err(), BuildError::MemoryShare);
    assert_eq!(share(1.5).build().unwrap_err(), BuildError::MemoryShare);
    assert_eq!(
        share(0.5).bytes(1 << 20).build().unwrap_err(),
        BuildError::BytesAndShare
    );
    let missing = AdmissionLayer::builder()
        .bytes_share(MemoryShare::of(0.5).read_from(root.path().join("nowhere")))
        .build()
        .unwrap_err();
    let BuildError::Memory(error) = &missing else {
        panic!("{missing:?}")
    };
    assert!(matches!(error.kind(), MemoryErrorKind::Unreadable(_)));
    assert!(error.path().ends_with("proc/meminfo"));
    let source = std::error::Error::source(&missing).unwrap().to_string();
    assert!(source.contains("nowhere/proc/meminfo"), "{source}");
}

/// Under a real memory cgroup, where this machine lets the test make one: the test
/// binary runs itself (the ignored test below) in a new cgroup of 320 MiB above what
/// it holds now.
#[test]
fn under_a_real_memory_cgroup_where_the_machine_allows_one() {
    let Some((dir, procs)) = make_cgroup(resident() + 320 * MIB) else {
        return;
    };
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "in_the_cgroup", "--ignored", "--nocapture"])
        .env("ADMISSION_CGROUP_PROCS", &procs)
        .status()
        .unwrap();
    let _ = std::fs::remove_dir(&dir);
    assert!(status.success(), "the run in the cgroup failed");
}

/// A memory cgroup of `limit` bytes (v1 or v2): its directory and its `cgroup.procs`, or
/// `None` with a plain message where the machine does not let the test make one.
fn make_cgroup(limit: u64) -> Option<(PathBuf, PathBuf)> {
    let name = format!("admission-test-{}", std::process::id());
    let (dir, file) = if Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
        (
            Path::new("/sys/fs/cgroup/memory").join(name),
            "memory.limit_in_bytes",
        )
    } else {
        (Path::new("/sys/fs/cgroup").join(name), "memory.max")
    };
    let made =
        std::fs::create_dir(&dir).and_then(|()| std::fs::write(dir.join(file), limit.to_string()));
    match made {
        Ok(()) => Some((dir.clone(), dir.join("cgroup.procs"))),
        Err(error) => {
            let _ = std::fs::remove_dir(&dir);
            println!("SKIPPED: this machine does not let the test make a memory cgroup ({error})");
            None
        }
    }
}

#[test]
#[ignore = "run by under_a_real_memory_cgroup_where_the_machine_allows_one, inside the cgroup"]
fn in_the_cgroup() {
    // Run on its own (`--ignored`), outside a cgroup made for it: its parent test is
    // what checks it.
    let Ok(procs) = std::env::var("ADMISSION_CGROUP_PROCS") else {
        println!("in_the_cgroup: runs only inside the cgroup its parent test makes");
        return;
    };
    std::fs::write(procs, std::process::id().to_string()).unwrap();
    let limit = MemoryLimit::read().unwrap();
    assert_ne!(limit.source(), MemorySource::Machine, "{limit:?}");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(ballast_is_shed_for(MemoryShare::of(0.25), limit.bytes()));
}
