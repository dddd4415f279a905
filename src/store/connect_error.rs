//! Why a connection to PostgreSQL failed, said once, in words an operator can
//! act on: where the server tried to connect (hosts and ports or socket,
//! database, user; never the password), what went wrong, and what to check.
//!
//! Every path that connects uses it: start-up (the wait for the database and
//! `migrate`), the pool, the shared connections and the listener. A
//! [`ConnectError`] has no `source()`: its sentence already holds the cause,
//! so a cause chain in the logs never says it twice.
//!
//! A database URL that cannot work however long one waits (it does not
//! parse, names no host, hides a password's `@` in the host, or asks for TLS
//! this build does not speak) is a [`UrlError`], found before any
//! connection is tried.

use std::fmt;
use std::io;
use std::time::Duration;

use deadpool_postgres::{PoolError, TimeoutType};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Config, NoTls};

/// Where connections go, without the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectTarget {
    /// One per host tried, in order: `host:port`, `[v6]:port`, or the unix
    /// socket's path.
    places: Vec<String>,
    /// `None`: the server's default, a database named like the user.
    database: Option<String>,
    /// `None`: this process's operating-system user name.
    user: Option<String>,
}

impl ConnectTarget {
    /// The hosts, database and user of `config` (never its password).
    pub fn of(config: &Config) -> Self {
        let ports = config.get_ports();
        let port = |i: usize| {
            ports
                .get(i)
                .or_else(|| ports.first())
                .copied()
                .unwrap_or(5432)
        };
        let hostaddrs = config.get_hostaddrs();
        let count = config.get_hosts().len().max(hostaddrs.len());
        let places = (0..count)
            .map(|i| match (hostaddrs.get(i), config.get_hosts().get(i)) {
                (Some(ip), _) => tcp_place(&ip.to_string(), port(i)),
                (None, Some(Host::Tcp(host))) => tcp_place(host, port(i)),
                #[cfg(unix)]
                (None, Some(Host::Unix(dir))) => {
                    format!(
                        "{SOCKET}{}",
                        dir.join(format!(".s.PGSQL.{}", port(i))).display()
                    )
                }
                (None, None) => "no host".to_owned(),
            })
            .collect();
        ConnectTarget {
            places,
            database: config.get_dbname().map(str::to_owned),
            user: config.get_user().map(str::to_owned),
        }
    }

    /// `host:port` (or the socket's path) of each host, for log fields.
    pub fn places(&self) -> String {
        let places: Vec<&str> = self
            .places
            .iter()
            .map(|p| p.strip_prefix(SOCKET).unwrap_or(p))
            .collect();
        places.join(", ")
    }

    /// The database's name, as the URL gives it or as the server will pick it.
    pub fn database(&self) -> String {
        match (&self.database, &self.user) {
            (Some(database), _) => database.clone(),
            (None, Some(user)) => user.clone(),
            (None, None) => "(named like the user)".to_owned(),
        }
    }

    /// The user name, as the URL gives it.
    pub fn user(&self) -> String {
        self.user
            .clone()
            .unwrap_or_else(|| "(this process's OS user)".to_owned())
    }
}

/// How a unix socket is named in messages.
const SOCKET: &str = "the socket ";

fn tcp_place(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl fmt::Display for ConnectTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PostgreSQL at {} (database \"{}\", user \"{}\")",
            self.places.join(" or "),
            self.database(),
            self.user()
        )
    }
}

/// What went wrong, each with what to check.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cause {
    /// Nothing listens on that port (ECONNREFUSED).
    Refused,
    /// No socket file where a unix socket was looked for.
    NoSocket,
    /// The host name does not resolve.
    UnknownHost,
    /// The network has no route to the host.
    Unreachable,
    /// No answer in time: the given limit, or the operating system's.
    TimedOut(Option<Duration>),
    /// SQLSTATE 3D000.
    UnknownDatabase,
    /// SQLSTATE 28000, "role ... does not exist".
    UnknownRole,
    /// SQLSTATE 28P01.
    AuthenticationFailed,
    /// The server asks for a password and the URL gives none.
    PasswordRequired,
    /// SQLSTATE 28000 otherwise (pg_hba.conf has no line for this client);
    /// the server's words.
    NotAllowed(String),
    /// SQLSTATE 57P03 (starting up, shutting down, recovering), 57P01 or
    /// 57P02; the server's words.
    NotAcceptingYet(String),
    /// SQLSTATE 53300; the server's words.
    TooManyConnections(String),
    /// The connection closed (or was reset) before it was ready.
    Closed,
    /// Every pooled connection stayed busy for this long.
    PoolBusy(Duration),
    /// Anything else, as the error says it.
    Other(String),
}

