//! Traces: a server process started with `--otlp-endpoint` sends each
//! call's span to an OTLP receiver run by the test, under the caller's trace
//! when the call carries a `traceparent`, and never with a raw key in it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency_coordinator::telemetry::key_hash;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio_stream::wrappers::TcpListenerStream;

use idempotency_coordinator::proto;

use crate::helpers::*;

/// The caller's trace and span, as its `traceparent` names them.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN_ID: &str = "00f067aa0ba902b7";
const TRACESTATE: &str = "vendor=opaque-value";

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{PARENT_SPAN_ID}-01")
}

/// An OTLP/gRPC trace receiver on a free port: keeps every span exported
/// to it, and the service name each came under.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut kept = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| string(kv.value.as_ref()?.value.as_ref()?))
                .unwrap_or_default();
            for scope_spans in resource_spans.scope_spans {
                kept.extend(scope_spans.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

fn string(value: &Value) -> Option<String> {
    match value {
        Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

impl Receiver {
    async fn start() -> (Self, SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let receiver = Receiver::default();
        let service = TraceServiceServer::new(receiver.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        (receiver, addr)
    }

    /// The call spans received so far whose `method` is `method`.
    fn calls(&self, method: &str) -> Vec<(String, Span)> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, span)| attribute(span, "method").as_deref() == Some(method))
            .cloned()
            .collect()
    }

    /// Everything received, as text, to look for what must not be there.
    fn everything(&self) -> String {
        format!("{:?}", self.spans.lock().unwrap())
    }
}

/// A span's attribute, as text.
fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span.attributes.iter().find(|kv| kv.key == key)?;
    match value.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        Value::DoubleValue(d) => Some(d.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

fn with_trace_context<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("traceparent", traceparent().parse().unwrap());
    request
        .metadata_mut()
        .insert("tracestate", TRACESTATE.parse().unwrap());
    request
}

#[tokio::test]
async fn an_acquire_with_a_traceparent_continues_the_callers_trace() {
    let db = TestDatabase::create().await;
    let (receiver, collector) = Receiver::start().await;
    let endpoint = format!("http://{collector}");
    let server = ServerProcess::launch(
        &db.url,
        &["--otlp-endpoint", &endpoint],
        Launch {
            // Batches leave every 100 ms rather than every 5 s; debug lines
            // show what is logged inside a call.
            env: &[
                ("OTEL_BSP_SCHEDULE_DELAY", "100"),
                ("RUST_LOG", "info,idempotency_coordinator=debug"),
            ],
            ..Launch::default()
        },
    )
    .await;
    let mut client = server.client().await;
    let key = "raw-key-5d41402abc4b2a76";
    let answer = client
        .acquire(with_trace_context(acquire("traced", key)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&answer), proto::Decision::Proceed);

    let (service, span) = eventually("the Acquire's span", Duration::from_secs(30), || async {
        receiver.calls("Acquire").into_iter().next()
    })
    .await;
    assert_eq!(service, "idempotency-coordinator");
    assert_eq!(span.name, "idempotency.v1.Coordinator/Acquire");
    assert_eq!(hex::encode(&span.trace_id), TRACE_ID, "the caller's trace");
    assert_eq!(
        hex::encode(&span.parent_span_id),
        PARENT_SPAN_ID,
        "the caller's span is the parent"
    );
    assert_eq!(span.trace_state, TRACESTATE);
    assert_eq!(span.kind, 2, "SPAN_KIND_SERVER");
    assert!(span.end_time_unix_nano > span.start_time_unix_nano);
    assert_eq!(attribute(&span, "tenant").as_deref(), Some("default"));
    assert_eq!(attribute(&span, "scope").as_deref(), Some("traced"));
    assert_eq!(
        attribute(&span, "decision").as_deref(),
        Some("DECISION_PROCEED")
    );
    assert_eq!(
        attribute(&span, "key_hash"),
        Some(key_hash("default", "traced", key))
    );
    assert_eq!(attribute(&span, "trace_id").as_deref(), Some(TRACE_ID));
    assert_eq!(attribute(&span, "error"), None);
    // The only call: its statement carried it alone.
    assert_eq!(attribute(&span, "batch_size").as_deref(), Some("1"));
    // Neither the key nor the lease token leaves the server in a span.
    let token = token(&answer);
    let exported = receiver.everything();
    assert!(!exported.contains(key), "the raw key was exported");
    assert!(!exported.contains(&token), "the lease token was exported");

    // What is logged inside the call carries its trace id, and no key.
    let logs = server.logs();
    let in_call: Vec<serde_json::Value> = logs
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|entry| entry["span"]["name"] == "call")
        .collect();
    let acquire_line = in_call
        .iter()
        .find(|entry| entry["fields"]["message"] == "acquire")
        .unwrap_or_else(|| panic!("no acquire line inside the call's span: {logs:#?}"));
    assert_eq!(acquire_line["span"]["trace_id"], TRACE_ID);
    assert_eq!(acquire_line["span"]["method"], "Acquire");
    assert!(
        logs.iter().all(|line| !line.contains(key)),
        "the raw key was logged"
    );
}

#[tokio::test]
async fn an_error_s_reason_is_on_its_span_and_spans_are_sent_before_the_server_exits() {
    let db = TestDatabase::create().await;
    let (receiver, collector) = Receiver::start().await;
    let endpoint = format!("http://{collector}");
    // The default batch delay (5 s): what the receiver has by the time the
    // process has exited was sent by the flush at shutdown.
    let server = ServerProcess::start_with(&db.url, &["--otlp-endpoint", &endpoint]).await;
    let mut client = server.client().await;
    let missing = client
        .get(get_req("traced", "never-acquired"))
        .await
        .expect_err("no such record");
    assert_eq!(reason(&missing), "RECORD_NOT_FOUND");
    // Without a traceparent, the call is a trace of its own.
    let answer = client
        .acquire(acquire("traced", "fresh"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&answer), proto::Decision::Proceed);

    assert!(server.terminate().await.success());
    let get = receiver.calls("Get");
    assert_eq!(get.len(), 1, "the Get's span, sent at shutdown");
    let (_, get) = &get[0];
    assert_eq!(attribute(get, "error").as_deref(), Some("RECORD_NOT_FOUND"));
    assert_eq!(attribute(get, "scope").as_deref(), Some("traced"));
    let acquires = receiver.calls("Acquire");
    assert_eq!(acquires.len(), 1);
    let (_, acquire) = &acquires[0];
    assert!(acquire.parent_span_id.is_empty(), "a root span");
    assert_ne!(hex::encode(&acquire.trace_id), TRACE_ID);
    assert_ne!(acquire.trace_id, get.trace_id, "one trace per call");
}

#[tokio::test]
async fn without_an_exporter_only_traced_calls_log_in_a_span_carrying_the_trace_id() {
    let db = TestDatabase::create().await;
    // The service's debug lines on, the call spans at their default level.
    let server = ServerProcess::launch(
        &db.url,
        &[],
        Launch {
            env: &[("RUST_LOG", "info,idempotency_coordinator::service=debug")],
            ..Launch::default()
        },
    )
    .await;
    let mut client = server.client().await;
    client
        .acquire(with_trace_context(acquire("logged", "traced")))
        .await
        .unwrap();
    client.acquire(acquire("logged", "untraced")).await.unwrap();

    let acquire_lines = || {
        server
            .logs()
            .iter()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|entry| entry["fields"]["message"] == "acquire")
            .collect::<Vec<_>>()
    };
    let lines = eventually("both acquire lines", Duration::from_secs(10), || {
        let lines = acquire_lines();
        async move { (lines.len() == 2).then_some(lines) }
    })
    .await;
    // The traced call's line is inside its span, with the caller's trace id.
    assert_eq!(lines[0]["span"]["name"], "call", "{lines:#?}");
    assert_eq!(lines[0]["span"]["trace_id"], TRACE_ID);
    assert_eq!(lines[0]["span"]["tenant"], "default");
    assert_eq!(
        lines[0]["span"]["key_hash"],
        key_hash("default", "logged", "traced")
    );
    // Nobody traces the other: no span for it at the default level.
    assert_ne!(lines[1]["span"]["name"], "call", "{lines:#?}");
}
