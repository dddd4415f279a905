//! Bodies that trickle, without credentials: the budget is charged by the
//! bytes that arrived and shared by client, and a body that stops arriving
//! is answered 408 at the body idle timeout.

use std::time::Duration;

use http::StatusCode;

use crate::raw::{more_files, open, until_text};
use crate::support::{Env, fresh_key};

const SLOW: usize = 64;
const LEGITIMATE: usize = 40;

fn slow_request(i: usize) -> Vec<u8> {
    // Half declare 1 MiB, half are chunked; each sends one byte of body.
    let (framing, first) = if i.is_multiple_of(2) {
        ("content-length: 1048576", "{")
    } else {
        ("transfer-encoding: chunked", "1\r\n{\r\n")
    };
    format!(
        "POST /pay HTTP/1.1\r\nhost: x\r\nidempotency-key: \"slow-{i}\"\r\ncontent-type: application/json\r\n{framing}\r\n\r\n{first}"
    )
    .into_bytes()
}

#[tokio::test]
async fn sixty_four_slow_anonymous_bodies_leave_95_percent_of_keyed_posts_served() {
    more_files();
    // The idle timeout out of the way: the budget alone is under test.
    let env = Env::start(&["--request-body-idle-timeout", "60s"]).await;
    let mut slow = Vec::with_capacity(SLOW);
    for i in 0..SLOW {
        slow.push(open(env.sidecar.addr, &slow_request(i)).await);
    }
    let mut served = 0;
    for _ in 0..LEGITIMATE {
        let reply = env
            .client
            .post("/pay", &fresh_key(), "{\"amount\":1}")
            .await;
        if reply.status == StatusCode::CREATED {
            served += 1;
        }
    }
    eprintln!("{served} of {LEGITIMATE} keyed POSTs served with {SLOW} slow bodies held");
    assert!(
        served * 100 >= LEGITIMATE * 95,
        "{served} of {LEGITIMATE} keyed POSTs served with {SLOW} slow bodies held"
    );
    drop(slow);
}

#[tokio::test]
async fn a_body_that_stops_arriving_is_408_at_the_body_idle_timeout() {
    let env = Env::start(&["--request-body-idle-timeout", "1s"]).await;
    let mut slow = open(env.sidecar.addr, &slow_request(0)).await;
    let answered = until_text(&mut slow, "\r\n\r\n", Duration::from_secs(5)).await;
    let (answer, took) =
        answered.expect("no answer within 5 s to a body stalled (body idle timeout 1 s)");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        took >= Duration::from_millis(900),
        "answered after {took:?}"
    );
    assert_eq!(env.upstream.count("/pay"), 0);
}
