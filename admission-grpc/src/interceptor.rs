//! Admission as a tonic `Interceptor`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use admission_core::{Claim, Gate, GatePermit, Key, Priority};
use admission_http::jittered;
use tonic::metadata::MetadataMap;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::status::{RefusalCode, refused_status_with};

type KeyFn = Arc<dyn Fn(&MetadataMap) -> Option<Key> + Send + Sync>;
type ClassifyFn = Arc<dyn Fn(&MetadataMap) -> Priority + Send + Sync>;

/// Count and per-key admission for servers that can only add interceptors.
///
/// On admission the permit rides in the request's extensions as a [`HandlerPermit`], so
/// **its scope is the handler's hold on the request**, not the response: it is released
/// when the handler drops the request (typically when the handler returns), even if the
/// handler returned a stream that keeps running. To bound streaming responses, use the
/// layer ([`refusals`](crate::refusals())), which holds permits until the stream
/// ends. Byte budgets need the request body, so they belong to the layer or to the
/// handler ([`refused_status`](crate::refused_status)).
///
/// # Examples
///
/// ```
/// use admission_core::Gate;
/// use admission_grpc::AdmissionInterceptor;
/// use tonic::service::Interceptor;
///
/// let gate: Gate = Gate::builder().count(64).per_key(1).build()?;
/// let mut interceptor = AdmissionInterceptor::new(gate).key(admission_grpc::key::metadata("x-subject"));
///
/// let mut request = tonic::Request::new(());
/// request.metadata_mut().insert("x-subject", "alice".parse().unwrap());
/// let admitted = interceptor.call(request)?;
///
/// let mut again = tonic::Request::new(());
/// again.metadata_mut().insert("x-subject", "alice".parse().unwrap());
/// let status = interceptor.call(again).unwrap_err();
/// assert_eq!(status.code(), tonic::Code::ResourceExhausted);
///
/// drop(admitted); // the handler is done with the request: the permit is released
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AdmissionInterceptor {
    gate: Gate,
    key: Option<KeyFn>,
    classify: Option<ClassifyFn>,
    retry_after: Duration,
    retry_jitter: Duration,
    code: RefusalCode,
}

impl Clone for AdmissionInterceptor {
    fn clone(&self) -> Self {
        Self {
            gate: self.gate.clone(),
            key: self.key.clone(),
            classify: self.classify.clone(),
            retry_after: self.retry_after,
            retry_jitter: self.retry_jitter,
            code: self.code,
        }
    }
}

impl AdmissionInterceptor {
    /// Admits calls through `gate` (its count and per-key dimensions; a byte budget is
    /// charged 0 here). Refusals carry `RetryInfo` of 1 s until
    /// [`retry_after`](Self::retry_after) says otherwise.
    ///
    /// The gate may be shared: a clone of the one an HTTP or gRPC layer was built from
    /// (`AdmissionLayer::from_gate`) puts both under one limit.
    ///
    /// ```
    /// use admission_core::Gate;
    /// use admission_grpc::AdmissionInterceptor;
    ///
    /// let interceptor = AdmissionInterceptor::new(Gate::<Key>::builder().count(8).build()?);
    /// assert_eq!(interceptor.gate().count().capacity(), 8);
    /// # use admission_core::Key;
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn new(gate: Gate) -> Self {
        Self {
            gate,
            key: None,
            classify: None,
            retry_after: Duration::from_secs(1),
            retry_jitter: Duration::ZERO,
            code: RefusalCode::ResourceExhausted,
        }
    }

    /// Extracts the key from the call's metadata (an authenticated subject, a tenant).
    ///
    /// ```
    /// use admission_core::{Gate, Refused};
    /// use admission_grpc::AdmissionInterceptor;
    /// use tonic::service::Interceptor;
    ///
    /// let gate: Gate = Gate::builder().per_key(1).build()?;
    /// let mut interceptor = AdmissionInterceptor::new(gate.clone())
    ///     .key(|metadata| Some(admission_core::Key::from_bytes(metadata.get("x-tenant")?.as_bytes())));
    /// let mut request = tonic::Request::new(());
    /// request.metadata_mut().insert("x-tenant", "t1".parse().unwrap());
    /// let _held = interceptor.call(request)?;
    /// assert_eq!(gate.keyed().unwrap().keys(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn key<F>(mut self, key: F) -> Self
    where
        F: Fn(&MetadataMap) -> Option<Key> + Send + Sync + 'static,
    {
        self.key = Some(Arc::new(key));
        self
    }

