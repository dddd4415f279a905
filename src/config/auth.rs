//! Authentication: the credentials file.

use std::path::PathBuf;

use clap::Args;

/// Who may call: the credentials file.
#[derive(Debug, Clone, Args)]
pub struct AuthArgs {
    /// Require bearer tokens: a file of `<token or sha256:HEX> <tenant>
    /// [admin]` lines (`#` comments), read again on SIGHUP. Without it every
    /// caller is one default tenant. Replace it by renaming a new file over
    /// it: a file that does not end with a newline is refused as cut short.
    #[arg(long, env = "IDEMPOTENCY_AUTH_TOKENS")]
    pub auth_tokens: Option<PathBuf>,

    /// Accept a credentials file with no credential in it (every Coordinator
    /// call is then refused); without it such a file is refused as a mistake.
    #[arg(
        long,
        env = "IDEMPOTENCY_ALLOW_EMPTY_CREDENTIALS",
        requires = "auth_tokens"
    )]
    pub allow_empty_credentials: bool,
}
