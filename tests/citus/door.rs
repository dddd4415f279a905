//! The HTTP door on Citus: the workflow API's `/acquire` and `/complete`
//! (as n8n calls them) and the Connect routes make the same calls as gRPC,
//! decided on the worker holding the key.

use serde_json::{Value, json};

use crate::app::spawn_citus_app_with;
use crate::placement::{group_of, range_of_group, worker_of};

async fn post(http: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("an HTTP answer");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

#[tokio::test]
async fn the_workflow_api_and_the_connect_routes_answer_from_the_keys_worker() {
    let Some(app) = spawn_citus_app_with(|c| {
        c.http_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await
    else {
        return;
    };
    idempotency_coordinator::tls::install_crypto_provider();
    let http = reqwest::Client::new();
    let url = format!("http://{}", app.http_addr.expect("the HTTP port"));
    let key = json!({"scope": "order_process", "idempotency_key": "door-1"});

    let (status, first) = post(&http, &format!("{url}/acquire"), &key).await;
    assert_eq!(
        (status, &first["decision"]),
        (200, &json!("PROCEED")),
        "{first}"
    );
    let (_, again) = post(&http, &format!("{url}/acquire"), &key).await;
    assert_eq!(again["decision"], "RETRY_LATER", "{again}");
    let done = json!({"scope": "order_process", "idempotency_key": "door-1",
                      "final_status": "DONE", "attempt_count": 1});
    let (status, answer) = post(&http, &format!("{url}/complete"), &done).await;
    assert_eq!((status, &answer["ok"]), (200, &json!(true)), "{answer}");
    let (_, replay) = post(&http, &format!("{url}/acquire"), &key).await;
    assert_eq!(replay["decision"], "SKIP_ALREADY_DONE", "{replay}");

    // The Connect route of Acquire: a lease whose fencing token comes from
    // the range of the worker holding the key.
    let (status, connect) = post(
        &http,
        &format!("{url}/idempotency.v1.Coordinator/Acquire"),
        &json!({"scope": "s", "key": "door-2"}),
    )
    .await;
    assert_eq!(status, 200, "{connect}");
    assert_eq!(connect["decision"], "DECISION_PROCEED", "{connect}");
    let token: u64 = connect["lease"]["fencingToken"]
        .as_str()
        .expect("a 64-bit number as a JSON string")
        .parse()
        .unwrap();
    let range = range_of_group(group_of(&app.db, worker_of(&app.db, "door-2").await).await);
    assert!(range.contains(&token), "token {token} from {range:?}");
}
