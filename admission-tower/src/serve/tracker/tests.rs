//! One test per transition of a connection's tracker: what `deadline` reads after each.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::task::Wake;
use std::time::Duration;

use super::*;

const HEAD: Duration = Duration::from_secs(3);
const IDLE: Duration = Duration::from_secs(10);

fn limits() -> ConnectionLimits {
    ConnectionLimits::default()
        .with_head_within(Some(HEAD))
        .with_idle(Some(IDLE))
}

/// Counts its wakes.
#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A task's context, and how often it was woken.
fn task() -> (Waker, Arc<Count>) {
    let woken = Arc::new(Count::default());
    (Waker::from(woken.clone()), woken)
}

/// The tracker's deadline and what it does then, read with `waker`'s task.
fn due(tracker: &Tracker, limits: &ConnectionLimits, waker: &Waker) -> Option<(Instant, Expiry)> {
    tracker.deadline(limits, &Context::from_waker(waker))
}

/// Runs `change` and says it began no earlier than `.0` and ended no later than `.1`.
fn timed(change: impl FnOnce()) -> (Instant, Instant) {
    let before = Instant::now();
    change();
    (before, Instant::now())
}

#[test]
fn accepted_the_first_head_is_due_by_the_head_bound_from_the_accept() {
    let accepted = Instant::now();
    let tracker = Tracker::new(accepted);
    let (waker, _) = task();
    assert_eq!(
        due(&tracker, &limits(), &waker),
        Some((accepted + HEAD, Expiry::Cut))
    );
    // With no head bound, the idle bound times the wait for the first head.
    let no_head = limits().with_head_within(None);
    assert_eq!(
        due(&tracker, &no_head, &waker),
        Some((accepted + IDLE, Expiry::Idle))
    );
    // And with neither, nothing does.
    let neither = no_head.with_idle(None);
    assert_eq!(due(&tracker, &neither, &waker), None);
}

#[test]
fn a_head_completed_stops_every_timer_while_its_request_runs() {
    let tracker = Tracker::new(Instant::now());
    let (waker, woken) = task();
    tracker.begin(Version::HTTP_11);
    assert_eq!(due(&tracker, &limits(), &waker), None, "busy: no timer");
    // Bytes read while busy (a pipelined head, a body) start nothing.
    tracker.read();
    assert_eq!(due(&tracker, &limits(), &waker), None);
    assert_eq!(woken.0.load(Ordering::SeqCst), 0);
}

#[test]
fn the_last_request_ending_wakes_the_connection_and_starts_the_idle_bound() {
    let tracker = Tracker::new(Instant::now());
    let (waker, woken) = task();
    tracker.begin(Version::HTTP_11);
    tracker.begin(Version::HTTP_11);
    assert_eq!(due(&tracker, &limits(), &waker), None, "registers the task");
    tracker.end();
    assert_eq!(woken.0.load(Ordering::SeqCst), 0, "one still in flight");
    assert_eq!(due(&tracker, &limits(), &waker), None);
    let (before, after) = timed(|| tracker.end());
    assert_eq!(woken.0.load(Ordering::SeqCst), 1, "the last one wakes it");
    let (at, expiry) = due(&tracker, &limits(), &waker).expect("idle: timed");
    assert_eq!(
        expiry,
        Expiry::Idle,
        "after a request, no head bound until a byte"
    );
    assert!(at >= before + IDLE && at <= after + IDLE);
}

#[test]
fn a_byte_between_http1_requests_starts_the_next_head_from_it() {
    let tracker = Tracker::new(Instant::now());
    let (waker, _) = task();
    tracker.begin(Version::HTTP_11);
    tracker.end();
    let (before, after) = timed(|| tracker.read());
    let (at, expiry) = due(&tracker, &limits(), &waker).expect("a head under way");
    assert_eq!(expiry, Expiry::Cut);
    assert!(at >= before + HEAD && at <= after + HEAD);
    // Later bytes of the same head do not move it.
    std::thread::sleep(Duration::from_millis(5));
    tracker.read();
    assert_eq!(due(&tracker, &limits(), &waker), Some((at, Expiry::Cut)));
    // The head completes: busy again, and its end starts a fresh idle wait.
    tracker.begin(Version::HTTP_11);
    assert_eq!(due(&tracker, &limits(), &waker), None);
    tracker.end();
    assert_eq!(due(&tracker, &limits(), &waker).unwrap().1, Expiry::Idle);
}

#[test]
fn on_h2_bytes_read_while_idle_start_no_head() {
    let tracker = Tracker::new(Instant::now());
    let (waker, woken) = task();
    tracker.begin(Version::HTTP_2);
    assert_eq!(due(&tracker, &limits(), &waker), None, "busy: no timer");
    let (before, after) = timed(|| tracker.end()); // as its request's `InFlight` does when dropped
    assert_eq!(woken.0.load(Ordering::SeqCst), 1);
    let (at, expiry) = due(&tracker, &limits(), &waker).unwrap();
    assert_eq!(expiry, Expiry::Idle);
    assert!(at >= before + IDLE && at <= after + IDLE);
    // Pings and settings frames are bytes, not a head.
    tracker.read();
    assert_eq!(due(&tracker, &limits(), &waker), Some((at, Expiry::Idle)));
}
