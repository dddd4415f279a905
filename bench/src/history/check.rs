//! The checker: every promise of the module's documentation held against
//! one key's calls and its final read at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;

use super::model::{
    Call, CallKind, Decision, Entry, FinalRead, Lease, Micros, Outcome, Record, Sent, Status,
};

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

/// Where a violation found on a key is reported.
type Report<'r> = &'r mut dyn FnMut(ViolationKind, String);

/// The least and the greatest offset of the client's clock over the
/// database's that the answers allow.
#[derive(Debug, Clone, Copy, Default)]
struct Offsets {
    /// A lease granted by a PROCEED without request_id (so not an earlier
    /// lease handed back) was written after its call started, so offset >=
    /// start - updated_at.
    min: Option<Micros>,
    /// An answer's updated_at was written before its call ended, so offset
    /// <= end - updated_at.
    max: Option<Micros>,
}

impl Offsets {
    /// Narrows the offsets by one call's answer.
    fn narrow(&mut self, call: &Call) {
        if call.ok()
            && let Some(r) = &call.record
        {
            let bound = call.end_us - r.updated_at_us;
            self.max = Some(self.max.map_or(bound, |m| m.min(bound)));
            if call.decision == Some(Decision::Proceed) && call.request_id.is_empty() {
                let bound = call.start_us - r.updated_at_us;
                self.min = Some(self.min.map_or(bound, |m| m.max(bound)));
            }
        }
    }
}

/// Checks `entries` and returns every violation found, by key.
pub fn check(entries: &[Entry]) -> Vec<Violation> {
    let mut keys: BTreeMap<KeyId, KeyHistory> = BTreeMap::new();
    let mut offsets = Offsets::default();
    for entry in entries {
        match entry {
            Entry::Call(call) => {
                offsets.narrow(call);
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
        check_key(history, offsets, &mut |kind, detail| {
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

/// Every promise, on one key.
fn check_key(history: &KeyHistory<'_>, offsets: Offsets, report: Report<'_>) {
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

    completes_are_kept(&ok_completes, last, report);
    one_result_per_record(calls, final_record, report);
    let leases = granted_leases(calls, report);
    fencing_tokens_grow(&leases, report);
    one_holder_at_a_time(calls, &leases, offsets.max, report);
    // No lease in the table that its callers heard an error for.
    if let Some(detail) = orphan_lease(calls, final_record, &leases, offsets.min) {
        report(ViolationKind::OrphanLease, detail);
    }
    every_proceed_is_accounted_for(&leases, &ok_completes, last, report);
}

/// Completes are kept: each OK Complete of a success answered what was
/// sent, and the final read still holds it unless the record expired.
fn completes_are_kept(ok_completes: &[(&Call, &Sent)], last: &FinalRead, report: Report<'_>) {
    let final_record = last.record.as_ref();
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
}

/// One result per record: every SUCCEEDED view of one record shows the
/// same result bytes.
fn one_result_per_record(calls: &[&Call], final_record: Option<&Record>, report: Report<'_>) {
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
}

/// The leases granted, one per fencing token, in grant order; a fencing
/// token granted to two leases is reported.
fn granted_leases<'a>(calls: &[&'a Call], report: Report<'_>) -> Vec<Granted<'a>> {
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
    leases
}

/// Fencing tokens grow, in grant order.
fn fencing_tokens_grow(leases: &[Granted<'_>], report: Report<'_>) {
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
}

/// One holder at a time: no lease granted while an earlier one was live.
/// `max_offset`: the greatest offset of the client's clock over the
/// database's that the answers allow.
fn one_holder_at_a_time(
    calls: &[&Call],
    leases: &[Granted<'_>],
    max_offset: Option<Micros>,
    report: Report<'_>,
) {
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
}

/// Every PROCEED is accounted for: each lease was completed, taken over,
/// or visibly ran out.
fn every_proceed_is_accounted_for(
    leases: &[Granted<'_>],
    ok_completes: &[(&Call, &Sent)],
    last: &FinalRead,
    report: Report<'_>,
) {
    let final_record = last.record.as_ref();
    let newest_granted = leases.iter().map(|g| g.lease.fencing_token).max();
    for g in leases {
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
