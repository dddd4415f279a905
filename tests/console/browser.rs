//! Logging in, looking up keys, following a record live, an action with
//! its confirmation, hostile keys, and the refusals, in one browser session
//! against one server.

use std::path::PathBuf;
use std::time::Duration;

use idempotency_coordinator::proto::{self, Decision};

use crate::helpers::*;
use crate::webdriver::{Browser, installed};

const WORKER: &str = "worker-token-0123456789";
const ADMIN: &str = "admin-token-0123456789ab";
/// A key that would run script if a page did not escape it (keys hold no
/// spaces, so `/` stands between the attributes).
const XSS_KEY: &str = "<img/src=x/onerror=alert(1)>";
const XSS_ERROR: &str = "<img src=x onerror=alert(1)><script>alert(2)</script>";

struct Console {
    app: TestApp,
    base: String,
    worker: AuthedClient,
    browser: Browser,
    _tokens: TokenFile,
}

fn shot(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("docs/console/{name}.png"))
}

async fn start() -> Console {
    let tokens = TokenFile::new(&format!("{WORKER} shop\n{ADMIN} shop admin\n"));
    let path = tokens.path.clone();
    let app = spawn_app_with(move |c| {
        c.auth_tokens = Some(path);
        c.http_listen = Some("127.0.0.1:0".parse().unwrap());
        c.console = true;
        c.sweep_interval = Duration::ZERO;
    })
    .await;
    let base = format!("http://{}/console/", app.http_addr.expect("the HTTP door"));
    let worker = client_with_token(&app, WORKER).await;
    let browser = Browser::start().await;
    Console {
        app,
        base,
        worker,
        browser,
        _tokens: tokens,
    }
}

impl Console {
    async fn lease(&mut self, scope: &str, key: &str) -> String {
        let mut request = acquire(scope, key);
        request.request_id = "req-42".into();
        let answer = self.worker.acquire(request).await.unwrap().into_inner();
        assert_eq!(decision(&answer), Decision::Proceed);
        answer.lease.unwrap().token
    }

    async fn open(&self, page: &str) {
        self.browser.goto(&format!("{}{page}", self.base)).await;
    }

    async fn log_in(&self, token: &str) {
        self.open("login").await;
        self.browser.type_into("input[name=token]", token).await;
        self.browser.type_into("input[name=operator]", "Ada").await;
        self.browser.click("button[type=submit]").await;
        // The answer: the console (logged in) or the login page saying why
        // not.
        self.browser
            .until_source_has(
                &["Log out", "not an admin credential", "Unknown credential"],
                Duration::from_secs(10),
            )
            .await;
    }
}

#[tokio::test]
async fn the_console_in_a_browser() {
    if !installed() {
        return;
    }
    let mut console = start().await;
    refusals_before_login(&console).await;
    console.log_in(ADMIN).await;
    assert_eq!(console.browser.url().await, console.base);
    lookup_and_live_update(&mut console).await;
    release_refuses_the_holder(&mut console).await;
    hostile_content_is_text(&mut console).await;
    a_post_without_csrf_is_refused(&mut console).await;
    console.browser.quit().await;
    console.app.server.stop().await;
}

async fn refusals_before_login(console: &Console) {
    let browser = &console.browser;
    console.open("").await;
    assert!(
        browser.url().await.ends_with("/console/login"),
        "no token: the login page"
    );
    browser.screenshot(&shot("login")).await;
    console.log_in(WORKER).await;
    let page = browser.source().await;
    assert!(page.contains("not an admin credential"), "{page}");
    console.open("").await;
    assert!(
        browser.url().await.ends_with("/console/login"),
        "a refused token is not kept"
    );
    console.log_in("not-a-token-of-this-server").await;
    assert!(browser.source().await.contains("Unknown credential"));
}

