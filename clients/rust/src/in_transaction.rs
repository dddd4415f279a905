//! `run_once_in_transaction`: the work's writes and the record's SUCCEEDED
//! committed together, in the caller's own PostgreSQL transaction
//! (`docs/in-transaction.md`).
//!
//! Acquire goes to the coordinator as in `run_once` (waiting, replays and
//! fencing unchanged). The work runs in a savepoint of the caller's
//! transaction; on success the library calls `idempotency_complete_in_tx`
//! in that savepoint and releases it, and the caller commits. A failed work
//! rolls the savepoint back and is reported with a Complete, as in
//! `run_once`.

use std::fmt::Display;
use std::time::SystemTime;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_postgres::Transaction;
use tokio_postgres::error::SqlState;

use crate::client::Client;
use crate::codec::{Codec, Json};
use crate::error::{CallError, RunOnceError, WorkError};
use crate::lease::{Lease, under_heartbeat};
use crate::proto::{Failure, Record, Release, Status, Success, complete_request::Outcome};
use crate::run::{Acquired, Done, Fingerprint, completion, heartbeat_interval};
use crate::{Code, RunOptions};

/// Where the coordinator's records are, seen from the caller's database
/// session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InDatabase {
    /// The tenant the coordinator files this caller's records under: the
    /// one its credentials name, `default` when authentication is off. The
    /// completion runs on the caller's connection, not through the
    /// coordinator, so it names the record itself.
    pub tenant: String,
    /// The schema the coordinator was migrated into, when the caller's
    /// `search_path` does not list it; `None` calls the function unqualified.
    pub schema: Option<String>,
}

impl Default for InDatabase {
    fn default() -> Self {
        InDatabase {
            tenant: "default".to_owned(),
            schema: None,
        }
    }
}

/// A [`Client`] whose completions run in the caller's own transaction, on
/// the database that holds the coordinator's records.
#[derive(Debug, Clone)]
pub struct DatabaseClient<'c> {
    client: &'c Client,
    place: InDatabase,
}

impl Client {
    /// This client, completing in the caller's transactions on the
    /// database `place` describes.
    pub fn in_database(&self, place: InDatabase) -> DatabaseClient<'_> {
        DatabaseClient {
            client: self,
            place,
        }
    }
}

/// The media type of the stored JSON (`Json`'s).
const CONTENT_TYPE: &str = "application/json";

/// The name of the savepoint the work runs in.
const SAVEPOINT: &str = "idempotency_work";

