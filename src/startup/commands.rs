//! What the commands do, past their arguments: `serve` and `migrate` on the
//! database given, or on a private PostgreSQL started for them and stopped
//! after them; `health`, asking a running server.

use std::future::Future;
use std::time::Duration;

use super::{Application, Listeners, StartupError, wait_for_database};
use crate::config::{DatabaseArgs, HealthArgs, ServeArgs, ServeConfig};
use crate::embedded::{self, Embedded};
use crate::shutdown;
use crate::store::{Clock, Store, StoreConfig, connect_error};

/// `serve`: binds the ports, then serves at once, waiting for the database
/// meanwhile, until SIGTERM or SIGINT.
pub async fn serve(mut args: Box<ServeArgs>) -> Result<(), StartupError> {
    // The ports first: one in use is said before a private PostgreSQL is
    // started for nothing.
    let listeners = Listeners::bind(args.listen, args.http_listen, args.metrics_listen).await?;
    let db = args.database.clone();
    on_database(&db, |url| async move {
        args.database.database_url = Some(url);
        // Serves at once; the database is waited for while serving.
        let app = Application::bind_on(ServeConfig::from(*args), listeners).await?;
        app.run_until(shutdown::signal()).await
    })
    .await
}

/// `migrate`: applies the pending migrations, in one attempt: whatever
/// runs `migrate` (a Job, Compose) retries it.
pub async fn migrate(db: DatabaseArgs) -> Result<(), StartupError> {
    on_database(&db, |url| async move {
        let pg = connect_error::check_url(&url)?;
        let config = StoreConfig::for_migrations(url);
        let store = Store::new(&config, Clock::default()).map_err(StartupError::Database)?;
        wait_for_database(&store, &pg, true, Some(Duration::ZERO)).await
    })
    .await
}

/// `health`: asks a running server's health service.
pub async fn health(args: HealthArgs) -> Result<(), StartupError> {
    crate::health::check(&args)
        .await
        .map_err(|e| StartupError::Unhealthy(e.to_string()))
}

/// Runs `work` on the database URL given, or on a private PostgreSQL
/// started for it and stopped after it, whatever `work` returned.
async fn on_database<F, Fut>(db: &DatabaseArgs, work: F) -> Result<(), StartupError>
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Result<(), StartupError>>,
{
    if let Some(url) = &db.database_url {
        return work(url.clone()).await;
    }
    let data_dir = db
        .data_dir
        .clone()
        .unwrap_or_else(embedded::default_data_dir);
    let embedded = Embedded::start(&data_dir).await?;
    let done = work(embedded.database_url()).await;
    embedded.stop().await;
    done
}
