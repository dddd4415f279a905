//! The gRPC port's services: the Coordinator, health, and reflection (v1
//! and v1alpha, from one builder), behind admission (which holds the
//! Coordinator's gate).

use std::sync::Arc;

use tonic::Status;
use tonic::service::Routes;
use tonic_health::server::HealthReporter;

use super::StartupError;
use crate::auth::Authenticator;
use crate::config::ServeConfig;
use crate::metrics::Metrics;
use crate::proto::{self, coordinator_server::CoordinatorServer};
use crate::service::CoordinatorService;
use crate::transport::Admission;

/// The gRPC port's front: admission (under the configured byte budget and
/// limits, callers authenticated by `auth`, Coordinator calls behind
/// `gate`) before the routes [`grpc`] builds, and the health reporter that
/// says their readiness.
pub(super) async fn admission(
    coordinator: CoordinatorService,
    gate: impl Fn(tonic::Request<()>) -> Result<tonic::Request<()>, Status> + Send + Sync + 'static,
    (auth, metrics): (Arc<Authenticator>, Metrics),
    config: &ServeConfig,
) -> Result<(Arc<Admission>, HealthReporter), StartupError> {
    let (routes, reporter) = grpc(coordinator, config.max_request_bytes).await?;
    let admission = Admission::new(
        routes,
        Arc::new(move || gate(tonic::Request::new(())).map(drop)),
        (auth, metrics),
        config.max_inflight_request_bytes,
        config.max_request_bytes,
        config.request_body_timeout,
    );
    Ok((Arc::new(admission), reporter))
}

/// The routes of the gRPC port, and the health reporter that says their
/// readiness: the Coordinator NOT_SERVING until readiness says otherwise.
///
/// Requests somewhat over the result limit still decode, so the caller
/// hears INVALID_ARGUMENT naming `success.result`; past `max_request_bytes`
/// admission refuses them (RESOURCE_EXHAUSTED) from their length prefix,
/// before they arrive.
async fn grpc(
    coordinator: CoordinatorService,
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
        .add_service(coordinator)
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
