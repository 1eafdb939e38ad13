//! What one request has been charged, and the unread body it hands over.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll};

use admission_core::{BytePermit, Refused};
use http_body::Body;

use crate::shape::BodyError;
use crate::{BodyRefused, Refusals};

/// What one request has been charged, shared by its metered request body and whatever
/// holds it until the response ends; the charge is released when the last clone drops.
///
/// It also records whether the body was refused while it streamed
/// ([`refused`](Self::refused)), so the code that answers the request can answer with
/// the refusal rather than with whatever the handler made of a failed body.
///
/// ```
/// use admission_core::ByteLedger;
/// use admission_http::RequestCharge;
///
/// let ledger = ByteLedger::new(100)?;
/// let charge = RequestCharge::new(ledger.try_charge(10)?);
/// let held_by_response = charge.clone();
/// drop(charge);
/// assert_eq!((held_by_response.charged(), ledger.in_flight()), (10, 10));
/// drop(held_by_response);
/// assert_eq!(ledger.in_flight(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RequestCharge {
    shared: Arc<Charge>,
}

struct Charge {
    /// `None` for a body that is timed but not metered ([`RequestCharge::unmetered`]).
    permit: Mutex<Option<BytePermit>>,
    /// Set once, by the body, when the ledger refuses it.
    refused: OnceLock<Refused>,
    /// Makes the source of the body's error (see `Refusals::body_error`).
    error: Option<BodyError>,
    /// Data bytes the metered body has seen, and what the permit covers: the body's own
    /// counters (only the body that meters this charge writes them, so relaxed loads and
    /// stores suffice), kept here so that an unmetered body carries nothing but its inner
    /// body and one empty pointer.
    seen: AtomicU64,
    covered: AtomicU64,
    /// What is left of a body its reader dropped unfinished (`MeteredBody::keep_unread`),
    /// and whether there is any: a response polled without one takes no lock.
    unread: Mutex<Option<Pin<Box<dyn Unread>>>>,
    kept: AtomicBool,
}

