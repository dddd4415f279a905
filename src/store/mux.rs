//! A few database connections shared by all calls, each call's statement
//! pipelined behind the others on its connection instead of waiting for a
//! connection of its own. Every statement of a call is a single autocommit
//! statement holding row locks only while it runs, so sharing a connection is
//! safe; a closed connection is replaced on first use after it closed.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::RwLock;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row, Statement};

use super::StoreError;

/// One shared connection and the statements prepared on it.
pub(super) struct Shared {
    pub client: Client,
    prepared: std::sync::Mutex<HashMap<&'static str, Statement>>,
}

impl Shared {
    /// `sql` prepared on this connection (once).
    async fn prepare(&self, sql: &'static str) -> Result<Statement, StoreError> {
        if let Some(statement) = self.lock().get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql).await?;
        self.lock().insert(sql, statement.clone());
        Ok(statement)
    }

    /// At most one row of `sql` (prepared here once).
    pub async fn query_opt(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, StoreError> {
        let statement = self.prepare(sql).await?;
        Ok(self.client.query_opt(&statement, params).await?)
    }

    /// Every row of `sql` (prepared here once).
    pub async fn query(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let statement = self.prepare(sql).await?;
        Ok(self.client.query(&statement, params).await?)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<&'static str, Statement>> {
        self.prepared.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The shared connections, handed out in turn.
pub(super) struct Mux {
    /// How to connect, with PostgreSQL's own limit on each statement a
    /// little under the client's query timeout: a statement that runs too
    /// long is then rolled back by the database itself, rather than left
    /// running (and maybe committing) after its caller heard UNAVAILABLE.
    pg: tokio_postgres::Config,
    slots: Vec<RwLock<Option<Arc<Shared>>>>,
    next: AtomicUsize,
}

impl Mux {
    pub fn new(
        mut pg: tokio_postgres::Config,
        connections: usize,
        query_timeout: Duration,
    ) -> Self {
        let statement_timeout = (query_timeout * 9 / 10).max(Duration::from_millis(1));
        let options = format!(
            "{} -c statement_timeout={}",
            pg.get_options().unwrap_or_default(),
            statement_timeout.as_millis()
        );
        pg.options(options.trim_start());
        Mux {
            pg,
            slots: (0..connections.max(1)).map(|_| RwLock::new(None)).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// The next connection, connecting it (within `wait`) if it is new or
    /// has closed.
    pub async fn get(&self, wait: Duration) -> Result<Arc<Shared>, StoreError> {
        let slot = &self.slots[self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len()];
        if let Some(shared) = slot.read().await.as_ref()
            && !shared.client.is_closed()
        {
            return Ok(Arc::clone(shared));
        }
        let mut slot = slot.write().await;
        if let Some(shared) = slot.as_ref()
            && !shared.client.is_closed()
        {
            return Ok(Arc::clone(shared));
        }
        let (client, connection) = tokio::time::timeout(wait, self.pg.connect(NoTls))
            .await
            .map_err(|_| {
                StoreError::Unavailable("connecting to the database timed out".into())
            })??;
        tokio::spawn(connection);
        let shared = Arc::new(Shared {
            client,
            prepared: std::sync::Mutex::new(HashMap::new()),
        });
        *slot = Some(Arc::clone(&shared));
        Ok(shared)
    }
}
