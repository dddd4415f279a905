//! The console's session: a server-side id in the cookie (never the
//! token), `Secure` and HSTS under TLS, and a logout that ends it.

use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::startup::Application;
use idempotency_coordinator::tls::TlsFiles;

use super::*;

#[tokio::test]
async fn the_cookie_names_a_session_not_the_token_and_logout_ends_it() {
    let db = TestDatabase::create().await;
    let file = tokens();
    let console = Console::start(&db, Some(&file), &[]).await;
    let cookie = console.session().await;
    let (name, id) = cookie.split_once('=').unwrap();
    assert_eq!(name, "idempotency_console");
    assert_eq!(id.len(), 64, "a random id: {cookie}");
    for encoded in [
        ADMIN.to_owned(),
        base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, ADMIN),
    ] {
        assert!(
            !cookie.contains(&encoded),
            "the cookie holds no token: {cookie}"
        );
    }
    let home = console.get("", &cookie).await;
    assert_eq!(home.status(), 200);
    let csrf = csrf_of(&home.text().await.unwrap());

    let out = console.post("logout", &cookie, &[("csrf", &csrf)]).await;
    assert_eq!(out.status(), 303);
    let after = console.get("", &cookie).await;
    assert_eq!(
        after.status(),
        303,
        "the logged-out session's cookie opens nothing"
    );
    assert_eq!(after.headers()["location"], "/console/login");
}

#[tokio::test]
async fn under_tls_the_session_cookie_is_secure_and_answers_carry_hsts() {
    let db = TestDatabase::create().await;
    let file = tokens();
    let server_pki = pki(&["localhost"]);
    let files = PemFiles::new();
    let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), db.url.clone());
    config.http_listen = Some("127.0.0.1:0".parse().unwrap());
    config.console = true;
    config.auth_tokens = Some(file.path.clone());
    config.tls = Some(TlsFiles {
        cert: files.write("server.pem", &server_pki.cert),
        key: files.write("server.key", &server_pki.key),
        client_ca: None,
    });
    let app = Application::build(config).await.expect("build with TLS");
    let port = app.http_addr().expect("the HTTP port").port();
    let _serving = serve(app);
    idempotency_coordinator::tls::install_crypto_provider();
    let client = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(server_pki.ca.as_bytes()).unwrap()])
        .resolve("localhost", ([127, 0, 0, 1], port).into())
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let url = |path: &str| format!("https://localhost:{port}/console/{path}");
    let form = client.get(url("login")).send().await.unwrap();
    assert_eq!(
        form.headers()["strict-transport-security"],
        "max-age=31536000"
    );
    let cookie = cookies(&form);
    let csrf = csrf_of(&form.text().await.unwrap());
    let body = format!("csrf={csrf}&token={ADMIN}&operator=Ada");
    let login = client
        .post(url("login"))
        .header("cookie", cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 303);
    let set: Vec<&str> = login
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert!(
        set.iter().any(|c| c.starts_with("idempotency_console=")),
        "{set:?}"
    );
    assert!(set.iter().all(|c| c.contains("; Secure")), "{set:?}");
    assert_eq!(
        login.headers()["strict-transport-security"],
        "max-age=31536000"
    );
}
