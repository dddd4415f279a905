//! The coordinator on a Citus cluster (a coordinator node and two workers,
//! `harness`): the same calls and answers as on one PostgreSQL, with the
//! records spread over the workers. Skipped, loudly, where Citus is not
//! installed (`bash .ci/citus` installs it); CI fails instead.

mod admin;
mod app;
mod batches;
mod calls;
mod cluster;
// The conformance matrix, run on the cluster: the same calls must get the
// same answers as on one PostgreSQL.
mod conformance;
mod direct;
mod door;
// Shared with the bench crate's Citus fault tests, which start clusters of
// their own and stop or add nodes; these tests use the shared cluster.
use test_support::citus::{harness, placement};
use test_support::helpers;
mod maintenance;
mod migrations;
mod moves;
mod plan_cache;
mod table_changes;
mod waiting;
