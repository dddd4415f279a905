//! The generated `Coordinator` trait implemented: decode the request into a
//! validated command, ask the store, encode the answer. Decisions are data
//! (`Decision`); only calls that cannot be answered become a `Status`, through
//! `crate::error`.

mod admin;
mod decode;
mod due;
mod encode;
mod route;
mod wait;

pub use due::FeedConfig;
pub use route::{ACQUIRE_PATH, AcquireRoute};

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use crate::auth::{Authenticator, Caller};
use crate::domain::{AcquireCommand, AdminAction, Policy};
use crate::error::Error;
use crate::notify::Hub;
use crate::proto;
use crate::proto::acquire_request::RequestFingerprint;
use crate::proto::coordinator_server::Coordinator;
use crate::store::{CallTime, Store};
use crate::sweeper::{Sweep, Sweeper};
use crate::telemetry;
use crate::transport::CallDeadline;

/// Asks Get to answer the record's current lease token as well, in the
/// response's extensions ([`CurrentLeaseToken`]), never on the wire. Only an
/// in-process caller can put it in a request's extensions: the HTTP door's
/// seed-004 `/complete`, which completes the current lease when its caller
/// sends no token (the API it keeps had none). A network caller cannot ask
/// for a token it was not given.
#[derive(Clone, Copy, Debug)]
pub struct WantLeaseToken;

/// The record's current lease token, answered to a Get that asked for it
/// with [`WantLeaseToken`]; empty when the record has no lease.
#[derive(Clone, Debug)]
pub struct CurrentLeaseToken(pub String);

/// The Coordinator service, one per server; cheap to share.
#[derive(Clone)]
pub struct CoordinatorService {
    /// Where every decision is made.
    store: Store,
    /// Defaults and limits for requests.
    policy: Arc<Policy>,
    /// Where waiters hear that a record changed.
    hub: Arc<Hub>,
    /// What the Sweep RPC runs.
    sweeper: Sweeper,
    /// How WatchDue feeds run.
    feed: FeedConfig,
    /// Who the caller is; the only source of the tenant.
    auth: Arc<Authenticator>,
}

impl CoordinatorService {
    pub fn new(
        store: Store,
        policy: Arc<Policy>,
        hub: Arc<Hub>,
        sweeper: Sweeper,
        feed: FeedConfig,
        auth: Arc<Authenticator>,
    ) -> Self {
        CoordinatorService {
            store,
            policy,
            hub,
            sweeper,
            feed,
            auth,
        }
    }

    /// The authenticated caller of `request`: the one admission found on
    /// its headers, or (when admission had nothing to check) the headers'.
    fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Error> {
        match request.extensions().get::<Caller>() {
            Some(caller) => Ok(caller.clone()),
            None => Ok(self.auth.caller(request.metadata())?),
        }
    }
}

/// When the caller stops waiting: the `grpc-timeout` admission read from
/// the call's headers.
fn call_budget<T>(request: &Request<T>) -> Option<CallDeadline> {
    request.extensions().get::<CallDeadline>().copied()
}

impl CoordinatorService {
    /// Runs a decoded Acquire: at once, or within its wait window. A plain
    /// `fn` returning an `async` block, not an `async fn`, whose future would
    /// hold the command twice (as argument and as local).
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn's future would hold the command twice"
    )]
    fn run_acquire(
        &self,
        cmd: AcquireCommand,
    ) -> impl Future<Output = Result<Response<proto::AcquireResponse>, Status>> + Send + '_ {
        async move {
            let answer_by = cmd.answer_by.map(Instant::from_std);
            let left = answer_by.map(|at| at.saturating_duration_since(Instant::now()));
            let window = Some(wait::window(cmd.wait, left)).filter(|w| !w.is_zero());
            let acquired = match window {
                None => {
                    let time = CallTime::until(answer_by);
                    self.store.acquire(&cmd, Duration::ZERO, time).await
                }
                Some(window) => {
                    let subscription = self.hub.subscribe(&cmd.id).map_err(Error::from)?;
                    wait::acquire(&self.store, subscription, &cmd, window).await
                }
            }
            .map_err(|e| Error::from_store(e, self.store.metrics()))?;
            self.store.metrics().acquired(
                acquired.decision,
                cmd.id.scope.as_str(),
                acquired.took_over(),
            );
            tracing::debug!(scope = cmd.id.scope.as_str(), decision = ?acquired.decision, "acquire");
            let answer = encode::acquired(acquired);
            telemetry::record_decision(answer.decision().as_str_name());
            Ok(Response::new(answer))
        }
    }
}

