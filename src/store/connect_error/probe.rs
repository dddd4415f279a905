//! One connection opened and closed to learn whether the database can be
//! reached as the URL says.

use std::time::Duration;

use crate::store::Postgres;

use super::ConnectError;

/// Opens one connection to `config` within `limit` and closes it: the
/// database answers, knows this user and has this database, or the error
/// says which not.
pub async fn probe(config: &Postgres, limit: Duration) -> Result<(), ConnectError> {
    match tokio::time::timeout(limit, config.connect()).await {
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
