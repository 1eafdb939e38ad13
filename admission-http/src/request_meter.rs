//! Request-body metering against a byte ledger: the meter that admits a request.

use admission_core::ByteLedger;
use http::{HeaderMap, Request};

use crate::{MeteredBody, Refusal, RequestCharge, content_length};

/// Charges requests' bodies against a [`ByteLedger`].
///
/// A declared `Content-Length` is charged before the body is read; a request above the
/// ledger's [`max_charge`](ByteLedger::max_charge) is refused as
/// [`Refused::TooLarge`](admission_core::Refused::TooLarge) (413) without reading it. A body without a length is charged as
/// its data frames arrive, and fails with [`BodyRefused`](crate::BodyRefused) when the budget refuses. A body
/// that sends more than it declared is charged for the excess the same way.
///
/// What it does not bound: bytes the handler copies or decodes out of the body (charge
/// those separately), and a client that trickles a body slowly (a timeout's job).
///
/// # Examples
///
/// ```
/// use admission_core::{ByteLedger, Refused};
/// use admission_http::{Refusal, RequestMeter};
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
/// let refusal = meter.charge(huge.headers()).unwrap_err();
/// assert_eq!(refusal, Refusal::Refused(Refused::TooLarge));
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
    /// The [`Refusal`]: a malformed `Content-Length`, or the ledger's refusal. Nothing
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
    pub fn charge(&self, headers: &HeaderMap) -> Result<RequestCharge, Refusal> {
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
    pub fn admit<B>(&self, request: Request<B>) -> Result<MeteredRequest<B>, Refusal> {
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
