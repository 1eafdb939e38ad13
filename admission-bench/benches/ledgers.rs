//! Hot-path benches of the ledgers beside what a user would pick instead, group by group.
//!
//! Read the results as ratios within one run; absolute times drift on shared machines.
//! `cargo run -p admission-bench --bin report` prints the table of ratios.

use std::collections::HashMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use admission_bench::{ArcPermit, Floor, KeyedFloor};
use admission_core::adaptive::{AdaptiveLimit, Gradient, Outcome};
use admission_core::{ByteLedger, CountLedger, Gate, Key, KeyedLedger, Priority};
use criterion::{Criterion, criterion_group, criterion_main};
use dashmap::DashMap;
use parking_lot::Mutex;
use tokio::sync::Semaphore;

const CAPACITY: usize = 1024;
const CHARGE: u64 = 4096;
const BUDGET: u64 = 64 << 20;
const KEYS: u64 = 1000;

fn count(c: &mut Criterion) {
    let mut g = c.benchmark_group("count");
    let floor = Floor::new(CAPACITY as u64);
    g.bench_function("floor", |b| {
        b.iter(|| {
            assert!(floor.try_acquire(black_box(1)));
            floor.release(1);
        })
    });
    g.bench_function("floor_optimistic_add", |b| {
        b.iter(|| {
            assert!(floor.try_acquire_optimistic(black_box(1)));
            floor.release(1);
        })
    });
    let arc_floor = Arc::new(Floor::new(CAPACITY as u64));
    g.bench_function("floor_plus_arc_permit", |b| {
        b.iter(|| drop(black_box(ArcPermit::try_acquire(&arc_floor).unwrap())))
    });
    let ledger = CountLedger::new(CAPACITY).unwrap();
    g.bench_function("admission", |b| {
        b.iter(|| drop(black_box(ledger.try_acquire().unwrap())))
    });
    // The same ledger, with a priority class (its share computed from the threshold).
    // The class is a run-time value (opaque to the compiler, as a classifier's answer
    // is), chosen once: it lives in registers, as a request's class would.
    let class = black_box(Priority::SHEDDABLE);
    g.bench_function("admission_class", |b| {
        b.iter(|| drop(black_box(ledger.try_acquire_as(class).unwrap())))
    });
    let sem = Arc::new(Semaphore::new(CAPACITY));
    g.bench_function("tokio_try_acquire", |b| {
        b.iter(|| drop(black_box(sem.try_acquire().unwrap())))
    });
    g.bench_function("tokio_try_acquire_owned", |b| {
        b.iter(|| drop(black_box(sem.clone().try_acquire_owned().unwrap())))
    });
    let mutex = Mutex::new(0_usize);
    g.bench_function("mutex_counter", |b| {
        b.iter(|| {
            {
                let mut n = mutex.lock();
                assert!(*n < CAPACITY);
                *n += 1;
            }
            *mutex.lock() -= 1;
        })
    });
    g.finish();
}

fn bytes(c: &mut Criterion) {
    let mut g = c.benchmark_group("bytes");
    let floor = Floor::new(BUDGET);
    g.bench_function("floor", |b| {
        b.iter(|| {
            assert!(floor.try_acquire(black_box(CHARGE)));
            floor.release(CHARGE);
        })
    });
    let ledger = ByteLedger::new(BUDGET).unwrap();
    g.bench_function("admission", |b| {
        b.iter(|| drop(black_box(ledger.try_charge(black_box(CHARGE)).unwrap())))
    });
    let sem = Arc::new(Semaphore::new(BUDGET as usize));
    g.bench_function("tokio_try_acquire_many_owned", |b| {
        b.iter(|| {
            drop(black_box(
                sem.clone().try_acquire_many_owned(CHARGE as u32).unwrap(),
            ))
        })
    });
    g.finish();
}

