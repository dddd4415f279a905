//! The conformance matrix (`test_support::conformance`) on one PostgreSQL:
//! every path a call can take gets the answers and leaves the records that
//! `idempotency_acquire` and a single call do.

test_support::conformance_tests!(test_support::helpers::TestDatabase);
