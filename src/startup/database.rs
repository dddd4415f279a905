//! Waiting for the database at start: one attempt, then retries with a
//! growing pause, each failure said, for up to `--database-wait`, migrating
//! when asked; and the gate that answers Coordinator calls UNAVAILABLE
//! until the database is ready.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tonic::Status;

use super::StartupError;
use crate::error::Error;
use crate::store::{self, ConnectTarget, Store, StoreError, migrate};
use crate::telemetry::cause_chain;

/// The pause after the first failed attempt to reach the database at
/// start; it doubles with each attempt, up to [`MAX_DATABASE_RETRY`].
const FIRST_DATABASE_RETRY: Duration = Duration::from_millis(250);
/// The longest pause between attempts to reach the database at start.
const MAX_DATABASE_RETRY: Duration = Duration::from_secs(5);
/// The longest one attempt to connect may take (a host that drops packets
/// never refuses).
const DATABASE_ATTEMPT_LIMIT: Duration = Duration::from_secs(10);

/// Waits until the database at `pg` answers and, with `migrate`, applies
/// its pending migrations through `store`: one attempt, then retries after
/// 250 ms doubling to 5 s, each failure logged with where it tried and why,
/// for at most `bound` (`None`: forever; zero: the one attempt).
///
/// Every connection failure is retried, refusals by the server included (no
/// such database or role, a refused password): those are fixed on the
/// database's side, and a database being provisioned shows them for a while.
/// What retrying cannot fix ends the wait at once: a migration that fails
/// other than by losing its connection. (A URL that cannot work never gets
/// here: [`store::connect_error::check_url`] refuses it first.)
pub async fn wait_for_database(
    store: &Store,
    pg: &crate::store::Postgres,
    migrate: bool,
    bound: Option<Duration>,
) -> Result<(), StartupError> {
    let target = ConnectTarget::of(pg);
    let started = Instant::now();
    let mut pause = FIRST_DATABASE_RETRY;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let failure = match attempt_database(store, pg, migrate).await {
            Ok(()) => {
                tracing::info!(
                    attempts = attempt,
                    waited = ?started.elapsed(),
                    host = %target.places(),
                    database = %target.database(),
                    user = %target.user(),
                    "database ready"
                );
                return Ok(());
            }
            Err(Attempt::Fatal(e)) => return Err(e),
            Err(Attempt::Retry(failure)) => failure,
        };
        let waited = started.elapsed();
        let left = bound.map(|bound| bound.saturating_sub(waited));
        if left == Some(Duration::ZERO) {
            return Err(if attempt == 1 {
                StartupError::Unreachable(failure)
            } else {
                StartupError::GaveUp {
                    attempts: attempt,
                    waited,
                    last: failure,
                }
            });
        }
        let retry_in = left.map_or(pause, |left| left.min(pause));
        tracing::warn!(
            attempt,
            error = %cause_chain(failure.as_ref()),
            host = %target.places(),
            database = %target.database(),
            user = %target.user(),
            ?retry_in,
            "waiting for the database"
        );
        tokio::time::sleep(retry_in).await;
        pause = (pause * 2).min(MAX_DATABASE_RETRY);
    }
}

/// How one attempt to reach (and migrate) the database failed.
enum Attempt {
    /// Worth another attempt.
    Retry(Box<dyn std::error::Error + Send + Sync>),
    /// Not worth one.
    Fatal(StartupError),
}

/// Connects once, migrates when asked, and learns whether the database is
/// a Citus coordinator.
async fn attempt_database(
    store: &Store,
    pg: &crate::store::Postgres,
    migrate: bool,
) -> Result<(), Attempt> {
    store::connect_error::probe(pg, DATABASE_ATTEMPT_LIMIT)
        .await
        .map_err(|e| Attempt::Retry(Box::new(e)))?;
    if migrate {
        migrate_database(store).await?;
    }
    store.inspect().await.map_err(|e| match e {
        StoreError::Unavailable(e) => Attempt::Retry(e),
        other => Attempt::Fatal(StartupError::Database(other)),
    })?;
    Ok(())
}

/// Applies what the database lacks (`store::migrate`).
async fn migrate_database(store: &Store) -> Result<(), Attempt> {
    match store.migrate().await {
        Ok(applied) if applied.is_empty() => tracing::info!("database schema is current"),
        Ok(applied) => tracing::info!(?applied, "applied migrations"),
        // The connection went away between the probe and the migration,
        // or during it (which rolled it back).
        Err(migrate::MigrateError::Connect(e)) => return Err(Attempt::Retry(Box::new(e))),
        Err(migrate::MigrateError::Database(e)) => {
            return Err(match StoreError::from(e) {
                StoreError::Unavailable(e) => Attempt::Retry(e),
                StoreError::Query(e) => {
                    Attempt::Fatal(StartupError::Migrate(migrate::MigrateError::Database(e)))
                }
                other => Attempt::Fatal(StartupError::Database(other)),
            });
        }
        Err(e) => return Err(Attempt::Fatal(e.into())),
    }
    Ok(())
}

/// What a Coordinator call hears while the server waits for the database
/// at start.
#[derive(Debug, thiserror::Error)]
#[error("the server is still waiting for the database at start-up")]
struct WaitingForDatabase;

/// The interceptor in front of the Coordinator: calls are answered
/// UNAVAILABLE ([`WaitingForDatabase`]) until `up` is set.
pub(super) fn gate(
    up: Arc<AtomicBool>,
) -> impl Fn(tonic::Request<()>) -> Result<tonic::Request<()>, Status> + Clone + Send + Sync + 'static
{
    move |request| {
        if up.load(Ordering::Acquire) {
            Ok(request)
        } else {
            Err(Status::from(Error::Unavailable(Box::new(
                WaitingForDatabase,
            ))))
        }
    }
}
