//! How long the server waits for a statement it sent for calls whose
//! callers stop waiting at a known moment.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::super::StoreError;
use super::super::mux::{Mux, Shared};

/// How long before `answer_by` the wait for a statement ends at most (a
/// tenth of the time left, if less): the time to carry the answer out.
const ANSWER_MARGIN: Duration = Duration::from_millis(50);

/// `work` (a statement on `shared`) waited for within `query_timeout`,
/// as `Mux::in_time` does (a connection that does not answer in that time
/// is retired), and at most until shortly before `answer_by`
/// ([`ANSWER_MARGIN`]), when the first of its callers stops waiting (the
/// moment admission answers DEADLINE_EXCEEDED). The statement, stamped to
/// roll back by then (`stamp_by`), cannot commit unheard. Past that moment
/// the call fails with [`PastDeadline`]: on a Citus node (`on_node`) the
/// caller hears UNAVAILABLE (a node cut off the network, its packets
/// dropped, is a node to try again later), on one PostgreSQL
/// DEADLINE_EXCEEDED (its statement may just be waiting for a lock). A
/// connection is not retired for a caller's short deadline.
pub(in crate::store) async fn in_time_for<T>(
    mux: &Mux,
    shared: &Arc<Shared>,
    query_timeout: Duration,
    (answer_by, on_node): (Option<Instant>, bool),
    work: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let left = answer_by.map(|at| {
        let left = at.saturating_duration_since(Instant::now());
        left.saturating_sub((left / 10).min(ANSWER_MARGIN))
    });
    match left.filter(|left| *left < query_timeout) {
        None => mux.in_time(shared, query_timeout, work).await,
        Some(left) => match tokio::time::timeout(left, work).await {
            Ok(done) => done,
            Err(_) => Err(StoreError::Unavailable(Box::new(PastDeadline {
                left,
                on_node,
            }))),
        },
    }
}

/// Why a call whose statement had not answered by its caller's deadline
/// failed, and whether it was sent straight to a Citus node.
#[derive(Debug, thiserror::Error)]
#[error("the database did not answer within the caller's deadline ({left:?})")]
pub(crate) struct PastDeadline {
    left: Duration,
    on_node: bool,
}

impl PastDeadline {
    /// Whether the call went straight to a Citus node.
    pub(crate) fn on_node(&self) -> bool {
        self.on_node
    }
}
