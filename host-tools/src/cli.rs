//! Commands of vgpuctl and their table output.
//!
//! Exit codes scripts can rely on (also in `vgpuctl --help` and
//! docs/admin.md):
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success |
//! | 1 | vgpud refused the request (unknown VM or device, invalid or conflicting change) or the command failed |
//! | 2 | the command line is wrong (clap's usage error) |
//! | 3 | vgpud cannot be reached (not running, wrong `--socket`, no permission) |
//! | 4 | `doctor` found a failing check |
//! | 5 | `vm drain --wait` timed out with sessions left |

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};

use crate::api::{ApiError, Client};
use crate::table::{Align, Table, duration, json_bytes, json_percent, json_str};

/// Default admin socket.
pub const DEFAULT_SOCKET: &str = "/run/vgpu/admin.sock";

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

const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  vgpud refused the request (unknown VM or device, invalid or conflicting change)
  2  the command line is wrong
  3  vgpud cannot be reached (not running, wrong --socket, no permission)
  4  doctor found a failing check
  5  vm drain --wait timed out with sessions left";

/// Administer vgpud: devices, VMs and their GPU slices.
#[derive(Debug, Parser)]
#[command(name = "vgpuctl", version, after_long_help = EXIT_CODES_HELP)]
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
    /// Devices: vgpud's devices and the host's real GPUs.
    Device {
        /// Device command.
        #[command(subcommand)]
        command: DeviceCommand,
    },
    /// VMs (tenants): list, inspect, add, remove, change, drain.
    Vm {
        /// VM command.
        #[command(subcommand)]
        command: VmCommand,
    },
    /// Live view of devices and VMs (q or Ctrl-C quits).
    Top(crate::top::TopArgs),
    /// Print the Prometheus metrics vgpud exports.
    Metrics,
    /// Hotspots (VM pairs that contend most, and when), bottlenecks and recommendations with numbers.
    Analyze,
    /// Re-read vgpud's config file and apply what changed (like SIGHUP).
    Reload,
    /// Check this host for what vgpu needs: KVM, shared memory, QEMU, IOMMU, NVIDIA driver, memory.
    Doctor(crate::doctor::DoctorArgs),
    /// Print a shell completion script.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write man pages (vgpuctl.1 and one per subcommand) into a directory.
    Man {
        /// Directory to write the pages into (created if missing).
        dir: PathBuf,
    },
    /// Whole GPUs and SR-IOV virtual functions assigned to VMs with VFIO.
    Passthrough(crate::passthrough::PassthroughArgs),
}

/// Device commands.
#[derive(Debug, Subcommand)]
pub enum DeviceCommand {
    /// List vgpud's devices and the host's NVIDIA GPUs.
    List,
    /// Show one device: memory, slices, scheduling, VMs.
    Show {
        /// Device name (the `[[device]] name`).
        name: String,
    },
    /// Change a device's scheduling live.
    Set(DeviceSetArgs),
}

/// Arguments of `device set`.
#[derive(Debug, Args)]
pub struct DeviceSetArgs {
    /// Device name.
    pub name: String,
    /// Scheduling policy: fair (weighted, work-conserving) or fixed (hard caps).
    #[arg(long, value_parser = ["fair", "fixed"])]
    pub policy: Option<String>,
    /// Time slice in milliseconds (1-100).
    #[arg(long, value_name = "MS")]
    pub slice_ms: Option<u64>,
    /// Minimum share of device time the batch class keeps, in percent (0-50).
    #[arg(long, value_name = "PERCENT")]
    pub batch_min_share: Option<u32>,
}

/// Scheduling class.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PriorityArg {
    /// Preempts everything else.
    Realtime,
    /// The default.
    Normal,
    /// Runs when nothing else waits, with a guaranteed minimum share.
    Batch,
}

impl PriorityArg {
    fn as_str(self) -> &'static str {
        match self {
            PriorityArg::Realtime => "realtime",
            PriorityArg::Normal => "normal",
            PriorityArg::Batch => "batch",
        }
    }
}

/// VM commands.
#[derive(Debug, Subcommand)]
pub enum VmCommand {
    /// List VMs with their slices, shares and sessions.
    List,
    /// Show one VM in detail, with its sessions.
    Show {
        /// VM name.
        name: String,
    },
    /// Add a VM (the same fields and rules as a `[[vm]]` entry of the config).
    Add(VmAddArgs),
    /// Remove a VM: its sessions end and everything they hold is released.
    Remove {
        /// VM name.
        name: String,
    },
    /// Change a VM's memory slice, weight or priority live.
    Set(VmSetArgs),
    /// Drain a VM: new sessions are refused, running ones go on until they end.
    Drain {
        /// VM name.
        name: String,
        /// Wait until the VM has no session left.
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this many seconds (exit code 5).
        #[arg(long, value_name = "SECONDS", default_value_t = 300)]
        timeout: u64,
    },
    /// Print the VMM command-line arguments (or libvirt domain XML) that attach a VM to vgpud.
    AttachArgs(crate::attach::AttachArgs),
    /// Attach a VM to a defined libvirt domain (idempotent; takes effect at the domain's next start).
    Attach(crate::libvirt::DomainArgs),
    /// Remove a VM's device from a libvirt domain.
    Detach(crate::libvirt::DomainArgs),
}

