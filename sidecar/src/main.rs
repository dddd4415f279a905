//! The `idempotency-sidecar` binary: parse flags, start the runtime
//! (`--worker-threads`) and logging, start the sidecar, and drain on SIGTERM
//! or Ctrl-C.

use std::io::IsTerminal as _;

use clap::Parser as _;
use idempotency_sidecar::config::Args;
use tracing_subscriber::EnvFilter;

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let runtime = match args.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        0 => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    };
    match runtime {
        Ok(runtime) => runtime.block_on(serve(args)),
        Err(error) => {
            eprintln!("idempotency-sidecar: cannot start the runtime: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> std::process::ExitCode {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colours for a terminal only: a log file or a collector gets the
        // text without escape sequences.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if args.log_format == "json" {
        logs.json().init();
    } else {
        logs.init();
    }
    let running = match idempotency_sidecar::start(&args).await {
        Ok(running) => running,
        Err(error) => {
            tracing::error!(%error, "the sidecar could not start");
            return std::process::ExitCode::FAILURE;
        }
    };
    tracing::info!(addr = %running.addr, upstream = %args.upstream, "listening");
    tracing::info!(addr = %running.metrics_addr, "metrics listening");
    shutdown_signal().await;
    tracing::info!("draining");
    running.drain();
    running.stopped().await;
    tracing::info!("stopped");
    std::process::ExitCode::SUCCESS
}

/// SIGTERM (as Kubernetes sends) or Ctrl-C.
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
