//! `SlowClients`: what the layer does about clients that hold what they were admitted
//! with without doing their part.

use admission_http::MinDataRate;
use http::header::CONTENT_TYPE;
use http::request::Parts;

/// The layer's policy for slow clients ([`AdmissionBuilder::slow_clients`]): one value,
/// safe by default.
///
/// **A request body slower than a minimum rate is cut.** Counted only while the handler
/// waits on the body (a handler that reads slowly is not a slow client), a body that,
/// once it has waited out the grace period, has sent less than the rate times its wait
/// fails with a [`BodyRefused`](admission_http::BodyRefused) of
/// [`Refused::TooSlow`](admission_core::Refused::TooSlow). Its permits go as soon as the
/// handler's answer is dropped, and the client is answered 408, with `connection: close`
/// on HTTP/1.x (if the handler had already sent its response head, the handler sees the
/// body error and ends the response as it sees fit). The default is Kestrel's: 240 bytes
/// per second after 5 s. The cut needs a timer: with the `tokio` feature (the default) a
/// stalled body is cut on time; without it, only when its next frame comes.
///
/// **A slow body holds of the byte budget only what it fills.** With a byte budget, a
/// request that declares its length is charged at first only the grace period's worth at
/// the minimum rate (1,200 bytes by default), and its charge grows with what arrives: to
/// what it has sent plus the grace period at its own measured rate, up to the declared
/// length. While it waits it gives back what its rate no longer earns (reviewed every
/// second; a rate is measured over at least a second). A declared length above the
/// maximum is still refused 413 at the head. So a body holds at most six times what it
/// has sent in its first second, and little more than what it has sent after that.
/// Without this policy, four connections that declare 64 KiB and trickle 2 bytes per
/// second (8 B/s in all) hold a 256 KiB budget indefinitely; with it, the same four hold
/// about 5 KiB and are cut after 5 s, four that keep to the minimum rate (960 B/s in
/// all) hold what they have sent plus 1,200 bytes each, and holding the whole budget
/// takes uploads of about a sixth of it every second (43 KiB/s for 256 KiB), on new
/// connections every second.
///
/// What it costs a legitimate client: a body slower than 240 B/s for longer than 5 s of
/// waiting is cut (a large upload over a very poor link), and a large upload into a busy
/// byte budget may be refused (503) after its first bytes rather than at its head.
///
/// gRPC requests (`content-type: application/grpc…`) are not timed: a client stream may
/// idle between messages for as long as its call lives. A request without a body pays
/// nothing.
///
/// **A response its client does not take gives its permits back.** hyper asks a response
/// body for its next frame only once what it was handed has gone into its buffers, which
/// it does only as the client takes it (an h2 window with room, a socket that drains).
/// So the layer's body hands each frame out in pieces the client could take at the
/// minimum rate in time, and a body not asked for its next piece within its allowance
/// (the grace period, plus what the bytes it has sent earn at the rate, banking at most
/// 64 KiB's worth) is not being taken: an h2 window kept at 0 from the start, a client
/// that stops reading. Its permits (count, bytes, key, fleet lease) go at once, under any
/// server (`axum::serve`, tonic's `Server`, hyper-util's builder), counted in
/// [`AdmissionSnapshot::stalled`](crate::AdmissionSnapshot::stalled), and the body ends in
/// a [`Stalled`](crate::Stalled) error when next asked (hyper resets the h2 stream, or
/// closes the HTTP/1.1 connection). Time the body waits on its own source (an event stream
/// with nothing to say) is never the client's. The default is Kestrel's
/// `MinResponseDataRate`: 240 bytes per second after 5 s. Under `serve` an h2 stream is
/// also reset at the same allowance ([`ConnectionLimits::min_send_rate`](crate::ConnectionLimits::min_send_rate)).
///
/// What it costs: one thread for the process sweeps every 250 ms (a permit goes at most
/// that late), and a response with a body parks its permits between polls (a lock on one
/// of eight shards, and a clock read, each time; a response without a body pays nothing).
/// What it does not bound: how many slots one client takes for a grace period at a time
/// by opening many streams; cap each client ([`PerKey`](crate::PerKey)) for that.
///
/// **A client that goes away holds nothing**, with this policy or without it: waiting
/// for a slot, its handler running, or its response under way, the layer reads what no
/// one else reads of its body so that the server sees it go, drops the handler's future
/// if it is still running, and releases its permits (see the crate docs for the cases it
/// cannot see, and for how long they hold).
///
/// ```
/// use std::time::Duration;
/// use admission_tower::{AdmissionLayer, SlowClients};
/// use admission_http::MinDataRate;
///
/// let default = AdmissionLayer::builder().count(64).build()?;
/// assert_eq!(default.slow_clients(), SlowClients::default());
/// assert_eq!(SlowClients::default().min_body_rate(), Some(MinDataRate::default()));
///
/// let stricter = SlowClients::default()
///     .with_min_body_rate(MinDataRate::new(1_024, Duration::from_secs(2)));
/// let layer = AdmissionLayer::builder().count(64).slow_clients(stricter).build()?;
/// assert_eq!(layer.slow_clients().min_body_rate().unwrap().bytes_per_second(), 1_024);
///
/// let off = AdmissionLayer::builder().count(64).slow_clients(SlowClients::off()).build()?;
/// assert_eq!(off.slow_clients().min_body_rate(), None);
/// # Ok::<(), admission_tower::BuildError>(())
/// ```
///
/// [`AdmissionBuilder::slow_clients`]: crate::AdmissionBuilder::slow_clients
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlowClients {
    body_rate: Option<MinDataRate>,
    response_rate: Option<MinDataRate>,
}

