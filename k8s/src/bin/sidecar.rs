//! `vgpu-kubevirt-sidecar`: KubeVirt's hook sidecar for vgpu (docs/kubernetes.md).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use vgpu_k8s::sidecar::{self, Hooks};

/// Adds vgpu devices and shared memory to the domains of VMIs that request vgpu resources.
///
/// No `--version` flag of clap's: `--version` is the hook API version virt-launcher passes (clap
/// refuses the clash at start, or would print the program's version and exit).
#[derive(Parser, Debug)]
#[command(name = "vgpu-kubevirt-sidecar")]
struct Args {
    /// The hook socket virt-launcher dials.
    #[arg(long, default_value = "/var/run/kubevirt-hooks/vgpu.sock")]
    socket: PathBuf,
    /// Resource domain of the device plugin.
    #[arg(long, default_value = "vgpu.io")]
    domain: String,
    /// Hook API version KubeVirt passes (`--version v1alpha2`); only v1alpha2 is served.
    #[arg(long)]
    version: Option<String>,
    /// Transform domain XML from stdin with the VMI JSON in this file, print it, and exit (for checks).
    #[arg(long, value_name = "VMI_JSON")]
    transform: Option<PathBuf>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VGPU_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let a = Args::parse();
    if let Some(v) = a.version.as_deref().filter(|v| *v != "v1alpha2") {
        eprintln!("vgpu-kubevirt-sidecar: hook API {v} is not served; use --version v1alpha2");
        return ExitCode::FAILURE;
    }
    if let Some(vmi) = &a.transform {
        let mut xml = String::new();
        let r = std::io::Read::read_to_string(&mut std::io::stdin(), &mut xml)
            .map_err(|e| e.to_string())
            .and_then(|_| std::fs::read(vmi).map_err(|e| format!("{}: {e}", vmi.display())))
            .and_then(|v| {
                sidecar::on_define_domain(&xml, &v, &a.domain).map_err(|e| e.to_string())
            });
        return match r {
            Ok(out) => {
                print!("{out}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("vgpu-kubevirt-sidecar: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vgpu-kubevirt-sidecar: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let hooks = Hooks { domain: a.domain };
    match rt.block_on(sidecar::serve(&a.socket, hooks, async {
        let _ = tokio::signal::ctrl_c().await;
    })) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpu-kubevirt-sidecar: {e}");
            ExitCode::FAILURE
        }
    }
}
