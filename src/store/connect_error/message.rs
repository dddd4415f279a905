//! A failed connection in one sentence: where it went, what went wrong,
//! and what to check.

use std::fmt;
use std::time::Duration;

use deadpool_postgres::{PoolError, TimeoutType};
use tokio_postgres::Config;

use super::{Cause, ConnectTarget};

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
            Cause::NotAllowed(said) if said.ends_with("no encryption") => write!(
                f,
                "the server refuses this client without TLS ({said}). Connect with TLS: \
                 sslmode=verify-full and sslrootcert=/path/to/ca.pem in the database URL \
                 (or sslmode=require, which does not check the server's certificate)"
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
            Cause::TlsRefused => f.write_str(
                "the server does not accept TLS, which the URL's sslmode requires. Turn ssl on \
                 in PostgreSQL (ssl, ssl_cert_file, ssl_key_file), or check that the URL names \
                 the right server",
            ),
            Cause::Tls(said) => write!(
                f,
                "the TLS handshake failed ({said}). Check that sslrootcert names the CA that \
                 signed the server's certificate, that the certificate is valid now, and with \
                 sslmode=verify-full that it names the host in the URL"
            ),
            Cause::PoolBusy(_) => unreachable!("said above"),
            Cause::Other(said) => write!(f, "{said}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_has_its_own_sentence_with_what_to_check() {
        let t = ConnectTarget::of(&"postgres://app:s3cret@db:5432/orders".parse().unwrap());
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
            (
                say(Cause::Tls("invalid peer certificate: UnknownIssuer".into())),
                "sslrootcert names the CA",
            ),
            (say(Cause::TlsRefused), "does not accept TLS"),
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
}
