//! A server whose background sweeper's totals the test can read.

use std::sync::Arc;

use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::startup::Application;

use super::server::{TestServer, init_tracing, run_app};

/// A server and its background sweeper's totals.
pub struct TotalsServer {
    pub server: TestServer,
    pub totals: Arc<idempotency_coordinator::sweeper::SweepTotals>,
}

pub async fn start_server_with_totals(config: ServeConfig) -> TotalsServer {
    init_tracing();
    let app = Application::build(config).await.expect("build the server");
    let totals = app.sweep_totals();
    TotalsServer {
        server: run_app(app).await,
        totals,
    }
}
