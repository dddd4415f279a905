//! Steady load on a server while Prometheus scrapes it: Acquires and
//! Completes, replays, refused Completes, lookups of missing keys, leases
//! taken over after running out, and a Watch held open, so that every
//! panel has something to show.

use std::time::Duration;

use idempotency_coordinator::proto::{self, coordinator_client::CoordinatorClient};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::helpers::{TestServer, acquire, complete, secs, success};

pub struct Load {
    stop: CancellationToken,
    tasks: JoinSet<()>,
}

impl Load {
    pub async fn stop(mut self) {
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
    }
}

async fn cycles(mut client: CoordinatorClient<Channel>, stop: CancellationToken) {
    let mut i = 0u64;
    while !stop.is_cancelled() {
        i += 1;
        let key = format!("order-{i}");
        if let Ok(answer) = client.acquire(acquire("load", &key)).await {
            let token = answer
                .into_inner()
                .lease
                .map(|l| l.token)
                .unwrap_or_default();
            let _ = client
                .complete(complete("load", &key, &token, success(b"{}")))
                .await;
        }
        // A replay, a refused Complete, a missing key.
        let _ = client.acquire(acquire("load", &key)).await;
        let stale = uuid::Uuid::new_v4().to_string();
        let _ = client
            .complete(complete("load", &key, &stale, success(b"{}")))
            .await;
        let get = proto::GetRequest {
            scope: "load".into(),
            key: format!("missing-{i}"),
        };
        let _ = client.get(get).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn takeovers(mut client: CoordinatorClient<Channel>, stop: CancellationToken) {
    let mut i = 0u64;
    while !stop.is_cancelled() {
        i += 1;
        let mut first = acquire("takeover", &format!("job-{i}"));
        first.lease_ttl = secs(1);
        let _ = client.acquire(first.clone()).await;
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let _ = client.acquire(first).await;
    }
}

async fn watching(mut client: CoordinatorClient<Channel>, stop: CancellationToken) {
    let _ = client.acquire(acquire("watched", "held")).await;
    while !stop.is_cancelled() {
        let request = proto::WatchRequest {
            scope: "watched".into(),
            key: "held".into(),
            timeout: secs(30),
        };
        if let Ok(stream) = client.watch(request).await {
            let mut stream = stream.into_inner();
            tokio::select! {
                () = stop.cancelled() => return,
                _ = async { while let Ok(Some(_)) = stream.message().await {} } => {}
            }
        }
    }
}

pub async fn start(server: &TestServer) -> Load {
    let stop = CancellationToken::new();
    let mut tasks = JoinSet::new();
    for _ in 0..2 {
        tasks.spawn(cycles(server.client.clone(), stop.clone()));
    }
    tasks.spawn(takeovers(server.client.clone(), stop.clone()));
    tasks.spawn(watching(server.client.clone(), stop.clone()));
    Load { stop, tasks }
}
