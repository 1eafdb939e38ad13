//! What a fleet cap's builder refuses.

use std::fmt;

/// A setting [`FleetCapBuilder::build`](crate::FleetCapBuilder::build) refuses.
#[derive(Debug)]
#[non_exhaustive]
pub enum FleetError {
    /// A cap, chunk, time to live, grant timeout or most grants under way of 0: it would
    /// refuse everything or never renew. Names the setting.
    Zero(&'static str),
    /// A grant timeout not below a third of the time to live: a slow Redis would let
    /// leases expire between renewals.
    SlowGrant,
    /// The Redis client could not be set up (its URL, say).
    Redis(redis::RedisError),
    /// The thread that keeps the cap's clock could not be started.
    Thread(std::io::Error),
    /// `build` was called outside a tokio runtime: the cap's upkeep and its Redis
    /// connection run on the runtime it is built in.
    NoRuntime,
}

impl fmt::Display for FleetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FleetError::Zero("cap") => f.write_str(
                "a fleet cap of 0 would refuse every request: give the most a key may have in flight across the fleet, at least 1",
            ),
            FleetError::Zero(what) => write!(
                f,
                "a fleet cap's `{what}` of 0 would refuse every request or never renew: leave the setter out for its default, or give at least 1"
            ),
            FleetError::SlowGrant => {
                f.write_str("the grant timeout must be below a third of the leases' time to live")
            }
            FleetError::Redis(_) => f.write_str("the Redis client could not be set up"),
            FleetError::Thread(_) => f.write_str("the fleet cap's clock thread could not start"),
            FleetError::NoRuntime => f.write_str(
                "a fleet cap is built inside a tokio runtime (in `#[tokio::main]`, or after `Runtime::enter`): its upkeep runs there",
            ),
        }
    }
}

impl std::error::Error for FleetError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FleetError::Redis(error) => Some(error),
            FleetError::Thread(error) => Some(error),
            _ => None,
        }
    }
}