fn keyed(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed");
    // Existing keys: every key already has a permit in flight, so its entry exists.
    let ledger = KeyedLedger::new(CAPACITY).unwrap();
    let _resident: Vec<_> = (0..KEYS).map(|k| ledger.try_acquire(&k).unwrap()).collect();
    let mut key = 0;
    g.bench_function("admission", |b| {
        b.iter(|| {
            key = (key + 1) % KEYS;
            drop(black_box(ledger.try_acquire(&key).unwrap()));
        })
    });
    let map: Mutex<HashMap<u64, usize>> = Mutex::new((0..KEYS).map(|k| (k, 1)).collect());
    g.bench_function("mutex_hashmap", |b| {
        b.iter(|| {
            key = (key + 1) % KEYS;
            mutex_hashmap_acquire(&map, key);
            mutex_hashmap_release(&map, key);
        })
    });
    let dash: DashMap<u64, Arc<Semaphore>> = (0..KEYS)
        .map(|k| (k, Arc::new(Semaphore::new(CAPACITY))))
        .collect();
    g.bench_function("dashmap_semaphore", |b| {
        b.iter(|| {
            key = (key + 1) % KEYS;
            drop(black_box(dashmap_acquire(&dash, key)));
        })
    });
    // The floor: hash, find the key's counter, one compare-exchange in, one subtract out.
    let floor = KeyedFloor::new(KEYS, CAPACITY as u64);
    g.bench_function("floor", |b| {
        b.iter(|| {
            key = (key + 1) % KEYS;
            assert!(floor.cycle(black_box(key)));
        })
    });
    // Ours with SipHash (the standard library's `RandomState`), as a user who opts for it
    // with `with_hasher` runs it; and the port with foldhash, ours's default.
    let sip = KeyedLedger::with_hasher(CAPACITY, std::hash::RandomState::new()).unwrap();
    let _resident_sip: Vec<_> = (0..KEYS).map(|k| sip.try_acquire(&k).unwrap()).collect();
    g.bench_function("admission_siphash", |b| {
        b.iter(|| {
            key = (key + 1) % KEYS;
            drop(black_box(sip.try_acquire(&key).unwrap()));
        })
    });
    let dash_fast: DashMap<u64, Arc<Semaphore>, foldhash::fast::RandomState> =
        DashMap::with_hasher(Default::default());
    for k in 0..KEYS {
        dash_fast.insert(k, Arc::new(Semaphore::new(CAPACITY)));
    }
    g.bench_function("dashmap_semaphore_foldhash", |b| {
        b.iter(|| {
            key = (key + 1) % KEYS;
            let sem = dash_fast.get(&key).unwrap().clone();
            drop(black_box(sem.try_acquire_owned().unwrap()));
        })
    });
    // The layer's path: a `Key` made per request from a header value (an API key of 32
    // bytes) or a peer address, on both sides.
    let headers: Vec<[u8; 32]> = (0..KEYS)
        .map(|k| {
            let mut value = *b"k-000000000000000000000000000000";
            value[2..22].copy_from_slice(format!("{k:020}").as_bytes());
            value
        })
        .collect();
    let header = |k: u64| Key::from_bytes(&headers[k as usize]);
    let peer = |k: u64| Key::from(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + k as u32)));
    for (name, key_of) in [
        ("key_header", &header as &dyn Fn(u64) -> Key),
        ("key_peer", &peer),
    ] {
        let ledger = KeyedLedger::new(CAPACITY).unwrap();
        let _resident: Vec<_> = (0..KEYS)
            .map(|k| ledger.try_acquire(&key_of(k)).unwrap())
            .collect();
        g.bench_function(format!("admission_{name}"), |b| {
            b.iter(|| {
                key = (key + 1) % KEYS;
                drop(black_box(ledger.try_acquire(&key_of(key)).unwrap()));
            })
        });
        let dash: DashMap<Key, Arc<Semaphore>> = (0..KEYS)
            .map(|k| (key_of(k), Arc::new(Semaphore::new(CAPACITY))))
            .collect();
        g.bench_function(format!("dashmap_{name}"), |b| {
            b.iter(|| {
                key = (key + 1) % KEYS;
                let sem = dash.get(&key_of(key)).unwrap().clone();
                drop(black_box(sem.try_acquire_owned().unwrap()));
            })
        });
    }
    // First-seen keys: each acquire creates the key's entry, each release removes it.
    let fresh = KeyedLedger::new(CAPACITY).unwrap();
    let mut next = 0_u64;
    g.bench_function("admission_first_seen", |b| {
        b.iter(|| {
            next += 1;
            drop(black_box(fresh.try_acquire(&next).unwrap()));
        })
    });
    let fresh_map: Mutex<HashMap<u64, usize>> = Mutex::new(HashMap::new());
    g.bench_function("mutex_hashmap_first_seen", |b| {
        b.iter(|| {
            next += 1;
            mutex_hashmap_acquire(&fresh_map, next);
            mutex_hashmap_release(&fresh_map, next);
        })
    });
    g.finish();
}

