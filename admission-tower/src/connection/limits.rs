//! `ConnectionLimits`: every bound on a connection, in one value.

use std::time::Duration;

use admission_http::MinDataRate;

/// What a connection may hold, and for how long, before any request of it is admitted:
/// one value, safe by default, set with [`AdmissionBuilder::connection_limits`] and held by
/// `AdmissionLayer::serve` (feature `serve`), which bounds all of it; or in part (the
/// caps, the first byte within the head bound, the send rate) by `AdmissionLayer::guard`
/// (feature `axum`) for `axum::serve`, and by `Connections::admit` in an accept loop of
/// your own.
///
/// | Bound | What it stops | Default | Kestrel | nginx |
/// |---|---|---|---|---|
/// | [`max_connections`](Self::with_max_connections) | the process running out of sockets, tasks and buffers | none | `MaxConcurrentConnections` (none) | `worker_connections` |
/// | [`max_per_address`](Self::with_max_per_address) | one client address taking every connection | none | — | `limit_conn` (none) |
/// | [`head_within`](Self::with_head_within) | a request head trickled in (slowloris), a connection that never sends one, a stalled TLS handshake or h2 preface | [30 s](Self::HEAD_WITHIN) | `RequestHeadersTimeout` 30 s | `client_header_timeout` 60 s |
/// | [`idle`](Self::with_idle) | a connection kept open with nothing in flight | [130 s](Self::IDLE) | `KeepAliveTimeout` 130 s | `keepalive_timeout` 75 s |
/// | [`ping`](Self::with_ping) | an h2 peer that is gone without a word, its streams held | [every 60 s, 20 s to answer](Self::PING) | `KeepAlivePingDelay` (off), `KeepAlivePingTimeout` 20 s | — |
/// | [`max_streams`](Self::with_max_streams) | one h2 connection opening streams without end (the excess is refused with `REFUSED_STREAM`, which clients retry) | [100](Self::MAX_STREAMS) | `Http2.MaxStreamsPerConnection` 100 | `http2_max_concurrent_streams` 128 |
/// | [`max_header_bytes`](Self::with_max_header_bytes) | a head of unbounded size (431 on HTTP/1.1; on h2 the stream is refused, and a CONTINUATION flood ends the connection) | [32 KiB](Self::MAX_HEADER_BYTES) | `MaxRequestHeadersTotalSize` 32 KiB | `large_client_header_buffers` 4 × 8 KiB |
/// | [`min_send_rate`](Self::with_min_send_rate) | a client that does not take a response, holding its request's permits: one that stops reading the socket, or (h2, `serve`) keeps a stream's or the connection's window at 0 or opens it a byte at a time | [240 B/s after 5 s](admission_http::MinDataRate::default) | `MinResponseDataRate` 240 B/s, 5 s | `send_timeout` 60 s |
///
/// The head bound runs from the moment the connection is accepted to its first
/// complete request head (whatever the connection does first counts: a handshake, the
/// h2 preface, the head itself), and on HTTP/1.1 from the first byte of each later head
/// to its end; the idle bound runs while the connection has no request in flight and
/// (HTTP/1.1) no byte of a next head. An idle connection is closed gracefully (an h2
/// `GOAWAY`), a head over its bound at once.
///
/// Not settable, and set to hyper's defences: an h2 client may have at most 20 streams
/// it reset before the server took them and cause at most 1,024 resets by errors of its
/// own, or the connection is ended (`ENHANCE_YOUR_CALM`): the "rapid reset" attack
/// (CVE-2023-44487).
///
/// ```
/// use std::time::Duration;
/// use admission_tower::ConnectionLimits;
///
/// let limits = ConnectionLimits::default()
///     .with_max_connections(Some(10_000))
///     .with_max_per_address(Some(64))
///     .with_head_within(Some(Duration::from_secs(10)));
/// assert_eq!(limits.max_per_address(), Some(64));
/// assert_eq!(limits.idle(), Some(Duration::from_secs(130)));
/// assert_eq!(ConnectionLimits::off().head_within(), None);
/// ```
///
/// [`AdmissionBuilder::connection_limits`]: crate::AdmissionBuilder::connection_limits
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub(crate) max_connections: Option<usize>,
    pub(crate) max_per_address: Option<usize>,
    pub(crate) head_within: Option<Duration>,
    pub(crate) idle: Option<Duration>,
    pub(crate) ping: Option<(Duration, Duration)>,
    pub(crate) max_streams: Option<u32>,
    pub(crate) max_header_bytes: usize,
    pub(crate) min_send_rate: Option<MinDataRate>,
}

