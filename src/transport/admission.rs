//! What every call passes before a service sees it, decided on its headers
//! alone: who the caller is (Coordinator calls, when tokens are required),
//! whether the server has room for the request's bytes (and, with
//! credentials required, the caller's tenant in its share of them), the
//! limits its body is held to while it arrives, and the caller's deadline.
//!
//! A refused call is answered at once, and its body is never read; every
//! refusal is counted by port and reason.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::Either;
use http::{HeaderMap, Request, Response};
use tonic::body::Body;
use tonic::service::Routes;
use tower_service::Service as _;
use tracing::Instrument as _;

use super::activity::OpenCall;
use super::body::{BodyLimits, ByteBudget, Full, GuardedBody, Held, Pace, Reservation};
use super::later::AnswerLater;
use crate::auth::{Authenticator, Caller};
use crate::domain::Tenant;
use crate::error::Error;
use crate::metrics::{self, Metrics};
use crate::telemetry::CallSpan;

mod typed;

/// The largest message of the health and reflection services: their
/// requests name a service or a symbol.
pub const SMALL_MESSAGE_BYTES: usize = 64 * 1024;

/// Arriving request bytes of the health and reflection services, which
/// anyone may call: a budget of their own, so that callers without
/// credentials cannot take the room of Coordinator calls.
pub const OPEN_SERVICES_BUDGET_BYTES: usize = 8 * 1024 * 1024;

/// What the server holds for a call whose body has not arrived, besides its
/// headers (counted twice: as received and as decoded): the stream's state
/// in the HTTP/2 connection, the request and the call's future.
pub const CALL_OVERHEAD_BYTES: usize = 8 * 1024;

/// The part of the Coordinator calls' budget (`--max-inflight-request-mib`)
/// one tenant may hold, as a fraction: a half, so that one tenant (or one
/// stolen token) leaves the other tenants at least the other half. Applies
/// when credentials are required (without them every caller is one tenant).
pub const TENANT_SHARE_DIVISOR: usize = 2;

/// Marks a request that the HTTP/JSON door makes in process, so that
/// admission counts its refusals as the HTTP port's.
#[derive(Debug, Clone, Copy)]
pub struct FromHttpPort;

/// A budget refusal logged at most this often; the others are counted in
/// the next line (and all of them in the metrics).
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Counts a request refused at the edge (`reason`: the refusal metric's
/// label), and says so at info, at most once a second, when it was refused
/// for want of room in a byte budget: a full budget means callers are
/// turned away, which the operator should hear of.
pub fn refused(metrics: &Metrics, port: metrics::Port, reason: &'static str) {
    metrics.request_refused(port, reason);
    if !matches!(reason, "overloaded" | "tenant_share" | "connection_share") {
        return;
    }
    static START: LazyLock<Instant> = LazyLock::new(Instant::now);
    static NEXT_MS: AtomicU64 = AtomicU64::new(0);
    static UNLOGGED: AtomicU64 = AtomicU64::new(0);
    let now = u64::try_from(START.elapsed().as_millis()).unwrap_or(u64::MAX);
    let next = NEXT_MS.load(Ordering::Relaxed);
    let interval = u64::try_from(REFUSAL_LOG_INTERVAL.as_millis()).unwrap_or(1000);
    if now < next
        || NEXT_MS
            .compare_exchange(next, now + interval, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        UNLOGGED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let unlogged = UNLOGGED.swap(0, Ordering::Relaxed);
    let port = match port {
        metrics::Port::Grpc => "grpc",
        metrics::Port::Http => "http",
    };
    tracing::info!(
        port,
        reason,
        also_refused_since_last_line = unlogged,
        "request refused: no room in the in-flight request byte budget (--max-inflight-request-mib)"
    );
}

/// Which service a call is for, by its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    Coordinator,
    Reflection,
    /// Health, and paths no service answers.
    Other,
}

fn service_of(path: &str) -> Service {
    if path.starts_with("/idempotency.v1.Coordinator/") {
        Service::Coordinator
    } else if path.starts_with("/grpc.reflection.") {
        Service::Reflection
    } else {
        Service::Other
    }
}

/// How long the caller is prepared to wait, from its `grpc-timeout` header
/// (`<digits><unit>` as the gRPC HTTP/2 protocol defines it).
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.saturating_mul(3600)),
        "M" => Duration::from_secs(amount.saturating_mul(60)),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// When a call whose caller allowed `budget` is answered DEADLINE_EXCEEDED:
/// a little before the caller's own timer runs out (the smaller of 100 ms
/// and a tenth of the budget), so that the caller hears the server's
/// DEADLINE_EXCEEDED rather than its library's own verdict, which the two
/// race for at the deadline itself (and which some libraries, tonic among
/// them, report as CANCELLED).
fn answer_by(budget: Duration) -> Duration {
    budget.saturating_sub((budget / 10).min(Duration::from_millis(100)))
}

