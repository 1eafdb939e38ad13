//! The response future of [`Admission`](crate::Admission).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;

use crate::ResponseBody;
use crate::discard::{self, Discard};
use crate::permit::AdmissionPermit;

pin_project! {
    /// The response future of [`Admission`](crate::Admission): the inner future with the
    /// request's permits, which it hands to the response body; or a refusal, ready once
    /// the refused request's small body (HTTP/1.x) has been discarded.
    ///
    /// Dropping it before it resolves releases the permits.
    ///
    /// `B` is the request's body type: a refusal may hold the body to discard it.
    ///
    /// # Panics
    ///
    /// If a refusal is polled again after it returned `Ready` (an admitted request's
    /// future is the inner future's, which may panic too), as futures may.
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
        // Held until the response is ready, then handed to its body. `None` for a
        // bypassed (or dry-run, or uncounted) request and for a refusal.
        permit: Option<AdmissionPermit>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Called { #[pin] future: F },
        // Boxed: the cold paths, kept out of every admitted request's future (two
        // variants keep its drop and its poll's dispatch one test).
        Cold { cold: Box<Cold<F>> },
    }
}

enum Cold<F> {
    Refused(Answer),
    /// On the slow path (a lease asked to grow, a wait for a count slot): what the request
    /// becomes once admitted or refused.
    Waiting(Pin<Box<dyn Future<Output = ResponseFuture<F>> + Send>>),
}

/// A refusal, sent once `discard` (if any) has read the request's body.
struct Answer {
    response: Option<Response<Bytes>>,
    /// The refused body being discarded (its type erased: the future's type names only
    /// the inner future).
    discard: Option<Pin<Box<dyn Future<Output = bool> + Send>>>,
    /// The request came over HTTP/1.x: a body not discarded closes the connection.
    http1: bool,
}

impl<F> ResponseFuture<F> {
    #[inline]
    pub(crate) fn admitted(future: F, permit: AdmissionPermit) -> Self {
        Self {
            state: State::Called { future },
            permit: Some(permit),
        }
    }

    /// A request that holds no permit: bypassed, dry run, or uncounted.
    #[inline]
    pub(crate) fn unguarded(future: F) -> Self {
        Self {
            state: State::Called { future },
            permit: None,
        }
    }

    /// A request waiting for a count slot: `wait` admits it (and calls the inner
    /// service) or refuses it.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn waiting(wait: Pin<Box<dyn Future<Output = ResponseFuture<F>> + Send>>) -> Self {
        Self {
            state: State::Cold {
                cold: Box::new(Cold::Waiting(wait)),
            },
            permit: None,
        }
    }

    /// The answer to a request whose client went away while it waited (see
    /// [`gone_response`]).
    #[cold]
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn gone() -> Self {
        Self::answered(Some(gone_response()))
    }

    /// A refusal's state: `response` still to send, or, `None`, sent.
    fn answered(response: Option<Response<Bytes>>) -> Self {
        Self {
            state: State::Cold {
                cold: Box::new(Cold::Refused(Answer {
                    response,
                    discard: None,
                    http1: false,
                })),
            },
            permit: None,
        }
    }

    /// A refusal, sent once `discard` (if any) has read the request's body.
    pub(crate) fn refused<B>(
        response: Response<Bytes>,
        discard: Option<Discard<B>>,
        http1: bool,
    ) -> Self
    where
        B: Body + Send + 'static,
    {
        Self {
            state: State::Cold {
                cold: Box::new(Cold::Refused(Answer {
                    response: Some(response),
                    discard: discard.map(|discard| {
                        Box::pin(discard) as Pin<Box<dyn Future<Output = bool> + Send>>
                    }),
                    http1,
                })),
            },
            permit: None,
        }
    }
}

impl<F, RB, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<RB>, E>>,
    RB: Body,
    RB::Data: From<Bytes>,
{
    type Output = Result<Response<ResponseBody<RB>>, E>;

    #[inline(always)]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        while let StateProj::Cold { cold } = self.as_mut().project().state.project() {
            let Cold::Waiting(wait) = &mut **cold else {
                break;
            };
            // The slow path's end, admitted (the inner future, with its permits) or
            // refused: it becomes that.
            let next = std::task::ready!(wait.as_mut().poll(cx));
            self.as_mut().set(next);
        }
        let this = self.as_mut().project();
        match this.state.project() {
            // Nothing to hand over (a bypassed or uncounted request): the response as it
            // comes, its body wrapped, in one expression (no copy of the response kept
            // across a branch).
            StateProj::Called { future } if this.permit.is_none() => future
                .poll(cx)
                .map_ok(|response| response.map(ResponseBody::passed)),
            StateProj::Called { future } => match future.poll(cx) {
                Poll::Pending => {
                    let gone = this.permit.as_ref().is_some_and(|p| p.client_gone(cx));
                    if gone {
                        // Its client went away while the handler ran: the handler's future
                        // goes first (as a server drops it when it sees the hang-up),
                        // then the permits it ran under; no one reads the answer.
                        self.set(ResponseFuture::answered(None));
                        return Poll::Ready(Ok(gone_response().map(ResponseBody::refused)));
                    }
                    Poll::Pending
                }
                Poll::Ready(Ok(response)) => {
                    let mut permit = this.permit.take();
                    if let Some((refused, late)) =
                        permit.as_mut().and_then(AdmissionPermit::take_late_refusal)
                    {
                        // The meter refused the body while it streamed: whatever the
                        // handler made of the body error (axum: 400; tonic: UNKNOWN), the
                        // request is answered as the refusal it is. The handler's answer
                        // goes first, then the permits it was made under: what it holds
                        // stays counted until it is gone.
                        drop(response);
                        drop(permit);
                        let response = late.respond(refused);
                        return Poll::Ready(Ok(response.map(ResponseBody::refused)));
                    }
                    if let Some(permit) = &mut permit {
                        permit.head(&response);
                    }
                    Poll::Ready(Ok(response.map(|body| ResponseBody::new(body, permit))))
                }
                Poll::Ready(Err(err)) => {
                    // The request failed without a response body: release now (an
                    // overload, for an adaptive limit).
                    if let Some(mut permit) = this.permit.take() {
                        permit.failed();
                    }
                    Poll::Ready(Err(err))
                }
            },
            StateProj::Cold { cold } => {
                let Cold::Refused(Answer {
                    response,
                    discard,
                    http1,
                }) = &mut **cold
                else {
                    unreachable!("a waiting future became what it waited for")
                };
                let mut close = false;
                if let Some(pending) = discard {
                    match pending.as_mut().poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(read_all) => close = !read_all,
                    }
                    *discard = None;
                }
                let mut response = response
                    .take()
                    .expect("ResponseFuture polled after it completed");
                // A body not discarded in time: on HTTP/1.x the connection goes with it.
                if close && *http1 {
                    discard::close(&mut response);
                }
                Poll::Ready(Ok(response.map(ResponseBody::refused)))
            }
        }
    }
}

/// The answer to a request whose client went away while it waited or while its handler
/// ran: no one reads it (400, as a handler answers a body it cannot read).
#[cold]
fn gone_response() -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    *response.status_mut() = http::StatusCode::BAD_REQUEST;
    response
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match (&self.state, &self.permit) {
            (State::Called { .. }, Some(_)) => "admitted",
            (State::Called { .. }, None) => "unguarded",
            (State::Cold { cold }, _) => match **cold {
                Cold::Refused(_) => "refused",
                Cold::Waiting(_) => "waiting",
            },
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
