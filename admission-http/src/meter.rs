//! Request-body metering against a byte ledger.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll};

use admission_core::{ByteLedger, BytePermit, Refused};
use bytes::Buf;
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, Request, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::ahead::{self, ReadFrames, Replay};
use crate::pace::{self, Pace};
use crate::refusal::BodyError;
use crate::{MinDataRate, Refusals};

/// The error type of a metered body: the inner body's error or a [`BodyRefused`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request is answered before its body is read.
///
/// ```
/// use admission_core::Refused;
/// use admission_http::Rejection;
/// use http::StatusCode;
///
/// assert_eq!(Rejection::Refused(Refused::Count).status(), StatusCode::SERVICE_UNAVAILABLE);
/// assert_eq!(Rejection::Refused(Refused::Key).status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(Rejection::Refused(Refused::TooLarge).status(), StatusCode::PAYLOAD_TOO_LARGE);
/// assert_eq!(Rejection::Refused(Refused::TooSlow).status(), StatusCode::REQUEST_TIMEOUT);
/// assert_eq!(Rejection::InvalidContentLength.status(), StatusCode::BAD_REQUEST);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// A ledger refused the request.
    Refused(Refused),
    /// The request's `Content-Length` does not parse (or two of them disagree).
    InvalidContentLength,
}

impl Rejection {
    /// The HTTP status for this rejection: 503 for global overload (count, bytes, key
    /// table), 429 for one key over its cap, 413 for one request too large, 408 for a
    /// body slower than the minimum data rate, 400 for a malformed `Content-Length`.
    ///
    /// ```
    /// use admission_core::Refused;
    /// use admission_http::Rejection;
    ///
    /// assert_eq!(Rejection::Refused(Refused::KeyTable).status(), 503);
    /// ```
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::Refused(Refused::Key) => StatusCode::TOO_MANY_REQUESTS,
            Rejection::Refused(Refused::TooLarge) => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::Refused(Refused::TooSlow) => StatusCode::REQUEST_TIMEOUT,
            Rejection::Refused(_) => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::InvalidContentLength => StatusCode::BAD_REQUEST,
        }
    }

    /// Whether the same request may succeed later, so a `Retry-After` belongs on the
    /// answer (503 and 429 yes; 413 and 400 no).
    ///
    /// ```
    /// use admission_core::Refused;
    /// use admission_http::Rejection;
    ///
    /// assert!(Rejection::Refused(Refused::Bytes).is_retryable());
    /// assert!(!Rejection::InvalidContentLength.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            Rejection::Refused(refused) => refused.is_retryable(),
            Rejection::InvalidContentLength => false,
        }
    }
}

impl From<Refused> for Rejection {
    fn from(refused: Refused) -> Self {
        Rejection::Refused(refused)
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Refused(refused) => refused.fmt(f),
            Rejection::InvalidContentLength => f.write_str("invalid content-length"),
        }
    }
}

impl std::error::Error for Rejection {}

/// The request's declared body length: `Ok(None)` without a `Content-Length`.
///
/// # Errors
///
/// [`Rejection::InvalidContentLength`] if a value is not a plain decimal number that
/// fits a `u64`, or if several `Content-Length` headers disagree.
///
/// # Examples
///
/// ```
/// use admission_http::{content_length, Rejection};
/// use http::HeaderMap;
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(content_length(&headers), Ok(None));
/// headers.insert("content-length", "42".parse().unwrap());
/// assert_eq!(content_length(&headers), Ok(Some(42)));
/// headers.insert("content-length", "-1".parse().unwrap());
/// assert_eq!(content_length(&headers), Err(Rejection::InvalidContentLength));
/// ```
pub fn content_length(headers: &HeaderMap) -> Result<Option<u64>, Rejection> {
    let mut length = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        let parsed = value
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or(Rejection::InvalidContentLength)?;
        if length.is_some_and(|seen| seen != parsed) {
            return Err(Rejection::InvalidContentLength);
        }
        length = Some(parsed);
    }
    Ok(length)
}

