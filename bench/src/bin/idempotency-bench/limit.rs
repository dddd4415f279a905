//! `limit`: the figure `cycle` is held against. The cheapest Acquire and
//! Complete PostgreSQL can do (`bench/limit/limit.sql`: one row by primary
//! key each, one transaction per call), driven by pgbench
//! (`bench/limit/cycle.pgbench`), the cheapest client there is, at the same
//! clients and seconds as the coordinator's scenarios, in its own database
//! (`--limit-database-url`, created and loaded on first use).

use tokio_postgres::NoTls;

use crate::Args;
use crate::cost::Meter;

const LIMIT_SQL: &str = include_str!("../../../limit/limit.sql");
const CYCLE_PGBENCH: &str = include_str!("../../../limit/cycle.pgbench");

/// Creates the limit's database if it is missing and loads `limit.sql` into
/// it (a fresh `limit_keys` table).
pub(crate) async fn prepare(url: &str) -> Result<(), String> {
    let config: tokio_postgres::Config = url.parse().map_err(|e| format!("{url}: {e}"))?;
    // pgbench gets the same URL, so the database must be named in it.
    let name = config
        .get_dbname()
        .ok_or_else(|| format!("{url} names no database"))?
        .to_owned();
    let mut admin = config.clone();
    admin.dbname("postgres");
    let (client, connection) = admin
        .connect(NoTls)
        .await
        .map_err(|e| format!("cannot connect to create the limit's database: {e}"))?;
    tokio::spawn(connection);
    let exists = client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await
        .map_err(|e| e.to_string())?
        .is_some();
    if !exists {
        let quoted = name.replace('"', "\"\"");
        client
            .batch_execute(&format!("CREATE DATABASE \"{quoted}\""))
            .await
            .map_err(|e| format!("cannot create database {name}: {e}"))?;
    }
    let (client, connection) = config
        .connect(NoTls)
        .await
        .map_err(|e| format!("cannot connect to {name}: {e}"))?;
    tokio::spawn(connection);
    client
        .batch_execute(&format!("SET client_min_messages = warning; {LIMIT_SQL}"))
        .await
        .map_err(|e| format!("cannot load limit.sql into {name}: {e}"))
}

/// Runs pgbench for `--seconds` with `--clients`, prints its figure and what
/// it cost, and returns its cycles per second.
pub(crate) async fn limit(args: &Args, meter: &Meter) -> Result<f64, String> {
    let before = meter.read().await;
    let (per_s, cycles) = pgbench(args, &args.limit_database_url).await?;
    let cost = meter.report("limit", &before, cycles).await;
    println!("limit (pgbench, direct SQL): {per_s:.0} cycles/s");
    println!(
        "RESULT scenario=limit clients={} seconds={} ops_per_s={per_s:.0}{}",
        args.clients,
        args.seconds,
        cost.fields()
    );
    Ok(per_s)
}

/// Runs pgbench; returns its cycles per second (pgbench's tps: a
/// transaction is one Acquire and one Complete) and how many it ran.
async fn pgbench(args: &Args, url: &str) -> Result<(f64, u64), String> {
    let script =
        std::env::temp_dir().join(format!("idempotency-limit-{}.pgbench", std::process::id()));
    std::fs::write(&script, CYCLE_PGBENCH).map_err(|e| e.to_string())?;
    let output = tokio::process::Command::new(&args.pgbench)
        .args(["-n", "-M", "prepared", "-j", "2"])
        .arg("-c")
        .arg(args.clients.to_string())
        .arg("-T")
        .arg(args.seconds.to_string())
        .arg("-f")
        .arg(&script)
        .arg(url)
        .kill_on_drop(true)
        .output()
        .await;
    let _ = std::fs::remove_file(&script);
    let output = output.map_err(|e| format!("cannot run {}: {e}", args.pgbench.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "pgbench failed ({}): {}{}",
            output.status,
            stdout,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    match (
        figure(&stdout, "tps = "),
        figure(&stdout, "number of transactions actually processed: "),
    ) {
        (Some(tps), Some(count)) => Ok((tps, count as u64)),
        _ => Err(format!("no tps in pgbench's output: {stdout}")),
    }
}

/// The number after `label` at the start of a line of pgbench's report.
fn figure(report: &str, label: &str) -> Option<f64> {
    report
        .lines()
        .find_map(|line| line.strip_prefix(label))?
        .split(|c: char| c.is_whitespace() || c == '/')
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::figure;

    #[test]
    fn reads_the_figures_of_a_pgbench_report() {
        let report = "number of transactions actually processed: 44678\n\
                      number of failed transactions: 0 (0.000%)\n\
                      latency average = 7.164 ms\n\
                      initial connection time = 21.448 ms\n\
                      tps = 4466.786337 (without initial connection time)\n";
        assert_eq!(figure(report, "tps = "), Some(4466.786337));
        assert_eq!(
            figure(report, "number of transactions actually processed: "),
            Some(44678.0)
        );
        assert_eq!(figure("pgbench: error: connection failed", "tps = "), None);
    }
}
