//! Flags, each with an environment fallback (`IDEMPOTENCY_SIDECAR_*`), and
//! their defaults, each written once here; [`Args::resolve`] turns them
//! into the pieces the proxy is built from, refusing bad values at start.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use http::{StatusCode, Uri};
use idempotency_client::{ClientOptions, TlsOptions};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::key::Credentials;
use crate::proxy::Settings;
use crate::routes::{
    self, DEFAULT_CREDENTIAL_HEADERS, DEFAULT_STORED_HEADERS, RouteDefaults, RouteError, Routes,
};
use crate::upstream::RetryStatuses;

/// An HTTP reverse proxy that gives any HTTP API `Idempotency-Key`
/// semantics, with the idempotency coordinator deciding.
#[derive(Debug, Clone, Parser)]
#[command(name = "idempotency-sidecar", version)]
pub struct Args {
    /// Where clients connect (HTTP/1.1 and h2c).
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_LISTEN",
        default_value = "0.0.0.0:8080"
    )]
    pub listen: SocketAddr,
    /// The API behind the sidecar, e.g. `http://127.0.0.1:3000`.
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_UPSTREAM")]
    pub upstream: Uri,
    /// Speak HTTP/2 with prior knowledge (h2c) to the upstream.
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_UPSTREAM_H2C")]
    pub upstream_h2c: bool,
    /// How long the upstream may take to answer a request, head and body.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_UPSTREAM_TIMEOUT",
        default_value = "60s"
    )]
    pub upstream_timeout: humantime::Duration,
    /// The coordinator's gRPC endpoint, e.g. `http://127.0.0.1:50051`, or
    /// `unix:/run/idempotency/coordinator.sock` for a coordinator in the
    /// same pod or host serving that Unix socket (its `--unix-socket`).
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_COORDINATOR")]
    pub coordinator: String,
    /// Bearer token for the coordinator: its credentials decide the tenant.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_COORDINATOR_TOKEN",
        hide_env_values = true
    )]
    pub coordinator_token: Option<String>,
    /// PEM file of the CA the coordinator's certificate chains to (with an
    /// `https://` endpoint).
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_COORDINATOR_CA")]
    pub coordinator_ca: Option<std::path::PathBuf>,
    /// PEM file of a client certificate chain, for mutual TLS.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_COORDINATOR_CERT",
        requires = "coordinator_key"
    )]
    pub coordinator_cert: Option<std::path::PathBuf>,
    /// PEM file of the client certificate's private key.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_COORDINATOR_KEY",
        requires = "coordinator_cert"
    )]
    pub coordinator_key: Option<std::path::PathBuf>,
    /// Deadline of each coordinator call.
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_CALL_TIMEOUT", default_value = "10s")]
    pub call_timeout: humantime::Duration,
    /// How long an upstream's answer that could not be stored is held
    /// while its Complete is sent again (same lease token, with backoff),
    /// until stored or the key is taken over; its client waits meanwhile.
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_STORE_PATIENCE", default_value = "2m")]
    pub store_patience: humantime::Duration,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_METRICS_LISTEN",
        default_value = "0.0.0.0:9464"
    )]
    pub metrics_listen: SocketAddr,
    /// A route: `METHOD PATTERN require|accept|pass [option=value...]`
    /// (repeatable; tried in order, before the route file's).
    #[arg(
        long = "route",
        env = "IDEMPOTENCY_SIDECAR_ROUTES",
        value_delimiter = ';'
    )]
    pub routes: Vec<String>,
    /// A file of routes, one a line (`#` starts a comment).
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_ROUTES_FILE")]
    pub routes_file: Option<std::path::PathBuf>,
    /// The scope of routes that name none.
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_SCOPE", default_value = "http")]
    pub scope: String,
    /// Request headers the fingerprint covers, unless a route says (`-`: none).
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_FINGERPRINT_HEADERS",
        default_value = "content-type"
    )]
    pub fingerprint_headers: String,
    /// Response headers stored for replays, unless a route says (`*`: all
    /// but Set-Cookie).
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_STORE_HEADERS", default_value = DEFAULT_STORED_HEADERS)]
    pub store_headers: String,
    /// A client header whose value namespaces keys (e.g. `x-api-key`).
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_TENANT_HEADER")]
    pub tenant_header: Option<http::HeaderName>,
    /// Request headers that identify the caller, unless a route says:
    /// keys are namespaced by their values, so that no caller gets
    /// another's answer (`-`: none, for keys unique across callers).
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_CREDENTIAL_HEADERS", default_value = DEFAULT_CREDENTIAL_HEADERS)]
    pub credential_headers: String,
    /// Cookies that identify the caller, unless a route says: when named,
    /// a `Cookie` header counts by these alone (`-` or empty: all of it).
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_CREDENTIAL_COOKIES",
        default_value = ""
    )]
    pub credential_cookies: String,
    /// The longest `Idempotency-Key` accepted.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_MAX_KEY_LENGTH",
        default_value_t = 255
    )]
    pub max_key_length: usize,
    /// The largest body of a request with a key (held for the fingerprint).
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_MAX_REQUEST_BODY", default_value_t = 1024 * 1024)]
    pub max_request_body: usize,
    /// The largest answer stored (status, stored headers and body); larger
    /// ones pass through and release the key. At most the coordinator's
    /// `--max-result-bytes`.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_MAX_STORED_BYTES",
        default_value_t = 1_000_000
    )]
    pub max_stored_bytes: usize,
    /// The bodies of requests with a key held at once, in MiB (each counts
    /// the bytes that have arrived); past it, 503.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_MAX_INFLIGHT_BODY_MIB",
        default_value_t = 64
    )]
    pub max_inflight_body_mib: u32,
    /// How long the body of a request with a key may take to arrive.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_REQUEST_BODY_TIMEOUT",
        default_value = "30s"
    )]
    pub request_body_timeout: humantime::Duration,
    /// The lease on a key while its request runs upstream (extended every
    /// third of it while the upstream works).
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_LEASE_TTL", default_value = "30s")]
    pub lease_ttl: humantime::Duration,
    /// The longest `Prefer: wait=N` honoured.
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_MAX_WAIT", default_value = "30s")]
    pub max_wait: humantime::Duration,
    /// Attempts a key allows (0: the coordinator's default).
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_MAX_ATTEMPTS", default_value_t = 0)]
    pub max_attempts: u32,
    /// How long a key's answer is kept (default: the coordinator's).
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_RETENTION")]
    pub retention: Option<humantime::Duration>,
    /// Upstream statuses recorded as failures to retry: `5xx` and codes.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_RETRY_STATUSES",
        default_value = "5xx,408,429"
    )]
    pub retry_statuses: String,
    /// How soon a failed key may run again when the upstream sends no
    /// `Retry-After`.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_FAILURE_RETRY_AFTER",
        default_value = "0s"
    )]
    pub failure_retry_after: humantime::Duration,
    /// Where docs/sidecar.md is published: problem types link to its anchors.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_PROBLEM_DOCS",
        default_value = "docs/sidecar.md"
    )]
    pub problem_docs: String,
    /// Client connections served at once; more wait to be accepted.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_MAX_CONNECTIONS",
        default_value_t = 10_000
    )]
    pub max_connections: usize,
    /// Concurrent HTTP/2 streams per client connection.
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_MAX_STREAMS", default_value_t = 1000)]
    pub max_streams: u32,
    /// How long a new connection has to send its first byte, and a
    /// request its head (HTTP/1.1).
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_HEADER_READ_TIMEOUT",
        default_value = "10s"
    )]
    pub header_read_timeout: humantime::Duration,
    /// On SIGTERM, how long requests in flight have to finish.
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_DRAIN_TIMEOUT", default_value = "30s")]
    pub drain_timeout: humantime::Duration,
    /// How often the coordinator's health is asked.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_HEALTH_INTERVAL",
        default_value = "2s"
    )]
    pub health_interval: humantime::Duration,
    /// `text` or `json` log lines.
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_LOG_FORMAT", default_value = "text")]
    pub log_format: String,
    /// Threads that serve requests: 1 (the default) runs everything on one
    /// thread, so no request's steps hop between threads; 0 for one per core
    /// the machine has (not the container's CPU limit); N for N.
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_WORKER_THREADS", default_value_t = 1)]
    pub worker_threads: usize,
    /// A client connection with no request open for this long is closed
    /// (a full connection table closes the one idle the longest sooner).
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_IDLE_TIMEOUT", default_value = "60s")]
    pub idle_timeout: humantime::Duration,
    /// Requests that wait (`Prefer: wait`) at once in all; past it, 503.
    #[arg(long, env = "IDEMPOTENCY_SIDECAR_MAX_WAITERS", default_value_t = 512)]
    pub max_waiters: usize,
    /// Requests that wait at once on one client connection; past it, 503.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_MAX_WAITERS_PER_CONNECTION",
        default_value_t = 32
    )]
    pub max_waiters_per_connection: usize,
    /// What one client's bodies (by `--tenant-header` value, else address)
    /// hold of `--max-inflight-body-mib` at once, in MiB.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_MAX_INFLIGHT_BODY_PER_CLIENT_MIB",
        default_value_t = 16
    )]
    pub max_inflight_body_per_client_mib: u32,
    /// The longest pause between two chunks of a keyed request's body.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_REQUEST_BODY_IDLE_TIMEOUT",
        default_value = "5s"
    )]
    pub request_body_idle_timeout: humantime::Duration,
    /// Upstream answers of keyed requests held at once until sent, in MiB
    /// (each byte counted three times: read, encoded, sent to the
    /// coordinator); past it, answers wait for room.
    #[arg(
        long,
        env = "IDEMPOTENCY_SIDECAR_MAX_INFLIGHT_ANSWER_MIB",
        default_value_t = 64
    )]
    pub max_inflight_answer_mib: u32,
}