/// The error a [`MeteredBody`] returns when the byte ledger refuses to let the body
/// grow: the reader (the handler) sees a body error, and nothing hangs.
///
/// Downcast it from the body's [`BoxError`]:
///
/// ```
/// use admission_core::Refused;
/// use admission_http::{BodyRefused, BoxError};
///
/// let err: BoxError = Box::new(BodyRefused::new(Refused::Bytes));
/// let refused = err.downcast_ref::<BodyRefused>().unwrap();
/// assert_eq!(refused.refused(), Refused::Bytes);
/// assert_eq!(err.to_string(), "request body refused: byte budget exhausted");
/// ```
///
/// Its [`source`](std::error::Error::source) is the protocol's own error for the
/// refusal, when one was configured ([`Refusals::body_error`](crate::Refusals::body_error)):
/// a gRPC status, say, which a framework that looks for one in an error's chain (tonic)
/// then answers with.
#[derive(Debug)]
pub struct BodyRefused {
    refused: Refused,
    source: Option<BoxError>,
}

impl BodyRefused {
    /// An error for `refused`.
    ///
    /// ```
    /// use admission_core::Refused;
    /// use admission_http::BodyRefused;
    ///
    /// assert_eq!(BodyRefused::new(Refused::TooLarge).refused(), Refused::TooLarge);
    /// ```
    pub fn new(refused: Refused) -> Self {
        Self {
            refused,
            source: None,
        }
    }

    /// An error for `refused` whose source is `source`, a protocol's own error for it.
    ///
    /// ```
    /// use std::error::Error;
    /// use admission_core::Refused;
    /// use admission_http::BodyRefused;
    ///
    /// let err = BodyRefused::with_source(Refused::Bytes, "busy: retry in 1 s".into());
    /// assert_eq!(err.source().unwrap().to_string(), "busy: retry in 1 s");
    /// ```
    pub fn with_source(refused: Refused, source: BoxError) -> Self {
        Self {
            refused,
            source: Some(source),
        }
    }

    /// What the ledger said.
    ///
    /// ```
    /// use admission_core::Refused;
    /// use admission_http::BodyRefused;
    ///
    /// assert_eq!(BodyRefused::new(Refused::Bytes).refused(), Refused::Bytes);
    /// ```
    pub fn refused(&self) -> Refused {
        self.refused
    }
}

impl fmt::Display for BodyRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request body refused: {}", self.refused)
    }
}

