//! Raw TCP clients: what an HTTP client library would never send.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Raises this process's open file limit: the tests hold thousands of
/// sockets at both ends.
pub fn more_files() {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
}

/// A connection that has sent `sent`.
pub async fn open(addr: SocketAddr, sent: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    if !sent.is_empty() {
        stream.write_all(sent).await.expect("write");
    }
    stream
}

/// Reads until the peer closes, within `deadline`: what arrived and how
/// long the close took, or `None` when the connection is still open then.
pub async fn until_closed(
    stream: &mut TcpStream,
    deadline: Duration,
) -> Option<(String, Duration)> {
    let started = Instant::now();
    let mut all = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let left = deadline.checked_sub(started.elapsed())?;
        match tokio::time::timeout(left, stream.read(&mut buffer)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => {
                return Some((
                    String::from_utf8_lossy(&all).into_owned(),
                    started.elapsed(),
                ));
            }
            Ok(Ok(n)) => all.extend_from_slice(&buffer[..n]),
        }
    }
}

/// Reads until `wanted` has arrived, within `deadline`: what arrived, or
/// `None`.
pub async fn until_text(
    stream: &mut TcpStream,
    wanted: &str,
    deadline: Duration,
) -> Option<(String, Duration)> {
    let started = Instant::now();
    let mut all = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&all).into_owned();
        if text.contains(wanted) {
            return Some((text, started.elapsed()));
        }
        let left = deadline.checked_sub(started.elapsed())?;
        match tokio::time::timeout(left, stream.read(&mut buffer)).await {
            Ok(Ok(n)) if n > 0 => all.extend_from_slice(&buffer[..n]),
            _ => return None,
        }
    }
}