impl Cause {
    /// The cause of a connection attempt's error.
    pub fn of(error: &tokio_postgres::Error) -> Cause {
        if let Some(db) = error.as_db_error() {
            return Cause::from_server(db.code(), db.message());
        }
        if error.is_closed() {
            return Cause::Closed;
        }
        let source = std::error::Error::source(error);
        if let Some(io) = source.and_then(|s| s.downcast_ref::<io::Error>()) {
            return Cause::from_io(io);
        }
        match source {
            Some(s) if s.to_string() == "password missing" => Cause::PasswordRequired,
            Some(s) => Cause::Other(format!("{error}: {s}")),
            None => Cause::Other(error.to_string()),
        }
    }

    /// What the server's refusal, SQLSTATE `code` with `message`, means.
    pub fn from_server(code: &SqlState, message: &str) -> Cause {
        match *code {
            SqlState::INVALID_CATALOG_NAME => Cause::UnknownDatabase,
            SqlState::INVALID_PASSWORD => Cause::AuthenticationFailed,
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION
                if message.starts_with("role ") && message.ends_with("does not exist") =>
            {
                Cause::UnknownRole
            }
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION => Cause::NotAllowed(message.to_owned()),
            SqlState::CANNOT_CONNECT_NOW | SqlState::ADMIN_SHUTDOWN | SqlState::CRASH_SHUTDOWN => {
                Cause::NotAcceptingYet(message.to_owned())
            }
            SqlState::TOO_MANY_CONNECTIONS => Cause::TooManyConnections(message.to_owned()),
            _ => Cause::Other(format!(
                "PostgreSQL refused the connection: {message} (SQLSTATE {})",
                code.code()
            )),
        }
    }

    fn from_io(error: &io::Error) -> Cause {
        match error.kind() {
            io::ErrorKind::ConnectionRefused => Cause::Refused,
            io::ErrorKind::NotFound => Cause::NoSocket,
            io::ErrorKind::TimedOut => Cause::TimedOut(None),
            io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => {
                Cause::Unreachable
            }
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::BrokenPipe => Cause::Closed,
            _ => {
                // Name resolution fails with no OS error code: std says
                // "failed to lookup address information: ...", and
                // tokio-postgres "could not resolve any addresses" when the
                // answer is empty.
                let said = error.to_string();
                if error.raw_os_error().is_none()
                    && (said.starts_with("failed to lookup address")
                        || said.starts_with("could not resolve"))
                {
                    Cause::UnknownHost
                } else {
                    Cause::Other(said)
                }
            }
        }
    }
}

/// A connection that could not be had: where, why, and what to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError {
    /// Where the connection was to go: hosts, database and user, without the
    /// password.
    pub target: ConnectTarget,
    /// What went wrong, which decides what the message tells the operator to
    /// check.
    pub cause: Cause,
}

impl std::error::Error for ConnectError {}

impl ConnectError {
    /// `error`, from connecting to `target`.
    pub fn new(target: &ConnectTarget, error: &tokio_postgres::Error) -> Self {
        ConnectError {
            target: target.clone(),
            cause: Cause::of(error),
        }
    }

    /// Connecting to `config` failed with `error`.
    pub fn connecting(config: &Config, error: &tokio_postgres::Error) -> Self {
        ConnectError::new(&ConnectTarget::of(config), error)
    }

    /// Connecting to `config` did not finish within `limit`.
    pub fn timed_out(config: &Config, limit: Duration) -> Self {
        ConnectError {
            target: ConnectTarget::of(config),
            cause: Cause::TimedOut(Some(limit)),
        }
    }

