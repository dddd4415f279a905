//! The timed load scenarios `cycle`, `replay` and `contend`, each run a
//! second time on the direct-SQL baseline when one is configured, and the
//! cycle loop that `cycle-beside-waiters` and `sweep` run as their load.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idempotency_coordinator::proto::Decision;

use crate::Args;
use crate::client::{Client, Driver};
use crate::cost::{Cost, Meter};
use crate::report::{CallStats, CycleStats, histogram, ms, report, report_cycles};

/// `cycle`: Acquire + Complete on fresh keys, over gRPC and then (with `sql`)
/// on the baseline; returns the gRPC cycles per second and what a cycle
/// cost.
pub(crate) async fn cycle(
    args: &Args,
    grpc: &[Driver],
    sql: Option<&[Driver]>,
    run: &str,
    meter: &Meter,
) -> (f64, Cost) {
    let seconds = Duration::from_secs(args.seconds);
    let before = meter.read().await;
    let stats = cycles_until(
        grpc,
        args.clients,
        seconds,
        Arc::new(AtomicBool::new(false)),
        run,
        args.rate,
    )
    .await;
    let cost = meter.report("cycle", &before, stats.cycles).await;
    let extra = match sql {
        Some(sql) => {
            let base = cycles_until(
                sql,
                args.clients,
                seconds,
                Arc::new(AtomicBool::new(false)),
                &format!("{run}-sql"),
                args.rate,
            )
            .await;
            let sql_per_s = base.cycles as f64 / base.elapsed.as_secs_f64();
            let per_s = stats.cycles as f64 / stats.elapsed.as_secs_f64();
            println!(
                "cycle, direct SQL: {sql_per_s:.0} cycles/s; acquire p99 {:.2} ms",
                ms(&base.acquire, 0.99)
            );
            format!(
                " sql_ops_per_s={sql_per_s:.0} ratio={:.2}",
                per_s / sql_per_s
            )
        }
        None => String::new(),
    };
    let per_s = report_cycles("cycle", args, &stats, &format!("{extra}{}", cost.fields()));
    (per_s, cost)
}

/// `replay` (Acquire on 1,000 keys already SUCCEEDED) or `contend` (all
/// clients on `--hot-keys` keys), over gRPC and then (with `sql`) on the
/// baseline; returns what a call cost.
pub(crate) async fn replay_or_contend(
    args: &Args,
    grpc: &[Driver],
    sql: Option<&[Driver]>,
    run: &str,
    contend: bool,
    meter: &Meter,
) -> Cost {
    let seconds = Duration::from_secs(args.seconds);
    let (name, scope, count) = if contend {
        ("contend", "bench.contend", args.hot_keys.max(1))
    } else {
        ("replay", "bench.replay", 1000)
    };
    let keys: Arc<Vec<String>> = Arc::new((0..count).map(|k| format!("{run}-{k}")).collect());
    if !contend {
        let mut setup = grpc[0].clone();
        for key in keys.iter() {
            let (_, token) = setup.acquire(scope, key).await;
            setup
                .complete(scope, key, token.expect("fresh key"), false)
                .await;
        }
    }
    let before = meter.read().await;
    let stats = acquires(
        grpc,
        args.clients,
        seconds,
        scope,
        Arc::clone(&keys),
        contend,
    )
    .await;
    let cost = meter.report(name, &before, stats.calls).await;
    let mut extra = String::new();
    if let Some(sql) = sql {
        let base = acquires(sql, args.clients, seconds, scope, keys, contend).await;
        println!(
            "{name}, direct SQL: {:.0} acquires/s; p99 {:.2} ms",
            base.per_s(),
            ms(&base.latency, 0.99)
        );
        extra = format!(
            " sql_ops_per_s={:.0} ratio={:.2}",
            base.per_s(),
            stats.per_s() / base.per_s()
        );
    }
    report(
        name,
        args,
        stats.per_s(),
        &stats.latency,
        &format!("{extra}{}", cost.fields()),
    );
    cost
}

