//! `MemoryShare`: a byte budget stated as a share of the memory the process may use.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use admission_core::ByteLedger;
use admission_core::memory::{MemoryBudget, MemoryLimit, resident_at};

use crate::BuildError;

/// A byte budget stated as a share of the memory this process may use
/// ([`AdmissionBuilder::bytes_share`](crate::AdmissionBuilder::bytes_share)): its memory
/// cgroup's limit (v2 `memory.max`, or v1 `memory.limit_in_bytes`, the lowest along its
/// ancestry) where one is set, else the machine's memory. Read once, when the layer is
/// built (Linux only: elsewhere the build fails, and the budget must be stated in
/// bytes); [`AdmissionSnapshot::memory`](crate::AdmissionSnapshot::memory) reports it.
///
/// **Following the rest of the process** ([`following_use`](Self::following_use), off by
/// default): the budget then shrinks when the rest of the process grows, to what is left
/// of the limit below a tenth of it once the process's resident memory (less what is
/// charged to the budget) is counted, and grows back, never above the share. So a cache or
/// a leak elsewhere in the process makes the server shed uploads (503, retryable) before
/// the process meets its limit, not after the kernel has ended it. A thread of the layer's
/// own reads `/proc/self/status` (one small file) every 250 ms by default: no request
/// reads anything. A lone request is still admitted whatever the budget (up to the
/// maximum request size).
///
/// How to choose the share: the budget bounds the request bodies handed to handlers.
/// Beside its body, each connection holds some tens of KiB of heap, idle or with a request
/// in flight (hyper's buffers and the connection's task, served by
/// `AdmissionLayer::serve` behind this layer; the `footprint` test holds it under
/// 48 KiB), plus the kernel's socket buffers, which are not the
/// process's heap but are charged to its cgroup; and your handlers hold what they
/// allocate. So budget the rest first: connections (10,000 are a few hundred MiB), the
/// handlers' own state, caches. What is left is the share; a quarter suits a service whose
/// handlers buffer bodies and hold little else. Follow the process's use where what the
/// rest holds grows and shrinks.
///
/// ```
/// use admission_tower::{AdmissionLayer, MemoryShare};
///
/// # #[cfg(target_os = "linux")] {
/// let layer = AdmissionLayer::builder()
///     .count(512)
///     .bytes_share(MemoryShare::of(0.25).following_use())
///     .max_request_bytes(16 << 20)
///     .build()?;
/// let memory = layer.snapshot().memory.expect("a budget from memory");
/// assert_eq!(layer.gate().bytes().unwrap().budget(), memory.bytes() / 4);
/// # }
/// # Ok::<(), admission_tower::BuildError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryShare {
    share: f64,
    follow: Option<Duration>,
    root: PathBuf,
}

impl MemoryShare {
    /// How often the budget follows the process's use by default.
    pub const EVERY: Duration = Duration::from_millis(250);

    /// `share` of the memory the process may use: above 0, at most 1 (checked when the
    /// layer is built).
    pub fn of(share: f64) -> Self {
        Self {
            share,
            follow: None,
            root: PathBuf::from("/"),
        }
    }

    /// The budget follows what the rest of the process uses, every 250 ms.
    pub fn following_use(self) -> Self {
        self.following_use_every(Self::EVERY)
    }

    /// The budget follows what the rest of the process uses, every `every`.
    pub fn following_use_every(mut self, every: Duration) -> Self {
        self.follow = Some(every);
        self
    }

    /// Reads `/proc` and `/sys` under `root` rather than `/` (a host's mounted elsewhere,
    /// or files a test lays out).
    pub fn read_from(mut self, root: impl Into<PathBuf>) -> Self {
        self.root = root.into();
        self
    }

    /// The share.
    pub fn share(&self) -> f64 {
        self.share
    }

    /// The budget it comes to, and how to follow the process's use.
    pub(crate) fn resolve(self) -> Result<Resolved, BuildError> {
        let limit = if self.root == Path::new("/") {
            // Says "unsupported" off Linux, rather than naming a missing file.
            MemoryLimit::read()
        } else {
            MemoryLimit::read_at(&self.root)
        };
        let limit = limit.map_err(BuildError::Memory)?;
        let budget = MemoryBudget::new(limit, self.share).ok_or(BuildError::MemoryShare)?;
        if self.follow.is_some() {
            // What following reads, read now: an error is the build's, not a thread's.
            resident_at(&self.root).map_err(BuildError::Memory)?;
        }
        Ok(Resolved {
            budget,
            follow: self.follow.map(|every| (every, self.root)),
        })
    }
}

/// A [`MemoryShare`] resolved at build.
#[derive(Debug)]
pub(crate) struct Resolved {
    pub(crate) budget: MemoryBudget,
    follow: Option<(Duration, PathBuf)>,
}

impl Resolved {
    /// Starts following the process's use with `ledger`'s budget, if asked to.
    pub(crate) fn start(self, ledger: Option<&ByteLedger>) -> Option<Follower> {
        let (every, root) = self.follow?;
        let ledger = ledger?.clone();
        let budget = self.budget;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let spawned = std::thread::Builder::new()
            .name("admission-memory".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    // A read that fails (the file gone for a moment) leaves the budget.
                    if let Ok(resident) = resident_at(&root) {
                        let bytes = budget.tightened(resident, ledger.in_flight());
                        let _ = ledger.set_budget(bytes.min(ByteLedger::MAX_BUDGET));
                    }
                    std::thread::park_timeout(every);
                }
            });
        spawned.ok().map(|thread| Follower { stop, thread })
    }
}

/// The thread that keeps a budget following the process's use, stopped when the layer
/// goes.
#[derive(Debug)]
pub(crate) struct Follower {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.thread().unpark();
    }
}