impl std::error::Error for BodyRefused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn std::error::Error + 'static))
    }
}

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
    /// body that is timed ([`MeteredBody::paced`]) but not metered. It never grows.
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
    /// request should be answered as refused ([`Rejection::Refused`]), whatever the
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

    /// Counts `data` more bytes seen by the body; returns the total.
    fn saw(&self, data: u64) -> u64 {
        // Only the body that meters this charge writes its counters: relaxed suffices.
        let counters = &self.shared;
        let seen = counters.seen.load(Ordering::Relaxed).saturating_add(data);
        counters.seen.store(seen, Ordering::Relaxed);
        seen
    }

    /// What the permit covers.
    fn covered(&self) -> u64 {
        self.shared.covered.load(Ordering::Relaxed)
    }

    /// Makes the permit cover the `seen` bytes the body has carried, or refuses the body;
    /// then `want` bytes, as far as the budget has room. A charge above `want` is
    /// kept (see `give_back`).
    fn cover(&self, seen: u64, want: u64) -> Result<(), BodyRefused> {
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
    fn give_back(&self, keep: u64) {
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
    /// ([`MeteredBody::keep_unread`]): `Pending` while it lasts (the task is woken when
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
    fn refuse(&self, refused: Refused) -> BodyRefused {
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

/// Charges requests' bodies against a [`ByteLedger`].
///
/// A declared `Content-Length` is charged before the body is read; a request above the
/// ledger's [`max_charge`](ByteLedger::max_charge) is refused as
/// [`Refused::TooLarge`] (413) without reading it. A body without a length is charged as
/// its data frames arrive, and fails with [`BodyRefused`] when the budget refuses. A body
/// that sends more than it declared is charged for the excess the same way.
///
/// What it does not bound: bytes the handler copies or decodes out of the body (charge
/// those separately), and a client that trickles a body slowly (a timeout's job).
///
/// # Examples
///
/// ```
/// use admission_core::{ByteLedger, Refused};
/// use admission_http::{Rejection, RequestMeter};
///
/// let ledger = ByteLedger::new(1 << 20)?;
/// ledger.set_max_charge(64 << 10)?;
/// let meter = RequestMeter::new(ledger.clone());
///
/// let request = http::Request::post("/upload")
///     .header("content-length", "1000")
///     .body("...")?;
/// let admitted = meter.admit(request)?;
/// assert_eq!((admitted.charge.charged(), ledger.in_flight()), (1000, 1000));
/// drop(admitted);
/// assert_eq!(ledger.in_flight(), 0);
///
/// let huge = http::Request::post("/upload")
///     .header("content-length", "1000000")
///     .body("...")?;
/// let rejection = meter.charge(huge.headers()).unwrap_err();
/// assert_eq!(rejection, Rejection::Refused(Refused::TooLarge));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct RequestMeter {
    ledger: ByteLedger,
}

impl RequestMeter {
    /// Meters request bodies against `ledger`.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    /// use admission_http::RequestMeter;
    ///
    /// let meter = RequestMeter::new(ByteLedger::new(100)?);
    /// assert_eq!(meter.ledger().budget(), 100);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn new(ledger: ByteLedger) -> Self {
        Self { ledger }
    }

    /// The ledger charged.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    /// use admission_http::RequestMeter;
    ///
    /// let meter = RequestMeter::new(ByteLedger::new(10)?);
    /// assert_eq!(meter.ledger().budget(), 10);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn ledger(&self) -> &ByteLedger {
        &self.ledger
    }

    /// Charges a request's declared length, reading only its headers. Wrap the body
    /// with [`MeteredBody::new`] and this charge to meter what arrives beyond it.
    ///
    /// # Errors
    ///
    /// The [`Rejection`]: a malformed `Content-Length`, or the ledger's refusal. Nothing
    /// is charged then, and the body has not been touched.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    /// use admission_http::RequestMeter;
    ///
    /// let meter = RequestMeter::new(ByteLedger::new(100)?);
    /// let request = http::Request::post("/").header("content-length", "40").body(())?;
    /// let charge = meter.charge(request.headers())?;
    /// assert_eq!((charge.charged(), meter.ledger().in_flight()), (40, 40));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge(&self, headers: &HeaderMap) -> Result<RequestCharge, Rejection> {
        let declared = content_length(headers)?.unwrap_or(0);
        Ok(RequestCharge::new(self.ledger.try_charge(declared)?))
    }

    /// Charges `request`'s declared length and wraps its body to meter the rest: the
    /// request to hand on, and the charge to hold until the response ends.
    ///
    /// # Errors
    ///
    /// As [`charge`](Self::charge).
    ///
    /// ```
    /// use admission_core::ByteLedger;
    /// use admission_http::RequestMeter;
    ///
    /// let meter = RequestMeter::new(ByteLedger::new(100)?);
    /// let request = http::Request::post("/").header("content-length", "5").body("hello")?;
    /// let admitted = meter.admit(request)?;
    /// assert_eq!(admitted.charge.charged(), 5);
    /// assert_eq!(*admitted.request.body().get_ref(), "hello");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn admit<B>(&self, request: Request<B>) -> Result<MeteredRequest<B>, Rejection> {
        let charge = self.charge(request.headers())?;
        let request = request.map(|body| MeteredBody::new(body, charge.clone()));
        Ok(MeteredRequest { request, charge })
    }
}

/// A request admitted by [`RequestMeter::admit`]: the request with its metered body, and
/// its charge, to hold (for instance in a [`PermitBody`](crate::PermitBody)) until the
/// response ends.
#[derive(Debug)]
#[non_exhaustive]
pub struct MeteredRequest<B> {
    /// The request, its body metered.
    pub request: Request<MeteredBody<B>>,
    /// What the request is charged.
    pub charge: RequestCharge,
}

