//! The memory a process may use, read from the machine, and a byte budget sized from it.
//!
//! [`MemoryLimit::read`] resolves the limit the kernel holds the process to: its memory
//! cgroup's (v2 `memory.max`, or v1 `memory.limit_in_bytes` where the machine mounts the
//! v1 memory controller), the lowest along the cgroup's ancestry, else the machine's
//! memory (`MemTotal`). [`MemoryBudget`] is a share of it, and can follow what the rest of
//! the process uses ([`MemoryBudget::tightened`]), so that requests are shed before the
//! limit is reached when something else in the process grows.
//!
//! Linux only: elsewhere [`MemoryLimit::read`] fails with
//! [`MemoryErrorKind::Unsupported`], and a byte budget must be stated in bytes.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

// Not under Miri: the tests read files, which Miri's isolation refuses, and the module
// has no unsafe code for Miri to check.
#[cfg(all(test, not(miri)))]
mod tests;

/// How much memory the process may use, and what says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimit {
    bytes: u64,
    source: MemorySource,
}

/// Where a [`MemoryLimit`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemorySource {
    /// The process's cgroup (v2): `memory.max`, its own or an ancestor's.
    CgroupV2,
    /// The process's memory cgroup (v1): `memory.limit_in_bytes`.
    CgroupV1,
    /// No cgroup limit below the machine's memory: `MemTotal` in `/proc/meminfo`.
    Machine,
}

/// Why the memory limit, or the memory in use, could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryError {
    path: PathBuf,
    kind: MemoryErrorKind,
}

/// What went wrong in a [`MemoryError`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryErrorKind {
    /// The file could not be read (missing where it must exist, or not permitted).
    Unreadable(io::ErrorKind),
    /// The file does not say what it should, in the form it should.
    Malformed,
    /// Not Linux: there is nothing to read.
    Unsupported,
}

impl MemoryError {
    /// The file that could not be read or understood.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What went wrong.
    pub fn kind(&self) -> &MemoryErrorKind {
        &self.kind
    }

    fn malformed(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            kind: MemoryErrorKind::Malformed,
        }
    }
}

impl fmt::Display for MemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path.display();
        match &self.kind {
            MemoryErrorKind::Unreadable(kind) => write!(f, "cannot read {path}: {kind}"),
            MemoryErrorKind::Malformed => write!(f, "{path} does not hold a memory figure"),
            MemoryErrorKind::Unsupported => f.write_str(
                "the memory limit is read from Linux's /proc and /sys only; state the byte budget in bytes",
            ),
        }
    }
}

impl std::error::Error for MemoryError {}

impl MemoryLimit {
    /// The limit the kernel holds this process to.
    ///
    /// # Errors
    ///
    /// A [`MemoryError`] naming the file that could not be read or understood; on a
    /// platform other than Linux, [`MemoryErrorKind::Unsupported`].
    ///
    /// ```
    /// use admission_core::memory::MemoryLimit;
    ///
    /// # #[cfg(target_os = "linux")] {
    /// let limit = MemoryLimit::read()?;
    /// assert!(limit.bytes() > 0);
    /// # }
    /// # Ok::<(), admission_core::memory::MemoryError>(())
    /// ```
    pub fn read() -> Result<Self, MemoryError> {
        if cfg!(target_os = "linux") {
            Self::read_at(Path::new("/"))
        } else {
            Err(MemoryError {
                path: PathBuf::from("/proc/meminfo"),
                kind: MemoryErrorKind::Unsupported,
            })
        }
    }

    /// The same, from a tree laid out as Linux's under `root`: `root/proc/self/cgroup`,
    /// `root/proc/meminfo` and `root/sys/fs/cgroup/...` (for tests, or a host's `/proc`
    /// and `/sys` mounted elsewhere).
    ///
    /// # Errors
    ///
    /// A [`MemoryError`] naming the file: `proc/meminfo` missing or without `MemTotal`,
    /// or a cgroup limit file that exists but cannot be read or parsed. A cgroup without
    /// a limit file is no limit.
    pub fn read_at(root: &Path) -> Result<Self, MemoryError> {
        let meminfo = root.join("proc/meminfo");
        let machine = kib_field(&read(&meminfo)?, "MemTotal:")
            .ok_or_else(|| MemoryError::malformed(&meminfo))?;
        let mut limit = Self {
            bytes: machine,
            source: MemorySource::Machine,
        };
        if let Some((bytes, source)) = cgroup_limit(root)? {
            if bytes < limit.bytes {
                limit = Self { bytes, source };
            }
        }
        Ok(limit)
    }

    /// A limit of `bytes` (what [`read`](Self::read) would find where the limit is known
    /// otherwise).
    pub const fn new(bytes: u64, source: MemorySource) -> Self {
        Self { bytes, source }
    }

    /// The limit, in bytes.
    pub const fn bytes(&self) -> u64 {
        self.bytes
    }

    /// What sets it.
    pub const fn source(&self) -> MemorySource {
        self.source
    }
}

/// What this process has resident in memory now (`VmRSS` in `/proc/self/status`, under
/// `root`).
///
/// # Errors
///
/// A [`MemoryError`] naming the file.
pub fn resident_at(root: &Path) -> Result<u64, MemoryError> {
    let status = root.join("proc/self/status");
    kib_field(&read(&status)?, "VmRSS:").ok_or_else(|| MemoryError::malformed(&status))
}