/// hyper's floor for its HTTP/1.1 read buffer, which also holds the head.
const MIN_HEADER_BYTES: usize = 8 * 1024;

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: None,
            max_per_address: None,
            head_within: Some(Self::HEAD_WITHIN),
            idle: Some(Self::IDLE),
            ping: Some(Self::PING),
            max_streams: Some(Self::MAX_STREAMS),
            max_header_bytes: Self::MAX_HEADER_BYTES,
            min_send_rate: Some(MinDataRate::default()),
        }
    }
}

impl ConnectionLimits {
    /// The default head bound, 30 s: from the accept to a complete request head, and
    /// from the first byte of each later head to its end (Kestrel's
    /// `RequestHeadersTimeout`).
    pub const HEAD_WITHIN: Duration = Duration::from_secs(30);

    /// The default idle bound, 130 s: above the 90 s most client pools keep an idle
    /// connection, so that the client closes first (Kestrel's `KeepAliveTimeout`).
    pub const IDLE: Duration = Duration::from_secs(130);

    /// The default h2 ping: after 60 s without a frame, and 20 s to answer.
    pub const PING: (Duration, Duration) = (Duration::from_secs(60), Duration::from_secs(20));

    /// The default cap on one h2 connection's concurrent streams, 100.
    pub const MAX_STREAMS: u32 = 100;

    /// The default largest request head, 32 KiB.
    pub const MAX_HEADER_BYTES: usize = 32 * 1024;

    /// No bound a setting can turn off: no cap, no timer, no stream cap, no rate. The
    /// header size stays bounded (at hyper's largest read buffer, about 400 KiB), and
    /// hyper's defences against reset floods stay on.
    ///
    /// ```
    /// use admission_tower::ConnectionLimits;
    ///
    /// let off = ConnectionLimits::off();
    /// assert_eq!((off.idle(), off.max_streams(), off.min_send_rate()), (None, None, None));
    /// ```
    pub const fn off() -> Self {
        Self {
            max_connections: None,
            max_per_address: None,
            head_within: None,
            idle: None,
            ping: None,
            max_streams: None,
            max_header_bytes: 400 * 1024,
            min_send_rate: None,
        }
    }

    /// At most `max` connections open at once; one accepted above it is closed before
    /// anything is read from it. `None`: no cap; 0 is a build error
    /// ([`BuildError::ZeroConnectionLimit`](crate::BuildError::ZeroConnectionLimit)), as
    /// is 0 for every bound here.
    pub const fn with_max_connections(mut self, max: Option<usize>) -> Self {
        self.max_connections = max;
        self
    }

    /// The cap on open connections.
    pub const fn max_connections(&self) -> Option<usize> {
        self.max_connections
    }

    /// At most `max` connections open at once from one client IP address (nginx's
    /// `limit_conn`); one above it is closed before anything is read from it, while
    /// other addresses are served. `None`: no cap. Only where the address is known
    /// (`AdmissionLayer::serve` and `guard` over TCP). Behind a proxy or a
    /// load balancer every client has its address: leave it off there.
    pub const fn with_max_per_address(mut self, max: Option<usize>) -> Self {
        self.max_per_address = max;
        self
    }

    /// The cap on open connections from one address.
    pub const fn max_per_address(&self) -> Option<usize> {
        self.max_per_address
    }

    /// How long a connection may take from being accepted to its first complete request
    /// head, and (HTTP/1.1) from the first byte of each later head to its end. Over it
    /// the connection is closed. `None`: no bound (a client may trickle a head for ever).
    /// Through `guard` (a listener, which sees bytes, not heads) only the first byte is
    /// timed by it.
    pub const fn with_head_within(mut self, within: Option<Duration>) -> Self {
        self.head_within = within;
        self
    }

    /// The bound on request heads.
    pub const fn head_within(&self) -> Option<Duration> {
        self.head_within
    }

    /// When a head begun at `from` must be complete: the head bound's one reading, for
    /// the listener guard (the first byte, from the accept), `serve`'s handshake and each
    /// connection's heads.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // Only the timers read it.
    pub(crate) fn head_due<T: std::ops::Add<Duration, Output = T>>(&self, from: T) -> Option<T> {
        self.head_within.map(|within| from + within)
    }

