//! Complete, alone or in a group commit: the same calls get the same answer,
//! leave the same record and show a watcher the same events, whichever path
//! the last Complete takes. The reference is a single call on a pooled
//! connection; the other paths are a call alone on a shared connection
//! (replay cache on and off) and a group commit, where every case's
//! Complete runs in one statement.

use idempotency_coordinator::proto::{self, complete_request};
use tokio_postgres::Client;
use tonic::Code;

use super::Backend;
use super::shape::Shape;
use super::watch::{Watched, Watcher};
use super::{
    Servers, Tally, assert_one_writer_per_node, batched_beside, companion_acquire, gated_servers,
    set_after_update,
};
use crate::helpers::*;

/// What is done to the record before the Complete compared.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Before {
    Nothing,
    /// An ExtendLease that saves a checkpoint.
    Checkpoint,
    /// The lease runs out; nobody takes over.
    LeaseRanOut,
    /// The holder has completed already, with this outcome.
    Completed(Outcome),
    /// The lease runs out and another caller takes over.
    TakenOver,
    /// The record is past its retention.
    Expired,
    /// Nobody ever acquired the key.
    NoRecord,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    Success,
    Failure,
    /// A failure with a retry delay of its own.
    FailureRetryAfter,
    FailurePermanent,
    Release,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Token {
    /// The holder's own lease token.
    Own,
    /// A token no lease was ever granted.
    Stranger,
}

struct Case {
    name: &'static str,
    /// The record's attempts; 0 for the server's default.
    max_attempts: u32,
    before: Before,
    token: Token,
    outcome: Outcome,
    /// What the contract says: the record's status after an accepted
    /// Complete, or the refusal's reason.
    expect: &'static str,
}

impl Case {
    /// Whether the Complete compared writes the record.
    fn writes(&self) -> bool {
        self.token == Token::Own
            && matches!(
                self.before,
                Before::Nothing | Before::Checkpoint | Before::LeaseRanOut
            )
    }
}

const fn case(name: &'static str, before: Before, outcome: Outcome, expect: &'static str) -> Case {
    Case {
        name,
        max_attempts: 0,
        before,
        token: Token::Own,
        outcome,
        expect,
    }
}

const CASES: [Case; 15] = [
    case("success", Before::Nothing, Outcome::Success, "SUCCEEDED"),
    case(
        "success after a checkpoint",
        Before::Checkpoint,
        Outcome::Success,
        "SUCCEEDED",
    ),
    case(
        "success after the lease ran out",
        Before::LeaseRanOut,
        Outcome::Success,
        "SUCCEEDED",
    ),
    case("failure", Before::Nothing, Outcome::Failure, "FAILED"),
    case(
        "failure with a delay of its own",
        Before::Nothing,
        Outcome::FailureRetryAfter,
        "FAILED",
    ),
    case(
        "permanent failure",
        Before::Nothing,
        Outcome::FailurePermanent,
        "FAILED_PERMANENT",
    ),
    Case {
        max_attempts: 1,
        ..case(
            "failure of the last attempt",
            Before::Nothing,
            Outcome::Failure,
            "FAILED_PERMANENT",
        )
    },
    case("release", Before::Nothing, Outcome::Release, "FAILED"),
    case(
        "success again",
        Before::Completed(Outcome::Success),
        Outcome::Success,
        "SUCCEEDED",
    ),
    case(
        "failure again",
        Before::Completed(Outcome::Failure),
        Outcome::Failure,
        "FAILED",
    ),
    case(
        "success after a failure",
        Before::Completed(Outcome::Failure),
        Outcome::Success,
        "ALREADY_COMPLETED",
    ),
    Case {
        token: Token::Stranger,
        ..case(
            "a token never granted",
            Before::Nothing,
            Outcome::Success,
            "LEASE_LOST",
        )
    },
    case(
        "after a takeover",
        Before::TakenOver,
        Outcome::Success,
        "LEASE_LOST",
    ),
    case(
        "past retention",
        Before::Expired,
        Outcome::Success,
        "RECORD_NOT_FOUND",
    ),
    case(
        "no record",
        Before::NoRecord,
        Outcome::Success,
        "RECORD_NOT_FOUND",
    ),
];

