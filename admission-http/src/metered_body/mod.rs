//! The metered request body: grown against its charge as it arrives, paced, replayed.

use std::mem::ManuallyDrop;
use std::pin::Pin;

use http_body::Body;
use pin_project_lite::pin_project;

use crate::ahead::{ReadFrames, Replay};
use crate::pace::Pace;
use crate::{MinDataRate, RequestCharge};

mod poll;

pin_project! {
    /// A request body that grows its request's byte charge as data frames arrive beyond
    /// what was charged, and fails with [`BodyRefused`](crate::BodyRefused) when the ledger refuses.
    ///
    /// Frames pass through unchanged. After a refusal the body ends (`Ready(None)`).
    /// The charge is shared with [`RequestCharge`]; dropping the body releases nothing
    /// while another clone of the charge (the response's) is alive.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    /// use admission_http::{BodyRefused, MeteredBody, RequestCharge};
    /// use http_body_util::BodyExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ledger = ByteLedger::new(4)?;
    /// let _other = ledger.try_charge(1)?;
    /// let charge = RequestCharge::new(ledger.try_charge(0)?);
    /// let body = MeteredBody::new(http_body_util::Full::new(bytes::Bytes::from("hello")), charge);
    /// let err = body.collect().await.unwrap_err();
    /// assert!(err.downcast_ref::<BodyRefused>().is_some());
    /// assert_eq!(ledger.in_flight(), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub struct MeteredBody<B> {
        // `None` only once taken (`into_inner`, or handed to the charge on drop).
        #[pin]
        inner: Option<B>,
        // `None` unmetered and not replayed. One pointer: every request's body is moved
        // several times on its way to the handler, and an unmetered one should cost next
        // to nothing. Never dropped in place: `PinnedDrop` takes it out when there is one,
        // so that an unmetered body's drop is one test, inlined where it is dropped.
        meter: ManuallyDrop<Option<Pin<Box<Meter<B>>>>>,
    }

    impl<B> PinnedDrop for MeteredBody<B> {
        #[inline]
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if this.meter.is_some() {
                release(this.inner, this.meter);
            }
        }
    }
}

/// A metered (or replayed) body's drop: what the reader left of it handed to its charge
/// (if it was to be kept), then its meter released. Out of line: most bodies have none.
#[inline(never)]
fn release<B>(inner: Pin<&mut Option<B>>, meter: &mut ManuallyDrop<Option<Pin<Box<Meter<B>>>>>) {
    // Taken out, `None` is left, which has nothing to drop.
    let Some(mut meter) = meter.take() else {
        return;
    };
    let meter = meter.as_mut().project();
    // A body read ahead to its end has nothing left to read.
    let ended = meter.replay.as_ref().is_some_and(|replay| replay.ended());
    if let (Some(keep), Some(charge), false) = (meter.keep.take(), meter.charge, ended) {
        keep(inner, charge);
    }
}

pin_project! {
    /// What a metered (or replayed) body carries beside its inner body.
    struct Meter<B> {
        // The charge this body grows, with its counters; `None` for a body that is only
        // replayed, not metered.
        charge: Option<RequestCharge>,
        // Frames read ahead of the reader (`replay`), given first.
        replay: Option<Box<dyn Replay<B>>>,
        // Its timing, for a body held to a minimum data rate.
        #[pin]
        pace: Option<Pace>,
        // Hands an unfinished body to its charge when dropped (`keep_unread`).
        keep: Option<fn(Pin<&mut Option<B>>, &RequestCharge)>,
    }
}

const TAKEN: &str = "a MeteredBody's inner body is there until it is taken, by value";