    /// Priority classes: `classify` names each call's class from its metadata, and the
    /// call is admitted only below its class's share of the count capacity, so the least
    /// important calls are shed first (see `admission_core::Classes`). The conventional
    /// metadata entry is [`class::METADATA`](crate::class::METADATA), read by
    /// [`class::metadata`](crate::class::metadata). The count ledger records which class
    /// was shed (`gate().count().refused_by_class()`).
    ///
    /// ```
    /// use admission_core::{Classes, Gate, Priority};
    /// use admission_grpc::{class, AdmissionInterceptor};
    /// use tonic::service::Interceptor;
    ///
    /// let gate: Gate = Gate::builder().count(10).build()?;
    /// let classes = Classes::standard();
    /// let mut interceptor = AdmissionInterceptor::new(gate.clone())
    ///     .priority(class::metadata(&classes, Priority::DEFAULT));
    /// let call = |class_name: &str| {
    ///     let mut request = tonic::Request::new(());
    ///     class::set(&mut request, class_name).unwrap();
    ///     request
    /// };
    /// let held: Vec<_> = (0..7).map(|_| interceptor.call(call("sheddable"))).collect::<Result<_, _>>()?;
    /// assert!(interceptor.call(call("sheddable")).is_err(), "sheddable: 70% of 10");
    /// let _critical = interceptor.call(call("critical"))?;
    /// assert_eq!(gate.count().refused_by_class()[Priority::SHEDDABLE.index()], 1);
    /// # drop(held);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// To shed retries before first attempts (as the layer's `Retries` does), name a
    /// retry's class as its [`Priority::retry`]: gRPC clients send
    /// `grpc-previous-rpc-attempts` on every retry and hedged call.
    ///
    /// ```
    /// use admission_core::{Gate, Priority};
    /// use admission_grpc::AdmissionInterceptor;
    /// use tonic::service::Interceptor;
    ///
    /// let gate: Gate = Gate::builder().count(2).build()?;
    /// let mut interceptor = AdmissionInterceptor::new(gate).priority(|metadata| {
    ///     let earlier = metadata.get("grpc-previous-rpc-attempts").and_then(|n| n.to_str().ok()?.parse::<u32>().ok());
    ///     if earlier > Some(0) { Priority::CRITICAL.retry(50) } else { Priority::CRITICAL }
    /// });
    /// let _first = interceptor.call(tonic::Request::new(()))?;
    /// let mut retry = tonic::Request::new(());
    /// retry.metadata_mut().insert("grpc-previous-rpc-attempts", "1".parse().unwrap());
    /// assert!(interceptor.call(retry).is_err(), "1 of 2 in flight: retries may fill 1");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn priority<F>(mut self, classify: F) -> Self
    where
        F: Fn(&MetadataMap) -> Priority + Send + Sync + 'static,
    {
        self.classify = Some(Arc::new(classify));
        self
    }

