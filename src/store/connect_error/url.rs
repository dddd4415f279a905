//! The database URLs refused before any connection is tried: those that
//! cannot work however long one waits.

use tokio_postgres::config::Host;

use crate::store::tls::TlsOptionsError;
use crate::store::{Postgres, PostgresError};

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
    #[error("the database URL's TLS settings cannot work: {0}")]
    Tls(TlsOptionsError),
}

/// Parses `url` as [`crate::store::pg_config`] does, and refuses what
/// cannot work: the refusal says which part is wrong, and never quotes the
/// URL's text when the URL holds a password.
pub fn check_url(url: &str) -> Result<Postgres, UrlError> {
    let config = Postgres::new(url).map_err(|e| match e {
        PostgresError::Parse(e) => {
            let said =
                std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
            UrlError::Malformed(describe_parse_error(&said, has_password(url)))
        }
        PostgresError::Tls(e) => UrlError::Tls(e),
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

    #[test]
    fn a_url_that_cannot_work_is_refused_saying_which_part() {
        let refused = |url| check_url(url).unwrap_err().to_string();
        assert!(refused("postgres://app@db:54x2/orders").contains("the port is not a number"));
        assert!(
            refused("postgres://app:p@ss@db/orders").contains("write an @ in the password as %40")
        );
        assert!(!refused("postgres://app:p@ss@db/orders").contains("ss@db"));
        assert!(refused("dbname=orders").contains("names no host"));
        assert!(check_url("postgres://app@db/orders?sslmode=require").is_ok());
        assert!(
            refused("postgres://app@db/orders?sslmode=verify-full&sslrootcert=/nonexistent")
                .contains("cannot read sslrootcert /nonexistent")
        );
        // Quotes the URL's text only when it holds no password.
        assert!(refused("host=db bogus=1").contains("unknown option `bogus`"));
        let secret = refused("host=db password=two words");
        assert!(!secret.contains("words"), "{secret}");
        assert!(check_url("postgres://app:s3cret@db:5432/orders").is_ok());
    }
}
