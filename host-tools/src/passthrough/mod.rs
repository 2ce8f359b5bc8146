//! `vgpuctl passthrough`: prepares, verifies and tracks VFIO assignments of
//! whole GPUs and SR-IOV virtual functions (being written; see docs/passthrough.md).

use clap::{Args, Subcommand};
use thiserror::Error;

/// Arguments of `vgpuctl passthrough`.
#[derive(Debug, Args)]
pub struct PassthroughArgs {
    /// Root of the sysfs tree to inspect and change.
    #[arg(long, global = true, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: std::path::PathBuf,
    /// What to do.
    #[command(subcommand)]
    pub command: PassthroughCommand,
}

/// Passthrough commands.
#[derive(Debug, Subcommand)]
pub enum PassthroughCommand {
    /// List NVIDIA GPUs and their virtual functions.
    List,
}

/// Why a passthrough command failed.
#[derive(Debug, Error)]
pub enum PassthroughError {
    /// Not available yet in this build.
    #[error("{0}")]
    Unavailable(String),
}

/// Runs a passthrough command.
pub fn run(args: &PassthroughArgs, _json: bool) -> Result<(), PassthroughError> {
    Err(PassthroughError::Unavailable(format!(
        "`vgpuctl passthrough` is not available in this build (sysfs root {})",
        args.sysfs_root.display()
    )))
}
