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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

// The decision of an OK Acquire is the domain's, written by its name.
pub use idempotency_coordinator::domain::Decision;

/// Microseconds since the Unix epoch.
pub type Micros = i64;

/// One line of a history.
// Nearly every entry is a call: boxing calls would cost an allocation each
// and save no memory.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Entry {
    /// A call and its answer.
    Call(Call),
    /// A key as the final read found it.
    Final(FinalRead),
}

/// The calls a history records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    Acquire,
    Complete,
    Get,
}

/// One call: what was asked, when, and what came back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    /// Which call it was.
    pub kind: CallKind,
    /// The server the call went to, when the history has several.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub server: String,
    /// The scope the call named.
    pub scope: String,
    /// The idempotency key the call named.
    pub key: String,
    /// The Acquire's request_id ('' for none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request_id: String,
    /// Wall-clock start and end of the call, as the client saw them.
    pub start_us: Micros,
    /// When the client had the answer, or gave up on it.
    pub end_us: Micros,
    /// The deadline the client sent (grpc-timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// An Acquire's wait window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// The gRPC status code by its canonical name ("OK", "UNAVAILABLE", …),
    /// or "NO_ANSWER" when the client gave up on a call that never answered.
    pub code: String,
    /// The ErrorInfo reason of a failed call.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Whether a failed call carried RetryInfo.
    #[serde(default, skip_serializing_if = "is_false")]
    pub retry_info: bool,
    /// A Complete: what was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent: Option<Sent>,
    /// An OK Acquire: the decision, by its name in the contract.
    #[serde(
        default,
        with = "decision_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub decision: Option<Decision>,
    /// An OK PROCEED: the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,
    /// An OK answer: the record it carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<Record>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Call {
    /// Whether the call answered OK.
    pub fn ok(&self) -> bool {
        self.code == "OK"
    }

    /// Whether the call failed in a way that says it took no effect: the
    /// server refused it (bad argument, lost lease, not found, no room) or
    /// answered it with a final word. Anything else that is not OK (a
    /// deadline, an unavailable database, no answer) may have taken effect.
    pub fn refused(&self) -> bool {
        matches!(
            self.code.as_str(),
            "INVALID_ARGUMENT"
                | "NOT_FOUND"
                | "ABORTED"
                | "FAILED_PRECONDITION"
                | "PERMISSION_DENIED"
                | "UNAUTHENTICATED"
                | "RESOURCE_EXHAUSTED"
        )
    }

    /// Wall-clock duration of the call.
    pub fn took_us(&self) -> Micros {
        self.end_us - self.start_us
    }
}

/// A Complete's request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sent {
    /// The lease token the Complete presented.
    pub lease_token: String,
    /// Which outcome the Complete reported.
    pub outcome: Outcome,
    /// The success's result bytes.
    #[serde(default, with = "hex_bytes", skip_serializing_if = "Option::is_none")]
    pub result: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    Success,
    Failure,
    Release,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    Processing,
    Succeeded,
    Failed,
    FailedPermanent,
}

/// A lease as PROCEED granted it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The lease's token, as the answer spelled it.
    pub token: String,
    /// The lease's fencing token: it must grow with every grant on the key.
    pub fencing_token: u64,
    /// Which attempt the lease is, from 1.
    pub attempt: u32,
    /// When the lease runs out (database clock).
    pub expires_at_us: Micros,
}

/// A record as an answer or the final read showed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The record's status.
    pub status: Status,
    /// The fencing token of the record's latest lease.
    pub fencing_token: u64,
    /// Leases granted so far, less released ones.
    pub attempt_count: u32,
    /// When SUCCEEDED: the stored result.
    #[serde(default, with = "hex_bytes", skip_serializing_if = "Option::is_none")]
    pub result: Option<Vec<u8>>,
    /// When the record was created (database clock): with the key, it names
    /// one record.
    pub created_at_us: Micros,
    /// When the record last changed (database clock); on PROCEED, when the
    /// lease was granted.
    pub updated_at_us: Micros,
    /// When the record is deleted (database clock).
    pub expires_at_us: Micros,
    /// When the current lease runs out (database clock); `None` unless
    /// PROCESSING.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires_at_us: Option<Micros>,
}