fn mutex_hashmap_acquire(map: &Mutex<HashMap<u64, usize>>, key: u64) {
    let mut map = map.lock();
    let n = map.entry(key).or_insert(0);
    assert!(*n < CAPACITY);
    *n += 1;
}

fn mutex_hashmap_release(map: &Mutex<HashMap<u64, usize>>, key: u64) {
    let mut map = map.lock();
    let n = map.get_mut(&key).unwrap();
    *n -= 1;
    if *n == 0 {
        map.remove(&key);
    }
}

/// The straightforward port of a per-subject limiter: a semaphore per key in a DashMap.
fn dashmap_acquire(
    map: &DashMap<u64, Arc<Semaphore>>,
    key: u64,
) -> tokio::sync::OwnedSemaphorePermit {
    let sem = map
        .entry(key)
        .or_insert_with(|| Arc::new(Semaphore::new(CAPACITY)))
        .clone();
    sem.try_acquire_owned().unwrap()
}

fn gate(c: &mut Criterion) {
    let mut g = c.benchmark_group("gate");
    let gate = Gate::<u64>::builder()
        .count(CAPACITY)
        .bytes(BUDGET)
        .per_key(CAPACITY)
        .build()
        .unwrap();
    let _resident: Vec<_> = (0..KEYS)
        .map(|k| gate.keyed().unwrap().try_acquire(&k).unwrap())
        .collect();
    let mut key = 0;
    g.bench_function("admission_three_dimensions", |b| {
        b.iter(|| {
            key = (key + 1) % KEYS;
            drop(black_box(gate.try_admit(Some(&key), CHARGE).unwrap()));
        })
    });
    let (count, bytes, keys) = (gate.count(), gate.bytes().unwrap(), gate.keyed().unwrap());
    g.bench_function("sum_of_parts", |b| {
        b.iter(|| {
            key = (key + 1) % KEYS;
            let c = count.try_acquire().unwrap();
            let k = keys.try_acquire(&key).unwrap();
            let b = bytes.try_charge(CHARGE).unwrap();
            drop(black_box((c, k, b)));
        })
    });
    g.finish();
}

/// `threads` threads on one ledger at once. Each thread runs `iters` acquire-release
/// cycles after a barrier, calling `op(thread, i)`; the reported time is the slowest
/// thread's wall time divided by `iters`, i.e. the latency of one cycle while the others
/// do the same. One thread runs on the caller's.
fn on_threads(threads: u64, iters: u64, op: impl Fn(u64, u64) + Sync) -> Duration {
    let barrier = Barrier::new(threads as usize);
    let run = |t: u64| {
        barrier.wait();
        let start = Instant::now();
        for i in 0..iters {
            op(t, i);
        }
        start.elapsed()
    };
    let run = &run;
    std::thread::scope(|s| {
        let others: Vec<_> = (1..threads).map(|t| s.spawn(move || run(t))).collect();
        let mine = run(0);
        others
            .into_iter()
            .map(|other| other.join().unwrap())
            .fold(mine, Duration::max)
    })
}