/// Arguments of `vm add`.
#[derive(Debug, Args)]
pub struct VmAddArgs {
    /// VM name (1-64 letters, digits, '-', '_' or '.').
    pub name: String,
    /// Memory slice, e.g. 2GiB (B, KiB, MiB, GiB, TiB); may be left out with --profile.
    #[arg(long, value_name = "SIZE", required_unless_present = "profile")]
    pub memory: Option<String>,
    /// A [[profile]] of the config: its memory slice, weight and priority (the options above win).
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
    /// user[:group] that gets the VM's sockets, mode 0660 (libvirt's QEMU runs as libvirt-qemu).
    #[arg(long, value_name = "USER[:GROUP]")]
    pub socket_owner: Option<String>,
    /// Device to run on (may be left out when vgpud has one device).
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    /// Compute share weight (1-10000).
    #[arg(long)]
    pub weight: Option<u32>,
    /// Scheduling class.
    #[arg(long, value_enum)]
    pub priority: Option<PriorityArg>,
    /// Unix socket vgpud listens on for this VM (containers, host processes, hybrid vsock).
    #[arg(long, value_name = "PATH")]
    pub unix_socket: Option<PathBuf>,
    /// vhost-user socket of the VM's vsock device (for the VMM); needs --guest-cid.
    #[arg(long, value_name = "PATH", requires = "guest_cid")]
    pub vhost_user_socket: Option<PathBuf>,
    /// Guest CID of the VM's vsock device (3 or more, unique per VM).
    #[arg(long, value_name = "CID", requires = "vhost_user_socket")]
    pub guest_cid: Option<u64>,
    /// Hybrid-vsock base path of the vsock device (default: <dir of vhost-user socket>/<name>.vsock).
    #[arg(long, value_name = "PATH", requires = "vhost_user_socket")]
    pub vsock_uds_path: Option<PathBuf>,
}

/// Arguments of `vm set`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("change").required(true).multiple(true).args(["memory", "reserved", "overflow", "overflow_limit", "weight", "priority", "target_wait_p99", "min_share", "weight_min", "weight_max"]))]
pub struct VmSetArgs {
    /// VM name.
    pub name: String,
    /// New memory slice, e.g. 4GiB (refused below what the VM uses, or when the device's
    /// slices would add up past its overcommit).
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// Device memory guaranteed to the VM, e.g. 1GiB (reservations add up to at most the device).
    #[arg(long, value_name = "SIZE")]
    pub reserved: Option<String>,
    /// Where allocations go when the device is full: none (they fail) or host (host memory).
    #[arg(long, value_enum)]
    pub overflow: Option<OverflowArg>,
    /// Most host memory the VM's allocations may overflow to, e.g. 2GiB (with --overflow host).
    #[arg(long, value_name = "SIZE")]
    pub overflow_limit: Option<String>,
    /// New compute share weight (1-10000).
    #[arg(long)]
    pub weight: Option<u32>,
    /// New scheduling class.
    #[arg(long, value_enum)]
    pub priority: Option<PriorityArg>,
    /// Launch-to-start p99 target for the tuning controller, e.g. 5ms.
    #[arg(long, value_name = "DURATION")]
    pub target_wait_p99: Option<String>,
    /// Share of the device (percent) the VM should get while it has work waiting.
    #[arg(long, value_name = "PERCENT")]
    pub min_share: Option<u32>,
    /// Lowest weight the tuning controller may set.
    #[arg(long)]
    pub weight_min: Option<u32>,
    /// Highest weight the tuning controller may set.
    #[arg(long)]
    pub weight_max: Option<u32>,
}

/// `overflow` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum OverflowArg {
    /// Allocations past the device's free memory fail with CUDA_ERROR_OUT_OF_MEMORY.
    None,
    /// They go to host memory, at the same device addresses.
    Host,
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

fn vm_table(vms: &[Value]) -> String {
    let mut t = Table::new(&[
        ("VM", Align::Left),
        ("DEVICE", Align::Left),
        ("USED", Align::Right),
        ("SLICE", Align::Right),
        ("WEIGHT", Align::Right),
        ("PRIORITY", Align::Left),
        ("SHARE 10s", Align::Right),
        ("CONFIGURED", Align::Right),
        ("SESSIONS", Align::Right),
        ("KERNELS", Align::Right),
        ("STATE", Align::Left),
    ]);
    for v in vms {
        t.row(vec![
            json_str(&v["name"]),
            json_str(&v["device"]),
            json_bytes(&v["memory_used"]),
            json_bytes(&v["memory_limit"]),
            json_str(&v["weight"]),
            json_str(&v["priority"]),
            json_percent(&v["usage"]["share_10s"]),
            json_percent(&v["usage"]["configured_share"]),
            v["sessions"].as_array().map_or(0, Vec::len).to_string(),
            json_str(&v["stats"]["kernels"]),
            json_str(&v["state"]),
        ]);
    }
    t.render()
}

