//! Scripted bodies and in-place polling shared by the integration tests.

// Each test file uses part of this module, and test helpers need no docs.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

/// One step of a scripted body.
#[derive(Debug, Clone)]
pub enum Step {
    Pending,
    Data(&'static str),
    Trailers(&'static str, &'static str),
    Error,
}

/// What `is_end_stream` answers.
#[derive(Debug, Clone, Copy)]
pub enum Hint {
    /// True once no step is left.
    Accurate,
    Always,
    Never,
}

#[derive(Debug, PartialEq, Eq)]
pub struct ScriptError;

impl fmt::Display for ScriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("scripted error")
    }
}

impl std::error::Error for ScriptError {}

/// A body that plays `steps` in order, one per poll.
#[derive(Debug)]
pub struct Script {
    steps: VecDeque<Step>,
    hint: Hint,
    size: SizeHint,
}

impl Script {
    pub fn new(hint: Hint, steps: impl IntoIterator<Item = Step>) -> Self {
        Self {
            steps: steps.into_iter().collect(),
            hint,
            size: SizeHint::default(),
        }
    }

    pub fn with_size_hint(mut self, size: SizeHint) -> Self {
        self.size = size;
        self
    }
}

impl Body for Script {
    type Data = Bytes;
    type Error = ScriptError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ScriptError>>> {
        match self.steps.pop_front() {
            None => Poll::Ready(None),
            Some(Step::Pending) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Some(Step::Data(s)) => Poll::Ready(Some(Ok(Frame::data(Bytes::from(s))))),
            Some(Step::Trailers(name, value)) => {
                let mut map = HeaderMap::new();
                map.insert(name, value.parse().unwrap());
                Poll::Ready(Some(Ok(Frame::trailers(map))))
            }
            Some(Step::Error) => Poll::Ready(Some(Err(ScriptError))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self.hint {
            Hint::Accurate => self.steps.is_empty(),
            Hint::Always => true,
            Hint::Never => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        self.size
    }
}

/// A body that fails the test if anyone polls it: proof that a body was not read.
#[derive(Debug)]
pub struct Unread;

impl Body for Unread {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        panic!("the request body was read");
    }
}

/// What one poll of a body returns.
pub type Polled<B> = Poll<Option<Result<Frame<<B as Body>::Data>, <B as Body>::Error>>>;

/// Polls `body` once, in place, with a no-op waker.
pub fn poll<B: Body + Unpin>(body: &mut B) -> Polled<B> {
    Pin::new(body).poll_frame(&mut Context::from_waker(Waker::noop()))
}

/// Polls once and expects a data frame; returns its bytes.
pub fn data<B>(body: &mut B) -> Bytes
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: fmt::Debug,
{
    match poll(body) {
        Poll::Ready(Some(Ok(frame))) => frame.into_data().expect("a data frame"),
        other => panic!(
            "expected a data frame, got {:?}",
            other.map(|o| o.map(|r| r.is_ok()))
        ),
    }
}
