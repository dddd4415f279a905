//! Which node holds a key's row on Citus, so that a batch is split into one
//! statement per node (`batch`): Citus's map of shards, read from the
//! coordinator, and the hash Citus places a key by.
//!
//! `idempotency_keys` is distributed by hash of `idempotency_key`: a key's
//! shard is the one whose range holds `worker_hash(key)`, for a `text`
//! column PostgreSQL's `hashtext`, which [`hashtext`] computes here (checked
//! against the database's `worker_hash` before the map is used; a server
//! whose hash disagrees sends every call alone, as without a map).
//!
//! With the map come the nodes' addresses: unless told to go through the
//! coordinator node (`--citus-via-coordinator`), the server keeps shared
//! connections to every node that holds shards ([`Routes::node`]) and sends
//! each call, and each node's share of a batch, straight there. Every node
//! of a Citus 11+ cluster has the metadata, so a distributed function
//! called on the node that holds its key's shard runs there, locally: the
//! coordinator node does no work per call.
//!
//! The map is only ever a guess at where to send a call: each batch group
//! goes out as one call of `idempotency_call_batch_at`, which Citus delegates to the node of its routing key and
//! whose statements Citus routes to wherever their rows live now; a single
//! call is a delegated function call, routed the same way from whichever
//! node receives it. A stale map (shards moved since it was read) thus
//! costs a hop and a distributed commit, never a wrong answer, and only
//! until the map is read again ([`REREAD`] after the last reading).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::{GenericClient, Row};

use super::StoreError;
use super::mux::Mux;

/// How old the map gets before a batch worker reads it again.
pub(super) const REREAD: Duration = Duration::from_secs(30);

/// The shards of `idempotency_keys`: hash range, the node group that holds
/// it (one placement of each) and that group's primary node's address.
pub(super) const MAP: &str = "SELECT DISTINCT ON (s.shardid) \
     s.shardminvalue::int, s.shardmaxvalue::int, p.groupid, n.nodename, n.nodeport \
     FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid) \
     JOIN pg_dist_node n ON n.groupid = p.groupid AND n.noderole = 'primary' AND n.isactive \
     WHERE s.logicalrelid = 'idempotency_keys'::regclass AND p.shardstate = 1 \
     ORDER BY s.shardid, p.groupid";

/// Keys whose hash the server checks against `worker_hash` before it uses
/// its map: every length up to past two of the hash's 12-byte blocks,
/// and bytes above ASCII.
const SAMPLES: &[&str] = &[
    "",
    "a",
    "ab",
    "abc",
    "abcd",
    "abcde",
    "abcdef",
    "abcdefg",
    "abcdefgh",
    "abcdefghi",
    "abcdefghij",
    "abcdefghijk",
    "abcdefghijkl",
    "abcdefghijklm",
    "order-2024-000123/charge",
    "ключ-идемпотентности",
    "a key long enough to take several of the hash's twelve-byte blocks",
];

/// The node group that holds each hash range, by range.
#[derive(Debug)]
pub(super) struct ShardMap {
    /// (lowest hash, highest hash, node group), by lowest hash.
    ranges: Vec<(i32, i32, i32)>,
    /// Each node group's primary node: (group, host, port).
    nodes: Vec<(i32, String, u16)>,
}

impl ShardMap {
    /// The node group of `key`'s shard, as the map says.
    pub fn node_of(&self, key: &str) -> Option<i32> {
        let hash = hashtext(key.as_bytes());
        let at = self.ranges.partition_point(|&(min, _, _)| min <= hash);
        let &(_, max, group) = self.ranges.get(at.checked_sub(1)?)?;
        (hash <= max).then_some(group)
    }
}

/// How the server connects straight to the nodes that hold shards.
#[derive(Debug, Clone)]
pub(super) struct Direct {
    /// The coordinator node's settings (user, password, database, ...),
    /// pointed at each node in turn.
    pub pg: super::Postgres,
    /// Shared connections to each node.
    pub connections: usize,
    pub query_timeout: Duration,
}

/// Shared connections to one node.
struct Node {
    host: String,
    port: u16,
    mux: Arc<Mux>,
}

/// The map calls are routed by: none on plain PostgreSQL (a batch is one
/// statement), or before a Citus coordinator's map has been read; and the
/// shared connections to the nodes it names, when calls go straight there.
#[derive(Default)]
pub(super) struct Routes {
    map: RwLock<Option<Arc<ShardMap>>>,
    /// When the map is to be read again.
    reread_at: Mutex<Option<Instant>>,
    /// `None`: every call goes through the coordinator node.
    direct: Option<Direct>,
    /// By node group; kept across readings of the map while a group's
    /// address stays the same.
    nodes: RwLock<HashMap<i32, Node>>,
}