fn device_table(devices: &[Value]) -> String {
    let mut t = Table::new(&[
        ("NAME", Align::Left),
        ("KIND", Align::Left),
        ("MODEL", Align::Left),
        ("USED", Align::Right),
        ("MEMORY", Align::Right),
        ("SLICED", Align::Right),
        ("UTIL", Align::Right),
        ("POLICY", Align::Left),
        ("SLICE", Align::Right),
        ("VMS", Align::Left),
    ]);
    for d in devices {
        t.row(vec![
            json_str(&d["name"]),
            json_str(&d["kind"]),
            json_str(&d["model"]),
            json_bytes(&d["memory_used"]),
            json_bytes(&d["memory_total"]),
            json_bytes(&d["memory_sliced"]),
            json_percent(&d["utilization"]),
            json_str(&d["scheduling"]["policy"]),
            d["scheduling"]["slice_ms"]
                .as_u64()
                .map_or("-".into(), |m| format!("{m} ms")),
            d["vms"]
                .as_array()
                .map(|v| {
                    v.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default(),
        ]);
    }
    t.render()
}

fn gpu_table(report: &Value) -> String {
    let gpus = report["gpus"].as_array().map_or(&[][..], Vec::as_slice);
    if gpus.is_empty() {
        return format!(
            "No NVIDIA GPU found: {}\n",
            report["reason"].as_str().unwrap_or("NVML reported none")
        );
    }
    let mut t = Table::new(&[
        ("GPU", Align::Right),
        ("NAME", Align::Left),
        ("UUID", Align::Left),
        ("PCI", Align::Left),
        ("USED", Align::Right),
        ("MEMORY", Align::Right),
        ("UTIL", Align::Right),
        ("TEMP", Align::Right),
        ("POWER", Align::Right),
        ("MIG", Align::Left),
        ("VFS", Align::Right),
    ]);
    for g in gpus {
        let mig = match g["mig_enabled"].as_bool() {
            Some(true) => format!(
                "on ({} instances)",
                g["mig_instances"].as_array().map_or(0, Vec::len)
            ),
            Some(false) => "off".into(),
            None => "-".into(),
        };
        t.row(vec![
            json_str(&g["index"]),
            json_str(&g["name"]),
            json_str(&g["uuid"]),
            json_str(&g["pci"]),
            json_bytes(&g["memory_used"]),
            json_bytes(&g["memory_total"]),
            g["utilization_gpu"]
                .as_u64()
                .map_or("-".into(), |u| format!("{u}%")),
            g["temperature_c"]
                .as_u64()
                .map_or("-".into(), |c| format!("{c}C")),
            g["power_w"]
                .as_f64()
                .map_or("-".into(), |w| format!("{w:.0} W")),
            mig,
            match (g["sriov_vfs"].as_u64(), g["sriov_vfs_total"].as_u64()) {
                (Some(n), Some(t)) => format!("{n}/{t}"),
                _ => "-".into(),
            },
        ]);
    }
    let mut out = format!(
        "NVIDIA driver {}\n",
        report["driver_version"].as_str().unwrap_or("?")
    );
    out += &t.render();
    for g in gpus {
        for m in g["mig_instances"].as_array().into_iter().flatten() {
            out += &format!(
                "  GPU {} MIG {}: {} {} {}\n",
                json_str(&g["index"]),
                json_str(&m["index"]),
                json_str(&m["name"]),
                json_str(&m["uuid"]),
                json_bytes(&m["memory_total"])
            );
        }
    }
    out
}

fn session_table(v: &Value) -> String {
    let mut t = Table::new(&[
        ("SESSION", Align::Right),
        ("PID", Align::Right),
        ("PROCESS", Align::Left),
        ("MEMORY", Align::Right),
        ("TRANSPORT", Align::Left),
    ]);
    for s in v["sessions"].as_array().into_iter().flatten() {
        t.row(vec![
            json_str(&s["id"]),
            json_str(&s["pid"]),
            json_str(&s["process"]),
            json_bytes(&s["memory_used"]),
            json_str(&s["transport"]),
        ]);
    }
    t.render()
}

fn secs_ms(s: f64) -> String {
    format!("{:.2} ms", s * 1e3)
}

fn json_ms(v: &Value) -> String {
    v.as_f64().map_or("-".into(), secs_ms)
}

/// `vgpuctl analyze` for people.
fn analysis_text(v: &Value) -> String {
    let list = |k: &str| v[k].as_array().map_or(&[][..], Vec::as_slice);
    let mut out = String::new();
    let hs = list("hotspots");
    out += "hotspots (the VM pairs that contend most over the last hour):\n";
    if hs.is_empty() {
        out += "  none: no VM waited behind another\n";
    } else {
        let mut t = Table::new(&[
            ("DEVICE", Align::Left),
            ("WAITING", Align::Left),
            ("BEHIND", Align::Left),
            ("LAST HOUR", Align::Right),
            ("PEAK MINUTE", Align::Right),
            ("AT", Align::Left),
        ]);
        for h in hs {
            t.row(vec![
                json_str(&h["device"]),
                json_str(&h["waiting"]),
                json_str(&h["running"]),
                h["last_hour_s"]
                    .as_f64()
                    .map_or("-".into(), |s| format!("{s:.2} s")),
                h["peak_minute_s"]
                    .as_f64()
                    .map_or("-".into(), |s| format!("{s:.2} s")),
                h["peak_minute_start"].as_u64().map_or("-".into(), |t| {
                    let hm = (t % 86_400) / 60;
                    format!("{:02}:{:02} UTC", hm / 60, hm % 60)
                }),
            ]);
        }
        out += &t.render();
    }
    out += "\nbottlenecks:\n";
    let bs = list("bottlenecks");
    if bs.is_empty() {
        out += "  none\n";
    }
    for b in bs {
        out += &format!("  [{}] {}\n", json_str(&b["kind"]), json_str(&b["detail"]));
    }
    out += "\nrecommendations:\n";
    let rs = list("recommendations");
    if rs.is_empty() {
        out += "  none\n";
    }
    for r in rs {
        out += &format!("  {}\n", json_str(&r["text"]));
    }
    let tu = &v["tuning"];
    out += &format!(
        "\ntuning: mode {}, every {} s, {} rounds\n",
        json_str(&tu["mode"]),
        json_str(&tu["interval_s"]),
        json_str(&tu["runs"])
    );
    for c in tu["latest"].as_array().map_or(&[][..], Vec::as_slice) {
        out += &format!(
            "  {} {}: weight {} → {}: {}\n",
            if c["applied"].as_bool() == Some(true) {
                "changed"
            } else {
                "advised"
            },
            json_str(&c["vm"]),
            json_str(&c["from"]),
            json_str(&c["to"]),
            json_str(&c["reason"])
        );
    }
    out
}

/// The contention matrix and the waste of a device (`vgpuctl device show`).
fn device_detail(d: &Value) -> String {
    let u = &d["usage"];
    let mut out = format!(
        "utilization: {} (1s) {} (10s) {} (1 min) {} (10 min)\n\
         idle with work queued: {} (must stay 0); idle at fixed caps: {}; anticipation: {}; hand-over: {}\n\
         memory: {} free, {} in no slice, fragmentation {}\n",
        json_percent(&u["utilization_1s"]),
        json_percent(&u["utilization_10s"]),
        json_percent(&u["utilization_60s"]),
        json_percent(&u["utilization_10m"]),
        json_ms(&u["idle_with_work_s"]),
        json_ms(&u["idle_capped_s"]),
        json_ms(&u["anticipation_s"]),
        json_ms(&u["handover_s"]),
        json_bytes(&u["memory_free"]),
        json_bytes(&u["memory_unsliced"]),
        json_percent(&u["fragmentation"]),
    );
    let pairs = u["contention"].as_array().map_or(&[][..], Vec::as_slice);
    if !pairs.is_empty() {
        let mut t = Table::new(&[
            ("WAITING", Align::Left),
            ("BEHIND", Align::Left),
            ("TOTAL", Align::Right),
            ("LAST HOUR", Align::Right),
            ("PEAK MINUTE", Align::Right),
        ]);
        for p in pairs {
            t.row(vec![
                json_str(&p["waiting"]),
                json_str(&p["running"]),
                p["total_s"]
                    .as_f64()
                    .map_or("-".into(), |s| format!("{s:.2} s")),
                p["last_hour_s"]
                    .as_f64()
                    .map_or("-".into(), |s| format!("{s:.2} s")),
                p["peak_minute_s"]
                    .as_f64()
                    .map_or("-".into(), |s| format!("{s:.2} s")),
            ]);
        }
        out += "\ncontention (time WAITING had a kernel ready while BEHIND ran):\n";
        out += &t.render();
    }
    out
}

fn vm_detail(v: &Value) -> String {
    let mut out = vm_table(std::slice::from_ref(v));
    let u = &v["usage"];
    out += &format!(
        "\nshare: {} (1s) {} (10s) {} (1 min) {} (10 min), configured {}; busy {}\n",
        json_percent(&u["share_1s"]),
        json_percent(&u["share_10s"]),
        json_percent(&u["share_60s"]),
        json_percent(&u["share_10m"]),
        json_percent(&u["configured_share"]),
        u["busy_s"]
            .as_f64()
            .map_or("-".into(), |b| format!("{b:.1} s")),
    );
    let target = u["target_wait_p99_s"]
        .as_f64()
        .map_or(String::new(), |t| format!(" (target {})", secs_ms(t)));
    out += &format!(
        "launch-to-start wait: p50 {} p90 {} p99 {}{target}; deadline misses {}; think time {}\n",
        json_ms(&u["queue_wait_p50_s"]),
        json_ms(&u["queue_wait_p90_s"]),
        json_ms(&u["queue_wait_p99_s"]),
        json_str(&u["deadline_misses"]),
        json_ms(&u["think_time_s"]),
    );
    out += &format!(
        "memory: {} used, peak {}, 24 h high-water {}, slice {}\n",
        json_bytes(&u["memory_used"]),
        json_bytes(&u["memory_peak"]),
        json_bytes(&u["memory_high_water_24h"]),
        json_bytes(&u["memory_limit"]),
    );
    if let Some(t) = v["tuning"].as_object() {
        out += &format!(
            "tuning: mode {}, weight {} (baseline {}, bounds {}–{}){}\n",
            json_str(&t["mode"]),
            json_str(&v["weight"]),
            json_str(&t["baseline_weight"]),
            json_str(&t["weight_min"]),
            json_str(&t["weight_max"]),
            t.get("last_change")
                .and_then(Value::as_object)
                .map_or(String::new(), |c| format!(
                    "; last change {} → {}: {}",
                    json_str(&c["from"]),
                    json_str(&c["to"]),
                    json_str(&c["reason"])
                )),
        );
    }
    let mp = &v["memory_placement"];
    if mp.is_object() {
        out += &format!(
            "placement: {} on the device ({} borrowed past the reservation of {}), {} overflowed to host (overflow {}, limit {}); demotions {} ({}), promotions {} ({})\n",
            json_bytes(&mp["device_bytes"]),
            json_bytes(&mp["borrowed_bytes"]),
            json_bytes(&mp["reserved"]),
            json_bytes(&mp["host_bytes"]),
            json_str(&mp["overflow"]),
            json_bytes(&mp["overflow_limit"]),
            json_str(&mp["demotions"]),
            json_bytes(&mp["demoted_bytes"]),
            json_str(&mp["promotions"]),
            json_bytes(&mp["promoted_bytes"]),
        );
    }
    let k = &v["memory_by_kind"];
    if k.is_object() {
        out += &format!(
            "memory by kind: plain {}, pools {} reserved ({} in use), managed {}, mapped host {}, VMM physical {}\n",
            json_bytes(&k["plain"]),
            json_bytes(&k["pool_reserved"]),
            json_bytes(&k["pool_used"]),
            json_bytes(&k["managed"]),
            json_bytes(&k["mapped_host"]),
            json_bytes(&k["vmm_physical"]),
        );
    }
    let st = &v["stats"];
    out += &format!(
        "copies: {} to the device, {} from it; errors {}; sessions opened {}\n",
        json_bytes(&st["bytes_htod"]),
        json_bytes(&st["bytes_dtoh"]),
        json_str(&st["errors"]),
        json_str(&st["sessions_total"]),
    );
    if let Some(p) = v["unix_socket"].as_str() {
        out += &format!("unix socket: {p}\n");
    }
    if v["vsock"].is_object() {
        let vs = &v["vsock"];
        out += &format!(
            "vsock: cid {} on {} ({} open connections, {} device resets)\n",
            json_str(&vs["guest_cid"]),
            json_str(&vs["socket"]),
            json_str(&vs["stats"]["connections_open"]),
            json_str(&vs["stats"]["device_resets"]),
        );
    }
    if v["vgpu_device"].is_object() {
        let vd = &v["vgpu_device"];
        let st = &vd["stats"];
        out += &format!(
            "virtio-vgpu device: ID {} on {} ({} open sessions; {} in place from the guest, {} to it; \
             {} device resets, {} pauses, {} resumed)\n",
            json_str(&vd["device_id"]),
            json_str(&vd["socket"]),
            json_str(&st["sessions_open"]),
            json_bytes(&st["bytes_from_guest"]),
            json_bytes(&st["bytes_to_guest"]),
            json_str(&st["device_resets"]),
            json_str(&st["pauses"]),
            json_str(&st["resumes"]),
        );
    }
    if v["sessions"].as_array().is_some_and(|s| !s.is_empty()) {
        out.push('\n');
        out += &session_table(v);
    }
    out
}

/// Runs a command.
pub fn run(cli: &Cli) -> Result<(), CliError> {
    let c = Client::new(&cli.socket);
    match &cli.command {
        Command::Passthrough(args) => Ok(crate::passthrough::run(args, cli.json)?),
        Command::Completions { shell } => {
            let mut cmd = Cli::command();
            clap_complete::generate(*shell, &mut cmd, "vgpuctl", &mut std::io::stdout());
            Ok(())
        }
        Command::Man { dir } => crate::manpages::write_all(&Cli::command(), dir)
            .map(|files| {
                if cli.json {
                    print_json(&json!(files));
                } else {
                    for f in files {
                        println!("{}", f.display());
                    }
                }
            })
            .map_err(|e| {
                CliError::Failed(format!(
                    "cannot write man pages into {}: {e}",
                    dir.display()
                ))
            }),
        Command::Doctor(args) => crate::doctor::run(args, &c, cli.json),
        Command::Top(args) => crate::top::run(args, &c, cli.json),
        Command::Vm {
            command: VmCommand::AttachArgs(args),
        } => crate::attach::run(args, &c, cli.json),
        Command::Vm {
            command: VmCommand::Attach(args),
        } => crate::libvirt::attach(args, &c, cli.json),
        Command::Vm {
            command: VmCommand::Detach(args),
        } => crate::libvirt::detach(args, &c, cli.json),
        _ => run_api(cli, &c),
    }
}

fn run_api(cli: &Cli, c: &Client) -> Result<(), CliError> {
    let out = match &cli.command {
        Command::Status => {
            let info = c.get("/v1/info")?;
            let devices = c.get("/v1/devices")?;
            let vms = c.get("/v1/vms")?;
            if !cli.json {
                println!(
                    "vgpud {} (pid {}, protocol {}), up {}",
                    json_str(&info["version"]),
                    json_str(&info["pid"]),
                    json_str(&info["protocol_version"]),
                    duration(info["uptime_s"].as_u64().unwrap_or(0)),
                );
                println!("config: {}", json_str(&info["config"]));
                if let Some(m) = info["metrics_listen"].as_str() {
                    println!("metrics: http://{m}/metrics");
                }
                if let Some(a) = info["audit_log"].as_str() {
                    println!("audit log: {a}");
                }
                println!();
                print!(
                    "{}",
                    device_table(devices.as_array().map_or(&[], Vec::as_slice))
                );
                println!();
                print!("{}", vm_table(vms.as_array().map_or(&[], Vec::as_slice)));
                return Ok(());
            }
            json!({ "daemon": info, "devices": devices, "vms": vms })
        }
        Command::Device { command } => match command {
            DeviceCommand::List => {
                let devices = c.get("/v1/devices")?;
                let gpus = c.get("/v1/gpus")?;
                if !cli.json {
                    print!(
                        "{}",
                        device_table(devices.as_array().map_or(&[], Vec::as_slice))
                    );
                    println!();
                    print!("{}", gpu_table(&gpus));
                    return Ok(());
                }
                json!({ "devices": devices, "gpus": gpus })
            }
            DeviceCommand::Show { name } => {
                let d = c.get(&format!("/v1/devices/{name}"))?;
                if !cli.json {
                    print!("{}", device_table(std::slice::from_ref(&d)));
                    println!(
                        "uuid {}; batch class keeps at least {}% of the device",
                        json_str(&d["uuid"]),
                        json_str(&d["scheduling"]["batch_min_share"])
                    );
                    print!("{}", device_detail(&d));
                    return Ok(());
                }
                d
            }
            DeviceCommand::Set(a) => {
                let mut body = serde_json::Map::new();
                if let Some(p) = &a.policy {
                    body.insert("policy".into(), p.clone().into());
                }
                if let Some(s) = a.slice_ms {
                    body.insert("slice_ms".into(), s.into());
                }
                if let Some(b) = a.batch_min_share {
                    body.insert("batch_min_share".into(), b.into());
                }
                if body.is_empty() {
                    return Err(CliError::Failed(
                        "nothing to change: give --policy, --slice-ms and/or --batch-min-share"
                            .into(),
                    ));
                }
                let s = c.patch(
                    &format!("/v1/devices/{}/scheduling", a.name),
                    &Value::Object(body),
                )?;
                if !cli.json {
                    println!(
                        "device {}: policy {}, slice {} ms, batch minimum share {}%",
                        a.name,
                        json_str(&s["policy"]),
                        json_str(&s["slice_ms"]),
                        json_str(&s["batch_min_share"])
                    );
                    return Ok(());
                }
                s
            }
        },
        Command::Vm { command } => match command {
            VmCommand::List => {
                let vms = c.get("/v1/vms")?;
                if !cli.json {
                    print!("{}", vm_table(vms.as_array().map_or(&[], Vec::as_slice)));
                    return Ok(());
                }
                vms
            }
            VmCommand::Show { name } => {
                let v = c.get(&format!("/v1/vms/{name}"))?;
                if !cli.json {
                    print!("{}", vm_detail(&v));
                    return Ok(());
                }
                v
            }
            VmCommand::Add(a) => {
                let mut body = json!({ "name": a.name });
                let m = body.as_object_mut().expect("object");
                let mut put = |k: &str, v: Option<Value>| {
                    if let Some(v) = v {
                        m.insert(k.into(), v);
                    }
                };
                put("memory", a.memory.clone().map(Value::from));
                put("profile", a.profile.clone().map(Value::from));
                put("socket_owner", a.socket_owner.clone().map(Value::from));
                put("device", a.device.clone().map(Value::from));
                put("weight", a.weight.map(Value::from));
                put("priority", a.priority.map(|p| p.as_str().into()));
                put(
                    "unix_socket",
                    a.unix_socket.as_ref().map(|p| p.to_string_lossy().into()),
                );
                put(
                    "vhost_user_socket",
                    a.vhost_user_socket
                        .as_ref()
                        .map(|p| p.to_string_lossy().into()),
                );
                put("guest_cid", a.guest_cid.map(Value::from));
                put(
                    "vsock_uds_path",
                    a.vsock_uds_path
                        .as_ref()
                        .map(|p| p.to_string_lossy().into()),
                );
                let v = c.post("/v1/vms", &body)?;
                if !cli.json {
                    println!(
                        "VM {} added: {} slice on {}",
                        a.name,
                        json_bytes(&v["memory_limit"]),
                        json_str(&v["device"])
                    );
                    return Ok(());
                }
                v
            }
            VmCommand::Remove { name } => {
                let r = c.delete(&format!("/v1/vms/{name}"))?;
                if !cli.json {
                    println!(
                        "VM {name} removed: {} session(s) ended, {} released{}",
                        json_str(&r["sessions_ended"]),
                        json_bytes(&r["memory_released"]),
                        if r["complete"] == false {
                            " (some sessions are still finishing a call)"
                        } else {
                            ""
                        }
                    );
                    return Ok(());
                }
                r
            }
            VmCommand::Set(a) => {
                let mut body = serde_json::Map::new();
                if let Some(m) = &a.memory {
                    body.insert("memory".into(), m.clone().into());
                }
                if let Some(r) = &a.reserved {
                    body.insert("reserved".into(), r.clone().into());
                }
                if let Some(o) = a.overflow {
                    let o = match o {
                        OverflowArg::None => "none",
                        OverflowArg::Host => "host",
                    };
                    body.insert("overflow".into(), o.into());
                }
                if let Some(l) = &a.overflow_limit {
                    body.insert("overflow_limit".into(), l.clone().into());
                }
                if let Some(w) = a.weight {
                    body.insert("weight".into(), w.into());
                }
                if let Some(p) = a.priority {
                    body.insert("priority".into(), p.as_str().into());
                }
                if let Some(t) = &a.target_wait_p99 {
                    body.insert("target_wait_p99".into(), t.clone().into());
                }
                for (k, v) in [
                    ("min_share", a.min_share),
                    ("weight_min", a.weight_min),
                    ("weight_max", a.weight_max),
                ] {
                    if let Some(v) = v {
                        body.insert(k.into(), v.into());
                    }
                }
                let v = c.patch(&format!("/v1/vms/{}", a.name), &Value::Object(body))?;
                if !cli.json {
                    println!(
                        "VM {}: slice {}, weight {}, priority {}",
                        a.name,
                        json_bytes(&v["memory_limit"]),
                        json_str(&v["weight"]),
                        json_str(&v["priority"])
                    );
                    return Ok(());
                }
                v
            }
            VmCommand::Drain {
                name,
                wait,
                timeout,
            } => {
                let mut v = c.post(&format!("/v1/vms/{name}/drain"), &json!({}))?;
                if *wait {
                    let deadline = Instant::now() + Duration::from_secs(*timeout);
                    while v["sessions"].as_array().is_some_and(|s| !s.is_empty()) {
                        if Instant::now() >= deadline {
                            return Err(CliError::Timeout(format!(
                                "VM {name} still has {} session(s) after {timeout} s; they keep running (new ones are refused); `vgpuctl vm remove {name}` ends them",
                                v["sessions"].as_array().map_or(0, Vec::len)
                            )));
                        }
                        std::thread::sleep(DRAIN_POLL);
                        v = c.get(&format!("/v1/vms/{name}"))?;
                    }
                }
                if !cli.json {
                    let n = v["sessions"].as_array().map_or(0, Vec::len);
                    println!(
                        "VM {name} is draining: new sessions are refused; {n} session(s) running"
                    );
                    return Ok(());
                }
                v
            }
            VmCommand::AttachArgs(_) | VmCommand::Attach(_) | VmCommand::Detach(_) => {
                unreachable!("handled by run")
            }
        },
        Command::Analyze => {
            let v = c.get("/v1/analyze")?;
            if !cli.json {
                print!("{}", analysis_text(&v));
                return Ok(());
            }
            v
        }
        Command::Metrics => {
            let text = c.get_text("/v1/metrics")?;
            if !cli.json {
                print!("{text}");
                return Ok(());
            }
            Value::Array(parse_metrics(&text))
        }
        Command::Reload => {
            let r = c.post("/v1/reload", &json!({}))?;
            if !cli.json {
                for (k, label) in [
                    ("applied", "applied"),
                    ("refused", "REFUSED"),
                    ("restart_needed", "needs a restart"),
                ] {
                    for line in r[k].as_array().into_iter().flatten() {
                        println!("{label}: {}", json_str(line));
                    }
                }
                if r.as_object()
                    .is_some_and(|o| o.values().all(|v| v.as_array().is_some_and(Vec::is_empty)))
                {
                    println!("nothing changed");
                }
                if r["refused"].as_array().is_some_and(|a| !a.is_empty()) {
                    return Err(CliError::Failed(
                        "some changes were refused; fix the file and reload again".into(),
                    ));
                }
                return Ok(());
            }
            r
        }
        Command::Passthrough(_)
        | Command::Completions { .. }
        | Command::Man { .. }
        | Command::Doctor(_)
        | Command::Top(_) => unreachable!("handled by run"),
    };
    print_json(&out);
    Ok(())
}

/// The samples of a Prometheus text exposition as JSON
/// (`{"name", "labels", "value"}`); comments are skipped.
pub fn parse_metrics(text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = match line.rsplit_once(' ') {
            Some(x) => x,
            None => continue,
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, parse_labels(rest.trim_end_matches('}'))),
            None => (series, serde_json::Map::new()),
        };
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or(f64::NAN),
        };
        out.push(json!({ "name": name, "labels": labels, "value": value }));
    }
    out
}

