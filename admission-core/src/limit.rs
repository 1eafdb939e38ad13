//! Limits as the ledgers store them. Configuration says 0 for "unlimited"; stored, that
//! is `UNLIMITED`, so the admit path compares against one number with no special case.

use crate::CapacityError;

/// A stored limit no count can reach.
pub(crate) const UNLIMITED: u64 = u64::MAX;

/// The stored form of a configured `value` (0 for unlimited), or an error above `maximum`.
pub(crate) fn encode(value: u64, maximum: u64) -> Result<u64, CapacityError> {
    let value = CapacityError::check(value, maximum)?;
    Ok(if value == 0 { UNLIMITED } else { value })
}

/// The configured form of a stored limit: 0 for unlimited.
pub(crate) fn decode(stored: u64) -> u64 {
    if stored == UNLIMITED { 0 } else { stored }
}
