//! The limit setters of a gate of the layer's own, and `build` (which hands the rest to
//! `assemble.rs`).

use admission_core::Gate;
use http::request::Parts;

use crate::builder::{AdmissionBuilder, NewGate, SharedGate};
use crate::{AdmissionLayer, BuildError, MemoryShare};

impl AdmissionBuilder<NewGate> {
    /// At most `limit` requests in flight (from the call until the response body ends);
    /// 503 + `Retry-After` above. `None` for no count limit (the default; requests are
    /// still counted, for [`drain`](AdmissionLayer::drain) and snapshots).
    ///
    /// How to choose it: against the resource the requests contend for (a pool of
    /// database connections, the workers of a CPU-bound handler), times what bursts need.
    /// A limit equal to the workers refuses a burst that the workers would have cleared in
    /// a few milliseconds (admission-bench's bursts figure measures how much). Start at a few
    /// times the workers, watch the latency at the limit, and lower it until the latency
    /// is what clients accept. Where the right number moves (other tenants, autoscaled
    /// dependencies), let an [`adaptive`](Self::adaptive) limit find it instead.
    ///
    /// ```
    /// use admission_tower::{AdmissionLayer, BuildError};
    ///
    /// let layer = AdmissionLayer::builder().count(100).build()?;
    /// assert_eq!(layer.gate().count().capacity(), 100);
    /// let from_config: Option<usize> = None; // "no limit" in the configuration
    /// assert!(AdmissionLayer::builder().count(from_config).build().is_ok());
    /// assert_eq!(AdmissionLayer::builder().count(0).build().unwrap_err(), BuildError::ZeroLimit("count"));
    /// # Ok::<(), BuildError>(())
    /// ```
    pub fn count(mut self, limit: impl Into<Option<usize>>) -> Self {
        self.gate.count = limit.into();
        self
    }

    /// At most `budget` bytes of request bodies in flight (503 + `Retry-After` above): a
    /// declared `Content-Length` is charged at the head, a body without one as it arrives;
    /// the charge is held until the response body ends. `None` for no budget (the
    /// default). This bounds request bytes the server is handed, not what handlers
    /// allocate. To size it from the memory the process may use, and to have it shrink
    /// when the rest of the process grows, use [`bytes_share`](Self::bytes_share) instead
    /// ([`MemoryShare`] says how to choose the share).
    ///
    /// **One request larger than the budget is admitted when nothing else is charged**
    /// (the lone-request exemption): refusing the only request in flight would shed load
    /// the process is not short of, and a client could never succeed by retrying. So a
    /// budget below the largest body you accept is not an error; to refuse bodies above
    /// a size, set [`max_request_bytes`](Self::max_request_bytes) (413, whatever is in
    /// flight).
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().bytes(1 << 20).build()?;
    /// assert_eq!(layer.gate().bytes().unwrap().budget(), 1 << 20);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn bytes(mut self, budget: impl Into<Option<u64>>) -> Self {
        self.gate.bytes = budget.into();
        self
    }

    /// A byte budget stated as a share of the memory the process may use (its cgroup's
    /// limit, else the machine's), read when the layer is built, and optionally
    /// following what the rest of the process uses: see [`MemoryShare`]. In place of
    /// [`bytes`](Self::bytes), not beside it.
    ///
    /// ```
    /// use admission_tower::{AdmissionLayer, MemoryShare};
    ///
    /// # #[cfg(target_os = "linux")] {
    /// let layer = AdmissionLayer::builder().bytes_share(MemoryShare::of(0.25)).build()?;
    /// let limit = layer.snapshot().memory.unwrap();
    /// assert_eq!(layer.gate().bytes().unwrap().budget(), limit.bytes() / 4);
    /// # }
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn bytes_share(mut self, share: MemoryShare) -> Self {
        self.gate.memory = Some(share);
        self
    }

    /// Refuse a request whose body is above `max` bytes with 413, before reading it (or
    /// as soon as a body without a length passes it). `None` for no maximum (the default).
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().max_request_bytes(1 << 16).build()?;
    /// assert_eq!(layer.gate().bytes().unwrap().max_charge(), 1 << 16);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn max_request_bytes(mut self, max: impl Into<Option<u64>>) -> Self {
        self.gate.max_request_bytes = max.into();
        self
    }

    /// The layer these settings describe, every setting checked against the others.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] that names what is wrong: a limit of 0 or beyond its ledger's
    /// range, both a count and an adaptive limit, invalid adaptive bounds, priority
    /// classes, retries or a wait without a count to apply to, a class (or its retries)
    /// whose share of the count rounds to 0, a wait that lets nothing wait.
    pub fn build(self) -> Result<AdmissionLayer, BuildError> {
        let (
            NewGate {
                count,
                mut bytes,
                memory,
                max_request_bytes,
            },
            mut this,
        ) = self.swap(());
        for (what, limit) in [
            ("count", count.map(|n| n as u64)),
            ("bytes", bytes),
            ("max_request_bytes", max_request_bytes),
        ] {
            if limit == Some(0) {
                return Err(BuildError::ZeroLimit(what));
            }
        }
        if count.is_some() && this.draft.adaptive.is_some() {
            return Err(BuildError::CountAndAdaptive);
        }
        if let Some(memory) = memory {
            if bytes.is_some() {
                return Err(BuildError::BytesAndShare);
            }
            let resolved = memory.resolve()?;
            bytes = Some(
                resolved
                    .budget
                    .bytes()
                    .min(admission_core::ByteLedger::MAX_BUDGET),
            );
            this.draft.memory = Some(resolved);
        }
        let mut gate = Gate::builder()
            .count(count.unwrap_or(0))
            .bytes(bytes.unwrap_or(0))
            .max_request_bytes(max_request_bytes.unwrap_or(0));
        if let Some(fair) = &this.draft.fair {
            if fair.headroom > 1000 {
                return Err(BuildError::FairShare("a headroom outside 0 to 1"));
            }
            match (&fair.key, &this.draft.per_key) {
                (None, None) => {
                    return Err(BuildError::FairShare(
                        "`FairShare::per_key` on a layer without a per-key cap",
                    ));
                }
                (Some(_), Some(_)) => {
                    return Err(BuildError::FairShare(
                        "`FairShare::by` on a layer with a per-key cap: use `FairShare::per_key`",
                    ));
                }
                _ => {}
            }
            if count.is_none() && this.draft.adaptive.is_none() {
                return Err(BuildError::FairShare(
                    "no count limit (`count` or `adaptive`) to share",
                ));
            }
            // With a wait, waiting clients take turns and no slot is kept; without one,
            // the gate keeps the headroom for the clients below their share.
            gate = if this.draft.waits() {
                gate.track_keys()
            } else {
                gate.fair_share(fair.headroom)
            };
        }
        if let Some(per_key) = &this.draft.per_key {
            let cap = per_key.cap.ok_or(BuildError::NoKeyCap)?;
            if cap == 0 {
                return Err(BuildError::ZeroLimit("per-key cap"));
            }
            if per_key.max_keys == Some(0) {
                return Err(BuildError::ZeroLimit("max_keys"));
            }
            gate = gate.per_key(cap).max_keys(per_key.max_keys.unwrap_or(0));
            if per_key.cap_by.is_some() || per_key.leases.is_some() {
                gate = gate.track_keys();
            }
        }
        this.swap(gate.build()?).1.finish()
    }
}

