//! The scenarios with calls parked on held keys: `cycle-beside-waiters`
//! (the plain path while others wait) and `wait` (one Complete releasing
//! every waiter).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idempotency_coordinator::proto::Decision;

use crate::Args;
use crate::client::{Client, acquire, connect, succeed, waiting};
use crate::load::cycles;
use crate::report::{histogram, ms, report_cycles, resident_mib};

/// Takes a lease on `key` so that others find it IN_PROGRESS.
async fn hold(client: &mut Client, scope: &str, key: &str) -> String {
    let mut req = acquire(scope, key);
    req.lease_ttl = Some(prost_types::Duration {
        seconds: 600,
        nanos: 0,
    });
    let granted = client.acquire(req).await.expect("hold").into_inner();
    assert_eq!(granted.decision, Decision::Proceed as i32, "fresh key");
    granted.lease.expect("lease").token
}

/// Connections enough that no connection carries more than 100 waiting
/// streams (servers commonly allow 100 to 200 per connection).
fn waiter_connections(args: &Args) -> usize {
    args.connections.max(args.waiters.div_ceil(100))
}

pub(crate) async fn cycle_beside_waiters(args: &Args, clients: &[Client], run: &str) -> f64 {
    let scope = "bench.parked";
    let held_keys = args.waiters.div_ceil(10).max(1);
    let mut holder = clients[0].clone();
    let mut tokens = Vec::with_capacity(held_keys);
    for k in 0..held_keys {
        tokens.push(hold(&mut holder, scope, &format!("{run}-held-{k}")).await);
    }
    let waiter_clients = connect(&args.target, waiter_connections(args)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let waiters: Vec<_> = (0..args.waiters)
        .map(|i| {
            let mut client = waiter_clients[i % waiter_clients.len()].clone();
            let key = format!("{run}-held-{}", i % held_keys);
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                // Wait again whenever a window ends, until the run is over.
                while !stop.load(Ordering::SeqCst) {
                    let answer = client.acquire(waiting(scope, &key)).await.expect("wait");
                    if answer.into_inner().decision != Decision::InProgress as i32 {
                        break;
                    }
                }
            })
        })
        .collect();
    // Let the waiters reach the server and park before measuring.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let stats = cycles(
        clients,
        args.clients,
        Duration::from_secs(args.seconds),
        &format!("{run}-beside"),
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    for (k, token) in tokens.into_iter().enumerate() {
        holder
            .complete(succeed(scope, &format!("{run}-held-{k}"), token))
            .await
            .expect("release the held keys");
    }
    for waiter in waiters {
        waiter.await.expect("waiter task");
    }
    report_cycles(
        "cycle-beside-waiters",
        args,
        &stats,
        &format!(" background_waiters={}", args.waiters),
    )
}

/// Returns once every waiter is parked on the first server: read from its
/// `waiters_parked` gauge (with `--metrics`, within 60 s, then a second
/// more for the allocator to hand back what the burst of arrivals freed,
/// which it does within half a second), or after 2 s without it.
async fn parked(args: &Args) {
    let Some(address) = args.metrics.first() else {
        tokio::time::sleep(Duration::from_secs(2)).await;
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let page = crate::cost::scrape(address).await.unwrap_or_default();
        let parked = page
            .lines()
            .find_map(|line| line.strip_prefix("idempotency_waiters_parked "))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        if parked >= args.waiters as f64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {parked} of {} waiters parked within 60 s",
            args.waiters
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Returns the first server's resident memory, in MiB, while every waiter
/// was parked (with `--server-pid`).
pub(crate) async fn wait_release(args: &Args, clients: &[Client], run: &str) -> Option<f64> {
    let scope = "bench.wait";
    let key = format!("{run}-one");
    let mut holder = clients[0].clone();
    let token = hold(&mut holder, scope, &key).await;
    let waiter_clients = connect(&args.target, waiter_connections(args)).await;
    let waiters: Vec<_> = (0..args.waiters)
        .map(|i| {
            let mut client = waiter_clients[i % waiter_clients.len()].clone();
            let key = key.clone();
            tokio::spawn(async move {
                let answer = client.acquire(waiting(scope, &key)).await.expect("wait");
                (answer.into_inner().decision, Instant::now())
            })
        })
        .collect();
    parked(args).await;
    let rss = args.server_pid.first().copied().and_then(resident_mib);
    if let Some(rss) = rss {
        println!(
            "wait: server resident memory with {} waiters parked: {rss:.1} MiB",
            args.waiters
        );
    }

    let released = Instant::now();
    holder
        .complete(succeed(scope, &key, token))
        .await
        .expect("complete");
    let completed = released.elapsed();
    let mut delays = histogram();
    let mut last = Duration::ZERO;
    for waiter in waiters {
        let (decision, at) = waiter.await.expect("waiter task");
        assert_eq!(
            decision,
            Decision::AlreadyDone as i32,
            "every waiter gets the result"
        );
        let delay = at.saturating_duration_since(released);
        last = last.max(delay);
        delays.saturating_record(delay.as_micros() as u64);
    }
    println!(
        "wait: {} waiters released by one Complete (which took {:.2} ms): median answer after {:.2} ms, last after {:.2} ms",
        args.waiters,
        completed.as_secs_f64() * 1000.0,
        ms(&delays, 0.5),
        last.as_secs_f64() * 1000.0,
    );
    println!(
        "RESULT scenario=wait waiters={} complete_ms={:.2} p50_ms={:.2} p99_ms={:.2} last_ms={:.2}{}",
        args.waiters,
        completed.as_secs_f64() * 1000.0,
        ms(&delays, 0.5),
        ms(&delays, 0.99),
        last.as_secs_f64() * 1000.0,
        rss.map(|mib| format!(" server_rss_mib={mib:.1}"))
            .unwrap_or_default(),
    );
    rss
}