/// When the service must have answered: the caller's deadline, read once
/// from `grpc-timeout` by admission when the call's headers arrived, less
/// the margin by which admission answers DEADLINE_EXCEEDED early
/// (`answer_by`); handed to the service in the request's extensions, so
/// that what the service bounds by it (a wait window, a connect wait, the
/// deadline its statements carry into the database) ends before admission
/// gives up on the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallDeadline(pub tokio::time::Instant);

impl CallDeadline {
    /// A deadline `budget` from now.
    pub fn after(budget: Duration) -> Self {
        CallDeadline(tokio::time::Instant::now() + budget)
    }

    /// What is left of it now.
    pub fn left(&self) -> Duration {
        self.0
            .saturating_duration_since(tokio::time::Instant::now())
    }
}

/// The bytes a call's headers take, as HTTP/2 counts them against its
/// header list limit (name, value and 32 bytes each).
fn header_bytes(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 32)
        .sum()
}

/// The limits of admission, shared by every connection.
pub struct Admission {
    routes: Routes,
    /// Sees every Coordinator call first (it refuses them while the
    /// database is not ready).
    gate: Gate,
    auth: Arc<Authenticator>,
    /// For Coordinator calls.
    budget: Arc<ByteBudget>,
    /// Each tenant's share of `budget` (credentials required only), made
    /// on its first call; as many as the credentials file has named.
    tenant_shares: Mutex<HashMap<Tenant, Arc<ByteBudget>>>,
    /// The size of each share.
    tenant_share_bytes: usize,
    /// For everything else (health, reflection, unknown paths).
    open_budget: Arc<ByteBudget>,
    /// The largest Coordinator request.
    max_request_bytes: usize,
    /// The longest a request body may take to arrive.
    body_timeout: Duration,
    /// Where every call and every refusal is counted.
    metrics: Metrics,
}

/// What every Coordinator call passes after its caller is known: `Err` to
/// refuse it (with UNAVAILABLE while the database is not ready).
pub type Gate = Arc<dyn Fn() -> Result<(), tonic::Status> + Send + Sync>;

fn refuse(status: tonic::Status) -> Response<Body> {
    status.into_http()
}

impl Admission {
    /// `inflight_bytes` is the Coordinator calls' budget; calls and
    /// refusals are counted in `metrics`.
    pub fn new(
        routes: Routes,
        gate: Gate,
        (auth, metrics): (Arc<Authenticator>, Metrics),
        inflight_bytes: usize,
        max_request_bytes: usize,
        body_timeout: Duration,
    ) -> Self {
        Admission {
            routes,
            gate,
            auth,
            budget: ByteBudget::new(inflight_bytes),
            tenant_shares: Mutex::new(HashMap::new()),
            tenant_share_bytes: inflight_bytes / TENANT_SHARE_DIVISOR,
            open_budget: ByteBudget::new(OPEN_SERVICES_BUDGET_BYTES),
            max_request_bytes,
            body_timeout,
            metrics,
        }
    }

