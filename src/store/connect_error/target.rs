//! Where a connection was to go, said without the password: hosts and
//! ports or socket, database, user.

use std::fmt;

use tokio_postgres::Config;
use tokio_postgres::config::Host;

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
}