impl RequestCharge {
    /// Shares `permit` as a request's charge.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    /// use admission_http::RequestCharge;
    ///
    /// let ledger = ByteLedger::new(10)?;
    /// let charge = RequestCharge::new(ledger.try_charge(3)?);
    /// assert_eq!(charge.charged(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(permit: BytePermit) -> Self {
        Self::with_error(permit, None)
    }

    /// Shares `permit` as a request's charge, whose body, if refused, fails with the
    /// error `refusals` configures ([`Refusals::body_error`]) as its source.
    ///
    /// ```
    /// use std::error::Error;
    /// use admission_core::ByteLedger;
    /// use admission_http::{BodyRefused, MeteredBody, RequestCharge, Refusals};
    /// use http_body_util::BodyExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let refusals = Refusals::new().body_error(|cx| format!("{} (protocol error)", cx.refused).into());
    /// let ledger = ByteLedger::new(4)?;
    /// let _other = ledger.try_charge(4)?;
    /// let charge = RequestCharge::with_refusals(ledger.try_charge(0)?, &refusals);
    /// let body = MeteredBody::new(http_body_util::Full::new(bytes::Bytes::from("hello")), charge);
    /// let err = body.collect().await.unwrap_err();
    /// let source = err.downcast_ref::<BodyRefused>().unwrap().source().unwrap();
    /// assert_eq!(source.to_string(), "byte budget exhausted (protocol error)");
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_refusals(permit: BytePermit, refusals: &Refusals) -> Self {
        Self::with_error(permit, refusals.body_error_fn())
    }

    /// A charge of no byte ledger, that records only whether its body was refused: for a
    /// body that is timed ([`MeteredBody::paced`](crate::MeteredBody::paced)) but not metered. It never grows.
    ///
    /// ```
    /// use admission_http::{Refusals, RequestCharge};
    ///
    /// let charge = RequestCharge::unmetered(&Refusals::new());
    /// assert_eq!((charge.charged(), charge.refused()), (0, None));
    /// ```
    pub fn unmetered(refusals: &Refusals) -> Self {
        Self::shared(None, u64::MAX, refusals.body_error_fn())
    }

    fn with_error(permit: BytePermit, error: Option<BodyError>) -> Self {
        let covered = permit.charged();
        Self::shared(Some(permit), covered, error)
    }

    fn shared(permit: Option<BytePermit>, covered: u64, error: Option<BodyError>) -> Self {
        let covered = AtomicU64::new(covered);
        Self {
            shared: Arc::new(Charge {
                permit: Mutex::new(permit),
                refused: OnceLock::new(),
                error,
                seen: AtomicU64::new(0),
                covered,
                unread: Mutex::new(None),
                kept: AtomicBool::new(false),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<BytePermit>> {
        // The lock guards plain arithmetic on the permit; a panic under it cannot leave
        // the permit inconsistent, so a poisoned lock is still good.
        self.shared
            .permit
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Bytes charged for the request so far.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    /// use admission_http::RequestCharge;
    ///
    /// let charge = RequestCharge::new(ByteLedger::new(10)?.try_charge(7)?);
    /// assert_eq!(charge.charged(), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charged(&self) -> u64 {
        self.lock().as_ref().map_or(0, BytePermit::charged)
    }

    /// Why the request's metered body was refused while it streamed, if it was: the
    /// request should be answered as refused ([`Refusal::Refused`](crate::Refusal::Refused)), whatever the
    /// handler answered to the body error it saw.
    ///
    /// ```
    /// use admission_core::{ByteLedger, Refused};
    /// use admission_http::{MeteredBody, RequestCharge};
    /// use http_body_util::BodyExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ledger = ByteLedger::new(4)?;
    /// let _other = ledger.try_charge(1)?;
    /// let charge = RequestCharge::new(ledger.try_charge(0)?);
    /// assert_eq!(charge.refused(), None);
    /// let body = MeteredBody::new(http_body_util::Full::new(bytes::Bytes::from("hello")), charge.clone());
    /// assert!(body.collect().await.is_err());
    /// assert_eq!(charge.refused(), Some(Refused::Bytes));
    /// # Ok(())
    /// # }
    /// ```
    pub fn refused(&self) -> Option<Refused> {
        self.shared.refused.get().copied()
    }

    /// The body's data bytes seen so far.
    pub(crate) fn seen_bytes(&self) -> u64 {
        self.shared.seen.load(Ordering::Relaxed)
    }

    /// Takes a body dropped unfinished, to be read and discarded by
    /// [`poll_unread`](Self::poll_unread).
    pub(crate) fn keep_unread(&self, body: Pin<Box<dyn Unread>>) {
        *self.shared.unread.lock().unwrap_or_else(|p| p.into_inner()) = Some(body);
        // Release: pairs with the acquire in `poll_unread`, which then finds the body.
        self.shared.kept.store(true, Ordering::Release);
    }

    /// Counts `data` more bytes seen by the body; returns the total.
    pub(crate) fn saw(&self, data: u64) -> u64 {
        // Only the body that meters this charge writes its counters: relaxed suffices.
        let counters = &self.shared;
        let seen = counters.seen.load(Ordering::Relaxed).saturating_add(data);
        counters.seen.store(seen, Ordering::Relaxed);
        seen
    }

    /// What the permit covers.
    pub(crate) fn covered(&self) -> u64 {
        self.shared.covered.load(Ordering::Relaxed)
    }

    /// Makes the permit cover the `seen` bytes the body has carried, or refuses the body;
    /// then `want` bytes, as far as the budget has room. A charge above `want` is
    /// kept (see `give_back`).
    pub(crate) fn cover(&self, seen: u64, want: u64) -> Result<(), BodyRefused> {
        let mut covered = self.covered();
        if want <= covered && seen <= covered {
            return Ok(());
        }
        let mut permit = self.lock();
        let Some(permit) = permit.as_mut() else {
            return Ok(());
        };
        if seen > covered {
            if let Err(refused) = permit.try_grow(seen - covered) {
                return Err(self.refuse(refused));
            }
            covered = seen;
        }
        if want > covered {
            covered += permit.grow_within(want - covered);
        }
        self.shared.covered.store(covered, Ordering::Relaxed);
        Ok(())
    }

    /// Releases what the permit covers above `keep`.
    pub(crate) fn give_back(&self, keep: u64) {
        let covered = self.covered();
        if covered <= keep {
            return;
        }
        if let Some(permit) = self.lock().as_mut() {
            permit.shrink(covered - keep);
            self.shared.covered.store(keep, Ordering::Relaxed);
        }
    }

    /// Reads on, and discards, what is left of a body its reader dropped unfinished
    /// ([`MeteredBody::keep_unread`](crate::MeteredBody::keep_unread)): `Pending` while it lasts (the task is woken when
    /// more comes), `Ready(true)` once nothing is left unread (or nothing was kept), and
    /// `Ready(false)` if it failed: the client hung up or reset the request.
    ///
    /// ```
    /// use std::task::Poll;
    /// use admission_core::ByteLedger;
    /// use admission_http::RequestCharge;
    ///
    /// let charge = RequestCharge::new(ByteLedger::new(10)?.try_charge(1)?);
    /// let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    /// assert_eq!(charge.poll_unread(&mut cx), Poll::Ready(true), "nothing was kept");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn poll_unread(&self, cx: &mut Context<'_>) -> Poll<bool> {
        if !self.shared.kept.load(Ordering::Acquire) {
            return Poll::Ready(true);
        }
        let mut unread = self
            .shared
            .unread
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let Some(body) = unread.as_mut() else {
            return Poll::Ready(true);
        };
        let ended = std::task::ready!(body.as_mut().poll_discard(cx));
        *unread = None;
        Poll::Ready(ended)
    }

    /// Records that the body was refused, and makes the error its reader sees.
    pub(crate) fn refuse(&self, refused: Refused) -> BodyRefused {
        let _ = self.shared.refused.set(refused);
        match &self.shared.error {
            Some(error) => BodyRefused::with_source(refused, error.make(refused)),
            None => BodyRefused::new(refused),
        }
    }
}

impl fmt::Debug for RequestCharge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestCharge")
            .field("charged", &self.charged())
            .field("refused", &self.refused())
            .finish()
    }
}

/// A request body read only to be discarded.
pub(crate) trait Unread: Send {
    /// Reads what has come: `Ready(true)` at the end, `Ready(false)` if it failed.
    fn poll_discard(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool>;
}

impl<B: Body + Send> Unread for B {
    fn poll_discard(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        // A few frames a call, then yield: a client that sends fast cannot hold the task.
        for _ in 0..16 {
            match self.as_mut().poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(true),
                Poll::Ready(Some(Err(_))) => return Poll::Ready(false),
                Poll::Ready(Some(Ok(_))) => {}
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
