//! Added latency, measured (not asserted): the same upstream direct and
//! through the sidecar, one request at a time. Ignored by default; run with
//! `cargo test --release -p idempotency-sidecar --test proxy -- --ignored
//! --nocapture added_latency`.

use std::time::{Duration, Instant};

use http::Method;

use crate::support::{Env, TestClient};

const REQUESTS: usize = 500;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at]
}

async fn measure<F, Fut>(what: &str, mut send: F)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for i in 0..20 {
        send(REQUESTS + i).await;
    }
    let mut took = Vec::with_capacity(REQUESTS);
    let start = Instant::now();
    for i in 0..REQUESTS {
        let sent = Instant::now();
        send(i).await;
        took.push(sent.elapsed());
    }
    let total = start.elapsed();
    took.sort();
    println!(
        "{what:<32} p50 {:>8.0?}  p99 {:>8.0?}  {:>6.0} req/s (one at a time)",
        percentile(&took, 0.5),
        percentile(&took, 0.99),
        REQUESTS as f64 / total.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a test"]
async fn added_latency() {
    let env = Env::start(&[]).await;
    let direct = TestClient::new(env.upstream.addr);
    let sidecar = env.client.clone();
    measure("direct POST", |_| {
        let direct = direct.clone();
        async move {
            direct.send(Method::POST, "/pay", None, "{}", &[]).await;
        }
    })
    .await;
    measure("sidecar POST, no key (passed)", |_| {
        let sidecar = sidecar.clone();
        async move {
            sidecar.send(Method::POST, "/pay", None, "{}", &[]).await;
        }
    })
    .await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    measure("sidecar POST, new key (stored)", |i| {
        let (sidecar, key) = (sidecar.clone(), format!("\"{run}-{i}\""));
        async move {
            sidecar.post("/pay", &key, "{}").await;
        }
    })
    .await;
    measure("sidecar POST, same key (replay)", |i| {
        let (sidecar, key) = (sidecar.clone(), format!("\"{run}-{i}\""));
        async move {
            assert!(sidecar.post("/pay", &key, "{}").await.replayed());
        }
    })
    .await;
}
