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

use vgpu_api as api;

use crate::api::{Client, typed};
pub use crate::outcome::{
    CliError, EXIT_CHECK_FAILED, EXIT_REFUSED, EXIT_TIMEOUT, EXIT_UNREACHABLE, EXIT_USAGE,
    print_json,
};
use crate::table::{Align, Table, bytes, duration, or_dash, percent};

/// Default admin socket.
pub const DEFAULT_SOCKET: &str = "/run/vgpu/admin.sock";

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
    /// Change a device's scheduling or overcommit live.
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
    /// How far the slices of the device's VMs may add up past its memory (1.0-16); refused
    /// when the slices do not fit it.
    #[arg(long, value_name = "MULTIPLE")]
    pub overcommit: Option<f64>,
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

fn vm_table(vms: &[api::Vm]) -> String {
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
            v.name.clone(),
            v.device.clone(),
            bytes(v.memory_used),
            bytes(v.memory_limit),
            v.weight.to_string(),
            v.priority.clone(),
            percent(v.usage.share_10s),
            percent(v.usage.configured_share),
            v.sessions.len().to_string(),
            v.stats.kernels.to_string(),
            v.state.clone(),
        ]);
    }
    t.render()
}

fn device_table(devices: &[api::Device]) -> String {
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
        let sched = d.scheduling.as_ref();
        t.row(vec![
            d.name.clone(),
            d.kind.clone(),
            d.model.clone(),
            bytes(d.memory_used),
            bytes(d.memory_total),
            bytes(d.memory_sliced),
            d.utilization.map_or("-".into(), percent),
            or_dash(sched.map(|s| &s.policy)),
            sched.map_or("-".into(), |s| format!("{} ms", s.slice_ms)),
            d.vms.join(","),
        ]);
    }
    t.render()
}

fn gpu_table(report: &api::Inventory) -> String {
    let gpus = &report.gpus;
    if gpus.is_empty() {
        return format!(
            "No NVIDIA GPU found: {}\n",
            report.reason.as_deref().unwrap_or("NVML reported none")
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
        let mig = match g.mig_enabled {
            Some(true) => format!("on ({} instances)", g.mig_instances.len()),
            Some(false) => "off".into(),
            None => "-".into(),
        };
        t.row(vec![
            g.index.to_string(),
            or_dash(g.name.as_ref()),
            or_dash(g.uuid.as_ref()),
            or_dash(g.pci.as_ref()),
            g.memory_used.map_or("-".into(), bytes),
            g.memory_total.map_or("-".into(), bytes),
            g.utilization_gpu.map_or("-".into(), |u| format!("{u}%")),
            g.temperature_c.map_or("-".into(), |c| format!("{c}C")),
            g.power_w.map_or("-".into(), |w| format!("{w:.0} W")),
            mig,
            match (g.sriov_vfs, g.sriov_vfs_total) {
                (Some(n), Some(t)) => format!("{n}/{t}"),
                _ => "-".into(),
            },
        ]);
    }
    let mut out = format!(
        "NVIDIA driver {}\n",
        report.driver_version.as_deref().unwrap_or("?")
    );
    out += &t.render();
    for g in gpus {
        for m in &g.mig_instances {
            out += &format!(
                "  GPU {} MIG {}: {} {} {}\n",
                g.index,
                m.index,
                or_dash(m.name.as_ref()),
                or_dash(m.uuid.as_ref()),
                m.memory_total.map_or("-".into(), bytes)
            );
        }
    }
    out
}

fn session_table(v: &api::Vm) -> String {
    let mut t = Table::new(&[
        ("SESSION", Align::Right),
        ("PID", Align::Right),
        ("PROCESS", Align::Left),
        ("MEMORY", Align::Right),
        ("TRANSPORT", Align::Left),
    ]);
    for s in &v.sessions {
        t.row(vec![
            s.id.to_string(),
            s.pid.to_string(),
            s.process.clone(),
            bytes(s.memory_used),
            s.transport.clone(),
        ]);
    }
    t.render()
}

fn secs_ms(s: f64) -> String {
    format!("{:.2} ms", s * 1e3)
}

/// A number of seconds as JSON writes it (`300.0`).
fn secs(s: f64) -> String {
    Value::from(s).to_string()
}

/// `vgpuctl analyze` for people.
fn analysis_text(v: &api::Analysis) -> String {
    let mut out = String::new();
    let hs = &v.hotspots;
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
                h.device.clone(),
                h.waiting.clone(),
                h.running.clone(),
                format!("{:.2} s", h.last_hour_s),
                format!("{:.2} s", h.peak_minute_s),
                h.peak_minute_start.map_or("-".into(), |t| {
                    let hm = (t % 86_400) / 60;
                    format!("{:02}:{:02} UTC", hm / 60, hm % 60)
                }),
            ]);
        }
        out += &t.render();
    }
    out += "\nbottlenecks:\n";
    if v.bottlenecks.is_empty() {
        out += "  none\n";
    }
    for b in &v.bottlenecks {
        out += &format!("  [{}] {}\n", b.kind, b.detail);
    }
    out += "\nrecommendations:\n";
    if v.recommendations.is_empty() {
        out += "  none\n";
    }
    for r in &v.recommendations {
        out += &format!("  {}\n", r.text);
    }
    let tu = &v.tuning;
    out += &format!(
        "\ntuning: mode {}, every {} s, {} rounds\n",
        tu.mode,
        secs(tu.interval_s),
        tu.runs
    );
    for c in &tu.latest {
        out += &format!(
            "  {} {}: weight {} → {}: {}\n",
            if c.applied { "changed" } else { "advised" },
            c.vm,
            c.from,
            c.to,
            c.reason
        );
    }
    out
}

