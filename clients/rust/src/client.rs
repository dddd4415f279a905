//! The connection: endpoint, TLS, bearer token, per-call deadlines, and the
//! single calls (no retries) the run-once template is built from.

use std::future::Future;
use std::time::Duration;

use tonic::body::Body;
use tonic::codegen::StdError;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tower::ServiceExt as _;
use tower::util::BoxCloneSyncService;

use crate::error::CallError;
use crate::proto::coordinator_client::CoordinatorClient;
use crate::proto::{
    AcquireRequest, AcquireResponse, CompleteRequest, CompleteResponse, ExtendLeaseRequest,
    ExtendLeaseResponse, GetRequest, Record,
};

/// The transport every [`Client`] runs on: a channel, or any tower service
/// speaking HTTP/2 requests and responses (see [`Client::from_service`]),
/// boxed so that `Client` is one type whatever it runs on.
pub type Transport = BoxCloneSyncService<http::Request<Body>, http::Response<Body>, TransportError>;

/// A transport's failure, as the generated stub sees it (it becomes the
/// call's status: UNAVAILABLE when the connection failed).
///
/// A named type rather than a bare boxed error: with the latter the
/// compiler cannot prove a call's future `Send`.
#[derive(Debug)]
pub struct TransportError(StdError);

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for TransportError {
    // The error itself is the source, so that tonic finds a status (or a
    // connection failure) in the chain.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// How to reach and authenticate to the coordinator.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Sent as `authorization: Bearer <token>` on every call.
    pub bearer_token: Option<String>,
    /// TLS: needed with an `https://` endpoint (see [`TlsOptions`]).
    pub tls: Option<TlsOptions>,
    /// Every call's deadline (Acquire's is its wait window plus this): 10 s.
    pub call_timeout: Duration,
    /// How long opening the connection may take: 10 s.
    pub connect_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            bearer_token: None,
            tls: None,
            call_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// TLS settings, as PEM.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// The CA certificate(s) the server's certificate must chain to.
    pub ca_pem: Option<String>,
    /// A client certificate chain, for mutual TLS (with `client_key_pem`).
    pub client_cert_pem: Option<String>,
    /// The client certificate's private key.
    pub client_key_pem: Option<String>,
    /// The name the server's certificate must carry, when it is not the
    /// endpoint's host.
    pub domain: Option<String>,
}

/// Why a client could not be made. Non-exhaustive: a `match` on it outside
/// this crate needs a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The bearer token is not a valid header value (visible ASCII).
    #[error("the bearer token must be visible ASCII")]
    InvalidToken,
    /// A client certificate needs its key, and a key its certificate.
    #[error("mutual TLS needs both client_cert_pem and client_key_pem")]
    IncompleteIdentity,
    /// The endpoint is malformed, the TLS settings refused, or the
    /// connection failed.
    #[error("{0}")]
    Transport(#[from] tonic::transport::Error),
}

