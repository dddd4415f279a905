//! The machine's headless Chromium, driven through its chromedriver
//! (Debian's `chromium` and `chromium-driver`) with `fantoccini`: nothing is
//! downloaded (`SE_OFFLINE`). Skipped, loudly, where they are not installed
//! (`bash .ci/chromium` installs them); CI fails instead.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::helpers::eventually;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

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
    client: Client,
}

async fn free_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
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
        let addr = format!("127.0.0.1:{port}");
        eventually(
            "chromedriver to listen",
            Duration::from_secs(10),
            || async { tokio::net::TcpStream::connect(&addr).await.ok().map(drop) },
        )
        .await;
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,1100",
                         "--no-first-run", "--disable-extensions"]
            }
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!("capabilities are an object")
        };
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://{addr}"))
            .await
            .expect("a Chromium session");
        Browser { driver, client }
    }

    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.expect("navigate");
    }

    pub async fn url(&self) -> String {
        self.client.current_url().await.expect("url").to_string()
    }

    /// The page's markup as the browser holds it now.
    pub async fn source(&self) -> String {
        self.client.source().await.expect("source")
    }

    /// The elements matching a CSS selector.
    pub async fn find_all(&self, css: &str) -> Vec<fantoccini::elements::Element> {
        self.client
            .find_all(Locator::Css(css))
            .await
            .unwrap_or_default()
    }

    /// The first element matching `css`, waiting up to 5 seconds for it
    /// (a form's answer may still be loading).
    async fn find(&self, css: &str) -> fantoccini::elements::Element {
        let what = format!("an element {css}");
        eventually(&what, Duration::from_secs(5), || async {
            self.find_all(css).await.into_iter().next()
        })
        .await
    }

    /// The text of the first element matching `css`; tried again while
    /// the page reloads under it (a stale element).
    pub async fn text(&self, css: &str) -> String {
        let what = format!("the text of {css}");
        eventually(&what, Duration::from_secs(5), || async {
            self.find(css).await.text().await.ok()
        })
        .await
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        self.find(css).await.send_keys(text).await.expect("type");
    }

    pub async fn click(&self, css: &str) {
        self.find(css).await.click().await.expect("click");
    }

    /// Runs `script` in the page (WebDriver's own channel, which the
    /// page's Content-Security-Policy does not govern).
    pub async fn execute(&self, script: &str) -> Value {
        self.client
            .execute(script, Vec::new())
            .await
            .expect("execute")
    }

    /// The text of an open alert dialog, if a script opened one.
    pub async fn alert(&self) -> Option<String> {
        self.client.get_alert_text().await.ok()
    }

    /// Saves a screenshot of the page to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let png = self.client.screenshot().await.expect("screenshot");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).expect("write the screenshot");
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
        let _ = self.client.close().await;
        let _ = self.driver.kill().await;
    }
}
