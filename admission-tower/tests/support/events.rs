//! An event stream's body, for the tests of what a server keeps open and what it cuts.

// Each test file uses part of this module, and test helpers need no docs.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;

/// A body that sends a heartbeat every 200 ms, for ever: an event stream.
pub struct Heartbeats(tokio::time::Interval);

impl Heartbeats {
    pub fn new() -> Self {
        Self(tokio::time::interval(Duration::from_millis(200)))
    }
}

impl http_body::Body for Heartbeats {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_tick(cx)
            .map(|_| Some(Ok(Frame::data(Bytes::from_static(b":\n\n")))))
    }
}
