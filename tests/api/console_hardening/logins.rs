//! Guessing the console's token: failed logins are counted per client
//! address, logged (at most a line a second) and, past ten a minute,
//! refused without a look at the token.

use super::*;

#[tokio::test]
async fn past_10_failed_logins_a_minute_an_address_is_refused_429_and_every_one_is_counted() {
    let db = TestDatabase::create().await;
    let file = tokens();
    let console = Console::start(&db, Some(&file), &[]).await;
    let (csrf, cookie) = console.login_form().await;
    let mut statuses = Vec::new();
    for i in 0..50 {
        let guess = format!("guessed-token-{i:010}");
        let answer = console
            .post(
                "login",
                &cookie,
                &[("csrf", &csrf), ("token", &guess), ("operator", "")],
            )
            .await;
        if answer.status() == 429 {
            let wait: u64 = answer.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!((1..=60).contains(&wait), "Retry-After {wait}");
        }
        statuses.push(answer.status().as_u16());
    }
    let unknown = statuses.iter().filter(|s| **s == 401).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!(
        (unknown, refused),
        (10, 40),
        "of 50 guesses in a row, 10 are checked and 40 refused: {statuses:?}"
    );
    // Refused without a look at the token: the right one too.
    let (csrf, cookie) = console.login_form().await;
    let admin = console
        .post(
            "login",
            &cookie,
            &[("csrf", &csrf), ("token", ADMIN), ("operator", "")],
        )
        .await;
    assert_eq!(admin.status(), 429);

    assert_eq!(console.refusals("console_login_failed").await, 10.0);
    assert_eq!(console.refusals("console_login_limited").await, 41.0);
    let lines = console
        .server
        .logs()
        .iter()
        .filter(|l| l.contains("console login failed") || l.contains("console login refused"))
        .count();
    assert!(
        (1..=10).contains(&lines),
        "51 refused logins logged in {lines} lines (at most one a second)"
    );
}

#[tokio::test]
async fn a_login_without_the_login_forms_csrf_token_is_refused() {
    let db = TestDatabase::create().await;
    let file = tokens();
    let console = Console::start(&db, Some(&file), &[]).await;
    let (csrf, cookie) = console.login_form().await;
    let forged = console
        .post(
            "login",
            "",
            &[("csrf", &csrf), ("token", ADMIN), ("operator", "")],
        )
        .await;
    assert_eq!(forged.status(), 403, "a form without the login cookie");
    let wrong = console
        .post(
            "login",
            &cookie,
            &[("csrf", "0011"), ("token", ADMIN), ("operator", "")],
        )
        .await;
    assert_eq!(wrong.status(), 403, "a form with another token");
    assert!(
        cookies(&wrong)
            .split("; ")
            .all(|c| !c.starts_with("idempotency_console="))
    );
    let right = console
        .post(
            "login",
            &cookie,
            &[("csrf", &csrf), ("token", ADMIN), ("operator", "")],
        )
        .await;
    assert_eq!(right.status(), 303);
}
