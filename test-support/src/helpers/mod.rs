//! Test fixtures, one module per kind, all re-exported: tests need only
//! `use test_support::helpers::*;`.

pub mod auth;
pub mod conditions;
pub mod database;
pub mod every_call;
pub mod gate;
pub mod health;
pub mod pki;
pub mod polling;
pub mod process;
pub mod requests;
pub mod server;
pub mod skip;
pub mod totals;
pub mod webhook;

pub use auth::*;
pub use conditions::*;
pub use database::*;
pub use every_call::*;
pub use gate::*;
pub use health::*;
pub use pki::*;
pub use polling::*;
pub use process::*;
pub use requests::*;
pub use server::*;
pub use skip::*;
pub use totals::*;
pub use webhook::*;