/// The store's bounds for a call whose caller stops waiting at `deadline`:
/// its connect wait ends by then (so that a caller with a short deadline
/// hears UNAVAILABLE in time rather than DEADLINE_EXCEEDED), and none of its
/// statements commits after it.
fn call_time(deadline: Option<CallDeadline>) -> CallTime {
    CallTime::until(deadline.map(|d| d.0))
}

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Coordinator for CoordinatorService {
    // Written out rather than `async fn`: the request is decoded before the
    // future is built, so a call waiting in its window does not keep the
    // request (metadata and message) in its future; only the command does.
    fn acquire<'life0, 'async_trait>(
        &'life0 self,
        request: Request<proto::AcquireRequest>,
    ) -> Pin<
        Box<
            dyn Future<Output = Result<Response<proto::AcquireResponse>, Status>>
                + Send
                + 'async_trait,
        >,
    >
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        let budget = call_budget(&request);
        let caller = match self.caller(&request) {
            Ok(caller) => caller,
            Err(e) => return Box::pin(std::future::ready(Err(e.into()))),
        };
        let mut message = request.into_inner();
        if let Some(RequestFingerprint::JsonPayload(text)) = &mut message.request_fingerprint
            && text.len() > decode::INLINE_JSON_BYTES
        {
            let text = std::mem::take(text);
            return Box::pin(async move {
                let json = decode::json_fingerprint(text).await;
                let mut cmd =
                    decode::acquire_with(caller.tenant, message, &self.policy, Some(json))?;
                cmd.answer_by = budget.map(|d| d.0.into_std());
                telemetry::record_id(&cmd.id);
                self.run_acquire(cmd).await
            });
        }
        // A refused request is answered without a future of its own; the
        // future below holds the command alone, not also its `Result`.
        match decode::acquire(caller.tenant, message, &self.policy) {
            Ok(mut cmd) => {
                cmd.answer_by = budget.map(|d| d.0.into_std());
                telemetry::record_id(&cmd.id);
                Box::pin(self.run_acquire(cmd))
            }
            Err(e) => Box::pin(std::future::ready(Err(e.into()))),
        }
    }

    async fn complete(
        &self,
        request: Request<proto::CompleteRequest>,
    ) -> Result<Response<proto::CompleteResponse>, Status> {
        let budget = call_budget(&request);
        let cmd = decode::complete(
            self.caller(&request)?.tenant,
            request.into_inner(),
            &self.policy,
        )?;
        telemetry::record_id(&cmd.id);
        let record = self
            .store
            .complete(&cmd, self.policy.backoff, call_time(budget))
            .await
            .map_err(|e| Error::from_store(e, self.store.metrics()))?;
        Ok(Response::new(proto::CompleteResponse {
            record: Some(encode::record(record)),
        }))
    }

    async fn extend_lease(
        &self,
        request: Request<proto::ExtendLeaseRequest>,
    ) -> Result<Response<proto::ExtendLeaseResponse>, Status> {
        let budget = call_budget(&request);
        let cmd = decode::extend_lease(
            self.caller(&request)?.tenant,
            request.into_inner(),
            &self.policy,
        )?;
        telemetry::record_id(&cmd.id);
        let lease = self
            .store
            .extend_lease(&cmd, self.policy.max_lease_ttl, call_time(budget))
            .await
            .map_err(|e| Error::from_store(e, self.store.metrics()))?;
        Ok(Response::new(proto::ExtendLeaseResponse {
            lease: Some(encode::lease(&lease)),
        }))
    }

    async fn get(
        &self,
        request: Request<proto::GetRequest>,
    ) -> Result<Response<proto::GetResponse>, Status> {
        let budget = call_budget(&request);
        let token_wanted = request.extensions().get::<WantLeaseToken>().is_some();
        let id = decode::get(self.caller(&request)?.tenant, request.into_inner())?;
        telemetry::record_id(&id);
        let record = self
            .store
            .get(&id, call_time(budget))
            .await
            .map_err(|e| Error::from_store(e, self.store.metrics()))?;
        let token = token_wanted.then(|| CurrentLeaseToken(record.lease.token.to_string()));
        let mut response = Response::new(proto::GetResponse {
            record: Some(encode::record(record)),
        });
        if let Some(token) = token {
            response.extensions_mut().insert(token);
        }
        Ok(response)
    }

    type WatchStream = EventStream<proto::WatchEvent>;

    async fn watch(
        &self,
        request: Request<proto::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let budget = call_budget(&request);
        let (id, asked) = decode::watch(
            self.caller(&request)?.tenant,
            request.into_inner(),
            &self.policy,
        )?;
        telemetry::record_id(&id);
        let window = wait::window(asked, budget.map(|d| d.left()));
        let subscription = self.hub.subscribe(&id).map_err(Error::from)?;
        let first = self
            .store
            .watch(&id, window, call_time(budget))
            .await
            .map_err(|e| Error::from_store(e, self.store.metrics()))?;
        let (events, stream) = tokio::sync::mpsc::channel(4);
        tokio::spawn(
            wait::follow(self.store.clone(), subscription, id, first, window, events)
                .instrument(tracing::Span::current()),
        );
        Ok(Response::new(Box::pin(ReceiverStream::new(stream))))
    }

    type WatchDueStream = EventStream<proto::DueRecord>;

    async fn watch_due(
        &self,
        request: Request<proto::WatchDueRequest>,
    ) -> Result<Response<Self::WatchDueStream>, Status> {
        let caller = self.caller(&request)?;
        let revocation = self.auth.revocation(request.metadata().as_ref(), &caller);
        let tenant = caller.tenant;
        let scope = decode::watch_due(request.into_inner())?;
        telemetry::record_scope(&scope);
        let announcements = self
            .hub
            .subscribe_due(tenant.clone(), scope.clone())
            .map_err(Error::from)?;
        let (records, stream) = tokio::sync::mpsc::channel(4);
        tokio::spawn(
            due::feed(
                self.store.clone(),
                announcements,
                (tenant, revocation),
                scope,
                self.feed,
                records,
            )
            .instrument(tracing::Span::current()),
        );
        Ok(Response::new(Box::pin(ReceiverStream::new(stream))))
    }

    async fn sweep(
        &self,
        request: Request<proto::SweepRequest>,
    ) -> Result<Response<proto::SweepResponse>, Status> {
        let caller = self.caller(&request)?;
        if !caller.admin {
            return Err(Error::PermissionDenied("Sweep needs an admin credential").into());
        }
        let req = request.into_inner();
        let limit = (req.limit > 0).then_some(u64::from(req.limit));
        // An admin sweeps its own tenant's records; the background sweeper
        // sweeps everyone's.
        let counts = self
            .sweeper
            .sweep(Sweep {
                tenant: Some(&caller.tenant),
                limit,
                dry_run: req.dry_run,
                exclusive: false,
            })
            .await
            .map_err(|e| Error::from_store(e, self.store.metrics()))?
            .unwrap_or_default();
        tracing::info!(
            dry_run = req.dry_run,
            expired_deleted = counts.expired_deleted,
            leases_reclaimed = counts.leases_reclaimed,
            retries_due = counts.retries_due,
            "sweep requested"
        );
        Ok(Response::new(proto::SweepResponse {
            expired_deleted: counts.expired_deleted,
            leases_reclaimed: counts.leases_reclaimed,
            retries_due: counts.retries_due,
        }))
    }

    async fn release_lease(
        &self,
        request: Request<proto::ReleaseLeaseRequest>,
    ) -> Result<Response<proto::ReleaseLeaseResponse>, Status> {
        let record = self
            .admin_act(request, |r| r.target.as_ref(), AdminAction::ReleaseLease)
            .await?;
        Ok(Response::new(proto::ReleaseLeaseResponse {
            record: Some(record),
        }))
    }

    async fn retry_now(
        &self,
        request: Request<proto::RetryNowRequest>,
    ) -> Result<Response<proto::RetryNowResponse>, Status> {
        let record = self
            .admin_act(request, |r| r.target.as_ref(), AdminAction::RetryNow)
            .await?;
        Ok(Response::new(proto::RetryNowResponse {
            record: Some(record),
        }))
    }

    async fn fail_permanently(
        &self,
        request: Request<proto::FailPermanentlyRequest>,
    ) -> Result<Response<proto::FailPermanentlyResponse>, Status> {
        let record = self
            .admin_act(request, |r| r.target.as_ref(), AdminAction::FailPermanently)
            .await?;
        Ok(Response::new(proto::FailPermanentlyResponse {
            record: Some(record),
        }))
    }

    async fn delete_record(
        &self,
        request: Request<proto::DeleteRecordRequest>,
    ) -> Result<Response<proto::DeleteRecordResponse>, Status> {
        let record = self.admin_delete(request).await?;
        Ok(Response::new(proto::DeleteRecordResponse {
            record: Some(record),
        }))
    }

    async fn list_records(
        &self,
        request: Request<proto::ListRecordsRequest>,
    ) -> Result<Response<proto::ListRecordsResponse>, Status> {
        Ok(Response::new(self.admin_list(request).await?))
    }

    async fn summarize(
        &self,
        request: Request<proto::SummarizeRequest>,
    ) -> Result<Response<proto::SummarizeResponse>, Status> {
        Ok(Response::new(self.admin_summary(request).await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::WaiterLimits;
    use crate::store::{Clock, StoreConfig};

    /// The Coordinator over a store that never connects: enough to build
    /// calls' futures without running them.
    fn service() -> CoordinatorService {
        let config = StoreConfig::for_migrations("postgres://nobody@127.0.0.1:1/none");
        let store = Store::new(&config, Clock::default()).unwrap();
        CoordinatorService::new(
            store.clone(),
            Arc::new(Policy::default()),
            Hub::new(
                WaiterLimits {
                    total: 10,
                    per_tenant: 10,
                },
                crate::metrics::Metrics::new(),
            ),
            Sweeper::new(store, 10),
            FeedConfig {
                offer: Duration::from_secs(1),
                poll: Duration::from_secs(1),
            },
            Arc::new(Authenticator::new(None, false).unwrap()),
        )
    }

    #[test]
    fn a_waiting_acquire_fits_in_640_bytes() {
        // Ten thousand of these are the server's memory; 640 bytes is one of
        // jemalloc's size classes, and the next is 768 (README, Memory).
        let service = service();
        let request = Request::new(proto::AcquireRequest {
            scope: "s".into(),
            key: "k".into(),
            wait: Some(prost_types::Duration {
                seconds: 30,
                nanos: 0,
            }),
            ..Default::default()
        });
        let call = service.acquire(request);
        let size = std::mem::size_of_val(&*call);
        assert!(size <= 640, "a waiting Acquire's future is {size} bytes");
        // A refused request's future is far smaller: this one was accepted.
        assert!(size > 320, "{size} bytes: the request was refused");
    }

    #[test]
    fn acquires_own_route_keeps_a_few_words_beside_the_services_future() {
        use crate::transport::DirectMethod as _;
        // What a waiting call holds besides the service's future: the
        // router's and the generated server's futures took about 2.7 KB.
        let route = AcquireRoute::new(service(), Ok, 1 << 16);
        let call = route.call(http::Request::new(tonic::body::Body::empty()));
        let size = std::mem::size_of_val(&*call);
        assert!(size <= 64, "Acquire's route keeps {size} bytes a call");
    }

    #[test]
    fn the_budget_is_the_deadline_admission_read() {
        let mut request = Request::new(());
        assert_eq!(call_budget(&request), None);
        let deadline = CallDeadline::after(Duration::from_millis(150));
        request.extensions_mut().insert(deadline);
        assert_eq!(call_budget(&request), Some(deadline));
    }
}