fn read(path: &Path) -> Result<String, MemoryError> {
    std::fs::read_to_string(path).map_err(|error| MemoryError {
        path: path.to_owned(),
        kind: MemoryErrorKind::Unreadable(error.kind()),
    })
}

/// `name   1234 kB` in a `/proc` table, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find_map(|line| line.strip_prefix(name))?;
    let kib = line.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    kib.checked_mul(1024)
}

/// The lowest limit along the process's memory cgroup and its ancestors, if any.
fn cgroup_limit(root: &Path) -> Result<Option<(u64, MemorySource)>, MemoryError> {
    let membership = root.join("proc/self/cgroup");
    let text = match std::fs::read_to_string(&membership) {
        Ok(text) => text,
        // No cgroups here (or not mounted): the machine's memory is the limit.
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(MemoryError {
                path: membership,
                kind: MemoryErrorKind::Unreadable(error.kind()),
            });
        }
    };
    let mut v1 = None;
    let mut v2 = None;
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            return Err(MemoryError::malformed(&membership));
        };
        // v2's line is the one without controllers (`0::/path`); v1's name theirs.
        if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path);
        } else if controllers.is_empty() {
            v2 = Some(path);
        }
    }
    // The memory controller is on v1 where a v1 hierarchy names it (hybrid machines
    // mount v2 beside it, without memory).
    let (base, file, source, path) = match (v1, v2) {
        (Some(path), _) => (
            "sys/fs/cgroup/memory",
            "memory.limit_in_bytes",
            MemorySource::CgroupV1,
            path,
        ),
        (None, Some(path)) => ("sys/fs/cgroup", "memory.max", MemorySource::CgroupV2, path),
        (None, None) => return Ok(None),
    };
    let base = root.join(base);
    let mut lowest: Option<u64> = None;
    // The cgroup's own directory and each ancestor up to the mount (in a container with
    // its own cgroup namespace, the mount itself is the container's cgroup).
    let mut dir = Some(Path::new(path.trim_start_matches('/')));
    while let Some(relative) = dir {
        let limit_file = base.join(relative).join(file);
        match std::fs::read_to_string(&limit_file) {
            Ok(text) => {
                if let Some(bytes) = parse_limit(&text, source, &limit_file)? {
                    lowest = Some(lowest.map_or(bytes, |low| low.min(bytes)));
                }
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => {
                return Err(MemoryError {
                    path: limit_file,
                    kind: MemoryErrorKind::Unreadable(error.kind()),
                });
            }
        }
        dir = relative.parent();
    }
    Ok(lowest.map(|bytes| (bytes, source)))
}

/// A limit file's figure: `None` for no limit. (v1 writes none as the largest
/// page-aligned `i64`, which the machine's memory, always lower, overrides.)
fn parse_limit(text: &str, source: MemorySource, path: &Path) -> Result<Option<u64>, MemoryError> {
    let text = text.trim();
    if source == MemorySource::CgroupV2 && text == "max" {
        return Ok(None);
    }
    let bytes = text
        .parse::<u64>()
        .map_err(|_| MemoryError::malformed(path))?;
    Ok(Some(bytes))
}

/// A byte budget that is a share of the process's [`MemoryLimit`].
///
/// ```
/// use admission_core::memory::{MemoryBudget, MemoryLimit, MemorySource};
///
/// let limit = MemoryLimit::new(1 << 30, MemorySource::CgroupV2);
/// let budget = MemoryBudget::new(limit, 0.25).unwrap();
/// assert_eq!(budget.bytes(), 256 << 20);
/// // The rest of the process uses 800 MiB: what is left below the margin is less.
/// assert!(budget.tightened(800 << 20, 0) < 256 << 20);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryBudget {
    limit: MemoryLimit,
    share: f64,
}

impl MemoryBudget {
    /// Of the limit, the part left to nobody when the budget tightens: the allocator's
    /// slack and what a process holds that is not counted as resident (the kernel's
    /// buffers for it). A tenth keeps the last requests admitted from meeting the limit.
    pub const MARGIN: f64 = 0.1;

    /// `share` (above 0, at most 1) of `limit`; `None` for a share outside that range.
    pub fn new(limit: MemoryLimit, share: f64) -> Option<Self> {
        (share > 0.0 && share <= 1.0).then_some(Self { limit, share })
    }

    /// The limit it is a share of.
    pub fn limit(&self) -> MemoryLimit {
        self.limit
    }

    /// The share.
    pub fn share(&self) -> f64 {
        self.share
    }

    /// The budget while the rest of the process uses little: the share of the limit
    /// (at least 1 byte).
    pub fn bytes(&self) -> u64 {
        ((self.limit.bytes as f64 * self.share) as u64).max(1)
    }

    /// The budget when the process has `resident` bytes in memory, `in_flight` of them
    /// charged to the budget: the share of the limit, but never more than what is left
    /// below the margin once the rest of the process is counted (at least 1 byte; a
    /// ledger still admits a lone request of any allowed size).
    pub fn tightened(&self, resident: u64, in_flight: u64) -> u64 {
        let other = resident.saturating_sub(in_flight);
        let usable = (self.limit.bytes as f64 * (1.0 - Self::MARGIN)) as u64;
        self.bytes().min(usable.saturating_sub(other)).max(1)
    }
}
