//! Runs one keyed acquire-release cycle N times, for instruction counts under callgrind
//! (see `layer_loop`, the same method):
//!
//! ```sh
//! cargo build --release -p admission-bench --example keyed_loop
//! valgrind --tool=callgrind target/release/examples/keyed_loop first_seen 100000
//! valgrind --tool=callgrind target/release/examples/keyed_loop first_seen 200000
//! ```
//!
//! The difference of the two totals over 100,000 is the cost of one cycle. Variants, as the
//! `keyed` bench group has them: `first_seen` (`KeyedLedger`, a new key each time: the
//! entry is made and emptied), `existing` (`KeyedLedger`, 1,000 keys cycled, each
//! already holding a permit), `mutex_first_seen` (`parking_lot::Mutex<HashMap>`, a new
//! key each time), `dashmap` (the DashMap + semaphore port, existing keys) and
//! `keyed_floor` (`KeyedFloor`); and the path the layer takes, a `Key` made from a header value
//! (`key_header`, `dashmap_key_header`) or a peer address (`key_peer`,
//! `dashmap_key_peer`), each made in the loop as the layer makes it per request. Each
//! side with its default hasher.

use std::collections::HashMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use admission_bench::KeyedFloor;
use admission_core::{Key, KeyedLedger};
use dashmap::DashMap;
use parking_lot::Mutex;
use tokio::sync::Semaphore;

/// The keys cycled through: 1,000, each already holding a permit.
const KEYS: u64 = 1000;

/// The header values of the 1,000 keys: API keys of the usual length (32 bytes).
fn headers() -> Vec<[u8; 32]> {
    (0..KEYS)
        .map(|n| {
            let mut value = *b"k-000000000000000000000000000000";
            value[2..22].copy_from_slice(format!("{n:020}").as_bytes());
            value
        })
        .collect()
}

/// The `n`th peer address.
fn peer(n: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n as u32))
}

/// Cycles `n` acquisitions through the 1,000 keys `key` makes, each already holding one.
fn ours(n: u64, key: impl Fn(u64) -> Key) {
    let ledger = KeyedLedger::new(1024).expect("a valid cap");
    let resident: Vec<_> = (0..KEYS).map(|k| ledger.try_acquire(&key(k))).collect();
    for i in 0..n {
        drop(black_box(ledger.try_acquire(&key(i % KEYS))));
    }
    drop(resident);
}

/// [`ours`], with the DashMap + semaphore port.
fn theirs<K: std::hash::Hash + Eq>(n: u64, key: impl Fn(u64) -> K) {
    let map: DashMap<K, Arc<Semaphore>> = (0..KEYS)
        .map(|k| (key(k), Arc::new(Semaphore::new(1024))))
        .collect();
    for i in 0..n {
        let semaphore = map.get(&key(i % KEYS)).expect("resident").clone();
        drop(black_box(semaphore.try_acquire_owned()));
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(variant), Some(n)) = (args.next(), args.next().and_then(|n| n.parse().ok())) else {
        eprintln!("usage: keyed_loop <variant> <iterations> (see the file's docs)");
        std::process::exit(2);
    };
    let n: u64 = n;
    match variant.as_str() {
        "first_seen" => {
            let ledger = KeyedLedger::new(1024).expect("a valid cap");
            for key in 0..n {
                drop(black_box(ledger.try_acquire(&key)));
            }
        }
        "existing" => {
            let ledger = KeyedLedger::new(1024).expect("a valid cap");
            let resident: Vec<_> = (0..1000_u64).map(|k| ledger.try_acquire(&k)).collect();
            for key in 0..n {
                drop(black_box(ledger.try_acquire(&(key % 1000))));
            }
            drop(resident);
        }
        "dashmap" => theirs(n, |k| k),
        "keyed_floor" => {
            let floor = KeyedFloor::new(KEYS, 1024);
            for key in 0..n {
                assert!(floor.cycle(black_box(key % KEYS)));
            }
        }
        "key_header" => {
            let headers = headers();
            ours(n, |k| Key::from_bytes(&headers[k as usize]))
        }
        "dashmap_key_header" => {
            let headers = headers();
            theirs(n, |k| Key::from_bytes(&headers[k as usize]))
        }
        "key_peer" => ours(n, |k| Key::from(peer(k))),
        "dashmap_key_peer" => theirs(n, |k| Key::from(peer(k))),
        "mutex_first_seen" => {
            let map: Mutex<HashMap<u64, usize>> = Mutex::new(HashMap::new());
            for key in 0..n {
                *map.lock().entry(key).or_insert(0) += 1;
                let mut map = map.lock();
                let held = map.get_mut(&key).expect("just inserted");
                *held -= 1;
                if *held == 0 {
                    map.remove(&key);
                }
            }
        }
        other => {
            eprintln!("keyed_loop: no variant {other}");
            std::process::exit(2);
        }
    }
}
