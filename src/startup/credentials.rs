//! The credentials and certificates while the server runs: what is said of
//! authentication at start, and reading them again on SIGHUP.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::auth::Authenticator;
use crate::telemetry::cause_chain;
use crate::tls::Tls;

/// Says whether callers must authenticate.
pub(super) fn announce(auth: &Authenticator) {
    if auth.is_on() {
        tracing::info!("authentication on: bearer tokens required");
    } else {
        tracing::warn!(
            "authentication is off: every caller is the one default tenant and may Sweep; pass --auth-tokens to require tokens"
        );
    }
}

/// Reads the credentials and certificates again on every SIGHUP, without
/// touching connections, until `stop` is cancelled; a bad file leaves the
/// old ones in force.
pub(super) async fn reload_on_hangup(
    auth: Arc<Authenticator>,
    tls: Option<Arc<Tls>>,
    stop: CancellationToken,
) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP; credentials are not reloaded");
            stop.cancelled().await;
            return;
        };
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                hangup = hangups.recv() => {
                    if hangup.is_none() {
                        return;
                    }
                }
            }
            reload(&auth, tls.as_deref());
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (auth, tls);
        stop.cancelled().await;
    }
}

/// Reads the credentials, and the certificates when TLS is on, again.
#[cfg_attr(not(unix), allow(dead_code))]
fn reload(auth: &Authenticator, tls: Option<&Tls>) {
    match auth.reload() {
        Ok(n) => tracing::info!(credentials = n, "credentials reloaded"),
        Err(e) => tracing::error!(
            error = %cause_chain(&e),
            "credentials not reloaded; the previous ones stay in force"
        ),
    }
    if let Some(tls) = tls {
        match tls.reload() {
            Ok(()) => tracing::info!("TLS certificates reloaded"),
            Err(e) => tracing::error!(
                error = %cause_chain(&e),
                "TLS certificates not reloaded; the previous ones stay in force"
            ),
        }
    }
}
