//! The one place every synchronisation primitive comes from.
//!
//! Under `--cfg admission_loom` these are loom's model-checked types; otherwise the
//! standard library's atomics and `parking_lot`'s mutex. A cfg of our own (rather than a
//! bare `--cfg loom`) keeps tokio and other dependencies out of the model.

#[cfg(not(admission_loom))]
mod imp {
    pub(crate) use std::sync::atomic::{fence, AtomicU64, Ordering};
    pub(crate) use std::sync::Arc;

    /// A mutex whose `lock` cannot fail (`parking_lot` has no poisoning).
    pub(crate) type Mutex<T> = parking_lot::Mutex<T>;

    /// Allocation tracking exists only under loom; here it is a zero-sized no-op.
    #[derive(Debug)]
    pub(crate) struct Track;

    impl Track {
        pub(crate) fn new() -> Self {
            Track
        }
    }
}

#[cfg(admission_loom)]
mod imp {
    pub(crate) use loom::sync::atomic::{fence, AtomicU64, Ordering};
    pub(crate) use loom::sync::Arc;

    /// loom's mutex behind `parking_lot`'s signature.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            // A poisoned lock means a model thread panicked; the model has failed already.
            self.0
                .lock()
                .expect("a loom model thread panicked while holding a lock")
        }
    }

    /// Every ledger allocation carries one of these under loom, so a leaked or
    /// never-freed ledger fails the model at the end of the execution.
    #[derive(Debug)]
    pub(crate) struct Track(#[allow(dead_code)] loom::alloc::Track<()>);

    impl Track {
        pub(crate) fn new() -> Self {
            Self(loom::alloc::Track::new(()))
        }
    }
}

pub(crate) use imp::*;
