//! A server process on a database of its own, clients of it, the bare
//! generated stub, and waiting on a condition with a deadline.

use std::future::Future;
use std::time::Duration;

use idempotency_client::proto::coordinator_client::CoordinatorClient;
use idempotency_client::proto::{AcquireRequest, AcquireResponse, GetRequest, Record};
use idempotency_client::{Client, ClientOptions};
use tonic::transport::Channel;

use crate::database::TestDatabase;
pub use crate::polling::eventually;
use crate::process::ServerProcess;

/// The server binary serving a fresh database, until dropped (the server
/// is killed first, then the database dropped).
pub struct Fixture {
    pub server: ServerProcess,
    /// Kept for its drop, which drops the database.
    _db: TestDatabase,
}

impl Fixture {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// With extra `serve` flags.
    pub async fn start_with(flags: &[&str]) -> Self {
        let db = TestDatabase::create().await;
        let server = ServerProcess::start_with(&db.url, flags).await;
        Fixture { server, _db: db }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// A client with the default options.
    pub async fn client(&self) -> Client {
        self.client_with(ClientOptions::default()).await
    }

    pub async fn client_with(&self, options: ClientOptions) -> Client {
        Client::connect(self.endpoint(), options)
            .await
            .expect("connect the client")
    }

    /// The bare generated stub, with none of the library around it.
    pub async fn stub(&self) -> CoordinatorClient<Channel> {
        CoordinatorClient::connect(self.endpoint())
            .await
            .expect("connect the stub")
    }

    /// The record of (scope, key), read with a bare Get.
    pub async fn record(&self, scope: &str, key: &str) -> Record {
        self.stub()
            .await
            .get(GetRequest {
                scope: scope.into(),
                key: key.into(),
            })
            .await
            .expect("get the record")
            .into_inner()
            .record
            .expect("a record")
    }

    /// One bare Acquire that answers at once.
    pub async fn bare_acquire(
        &self,
        scope: &str,
        key: &str,
        lease_ttl: Duration,
        request_id: &str,
    ) -> AcquireResponse {
        self.stub()
            .await
            .acquire(AcquireRequest {
                scope: scope.into(),
                key: key.into(),
                lease_ttl: Some(lease_ttl.try_into().unwrap()),
                request_id: request_id.into(),
                ..AcquireRequest::default()
            })
            .await
            .expect("acquire")
            .into_inner()
    }
}

/// `future`, or a test failure after `deadline`.
pub async fn within<T>(what: &str, deadline: Duration, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(deadline, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {deadline:?}"))
}

/// A unique key per test.
pub fn fresh_key() -> String {
    format!("key-{}", uuid::Uuid::new_v4().simple())
}