/// A flag whose value cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A route line (or file) is wrong.
    #[error(transparent)]
    Route(#[from] RouteError),
    /// The route file could not be read.
    #[error("reading the route file {path}: {error}")]
    RoutesFile {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// Another flag is wrong.
    #[error("--{flag}: {why}")]
    Flag {
        /// The flag.
        flag: &'static str,
        /// Why.
        why: String,
    },
}

fn flag(flag: &'static str, why: impl Into<String>) -> ConfigError {
    ConfigError::Flag {
        flag,
        why: why.into(),
    }
}

impl Args {
    /// The route table.
    pub fn routes(&self) -> Result<Routes, ConfigError> {
        let defaults = RouteDefaults {
            scope: routes::valid_scope(&self.scope)
                .ok_or_else(|| flag("scope", "1 to 128 of [A-Za-z0-9._:/-]"))?,
            fingerprint_headers: routes::header_list(&self.fingerprint_headers)
                .ok_or_else(|| flag("fingerprint-headers", "a list of header names"))?,
            store_headers: routes::store_headers(&self.store_headers)
                .ok_or_else(|| flag("store-headers", "`*` or a list of header names"))?,
            credentials: Credentials {
                headers: routes::header_list(&self.credential_headers)
                    .ok_or_else(|| flag("credential-headers", "a list of header names"))?,
                cookies: routes::cookie_list(&self.credential_cookies)
                    .ok_or_else(|| flag("credential-cookies", "a list of cookie names"))?,
            },
        };
        if let Some(name) = defaults.store_headers.per_caller() {
            let why = format!("{name} belongs to one caller: name it on a route's store-headers=");
            return Err(flag("store-headers", why));
        }
        let file = match &self.routes_file {
            Some(path) => {
                std::fs::read_to_string(path).map_err(|error| ConfigError::RoutesFile {
                    path: path.display().to_string(),
                    error,
                })?
            }
            None => String::new(),
        };
        let lines = self.routes.iter().map(String::as_str).chain(file.lines());
        Ok(Routes::parse(lines, defaults)?)
    }

    /// Which upstream statuses are failures to retry.
    pub fn retry_statuses(&self) -> Result<RetryStatuses, ConfigError> {
        let mut statuses = RetryStatuses {
            server_errors: false,
            also: Vec::new(),
        };
        for item in self
            .retry_statuses
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            if item.eq_ignore_ascii_case("5xx") {
                statuses.server_errors = true;
            } else {
                let code = item
                    .parse::<u16>()
                    .ok()
                    .and_then(|c| StatusCode::from_u16(c).ok())
                    .ok_or_else(|| flag("retry-statuses", format!("{item:?} is not a status")))?;
                statuses.also.push(code);
            }
        }
        Ok(statuses)
    }

    /// The limits and defaults of coordinated requests.
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        if self.max_key_length == 0 || self.max_key_length > 1024 {
            return Err(flag("max-key-length", "1 to 1024"));
        }
        if self.lease_ttl.as_secs() < 1 {
            return Err(flag("lease-ttl", "at least 1s"));
        }
        Ok(Settings {
            max_key_len: self.max_key_length,
            max_request_body: self.max_request_body,
            max_stored_bytes: self.max_stored_bytes,
            request_body_timeout: self.request_body_timeout.into(),
            tenant_header: self.tenant_header.clone(),
            lease_ttl: self.lease_ttl.into(),
            store_patience: self.store_patience.into(),
            max_wait: self.max_wait.into(),
            max_attempts: self.max_attempts,
            retention: self.retention.map(Duration::from),
            failure_retry_after: self.failure_retry_after.into(),
            body_budget_kib: self.body_budget_kib()?,
        })
    }

    /// How the client library reaches and authenticates to the
    /// coordinator.
    pub fn coordinator_options(&self) -> Result<ClientOptions, ConfigError> {
        let read = |flag_name: &'static str, path: &Option<std::path::PathBuf>| {
            path.as_ref()
                .map(|p| {
                    std::fs::read_to_string(p)
                        .map_err(|e| flag(flag_name, format!("{}: {e}", p.display())))
                })
                .transpose()
        };
        let ca_pem = read("coordinator-ca", &self.coordinator_ca)?;
        let client_cert_pem = read("coordinator-cert", &self.coordinator_cert)?;
        let client_key_pem = read("coordinator-key", &self.coordinator_key)?;
        let tls = self
            .coordinator
            .starts_with("https://")
            .then_some(TlsOptions {
                ca_pem,
                client_cert_pem,
                client_key_pem,
                domain: None,
            });
        Ok(ClientOptions {
            bearer_token: self.coordinator_token.clone(),
            tls,
            call_timeout: self.call_timeout.into(),
            ..ClientOptions::default()
        })
    }

    /// The endpoint the coordinator's health is asked on: the client
    /// library's, with the same TLS.
    pub fn health_endpoint(&self, options: &ClientOptions) -> Result<Endpoint, ConfigError> {
        let bad = |e: tonic::transport::Error| flag("coordinator", e.to_string());
        let mut endpoint = Endpoint::from_shared(self.coordinator.clone()).map_err(bad)?;
        if let Some(tls) = &options.tls {
            let mut config = ClientTlsConfig::new();
            if let Some(ca) = &tls.ca_pem {
                config = config.ca_certificate(Certificate::from_pem(ca));
            }
            if let (Some(cert), Some(key)) = (&tls.client_cert_pem, &tls.client_key_pem) {
                config = config.identity(Identity::from_pem(cert, key));
            }
            endpoint = endpoint.tls_config(config).map_err(bad)?;
        }
        Ok(endpoint)
    }

    /// The body budget, in KiB.
    pub fn body_budget_kib(&self) -> Result<u32, ConfigError> {
        self.max_inflight_body_mib
            .checked_mul(1024)
            .filter(|kib| (1..=crate::proxy::MAX_BUDGET_KIB).contains(kib))
            .ok_or_else(|| flag("max-inflight-body-mib", "1 to 1048576"))
    }

    /// One client's share of the body budget, in KiB.
    pub fn body_share_kib(&self) -> Result<u32, ConfigError> {
        self.max_inflight_body_per_client_mib
            .checked_mul(1024)
            .filter(|kib| (1..=crate::proxy::MAX_BUDGET_KIB).contains(kib))
            .ok_or_else(|| flag("max-inflight-body-per-client-mib", "1 to 1048576"))
    }

    /// The answer budget, in KiB: room for at least one largest answer.
    pub fn answer_budget_kib(&self) -> Result<u32, ConfigError> {
        let one = self.max_stored_bytes.saturating_mul(crate::answers::COPIES) / 1024 + 1;
        self.max_inflight_answer_mib
            .checked_mul(1024)
            .filter(|kib| (1..=crate::proxy::MAX_BUDGET_KIB).contains(kib))
            .filter(|kib| *kib as usize >= one)
            .ok_or_else(|| {
                let why = "1 to 1048576, and room for three copies of --max-stored-bytes";
                flag("max-inflight-answer-mib", why)
            })
    }

    /// The upstream's base URI, checked.
    pub fn upstream_base(&self) -> Result<Uri, ConfigError> {
        match (self.upstream.scheme_str(), self.upstream.authority()) {
            (Some("http"), Some(_)) => Ok(self.upstream.clone()),
            _ => Err(flag("upstream", "an http:// URL with a host")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Result<Args, clap::Error> {
        let mut argv = vec![
            "idempotency-sidecar",
            "--upstream",
            "http://127.0.0.1:3000",
            "--coordinator",
            "http://127.0.0.1:50051",
        ];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv)
    }

    #[test]
    fn defaults_resolve() {
        let args = args(&[]).unwrap();
        let statuses = args.retry_statuses().unwrap();
        assert!(statuses.server_errors);
        assert_eq!(
            statuses.also,
            [StatusCode::REQUEST_TIMEOUT, StatusCode::TOO_MANY_REQUESTS]
        );
        let settings = args.settings().unwrap();
        assert_eq!(settings.max_request_body, 1024 * 1024);
        assert!(args.routes().is_ok());
        assert!(args.coordinator_options().unwrap().tls.is_none());
        assert_eq!(args.worker_threads, 1, "one thread");
    }

    #[test]
    fn worker_threads_may_be_one_per_core() {
        assert_eq!(args(&["--worker-threads", "0"]).unwrap().worker_threads, 0);
    }

    #[test]
    fn routes_come_from_flags_then_the_route_file() {
        let file = std::env::temp_dir().join(format!("sidecar-routes-{}", std::process::id()));
        std::fs::write(&file, "# payments\nPOST /pay/** require scope=payments\n\n").unwrap();
        let path = file.display().to_string();
        let parsed = args(&[
            "--route",
            "POST /pay/x pass;PUT /y accept",
            "--routes-file",
            &path,
        ]);
        let routes = parsed.unwrap().routes().unwrap();
        std::fs::remove_file(&file).unwrap();
        let post = http::Method::POST;
        assert_eq!(
            routes.route(&post, "/pay/x").mode,
            crate::routes::Mode::Pass
        );
        assert_eq!(
            routes.route(&http::Method::PUT, "/y").mode,
            crate::routes::Mode::Accept
        );
        let paid = routes.route(&post, "/pay/z");
        assert_eq!(
            (paid.mode, paid.scope.as_str()),
            (crate::routes::Mode::Require, "payments")
        );
        let missing = args(&["--routes-file", "/nonexistent/routes"]).unwrap();
        assert!(matches!(
            missing.routes(),
            Err(ConfigError::RoutesFile { .. })
        ));
    }

    #[test]
    fn bad_values_are_refused_at_start() {
        assert!(
            args(&["--retry-statuses", "5xx,abc"])
                .unwrap()
                .retry_statuses()
                .is_err()
        );
        assert!(args(&["--scope", "a b"]).unwrap().routes().is_err());
        assert!(
            args(&["--route", "POST /x sometimes"])
                .unwrap()
                .routes()
                .is_err()
        );
        assert!(args(&["--lease-ttl", "100ms"]).unwrap().settings().is_err());
        let ftp = args(&[]).map(|mut a| {
            a.upstream = "ftp://host/".parse().unwrap();
            a
        });
        assert!(ftp.unwrap().upstream_base().is_err());
        assert!(
            args(&["--coordinator-cert", "c.pem"]).is_err(),
            "a cert needs its key"
        );
    }
}
