//! The generated `Coordinator` trait implemented: decode the request into a
//! validated command, ask the store, encode the answer. Decisions are data
//! (`Decision`); only calls that cannot be answered become a `Status`, through
//! `crate::error`.

mod admin;
mod decode;
mod due;
mod encode;
mod wait;

pub use due::FeedConfig;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use crate::auth::{Authenticator, Caller};
use crate::domain::{AcquireCommand, Acquired, AdminAction, Policy};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::notify::{Hub, Subscription};
use crate::proto;
use crate::proto::acquire_request::RequestFingerprint;
use crate::proto::coordinator_server::Coordinator;
use crate::store::{CallTime, Store};
use crate::sweeper::{Sweep, Sweeper};
use crate::telemetry;
use crate::transport::{CallDeadline, answer_later};

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
    /// The same store, shared: what a parked Acquire keeps (a pointer
    /// rather than the store's 112 bytes, in each of thousands of waiters).
    parked_store: Arc<Store>,
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
            parked_store: Arc::new(store.clone()),
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
    /// A decoded Acquire, its large `json_payload` canonicalised on the
    /// blocking pool.
    async fn acquire_command(
        &self,
        request: Request<proto::AcquireRequest>,
    ) -> Result<AcquireCommand, Error> {
        let budget = call_budget(&request);
        let tenant = self.caller(&request)?.tenant;
        let mut message = request.into_inner();
        let json = match &mut message.request_fingerprint {
            Some(RequestFingerprint::JsonPayload(text))
                if text.len() > decode::INLINE_JSON_BYTES =>
            {
                Some(decode::json_fingerprint(std::mem::take(text)).await)
            }
            _ => None,
        };
        let mut cmd = decode::acquire_with(tenant, message, &self.policy, json)?;
        cmd.answer_by = budget.map(|d| d.0.into_std());
        telemetry::record_id(&cmd.id);
        Ok(cmd)
    }

    /// Parks an Acquire that may wait `window`: the call is answered at
    /// once with its headers and an [`AnswerLater`] holding its future (the
    /// command, the hub's subscription and the wait's state, no request and
    /// no handler's future), which decides, waits and answers when the
    /// answer's body polls it; a caller that goes away drops it.
    fn park(
        &self,
        cmd: AcquireCommand,
        window: Duration,
    ) -> Result<Response<proto::AcquireResponse>, Error> {
        let subscription = self.hub.subscribe(&cmd.id)?;
        let store = Arc::clone(&self.parked_store);
        let later = answer_later(parked(store, subscription, cmd, window));
        let mut response = Response::new(proto::AcquireResponse::default());
        response.extensions_mut().insert(later);
        Ok(response)
    }
}

/// A parked Acquire: see [`CoordinatorService::park`]. Its future is what
/// a waiting call holds for its whole window.
fn parked(
    store: Arc<Store>,
    subscription: Subscription,
    cmd: AcquireCommand,
    window: Duration,
) -> impl std::future::Future<Output = Result<proto::AcquireResponse, Status>> + Send {
    wait::acquire(store, subscription, cmd, window, |store, cmd, acquired| {
        acquired
            .map(|acquired| answered(store.metrics(), cmd, acquired))
            .map_err(|e| Status::from(Error::from_store(e, store.metrics())))
    })
}

/// An Acquire's decision as its answer, counted and traced.
fn answered(metrics: &Metrics, cmd: &AcquireCommand, acquired: Acquired) -> proto::AcquireResponse {
    metrics.acquired(
        acquired.decision,
        cmd.id.scope.as_str(),
        acquired.took_over(),
    );
    tracing::debug!(scope = cmd.id.scope.as_str(), decision = ?acquired.decision, "acquire");
    let answer = encode::acquired(acquired);
    telemetry::record_decision(answer.decision().as_str_name());
    answer
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
    /// Decided at once, or, for a caller that may wait, parked
    /// ([`CoordinatorService::park`]) and answered when decided.
    async fn acquire(
        &self,
        request: Request<proto::AcquireRequest>,
    ) -> Result<Response<proto::AcquireResponse>, Status> {
        let cmd = self.acquire_command(request).await?;
        let answer_by = cmd.answer_by.map(Instant::from_std);
        let left = answer_by.map(|at| at.saturating_duration_since(Instant::now()));
        match Some(wait::window(cmd.wait, left)).filter(|w| !w.is_zero()) {
            Some(window) => Ok(self.park(cmd, window)?),
            None => {
                let time = CallTime::until(answer_by);
                let acquired = self
                    .store
                    .acquire(&cmd, Duration::ZERO, time)
                    .await
                    .map_err(|e| Error::from_store(e, self.store.metrics()))?;
                Ok(Response::new(answered(
                    self.store.metrics(),
                    &cmd,
                    acquired,
                )))
            }
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

    #[tokio::test]
    async fn a_parked_acquire_fits_in_640_bytes() {
        // Ten thousand of these are the server's memory; 640 bytes is one of
        // jemalloc's size classes (docs/performance.md, Memory): the command,
        // the subscription, the store's handle and the sleeping state, each
        // once. The answer's body holds it boxed, as it is.
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
        let cmd = service.acquire_command(request).await.unwrap();
        let subscription = service.hub.subscribe(&cmd.id).unwrap();
        let window = Duration::from_secs(30);
        let store = Arc::clone(&service.parked_store);
        let waiter = parked(store, subscription, cmd, window);
        let size = std::mem::size_of_val(&waiter);
        assert!(size <= 640, "a parked Acquire's future is {size} bytes");
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