/// One key after the load: its record, or none, and when it was read
/// (database clock).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalRead {
    /// The scope of the key read.
    pub scope: String,
    /// The idempotency key read.
    pub key: String,
    /// When the key was read (database clock).
    pub read_at_us: Micros,
    /// The record as it stood; `None` when there was none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<Record>,
}

/// Bytes as lowercase hex in JSON.
mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(b) => s.serialize_str(&hex::encode(b)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| hex::decode(text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// A decision by its name ([`Decision::name`]: `PROCEED`, `ALREADY_DONE`,
/// …), as the contract spells it.
mod decision_name {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::Decision;
    use idempotency_coordinator::store::names;

    pub fn serialize<S: Serializer>(decision: &Option<Decision>, s: S) -> Result<S::Ok, S::Error> {
        match decision {
            Some(d) => s.serialize_str(d.name()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Decision>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|name| {
                names::decision(&name)
                    .ok_or_else(|| serde::de::Error::custom(format!("unknown decision {name:?}")))
            })
            .transpose()
    }
}

/// A line that is not an [`Entry`].
#[derive(Debug, thiserror::Error)]
#[error("history line {line}: {source}")]
pub struct ParseError {
    /// The line that did not parse, from 1.
    pub line: usize,
    /// Why it did not parse.
    #[source]
    pub source: serde_json::Error,
}

/// Reads a history from JSON lines (blank lines are skipped).
pub fn parse(text: &str) -> Result<Vec<Entry>, ParseError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| {
            serde_json::from_str(l).map_err(|source| ParseError {
                line: n + 1,
                source,
            })
        })
        .collect()
}

/// One entry as a JSON line (without the newline).
pub fn to_line(entry: &Entry) -> String {
    serde_json::to_string(entry).expect("history entries always serialize")
}

/// Which promise a violation breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationKind {
    /// A Complete answered OK but its result is not in the table.
    LostComplete,
    /// A Complete answered OK with a record that does not show what was sent.
    CompleteAnsweredOther,
    /// One record was seen SUCCEEDED with two different results.
    TwoResults,
    /// A key's fencing tokens did not strictly increase in grant order.
    FencingNotIncreasing,
    /// A lease was granted while another one on the key was live.
    OverlappingLeases,
    /// A granted lease was neither completed, taken over, nor visibly expired.
    UnaccountedProceed,
    /// A key was called but never read at the end.
    NoFinalRead,
    /// The table holds a lease granted after every Acquire on its key had
    /// been answered, none of them with that lease: a statement that
    /// committed after its caller heard an error, a lease nobody holds.
    OrphanLease,
}

/// A broken promise: what, on which key, and the evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which promise is broken.
    pub kind: ViolationKind,
    /// The scope of the key it happened on.
    pub scope: String,
    /// The idempotency key it happened on.
    pub key: String,
    /// The evidence, in words.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} on {}/{}: {}",
            self.kind, self.scope, self.key, self.detail
        )
    }
}

type KeyId = (String, String);

/// One lease, from one or more PROCEED answers (a repeated request_id gets
/// the same lease back).
#[derive(Debug)]
struct Granted<'a> {
    lease: &'a Lease,
    granted_at: Micros,
    record: &'a Record,
}

/// Everything the history says about one key.
#[derive(Default)]
struct KeyHistory<'a> {
    calls: Vec<&'a Call>,
    finals: Option<&'a FinalRead>,
}

