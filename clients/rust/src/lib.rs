//! Client for the idempotency coordinator: run each side-effecting
//! operation exactly once.
//!
//! ```no_run
//! use idempotency_client::{Client, ClientOptions, Fingerprint, RunOptions, WorkError};
//!
//! # async fn charge(order: &str) -> Result<String, std::io::Error> { Ok(String::new()) }
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::connect("http://127.0.0.1:50051", ClientOptions::default()).await?;
//! let done = client
//!     .run_once("payments.charge", "order-42", Fingerprint::None, &RunOptions::default(),
//!         |lease| async move {
//!             // lease.fencing_token() goes with every downstream write.
//!             let receipt = charge("order-42").await?; // io::Error: retryable
//!             Ok::<_, WorkError<std::io::Error>>(receipt)
//!         })
//!     .await?;
//! println!("{} (replayed: {})", done.value, done.replayed);
//! # Ok(()) }
//! ```

mod client;
mod codec;
mod error;
mod retry;
mod run;

/// Generated from the contract (`proto/idempotency/v1/coordinator.proto`):
/// the messages, and the stub for calls this library does not wrap.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod proto {
    tonic::include_proto!("idempotency.v1");
}

pub use client::{Client, ClientOptions, ConnectError, TlsOptions, Transport, TransportError};
pub use codec::{Codec, CodecError, Json, Raw};
pub use error::{CallError, FieldViolation, RunOnceError, WorkError};
pub use retry::Backoff;
pub use run::{Done, Fingerprint, Heartbeat, Lease, RunOptions};
pub use tokio_util::sync::CancellationToken;
pub use tonic::Code;
