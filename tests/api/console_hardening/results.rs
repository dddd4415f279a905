//! A stored result on its record page: a bounded preview, never the whole
//! result pretty-printed.

use super::*;

/// 64 KiB of JSON nested 126 deep (serde_json parses up to 128): a list
/// of zeros at the bottom, each of which pretty-printing puts on a line
/// of its own behind 252 spaces of indentation.
fn deep_json() -> Vec<u8> {
    let zeros = vec!["0"; 32 * 1024].join(",");
    format!("{}{zeros}{}", "[".repeat(126), "]".repeat(126)).into_bytes()
}

#[tokio::test]
async fn a_64_kib_json_result_nested_126_deep_makes_a_record_page_of_at_most_32_kib() {
    let db = TestDatabase::create().await;
    let file = tokens();
    let console = Console::start(&db, Some(&file), &[]).await;
    let mut worker = grpc(&console.server, WORKER).await;
    let answer = worker
        .acquire(acquire("pay", "deep"))
        .await
        .unwrap()
        .into_inner();
    let result = deep_json();
    assert!(result.len() >= 64 * 1024);
    worker
        .complete(complete("pay", "deep", &token(&answer), success(&result)))
        .await
        .unwrap();

    let cookie = console.session().await;
    let page = console.get("record?scope=pay&key=deep", &cookie).await;
    assert_eq!(page.status(), 200);
    let page = page.text().await.unwrap();
    assert!(
        page.len() <= 32 * 1024,
        "a {} byte JSON result nested 126 deep made a record page of {} bytes",
        result.len(),
        page.len()
    );
    assert!(page.contains("The first 4096 bytes; download for the rest."));
    assert!(
        page.contains("[[[[[[[[0,0,0"),
        "the preview is the result as stored"
    );

    // The whole result is the download's.
    let download = console.get("result?scope=pay&key=deep", &cookie).await;
    assert_eq!(download.bytes().await.unwrap().as_ref(), result.as_slice());
}

#[tokio::test]
async fn a_small_json_result_is_still_pretty_printed() {
    let db = TestDatabase::create().await;
    let file = tokens();
    let console = Console::start(&db, Some(&file), &[]).await;
    let mut worker = grpc(&console.server, WORKER).await;
    let answer = worker
        .acquire(acquire("pay", "small"))
        .await
        .unwrap()
        .into_inner();
    worker
        .complete(complete(
            "pay",
            "small",
            &token(&answer),
            success(br#"{"id":7,"ok":[1,2]}"#),
        ))
        .await
        .unwrap();
    let cookie = console.session().await;
    let page = console.get("record?scope=pay&key=small", &cookie).await;
    let page = page.text().await.unwrap();
    assert!(page.contains("&quot;id&quot;: 7,\n"), "{page}");
}