/// Checks `entries` and returns every violation found, by key.
pub fn check(entries: &[Entry]) -> Vec<Violation> {
    let mut keys: BTreeMap<KeyId, KeyHistory> = BTreeMap::new();
    // The largest offset of the client's clock over the database's that the
    // answers allow: an answer's updated_at was written before its call
    // ended, so offset <= end - updated_at.
    let mut max_offset: Option<Micros> = None;
    // And the smallest: a lease granted by a PROCEED without request_id (so
    // not an earlier lease handed back) was written after its call started,
    // so offset >= start - updated_at.
    let mut min_offset: Option<Micros> = None;
    for entry in entries {
        match entry {
            Entry::Call(call) => {
                if call.ok()
                    && let Some(r) = &call.record
                {
                    let bound = call.end_us - r.updated_at_us;
                    max_offset = Some(max_offset.map_or(bound, |m| m.min(bound)));
                    if call.decision == Some(Decision::Proceed) && call.request_id.is_empty() {
                        let bound = call.start_us - r.updated_at_us;
                        min_offset = Some(min_offset.map_or(bound, |m| m.max(bound)));
                    }
                }
                keys.entry((call.scope.clone(), call.key.clone()))
                    .or_default()
                    .calls
                    .push(call);
            }
            Entry::Final(read) => {
                keys.entry((read.scope.clone(), read.key.clone()))
                    .or_default()
                    .finals = Some(read);
            }
        }
    }
    let mut violations = Vec::new();
    for ((scope, key), history) in &keys {
        let mut found = Vec::new();
        check_key(history, (min_offset, max_offset), &mut |kind, detail| {
            found.push((kind, detail))
        });
        violations.extend(found.into_iter().map(|(kind, detail)| Violation {
            kind,
            scope: scope.clone(),
            key: key.clone(),
            detail,
        }));
    }
    violations.sort_by(|a, b| (a.kind, &a.scope, &a.key).cmp(&(b.kind, &b.scope, &b.key)));
    violations
}

