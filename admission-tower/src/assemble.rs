//! From a builder's settings to a layer: what `build` checks (each mistake a
//! [`BuildError`]), and the shared state it assembles.

use admission_core::{Classes, Gate, Priority};

use crate::observe::Observer;
use crate::pacer::Pacing;
use crate::shared::{Settings, Shared};
use crate::{AdmissionBuilder, AdmissionLayer, BuildError, PerKey, Retries};

impl AdmissionBuilder<Gate> {
    /// The layer over `self.gate`, the configuration checked.
    pub(crate) fn finish(self) -> Result<AdmissionLayer, BuildError> {
        if let Some(zero) = self.draft.connections.zero() {
            return Err(BuildError::ZeroConnectionLimit(zero));
        }
        let gate = self.gate;
        let memory_limit = self
            .draft
            .memory
            .as_ref()
            .map(|memory| memory.budget.limit());
        let follower = self
            .draft
            .memory
            .and_then(|memory| memory.start(gate.bytes()));
        let (adaptive, sample_at) = match self.draft.adaptive {
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
        if let Some((classes, _)) = &self.draft.classes {
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
        if let Some(retries) = &self.draft.retries {
            check_retries(
                retries,
                self.draft.classes.as_ref().map(|(c, _)| c),
                smallest,
            )?;
        }
        #[cfg(feature = "tokio")]
        if let Some(wait) = &self.draft.wait {
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
        if let Some(wait) = &self.draft.wait {
            gate.count().set_max_waiting(wait.max_waiting);
            gate.count().set_standing_queue(wait.interval, wait.target);
        }
        #[cfg(feature = "tokio")]
        let turns = self.draft.fair.is_some() && self.draft.wait.is_some();
        let fair_key = self.draft.fair.and_then(|fair| fair.key);
        let keys = (self.draft.per_key.map(PerKey::into_policy))
            .or_else(|| fair_key.map(PerKey::policy_of));
        if let (Some(leases), Some(keyed)) =
            (keys.as_ref().and_then(|k| k.leases.as_ref()), gate.keyed())
        {
            leases
                .attach(keyed, &self.draft.report.name)
                .map_err(|_| BuildError::LeasesTaken)?;
        }
        let observer = Observer::new(
            &self.draft.report,
            &gate,
            self.draft.classes.as_ref().map(|(classes, _)| classes),
            memory_limit.map(|limit| limit.bytes()),
        );
        let pacer = (self.draft.slow.min_response_rate())
            .map(|rate| Pacing::new(rate, observer.stall_report()));
        let settings = Settings {
            keys,
            bypass: self.draft.bypass,
            classes: self.draft.classes,
            seats: self.draft.seats,
            retries: self.draft.retries,
            refusals: self.draft.refusals,
            hook: self.draft.hook,
            dry_run: self.draft.dry_run,
            observer,
            adaptive,
            sample_at,
            slow: self.draft.slow,
            pacer,
            #[cfg(feature = "tokio")]
            wait: self.draft.wait,
            #[cfg(feature = "tokio")]
            turns,
            memory: memory_limit,
            _follower: follower,
            ..Settings::over(gate)
        };
        Ok(AdmissionLayer::from_parts(
            Shared::new(settings),
            self.draft.connections,
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
