//! The response future of [`Admission`](super::Admission).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;

use super::service::AdmissionPermit;
use super::ResponseBody;

pin_project! {
    /// The response future of [`Admission`](super::Admission): the inner future with the
    /// request's permits, which it hands to the response body; or a refusal, ready at once.
    ///
    /// Dropping it before it resolves releases the permits.
    ///
    /// # Panics
    ///
    /// If polled again after it returned `Ready`, as futures may.
    pub struct ResponseFuture<F, K, H> {
        #[pin]
        state: State<F, K, H>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, K, H> {
        Admitted { #[pin] future: F, permit: Option<AdmissionPermit<K, H>> },
        Unguarded { #[pin] future: F },
        // Boxed: a refusal is the cold path, and an inline `Response` would make every
        // admitted request's future (moved at each poll site) a hundred bytes larger.
        Refused { response: Option<Box<Response<Bytes>>> },
    }
}

impl<F, K, H> ResponseFuture<F, K, H> {
    pub(crate) fn admitted(future: F, permit: AdmissionPermit<K, H>) -> Self {
        Self {
            state: State::Admitted {
                future,
                permit: Some(permit),
            },
        }
    }

    /// A bypassed (or dry-run) request: no permit.
    pub(crate) fn unguarded(future: F) -> Self {
        Self {
            state: State::Unguarded { future },
        }
    }

    pub(crate) fn refused(response: Response<Bytes>) -> Self {
        Self {
            state: State::Refused {
                response: Some(Box::new(response)),
            },
        }
    }
}

impl<F, B, E, K, H> Future for ResponseFuture<F, K, H>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
    B::Data: From<Bytes>,
{
    type Output = Result<Response<ResponseBody<B, K, H>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Admitted { future, permit } => match future.poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Ok(response)) => {
                    let permit = permit
                        .take()
                        .expect("ResponseFuture polled after it completed");
                    Poll::Ready(Ok(response.map(|body| ResponseBody::admitted(body, permit))))
                }
                Poll::Ready(Err(err)) => {
                    // The request failed without a response body: release now.
                    drop(permit.take());
                    Poll::Ready(Err(err))
                }
            },
            StateProj::Unguarded { future } => match future.poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(result) => Poll::Ready(result.map(|r| r.map(ResponseBody::unguarded))),
            },
            StateProj::Refused { response } => {
                let response = response
                    .take()
                    .expect("ResponseFuture polled after it completed");
                Poll::Ready(Ok((*response).map(ResponseBody::refused)))
            }
        }
    }
}

impl<F, K, H> std::fmt::Debug for ResponseFuture<F, K, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Admitted { .. } => "admitted",
            State::Unguarded { .. } => "unguarded",
            State::Refused { .. } => "refused",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