async fn lookup_and_live_update(console: &mut Console) {
    let token = console.lease("payments.charge", "order-1001").await;
    console.lease("payments.charge", "order-1002").await;
    let browser = &console.browser;
    console.open("").await;
    assert!(browser.source().await.contains("payments.charge"));
    browser.screenshot(&shot("home")).await;

    console
        .open("records?scope=payments.charge&prefix=order-")
        .await;
    assert_eq!(browser.find_all("table.records tbody tr").await.len(), 2);
    browser.screenshot(&shot("records")).await;

    browser
        .type_into(
            "form[action='/console/record'] input[name=key]",
            "order-1001",
        )
        .await;
    browser.click("form[action='/console/record'] button").await;
    assert_eq!(browser.text("#status").await, "PROCESSING");
    assert!(
        browser.source().await.contains("req-42"),
        "the lease's request id"
    );
    browser
        .until_text("#live", "(following live)", Duration::from_secs(5))
        .await;
    browser.screenshot(&shot("record-processing")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut done = success(br#"{"charge":"ch_1","amount":1200}"#);
    if let proto::complete_request::Outcome::Success(s) = &mut done {
        s.content_type = "application/json".into();
    }
    console
        .worker
        .complete(complete("payments.charge", "order-1001", &token, done))
        .await
        .unwrap();
    let browser = &console.browser;
    browser
        .until_text("#status", "SUCCEEDED", Duration::from_secs(10))
        .await;
    assert!(
        browser
            .text("pre.result")
            .await
            .contains("\"amount\": 1200"),
        "pretty JSON"
    );
    browser.screenshot(&shot("record-succeeded")).await;
}

async fn release_refuses_the_holder(console: &mut Console) {
    let token = console.lease("payments.charge", "order-2001").await;
    let browser = &console.browser;
    console
        .open("record?scope=payments.charge&key=order-2001")
        .await;
    browser.click("#action-release").await;
    // A confirmation first.
    browser
        .until_url_has("/console/confirm", Duration::from_secs(10))
        .await;
    browser
        .type_into("textarea[name=reason]", "worker pod is wedged")
        .await;
    browser.screenshot(&shot("confirm")).await;
    browser.click("#confirm").await;
    browser
        .until_text("#status", "FAILED", Duration::from_secs(10))
        .await;
    let page = browser.source().await;
    assert!(
        page.contains("RELEASE_LEASE") && page.contains("operator Ada"),
        "{page}"
    );
    browser.screenshot(&shot("record-released")).await;

    let err = console
        .worker
        .complete(complete(
            "payments.charge",
            "order-2001",
            &token,
            success(b"late"),
        ))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "LEASE_LOST");
}

async fn hostile_content_is_text(console: &mut Console) {
    let token = console.lease("payments.charge", XSS_KEY).await;
    let mut failed = failure(XSS_ERROR);
    if let proto::complete_request::Outcome::Failure(f) = &mut failed {
        f.permanent = true;
    }
    console
        .worker
        .complete(complete("payments.charge", XSS_KEY, &token, failed))
        .await
        .unwrap();
    let browser = &console.browser;
    console
        .open("records?scope=payments.charge&prefix=%3C")
        .await;
    browser.click("table.records tbody a").await;
    assert_eq!(browser.text("#key").await, XSS_KEY);
    assert_eq!(browser.text("#last-error").await, XSS_ERROR);
    assert!(
        browser.find_all("img").await.is_empty(),
        "no element made of a key"
    );
    assert!(browser.find_all("main script").await.is_empty());
    assert_eq!(browser.alert().await, None, "no script ran");
    assert_eq!(
        browser.execute("return document.title").await,
        "Record · idempotency console"
    );
    browser.screenshot(&shot("hostile")).await;
}

async fn a_post_without_csrf_is_refused(console: &mut Console) {
    console.lease("payments.charge", "order-3001").await;
    let browser = &console.browser;
    console
        .open("record?scope=payments.charge&key=order-3001")
        .await;
    browser
        .execute(
            "const f = document.createElement('form');
             f.method = 'post'; f.action = '/console/act';
             for (const [n, v] of [['action', 'delete'], ['scope', 'payments.charge'],
                                   ['key', 'order-3001']]) {
               const i = document.createElement('input');
               i.type = 'hidden'; i.name = n; i.value = v; f.appendChild(i);
             }
             document.body.appendChild(f); f.submit();",
        )
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        browser
            .source()
            .await
            .contains("CSRF token is missing or wrong")
    );
    let still = console
        .worker
        .get(proto::GetRequest {
            scope: "payments.charge".into(),
            key: "order-3001".into(),
        })
        .await;
    assert!(still.is_ok(), "the record was not deleted");
}
