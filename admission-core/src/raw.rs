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
//! everything a holder did with the cell happens before its decrement; the thread that
//! reaches zero then makes an `Acquire` load of the word before freeing. That load reads
//! the zero its own decrement wrote, the last of a release sequence made of every
//! holder's decrement (read-modify-writes all), so it synchronises with all of them: all
//! their uses of the cell happen before the free. Increments need no ordering: they
//! happen through a live reference (a handle, or under a lock that a live reference
//! protects), never through a count that could be zero.
//!
//! Two exceptions, both the keyed ledger's. Its release of an entry's share may be made
//! before the holder's last use of the cell: a relaxed decrement inside a shard's critical
//! section, or a release decrement while the holder's slot is marked busy. Whoever brings
//! the word to zero therefore loads it with acquire, then takes every shard lock and waits
//! until no slot is busy before the free (`Counted::quiesce`): the unlock, or the store
//! that ends the mark, orders all of that holder's uses before the free, which the
//! decrement alone could not. And not every entry holds a share while the ledger has
//! handles: the last handle gives each one a share before it gives up `OWNER`
//! (`Counted::close`).
//!
//! An acquire load rather than `Arc`'s acquire fence, on this cold path: the two give the
//! same guarantee, but ThreadSanitizer does not model standalone fences and would report
//! the free as a data race in a user's tests (std's `Arc` switches to the load under
//! `cfg(sanitize = "thread")` for the same reason).
//!
//! Both orderings are load-bearing in the checks: under loom every holder reads a cell
//! standing for the allocation just before its decrement and the free writes it (see
//! `sync::Track`), so weakening either ordering fails the loom models of a last release
//! on another thread; Miri's race detector sees the same as a deallocation racing a
//! holder's access, in the unit tests that drop the last permit and the last handle on
//! two threads at once.

use std::ptr::NonNull;

use crate::sync::{AtomicU64, Ordering, Track};

/// The bit of the word that stands for every public handle of the ledger together.
pub(crate) const OWNER: u64 = 1 << 63;

/// A heap value whose lifetime is counted by one of its atomic words.
pub(crate) trait Counted {
    /// The word that counts every reference to `self` (see the module docs).
    fn word(&self) -> &AtomicU64;

    /// The allocation's tracker: a leak check and an access model under loom, nothing
    /// otherwise.
    fn track(&self) -> &Track;

    /// Waits until no thread is still using the cell after giving up its share: called
    /// by whoever brings the word to zero, before the free. A cell whose holders give up
    /// their shares last of all has nothing to wait for (the default); the keyed ledger's
    /// holders give theirs up inside a critical section (see `keyed`).
    fn quiesce(&self) {}

    /// Called by the last handle just before it gives up `OWNER`, while that share still
    /// keeps the cell alive: a cell whose holders do not all have a share of their own
    /// gives them one here (the keyed ledger's entries made without the lock, see
    /// `keyed`). Nothing by default.
    fn close(&self) {}
}

/// Moves `value` to the heap and returns its address; nothing frees it but [`put`].
pub(crate) fn alloc<T>(value: T) -> NonNull<T> {
    #[cfg(test)]
    live::change(1);
    NonNull::from(Box::leak(Box::new(value)))
}

/// Gives up `amount` of `ptr`'s count and frees the cell if that was the last of it.
/// Returns the word as it was before the decrement.
///
/// # Safety
///
/// `ptr` came from [`alloc`] and is a [`Counted`] cell whose word includes at least
/// `amount` on behalf of the caller, who neither uses `ptr` after this call nor gives
/// up the same `amount` twice.
#[inline]
pub(crate) unsafe fn put<T: Counted>(ptr: NonNull<T>, amount: u64) -> u64 {
    // SAFETY: the caller's share of the count keeps the cell alive until the decrement
    // below, and the reference ends with this expression.
    unsafe { ptr.as_ref() }.track().touch();
    // Must be a release so that this holder's every use of the cell happens before the
    // free, by whichever thread makes it.
    // SAFETY: as above, up to this decrement. The reference is a temporary that ends
    // with the expression, so nothing of ours refers to the cell once another holder may
    // free it. (`Arc` has the same gap between its decrement and the function's return:
    // rust-lang/rust#55005.)
    let prev = unsafe { ptr.as_ref() }
        .word()
        .fetch_sub(amount, Ordering::Release);
    debug_assert!(prev >= amount, "a ledger's reference count went below zero");
    if prev == amount {
        // SAFETY: the word is zero, by this decrement.
        unsafe { free(ptr) };
    }
    prev
}

/// [`put`], unless the word has any bit of `unless` set: then nothing is given up and the
/// word as read is the error. A compare-exchange loop rather than one subtraction, so that
/// the check and the decrement are one step: a bit set between them fails the exchange.
///
/// # Safety
///
/// As [`put`]. On an error the caller still holds its share.
#[inline]
pub(crate) unsafe fn put_unless<T: Counted>(
    ptr: NonNull<T>,
    amount: u64,
    unless: u64,
) -> Result<u64, u64> {
    // SAFETY: the caller's share keeps the cell alive until the decrement below (as in
    // `put`); every reference here is a temporary that ends before it.
    unsafe { ptr.as_ref() }.track().touch();
    // SAFETY: as above.
    let word = unsafe { ptr.as_ref() }.word();
    // Relaxed: an advisory first read; the exchange decides.
    let mut current = word.load(Ordering::Relaxed);
    let prev = loop {
        if current & unless != 0 {
            return Err(current);
        }
        debug_assert!(
            current >= amount,
            "a ledger's reference count went below zero"
        );
        // Release on success, as `put`'s decrement: this holder's every use of the cell
        // happens before the free, by whichever thread makes it. (The cell is not
        // touched after a successful exchange: `word` is not used again.)
        match word.compare_exchange_weak(
            current,
            current - amount,
            Ordering::Release,
            Ordering::Relaxed,
        ) {
            Ok(prev) => break prev,
            Err(actual) => current = actual,
        }
    };
    if prev == amount {
        // SAFETY: the word is zero, by this decrement.
        unsafe { free(ptr) };
    }
    Ok(prev)
}

/// Frees a cell whose word the caller brought to zero, once every holder is done with it.
///
/// # Safety
///
/// `ptr` came from [`alloc`], and the caller's own decrement brought its word to zero
/// (a release, unless the cell's `quiesce` orders every holder's uses before the free);
/// the caller does not use `ptr` afterwards.
pub(crate) unsafe fn free<T: Counted>(ptr: NonNull<T>) {
    // SAFETY: the word is zero: no handle and no permit refers to the cell, none can
    // appear (new references are made only through live ones), and only this thread may
    // free it. It is ours until the free below.
    let cell = unsafe { ptr.as_ref() };
    // Must be an acquire so that it synchronises with every holder's release decrement:
    // all their uses of the cell happen before the free below. (A load, not a fence: see
    // the module docs.) Before the quiesce, so that what a holder did before its release
    // decrement is seen by the quiesce's own looks too.
    let word = cell.word().load(Ordering::Acquire);
    debug_assert_eq!(word, 0, "a reference appeared after the last one went");
    cell.quiesce();
    cell.track().retire();
    // SAFETY: as above; `cell` is not used after this line.
    drop(unsafe { Box::from_raw(ptr.as_ptr()) });
    #[cfg(test)]
    live::change(-1);
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
        self.get().close();
        // SAFETY: this handle holds `OWNER`, gives it up once, and is gone afterwards.
        unsafe { put(self.ptr, OWNER) };
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
