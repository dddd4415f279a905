//! Sweeping and recovery: the background sweeper, the WatchDue feed, and
//! the webhook that POSTs due records.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::hd;
use crate::recovery::WebhookConfig;
use crate::service::FeedConfig;

/// How often the background sweeper runs.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// Rows of each kind per sweeping transaction.
pub const DEFAULT_SWEEP_BATCH: u32 = 1000;
/// How long a due record offered to one subscriber is not offered again.
pub const DEFAULT_DUE_OFFER: Duration = Duration::from_secs(30);
/// How often an idle recovery feed looks for newly due records.
pub const DEFAULT_DUE_POLL: Duration = Duration::from_secs(1);

/// The sweeper, the recovery feed and the webhook.
#[derive(Debug, Clone, Args)]
pub struct RecoveryArgs {
    /// How often the background sweeper deletes expired records and reclaims
    /// dead leases (one replica at a time); 0 turns it off.
    #[arg(long, env = "IDEMPOTENCY_SWEEP_INTERVAL", default_value_t = hd(DEFAULT_SWEEP_INTERVAL))]
    pub sweep_interval: humantime::Duration,

    /// Records of each kind a sweeping transaction handles at most.
    #[arg(long, env = "IDEMPOTENCY_SWEEP_BATCH", default_value_t = DEFAULT_SWEEP_BATCH)]
    pub sweep_batch: u32,

    /// How long a due record offered to one WatchDue subscriber (or the
    /// webhook) is not offered to another, unless somebody Acquires it.
    #[arg(long, env = "IDEMPOTENCY_DUE_OFFER_INTERVAL", default_value_t = hd(DEFAULT_DUE_OFFER))]
    pub due_offer_interval: humantime::Duration,

    /// How often an idle WatchDue stream looks for retries that came due.
    #[arg(long, env = "IDEMPOTENCY_DUE_POLL_INTERVAL", default_value_t = hd(DEFAULT_DUE_POLL))]
    pub due_poll_interval: humantime::Duration,

    /// POST each due record (every tenant) as JSON to this http:// or
    /// https:// URL after each sweep, for callers that cannot hold a
    /// WatchDue stream. https:// trusts the system's root certificates
    /// (SSL_CERT_FILE, SSL_CERT_DIR) unless --recovery-webhook-ca is given.
    #[arg(long, env = "IDEMPOTENCY_RECOVERY_WEBHOOK")]
    pub recovery_webhook: Option<reqwest::Url>,

    /// PEM CA certificates that an https:// webhook's certificate must
    /// chain to, in place of the system's roots (a private CA).
    #[arg(
        long,
        env = "IDEMPOTENCY_RECOVERY_WEBHOOK_CA",
        requires = "recovery_webhook"
    )]
    pub recovery_webhook_ca: Option<PathBuf>,

    /// Time limit of one webhook POST.
    #[arg(
        long,
        env = "IDEMPOTENCY_RECOVERY_WEBHOOK_TIMEOUT",
        default_value = "5s"
    )]
    pub recovery_webhook_timeout: humantime::Duration,

    /// POSTs per due record before it waits for its next offer.
    #[arg(
        long,
        env = "IDEMPOTENCY_RECOVERY_WEBHOOK_ATTEMPTS",
        default_value_t = 3
    )]
    pub recovery_webhook_attempts: u32,
}

impl RecoveryArgs {
    /// How the WatchDue feed offers and looks for due records.
    pub(super) fn feed(&self) -> FeedConfig {
        FeedConfig {
            offer: self.due_offer_interval.into(),
            poll: self.due_poll_interval.into(),
        }
    }

    /// Where the sweeper POSTs due records, if anywhere.
    pub(super) fn webhook(&self) -> Option<WebhookConfig> {
        self.recovery_webhook.clone().map(|url| WebhookConfig {
            url,
            ca: self.recovery_webhook_ca.clone(),
            timeout: self.recovery_webhook_timeout.into(),
            attempts: self.recovery_webhook_attempts,
            offer: self.due_offer_interval.into(),
        })
    }
}
