//! Commands of vgpuctl and their table output.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use serde_json::Value;

use crate::api::{ApiError, Client};

/// Default admin socket.
pub const DEFAULT_SOCKET: &str = "/run/vgpu/admin.sock";

/// Exit code: the daemon refused the request (unknown VM, invalid change).
pub const EXIT_REFUSED: u8 = 1;
/// Exit code: the daemon could not be reached.
pub const EXIT_UNREACHABLE: u8 = 3;

/// Administer vgpud: devices, VMs and their GPU slices.
#[derive(Debug, Parser)]
#[command(name = "vgpuctl", version)]
pub struct Cli {
    /// Admin socket of vgpud (the `[admin] socket` of its config).
    #[arg(long, global = true, value_name = "PATH", default_value = DEFAULT_SOCKET, env = "VGPU_ADMIN_SOCKET")]
    pub socket: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Daemon version and a summary of devices and VMs.
    Status,
    /// Devices.
    Device {
        /// Device command.
        #[command(subcommand)]
        command: DeviceCommand,
    },
    /// VMs (tenants).
    Vm {
        /// VM command.
        #[command(subcommand)]
        command: VmCommand,
    },
    /// Whole GPUs and SR-IOV virtual functions assigned to VMs with VFIO.
    Passthrough(crate::passthrough::PassthroughArgs),
}

/// Device commands.
#[derive(Debug, Subcommand)]
pub enum DeviceCommand {
    /// List devices.
    List,
}

/// VM commands.
#[derive(Debug, Subcommand)]
pub enum VmCommand {
    /// List VMs with their slices and sessions.
    List,
    /// Show one VM in detail.
    Show {
        /// VM name.
        name: String,
    },
}

fn mib(v: &Value) -> String {
    v.as_u64()
        .map_or("-".into(), |b| format!("{} MiB", b >> 20))
}

fn print_vms(vms: &[Value]) {
    println!(
        "{:<16} {:<8} {:>12} {:>12} {:>7} {:<9} {:>8}",
        "VM", "DEVICE", "USED", "SLICE", "WEIGHT", "PRIORITY", "SESSIONS"
    );
    for v in vms {
        println!(
            "{:<16} {:<8} {:>12} {:>12} {:>7} {:<9} {:>8}",
            v["name"].as_str().unwrap_or("?"),
            v["device"].as_str().unwrap_or("?"),
            mib(&v["memory_used"]),
            mib(&v["memory_limit"]),
            v["weight"],
            v["priority"].as_str().unwrap_or("?"),
            v["sessions"].as_array().map_or(0, Vec::len)
        );
    }
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The admin API refused or could not be reached.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// A passthrough operation failed.
    #[error(transparent)]
    Passthrough(#[from] crate::passthrough::PassthroughError),
}

/// Runs a command.
pub fn run(cli: &Cli) -> Result<(), CliError> {
    if let Command::Passthrough(args) = &cli.command {
        return Ok(crate::passthrough::run(args, cli.json)?);
    }
    Ok(run_api(cli)?)
}

fn run_api(cli: &Cli) -> Result<(), ApiError> {
    let c = Client::new(&cli.socket);
    let out = match &cli.command {
        Command::Passthrough(_) => unreachable!("handled by run"),
        Command::Status => {
            let info = c.get("/v1/info")?;
            let devices = c.get("/v1/devices")?;
            let vms = c.get("/v1/vms")?;
            if !cli.json {
                println!(
                    "vgpud {} (pid {}, protocol {})",
                    info["version"].as_str().unwrap_or("?"),
                    info["pid"],
                    info["protocol_version"]
                );
                println!("devices: {}", devices.as_array().map_or(0, Vec::len));
                print_vms(vms.as_array().map_or(&[], Vec::as_slice));
                return Ok(());
            }
            serde_json::json!({ "daemon": info, "devices": devices, "vms": vms })
        }
        Command::Device {
            command: DeviceCommand::List,
        } => {
            let devices = c.get("/v1/devices")?;
            if !cli.json {
                println!(
                    "{:<8} {:<6} {:<22} {:>12} {:>12}  VMS",
                    "NAME", "KIND", "MODEL", "USED", "MEMORY"
                );
                for d in devices.as_array().into_iter().flatten() {
                    println!(
                        "{:<8} {:<6} {:<22} {:>12} {:>12}  {}",
                        d["name"].as_str().unwrap_or("?"),
                        d["kind"].as_str().unwrap_or("?"),
                        d["model"].as_str().unwrap_or("?"),
                        mib(&d["memory_used"]),
                        mib(&d["memory_total"]),
                        d["vms"]
                            .as_array()
                            .map(|v| v
                                .iter()
                                .filter_map(Value::as_str)
                                .collect::<Vec<_>>()
                                .join(","))
                            .unwrap_or_default()
                    );
                }
                return Ok(());
            }
            devices
        }
        Command::Vm {
            command: VmCommand::List,
        } => {
            let vms = c.get("/v1/vms")?;
            if !cli.json {
                print_vms(vms.as_array().map_or(&[], Vec::as_slice));
                return Ok(());
            }
            vms
        }
        Command::Vm {
            command: VmCommand::Show { name },
        } => {
            let v = c.get(&format!("/v1/vms/{name}"))?;
            if !cli.json {
                print_vms(std::slice::from_ref(&v));
                for s in v["sessions"].as_array().into_iter().flatten() {
                    println!(
                        "  session {:<5} pid {:<8} {:<24} {:>10}  {}",
                        s["id"],
                        s["pid"],
                        s["process"].as_str().unwrap_or("?"),
                        mib(&s["memory_used"]),
                        s["transport"].as_str().unwrap_or("?")
                    );
                }
                return Ok(());
            }
            v
        }
    };
    println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    Ok(())
}