impl<B> MeteredBody<B> {
    /// Meters `inner` against `charge`, which covers what was charged up front.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    /// use admission_http::{MeteredBody, RequestCharge};
    ///
    /// let charge = RequestCharge::new(ByteLedger::new(10)?.try_charge(4)?);
    /// let body = MeteredBody::new("body", charge);
    /// assert_eq!(body.charge().unwrap().charged(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(inner: B, charge: RequestCharge) -> Self {
        // What the charge covers (its permit's charge, kept in step by every growth and
        // shrink) is what the body may carry before growing it.
        Self {
            inner: Some(inner),
            meter: ManuallyDrop::new(Some(Box::pin(Meter {
                charge: Some(charge),
                replay: None,
                pace: None,
                keep: None,
            }))),
        }
    }

    /// Holds the body to a minimum data rate, counting only the time its reader waits on
    /// it: once it has waited out `rate`'s grace period, a body that has sent less than
    /// the rate times its wait fails with [`BodyRefused`](crate::BodyRefused) ([`Refused::TooSlow`], recorded
    /// in its charge). With a `declared` length, its charge also follows its pace: from
    /// the grace period's worth at the minimum rate, it grows as data arrives to what has
    /// arrived plus the grace period at the body's own rate (up to the declared length),
    /// and gives back, while the body waits, what its rate no longer earns. A growth the
    /// budget cannot take beyond the data itself is skipped, not refused.
    ///
    /// The timer is tokio's (feature `tokio`, inside a tokio runtime). Without it a body
    /// that stalls is cut, and its charge reviewed, only when its next frame comes. An
    /// unmetered body is not timed: to time a body without a byte budget, meter it with
    /// [`RequestCharge::unmetered`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use admission_core::{ByteLedger, Refused};
    /// use admission_http::{MeteredBody, MinDataRate, RequestCharge};
    /// use http_body_util::{BodyExt, StreamBody};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ledger = ByteLedger::new(1 << 20)?;
    /// let rate = MinDataRate::new(100, Duration::from_millis(100));
    /// // A body that declared 64 KiB, then sends one byte after 300 ms.
    /// let (tx, rx) = tokio::sync::mpsc::channel(1);
    /// tokio::spawn(async move {
    ///     tokio::time::sleep(Duration::from_millis(300)).await;
    ///     let _ = tx.send(Ok::<_, std::io::Error>(http_body::Frame::data(bytes::Bytes::from("x")))).await;
    /// });
    /// let slow = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    /// let charge = RequestCharge::new(ledger.try_charge(rate.grace_bytes())?);
    /// let body = MeteredBody::new(slow, charge.clone()).paced(rate, Some(64 << 10));
    /// assert_eq!(ledger.in_flight(), 10, "the grace period's worth, not 64 KiB");
    /// assert!(body.collect().await.is_err());
    /// assert_eq!(charge.refused(), Some(Refused::TooSlow));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`Refused::TooSlow`]: admission_core::Refused::TooSlow
    pub fn paced(mut self, rate: MinDataRate, declared: Option<u64>) -> Self {
        if let Some(meter) = self.meter.as_mut().filter(|meter| meter.charge.is_some()) {
            let pace = Pace::new(rate, declared);
            meter.as_mut().project().pace.set(Some(pace));
        }
        self
    }

    /// When the reader drops this body before its end, hands what is left of it to the
    /// charge, which reads and discards it as [`RequestCharge::poll_unread`] is polled
    /// (by whatever holds the charge until the response ends). A server such as hyper
    /// stops reading a connection whose request body was dropped unfinished, and then
    /// cannot see the client hang up while the response has nothing to send; read on,
    /// it sees the end of the connection, and the holder can release what the request
    /// held. A body that was refused or had ended is not kept, nor an unmetered one
    /// (there is no charge to keep it).
    ///
    /// ```
    /// use std::task::Poll;
    /// use admission_core::ByteLedger;
    /// use admission_http::{MeteredBody, RequestCharge};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ledger = ByteLedger::new(100)?;
    /// let (tx, rx) = tokio::sync::mpsc::channel(1);
    /// let unfinished = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    /// let charge = RequestCharge::new(ledger.try_charge(10)?);
    /// drop(MeteredBody::new(unfinished, charge.clone()).keep_unread()); // the handler drops it
    ///
    /// let unread = std::future::poll_fn(|cx| Poll::Ready(charge.poll_unread(cx)));
    /// assert!(unread.await.is_pending(), "kept, and read on");
    /// tx.send(Err::<http_body::Frame<bytes::Bytes>, _>(std::io::Error::other("reset"))).await?;
    /// let gone = std::future::poll_fn(|cx| charge.poll_unread(cx)).await;
    /// assert!(!gone, "the client went away: its body failed");
    /// # Ok(())
    /// # }
    /// ```
    pub fn keep_unread(mut self) -> Self
    where
        B: Body + Send + Unpin + 'static,
    {
        if let Some(meter) = self.meter.as_mut() {
            *meter.as_mut().project().keep = Some(hand_over::<B>);
        }
        self
    }

    /// Gives the frames `read` ahead of this body ([`ReadAhead`]) first, as if they had
    /// just arrived (metered and timed as they are given), then the rest of the body. The
    /// reader sees the body it would have seen had nothing been read ahead.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    /// use admission_http::{MeteredBody, ReadAhead, RequestCharge};
    /// use http_body_util::BodyExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut ahead = ReadAhead::new(http_body_util::Full::new(bytes::Bytes::from("hello")), 1024);
    /// let _ = ahead.poll_failed(&mut std::task::Context::from_waker(std::task::Waker::noop()));
    /// let (body, read) = ahead.split();
    ///
    /// let ledger = ByteLedger::new(100)?;
    /// let charge = RequestCharge::new(ledger.try_charge(0)?);
    /// let body = MeteredBody::new(body, charge.clone()).replay(read);
    /// assert_eq!(ledger.in_flight(), 0, "charged as it is given, not as it was read");
    /// assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");
    /// assert_eq!(charge.charged(), 5);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`ReadAhead`]: crate::ReadAhead
    pub fn replay(mut self, read: ReadFrames<B>) -> Self
    where
        B: Body + 'static,
        B::Data: Send + Sync,
    {
        let meter = self.meter.get_or_insert_with(|| {
            Box::pin(Meter {
                charge: None,
                replay: None,
                pace: None,
                keep: None,
            })
        });
        *meter.as_mut().project().replay = Some(Box::new(read));
        self
    }

    /// Passes `inner` through uncharged and uncounted, for a server whose requests are
    /// metered only sometimes but whose handlers take one body type. It costs a few
    /// empty words beside the inner body, and a branch per frame.
    ///
    /// ```
    /// use admission_http::MeteredBody;
    ///
    /// let body = MeteredBody::unmetered(http_body_util::Empty::<bytes::Bytes>::new());
    /// assert!(body.charge().is_none());
    /// ```
    #[inline]
    pub fn unmetered(inner: B) -> Self {
        Self {
            inner: Some(inner),
            meter: ManuallyDrop::new(None),
        }
    }

    /// Data bytes read through the body so far, if it is metered (0 if not: an unmetered
    /// body counts nothing).
    ///
    /// ```
    /// use admission_core::ByteLedger;
    /// use admission_http::{MeteredBody, RequestCharge};
    ///
    /// let charge = RequestCharge::new(ByteLedger::new(10)?.try_charge(0)?);
    /// assert_eq!(MeteredBody::new(http_body_util::Empty::<bytes::Bytes>::new(), charge).seen(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn seen(&self) -> u64 {
        self.charge().map_or(0, RequestCharge::seen_bytes)
    }

    /// What was read ahead of this body and is still to be given, if anything was.
    fn replayed(&self) -> Option<&dyn Replay<B>> {
        self.meter
            .as_ref()
            .and_then(|meter| meter.replay.as_deref())
    }

    /// Whether the byte ledger refused this body: it then ends.
    fn failed(&self) -> bool {
        self.charge().is_some_and(|c| c.refused().is_some())
    }

    /// The shared charge, if the body is metered.
    ///
    /// ```
    /// use admission_http::MeteredBody;
    ///
    /// assert!(MeteredBody::unmetered("body").charge().is_none());
    /// ```
    pub fn charge(&self) -> Option<&RequestCharge> {
        self.meter.as_ref().and_then(|meter| meter.charge.as_ref())
    }

    /// The inner body.
    ///
    /// ```
    /// use admission_http::MeteredBody;
    ///
    /// assert_eq!(*MeteredBody::unmetered("body").get_ref(), "body");
    /// ```
    pub fn get_ref(&self) -> &B {
        self.inner.as_ref().expect(TAKEN)
    }

    /// The inner body, mutably.
    ///
    /// ```
    /// use admission_http::MeteredBody;
    ///
    /// let mut body = MeteredBody::unmetered(String::from("a"));
    /// body.get_mut().push('b');
    /// assert_eq!(body.get_ref(), "ab");
    /// ```
    pub fn get_mut(&mut self) -> &mut B {
        self.inner.as_mut().expect(TAKEN)
    }

    /// The inner body; the charge is released unless another clone holds it.
    ///
    /// ```
    /// use admission_core::ByteLedger;
    /// use admission_http::{MeteredBody, RequestCharge};
    ///
    /// let ledger = ByteLedger::new(10)?;
    /// let body = MeteredBody::new("x", RequestCharge::new(ledger.try_charge(1)?));
    /// assert_eq!(body.into_inner(), "x");
    /// assert_eq!(ledger.in_flight(), 0, "no other clone held the charge");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_inner(self) -> B {
        let mut this = self;
        this.inner.take().expect(TAKEN)
    }
}

/// Hands an unfinished, unrefused body to its charge (see `MeteredBody::keep_unread`).
fn hand_over<B: Body + Send + Unpin + 'static>(inner: Pin<&mut Option<B>>, charge: &RequestCharge) {
    let inner = inner.get_mut();
    let unfinished = inner.as_ref().is_some_and(|body| !body.is_end_stream());
    if unfinished && charge.refused().is_none() {
        if let Some(body) = inner.take() {
            charge.keep_unread(Box::pin(body));
        }
    }
}
