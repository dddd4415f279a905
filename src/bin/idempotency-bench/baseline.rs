//! The direct-SQL baseline: Acquire and Complete run straight against
//! PostgreSQL through the coordinator's own SQL functions, prepared on one
//! connection per client, for the physical limit the coordinator can at most
//! match.
//!
//! The decision and outcome names come from the library's domain
//! (`Decision::from_stored`, `Outcome::stored_name`); the statements are
//! copies, since the store keeps its own (`store::calls`) private.

use std::sync::Arc;

use idempotency_coordinator::domain;
use idempotency_coordinator::proto::Decision;

use crate::client::Driver;

/// Statements the direct-SQL baseline runs: the coordinator's own SQL
/// functions, called the way the store calls them.
/// Both read back the whole record, as the coordinator does.
const SQL_ACQUIRE: &str = "SELECT a.decision, a.retry_after_ms, (a.rec).* \
     FROM idempotency_acquire('default', $1, $2, '', '', 900000, 10, 86400000, 0, 0) a";
const SQL_COMPLETE: &str = "SELECT c.outcome, (c.rec).* FROM idempotency_complete('default', $1, $2, \
     $3, $4, $5, 'application/json', 200, '', '', false, NULL, 1000, 3600000, 0) c";

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
            .query_one(&self.acquire, &[&scope, &key])
            .await
            .expect("idempotency_acquire");
        let decision = decision(domain::Decision::from_stored(row.get::<_, &str>(0)));
        let token = (decision == Decision::Proceed)
            .then(|| row.get::<_, uuid::Uuid>("lease_token").to_string());
        (decision as i32, token)
    }

    /// Complete with success, or give the key back (`release`).
    pub(crate) async fn complete(&self, scope: &str, key: &str, token: String, release: bool) {
        let token: uuid::Uuid = token.parse().expect("uuid token");
        let outcome = if release {
            domain::Outcome::Release
        } else {
            domain::Outcome::Success(domain::StoredResult::default())
        }
        .stored_name();
        let result: &[u8] = br#"{"status":"ok"}"#;
        self.client
            .query_one(&self.complete, &[&scope, &key, &token, &outcome, &result])
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
pub(crate) async fn sql_drivers(url: &str, n: usize) -> Vec<Driver> {
    let mut drivers = Vec::with_capacity(n);
    for _ in 0..n {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect to the database");
        tokio::spawn(connection);
        let acquire = client.prepare(SQL_ACQUIRE).await.expect("prepare acquire");
        let complete = client
            .prepare(SQL_COMPLETE)
            .await
            .expect("prepare complete");
        drivers.push(Driver::Sql(Arc::new(Sql {
            client,
            acquire,
            complete,
        })));
    }
    drivers
}