    /// Why the pool handed out no connection within `wait`.
    pub fn from_pool(target: &ConnectTarget, error: &PoolError, wait: Duration) -> Self {
        let cause = match error {
            PoolError::Backend(e) => Cause::of(e),
            PoolError::Timeout(TimeoutType::Wait) => Cause::PoolBusy(wait),
            PoolError::Timeout(TimeoutType::Create | TimeoutType::Recycle) => {
                Cause::TimedOut(Some(wait))
            }
            other => Cause::Other(other.to_string()),
        };
        ConnectError {
            target: target.clone(),
            cause,
        }
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = &self.target;
        if let Cause::PoolBusy(wait) = &self.cause {
            return write!(
                f,
                "no pooled connection to {target} came free within {wait:?}: all are in use. \
                 Raise --pool-size, or look for long statements in pg_stat_activity"
            );
        }
        write!(f, "cannot connect to {target}: ")?;
        match &self.cause {
            Cause::Refused => f.write_str(
                "the connection was refused, so nothing listens there. Check that PostgreSQL is \
                 running and listens on that address (listen_addresses, port), and that the \
                 database URL's host and port are right",
            ),
            Cause::NoSocket => f.write_str(
                "there is no socket file there. Check that PostgreSQL is running, and that the \
                 URL's socket directory and port match its unix_socket_directories and port",
            ),
            Cause::UnknownHost => f.write_str(
                "the host name does not resolve. Check the host in the database URL, and this \
                 machine's DNS (in Kubernetes or Compose, that a service of that name exists)",
            ),
            Cause::Unreachable => f.write_str(
                "the network has no route to that host. Check the host in the database URL, \
                 and this machine's network and routes",
            ),
            Cause::TimedOut(limit) => {
                match limit {
                    Some(limit) => write!(f, "no answer within {limit:?}. ")?,
                    None => f.write_str("the connection timed out. ")?,
                }
                f.write_str(
                    "Check that this machine can reach that host and port (firewalls, security \
                     groups, network policies), and that PostgreSQL there is not overloaded",
                )
            }
            Cause::UnknownDatabase => write!(
                f,
                "the database \"{}\" does not exist. Create it (CREATE DATABASE), or correct \
                 the database name in the URL",
                target.database()
            ),
            Cause::UnknownRole => write!(
                f,
                "the role \"{}\" does not exist. Create it (CREATE ROLE ... LOGIN), or correct \
                 the user name in the URL",
                target.user()
            ),
            Cause::AuthenticationFailed => write!(
                f,
                "password authentication failed for user \"{}\". Check the password in the URL \
                 (percent-encode @ : / % in it as %40 %3A %2F %25) against the role's password",
                target.user()
            ),
            Cause::PasswordRequired => f.write_str(
                "the server asks for a password and the URL gives none. Put it in the URL \
                 (postgres://user:password@host:port/database)",
            ),
            Cause::NotAllowed(said) => write!(
                f,
                "the server refuses this client ({said}). Check pg_hba.conf for a line that \
                 lets this address, user and database in"
            ),
            Cause::NotAcceptingYet(said) => write!(
                f,
                "the server accepts no connections yet ({said}): it is starting up, shutting \
                 down or recovering. This passes on its own"
            ),
            Cause::TooManyConnections(said) => write!(
                f,
                "the server has no connection slot left ({said}). Lower --pool-size, \
                 --shared-connections or the number of replicas, or raise max_connections \
                 (or the role's or database's CONNECTION LIMIT)"
            ),
            Cause::Closed => f.write_str(
                "the server closed the connection before it was ready. It may be shutting \
                 down, or what listens there may not be PostgreSQL",
            ),
            Cause::PoolBusy(_) => unreachable!("said above"),
            Cause::Other(said) => write!(f, "{said}"),
        }
    }
}

