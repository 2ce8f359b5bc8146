//! vgpuctl: administer vgpud.

use std::process::ExitCode;

use clap::Parser;
use vgpu_host_tools::api::ApiError;
use vgpu_host_tools::cli::{Cli, CliError, EXIT_REFUSED, EXIT_UNREACHABLE, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpuctl: {e}");
            match e {
                CliError::Api(ApiError::Connect { .. }) => ExitCode::from(EXIT_UNREACHABLE),
                _ => ExitCode::from(EXIT_REFUSED),
            }
        }
    }
}
