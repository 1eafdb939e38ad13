//! `Wait`: the optional, bounded wait for a count slot.

use std::time::Duration;

use http::header::HeaderName;
use http::request::Parts;

/// Lets a request that finds the count full wait for a slot, bounded, instead of being
/// refused at once (off by default: see [`AdmissionBuilder::wait`](crate::AdmissionBuilder::wait)).
///
/// At most `max_waiting` requests wait at once (beyond that, refused at once as without
/// a wait), each for at most `max_wait`, and never past its client's own deadline less
/// the time it would then take to answer: the deadline a gRPC client sends
/// (`grpc-timeout`), or for HTTP the header named by
/// [`deadline_header`](Self::deadline_header) (milliseconds); the time to answer is the
/// adaptive limit's estimate where one drives the count
/// ([`AdaptiveLimit::latency`](admission_core::AdaptiveLimit::latency)), else
/// [`service_time`](Self::service_time). A request that could not be answered in time is
/// refused at once rather than made to wait: HTTP 503 with `Retry-After`, gRPC
/// `RESOURCE_EXHAUSTED`, as any count refusal (the server is busy, not broken: the
/// client's retry policy retries it, where a `DEADLINE_EXCEEDED` would not be retried).
///
/// Waiters are served as slots free: the most important class first, within it the oldest.
/// **Under sustained overload the wait sheds at once**, after Meta's adaptive LIFO with
/// CoDel: once the queue has been waited in for an interval without emptying (it
/// *stands*; 100 ms by default), each class is served newest first, and a waiter that has
/// waited a short target (5 ms by default) is refused as soon as a newer request of its
/// class (or a more important one) comes to wait, since that one would be served first
/// ([`standing_queue`](Self::standing_queue)). Under sustained overload newer requests
/// keep coming, so no one waits much past the target, admitted or refused (the `bursts`
/// example measures it on a real server at 5x its capacity); after a burst no newer
/// request comes, and its waiters keep their places
/// for as long as `max_wait` lets them. Per-key refusals (429) and requests too large
/// (413) never wait. A drain or close refuses every waiter at once.
///
/// # A client that goes away
///
/// A waiting request whose client hangs up or resets leaves the queue at once, never
/// reaches the handler, and holds nothing (counted in
/// [`AdmissionSnapshot::gone`](crate::AdmissionSnapshot::gone)). The server sees the
/// hang-up itself where nothing is left to read of the request (no body, or all of it
/// read); for a body still to come, the layer reads it ahead while the request waits, up
/// to 64 KiB (and at most one read of the server's buffer beyond), so that the hang-up is
/// seen there too. The handler is given the body whole, every frame in order, as if
/// nothing had been read ahead; what was read ahead is charged to the byte budget as the
/// handler reads it. Not seen while waiting: a client that hangs up after sending more
/// than 64 KiB of its body, and one that sent `Expect: 100-continue` (reading its body
/// would ask it to send it). Such a request waits out its wait (at most `max_wait`, less
/// once the queue stands and newer requests come), and is then refused, or admitted and
/// let go as soon as its body is read and fails (see [`SlowClients`](crate::SlowClients)).
///
/// # What waiting holds
///
/// At most `max_waiting` requests, each holding: its head and what the connection has
/// read of its body, which the server's connection settings bound (with hyper's
/// defaults: on HTTP/1.1 the connection's read buffer, `max_buf_size`, about 400 KiB for
/// the head and any body bytes read with it; on HTTP/2 the header list limit, 16 KiB,
/// and the stream's flow-control window for body bytes the client sends ahead); what
/// the layer read ahead of its body, at most 64 KiB and one read of that buffer; its
/// key's permit, so it counts against its client's cap and one client cannot fill the
/// queue; an entry in the count's queue; and its response future (the ready inner
/// service and the request). Nothing of the byte budget: the body is charged once the
/// request is admitted (what was read ahead, as the handler reads it), and the slow-body
/// clock starts then too. A refused request holds nothing.
///
/// ```
/// use std::time::Duration;
/// use admission_tower::{AdmissionLayer, Wait};
/// use http::HeaderName;
///
/// let deadline = HeaderName::from_static("x-timeout-ms");
/// let layer = AdmissionLayer::builder()
///     .count(64)
///     .wait(Wait::new(256, Duration::from_millis(100)).deadline_header(deadline))
///     .build()?;
/// # Ok::<(), admission_tower::BuildError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    pub(crate) max_waiting: usize,
    pub(crate) max_wait: Duration,
    pub(crate) deadline_header: Option<HeaderName>,
    pub(crate) service_time: Duration,
    /// The standing-queue rule: after how long without emptying the queue stands, and
    /// how long a waiter may wait then.
    pub(crate) interval: Duration,
    pub(crate) target: Duration,
}

/// How much of a waiting request's body the layer reads ahead to see its client go.
pub(crate) const READ_AHEAD: u64 = 64 << 10;