fn parse_labels(s: &str) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    let mut chars = s.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        let key = key.trim_start_matches(',').trim().to_string();
        if key.is_empty() || chars.next() != Some('"') {
            return m;
        }
        let mut val = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => val.push('\n'),
                    Some(o) => val.push(o),
                    None => break,
                },
                '"' => break,
                o => val.push(o),
            }
        }
        m.insert(key, val.into());
    }
}

/// How often `vm drain --wait` looks.
const DRAIN_POLL: Duration = Duration::from_millis(200);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_and_command_has_help() {
        fn walk(cmd: &clap::Command, path: &str) {
            for a in cmd.get_arguments() {
                if matches!(a.get_id().as_str(), "help" | "version") {
                    continue;
                }
                assert!(
                    a.get_help().is_some(),
                    "{path} --{} has no help",
                    a.get_id()
                );
            }
            for s in cmd.get_subcommands() {
                if s.get_name() == "help" {
                    continue;
                }
                assert!(
                    s.get_about().is_some(),
                    "{path} {} has no help",
                    s.get_name()
                );
                walk(s, &format!("{path} {}", s.get_name()));
            }
        }
        Cli::command().debug_assert();
        walk(&Cli::command(), "vgpuctl");
    }

    #[test]
    fn bad_command_lines_are_usage_errors() {
        for args in [
            &["vgpuctl", "vm", "set", "vm1"][..],
            &["vgpuctl", "vm", "add", "x"],
            &[
                "vgpuctl",
                "vm",
                "add",
                "x",
                "--memory",
                "1GiB",
                "--guest-cid",
                "3",
            ],
            &["vgpuctl", "vm", "attach-args", "x"],
            &["vgpuctl", "completions", "tcsh"],
        ] {
            let e = Cli::try_parse_from(args).unwrap_err();
            assert_eq!(e.exit_code(), i32::from(EXIT_USAGE), "{args:?}: {e}");
        }
        assert!(Cli::try_parse_from(["vgpuctl", "vm", "set", "vm1", "--weight", "3"]).is_ok());
    }

    #[test]
    fn errors_map_to_documented_exit_codes() {
        let unreachable = CliError::Api(ApiError::Connect {
            path: "/x".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
        assert_eq!(unreachable.exit_code(), EXIT_UNREACHABLE);
        assert!(unreachable.to_string().contains("is vgpud running?"));
        let denied = CliError::Api(ApiError::Connect {
            path: "/x".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        });
        assert!(denied.to_string().contains("sudo"), "{denied}");
        let refused = CliError::Api(ApiError::Status {
            status: 404,
            message: "no VM".into(),
        });
        assert_eq!(refused.exit_code(), EXIT_REFUSED);
        assert_eq!(CliError::ChecksFailed(2).exit_code(), EXIT_CHECK_FAILED);
        assert_eq!(CliError::Timeout("t".into()).exit_code(), EXIT_TIMEOUT);
    }

    #[test]
    fn metrics_text_becomes_json_samples() {
        let v = parse_metrics(
            "# HELP a x\n# TYPE a gauge\na{vm=\"v\\\"1\",device=\"gpu0\"} 2.5\nb 3\n",
        );
        assert_eq!(v.len(), 2);
        assert_eq!(v[0]["labels"]["vm"], "v\"1");
        assert_eq!(v[0]["labels"]["device"], "gpu0");
        assert_eq!(v[0]["value"], 2.5);
        assert_eq!(v[1], json!({ "name": "b", "labels": {}, "value": 3.0 }));
    }

    #[test]
    fn analysis_and_tuning_read_as_sentences() {
        let a = json!({
            "hotspots": [{ "device": "gpu0", "waiting": "inference", "running": "training",
                           "last_hour_s": 41.2, "total_s": 50.0, "peak_minute_start": 1_700_000_520u64,
                           "peak_minute_s": 9.8 }],
            "bottlenecks": [{ "kind": "oversized_slice", "device": "gpu0", "vm": "training",
                              "detail": "`training` has a 8 GiB slice and used at most 4.2 GiB in 24 h" }],
            "recommendations": [{ "vm": "training", "setting": "memory", "from": 8u64 << 30, "to": 5u64 << 30,
                                  "text": "training: slice 8 GiB, peak 4.2 GiB in 24 h: shrink to 5 GiB" }],
            "tuning": { "mode": "advise", "interval_s": 300.0, "runs": 12,
                        "latest": [{ "vm": "inference", "from": 3, "to": 4, "applied": false,
                                     "reason": "p99 wait 9.0 ms vs target 5.0 ms" }] },
        });
        let t = analysis_text(&a);
        for want in [
            "inference  training",
            "41.20 s",
            "22:22 UTC",
            "[oversized_slice]",
            "shrink to 5 GiB",
            "advised inference: weight 3 → 4: p99 wait 9.0 ms vs target 5.0 ms",
        ] {
            assert!(t.contains(want), "{want:?} not in\n{t}");
        }
        let empty = analysis_text(
            &json!({ "hotspots": [], "bottlenecks": [], "recommendations": [], "tuning": {} }),
        );
        assert!(
            empty.contains("none: no VM waited behind another"),
            "{empty}"
        );
        let vm = json!({
            "name": "inference", "weight": 4, "usage": { "queue_wait_p99_s": 0.004, "target_wait_p99_s": 0.005,
            "memory_peak": 1u64 << 30, "share_10m": 0.3 },
            "tuning": { "mode": "auto", "baseline_weight": 3, "weight_min": 1, "weight_max": 12,
                        "last_change": { "from": 3, "to": 4, "reason": "p99 wait 9.0 ms vs target 5.0 ms" } },
        });
        let d = vm_detail(&vm);
        assert!(d.contains("p99 4.00 ms (target 5.00 ms)"), "{d}");
        assert!(
            d.contains(
                "tuning: mode auto, weight 4 (baseline 3, bounds 1–12); last change 3 → 4: p99 wait"
            ),
            "{d}"
        );
        let dev = json!({ "usage": { "idle_with_work_s": 0.0, "fragmentation": 0.5,
            "contention": [{ "waiting": "a", "running": "b", "total_s": 1.5, "last_hour_s": 1.5, "peak_minute_s": 1.0 }] } });
        let d = device_detail(&dev);
        assert!(
            d.contains("idle with work queued: 0.00 ms (must stay 0)") && d.contains("1.50 s"),
            "{d}"
        );
    }

    #[test]
    fn tables_show_what_operators_look_for() {
        let vm = json!({
            "name": "vm1", "device": "gpu0", "memory_used": 16u64 << 20, "memory_limit": 64u64 << 20,
            "weight": 3, "priority": "normal", "state": "running",
            "usage": { "configured_share": 0.75, "share_10s": null },
            "sessions": [{ "id": 4, "pid": 99, "process": "train", "memory_used": 16u64 << 20, "transport": "unix:/s" }],
            "stats": { "kernels": 12, "bytes_htod": 1024, "bytes_dtoh": 0, "errors": 0, "sessions_total": 1 },
        });
        let t = vm_table(std::slice::from_ref(&vm));
        assert!(
            t.contains("16 MiB") && t.contains("64 MiB") && t.contains("75%"),
            "{t}"
        );
        let d = vm_detail(&vm);
        assert!(d.contains("train") && d.contains("99"), "{d}");
        assert!(!d.contains("virtio-vgpu"), "{d}");
        let mut dev = vm.clone();
        dev["vgpu_device"] = json!({ "device_id": 21, "socket": "/run/vgpu/vm1.vgpu.sock",
            "stats": { "sessions_open": 2, "bytes_from_guest": 3u64 << 20, "bytes_to_guest": 0,
                       "device_resets": 1, "pauses": 4, "resumes": 3 } });
        let d = vm_detail(&dev);
        assert!(
            d.contains(
                "virtio-vgpu device: ID 21 on /run/vgpu/vm1.vgpu.sock (2 open sessions; 3 MiB"
            ) && d.contains("1 device resets, 4 pauses, 3 resumed"),
            "{d}"
        );
        let g =
            gpu_table(&json!({ "nvml": false, "reason": "no NVIDIA driver found: x", "gpus": [] }));
        assert_eq!(g, "No NVIDIA GPU found: no NVIDIA driver found: x\n");
        let g = gpu_table(
            &json!({ "nvml": true, "driver_version": "550.54", "gpus": [{
            "index": 0, "name": "NVIDIA H100", "uuid": "GPU-1", "pci": "0000:3b:00.0",
            "memory_total": 80u64 << 30, "memory_used": 1u64 << 30, "utilization_gpu": 12,
            "temperature_c": 40, "power_w": 71.5, "mig_enabled": true,
            "mig_instances": [{ "index": 0, "name": "1g.10gb", "uuid": "MIG-1", "memory_total": 10u64 << 30 }],
            "sriov_vfs": 0, "sriov_vfs_total": 16 }] }),
        );
        assert!(
            g.contains("NVIDIA driver 550.54")
                && g.contains("on (1 instances)")
                && g.contains("MIG-1")
                && g.contains("0/16"),
            "{g}"
        );
    }
}