pin_project! {
    /// A request body that grows its request's byte charge as data frames arrive beyond
    /// what was charged, and fails with [`BodyRefused`] when the ledger refuses.
    ///
    /// Frames pass through unchanged. After a refusal the body ends (`Ready(None)`).
    /// The charge is shared with [`RequestCharge`]; dropping the body releases nothing
    /// while another clone of the charge (the response's) is alive.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    /// use admission_http::{BodyRefused, MeteredBody, RequestCharge};
    /// use http_body_util::BodyExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ledger = ByteLedger::new(4)?;
    /// let _other = ledger.try_charge(1)?;
    /// let charge = RequestCharge::new(ledger.try_charge(0)?);
    /// let body = MeteredBody::new(http_body_util::Full::new(bytes::Bytes::from("hello")), charge);
    /// let err = body.collect().await.unwrap_err();
    /// assert!(err.downcast_ref::<BodyRefused>().is_some());
    /// assert_eq!(ledger.in_flight(), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub struct MeteredBody<B> {
        // `None` only once taken (`into_inner`, or handed to the charge on drop).
        #[pin]
        inner: Option<B>,
        // `None` unmetered and not replayed. One pointer: every request's body is moved
        // several times on its way to the handler, and an unmetered one should cost next
        // to nothing.
        meter: Option<Pin<Box<Meter<B>>>>,
    }

    impl<B> PinnedDrop for MeteredBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(meter) = this.meter.as_mut() {
                let meter = meter.as_mut().project();
                // A body read ahead to its end has nothing left to read.
                let ended = meter.replay.as_ref().is_some_and(|replay| replay.ended());
                if let (Some(keep), Some(charge), false) = (meter.keep.take(), meter.charge, ended) {
                    keep(this.inner, charge);
                }
            }
        }
    }
}

pin_project! {
    /// What a metered (or replayed) body carries beside its inner body.
    struct Meter<B> {
        // The charge this body grows, with its counters; `None` for a body that is only
        // replayed, not metered.
        charge: Option<RequestCharge>,
        // Frames read ahead of the reader (`replay`), given first.
        replay: Option<Box<dyn Replay<B>>>,
        // Its timing, for a body held to a minimum data rate.
        #[pin]
        pace: Option<Pace>,
        // Hands an unfinished body to its charge when dropped (`keep_unread`).
        keep: Option<fn(Pin<&mut Option<B>>, &RequestCharge)>,
    }
}

const TAKEN: &str = "a MeteredBody's inner body is there until it is taken, by value";

