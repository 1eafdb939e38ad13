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
//! key each time). All hash with the standard library's `RandomState`.

use std::collections::HashMap;
use std::hint::black_box;

use admission_core::KeyedLedger;
use parking_lot::Mutex;

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(variant), Some(n)) = (args.next(), args.next().and_then(|n| n.parse().ok())) else {
        eprintln!("usage: keyed_loop <first_seen|existing|mutex_first_seen> <iterations>");
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
