//! The gate's ledgers, closing and draining it, and a reading of it.

use super::Gate;
use crate::priority::MAX_CLASSES;
use crate::{ByteLedger, CountLedger, Drain, KeyedLedger, KeyedSnapshot, Snapshot};

impl<K, S> Gate<K, S> {
    /// The count ledger: every gate has one (unlimited when no count limit is set).
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<()>::builder().count(3).build()?;
    /// assert_eq!(gate.count().capacity(), 3);
    /// gate.count().set_capacity(5)?; // at run time
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn count(&self) -> &CountLedger {
        &self.count
    }

    /// Refuses every new request with [`Refused::Closed`](crate::Refused::Closed) until
    /// [`reopen`](Self::reopen), whatever limits are set meanwhile; admitted requests
    /// are untouched. See [`CountLedger::close`].
    ///
    /// ```
    /// use admission_core::{Gate, Refused};
    ///
    /// let gate = Gate::<()>::builder().count(8).build()?;
    /// gate.close();
    /// assert_eq!(gate.try_admit(None, 0).unwrap_err(), Refused::Closed);
    /// gate.reopen();
    /// assert!(gate.try_admit(None, 0).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn close(&self) {
        self.count.close();
    }

    /// Admits again after [`close`](Self::close) or [`drain`](Self::drain).
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<()>::builder().build()?;
    /// gate.close();
    /// gate.reopen();
    /// assert!(!gate.is_closed());
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn reopen(&self) {
        self.count.reopen();
    }

    /// Whether the gate is closed.
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<()>::builder().build()?;
    /// assert!(!gate.is_closed());
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn is_closed(&self) -> bool {
        self.count.is_closed()
    }

    /// Closes the gate and returns a [`Drain`] that completes once no admitted request
    /// is in flight: a future for any runtime, or [`Drain::wait`] to block a thread.
    ///
    /// ```
    /// use admission_core::{Gate, Refused};
    ///
    /// let gate = Gate::<()>::builder().count(64).build()?;
    /// let admitted = gate.try_admit(None, 0)?;
    /// let drain = gate.drain();
    /// assert_eq!(gate.try_admit(None, 0).unwrap_err(), Refused::Closed);
    /// drop(admitted);
    /// drain.wait();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn drain(&self) -> Drain {
        self.count.drain()
    }

    /// The byte ledger, if configured.
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<()>::builder().bytes(1024).build()?;
    /// assert_eq!(gate.bytes().unwrap().budget(), 1024);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn bytes(&self) -> Option<&ByteLedger> {
        self.bytes.as_ref()
    }

    /// The keyed ledger, if configured.
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<u8>::builder().per_key(2).build()?;
    /// assert_eq!(gate.keyed().unwrap().cap(), 2);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn keyed(&self) -> Option<&KeyedLedger<K, S>> {
        self.keyed.as_ref()
    }

    /// A reading of every configured dimension.
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<()>::builder().count(1).build()?;
    /// let snap = gate.snapshot();
    /// assert_eq!(snap.count.capacity, Some(1));
    /// assert!(snap.bytes.is_none() && snap.keyed.is_none() && !snap.closed);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn snapshot(&self) -> GateSnapshot {
        GateSnapshot {
            count: self.count.snapshot(),
            refused_by_class: self.count.refused_by_class(),
            refused_retries: self.count.refused_retries(),
            closed: self.count.is_closed(),
            bytes: self.bytes.as_ref().map(ByteLedger::snapshot),
            keyed: self.keyed.as_ref().map(KeyedLedger::snapshot),
        }
    }
}

/// Readings of a [`Gate`]'s dimensions; `None` where a dimension is not configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct GateSnapshot {
    /// The count ledger (capacity `None`: no count limit).
    pub count: Snapshot,
    /// Count refusals of claims with a priority class, by [`Priority::index`](crate::Priority::index): which
    /// class was shed (see [`CountLedger::refused_by_class`]).
    pub refused_by_class: [u64; MAX_CLASSES],
    /// Of those, refusals of retries ([`Priority::retry`](crate::Priority::retry); see
    /// [`CountLedger::refused_retries`](crate::CountLedger::refused_retries)).
    pub refused_retries: u64,
    /// Whether the gate is closed (or draining).
    pub closed: bool,
    /// The byte ledger.
    pub bytes: Option<Snapshot>,
    /// The keyed ledger.
    pub keyed: Option<KeyedSnapshot>,
}
