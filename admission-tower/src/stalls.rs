//! Responses waiting on their clients, and the one sweep that takes back what those past
//! their allowance hold.
//!
//! A response body that the server was handed and has not asked for its next frame waits
//! on its client. On its own it cannot see a server that never asks again (an h2 window
//! kept at 0: hyper waits for room in it before it polls the body), since nothing polls
//! it. So while it waits, the body parks what it holds in a [`Registry`], with the time
//! its allowance runs out ([`SendPace`](crate::send_pace::SendPace)), and takes it back when it is
//! asked again. One thread for the process sweeps the registry every [`TICK`]: what is
//! past its time is taken out and released there, and its body, when next polled, finds
//! its place empty and ends in an error.
//!
//! The registry is sharded by thread, so that parks on different workers rarely meet on
//! one lock; an entry's id tells its body whether its place still holds its own entry (a
//! slab reuses places). Everything is under the shard's lock, so a body taking its entry
//! back and the sweep taking it out cannot both have it. Values are released outside the
//! lock: a release may run user code (a refusal hook, a metrics recorder).

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use slab::Slab;

/// How often the sweep runs: what is past its time is released at most this late.
pub(crate) const TICK: Duration = Duration::from_millis(250);

/// Shards of the registry: enough that the workers of a server rarely share one.
const SHARDS: usize = 8;

/// Values parked until a time, each taken back by its owner before then or released by
/// the sweep after it.
pub(crate) struct Registry<T> {
    shards: [Shard<T>; SHARDS],
    /// Whether the sweeping thread has been started.
    sweeping: AtomicBool,
    /// What the sweep does with a value past its time (and then drops it).
    on_due: fn(T),
}

/// One shard, on cache lines of its own (128 bytes, as `crossbeam_utils::CachePadded`
/// pads for x86_64 and aarch64, whose adjacent-line prefetch pairs lines).
#[repr(align(128))]
struct Shard<T>(Mutex<Places<T>>);

struct Places<T> {
    slab: Slab<Entry<T>>,
    /// The id of the next entry: distinguishes entries that reuse one place.
    next_id: u64,
}

struct Entry<T> {
    id: NonZeroU64,
    /// `None`: kept, never swept.
    due: Option<Instant>,
    value: T,
}

/// Where a value is parked: its shard, its place, and its id. Two words: a response body
/// keeps one, and every response is moved whole through a server.
#[derive(Debug)]
pub(crate) struct Ticket {
    id: NonZeroU64,
    key: u32,
    shard: u8,
}

/// The shard a thread parks in: threads take the shards in turn.
fn home() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static HOME: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    HOME.with(|home| *home)
}

