//! A recovery webhook receiver that records each body and answers as told.

use std::time::Duration;

/// How the test webhook answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookMode {
    Ok,
    Fail,
    Hang,
}

/// A minimal HTTP/1.1 server on 127.0.0.1 that records each request body.
pub struct TestWebhook {
    pub url: String,
    pub bodies: tokio::sync::mpsc::UnboundedReceiver<serde_json::Value>,
}

impl TestWebhook {
    pub async fn start(mode: WebhookMode) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/recover", listener.local_addr().unwrap());
        let (tx, bodies) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let Ok(n) = socket.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buffer.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buffer).to_string();
                        let Some(end) = text.find("\r\n\r\n") else {
                            continue;
                        };
                        let length = text[..end]
                            .lines()
                            .find_map(|l| {
                                let (name, value) = l.split_once(':')?;
                                name.eq_ignore_ascii_case("content-length")
                                    .then(|| value.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if buffer.len() < end + 4 + length {
                            continue;
                        }
                        let body = &buffer[end + 4..end + 4 + length];
                        if let Ok(json) = serde_json::from_slice(body) {
                            let _ = tx.send(json);
                        }
                        match mode {
                            WebhookMode::Hang => {
                                tokio::time::sleep(Duration::from_secs(3600)).await;
                            }
                            WebhookMode::Fail => {
                                let _ = socket
                                    .write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n")
                                    .await;
                            }
                            WebhookMode::Ok => {
                                let _ = socket.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await;
                            }
                        }
                        buffer.clear();
                    }
                });
            }
        });
        TestWebhook { url, bodies }
    }
}
