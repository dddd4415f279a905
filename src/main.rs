//! `idempotency-coordinator serve | migrate | health`: parse the arguments,
//! start the runtime's threads (`--worker-threads`), set up logging and the
//! span exporter, run the command (each command's flow is in
//! `startup::commands`), send the last spans.

use std::process::ExitCode;

use clap::Parser;
use idempotency_coordinator::config::{Cli, Command};
use idempotency_coordinator::startup::{StartupError, commands};
use idempotency_coordinator::telemetry;
use idempotency_coordinator::telemetry::cause_chain;

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

/// Runs the command asked for.
async fn run(cli: Cli) -> Result<(), StartupError> {
    match cli.command {
        Command::Serve(args) => commands::serve(args).await,
        Command::Health(args) => commands::health(args).await,
        Command::Migrate(db) => commands::migrate(db).await,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if cli.worker_threads > 0 {
        runtime.worker_threads(usize::from(cli.worker_threads));
    }
    match runtime.build() {
        Ok(runtime) => runtime.block_on(start(cli)),
        Err(e) => {
            eprintln!("idempotency-coordinator: cannot start its threads: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Sets up logging and spans, runs the command, sends the last spans.
async fn start(cli: Cli) -> ExitCode {
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