/// Acquire + Complete on fresh keys, `clients` at a time, for `duration`.
pub(crate) async fn cycles(
    clients: &[Client],
    n: usize,
    duration: Duration,
    run: &str,
) -> CycleStats {
    let drivers: Vec<Driver> = clients.iter().cloned().map(Driver::Grpc).collect();
    cycles_until(
        &drivers,
        n,
        duration,
        Arc::new(AtomicBool::new(false)),
        run,
        None,
    )
    .await
}

/// Like [`cycles`], ending early when `stop` is set.
pub(crate) async fn cycles_until(
    clients: &[Driver],
    n: usize,
    duration: Duration,
    stop: Arc<AtomicBool>,
    run: &str,
    rate: Option<f64>,
) -> CycleStats {
    let start = Instant::now();
    let end = start + duration;
    // Each client's share of the rate, as a period between cycle starts.
    let period = rate
        .filter(|r| *r > 0.0)
        .map(|r| Duration::from_secs_f64(n as f64 / r));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            let run = run.to_owned();
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let (mut cycle, mut acquire_h, mut complete_h) =
                    (histogram(), histogram(), histogram());
                let mut count = 0u64;
                let mut ticks = period.map(|p| {
                    let mut t = tokio::time::interval_at(
                        tokio::time::Instant::now() + p.mul_f64(i as f64 / n as f64),
                        p,
                    );
                    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                    t
                });
                while Instant::now() < end && !stop.load(Ordering::Relaxed) {
                    if let Some(ticks) = &mut ticks {
                        ticks.tick().await;
                    }
                    let key = format!("{run}-{i}-{count}");
                    let t0 = Instant::now();
                    let (decision, token) = client.acquire("bench.cycle", &key).await;
                    let t1 = Instant::now();
                    assert_eq!(decision, Decision::Proceed as i32, "fresh key");
                    client
                        .complete("bench.cycle", &key, token.expect("lease"), false)
                        .await;
                    let t2 = Instant::now();
                    acquire_h.saturating_record((t1 - t0).as_micros() as u64);
                    complete_h.saturating_record((t2 - t1).as_micros() as u64);
                    cycle.saturating_record((t2 - t0).as_micros() as u64);
                    count += 1;
                }
                (count, cycle, acquire_h, complete_h)
            })
        })
        .collect();
    let mut stats = CycleStats::empty();
    for task in tasks {
        let (count, cycle, acquire_h, complete_h) = task.await.expect("client task");
        stats.cycles += count;
        stats.cycle.add(cycle).expect("same bounds");
        stats.acquire.add(acquire_h).expect("same bounds");
        stats.complete.add(complete_h).expect("same bounds");
    }
    stats.elapsed = start.elapsed();
    stats
}

/// `n` clients each calling Acquire back to back for `duration`: on keys
/// that are done (`replay`: every answer ALREADY_DONE), or on a few hot keys
/// (`contend`: a caller that gets the lease gives it straight back, the
/// others get IN_PROGRESS).
async fn acquires(
    drivers: &[Driver],
    n: usize,
    duration: Duration,
    scope: &'static str,
    keys: Arc<Vec<String>>,
    contend: bool,
) -> CallStats {
    let start = Instant::now();
    let end = start + duration;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let mut driver = drivers[i % drivers.len()].clone();
            let keys = Arc::clone(&keys);
            tokio::spawn(async move {
                let mut latency = histogram();
                let mut count = 0u64;
                while Instant::now() < end {
                    let key = &keys[(i + count as usize) % keys.len()];
                    let t0 = Instant::now();
                    let (decision, token) = driver.acquire(scope, key).await;
                    latency.saturating_record(t0.elapsed().as_micros() as u64);
                    count += 1;
                    if contend {
                        if let Some(token) = token {
                            driver.complete(scope, key, token, true).await;
                        }
                    } else {
                        assert_eq!(decision, Decision::AlreadyDone as i32, "a replay");
                    }
                }
                (count, latency)
            })
        })
        .collect();
    let mut stats = CallStats {
        calls: 0,
        elapsed: Duration::ZERO,
        latency: histogram(),
    };
    for task in tasks {
        let (count, latency) = task.await.expect("client task");
        stats.calls += count;
        stats.latency.add(latency).expect("same bounds");
    }
    stats.elapsed = start.elapsed();
    stats
}
