//! Logging and traces: `RUST_LOG` filters the log (default `info`), text or
//! JSON lines on standard error, colours only when standard error is a
//! terminal; with `--otlp-endpoint`, every Coordinator call's span is also
//! exported over OTLP/gRPC, in batches, flushed when the server stops.
//!
//! # The call span
//!
//! Every Coordinator call runs inside one `call` span ([`CallSpan`], opened
//! by admission once it knows the caller), so every line logged while it
//! runs names it. It carries `method`, `tenant`, `scope`, `key_hash` (never
//! the key: the first 16 hex digits of the SHA-256 of tenant, scope and key,
//! NUL-separated, see [`key_hash`]), Acquire's `decision`, the `error`
//! reason the caller got (its `ErrorInfo.reason`) and `batch_size` (filled
//! by the store); its start and end are the call's duration. Tokens,
//! payloads and results are never recorded.
//!
//! A `traceparent` (and `tracestate`) header, W3C Trace Context, continues
//! the caller's trace: the exported span's parent is the caller's span, and
//! the span's `trace_id` field, on every log line of the call, is the
//! caller's trace id, exported or not.
//!
//! The span's level is what it costs: `info` when it is exported or the
//! caller sent a `traceparent`; otherwise `debug`, so that with the default
//! `RUST_LOG` a call nobody traces costs no span at all (a span in the log
//! on every call took 5–7% more of the server's CPU, README "Traces and
//! logs"; `RUST_LOG=info,idempotency_coordinator::call=debug` logs them).
//! Without an exporter, nothing of OpenTelemetry runs for a call that has no
//! `traceparent`.
//!
//! The database driver logs every statement's parameters (lease tokens,
//! results, error texts) at debug level, so it stays at `info` unless
//! `RUST_LOG` names it (`tokio_postgres=debug`): a general `debug` never
//! puts a secret in the log.

use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::HeaderMap;
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{TraceContextExt as _, TraceId, TracerProvider as _};
use opentelemetry_http::HeaderExtractor;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use sha2::{Digest as _, Sha256};
use tonic_types::StatusExt as _;
use tracing::field::Empty;
use tracing::{Level, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer};

use crate::domain::{RecordId, Scope};

/// `error: cause: cause ...`, for logs.
pub fn cause_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Targets that log call data at debug level: kept at `info` unless named.
const QUIET_TARGETS: &[&str] = &["tokio_postgres"];

/// The target of the call span: the only span the exporter sees.
pub const CALL_TARGET: &str = "idempotency_coordinator::call";

/// The service name spans are exported under, unless `OTEL_SERVICE_NAME`
/// names another.
pub const SERVICE_NAME: &str = "idempotency-coordinator";

/// How long stopping waits for the last spans to reach the collector.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Set once an exporter is installed: only then does a call without a
/// `traceparent` touch OpenTelemetry.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// The filter for `RUST_LOG`'s value (`None`: unset).
fn filter(rust_log: Option<&str>) -> EnvFilter {
    let spec = rust_log.filter(|s| !s.trim().is_empty()).unwrap_or("info");
    let mut filter = EnvFilter::try_new(spec).unwrap_or_else(|e| {
        eprintln!("RUST_LOG={spec:?} is not a valid filter ({e}); logging at info");
        EnvFilter::new("info")
    });
    for target in QUIET_TARGETS {
        if !spec.contains(target) {
            filter =
                filter.add_directive(format!("{target}=info").parse().expect("a valid directive"));
        }
    }
    filter
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("the OTLP endpoint {endpoint:?} is not usable")]
    Exporter {
        /// The collector's address, as given.
        endpoint: String,
        /// Why the exporter could not be built.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// Where spans go: `--otlp-endpoint`, else `OTEL_EXPORTER_OTLP_ENDPOINT`
/// (an empty value is unset).
pub fn otlp_endpoint(flag: Option<&str>) -> Option<String> {
    flag.map(str::to_owned)
        .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok())
        .filter(|e| !e.trim().is_empty())
}