/// `offsets`: the least and the greatest offset of the client's clock over
/// the database's that the answers allow.
fn check_key(
    history: &KeyHistory<'_>,
    offsets: (Option<Micros>, Option<Micros>),
    report: &mut dyn FnMut(ViolationKind, String),
) {
    let (min_offset, max_offset) = offsets;
    let calls = &history.calls;
    let Some(last) = history.finals else {
        if !calls.is_empty() {
            report(
                ViolationKind::NoFinalRead,
                format!("{} calls, no final read", calls.len()),
            );
        }
        return;
    };
    let final_record = last.record.as_ref();
    let ok_completes: Vec<(&Call, &Sent)> = calls
        .iter()
        .filter(|c| c.kind == CallKind::Complete && c.ok())
        .filter_map(|c| Some((*c, c.sent.as_ref()?)))
        .collect();

    // Completes are kept.
    for (call, sent) in ok_completes
        .iter()
        .filter(|(_, s)| s.outcome == Outcome::Success)
    {
        let Some(answered) = &call.record else {
            report(
                ViolationKind::CompleteAnsweredOther,
                "an OK Complete without a record".into(),
            );
            continue;
        };
        if answered.status != Status::Succeeded || answered.result != sent.result {
            report(
                ViolationKind::CompleteAnsweredOther,
                format!(
                    "sent {}, answered {:?} with {}",
                    show(&sent.result),
                    answered.status,
                    show(&answered.result)
                ),
            );
            continue;
        }
        let kept = match final_record {
            Some(r) if r.created_at_us == answered.created_at_us => {
                r.status == Status::Succeeded
                    && r.result == sent.result
                    && r.fencing_token == answered.fencing_token
            }
            // A newer record: the completed one must have expired first.
            Some(r) => answered.expires_at_us <= r.created_at_us,
            None => answered.expires_at_us <= last.read_at_us,
        };
        if !kept {
            report(
                ViolationKind::LostComplete,
                format!(
                    "Complete (fencing {}) answered OK with {} at {}; the table holds {}",
                    answered.fencing_token,
                    show(&sent.result),
                    answered.updated_at_us,
                    describe(final_record)
                ),
            );
        }
    }

    // One result per record.
    let mut results: BTreeMap<Micros, BTreeSet<Option<&Vec<u8>>>> = BTreeMap::new();
    let seen = calls
        .iter()
        .filter(|c| c.ok())
        .filter_map(|c| c.record.as_ref())
        .chain(final_record);
    for r in seen.filter(|r| r.status == Status::Succeeded) {
        results
            .entry(r.created_at_us)
            .or_default()
            .insert(r.result.as_ref());
    }
    for (created, set) in results.iter().filter(|(_, s)| s.len() > 1) {
        let shown: Vec<String> = set.iter().map(|r| show(&r.cloned())).collect();
        report(
            ViolationKind::TwoResults,
            format!(
                "the record created at {created} was answered SUCCEEDED with {}",
                shown.join(" and ")
            ),
        );
    }

    // The leases granted, one per fencing token, in grant order.
    let mut leases: Vec<Granted> = Vec::new();
    for call in calls
        .iter()
        .filter(|c| c.ok() && c.decision == Some(Decision::Proceed))
    {
        let (Some(lease), Some(record)) = (&call.lease, &call.record) else {
            continue;
        };
        match leases
            .iter()
            .find(|g| g.lease.fencing_token == lease.fencing_token)
        {
            Some(g) if g.lease.token == lease.token => {}
            Some(g) => report(
                ViolationKind::FencingNotIncreasing,
                format!(
                    "fencing token {} granted to two leases ({} and {})",
                    lease.fencing_token, g.lease.token, lease.token
                ),
            ),
            None => leases.push(Granted {
                lease,
                granted_at: record.updated_at_us,
                record,
            }),
        }
    }
    leases.sort_by_key(|g| (g.granted_at, g.lease.fencing_token));

    // Fencing tokens grow.
    for pair in leases.windows(2) {
        if pair[1].lease.fencing_token <= pair[0].lease.fencing_token {
            report(
                ViolationKind::FencingNotIncreasing,
                format!(
                    "fencing token {} granted at {} after {} granted at {}",
                    pair[1].lease.fencing_token,
                    pair[1].granted_at,
                    pair[0].lease.fencing_token,
                    pair[0].granted_at
                ),
            );
        }
    }

    // One holder at a time.
    let ends_at = |g: &Granted| -> Micros {
        let mut end = g.lease.expires_at_us;
        for c in calls.iter().filter(|c| {
            c.kind == CallKind::Complete
                && c.sent
                    .as_ref()
                    .is_some_and(|s| s.lease_token == g.lease.token)
        }) {
            if c.ok() {
                if let Some(r) = &c.record {
                    end = end.min(r.updated_at_us);
                }
            } else if !c.refused() {
                // May have taken effect any time after it was sent.
                end = end.min(max_offset.map_or(Micros::MIN, |o| c.start_us - o));
            }
        }
        end
    };
    for (i, earlier) in leases.iter().enumerate() {
        let end = ends_at(earlier);
        for later in leases[i + 1..].iter().filter(|l| l.granted_at < end) {
            report(
                ViolationKind::OverlappingLeases,
                format!(
                    "lease {} (fencing {}) granted at {} while lease {} (fencing {}, granted at {}) was live until {}",
                    later.lease.token,
                    later.lease.fencing_token,
                    later.granted_at,
                    earlier.lease.token,
                    earlier.lease.fencing_token,
                    earlier.granted_at,
                    end
                ),
            );
        }
    }

    // No lease in the table that its callers heard an error for.
    if let Some(detail) = orphan_lease(calls, final_record, &leases, min_offset) {
        report(ViolationKind::OrphanLease, detail);
    }

    // Every PROCEED is accounted for.
    let newest_granted = leases.iter().map(|g| g.lease.fencing_token).max();
    for g in &leases {
        let fencing = g.lease.fencing_token;
        let completed = ok_completes
            .iter()
            .any(|(_, s)| s.lease_token == g.lease.token);
        let taken_over = newest_granted.is_some_and(|n| n > fencing);
        let in_table = match final_record {
            Some(r) if r.fencing_token > fencing => true,
            Some(r) if r.fencing_token == fencing => {
                r.status != Status::Processing
                    || r.lease_expires_at_us.is_some_and(|e| e <= last.read_at_us)
            }
            Some(_) => false,
            None => g.record.expires_at_us <= last.read_at_us,
        };
        if !(completed || taken_over || in_table) {
            report(
                ViolationKind::UnaccountedProceed,
                format!(
                    "lease {} (fencing {}, granted at {}, expiring at {}) was not completed, taken over or seen to expire; the table holds {} at {}",
                    g.lease.token,
                    fencing,
                    g.granted_at,
                    g.lease.expires_at_us,
                    describe(final_record),
                    last.read_at_us
                ),
            );
        }
    }
}

