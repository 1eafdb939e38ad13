use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// A directory laid out as Linux's `/`, with `files` (path, contents) in it; removed
/// when dropped.
fn tree(files: &[(&str, &str)]) -> Tree {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let root = std::env::temp_dir().join(format!("admission-memory-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for (path, contents) in files {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }
    Tree(root)
}

/// A test's directory, removed when dropped.
struct Tree(PathBuf);

impl std::ops::Deref for Tree {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const MEMINFO: (&str, &str) = (
    "proc/meminfo",
    "MemTotal:       16384000 kB\nMemFree:         1000 kB\n",
);
const MACHINE: u64 = 16_384_000 * 1024;

#[test]
fn v2_reads_the_lowest_memory_max_along_the_ancestry() {
    let root = tree(&[
        MEMINFO,
        ("proc/self/cgroup", "0::/system.slice/app.service\n"),
        ("sys/fs/cgroup/system.slice/memory.max", "1073741824\n"),
        ("sys/fs/cgroup/system.slice/app.service/memory.max", "max\n"),
    ]);
    let limit = MemoryLimit::read_at(&root).unwrap();
    assert_eq!(limit, MemoryLimit::new(1 << 30, MemorySource::CgroupV2));

    // Its own, lower than its parent's.
    let root = tree(&[
        MEMINFO,
        ("proc/self/cgroup", "0::/app\n"),
        ("sys/fs/cgroup/memory.max", "4294967296\n"),
        ("sys/fs/cgroup/app/memory.max", "536870912\n"),
    ]);
    assert_eq!(MemoryLimit::read_at(&root).unwrap().bytes(), 512 << 20);
}

#[test]
fn v1_reads_the_memory_controller_and_its_unlimited_is_none() {
    let root = tree(&[
        MEMINFO,
        (
            "proc/self/cgroup",
            "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n",
        ),
        (
            "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
            "268435456\n",
        ),
        (
            "sys/fs/cgroup/memory/memory.limit_in_bytes",
            "9223372036854771712\n",
        ),
        // A hybrid machine's v2 mount, without the memory controller: not read.
        ("sys/fs/cgroup/memory.max", "1\n"),
    ]);
    let limit = MemoryLimit::read_at(&root).unwrap();
    assert_eq!(limit, MemoryLimit::new(256 << 20, MemorySource::CgroupV1));

    let unlimited = tree(&[
        MEMINFO,
        ("proc/self/cgroup", "4:memory:/\n"),
        (
            "sys/fs/cgroup/memory/memory.limit_in_bytes",
            "9223372036854771712\n",
        ),
    ]);
    let limit = MemoryLimit::read_at(&unlimited).unwrap();
    assert_eq!(limit, MemoryLimit::new(MACHINE, MemorySource::Machine));
}

#[test]
fn without_a_limit_the_machines_memory_is_the_limit() {
    for files in [
        vec![MEMINFO],
        vec![MEMINFO, ("proc/self/cgroup", "0::/\n")],
        vec![
            MEMINFO,
            ("proc/self/cgroup", "0::/\n"),
            ("sys/fs/cgroup/memory.max", "max\n"),
        ],
        // A cgroup limit at or above the machine's memory limits nothing more.
        vec![
            MEMINFO,
            ("proc/self/cgroup", "0::/\n"),
            ("sys/fs/cgroup/memory.max", "16777216000\n"),
        ],
        vec![
            MEMINFO,
            ("proc/self/cgroup", "0::/\n"),
            ("sys/fs/cgroup/memory.max", "68719476736000\n"),
        ],
    ] {
        let limit = MemoryLimit::read_at(&tree(&files)).unwrap();
        assert_eq!(limit, MemoryLimit::new(MACHINE, MemorySource::Machine));
    }
}

#[test]
fn unreadable_and_malformed_files_are_errors_that_name_them() {
    let root = tree(&[("proc/self/cgroup", "0::/\n")]);
    let error = MemoryLimit::read_at(&root).unwrap_err();
    assert_eq!(
        error.kind(),
        &MemoryErrorKind::Unreadable(io::ErrorKind::NotFound)
    );
    assert!(error.path().ends_with("proc/meminfo"));
    assert!(error.to_string().contains("proc/meminfo"), "{error}");

    for (files, file) in [
        (vec![("proc/meminfo", "MemFree: 12 kB\n")], "proc/meminfo"),
        (
            vec![("proc/meminfo", "MemTotal: lots kB\n")],
            "proc/meminfo",
        ),
        (
            vec![
                MEMINFO,
                ("proc/self/cgroup", "0::/\n"),
                ("sys/fs/cgroup/memory.max", "a gigabyte\n"),
            ],
            "sys/fs/cgroup/memory.max",
        ),
        (
            vec![MEMINFO, ("proc/self/cgroup", "not a cgroup line\n")],
            "proc/self/cgroup",
        ),
    ] {
        let error = MemoryLimit::read_at(&tree(&files)).unwrap_err();
        assert_eq!(error.kind(), &MemoryErrorKind::Malformed, "{file}");
        assert!(error.path().ends_with(file), "{error}");
    }

    // A membership file that is there but cannot be read (a directory in its place).
    let root = tree(&[MEMINFO]);
    std::fs::create_dir_all(root.join("proc/self/cgroup")).unwrap();
    let error = MemoryLimit::read_at(&root).unwrap_err();
    assert!(
        matches!(error.kind(), MemoryErrorKind::Unreadable(_)),
        "{error}"
    );
    assert!(error.path().ends_with("proc/self/cgroup"));

    // A limit file that is there but cannot be read (a directory in its place).
    let root = tree(&[MEMINFO, ("proc/self/cgroup", "0::/\n")]);
    std::fs::create_dir_all(root.join("sys/fs/cgroup/memory.max")).unwrap();
    let error = MemoryLimit::read_at(&root).unwrap_err();
    assert!(
        matches!(error.kind(), MemoryErrorKind::Unreadable(_)),
        "{error}"
    );
}

#[test]
fn resident_memory_is_read_from_the_status_table() {
    let root = tree(&[("proc/self/status", "Name: x\nVmRSS:\t   2140 kB\n")]);
    assert_eq!(resident_at(&root).unwrap(), 2140 * 1024);
    let error = resident_at(&tree(&[("proc/self/status", "Name: x\n")])).unwrap_err();
    assert_eq!(error.kind(), &MemoryErrorKind::Malformed);
}

#[cfg(target_os = "linux")]
#[test]
fn this_machine_has_a_limit_and_a_resident_set() {
    let limit = MemoryLimit::read().unwrap();
    let resident = resident_at(Path::new("/")).unwrap();
    assert!(resident > 0 && resident < limit.bytes());
}

#[test]
fn a_budget_is_its_share_until_the_rest_of_the_process_leaves_less() {
    let limit = MemoryLimit::new(1000 << 20, MemorySource::CgroupV2);
    assert!(MemoryBudget::new(limit, 0.0).is_none());
    assert!(MemoryBudget::new(limit, 1.5).is_none());
    let budget = MemoryBudget::new(limit, 0.25).unwrap();
    assert_eq!((budget.limit(), budget.share()), (limit, 0.25));
    assert_eq!(budget.bytes(), 250 << 20);
    // The rest of the process is small: the share.
    assert_eq!(budget.tightened(100 << 20, 0), 250 << 20);
    // What is charged is not the rest of the process.
    assert_eq!(budget.tightened(750 << 20, 250 << 20), 250 << 20);
    // The rest grows to 800 MiB: 900 MiB usable, 100 MiB left.
    assert_eq!(budget.tightened(800 << 20, 0), 100 << 20);
    // Past the margin: the least budget, one byte (a lone request is still admitted).
    assert_eq!(budget.tightened(990 << 20, 0), 1);
    // And back when the memory comes back.
    assert_eq!(budget.tightened(50 << 20, 0), 250 << 20);
}
