//! One tonic service behind limits of its own.

use std::fmt;
use std::task::{Context, Poll};

use admission_tower::{Admission, AdmissionLayer};
use tonic::server::NamedService;
use tower_layer::Layer;
use tower_service::Service;

/// One gRPC service behind limits of its own, in a form tonic's router takes:
/// `Server::builder().add_service(NamedAdmission::new(&layer, service))`.
///
/// A layer on the server (`Server::builder().layer(..)`) puts every service under one
/// gate. To give services different limits (a cheap lookup and an expensive export on one
/// port), wrap each in its own: tonic routes by the wrapped service's name
/// ([`NamedService`]), which the tower crate's [`Admission`] cannot carry without
/// depending on tonic. Everything else is the layer's: refusals (give its builder
/// [`refusals`](crate::refusals())), bypass, drain.
///
/// ```
/// use admission_grpc::NamedAdmission;
/// use admission_tower::AdmissionLayer;
/// use tonic::server::NamedService;
///
/// let (_, health) = tonic_health::server::health_reporter();
/// let tight = AdmissionLayer::builder().count(4).refusals(admission_grpc::refusals()).build()?;
/// let service = NamedAdmission::new(&tight, health);
/// fn name<S: NamedService>(_: &S) -> &'static str { S::NAME }
/// assert_eq!(name(&service), "grpc.health.v1.Health"); // what tonic routes by
/// let _router = tonic::transport::Server::builder().add_service(service);
/// # Ok::<(), admission_tower::BuildError>(())
/// ```
pub struct NamedAdmission<S> {
    inner: Admission<S>,
}

impl<S> NamedAdmission<S> {
    /// `service` behind `layer`'s gate (shared with every other use of that layer).
    ///
    /// ```
    /// use admission_grpc::NamedAdmission;
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().count(8).build()?;
    /// let (_, health) = tonic_health::server::health_reporter();
    /// let wrapped = NamedAdmission::new(&layer, health);
    /// assert_eq!(wrapped.get_ref().gate().count().capacity(), 8);
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn new(layer: &AdmissionLayer, service: S) -> Self {
        Self {
            inner: layer.layer(service),
        }
    }

    /// The admission service inside.
    ///
    /// ```
    /// use admission_grpc::NamedAdmission;
    /// use admission_tower::AdmissionLayer;
    ///
    /// let layer = AdmissionLayer::builder().count(8).build()?;
    /// let (_, health) = tonic_health::server::health_reporter();
    /// assert_eq!(NamedAdmission::new(&layer, health).get_ref().snapshot(), layer.snapshot());
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn get_ref(&self) -> &Admission<S> {
        &self.inner
    }
}

impl<S: NamedService> NamedService for NamedAdmission<S> {
    const NAME: &'static str = S::NAME;
}

impl<S: Clone> Clone for NamedAdmission<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<S, Request> Service<Request> for NamedAdmission<S>
where
    Admission<S>: Service<Request>,
{
    type Response = <Admission<S> as Service<Request>>::Response;
    type Error = <Admission<S> as Service<Request>>::Error;
    type Future = <Admission<S> as Service<Request>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        self.inner.call(request)
    }
}

impl<S: fmt::Debug> fmt::Debug for NamedAdmission<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("NamedAdmission").field(&self.inner).finish()
    }
}
