//! Health checks: a probe's view of a service, and waiting for a wanted status.

use std::time::Duration;

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use super::polling::eventually;
use super::server::TestServer;

/// The readiness service name Kubernetes probes ask about.
pub const READINESS: &str = "idempotency.v1.Coordinator";

/// `server`'s health as a probe of `service` sees it.
pub async fn health(server: &TestServer, service: &str) -> ServingStatus {
    let mut client = HealthClient::new(server.channel().await);
    let resp = client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("health check")
        .into_inner();
    ServingStatus::try_from(resp.status).unwrap()
}

/// Waits until `server` reports `wanted` for `service`.
pub async fn until_health(server: &TestServer, service: &str, wanted: ServingStatus) {
    eventually(
        &format!("{service:?} to be {wanted:?}"),
        Duration::from_secs(10),
        || async { (health(server, service).await == wanted).then_some(()) },
    )
    .await;
}
