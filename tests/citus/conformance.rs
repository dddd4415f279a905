//! The conformance matrix (`test_support::conformance`) on the shared
//! Citus cluster: every path a call can take, straight to a worker or
//! through the coordinator node, gets the answers and leaves the records
//! that `idempotency_acquire` and a single call do.

test_support::conformance_tests!(test_support::citus::harness::CitusDatabase);
