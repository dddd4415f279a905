//! Why the store could not answer, and which database errors go away on
//! their own (UNAVAILABLE, safe to retry) and which do not; and which say
//! a prepared statement must be prepared anew.

use std::time::Duration;

use tokio_postgres::error::SqlState;

use crate::domain::Refusal;

/// Why the store could not answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An expected refusal: the caller must act on it.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// No connection could be had in time, or it broke mid-call. Retrying
    /// later is safe: Acquire with a request_id and Complete are idempotent.
    #[error("the database is unavailable")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The database answered with an error that retrying will not fix.
    #[error("a database call failed")]
    Query(#[source] tokio_postgres::Error),
    /// A row that does not match what the SQL functions promise.
    #[error("the database returned an unexpected row: {0}")]
    Corrupt(String),
    /// The database URL or pool settings cannot be used.
    #[error("invalid database configuration")]
    Config(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(error: tokio_postgres::Error) -> Self {
        if is_transient(&error) {
            StoreError::Unavailable(Box::new(error))
        } else {
            StoreError::Query(error)
        }
    }
}

impl StoreError {
    /// A deadlock, a serialization failure or a row lock not had within
    /// `lock_timeout` (a record locked by an application's open transaction,
    /// `mux::LOCK_LIMIT`): the statement rolled back whole, and running its
    /// work again can succeed.
    pub(super) fn is_conflict(&self) -> bool {
        let StoreError::Unavailable(source) = self else {
            return false;
        };
        source
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(tokio_postgres::Error::as_db_error)
            .is_some_and(|db| {
                // Not 40003 (statement completion unknown): that one may
                // have committed.
                matches!(
                    *db.code(),
                    SqlState::T_R_SERIALIZATION_FAILURE
                        | SqlState::T_R_DEADLOCK_DETECTED
                        | SqlState::LOCK_NOT_AVAILABLE
                )
            })
    }

    /// A unique violation: the statement tried to create a record that
    /// another transaction created after the statement looked for it (a
    /// batch's new keys, `sql/functions/batches.sql`). The statement rolled
    /// back whole; running its calls again decides on the other's record.
    pub(super) fn is_key_created_meanwhile(&self) -> bool {
        matches!(self, StoreError::Query(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION))
    }
}

/// Lost connections, server shutdowns and resource exhaustion go away on their
/// own; anything else is a bug or a broken schema.
fn is_transient(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    if let Some(db) = error.as_db_error() {
        let class = &db.code().code()[..2];
        // 08 connection exception, 53 insufficient resources, 57 operator
        // intervention (shutdown, terminated backend), 40 serialization
        // failure or deadlock; and 55P03, a row lock not had within
        // lock_timeout: the lock's holder (an application's transaction)
        // ends on its own.
        return matches!(class, "08" | "53" | "57" | "40")
            || *db.code() == SqlState::LOCK_NOT_AVAILABLE;
    }
    std::error::Error::source(error).is_some_and(|s| s.is::<std::io::Error>())
}

/// A statement that got no answer in time.
#[derive(Debug, thiserror::Error)]
#[error("the database did not answer within {0:?}")]
pub struct QueryTimeout(pub(super) Duration);

/// A call whose caller's deadline passed before its statement was sent:
/// the statement is not sent at all.
#[derive(Debug, thiserror::Error)]
#[error("the call's deadline passed before its statement was sent")]
pub struct PastDeadline;

impl StoreError {
    /// What metrics call this failure (`None` for a refusal, which is an
    /// answer): the kind of `Unavailable` is read from its cause chain (a
    /// statement past `--query-timeout`, or cancelled by PostgreSQL for
    /// running past its statement timeout or its deadline, or whose deadline
    /// passed before it was sent; no pooled connection within the wait;
    /// anything else).
    pub fn kind(&self) -> Option<crate::metrics::DatabaseError> {
        use crate::metrics::DatabaseError as Kind;
        Some(match self {
            StoreError::Refused(_) => return None,
            StoreError::Unavailable(source) => {
                let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
                while let Some(e) = cause {
                    let cancelled = e
                        .downcast_ref::<tokio_postgres::Error>()
                        .and_then(tokio_postgres::Error::as_db_error)
                        .is_some_and(|db| *db.code() == SqlState::QUERY_CANCELED);
                    if cancelled || e.is::<QueryTimeout>() || e.is::<PastDeadline>() {
                        return Some(Kind::Timeout);
                    }
                    if let Some(deadpool_postgres::PoolError::Timeout(_)) =
                        e.downcast_ref::<deadpool_postgres::PoolError>()
                    {
                        return Some(Kind::PoolTimeout);
                    }
                    cause = e.source();
                }
                Kind::Unavailable
            }
            StoreError::Query(_) => Kind::Query,
            StoreError::Corrupt(_) => Kind::Corrupt,
            StoreError::Config(_) => Kind::Config,
        })
    }
}

/// Whether PostgreSQL refused a prepared statement because the table its
/// result describes changed since it was prepared.
pub(super) fn prepared_before_a_table_change(error: &tokio_postgres::Error) -> bool {
    error
        .as_db_error()
        .is_some_and(|db| refused_as_stale(db.code(), db.routine(), db.message()))
}

/// The error's SQLSTATE, the routine that raised it and its message say a
/// prepared statement is stale. Known by the routine, as the message is in
/// the server's language; by the English message where the routine is
/// another's (Citus passes a worker's error on as its own, so such a
/// message from a worker speaking another language is not recognised).
/// One more, whatever the language: a statement that a Citus coordinator
/// node prepared before a column was dropped still refers to that column,
/// and PostgreSQL's SQL printer writes a reference to a dropped column as
/// `?dropped?column?` in the query the node sends on; the node that runs
/// it says that column does not exist. No table of ours has such a column,
/// and the name is not translated.
fn refused_as_stale(code: &SqlState, routine: Option<&str>, message: &str) -> bool {
    let column_dropped = *code == SqlState::UNDEFINED_COLUMN
        && (routine == Some("CheckVarSlotCompatibility")
            || message.ends_with("has been dropped")
            || message.contains("?dropped?column?"));
    let result_changed = *code == SqlState::FEATURE_NOT_SUPPORTED
        && (routine == Some("RevalidateCachedQuery")
            || message == "cached plan must not change result type");
    column_dropped || result_changed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_failures_are_counted_by_kind_and_refusals_are_not() {
        use crate::metrics::DatabaseError as Kind;
        let timeout = deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Wait);
        assert_eq!(
            StoreError::Unavailable(Box::new(timeout)).kind(),
            Some(Kind::PoolTimeout)
        );
        let refused = std::io::Error::other("connection refused");
        assert_eq!(
            StoreError::Unavailable(Box::new(refused)).kind(),
            Some(Kind::Unavailable)
        );
        assert_eq!(
            StoreError::Corrupt("no row".into()).kind(),
            Some(Kind::Corrupt)
        );
        assert_eq!(StoreError::Refused(Refusal::LeaseLost).kind(), None);
    }

    #[test]
    fn a_stale_statement_is_known_by_its_routine_in_any_language() {
        let dropped = "l'attribut 2 du type record a été supprimé";
        assert!(refused_as_stale(
            &SqlState::UNDEFINED_COLUMN,
            Some("CheckVarSlotCompatibility"),
            dropped
        ));
        let changed = "le plan en cache ne doit pas modifier le type en résultat";
        assert!(refused_as_stale(
            &SqlState::FEATURE_NOT_SUPPORTED,
            Some("RevalidateCachedQuery"),
            changed
        ));
    }

    #[test]
    fn a_stale_statement_passed_on_by_citus_is_known_by_its_english_message() {
        assert!(refused_as_stale(
            &SqlState::UNDEFINED_COLUMN,
            Some("ReportResultError"),
            "attribute 2 of type record has been dropped"
        ));
        assert!(refused_as_stale(
            &SqlState::FEATURE_NOT_SUPPORTED,
            Some("ReportResultError"),
            "cached plan must not change result type"
        ));
        // Through the coordinator node after a column was dropped, in any
        // language: the dropped column's name is not translated.
        assert!(refused_as_stale(
            &SqlState::UNDEFINED_COLUMN,
            Some("ReportResultError"),
            "column \"?dropped?column?\" does not exist"
        ));
        assert!(refused_as_stale(
            &SqlState::UNDEFINED_COLUMN,
            Some("ReportResultError"),
            "la colonne « ?dropped?column? » n'existe pas"
        ));
    }

    #[test]
    fn other_errors_are_not_run_again() {
        // A column that never existed, and a feature missing for good.
        assert!(!refused_as_stale(
            &SqlState::UNDEFINED_COLUMN,
            Some("errorMissingColumn"),
            "column \"nope\" does not exist"
        ));
        assert!(!refused_as_stale(
            &SqlState::FEATURE_NOT_SUPPORTED,
            Some("transformLockingClause"),
            "FOR UPDATE is not allowed with aggregate functions"
        ));
        // The right routine with another SQLSTATE: a column of another type.
        assert!(!refused_as_stale(
            &SqlState::DATATYPE_MISMATCH,
            Some("CheckVarSlotCompatibility"),
            "attribute 2 of type record has wrong type"
        ));
    }
}
