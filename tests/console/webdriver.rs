//! Just enough of the W3C WebDriver protocol to drive the machine's
//! headless Chromium through its chromedriver (Debian's `chromium` and
//! `chromium-driver`): nothing is downloaded. Skipped, loudly, where they
//! are not installed (`bash .ci/chromium` installs them); CI fails instead.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::helpers::eventually;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The key WebDriver names an element by.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Whether Chromium and its driver are installed; without them, and
/// without `CI`, says that the test is skipped.
pub fn installed() -> bool {
    if Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists() {
        return true;
    }
    crate::helpers::skip_without(
        &format!("Chromium ({CHROMIUM}, {CHROMEDRIVER})"),
        "the console's browser tests",
        "bash .ci/chromium",
    );
    false
}

/// A headless Chromium session; the driver is killed on drop.
pub struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: String,
}

async fn free_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

/// One WebDriver request; the answer's `value`, or the error it names.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<Value, String> {
    let stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let bytes = body.map(|b| b.to_string()).unwrap_or_default();
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    let answer: Value = serde_json::from_slice(&body.to_bytes()).map_err(|e| e.to_string())?;
    let value = answer.get("value").cloned().unwrap_or(Value::Null);
    if status.is_success() {
        Ok(value)
    } else {
        Err(value
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("error")
            .to_owned())
    }
}

impl Browser {
    pub async fn start() -> Browser {
        let port = free_port().await;
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .env("SE_OFFLINE", "true")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        for _ in 0..100 {
            if send(addr, "GET", "/status", None).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,1100",
                         "--no-first-run", "--disable-extensions"]
            }
        }}});
        let created = send(addr, "POST", "/session", Some(capabilities))
            .await
            .expect("a Chromium session");
        let session = created["sessionId"]
            .as_str()
            .expect("session id")
            .to_owned();
        Browser {
            driver,
            addr,
            session,
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let path = format!("/session/{}{path}", self.session);
        send(self.addr, method, &path, body).await
    }

    pub async fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url })))
            .await
            .expect("navigate");
    }

    pub async fn url(&self) -> String {
        let url = self.call("GET", "/url", None).await.expect("url");
        url.as_str().unwrap_or_default().to_owned()
    }

    /// The page's markup as the browser holds it now.
    pub async fn source(&self) -> String {
        let source = self.call("GET", "/source", None).await.expect("source");
        source.as_str().unwrap_or_default().to_owned()
    }

    /// The elements matching a CSS selector.
    pub async fn find_all(&self, css: &str) -> Vec<String> {
        let found = self
            .call(
                "POST",
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await
            .expect("find elements");
        found
            .as_array()
            .map(|all| {
                all.iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The first element matching `css`, waiting up to 5 seconds for it
    /// (a form's answer may still be loading).
    pub async fn find(&self, css: &str) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(element) = self.find_all(css).await.into_iter().next() {
                return element;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no element {css} on {}",
                self.url().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The text of the first element matching `css`; tried again while
    /// the page reloads under it (a stale element).
    pub async fn text(&self, css: &str) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let element = self.find(css).await;
            match self
                .call("GET", &format!("/element/{element}/text"), None)
                .await
            {
                Ok(text) => return text.as_str().unwrap_or_default().to_owned(),
                Err(e) => assert!(tokio::time::Instant::now() < deadline, "text of {css}: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css).await;
        self.call(
            "POST",
            &format!("/element/{element}/value"),
            Some(json!({ "text": text })),
        )
        .await
        .expect("type");
    }

    pub async fn click(&self, css: &str) {
        let element = self.find(css).await;
        self.call(
            "POST",
            &format!("/element/{element}/click"),
            Some(json!({})),
        )
        .await
        .expect("click");
    }

    /// Runs `script` in the page (WebDriver's own channel, which the
    /// page's Content-Security-Policy does not govern).
    pub async fn execute(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
        .await
        .expect("execute")
    }

    /// The text of an open alert dialog, if a script opened one.
    pub async fn alert(&self) -> Option<String> {
        let text = self.call("GET", "/alert/text", None).await.ok()?;
        Some(text.as_str().unwrap_or_default().to_owned())
    }

    /// Saves a screenshot of the page to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let png = self
            .call("GET", "/screenshot", None)
            .await
            .expect("screenshot");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap_or_default())
            .expect("base64 png");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).expect("write the screenshot");
    }

    /// Waits until the text of `css` is `wanted`.
    pub async fn until_text(&self, css: &str, wanted: &str, within: Duration) {
        let what = format!("{css} to become {wanted:?}");
        eventually(&what, within, || async {
            (!self.find_all(css).await.is_empty() && self.text(css).await == wanted).then_some(())
        })
        .await;
    }

    /// Waits up to `within` for the page's address to contain `wanted`
    /// (a click that navigates may answer before the new page is there).
    pub async fn until_url_has(&self, wanted: &str, within: Duration) {
        let what = format!("the address to show {wanted:?}");
        eventually(&what, within, || async {
            self.url().await.contains(wanted).then_some(())
        })
        .await;
    }

    /// Waits up to `within` for the page's source to contain one of
    /// `wanted` (a form's answer loads after the click that sent it).
    pub async fn until_source_has(&self, wanted: &[&str], within: Duration) {
        let what = format!("the page to show any of {wanted:?}");
        eventually(&what, within, || async {
            let source = self.source().await;
            wanted.iter().any(|w| source.contains(w)).then_some(())
        })
        .await;
    }

    pub async fn quit(mut self) {
        let _ = self.call("DELETE", "", None).await;
        let _ = self.driver.kill().await;
    }
}
