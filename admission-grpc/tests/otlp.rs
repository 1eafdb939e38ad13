//! The OpenTelemetry OTLP span exporter, its retry policy on, against a real OTLP trace
//! collector service behind the gRPC admission layer: refusals at the head (count) and
//! while the request streams in (byte budget) are retried by the exporter itself, and
//! every span arrives exactly once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use admission_tower::AdmissionLayer;
use opentelemetry::InstrumentationScope;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry_otlp::{RetryPolicy, WithExportConfig, WithTonicConfig};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};
use tonic::transport::Server;

/// A collector that counts the spans it receives, by name.
#[derive(Default, Clone)]
struct Collector {
    received: Arc<Mutex<HashMap<String, usize>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = self.received.lock().unwrap();
        for resource in &request.get_ref().resource_spans {
            for scope in &resource.scope_spans {
                for span in &scope.spans {
                    *received.entry(span.name.clone()).or_default() += 1;
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn span(name: String, id: u64) -> SpanData {
    SpanData {
        span_context: SpanContext::new(
            TraceId::from(u128::from(id) + 1),
            SpanId::from(id + 1),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id: SpanId::INVALID,
        parent_span_is_remote: false,
        span_kind: SpanKind::Internal,
        name: name.into(),
        start_time: SystemTime::now(),
        end_time: SystemTime::now(),
        attributes: Vec::new(),
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: Status::Unset,
        instrumentation_scope: InstrumentationScope::builder("admission-test").build(),
    }
}

/// A batch of `n` spans named `{prefix}-{i}`, each name padded to about 100 bytes.
fn batch(prefix: &str, n: u64) -> (Vec<SpanData>, Vec<String>) {
    let names: Vec<String> = (0..n)
        .map(|i| format!("{prefix}-{i:03}-{}", "x".repeat(90)))
        .collect();
    let spans = names
        .iter()
        .zip(0..)
        .map(|(name, i)| span(name.clone(), i))
        .collect();
    (spans, names)
}

/// Exports `batch` while `held` (what other requests hold) stays held for 300 ms: the
/// export is refused until then, and must succeed by the exporter's own retries.
async fn export_while_held<T: Send + 'static>(
    exporter: &opentelemetry_otlp::SpanExporter,
    held: T,
    (spans, names): (Vec<SpanData>, Vec<String>),
    expected: &mut Vec<String>,
) {
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(held);
    });
    expected.extend(names);
    exporter
        .export(spans)
        .await
        .expect("exported after retrying");
    release.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_otlp_exporter_retries_head_and_mid_stream_refusals_and_every_span_arrives_once() {
    let refusals: Arc<Mutex<HashMap<&'static str, usize>>> = Arc::default();
    let seen = refusals.clone();
    let layer = AdmissionLayer::builder()
        .count(1)
        .bytes(16 << 10)
        .max_request_bytes(8 << 10)
        .refusals(admission_grpc::refusals().retry_after(Duration::from_millis(100)))
        .on_refusal(move |event| {
            if let admission_http::Refusal::Refused(refused) = event.refusal {
                *seen.lock().unwrap().entry(refused.dimension()).or_default() += 1;
            }
        })
        .build()
        .unwrap();
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .layer(layer.clone())
            .add_service(TraceServiceServer::new(collector.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );

    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(format!("http://{addr}"))
        .with_timeout(Duration::from_secs(10))
        .with_retry_policy(RetryPolicy::recommended().with_max_retries(8))
        .build()
        .unwrap();
    let mut expected = Vec::new();

    // Saturated by count: another request holds the one slot for 300 ms. The export is
    // refused at the head, and retried until the slot is free.
    let held = layer.gate().count().try_acquire().unwrap();
    export_while_held(&exporter, held, batch("count", 20), &mut expected).await;

    // Saturated by bytes: other requests hold 14 KiB of the 16 KiB budget for 300 ms.
    // The exporter sends no content-length, so its ~3 KiB batch is refused as it
    // arrives, and retried until the budget has room.
    let bytes = layer.gate().bytes().unwrap().clone();
    let held = [
        bytes.try_charge(7 << 10).unwrap(),
        bytes.try_charge(7 << 10).unwrap(),
    ];
    export_while_held(&exporter, held, batch("bytes", 20), &mut expected).await;

    // Idle again: a batch goes through at once.
    let (spans, names) = batch("idle", 20);
    expected.extend(names);
    exporter.export(spans).await.unwrap();

    let received = collector.received.lock().unwrap().clone();
    assert_eq!(received.len(), expected.len(), "every span arrived");
    for name in &expected {
        assert_eq!(received.get(name), Some(&1), "{name} arrived exactly once");
    }
    let refusals = refusals.lock().unwrap().clone();
    assert!(
        refusals.get("count").is_some_and(|&n| n >= 1),
        "{refusals:?}"
    );
    assert!(
        refusals.get("bytes").is_some_and(|&n| n >= 1),
        "{refusals:?}"
    );
    assert_eq!(refusals.get("too_large"), None, "{refusals:?}");
    // The last response's permits go when its body ends on the server, just after the
    // client has read it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while layer.gate().count().in_flight() + bytes.in_flight() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "ledgers back to zero"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
