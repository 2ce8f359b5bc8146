//! vgpuctl: administer vgpud.

use std::process::ExitCode;

use clap::Parser;
use vgpu_host_tools::cli::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpuctl: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
