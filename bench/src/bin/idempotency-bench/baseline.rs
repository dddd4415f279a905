//! The direct-SQL baseline: Acquire and Complete run straight against
//! PostgreSQL through the coordinator's own SQL functions, prepared on one
//! connection per client, for the physical limit the coordinator can at most
//! match.
//!
//! The statements are the store's own (`store::ACQUIRE_SQL`,
//! `store::COMPLETE_SQL`), which read back the whole record as the
//! coordinator does and take it apart as the coordinator does
//! (`store::record_in_rec`), and so are the decision and outcome names
//! (`store::names`).

use std::sync::Arc;

use idempotency_coordinator::domain;
use idempotency_coordinator::proto::Decision;
use idempotency_coordinator::store::{ACQUIRE_SQL, COMPLETE_SQL, names, record_in_rec};

/// The arguments the bench's Acquires share with the server's defaults:
/// lease 15 min, 10 attempts, retention 1 day, no wait, no clock offset.
const LEASE_MS: i64 = 900_000;
const MAX_ATTEMPTS: i32 = 10;
const RETENTION_MS: i64 = 86_400_000;
const BACKOFF_BASE_MS: i64 = 1000;
const BACKOFF_CAP_MS: i64 = 3_600_000;

/// One direct database connection with its prepared statements.
pub(crate) struct Sql {
    client: tokio_postgres::Client,
    acquire: tokio_postgres::Statement,
    complete: tokio_postgres::Statement,
}

impl Sql {
    /// Acquire: the decision, and the lease token on PROCEED.
    pub(crate) async fn acquire(&self, scope: &str, key: &str) -> (i32, Option<String>) {
        let row = self
            .client
            .query_one(
                &self.acquire,
                &[
                    &"default",
                    &scope,
                    &key,
                    &"",
                    &"",
                    &LEASE_MS,
                    &MAX_ATTEMPTS,
                    &RETENTION_MS,
                    &0i64,
                    &0i64,
                    &None::<chrono::DateTime<chrono::Utc>>,
                ],
            )
            .await
            .expect("idempotency_acquire");
        let decision = decision(names::decision(row.get::<_, &str>("decision")));
        let record = record_in_rec(&row).expect("the record of idempotency_acquire");
        let token =
            (decision == Decision::Proceed).then(|| record.lease.token.as_uuid().to_string());
        (decision as i32, token)
    }

    /// Complete with success, or give the key back (`release`).
    pub(crate) async fn complete(&self, scope: &str, key: &str, token: String, release: bool) {
        let token: uuid::Uuid = token.parse().expect("uuid token");
        let outcome = names::outcome(&if release {
            domain::Outcome::Release
        } else {
            domain::Outcome::Success(domain::StoredResult::default())
        });
        let result: &[u8] = br#"{"status":"ok"}"#;
        self.client
            .query_one(
                &self.complete,
                &[
                    &"default",
                    &scope,
                    &key,
                    &token,
                    &outcome,
                    &result,
                    &"application/json",
                    &200i32,
                    &"",
                    &"",
                    &false,
                    &None::<i64>,
                    &BACKOFF_BASE_MS,
                    &BACKOFF_CAP_MS,
                    &0i64,
                    &None::<chrono::DateTime<chrono::Utc>>,
                ],
            )
            .await
            .expect("idempotency_complete");
    }
}

/// A decision as the gRPC answer carries it (the service's own mapping is
/// private); a name the domain does not know counts as EXHAUSTED.
fn decision(stored: Option<domain::Decision>) -> Decision {
    match stored {
        Some(domain::Decision::Proceed) => Decision::Proceed,
        Some(domain::Decision::AlreadyDone) => Decision::AlreadyDone,
        Some(domain::Decision::InProgress) => Decision::InProgress,
        Some(domain::Decision::RetryLater) => Decision::RetryLater,
        Some(domain::Decision::Conflict) => Decision::Conflict,
        Some(domain::Decision::Exhausted) | None => Decision::Exhausted,
    }
}

/// `n` direct connections, each with the statements prepared.
pub(crate) async fn sql_drivers(url: &str, n: usize) -> Vec<Arc<Sql>> {
    let mut drivers = Vec::with_capacity(n);
    for _ in 0..n {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect to the database");
        tokio::spawn(connection);
        let acquire = client.prepare(ACQUIRE_SQL).await.expect("prepare acquire");
        let complete = client
            .prepare(COMPLETE_SQL)
            .await
            .expect("prepare complete");
        drivers.push(Arc::new(Sql {
            client,
            acquire,
            complete,
        }));
    }
    drivers
}
