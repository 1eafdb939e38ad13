//! The one place every synchronisation primitive comes from.
//!
//! Under `--cfg admission_loom` these are loom's model-checked types; otherwise the
//! standard library's atomics and `parking_lot`'s mutex. A cfg of our own (rather than a
//! bare `--cfg loom`) keeps tokio and other dependencies out of the model.

#[cfg(not(admission_loom))]
mod imp {
    pub(crate) use std::sync::Arc;
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

    /// A mutex whose `lock` cannot fail (`parking_lot` has no poisoning).
    pub(crate) type Mutex<T> = parking_lot::Mutex<T>;
    pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    /// `UnsafeCell` behind loom's closure-based signature, so that loom can check every
    /// access to what it holds.
    #[derive(Debug)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        /// A read of the contents (the pointer is valid for reads during `f`).
        #[inline(always)]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        /// A write of the contents (the pointer is valid for writes during `f`).
        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }

    /// Waits while `busy` holds: another thread's step of a few instructions is under way
    /// (spins a little, then yields the core, as `crossbeam_utils::Backoff` does).
    pub(crate) fn wait_while(mut busy: impl FnMut() -> bool) {
        let backoff = crossbeam_utils::Backoff::new();
        while busy() {
            backoff.snooze();
        }
    }

    /// Allocation and access tracking exist only under loom; here they are zero-sized
    /// no-ops that compile away.
    #[derive(Debug)]
    pub(crate) struct Track;

    impl Track {
        pub(crate) fn new() -> Self {
            Track
        }

        #[inline(always)]
        pub(crate) fn touch(&self) {}

        #[inline(always)]
        pub(crate) fn retire(&self) {}
    }
}

#[cfg(admission_loom)]
mod imp {
    pub(crate) use loom::cell::UnsafeCell;
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
    pub(crate) use loom::sync::{Arc, MutexGuard};

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

        pub(crate) fn try_lock(&self) -> Option<loom::sync::MutexGuard<'_, T>> {
            self.0.try_lock().ok()
        }
    }

    /// Waits while `busy` holds, yielding to the model's other threads between looks (a
    /// spin that did not would never let the thread it waits for run).
    pub(crate) fn wait_while(mut busy: impl FnMut() -> bool) {
        while busy() {
            loom::thread::yield_now();
        }
    }

    /// Every ledger allocation carries one of these under loom, so a leaked or
    /// never-freed ledger fails the model at the end of the execution, and a free that
    /// does not happen after every holder's last use fails it at once.
    ///
    /// loom does not see freeing memory as an access, so the cell stands for the
    /// allocation's memory: each holder reads it just before giving up its share
    /// ([`touch`](Self::touch)), and the free writes it ([`retire`](Self::retire)). A
    /// write that is not ordered after every earlier read is a causality violation in
    /// loom's model, which is exactly a free racing a holder's use.
    #[derive(Debug)]
    pub(crate) struct Track {
        _alloc: loom::alloc::Track<()>,
        memory: loom::cell::UnsafeCell<()>,
    }

    impl Track {
        pub(crate) fn new() -> Self {
            Self {
                _alloc: loom::alloc::Track::new(()),
                memory: loom::cell::UnsafeCell::new(()),
            }
        }

        /// A holder's use of the allocation (a read), before it gives up its share.
        pub(crate) fn touch(&self) {
            self.memory.with(|_| ());
        }

        /// The free (a write): must happen after every `touch`.
        pub(crate) fn retire(&self) {
            self.memory.with_mut(|_| ());
        }
    }
}

pub(crate) use imp::*;
