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
//! parse, names no host, hides a password's `@` in the host, or has TLS
//! settings that cannot work, `store::tls`) is a [`UrlError`], found before any
//! connection is tried.
//!
//! By job: [`ConnectTarget`] says where a connection was to go,
//! [`Cause`] reads what went wrong from the error, [`ConnectError`] puts
//! both in the sentence with what to check, [`check_url`] refuses a URL up
//! front, and [`probe`] tries one connection.

mod cause;
mod message;
mod probe;
mod target;
mod url;

pub use cause::Cause;
pub use message::ConnectError;
pub use probe::probe;
pub use target::ConnectTarget;
pub use url::{UrlError, check_url};
