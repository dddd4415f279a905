//! Tenants and credentials: the tenant comes only from the token, and no
//! call of one tenant reaches another's records.

use std::time::Duration;

use idempotency_coordinator::proto::{self, Decision, complete_request::Outcome};
use sha2::{Digest, Sha256};
use tokio_stream::StreamExt;
use tonic::Code;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::helpers::*;

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789ab";
const ADMIN_A: &str = "alice-admin-0123456789";

fn tokens() -> String {
    let hashed = hex::encode(Sha256::digest(BOB.as_bytes()));
    format!(
        "# tenants\n{ALICE} tenant-a\nsha256:{hashed} tenant-b   # hashed form\n{ADMIN_A} tenant-a admin\n"
    )
}

async fn app_with_tokens(file: &TokenFile) -> TestApp {
    let path = file.path.clone();
    spawn_app_with(move |c| {
        c.auth_tokens = Some(path);
        c.sweep_interval = Duration::ZERO;
    })
    .await
}

#[tokio::test]
async fn calls_without_a_known_token_are_unauthenticated() {
    let file = TokenFile::new(&tokens());
    let app = app_with_tokens(&file).await;

    let mut anonymous = app.client.clone();
    let err = anonymous.acquire(acquire("s", "k")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert_eq!(reason(&err), "UNAUTHENTICATED");

    let mut wrong = client_with_token(&app, "not-a-known-token-at-all").await;
    let err = wrong.acquire(acquire("s", "k")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(
        !err.message().contains("not-a-known-token"),
        "{}",
        err.message()
    );

    let mut alice = client_with_token(&app, ALICE).await;
    alice
        .acquire(acquire("s", "k"))
        .await
        .expect("a known token");
    let mut bob = client_with_token(&app, BOB).await;
    bob.acquire(acquire("s", "k"))
        .await
        .expect("a hashed token");
    assert_eq!(
        app.db.count_records().await,
        2,
        "only authenticated calls wrote"
    );
}

#[tokio::test]
async fn health_and_reflection_need_no_token() {
    let file = TokenFile::new(&tokens());
    let app = app_with_tokens(&file).await;
    let mut health = HealthClient::new(app.channel().await);
    health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("liveness without a token");

    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest,
    };
    let mut reflection = ServerReflectionClient::new(app.channel().await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection without a token")
        .into_inner();
    let answer = answers.next().await.unwrap().unwrap();
    assert!(format!("{answer:?}").contains("idempotency.v1.Coordinator"));
}

#[tokio::test]
async fn a_revoked_token_stops_working_after_a_reload_and_a_bad_file_changes_nothing() {
    let file = TokenFile::new(&tokens());
    let db = TestDatabase::create().await;
    let mut config = idempotency_coordinator::config::ServeConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        db.url.clone(),
    );
    config.auth_tokens = Some(file.path.clone());
    let app = idempotency_coordinator::startup::Application::build(config)
        .await
        .unwrap();
    let credentials = app.reload_handle();
    let server = run_app(app).await;
    let mut alice = client_with_token(&server, ALICE).await;
    alice.get(get_req("s", "k")).await.unwrap_err(); // NOT_FOUND: authenticated

    // A file that does not parse keeps the credentials in force.
    file.rewrite("this line is not a credential at all and has too many fields");
    assert!(credentials.reload().is_err());
    let err = alice.get(get_req("s", "k")).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "alice still gets in");

    file.rewrite(&format!("{BOB} tenant-b\n"));
    assert_eq!(credentials.reload().unwrap(), 1);
    let err = alice.get(get_req("s", "k")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "revoked");
}

#[tokio::test]
async fn sweep_needs_an_admin_and_sweeps_only_the_admins_tenant() {
    let file = TokenFile::new(&tokens());
    let app = app_with_tokens(&file).await;
    let mut alice = client_with_token(&app, ALICE).await;
    let mut bob = client_with_token(&app, BOB).await;
    let mut admin = client_with_token(&app, ADMIN_A).await;
    for c in [&mut alice, &mut bob] {
        let mut req = acquire("s", "old");
        req.retention = secs(60);
        let granted = c.acquire(req).await.unwrap().into_inner();
        c.complete(complete("s", "old", &token(&granted), success(b"x")))
            .await
            .unwrap();
    }
    app.clock.advance(Duration::from_secs(61));

    let err = alice.sweep(sweep_req(false, 0)).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let swept = admin.sweep(sweep_req(false, 0)).await.unwrap().into_inner();
    assert_eq!(swept.expired_deleted, 1, "tenant-a's record only");
    assert_eq!(
        app.db.count_records().await,
        1,
        "tenant-b's expired record stays"
    );
}

