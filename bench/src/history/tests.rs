//! The checker and the format, on small histories built by hand.

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
