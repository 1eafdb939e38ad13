//! What one claim shares of the gate: its seats of the count, and its key's fair share.

use std::hash::{BuildHasher, Hash};

use super::Gate;
use crate::{CountPermit, Priority, Refused};

impl<K: Hash + Eq + Clone, S: BuildHasher> Gate<K, S> {
    /// The seats of a claim of `seats` beyond its first, all or none: at most the count
    /// (its class's threshold), so that any claim can be admitted alone. With the highest
    /// level they brought the count to (0 for none).
    #[inline]
    pub(super) fn more_seats(
        &self,
        seats: u32,
        priority: Option<Priority>,
        waits: bool,
    ) -> Result<(Vec<CountPermit>, u64), Refused> {
        if seats <= 1 {
            return Ok((Vec::new(), 0));
        }
        self.take_seats(seats, priority, waits)
    }

    #[inline(never)]
    fn take_seats(
        &self,
        seats: u32,
        priority: Option<Priority>,
        waits: bool,
    ) -> Result<(Vec<CountPermit>, u64), Refused> {
        let (_, threshold) = self.count.room(priority);
        let more = u64::from(seats).min(threshold.max(1)) - 1;
        let mut taken = Vec::with_capacity(more as usize);
        let mut level = 0;
        for _ in 0..more {
            // A refusal drops the seats taken so far.
            let (permit, at) = self.count.try_acquire_unobserved(priority, waits)?;
            taken.push(permit);
            level = at;
        }
        Ok((taken, level))
    }

    /// The cap `key`'s request is held to: `key_cap` (or the ledger's), and, with fair
    /// shares and the count within its headroom of full, at most the key's share. Marks
    /// the key active.
    #[inline(always)]
    pub(super) fn fair_cap(
        &self,
        key: Option<&K>,
        key_cap: Option<u64>,
        priority: Option<Priority>,
    ) -> Option<u64> {
        let (Some(fair), Some(key), Some(keyed)) = (&self.fair, key, &self.keyed) else {
            return key_cap;
        };
        fair.mark(keyed.hash(key));
        let share = fair.cap(&self.count, priority)?;
        let cap = key_cap.unwrap_or_else(|| match keyed.cap() {
            0 => u64::MAX,
            cap => cap,
        });
        Some(cap.min(share))
    }

    /// A claim of `key` the count refused: with fair shares, a key below its share turned
    /// away by a full count widens the headroom.
    #[cold]
    pub(super) fn full(
        &self,
        key: Option<&K>,
        priority: Option<Priority>,
        refused: Refused,
    ) -> Refused {
        if let (Some(fair), Some(key), Some(keyed), Refused::Count | Refused::Class) =
            (&self.fair, key, &self.keyed, refused)
        {
            fair.refused(&self.count, priority, keyed.in_flight(key));
        }
        refused
    }

    /// The flow `key`'s requests wait in ([`Claim::flow`](crate::Claim::flow)): its hash under the gate's
    /// hasher; `None` without a key dimension.
    ///
    /// ```
    /// use admission_core::Gate;
    ///
    /// let gate = Gate::<&str>::builder().count(8).track_keys().build()?;
    /// assert_eq!(gate.flow_of(&"alice"), gate.flow_of(&"alice"));
    /// assert_ne!(gate.flow_of(&"alice"), gate.flow_of(&"bob"));
    /// assert_eq!(Gate::<&str>::builder().count(8).build()?.flow_of(&"alice"), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn flow_of(&self, key: &K) -> Option<u64> {
        self.keyed.as_ref().map(|keyed| keyed.hash(key))
    }

    /// The keys the fair shares count as active now (see
    /// [`GateBuilder::fair_share`](crate::GateBuilder::fair_share)); `None` without fair shares.
    pub fn active_keys(&self) -> Option<u64> {
        self.fair.as_ref().map(|fair| fair.active())
    }
}
