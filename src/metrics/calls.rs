//! Calls: every call's status and duration by method, Acquire's decisions
//! (by scope too, when asked), lease takeovers, and refused calls on a lease
//! or record.

use std::sync::OnceLock;
use std::sync::atomic::Ordering;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use tonic::Code;

use super::{HistogramFamily, Metrics, series};
use crate::domain::Decision;

/// The services and methods this server answers: the only values the
/// `service` and `method` labels take, besides `unknown`.
const SERVICES: &[(&str, &[&str])] = &[
    (
        "idempotency.v1.Coordinator",
        &[
            "Acquire",
            "Complete",
            "ExtendLease",
            "Get",
            "Watch",
            "WatchDue",
            "Sweep",
            "ReleaseLease",
            "RetryNow",
            "FailPermanently",
            "DeleteRecord",
            "ListRecords",
            "Summarize",
        ],
    ),
    ("grpc.health.v1.Health", &["Check", "Watch"]),
    (
        "grpc.reflection.v1.ServerReflection",
        &["ServerReflectionInfo"],
    ),
    (
        "grpc.reflection.v1alpha.ServerReflection",
        &["ServerReflectionInfo"],
    ),
];

/// The label value of anything not in a fixed table.
const UNKNOWN: &str = "unknown";

/// Call latency buckets, in seconds: sub-millisecond answers up to the
/// longest wait window (`--max-wait`, 1 min by default).
const LATENCY_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// The reasons a call on a lease or record is refused (`ErrorInfo.reason`).
const REFUSALS: [&str; 5] = [
    "RECORD_NOT_FOUND",
    "LEASE_LOST",
    "LEASE_EXPIRED",
    "ALREADY_COMPLETED",
    "WRONG_STATUS",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    service: &'static str,
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    service: &'static str,
    method: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScopeDecisionLabels {
    decision: &'static str,
    scope: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// How many gRPC status codes there are (0 to 16).
const CODES: usize = 17;

/// One method's series of `rpcs` (one per status code) and of
/// `rpc_duration`, each taken from its family the first time it is needed
/// and kept: a family finds a member by hashing its labels under a lock,
/// which every call would otherwise pay twice.
#[derive(Default)]
struct MethodSeries {
    calls: [OnceLock<Counter>; CODES],
    duration: OnceLock<Histogram>,
}

/// The calls' metrics.
pub(super) struct Calls {
    rpcs: Family<RpcLabels, Counter>,
    rpc_duration: HistogramFamily<MethodLabels>,
    /// Indexed by [`Method::slot`].
    series: Box<[MethodSeries]>,
    decisions: Family<DecisionLabels, Counter>,
    /// `decisions`' series, indexed by [`Decision`] in its order (see
    /// [`MethodSeries`]).
    decision_series: [Counter; Decision::ALL.len()],
    decisions_by_scope: Family<ScopeDecisionLabels, Counter>,
    takeovers: Counter,
    refusals: Family<ReasonLabels, Counter>,
}

impl Calls {
    /// The calls' metrics, registered in `r`, their bounded series at zero.
    pub(super) fn new(r: &mut Registry) -> Self {
        let decisions: Family<DecisionLabels, Counter> = Family::default();
        let m = Calls {
            rpcs: Family::default(),
            rpc_duration: Family::new_with_constructor(latency_histogram),
            series: (0..slot_count()).map(|_| MethodSeries::default()).collect(),
            decision_series: Decision::ALL.map(|decision| {
                let labels = DecisionLabels {
                    decision: decision.name(),
                };
                series(&decisions, &labels)
            }),
            decisions,
            decisions_by_scope: Family::default(),
            takeovers: Counter::default(),
            refusals: Family::default(),
        };
        r.register(
            "rpcs",
            "Calls answered, by service, method and gRPC status code (calls refused at admission included; a call whose client went away is CANCELLED)",
            m.rpcs.clone(),
        );
        r.register_with_unit(
            "rpc_duration",
            "Time from a call's admission to its final status (for streams: the stream's life), by service and method",
            Unit::Seconds,
            m.rpc_duration.clone(),
        );
        r.register(
            "acquire_decisions",
            "Acquire answers, by decision",
            m.decisions.clone(),
        );
        r.register(
            "acquire_decisions_by_scope",
            "Acquire answers, by decision and scope (only with --metrics-scope-labels)",
            m.decisions_by_scope.clone(),
        );
        r.register(
            "lease_takeovers",
            "Acquires that took over a key whose previous lease ran out before it completed (PROCEED, attempt above 1, no failure reported since)",
            m.takeovers.clone(),
        );
        r.register(
            "refusals",
            "Calls on a lease or record refused, by reason (LEASE_LOST, LEASE_EXPIRED, ALREADY_COMPLETED, RECORD_NOT_FOUND)",
            m.refusals.clone(),
        );
        for reason in REFUSALS {
            let _ = m.refusals.get_or_create(&ReasonLabels { reason });
        }
        m
    }
}

impl Metrics {
    /// Counts Acquire decisions by scope as well (`--metrics-scope-labels`).
    /// Scopes are chosen by callers: every scope seen becomes a series.
    pub fn set_scope_labels(&self, on: bool) {
        self.0.scope_labels.store(on, Ordering::Relaxed);
    }
}

/// The canonical name of a gRPC status code.
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// A method of the fixed table, or `unknown`.
#[derive(Debug)]
struct Method {
    labels: MethodLabels,
    /// Where its series are kept: each service's methods in the table's
    /// order, then that service's `unknown` method; after every service's,
    /// the `unknown` service's.
    slot: usize,
}

/// How many slots [`Method::slot`] takes.
fn slot_count() -> usize {
    SERVICES
        .iter()
        .map(|(_, methods)| methods.len() + 1)
        .sum::<usize>()
        + 1
}

/// The service and method a call's path names, from the fixed table.
fn method_of(path: &str) -> Method {
    let unknown = Method {
        labels: MethodLabels {
            service: UNKNOWN,
            method: UNKNOWN,
        },
        slot: slot_count() - 1,
    };
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return unknown;
    };
    let mut first = 0;
    for (name, methods) in SERVICES {
        if *name == service {
            let at = methods
                .iter()
                .position(|m| *m == method)
                .unwrap_or(methods.len());
            return Method {
                labels: MethodLabels {
                    service: name,
                    method: methods.get(at).copied().unwrap_or(UNKNOWN),
                },
                slot: first + at,
            };
        }
        first += methods.len() + 1;
    }
    unknown
}

/// One call, from its admission until its final status is known. Dropped
/// without [`Rpc::finish`] (the client went away, or the answer was dropped
/// before its status was sent), it counts as CANCELLED.
#[derive(Debug)]
pub struct Rpc {
    metrics: Metrics,
    method: Method,
    started: Instant,
    finished: bool,
}

impl Rpc {
    /// A call to `path` (`/package.Service/Method`) starts now, counted
    /// in `metrics`.
    pub fn start(metrics: &Metrics, path: &str) -> Self {
        Rpc {
            metrics: metrics.clone(),
            method: method_of(path),
            started: Instant::now(),
            finished: false,
        }
    }

    /// The call's final status is `code`.
    pub fn finish(mut self, code: Code) {
        self.record(code);
    }

    fn record(&mut self, code: Code) {
        self.finished = true;
        let m = &self.metrics.0.calls;
        let method = &m.series[self.method.slot];
        let labels = &self.method.labels;
        method.calls[code as usize]
            .get_or_init(|| {
                let labels = RpcLabels {
                    service: labels.service,
                    method: labels.method,
                    code: code_name(code),
                };
                series(&m.rpcs, &labels)
            })
            .inc();
        method
            .duration
            .get_or_init(|| series(&m.rpc_duration, labels))
            .observe(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for Rpc {
    fn drop(&mut self) {
        if !self.finished {
            self.record(Code::Cancelled);
        }
    }
}

impl Metrics {
    /// An Acquire answered `decision` for `scope`; `takeover` when it took
    /// over a lease that ran out.
    pub fn acquired(&self, decision: Decision, scope: &str, takeover: bool) {
        let m = &self.0.calls;
        m.decision_series[decision as usize].inc();
        if self.0.scope_labels.load(Ordering::Relaxed) {
            m.decisions_by_scope
                .get_or_create(&ScopeDecisionLabels {
                    decision: decision.name(),
                    scope: scope.to_owned(),
                })
                .inc();
        }
        if takeover {
            m.takeovers.inc();
        }
    }
}

impl Metrics {
    /// A call on a lease or record was refused for `reason` (the status's
    /// ErrorInfo reason, e.g. `LEASE_LOST`).
    pub fn refused(&self, reason: &'static str) {
        self.0
            .calls
            .refusals
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_known_methods_or_unknown() {
        let m = method_of("/idempotency.v1.Coordinator/Acquire").labels;
        assert_eq!(
            (m.service, m.method),
            ("idempotency.v1.Coordinator", "Acquire")
        );
        let m = method_of("/grpc.health.v1.Health/Check").labels;
        assert_eq!((m.service, m.method), ("grpc.health.v1.Health", "Check"));
        let m = method_of("/idempotency.v1.Coordinator/DropTables").labels;
        assert_eq!(
            (m.service, m.method),
            ("idempotency.v1.Coordinator", UNKNOWN)
        );
        for path in [
            "/",
            "",
            "/x",
            "/a.b.C/Acquire",
            "idempotency.v1.Coordinator/Acquire",
        ] {
            let m = method_of(path).labels;
            assert_eq!((m.service, m.method), (UNKNOWN, UNKNOWN), "{path:?}");
        }
    }

    #[test]
    fn every_label_pair_has_a_series_slot_of_its_own() {
        let mut slots = Vec::new();
        for (service, methods) in SERVICES {
            for method in methods.iter().chain(["NotAMethod"].iter()) {
                let m = method_of(&format!("/{service}/{method}"));
                let expected = if *method == "NotAMethod" {
                    UNKNOWN
                } else {
                    method
                };
                assert_eq!((m.labels.service, m.labels.method), (*service, expected));
                slots.push(m.slot);
            }
        }
        slots.push(method_of("/a.b.C/Acquire").slot);
        assert_eq!(method_of("/x").slot, method_of("/a.b.C/Acquire").slot);
        slots.sort_unstable();
        assert_eq!(slots, (0..slot_count()).collect::<Vec<_>>());
    }

    #[test]
    fn every_call_counts_in_the_exported_series_of_its_code() {
        let path = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
        let metrics = Metrics::new();
        let exported = |code: &'static str| {
            let labels = RpcLabels {
                service: "grpc.reflection.v1alpha.ServerReflection",
                method: "ServerReflectionInfo",
                code,
            };
            metrics.0.calls.rpcs.get_or_create(&labels).get()
        };
        let before = (exported("OK"), exported("DATA_LOSS"));
        for _ in 0..3 {
            Rpc::start(&metrics, path).finish(Code::DataLoss);
        }
        Rpc::start(&metrics, path).finish(Code::Ok);
        assert_eq!(
            (exported("OK"), exported("DATA_LOSS")),
            (before.0 + 1, before.1 + 3)
        );
    }

    #[test]
    fn each_decision_counts_in_its_own_series() {
        let metrics = Metrics::new();
        for (at, decision) in Decision::ALL.into_iter().enumerate() {
            assert_eq!(decision as usize, at, "{decision:?}");
            let exported = || {
                metrics
                    .0
                    .calls
                    .decisions
                    .get_or_create(&DecisionLabels {
                        decision: decision.name(),
                    })
                    .get()
            };
            let before = exported();
            metrics.acquired(decision, "s", false);
            assert!(exported() > before, "{decision:?}");
        }
    }

    #[test]
    fn every_code_has_its_canonical_name() {
        for (number, name) in [
            (0, "OK"),
            (3, "INVALID_ARGUMENT"),
            (8, "RESOURCE_EXHAUSTED"),
            (14, "UNAVAILABLE"),
            (16, "UNAUTHENTICATED"),
        ] {
            assert_eq!(code_name(Code::from(number)), name);
        }
    }
}
