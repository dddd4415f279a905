//! What went wrong when connecting, read from tokio-postgres's error: the
//! server's refusal by its SQLSTATE, the operating system's error, or the
//! error's own words.

use std::io;
use std::time::Duration;

use tokio_postgres::error::SqlState;

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
    /// The server does not take TLS, which the URL's sslmode requires.
    TlsRefused,
    /// The TLS handshake failed: the server's certificate did not pass the
    /// checks sslmode asked for (rustls's words), or the session broke.
    Tls(String),
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
        if error.to_string() == "error performing TLS handshake" {
            return match source.map(ToString::to_string) {
                Some(said) if said == "server does not support TLS" => Cause::TlsRefused,
                Some(said) => Cause::Tls(said),
                None => Cause::Tls(error.to_string()),
            };
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
