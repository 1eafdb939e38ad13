//! How a fleet cap names things in Redis: a key's leases (the key as their hash tag),
//! and this replica.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use admission_core::Key;

/// Whether another replica can name `key`: not a digest (see [`lease_name`]).
#[inline]
pub(crate) fn nameable(key: &Key) -> bool {
    key.as_bytes().is_some() || key.ip().is_some() || *key == Key::MISSING
}

/// The Redis name of `key`'s leases under `prefix`; `None` for a key held as a digest,
/// whose secret is the process's own, so that no other replica could name it. The key
/// is the name's hash tag (in braces): on a cluster, its slot follows the key, whatever
/// braces the key itself holds.
pub(crate) fn lease_name(prefix: &str, key: &Key) -> Option<Vec<u8>> {
    let mut name = Vec::with_capacity(prefix.len() + 58);
    name.extend_from_slice(prefix.as_bytes());
    if let Some(ip) = key.ip() {
        name.extend_from_slice(format!(":{{ip:{ip}}}").as_bytes());
    } else if *key == Key::MISSING {
        name.extend_from_slice(b":{missing}");
    } else {
        name.extend_from_slice(b":{key:");
        name.extend_from_slice(key.as_bytes()?);
        name.push(b'}');
    }
    Some(name)
}

/// The key a lease name under `prefix` names (see [`lease_name`]).
pub(crate) fn key_named(prefix: &str, name: &[u8]) -> Option<Key> {
    let rest = name.strip_prefix(prefix.as_bytes())?;
    let tag = rest.strip_prefix(b":{")?.strip_suffix(b"}")?;
    if let Some(ip) = tag.strip_prefix(b"ip:") {
        let ip: IpAddr = std::str::from_utf8(ip).ok()?.parse().ok()?;
        Some(Key::from(ip))
    } else if tag == b"missing" {
        Some(Key::MISSING)
    } else {
        tag.strip_prefix(b"key:").map(Key::from)
    }
}

/// A name no other replica has: the host's process id, the time, and an address.
pub(crate) fn replica_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{}-{}-{n}", std::process::id(), now.as_nanos())
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use admission_core::Key;

    use super::{key_named, lease_name, nameable};

    #[test]
    fn a_key_is_named_by_its_value_and_a_digest_not_at_all() {
        let ip = Key::from(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let text = Key::from("127.0.0.1");
        let long = Key::from("k".repeat(100).as_str());
        for key in [ip, text, Key::MISSING] {
            assert!(nameable(&key), "{key:?}");
        }
        assert!(!nameable(&long));
        let name = |key: &Key| lease_name("p", key).map(|n| String::from_utf8(n).unwrap());
        assert_eq!(name(&ip).as_deref(), Some("p:{ip:127.0.0.1}"));
        assert_eq!(name(&text).as_deref(), Some("p:{key:127.0.0.1}"));
        assert_eq!(name(&Key::MISSING).as_deref(), Some("p:{missing}"));
        assert_eq!(name(&long), None);
    }

    #[test]
    fn a_lease_name_names_its_key_back() {
        let keys = [
            Key::from(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            Key::from("acme"),
            Key::from("has space:and colon"),
            Key::from("{braces}}"),
            Key::MISSING,
        ];
        for key in keys {
            let name = lease_name("fleet", &key).unwrap();
            assert_eq!(key_named("fleet", &name), Some(key), "{key:?}");
            assert_eq!(key_named("other", &name), None);
        }
        assert_eq!(key_named("fleet", b"fleet:{ip:not-an-ip}"), None);
        assert_eq!(key_named("fleet", b"fleet:{else}"), None);
        assert_eq!(key_named("fleet", b"fleet:{key:open"), None);
    }
}