fn outcome(outcome: Outcome) -> complete_request::Outcome {
    let failure = |retry_after, permanent| {
        complete_request::Outcome::Failure(proto::Failure {
            error: "it failed".into(),
            permanent,
            retry_after,
        })
    };
    match outcome {
        Outcome::Success => complete_request::Outcome::Success(proto::Success {
            result: b"done".to_vec(),
            content_type: "text/plain".into(),
            status_code: 201,
            result_ref: "ref-1".into(),
        }),
        Outcome::Failure => failure(None, false),
        Outcome::FailureRetryAfter => failure(secs(90), false),
        Outcome::FailurePermanent => failure(None, true),
        Outcome::Release => complete_request::Outcome::Release(proto::Release {}),
    }
}

/// A case's record on one path, ready for the Complete compared.
struct Prepared {
    key: String,
    /// The token the Complete compared carries.
    token: String,
    /// The fencing token of the lease the case acquired (0: none).
    fencing: u64,
}

/// Acquires `key` for `case` through `server` and does what the case does
/// before the Complete compared. Times are set relative to the record's
/// own, so that each path's record keeps the same offsets.
async fn prepare(server: &TestServer, sql: &Client, case: &Case, key: String) -> Prepared {
    let stranger = uuid::Uuid::new_v4().to_string();
    if case.before == Before::NoRecord {
        return Prepared {
            key,
            token: stranger,
            fencing: 0,
        };
    }
    let mut client = server.client.clone();
    let request = proto::AcquireRequest {
        max_attempts: case.max_attempts,
        ..acquire("s", &key)
    };
    let granted = proceed(&mut client, request.clone()).await;
    let own = token(&granted);
    match case.before {
        Before::Nothing | Before::NoRecord => {}
        Before::Checkpoint => {
            // As far as a lease may reach: the lease and the record then
            // end one maximum lease from the extension, whenever it ran.
            client
                .extend_lease(proto::ExtendLeaseRequest {
                    scope: "s".into(),
                    key: key.clone(),
                    lease_token: own.clone(),
                    extend_by: secs(24 * 3600),
                    checkpoint: Some(b"half way".to_vec()),
                })
                .await
                .unwrap();
        }
        Before::LeaseRanOut => {
            set_after_update(sql, &key, &[("lease_expires_at", -60)]).await;
        }
        Before::Completed(first) => {
            complete_ok(&mut client, complete("s", &key, &own, outcome(first))).await;
        }
        Before::TakenOver => {
            set_after_update(sql, &key, &[("lease_expires_at", -60)]).await;
            proceed(&mut client, request).await;
        }
        Before::Expired => {
            let past = [("lease_expires_at", -2), ("expires_at", -1)];
            set_after_update(sql, &key, &past).await;
        }
    }
    Prepared {
        key,
        token: match case.token {
            Token::Own => own,
            Token::Stranger => stranger,
        },
        fencing: granted.lease.expect("lease").fencing_token,
    }
}

/// The Complete compared.
fn compared(case: &Case, prepared: &Prepared) -> proto::CompleteRequest {
    complete("s", &prepared.key, &prepared.token, outcome(case.outcome))
}

/// What one path left: the Complete's answer (its record, or the refusal's
/// code and reason), the record Get reads after it, and what a watcher of
/// the record saw from before the Complete on.
#[derive(Debug, PartialEq)]
struct Seen {
    answer: Result<Shape, (Code, String)>,
    read_back: Result<Shape, Code>,
    watched: Watched,
}

impl Seen {
    async fn of(
        server: &TestServer,
        prepared: &Prepared,
        answer: Result<proto::CompleteResponse, tonic::Status>,
        watcher: Watcher,
    ) -> Seen {
        let answer = match answer {
            Ok(response) => Ok(Shape::of(
                &response.record.expect("record"),
                prepared.fencing,
            )),
            Err(status) => Err((status.code(), reason(&status))),
        };
        let read_back = match server.client.clone().get(get_req("s", &prepared.key)).await {
            Ok(response) => Ok(Shape::of(
                &response.into_inner().record.expect("record"),
                prepared.fencing,
            )),
            Err(status) => Err(status.code()),
        };
        Seen {
            answer,
            read_back,
            watched: watcher.events().await,
        }
    }

    /// The record's status after an accepted Complete, or the reason it
    /// was refused.
    fn label(&self) -> String {
        match &self.answer {
            Ok(record) => record.status.clone(),
            Err((_, reason)) => reason.clone(),
        }
    }
}

/// Every case prepared on `server`, on keys ending in `path`, each with a
/// watcher of its record.
async fn prepare_and_watch(
    server: &TestServer,
    sql: &Client,
    path: &str,
) -> Vec<(Prepared, Watcher)> {
    let mut prepared = Vec::new();
    for case in &CASES {
        let key = format!("{}-{path}", case.name).replace(' ', "-");
        prepared.push(prepare(server, sql, case, key).await);
    }
    let mut watched = Vec::new();
    for prepared in prepared {
        let watcher = Watcher::start(server, &prepared.key).await;
        watched.push((prepared, watcher));
    }
    watched
}