/// Opens one connection to `config` within `limit` and closes it: the
/// database answers, knows this user and has this database, or the error
/// says which not.
pub async fn probe(config: &Config, limit: Duration) -> Result<(), ConnectError> {
    match tokio::time::timeout(limit, config.connect(NoTls)).await {
        Ok(Ok((client, connection))) => {
            drop(client);
            // Ends at once: the client is gone, so the connection says
            // goodbye and closes.
            let _ = connection.await;
            Ok(())
        }
        Ok(Err(e)) => Err(ConnectError::connecting(config, &e)),
        Err(_) => Err(ConnectError::timed_out(config, limit)),
    }
}

/// A database URL that no amount of waiting makes work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error(
        "the database URL is malformed: {0}. Write it as \
         postgres://USER:PASSWORD@HOST:PORT/DATABASE (percent-encode @ : / % in the password \
         as %40 %3A %2F %25), or as key=value pairs (host=HOST port=PORT dbname=DATABASE \
         user=USER)"
    )]
    Malformed(String),
    #[error(
        "the database URL asks for TLS (sslmode=require), and this server connects to \
         PostgreSQL without TLS: use sslmode=prefer or sslmode=disable, over a network you trust"
    )]
    TlsRequired,
}

/// Parses `url` as [`super::pg_config`] does, and refuses what cannot work:
/// the refusal says which part is wrong, and never quotes the URL's text
/// when the URL holds a password.
pub fn check_url(url: &str) -> Result<Config, UrlError> {
    let config = super::pg_config(url).map_err(|e| {
        let said = std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
        UrlError::Malformed(describe_parse_error(&said, has_password(url)))
    })?;
    let hosts = config.get_hosts();
    let hostaddrs = config.get_hostaddrs();
    if hosts.is_empty() && hostaddrs.is_empty() {
        return Err(UrlError::Malformed(
            "it names no host (postgres://user@HOST:5432/database, or host=HOST)".to_owned(),
        ));
    }
    if !hosts.is_empty() && !hostaddrs.is_empty() && hosts.len() != hostaddrs.len() {
        return Err(UrlError::Malformed(format!(
            "it names {} hosts and {} hostaddrs; give as many of each",
            hosts.len(),
            hostaddrs.len()
        )));
    }
    let ports = config.get_ports().len();
    if ports > 1 && ports != hosts.len().max(hostaddrs.len()) {
        return Err(UrlError::Malformed(format!(
            "it names {ports} ports for {} hosts; give one port, or one per host",
            hosts.len().max(hostaddrs.len())
        )));
    }
    if hosts
        .iter()
        .any(|h| matches!(h, Host::Tcp(name) if name.contains('@')))
    {
        return Err(UrlError::Malformed(
            "its host holds an @, which is most likely part of the password: write an @ in \
             the password as %40"
                .to_owned(),
        ));
    }
    if config.get_ssl_mode() == SslMode::Require {
        return Err(UrlError::TlsRequired);
    }
    Ok(config)
}

/// Whether `url` carries a password: `user:password@` in a URL, or a
/// `password` key or parameter anywhere.
fn has_password(url: &str) -> bool {
    if url.contains("password") {
        return true;
    }
    ["postgres://", "postgresql://"].iter().any(|prefix| {
        url.strip_prefix(prefix)
            .and_then(|rest| rest.split_once('@'))
            .is_some_and(|(userinfo, _)| userinfo.contains(':'))
    })
}