impl Wait {
    /// At most `max_waiting` requests wait at once, each for at most `max_wait`.
    pub fn new(max_waiting: usize, max_wait: Duration) -> Self {
        Self {
            max_waiting,
            max_wait,
            deadline_header: None,
            service_time: Duration::ZERO,
            interval: Duration::from_millis(100),
            target: Duration::from_millis(5),
        }
    }

    /// The standing-queue rule (default 100 ms and 5 ms, Meta's CoDel settings): once
    /// the queue has been waited in for `interval` without emptying, it stands, and a
    /// request that has waited `target` gives its place to the next newer one (never
    /// waiting more than `max_wait`). A longer interval lets longer bursts be served
    /// first come, first served; a shorter target sheds sooner under sustained overload.
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_tower::{AdmissionLayer, Wait};
    ///
    /// let wait = Wait::new(64, Duration::from_millis(100))
    ///     .standing_queue(Duration::from_millis(200), Duration::from_millis(10));
    /// let layer = AdmissionLayer::builder().count(32).wait(wait).build()?;
    /// let rule = layer.gate().count().standing_queue();
    /// assert_eq!(rule, (Duration::from_millis(200), Duration::from_millis(10)));
    /// # Ok::<(), admission_tower::BuildError>(())
    /// ```
    pub fn standing_queue(mut self, interval: Duration, target: Duration) -> Self {
        self.interval = interval;
        self.target = target;
        self
    }

    /// An HTTP header whose value is the client's remaining time in milliseconds (say
    /// `x-timeout-ms`): a request waits no longer than that less the time to answer it.
    /// gRPC's `grpc-timeout` is always read.
    ///
    /// The name is an [`http::HeaderName`], as [`key::header`](crate::key::header)'s is.
    pub fn deadline_header(mut self, name: HeaderName) -> Self {
        self.deadline_header = Some(name);
        self
    }

    /// The time to answer a request once admitted, for the deadline check, where no
    /// adaptive limit estimates it (default 0).
    pub fn service_time(mut self, time: Duration) -> Self {
        self.service_time = time;
        self
    }

    /// How long a request may wait: `max_wait`, or less for a client with a deadline;
    /// `None` if it could not be answered before its deadline even at once.
    pub(crate) fn budget(&self, parts: &Parts, estimate: Option<Duration>) -> Option<Duration> {
        let answer = estimate.unwrap_or(self.service_time);
        let deadline = grpc_timeout(parts).or_else(|| {
            let name = self.deadline_header.as_ref()?;
            let value = parts.headers.get(name)?.to_str().ok()?;
            value.trim().parse::<u64>().ok().map(Duration::from_millis)
        });
        match deadline {
            Some(deadline) => {
                let left = deadline.checked_sub(answer)?;
                Some(left.min(self.max_wait))
            }
            None => Some(self.max_wait),
        }
    }
}

/// The deadline a gRPC client sent: `grpc-timeout`, up to eight digits and a unit.
fn grpc_timeout(parts: &Parts) -> Option<Duration> {
    let value = parts.headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.checked_mul(3600)?),
        "M" => Duration::from_secs(amount.checked_mul(60)?),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut request = http::Request::builder();
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn the_budget_is_max_wait_or_the_clients_deadline_less_the_answer() {
        let wait = Wait::new(8, Duration::from_millis(100))
            .deadline_header(http::HeaderName::from_static("x-timeout-ms"))
            .service_time(Duration::from_millis(20));
        let ms = Duration::from_millis;
        assert_eq!(wait.budget(&parts(&[]), None), Some(ms(100)));
        assert_eq!(
            wait.budget(&parts(&[("x-timeout-ms", "70")]), None),
            Some(ms(50))
        );
        assert_eq!(
            wait.budget(&parts(&[("x-timeout-ms", "500")]), None),
            Some(ms(100))
        );
        assert_eq!(
            wait.budget(&parts(&[("x-timeout-ms", "10")]), None),
            None,
            "too late"
        );
        assert_eq!(
            wait.budget(&parts(&[("grpc-timeout", "60m")]), None),
            Some(ms(40))
        );
        assert_eq!(
            wait.budget(&parts(&[("grpc-timeout", "60m")]), Some(ms(5))),
            Some(ms(55)),
            "the adaptive limit's estimate, where there is one"
        );
        assert_eq!(
            wait.budget(&parts(&[("x-timeout-ms", "soon")]), None),
            Some(ms(100))
        );
    }

    #[test]
    fn grpc_timeouts_are_read_in_every_unit() {
        let read = |value| grpc_timeout(&parts(&[("grpc-timeout", value)]));
        assert_eq!(read("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(read("2M"), Some(Duration::from_secs(120)));
        assert_eq!(read("3S"), Some(Duration::from_secs(3)));
        assert_eq!(read("4m"), Some(Duration::from_millis(4)));
        assert_eq!(read("5u"), Some(Duration::from_micros(5)));
        assert_eq!(read("6n"), Some(Duration::from_nanos(6)));
        assert_eq!(read("123456789m"), None, "nine digits");
        assert_eq!(read("m"), None);
        assert_eq!(read("5x"), None);
        assert_eq!(read(""), None);
    }
}