    /// The server's metrics, where every call through admission is counted.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Admits or refuses one call; `call` marks its connection busy until
    /// the answer has been sent. The service's future is built here, so the
    /// one returned holds it, and not the request besides (a call that waits
    /// keeps this future for its whole window).
    pub fn call<B>(
        &self,
        mut request: Request<B>,
        call: OpenCall,
    ) -> impl Future<Output = Result<Response<Body>, Infallible>> + Send + use<B>
    where
        B: http_body::Body<Data = bytes::Bytes> + Unpin + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let rpc = metrics::Rpc::start(&self.metrics, request.uri().path());
        let service = service_of(request.uri().path());
        let admitted = self.admit(&mut request, service);
        // Coordinator calls run in a span of their own, from here until
        // their answer has been sent.
        let span = match service {
            Service::Coordinator => {
                let tenant = request.extensions().get::<Caller>();
                let tenant = tenant.map(|caller| caller.tenant.as_str());
                CallSpan::start(request.uri().path(), request.headers(), tenant)
            }
            _ => CallSpan::none(),
        };
        let (reservation, limits, deadline) = match admitted {
            Ok(admitted) => admitted,
            Err(e) => {
                let refused = span.span().in_scope(|| refuse(e));
                span.answered(refused.headers());
                return Either::Left(std::future::ready(Ok(answered(rpc, refused).0)));
            }
        };
        // A Coordinator call holds its headers' charge and its request's
        // bytes, as they arrive and for as long as the call holds them
        // (decoded, then waiting for the database), until its service has
        // answered; then its answer's bytes instead, until they have been
        // sent. A call its service parked holds nothing once parked: the
        // waiter limits bound those. Calls of the health and reflection
        // services, open to anyone, count their messages only while they
        // arrive, and their headers' charge for as long as they last.
        let (body_share, held, answering) = match service {
            Service::Coordinator => {
                let held = Held::new(reservation);
                let answer = Answer {
                    kept: held.bytes(),
                    bytes: 0,
                };
                (held.clone(), held, Some(answer))
            }
            _ => (Held::new(reservation.empty()), Held::new(reservation), None),
        };
        let request = request.map(|body| GuardedBody::new(body, body_share, limits));
        // Boxed: the router's future (320 bytes) would otherwise size every
        // call's future. A call that waits does not keep it: its service
        // parks it, and the answer's body runs it ([`AnswerLater`]).
        let answer = span
            .span()
            .in_scope(|| Box::pin(self.routes.clone().call(request)))
            .instrument(span.span().clone());
        Either::Right(async move {
            let response = match deadline {
                None => answer.await,
                Some(deadline) => {
                    let expired = Box::pin(tokio::time::sleep(deadline));
                    match futures_util::future::select(answer, expired).await {
                        Either::Left((response, _)) => response,
                        Either::Right(_) => Ok(refuse(Error::DeadlineExceeded.into())),
                    }
                }
            }?;
            let (response, parked) = answer_later(response);
            let mut answer = answering;
            if let Some(answer) = &mut answer {
                // The request is gone: its bytes leave the budget.
                if parked {
                    answer.kept = 0;
                }
                held.answering(answer.kept, 0);
            }
            span.answered(response.headers());
            let (response, rpc) = answered(rpc, response);
            Ok(response.map(|body| {
                Body::new(Tracked {
                    body,
                    rpc,
                    _call: call,
                    held,
                    answer,
                    span,
                })
            }))
        })
    }

    /// No bytes yet of the Coordinator calls' budget, bounded also by
    /// `caller`'s tenant's share and by `shares` (a connection's): the HTTP
    /// door grows it as a JSON body's bytes arrive ([`Reservation::grow`])
    /// and holds it until the body has become protobuf, before the call it
    /// becomes is admitted.
    pub fn hold_for(&self, caller: &Caller, mut shares: Vec<Arc<ByteBudget>>) -> Reservation {
        if let Some(share) = self.tenant_share(caller) {
            shares.insert(0, share);
        }
        self.budget.reserve_empty(shares)
    }

    /// `caller`'s tenant's share of the Coordinator calls' budget, when
    /// credentials are required.
    fn tenant_share(&self, caller: &Caller) -> Option<Arc<ByteBudget>> {
        if !self.auth.is_on() {
            return None;
        }
        let mut shares = self.tenant_shares.lock().unwrap_or_else(|e| e.into_inner());
        let share = shares
            .entry(caller.tenant.clone())
            .or_insert_with(|| ByteBudget::share(self.tenant_share_bytes, Full::Tenant));
        Some(Arc::clone(share))
    }

    /// Decides on the headers: the caller (inserted into the request's
    /// extensions), the request's share of the budget, its body's limits and
    /// its deadline.
    fn admit<B>(
        &self,
        request: &mut Request<B>,
        service: Service,
    ) -> Result<(Reservation, BodyLimits, Option<Duration>), tonic::Status> {
        let port = match request.extensions().get::<FromHttpPort>() {
            Some(_) => metrics::Port::Http,
            None => metrics::Port::Grpc,
        };
        let mut reservation = match service {
            Service::Coordinator => {
                // A caller in the extensions was put there in process by the
                // HTTP door, which authenticated it from these same headers
                // (a request from the network carries none).
                let caller = match request.extensions_mut().remove::<Caller>() {
                    Some(caller) => caller,
                    None => self
                        .auth
                        .caller_from_headers(request.headers())
                        .inspect_err(|_| refused(&self.metrics, port, "unauthenticated"))
                        .map_err(Error::from)?,
                };
                (self.gate)()?;
                let reservation = self.hold_for(&caller, Vec::new());
                request.extensions_mut().insert(caller);
                reservation
            }
            _ => self.open_budget.reserve_empty(Vec::new()),
        };
        let charge = 2 * header_bytes(request.headers()) + CALL_OVERHEAD_BYTES;
        if let Err(full) = reservation.grow(charge) {
            refused(&self.metrics, port, full.reason());
            return Err(Error::Overloaded.into());
        }
        let (max_message, max_message_flag) = match service {
            Service::Coordinator => (self.max_request_bytes, "--max-request-bytes"),
            _ => (
                SMALL_MESSAGE_BYTES,
                "the health and reflection message limit",
            ),
        };
        let limits = BodyLimits {
            max_message,
            timeout: self.body_timeout,
            // Reflection is a stream of requests; every other call sends one.
            pace: match service {
                Service::Reflection => Pace::EachMessage,
                _ => Pace::Whole,
            },
            max_message_flag,
            port,
            metrics: self.metrics.clone(),
        };
        let deadline = grpc_timeout(request.headers()).map(answer_by);
        if let Some(deadline) = deadline {
            request
                .extensions_mut()
                .insert(CallDeadline::after(deadline));
        }
        Ok((reservation, limits, deadline))
    }
}

