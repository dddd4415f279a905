//! A worker cut off under load, not stopped: every packet to and from it is
//! dropped and no connection is refused or closed (a proxy in front of it
//! stops forwarding; the cluster and the server know the worker only by
//! the proxy's address). Calls on its keys answer UNAVAILABLE within their
//! deadline (never DEADLINE_EXCEEDED: the server stops waiting for the
//! node before the caller's deadline), calls on the other worker's keys keep answering, and once the
//! network is back nothing is left behind: its keys answer again, no
//! prepared transaction or open transaction of the cut-off sessions stays
//! on any node, and the history checker finds no violation.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use idempotency_bench::history::Call;
use idempotency_bench::recorder::now_us;

use crate::harness::CitusDatabase;
use crate::load::{self, Load, codes, secs, went_to_database};
use crate::placement;
use crate::proxy::{Mode, Proxy};
use crate::setup::{Env, serial};

/// How long the worker stays cut off at least: past several deadlines and
/// the server's connect wait, so that every way a call can wait on it has
/// run out at least once.
const CUT: Duration = Duration::from_secs(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_worker_s_keys_answer_unavailable_in_time_and_the_other_worker_s_keep_answering()
{
    let _serial = serial().await;
    let Some(cluster) = Env::cluster().await else {
        return;
    };
    let [cut, other] = cluster.workers();
    let proxy = Proxy::start(cluster.socket(cut)).await;
    let db = CitusDatabase::create_through(cluster, [proxy.port, other]).await;
    let env = Env::start_on(db).await;
    let mut by_node = placement::keys_by_node(&env.db, 600).await;
    let cut_pool = by_node
        .remove(&proxy.port)
        .expect("keys on the cut-off worker");
    let other_pool = by_node.remove(&other).expect("keys on the other worker");
    let (cut_keys, other_keys): (HashSet<String>, HashSet<String>) = (
        cut_pool.iter().cloned().collect(),
        other_pool.iter().cloned().collect(),
    );
    let load = Load::start(env.addr, &[cut_pool, other_pool], 3).await;
    let t0 = now_us();
    load.until(
        Duration::from_secs(10),
        "both workers' keys answer",
        |calls| answered(calls, &cut_keys, t0, 3) && answered(calls, &other_keys, t0, 3),
    )
    .await;

    proxy.set(Mode::Blackhole);
    let cut_at = now_us();
    let held = Instant::now();
    load.until(
        Duration::from_secs(10),
        "a call on the cut-off worker's keys answers UNAVAILABLE",
        |calls| {
            calls.iter().any(|c| {
                cut_keys.contains(&c.key) && c.start_us >= cut_at && c.code == "UNAVAILABLE"
            })
        },
    )
    .await;
    load.until(
        Duration::from_secs(20),
        "the other worker's keys answer while one is cut off",
        |calls| answered(calls, &other_keys, cut_at, 60),
    )
    .await;
    tokio::time::sleep(CUT.saturating_sub(held.elapsed())).await;

    proxy.set(Mode::Pass);
    let back_at = now_us();
    load.until(
        Duration::from_secs(20),
        "the cut-off worker's keys answer again",
        |calls| answered(calls, &cut_keys, back_at, 3),
    )
    .await;
    let history = load.stop(&env.db).await;
    let calls = load::calls(&history);
    println!(
        "CUT OFF: cut-off worker's keys while cut off ({:.2} s): {}",
        secs(cut_at, back_at),
        codes(&calls, &cut_keys, cut_at, back_at)
    );
    println!(
        "CUT OFF: other worker's keys meanwhile: {}",
        codes(&calls, &other_keys, cut_at, back_at)
    );

    load::assert_calls_answered(&calls, t0);
    let failed: Vec<_> = calls
        .iter()
        .filter(|c| other_keys.contains(&c.key) && c.start_us >= cut_at && c.start_us < back_at)
        .filter(|c| !c.ok())
        .map(|c| format!("{:?} {} {} ({})", c.kind, c.key, c.code, c.reason))
        .collect();
    assert!(
        failed.is_empty(),
        "the other worker's keys failed while one was cut off:\n{}",
        failed.join("\n")
    );
    // The server's wait for a node ends before the caller's deadline, and
    // it answers UNAVAILABLE then: a call on the cut-off worker's keys
    // never runs out its caller's deadline waiting on it.
    let late: Vec<_> = calls
        .iter()
        .filter(|c| cut_keys.contains(&c.key) && c.start_us >= cut_at && c.end_us < back_at)
        .filter(|c| c.code == "DEADLINE_EXCEEDED")
        .map(|c| {
            format!(
                "{:?} {} after {} ms ({})",
                c.kind,
                c.key,
                c.took_us() / 1000,
                c.reason
            )
        })
        .collect();
    assert!(
        late.is_empty(),
        "calls on the cut-off worker's keys answered DEADLINE_EXCEEDED, not UNAVAILABLE:\n{}",
        late.join("\n")
    );
    load::assert_history_clean(&history);
    nothing_left_behind(&env.db, &[proxy.port, other]).await;
    env.stop().await;
}

/// Whether at least `n` calls on `keys` begun since `since` reached the
/// database and answered.
fn answered(calls: &[Call], keys: &HashSet<String>, since: i64, n: usize) -> bool {
    calls
        .iter()
        .filter(|c| keys.contains(&c.key) && c.start_us >= since && went_to_database(c))
        .count()
        >= n
}

/// Once the network is back: Citus's recovery of prepared transactions
/// leaves none on any node, and no session of the test's database stays
/// open in a transaction (a row lock the cut-off calls took, held by a
/// session whose client is gone). Waited for with a deadline: the sessions
/// that were cut off learn that their client left once their bytes flow.
async fn nothing_left_behind(db: &CitusDatabase, workers: &[u16]) {
    let coordinator = db.connect().await;
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        coordinator
            .execute("SELECT recover_prepared_transactions()", &[])
            .await
            .expect("recover prepared transactions");
        let mut left = Vec::new();
        for port in workers {
            let node = db.connect_worker(*port).await;
            let row = node
                .query_one(
                    "SELECT (SELECT count(*) FROM pg_prepared_xacts),
                            (SELECT count(*) FROM pg_stat_activity
                              WHERE datname = current_database() AND pid <> pg_backend_pid()
                                AND state LIKE 'idle in transaction%')",
                    &[],
                )
                .await
                .expect("read what the node holds");
            let (prepared, open): (i64, i64) = (row.get(0), row.get(1));
            if prepared + open > 0 {
                left.push(format!(
                    "node {port}: {prepared} prepared, {open} open in a transaction"
                ));
            }
        }
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < end,
            "left behind after the worker came back: {}",
            left.join("; ")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
