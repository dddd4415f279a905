//! Credentials: clients that present a bearer token, and a credentials file.

use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use tonic::transport::Channel;

use super::server::TestServer;

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct Bearer(pub tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

pub type AuthedClient =
    CoordinatorClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>>;

/// A client of `server` that presents `token`.
pub async fn client_with_token(server: &TestServer, token: &str) -> AuthedClient {
    let value = format!("Bearer {token}").parse().expect("ascii token");
    CoordinatorClient::with_interceptor(server.channel().await, Bearer(value))
}

/// A credentials file in the temporary directory, removed on drop.
pub struct TokenFile {
    pub path: std::path::PathBuf,
}

impl TokenFile {
    pub fn new(contents: &str) -> Self {
        let path = std::env::temp_dir().join(format!("idem-tokens-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, contents).expect("write the credentials file");
        TokenFile { path }
    }

    pub fn rewrite(&self, contents: &str) {
        std::fs::write(&self.path, contents).expect("rewrite the credentials file");
    }
}

impl Drop for TokenFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