/// The exporter in force, to flush when the server stops.
#[must_use = "flush it when the process stops"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Sends the spans not yet exported, waiting at most a few seconds for
    /// the collector, and stops the exporter.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        // Blocks until the batch is exported, which the gRPC client does on
        // this runtime: off its worker threads.
        let flushed =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(FLUSH_TIMEOUT))
                .await;
        match flushed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "spans not all exported"),
            Err(e) => tracing::warn!(error = %e, "spans not all exported"),
        }
    }
}

/// The OTLP/gRPC exporter's provider, batching, for `endpoint`.
fn provider(endpoint: &str) -> Result<SdkTracerProvider, TelemetryError> {
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|source| TelemetryError::Exporter {
            endpoint: endpoint.to_owned(),
            source,
        })?;
    // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are read by the
    // resource's own detectors.
    let mut resource = opentelemetry_sdk::Resource::builder().with_attribute(
        opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
    );
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(SERVICE_NAME);
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

/// Lines on standard error, as text or JSON.
fn log_layer<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let log = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => log.boxed(),
        LogFormat::Json => log.json().boxed(),
    }
}

/// Installs logging and, when `otlp_endpoint` is given, the span exporter
/// (which needs the Tokio runtime: call it from within). Logging is set up
/// even when the exporter cannot be, so that the error can be logged.
pub fn init(format: LogFormat, otlp_endpoint: Option<&str>) -> Result<Telemetry, TelemetryError> {
    let (provider, failed) = match otlp_endpoint.map(provider).transpose() {
        Ok(provider) => (provider, None),
        Err(e) => (None, Some(e)),
    };
    let rust_log = std::env::var("RUST_LOG").ok();
    let log_filter = filter(rust_log.as_deref());
    // The exporter sees call spans and what is logged in them at info, whatever
    // RUST_LOG says of the log.
    let export = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer(SERVICE_NAME))
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                if meta.is_span() {
                    meta.target() == CALL_TARGET
                } else {
                    *meta.level() <= Level::INFO
                }
            }))
    });
    EXPORTING.store(export.is_some(), Ordering::Relaxed);
    match export {
        // One filter for everything, checked once per callsite: a filter
        // per layer costs a lookup on every span entered.
        None => tracing_subscriber::registry()
            .with(log_filter)
            .with(log_layer(format))
            .init(),
        Some(export) => tracing_subscriber::registry()
            .with(log_layer(format).with_filter(log_filter))
            .with(export)
            .init(),
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(Telemetry { provider }),
    }
}

/// The first 16 hex digits of the SHA-256 of `tenant`, `scope` and `key`,
/// NUL-separated (no part may hold a NUL): a record's name in spans and
/// logs, never its key. `printf '%s\0%s\0%s' TENANT SCOPE KEY | sha256sum`
/// gives it from a known key.
pub fn key_hash(tenant: &str, scope: &str, key: &str) -> String {
    let digest = Sha256::new()
        .chain_update(tenant)
        .chain_update([0])
        .chain_update(scope)
        .chain_update([0])
        .chain_update(key)
        .finalize();
    hex::encode(&digest[..8])
}

/// Records the record a call is about (scope and hashed key) on the current
/// call span.
pub fn record_id(id: &RecordId) {
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    let hash = key_hash(id.tenant.as_str(), id.scope.as_str(), id.key.as_str());
    // Both at once: the JSON log rewrites a span's fields on each record.
    tracing::record_all!(span, scope = id.scope.as_str(), key_hash = hash.as_str());
}

/// Records the scope of a call that names no record on the current call span.
pub fn record_scope(scope: &Scope) {
    Span::current().record("scope", scope.as_str());
}

/// Records Acquire's decision (its name in the contract) on the current call
/// span.
pub fn record_decision(decision: &'static str) {
    Span::current().record("decision", decision);
}

/// One Coordinator call's span: opened before admission decides, closed
/// when its answer has been sent (when the last clone of the span goes).
pub struct CallSpan {
    span: Span,
}