impl<T: Send + 'static> Registry<T> {
    /// An empty registry; `on_due` gets each value the sweep takes out.
    pub(crate) const fn new(on_due: fn(T)) -> Self {
        Self {
            shards: [const { Shard(Mutex::new(Places::new())) }; SHARDS],
            sweeping: AtomicBool::new(false),
            on_due,
        }
    }

    /// Parks `value` until `due` (`None`: for as long as its owner likes); the sweep
    /// takes it out after that.
    pub(crate) fn park(&'static self, value: T, due: Option<Instant>) -> Ticket {
        let shard = home();
        let mut places = self.lock(shard);
        places.next_id += 1;
        let id = NonZeroU64::new(places.next_id).expect("ids count up from 1");
        let key = places.slab.insert(Entry { id, due, value });
        drop(places);
        if due.is_some() {
            self.sweep_from_now_on();
        }
        Ticket {
            id,
            // Four billion responses parked at once would have run out of memory first.
            key: u32::try_from(key).expect("fewer than 2^32 values parked"),
            shard: shard as u8,
        }
    }

    /// Takes back what `ticket` parked, unless the sweep took it out.
    pub(crate) fn unpark(&self, ticket: &Ticket) -> Option<T> {
        let mut places = self.lock(usize::from(ticket.shard));
        let key = ticket.key as usize;
        let ours = (places.slab.get(key)).is_some_and(|entry| entry.id == ticket.id);
        ours.then(|| places.slab.remove(key).value)
    }

    /// Whether what `ticket` parked is still parked.
    pub(crate) fn holds(&self, ticket: &Ticket) -> bool {
        let places = self.lock(usize::from(ticket.shard));
        (places.slab.get(ticket.key as usize)).is_some_and(|entry| entry.id == ticket.id)
    }

    /// Takes out what is due at `now` and hands it to `on_due`, outside the locks (a
    /// panic there is caught: the sweep goes on). How many it took out.
    pub(crate) fn sweep(&self, now: Instant) -> usize {
        let mut due = Vec::new();
        for shard in 0..SHARDS {
            let mut places = self.lock(shard);
            let keys: Vec<usize> = (places.slab.iter())
                .filter(|(_, entry)| entry.due.is_some_and(|due| due <= now))
                .map(|(key, _)| key)
                .collect();
            due.extend(keys.into_iter().map(|key| places.slab.remove(key).value));
        }
        let taken = due.len();
        for value in due {
            let on_due = self.on_due;
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| on_due(value)));
        }
        taken
    }

    /// Starts the thread that sweeps every [`TICK`], once. (If it cannot be started, the
    /// next park tries again.)
    fn sweep_from_now_on(&'static self) {
        if self.sweeping.load(Ordering::Relaxed) || self.sweeping.swap(true, Ordering::Relaxed) {
            return;
        }
        let started = std::thread::Builder::new()
            .name("admission-sweep".to_owned())
            .spawn(move || {
                loop {
                    std::thread::sleep(TICK);
                    self.sweep(Instant::now());
                }
            });
        if started.is_err() {
            self.sweeping.store(false, Ordering::Relaxed);
        }
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Places<T>> {
        // A panic under the lock leaves the slab whole (it runs no user code there).
        self.shards[shard]
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> Places<T> {
    const fn new() -> Self {
        Self {
            slab: Slab::new(),
            next_id: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use super::{Registry, SHARDS};

    /// A value whose release the tests count.
    struct Value(&'static AtomicUsize);

    fn released(value: Value) {
        value.0.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn a_value_taken_back_before_its_time_is_not_swept() {
        static REGISTRY: Registry<Value> = Registry::new(released);
        static RELEASED: AtomicUsize = AtomicUsize::new(0);
        let later = Instant::now() + Duration::from_secs(3_600);
        let ticket = REGISTRY.park(Value(&RELEASED), Some(later));
        assert!(REGISTRY.holds(&ticket));
        assert_eq!(REGISTRY.sweep(Instant::now()), 0, "not due");
        assert!(REGISTRY.unpark(&ticket).is_some());
        assert!(!REGISTRY.holds(&ticket));
        assert!(REGISTRY.unpark(&ticket).is_none(), "taken once");
        assert_eq!(REGISTRY.sweep(later), 0, "nothing left to sweep");
        assert_eq!(RELEASED.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_value_past_its_time_is_swept_once_and_its_ticket_finds_nothing() {
        static REGISTRY: Registry<Value> = Registry::new(released);
        static RELEASED: AtomicUsize = AtomicUsize::new(0);
        let now = Instant::now();
        let ticket = REGISTRY.park(Value(&RELEASED), Some(now));
        // The sweeping thread may get there first; either way it is released once.
        REGISTRY.sweep(now);
        assert_eq!(RELEASED.load(Ordering::SeqCst), 1);
        assert!(!REGISTRY.holds(&ticket));
        assert!(REGISTRY.unpark(&ticket).is_none());
        assert_eq!(REGISTRY.sweep(now + Duration::from_secs(1)), 0);
        assert_eq!(RELEASED.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_ticket_whose_place_was_reused_does_not_take_the_new_value() {
        static REGISTRY: Registry<Value> = Registry::new(released);
        static RELEASED: AtomicUsize = AtomicUsize::new(0);
        let now = Instant::now();
        let later = now + Duration::from_secs(3_600);
        let swept = REGISTRY.park(Value(&RELEASED), Some(now));
        REGISTRY.sweep(now);
        // Same thread, same shard: the slab hands the freed place out again.
        let parked = REGISTRY.park(Value(&RELEASED), Some(later));
        assert_eq!((parked.shard, parked.key), (swept.shard, swept.key));
        assert!(REGISTRY.unpark(&swept).is_none(), "not its entry");
        assert!(REGISTRY.unpark(&parked).is_some());
    }

    #[test]
    fn a_value_parked_without_a_time_is_never_swept() {
        static REGISTRY: Registry<Value> = Registry::new(released);
        static RELEASED: AtomicUsize = AtomicUsize::new(0);
        let kept = REGISTRY.park(Value(&RELEASED), None);
        assert_eq!(
            REGISTRY.sweep(Instant::now() + Duration::from_secs(3_600)),
            0
        );
        assert!(REGISTRY.holds(&kept));
        assert!(REGISTRY.unpark(&kept).is_some());
        assert_eq!(RELEASED.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_panic_as_a_value_is_released_does_not_stop_the_sweep() {
        fn panics(_: Value) {
            panic!("a release that panics");
        }
        static REGISTRY: Registry<Value> = Registry::new(panics);
        static UNUSED: AtomicUsize = AtomicUsize::new(0);
        let now = Instant::now();
        let first = REGISTRY.park(Value(&UNUSED), Some(now));
        let second = REGISTRY.park(Value(&UNUSED), Some(now));
        REGISTRY.sweep(now);
        assert!(!REGISTRY.holds(&first) && !REGISTRY.holds(&second));
    }

    #[test]
    fn threads_park_in_shards_of_their_own_in_turn() {
        let homes: Vec<usize> = (0..SHARDS)
            .map(|_| std::thread::spawn(super::home).join().unwrap())
            .collect();
        let mut sorted = homes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert!(sorted.len() > 1, "{homes:?}");
    }

    #[test]
    fn the_sweeping_thread_releases_what_is_due_on_its_own() {
        static REGISTRY: Registry<Value> = Registry::new(released);
        static RELEASED: AtomicUsize = AtomicUsize::new(0);
        let kept = REGISTRY.park(Value(&RELEASED), None);
        assert!(
            !REGISTRY.sweeping.load(Ordering::SeqCst),
            "nothing to sweep yet: no thread"
        );
        let _ticket = REGISTRY.park(Value(&RELEASED), Some(Instant::now()));
        assert!(REGISTRY.sweeping.load(Ordering::SeqCst), "one thread, once");
        let deadline = Instant::now() + Duration::from_secs(10);
        while RELEASED.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(RELEASED.load(Ordering::SeqCst), 1);
        assert!(REGISTRY.unpark(&kept).is_some(), "what has no time stays");
    }
}