impl<B> MeteredBody<B> {
    /// Meters `inner` against `charge`, which covers what was charged up front.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    /// use admission_http::{MeteredBody, RequestCharge};
    ///
    /// let charge = RequestCharge::new(ByteLedger::new(10)?.try_charge(4)?);
    /// let body = MeteredBody::new("body", charge);
    /// assert_eq!(body.charge().unwrap().charged(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(inner: B, charge: RequestCharge) -> Self {
        // What the charge covers now is what the body may carry before growing it.
        let covered = charge.charged();
        charge.shared.covered.store(covered, Ordering::Relaxed);
        Self {
            inner: Some(inner),
            meter: Some(Box::pin(Meter {
                charge: Some(charge),
                replay: None,
                pace: None,
                keep: None,
            })),
        }
    }

    /// Holds the body to a minimum data rate, counting only the time its reader waits on
    /// it: once it has waited out `rate`'s grace period, a body that has sent less than
    /// the rate times its wait fails with [`BodyRefused`] ([`Refused::TooSlow`], recorded
    /// in its charge). With a `declared` length, its charge also follows its pace: from
    /// the grace period's worth at the minimum rate, it grows as data arrives to what has
    /// arrived plus the grace period at the body's own rate (up to the declared length),
    /// and gives back, while the body waits, what its rate no longer earns. A growth the
    /// budget cannot take beyond the data itself is skipped, not refused.
    ///
    /// The timer is tokio's (feature `tokio`, inside a tokio runtime). Without it a body
    /// that stalls is cut, and its charge reviewed, only when its next frame comes. An
    /// unmetered body is not timed: to time a body without a byte budget, meter it with
    /// [`RequestCharge::unmetered`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_core::{ByteLedger, Refused};
    /// use admission_http::{MeteredBody, MinDataRate, RequestCharge};
    /// use http_body_util::{BodyExt, StreamBody};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ledger = ByteLedger::new(1 << 20)?;
    /// let rate = MinDataRate::new(100, Duration::from_millis(100));
    /// // A body that declared 64 KiB, then sends one byte after 300 ms.
    /// let (tx, rx) = tokio::sync::mpsc::channel(1);
    /// tokio::spawn(async move {
    ///     tokio::time::sleep(Duration::from_millis(300)).await;
    ///     let _ = tx.send(Ok::<_, std::io::Error>(http_body::Frame::data(bytes::Bytes::from("x")))).await;
    /// });
    /// let slow = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    /// let charge = RequestCharge::new(ledger.try_charge(rate.grace_bytes())?);
    /// let body = MeteredBody::new(slow, charge.clone()).paced(rate, Some(64 << 10));
    /// assert_eq!(ledger.in_flight(), 10, "the grace period's worth, not 64 KiB");
    /// assert!(body.collect().await.is_err());
    /// assert_eq!(charge.refused(), Some(Refused::TooSlow));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`Refused::TooSlow`]: admission_core::Refused::TooSlow
    pub fn paced(mut self, rate: MinDataRate, declared: Option<u64>) -> Self {
        if let Some(meter) = self.meter.as_mut().filter(|meter| meter.charge.is_some()) {
            let pace = Pace::new(rate, declared);
            meter.as_mut().project().pace.set(Some(pace));
        }
        self
    }

    /// When the reader drops this body before its end, hands what is left of it to the
    /// charge, which reads and discards it as [`RequestCharge::poll_unread`] is polled
    /// (by whatever holds the charge until the response ends). A server such as hyper
    /// stops reading a connection whose request body was dropped unfinished, and then
    /// cannot see the client hang up while the response has nothing to send; read on,
    /// it sees the end of the connection, and the holder can release what the request
    /// held. A body that was refused or had ended is not kept, nor an unmetered one
    /// (there is no charge to keep it).
    ///
    /// ```
    /// use std::task::Poll;
    /// use admission_core::ByteLedger;
    /// use admission_http::{MeteredBody, RequestCharge};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ledger = ByteLedger::new(100)?;
    /// let (tx, rx) = tokio::sync::mpsc::channel(1);
    /// let unfinished = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    /// let charge = RequestCharge::new(ledger.try_charge(10)?);
    /// drop(MeteredBody::new(unfinished, charge.clone()).keep_unread()); // the handler drops it
    ///
    /// let unread = std::future::poll_fn(|cx| Poll::Ready(charge.poll_unread(cx)));
    /// assert!(unread.await.is_pending(), "kept, and read on");
    /// tx.send(Err::<http_body::Frame<bytes::Bytes>, _>(std::io::Error::other("reset"))).await?;
    /// let gone = std::future::poll_fn(|cx| charge.poll_unread(cx)).await;
    /// assert!(!gone, "the client went away: its body failed");
    /// # Ok(())
    /// # }
    /// ```
    pub fn keep_unread(mut self) -> Self
    where
        B: Body + Send + Unpin + 'static,
    {
        if let Some(meter) = self.meter.as_mut() {
            *meter.as_mut().project().keep = Some(hand_over::<B>);
        }
        self
    }

    /// Gives the frames `read` ahead of this body ([`ReadAhead`]) first, as if they had
    /// just arrived (metered and timed as they are given), then the rest of the body. The
    /// reader sees the body it would have seen had nothing been read ahead.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    /// use admission_http::{MeteredBody, ReadAhead, RequestCharge};
    /// use http_body_util::BodyExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut ahead = ReadAhead::new(http_body_util::Full::new(bytes::Bytes::from("hello")), 1024);
    /// let _ = ahead.poll_failed(&mut std::task::Context::from_waker(std::task::Waker::noop()));
    /// let (body, read) = ahead.split();
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// let charge = RequestCharge::new(ledger.try_charge(0)?);
    /// let body = MeteredBody::new(body, charge.clone()).replay(read);
    /// assert_eq!(ledger.in_flight(), 0, "charged as it is given, not as it was read");
    /// assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");
    /// assert_eq!(charge.charged(), 5);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`ReadAhead`]: crate::ReadAhead
    pub fn replay(mut self, read: ReadFrames<B>) -> Self
    where
        B: Body + 'static,
        B::Data: Send + Sync,
    {
        let meter = self.meter.get_or_insert_with(|| {
            Box::pin(Meter {
                charge: None,
                replay: None,
                pace: None,
                keep: None,
            })
        });
        *meter.as_mut().project().replay = Some(Box::new(read));
        self
    }

    /// Passes `inner` through uncharged and uncounted, for a server whose requests are
    /// metered only sometimes but whose handlers take one body type. It costs a few
    /// empty words beside the inner body, and a branch per frame.
    ///
    /// ```
    /// use admission_http::MeteredBody;
    ///
    /// let body = MeteredBody::unmetered(http_body_util::Empty::<bytes::Bytes>::new());
    /// assert!(body.charge().is_none());
    /// ```
    #[inline]
    pub fn unmetered(inner: B) -> Self {
        Self {
            inner: Some(inner),
            meter: None,
        }
    }

    /// Data bytes read through the body so far, if it is metered (0 if not: an unmetered
    /// body counts nothing).
    ///
    /// ```
    /// use admission_core::ByteLedger;
    /// use admission_http::{MeteredBody, RequestCharge};
    ///
    /// let charge = RequestCharge::new(ByteLedger::new(10)?.try_charge(0)?);
    /// assert_eq!(MeteredBody::new(http_body_util::Empty::<bytes::Bytes>::new(), charge).seen(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn seen(&self) -> u64 {
        self.charge()
            .map_or(0, |charge| charge.shared.seen.load(Ordering::Relaxed))
    }

    /// What was read ahead of this body and is still to be given, if anything was.
    fn replayed(&self) -> Option<&dyn Replay<B>> {
        self.meter
            .as_ref()
            .and_then(|meter| meter.replay.as_deref())
    }

    /// Whether the byte ledger refused this body: it then ends.
    fn failed(&self) -> bool {
        self.charge().is_some_and(|c| c.refused().is_some())
    }

    /// The shared charge, if the body is metered.
    ///
    /// ```
    /// use admission_http::MeteredBody;
    ///
    /// assert!(MeteredBody::unmetered("body").charge().is_none());
    /// ```
    pub fn charge(&self) -> Option<&RequestCharge> {
        self.meter.as_ref().and_then(|meter| meter.charge.as_ref())
    }

    /// The inner body.
    ///
    /// ```
    /// use admission_http::MeteredBody;
    ///
    /// assert_eq!(*MeteredBody::unmetered("body").get_ref(), "body");
    /// ```
    pub fn get_ref(&self) -> &B {
        self.inner.as_ref().expect(TAKEN)
    }

    /// The inner body, mutably.
    ///
    /// ```
    /// use admission_http::MeteredBody;
    ///
    /// let mut body = MeteredBody::unmetered(String::from("a"));
    /// body.get_mut().push('b');
    /// assert_eq!(body.get_ref(), "ab");
    /// ```
    pub fn get_mut(&mut self) -> &mut B {
        self.inner.as_mut().expect(TAKEN)
    }

    /// The inner body; the charge is released unless another clone holds it.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    /// use admission_http::{MeteredBody, RequestCharge};
    ///
    /// let ledger = ByteLedger::new(10)?;
    /// let body = MeteredBody::new("x", RequestCharge::new(ledger.try_charge(1)?));
    /// assert_eq!(body.into_inner(), "x");
    /// assert_eq!(ledger.in_flight(), 0, "no other clone held the charge");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_inner(self) -> B {
        let mut this = self;
        this.inner.take().expect(TAKEN)
    }
}

