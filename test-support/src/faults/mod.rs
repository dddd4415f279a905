//! What the fault suites share: the server binary, the database proxy and
//! (feature `bench`) the recording clients.

pub mod binary;
#[cfg(feature = "bench")]
pub mod client;
pub mod proxy;
