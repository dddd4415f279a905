//! A call's statement carries the moment its coordinator stops waiting for
//! the answer, and rolls back rather than commit after it
//! (`sql/functions/deadline.sql`): a statement stuck in a paused
//! network, or behind a lock, must not take a lease or store a result that
//! its caller already heard UNAVAILABLE for.

use std::time::Duration;

use chrono::{DateTime, Utc};
use idempotency_coordinator::store::{ACQUIRE_SQL, COMPLETE_SQL, migrate, record_in_rec};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Row};

use crate::helpers::*;

async fn acquire(client: &Client, deadline: DateTime<Utc>) -> Result<Row, tokio_postgres::Error> {
    client
        .query_one(
            ACQUIRE_SQL,
            &[
                &"t",
                &"s",
                &"k",
                &"",
                &"",
                &60_000i64,
                &3i32,
                &3_600_000i64,
                &0i64,
                &0i64,
                &Some(deadline),
            ],
        )
        .await
}

async fn complete(
    client: &Client,
    token: uuid::Uuid,
    deadline: DateTime<Utc>,
) -> Result<Row, tokio_postgres::Error> {
    client
        .query_one(
            COMPLETE_SQL,
            &[
                &"t",
                &"s",
                &"k",
                &token,
                &"SUCCESS",
                &b"sent".as_slice(),
                &"text/plain",
                &0i32,
                &"",
                &"",
                &false,
                &None::<i64>,
                &1_000i64,
                &60_000i64,
                &0i64,
                &Some(deadline),
            ],
        )
        .await
}

async fn database_now(client: &Client) -> DateTime<Utc> {
    client
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .unwrap()
        .get(0)
}

fn refused_as_late(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&SqlState::QUERY_CANCELED)
}

#[tokio::test]
async fn a_statement_arriving_after_its_deadline_takes_no_lease() {
    let db = TestDatabase::create().await;
    let mut client = db.connect().await;
    migrate::migrate(&mut client).await.unwrap();

    let past = database_now(&client).await - chrono::Duration::seconds(1);
    let late = acquire(&client, past).await.unwrap_err();
    assert!(refused_as_late(&late), "{late:?}");
    assert_eq!(db.count_records().await, 0);

    let future = database_now(&client).await + chrono::Duration::seconds(60);
    let row = acquire(&client, future).await.unwrap();
    assert_eq!(row.get::<_, &str>("decision"), "PROCEED");
    assert_eq!(db.count_records().await, 1);
}

#[tokio::test]
async fn a_statement_finishing_after_its_deadline_rolls_back_whole() {
    let db = TestDatabase::create().await;
    let mut client = db.connect().await;
    migrate::migrate(&mut client).await.unwrap();
    let far = database_now(&client).await + chrono::Duration::seconds(60);
    let acquired = acquire(&client, far).await.unwrap();
    let token = record_in_rec(&acquired).unwrap().lease.token.as_uuid();

    // Another session holds the record's row lock past the Complete's
    // deadline: the Complete arrives in time, waits, runs, and must then
    // roll back instead of committing for a caller that stopped waiting.
    let mut holder = db.connect().await;
    let lock = holder.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM idempotency_keys FOR UPDATE", &[])
        .await
        .unwrap();
    let deadline = database_now(&client).await + chrono::Duration::milliseconds(300);
    let completing = tokio::spawn(async move { complete(&client, token, deadline).await });
    eventually(
        "the Complete waits for the row lock",
        Duration::from_secs(10),
        || {
            let db = &db;
            async move {
                let waiting: i64 = db
                    .connect()
                    .await
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get(0);
                (waiting == 1).then_some(())
            }
        },
    )
    .await;
    // Hold the lock until the deadline has passed on the database's clock.
    eventually("the deadline passes", Duration::from_secs(10), || {
        let lock = &lock;
        async move {
            let now: DateTime<Utc> = lock
                .query_one("SELECT clock_timestamp()", &[])
                .await
                .unwrap()
                .get(0);
            (now > deadline).then_some(())
        }
    })
    .await;
    lock.commit().await.unwrap();

    let late = completing.await.unwrap().unwrap_err();
    assert!(refused_as_late(&late), "{late:?}");
    assert_eq!(
        statuses(&db).await,
        vec![("k".to_owned(), "PROCESSING".to_owned())],
        "the late Complete left the record as it was"
    );
}
