#![doc = include_str!("../README.md")]

#[cfg(feature = "canonical-json")]
mod canonical;
mod client;
mod codec;
mod error;
#[cfg(feature = "tokio-postgres")]
mod in_transaction;
mod lease;
mod options;
mod retry;
mod run;

/// Generated from the contract (`proto/idempotency/v1/coordinator.proto`):
/// the messages, and the stub for calls this library does not wrap.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod proto {
    tonic::include_proto!("idempotency.v1");
}

#[cfg(feature = "canonical-json")]
pub use canonical::canonical_json;
pub use client::{Client, ClientOptions, ConnectError, TlsOptions, Transport, TransportError};
pub use codec::{Codec, CodecError, Json, Raw};
pub use error::{CallError, FieldViolation, RunOnceError, WorkError};
#[cfg(feature = "tokio-postgres")]
pub use in_transaction::{DatabaseClient, InDatabase};
pub use lease::Lease;
pub use options::{Heartbeat, RunOptions, WhenLeaseLost};
pub use retry::Backoff;
pub use run::{Done, Fingerprint};
pub use tokio_util::sync::CancellationToken;
pub use tonic::Code;