/// The call span, with the fields known when it opens and room for those
/// recorded later (the service's, the store's, the answer's).
macro_rules! call_span {
    ($level:expr, $method:expr, $tenant:expr, $trace_id:expr $(, $($otel:tt)*)?) => {
        tracing::span!(
            target: CALL_TARGET,
            $level,
            "call",
            method = $method,
            tenant = $tenant,
            trace_id = $trace_id,
            scope = Empty,
            key_hash = Empty,
            decision = Empty,
            error = Empty,
            batch_size = Empty,
            $($($otel)*)?
        )
    };
}

impl CallSpan {
    /// No span, for calls of the health and reflection services.
    pub fn none() -> Self {
        CallSpan { span: Span::none() }
    }

    /// Opens the span of a call to `path` (`/package.Service/Method`) by
    /// `tenant` (when admission knows it), a child of the caller's span when
    /// `headers` carry a `traceparent`.
    pub fn start(path: &str, headers: &HeaderMap, tenant: Option<&str>) -> Self {
        let method = path.rsplit('/').next().unwrap_or(path);
        let caller = || TraceContextPropagator::new().extract(&HeaderExtractor(headers));
        if !EXPORTING.load(Ordering::Relaxed) {
            if !headers.contains_key("traceparent") {
                // Nobody traces this call: its span is in the log at debug
                // level only, and otherwise costs nothing.
                let span = call_span!(Level::DEBUG, method, tenant, Empty);
                return CallSpan { span };
            }
            // Only the caller's trace id, for the log.
            let trace_id = Some(caller().span().span_context().trace_id())
                .filter(|id| *id != TraceId::INVALID);
            let span = call_span!(
                Level::INFO,
                method,
                tenant,
                trace_id.map(tracing::field::display)
            );
            return CallSpan { span };
        }
        let span = call_span!(
            Level::INFO,
            method,
            tenant,
            Empty,
            otel.name = path.trim_start_matches('/'),
            otel.kind = "server",
            otel.status_code = Empty,
        );
        // Without a traceparent, an empty parent: a trace of its own, not
        // one under the connection.
        if span.set_parent(caller()).is_ok() {
            let trace_id = span.context().span().span_context().trace_id();
            span.record("trace_id", tracing::field::display(trace_id));
        }
        CallSpan { span }
    }

    pub fn span(&self) -> &Span {
        &self.span
    }

    /// Records the error the caller hears, from the headers or trailers of
    /// the answer (nothing when they carry no error status).
    pub fn answered(&self, headers: &HeaderMap) {
        if self.span.is_disabled() {
            return;
        }
        match headers.get("grpc-status") {
            None => return,
            Some(code) if code == "0" => return,
            Some(_) => {}
        }
        let Some(status) = tonic::Status::from_header_map(headers) else {
            return;
        };
        let details = status.get_error_details();
        match details.error_info() {
            Some(info) => self.span.record("error", info.reason.as_str()),
            None => self
                .span
                .record("error", tracing::field::debug(status.code())),
        };
        // The server's failures, not the caller's mistakes, mark the span.
        use tonic::Code;
        if matches!(
            status.code(),
            Code::Unknown
                | Code::DeadlineExceeded
                | Code::Unimplemented
                | Code::Internal
                | Code::Unavailable
                | Code::DataLoss
        ) {
            self.span.record("otel.status_code", "ERROR");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_stays_at_info_unless_named() {
        assert!(
            filter(Some("debug"))
                .to_string()
                .contains("tokio_postgres=info")
        );
        assert!(filter(None).to_string().contains("tokio_postgres=info"));
        let named = filter(Some("info,tokio_postgres=debug")).to_string();
        assert!(named.contains("tokio_postgres=debug"));
        assert!(!named.contains("tokio_postgres=info"));
    }

    #[test]
    fn keys_are_named_by_a_hash_that_separates_the_parts() {
        let hash = key_hash("t", "s", "k");
        assert_eq!(hash.len(), 16);
        assert!(hash.chars().all(|c| c.is_ascii_hexdigit()));
        // printf 't\0s\0k' | sha256sum
        assert_eq!(hash, "505a8052a8fbd744");
        assert_ne!(key_hash("t", "sk", ""), key_hash("t", "s", "k"));
        assert_ne!(key_hash("ts", "", "k"), key_hash("t", "s", "k"));
    }
}