/// tokio-postgres's word on a URL that does not parse, made plain. Its
/// texts that name only an option (a fixed word) are always safe to repeat;
/// the others quote the URL, so they are repeated only when it holds no
/// password.
fn describe_parse_error(said: &str, has_password: bool) -> String {
    if let Some(option) = said
        .strip_prefix("invalid value for option `")
        .and_then(|rest| rest.strip_suffix('`'))
    {
        return match option {
            "port" => "the port is not a number from 0 to 65535".to_owned(),
            "host" => {
                "the host is not valid (an IPv6 address goes in brackets: [::1]:5432)".to_owned()
            }
            other => format!("the value of `{other}` is not one it takes"),
        };
    }
    if said == "unexpected EOF" || said.starts_with("unterminated") {
        return format!("it ends too early ({said})");
    }
    if has_password {
        "a part of it does not parse (not quoted here, since the URL holds a password)".to_owned()
    } else {
        said.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> ConnectTarget {
        ConnectTarget::of(&url.parse().unwrap())
    }

    #[test]
    fn the_target_names_hosts_ports_database_and_user_but_never_the_password() {
        let t = target("postgres://app:s3cret@db.internal:6432,[::1]/orders");
        let said = t.to_string();
        assert_eq!(
            said,
            "PostgreSQL at db.internal:6432 or [::1]:5432 (database \"orders\", user \"app\")"
        );
        assert!(!said.contains("s3cret"));
        let socket = target("host=/var/run/postgresql port=5433 user=app password=s3cret");
        assert_eq!(
            socket.to_string(),
            "PostgreSQL at the socket /var/run/postgresql/.s.PGSQL.5433 (database \"app\", user \"app\")"
        );
    }

    #[test]
    fn server_refusals_read_by_their_sqlstate() {
        let cases = [
            (
                "3D000",
                "database \"x\" does not exist",
                Cause::UnknownDatabase,
            ),
            ("28000", "role \"x\" does not exist", Cause::UnknownRole),
            (
                "28P01",
                "password authentication failed for user \"x\"",
                Cause::AuthenticationFailed,
            ),
            (
                "28000",
                "no pg_hba.conf entry for host \"::1\"",
                Cause::NotAllowed("no pg_hba.conf entry for host \"::1\"".into()),
            ),
            (
                "57P03",
                "the database system is starting up",
                Cause::NotAcceptingYet("the database system is starting up".into()),
            ),
            (
                "53300",
                "sorry, too many clients already",
                Cause::TooManyConnections("sorry, too many clients already".into()),
            ),
        ];
        for (code, message, cause) in cases {
            assert_eq!(
                Cause::from_server(&SqlState::from_code(code), message),
                cause,
                "{code}"
            );
        }
    }

    #[test]
    fn each_cause_has_its_own_sentence_with_what_to_check() {
        let t = target("postgres://app:s3cret@db:5432/orders");
        let say = |cause| {
            ConnectError {
                target: t.clone(),
                cause,
            }
            .to_string()
        };
        let said = [
            (
                say(Cause::AuthenticationFailed),
                "password authentication failed for user \"app\"",
            ),
            (
                say(Cause::UnknownDatabase),
                "the database \"orders\" does not exist",
            ),
            (say(Cause::UnknownRole), "the role \"app\" does not exist"),
            (
                say(Cause::NotAcceptingYet(
                    "the database system is starting up".into(),
                )),
                "starting up",
            ),
            (
                say(Cause::TooManyConnections("sorry".into())),
                "max_connections",
            ),
            (
                say(Cause::TimedOut(Some(Duration::from_secs(5)))),
                "no answer within 5s",
            ),
            (say(Cause::UnknownHost), "does not resolve"),
        ];
        for (sentence, expected) in said {
            assert!(
                sentence.starts_with("cannot connect to PostgreSQL at db:5432"),
                "{sentence}"
            );
            assert!(sentence.contains(expected), "{sentence}");
            assert!(!sentence.contains("s3cret"), "{sentence}");
        }
    }

    #[test]
    fn a_url_that_cannot_work_is_refused_saying_which_part() {
        let refused = |url| check_url(url).unwrap_err().to_string();
        assert!(refused("postgres://app@db:54x2/orders").contains("the port is not a number"));
        assert!(
            refused("postgres://app:p@ss@db/orders").contains("write an @ in the password as %40")
        );
        assert!(!refused("postgres://app:p@ss@db/orders").contains("ss@db"));
        assert!(refused("dbname=orders").contains("names no host"));
        assert_eq!(
            check_url("postgres://app@db/orders?sslmode=require").unwrap_err(),
            UrlError::TlsRequired
        );
        // Quotes the URL's text only when it holds no password.
        assert!(refused("host=db bogus=1").contains("unknown option `bogus`"));
        let secret = refused("host=db password=two words");
        assert!(!secret.contains("words"), "{secret}");
        assert!(check_url("postgres://app:s3cret@db:5432/orders").is_ok());
    }
}
