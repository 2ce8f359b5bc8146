//! vgpud: serves virtual GPUs to VMs and processes.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use tracing_subscriber::EnvFilter;
use vgpu_config::{Config, DeviceKind};
use vgpud::Daemon;
use vgpud::audit::Actor;
use vgpud::signals::{self, SignalError, Signals};

/// Shares GPUs between VMs at the CUDA API level, with hard memory slices and time-sliced compute.
#[derive(Debug, Parser)]
#[command(name = "vgpud", version)]
struct Args {
    /// Configuration file (TOML) to run with.
    #[arg(long, value_name = "FILE", required_unless_present = "check_config")]
    config: Option<PathBuf>,
    /// Validate a configuration file and exit (0 = valid) without starting anything.
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    check_config: Option<PathBuf>,
    /// Log filter, e.g. `info`, `debug`, `vgpu_broker=debug` (overrides RUST_LOG).
    #[arg(long, value_name = "FILTER")]
    log: Option<String>,
    /// System-call filters per thread kind: `on` aborts on a call outside a thread's allowlist,
    /// `log` lets it through and has the kernel log it, `off` installs none (debugging only).
    #[arg(long, value_enum, value_name = "MODE", default_value_t = SeccompArg::On)]
    seccomp: SeccompArg,
    /// Where the host's sysfs is mounted (a container that mounts it elsewhere): passthrough
    /// devices, their drivers and IOMMU groups are read there.
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    sysfs_root: PathBuf,
    /// Where the host's procfs is mounted: the NVIDIA driver's GPUs are read there.
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    proc_root: PathBuf,
}

/// `--seccomp` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SeccompArg {
    /// Enforce the allowlists (default).
    On,
    /// Allow and log calls outside the allowlists.
    Log,
    /// No filters.
    Off,
}

impl From<SeccompArg> for vgpu_seccomp::Mode {
    fn from(arg: SeccompArg) -> Self {
        match arg {
            SeccompArg::On => vgpu_seccomp::Mode::Enforce,
            SeccompArg::Log => vgpu_seccomp::Mode::Log,
            SeccompArg::Off => vgpu_seccomp::Mode::Off,
        }
    }
}

/// An error with its causes, `outer: inner: …`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Points standard output at `/dev/null`. vgpud writes nothing there (logs go to stderr), but
/// the CUDA driver flushes the output of device-side `printf` in the guests' kernels to the
/// process's stdout: guest-controlled text must not reach the host's logs (journald captures
/// stdout).
fn discard_stdout() -> std::io::Result<()> {
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    // SAFETY: both are open descriptors; dup2 atomically replaces fd 1, whose old file nothing
    // in this process holds a reference to beyond the descriptor itself.
    if unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), libc::STDOUT_FILENO) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Serves signals until `SIGTERM` or `SIGINT`: each `SIGHUP` reloads the config file at `path`.
/// Runs on the main thread's tokio runtime; a reload runs on it too (nothing else does), and
/// signals that arrive meanwhile wait in the signalfd.
async fn serve_signals(
    signals: &Signals,
    daemon: &Daemon,
    path: &std::path::Path,
) -> Result<(), SignalError> {
    loop {
        let actor = signals.next().await?;
        let Actor::Signal { signal, pid, .. } = actor else {
            continue;
        };
        if signal != libc::SIGHUP {
            tracing::info!(signal, sender = pid, "shutting down");
            return Ok(());
        }
        tracing::info!(sender = pid, config = %path.display(), "SIGHUP: reloading the config");
        match daemon.reload(actor, path) {
            Ok(r) => tracing::info!(
                applied = r.applied.len(),
                refused = r.refused.len(),
                restart_needed = r.restart_needed.len(),
                "config reloaded"
            ),
            Err(e) => tracing::error!("config not reloaded: {e}"),
        }
    }
}

fn main() -> ExitCode {
    // Before any thread starts.
    let arenas = vgpu_broker::limit_heap_arenas();
    let args = Args::parse();
    let filter = args.log.clone().map(EnvFilter::new).unwrap_or_else(|| {
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colours only on a terminal: journald and log files get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    tracing::debug!(
        ?arenas,
        "heap arenas capped (None: MALLOC_ARENA_MAX or glibc decides)"
    );

    if let Some(path) = args.check_config {
        return match Config::load(&path) {
            Ok(c) => {
                println!(
                    "{}: valid ({} devices, {} VMs)",
                    path.display(),
                    c.devices.len(),
                    c.vms.len()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        };
    }
    let path = args.config.expect("clap requires --config");
    // Reloads read the same file even if a relative path's meaning changes.
    let path = std::fs::canonicalize(&path).unwrap_or(path);
    let config = match Config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // A configured MIG instance must be made visible to CUDA before anything
    // else runs.
    // SAFETY: no other thread exists yet, and no CUDA device was opened.
    if let Err(e) = unsafe { vgpu_cuda::make_mig_visible(&config.devices) } {
        eprintln!("vgpud: {e}");
        return ExitCode::from(2);
    }
    if let Err(e) = discard_stdout() {
        tracing::warn!(error = %e, "cannot point stdout at /dev/null; kernels' printf output may reach it");
    }
    // Block SIGINT/SIGTERM/SIGHUP before any thread starts: every thread inherits the mask, so
    // the signals wait for the signalfd read on this thread's runtime.
    let signal_set = match signals::block() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("vgpud: {}", chain(&e));
            return ExitCode::FAILURE;
        }
    };
    // Every thread starts from here, so every thread inherits the control filter.
    let real_gpu = config
        .devices
        .iter()
        .any(|d| matches!(d.kind, DeviceKind::Cuda { .. }));
    if let Err(e) = vgpu_seccomp::install(args.seccomp.into(), real_gpu) {
        eprintln!("vgpud: {e}");
        return ExitCode::FAILURE;
    }
    let roots = vgpud::passthrough::HostRoots {
        sysfs: args.sysfs_root.clone(),
        procfs: args.proc_root.clone(),
    };
    let daemon = match Daemon::start_with(&config, roots) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("vgpud: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(config = %path.display(), vms = config.vms.len(), "vgpud ready");
    // The main thread's control-plane runtime: it only reads signals (and runs the reloads they
    // ask for); the admin API and metrics have runtimes of their own (server.rs).
    let served = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(SignalError::Open)
        .and_then(|rt| {
            rt.block_on(async {
                let signals = Signals::open(&signal_set)?;
                serve_signals(&signals, &daemon, &path).await
            })
        });
    let code = match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %chain(&e), "signals cannot be read; shutting down");
            ExitCode::FAILURE
        }
    };
    daemon.shutdown();
    code
}
