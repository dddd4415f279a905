//! The console and the admin calls against what an abuse probe tried on a
//! release build, each against a server process of its own: results shown
//! whole, logins guessed by the thousand, revoked credentials' streams,
//! tenants of thousands of scopes, rebound host names, sessions that
//! outlive their logout, and operator names that read as someone else.

mod hosts;
mod logins;
mod operators;
mod results;
mod revocation;
mod scopes;
mod sessions;

use std::net::SocketAddr;

use crate::helpers::*;

pub(super) const WORKER: &str = "worker-token-0123456789";
pub(super) const ADMIN: &str = "admin-token-0123456789ab";

/// The credentials: a worker and an admin of tenant `shop`.
pub(super) fn tokens() -> TokenFile {
    TokenFile::new(&format!("{WORKER} shop\n{ADMIN} shop admin\n"))
}

/// A server process with the console on its HTTP port.
pub(super) struct Console {
    pub server: ServerProcess,
    /// The HTTP port.
    pub http: SocketAddr,
    /// Follows no redirects, so that they can be checked.
    pub client: reqwest::Client,
}

impl Console {
    /// A server on `db` with the console, the credentials of `tokens`
    /// (none: authentication off), a metrics port, and `extra` flags.
    pub async fn start(db: &TestDatabase, tokens: Option<&TokenFile>, extra: &[&str]) -> Console {
        let mut args = vec![
            "--http-listen",
            "127.0.0.1:0",
            "--console",
            "--metrics-listen",
            "127.0.0.1:0",
            "--sweep-interval",
            "0s",
        ];
        if let Some(tokens) = tokens {
            args.extend(["--auth-tokens", tokens.path.to_str().unwrap()]);
        }
        args.extend(extra);
        let server = ServerProcess::start_with(&db.url, &args).await;
        let http = server.logged_addr("serving HTTP/JSON");
        idempotency_coordinator::tls::install_crypto_provider();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        Console {
            server,
            http,
            client,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}/console/{path}", self.http)
    }

    /// The login form's CSRF token and the cookie that goes with it.
    pub async fn login_form(&self) -> (String, String) {
        let page = self.client.get(self.url("login")).send().await.unwrap();
        assert_eq!(page.status(), 200);
        let cookie = cookies(&page);
        let csrf = csrf_of(&page.text().await.unwrap());
        (csrf, cookie)
    }

    /// Logs in with `token` as operator `operator`, through the form.
    pub async fn log_in(&self, token: &str, operator: &str) -> reqwest::Response {
        let (csrf, cookie) = self.login_form().await;
        self.post(
            "login",
            &cookie,
            &[("csrf", &csrf), ("token", token), ("operator", operator)],
        )
        .await
    }

    /// The session cookie of an admin's login.
    pub async fn session(&self) -> String {
        let answer = self.log_in(ADMIN, "Ada").await;
        assert_eq!(answer.status(), 303, "the admin logs in");
        cookies(&answer)
    }

    pub async fn get(&self, path: &str, cookie: &str) -> reqwest::Response {
        self.client
            .get(self.url(path))
            .header("cookie", cookie)
            .send()
            .await
            .unwrap()
    }

    /// POSTs a form of `fields` to `path`.
    pub async fn post(
        &self,
        path: &str,
        cookie: &str,
        fields: &[(&str, &str)],
    ) -> reqwest::Response {
        let mut form = form_urlencoded::Serializer::new(String::new());
        form.extend_pairs(fields);
        self.client
            .post(self.url(path))
            .header("cookie", cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form.finish())
            .send()
            .await
            .unwrap()
    }

    /// The refusals counted with `reason` on the HTTP port.
    pub async fn refusals(&self, reason: &str) -> f64 {
        let addr = crate::metrics::metrics_addr(&self.server);
        crate::metrics::scrape(addr)
            .await
            .value(
                "idempotency_requests_refused_total",
                &[("port", "http"), ("reason", reason)],
            )
            .unwrap_or(0.0)
    }
}

/// The cookies an answer sets, as a `Cookie` header sends them back (a
/// cleared one left out).
pub(super) fn cookies(response: &reqwest::Response) -> String {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_owned())
        .filter(|pair| !pair.ends_with('='))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The CSRF token of the first form on `page`.
pub(super) fn csrf_of(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a form with a CSRF token")
        .to_owned()
}

/// A gRPC client of `server` presenting `token`.
pub(super) async fn grpc(server: &ServerProcess, token: &str) -> AuthedClient {
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let value = format!("Bearer {token}").parse().unwrap();
    idempotency_coordinator::proto::coordinator_client::CoordinatorClient::with_interceptor(
        channel,
        Bearer(value),
    )
}
