//! `Connections`: the ledgers of the connections open under a layer's limits.

use std::net::IpAddr;

use admission_core::{CountLedger, KeyedLedger};
use tokio::time::Instant;

use super::{ConnectionLimits, GuardedIo};

/// The [`ConnectionLimits`] of a layer, and the count of the connections open under
/// them: what every listener and accept loop the layer bounds shares.
#[derive(Debug, Clone)]
pub struct Connections {
    limits: ConnectionLimits,
    open: CountLedger,
    per_address: Option<KeyedLedger<IpAddr>>,
}

impl Connections {
    /// Ledgers of their own for `limits`.
    ///
    /// ```
    /// use admission_tower::{ConnectionLimits, Connections};
    ///
    /// let connections = Connections::new(ConnectionLimits::default().with_max_connections(Some(2)));
    /// let first = connections.admit(()).expect("under the cap");
    /// let _second = connections.admit(()).expect("at the cap");
    /// assert!(connections.admit(()).is_none(), "over it: close the connection");
    /// drop(first);
    /// assert_eq!(connections.open(), 1);
    /// ```
    pub fn new(limits: ConnectionLimits) -> Self {
        let cap = limits
            .max_connections
            .map_or(CountLedger::MAX_CAPACITY, |max| {
                max.clamp(1, CountLedger::MAX_CAPACITY)
            });
        let open = CountLedger::new(cap).expect("a capacity in range");
        let per_address = limits.max_per_address.map(|max| {
            let cap = max.clamp(1, KeyedLedger::<IpAddr>::MAX_CAP);
            KeyedLedger::new(cap).expect("a cap in range")
        });
        Self {
            limits,
            open,
            per_address,
        }
    }

    /// The limits held.
    pub fn limits(&self) -> &ConnectionLimits {
        &self.limits
    }

    /// Connections open now.
    ///
    /// ```
    /// use admission_tower::{ConnectionLimits, Connections};
    ///
    /// assert_eq!(Connections::new(ConnectionLimits::default()).open(), 0);
    /// ```
    pub fn open(&self) -> u64 {
        self.open.in_flight()
    }

    /// Connections open now from `address` (0 without a per-address cap, which is what
    /// counts them).
    pub fn open_from(&self, address: IpAddr) -> u64 {
        self.per_address
            .as_ref()
            .map_or(0, |ledger| ledger.in_flight(&address))
    }

    /// Guards an accepted connection `io`, or `None` if the cap is reached: drop `io` to
    /// close it. The connection must send its first byte within the head bound (a
    /// listener cannot see where a head ends), and read at the minimum send rate.
    ///
    /// ```
    /// use admission_tower::{ConnectionLimits, Connections};
    ///
    /// let connections = Connections::new(ConnectionLimits::default());
    /// let guarded = connections.admit("an io").unwrap();
    /// assert_eq!(*guarded.get_ref(), "an io");
    /// assert_eq!(connections.open(), 1);
    /// ```
    pub fn admit<I>(&self, io: I) -> Option<GuardedIo<I>> {
        self.admit_from(io, None, true)
    }

    /// Guards `io`, accepted from `address`, under both caps; its first byte timed by the
    /// head bound if `first_byte` (a listener's only view of a head).
    pub(crate) fn admit_from<I>(
        &self,
        io: I,
        address: Option<IpAddr>,
        first_byte: bool,
    ) -> Option<GuardedIo<I>> {
        let per_address = match (&self.per_address, address) {
            (Some(ledger), Some(address)) => Some(ledger.try_acquire(&address).ok()?),
            _ => None,
        };
        let permit = self.open.try_acquire().ok()?;
        let first_byte = first_byte
            .then(|| self.limits.head_due(Instant::now()))
            .flatten();
        Some(GuardedIo::new(
            io,
            (permit, per_address),
            first_byte,
            self.limits.min_send_rate,
        ))
    }
}
