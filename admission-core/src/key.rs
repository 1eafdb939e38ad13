//! `Key`: the default key of keyed limits.

use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;

/// What kind of value a [`Key`] holds; part of its identity.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The value's bytes, exactly.
    Exact,
    /// A 128-bit digest of a value longer than [`Key::INLINE`].
    Digest,
    Ipv4,
    Ipv6,
    /// [`Key::MISSING`].
    Missing,
}

/// A compact owned key for keyed limits: a client's IP address, or an identifier (an API
/// key, a tenant, a subject) of up to [`INLINE`](Self::INLINE) bytes held exactly.
///
/// Made from a request without allocating and without holding on to the request: a
/// `HeaderValue` kept as a key would keep the buffer it points into (hyper reads a whole
/// request head into one) alive for as long as the key has work in flight, and a `String`
/// allocates on every request. A `Key` is 48 bytes, `Copy`, and hashes only the 16-byte
/// words its value fills (one for an address or a value of up to 14 bytes).
///
/// A longer value is held as a 128-bit digest keyed by a per-process random secret (two
/// independently keyed SipHash instances of the standard library's `RandomState`): two
/// different long values share a key only by a collision no client can aim for.
///
/// ```
/// use std::net::{IpAddr, Ipv4Addr};
/// use admission_core::Key;
///
/// let tenant = Key::from("tenant-42");
/// assert_eq!(tenant.as_bytes(), Some(&b"tenant-42"[..]));
/// let peer = Key::from(IpAddr::V4(Ipv4Addr::LOCALHOST));
/// assert_eq!(peer.ip(), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
/// assert_ne!(Key::from("127.0.0.1"), peer, "an address is not the text of one");
///
/// let long = "k".repeat(100);
/// assert_eq!(Key::from(long.as_str()), Key::from(long.as_str()));
/// assert!(Key::from(long.as_str()).as_bytes().is_none(), "held as a digest");
/// ```
#[derive(Clone, Copy)]
pub struct Key {
    kind: Kind,
    len: u8,
    bytes: [u8; Key::INLINE],
}

impl Key {
    /// The longest value held exactly; longer ones are held as a digest.
    pub const INLINE: usize = 46;

    /// The key of requests that carry none (no such header, no peer address): equal only
    /// to itself, so it is no client's identifier, empty or otherwise.
    ///
    /// ```
    /// use admission_core::Key;
    ///
    /// assert_eq!(Key::MISSING, Key::MISSING);
    /// assert_ne!(Key::MISSING, Key::from(""));
    /// assert_eq!(format!("{:?}", Key::MISSING), "Key(<missing>)");
    /// ```
    pub const MISSING: Key = Key {
        kind: Kind::Missing,
        len: 0,
        bytes: [0; Key::INLINE],
    };

    /// A key for `value`: exact up to [`INLINE`](Self::INLINE) bytes, a digest beyond.
    ///
    /// ```
    /// use admission_core::Key;
    ///
    /// assert_eq!(Key::from_bytes(b"abc"), Key::from("abc"));
    /// ```
    pub fn from_bytes(value: &[u8]) -> Self {
        if value.len() <= Self::INLINE {
            return Self::with(Kind::Exact, value);
        }
        let (a, b) = digest_keys();
        let mut digest = [0; 16];
        digest[..8].copy_from_slice(&a.hash_one(value).to_le_bytes());
        digest[8..].copy_from_slice(&b.hash_one(value).to_le_bytes());
        Self::with(Kind::Digest, &digest)
    }

    fn with(kind: Kind, value: &[u8]) -> Self {
        let mut bytes = [0; Self::INLINE];
        bytes[..value.len()].copy_from_slice(value);
        Self {
            kind,
            // At most INLINE (46) here.
            len: value.len() as u8,
            bytes,
        }
    }

