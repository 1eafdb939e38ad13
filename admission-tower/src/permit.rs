//! What an admitted request holds until its response body ends.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use admission_core::adaptive::Outcome;
use admission_core::{CountPermit, Key, KeyedPermit, Refused};
use admission_http::RequestCharge;
use http::{HeaderName, Response};

use crate::SampleAt;
use crate::late::LateRefusal;
use crate::observe::Timer;
use crate::pacer::PacerId;
use crate::shared::Shared;

/// What an admitted request holds until its response body ends: its count permit, and
/// its key's permit, body charge and adaptive sample where the layer has those. Two
/// words: the response future and body that carry it are moved at every step, and the
/// common request (count only) should not pay for the rare ones.
pub(crate) struct AdmissionPermit {
    held: Held,
    /// The hold time's start, with the `metrics` feature (else nothing at all).
    _timer: Timer,
    /// The layer's minimum send rate for responses, if it keeps one.
    pacer: Option<PacerId>,
    /// `serve` polls the response to its end ([`ServedStream`](crate::pacer::ServedStream)).
    served_stream: bool,
}

enum Held {
    /// The count permit alone.
    Count { _permit: CountPermit },
    /// The count permit and the rest.
    Rest(Box<Rest>),
    /// Released (in `drop`).
    Released,
}

impl Drop for AdmissionPermit {
    #[inline]
    fn drop(&mut self) {
        release(std::mem::replace(&mut self.held, Held::Released));
    }
}

/// Releases what a permit held. Out of line: the bodies and futures that carry a permit
/// are dropped on every request, and their drop stays small enough to be inlined where a
/// request holds none.
#[inline(never)]
fn release(held: Held) {
    drop(held);
}

/// The count permit with the key's permit, the body's charge or the adaptive sample, for
/// a request that has any; and, for a body that may be refused as it streams, what
/// answering that refusal takes.
struct Rest {
    count: CountPermit,
    _keyed: Option<KeyedPermit<Key>>,
    charge: Option<RequestCharge>,
    /// Boxed: the request head it keeps is large, and rare (see `may_outgrow`); the rest
    /// is moved into its box on every request that has any of it.
    late: Option<Box<LateRefusal>>,
    /// The adaptive limit's sample, while it is still to be recorded.
    sample: Option<Sample>,
    /// The layer, to count the request if its client goes while the handler runs (with
    /// a charge, which keeps what the handler leaves of the body: see `client_gone`).
    watch: Option<Arc<Shared>>,
    /// The request's count slots beyond the first (`AdmissionBuilder::seats`).
    _seats: Vec<CountPermit>,
}

impl Drop for Rest {
    fn drop(&mut self) {
        // Before the count permit goes: the sample is recorded through it.
        self.record();
        // A body cut for its pace after the service answered: the layer did not answer
        // it, but the hook, the snapshot and the metrics still hear of it.
        if let (Some(charge), Some(late)) = (&self.charge, &self.late) {
            if charge.refused() == Some(Refused::TooSlow) {
                late.report(Refused::TooSlow);
            }
        }
    }
}

impl Rest {
    /// Apart from `AdmissionPermit::new`, which is always inlined: the compiler weighs
    /// this on its own.
    #[inline]
    fn boxed(
        count: CountPermit,
        keyed: Option<KeyedPermit<Key>>,
        charge: Option<RequestCharge>,
        late: Option<LateRefusal>,
        sample: Option<Sample>,
        watch: Option<Arc<Shared>>,
    ) -> Box<Self> {
        Box::new(Rest {
            count,
            _keyed: keyed,
            charge,
            late: late.map(Box::new),
            sample,
            watch,
            _seats: Vec::new(),
        })
    }

    fn record(&mut self) {
        if let Some(sample) = self.sample.take() {
            self.count.record(sample.admitted.elapsed(), sample.outcome);
        }
    }
}

/// An adaptive limit's sample of one request: since when, how it ended as far as is known
/// (`Gone` until the response head), and where it ends.
pub(crate) struct Sample {
    admitted: Instant,
    outcome: Outcome,
    at: SampleAt,
}

impl Sample {
    #[inline]
    pub(crate) fn start(at: Option<SampleAt>) -> Option<Self> {
        at.map(|at| Sample {
            admitted: Instant::now(),
            outcome: Outcome::Gone,
            at,
        })
    }
}

impl AdmissionPermit {
    /// Always inlined: on the count's path it is a few moves (its rest is made out of
    /// line), and a call would cost more than the permit.
    #[inline(always)]
    pub(crate) fn new(
        count: CountPermit,
        keyed: Option<KeyedPermit<Key>>,
        charge: Option<RequestCharge>,
        late: Option<LateRefusal>,
        timer: Timer,
        sample: Option<Sample>,
        watch: Option<Arc<Shared>>,
    ) -> Self {
        let held = if keyed.is_some() || charge.is_some() || sample.is_some() {
            Held::Rest(Rest::boxed(count, keyed, charge, late, sample, watch))
        } else {
            Held::Count { _permit: count }
        };
        Self {
            held,
            _timer: timer,
            pacer: None,
            served_stream: false,
        }
    }