/// The contention matrix and the waste of a device (`vgpuctl device show`).
fn device_detail(d: &api::Device) -> String {
    let Some(u) = &d.usage else {
        return "usage: -\n".into();
    };
    let mut out = format!(
        "utilization: {} (1s) {} (10s) {} (1 min) {} (10 min)\n\
         idle with work queued: {} (must stay 0); idle at fixed caps: {}; anticipation: {}; hand-over: {}\n\
         memory: {} free, {} in no slice, fragmentation {}\n",
        percent(u.utilization_1s),
        percent(u.utilization_10s),
        percent(u.utilization_60s),
        percent(u.utilization_10m),
        secs_ms(u.idle_with_work_s),
        secs_ms(u.idle_capped_s),
        secs_ms(u.anticipation_s),
        secs_ms(u.handover_s),
        bytes(u.memory_free),
        bytes(u.memory_unsliced),
        percent(u.fragmentation),
    );
    if let Some(e) = &d.execution_units {
        out += &format!(
            "execution units: {} busy of {}, {} kernel workers waiting for one\n",
            e.busy, e.total, e.waiting
        );
    }
    if !u.contention.is_empty() {
        let mut t = Table::new(&[
            ("WAITING", Align::Left),
            ("BEHIND", Align::Left),
            ("TOTAL", Align::Right),
            ("LAST HOUR", Align::Right),
            ("PEAK MINUTE", Align::Right),
        ]);
        for p in &u.contention {
            t.row(vec![
                p.waiting.clone(),
                p.running.clone(),
                format!("{:.2} s", p.total_s),
                format!("{:.2} s", p.last_hour_s),
                format!("{:.2} s", p.peak_minute_s),
            ]);
        }
        out += "\ncontention (time WAITING had a kernel ready while BEHIND ran):\n";
        out += &t.render();
    }
    out
}

/// A device counter of `stats`, `-` when the device does not report it.
fn counter(stats: &api::Counters, name: &str) -> String {
    or_dash(stats.get(name))
}

