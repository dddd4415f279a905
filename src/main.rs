//! `idempotency-coordinator serve | migrate`: parse the configuration, set up
//! logging and the span exporter, start the private PostgreSQL when no
//! database URL is given, bind, serve (waiting for the database meanwhile)
//! until SIGTERM or SIGINT, stop the private PostgreSQL, send the last
//! spans.

use std::future::Future;
use std::process::ExitCode;

use clap::Parser;
use idempotency_coordinator::config::{Cli, Command, DatabaseArgs, ServeConfig};
use idempotency_coordinator::embedded::{self, Embedded};
use idempotency_coordinator::error::cause_chain;
use idempotency_coordinator::startup::{Application, Listeners, StartupError, wait_for_database};
use idempotency_coordinator::store::{Clock, Store, StoreConfig, connect_error};
use idempotency_coordinator::{shutdown, telemetry};

/// jemalloc rather than the system allocator: a burst of calls (ten thousand
/// waiters arriving at once) frees most of what it allocated, and glibc's
/// malloc keeps those holes resident, fragmented between the calls that stay;
/// jemalloc packs allocations by size and hands freed pages back.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read before `main`: freed pages go back to the system
/// within half a second, from jemalloc's own background thread rather than
/// from a call's thread; one arena, and thread caches only for objects up to
/// 1 KiB, so that memory a burst freed is not kept per thread. The server is
/// bound by database round trips, not by allocation, and these cost no
/// measurable throughput (README, Performance). `_RJEM_MALLOC_CONF` in the
/// environment overrides them (`narenas:4` on a host with many cores, say).
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &u8 =
    &b"background_thread:true,narenas:1,lg_tcache_max:10,dirty_decay_ms:500,muzzy_decay_ms:0\0"[0];

/// Runs `work` on the database URL given, or on a private PostgreSQL
/// started for it and stopped after it, whatever `work` returned.
async fn on_database<F, Fut>(db: &DatabaseArgs, work: F) -> Result<(), StartupError>
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Result<(), StartupError>>,
{
    if let Some(url) = &db.database_url {
        return work(url.clone()).await;
    }
    let data_dir = db
        .data_dir
        .clone()
        .unwrap_or_else(embedded::default_data_dir);
    let embedded = Embedded::start(&data_dir).await?;
    let done = work(embedded.database_url()).await;
    embedded.stop().await;
    done
}

async fn run(cli: Cli) -> Result<(), StartupError> {
    match cli.command {
        Command::Serve(mut args) => {
            // The ports first: one in use is said before a private
            // PostgreSQL is started for nothing.
            let listeners =
                Listeners::bind(args.listen, args.http_listen, args.metrics_listen).await?;
            let db = args.database.clone();
            on_database(&db, |url| async move {
                args.database.database_url = Some(url);
                // Serves at once; the database is waited for while serving.
                let app = Application::bind_on(ServeConfig::from(*args), listeners).await?;
                app.run_until(shutdown::signal()).await
            })
            .await
        }
        Command::Health(args) => idempotency_coordinator::health::check(&args)
            .await
            .map_err(|e| StartupError::Unhealthy(e.to_string())),
        Command::Migrate(db) => {
            on_database(&db, |url| async move {
                let pg = connect_error::check_url(&url)?;
                let config = StoreConfig::for_migrations(url);
                let store =
                    Store::new(&config, Clock::default()).map_err(StartupError::Database)?;
                // One attempt: whatever runs `migrate` (a Job, Compose)
                // retries it.
                wait_for_database(&store, &pg, true, Some(std::time::Duration::ZERO)).await
            })
            .await
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let endpoint = telemetry::otlp_endpoint(cli.otlp_endpoint.as_deref());
    let telemetry = match telemetry::init(cli.log_format, endpoint.as_deref()) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            tracing::error!(error = %cause_chain(&e), "exiting");
            return ExitCode::FAILURE;
        }
    };
    let done = run(cli).await;
    // The last spans are sent before the process goes.
    telemetry.shutdown().await;
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %cause_chain(&e), "exiting");
            ExitCode::FAILURE
        }
    }
}
