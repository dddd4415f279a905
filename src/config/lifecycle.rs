//! Start, readiness and shutdown: how long to wait for the database at
//! start, how often readiness asks it, and how long to keep serving once
//! a shutdown begins.

use std::time::Duration;

use clap::Args;

use super::hd;

/// How often readiness asks the database whether it answers.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(1);
/// How long `serve` waits for the database at start before it exits: longer
/// than PostgreSQL takes to start, recover from a crash or fail over to a
/// standby (usually well under a minute or two), short enough that a
/// database that will not come (a wrong host, a role nobody creates) ends in
/// an exit that supervisors count and show, not in a process that waits
/// unnoticed.
pub const DEFAULT_DATABASE_WAIT: Duration = Duration::from_secs(300);

/// Waiting for the database at start, readiness, and shutdown.
#[derive(Debug, Clone, Args)]
pub struct LifecycleArgs {
    /// On SIGTERM/SIGINT, how long to keep serving after readiness turns
    /// NOT_SERVING, so load balancers stop sending new calls first.
    #[arg(long, env = "IDEMPOTENCY_SHUTDOWN_DELAY", default_value_t = hd(Duration::ZERO))]
    pub shutdown_delay: humantime::Duration,

    /// At start, how long to wait for the database to answer (and to apply
    /// migrations), retrying with backoff while liveness is SERVING and
    /// readiness NOT_SERVING, before exiting; 0 waits forever. A database
    /// URL that cannot work exits at once.
    #[arg(long, env = "IDEMPOTENCY_DATABASE_WAIT", default_value_t = hd(DEFAULT_DATABASE_WAIT))]
    pub database_wait: humantime::Duration,

    /// How often readiness asks the database whether it answers: the
    /// listener reads the database's clock every interval, and every shared
    /// connection is sent an empty query every half interval; either
    /// unanswered within an interval turns readiness NOT_SERVING.
    #[arg(long, env = "IDEMPOTENCY_HEALTH_INTERVAL", default_value_t = hd(DEFAULT_HEALTH_INTERVAL),
          value_parser = at_least_10ms)]
    pub health_interval: humantime::Duration,
}

/// A health interval: at least 10 ms, so that checks cannot spin.
fn at_least_10ms(value: &str) -> Result<humantime::Duration, String> {
    let d: humantime::Duration = value.parse().map_err(|e| format!("{e}"))?;
    if Duration::from(d) < Duration::from_millis(10) {
        return Err("must be at least 10ms".to_owned());
    }
    Ok(d)
}
