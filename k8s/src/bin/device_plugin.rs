//! `vgpu-device-plugin`: the kubelet device plugin of vgpu (docs/kubernetes.md).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use vgpu_k8s::plugin::{self, PluginConfig};

/// Offers vgpu's profiles to the kubelet as resources `vgpu.io/<profile>`.
#[derive(Parser, Debug)]
#[command(name = "vgpu-device-plugin", version)]
struct Args {
    /// vgpud's admin socket.
    #[arg(long, default_value = "/run/vgpu/admin.sock")]
    admin_socket: PathBuf,
    /// The kubelet's device-plugin directory (holds kubelet.sock).
    #[arg(long, default_value = plugin::DEFAULT_PLUGIN_DIR)]
    plugin_dir: PathBuf,
    /// The kubelet's pod-resources socket (slots no pod holds are released).
    #[arg(long, default_value = plugin::DEFAULT_POD_RESOURCES)]
    pod_resources_socket: PathBuf,
    /// Host directory for the VMs' socket directories (mounted into containers).
    #[arg(long, default_value = plugin::DEFAULT_SOCKET_ROOT)]
    socket_root: PathBuf,
    /// Resource domain.
    #[arg(long, default_value = plugin::DEFAULT_DOMAIN)]
    domain: String,
    /// Seconds between polls of vgpud and the kubelet.
    #[arg(long, default_value_t = 2.0)]
    poll_s: f64,
    /// Seconds a slot may be held by no pod before its VM is removed.
    #[arg(long, default_value_t = 60.0)]
    release_grace_s: f64,
    /// Lowest guest CID of the VMs' vsock devices.
    #[arg(long, default_value_t = 1000)]
    cid_base: u64,
    /// user[:group] that gets the VMs' sockets (KubeVirt's virt-launcher runs QEMU as 107:107).
    #[arg(long)]
    socket_owner: Option<String>,
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
    let mut c = PluginConfig::new(&a.admin_socket, &a.plugin_dir);
    c.pod_resources = a.pod_resources_socket;
    c.socket_root = a.socket_root;
    c.domain = a.domain;
    c.poll = Duration::from_secs_f64(a.poll_s.max(0.05));
    c.release_grace = Duration::from_secs_f64(a.release_grace_s.max(0.0));
    c.cid_base = a.cid_base.max(3);
    c.socket_owner = a.socket_owner;
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vgpu-device-plugin: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r = rt.block_on(plugin::run(c, async {
        let _ = tokio::signal::ctrl_c().await;
    }));
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpu-device-plugin: {e}");
            ExitCode::FAILURE
        }
    }
}