    fn used(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The value, when it is held exactly (not an address, not a digest).
    ///
    /// ```
    /// use admission_core::Key;
    ///
    /// assert_eq!(Key::from("alice").as_bytes(), Some(&b"alice"[..]));
    /// ```
    pub fn as_bytes(&self) -> Option<&[u8]> {
        (self.kind == Kind::Exact).then(|| self.used())
    }

    /// The address, when the key is one.
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use admission_core::Key;
    ///
    /// let peer: SocketAddr = "[::1]:443".parse()?;
    /// assert_eq!(Key::from(peer).ip(), Some(peer.ip()), "the port is not part of it");
    /// # Ok::<(), std::net::AddrParseError>(())
    /// ```
    pub fn ip(&self) -> Option<IpAddr> {
        match self.kind {
            Kind::Ipv4 => <[u8; 4]>::try_from(self.used()).ok().map(IpAddr::from),
            Kind::Ipv6 => <[u8; 16]>::try_from(self.used()).ok().map(IpAddr::from),
            _ => None,
        }
    }
}

/// The two secrets long values are digested with: random, once per process.
fn digest_keys() -> &'static (std::hash::RandomState, std::hash::RandomState) {
    static KEYS: OnceLock<(std::hash::RandomState, std::hash::RandomState)> = OnceLock::new();
    KEYS.get_or_init(|| (std::hash::RandomState::new(), std::hash::RandomState::new()))
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        // The bytes past `len` are zero (`with`), so the whole arrays compare as the bytes
        // used do, in a compare of fixed size.
        self.kind == other.kind && self.len == other.len && self.bytes == other.bytes
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The kind, the length and the bytes used, in 16-byte words: as many as the length
        // needs (an address, a short identifier: one), since the bytes past `len` are zero
        // (`with`). Words, not a slice: a hasher takes a word in one step.
        let word = |at: usize| {
            let mut word = [0; 16];
            word.copy_from_slice(&self.bytes[at..at + 16]);
            u128::from_le_bytes(word)
        };
        let head = u128::from(self.kind as u8) << 8 | u128::from(self.len);
        let mut first = [0; 16];
        first[2..].copy_from_slice(&self.bytes[..14]);
        state.write_u128(head | u128::from_le_bytes(first));
        if self.len > 14 {
            state.write_u128(word(14));
        }
        if self.len > 30 {
            state.write_u128(word(30));
        }
    }
}

impl From<&str> for Key {
    fn from(value: &str) -> Self {
        Self::from_bytes(value.as_bytes())
    }
}

impl From<&[u8]> for Key {
    fn from(value: &[u8]) -> Self {
        Self::from_bytes(value)
    }
}

impl From<u64> for Key {
    /// A numeric identifier (a user id, say), by its little-endian bytes.
    fn from(value: u64) -> Self {
        Self::with(Kind::Exact, &value.to_le_bytes())
    }
}

impl From<IpAddr> for Key {
    /// An address. An IPv4-mapped IPv6 address is the IPv4 address it maps, so a client
    /// is one key whichever way the listener saw it.
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self::with(Kind::Ipv4, &v4.octets()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self::with(Kind::Ipv4, &v4.octets()),
                None => Self::with(Kind::Ipv6, &v6.octets()),
            },
        }
    }
}

impl From<SocketAddr> for Key {
    /// The address's IP; the port is not part of the key (one client, many connections).
    fn from(addr: SocketAddr) -> Self {
        Self::from(addr.ip())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.kind, self.ip()) {
            (_, Some(ip)) => write!(f, "Key({ip})"),
            (Kind::Exact, _) => match std::str::from_utf8(self.used()) {
                Ok(text) => write!(f, "Key({text:?})"),
                Err(_) => write!(f, "Key({:x?})", self.used()),
            },
            (Kind::Missing, _) => f.write_str("Key(<missing>)"),
            _ => f.write_str("Key(<digest>)"),
        }
    }
}

