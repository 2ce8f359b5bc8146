//! `vgpuctl passthrough`: prepares, verifies and tracks VFIO assignments of
//! whole GPUs and SR-IOV virtual functions (see docs/passthrough.md).
//!
//! The host is read through the `vgpu-pci` crate (`host-tools/pci/`, shared with
//! vgpud): its `Sysfs` seam rooted at `--sysfs-root`, PCI devices, IOMMU groups
//! and SR-IOV functions, and procfs (the NVIDIA driver's GPUs, open device nodes).
//!
//! - [`usage`]: whether a GPU is free, shared by vgpud or assigned;
//! - [`rollback`]: sysfs changes as steps that undo themselves on failure;
//! - [`state`]: the state file recording the drivers devices had;
//! - [`list`], [`sriov`], [`bind`], [`verify`]: the commands;
//! - [`vfio`]: the VFIO ioctls of `verify` (`vfio-ioctls`);
//! - [`testutils`]: fake sysfs trees that behave like the kernel's.

pub mod bind;
pub mod checks;
pub mod error;
pub mod list;
pub mod rollback;
pub mod sriov;
pub mod state;
pub mod testutils;
pub mod usage;
pub mod verify;
pub mod vfio;

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use serde_json::Value;

pub use error::PassthroughError;
use state::{DEFAULT_STATE_DIR, StateStore};
use usage::UsageContext;
use verify::Vmm;
use vgpu_pci::PciAddress;
use vgpu_pci::procfs::Procfs;
use vgpu_pci::sysfs::{RealSysfs, Sysfs};

/// The host's sysfs.
pub const DEFAULT_SYSFS: &str = "/sys";
/// vgpud's config, read when `--config` is not given and `--sysfs-root` is
/// the host's (a test tree never picks up the host's config).
pub const DEFAULT_CONFIG: &str = "/etc/vgpu/vgpud.toml";

/// Arguments of `vgpuctl passthrough`.
#[derive(Debug, Args)]
pub struct PassthroughArgs {
    /// Root of the sysfs tree to inspect and change.
    #[arg(long, global = true, value_name = "DIR", default_value = DEFAULT_SYSFS)]
    pub sysfs_root: PathBuf,
    /// Root of procfs (the NVIDIA driver's GPU information, open device nodes).
    #[arg(long, global = true, value_name = "DIR", default_value = "/proc")]
    pub proc_root: PathBuf,
    /// Directory of the state file that records the drivers devices had before `bind`.
    #[arg(long, global = true, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// vgpud's config file: its passthrough VMs and its shared devices
    /// (default: /etc/vgpu/vgpud.toml when it exists and --sysfs-root is /sys).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// vgpud's admin socket (the global `--socket`), asked which devices it shares.
    #[arg(from_global)]
    pub socket: PathBuf,
    /// What to do.
    #[command(subcommand)]
    pub command: PassthroughCommand,
}

/// Passthrough commands.
#[derive(Debug, Subcommand)]
pub enum PassthroughCommand {
    /// List NVIDIA GPUs and their virtual functions: IOMMU group, driver,
    /// SR-IOV, and whether each is free, shared by vgpud or assigned.
    List,
    /// Create SR-IOV virtual functions on a GPU (refused while existing ones are in use).
    EnableVfs {
        /// The GPU (physical function), e.g. 0000:3b:00.0.
        bdf: PciAddress,
        /// How many VFs.
        count: u32,
    },
    /// Remove the SR-IOV virtual functions of a GPU (refused while any is in use).
    DisableVfs {
        /// The GPU (physical function).
        bdf: PciAddress,
    },
    /// Bind a GPU or VF to vfio-pci so a VM can own it; records its driver for `unbind`.
    Bind {
        /// The GPU or VF.
        bdf: PciAddress,
        /// Also bind the other devices of its IOMMU group (e.g. its audio function).
        #[arg(long)]
        group: bool,
    },
    /// Give a device bound by `bind` back to its original driver.
    Unbind {
        /// The GPU or VF.
        bdf: PciAddress,
    },
    /// Open the device through VFIO as a VMM would; print its regions and interrupts.
    Verify {
        /// The GPU or VF.
        bdf: PciAddress,
    },
    /// Print the VMM arguments that pass the device through.
    AttachArgs {
        /// The GPU or VF.
        bdf: PciAddress,
        /// The VMM.
        #[arg(long, value_enum)]
        vmm: Vmm,
    },
}

