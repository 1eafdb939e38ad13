//! A connection's state under `serve`: what it has in flight, and which of its bounds
//! (the head bound, the idle bound) runs, from when. Its transitions: a head completes
//! (`begin`), a request ends (`end`), bytes are read (`read`, which between HTTP/1.1
//! requests starts a head); `deadline` reads the state.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Waker};

use http::Version;
use tokio::time::Instant;

use crate::ConnectionLimits;

/// What one connection has in flight, shared by its task, its requests and its reads.
#[derive(Debug)]
pub(super) struct Tracker {
    state: Mutex<Track>,
    /// Set while the connection is idle between HTTP/1.1 requests: the next byte read
    /// starts a head. Read on every read, so that a busy connection never locks.
    between: AtomicBool,
}

#[derive(Debug)]
struct Track {
    in_flight: usize,
    requests: u64,
    h2: bool,
    /// Since when the connection has been idle, or its next head under way.
    since: Instant,
    /// A byte of a next HTTP/1.1 head has come.
    head: bool,
    /// The connection's task, woken when its last request ends elsewhere (h2 streams
    /// run on tasks of their own).
    task: Option<Waker>,
}

/// What a connection's timer does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    /// A head not complete in time: close at once.
    Cut,
    /// Idle: close gracefully.
    Idle,
}

impl Tracker {
    pub(super) fn new(accepted: Instant) -> Self {
        Self {
            state: Mutex::new(Track {
                in_flight: 0,
                requests: 0,
                h2: false,
                since: accepted,
                head: false,
                task: None,
            }),
            between: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Track> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A request head is complete.
    pub(super) fn begin(&self, version: Version) {
        let mut track = self.lock();
        track.in_flight += 1;
        track.requests += 1;
        track.h2 = version >= Version::HTTP_2;
        track.head = false;
        self.between.store(false, Ordering::Relaxed);
    }

    /// A request is over (its response body ended or was dropped).
    pub(super) fn end(&self) {
        let mut track = self.lock();
        track.in_flight -= 1;
        if track.in_flight == 0 {
            track.since = Instant::now();
            self.between.store(!track.h2, Ordering::Relaxed);
            if let Some(task) = track.task.take() {
                task.wake();
            }
        }
    }

    /// Bytes were read.
    pub(super) fn read(&self) {
        if self.between.swap(false, Ordering::Relaxed) {
            let mut track = self.lock();
            if track.in_flight == 0 && !track.head {
                track.head = true;
                track.since = Instant::now();
            }
        }
    }

    /// When the connection's timer fires, and what it does then; registers `cx`'s task
    /// to be woken when the last request ends.
    pub(super) fn deadline(
        &self,
        limits: &ConnectionLimits,
        cx: &Context<'_>,
    ) -> Option<(Instant, Expiry)> {
        let mut track = self.lock();
        if track.in_flight > 0 {
            match &track.task {
                Some(task) if task.will_wake(cx.waker()) => {}
                _ => track.task = Some(cx.waker().clone()),
            }
            return None;
        }
        let head = limits.head_due(track.since).map(|at| (at, Expiry::Cut));
        let idle = limits.idle.map(|idle| (track.since + idle, Expiry::Idle));
        if track.requests == 0 || track.head {
            // The first head counts from the accept; a later one from its first byte.
            // Both are idle time too.
            [head, idle].into_iter().flatten().min_by_key(|(at, _)| *at)
        } else {
            idle
        }
    }
}

#[cfg(test)]
mod tests;
