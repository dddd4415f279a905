//! The sidecar's suites' harness: a counting upstream, and (feature
//! `sidecar`) a coordinator, upstream and sidecar started together.

#[cfg(feature = "sidecar")]
pub mod support;
pub mod upstream;