/// A command's result: JSON for `--json`, text otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The `--json` output.
    pub json: Value,
    /// The text output (stdout).
    pub text: String,
    /// Advice printed on stderr in text mode (kept off stdout so that
    /// `$(vgpuctl passthrough attach-args …)` stays usable).
    pub warnings: Vec<String>,
}

impl Report {
    /// A report without warnings.
    pub fn new(json: Value, text: String) -> Self {
        Self {
            json,
            text,
            warnings: Vec::new(),
        }
    }
}

/// The host a command works on.
pub struct Host<'a> {
    /// sysfs.
    pub sysfs: &'a dyn Sysfs,
    /// procfs.
    pub procfs: Procfs,
    /// The state file.
    pub store: StateStore,
    /// vgpud's config (`--config`, or the default one on the host).
    pub config: Option<PathBuf>,
    /// vgpud's admin socket.
    pub socket: Option<PathBuf>,
}

impl<'a> Host<'a> {
    /// The host described by `args`, with `sysfs`.
    pub fn new(sysfs: &'a dyn Sysfs, args: &PassthroughArgs) -> Self {
        Self {
            sysfs,
            procfs: Procfs::new(&args.proc_root),
            store: StateStore::new(&args.state_dir),
            config: args.config.clone().or_else(|| {
                let default = Path::new(DEFAULT_CONFIG);
                (args.sysfs_root == Path::new(DEFAULT_SYSFS) && default.exists())
                    .then(|| default.to_path_buf())
            }),
            socket: Some(args.socket.clone()),
        }
    }

    /// Who uses what (config, admin API, procfs).
    pub fn usage(&self) -> Result<UsageContext, PassthroughError> {
        UsageContext::gather(
            self.procfs.clone(),
            self.config.as_deref(),
            self.socket.as_deref(),
        )
    }
}

/// Runs a command against a host.
pub fn execute(h: &Host<'_>, command: &PassthroughCommand) -> Result<Report, PassthroughError> {
    match command {
        PassthroughCommand::List => list::list(h),
        PassthroughCommand::EnableVfs { bdf, count } => sriov::enable_vfs(h, *bdf, *count),
        PassthroughCommand::DisableVfs { bdf } => sriov::disable_vfs(h, *bdf),
        PassthroughCommand::Bind { bdf, group } => bind::bind(h, *bdf, *group),
        PassthroughCommand::Unbind { bdf } => bind::unbind(h, *bdf),
        PassthroughCommand::Verify { bdf } => verify::verify(h, *bdf),
        PassthroughCommand::AttachArgs { bdf, vmm } => verify::attach_args(h, *bdf, *vmm),
    }
}

/// Runs a command with `sysfs` and writes its output to `out` (warnings to
/// `err`).
pub fn run_with(
    sysfs: &dyn Sysfs,
    args: &PassthroughArgs,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), PassthroughError> {
    let report = execute(&Host::new(sysfs, args), &args.command)?;
    let written = if json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&report.json).unwrap_or_default()
        )
    } else {
        out.write_all(report.text.as_bytes()).and_then(|()| {
            report
                .warnings
                .iter()
                .try_for_each(|w| writeln!(err, "note: {w}"))
        })
    };
    written.map_err(PassthroughError::Output)
}

/// Runs a passthrough command on the host.
pub fn run(args: &PassthroughArgs, json: bool) -> Result<(), PassthroughError> {
    let sysfs = RealSysfs::new(&args.sysfs_root);
    run_with(
        &sysfs,
        args,
        json,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
}