impl Routes {
    pub fn new(direct: Option<Direct>) -> Self {
        Routes {
            direct,
            ..Routes::default()
        }
    }

    /// Whether a map has been read: batches are split by it.
    pub fn ready(&self) -> bool {
        self.map.read().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    pub fn map(&self) -> Option<Arc<ShardMap>> {
        self.map.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sets the map (none: calls run alone), to be read again in [`REREAD`].
    pub fn set(&self, map: Option<ShardMap>) {
        let reread_at = map.is_some().then(|| Instant::now() + REREAD);
        if let Some(map) = &map {
            self.connect_nodes(map);
        }
        *self.map.write().unwrap_or_else(|e| e.into_inner()) = map.map(Arc::new);
        *self.reread_at.lock().unwrap_or_else(|e| e.into_inner()) = reread_at;
    }

    /// Whether the map is due to be read again; the one caller told so
    /// reads it (the next reading is due [`REREAD`] later either way).
    pub fn reread_due(&self) -> bool {
        let mut reread_at = self.reread_at.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match *reread_at {
            Some(at) if at <= now => {
                *reread_at = Some(now + REREAD);
                true
            }
            _ => false,
        }
    }

    /// Replaces a map with one read again.
    pub fn replace(&self, map: ShardMap) -> Arc<ShardMap> {
        self.connect_nodes(&map);
        let map = Arc::new(map);
        *self.map.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(&map));
        map
    }

    /// The shared connections to node group `group`, when calls go
    /// straight to the nodes and the map names it.
    pub fn node(&self, group: i32) -> Option<Arc<Mux>> {
        let nodes = self.nodes.read().unwrap_or_else(|e| e.into_inner());
        nodes.get(&group).map(|node| Arc::clone(&node.mux))
    }

    /// Whether calls go straight to the nodes (a map read, and the server
    /// not told to go through the coordinator node).
    pub fn direct(&self) -> bool {
        self.direct.is_some() && self.ready()
    }

    /// The shared connections to the node the map places `key` on.
    pub fn node_of_key(&self, key: &str) -> Option<Arc<Mux>> {
        self.direct.as_ref()?;
        self.node(self.map()?.node_of(key)?)
    }

    /// Shared connections (not yet connected) for every node `map` names
    /// that has none at its address; none kept for nodes it no longer
    /// names.
    fn connect_nodes(&self, map: &ShardMap) {
        let Some(direct) = &self.direct else {
            return;
        };
        let mut nodes = self.nodes.write().unwrap_or_else(|e| e.into_inner());
        nodes.retain(|group, node| {
            map.nodes
                .iter()
                .any(|(g, host, port)| g == group && *host == node.host && *port == node.port)
        });
        for (group, host, port) in &map.nodes {
            nodes.entry(*group).or_insert_with(|| {
                tracing::info!(
                    node_group = group,
                    host,
                    port,
                    "calls go straight to this node"
                );
                let pg = direct.pg.for_node(host, *port);
                Node {
                    host: host.clone(),
                    port: *port,
                    mux: Arc::new(Mux::new(pg, direct.connections, direct.query_timeout)),
                }
            });
        }
    }
}

/// Reads the map again in the background if it is due (on `coordinator`,
/// the shared connections to the coordinator node, within `limit`): calls
/// go on by the map they have meanwhile, and on failure it stays as it was.
pub(super) fn reread_if_due(routes: &Arc<Routes>, coordinator: &Arc<Mux>, limit: Duration) {
    if !routes.reread_due() {
        return;
    }
    let (routes, coordinator) = (Arc::clone(routes), Arc::clone(coordinator));
    tokio::spawn(async move {
        let reading = async {
            let shared = coordinator.get(limit).await?;
            coordinator
                .in_time(&shared, limit, async {
                    map_of(&shared.query(MAP, &[]).await?)
                })
                .await
        };
        match reading.await {
            Ok(fresh) => {
                routes.replace(fresh);
            }
            Err(e) => tracing::debug!(error = ?e, "the map of shards was not read again"),
        }
    });
}

/// The map of [`MAP`]'s rows.
pub(super) fn map_of(rows: &[Row]) -> Result<ShardMap, StoreError> {
    let mut ranges = Vec::with_capacity(rows.len());
    let mut nodes: Vec<(i32, String, u16)> = Vec::new();
    for row in rows {
        let group: i32 = row.try_get(2)?;
        ranges.push((row.try_get(0)?, row.try_get(1)?, group));
        if !nodes.iter().any(|(g, _, _)| *g == group) {
            let port: i32 = row.try_get(4)?;
            let port = u16::try_from(port)
                .map_err(|_| StoreError::Corrupt(format!("node port {port} out of range")))?;
            nodes.push((group, row.try_get(3)?, port));
        }
    }
    ranges.sort_unstable();
    Ok(ShardMap { ranges, nodes })
}

/// Reads the map of `idempotency_keys`'s shards from a Citus coordinator;
/// `None` (with a warning) when this server's hash is not the database's.
pub(super) async fn load(client: &impl GenericClient) -> Result<Option<ShardMap>, StoreError> {
    let rows = client
        .query(
            "SELECT k, worker_hash(k) FROM unnest($1::text[]) k",
            &[&SAMPLES],
        )
        .await?;
    for row in &rows {
        let (key, hash): (&str, i32) = (row.try_get(0)?, row.try_get(1)?);
        if hashtext(key.as_bytes()) != hash {
            tracing::warn!(
                key,
                "the database hashes keys unlike this server: \
                 Acquires and Completes are sent alone (no group commit)"
            );
            return Ok(None);
        }
    }
    Ok(Some(map_of(&client.query(MAP, &[]).await?)?))
}

/// PostgreSQL's `hashtext` for a deterministic collation: `hash_bytes`
/// (Bob Jenkins's lookup3, `src/common/hashfn.c`) of the text's bytes,
/// as the signed 32-bit value `worker_hash` returns.
pub(super) fn hashtext(bytes: &[u8]) -> i32 {
    let word = |b: &[u8]| -> u32 {
        b.iter().enumerate().fold(0, |w, (i, &byte)| {
            w.wrapping_add(u32::from(byte) << (8 * i))
        })
    };
    #[allow(clippy::cast_possible_truncation)]
    let init = 0x9e37_79b9_u32
        .wrapping_add(bytes.len() as u32)
        .wrapping_add(3_923_095);
    let (mut a, mut b, mut c) = (init, init, init);
    let mut rest = bytes;
    while rest.len() >= 12 {
        a = a.wrapping_add(word(&rest[0..4]));
        b = b.wrapping_add(word(&rest[4..8]));
        c = c.wrapping_add(word(&rest[8..12]));
        mix(&mut a, &mut b, &mut c);
        rest = &rest[12..];
    }
    // The tail: the lowest byte of c is left to the length.
    let part = |from: usize, to: usize| word(&rest[from.min(rest.len())..to.min(rest.len())]);
    a = a.wrapping_add(part(0, 4));
    b = b.wrapping_add(part(4, 8));
    c = c.wrapping_add(part(8, 11) << 8);
    finish(&mut a, &mut b, &mut c);
    i32::from_ne_bytes(c.to_ne_bytes())
}

fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    for (r1, r2, r3) in [(4, 6, 8), (16, 19, 4)] {
        *a = a.wrapping_sub(*c) ^ c.rotate_left(r1);
        *c = c.wrapping_add(*b);
        *b = b.wrapping_sub(*a) ^ a.rotate_left(r2);
        *a = a.wrapping_add(*c);
        *c = c.wrapping_sub(*b) ^ b.rotate_left(r3);
        *b = b.wrapping_add(*a);
    }
}

