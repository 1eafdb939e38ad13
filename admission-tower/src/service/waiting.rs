//! The wait for a count slot ([`crate::Wait`]): which refusals wait, and the wait itself.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use admission_core::{Priority, Refused};
use admission_http::{ReadAhead, Refusal};
use http::request::Parts;

use super::Admission;
use super::pending::{Inner, Pending, RequestBody};
use crate::future::ResponseFuture;
use crate::shared::{Shared, WaitEnd};
use crate::wait::READ_AHEAD;

impl<S> Admission<S> {
    /// Whether a request refused with `refusal` waits for a slot instead: the count (or
    /// its class's share of it) was full and the layer has a wait (never in a dry run,
    /// which refuses no one).
    pub(super) fn waits(&self, refusal: Refusal, priority: Option<Priority>) -> bool {
        matches!(refusal, Refusal::Refused(Refused::Count | Refused::Class))
            && self.shared.settings.wait.is_some()
            && !self.shared.settings.dry_run
            && !priority.is_some_and(Priority::is_retry)
    }

    /// The wait for a count slot (see [`crate::Wait`]), as long as the request's budget
    /// allows, then the request started or refused. A client whose deadline is too close
    /// to wait is refused without waiting.
    pub(super) async fn wait<ReqBody>(
        &mut self,
        pending: Pending<ReqBody>,
    ) -> ResponseFuture<S::Future>
    where
        S: Inner<ReqBody>,
        ReqBody: RequestBody,
    {
        let shared = self.shared.clone();
        let wait = shared.settings.wait.as_ref().expect("a wait");
        let estimate = (shared.settings.adaptive.as_ref())
            .and_then(|limit| limit.latency())
            .map(|latency| latency.typical);
        let Some(budget) = wait.budget(&pending.parts, estimate) else {
            // Its client would give up before an answer: refused now, not after waiting.
            shared.counts.waits.deadline.fetch_add(1, Ordering::Relaxed);
            return self.refuse(pending, Refusal::Refused(Refused::Count));
        };
        // The body is read ahead while the request waits, so that a client who goes is
        // seen; not one whose client waits to be told to send it.
        let Pending {
            parts,
            body,
            priority,
            rate,
            ..
        } = pending;
        let limit = if expects_continue(&parts) {
            0
        } else {
            READ_AHEAD
        };
        let mut ahead = ReadAhead::new(body, limit);
        let started = std::time::Instant::now();
        // Dropped while it waits (the server saw its client go): gone.
        let waiting = Waiting(Some(shared.clone()));
        let admitted = shared
            .admit_waiting(&parts, priority, rate, budget, &mut ahead)
            .await;
        waiting.ended();
        let waited = started.elapsed();
        let (body, read) = ahead.split();
        let pending = Pending {
            parts,
            body,
            read: Some(read),
            priority,
            rate,
        };
        match admitted {
            Ok((permit, declared)) => {
                shared.waited(waited);
                self.start(pending, permit, declared)
            }
            Err(WaitEnd::Refused(refusal)) => self.refuse_after(pending, refusal, waited),
            Err(WaitEnd::Gone) => ResponseFuture::gone(),
        }
    }
}

/// Whether the request asks to be told to send its body (`Expect: 100-continue`).
fn expects_continue(parts: &Parts) -> bool {
    parts
        .headers
        .get(http::header::EXPECT)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// A request waiting for a count slot: counted gone if its future is dropped before the
/// wait ends (the server saw its client go and dropped the request), as a client seen to
/// go while it waits is.
struct Waiting(Option<Arc<Shared>>);

impl Waiting {
    /// The wait ended (admitted, refused or gone, each counted where it ended).
    fn ended(mut self) {
        self.0 = None;
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            shared.count_gone();
        }
    }
}
