//! Admission as a tonic `Interceptor`.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use admission_core::{Gate, GatePermit};
use tonic::metadata::MetadataMap;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::status::{refused_status_with, RefusalCode};

type KeyFn<K> = Arc<dyn Fn(&MetadataMap) -> Option<K> + Send + Sync>;

/// Count and per-key admission for servers that can only add interceptors.
///
/// On admission the permit rides in the request's extensions as a [`HandlerPermit`], so
/// **its scope is the handler's hold on the request**, not the response: it is released
/// when the handler drops the request (typically when the handler returns), even if the
/// handler returned a stream that keeps running. To bound streaming responses, use the
/// layer ([`GrpcAdmission`](crate::GrpcAdmission)), which holds permits until the stream
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
/// let gate = Gate::<String>::builder().count(64).per_key(1).build()?;
/// let mut interceptor = AdmissionInterceptor::new(gate).key(|metadata| {
///     metadata.get("x-subject")?.to_str().ok().map(String::from)
/// });
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
pub struct AdmissionInterceptor<K = String, H = RandomState> {
    gate: Gate<K, H>,
    key: Option<KeyFn<K>>,
    retry_after: Duration,
    code: RefusalCode,
}

impl<K, H> Clone for AdmissionInterceptor<K, H> {
    fn clone(&self) -> Self {
        Self {
            gate: self.gate.clone(),
            key: self.key.clone(),
            retry_after: self.retry_after,
            code: self.code,
        }
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> AdmissionInterceptor<K> {
    /// Admits calls through `gate` (its count and per-key dimensions; a byte budget is
    /// charged 0 here). Refusals carry `RetryInfo` of 1 s until
    /// [`retry_after`](Self::retry_after) says otherwise.
    ///
    /// ```
    /// use admission_core::Gate;
    /// use admission_grpc::AdmissionInterceptor;
    ///
    /// let interceptor = AdmissionInterceptor::new(Gate::<String>::builder().count(8).build()?);
    /// assert_eq!(interceptor.gate().count().unwrap().capacity(), 8);
    /// # Ok::<(), admission_core::CapacityError>(())
    /// ```
    pub fn new(gate: Gate<K>) -> Self {
        Self {
            gate,
            key: None,
            retry_after: Duration::from_secs(1),
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
    /// let gate = Gate::<String>::builder().per_key(1).build()?;
    /// let mut interceptor = AdmissionInterceptor::new(gate.clone())
    ///     .key(|metadata| metadata.get("x-tenant")?.to_str().ok().map(String::from));
    /// let mut request = tonic::Request::new(());
    /// request.metadata_mut().insert("x-tenant", "t1".parse().unwrap());
    /// let _held = interceptor.call(request)?;
    /// assert_eq!(gate.keyed().unwrap().keys(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn key<F>(mut self, key: F) -> Self
    where
        F: Fn(&MetadataMap) -> Option<K> + Send + Sync + 'static,
    {
        self.key = Some(Arc::new(key));
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
    /// let gate = Gate::<String>::builder().count(1).build()?;
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

    /// The code of retryable refusals (default `RESOURCE_EXHAUSTED`).
    ///
    /// ```
    /// use admission_core::Gate;
    /// use admission_grpc::{AdmissionInterceptor, RefusalCode};
    /// use tonic::service::Interceptor;
    ///
    /// let gate = Gate::<String>::builder().count(1).build()?;
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
    /// let mut interceptor = AdmissionInterceptor::new(Gate::<String>::builder().count(2).build()?);
    /// let request = interceptor.call(tonic::Request::new(()))?;
    /// assert_eq!(interceptor.gate().count().unwrap().in_flight(), 1);
    /// drop(request);
    /// assert_eq!(interceptor.gate().count().unwrap().in_flight(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn gate(&self) -> &Gate<K> {
        &self.gate
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> Interceptor for AdmissionInterceptor<K> {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let key = self.key.as_ref().and_then(|key| key(request.metadata()));
        match self.gate.try_admit(key.as_ref(), 0) {
            Ok(permit) => {
                request.extensions_mut().insert(HandlerPermit {
                    _permit: Arc::new(permit),
                });
                Ok(request)
            }
            Err(refused) => Err(refused_status_with(self.code, refused, self.retry_after)),
        }
    }
}

impl<K, H> fmt::Debug for AdmissionInterceptor<K, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionInterceptor")
            .field("snapshot", &self.gate.snapshot())
            .field("retry_after", &self.retry_after)
            .field("code", &self.code)
            .finish_non_exhaustive()
    }
}

/// The permit an [`AdmissionInterceptor`] puts in a request's extensions; released when
/// the last clone of it (the request's extensions) is dropped.
#[derive(Clone)]
pub struct HandlerPermit<K = String, H = RandomState> {
    _permit: Arc<GatePermit<K, H>>,
}

impl<K, H> fmt::Debug for HandlerPermit<K, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerPermit").finish_non_exhaustive()
    }
}
