//! The `idempotency-sidecar` binary: parse flags, start logging, start the
//! sidecar, and drain on SIGTERM or Ctrl-C.

use clap::Parser as _;
use idempotency_sidecar::config::Args;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
