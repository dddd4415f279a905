//! `idempotency-coordinator serve | migrate`: parse the configuration, set up
//! logging, build, run until SIGTERM or SIGINT.

use std::process::ExitCode;

use clap::Parser;
use idempotency_coordinator::config::DEFAULT_QUERY_TIMEOUT;
use idempotency_coordinator::config::{Cli, Command, ServeConfig};
use idempotency_coordinator::error::cause_chain;
use idempotency_coordinator::startup::{Application, StartupError, run_migrations};
use idempotency_coordinator::store::{Clock, Store, StoreConfig};
use idempotency_coordinator::{shutdown, telemetry};

async fn run(cli: Cli) -> Result<(), StartupError> {
    match cli.command {
        Command::Serve(args) => {
            let app = Application::build(ServeConfig::from(*args)).await?;
            app.run_until(shutdown::signal()).await
        }
        Command::Migrate(db) => {
            let config = StoreConfig {
                database_url: db.database_url,
                pool_size: 1,
                connect_wait: std::time::Duration::from_secs(10),
                query_timeout: DEFAULT_QUERY_TIMEOUT,
                shared_connections: 0,
                batch_size: 1,
            };
            let store = Store::new(&config, Clock::default()).map_err(StartupError::Database)?;
            run_migrations(&store).await.map(|_| ())
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %cause_chain(&e), "exiting");
            ExitCode::FAILURE
        }
    }
}
