//! From a builder's settings to a layer: what `build` checks (each mistake a
//! [`BuildError`]), and the shared state it assembles.

use std::sync::atomic::AtomicU64;

use admission_core::{Classes, Gate, Priority};

use crate::observe::Observer;
use crate::pacer::Pacing;
use crate::shared::Shared;
use crate::{AdmissionBuilder, AdmissionLayer, BuildError, PerKey, Retries};

impl AdmissionBuilder<Gate> {
    /// The layer over `self.gate`, the configuration checked.
    pub(crate) fn finish(self) -> Result<AdmissionLayer, BuildError> {
        if let Some(zero) = self.settings.connections.zero() {
            return Err(BuildError::ZeroConnectionLimit(zero));
        }
        let gate = self.gate;
        let memory_limit = self
            .settings
            .memory
            .as_ref()
            .map(|memory| memory.budget.limit());
        let follower = self
            .settings
            .memory
            .and_then(|memory| memory.start(gate.bytes()));
        let (adaptive, sample_at) = match self.settings.adaptive {
            Some(adaptive) => (
                Some(adaptive.limit.build(gate.count())?),
                Some(adaptive.sample_at),
            ),
            None => (None, None),
        };
        // The smallest count limit the layer can run at: the adaptive limit's minimum,
        // else the fixed count (0: none).
        let smallest = match &adaptive {
            Some(adaptive) => adaptive.snapshot().min,
            None => gate.count().capacity(),
        };
        if let Some((classes, _)) = &self.settings.classes {
            if smallest == 0 {
                return Err(BuildError::PriorityWithoutCount);
            }
            for (class, priority) in classes.iter() {
                let share = priority.share();
                if smallest * u64::from(share) < 100 {
                    return Err(BuildError::ClassShareRoundsToZero {
                        class: class.to_owned(),
                        share,
                        limit: smallest,
                    });
                }
            }
        }
        if let Some(retries) = &self.settings.retries {
            check_retries(
                retries,
                self.settings.classes.as_ref().map(|(c, _)| c),
                smallest,
            )?;
        }
        #[cfg(feature = "tokio")]
        if let Some(wait) = &self.settings.wait {
            if smallest == 0 {
                return Err(BuildError::WaitWithoutCount);
            }
            if wait.max_waiting == 0 {
                return Err(BuildError::EmptyWait("max_waiting"));
            }
            if wait.max_wait.is_zero() {
                return Err(BuildError::EmptyWait("max_wait"));
            }
        }
        #[cfg(feature = "tokio")]
        if let Some(wait) = &self.settings.wait {
            gate.count().set_max_waiting(wait.max_waiting);
            gate.count().set_standing_queue(wait.interval, wait.target);
        }
        let keys = self.settings.per_key.map(PerKey::into_policy);
        if let (Some(leases), Some(keyed)) =
            (keys.as_ref().and_then(|k| k.leases.as_ref()), gate.keyed())
        {
            leases
                .attach(keyed, &self.settings.report.name)
                .map_err(|_| BuildError::LeasesTaken)?;
        }
        let count_only = gate.bytes().is_none()
            && keys.is_none()
            && self.settings.bypass.is_none()
            && self.settings.classes.is_none()
            && self.settings.retries.is_none();
        let observer = Observer::new(
            &self.settings.report,
            &gate,
            self.settings.classes.as_ref().map(|(classes, _)| classes),
            memory_limit.map(|limit| limit.bytes()),
        );
        let pacer = (self.settings.slow.min_response_rate())
            .map(|rate| Pacing::new(rate, observer.stall_report()));
        let limits = self.settings.connections;
        Ok(AdmissionLayer::from_parts(
            Shared {
                keys,
                bypass: self.settings.bypass,
                classes: self.settings.classes,
                retries: self.settings.retries,
                refusals: self.settings.refusals,
                hook: self.settings.hook,
                dry_run: self.settings.dry_run,
                observer,
                would_shed: AtomicU64::new(0),
                sample_at,
                slow: self.settings.slow,
                pacer,
                too_slow: AtomicU64::new(0),
                adaptive,
                count_only,
                untracked: false,
                #[cfg(feature = "tokio")]
                waits_first: self.settings.wait.is_some() && !self.settings.dry_run,
                #[cfg(not(feature = "tokio"))]
                waits_first: false,
                #[cfg(feature = "tokio")]
                wait: self.settings.wait,
                waits: Default::default(),
                gone: AtomicU64::new(0),
                memory: memory_limit,
                _follower: follower,
                gate,
            },
            limits,
        ))
    }
}

/// What `build` refuses of `retries` on a layer with `classes` whose count can be as small
/// as `smallest` (0: no count limit): a share outside 1 to 100, no count, or a class whose
/// retries would be refused with nothing in flight.
fn check_retries(
    retries: &Retries,
    classes: Option<&Classes>,
    smallest: u64,
) -> Result<(), BuildError> {
    if retries.share == 0 || retries.share > 100 {
        return Err(BuildError::RetryShare(retries.share));
    }
    if smallest == 0 {
        return Err(BuildError::RetriesWithoutCount);
    }
    let lowest = classes.map_or(Priority::CRITICAL, Classes::lowest);
    let share = lowest.retry(retries.share).share();
    if smallest * u64::from(share) < 100 {
        return Err(BuildError::RetryShareRoundsToZero {
            class: classes.and_then(|classes| classes.name(lowest).map(str::to_owned)),
            share,
            limit: smallest,
        });
    }
    Ok(())
}