    /// The permit with the request's count slots beyond the first (none for most).
    #[inline]
    pub(crate) fn seated(mut self, seats: Vec<CountPermit>) -> Self {
        if !seats.is_empty() {
            self.seat(seats);
        }
        self
    }

    /// Out of line: a request with more than one seat is rare.
    #[inline(never)]
    fn seat(&mut self, seats: Vec<CountPermit>) {
        self.held = match std::mem::replace(&mut self.held, Held::Released) {
            Held::Count { _permit: count } => {
                let mut rest = Rest::boxed(count, None, None, None, None, None);
                rest._seats = seats;
                Held::Rest(rest)
            }
            Held::Rest(mut rest) => {
                rest._seats = seats;
                Held::Rest(rest)
            }
            // (Never: a permit is seated as it is made.)
            Held::Released => Held::Released,
        };
    }

    /// The permit of a response that keeps the minimum send rate of `pacer`, and that
    /// `serve` polls to its end if `served_stream`.
    #[inline]
    pub(crate) fn paced(mut self, pacer: Option<PacerId>, served_stream: bool) -> Self {
        self.pacer = pacer;
        self.served_stream = served_stream;
        self
    }

    /// Whether `serve` polls this permit's response to its end (an h2 stream it serves).
    #[inline]
    pub(crate) fn served_stream(&self) -> bool {
        self.served_stream
    }

    /// The pacer of the layer this permit's response keeps the minimum send rate of, if
    /// it keeps one.
    #[inline]
    pub(crate) fn pacer(&self) -> Option<PacerId> {
        self.pacer
    }

    /// If the request's body was refused while it streamed (and the layer answers such
    /// refusals): the refusal, and what answering it takes. The caller drops the
    /// handler's answer, then this permit, then answers.
    #[inline]
    pub(crate) fn take_late_refusal(&mut self) -> Option<(Refused, Box<LateRefusal>)> {
        let Held::Rest(rest) = &mut self.held else {
            return None;
        };
        let refused = rest.charge.as_ref().and_then(RequestCharge::refused)?;
        let late = rest.late.take()?;
        // Refused by the layer itself, mid-request: not the service's latency.
        rest.sample = None;
        Some((refused, late))
    }

    /// The response head is here: its outcome, and its sample if sampled at the head.
    #[inline]
    pub(crate) fn head<B>(&mut self, response: &Response<B>) {
        if let Held::Rest(rest) = &mut self.held {
            if let Some(sample) = &mut rest.sample {
                sample.outcome = outcome(response);
                if sample.at == SampleAt::Head {
                    rest.record();
                }
            }
        }
    }

    /// The request's body charge, if it has one.
    #[inline]
    pub(crate) fn charge(&self) -> Option<&RequestCharge> {
        match &self.held {
            Held::Rest(rest) => rest.charge.as_ref(),
            _ => None,
        }
    }

    /// Whether the request's client has gone while the handler runs: what the handler
    /// dropped unread of the body (kept by its charge) is read on, and failed. Then the
    /// request is counted as gone; the caller drops the handler's future, then this
    /// permit. (The task is woken when more of the body comes.)
    #[inline]
    pub(crate) fn client_gone(&self, cx: &mut Context<'_>) -> bool {
        let Held::Rest(rest) = &self.held else {
            return false;
        };
        let gone = rest
            .charge
            .as_ref()
            .is_some_and(|charge| charge.poll_unread(cx) == Poll::Ready(false));
        if gone {
            if let Some(shared) = &rest.watch {
                shared.count_gone();
            }
        }
        gone
    }

    /// The service failed the request: an overload.
    pub(crate) fn failed(&mut self) {
        if let Held::Rest(rest) = &mut self.held {
            if let Some(sample) = &mut rest.sample {
                sample.outcome = Outcome::Overload;
            }
        }
    }
}

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// How a response head reports the request, for the adaptive limit: a 5xx, or a gRPC
/// status of overload (`RESOURCE_EXHAUSTED`, `UNAVAILABLE`, `DEADLINE_EXCEEDED`) in a
/// trailers-only response, is an overload.
fn outcome<B>(response: &Response<B>) -> Outcome {
    let grpc_overload = || {
        response
            .headers()
            .get(&GRPC_STATUS)
            .is_some_and(|status| matches!(status.as_bytes(), b"4" | b"8" | b"14"))
    };
    if response.status().is_server_error() || grpc_overload() {
        Outcome::Overload
    } else {
        Outcome::Success
    }
}