/// What a poll of body `B` gives.
type Polled<B> = Poll<Option<Result<Frame<<B as Body>::Data>, <B as Body>::Error>>>;

/// The next frame of a body of which `replay` (if any) was read ahead: those frames first,
/// then the body's own.
#[inline]
fn poll_source<B: Body>(
    inner: Pin<&mut B>,
    replay: &mut Option<Box<dyn Replay<B>>>,
    cx: &mut Context<'_>,
) -> Polled<B> {
    if let Some(ahead) = replay {
        if let Some(frame) = ahead.next() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if ahead.ended() {
            return Poll::Ready(None);
        }
        *replay = None;
    }
    inner.poll_frame(cx)
}

/// Hands an unfinished, unrefused body to its charge (see `MeteredBody::keep_unread`).
fn hand_over<B: Body + Send + Unpin + 'static>(inner: Pin<&mut Option<B>>, charge: &RequestCharge) {
    let inner = inner.get_mut();
    let unfinished = inner.as_ref().is_some_and(|body| !body.is_end_stream());
    if unfinished && charge.refused().is_none() {
        if let Some(body) = inner.take() {
            *charge
                .shared
                .unread
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(Box::pin(body));
            // Release: pairs with the acquire in `poll_unread`, which then finds the body.
            charge.shared.kept.store(true, Ordering::Release);
        }
    }
}

