//! scratch
use admission_core::KeyedLedger;
use std::hint::black_box;
fn main() {
    let n: u64 = std::env::args().nth(1).unwrap().parse().unwrap();
    let which = std::env::args().nth(2).unwrap();
    let ledger = KeyedLedger::new(1024).unwrap();
    let _r: Vec<_> = (0..1000u64)
        .map(|k| ledger.try_acquire(&k).unwrap())
        .collect();
    let floor = admission_bench::KeyedFloor::new(1000, 1024);
    if which == "ours" {
        for i in 0..n {
            drop(black_box(ledger.try_acquire(&(i % 1000)).unwrap()));
        }
    } else if which == "first" {
        for i in 0..n {
            drop(black_box(ledger.try_acquire(&(i + 1_000_000)).unwrap()));
        }
    } else {
        for i in 0..n {
            assert!(floor.cycle(black_box(i % 1000)));
        }
    }
}
