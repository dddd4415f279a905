//! The `idle-connections` scenario: what connections that make no call cost
//! the server.

use std::time::Duration;

use crate::Args;
use crate::client::connect;
use crate::report::resident_mib;

/// Opens `--waiters` connections that make no call to the first target and
/// reports its server's resident memory before and after.
pub(crate) async fn idle_connections(args: &Args) {
    let before = args.server_pid.first().copied().and_then(resident_mib);
    let open = connect(&args.target[..1], args.waiters).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = args.server_pid.first().copied().and_then(resident_mib);
    if let (Some(before), Some(after)) = (before, after) {
        println!(
            "idle-connections: {} connections: server resident {before:.1} MiB before, {after:.1} MiB after: {:.1} KiB each",
            open.len(),
            (after - before) * 1024.0 / open.len() as f64
        );
    }
    drop(open);
}
