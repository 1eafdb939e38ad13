//! A request its key's lease refused, or would refuse: the lease is asked to grow, once
//! (see [`crate::Leases`]), before the request is admitted again.

use http::request::Parts;

use crate::shared::Shared;

/// Asks the lease of the request's key for more slots while the request holds nothing, and
/// waits for the answer; `false` on a layer without leases or a request without a key
/// (nothing to ask).
pub(super) async fn grow_lease(shared: &Shared, parts: &Parts) -> bool {
    let leases = (shared.settings.keys.as_ref()).and_then(|keys| keys.leases.as_ref());
    let (Some(leases), Some(key)) = (leases, shared.key_of(parts)) else {
        return false;
    };
    leases.grow(&key).await;
    true
}
