//! A body held to a minimum data rate: cut when it stalls, timed only while its reader
//! waits, and holding of the byte budget only what its pace earns. tokio's paused clock.
#![cfg(feature = "tokio")]

use std::time::Duration;

use admission_core::{ByteLedger, Refused};
use admission_http::{BodyRefused, MeteredBody, MinDataRate, Refusals, RequestCharge};
use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use tokio::sync::mpsc;
use tokio::time::{advance, sleep};
use tokio_stream::wrappers::ReceiverStream;

type Item = Result<Frame<Bytes>, std::io::Error>;
type Frames = ReceiverStream<Item>;

const RATE: MinDataRate = MinDataRate::new(240, Duration::from_secs(5));
const DECLARED: u64 = 64 << 10;

/// A body the test feeds, with its charge from a 1 MiB ledger (the grace period's worth,
/// as the layer charges it), paced at 240 B/s after 5 s.
fn paced() -> (
    mpsc::Sender<Item>,
    MeteredBody<StreamBody<Frames>>,
    RequestCharge,
    ByteLedger,
) {
    let ledger = ByteLedger::new(1 << 20).unwrap();
    let (tx, rx) = mpsc::channel(64);
    let charge = RequestCharge::new(ledger.try_charge(RATE.grace_bytes()).unwrap());
    let body = MeteredBody::new(StreamBody::new(ReceiverStream::new(rx)), charge.clone())
        .paced(RATE, Some(DECLARED));
    (tx, body, charge, ledger)
}

fn chunk(n: usize) -> Item {
    Ok(Frame::data(Bytes::from(vec![b'x'; n])))
}

/// The length of the body's next data frame.
async fn next_len(body: &mut MeteredBody<StreamBody<Frames>>) -> usize {
    body.frame()
        .await
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap()
        .len()
}

fn too_slow(result: Option<Result<Frame<Bytes>, admission_http::BoxError>>) -> bool {
    matches!(result, Some(Err(err))
        if err.downcast_ref::<BodyRefused>().map(BodyRefused::refused) == Some(Refused::TooSlow))
}

#[tokio::test(start_paused = true)]
async fn a_body_that_sends_nothing_is_cut_once_the_grace_period_is_waited_out() {
    let (_tx, mut body, charge, _ledger) = paced();
    let start = tokio::time::Instant::now();
    assert!(too_slow(body.frame().await));
    let waited = start.elapsed();
    assert!(
        waited > Duration::from_secs(5) && waited < Duration::from_millis(5_100),
        "cut at the end of the grace period, not before or long after: {waited:?}"
    );
    assert_eq!(charge.refused(), Some(Refused::TooSlow));
    assert!(body.frame().await.is_none(), "the body ends after the cut");
}

#[tokio::test(start_paused = true)]
async fn a_body_at_the_minimum_rate_is_never_cut() {
    let (tx, mut body, charge, _ledger) = paced();
    tokio::spawn(async move {
        // 121 bytes, then every 500 ms: at every moment ahead of 240 B/s.
        for _ in 0..60 {
            if tx.send(chunk(121)).await.is_err() {
                return;
            }
            sleep(Duration::from_millis(500)).await;
        }
    });
    let mut received = 0;
    while let Some(frame) = body.frame().await {
        received += frame.unwrap().into_data().unwrap().len();
    }
    assert_eq!(received, 60 * 121, "30 s at 242 B/s, none of it cut");
    assert_eq!(charge.refused(), None);
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_does_not_poll_is_not_a_slow_client() {
    let (tx, mut body, charge, _ledger) = paced();
    tx.send(chunk(10)).await.unwrap();
    assert_eq!(next_len(&mut body).await, 10);
    // The handler is busy for a minute before it reads on: the data waits for it.
    advance(Duration::from_secs(60)).await;
    tx.send(chunk(10)).await.unwrap();
    assert_eq!(next_len(&mut body).await, 10);
    assert_eq!(charge.refused(), None);
    // Now it waits, and the body stalls: cut 5 s later.
    let start = tokio::time::Instant::now();
    assert!(too_slow(body.frame().await));
    assert!(start.elapsed() < Duration::from_millis(5_100));
}

#[tokio::test(start_paused = true)]
async fn a_fast_body_reserves_its_declared_length_at_its_first_frame() {
    let (tx, mut body, charge, ledger) = paced();
    assert_eq!(
        ledger.in_flight(),
        1_200,
        "the grace period's worth at the minimum rate"
    );
    tx.send(chunk(16 << 10)).await.unwrap();
    body.frame().await.unwrap().unwrap();
    assert_eq!(
        charge.charged(),
        DECLARED,
        "16 KiB within a second earns all of it"
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_body_holds_what_it_sent_plus_the_grace_period_at_its_own_rate() {
    let (tx, mut body, charge, ledger) = paced();
    // 2 KiB/s: 512 bytes every 250 ms, for 10 s.
    tokio::spawn(async move {
        for _ in 0..40 {
            sleep(Duration::from_millis(250)).await;
            tx.send(chunk(512)).await.unwrap();
        }
        std::future::pending::<()>().await; // then stalls, without ending
    });
    let mut received = 0_u64;
    for _ in 0..40 {
        received += next_len(&mut body).await as u64;
        // What it sent plus 5 s at 2 KiB/s (measured over at least a second).
        let bound = received + 5 * 2_048 + 512;
        assert!(
            charge.charged() <= bound,
            "{} held after {received} sent (bound {bound})",
            charge.charged()
        );
        assert!(charge.charged() >= received);
    }
    assert_eq!(received, 20 << 10);
    // Stalled: the reservation is given back as the rate decays, before the cut, never
    // below what was sent.
    let read = tokio::spawn(async move { too_slow(body.frame().await) });
    sleep(Duration::from_secs(30)).await;
    let held = ledger.in_flight();
    assert!(
        held <= received + 5 * 20_480 / 40 + 512,
        "{held} held after 30 s of nothing"
    );
    assert!(
        held >= received + 5 * 240,
        "{held}: what was sent, and the minimum ahead"
    );
    assert!(
        read.await.unwrap(),
        "and cut once its 20 KiB no longer earn the wait"
    );
}

#[tokio::test(start_paused = true)]
async fn a_body_timed_without_a_budget_records_its_cut_for_whoever_answers() {
    let (_tx, rx) = mpsc::channel::<Item>(1);
    let charge = RequestCharge::unmetered(&Refusals::new());
    let mut body = MeteredBody::new(StreamBody::new(ReceiverStream::new(rx)), charge.clone())
        .paced(RATE, None);
    assert!(too_slow(body.frame().await));
    assert_eq!(
        (charge.refused(), charge.charged()),
        (Some(Refused::TooSlow), 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_small_first_frame_earns_the_grace_period_at_its_own_rate() {
    let (tx, mut body, charge, _ledger) = paced();
    // 300 bytes at once: 300 B/s over the shortest measure (a second), 1,500 ahead.
    tx.send(chunk(300)).await.unwrap();
    assert_eq!(next_len(&mut body).await, 300);
    assert_eq!(charge.charged(), 300 + 1_500);
}
