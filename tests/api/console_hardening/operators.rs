//! An operator's name is recorded after the credential in the actor
//! (`credential sha256:…, operator <name>`): a name that could read as
//! another credential or operator, or break a log line, is refused.

use idempotency_coordinator::proto;

use super::*;

fn fail(operator: &str) -> proto::FailPermanentlyRequest {
    proto::FailPermanentlyRequest {
        target: Some(proto::AdminTarget {
            scope: "pay".into(),
            key: "k".into(),
            reason: "stuck".into(),
            operator: operator.into(),
        }),
    }
}

#[tokio::test]
async fn an_operator_name_that_reads_like_another_actor_is_refused_with_the_field_named() {
    let db = TestDatabase::create().await;
    let file = tokens();
    let console = Console::start(&db, Some(&file), &[]).await;
    let mut worker = grpc(&console.server, WORKER).await;
    worker.acquire(acquire("pay", "k")).await.unwrap();
    let mut admin = grpc(&console.server, ADMIN).await;
    for name in [
        "Ada, operator root",
        "credential sha256:0123456789ab",
        "Ada\nadmin action by root",
        "Ada\u{202e}toor",
        " Ada",
    ] {
        let refused = admin.fail_permanently(fail(name)).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{name:?}");
        assert_eq!(bad_fields(&refused), ["target.operator"], "{name:?}");
    }
    let record = admin
        .fail_permanently(fail("Ada O'Neil-Lovelace"))
        .await
        .expect("a plain name is recorded")
        .into_inner()
        .record
        .unwrap();
    let actor = record.admin_action.unwrap().actor;
    assert!(actor.ends_with(", operator Ada O'Neil-Lovelace"), "{actor}");

    // The console refuses such a name at login.
    let login = console
        .log_in(ADMIN, "Ada, credential sha256:0123456789ab")
        .await;
    assert_eq!(login.status(), 400);
    assert!(
        login
            .text()
            .await
            .unwrap()
            .contains("Your name may hold letters")
    );
}