    /// The retry delay refusals carry.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_core::Gate;
    /// use admission_grpc::AdmissionInterceptor;
    /// use tonic::service::Interceptor;
    /// use tonic_types::StatusExt;
    ///
    /// let gate: Gate = Gate::builder().count(1).build()?;
    /// let mut interceptor = AdmissionInterceptor::new(gate).retry_after(Duration::from_millis(100));
    /// let _held = interceptor.call(tonic::Request::new(()))?;
    /// let status = interceptor.call(tonic::Request::new(())).unwrap_err();
    /// assert_eq!(status.get_details_retry_info().unwrap().retry_delay, Some(Duration::from_millis(100)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn retry_after(mut self, delay: Duration) -> Self {
        self.retry_after = delay;
        self
    }

    /// Spreads each refusal's retry delay over `[retry_after, retry_after + jitter]`,
    /// drawn per refusal (default: none; see `admission_http::Refusals::retry_jitter`
    /// for why it is off, and when to turn it on).
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_core::Gate;
    /// use admission_grpc::AdmissionInterceptor;
    /// use tonic::service::Interceptor;
    /// use tonic_types::StatusExt;
    ///
    /// let gate: Gate = Gate::builder().count(1).build()?;
    /// let mut interceptor = AdmissionInterceptor::new(gate)
    ///     .retry_after(Duration::from_millis(100))
    ///     .retry_jitter(Duration::from_millis(100));
    /// let _held = interceptor.call(tonic::Request::new(()))?;
    /// let status = interceptor.call(tonic::Request::new(())).unwrap_err();
    /// let delay = status.get_details_retry_info().unwrap().retry_delay.unwrap();
    /// assert!(Duration::from_millis(100) <= delay && delay <= Duration::from_millis(200));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn retry_jitter(mut self, jitter: Duration) -> Self {
        self.retry_jitter = jitter;
        self
    }

    /// The code of retryable refusals (default `RESOURCE_EXHAUSTED`).
    ///
    /// ```
    /// use admission_core::Gate;
    /// use admission_grpc::{AdmissionInterceptor, RefusalCode};
    /// use tonic::service::Interceptor;
    ///
    /// let gate: Gate = Gate::builder().count(1).build()?;
    /// let mut interceptor = AdmissionInterceptor::new(gate).code(RefusalCode::Unavailable);
    /// let _held = interceptor.call(tonic::Request::new(()))?;
    /// assert_eq!(interceptor.call(tonic::Request::new(())).unwrap_err().code(), tonic::Code::Unavailable);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn code(mut self, code: RefusalCode) -> Self {
        self.code = code;
        self
    }

    /// The gate.
    ///
    /// ```
    /// use admission_core::Gate;
    /// use admission_grpc::AdmissionInterceptor;
    /// use tonic::service::Interceptor;
    ///
    /// let mut interceptor = AdmissionInterceptor::new(Gate::<Key>::builder().count(2).build()?);
    /// # use admission_core::Key;
    /// let request = interceptor.call(tonic::Request::new(()))?;
    /// assert_eq!(interceptor.gate().count().in_flight(), 1);
    /// drop(request);
    /// assert_eq!(interceptor.gate().count().in_flight(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn gate(&self) -> &Gate {
        &self.gate
    }
}

impl Interceptor for AdmissionInterceptor {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let key = self.key.as_ref().and_then(|key| key(request.metadata()));
        let mut claim = Claim::new();
        if let Some(key) = &key {
            claim = claim.key(key);
        }
        if let Some(classify) = &self.classify {
            claim = claim.priority(classify(request.metadata()));
        }
        match self.gate.try_claim(claim) {
            Ok(permit) => {
                request.extensions_mut().insert(HandlerPermit {
                    _permit: Arc::new(permit),
                });
                Ok(request)
            }
            Err(refused) => {
                let delay = jittered(self.retry_after, self.retry_jitter);
                Err(refused_status_with(self.code, refused, delay))
            }
        }
    }
}

impl fmt::Debug for AdmissionInterceptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionInterceptor")
            .field("snapshot", &self.gate.snapshot())
            .field("retry_after", &self.retry_after)
            .field("retry_jitter", &self.retry_jitter)
            .field("code", &self.code)
            .finish_non_exhaustive()
    }
}

/// The permit an [`AdmissionInterceptor`] puts in a request's extensions; released when
/// the last clone of it (the request's extensions) is dropped.
pub struct HandlerPermit {
    _permit: Arc<GatePermit>,
}

impl Clone for HandlerPermit {
    fn clone(&self) -> Self {
        Self {
            _permit: self._permit.clone(),
        }
    }
}

impl fmt::Debug for HandlerPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerPermit").finish_non_exhaustive()
    }
}