/// A request body read only to be discarded.
trait Unread: Send {
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

impl<B> Body for MeteredBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let inner = this.inner.as_mut().as_pin_mut().expect(TAKEN);
        let Some(meter) = this.meter.as_mut() else {
            // Unmetered: the inner body, as it is.
            return inner.poll_frame(cx).map_err(Into::into);
        };
        let meter = meter.as_mut().project();
        let replay = meter.replay;
        let Some(charge) = meter.charge.as_ref() else {
            // Replayed, not metered.
            return poll_source(inner, replay, cx).map_err(Into::into);
        };
        if charge.refused().is_some() {
            return Poll::Ready(None);
        }
        let Some(mut pace) = meter.pace.as_pin_mut() else {
            return match poll_source(inner, replay, cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.data_ref() {
                    Some(data) => {
                        let seen = charge.saw(data.remaining() as u64);
                        match charge.cover(seen, seen) {
                            Ok(()) => Poll::Ready(Some(Ok(frame))),
                            Err(refused) => Poll::Ready(Some(Err(Box::new(refused)))),
                        }
                    }
                    None => Poll::Ready(Some(Ok(frame))),
                },
                other => other.map_err(Into::into),
            };
        };
        let mut now = pace::now();
        match poll_source(inner, replay, cx) {
            Poll::Pending => {
                pace.as_mut().waiting(now);
                loop {
                    if pace.too_slow(now) {
                        let refused = charge.refuse(Refused::TooSlow);
                        return Poll::Ready(Some(Err(Box::new(refused))));
                    }
                    // Give back what the body's pace no longer earns.
                    charge.give_back(pace.reservation(now));
                    let holds_ahead = charge.covered() > pace.received;
                    match pace.as_mut().poll_alarm(cx, now, holds_ahead) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(()) => now = pace::now(),
                    }
                }
            }
            Poll::Ready(Some(Ok(frame))) => {
                let data = frame.data_ref().map_or(0, |data| data.remaining() as u64);
                if pace.too_slow(now) {
                    // Late (without a timer, nothing cut it while it waited).
                    let refused = charge.refuse(Refused::TooSlow);
                    return Poll::Ready(Some(Err(Box::new(refused))));
                }
                pace.as_mut().arrived(now, data);
                if data > 0 {
                    let seen = charge.saw(data);
                    if let Err(refused) = charge.cover(seen, pace.reservation(now)) {
                        return Poll::Ready(Some(Err(Box::new(refused))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            other => other.map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        if self.failed() {
            return true;
        }
        match self.replayed() {
            Some(replay) if !replay.is_empty() => false,
            Some(replay) if replay.ended() => true,
            _ => self.get_ref().is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        if self.failed() {
            return SizeHint::with_exact(0);
        }
        let inner = self.get_ref().size_hint();
        match self.replayed() {
            Some(replay) => ahead::size_hint(replay.remaining(), replay.ended(), inner),
            None => inner,
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for MeteredBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MeteredBody")
            .field("inner", &self.inner)
            .field("seen", &self.seen())
            .field("metered", &self.meter.is_some())
            .finish()
    }
}
