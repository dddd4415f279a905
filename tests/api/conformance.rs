//! The conformance matrix (`test_support::conformance`) on one PostgreSQL:
//! every path a call can take gets the answers and leaves the records that
//! `idempotency_acquire` and a single call do.

use test_support::conformance::{acquire, complete, new_key};
use test_support::helpers::TestDatabase;

#[tokio::test]
async fn every_path_answers_what_idempotency_acquire_answers() {
    acquire::every_path_answers_what_idempotency_acquire_answers::<TestDatabase>().await;
}

#[tokio::test]
async fn sql_cuts_error_texts_where_the_server_does() {
    acquire::sql_cuts_error_texts_where_the_server_does::<TestDatabase>().await;
}

#[tokio::test]
async fn a_new_key_gets_the_same_first_lease_on_every_path() {
    new_key::a_new_key_gets_the_same_first_lease_on_every_path::<TestDatabase>().await;
}

#[tokio::test]
async fn complete_leaves_the_same_record_alone_or_in_a_group_commit() {
    complete::complete_leaves_the_same_record_alone_or_in_a_group_commit::<TestDatabase>().await;
}
