//! Where keys live: the node and the shard of each, as the coordinator's
//! metadata says now, and the fencing tokens each node group draws. Shared
//! by the server's Citus tests and the Citus fault tests; each uses part
//! of it.

use std::collections::BTreeMap;

use super::harness::CitusDatabase;

/// `n` fresh keys, each with the shard it hashes to and the port of the
/// node holding that shard, in one query.
pub async fn place(db: &CitusDatabase, n: usize) -> Vec<(String, i64, u16)> {
    let keys: Vec<String> = (0..n)
        .map(|_| format!("k-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]))
        .collect();
    placements(db, &keys).await
}

/// Each of `keys` with its shard and its node's port.
pub async fn placements(db: &CitusDatabase, keys: &[String]) -> Vec<(String, i64, u16)> {
    let rows = db
        .connect()
        .await
        .query(
            "SELECT u.k, p.shardid, n.nodeport
               FROM unnest($1::text[]) WITH ORDINALITY AS u(k, i)
               JOIN pg_dist_placement p
                 ON p.shardid = get_shard_id_for_distribution_column('idempotency_keys', u.k)
               JOIN pg_dist_node n USING (groupid)
              ORDER BY u.i",
            &[&keys],
        )
        .await
        .expect("read the keys' placements");
    rows.iter()
        .map(|r| {
            let port: i32 = r.get(2);
            (r.get(0), r.get(1), u16::try_from(port).unwrap())
        })
        .collect()
}

/// `n` fresh keys by the port of the node holding each.
pub async fn keys_by_node(db: &CitusDatabase, n: usize) -> BTreeMap<u16, Vec<String>> {
    let mut by_node: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    for (key, _, port) in place(db, n).await {
        by_node.entry(port).or_default().push(key);
    }
    by_node
}

/// The port of the worker that holds `key`'s shard.
pub async fn worker_of(db: &CitusDatabase, key: &str) -> u16 {
    let [(_, _, port)] = <[_; 1]>::try_from(placements(db, &[key.to_owned()]).await)
        .expect("one placement for one key");
    port
}

/// The node group of the node on `port`.
pub async fn group_of(db: &CitusDatabase, port: u16) -> u64 {
    let group: i32 = db
        .connect()
        .await
        .query_one(
            "SELECT groupid FROM pg_dist_node WHERE nodeport = $1",
            &[&i32::from(port)],
        )
        .await
        .expect("read the node's group")
        .get(0);
    u64::try_from(group).unwrap()
}

/// The fencing tokens a node group draws: Citus starts group g's copy of a
/// bigint sequence at g * 2^48 + 1.
pub fn range_of_group(group: u64) -> std::ops::Range<u64> {
    (group << 48) + 1..((group + 1) << 48) + 1
}

/// The port of the node holding `shard`.
pub async fn node_of_shard(db: &CitusDatabase, shard: i64) -> u16 {
    let port: i32 = db
        .connect()
        .await
        .query_one(
            "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) \
             WHERE p.shardid = $1",
            &[&shard],
        )
        .await
        .expect("read the shard's placement")
        .get(0);
    u16::try_from(port).unwrap()
}

/// The transaction that last wrote each key's row, as (worker port, xmin),
/// read from every shard.
pub async fn writers(db: &CitusDatabase) -> BTreeMap<String, (u16, String)> {
    let rows = db
        .connect()
        .await
        .query(
            "SELECT n.nodeport, r.result FROM run_command_on_shards('idempotency_keys', \
             $$SELECT coalesce(json_agg(json_build_array(idempotency_key, xmin::text)), '[]') \
               FROM %s$$) r \
             JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node n USING (groupid)",
            &[],
        )
        .await
        .expect("read each shard's rows");
    let mut writers = BTreeMap::new();
    for row in rows {
        let port: i32 = row.get(0);
        let rows: Vec<(String, String)> = serde_json::from_str(row.get(1)).expect("json");
        for (key, xmin) in rows {
            writers.insert(key, (u16::try_from(port).unwrap(), xmin));
        }
    }
    writers
}
