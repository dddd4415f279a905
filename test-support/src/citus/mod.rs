//! A Citus cluster for the tests (`harness`) and where its shards are
//! (`placement`).

pub mod harness;
pub mod placement;
