//! Histories of calls and the checker that holds them to the coordinator's
//! promises.
//!
//! A history is what clients saw: every call (Acquire, Complete, Get) with
//! its wall-clock start and end, its status code and ErrorInfo reason, and
//! for answers that succeeded the decision, the lease and the record as the
//! database returned them; then, after the load, one final read of each key
//! (the record as it stands, read with the database's clock). It is kept as
//! JSON lines, one [`Entry`] a line: [`parse`] reads them and [`to_line`]
//! writes one. Timestamps are microseconds since the Unix epoch: `*_at_us`
//! fields are the database's clock, `start_us` and `end_us` the client's.
//!
//! [`check`] reads a history and returns every [`Violation`] of these
//! promises, each naming its key:
//!
//! - **Completes are kept.** A Complete with a success outcome that answered
//!   OK is in the final table as sent (SUCCEEDED, same result bytes, same
//!   record), unless the record has visibly expired: the final read finds no
//!   record (or a newer one) and the record's `expires_at` as that answer
//!   gave it had passed by then. The answer itself must show what was sent.
//! - **One result per record.** Every SUCCEEDED view of one record (one key
//!   and one `created_at`: an ALREADY_DONE answer, a Complete's or a Get's,
//!   the final read) shows the same result bytes.
//! - **Fencing tokens grow.** The leases granted on a key, in the order the
//!   database granted them, carry strictly increasing fencing tokens; two
//!   leases never share one.
//! - **One holder at a time.** A lease is granted at `granted_at` (the
//!   record's `updated_at` in the PROCEED answer: the database's clock when
//!   the grant was written) and is *live* on the half-open interval
//!   `[granted_at, ends_at)`, where `ends_at` is the earliest of: the lease's
//!   `expires_at`; the database time its holder's Complete took effect (the
//!   `updated_at` of the record an OK Complete returned); and, when its
//!   holder sent a Complete that got no definite answer (a deadline, an
//!   unavailable database, a broken connection), the earliest database time
//!   that Complete could have taken effect: its wall-clock start less the
//!   largest offset between the client's clock and the database's that the
//!   history allows (no answer can carry a database time later than the
//!   wall-clock end of its call). Two leases on a key are a violation when
//!   the later one was granted while the earlier one was live.
//! - **Every PROCEED is accounted for.** A lease granted by an OK PROCEED
//!   answer was completed (its Complete answered OK, or the final record
//!   carries its fencing token and is no longer PROCESSING), taken over (a
//!   later lease on the key, in the history or the final read), or visibly
//!   ran out (the final record is its lease, PROCESSING, expired by the read
//!   time; or the record is gone and its `expires_at` had passed). A final
//!   record with an older fencing token, or a record gone before its time,
//!   means a granted lease was lost.
//!
//! A key that was called but has no final read cannot be checked and is
//! reported as such. The module is pure: it parses and checks, it does no
//! I/O. Decisions are the domain's ([`Decision`]), written by their names in
//! the contract.
//!
//! In parts: `model` (what a history holds), `format` (how it is written)
//! and `check` (the promises, one function each).

mod check;
mod format;
mod model;
#[cfg(test)]
mod tests;

pub use check::{Violation, ViolationKind, check};
pub use format::{ParseError, parse, to_line};
pub use model::{
    Call, CallKind, Decision, Entry, FinalRead, Lease, Micros, Outcome, Record, Sent, Status,
};