/// Two threads on one ledger at once (see `on_threads`); `op` gets `i * 2 + thread`, so
/// the two threads' arguments never meet.
fn two_threads(iters: u64, op: impl Fn(u64) + Sync) -> Duration {
    on_threads(2, iters, |t, i| op(i * 2 + t))
}

fn contended(c: &mut Criterion) {
    let mut g = c.benchmark_group("contended");
    let floor = Floor::new(CAPACITY as u64);
    g.bench_function("count_floor", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |_| {
                assert!(floor.try_acquire(1));
                floor.release(1);
            })
        })
    });
    g.bench_function("count_floor_optimistic_add", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |_| {
                assert!(floor.try_acquire_optimistic(1));
                floor.release(1);
            })
        })
    });
    let ledger = CountLedger::new(CAPACITY).unwrap();
    g.bench_function("count_admission", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |_| drop(black_box(ledger.try_acquire().unwrap())))
        })
    });
    let sem = Arc::new(Semaphore::new(CAPACITY));
    g.bench_function("count_tokio_try_acquire_owned", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |_| {
                drop(black_box(sem.clone().try_acquire_owned().unwrap()))
            })
        })
    });
    let bytes = ByteLedger::new(BUDGET).unwrap();
    g.bench_function("bytes_admission", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |_| {
                drop(black_box(bytes.try_charge(CHARGE).unwrap()))
            })
        })
    });
    let big = Arc::new(Semaphore::new(BUDGET as usize));
    g.bench_function("bytes_tokio_try_acquire_many_owned", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |_| {
                drop(black_box(
                    big.clone().try_acquire_many_owned(CHARGE as u32).unwrap(),
                ))
            })
        })
    });
    let keyed = KeyedLedger::new(CAPACITY).unwrap();
    let _resident: Vec<_> = (0..KEYS).map(|k| keyed.try_acquire(&k).unwrap()).collect();
    g.bench_function("keyed_admission", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |i| {
                drop(black_box(keyed.try_acquire(&(i % KEYS)).unwrap()))
            })
        })
    });
    let dash: DashMap<u64, Arc<Semaphore>> = (0..KEYS)
        .map(|k| (k, Arc::new(Semaphore::new(CAPACITY))))
        .collect();
    g.bench_function("keyed_dashmap_semaphore", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |i| drop(black_box(dashmap_acquire(&dash, i % KEYS))))
        })
    });
    let floor = KeyedFloor::new(KEYS, CAPACITY as u64);
    g.bench_function("keyed_floor", |b| {
        b.iter_custom(|iters| two_threads(iters, |i| assert!(floor.cycle(black_box(i % KEYS)))))
    });
    g.finish();
}

