//! Waiters: calls waiting on this server, the records they watch, the ones
//! the waiter limits refused, and the open streams.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Metrics;
use super::snapshot::{Snapshot, count};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedWaiterLabels {
    kind: &'static str,
    limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StreamLabels {
    method: &'static str,
}

/// The waiters' metrics.
pub(super) struct Waiters {
    waiters: Gauge,
    waiters_parked: Gauge,
    watched_records: Gauge,
    waiters_refused: Family<RefusedWaiterLabels, Counter>,
    streams_open: Family<StreamLabels, Gauge>,
}

impl Waiters {
    /// The waiters' metrics, registered in `r`, their bounded series at zero.
    pub(super) fn new(r: &mut Registry) -> Self {
        let m = Waiters {
            waiters: Gauge::default(),
            waiters_parked: Gauge::default(),
            watched_records: Gauge::default(),
            waiters_refused: Family::default(),
            streams_open: Family::default(),
        };
        r.register(
            "waiters",
            "Calls waiting on this server (Acquire with wait, Watch, WatchDue)",
            m.waiters.clone(),
        );
        r.register(
            "waiters_parked",
            "Waiters asleep until their record changes",
            m.waiters_parked.clone(),
        );
        r.register(
            "watched_records",
            "Records at least one call on this server waits on",
            m.watched_records.clone(),
        );
        r.register(
            "waiters_refused",
            "Calls refused RESOURCE_EXHAUSTED by the waiter limits, by kind (record: Acquire with wait and Watch; due: WatchDue) and limit (server, tenant)",
            m.waiters_refused.clone(),
        );
        r.register(
            "streams_open",
            "Watch and WatchDue streams open, by method",
            m.streams_open.clone(),
        );
        for kind in [Waiter::Record, Waiter::Due] {
            for tenant in [false, true] {
                let _ = m
                    .waiters_refused
                    .get_or_create(&refused_labels(kind, tenant));
            }
        }
        for stream in [Stream::Watch, Stream::WatchDue] {
            let _ = m.streams_open.get_or_create(&StreamLabels {
                method: stream.method(),
            });
        }
        m
    }

    /// The waiters and watched records as `snapshot` has them.
    pub(super) fn apply(&self, snapshot: &Snapshot) {
        self.waiters.set(count(snapshot.waiters));
        self.waiters_parked.set(count(snapshot.waiters_parked));
        self.watched_records.set(count(snapshot.watched_records));
    }
}

/// What a refused waiter waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiter {
    /// A record's change: Acquire with a wait window, or Watch.
    Record,
    /// A scope's due records: WatchDue.
    Due,
}

fn refused_labels(kind: Waiter, tenant: bool) -> RefusedWaiterLabels {
    let kind = match kind {
        Waiter::Record => "record",
        Waiter::Due => "due",
    };
    let limit = if tenant { "tenant" } else { "server" };
    RefusedWaiterLabels { kind, limit }
}

impl Metrics {
    /// A waiter was refused: by the server's limit, or (`tenant`) by its
    /// tenant's.
    pub fn waiter_refused(&self, kind: Waiter, tenant: bool) {
        self.0
            .waiters
            .waiters_refused
            .get_or_create(&refused_labels(kind, tenant))
            .inc();
    }
}

/// A server-streaming method whose open streams are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Watch,
    WatchDue,
}

impl Stream {
    fn method(self) -> &'static str {
        match self {
            Stream::Watch => "Watch",
            Stream::WatchDue => "WatchDue",
        }
    }
}

/// An open stream; closed when dropped.
#[derive(Debug)]
pub struct OpenStream(Gauge);

impl Metrics {
    /// A `stream` opens; it counts as open until the guard is dropped.
    pub fn stream_opened(&self, stream: Stream) -> OpenStream {
        let gauge = self
            .0
            .waiters
            .streams_open
            .get_or_create_owned(&StreamLabels {
                method: stream.method(),
            });
        gauge.inc();
        OpenStream(gauge)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_stream_counts_until_dropped() {
        let metrics = Metrics::new();
        let gauge = || {
            metrics
                .0
                .waiters
                .streams_open
                .get_or_create_owned(&StreamLabels { method: "WatchDue" })
                .get()
        };
        let before = gauge();
        let stream = metrics.stream_opened(Stream::WatchDue);
        assert_eq!(gauge(), before + 1);
        drop(stream);
        assert_eq!(gauge(), before);
    }
}
