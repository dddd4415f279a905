//! The `sweep` scenario: expired records written straight into the
//! database, then one Sweep call deleting them while `cycle` runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::Args;
use crate::client::{Client, Driver};
use crate::load::cycles_until;
use crate::report::ms;

/// Expired SUCCEEDED records, written straight into the server's table (the
/// fastest way to make many; the coordinator never writes expired rows).
const INSERT_EXPIRED: &str = "
    INSERT INTO idempotency_keys (
        tenant, scope, idempotency_key, status, fingerprint, attempt_count, max_attempts,
        retention, lease_token, lease_request_id, fencing_token,
        created_at, updated_at, completed_at, expires_at)
    SELECT 'default', 'bench.expired', $1 || '-' || i, 'SUCCEEDED', '', 1, 10,
           interval '1 minute', gen_random_uuid(), '', 1,
           now() - interval '2 hours', now() - interval '2 hours',
           now() - interval '2 hours', now() - interval '1 hour'
      FROM generate_series(1, $2::integer) AS i";

pub(crate) async fn sweep_under_load(args: &Args, clients: &[Client], run: &str) {
    let url = args.database();
    let (db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect to the database");
    tokio::spawn(connection);
    let expired = i32::try_from(args.expired).unwrap_or(i32::MAX);
    let inserted = db
        .execute(INSERT_EXPIRED, &[&run, &expired])
        .await
        .expect("insert expired records");
    println!("sweep: {inserted} expired records in place; sweeping them under load");

    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let clients: Vec<Driver> = clients.iter().cloned().map(Driver::Grpc).collect();
        let stop = Arc::clone(&stop);
        let run = format!("{run}-load");
        let n = args.clients;
        tokio::spawn(async move {
            cycles_until(&clients, n, Duration::from_secs(3600), stop, &run, None).await
        })
    };
    // Let the load settle before the sweep starts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut sweeper = clients[0].clone();
    let started = Instant::now();
    let swept = sweeper
        .sweep(idempotency_coordinator::proto::SweepRequest {
            dry_run: false,
            limit: 0,
        })
        .await
        .expect("sweep")
        .into_inner();
    let took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let stats = load.await.expect("load task");
    let worst_ms = stats.acquire.max().max(stats.complete.max()) as f64 / 1000.0;
    println!(
        "sweep: deleted {} in {:.2} s; meanwhile {} clients ran {:.0} cycles/s, slowest call {:.1} ms, acquire p99 {:.2} ms",
        swept.expired_deleted,
        took.as_secs_f64(),
        args.clients,
        stats.cycles as f64 / stats.elapsed.as_secs_f64(),
        worst_ms,
        ms(&stats.acquire, 0.99),
    );
    println!(
        "RESULT scenario=sweep expired={} deleted={} sweep_s={:.2} clients={} ops_per_s={:.0} worst_call_ms={:.1} acquire_p99_ms={:.2} complete_p99_ms={:.2}",
        args.expired,
        swept.expired_deleted,
        took.as_secs_f64(),
        args.clients,
        stats.cycles as f64 / stats.elapsed.as_secs_f64(),
        worst_ms,
        ms(&stats.acquire, 0.99),
        ms(&stats.complete, 0.99),
    );
}