impl DatabaseClient<'_> {
    /// Runs `work` exactly once for (`scope`, `key`) inside `tx`, its value
    /// stored as JSON by `idempotency_complete_in_tx` in the same
    /// transaction: the work's writes and the record's SUCCEEDED commit or
    /// roll back together.
    ///
    /// The work gets a savepoint of `tx` and the [`Lease`]; its writes go
    /// through the savepoint. On success the completion is the last
    /// statement the library runs, and **the caller commits `tx`**: until
    /// then the record's row is locked by `tx`, so no other caller can take
    /// over. If the commit fails, nothing happened: the lease runs out and
    /// the key's next caller runs the work. Commit promptly: a call that
    /// needs this record's lock meanwhile (an Acquire that would wait for it
    /// or take it over, a Complete) waits at most the server's 300 ms lock
    /// limit and answers UNAVAILABLE with a retry delay; retried after the
    /// commit, it replays this result.
    ///
    /// On every `Err` the savepoint was rolled back, so the work's writes
    /// are gone and `tx` may still commit the caller's writes that do not
    /// depend on the work. A holder whose lease was taken over gets
    /// [`RunOnceError::LeaseLost`] (the database refused its completion:
    /// fencing by the row lock): another holder did the work, so it must
    /// not commit writes that depend on it (roll `tx` back). A
    /// failed work is reported with a Complete and returned in
    /// [`RunOnceError::Work`]; a failed statement on `tx` in
    /// [`RunOnceError::Database`] (the lease is released).
    pub async fn run_once_in_transaction<T, E, F>(
        &self,
        tx: &mut Transaction<'_>,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
        options: &RunOptions,
        work: F,
    ) -> Result<Done<T>, RunOnceError<E, T>>
    where
        T: Serialize + DeserializeOwned,
        E: Display,
        F: AsyncFnOnce(&mut Transaction<'_>, Lease) -> Result<T, WorkError<E>>,
    {
        let leased = self
            .client
            .lease_for_run(&Json, scope, key, fingerprint, options)
            .await;
        let (lease, record) = match leased {
            Acquired::Granted { lease, record } => (lease, record),
            Acquired::Answered(outcome) => return outcome,
        };
        let token = lease.token().to_owned();
        let mut savepoint = match tx.savepoint(SAVEPOINT).await {
            Ok(savepoint) => savepoint,
            Err(error) => return Err(self.released(scope, key, &token, options, error).await),
        };
        let interval = heartbeat_interval(options);
        let sp = &mut savepoint;
        let ran = under_heartbeat(lease, interval, options.when_lease_lost, move |lease| {
            work(sp, lease)
        })
        .await;
        let value = match ran {
            Ok(Ok(value)) => value,
            // Dropped for a lost lease: nothing to report.
            Err(lost) => {
                let _ = savepoint.rollback().await;
                return Err(lost);
            }
            Ok(Err(failure)) => {
                let _ = savepoint.rollback().await;
                return Err(self.report(scope, key, &token, options, Err(failure)).await);
            }
        };
        let bytes = match Codec::<T>::encode(&Json, &value) {
            Ok(bytes) => bytes,
            Err(_) => {
                let _ = savepoint.rollback().await;
                return Err(self.report(scope, key, &token, options, Ok(value)).await);
            }
        };
        let completed = self
            .complete_in(&savepoint, scope, key, &token, &bytes)
            .await;
        let completed = match completed {
            Ok(row) => match savepoint.commit().await {
                Ok(()) => Ok(row),
                // The savepoint outlives a RELEASE that failed: roll it back,
                // so that the work's writes cannot commit with `tx`.
                Err(error) => {
                    let _ = tx
                        .batch_execute(&format!("ROLLBACK TO SAVEPOINT {SAVEPOINT}"))
                        .await;
                    Err(error)
                }
            },
            Err(error) => {
                let _ = savepoint.rollback().await;
                Err(error)
            }
        };
        match completed {
            Ok(row) => Ok(Done {
                value,
                replayed: false,
                record: succeeded(record, bytes, CONTENT_TYPE, &row),
            }),
            Err(error) => Err(self.refused(scope, key, &token, options, error).await),
        }
    }

    /// `idempotency_complete_in_tx` on the caller's savepoint.
    async fn complete_in(
        &self,
        savepoint: &Transaction<'_>,
        scope: &str,
        key: &str,
        token: &str,
        result: &[u8],
    ) -> Result<tokio_postgres::Row, tokio_postgres::Error> {
        let function = match &self.place.schema {
            Some(schema) => format!(
                "\"{}\".idempotency_complete_in_tx",
                schema.replace('"', "\"\"")
            ),
            None => "idempotency_complete_in_tx".to_owned(),
        };
        let sql = format!(
            "SELECT status, fencing_token, completed_at, expires_at \
               FROM {function}($1::text, $2::text, $3::text, $4::text::uuid, $5::bytea, \
                               $6::text, $7::integer, $8::text)"
        );
        savepoint
            .query_one(
                &sql,
                &[
                    &self.place.tenant,
                    &scope,
                    &key,
                    &token,
                    &result,
                    &CONTENT_TYPE,
                    &0_i32,
                    &"",
                ],
            )
            .await
    }

    /// What a completion the database refused (or failed) answers:
    /// LEASE_LOST as [`RunOnceError::LeaseLost`], the other refusals as the
    /// Complete's own errors would be, and any other failure as
    /// [`RunOnceError::Database`] with the lease released (the work's
    /// writes were rolled back: nothing happened).
    async fn refused<T, E>(
        &self,
        scope: &str,
        key: &str,
        token: &str,
        options: &RunOptions,
        error: tokio_postgres::Error,
    ) -> RunOnceError<E, T> {
        let message = error
            .as_db_error()
            .map_or_else(|| error.to_string(), |db| db.message().to_owned());
        let refusal = |code: Code, reason: &str| {
            RunOnceError::Call(CallError {
                code,
                message: message.clone(),
                reason: Some(reason.to_owned()),
                field_violations: Vec::new(),
                retry_after: None,
            })
        };
        match error.code().map(SqlState::code) {
            Some("IK002") => RunOnceError::LeaseLost,
            Some("IK001") => {
                // A wrong tenant, say: the lease is still held, give it back.
                let answer = refusal(Code::NotFound, "RECORD_NOT_FOUND");
                self.send(scope, key, token, options, Outcome::Release(Release {}))
                    .await;
                answer
            }
            Some("IK003") => refusal(Code::FailedPrecondition, "ALREADY_COMPLETED"),
            // An argument over its limit (the result's size): the same
            // value is refused every time, so the key fails for good.
            Some("22023") => {
                let answer = refusal(Code::InvalidArgument, "RESULT_REFUSED");
                let failure = Outcome::Failure(Failure {
                    error: format!("the result was refused: {message}"),
                    permanent: true,
                    retry_after: None,
                });
                self.send(scope, key, token, options, failure).await;
                answer
            }
            _ => self.released(scope, key, token, options, error).await,
        }
    }

    /// Gives the lease back (nothing irreversible happened: the work's
    /// writes were not committed) and answers `error`.
    async fn released<T, E>(
        &self,
        scope: &str,
        key: &str,
        token: &str,
        options: &RunOptions,
        error: tokio_postgres::Error,
    ) -> RunOnceError<E, T> {
        self.send(scope, key, token, options, Outcome::Release(Release {}))
            .await;
        RunOnceError::Database(Box::new(error))
    }

    /// Completes the lease with `outcome`, best effort: if it fails too,
    /// the lease runs out.
    async fn send(
        &self,
        scope: &str,
        key: &str,
        token: &str,
        options: &RunOptions,
        outcome: Outcome,
    ) {
        let _ = self
            .client
            .complete_for_run(scope, key, token, outcome, options)
            .await;
    }

    /// Reports a failed work (or a value that cannot be encoded) with a
    /// Complete, as `run_once` does, and answers what `run_once` would.
    async fn report<T, E>(
        &self,
        scope: &str,
        key: &str,
        token: &str,
        options: &RunOptions,
        outcome: Result<T, WorkError<E>>,
    ) -> RunOnceError<E, T>
    where
        T: Serialize + DeserializeOwned,
        E: Display,
    {
        let (outcome, answer) = completion(&Json, outcome);
        // The work's own error is what the caller needs to hear, whether or
        // not the coordinator took the failure.
        self.send(scope, key, token, options, outcome).await;
        match answer {
            Err(error) => error,
            Ok(_) => RunOnceError::Call(CallError::protocol("a failure reported as a value")),
        }
    }
}

/// The Acquire's record as the completion left it (in the caller's
/// transaction, not committed yet).
fn succeeded(
    mut record: Record,
    result: Vec<u8>,
    content_type: &str,
    row: &tokio_postgres::Row,
) -> Record {
    let at = |i: usize| {
        row.try_get::<_, Option<SystemTime>>(i)
            .ok()
            .flatten()
            .map(prost_types::Timestamp::from)
    };
    record.status = Status::Succeeded as i32;
    record.result = Some(Success {
        result,
        content_type: content_type.to_owned(),
        ..Success::default()
    });
    record.lease_expires_at = None;
    record.next_retry_at = None;
    record.completed_at = at(2);
    record.updated_at = at(2);
    record.expires_at = at(3);
    if let Ok(fencing) = row.try_get::<_, i64>(1) {
        record.fencing_token = u64::try_from(fencing).unwrap_or_default();
    }
    record
}
