//! The recovery webhook, for callers that cannot hold a WatchDue stream
//! (seed 004's n8n flow): due records of every tenant are POSTed as JSON to
//! one URL, each record once per offer interval across all replicas (the same
//! offers as WatchDue). Delivery runs on its own task with bounded retries and
//! timeouts; the sweeper only hands it as many records as its queue has room
//! for, so a failing or hanging webhook never stalls sweeping. A record whose
//! delivery failed is offered again when its offer runs out.
//!
//! An `https://` webhook is verified against the system's root certificates
//! (the platform verifier reads the usual bundle, or `SSL_CERT_FILE` and
//! `SSL_CERT_DIR` when set), or against a private CA given instead. The URL
//! and the CA are checked when the server starts, so a webhook that cannot
//! work stops it there.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde_json::json;
use tokio::sync::mpsc;

use crate::domain::{DueReason, DueRecord, Status};
use crate::store::Store;
use crate::telemetry::cause_chain;

/// Records waiting for delivery at most; more wait for a later round.
const QUEUE: usize = 256;

/// How the webhook is reached.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Where due records are POSTed: an `http://` or `https://` URL.
    pub url: reqwest::Url,
    /// PEM CA certificates an `https://` webhook's certificate must chain
    /// to, in place of the system's roots; `None`: the system's roots.
    pub ca: Option<PathBuf>,
    /// Limit for one POST, connection included.
    pub timeout: Duration,
    /// POSTs per record before giving up until its next offer.
    pub attempts: u32,
    /// How long a record offered to the webhook is not offered again.
    pub offer: Duration,
}

/// Why the webhook cannot work as configured.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("the recovery webhook must be an http:// or https:// URL, got {0}://")]
    Scheme(String),
    #[error("a CA for the recovery webhook is only used with an https:// URL")]
    CaWithoutTls,
    #[error("cannot read the recovery webhook's CA {path}")]
    ReadCa {
        /// The CA file given with --recovery-webhook-ca.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    #[error("the recovery webhook's CA {0} holds no PEM certificate")]
    NoCertificate(PathBuf),
    #[error("the recovery webhook's CA {path} is not usable")]
    BadCa {
        /// The CA file given with --recovery-webhook-ca.
        path: PathBuf,
        /// Why its certificates were refused.
        #[source]
        source: reqwest::Error,
    },
    #[error(
        "cannot set up the recovery webhook's HTTP client (an https:// URL needs root \
         certificates: the system's, SSL_CERT_FILE's or --recovery-webhook-ca's)"
    )]
    Client(#[source] reqwest::Error),
}

impl WebhookConfig {
    /// The client the webhook POSTs with. Startup builds one to check the
    /// configuration, the delivery task the one it uses.
    pub fn client(&self) -> Result<reqwest::Client, WebhookError> {
        crate::tls::install_crypto_provider();
        let builder = reqwest::Client::builder().timeout(self.timeout);
        let builder = match (self.url.scheme(), &self.ca) {
            // Plain HTTP needs no roots: loading none means a machine
            // without a CA bundle can still use an http:// webhook.
            ("http", None) => builder.tls_certs_only([]),
            ("http", Some(_)) => return Err(WebhookError::CaWithoutTls),
            ("https", None) => builder,
            ("https", Some(path)) => builder.tls_certs_only(ca_certificates(path)?),
            (other, _) => return Err(WebhookError::Scheme(other.to_owned())),
        };
        builder.build().map_err(WebhookError::Client)
    }
}

/// The certificates of a PEM file.
fn ca_certificates(path: &Path) -> Result<Vec<reqwest::Certificate>, WebhookError> {
    let pem = std::fs::read(path).map_err(|source| WebhookError::ReadCa {
        path: path.to_owned(),
        source,
    })?;
    let certs =
        reqwest::Certificate::from_pem_bundle(&pem).map_err(|source| WebhookError::BadCa {
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(WebhookError::NoCertificate(path.to_owned()));
    }
    Ok(certs)
}

/// The sweeper's handle on the delivery task.
pub struct Webhook {
    /// Records handed to the delivery task.
    queue: mpsc::Sender<DueRecord>,
    /// The subscriber id this process's webhook claims offers as.
    subscriber: uuid::Uuid,
    /// How long an offer lasts.
    offer: Duration,
}

fn timestamp(t: Option<DateTime<Utc>>) -> serde_json::Value {
    t.map_or(serde_json::Value::Null, |t| json!(t.to_rfc3339()))
}

/// The JSON body for one due record: what a re-driver needs, never a result.
pub fn body(due: &DueRecord) -> serde_json::Value {
    let r = &due.record;
    json!({
        "tenant": due.tenant.as_str(),
        "scope": r.scope,
        "key": r.key,
        "reason": match due.reason {
            DueReason::RetryDue => "RETRY_DUE",
            DueReason::LeaseExpired => "LEASE_EXPIRED",
        },
        "status": match r.status {
            Status::Processing => "PROCESSING",
            Status::Succeeded => "SUCCEEDED",
            Status::Failed => "FAILED",
            Status::FailedPermanent => "FAILED_PERMANENT",
        },
        "fingerprint": r.fingerprint.as_str(),
        "attempt_count": r.attempt_count,
        "max_attempts": r.max_attempts,
        "last_error": r.last_error,
        "last_error_at": timestamp(r.last_error_at),
        "next_retry_at": timestamp(r.next_retry_at),
        "checkpoint": base64::engine::general_purpose::STANDARD.encode(&r.checkpoint),
    })
}

impl Webhook {
    /// Starts the delivery task.
    pub fn start(config: WebhookConfig) -> Self {
        let (queue, records) = mpsc::channel(QUEUE);
        tokio::spawn(deliver(config.clone(), records));
        Webhook {
            queue,
            subscriber: uuid::Uuid::new_v4(),
            offer: config.offer,
        }
    }

    /// Claims as many due records as the queue has room for and queues them.
    pub async fn offer_due(&self, store: &Store) {
        let room = u32::try_from(self.queue.capacity()).unwrap_or(0);
        if room == 0 {
            return;
        }
        match store
            .claim_due(None, self.subscriber, self.offer, room)
            .await
        {
            Ok(records) => {
                for record in records {
                    if self.queue.try_send(record).is_err() {
                        break; // offered anyway: it comes back after the offer
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %cause_chain(&e), "cannot claim due records for the webhook")
            }
        }
    }
}

async fn deliver(config: WebhookConfig, mut records: mpsc::Receiver<DueRecord>) {
    let client = match config.client() {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %cause_chain(&e), "cannot build the webhook client; webhook off");
            return;
        }
    };
    while let Some(due) = records.recv().await {
        let body = body(&due).to_string();
        let mut delay = Duration::from_millis(200);
        for attempt in 1..=config.attempts.max(1) {
            let sent = client
                .post(config.url.clone())
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            match sent {
                Ok(response) if response.status().is_success() => break,
                Ok(response) => tracing::warn!(
                    status = response.status().as_u16(),
                    attempt,
                    scope = due.record.scope,
                    "recovery webhook refused a due record"
                ),
                Err(e) => tracing::warn!(
                    error = %cause_chain(&e),
                    attempt,
                    scope = due.record.scope,
                    "recovery webhook unreachable"
                ),
            }
            if attempt < config.attempts {
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        }
    }
}
