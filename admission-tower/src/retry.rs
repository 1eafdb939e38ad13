//! `Retries`: requests that say they are retries, shed before first attempts.

use std::fmt;

use http::header::HeaderName;
use http::request::Parts;

type IsRetryFn = Box<dyn Fn(&Parts) -> bool + Send + Sync>;

/// Sheds retries before first attempts (off by default: see
/// [`AdmissionBuilder::retries`](crate::AdmissionBuilder::retries)).
///
/// Under overload, every refused request a client retries comes back as another request:
/// retries multiply the load just when the server can least take it. gRPC's retry design
/// (gRFC A6) throttles them at the client; this is the server's half. A request that says
/// it is a retry is admitted only while fewer than [`share`](Self::share) of what its
/// class may fill (80% by default) are in flight: a retry of a class of 90% at a count of
/// 100 is admitted below 72 in flight, a first attempt of the same class below 90. So
/// when the server must shed, it sheds retries first, and the first attempts of every
/// client keep the capacity. A retry refused is refused as any request of its class below
/// the capacity ([`Refused::Class`](crate::Refused::Class): 503 + `Retry-After`, gRPC
/// `RESOURCE_EXHAUSTED`), at once: **a retry never waits** in a [`Wait`](crate::Wait),
/// since its client already backs off between attempts.
///
/// How a request says it is a retry: [`grpc`](Self::grpc) reads the header gRPC clients
/// set on every retry and hedged call (`grpc-previous-rpc-attempts`);
/// [`previous_attempts`](Self::previous_attempts) reads a header of yours in the same
/// form; [`when`](Self::when) takes any test of the head (Envoy's
/// `x-envoy-attempt-count`, which is 1 on a first attempt, below). The header is the
/// client's word, and safe to take from anyone: saying "retry" only lowers a request.
///
/// Retries of each class are counted apart from its first attempts only where they are
/// refused: `gate.refused_retries` in the snapshot, the metric
/// `admission_refused_retries_total`, and [`RefusalEvent::retry`](crate::RefusalEvent::retry).
///
/// ```
/// use admission_tower::{AdmissionLayer, Retries};
///
/// // gRPC: retries and hedged calls say so in `grpc-previous-rpc-attempts`.
/// let grpc = AdmissionLayer::builder().count(64).retries(Retries::grpc()).build()?;
///
/// // Behind Envoy, whose `x-envoy-attempt-count` is 1 on a first attempt; retries
/// // may fill half of what their class may.
/// let envoy = Retries::when(|head| {
///     head.headers
///         .get("x-envoy-attempt-count")
///         .and_then(|value| value.to_str().ok()?.parse::<u32>().ok())
///         .is_some_and(|attempt| attempt > 1)
/// });
/// let http = AdmissionLayer::builder().count(64).retries(envoy.share(50)).build()?;
/// # drop((grpc, http));
/// # Ok::<(), admission_tower::BuildError>(())
/// ```
pub struct Retries {
    pub(crate) is_retry: IsRetryFn,
    pub(crate) share: u8,
}

impl Retries {
    /// The share of its class a retry may fill unless [`share`](Self::share) says
    /// otherwise, in percent: the last 20% of what each class may fill is kept for first
    /// attempts.
    pub const SHARE: u8 = 80;

    /// gRPC's convention: a call is a retry (or a hedged copy) when its
    /// `grpc-previous-rpc-attempts` header says it had earlier attempts (1 or more).
    /// gRPC clients with a retry or hedging policy set it.
    ///
    /// ```
    /// use admission_tower::Retries;
    ///
    /// let retries = Retries::grpc();
    /// let (head, _) = http::Request::get("/").header("grpc-previous-rpc-attempts", "2").body(())?.into_parts();
    /// assert!(retries.is_retry(&head));
    /// # Ok::<(), http::Error>(())
    /// ```
    pub fn grpc() -> Self {
        Self::previous_attempts(HeaderName::from_static("grpc-previous-rpc-attempts"))
    }

    /// A request is a retry when header `name` holds a count of earlier attempts of 1 or
    /// more, as gRPC's does. Absent, 0, or not a number: a first attempt.
    ///
    /// ```
    /// use admission_tower::Retries;
    /// use http::HeaderName;
    ///
    /// let retries = Retries::previous_attempts(HeaderName::from_static("x-retry-attempt"));
    /// let head = |value: &str| http::Request::get("/").header("x-retry-attempt", value).body(()).unwrap().into_parts().0;
    /// assert!(retries.is_retry(&head("1")));
    /// assert!(!retries.is_retry(&head("0")));
    /// assert!(!retries.is_retry(&head("again")));
    /// assert!(!retries.is_retry(&http::Request::get("/").body(())?.into_parts().0));
    /// # Ok::<(), http::Error>(())
    /// ```
    pub fn previous_attempts(name: HeaderName) -> Self {
        Self::when(move |head| {
            head.headers
                .get(&name)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.trim().parse::<u64>().ok())
                .is_some_and(|earlier| earlier > 0)
        })
    }

    /// A request is a retry when `is_retry` says so. It runs on every request that is not
    /// bypassed, before admission: keep it to a header lookup.
    ///
    /// ```
    /// use admission_tower::Retries;
    ///
    /// let retries = Retries::when(|head| head.headers.contains_key("x-retry"));
    /// let (head, _) = http::Request::get("/").header("x-retry", "").body(())?.into_parts();
    /// assert!(retries.is_retry(&head));
    /// # Ok::<(), http::Error>(())
    /// ```
    pub fn when<F>(is_retry: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        Self {
            is_retry: Box::new(is_retry),
            share: Self::SHARE,
        }
    }

    /// The share of what its class may fill that a retry may fill, in percent (1 to 100;
    /// [`SHARE`](Self::SHARE) by default): lower sheds retries sooner. At 100 a retry is
    /// admitted as a first attempt is, except that it never waits. A share outside 1 to
    /// 100 is refused by `build`
    /// ([`BuildError::RetryShare`](crate::BuildError::RetryShare)).
    ///
    /// ```
    /// use admission_tower::{AdmissionLayer, BuildError, Retries};
    ///
    /// let layer = AdmissionLayer::builder().count(64).retries(Retries::grpc().share(50)).build();
    /// assert!(layer.is_ok());
    /// let zero = AdmissionLayer::builder().count(64).retries(Retries::grpc().share(0)).build();
    /// assert!(matches!(zero, Err(BuildError::RetryShare(0))));
    /// ```
    #[must_use]
    pub fn share(mut self, percent: u8) -> Self {
        self.share = percent;
        self
    }

    /// Whether the request with head `head` says it is a retry.
    pub fn is_retry(&self, head: &Parts) -> bool {
        (self.is_retry)(head)
    }
}

impl fmt::Debug for Retries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retries")
            .field("share", &self.share)
            .finish_non_exhaustive()
    }
}