impl AdmissionBuilder<SharedGate> {
    /// The layer, over the shared gate.
    ///
    /// # Errors
    ///
    /// A [`BuildError`] that names what is wrong: a per-key cap or `max_keys` set here
    /// (they are the gate's), a key extractor for a gate without a per-key dimension,
    /// invalid adaptive bounds or a count already driven by another adaptive limit.
    pub fn build(self) -> Result<AdmissionLayer, BuildError> {
        let (SharedGate(gate), this) = self.swap(());
        if this.draft.fair.is_some() {
            return Err(BuildError::FairShare(
                "on a shared gate they are the gate's (`GateBuilder::fair_share`)",
            ));
        }
        if let Some(per_key) = &this.draft.per_key {
            if per_key.cap.is_some() || per_key.max_keys.is_some() {
                return Err(BuildError::LimitsOnSharedGate);
            }
            if gate.keyed().is_none() {
                return Err(BuildError::NoKeyedLedger);
            }
        }
        this.swap(gate).1.finish()
    }
}

impl<G> AdmissionBuilder<G> {
    /// Fair shares between clients when the server is full: the heavy client shed first
    /// (without a wait) or the waiting clients served in turn (with one). See
    /// [`FairShare`](crate::FairShare).
    pub fn fair_share(mut self, fair: crate::FairShare) -> Self {
        self.draft.fair = Some(fair);
        self
    }

    /// Seats: `seats` reads each request's head and says how many count slots it takes
    /// (1 for most; more for one that costs more, as a listing beside a lookup), at most
    /// the count (its class's share of it), so any request can still run alone. A request
    /// is admitted only with all its seats free, else refused (503) or, with a
    /// [`Wait`](crate::Wait), waits for its first and takes the rest at once. The count's
    /// readings (the snapshot, the metrics' in-flight gauge) count seats.
    ///
    /// ```
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder()
    ///     .count(64)
    ///     .seats(|req| if req.uri.path().starts_with("/list") { 8 } else { 1 })
    ///     .build()?;
    /// # drop(layer);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn seats<F>(mut self, seats: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        self.draft.seats = Some(Box::new(seats));
        self
    }
}
