//! Heap cells whose lifetime is counted inside the ledger's own admission word.
//!
//! # Why not `Arc`
//!
//! A permit must keep its ledger alive, and an `Arc` clone per permit costs two extra
//! atomic read-modify-writes (increment on acquire, decrement on release) on a counter
//! that every permit of the ledger shares. Admission already performs one
//! read-modify-write on one word per acquire and one per release; this module makes
//! that same word the reference count. Each ledger's word reads
//!
//! ```text
//!   OWNER (bit 63)  |  what the permits hold (the ledger's own layout below bit 63)
//! ```
//!
//! `OWNER` is set while any [`Owner`] handle exists (the public ledger types share one
//! `Owner` through an `Arc`, so cloning a ledger touches a different cache line from
//! admitting through it). Every permit contributes a non-zero amount to the low bits for
//! as long as it lives. The word is therefore zero exactly when no handle and no permit
//! remains, and whoever brings it to zero frees the cell. A permit holds a bare pointer.
//!
//! # Memory ordering
//!
//! This is `Arc`'s protocol with a richer count. Every decrement is a `Release`, so
//! everything a holder did with the cell happens before the final decrement; the thread
//! that reaches zero issues an `Acquire` fence before freeing, so it synchronises with all
//! of those releases. Increments need no ordering: they happen through a live reference
//! (a handle, or under a lock that a live reference protects), never through a count
//! that could be zero.

use std::ptr::NonNull;

use crate::sync::{fence, AtomicU64, Ordering};

/// The bit of the word that stands for every public handle of the ledger together.
pub(crate) const OWNER: u64 = 1 << 63;

/// A heap value whose lifetime is counted by one of its atomic words.
pub(crate) trait Counted {
    /// The word that counts every reference to `self` (see the module docs).
    fn word(&self) -> &AtomicU64;
}

/// Moves `value` to the heap and returns its address; nothing frees it but [`put`].
pub(crate) fn alloc<T>(value: T) -> NonNull<T> {
    #[cfg(test)]
    live::change(1);
    NonNull::from(Box::leak(Box::new(value)))
}

/// Gives up `amount` of `ptr`'s count and frees the cell if that was the last of it.
///
/// # Safety
///
/// `ptr` came from [`alloc`] and is a [`Counted`] cell whose word includes at least
/// `amount` on behalf of the caller, who neither uses `ptr` after this call nor gives
/// up the same `amount` twice.
pub(crate) unsafe fn put<T: Counted>(ptr: NonNull<T>, amount: u64) {
    // SAFETY: the caller's share of the count keeps the cell alive until this decrement.
    // The reference is a temporary that ends with the expression, so nothing of ours
    // refers to the cell once another holder may free it. (`Arc` has the same gap
    // between its decrement and the function's return: rust-lang/rust#55005.)
    let prev = unsafe { ptr.as_ref() }
        .word()
        .fetch_sub(amount, Ordering::Release);
    debug_assert!(prev >= amount, "a ledger's reference count went below zero");
    if prev == amount {
        // Must be an acquire so that it synchronises with every holder's release
        // decrement: all their uses of the cell happen before the free below.
        fence(Ordering::Acquire);
        // SAFETY: the word is now zero, so no handle and no permit refers to the cell,
        // and none can appear (new references are made only through live ones).
        drop(unsafe { Box::from_raw(ptr.as_ptr()) });
        #[cfg(test)]
        live::change(-1);
    }
}

/// The public handles' single share of a cell: `OWNER` in its word.
pub(crate) struct Owner<T: Counted> {
    ptr: NonNull<T>,
}

impl<T: Counted> Owner<T> {
    /// Moves `value` to the heap. Its word must start at `OWNER`.
    pub(crate) fn new(value: T) -> Self {
        debug_assert_eq!(value.word().load(Ordering::Relaxed), OWNER);
        Self { ptr: alloc(value) }
    }

    /// The cell, for as long as this handle lives.
    #[inline]
    pub(crate) fn get(&self) -> &T {
        // SAFETY: `OWNER` stays in the word until this handle drops, so the cell is live
        // for the returned borrow of `self`.
        unsafe { self.ptr.as_ref() }
    }

    /// The cell's address, for a permit whose own share the caller has just added.
    #[inline]
    pub(crate) fn ptr(&self) -> NonNull<T> {
        self.ptr
    }
}

impl<T: Counted> Drop for Owner<T> {
    fn drop(&mut self) {
        // SAFETY: this handle holds `OWNER`, gives it up once, and is gone afterwards.
        unsafe { put(self.ptr, OWNER) }
    }
}

// SAFETY: an `Owner` is a shared reference to a `T` that may be dropped (freeing the `T`)
// on any thread, exactly as `Arc<T>` is; the same bounds apply.
unsafe impl<T: Counted + Send + Sync> Send for Owner<T> {}
// SAFETY: as above; `&Owner<T>` only gives out `&T`.
unsafe impl<T: Counted + Send + Sync> Sync for Owner<T> {}

/// Unit tests count this thread's live cells, to see that the last reference frees one
/// (loom checks the same for every model, on every thread).
#[cfg(test)]
pub(crate) mod live {
    use std::cell::Cell;

    thread_local!(static LIVE: Cell<i64> = const { Cell::new(0) });

    pub(crate) fn change(by: i64) {
        LIVE.with(|live| live.set(live.get() + by));
    }

    /// Cells allocated minus cells freed on this thread.
    #[cfg_attr(admission_loom, allow(dead_code))] // The loom build has no unit tests.
    pub(crate) fn count() -> i64 {
        LIVE.with(Cell::get)
    }
}