/// How the cost of one acquire-release cycle grows with the threads doing it at once: 1,
/// 2 and, where the machine has the cores, 4 threads, on one count ledger (beside tokio's
/// semaphore) and on a keyed ledger, each thread on keys of its own (beside the DashMap
/// port) and all threads on one key. More threads than cores would measure the
/// scheduler, not contention, so the counts stop at the machine's parallelism. A second of
/// measurement each (over any given on the command line): there are twelve to eighteen.
fn scaling(c: &mut Criterion) {
    let mut g = c.benchmark_group("scaling");
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let counts: Vec<u64> = [1, 2, 4]
        .into_iter()
        .filter(|&n| n == 1 || n <= cores)
        .collect();
    let ledger = CountLedger::new(CAPACITY).unwrap();
    let sem = Arc::new(Semaphore::new(CAPACITY));
    let keyed = KeyedLedger::new(CAPACITY).unwrap();
    let _resident: Vec<_> = (0..KEYS).map(|k| keyed.try_acquire(&k).unwrap()).collect();
    let dash: DashMap<u64, Arc<Semaphore>> = (0..KEYS)
        .map(|k| (k, Arc::new(Semaphore::new(CAPACITY))))
        .collect();
    for &n in &counts {
        // Thread t's keys: a range of its own.
        let own = move |t: u64, i: u64| t * (KEYS / n) + i % (KEYS / n);
        g.bench_function(format!("count_admission_t{n}"), |b| {
            b.iter_custom(|iters| {
                on_threads(n, iters, |_, _| {
                    drop(black_box(ledger.try_acquire().unwrap()))
                })
            })
        });
        g.bench_function(format!("count_tokio_try_acquire_owned_t{n}"), |b| {
            b.iter_custom(|iters| {
                on_threads(n, iters, |_, _| {
                    drop(black_box(sem.clone().try_acquire_owned().unwrap()))
                })
            })
        });
        g.bench_function(format!("keyed_admission_t{n}"), |b| {
            b.iter_custom(|iters| {
                on_threads(n, iters, |t, i| {
                    drop(black_box(keyed.try_acquire(&own(t, i)).unwrap()))
                })
            })
        });
        g.bench_function(format!("keyed_dashmap_semaphore_t{n}"), |b| {
            b.iter_custom(|iters| {
                on_threads(n, iters, |t, i| {
                    drop(black_box(dashmap_acquire(&dash, own(t, i))))
                })
            })
        });
        g.bench_function(format!("one_key_admission_t{n}"), |b| {
            b.iter_custom(|iters| {
                on_threads(n, iters, |_, _| {
                    drop(black_box(keyed.try_acquire(&0).unwrap()))
                })
            })
        });
        g.bench_function(format!("one_key_dashmap_semaphore_t{n}"), |b| {
            b.iter_custom(|iters| {
                on_threads(n, iters, |_, _| drop(black_box(dashmap_acquire(&dash, 0))))
            })
        });
    }
    g.finish();
}

/// What an adaptive limit adds to a request: the plain count permit, and the same permit
/// on a ledger an adaptive limit drives, with its sample recorded; apart, the two clock
/// reads a real sample takes (at admission and at the end). Uncontended, and two threads
/// on one ledger.
fn adaptive(c: &mut Criterion) {
    let mut g = c.benchmark_group("adaptive");
    let plain = CountLedger::new(CAPACITY).unwrap();
    g.bench_function("admission", |b| {
        b.iter(|| drop(black_box(plain.try_acquire().unwrap())))
    });
    let (driven, _limit, epoch) = driven();
    // Every request ends at the same instant of the limit's clock: the clock is measured
    // apart, and the window closes once (as it does once per 100 ms in a server).
    let now = epoch + Duration::from_secs(1);
    let sampled = |_| {
        let permit = driven.try_acquire().unwrap();
        permit.record_at(black_box(now), black_box(LATENCY), Outcome::Success);
    };
    g.bench_function("sampled", |b| b.iter(|| sampled(0)));
    g.bench_function("two_clock_reads", |b| {
        b.iter(|| {
            let admitted = black_box(Instant::now());
            black_box(admitted.elapsed())
        })
    });
    g.bench_function("contended_admission", |b| {
        b.iter_custom(|iters| two_threads(iters, |_| drop(black_box(plain.try_acquire().unwrap()))))
    });
    g.bench_function("contended_sampled", |b| {
        b.iter_custom(|iters| two_threads(iters, sampled))
    });
    g.finish();
}

const LATENCY: Duration = Duration::from_millis(10);

/// A ledger an adaptive limit drives, its limit (kept alive) and its clock's origin.
fn driven() -> (CountLedger, AdaptiveLimit, Instant) {
    let ledger = CountLedger::new(0).unwrap();
    let epoch = Instant::now();
    let limit = AdaptiveLimit::builder(Gradient::default())
        .bounds(CAPACITY as u64, CAPACITY as u64)
        .initial(CAPACITY as u64)
        .epoch(epoch)
        .build(&ledger)
        .unwrap();
    (ledger, limit, epoch)
}

criterion_group!(
    benches, count, bytes, keyed, gate, contended, scaling, adaptive
);
criterion_main!(benches);
