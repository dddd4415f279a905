//! The gRPC port's services: the Coordinator behind its gate, health, and
//! reflection (v1 and v1alpha, from one builder), behind admission.

use std::sync::Arc;

use tonic::Status;
use tonic::service::Routes;
use tonic::service::interceptor::InterceptedService;
use tonic_health::server::HealthReporter;

use super::StartupError;
use crate::auth::Authenticator;
use crate::config::ServeConfig;
use crate::metrics::Metrics;
use crate::proto::{self, coordinator_server::CoordinatorServer};
use crate::service::{ACQUIRE_PATH, AcquireRoute, CoordinatorService};
use crate::transport::Admission;

/// The gRPC port's front: admission (under the configured byte budget and
/// limits, callers authenticated by `auth`) before the routes [`grpc`]
/// builds, and the health reporter that says their readiness.
pub(super) async fn admission(
    coordinator: CoordinatorService,
    gate: impl Fn(tonic::Request<()>) -> Result<tonic::Request<()>, Status>
    + Clone
    + Send
    + Sync
    + 'static,
    (auth, metrics): (Arc<Authenticator>, Metrics),
    config: &ServeConfig,
) -> Result<(Arc<Admission>, HealthReporter), StartupError> {
    let acquire = AcquireRoute::new(coordinator.clone(), gate.clone(), config.max_request_bytes);
    let (routes, reporter) = grpc(coordinator, gate, config.max_request_bytes).await?;
    // Acquire, the call that waits, ahead of the router (its own route says
    // why); the same gate and message limit as its route in `routes`.
    let admission = Admission::new(
        routes,
        (auth, metrics),
        config.max_inflight_request_bytes,
        config.max_request_bytes,
        config.request_body_timeout,
    )
    .serve_directly(ACQUIRE_PATH, Arc::new(acquire));
    Ok((Arc::new(admission), reporter))
}

/// The routes of the gRPC port, and the health reporter that says their
/// readiness: the Coordinator NOT_SERVING until readiness says otherwise.
///
/// `gate` sees every Coordinator call first (it refuses them while the
/// database is not ready). Requests somewhat over the result limit still
/// decode, so the caller hears INVALID_ARGUMENT naming `success.result`;
/// past `max_request_bytes` admission refuses them (RESOURCE_EXHAUSTED)
/// from their length prefix, before they arrive.
async fn grpc(
    coordinator: CoordinatorService,
    gate: impl Fn(tonic::Request<()>) -> Result<tonic::Request<()>, Status>
    + Clone
    + Send
    + Sync
    + 'static,
    max_request_bytes: usize,
) -> Result<(Routes, HealthReporter), StartupError> {
    let (reporter, health) = tonic_health::server::health_reporter();
    // Not ready until the first database check passes.
    reporter
        .set_not_serving::<CoordinatorServer<CoordinatorService>>()
        .await;
    let coordinator =
        CoordinatorServer::new(coordinator).max_decoding_message_size(max_request_bytes);
    let routes = Routes::new(health)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?)
        .add_service(InterceptedService::new(coordinator, gate))
        .prepare();
    Ok((routes, reporter))
}

/// Reflection's builder, the same for both versions: it knows our
/// contract, the health service and the google.rpc error details, so
/// grpcurl can show all three.
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
}
