//! Where the database is and how to reach it, read once from the database
//! URL: tokio-postgres's settings and the TLS connector (`store::tls`)
//! every connection to it uses — the pool, the shared connections, the
//! listener, the start-up probe and, on Citus, the nodes' connections
//! ([`Postgres::for_node`]).

use std::ops::Deref;

use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::{Client, Config, Connection, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::tls::{TlsOptions, TlsOptionsError};

/// A connection's byte stream: TLS or not, as negotiated.
pub type PgStream = <MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<Socket>>::Stream;

/// The database's settings and the TLS connector that goes with them.
#[derive(Clone)]
pub struct Postgres {
    /// What tokio-postgres connects with (`verify-*` given to it as
    /// `require`).
    config: Config,
    /// The TLS settings the URL asked for, for messages.
    tls: TlsOptions,
    /// Makes each connection's TLS session, checking the server's
    /// certificate as `tls` says.
    connector: MakeRustlsConnect,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres")
            .field("config", &self.config)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// A database URL that cannot be connected with.
#[derive(Debug, thiserror::Error)]
pub enum PostgresError {
    /// tokio-postgres does not take the rest of it.
    #[error(transparent)]
    Parse(#[from] tokio_postgres::Error),
    /// Its TLS settings cannot work.
    #[error(transparent)]
    Tls(#[from] TlsOptionsError),
}

impl Postgres {
    /// `database_url` read as [`super::pg_config`] reads it, with its TLS
    /// settings: the root certificates are read now.
    pub fn new(database_url: &str) -> Result<Self, PostgresError> {
        let (rest, tls) = TlsOptions::take(database_url)?;
        let mut config = super::pg_config(&rest)?;
        let named = config.get_hosts().iter().all(|h| matches!(h, Host::Tcp(_)))
            && !config.get_hosts().is_empty();
        if !named && config.get_hostaddrs().len() > config.get_hosts().len() {
            // tokio-postgres needs a host name for TLS: with hostaddr alone,
            // `prefer` connects without it; the stricter modes cannot.
            match config.get_ssl_mode() {
                SslMode::Prefer => {
                    config.ssl_mode(SslMode::Disable);
                }
                SslMode::Disable => {}
                _ => return Err(TlsOptionsError::NoHostName(tls.mode_word()).into()),
            }
        }
        let connector = MakeRustlsConnect::new(tls.client_config()?);
        Ok(Postgres {
            config,
            tls,
            connector,
        })
    }

    /// The same database's settings with `config` instead (options or a
    /// node's address changed), and the same TLS.
    pub fn with_config(&self, config: Config) -> Self {
        Postgres {
            config,
            ..self.clone()
        }
    }

    /// The settings, to change a copy of.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The TLS settings the URL asked for.
    pub fn tls(&self) -> &TlsOptions {
        &self.tls
    }

    /// The connector, for the pool.
    pub fn connector(&self) -> MakeRustlsConnect {
        self.connector.clone()
    }

    /// The settings for another node of a Citus cluster at `host:port`:
    /// the same user, database, TLS and checks of its certificate (with
    /// `verify-full`, that it names `host`).
    pub fn for_node(&self, host: &str, port: u16) -> Self {
        self.with_config(super::citus::node_config(&self.config, host, port))
    }

    /// One connection, TLS as the URL asked.
    pub async fn connect(
        &self,
    ) -> Result<(Client, Connection<Socket, PgStream>), tokio_postgres::Error> {
        self.config.connect(self.connector.clone()).await
    }
}

impl Deref for Postgres {
    type Target = Config;

    fn deref(&self) -> &Config {
        &self.config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_citus_node_is_reached_with_the_same_tls_checks() {
        let pg = Postgres::new("postgres://app@coordinator/orders?sslmode=require").unwrap();
        let node = pg.for_node("worker-1", 5433);
        assert_eq!(node.get_ssl_mode(), SslMode::Require);
        assert_eq!(node.tls(), pg.tls());
        assert_eq!(node.get_hosts(), &[Host::Tcp("worker-1".into())]);
    }

    #[test]
    fn hostaddr_alone_connects_in_clear_under_prefer_and_is_refused_stricter() {
        let pg = Postgres::new("hostaddr=127.0.0.1 user=app").unwrap();
        assert_eq!(pg.get_ssl_mode(), SslMode::Disable);
        let refused = Postgres::new("hostaddr=127.0.0.1 user=app sslmode=require").unwrap_err();
        assert!(refused.to_string().contains("host name"), "{refused}");
    }
}