/// A lease in the table that no Acquire was answered with, granted (by the
/// database's clock moved to the client's by the least offset the answers
/// allow) after the last Acquire on its key had been answered.
fn orphan_lease(
    calls: &[&Call],
    final_record: Option<&Record>,
    granted: &[Granted<'_>],
    min_offset: Option<Micros>,
) -> Option<String> {
    let record = final_record.filter(|r| r.status == Status::Processing)?;
    if granted
        .iter()
        .any(|g| g.lease.fencing_token == record.fencing_token)
    {
        return None;
    }
    let last_answered = calls
        .iter()
        .filter(|c| c.kind == CallKind::Acquire)
        .map(|c| c.end_us)
        .max()?;
    let granted_at = record.updated_at_us + min_offset?;
    (granted_at > last_answered).then(|| {
        format!(
            "the table holds a lease (fencing {}) granted at {granted_at}, after every Acquire on the key had been answered (the last at {last_answered}), none with that lease",
            record.fencing_token
        )
    })
}

fn show(bytes: &Option<Vec<u8>>) -> String {
    match bytes {
        Some(b) => format!("{:?}", String::from_utf8_lossy(b)),
        None => "no result".into(),
    }
}

fn describe(record: Option<&Record>) -> String {
    match record {
        Some(r) => format!(
            "{:?} fencing {} created at {} with {}",
            r.status,
            r.fencing_token,
            r.created_at_us,
            show(&r.result)
        ),
        None => "no record".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;
    const T0: i64 = 1_700_000_000 * S;

    fn record(status: Status, fencing: u64, result: Option<&str>, updated: i64) -> Record {
        Record {
            status,
            fencing_token: fencing,
            attempt_count: 1,
            result: result.map(|r| r.as_bytes().to_vec()),
            created_at_us: T0,
            updated_at_us: updated,
            expires_at_us: T0 + 3600 * S,
            lease_expires_at_us: (status == Status::Processing).then_some(updated + 10 * S),
        }
    }

    fn call(kind: CallKind, key: &str, at: i64) -> Call {
        Call {
            kind,
            server: String::new(),
            scope: "s".into(),
            key: key.into(),
            request_id: String::new(),
            start_us: at - 1000,
            end_us: at + 1000,
            deadline_ms: Some(1000),
            wait_ms: None,
            code: "OK".into(),
            reason: String::new(),
            retry_info: false,
            sent: None,
            decision: None,
            lease: None,
            record: None,
        }
    }

    /// PROCEED on `key` at `at` with a 10 s lease.
    fn proceed(key: &str, token: &str, fencing: u64, at: i64) -> Entry {
        let mut c = call(CallKind::Acquire, key, at);
        c.decision = Some(Decision::Proceed);
        c.lease = Some(Lease {
            token: token.into(),
            fencing_token: fencing,
            attempt: 1,
            expires_at_us: at + 10 * S,
        });
        c.record = Some(record(Status::Processing, fencing, None, at));
        Entry::Call(c)
    }

    fn complete(key: &str, token: &str, fencing: u64, result: &str, at: i64) -> Entry {
        let mut c = call(CallKind::Complete, key, at);
        c.sent = Some(Sent {
            lease_token: token.into(),
            outcome: Outcome::Success,
            result: Some(result.as_bytes().to_vec()),
        });
        c.record = Some(record(Status::Succeeded, fencing, Some(result), at));
        Entry::Call(c)
    }

    fn release(key: &str, token: &str, fencing: u64, at: i64) -> Entry {
        let mut c = call(CallKind::Complete, key, at);
        c.sent = Some(Sent {
            lease_token: token.into(),
            outcome: Outcome::Release,
            result: None,
        });
        c.record = Some(record(Status::Failed, fencing, None, at));
        Entry::Call(c)
    }

    fn already_done(key: &str, fencing: u64, result: &str, at: i64) -> Entry {
        let mut c = call(CallKind::Acquire, key, at);
        c.decision = Some(Decision::AlreadyDone);
        c.record = Some(record(Status::Succeeded, fencing, Some(result), at - S));
        Entry::Call(c)
    }

    fn last(key: &str, record: Option<Record>) -> Entry {
        Entry::Final(FinalRead {
            scope: "s".into(),
            key: key.into(),
            read_at_us: T0 + 100 * S,
            record,
        })
    }

    /// A clean history: a lease released and taken over, the second
    /// completed, replayed, and found in the table; a lease that ran out
    /// and was taken over; a Complete whose answer was lost.
    fn clean() -> Vec<Entry> {
        let done = record(Status::Succeeded, 2, Some("r2"), T0 + 3 * S);
        let mut lost = call(CallKind::Complete, "c", T0 + 2 * S);
        lost.code = "DEADLINE_EXCEEDED".into();
        lost.sent = Some(Sent {
            lease_token: "c1".into(),
            outcome: Outcome::Success,
            result: Some(b"c".to_vec()),
        });
        vec![
            proceed("a", "a1", 1, T0),
            release("a", "a1", 1, T0 + S),
            proceed("a", "a2", 2, T0 + 2 * S),
            complete("a", "a2", 2, "r2", T0 + 3 * S),
            already_done("a", 2, "r2", T0 + 4 * S),
            proceed("b", "b1", 3, T0),
            proceed("b", "b2", 4, T0 + 10 * S),
            proceed("c", "c1", 5, T0),
            Entry::Call(lost),
            last("a", Some(done)),
            last("b", Some(record(Status::Processing, 4, None, T0 + 10 * S))),
            last(
                "c",
                Some(record(Status::Succeeded, 5, Some("c"), T0 + 2 * S)),
            ),
        ]
    }

    fn kinds(entries: &[Entry]) -> Vec<ViolationKind> {
        check(entries).into_iter().map(|v| v.kind).collect()
    }

    #[test]
    fn a_lease_granted_after_every_acquire_failed_is_an_orphan() {
        let mut failed = call(CallKind::Acquire, "o", T0);
        failed.code = "DEADLINE_EXCEEDED".into();
        let mut entries = clean();
        entries.push(Entry::Call(failed.clone()));
        // Committed two seconds after its caller heard DEADLINE_EXCEEDED.
        entries.push(last(
            "o",
            Some(record(Status::Processing, 9, None, T0 + 2 * S)),
        ));
        assert_eq!(kinds(&entries), vec![ViolationKind::OrphanLease]);

        // Committed before the answer (which was lost): no orphan.
        let mut entries = clean();
        entries.push(Entry::Call(failed));
        entries.push(last("o", Some(record(Status::Processing, 9, None, T0))));
        assert_eq!(kinds(&entries), vec![]);
    }

    #[test]
    fn a_clean_history_passes() {
        assert_eq!(check(&clean()), vec![]);
    }

    #[test]
    fn a_history_survives_its_json_lines() {
        let entries = clean();
        let text: String = entries.iter().map(|e| to_line(e) + "\n").collect();
        assert_eq!(parse(&text).unwrap(), entries);
        let err = parse("\n{\"type\":\"call\"}\n").unwrap_err();
        assert_eq!(err.line, 2);
    }

    #[test]
    fn decisions_are_written_by_their_names_in_the_contract() {
        let line = r#"{"type":"call","kind":"acquire","scope":"s","key":"k","start_us":1,"end_us":2,"code":"OK","decision":"ALREADY_DONE"}"#;
        let entries = parse(line).unwrap();
        let Entry::Call(call) = &entries[0] else {
            panic!("{entries:?}")
        };
        assert_eq!(call.decision, Some(Decision::AlreadyDone));
        assert_eq!(to_line(&entries[0]), line);
        for decision in Decision::ALL {
            let mut call = call.clone();
            call.decision = Some(decision);
            let line = to_line(&Entry::Call(call.clone()));
            assert!(line.contains(&format!(r#""decision":"{}""#, decision.name())));
            assert_eq!(parse(&line).unwrap(), vec![Entry::Call(call)]);
        }
        let err = parse(&line.replace("ALREADY_DONE", "DONE")).unwrap_err();
        assert!(err.to_string().contains("unknown decision"), "{err}");
    }

    #[test]
    fn a_lost_ok_complete_is_caught() {
        let mut h = clean();
        // The table went back to the lease before the Complete.
        *h.iter_mut()
            .find(|e| matches!(e, Entry::Final(f) if f.key == "a"))
            .unwrap() = last("a", Some(record(Status::Processing, 2, None, T0 + 2 * S)));
        assert!(
            kinds(&h).contains(&ViolationKind::LostComplete),
            "{:?}",
            check(&h)
        );
        // Gone from the table before its retention ran out.
        let mut h = clean();
        *h.iter_mut()
            .find(|e| matches!(e, Entry::Final(f) if f.key == "a"))
            .unwrap() = last("a", None);
        assert_eq!(kinds(&h), vec![ViolationKind::LostComplete]);
    }

    #[test]
    fn a_record_gone_after_its_retention_is_no_loss() {
        let mut h = clean();
        for e in &mut h {
            if let Entry::Call(c) = e
                && c.key == "a"
                && let Some(r) = &mut c.record
            {
                r.expires_at_us = T0 + 50 * S;
            }
        }
        *h.iter_mut()
            .find(|e| matches!(e, Entry::Final(f) if f.key == "a"))
            .unwrap() = last("a", None);
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn two_different_already_done_results_are_caught() {
        let mut h = clean();
        h.push(already_done("a", 2, "something else", T0 + 5 * S));
        assert_eq!(kinds(&h), vec![ViolationKind::TwoResults]);
    }

    #[test]
    fn a_fencing_token_going_down_is_caught() {
        let mut h = clean();
        h.push(proceed("b", "b3", 2, T0 + 30 * S));
        let found = kinds(&h);
        assert!(
            found.contains(&ViolationKind::FencingNotIncreasing),
            "{found:?}"
        );
        // One fencing token for two leases.
        let mut h = clean();
        h.push(proceed("b", "b3", 4, T0 + 30 * S));
        assert!(kinds(&h).contains(&ViolationKind::FencingNotIncreasing));
    }

    #[test]
    fn overlapping_leases_are_caught() {
        let mut h = clean();
        // b2 granted 1 s before b1's 10 s lease ran out.
        let Entry::Call(c) = &mut h[6] else { panic!() };
        c.record.as_mut().unwrap().updated_at_us = T0 + 9 * S;
        assert_eq!(kinds(&h), vec![ViolationKind::OverlappingLeases]);
    }

    #[test]
    fn a_complete_without_an_answer_may_have_ended_the_lease() {
        let mut h = clean();
        // c1's holder sent a Complete (no answer) at T0 + 2 s, then c2
        // was granted at T0 + 3 s, before c1's lease ran out.
        h.push(proceed("c", "c2", 6, T0 + 3 * S));
        *h.iter_mut()
            .find(|e| matches!(e, Entry::Final(f) if f.key == "c"))
            .unwrap() = last("c", Some(record(Status::Processing, 6, None, T0 + 3 * S)));
        assert_eq!(check(&h), vec![]);
        // Without that Complete, c2 overlaps c1.
        h.retain(|e| !matches!(e, Entry::Call(c) if c.kind == CallKind::Complete && c.key == "c"));
        assert_eq!(kinds(&h), vec![ViolationKind::OverlappingLeases]);
    }

    #[test]
    fn an_unaccounted_proceed_is_caught() {
        let mut h = clean();
        // b's table holds fencing 3: the lease b2 was lost.
        *h.iter_mut()
            .find(|e| matches!(e, Entry::Final(f) if f.key == "b"))
            .unwrap() = last("b", Some(record(Status::Processing, 3, None, T0)));
        assert!(kinds(&h).contains(&ViolationKind::UnaccountedProceed));
        // A lease still live when the table was read, held by nobody.
        let mut h = clean();
        h.push(proceed("d", "d1", 9, T0 + 95 * S));
        h.push(last(
            "d",
            Some(record(Status::Processing, 9, None, T0 + 95 * S)),
        ));
        assert_eq!(kinds(&h), vec![ViolationKind::UnaccountedProceed]);
    }

    #[test]
    fn a_key_never_read_is_reported() {
        let mut h = clean();
        h.push(proceed("e", "e1", 10, T0));
        assert_eq!(kinds(&h), vec![ViolationKind::NoFinalRead]);
    }

    #[test]
    fn an_ok_complete_that_answers_another_result_is_caught() {
        let mut h = clean();
        let Entry::Call(c) = &mut h[3] else { panic!() };
        c.sent.as_mut().unwrap().result = Some(b"sent".to_vec());
        assert!(kinds(&h).contains(&ViolationKind::CompleteAnsweredOther));
    }
}
