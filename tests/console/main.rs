//! The operator console in a real browser: headless Chromium driven over
//! WebDriver (`webdriver`) against a real server with its HTTP door and
//! console on, and records made over gRPC. Screenshots of each page go to
//! `docs/console/` (linked from `docs/console.md`).

mod browser;
use test_support::helpers;
mod webdriver;
