//! A TCP proxy between the coordinator and the test's PostgreSQL (its unix
//! socket), whose network can be broken in the ways real ones break, at
//! run time.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::watch;

/// How the network behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Bytes flow.
    Pass,
    /// No byte moves in either direction, on existing connections or new
    /// ones; every socket stays open (a paused network, a NAT that lost its
    /// state). Bytes already sent are delivered when the mode ends.
    Blackhole,
    /// Every connection is reset, new ones are closed at once.
    Drop,
}

#[derive(Debug, Clone, Copy)]
struct State {
    mode: Mode,
    /// Connections numbered below this are silently dead for good (a
    /// firewall that dropped their state), whatever the mode.
    frozen_below: u64,
}

pub struct Proxy {
    pub port: u16,
    state: watch::Sender<State>,
    next_id: Arc<AtomicU64>,
    /// Bytes read from one side and not yet written to the other.
    pending: Arc<AtomicI64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: PathBuf) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (state, watch) = watch::channel(State {
            mode: Mode::Pass,
            frozen_below: 0,
        });
        let next_id = Arc::new(AtomicU64::new(0));
        let pending = Arc::new(AtomicI64::new(0));
        let ids = Arc::clone(&next_id);
        let counted = Arc::clone(&pending);
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let id = ids.fetch_add(1, Ordering::SeqCst);
                let watch = watch.clone();
                let target = target.clone();
                let pending = Arc::clone(&counted);
                tokio::spawn(connection(id, inbound, target, watch, pending));
            }
        });
        Proxy {
            port,
            state,
            next_id,
            pending,
            task,
        }
    }

    pub fn set(&self, mode: Mode) {
        self.state.send_modify(|s| s.mode = mode);
    }

    /// Existing connections go silently dead for good; new ones pass.
    pub fn freeze_existing(&self) {
        let below = self.next_id.load(Ordering::SeqCst);
        self.state.send_modify(|s| {
            s.mode = Mode::Pass;
            s.frozen_below = below;
        });
    }

    /// Bytes held by the proxy, read and not yet delivered.
    pub fn pending(&self) -> i64 {
        self.pending.load(Ordering::SeqCst)
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        // Every connection ends.
        self.state.send_modify(|s| s.mode = Mode::Drop);
    }
}

fn moves(state: &State, id: u64) -> bool {
    state.mode == Mode::Pass && id >= state.frozen_below
}

/// Waits until bytes may move on connection `id`; false when it must close.
async fn until_moving(watch: &mut watch::Receiver<State>, id: u64) -> bool {
    match watch
        .wait_for(|s| s.mode == Mode::Drop || moves(s, id))
        .await
    {
        Ok(s) => s.mode != Mode::Drop,
        Err(_) => false,
    }
}

async fn connection(
    id: u64,
    inbound: TcpStream,
    target: PathBuf,
    mut watch: watch::Receiver<State>,
    pending: Arc<AtomicI64>,
) {
    if !until_moving(&mut watch, id).await {
        reset(inbound);
        return;
    }
    let Ok(outbound) = UnixStream::connect(&target).await else {
        reset(inbound);
        return;
    };
    let (mut inbound, mut outbound) = (inbound, outbound);
    let dropped = {
        let (in_read, in_write) = inbound.split();
        let (out_read, out_write) = outbound.split();
        let up = pump(id, in_read, out_write, watch.clone(), Arc::clone(&pending));
        let down = pump(id, out_read, in_write, watch.clone(), Arc::clone(&pending));
        tokio::select! {
            // Both sides closed.
            _ = async { tokio::join!(up, down) } => false,
            _ = watch.wait_for(|s| s.mode == Mode::Drop) => true,
        }
    };
    if dropped {
        reset(inbound);
    }
}

/// Copies `from` to `to`, holding each chunk while the network does not
/// move; when `from` ends, so does `to` (after the bytes before the end).
async fn pump<R, W>(
    id: u64,
    mut from: R,
    mut to: W,
    mut watch: watch::Receiver<State>,
    pending: Arc<AtomicI64>,
) where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.fetch_add(n as i64, Ordering::SeqCst);
        let open = until_moving(&mut watch, id).await;
        let written = open && to.write_all(&buf[..n]).await.is_ok();
        pending.fetch_sub(n as i64, Ordering::SeqCst);
        if !written {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Closes with a reset (RST), as a dropped connection looks to its peer.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}
