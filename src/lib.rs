//! The idempotency coordinator: a stateless gRPC server in front of
//! PostgreSQL that lets services in any language run each side-effecting
//! operation exactly once.
//!
//! # Layout
//!
//! Where each decision is made (each module's own docs say how; the whole
//! repository's map is `docs/layout.md`):
//!
//! - [`proto`]: the generated code of the public contract, never edited.
//! - [`domain`]: validated request values, the policy of defaults and
//!   limits, records and decisions. No I/O.
//! - [`store`]: the database seam, one method per SQL function of `sql/`,
//!   where Acquire, Complete and ExtendLease are really decided (under row
//!   locks and the database clock); how statements reach the database.
//! - [`service`]: the gRPC services: decode into domain commands, ask the
//!   store, encode the answer; Acquire's wait (a waiting Acquire parked,
//!   run and answered by its answer's body: `transport::later`)
//!   and the Watch streams.
//! - [`error`]: the one error type and its mapping to gRPC status codes.
//! - [`notify`]: the hub: waiting without a database connection.
//! - [`sweeper`] and [`recovery`]: expired records out, dead leases
//!   reclaimed; the recovery webhook for due records.
//! - [`auth`]: who the caller is; the only source of a request's tenant.
//! - [`transport`]: the network edge: accepting connections, and admitting
//!   each call on its headers before its body is read, within budgets.
//! - [`http`]: the HTTP/JSON door and the operator console, through the
//!   same admission as gRPC callers.
//! - [`tls`]: TLS and mutual TLS on the ports, reloadable.
//! - [`telemetry`] and [`metrics`]: logs and traces; Prometheus metrics,
//!   handed to what records them (one registry per server).
//! - [`config`]: flags with environment fallbacks, and their defaults.
//! - [`startup`]: builds the server exactly as production and tests run it,
//!   and what `serve`, `migrate` and `health` do; [`embedded`]: the private
//!   PostgreSQL of local development; [`health`]: the `health` command;
//!   [`shutdown`]: the signals that start a drain.
//!
//! Dependencies point one way: `service` uses `domain`, `store`, `notify`,
//! `error` and `telemetry`; `notify` uses `domain` and `store`; `transport`
//! uses `auth`, `error`, `tls` and `telemetry`, and reaches the services
//! only as the routes `startup` hands it; `http` uses `transport`, `auth`,
//! `service` (only the names of what an in-process call may ask), `domain`,
//! `error` and the generated types; `error` uses `domain`, `auth` and
//! `store`; `store` uses `domain`; `domain` uses nothing of ours. `metrics`
//! uses only `domain`; a layer records through the handle it was given.
//! Only `startup` and `config` see everything.

pub mod auth;
pub mod config;
pub mod domain;
pub mod embedded;
pub mod error;
pub mod health;
pub mod http;
pub mod metrics;
pub mod notify;
pub mod recovery;
pub mod service;
pub mod shutdown;
pub mod startup;
pub mod store;
pub mod sweeper;
pub mod telemetry;
pub mod tls;
pub mod transport;

/// Generated from the proto; the only place that includes generated code.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod proto {
    tonic::include_proto!("idempotency.v1");

    /// The encoded descriptors of the contract (and the well-known types it
    /// imports), served by reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/coordinator_descriptor.bin"));

    #[cfg(test)]
    mod tests {
        use prost::Message as _;

        #[test]
        fn the_embedded_descriptor_set_decodes_and_holds_the_service() {
            let set = prost_types::FileDescriptorSet::decode(super::FILE_DESCRIPTOR_SET).unwrap();
            let ours = set
                .file
                .iter()
                .find(|f| f.package() == "idempotency.v1")
                .expect("our file");
            assert_eq!(ours.service[0].name(), "Coordinator");
        }
    }
}
