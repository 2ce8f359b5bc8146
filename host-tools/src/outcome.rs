//! What a vgpuctl command ends with: its error and the exit code scripts can rely on (the table
//! is in `cli.rs`'s documentation, `vgpuctl --help` and docs/admin.md), and its JSON output.
//! Every command module (`cli.rs`, `attach.rs`, `doctor.rs`, `top.rs`, `libvirt.rs`) uses these;
//! this module uses none of them.

use serde_json::Value;

use crate::api::ApiError;

/// Exit code: the daemon refused the request (unknown VM, invalid change).
pub const EXIT_REFUSED: u8 = 1;
/// Exit code: the command line is wrong (clap).
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the daemon could not be reached.
pub const EXIT_UNREACHABLE: u8 = 3;
/// Exit code: `doctor` found a failing check.
pub const EXIT_CHECK_FAILED: u8 = 4;
/// Exit code: `vm drain --wait` timed out.
pub const EXIT_TIMEOUT: u8 = 5;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The admin API refused or could not be reached.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// A passthrough operation failed.
    #[error(transparent)]
    Passthrough(#[from] crate::passthrough::PassthroughError),
    /// A local operation failed (writing man pages, attach arguments, …).
    #[error("{0}")]
    Failed(String),
    /// `doctor` found failing checks.
    #[error("{0} check(s) failed; see the fixes above")]
    ChecksFailed(usize),
    /// A wait timed out.
    #[error("{0}")]
    Timeout(String),
}

impl CliError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Api(ApiError::Connect { .. } | ApiError::Io(_) | ApiError::Malformed(_)) => {
                EXIT_UNREACHABLE
            }
            CliError::ChecksFailed(_) => EXIT_CHECK_FAILED,
            CliError::Timeout(_) => EXIT_TIMEOUT,
            CliError::Passthrough(e) => e.exit_code(),
            _ => EXIT_REFUSED,
        }
    }
}

/// Prints JSON, pretty.
pub fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}
