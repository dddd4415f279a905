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
//! The map is only ever a guess at where to send a batch: each group goes
//! out as one call of `idempotency_acquire_batch_at` (or `_complete_`),
//! which Citus delegates to the node of its routing key and whose
//! statements Citus routes to wherever their rows live now. A stale map
//! (shards moved since it was read) thus costs a hop and a distributed
//! commit, never a wrong answer, and only until a batch worker reads the
//! map again ([`REREAD`] after the last reading, before its next batch).

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::{GenericClient, Row};

/// How old the map gets before a batch worker reads it again.
pub(super) const REREAD: Duration = Duration::from_secs(30);

/// The shards of `idempotency_keys`: hash range and the node group that
/// holds it (one placement of each).
pub(super) const MAP: &str = "SELECT DISTINCT ON (s.shardid) \
     s.shardminvalue::int, s.shardmaxvalue::int, p.groupid \
     FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid) \
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

/// The map batches are split by: none on plain PostgreSQL (a batch is one
/// statement), or before a Citus coordinator's map has been read.
#[derive(Debug, Default)]
pub(super) struct Routes {
    map: RwLock<Option<Arc<ShardMap>>>,
    /// When the map is to be read again.
    reread_at: Mutex<Option<Instant>>,
}

impl Routes {
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
        let map = Arc::new(map);
        *self.map.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(&map));
        map
    }
}

/// The map of [`MAP`]'s rows.
pub(super) fn map_of(rows: &[Row]) -> Result<ShardMap, tokio_postgres::Error> {
    let mut ranges = rows
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
        .collect::<Result<Vec<(i32, i32, i32)>, tokio_postgres::Error>>()?;
    ranges.sort_unstable();
    Ok(ShardMap { ranges })
}

/// Reads the map of `idempotency_keys`'s shards from a Citus coordinator;
/// `None` (with a warning) when this server's hash is not the database's.
pub(super) async fn load(
    client: &impl GenericClient,
) -> Result<Option<ShardMap>, tokio_postgres::Error> {
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
        };
        for (key, hash) in EXPECTED {
            assert_eq!(map.node_of(key), Some(if *hash < 0 { 1 } else { 2 }));
        }
    }
}
