//! What the run-once template costs over the bare generated stub.
//!
//! Against a running coordinator, measures the median of N cycles (1,000
//! unless `--cycles`) of
//!   (a) `run_once` on a fresh key: Acquire PROCEED, the work (returns at
//!       once), Complete, with the heartbeat task started and stopped; and
//!   (b) the bare stub's Acquire and Complete with the same fields,
//! alternated in rounds (5 unless `--rounds`) after a warm-up, and prints
//! both medians and the difference per cycle.
//!
//!   cargo run --release -p idempotency-client --example overhead -- --target http://127.0.0.1:50051

use std::time::{Duration, Instant};

use idempotency_client::proto::coordinator_client::CoordinatorClient;
use idempotency_client::proto::{
    AcquireRequest, CompleteRequest, Decision, Success, acquire_request::RequestFingerprint,
    complete_request::Outcome,
};
use idempotency_client::{Client, ClientOptions, Fingerprint, RunOptions, WorkError};

const SCOPE: &str = "bench.overhead";

struct Args {
    target: String,
    cycles: usize,
    rounds: usize,
    token: Option<String>,
}

fn args() -> Args {
    let mut args = Args {
        target: "http://127.0.0.1:50051".into(),
        cycles: 1000,
        rounds: 5,
        token: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--target" => args.target = value(),
            "--cycles" => args.cycles = value().parse().expect("--cycles: a number"),
            "--rounds" => args.rounds = value().parse().expect("--rounds: a number"),
            "--token" => args.token = Some(value()),
            other => {
                panic!("unknown flag {other}; flags: --target URL --cycles N --rounds N --token T")
            }
        }
    }
    if !args.target.contains("://") {
        args.target = format!("http://{}", args.target);
    }
    args
}

fn key() -> String {
    format!("k-{}", uuid::Uuid::new_v4().simple())
}

async fn library_cycle(client: &Client, options: &RunOptions) -> Duration {
    let key = key();
    let start = Instant::now();
    let done = client
        .run_once(
            SCOPE,
            &key,
            Fingerprint::Exact("f".into()),
            options,
            |lease| async move { Ok::<_, WorkError<String>>(lease.attempt()) },
        )
        .await
        .expect("run_once");
    let elapsed = start.elapsed();
    assert!(!done.replayed);
    elapsed
}

/// A request as the library sends it: with a deadline and the token.
fn with_auth<M>(message: M, token: Option<&str>) -> tonic::Request<M> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(Duration::from_secs(20));
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    request
}

async fn stub_cycle(
    stub: &mut CoordinatorClient<tonic::transport::Channel>,
    token: Option<&str>,
) -> Duration {
    let key = key();
    let start = Instant::now();
    let acquired = stub
        .acquire(with_auth(
            AcquireRequest {
                scope: SCOPE.into(),
                key: key.clone(),
                request_fingerprint: Some(RequestFingerprint::Fingerprint("f".into())),
                lease_ttl: Some(prost_types::Duration {
                    seconds: 60,
                    nanos: 0,
                }),
                wait: Some(prost_types::Duration {
                    seconds: 10,
                    nanos: 0,
                }),
                request_id: uuid::Uuid::new_v4().to_string(),
                ..AcquireRequest::default()
            },
            token,
        ))
        .await
        .expect("acquire")
        .into_inner();
    assert_eq!(acquired.decision(), Decision::Proceed);
    let lease = acquired.lease.expect("a lease");
    stub.complete(with_auth(
        CompleteRequest {
            scope: SCOPE.into(),
            key,
            lease_token: lease.token,
            outcome: Some(Outcome::Success(Success {
                result: serde_json::to_vec(&lease.attempt).unwrap(),
                content_type: "application/json".into(),
                ..Success::default()
            })),
        },
        token,
    ))
    .await
    .expect("complete");
    start.elapsed()
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[tokio::main]
async fn main() {
    let args = args();
    let client = Client::connect(
        args.target.clone(),
        ClientOptions {
            bearer_token: args.token.clone(),
            ..ClientOptions::default()
        },
    )
    .await
    .expect("connect the client");
    let mut stub = CoordinatorClient::connect(args.target.clone())
        .await
        .expect("connect the stub");
    let options = RunOptions::default(); // heartbeat on (every 20 s)
    let token = args.token.as_deref();

    for _ in 0..50 {
        library_cycle(&client, &options).await;
        stub_cycle(&mut stub, token).await;
    }

    let per_round = args.cycles.div_ceil(args.rounds);
    let (mut library, mut bare) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        // Each round runs both, the order swapped every other round.
        for first in [round % 2 == 0, round % 2 != 0] {
            for _ in 0..per_round {
                if first {
                    library.push(library_cycle(&client, &options).await);
                } else {
                    bare.push(stub_cycle(&mut stub, token).await);
                }
            }
        }
    }
    let (a, b) = (median(&mut library), median(&mut bare));
    println!(
        "cycles: {} of each, in {} rounds, against {}",
        library.len(),
        args.rounds,
        args.target
    );
    println!(
        "run_once (Acquire + Complete, heartbeat on): median {:>8.1} µs",
        a.as_secs_f64() * 1e6
    );
    println!(
        "bare stub (Acquire + Complete):              median {:>8.1} µs",
        b.as_secs_f64() * 1e6
    );
    println!(
        "overhead per cycle:                                 {:>+8.1} µs",
        (a.as_secs_f64() - b.as_secs_f64()) * 1e6
    );
}