#[cfg(all(test, not(admission_loom)))]
mod tests {
    use super::*;
    use std::collections::hash_map::RandomState;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn equal_values_are_equal_keys_with_equal_hashes_and_kinds_never_mix() {
        let s = RandomState::new();
        for (a, b) in [
            (Key::from("x"), Key::from(&b"x"[..])),
            (Key::from("".repeat(0).as_str()), Key::from_bytes(b"")),
            (
                Key::from("y".repeat(47).as_str()),
                Key::from_bytes(&[b'y'; 47]),
            ),
        ] {
            assert_eq!(a, b);
            assert_eq!(s.hash_one(a), s.hash_one(b));
        }
        let v4 = Ipv4Addr::new(10, 0, 0, 1);
        assert_ne!(Key::from(IpAddr::V4(v4)), Key::from_bytes(&v4.octets()));
        assert_eq!(
            Key::from(IpAddr::V4(v4)),
            Key::from(IpAddr::V6(v4.to_ipv6_mapped()))
        );
        assert_ne!(
            Key::from(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            Key::from(IpAddr::V4(v4))
        );
        assert_ne!(Key::from(1_u64), Key::from(2_u64));
    }

    #[test]
    fn different_keys_hash_apart_and_an_address_key_gives_its_address_back() {
        let s = RandomState::new();
        // Equal hashes would still be correct, but every key in one bucket: the ledger's
        // defence against flooding is a hash of the whole value.
        assert_ne!(s.hash_one(Key::from("a")), s.hash_one(Key::from("b")));
        assert_ne!(s.hash_one(Key::from(1_u64)), s.hash_one(Key::from(2_u64)));
        for ip in [
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)),
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 9)),
        ] {
            assert_eq!(Key::from(ip).ip(), Some(ip));
        }
        assert_eq!(Key::from("192.0.2.7").ip(), None);
    }

    /// Every byte used takes part in the hash, in whichever of its words it falls, and
    /// the length does too (a value and the same with a zero byte more differ).
    #[test]
    fn every_byte_used_and_the_length_take_part_in_the_hash() {
        let s = crate::KeyState::new();
        // The kind too: an address and a value of the same bytes.
        let v4 = Key::from(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
        assert_ne!(s.hash_one(v4), s.hash_one(Key::from_bytes(&[10, 0, 0, 1])));
        for len in [1, 13, 14, 15, 29, 30, 31, 45, Key::INLINE] {
            let value = vec![b'v'; len];
            for at in [0, len / 2, len - 1] {
                let mut other = value.clone();
                other[at] = b'w';
                let (a, b) = (Key::from_bytes(&value), Key::from_bytes(&other));
                assert_ne!(s.hash_one(a), s.hash_one(b), "length {len}, byte {at}");
            }
            let mut longer = value.clone();
            longer.push(0);
            if longer.len() <= Key::INLINE {
                let (a, b) = (Key::from_bytes(&value), Key::from_bytes(&longer));
                assert_ne!(a, b);
                assert_ne!(
                    s.hash_one(a),
                    s.hash_one(b),
                    "length {len} and one more zero"
                );
            }
        }
    }

    #[test]
    fn values_up_to_inline_are_exact_and_longer_ones_are_digests_that_still_differ() {
        let at = "a".repeat(Key::INLINE);
        assert_eq!(Key::from(at.as_str()).as_bytes(), Some(at.as_bytes()));
        let (long_a, long_b) = ("a".repeat(Key::INLINE + 1), "b".repeat(Key::INLINE + 1));
        assert!(Key::from(long_a.as_str()).as_bytes().is_none());
        assert_ne!(Key::from(long_a.as_str()), Key::from(long_b.as_str()));
        // A digest never equals an exact value of the same bytes.
        let digest = Key::from(long_a.as_str());
        assert_ne!(digest, Key::from_bytes(digest.used()));
        assert_eq!(format!("{digest:?}"), "Key(<digest>)");
    }

    #[test]
    fn debug_shows_text_addresses_and_raw_bytes() {
        assert_eq!(format!("{:?}", Key::from("t1")), r#"Key("t1")"#);
        assert_eq!(
            format!("{:?}", Key::from(IpAddr::V4(Ipv4Addr::LOCALHOST))),
            "Key(127.0.0.1)"
        );
        assert_eq!(format!("{:?}", Key::from_bytes(&[0xff])), "Key([ff])");
        assert_eq!(format!("{:?}", Key::MISSING), "Key(<missing>)");
        assert_eq!(std::mem::size_of::<Key>(), 48);
    }
}
