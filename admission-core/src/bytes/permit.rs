//! `BytePermit`: a charge of bytes, released when dropped.

use std::fmt;
use std::ptr::NonNull;

use super::{BYTES, ByteInner, PERMIT, Refused, raw};
use crate::sync::Ordering;

/// A charge against a [`ByteLedger`](crate::ByteLedger), released when dropped.
///
/// `'static`, `Send + Sync`; it may outlive every handle of its ledger.
///
/// ```
/// use admission_core::ByteLedger;
///
/// let ledger = ByteLedger::new(100)?;
/// let mut permit = ledger.try_charge(10)?;
/// permit.try_grow(50)?;
/// permit.shrink(20);
/// assert_eq!((permit.charged(), ledger.in_flight()), (40, 40));
/// drop(permit);
/// assert_eq!(ledger.in_flight(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "the charge is released as soon as the permit is dropped"]
pub struct BytePermit {
    pub(super) inner: NonNull<ByteInner>,
    pub(super) charged: u64,
}

impl BytePermit {
    fn inner(&self) -> &ByteInner {
        // SAFETY: this permit's `PERMIT` share of the word keeps the cell alive for as
        // long as the permit, and so for the borrow of `self`.
        unsafe { self.inner.as_ref() }
    }

    /// Bytes this permit holds.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// assert_eq!(ledger.try_charge(7)?.charged(), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charged(&self) -> u64 {
        self.charged
    }

    /// Adds `bytes` to this permit's charge if the budget allows, else refuses and leaves
    /// the charge as it was.
    ///
    /// A permit that holds every charged byte of its ledger may grow past the budget (the
    /// lone-request exemption), but never past [`ByteLedger::max_charge`](crate::ByteLedger::max_charge).
    ///
    /// # Errors
    ///
    /// [`Refused::TooLarge`](crate::Refused::TooLarge) if the grown charge would exceed the maximum single charge;
    /// [`Refused::Bytes`] if the budget cannot take it now.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission_core::{ByteLedger, Refused};
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// let _other = ledger.try_charge(50)?;
    /// let mut body = ledger.try_charge(0)?;
    /// body.try_grow(50)?;
    /// assert_eq!(body.try_grow(1).unwrap_err(), Refused::Bytes);
    /// assert_eq!(body.charged(), 50);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_grow(&mut self, bytes: u64) -> Result<(), Refused> {
        let inner = self.inner();
        let hot = &*inner.hot;
        let grown = self.charged.saturating_add(bytes);
        if grown > hot.max_charge.load(Ordering::Relaxed) || grown > BYTES {
            inner.too_large.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::TooLarge);
        }
        let budget = hot.budget.load(Ordering::Relaxed);
        let mut current = hot.state.load(Ordering::Relaxed);
        loop {
            let charged = current & BYTES;
            // The permit's own bytes are part of `charged`, so this cannot underflow.
            let others = charged - self.charged;
            if (others != 0 && charged + bytes > budget) || charged + bytes > BYTES {
                inner.stats.refuse();
                return Err(Refused::Bytes);
            }
            // Relaxed: the permit's share keeps the cell alive; nothing else is ordered.
            match hot.state.compare_exchange_weak(
                current,
                current + bytes,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    inner.stats.observe(charged + bytes);
                    self.charged = grown;
                    return Ok(());
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Grows this permit's charge by up to `bytes`, as far as the budget has room now, and
    /// never past [`ByteLedger::max_charge`](crate::ByteLedger::max_charge); returns how many bytes it grew. It never
    /// refuses, so it counts no refusal: for a charge made ahead of need, such as a
    /// reservation for what a body is about to send. Being ahead of need, it takes no
    /// lone-request exemption: it stays within the budget even for the only charge in
    /// flight ([`try_grow`](Self::try_grow) is for what is needed now).
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// let _other = ledger.try_charge(70)?;
    /// let mut body = ledger.try_charge(10)?;
    /// assert_eq!(body.grow_within(50), 20, "the room there was");
    /// assert_eq!((body.charged(), ledger.in_flight()), (30, 100));
    /// assert_eq!(ledger.snapshot().refused, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn grow_within(&mut self, bytes: u64) -> u64 {
        let inner = self.inner();
        let hot = &*inner.hot;
        let most = hot.max_charge.load(Ordering::Relaxed).min(BYTES);
        let bytes = bytes.min(most.saturating_sub(self.charged));
        let budget = hot.budget.load(Ordering::Relaxed);
        let mut current = hot.state.load(Ordering::Relaxed);
        loop {
            let charged = current & BYTES;
            let grow = bytes.min(budget.min(BYTES).saturating_sub(charged));
            if grow == 0 {
                return 0;
            }
            // Relaxed: the permit's share keeps the cell alive; nothing else is ordered
            // (as in `try_grow`).
            match hot.state.compare_exchange_weak(
                current,
                current + grow,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    inner.stats.observe(charged + grow);
                    self.charged += grow;
                    return grow;
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Gives back up to `bytes` of this permit's charge now, keeping the permit; returns
    /// how many bytes were given back.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// let mut permit = ledger.try_charge(30)?;
    /// assert_eq!(permit.shrink(50), 30);
    /// assert_eq!(ledger.in_flight(), 0);
    /// assert_eq!(ledger.permits(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shrink(&mut self, bytes: u64) -> u64 {
        let bytes = bytes.min(self.charged);
        if bytes != 0 {
            // Relaxed: the permit's `PERMIT` share stays, so this never frees the cell.
            self.inner().hot.state.fetch_sub(bytes, Ordering::Relaxed);
            self.charged -= bytes;
        }
        bytes
    }

    /// Gives the whole charge and the permit's share back. Called only from `Drop`.
    fn release(&mut self) {
        // SAFETY: the word holds `PERMIT + charged` on this permit's behalf (made on
        // charge, kept in step by `try_grow` and `shrink`); given up once, here.
        unsafe { raw::put(self.inner, PERMIT + self.charged) };
    }
}

impl Drop for BytePermit {
    fn drop(&mut self) {
        self.release();
    }
}

impl fmt::Debug for BytePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BytePermit")
            .field("charged", &self.charged)
            .finish()
    }
}

// SAFETY: `ByteInner` is all atomics; the permit's operations (`try_grow`, `shrink`
// through `&mut self`, the release in `Drop`) are atomic and correct on any thread.
unsafe impl Send for BytePermit {}

// SAFETY: `&BytePermit` only reads the permit's own `charged`.
unsafe impl Sync for BytePermit {}

// What the two impls above rest on, checked by the compiler: the ledger's state is
// `Send + Sync` of its own accord. (Not under loom, whose use-tracker is neither.)
#[cfg(not(admission_loom))]
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<ByteInner>();
};
