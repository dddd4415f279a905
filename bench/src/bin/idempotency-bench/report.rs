//! What a run measures and how it is printed: latency histograms, the stats
//! of the timed scenarios, their human and `RESULT` lines, and the server's
//! resident memory.

use std::time::Duration;

use hdrhistogram::Histogram;

use crate::Args;

pub(crate) fn histogram() -> Histogram<u64> {
    // Microseconds from 1 µs to 60 s, three significant figures.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

pub(crate) fn ms(h: &Histogram<u64>, quantile: f64) -> f64 {
    h.value_at_quantile(quantile) as f64 / 1000.0
}

/// Resident memory of process `pid` in MiB, from /proc (Linux).
pub(crate) fn resident_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

pub(crate) struct CycleStats {
    /// Acquire-then-Complete cycles finished, by every client together.
    pub(crate) cycles: u64,
    /// How long the clients ran.
    pub(crate) elapsed: Duration,
    /// Latency of each whole cycle, in microseconds.
    pub(crate) cycle: Histogram<u64>,
    /// Latency of each cycle's Acquire, in microseconds.
    pub(crate) acquire: Histogram<u64>,
    /// Latency of each cycle's Complete, in microseconds.
    pub(crate) complete: Histogram<u64>,
}

impl CycleStats {
    /// No cycles yet: the clients' histograms are added in as they finish.
    pub(crate) fn empty() -> Self {
        CycleStats {
            cycles: 0,
            elapsed: Duration::ZERO,
            cycle: histogram(),
            acquire: histogram(),
            complete: histogram(),
        }
    }
}

/// Calls per second and their latency, for scenarios of single calls.
pub(crate) struct CallStats {
    /// Timed calls made, by every client together.
    pub(crate) calls: u64,
    /// How long the clients ran.
    pub(crate) elapsed: Duration,
    /// Latency of each timed call, in microseconds.
    pub(crate) latency: Histogram<u64>,
}

impl CallStats {
    pub(crate) fn per_s(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64()
    }
}

/// Prints a timed scenario's human line and its `RESULT` line.
pub(crate) fn report(name: &str, args: &Args, per_s: f64, latency: &Histogram<u64>, extra: &str) {
    report_line(name, args.clients, args.seconds, per_s, latency, extra);
}

/// Like [`report`], for a scenario whose concurrency is not `--clients`.
pub(crate) fn report_line(
    name: &str,
    clients: usize,
    seconds: u64,
    per_s: f64,
    latency: &Histogram<u64>,
    extra: &str,
) {
    let [p50, p90, p99, p999] = [0.5, 0.9, 0.99, 0.999].map(|q| ms(latency, q));
    println!(
        "{name}: {per_s:.0}/s; p50 {p50:.2} ms p90 {p90:.2} ms p99 {p99:.2} ms p99.9 {p999:.2} ms"
    );
    println!(
        "RESULT scenario={name} clients={clients} seconds={seconds} ops_per_s={per_s:.0} p50_ms={p50:.2} p90_ms={p90:.2} p99_ms={p99:.2} p999_ms={p999:.2}{extra}",
    );
}

pub(crate) fn report_cycles(name: &str, args: &Args, stats: &CycleStats, extra: &str) -> f64 {
    let per_s = stats.cycles as f64 / stats.elapsed.as_secs_f64();
    let extra = format!(" acquire_p99_ms={:.2}{extra}", ms(&stats.acquire, 0.99));
    report(name, args, per_s, &stats.cycle, &extra);
    per_s
}
