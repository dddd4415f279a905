//! Test fixtures, one module per kind, all re-exported: tests need only `use crate::helpers::*;`.

mod auth;
mod conditions;
mod database;
mod every_call;
mod gate;
mod health;
mod pki;
mod polling;
mod process;
mod requests;
mod server;
mod skip;
mod totals;
mod webhook;

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
