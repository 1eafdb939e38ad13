//! The responses the send-rate tests leave untaken: `/stream` (16 MiB in 64 KiB chunks),
//! `/big` (16 MiB in one chunk), and `/` ("ok").

// Each test file uses part of this module, and test helpers need no docs.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::convert::Infallible;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;

/// One chunk of `/stream`, and how many (16 MiB in all).
pub const CHUNK: usize = 64 * 1024;
pub const CHUNKS: usize = 256;

/// The single chunk of `/big`.
pub const BIG: usize = 16 << 20;

/// `/`, `/stream` and `/big`, for a test to add its own routes and its layer to.
pub fn routes() -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route(
            "/stream",
            get(|| async {
                let chunks = (0..CHUNKS).map(|_| Ok::<_, Infallible>(Bytes::from(vec![7; CHUNK])));
                Body::from_stream(tokio_stream::iter(chunks))
            }),
        )
        .route("/big", get(|| async { Body::from(vec![7u8; BIG]) }))
}
