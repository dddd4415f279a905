//! Citus: whether the database is a Citus coordinator, what migrating one
//! adds (`sql/citus/`), and the nodes that hold its shards.
//!
//! On a Citus coordinator `idempotency_keys` is distributed by
//! `idempotency_key` and the single-key functions are delegated to the
//! worker holding the key (docs/scaling.md). The store splits each batch
//! of Acquires or Completes by the node holding each key (`shards`) and
//! sends each group as one routed statement that Citus delegates to that
//! node (`sql/citus/batch_routes.sql`); the listener listens on every
//! worker too, where the functions' notifications are sent. Sweeping, the
//! due count and the recovery feed span shards: they use the forms of
//! `sql/citus/maintenance.sql` (see `store::maintenance`).

use tokio_postgres::GenericClient;

/// Distributes the table; run after the numbered migrations.
pub(super) const DISTRIBUTE_TABLE: &str = include_str!("../../sql/citus/distribute_table.sql");
/// The maintenance statements in forms Citus runs (sweeping per shard, the
/// recovery feed claimed key by key); run after the function files.
pub(super) const MAINTENANCE: &str = include_str!("../../sql/citus/maintenance.sql");
/// Delegates the single-key functions; run after the function files.
pub(super) const DELEGATE_FUNCTIONS: &str = include_str!("../../sql/citus/delegate_functions.sql");
/// Makes the batches delegable per node; run after `DELEGATE_FUNCTIONS`.
pub(super) const BATCH_ROUTES: &str = include_str!("../../sql/citus/batch_routes.sql");

/// Whether the database has the `citus` extension.
pub async fn present(client: &impl GenericClient) -> Result<bool, tokio_postgres::Error> {
    client
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')",
            &[],
        )
        .await?
        .try_get(0)
}

/// The other active primary nodes of the cluster (host, port): where the
/// rows this node does not hold live, and their notifications are sent.
pub async fn other_nodes(
    client: &impl GenericClient,
) -> Result<Vec<(String, u16)>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT nodename, nodeport FROM pg_dist_node
              WHERE isactive AND noderole = 'primary'
                AND groupid <> (SELECT groupid FROM pg_dist_local_group)
              ORDER BY groupid",
            &[],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let port: i32 = row.try_get(1)?;
            Ok((row.try_get(0)?, u16::try_from(port).unwrap_or(5432)))
        })
        .collect()
}

/// `pg` (the coordinator's settings) pointed at another node: the same
/// user, password, database and connection settings.
pub fn node_config(pg: &tokio_postgres::Config, host: &str, port: u16) -> tokio_postgres::Config {
    let mut node = tokio_postgres::Config::new();
    node.host(host).port(port);
    if let Some(user) = pg.get_user() {
        node.user(user);
    }
    if let Some(password) = pg.get_password() {
        node.password(password);
    }
    if let Some(dbname) = pg.get_dbname() {
        node.dbname(dbname);
    }
    if let Some(name) = pg.get_application_name() {
        node.application_name(name);
    }
    if let Some(timeout) = pg.get_connect_timeout() {
        node.connect_timeout(*timeout);
    }
    if let Some(timeout) = pg.get_tcp_user_timeout() {
        node.tcp_user_timeout(*timeout);
    }
    node.ssl_mode(pg.get_ssl_mode())
        .keepalives(pg.get_keepalives())
        .keepalives_idle(pg.get_keepalives_idle());
    if let Some(interval) = pg.get_keepalives_interval() {
        node.keepalives_interval(interval);
    }
    if let Some(retries) = pg.get_keepalives_retries() {
        node.keepalives_retries(retries);
    }
    node
}
