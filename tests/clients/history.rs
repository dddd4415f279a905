//! The benchmark's history checker (`bench/src/history`), its files
//! included as they are: what a history holds, how it is written, and the
//! promises it is held to.

#[path = "../../bench/src/history/check.rs"]
mod check;
#[path = "../../bench/src/history/format.rs"]
mod format;
#[path = "../../bench/src/history/model.rs"]
mod model;

pub use check::{Violation, check};
pub use model::{
    Call, CallKind, Decision, Entry, FinalRead, Lease, Micros, Outcome, Record, Sent, Status,
};
