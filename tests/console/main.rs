//! The operator console in a real browser: headless Chromium driven over
//! WebDriver (`webdriver`) against a real server with its HTTP door and
//! console on, and records made over gRPC. Screenshots of each page go to
//! `docs/console/` (linked from `docs/console.md`).

mod browser;
// The request builders and readers of the API tests; this binary uses
// only some of them.
#[allow(dead_code, unused_imports)]
#[path = "../api/helpers/mod.rs"]
mod helpers;
mod webdriver;