/// A coordinator client. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct Client {
    stub: CoordinatorClient<Transport>,
    pub(crate) call_timeout: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to `endpoint` (`http://host:port`, or `https://host:port`
    /// with [`ClientOptions::tls`]).
    pub async fn connect(
        endpoint: impl Into<String>,
        options: ClientOptions,
    ) -> Result<Client, ConnectError> {
        let channel = Self::endpoint(endpoint, &options)?.connect().await?;
        Self::new(channel, options)
    }

    /// Like [`Client::connect`], but connects on the first call (and
    /// reconnects as needed) instead of now.
    pub fn connect_lazy(
        endpoint: impl Into<String>,
        options: ClientOptions,
    ) -> Result<Client, ConnectError> {
        let channel = Self::endpoint(endpoint, &options)?.connect_lazy();
        Self::new(channel, options)
    }

    fn endpoint(
        endpoint: impl Into<String>,
        options: &ClientOptions,
    ) -> Result<Endpoint, ConnectError> {
        let mut endpoint = Endpoint::from_shared(endpoint.into())?
            .connect_timeout(options.connect_timeout)
            .tcp_nodelay(true);
        if let Some(tls) = &options.tls {
            let mut config = ClientTlsConfig::new();
            if let Some(ca) = &tls.ca_pem {
                config = config.ca_certificate(Certificate::from_pem(ca));
            }
            match (&tls.client_cert_pem, &tls.client_key_pem) {
                (Some(cert), Some(key)) => config = config.identity(Identity::from_pem(cert, key)),
                (None, None) => {}
                _ => return Err(ConnectError::IncompleteIdentity),
            }
            if let Some(domain) = &tls.domain {
                config = config.domain_name(domain.clone());
            }
            endpoint = endpoint.tls_config(config)?;
        }
        Ok(endpoint)
    }

    /// A client on a channel made elsewhere. [`ClientOptions::tls`] and
    /// `connect_timeout` are the channel's business and ignored here.
    pub fn new(channel: Channel, options: ClientOptions) -> Result<Client, ConnectError> {
        Self::from_service(channel, options)
    }

    /// A client on any tower service that carries gRPC's HTTP/2 requests:
    /// a channel wrapped in layers of your own (load balancing, metrics, a
    /// proxy that drops replies in a test). The bearer token is added to
    /// each request before it reaches `service`.
    pub fn from_service<S, B>(service: S, options: ClientOptions) -> Result<Client, ConnectError>
    where
        S: tower::Service<http::Request<Body>, Response = http::Response<B>>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Error: Into<StdError>,
        S::Future: Send + 'static,
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<StdError>,
    {
        let authorization = match &options.bearer_token {
            Some(token) => Some(
                http::HeaderValue::try_from(format!("Bearer {token}"))
                    .map_err(|_| ConnectError::InvalidToken)?,
            ),
            None => None,
        };
        let service = service
            .map_request(move |mut request: http::Request<Body>| {
                if let Some(value) = &authorization {
                    request
                        .headers_mut()
                        .insert(http::header::AUTHORIZATION, value.clone());
                }
                request
            })
            .map_response(|response: http::Response<B>| response.map(Body::new))
            .map_err(|error: S::Error| TransportError(error.into()));
        Ok(Client {
            stub: CoordinatorClient::new(BoxCloneSyncService::new(service)),
            call_timeout: options.call_timeout,
        })
    }

    /// The generated stub on this client's transport (with its bearer
    /// token), for calls this library does not wrap (Watch, WatchDue,
    /// Sweep). Set your own deadlines on its requests.
    pub fn stub(&self) -> CoordinatorClient<Transport> {
        self.stub.clone()
    }

    /// Every call's deadline but Acquire's.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// One Acquire, not retried; its deadline is the request's wait window
    /// plus the call timeout.
    pub async fn acquire(&self, request: AcquireRequest) -> Result<AcquireResponse, CallError> {
        let wait = request
            .wait
            .and_then(|w| Duration::try_from(w).ok())
            .unwrap_or_default();
        self.unary(
            request,
            wait + self.call_timeout,
            |mut stub, r| async move { stub.acquire(r).await },
        )
        .await
    }

    /// One Complete, not retried.
    pub async fn complete(&self, request: CompleteRequest) -> Result<CompleteResponse, CallError> {
        self.unary(request, self.call_timeout, |mut stub, r| async move {
            stub.complete(r).await
        })
        .await
    }

    /// One ExtendLease, not retried.
    pub async fn extend_lease(
        &self,
        request: ExtendLeaseRequest,
    ) -> Result<ExtendLeaseResponse, CallError> {
        self.unary(request, self.call_timeout, |mut stub, r| async move {
            stub.extend_lease(r).await
        })
        .await
    }

    /// The record of (scope, key); `None` when there is none (or it
    /// expired).
    pub async fn get(&self, scope: &str, key: &str) -> Result<Option<Record>, CallError> {
        let request = GetRequest {
            scope: scope.to_owned(),
            key: key.to_owned(),
        };
        let answer = self
            .unary(request, self.call_timeout, |mut stub, r| async move {
                stub.get(r).await
            })
            .await;
        match answer {
            Ok(response) => Ok(response.record),
            Err(error) if error.code == tonic::Code::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// One call with a deadline: sent to the server as `grpc-timeout`, and
    /// kept here too, so a call never outlives it.
    async fn unary<Req, Resp, F, Fut>(
        &self,
        message: Req,
        deadline: Duration,
        call: F,
    ) -> Result<Resp, CallError>
    where
        F: FnOnce(CoordinatorClient<Transport>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let mut request = tonic::Request::new(message);
        request.set_timeout(deadline);
        match tokio::time::timeout(deadline, call(self.stub.clone(), request)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(status.into()),
            Err(_) => Err(CallError::deadline(deadline)),
        }
    }
}