/// What each case left, once its watcher's stream has ended.
async fn seen(
    server: &TestServer,
    prepared: Vec<(Prepared, Watcher)>,
    answers: Vec<Result<proto::CompleteResponse, tonic::Status>>,
) -> Vec<Seen> {
    let mut seen = Vec::new();
    for ((prepared, watcher), answer) in prepared.into_iter().zip(answers) {
        seen.push(Seen::of(server, &prepared, answer, watcher).await);
    }
    seen
}

/// Every case on `server`, each Complete compared sent alone.
async fn alone(server: &TestServer, sql: &Client, path: String) -> Vec<Seen> {
    let prepared = prepare_and_watch(server, sql, &path).await;
    let mut answers = Vec::new();
    for (case, (prepared, _)) in CASES.iter().zip(&prepared) {
        let mut client = server.client.clone();
        let answer = client.complete(compared(case, prepared)).await;
        answers.push(answer.map(tonic::Response::into_inner));
    }
    seen(server, prepared, answers).await
}

/// Every case on `gated`, the Completes compared queued together behind
/// `gate` with an Acquire of a new key, and run as one statement (per
/// node).
async fn group_commit(
    gated: &TestServer,
    path: &str,
    gate: &Gate,
    db: &impl Backend,
    sql: &Client,
) -> Vec<Seen> {
    let path = path.replace(' ', "-");
    let prepared = prepare_and_watch(gated, sql, &path).await;
    let mut client = gated.client.clone();
    let gate_key = format!("gate-complete-{path}");
    let gate_token = token(&proceed(&mut client, acquire("s", &gate_key)).await);
    gate.shut().await;
    let gate_call = tokio::spawn(async move {
        client
            .complete(complete("s", &gate_key, &gate_token, success(b"gate")))
            .await
            .expect("the gate call passes once opened");
    });
    let companion_key = format!("companion-complete-{path}");
    let companion = companion_acquire(gated, &companion_key);
    let calls = || {
        CASES
            .iter()
            .zip(&prepared)
            .map(|(case, (prepared, _))| {
                let mut client = gated.client.clone();
                let request = compared(case, prepared);
                tokio::spawn(async move { client.complete(request).await.map(|r| r.into_inner()) })
            })
            .collect()
    };
    let answers = batched_beside(gate, gated, gate_call, calls, companion).await;
    let written: Vec<String> = CASES
        .iter()
        .zip(&prepared)
        .filter(|(case, _)| case.writes())
        .map(|(_, (prepared, _))| prepared.key.clone())
        .chain([companion_key])
        .collect();
    assert_one_writer_per_node(db, &written).await;
    seen(gated, prepared, answers).await
}

pub async fn complete_leaves_the_same_record_alone_or_in_a_group_commit<B: Backend>() {
    let Some(db) = B::create().await else {
        return;
    };
    let sql = db.connect().await;
    let servers = Servers::start(&db).await;
    let (gated, gate) = gated_servers(&db).await;
    let mut tally = Tally::default();

    // The paths side by side: each waits for its watchers' windows.
    let alone_on_each = servers
        .paths()
        .map(|(path, server)| alone(server, &sql, path.replace(' ', "-")));
    // The group commits one after another: they share the gate.
    let group_commits = async {
        let mut grouped = Vec::new();
        for (path, server) in &gated {
            let seen = group_commit(server, path, &gate, &db, &sql).await;
            grouped.push((path.clone(), seen));
        }
        grouped
    };
    let (alone_on_each, grouped) =
        tokio::join!(futures::future::join_all(alone_on_each), group_commits,);
    let mut seen_on_each = servers
        .paths()
        .map(|(path, _)| path.to_owned())
        .zip(alone_on_each);
    let (reference_path, reference) = seen_on_each.next().expect("the reference path");
    for (case, seen) in CASES.iter().zip(&reference) {
        let what = format!("{} / {reference_path}", case.name);
        let expected = case.expect.to_owned();
        tally.compare(&what, "the contract", &expected, &seen.label());
    }
    for (path, seen) in seen_on_each.chain(grouped) {
        for ((case, expected), got) in CASES.iter().zip(&reference).zip(&seen) {
            let what = format!("{} / {path}", case.name);
            tally.compare(&what, "a single call", expected, got);
        }
    }
    tally.assert_all_agree();
}
