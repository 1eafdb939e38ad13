//! The response future of [`Admission`](super::Admission).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use admission_core::Refused;
use admission_http::Rejection;
use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;

use super::drain::{self, Drain};
use super::layer::Shared;
use super::service::AdmissionPermit;
use super::ResponseBody;

pin_project! {
    /// The response future of [`Admission`](super::Admission): the inner future with the
    /// request's permits, which it hands to the response body; or a refusal, ready once
    /// the refused request's small body (HTTP/1.x) has been drained.
    ///
    /// Dropping it before it resolves releases the permits.
    ///
    /// `B` is the request's body type: a refusal may hold the body to drain it.
    ///
    /// # Panics
    ///
    /// If polled again after it returned `Ready`, as futures may.
    pub struct ResponseFuture<F, B, K, H> {
        #[pin]
        state: State<F, B, K, H>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B, K, H> {
        Admitted {
            #[pin] future: F,
            permit: Option<AdmissionPermit<K, H>>,
            late: Option<Box<LateRefusal<K, H>>>,
        },
        Unguarded { #[pin] future: F },
        // Boxed: a refusal is the cold path, and an inline `Response` would make every
        // admitted request's future (moved at each poll site) a hundred bytes larger.
        Refused {
            response: Option<Box<Response<Bytes>>>,
            drain: Option<Pin<Box<Drain<B>>>>,
        },
    }
}

/// What answering a request whose body is refused while it streams takes: the request's
/// head, kept for the refusal (its body closure sees the method, URI and headers), and
/// the layer's configuration. Kept only for a request whose body may still be refused.
pub(crate) struct LateRefusal<K, H> {
    shared: Arc<Shared<K, H>>,
    /// The request's head without its extensions (which cannot be cloned).
    head: Parts,
}

impl<K, H> LateRefusal<K, H> {
    pub(crate) fn new(shared: &Arc<Shared<K, H>>, parts: &Parts) -> Box<Self> {
        let (mut head, ()) = Request::new(()).into_parts();
        head.method = parts.method.clone();
        head.uri = parts.uri.clone();
        head.version = parts.version;
        head.headers = parts.headers.clone();
        Box::new(Self {
            shared: shared.clone(),
            head,
        })
    }

    /// The refusal, in place of the handler's answer to a body it could not read.
    #[cold]
    fn respond(self, refused: Refused) -> Response<Bytes> {
        let (head, rejection) = (&self.head, Rejection::Refused(refused));
        self.shared.refused(head, rejection);
        let mut response =
            self.shared
                .refusals
                .respond_to(&head.method, &head.uri, &head.headers, rejection);
        // The rest of the body is unread: on HTTP/1.x this is the connection's last.
        if drain::is_http1(head.version) {
            drain::close(&mut response);
        }
        response
    }
}

impl<F, B, K, H> ResponseFuture<F, B, K, H> {
    pub(crate) fn admitted(
        future: F,
        permit: AdmissionPermit<K, H>,
        late: Option<Box<LateRefusal<K, H>>>,
    ) -> Self {
        Self {
            state: State::Admitted {
                future,
                permit: Some(permit),
                late,
            },
        }
    }

    /// A bypassed (or dry-run) request: no permit.
    pub(crate) fn unguarded(future: F) -> Self {
        Self {
            state: State::Unguarded { future },
        }
    }

    /// A refusal, sent once `drain` (if any) has read the request's body.
    pub(crate) fn refused(response: Response<Bytes>, drain: Option<Drain<B>>) -> Self {
        Self {
            state: State::Refused {
                response: Some(Box::new(response)),
                drain: drain.map(Box::pin),
            },
        }
    }
}

impl<F, B, RB, E, K, H> Future for ResponseFuture<F, B, K, H>
where
    F: Future<Output = Result<Response<RB>, E>>,
    B: Body,
    RB: Body,
    RB::Data: From<Bytes>,
{
    type Output = Result<Response<ResponseBody<RB, K, H>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Admitted {
                future,
                permit,
                late,
            } => match future.poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Ok(response)) => {
                    let permit = permit
                        .take()
                        .expect("ResponseFuture polled after it completed");
                    // The meter refused the body while it streamed: whatever the handler
                    // made of the body error (axum: 400; tonic: UNKNOWN), the request is
                    // answered as the refusal it is. The request is over: release now.
                    if late.is_some() {
                        if let Some(refused) = permit.refused() {
                            drop((response, permit));
                            let late = late.take().expect("checked just above");
                            let response = late.respond(refused);
                            return Poll::Ready(Ok(response.map(ResponseBody::refused)));
                        }
                    }
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
            StateProj::Refused { response, drain } => {
                let mut close = false;
                if let Some(pending) = drain {
                    match pending.as_mut().poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(read_all) => close = !read_all,
                    }
                    *drain = None;
                }
                let mut response = response
                    .take()
                    .expect("ResponseFuture polled after it completed");
                if close {
                    drain::close(&mut response);
                }
                Poll::Ready(Ok((*response).map(ResponseBody::refused)))
            }
        }
    }
}

impl<F, B, K, H> std::fmt::Debug for ResponseFuture<F, B, K, H> {
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
