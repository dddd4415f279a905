//! Readiness: the health status of `idempotency.v1.Coordinator` follows the
//! database. A dedicated connection (not one from the pool, so a busy pool is
//! not mistaken for a dead database) is asked `SELECT 1` every interval;
//! NOT_SERVING as soon as a check fails or takes longer than the interval,
//! SERVING again on its own once the database answers.

use std::time::Duration;

use tokio_postgres::NoTls;
use tonic_health::server::HealthReporter;

use crate::error::cause_chain;
use crate::proto::coordinator_server::CoordinatorServer;
use crate::service::CoordinatorService;

/// Readiness as the health service reports it.
async fn report(reporter: &HealthReporter, ready: bool, was: &mut Option<bool>) {
    if *was == Some(ready) {
        return;
    }
    if ready {
        tracing::info!("database answers: ready");
        reporter
            .set_serving::<CoordinatorServer<CoordinatorService>>()
            .await;
    } else {
        reporter
            .set_not_serving::<CoordinatorServer<CoordinatorService>>()
            .await;
    }
    *was = Some(ready);
}

/// Runs until dropped (the server aborts it at shutdown).
pub async fn watch_database(
    pg: tokio_postgres::Config,
    reporter: HealthReporter,
    interval: Duration,
) {
    let mut was = None;
    loop {
        match tokio::time::timeout(interval * 5, pg.connect(NoTls)).await {
            Ok(Ok((client, connection))) => {
                let connection = tokio::spawn(connection);
                loop {
                    let ping = tokio::time::timeout(interval, client.simple_query("SELECT 1"));
                    match ping.await {
                        Ok(Ok(_)) => report(&reporter, true, &mut was).await,
                        Ok(Err(e)) => {
                            tracing::warn!(error = %cause_chain(&e), "database check failed: not ready");
                            break;
                        }
                        Err(_) => {
                            tracing::warn!(?interval, "database check timed out: not ready");
                            break;
                        }
                    }
                    tokio::time::sleep(interval).await;
                }
                connection.abort();
            }
            Ok(Err(e)) => {
                if was != Some(false) {
                    tracing::warn!(error = %cause_chain(&e), "cannot connect to the database: not ready");
                }
            }
            Err(_) => {
                if was != Some(false) {
                    tracing::warn!("connecting to the database timed out: not ready");
                }
            }
        }
        report(&reporter, false, &mut was).await;
        tokio::time::sleep(interval).await;
    }
}
