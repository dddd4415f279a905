//! The conformance matrix (`test_support::conformance`) on the shared
//! Citus cluster: every path a call can take, straight to a worker or through the
//! coordinator node, gets the answers and leaves the records that
//! `idempotency_acquire` and a single call do.

use test_support::citus::harness::CitusDatabase;
use test_support::conformance::{acquire, complete, new_key};

#[tokio::test]
async fn every_path_answers_what_idempotency_acquire_answers() {
    acquire::every_path_answers_what_idempotency_acquire_answers::<CitusDatabase>().await;
}

#[tokio::test]
async fn sql_cuts_error_texts_where_the_server_does() {
    acquire::sql_cuts_error_texts_where_the_server_does::<CitusDatabase>().await;
}

#[tokio::test]
async fn a_new_key_gets_the_same_first_lease_on_every_path() {
    new_key::a_new_key_gets_the_same_first_lease_on_every_path::<CitusDatabase>().await;
}

#[tokio::test]
async fn complete_leaves_the_same_record_alone_or_in_a_group_commit() {
    complete::complete_leaves_the_same_record_alone_or_in_a_group_commit::<CitusDatabase>().await;
}
