//! A real upstream HTTP server that counts its side effects and records
//! the coordination headers each request carried.
//!
//! - `POST /pay`: a side effect; answers 201 with a JSON body naming the
//!   effect's number, a `Location`, an `ETag` and a `Set-Cookie`; waits
//!   `?hold_ms=N` first.
//! - `POST /flaky`: 500 on its first call, 201 after.
//! - `POST /gate`: waits until the test opens the gate, then 201.
//! - `POST /big?bytes=N`: 200 with N bytes.
//! - `POST /busy`: 429 with `Retry-After: 30`.
//! - `GET /items`: 200, counted apart.
//! - `POST /account`: 401 without `Authorization`; else 201 naming the
//!   caller, with a `Set-Cookie` of the caller's session.
//! - `POST /marked` (and `GET /marked`): 201 (200) marked
//!   `Idempotent-Replayed: true` by the upstream itself.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::watch;

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub key: Option<String>,
    pub fencing_token: Option<u64>,
    pub attempt: Option<u32>,
    pub version: http::Version,
}

#[derive(Default)]
struct State {
    seen: Vec<Seen>,
    by_path: HashMap<String, usize>,
}

/// The upstream server, until dropped.
pub struct TestUpstream {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    gate: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestUpstream {
    pub async fn start() -> TestUpstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let (gate, _) = watch::channel(false);
        let task = tokio::spawn({
            let state = Arc::clone(&state);
            let gate = gate.clone();
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (state, gate) = (Arc::clone(&state), gate.subscribe());
                    let service = service_fn(move |request| {
                        let (state, gate) = (Arc::clone(&state), gate.clone());
                        async move { Ok::<_, Infallible>(answer(request, &state, gate).await) }
                    });
                    tokio::spawn(async move {
                        let builder =
                            hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                        let _ = builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            }
        });
        TestUpstream {
            addr,
            state,
            gate,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Side effects run on `path`.
    pub fn count(&self, path: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .by_path
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    /// Every request seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// Lets every request waiting at `/gate` (and later ones) through.
    pub fn open_gate(&self) {
        self.gate.send_replace(true);
    }
}

fn header<T: std::str::FromStr>(request: &Request<Incoming>, name: &str) -> Option<T> {
    request.headers().get(name)?.to_str().ok()?.parse().ok()
}

fn query(request: &Request<Incoming>, name: &str) -> Option<u64> {
    request.uri().query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| v.parse().ok()).flatten()
    })
}

async fn answer(
    request: Request<Incoming>,
    state: &Mutex<State>,
    mut gate: watch::Receiver<bool>,
) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_owned();
    let seen = Seen {
        path: path.clone(),
        key: header(&request, "idempotency-key"),
        fencing_token: header(&request, "idempotency-fencing-token"),
        attempt: header(&request, "idempotency-attempt"),
        version: request.version(),
    };
    let caller: Option<String> = header(&request, "authorization");
    let hold = query(&request, "hold_ms");
    let bytes = query(&request, "bytes");
    let body = request.into_body().collect().await.map(|b| b.to_bytes());
    let n = {
        let mut state = state.lock().unwrap();
        state.seen.push(seen.clone());
        let n = state.by_path.entry(path.clone()).or_default();
        *n += 1;
        *n
    };
    if let Some(ms) = hold {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let (status, text) = match path.as_str() {
        "/flaky" if n == 1 => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "{\"error\":\"boom\"}".to_owned(),
        ),
        "/gate" => {
            let _ = gate.wait_for(|open| *open).await;
            (StatusCode::CREATED, format!("{{\"effect\":{n}}}"))
        }
        "/big" => (StatusCode::OK, "x".repeat(bytes.unwrap_or(0) as usize)),
        "/busy" => {
            let response = Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .header("retry-after", "30")
                .body(Full::new(Bytes::from_static(b"slow down")))
                .unwrap();
            return response;
        }
        "/items" => (StatusCode::OK, "[]".to_owned()),
        "/account" => return account(caller, n),
        "/marked" => {
            return Response::builder()
                .status(StatusCode::CREATED)
                .header("idempotent-replayed", "true")
                .body(Full::new(Bytes::from(format!("{{\"effect\":{n}}}"))))
                .unwrap();
        }
        _ => (
            StatusCode::CREATED,
            format!(
                "{{\"effect\":{n},\"fencing_token\":{},\"body_bytes\":{}}}",
                seen.fencing_token.unwrap_or(0),
                body.map(|b| b.len()).unwrap_or(0)
            ),
        ),
    };
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("location", format!("{path}/{n}"))
        .header("etag", format!("\"{n}\""))
        .header("set-cookie", format!("session={n}"))
        .body(Full::new(Bytes::from(text)))
        .unwrap()
}

/// `/account`: who the caller is decides the answer.
fn account(caller: Option<String>, n: usize) -> Response<Full<Bytes>> {
    let Some(caller) = caller else {
        return Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header("www-authenticate", "Bearer")
            .body(Full::new(Bytes::from_static(
                b"{\"error\":\"who are you?\"}",
            )))
            .unwrap();
    };
    Response::builder()
        .status(StatusCode::CREATED)
        .header("content-type", "application/json")
        .header("set-cookie", format!("session={caller}-{n}"))
        .body(Full::new(Bytes::from(format!(
            "{{\"owner\":\"{caller}\",\"effect\":{n}}}"
        ))))
        .unwrap()
}
