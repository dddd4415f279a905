//! The operator console over plain HTTP (the browser suite, tests/console,
//! drives it in Chromium): off unless enabled, admin credentials only, the
//! security headers on every answer, state changes only with the CSRF
//! token; and the admin calls on the HTTP door's Connect routes.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::*;

const WORKER: &str = "worker-token-0123456789";
const ADMIN: &str = "admin-token-0123456789ab";

async fn app(console: bool, file: &TokenFile) -> TestApp {
    let path = file.path.clone();
    spawn_app_with(move |c| {
        c.auth_tokens = Some(path);
        c.http_listen = Some("127.0.0.1:0".parse().unwrap());
        c.console = console;
        c.sweep_interval = Duration::ZERO;
    })
    .await
}

fn tokens() -> TokenFile {
    TokenFile::new(&format!("{WORKER} shop\n{ADMIN} shop admin\n"))
}

/// A client that follows no redirects, so that they can be checked.
fn client() -> reqwest::Client {
    idempotency_coordinator::tls::install_crypto_provider();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

fn base(app: &TestApp) -> String {
    format!("http://{}", app.http_addr.expect("the HTTP port"))
}

/// The login form's answer for `token`, sent with the form's CSRF token
/// and cookie.
async fn log_in(client: &reqwest::Client, app: &TestApp, token: &str) -> reqwest::Response {
    let form = client
        .get(format!("{}/console/login", base(app)))
        .send()
        .await
        .unwrap();
    let cookie = cookies(&form);
    let page = form.text().await.unwrap();
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the login form's CSRF token");
    client
        .post(format!("{}/console/login", base(app)))
        .header("cookie", cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={csrf}&token={token}&operator=Ada"))
        .send()
        .await
        .unwrap()
}

fn cookies(response: &reqwest::Response) -> String {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_owned())
        .filter(|pair| !pair.ends_with('='))
        .collect::<Vec<_>>()
        .join("; ")
}

#[tokio::test]
async fn the_console_is_off_unless_enabled() {
    let file = tokens();
    let app = app(false, &file).await;
    let answer = client()
        .get(format!("{}/console/", base(&app)))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 404);
}

#[tokio::test]
async fn only_an_admin_token_logs_in_and_its_cookie_is_http_only_and_strict() {
    let file = tokens();
    let app = app(true, &file).await;
    let client = client();
    let anonymous = client
        .get(format!("{}/console/", base(&app)))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 303);
    assert_eq!(anonymous.headers()["location"], "/console/login");

    assert_eq!(log_in(&client, &app, WORKER).await.status(), 403);
    assert_eq!(
        log_in(&client, &app, "no-such-token-at-all").await.status(),
        401
    );
    let admin = log_in(&client, &app, ADMIN).await;
    assert_eq!(admin.status(), 303);
    let set: Vec<&str> = admin
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert!(
        set.iter()
            .all(|c| c.contains("HttpOnly") && c.contains("SameSite=Strict")),
        "{set:?}"
    );
    assert!(
        set.iter().all(|c| !c.contains(ADMIN)),
        "the token is encoded"
    );

    let home = client
        .get(format!("{}/console/", base(&app)))
        .header("cookie", cookies(&admin))
        .send()
        .await
        .unwrap();
    assert_eq!(home.status(), 200);
    let headers = home.headers().clone();
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert_eq!(headers["x-frame-options"], "DENY");
    assert_eq!(headers["cache-control"], "no-store");
    let page = home.text().await.unwrap();
    assert!(
        !page.contains("runs without credentials"),
        "no warning with credentials"
    );
}

#[tokio::test]
async fn without_credentials_every_page_warns() {
    let app = spawn_app_with(|c| {
        c.http_listen = Some("127.0.0.1:0".parse().unwrap());
        c.console = true;
    })
    .await;
    let page = client()
        .get(format!("{}/console/", base(&app)))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert!(
        page.text()
            .await
            .unwrap()
            .contains("runs without credentials")
    );
}

#[tokio::test]
async fn an_action_without_the_csrf_token_changes_nothing() {
    let file = tokens();
    let app = app(true, &file).await;
    let mut worker = client_with_token(&app, WORKER).await;
    worker.acquire(acquire("pay", "k")).await.unwrap();
    let client = client();
    let cookie = cookies(&log_in(&client, &app, ADMIN).await);
    let act = |body: String| {
        client
            .post(format!("{}/console/act", base(&app)))
            .header("cookie", cookie.clone())
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
    };
    let refused = act("action=delete&scope=pay&key=k".into()).await.unwrap();
    assert_eq!(refused.status(), 403);
    let wrong = act("action=delete&scope=pay&key=k&csrf=00112233".into())
        .await
        .unwrap();
    assert_eq!(wrong.status(), 403);
    let get = idempotency_coordinator::proto::GetRequest {
        scope: "pay".into(),
        key: "k".into(),
    };
    worker.get(get.clone()).await.expect("still there");

    // The confirmation page carries the token; with it the action runs.
    let confirm = client
        .get(format!(
            "{}/console/confirm?action=delete&scope=pay&key=k",
            base(&app)
        ))
        .header("cookie", cookie.clone())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = confirm
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the form's CSRF token");
    let done = act(format!("action=delete&scope=pay&key=k&csrf={csrf}"))
        .await
        .unwrap();
    assert_eq!(done.status(), 303);
    assert!(worker.get(get).await.is_err(), "deleted");
}

#[tokio::test]
async fn the_admin_calls_answer_on_the_connect_routes_for_admins_only() {
    let file = tokens();
    let app = app(false, &file).await;
    let mut worker = client_with_token(&app, WORKER).await;
    worker.acquire(acquire("pay", "order-1")).await.unwrap();
    let client = client();
    let list = |token: &'static str| {
        client
            .post(format!(
                "{}/idempotency.v1.Coordinator/ListRecords",
                base(&app)
            ))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {token}"))
            .body(json!({"scope": "pay", "keyPrefix": "order-"}).to_string())
            .send()
    };
    let answer = list(ADMIN).await.unwrap();
    assert_eq!(answer.status(), 200);
    let body: Value = serde_json::from_slice(&answer.bytes().await.unwrap()).unwrap();
    assert_eq!(body["records"][0]["key"], "order-1");
    assert_eq!(body["records"][0]["status"], "STATUS_PROCESSING");
    assert_eq!(list(WORKER).await.unwrap().status(), 403);
}

#[tokio::test]
async fn a_hostile_key_and_error_are_escaped_on_the_record_page() {
    const KEY: &str = "<img/src=x/onerror=alert(1)>";
    let file = tokens();
    let app = app(true, &file).await;
    let mut worker = client_with_token(&app, WORKER).await;
    let answer = worker
        .acquire(acquire("pay", KEY))
        .await
        .unwrap()
        .into_inner();
    let token = answer.lease.unwrap().token;
    let error = "\"><script>alert(2)</script>";
    worker
        .complete(complete("pay", KEY, &token, failure(error)))
        .await
        .unwrap();
    let client = client();
    let cookie = cookies(&log_in(&client, &app, ADMIN).await);
    let url = format!(
        "{}/console/record?scope=pay&key={}",
        base(&app),
        form_urlencoded::byte_serialize(KEY.as_bytes()).collect::<String>()
    );
    let page = client
        .get(url)
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("&lt;img/src=x/onerror=alert(1)&gt;"),
        "{page}"
    );
    assert!(
        page.contains("&quot;&gt;&lt;script&gt;alert(2)&lt;/script&gt;"),
        "{page}"
    );
    assert!(
        !page.contains("<img") && !page.contains("<script>alert"),
        "{page}"
    );
}