impl Default for SlowClients {
    fn default() -> Self {
        Self {
            body_rate: Some(MinDataRate::default()),
            response_rate: Some(MinDataRate::default()),
        }
    }
}

impl SlowClients {
    /// No bound on slow clients: a request body may take as long as it likes to come,
    /// and a response as long as it likes to be taken, holding what it was admitted with.
    ///
    /// ```
    /// use admission_tower::SlowClients;
    ///
    /// assert_eq!(SlowClients::off().min_body_rate(), None);
    /// assert_eq!(SlowClients::off().min_response_rate(), None);
    /// ```
    pub const fn off() -> Self {
        Self {
            body_rate: None,
            response_rate: None,
        }
    }

    /// Request bodies held to `rate`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_http::MinDataRate;
    /// use admission_tower::SlowClients;
    ///
    /// let rate = MinDataRate::new(500, Duration::from_secs(10));
    /// assert_eq!(SlowClients::off().with_min_body_rate(rate).min_body_rate(), Some(rate));
    /// ```
    pub const fn with_min_body_rate(mut self, rate: MinDataRate) -> Self {
        self.body_rate = Some(rate);
        self
    }

    /// Request bodies not timed.
    ///
    /// ```
    /// use admission_tower::SlowClients;
    ///
    /// assert_eq!(SlowClients::default().without_min_body_rate().min_body_rate(), None);
    /// ```
    pub const fn without_min_body_rate(mut self) -> Self {
        self.body_rate = None;
        self
    }

    /// The minimum request-body rate, if bodies are timed.
    ///
    /// ```
    /// use admission_tower::SlowClients;
    ///
    /// assert_eq!(SlowClients::default().min_body_rate().unwrap().bytes_per_second(), 240);
    /// ```
    pub const fn min_body_rate(&self) -> Option<MinDataRate> {
        self.body_rate
    }

    /// Responses held to `rate`: one not taken at it gives its permits back.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_http::MinDataRate;
    /// use admission_tower::SlowClients;
    ///
    /// let rate = MinDataRate::new(1_024, Duration::from_secs(10));
    /// let slow = SlowClients::default().with_min_response_rate(rate);
    /// assert_eq!(slow.min_response_rate(), Some(rate));
    /// ```
    pub const fn with_min_response_rate(mut self, rate: MinDataRate) -> Self {
        self.response_rate = Some(rate);
        self
    }

    /// Responses not timed: one may wait on its client for as long as the client likes,
    /// holding its permits (under `serve`, its h2 stream is still timed, by
    /// `ConnectionLimits::min_send_rate`).
    ///
    /// ```
    /// use admission_tower::SlowClients;
    ///
    /// let slow = SlowClients::default().without_min_response_rate();
    /// assert_eq!(slow.min_response_rate(), None);
    /// assert!(slow.min_body_rate().is_some(), "request bodies are still timed");
    /// ```
    pub const fn without_min_response_rate(mut self) -> Self {
        self.response_rate = None;
        self
    }

    /// The minimum rate at which a response must be taken, if responses are timed.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_tower::SlowClients;
    ///
    /// let rate = SlowClients::default().min_response_rate().unwrap();
    /// assert_eq!((rate.bytes_per_second(), rate.grace()), (240, Duration::from_secs(5)));
    /// ```
    pub const fn min_response_rate(&self) -> Option<MinDataRate> {
        self.response_rate
    }

    /// The rate this request's body is held to: none for a gRPC request.
    pub(crate) fn body_rate_for(&self, parts: &Parts) -> Option<MinDataRate> {
        let rate = self.body_rate?;
        let grpc = parts
            .headers
            .get(CONTENT_TYPE)
            .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"));
        (!grpc).then_some(rate)
    }
}