    /// How long a connection may stay open with no request in flight (and, on HTTP/1.1,
    /// no byte of a next request) before it is closed gracefully. `None`: for ever.
    /// Keep it above your clients' pool idle time (90 s for most) so that they close
    /// first.
    pub const fn with_idle(mut self, idle: Option<Duration>) -> Self {
        self.idle = idle;
        self
    }

    /// The idle bound.
    pub const fn idle(&self) -> Option<Duration> {
        self.idle
    }

    /// On h2, a ping after `every` without a frame from the peer; a peer that does not
    /// answer within `timeout` is closed, and its streams' permits released. `None`: no
    /// pings.
    pub const fn with_ping(mut self, ping: Option<(Duration, Duration)>) -> Self {
        self.ping = ping;
        self
    }

    /// The h2 ping interval and timeout.
    pub const fn ping(&self) -> Option<(Duration, Duration)> {
        self.ping
    }

    /// At most `max` concurrent streams on one h2 connection; the excess is refused with
    /// `REFUSED_STREAM`, which clients retry. `None`: hyper's default (200).
    pub const fn with_max_streams(mut self, max: Option<u32>) -> Self {
        self.max_streams = max;
        self
    }

    /// The cap on concurrent h2 streams.
    pub const fn max_streams(&self) -> Option<u32> {
        self.max_streams
    }

    /// The largest request head, in bytes (HTTP/1.1: the request line and headers,
    /// answered 431 above it; h2: the decoded header list). At least 8 KiB (hyper's
    /// floor): a smaller value is raised to it.
    pub const fn with_max_header_bytes(mut self, max: usize) -> Self {
        self.max_header_bytes = if max < MIN_HEADER_BYTES {
            MIN_HEADER_BYTES
        } else {
            max
        };
        self
    }

    /// The largest request head.
    pub const fn max_header_bytes(&self) -> usize {
        self.max_header_bytes
    }

    /// While the server has bytes a client does not take, the client must take them at
    /// `rate`. Counted only while there are bytes waiting, so an idle stream
    /// (server-sent events whose heartbeats are sent) is never cut. `None`: a client may
    /// stall for ever.
    ///
    /// - **At the socket** (HTTP/1.1, and every connection): writes may wait on the
    ///   client for at most the grace period in all, earning back `1 / rate` seconds a
    ///   byte it takes (never more than the grace period), and all of it when a write is
    ///   taken at once. Over it the connection is closed and its requests' permits
    ///   released.
    /// - **On each h2 stream** (`serve` only): h2's flow control can stall a response
    ///   while the socket stays writable (a window kept at 0, or opened a byte at a
    ///   time, the stream's or the connection's). So each stream's response is handed
    ///   to hyper a piece at a time, each piece what the client could take at `rate`
    ///   within its patience (1 KiB to 16 KiB); the stream may wait for the grace period,
    ///   plus `1 / rate` a byte it has taken, up to what 64 KiB earns (at the default,
    ///   5 s at first and at most 278 s). Over it the stream is reset (`RST_STREAM`), its
    ///   handler's body dropped and its permits released; the connection stays. h2
    ///   buffers at most 96 KiB of a stream's response (its send buffer and two pieces),
    ///   and the request's permits are held until the client has taken the response or
    ///   the stream is reset.
    ///
    /// The request's permits do not wait for either: the layer's own response body keeps
    /// its minimum rate under any server ([`SlowClients::min_response_rate`]), and gives
    /// them back at its own allowance.
    ///
    /// [`SlowClients::min_response_rate`]: crate::SlowClients::min_response_rate
    pub const fn with_min_send_rate(mut self, rate: Option<MinDataRate>) -> Self {
        self.min_send_rate = rate;
        self
    }

    /// The rate a client must read at while the server waits to write.
    pub const fn min_send_rate(&self) -> Option<MinDataRate> {
        self.min_send_rate
    }

    /// The first bound set to 0, which would close or refuse every connection or
    /// stream: the builder's error names it.
    pub(crate) fn zero(&self) -> Option<&'static str> {
        let zero = Duration::ZERO;
        [
            ("max_connections", self.max_connections == Some(0)),
            ("max_per_address", self.max_per_address == Some(0)),
            ("max_streams", self.max_streams == Some(0)),
            ("head_within", self.head_within == Some(zero)),
            ("idle", self.idle == Some(zero)),
            (
                "ping",
                self.ping
                    .is_some_and(|(every, timeout)| every == zero || timeout == zero),
            ),
        ]
        .into_iter()
        .find_map(|(name, zero)| zero.then_some(name))
    }
}
