//! Talking to the coordinator: connections, the requests the scenarios send,
//! and the [`Driver`] that runs Acquire and Complete over gRPC or, for the
//! baseline, straight against PostgreSQL.

use std::sync::Arc;

use idempotency_bench::recorder::{self, Timing};
use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use idempotency_coordinator::proto::{
    AcquireRequest, CompleteRequest, Success, complete_request::Outcome,
};
use tonic::transport::Channel;

use crate::baseline::Sql;
use crate::history::HistoryFile;

pub(crate) type Client = CoordinatorClient<Channel>;

pub(crate) fn acquire(scope: &str, key: &str) -> AcquireRequest {
    AcquireRequest {
        scope: scope.into(),
        key: key.into(),
        ..Default::default()
    }
}

pub(crate) fn succeed(scope: &str, key: &str, token: String) -> CompleteRequest {
    CompleteRequest {
        scope: scope.into(),
        key: key.into(),
        lease_token: token,
        outcome: Some(Outcome::Success(Success {
            result: br#"{"status":"ok"}"#.to_vec(),
            content_type: "application/json".into(),
            status_code: 200,
            result_ref: String::new(),
        })),
    }
}

pub(crate) fn waiting(scope: &str, key: &str) -> AcquireRequest {
    AcquireRequest {
        wait: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
        ..acquire(scope, key)
    }
}

/// `n` HTTP/2 connections to each of `targets`, interleaved (the first to
/// each target, then the second to each, …), so clients taken in turn are
/// spread evenly over the targets.
pub(crate) async fn connect(targets: &[String], n: usize) -> Vec<Client> {
    let mut clients = Vec::with_capacity(n.max(1) * targets.len());
    for _ in 0..n.max(1) {
        for target in targets {
            let channel = Channel::from_shared(format!("http://{target}"))
                .expect("a valid target address")
                .tcp_nodelay(true)
                .connect()
                .await
                .unwrap_or_else(|e| panic!("cannot connect to {target}: {e}"));
            clients.push(CoordinatorClient::new(channel));
        }
    }
    clients
}

/// What the scenarios drive: the coordinator over gRPC, or (for the
/// baseline) PostgreSQL directly through the same SQL functions.
#[derive(Clone)]
pub(crate) enum Driver {
    Grpc(Client),
    Sql(Arc<Sql>),
    /// Over gRPC, every call written to a history (with a request_id on
    /// each Acquire).
    Recorded(Client, Arc<HistoryFile>),
}

impl Driver {
    /// Acquire: the decision, and the lease token on PROCEED.
    pub(crate) async fn acquire(&mut self, scope: &str, key: &str) -> (i32, Option<String>) {
        match self {
            Driver::Grpc(c) => {
                let answer = c
                    .acquire(acquire(scope, key))
                    .await
                    .expect("acquire")
                    .into_inner();
                (answer.decision, answer.lease.map(|l| l.token))
            }
            Driver::Sql(sql) => sql.acquire(scope, key).await,
            Driver::Recorded(c, history) => {
                let req = AcquireRequest {
                    request_id: uuid::Uuid::new_v4().simple().to_string(),
                    ..acquire(scope, key)
                };
                let start_us = recorder::now_us();
                let answer = c
                    .acquire(req.clone())
                    .await
                    .map(tonic::Response::into_inner);
                let t = Timing {
                    start_us,
                    end_us: recorder::now_us(),
                    deadline: None,
                };
                history.write(recorder::acquire(&req, t, Some(answer.as_ref())));
                let answer = answer.expect("acquire");
                (answer.decision, answer.lease.map(|l| l.token))
            }
        }
    }

    /// Complete with success, or give the key back (`release`).
    pub(crate) async fn complete(&mut self, scope: &str, key: &str, token: String, release: bool) {
        match self {
            Driver::Grpc(c) => {
                let mut req = succeed(scope, key, token);
                if release {
                    req.outcome =
                        Some(Outcome::Release(idempotency_coordinator::proto::Release {}));
                }
                c.complete(req).await.expect("complete");
            }
            Driver::Sql(sql) => sql.complete(scope, key, token, release).await,
            Driver::Recorded(c, history) => {
                let mut req = succeed(scope, key, token);
                if release {
                    req.outcome =
                        Some(Outcome::Release(idempotency_coordinator::proto::Release {}));
                }
                let start_us = recorder::now_us();
                let answer = c
                    .complete(req.clone())
                    .await
                    .map(tonic::Response::into_inner);
                let t = Timing {
                    start_us,
                    end_us: recorder::now_us(),
                    deadline: None,
                };
                history.write(recorder::complete(&req, t, Some(answer.as_ref())));
                answer.expect("complete");
            }
        }
    }
}