fn finish(a: &mut u32, b: &mut u32, c: &mut u32) {
    *c = (*c ^ *b).wrapping_sub(b.rotate_left(14));
    *a = (*a ^ *c).wrapping_sub(c.rotate_left(11));
    *b = (*b ^ *a).wrapping_sub(a.rotate_left(25));
    *c = (*c ^ *b).wrapping_sub(b.rotate_left(16));
    *a = (*a ^ *c).wrapping_sub(c.rotate_left(4));
    *b = (*b ^ *a).wrapping_sub(a.rotate_left(14));
    *c = (*c ^ *b).wrapping_sub(b.rotate_left(24));
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPECTED: &[(&str, i32)] = &[
        ("", -1_477_818_771),
        ("a", 1_075_015_857),
        ("ab", 1_718_550_461),
        ("abc", -785_388_649),
        ("abcd", -393_934_804),
        ("abcde", -445_659_580),
        ("abcdefgh", -1_960_928_205),
        ("abcdefghijk", -1_483_803_693),
        ("abcdefghijkl", -1_586_087_212),
        ("abcdefghijklmnopq", 1_648_114_242),
        ("ключ", -884_514_432),
        ("order-7", 1_181_968_615),
    ];

    #[test]
    fn hashtext_is_postgresqls() {
        // SELECT hashtext(k) on PostgreSQL 15.
        for (key, hash) in EXPECTED {
            assert_eq!(hashtext(key.as_bytes()), *hash, "{key:?}");
        }
    }

    #[test]
    fn a_key_falls_in_the_range_that_holds_its_hash() {
        let map = ShardMap {
            ranges: vec![(i32::MIN, -1, 1), (0, i32::MAX, 2)],
            nodes: Vec::new(),
        };
        for (key, hash) in EXPECTED {
            assert_eq!(map.node_of(key), Some(if *hash < 0 { 1 } else { 2 }));
        }
    }
}