fn vm_detail(v: &api::Vm) -> String {
    let mut out = vm_table(std::slice::from_ref(v));
    let u = &v.usage;
    out += &format!(
        "\nshare: {} (1s) {} (10s) {} (1 min) {} (10 min), configured {}; busy {:.1} s\n",
        percent(u.share_1s),
        percent(u.share_10s),
        percent(u.share_60s),
        percent(u.share_10m),
        percent(u.configured_share),
        u.busy_s,
    );
    let target = u
        .target_wait_p99_s
        .map_or(String::new(), |t| format!(" (target {})", secs_ms(t)));
    out += &format!(
        "launch-to-start wait: p50 {} p90 {} p99 {}{target}; deadline misses {}; think time {}\n",
        secs_ms(u.queue_wait_p50_s),
        secs_ms(u.queue_wait_p90_s),
        secs_ms(u.queue_wait_p99_s),
        u.deadline_misses,
        secs_ms(u.think_time_s),
    );
    out += &format!(
        "memory: {} used, peak {}, 24 h high-water {}, slice {}\n",
        bytes(u.memory_used),
        bytes(u.memory_peak),
        bytes(u.memory_high_water_24h),
        bytes(u.memory_limit),
    );
    if let Some(t) = &v.tuning {
        out += &format!(
            "tuning: mode {}, weight {} (baseline {}, bounds {}–{}){}\n",
            t.mode,
            v.weight,
            t.baseline_weight,
            t.weight_min,
            t.weight_max,
            t.last_change.as_ref().map_or(String::new(), |c| format!(
                "; last change {} → {}: {}",
                c.from, c.to, c.reason
            )),
        );
    }
    if let Some(mp) = &v.memory_placement {
        out += &format!(
            "placement: {} on the device ({} borrowed past the reservation of {}), {} overflowed to host (overflow {}, limit {}); demotions {} ({}), promotions {} ({})\n",
            bytes(mp.device_bytes),
            bytes(mp.borrowed_bytes),
            bytes(mp.reserved),
            bytes(mp.host_bytes),
            mp.overflow,
            bytes(mp.overflow_limit),
            mp.demotions,
            bytes(mp.demoted_bytes),
            mp.promotions,
            bytes(mp.promoted_bytes),
        );
    }
    let k = &v.memory_by_kind;
    out += &format!(
        "memory by kind: plain {}, pools {} reserved ({} in use), managed {}, mapped host {}, VMM physical {}\n",
        bytes(k.plain),
        bytes(k.pool_reserved),
        bytes(k.pool_used),
        bytes(k.managed),
        bytes(k.mapped_host),
        bytes(k.vmm_physical),
    );
    let st = &v.stats;
    out += &format!(
        "copies: {} to the device, {} from it; errors {}; sessions opened {}; module loads stopped at the watchdog {}\n",
        bytes(st.bytes_htod),
        bytes(st.bytes_dtoh),
        st.errors,
        st.sessions_total,
        st.module_loads_stopped,
    );
    if let Some(p) = &v.unix_socket {
        out += &format!("unix socket: {p}\n");
    }
    if let Some(vs) = &v.vsock {
        out += &format!(
            "vsock: cid {} on {} ({} open connections, {} device resets)\n",
            vs.guest_cid,
            vs.socket,
            counter(&vs.stats, "connections_open"),
            counter(&vs.stats, "device_resets"),
        );
    }
    if let Some(vd) = &v.vgpu_device {
        let st = &vd.stats;
        out += &format!(
            "virtio-vgpu device: ID {} on {} ({} open sessions; {} in place from the guest, {} to it; \
             {} device resets, {} pauses, {} resumed)\n",
            vd.device_id,
            vd.socket,
            counter(st, "sessions_open"),
            st.get("bytes_from_guest").map_or("-".into(), |b| bytes(*b)),
            st.get("bytes_to_guest").map_or("-".into(), |b| bytes(*b)),
            counter(st, "device_resets"),
            counter(st, "pauses"),
            counter(st, "resumes"),
        );
    }
    if !v.sessions.is_empty() {
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
                let i: api::Info = typed(&info)?;
                println!(
                    "vgpud {} (pid {}, protocol {}), up {}",
                    i.version,
                    i.pid,
                    i.protocol_version,
                    duration(i.uptime_s),
                );
                println!("config: {}", i.config);
                if let Some(m) = &i.metrics_listen {
                    println!("metrics: http://{m}/metrics");
                }
                if let Some(a) = &i.audit_log {
                    println!("audit log: {a}");
                }
                println!();
                print!("{}", device_table(&typed::<Vec<api::Device>>(&devices)?));
                println!();
                print!("{}", vm_table(&typed::<Vec<api::Vm>>(&vms)?));
                return Ok(());
            }
            json!({ "daemon": info, "devices": devices, "vms": vms })
        }
        Command::Device { command } => match command {
            DeviceCommand::List => {
                let devices = c.get("/v1/devices")?;
                let gpus = c.get("/v1/gpus")?;
                if !cli.json {
                    print!("{}", device_table(&typed::<Vec<api::Device>>(&devices)?));
                    println!();
                    print!("{}", gpu_table(&typed(&gpus)?));
                    return Ok(());
                }
                json!({ "devices": devices, "gpus": gpus })
            }
            DeviceCommand::Show { name } => {
                let d = c.get(&format!("/v1/devices/{name}"))?;
                if !cli.json {
                    let dev: api::Device = typed(&d)?;
                    print!("{}", device_table(std::slice::from_ref(&dev)));
                    println!(
                        "uuid {}; batch class keeps at least {}% of the device",
                        dev.uuid,
                        or_dash(dev.scheduling.as_ref().map(|s| s.batch_min_share))
                    );
                    print!("{}", device_detail(&dev));
                    return Ok(());
                }
                d
            }
            DeviceCommand::Set(a) => {
                let body = api::SchedulingUpdate {
                    policy: a.policy.clone(),
                    slice_ms: a.slice_ms,
                    batch_min_share: a.batch_min_share,
                };
                if body.is_empty() && a.overcommit.is_none() {
                    return Err(CliError::Failed(
                        "nothing to change: give --policy, --slice-ms, --batch-min-share and/or --overcommit"
                            .into(),
                    ));
                }
                // JSON: the reply of each change made, under its name when there are two.
                let mut replies = serde_json::Map::new();
                if let Some(oc) = a.overcommit {
                    let update = api::DeviceUpdate {
                        overcommit: Some(oc),
                    };
                    let d = c.patch(&format!("/v1/devices/{}", a.name), &update)?;
                    if !cli.json {
                        let dev: api::Device = typed(&d)?;
                        let now = dev.memory_placement.and_then(|p| p.overcommit);
                        println!("device {}: overcommit {}", a.name, or_dash(now));
                    }
                    replies.insert("device".into(), d);
                }
                if !body.is_empty() {
                    let s = c.patch(&format!("/v1/devices/{}/scheduling", a.name), &body)?;
                    if !cli.json {
                        let sched: api::Scheduling = typed(&s)?;
                        println!(
                            "device {}: policy {}, slice {} ms, batch minimum share {}%",
                            a.name, sched.policy, sched.slice_ms, sched.batch_min_share
                        );
                    }
                    replies.insert("scheduling".into(), s);
                }
                if !cli.json {
                    return Ok(());
                }
                if replies.len() == 1 {
                    replies
                        .into_iter()
                        .map(|(_, v)| v)
                        .next()
                        .unwrap_or(Value::Null)
                } else {
                    Value::Object(replies)
                }
            }
        },
        Command::Vm { command } => match command {
            VmCommand::List => {
                let vms = c.get("/v1/vms")?;
                if !cli.json {
                    print!("{}", vm_table(&typed::<Vec<api::Vm>>(&vms)?));
                    return Ok(());
                }
                vms
            }
            VmCommand::Show { name } => {
                let v = c.get(&format!("/v1/vms/{name}"))?;
                if !cli.json {
                    print!("{}", vm_detail(&typed(&v)?));
                    return Ok(());
                }
                v
            }
            VmCommand::Add(a) => {
                let path =
                    |p: &Option<PathBuf>| p.as_ref().map(|p| p.to_string_lossy().into_owned());
                let body = api::VmEntry {
                    name: a.name.clone(),
                    memory: a.memory.clone().map(api::Size::Text),
                    profile: a.profile.clone(),
                    socket_owner: a.socket_owner.clone(),
                    device: a.device.clone(),
                    weight: a.weight,
                    priority: a.priority.map(|p| p.as_str().into()),
                    unix_socket: path(&a.unix_socket),
                    vhost_user_socket: path(&a.vhost_user_socket),
                    guest_cid: a.guest_cid,
                    vsock_uds_path: path(&a.vsock_uds_path),
                    ..Default::default()
                };
                let v = c.post("/v1/vms", &body)?;
                if !cli.json {
                    let vm: api::Vm = typed(&v)?;
                    println!(
                        "VM {} added: {} slice on {}",
                        a.name,
                        bytes(vm.memory_limit),
                        vm.device
                    );
                    return Ok(());
                }
                v
            }
            VmCommand::Remove { name } => {
                let r = c.delete(&format!("/v1/vms/{name}"))?;
                if !cli.json {
                    let r: api::Removal = typed(&r)?;
                    println!(
                        "VM {name} removed: {} session(s) ended, {} released{}",
                        r.sessions_ended,
                        bytes(r.memory_released),
                        if !r.complete {
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
                let body = api::VmUpdate {
                    memory: a.memory.clone().map(api::Size::Text),
                    reserved: a.reserved.clone().map(api::Size::Text),
                    overflow: a.overflow.map(|o| {
                        match o {
                            OverflowArg::None => "none",
                            OverflowArg::Host => "host",
                        }
                        .into()
                    }),
                    overflow_limit: a.overflow_limit.clone().map(api::Size::Text),
                    weight: a.weight,
                    priority: a.priority.map(|p| p.as_str().into()),
                    target_wait_p99: a.target_wait_p99.clone(),
                    min_share: a.min_share,
                    weight_min: a.weight_min,
                    weight_max: a.weight_max,
                    limits: None,
                };
                let v = c.patch(&format!("/v1/vms/{}", a.name), &body)?;
                if !cli.json {
                    let vm: api::Vm = typed(&v)?;
                    println!(
                        "VM {}: slice {}, weight {}, priority {}",
                        a.name,
                        bytes(vm.memory_limit),
                        vm.weight,
                        vm.priority
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
                let sessions = |v: &Value| typed::<api::Vm>(v).map(|vm| vm.sessions.len());
                if *wait {
                    let deadline = Instant::now() + Duration::from_secs(*timeout);
                    while sessions(&v)? > 0 {
                        if Instant::now() >= deadline {
                            return Err(CliError::Timeout(format!(
                                "VM {name} still has {} session(s) after {timeout} s; they keep running (new ones are refused); `vgpuctl vm remove {name}` ends them",
                                sessions(&v)?
                            )));
                        }
                        std::thread::sleep(DRAIN_POLL);
                        v = c.get(&format!("/v1/vms/{name}"))?;
                    }
                }
                if !cli.json {
                    let n = sessions(&v)?;
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
                print!("{}", analysis_text(&typed(&v)?));
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
                let report: api::ReloadReport = typed(&r)?;
                for (lines, label) in [
                    (&report.applied, "applied"),
                    (&report.refused, "REFUSED"),
                    (&report.restart_needed, "needs a restart"),
                ] {
                    for line in lines {
                        println!("{label}: {line}");
                    }
                }
                if report.is_empty() {
                    println!("nothing changed");
                }
                if !report.refused.is_empty() {
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
    use crate::api::ApiError;

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
        let a = api::Analysis {
            hotspots: vec![api::Hotspot {
                device: "gpu0".into(),
                waiting: "inference".into(),
                running: "training".into(),
                last_hour_s: 41.2,
                total_s: 50.0,
                peak_minute_start: Some(1_700_000_520),
                peak_minute_s: 9.8,
            }],
            bottlenecks: vec![api::Bottleneck {
                kind: "oversized_slice".into(),
                device: "gpu0".into(),
                vm: Some("training".into()),
                detail: "`training` has a 8 GiB slice and used at most 4.2 GiB in 24 h".into(),
            }],
            recommendations: vec![api::Recommendation {
                vm: "training".into(),
                setting: "memory".into(),
                from: 8 << 30,
                to: 5 << 30,
                text: "training: slice 8 GiB, peak 4.2 GiB in 24 h: shrink to 5 GiB".into(),
            }],
            tuning: api::TuningReport {
                mode: "advise".into(),
                interval_s: 300.0,
                runs: 12,
                latest: vec![api::WeightChange {
                    vm: "inference".into(),
                    from: 3,
                    to: 4,
                    reason: "p99 wait 9.0 ms vs target 5.0 ms".into(),
                    ..Default::default()
                }],
                history: vec![],
            },
        };
        let t = analysis_text(&a);
        for want in [
            "inference  training",
            "41.20 s",
            "22:22 UTC",
            "[oversized_slice]",
            "shrink to 5 GiB",
            "tuning: mode advise, every 300.0 s, 12 rounds",
            "advised inference: weight 3 → 4: p99 wait 9.0 ms vs target 5.0 ms",
        ] {
            assert!(t.contains(want), "{want:?} not in\n{t}");
        }
        let empty = analysis_text(&api::Analysis::default());
        assert!(
            empty.contains("none: no VM waited behind another"),
            "{empty}"
        );
        let vm = api::Vm {
            name: "inference".into(),
            weight: 4,
            usage: api::VmUsage {
                queue_wait_p99_s: 0.004,
                target_wait_p99_s: Some(0.005),
                memory_peak: 1 << 30,
                share_10m: 0.3,
                ..Default::default()
            },
            tuning: Some(api::VmTuning {
                mode: "auto".into(),
                baseline_weight: 3,
                weight_min: 1,
                weight_max: 12,
                last_change: Some(api::WeightChange {
                    from: 3,
                    to: 4,
                    reason: "p99 wait 9.0 ms vs target 5.0 ms".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let d = vm_detail(&vm);
        assert!(d.contains("p99 4.00 ms (target 5.00 ms)"), "{d}");
        assert!(
            d.contains(
                "tuning: mode auto, weight 4 (baseline 3, bounds 1–12); last change 3 → 4: p99 wait"
            ),
            "{d}"
        );
        let dev = api::Device {
            execution_units: Some(api::ExecutionUnits {
                total: 2,
                busy: 2,
                waiting: 3,
            }),
            usage: Some(api::DeviceUsage {
                fragmentation: 0.5,
                contention: vec![api::ContentionUsage {
                    waiting: "a".into(),
                    running: "b".into(),
                    total_s: 1.5,
                    last_hour_s: 1.5,
                    peak_minute_s: 1.0,
                    peak_minute_start: None,
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let d = device_detail(&dev);
        assert!(
            d.contains("idle with work queued: 0.00 ms (must stay 0)")
                && d.contains("1.50 s")
                && d.contains("execution units: 2 busy of 2, 3 kernel workers waiting for one"),
            "{d}"
        );
    }

    #[test]
    fn tables_show_what_operators_look_for() {
        let vm = api::Vm {
            name: "vm1".into(),
            device: "gpu0".into(),
            memory_used: 16 << 20,
            memory_limit: 64 << 20,
            weight: 3,
            priority: "normal".into(),
            state: "running".into(),
            usage: api::VmUsage {
                configured_share: 0.75,
                ..Default::default()
            },
            sessions: vec![api::Session {
                id: 4,
                pid: 99,
                process: "train".into(),
                memory_used: 16 << 20,
                transport: "unix:/s".into(),
                started: 0,
            }],
            stats: api::VmStats {
                kernels: 12,
                bytes_htod: 1024,
                sessions_total: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        let t = vm_table(std::slice::from_ref(&vm));
        assert!(
            t.contains("16 MiB") && t.contains("64 MiB") && t.contains("75%"),
            "{t}"
        );
        let d = vm_detail(&vm);
        assert!(d.contains("train") && d.contains("99"), "{d}");
        assert!(!d.contains("virtio-vgpu"), "{d}");
        let mut dev = vm.clone();
        dev.vgpu_device = Some(api::VmVgpuDevice {
            device_id: 21,
            socket: "/run/vgpu/vm1.vgpu.sock".into(),
            stats: [
                ("sessions_open", 2),
                ("bytes_from_guest", 3 << 20),
                ("bytes_to_guest", 0),
                ("device_resets", 1),
                ("pauses", 4),
                ("resumes", 3),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        });
        let d = vm_detail(&dev);
        assert!(
            d.contains(
                "virtio-vgpu device: ID 21 on /run/vgpu/vm1.vgpu.sock (2 open sessions; 3 MiB"
            ) && d.contains("1 device resets, 4 pauses, 3 resumed"),
            "{d}"
        );
        let g = gpu_table(&api::Inventory {
            reason: Some("no NVIDIA driver found: x".into()),
            ..Default::default()
        });
        assert_eq!(g, "No NVIDIA GPU found: no NVIDIA driver found: x\n");
        let g = gpu_table(&api::Inventory {
            nvml: true,
            driver_version: Some("550.54".into()),
            reason: None,
            gpus: vec![api::Gpu {
                index: 0,
                name: Some("NVIDIA H100".into()),
                uuid: Some("GPU-1".into()),
                pci: Some("0000:3b:00.0".into()),
                memory_total: Some(80 << 30),
                memory_used: Some(1 << 30),
                utilization_gpu: Some(12),
                temperature_c: Some(40),
                power_w: Some(71.5),
                mig_enabled: Some(true),
                mig_instances: vec![api::MigInstance {
                    index: 0,
                    name: Some("1g.10gb".into()),
                    uuid: Some("MIG-1".into()),
                    memory_total: Some(10 << 30),
                }],
                sriov_vfs: Some(0),
                sriov_vfs_total: Some(16),
                ..Default::default()
            }],
        });
        assert!(
            g.contains("NVIDIA driver 550.54")
                && g.contains("on (1 instances)")
                && g.contains("MIG-1")
                && g.contains("0/16"),
            "{g}"
        );
    }
}