#[tokio::test]
async fn no_call_of_one_tenant_reaches_anothers_records() {
    let file = TokenFile::new(&tokens());
    let app = spawn_app_with({
        let path = file.path.clone();
        move |c| {
            c.auth_tokens = Some(path);
            c.sweep_interval = Duration::ZERO;
            c.feed.poll = Duration::from_millis(50);
        }
    })
    .await;
    let mut alice = client_with_token(&app, ALICE).await;
    let mut bob = client_with_token(&app, BOB).await;

    // Alice holds a lease on (s, k) and has a due record (s, due).
    let a = alice.acquire(acquire("s", "k")).await.unwrap().into_inner();
    assert_eq!(decision(&a), Decision::Proceed);
    let due = alice
        .acquire(acquire("s", "due"))
        .await
        .unwrap()
        .into_inner();
    let fail = Outcome::Failure(proto::Failure {
        error: "alice's secret error".into(),
        permanent: false,
        retry_after: secs(0),
    });
    alice
        .complete(complete("s", "due", &token(&due), fail))
        .await
        .unwrap();

    // Get, Watch: Bob sees nothing.
    assert_eq!(
        bob.get(get_req("s", "k")).await.unwrap_err().code(),
        Code::NotFound
    );
    let watch = proto::WatchRequest {
        scope: "s".into(),
        key: "k".into(),
        timeout: secs(1),
    };
    assert_eq!(bob.watch(watch).await.unwrap_err().code(), Code::NotFound);
    // Complete, ExtendLease with Alice's token: nothing to act on.
    let err = bob
        .complete(complete("s", "k", &token(&a), success(b"bob")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = bob
        .extend_lease(proto::ExtendLeaseRequest {
            scope: "s".into(),
            key: "k".into(),
            lease_token: token(&a),
            extend_by: secs(60),
            checkpoint: Some(b"bob".to_vec()),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    // Acquire: the same scope and key is Bob's own, separate record.
    let b = bob.acquire(acquire("s", "k")).await.unwrap().into_inner();
    assert_eq!(decision(&b), Decision::Proceed);
    assert_eq!(b.lease.as_ref().unwrap().attempt, 1);
    assert_ne!(token(&b), token(&a));
    // WatchDue: Bob is never offered Alice's due record.
    let mut feed = bob
        .watch_due(proto::WatchDueRequest { scope: "s".into() })
        .await
        .unwrap()
        .into_inner();
    let offered = tokio::time::timeout(Duration::from_millis(500), feed.next()).await;
    assert!(offered.is_err(), "nothing offered to bob: {offered:?}");

    // Alice's records are as she left them.
    let record = get_record_authed(&mut alice, "s", "k").await;
    assert_eq!(status_of(&record), proto::Status::Processing);
    assert!(record.checkpoint.is_empty());
    let mut alice_feed = alice
        .watch_due(proto::WatchDueRequest { scope: "s".into() })
        .await
        .unwrap()
        .into_inner();
    let mine = tokio::time::timeout(Duration::from_secs(5), alice_feed.next())
        .await
        .expect("alice is offered her record")
        .unwrap()
        .unwrap();
    assert_eq!(mine.record.unwrap().key, "due");
}

async fn get_record_authed(c: &mut AuthedClient, scope: &str, key: &str) -> proto::Record {
    c.get(get_req(scope, key))
        .await
        .expect("get")
        .into_inner()
        .record
        .expect("record")
}

#[tokio::test]
async fn sighup_reloads_the_credentials_of_a_running_server() {
    let file = TokenFile::new(&tokens());
    let db = TestDatabase::create().await;
    let path = file.path.to_str().unwrap().to_owned();
    let server = ServerProcess::start_with(&db.url, &["--auth-tokens", &path]).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let bearer = |t: &str| Bearer(format!("Bearer {t}").parse().unwrap());
    let mut alice = proto::coordinator_client::CoordinatorClient::with_interceptor(
        channel.clone(),
        bearer(ALICE),
    );
    assert_eq!(
        alice.get(get_req("s", "k")).await.unwrap_err().code(),
        Code::NotFound
    );

    file.rewrite(&format!("{BOB} tenant-b\n"));
    server.signal("HUP");
    eventually(
        "alice's token to be revoked",
        Duration::from_secs(10),
        || {
            let mut alice = alice.clone();
            async move {
                let code = alice.get(get_req("s", "k")).await.unwrap_err().code();
                (code == Code::Unauthenticated).then_some(())
            }
        },
    )
    .await;
    let mut bob =
        proto::coordinator_client::CoordinatorClient::with_interceptor(channel, bearer(BOB));
    assert_eq!(
        bob.get(get_req("s", "k")).await.unwrap_err().code(),
        Code::NotFound
    );
}

#[tokio::test]
async fn one_tenant_cannot_take_every_waiting_place() {
    use idempotency_coordinator::domain::WaiterLimits;
    let file = TokenFile::new(&tokens());
    let path = file.path.clone();
    let app = spawn_app_with(move |c| {
        c.auth_tokens = Some(path);
        c.waiter_limits = WaiterLimits {
            total: 3,
            per_tenant: 2,
        };
    })
    .await;
    let mut alice = client_with_token(&app, ALICE).await;
    let mut bob = client_with_token(&app, BOB).await;
    let held = alice.acquire(acquire("s", "k")).await.unwrap().into_inner();
    assert_eq!(decision(&held), Decision::Proceed);
    let bob_held = bob.acquire(acquire("s", "k")).await.unwrap().into_inner();
    assert_eq!(decision(&bob_held), Decision::Proceed);

    let _waiting: Vec<_> = (0..2)
        .map(|_| {
            let mut a = alice.clone();
            tokio::spawn(async move { a.acquire(waiting("s", "k", 30)).await })
        })
        .collect();
    until_waiters(&app, 2).await;
    let err = alice.acquire(waiting("s", "k", 30)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(reason(&err), "TOO_MANY_WAITERS");
    // A call without wait still gets its answer.
    let now = alice.acquire(acquire("s", "k")).await.unwrap().into_inner();
    assert_eq!(decision(&now), Decision::InProgress);

    // Bob still has a place.
    let mut b = bob.clone();
    let bob_waits = tokio::spawn(async move { b.acquire(waiting("s", "k", 30)).await });
    until_waiters(&app, 3).await;
    // And then the server is full.
    let err = bob.acquire(waiting("s", "k", 30)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    bob_waits.abort();
}

#[tokio::test]
async fn a_replay_kept_for_one_tenant_answers_no_other() {
    let file = TokenFile::new(&tokens());
    let app = app_with_tokens(&file).await;
    let mut alice = client_with_token(&app, ALICE).await;
    let mut bob = client_with_token(&app, BOB).await;

    let lease = alice.acquire(acquire("s", "k")).await.unwrap().into_inner();
    alice
        .complete(complete("s", "k", &token(&lease), success(b"alice's")))
        .await
        .unwrap();
    for _ in 0..2 {
        let replay = alice.acquire(acquire("s", "k")).await.unwrap().into_inner();
        assert_eq!(decision(&replay), Decision::AlreadyDone);
    }

    let theirs = bob.acquire(acquire("s", "k")).await.unwrap().into_inner();
    assert_eq!(
        decision(&theirs),
        Decision::Proceed,
        "bob's (s, k) is bob's own"
    );
    bob.complete(complete("s", "k", &token(&theirs), success(b"bob's")))
        .await
        .unwrap();
    for (client, result) in [(&mut alice, b"alice's".as_slice()), (&mut bob, b"bob's")] {
        let replay = client
            .acquire(acquire("s", "k"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(replay.record.unwrap().result.unwrap().result, result);
    }
}