/// `response` with the body its service parked for later, if it did, and
/// whether it did.
fn answer_later(mut response: Response<Body>) -> (Response<Body>, bool) {
    match response.extensions_mut().remove::<AnswerLater>() {
        Some(later) => (response.map(|_| later.into_body()), true),
        None => (response, false),
    }
}

/// The status of a gRPC answer's headers or trailers, if they carry one.
fn grpc_status(headers: &HeaderMap) -> Option<tonic::Code> {
    headers
        .get("grpc-status")
        .map(|code| tonic::Code::from_bytes(code.as_bytes()))
}

/// Records `rpc` now if `response` carries its status in its headers (a
/// call refused, or answered with an error); otherwise hands it back to be
/// recorded when the trailers go out.
fn answered(rpc: metrics::Rpc, response: Response<Body>) -> (Response<Body>, Option<metrics::Rpc>) {
    match grpc_status(response.headers()) {
        Some(code) => {
            rpc.finish(code);
            (response, None)
        }
        None => (response, Some(rpc)),
    }
}

/// An answer's body that keeps its connection marked busy, its call's share
/// of the budget and its span open, until it has been sent or dropped; its
/// trailers give the call's final status to its span and to metrics (a
/// body dropped before them counts as CANCELLED).
struct Tracked {
    body: Body,
    rpc: Option<metrics::Rpc>,
    _call: OpenCall,
    /// The call's share of the budget, given back when the answer has been
    /// sent (or dropped).
    held: Held,
    /// A Coordinator call's answer, counted in `held` as it is sent.
    answer: Option<Answer>,
    /// Hears the status in the trailers.
    span: CallSpan,
}

/// What a Coordinator call's answer holds of its share.
struct Answer {
    /// The headers' charge, held until the answer has been sent (nothing
    /// for a call its service parked).
    kept: usize,
    /// The answer's bytes so far, which replace the request's in the share
    /// (the request is gone once the service has answered).
    bytes: usize,
}

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        let this = self.get_mut();
        // In the call's span: a parked call's body runs its decision.
        let polled = {
            let _in_span = this.span.span().enter();
            std::pin::Pin::new(&mut this.body).poll_frame(cx)
        };
        if let std::task::Poll::Ready(Some(frame)) = &polled {
            if let Ok(frame) = frame
                && let Some(data) = frame.data_ref()
                && let Some(answer) = &mut this.answer
            {
                answer.bytes += data.len();
                this.held.answering(answer.kept, answer.bytes);
            }
            if let Ok(frame) = frame
                && let Some(trailers) = frame.trailers_ref()
            {
                this.span.answered(trailers);
            }
            let code = match frame {
                Ok(frame) => frame.trailers_ref().and_then(grpc_status),
                Err(status) => Some(status.code()),
            };
            if let Some(code) = code
                && let Some(rpc) = this.rpc.take()
            {
                rpc.finish(code);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_call_is_answered_before_the_callers_own_timer_runs_out() {
        assert_eq!(
            answer_by(Duration::from_secs(2)),
            Duration::from_millis(1900)
        );
        assert_eq!(
            answer_by(Duration::from_millis(100)),
            Duration::from_millis(90)
        );
        assert_eq!(answer_by(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn grpc_timeouts_read_every_unit_and_refuse_nonsense() {
        let header = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert("grpc-timeout", v.parse().unwrap());
            grpc_timeout(&h)
        };
        assert_eq!(header("2S"), Some(Duration::from_secs(2)));
        assert_eq!(header("150m"), Some(Duration::from_millis(150)));
        assert_eq!(header("1500m"), Some(Duration::from_millis(1500)));
        assert_eq!(header("5u"), Some(Duration::from_micros(5)));
        assert_eq!(header("3M"), Some(Duration::from_secs(180)));
        assert_eq!(header("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(header("7u"), Some(Duration::from_micros(7)));
        assert_eq!(header("9n"), Some(Duration::from_nanos(9)));
        for bad in ["", "x", "S", "5", "5x", "-5S", "123456789S"] {
            assert_eq!(header(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn paths_name_their_service() {
        assert_eq!(
            service_of("/idempotency.v1.Coordinator/Acquire"),
            Service::Coordinator
        );
        assert_eq!(
            service_of("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"),
            Service::Reflection
        );
        assert_eq!(service_of("/grpc.health.v1.Health/Check"), Service::Other);
        assert_eq!(service_of("/idempotency.v1.Coordinatorx/A"), Service::Other);
    }
}
