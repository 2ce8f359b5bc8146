//! The vgpud configuration file (TOML): devices, VMs and the admin socket.
//!
//! Errors name `file:line` and say how to fix the entry (design.md §3).
//!
//! This crate is plain data and rules, with no broker inside: vgpud reads its
//! file with it and hands the broker what it needs, and `vgpuctl` reads the
//! same file to check it and to find the VMs' devices and sockets.
//! - [`memory`]: the `[memory]` table and each VM's reservation and overflow;
//! - [`limits`]: the per-VM budgets (`[limits]`, `[vm.limits]`);
//! - [`size`]: byte sizes as the file writes them (`2GiB`);
//! - [`reload`]: a configuration rendered back to TOML, live changes checked
//!   with the file's rules, and the diff a reload applies.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::limits::{
    MAX_GRAPH_BYTES, MAX_HANDLES, MAX_INTERPRETER_BYTES, MAX_MODULE_BYTES, MAX_MODULES,
    MAX_QUEUED_BYTES, MAX_SESSIONS, MIN_INTERPRETER_BYTES, MIN_QUEUED_BYTES, VmLimits,
};
use crate::size::parse_size;

pub mod limits;
pub mod memory;
pub mod reload;
pub mod size;

pub use memory::{MemoryConfig, Overcommit, Overflow, VmMemory};

/// Default memory of a simulated device.
pub const DEFAULT_SIM_MEMORY: u64 = 8 << 30;
/// Name of the device created when the file declares none.
pub const DEFAULT_DEVICE_NAME: &str = "gpu0";
/// Default kernel watchdog.
pub const DEFAULT_WATCHDOG: Duration = Duration::from_secs(30);
/// Longest kernel watchdog a config may set (`watchdog_ms`): the watchdog
/// cannot be disabled, or one kernel could hold the device forever.
pub const MAX_WATCHDOG_MS: u64 = 3_600_000;
/// Default compute weight of a VM.
pub const DEFAULT_WEIGHT: u32 = 1;
/// Largest accepted weight.
pub const MAX_WEIGHT: u32 = 10_000;
/// Lowest CID a guest may have (0–2 are reserved by vsock).
pub const MIN_GUEST_CID: u64 = 3;
/// Virtio device ID of the virtio-vgpu device when `vgpu_device_id` is not given: the last ID the
/// virtio PCI transport carries (PCI device 0x107f), far from the IDs the VIRTIO spec assigns.
pub const DEFAULT_VGPU_DEVICE_ID: u16 = 63;
/// The `vgpu_device_id` to use with QEMU: its generic `vhost-user-test-device-pci` presents only
/// IDs it has a name for (see [`qemu_presents_device_id`]), all assigned by the spec; 21 (the
/// spec's Signal Distribution Module) has no Linux driver and no QEMU device. The guest module
/// binds it besides the default.
pub const QEMU_VGPU_DEVICE_ID: u16 = 21;
/// Largest virtio device ID of a PCI device (Linux binds PCI device IDs 0x1040 + 0..=63).
pub const MAX_VGPU_DEVICE_ID: u16 = 63;
/// Virtqueues of the virtio-vgpu device (control, submission): what the VMM must set up.
pub const VGPU_QUEUES: usize = 2;
/// Size of each virtqueue of the virtio-vgpu device the VMM should ask for.
pub const VGPU_QUEUE_SIZE: u16 = 1024;
/// Bytes of the virtio-vgpu config space (a VMM's generic device must be told).
pub const VGPU_CONFIG_SIZE: usize = 96;

/// Whether QEMU's `vhost-user-test-device-pci` can present virtio device ID `id`: QEMU (11.1.3,
/// probed) aborts on IDs missing from its table of device names (`virtio_id_to_name`).
pub fn qemu_presents_device_id(id: u16) -> bool {
    matches!(id, 1..=13 | 16..=41 | 45)
}

/// Which device vgpud serves on a VM's `vhost_user_socket`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeviceModel {
    /// virtio-vsock (ID 19): stock guests, the GPU at a vsock port.
    #[default]
    Vsock,
    /// The dedicated virtio-vgpu device: the `vgpu` guest module, zero-copy transfers.
    Vgpu {
        /// Its virtio device ID (the VMM presents it; the guest module binds it).
        device_id: u16,
    },
}

impl DeviceModel {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceModel::Vsock => "vsock",
            DeviceModel::Vgpu { .. } => "vgpu",
        }
    }
}

/// A configuration error, displayed as `file:line: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// 1-based line, 0 when the error has no position.
    pub line: usize,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line > 0 {
            write!(f, "{}:{}: {}", self.path.display(), self.line, self.message)
        } else {
            write!(f, "{}: {}", self.path.display(), self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// What executes a device's work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceKind {
    /// The built-in simulated GPU.
    Sim,
    /// A real GPU through the CUDA driver.
    Cuda {
        /// Device ordinal.
        index: Option<u32>,
        /// `GPU-…` or `MIG-…` UUID.
        uuid: Option<String>,
    },
}

/// A `[[device]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Unique name VMs refer to.
    pub name: String,
    /// Executor.
    pub kind: DeviceKind,
    /// Simulated device memory in bytes (sim only).
    pub memory: u64,
    /// Worker threads of the simulated GPU (sim only; default: CPU count).
    pub workers: Option<usize>,
    /// Kernels running longer fail with `CUDA_ERROR_LAUNCH_TIMEOUT` (None: no limit).
    pub watchdog: Option<Duration>,
    /// How the device's compute time is shared.
    pub scheduling: SchedulingConfig,
    /// How far the slices of its VMs may add up past its memory.
    pub overcommit: Overcommit,
}

/// Default time slice.
pub const DEFAULT_SLICE: Duration = Duration::from_millis(2);
/// Shortest time slice.
pub const MIN_SLICE: Duration = Duration::from_millis(1);
/// Longest time slice.
pub const MAX_SLICE: Duration = Duration::from_millis(100);
/// Default minimum share of the `batch` class, in percent of device time.
pub const DEFAULT_BATCH_MIN_SHARE: u32 = 5;
/// Largest minimum share of the `batch` class, in percent.
pub const MAX_BATCH_MIN_SHARE: u32 = 50;

/// Scheduling policy of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Weighted fair share, work-conserving.
    #[default]
    Fair,
    /// Hard caps: a VM never exceeds weight / total, even on an idle device.
    Fixed,
}

impl Policy {
    /// Parses `fair` or `fixed`.
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "fair" => Some(Policy::Fair),
            "fixed" => Some(Policy::Fixed),
            _ => None,
        }
    }

    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Fair => "fair",
            Policy::Fixed => "fixed",
        }
    }
}

/// Scheduling settings of a device (`policy`, `slice_ms`, `batch_min_share`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulingConfig {
    /// Policy.
    pub policy: Policy,
    /// Time slice.
    pub slice: Duration,
    /// Minimum share of device time the `batch` class keeps, in percent.
    pub batch_min_share: u32,
}

impl Default for SchedulingConfig {
    fn default() -> Self {
        Self {
            policy: Policy::Fair,
            slice: DEFAULT_SLICE,
            batch_min_share: DEFAULT_BATCH_MIN_SHARE,
        }
    }
}

/// A time of day, minutes after local midnight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TimeOfDay(pub u16);

impl TimeOfDay {
    /// Parses `HH:MM` (00:00 to 24:00).
    pub fn parse(s: &str) -> Option<TimeOfDay> {
        let (h, m) = s.split_once(':')?;
        if h.len() != 2 || m.len() != 2 {
            return None;
        }
        let (h, m): (u16, u16) = (h.parse().ok()?, m.parse().ok()?);
        (m < 60 && (h < 24 || (h == 24 && m == 0))).then_some(TimeOfDay(h * 60 + m))
    }
}

impl std::fmt::Display for TimeOfDay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:02}:{:02}", self.0 / 60, self.0 % 60)
    }
}

/// A weight that applies during a window of local time (`[[vm.schedule]]`).
/// A window whose `to` is earlier than its `from` wraps past midnight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightWindow {
    /// Start (inclusive).
    pub from: TimeOfDay,
    /// End (exclusive).
    pub to: TimeOfDay,
    /// Weight during the window.
    pub weight: u32,
}

impl WeightWindow {
    /// Whether `t` lies in the window.
    pub fn contains(&self, t: TimeOfDay) -> bool {
        if self.from <= self.to {
            self.from <= t && t < self.to
        } else {
            t >= self.from || t < self.to
        }
    }
}

/// How a VM gets its GPU.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum VmMode {
    /// Shares a device through vgpud (slices and time-sliced compute).
    #[default]
    Shared,
    /// Owns a whole GPU or an SR-IOV virtual function through VFIO.
    Passthrough {
        /// PCI address, `DDDD:BB:DD.F`.
        pci: String,
    },
}

/// Scheduling class of a VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Preempts everything else.
    Realtime,
    /// The default.
    #[default]
    Normal,
    /// Runs when nothing else waits, with a guaranteed minimum share.
    Batch,
}

impl Priority {
    /// Parses `realtime`, `normal` or `batch`.
    pub fn parse(s: &str) -> Option<Priority> {
        match s {
            "realtime" => Some(Priority::Realtime),
            "normal" => Some(Priority::Normal),
            "batch" => Some(Priority::Batch),
            _ => None,
        }
    }

    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Realtime => "realtime",
            Priority::Normal => "normal",
            Priority::Batch => "batch",
        }
    }
}

/// A `[[vm]]` entry: a tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmConfig {
    /// Unique name.
    pub name: String,
    /// Name of its device.
    pub device: String,
    /// Memory slice in bytes (hard limit).
    pub memory: u64,
    /// Compute weight.
    pub weight: u32,
    /// Scheduling class.
    pub priority: Priority,
    /// Host-side unix socket listener.
    pub unix_socket: Option<PathBuf>,
    /// vhost-user socket for the VMM.
    pub vhost_user_socket: Option<PathBuf>,
    /// Guest CID (with `vhost_user_socket`).
    pub guest_cid: Option<u64>,
    /// Hybrid-vsock base path of the VM's vsock device: guest connections to
    /// ports other than the GPU port go to `<vsock_uds_path>_<port>`, and host
    /// programs reach guest ports by connecting here (`CONNECT <port>`).
    /// Defaults to `<dir of vhost_user_socket>/<name>.vsock`.
    pub vsock_uds_path: Option<PathBuf>,
    /// The device served on `vhost_user_socket` (vsock unless `device_model = "vgpu"`).
    pub device_model: DeviceModel,
    /// Weights by time of day (outside every window, `weight` applies).
    pub schedule: Vec<WeightWindow>,
    /// Shared (default) or passthrough.
    pub mode: VmMode,
    /// The `[[profile]]` it was created from: memory, weight and priority
    /// come from it unless the entry sets them.
    pub profile: Option<String>,
    /// `user[:group]` (names or numbers) that get the VM's sockets, mode
    /// 0660: the user a VMM runs as (libvirt's `libvirt-qemu`, KubeVirt's 107).
    pub socket_owner: Option<String>,
    /// Service targets and weight bounds for the tuning controller.
    pub tuning: VmTuning,
    /// Budgets besides memory: the config's `[limits]`, overridden by the
    /// VM's own `[vm.limits]` table.
    pub limits: VmLimits,
    /// Reservation and overflow (`reserved`, `overflow`, `overflow_limit`).
    pub memory_policy: VmMemory,
}

/// A VM's service targets and the bounds within which the tuning
/// controller may move its weight (docs/scheduling.md, "Auto-tuning").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmTuning {
    /// 99th percentile launch-to-start wait to stay under (`target_wait_p99`).
    pub target_wait_p99: Option<Duration>,
    /// Share of the device (percent) the VM should get while it has work
    /// queued (`min_share`).
    pub min_share: Option<u32>,
    /// Lowest weight the controller may set (`weight_min`, default 1).
    pub weight_min: Option<u32>,
    /// Highest weight the controller may set (`weight_max`, default four
    /// times the base weight).
    pub weight_max: Option<u32>,
}

impl VmTuning {
    /// Whether the VM has a service target.
    pub fn has_target(&self) -> bool {
        self.target_wait_p99.is_some() || self.min_share.is_some()
    }
}

/// What the tuning controller does (`[tuning] mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TuneMode {
    /// Nothing.
    #[default]
    Off,
    /// Computes the weight changes it would make and shows them as
    /// recommendations (`vgpuctl analyze`, `vm show`), changing nothing.
    Advise,
    /// Applies them.
    Auto,
}

impl TuneMode {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TuneMode::Off => "off",
            TuneMode::Advise => "advise",
            TuneMode::Auto => "auto",
        }
    }

    /// Parses the config spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "off" => Some(TuneMode::Off),
            "advise" => Some(TuneMode::Advise),
            "auto" => Some(TuneMode::Auto),
            _ => None,
        }
    }
}

/// Default `[tuning] tune_interval`.
pub const DEFAULT_TUNE_INTERVAL: Duration = Duration::from_secs(300);

/// The `[tuning]` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TuningConfig {
    /// `mode`.
    pub mode: TuneMode,
    /// `tune_interval`: how often the controller runs.
    pub interval: Duration,
}

impl Default for TuningConfig {
    fn default() -> Self {
        Self {
            mode: TuneMode::Off,
            interval: DEFAULT_TUNE_INTERVAL,
        }
    }
}

/// Parses a duration: a number with a unit `ms`, `s`, `min` or `h`
/// (`"5ms"`, `"30s"`, `"5min"`).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let secs = match unit.trim() {
        "us" => v * 1e-6,
        "ms" => v * 1e-3,
        "s" => v,
        "min" | "m" => v * 60.0,
        "h" => v * 3600.0,
        _ => return None,
    };
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

impl VmConfig {
    /// The weight at local time `t`.
    pub fn weight_at(&self, t: TimeOfDay) -> u32 {
        self.schedule
            .iter()
            .find(|w| w.contains(t))
            .map_or(self.weight, |w| w.weight)
    }
}

/// How much of its device a profile's memory slice is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProfileMemory {
    /// `"1/4"`: a fraction of the device's memory.
    Fraction {
        /// Numerator (1 ≤ num ≤ den).
        num: u32,
        /// Denominator (≤ [`MAX_PROFILE_DENOMINATOR`]).
        den: u32,
    },
    /// `"4GiB"`: a fixed size.
    Bytes(u64),
}

/// Largest denominator of a profile's memory fraction.
pub const MAX_PROFILE_DENOMINATOR: u32 = 64;

impl ProfileMemory {
    /// Parses `"N/D"` or a size.
    pub fn parse(s: &str) -> Result<ProfileMemory, String> {
        if let Some((n, d)) = s.split_once('/') {
            let (Ok(num), Ok(den)) = (n.trim().parse::<u32>(), d.trim().parse::<u32>()) else {
                return Err(format!("`{s}` is not a fraction: write N/D, e.g. \"1/4\""));
            };
            if num == 0 || den == 0 || num > den || den > MAX_PROFILE_DENOMINATOR {
                return Err(format!(
                    "`{s}`: a profile's fraction must be between 1/{MAX_PROFILE_DENOMINATOR} and 1/1"
                ));
            }
            return Ok(ProfileMemory::Fraction { num, den });
        }
        match parse_size(s) {
            Ok(0) => Err("a profile's memory must be larger than 0".into()),
            Ok(b) => Ok(ProfileMemory::Bytes(b)),
            Err(e) => Err(format!("{e}, or a fraction of the GPU such as \"1/4\"")),
        }
    }

    /// The slice on a device with `device_memory` bytes.
    pub fn bytes_of(self, device_memory: u64) -> u64 {
        match self {
            ProfileMemory::Fraction { num, den } => {
                (u128::from(device_memory) * u128::from(num) / u128::from(den)) as u64
            }
            ProfileMemory::Bytes(b) => b,
        }
    }

    /// The config spelling (`"1/4"`, or bytes).
    pub fn to_config_string(self) -> String {
        match self {
            ProfileMemory::Fraction { num, den } => format!("{num}/{den}"),
            ProfileMemory::Bytes(b) => format!("{b}B"),
        }
    }
}

/// A `[[profile]]` entry: a named vGPU size (memory slice and compute share),
/// like NVIDIA's vGPU profiles. VMs name it with `profile = "…"`; the
/// Kubernetes device plugin offers one resource per profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileConfig {
    /// Unique name (`q4`); the device plugin's resource is `vgpu.io/<name>`.
    pub name: String,
    /// Memory slice.
    pub memory: ProfileMemory,
    /// Compute weight.
    pub weight: u32,
    /// Scheduling class.
    pub priority: Priority,
}

/// The `[admin]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminConfig {
    /// REST/JSON admin socket.
    pub socket: Option<PathBuf>,
    /// Address of the Prometheus text endpoint (`127.0.0.1:9400`).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Append-only JSON-lines audit log.
    pub audit_log: Option<PathBuf>,
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The file it came from.
    pub path: PathBuf,
    /// `[admin]`.
    pub admin: AdminConfig,
    /// `[[device]]` entries (at least one).
    pub devices: Vec<DeviceConfig>,
    /// `[[vm]]` entries.
    pub vms: Vec<VmConfig>,
    /// `[[profile]]` entries.
    pub profiles: Vec<ProfileConfig>,
    /// `[tuning]`.
    pub tuning: TuningConfig,
    /// `[limits]`: every VM's budgets unless its own `[vm.limits]` says otherwise.
    pub limits: VmLimits,
    /// `[memory]`.
    pub memory: MemoryConfig,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawSize {
    Bytes(u64),
    Text(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    admin: Option<RawAdmin>,
    limits: Option<RawLimits>,
    #[serde(default)]
    device: Vec<Spanned<RawDevice>>,
    #[serde(default)]
    vm: Vec<Spanned<RawVm>>,
    #[serde(default)]
    profile: Vec<Spanned<RawProfile>>,
    tuning: Option<RawTuning>,
    memory: Option<RawMemory>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMemory {
    host_overflow_budget: Option<Spanned<RawSize>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    name: Spanned<String>,
    memory: Spanned<RawSize>,
    weight: Option<Spanned<u32>>,
    priority: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTuning {
    mode: Option<Spanned<String>>,
    tune_interval: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    socket: Option<Spanned<PathBuf>>,
    metrics_listen: Option<Spanned<String>>,
    audit_log: Option<Spanned<PathBuf>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDevice {
    name: Spanned<String>,
    kind: Spanned<String>,
    memory: Option<Spanned<RawSize>>,
    index: Option<Spanned<u32>>,
    uuid: Option<Spanned<String>>,
    workers: Option<Spanned<u32>>,
    watchdog_ms: Option<Spanned<u64>>,
    policy: Option<Spanned<String>>,
    slice_ms: Option<Spanned<u64>>,
    batch_min_share: Option<Spanned<u32>>,
    overcommit: Option<Spanned<f64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWindow {
    from: Spanned<String>,
    to: Spanned<String>,
    weight: Spanned<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVm {
    name: Spanned<String>,
    device: Option<Spanned<String>>,
    memory: Option<Spanned<RawSize>>,
    weight: Option<Spanned<u32>>,
    priority: Option<Spanned<String>>,
    unix_socket: Option<Spanned<PathBuf>>,
    vhost_user_socket: Option<Spanned<PathBuf>>,
    guest_cid: Option<Spanned<u64>>,
    vsock_uds_path: Option<Spanned<PathBuf>>,
    device_model: Option<Spanned<String>>,
    vgpu_device_id: Option<Spanned<u16>>,
    #[serde(default)]
    schedule: Vec<Spanned<RawWindow>>,
    mode: Option<Spanned<String>>,
    pci: Option<Spanned<String>>,
    profile: Option<Spanned<String>>,
    socket_owner: Option<Spanned<String>>,
    target_wait_p99: Option<Spanned<String>>,
    min_share: Option<Spanned<u32>>,
    weight_min: Option<Spanned<u32>>,
    weight_max: Option<Spanned<u32>>,
    reserved: Option<Spanned<RawSize>>,
    overflow: Option<Spanned<String>>,
    overflow_limit: Option<Spanned<RawSize>>,
    limits: Option<RawLimits>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    sessions: Option<Spanned<u32>>,
    connections: Option<Spanned<u32>>,
    modules: Option<Spanned<u32>>,
    module_bytes: Option<Spanned<RawSize>>,
    streams: Option<Spanned<u32>>,
    events: Option<Spanned<u32>>,
    handles: Option<Spanned<u32>>,
    queued_bytes: Option<Spanned<RawSize>>,
    graph_bytes: Option<Spanned<RawSize>>,
    interpreter_bytes: Option<Spanned<RawSize>>,
}

struct Ctx<'a> {
    path: &'a Path,
    src: &'a str,
}

impl Ctx<'_> {
    fn err(&self, span: Range<usize>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            path: self.path.to_path_buf(),
            line: line_of(self.src, span.start),
            message: message.into(),
        }
    }

    fn size(&self, v: &Spanned<RawSize>, what: &str) -> Result<u64, ConfigError> {
        match v.get_ref() {
            RawSize::Bytes(b) => Ok(*b),
            RawSize::Text(t) => {
                parse_size(t).map_err(|e| self.err(v.span(), format!("{what}: {e}")))
            }
        }
    }
}

fn line_of(src: &str, offset: usize) -> usize {
    src.as_bytes()[..offset.min(src.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let src = std::fs::read_to_string(path).map_err(|e| ConfigError {
            path: path.to_path_buf(),
            line: 0,
            message: format!("cannot read the config file: {e}"),
        })?;
        Config::parse(path, &src)
    }

    /// Validates config text; `path` is used in messages.
    pub fn parse(path: &Path, src: &str) -> Result<Config, ConfigError> {
        let cx = Ctx { path, src };
        let raw: RawConfig = toml::from_str(src).map_err(|e| ConfigError {
            path: path.to_path_buf(),
            line: e.span().map(|s| line_of(src, s.start)).unwrap_or(0),
            message: e.message().trim().to_string(),
        })?;

        let admin = parse_admin(&cx, raw.admin)?;

        let mut devices = Vec::new();
        let mut names = HashSet::new();
        for d in &raw.device {
            devices.push(parse_device(&cx, d, &mut names)?);
        }
        if devices.is_empty() {
            devices.push(DeviceConfig {
                name: DEFAULT_DEVICE_NAME.to_string(),
                kind: DeviceKind::Sim,
                memory: DEFAULT_SIM_MEMORY,
                workers: None,
                watchdog: Some(DEFAULT_WATCHDOG),
                scheduling: SchedulingConfig::default(),
                overcommit: Overcommit::default(),
            });
        }

        let mut profiles: Vec<ProfileConfig> = Vec::new();
        for p in &raw.profile {
            let p = parse_profile(&cx, p.get_ref())?;
            if profiles.iter().any(|x| x.name == p.name) {
                let span = raw.profile[profiles.len()].get_ref().name.span();
                return Err(cx.err(
                    span,
                    format!(
                        "a profile named `{}` is already defined; profile names must be unique",
                        p.name
                    ),
                ));
            }
            profiles.push(p);
        }

        let mut vms = Vec::new();
        let mut vm_names = HashSet::new();
        let mut cids = HashMap::new();
        let mut sockets = HashSet::new();
        let mut pcis: HashMap<String, String> = HashMap::new();
        if let Some(s) = &admin.socket {
            sockets.insert(s.clone());
        }
        let limits = match &raw.limits {
            Some(l) => parse_limits(&cx, VmLimits::default(), l, "limits")?,
            None => VmLimits::default(),
        };
        for v in &raw.vm {
            let vm = parse_vm(&cx, v, &devices, &profiles, &limits)?;
            if !vm_names.insert(vm.name.clone()) {
                return Err(cx.err(
                    v.get_ref().name.span(),
                    format!(
                        "a VM named `{}` is already defined; VM names must be unique",
                        vm.name
                    ),
                ));
            }
            if let Some(cid) = vm.guest_cid
                && let Some(other) = cids.insert(cid, vm.name.clone())
            {
                let span = v
                    .get_ref()
                    .guest_cid
                    .as_ref()
                    .map_or(v.span(), |c| c.span());
                return Err(cx.err(span, format!("guest_cid {cid} is already used by VM `{other}`; every VM needs its own CID")));
            }
            for (p, span) in [
                (
                    &vm.unix_socket,
                    v.get_ref().unix_socket.as_ref().map(|s| s.span()),
                ),
                (
                    &vm.vhost_user_socket,
                    v.get_ref().vhost_user_socket.as_ref().map(|s| s.span()),
                ),
                (
                    &vm.vsock_uds_path,
                    v.get_ref().vsock_uds_path.as_ref().map(|s| s.span()),
                ),
            ] {
                if let Some(p) = p
                    && !sockets.insert(p.clone())
                {
                    return Err(cx.err(
                        span.unwrap_or(v.span()),
                        format!(
                            "socket path {} is used twice; give each listener its own path",
                            p.display()
                        ),
                    ));
                }
            }
            if let VmMode::Passthrough { pci } = &vm.mode
                && let Some(other) = pcis.insert(pci.clone(), vm.name.clone())
            {
                let span = v.get_ref().pci.as_ref().map_or(v.span(), |p| p.span());
                return Err(cx.err(
                        span,
                        format!("PCI device {pci} is already assigned to VM `{other}`; a device or VF can be passed through to one VM only"),
                    ));
            }
            vms.push(vm);
        }

        let tuning = parse_tuning(&cx, raw.tuning.as_ref())?;
        let memory = parse_memory(&cx, raw.memory.as_ref())?;
        let config = Config {
            path: path.to_path_buf(),
            admin,
            devices,
            vms,
            profiles,
            tuning,
            limits,
            memory,
        };
        // Slices and reservations must fit the devices whose memory is known
        // now (simulated ones); a real GPU's are checked once it is open.
        let known = |d: &str| {
            config
                .devices
                .iter()
                .find(|x| x.name == d && x.kind == DeviceKind::Sim)
                .map(|x| x.memory)
        };
        if let Err(e) = config.check_memory_fit(known) {
            let span = raw
                .vm
                .iter()
                .find(|v| v.get_ref().name.get_ref() == &e.vm)
                .map_or(0..0, |v| v.span());
            return Err(cx.err(span, e.message));
        }
        Ok(config)
    }

    /// Checks that on every device whose memory `total` knows, the slices add up to at most
    /// `overcommit` times its memory and the reservations to at most its memory.
    pub fn check_memory_fit(
        &self,
        total: impl Fn(&str) -> Option<u64>,
    ) -> Result<(), memory::FitError> {
        for d in &self.devices {
            let Some(t) = total(&d.name) else { continue };
            let vms: Vec<memory::SliceOf<'_>> = self
                .vms
                .iter()
                .filter(|v| v.mode == VmMode::Shared && v.device == d.name)
                .map(|v| memory::SliceOf {
                    name: &v.name,
                    memory: v.memory,
                    reserved: v.memory_policy.reserved,
                })
                .collect();
            memory::check_device_fit(&d.name, t, d.overcommit, &vms)?;
        }
        Ok(())
    }

    /// A profile by name.
    pub fn profile(&self, name: &str) -> Option<&ProfileConfig> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// Gives VMs whose slice is a fraction of a device the config cannot
    /// size (a real GPU) their memory, from `total(device)` (the device's
    /// memory as the driver reports it). vgpud calls this once its devices
    /// are open; VMs of simulated devices are sized when parsed.
    pub fn resolve_profile_memory(
        &mut self,
        total: impl Fn(&str) -> Option<u64>,
    ) -> Result<(), String> {
        for vm in &mut self.vms {
            if vm.mode != VmMode::Shared || vm.memory != 0 {
                continue;
            }
            let Some(p) = vm
                .profile
                .as_deref()
                .and_then(|n| self.profiles.iter().find(|p| p.name == n))
            else {
                continue;
            };
            let Some(t) = total(&vm.device) else {
                return Err(format!(
                    "VM `{}`: device `{}` is not open, so profile `{}` cannot be sized",
                    vm.name, vm.device, p.name
                ));
            };
            vm.memory = p.memory.bytes_of(t);
            if vm.memory == 0 {
                return Err(format!(
                    "VM `{}`: profile `{}` gives a slice of 0 bytes on device `{}`",
                    vm.name, p.name, vm.device
                ));
            }
            let mp = &mut vm.memory_policy;
            if mp.overflow == Overflow::Host && mp.overflow_limit == 0 {
                mp.overflow_limit = vm.memory;
            }
            mp.check(vm.memory)
                .map_err(|(_, m)| format!("VM `{}`: {m}", vm.name))?;
        }
        self.check_memory_fit(&total).map_err(|e| e.message)
    }
}

fn parse_profile(cx: &Ctx<'_>, r: &RawProfile) -> Result<ProfileConfig, ConfigError> {
    let name = r.name.get_ref().clone();
    if !valid_name(&name) || name.contains('.') || name.contains('_') || name.len() > 40 {
        return Err(cx.err(
            r.name.span(),
            format!("profile name `{name}` is invalid: use 1-40 letters, digits or '-' (it becomes the Kubernetes resource vgpu.io/<name>)"),
        ));
    }
    let memory = match r.memory.get_ref() {
        RawSize::Bytes(0) => {
            return Err(cx.err(r.memory.span(), "a profile's memory must be larger than 0"));
        }
        RawSize::Bytes(b) => ProfileMemory::Bytes(*b),
        RawSize::Text(t) => {
            ProfileMemory::parse(t).map_err(|e| cx.err(r.memory.span(), format!("memory: {e}")))?
        }
    };
    let weight = match &r.weight {
        Some(w) if !(1..=MAX_WEIGHT).contains(w.get_ref()) => {
            return Err(cx.err(
                w.span(),
                format!("weight must be between 1 and {MAX_WEIGHT}"),
            ));
        }
        Some(w) => *w.get_ref(),
        None => DEFAULT_WEIGHT,
    };
    let priority = match &r.priority {
        Some(p) => Priority::parse(p.get_ref()).ok_or_else(|| {
            cx.err(
                p.span(),
                format!(
                    "unknown priority `{}`: use \"realtime\", \"normal\" or \"batch\"",
                    p.get_ref()
                ),
            )
        })?,
        None => Priority::Normal,
    };
    Ok(ProfileConfig {
        name,
        memory,
        weight,
        priority,
    })
}

fn parse_device(
    cx: &Ctx<'_>,
    d: &Spanned<RawDevice>,
    names: &mut HashSet<String>,
) -> Result<DeviceConfig, ConfigError> {
    let r = d.get_ref();
    let name = r.name.get_ref().clone();
    if !valid_name(&name) {
        return Err(cx.err(
            r.name.span(),
            format!("device name `{name}` is invalid: use 1-64 letters, digits, '-', '_' or '.'"),
        ));
    }
    if !names.insert(name.clone()) {
        return Err(cx.err(
            r.name.span(),
            format!("a device named `{name}` is already defined; device names must be unique"),
        ));
    }
    let kind = match r.kind.get_ref().as_str() {
        "sim" => {
            if let Some(i) = &r.index {
                return Err(cx.err(
                    i.span(),
                    "`index` applies to kind = \"cuda\" only; remove it",
                ));
            }
            if let Some(u) = &r.uuid {
                return Err(cx.err(
                    u.span(),
                    "`uuid` applies to kind = \"cuda\" only; remove it",
                ));
            }
            DeviceKind::Sim
        }
        "cuda" => {
            if let Some(m) = &r.memory {
                return Err(cx.err(m.span(), "`memory` applies to kind = \"sim\" only: a real GPU has the memory it has; remove it"));
            }
            if let Some(w) = &r.workers {
                return Err(cx.err(
                    w.span(),
                    "`workers` applies to kind = \"sim\" only; remove it",
                ));
            }
            if r.index.is_some() && r.uuid.is_some() {
                return Err(cx.err(
                    d.span(),
                    "give either `index` or `uuid` for a cuda device, not both",
                ));
            }
            if let Some(u) = &r.uuid {
                let s = u.get_ref();
                if !(s.starts_with("GPU-") || s.starts_with("MIG-")) {
                    return Err(cx.err(
                        u.span(),
                        format!(
                            "uuid `{s}` must start with GPU- or MIG- (as nvidia-smi -L prints it)"
                        ),
                    ));
                }
            }
            DeviceKind::Cuda {
                index: r.index.as_ref().map(|i| *i.get_ref()),
                uuid: r.uuid.as_ref().map(|u| u.get_ref().clone()),
            }
        }
        other => {
            return Err(cx.err(r.kind.span(), format!("unknown device kind `{other}`: use \"sim\" (simulated GPU) or \"cuda\" (real GPU)")));
        }
    };
    let memory = match &r.memory {
        Some(m) => {
            let b = cx.size(m, "memory")?;
            if b == 0 {
                return Err(cx.err(m.span(), "memory must be larger than 0"));
            }
            b
        }
        None => DEFAULT_SIM_MEMORY,
    };
    let workers = match &r.workers {
        Some(w) if *w.get_ref() == 0 || *w.get_ref() > 1024 => {
            return Err(cx.err(w.span(), "workers must be between 1 and 1024"));
        }
        Some(w) => Some(*w.get_ref() as usize),
        None => None,
    };
    let watchdog = match &r.watchdog_ms {
        Some(w) if *w.get_ref() == 0 || *w.get_ref() > MAX_WATCHDOG_MS => {
            return Err(cx.err(
                w.span(),
                format!(
                    "watchdog_ms must be between 1 and {MAX_WATCHDOG_MS} (1 hour): the watchdog cannot be disabled, or one kernel could hold the device forever"
                ),
            ));
        }
        Some(w) => Some(Duration::from_millis(*w.get_ref())),
        None => Some(DEFAULT_WATCHDOG),
    };
    let mut scheduling = SchedulingConfig::default();
    if let Some(p) = &r.policy {
        scheduling.policy = Policy::parse(p.get_ref()).ok_or_else(|| {
            cx.err(
                p.span(),
                format!(
                    "unknown policy `{}`: use \"fair\" (weighted, work-conserving) or \"fixed\" (hard caps)",
                    p.get_ref()
                ),
            )
        })?;
    }
    if let Some(ms) = &r.slice_ms {
        let d = Duration::from_millis(*ms.get_ref());
        if !(MIN_SLICE..=MAX_SLICE).contains(&d) {
            return Err(cx.err(
                ms.span(),
                format!(
                    "slice_ms must be between {} and {}",
                    MIN_SLICE.as_millis(),
                    MAX_SLICE.as_millis()
                ),
            ));
        }
        scheduling.slice = d;
    }
    if let Some(b) = &r.batch_min_share {
        if *b.get_ref() > MAX_BATCH_MIN_SHARE {
            return Err(cx.err(
                b.span(),
                format!("batch_min_share is a percentage from 0 to {MAX_BATCH_MIN_SHARE}"),
            ));
        }
        scheduling.batch_min_share = *b.get_ref();
    }
    let overcommit = match &r.overcommit {
        Some(o) => Overcommit::checked(*o.get_ref()).map_err(|m| cx.err(o.span(), m))?,
        None => Overcommit::default(),
    };
    Ok(DeviceConfig {
        name,
        kind,
        memory,
        workers,
        watchdog,
        scheduling,
        overcommit,
    })
}

fn parse_admin(cx: &Ctx<'_>, raw: Option<RawAdmin>) -> Result<AdminConfig, ConfigError> {
    let Some(raw) = raw else {
        return Ok(AdminConfig::default());
    };
    let metrics_listen = match &raw.metrics_listen {
        Some(m) => Some(m.get_ref().parse().map_err(|_| {
            cx.err(
                m.span(),
                format!(
                    "metrics_listen `{}` is not an address: write IP:PORT, e.g. \"127.0.0.1:9400\"",
                    m.get_ref()
                ),
            )
        })?),
        None => None,
    };
    Ok(AdminConfig {
        socket: raw.socket.map(|s| s.into_inner()),
        metrics_listen,
        audit_log: raw.audit_log.map(|s| s.into_inner()),
    })
}

fn valid_owner(s: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && p.len() <= 32
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    };
    match s.split_once(':') {
        Some((u, g)) => part(u) && part(g),
        None => part(s),
    }
}

fn valid_pci(s: &str) -> bool {
    let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit());
    let mut it = s.split(':');
    match (it.next(), it.next(), it.next(), it.next()) {
        (Some(d), Some(b), Some(df), None) => {
            hex(d, 4)
                && hex(b, 2)
                && df.split_once('.').is_some_and(|(dev, f)| {
                    hex(dev, 2) && f.len() == 1 && matches!(f.as_bytes()[0], b'0'..=b'7')
                })
        }
        _ => false,
    }
}

fn parse_passthrough(
    cx: &Ctx<'_>,
    v: &Spanned<RawVm>,
    name: String,
) -> Result<VmConfig, ConfigError> {
    let r = v.get_ref();
    let Some(pci) = &r.pci else {
        return Err(cx.err(
            v.span(),
            format!("VM `{name}` has mode = \"passthrough\" but no pci = \"DDDD:BB:DD.F\" address"),
        ));
    };
    if !valid_pci(pci.get_ref()) {
        return Err(cx.err(
            pci.span(),
            format!(
                "`{}` is not a PCI address: write domain:bus:device.function, e.g. \"0000:3b:00.0\" (see lspci -D)",
                pci.get_ref()
            ),
        ));
    }
    let shared_only: [(&str, Option<std::ops::Range<usize>>); 15] = [
        ("reserved", r.reserved.as_ref().map(|x| x.span())),
        ("overflow", r.overflow.as_ref().map(|x| x.span())),
        (
            "overflow_limit",
            r.overflow_limit.as_ref().map(|x| x.span()),
        ),
        ("socket_owner", r.socket_owner.as_ref().map(|x| x.span())),
        ("profile", r.profile.as_ref().map(|x| x.span())),
        ("device", r.device.as_ref().map(|x| x.span())),
        ("memory", r.memory.as_ref().map(|x| x.span())),
        ("weight", r.weight.as_ref().map(|x| x.span())),
        ("priority", r.priority.as_ref().map(|x| x.span())),
        ("unix_socket", r.unix_socket.as_ref().map(|x| x.span())),
        (
            "vhost_user_socket",
            r.vhost_user_socket.as_ref().map(|x| x.span()),
        ),
        ("guest_cid", r.guest_cid.as_ref().map(|x| x.span())),
        (
            "vsock_uds_path",
            r.vsock_uds_path.as_ref().map(|x| x.span()),
        ),
        ("device_model", r.device_model.as_ref().map(|x| x.span())),
        (
            "vgpu_device_id",
            r.vgpu_device_id.as_ref().map(|x| x.span()),
        ),
    ];
    if let Some((key, Some(span))) = shared_only.into_iter().find(|(_, s)| s.is_some()) {
        return Err(cx.err(
            span,
            format!("`{key}` applies to shared VMs only: a passthrough VM owns its whole device; remove it"),
        ));
    }
    if let Some(w) = r.schedule.first() {
        return Err(cx.err(w.span(), "`schedule` applies to shared VMs only; remove it"));
    }
    Ok(VmConfig {
        name,
        device: String::new(),
        memory: 0,
        weight: DEFAULT_WEIGHT,
        priority: Priority::Normal,
        unix_socket: None,
        vhost_user_socket: None,
        guest_cid: None,
        vsock_uds_path: None,
        device_model: DeviceModel::Vsock,
        schedule: Vec::new(),
        mode: VmMode::Passthrough {
            pci: pci.get_ref().to_ascii_lowercase(),
        },
        profile: None,
        socket_owner: None,
        tuning: VmTuning::default(),
        limits: VmLimits::default(),
        memory_policy: VmMemory::default(),
    })
}

fn parse_schedule(cx: &Ctx<'_>, r: &RawVm) -> Result<Vec<WeightWindow>, ConfigError> {
    let mut out: Vec<WeightWindow> = Vec::new();
    for w in &r.schedule {
        let raw = w.get_ref();
        let time = |t: &Spanned<String>| {
            TimeOfDay::parse(t.get_ref()).ok_or_else(|| {
                cx.err(
                    t.span(),
                    format!(
                        "`{}` is not a time: write HH:MM, e.g. \"08:00\"",
                        t.get_ref()
                    ),
                )
            })
        };
        let (from, to) = (time(&raw.from)?, time(&raw.to)?);
        if from == to {
            return Err(cx.err(
                w.span(),
                "a schedule window needs different `from` and `to` times",
            ));
        }
        let weight = *raw.weight.get_ref();
        if !(1..=MAX_WEIGHT).contains(&weight) {
            return Err(cx.err(
                raw.weight.span(),
                format!("weight must be between 1 and {MAX_WEIGHT}"),
            ));
        }
        let win = WeightWindow { from, to, weight };
        // Windows must not overlap: every minute of the day has at most one weight.
        if let Some(o) = out
            .iter()
            .find(|o| o.contains(win.from) || win.contains(o.from))
        {
            return Err(cx.err(
                w.span(),
                format!(
                    "this window overlaps the window {}-{}; give each time of day one weight",
                    o.from, o.to
                ),
            ));
        }
        out.push(win);
    }
    Ok(out)
}

/// `base` with what `raw` sets, each checked against its range.
fn parse_limits(
    cx: &Ctx<'_>,
    base: VmLimits,
    raw: &RawLimits,
    table: &str,
) -> Result<VmLimits, ConfigError> {
    let count = |v: &Option<Spanned<u32>>, key: &str, max: u32, default: u32| match v {
        None => Ok(default),
        Some(n) if (1..=max).contains(n.get_ref()) => Ok(*n.get_ref()),
        Some(n) => Err(cx.err(
            n.span(),
            format!(
                "{table}.{key} must be between 1 and {max} (got {})",
                n.get_ref()
            ),
        )),
    };
    let size = |v: &Option<Spanned<RawSize>>, key: &str, (min, max): (u64, u64), default: u64| {
        let Some(b) = v else { return Ok(default) };
        let bytes = cx.size(b, &format!("{table}.{key}"))?;
        if (min..=max).contains(&bytes) {
            Ok(bytes)
        } else {
            Err(cx.err(
                b.span(),
                format!(
                    "{table}.{key} must be between {} and {}",
                    crate::size::format_size(min),
                    crate::size::format_size(max)
                ),
            ))
        }
    };
    Ok(VmLimits {
        sessions: count(&raw.sessions, "sessions", MAX_SESSIONS, base.sessions)?,
        connections: count(
            &raw.connections,
            "connections",
            MAX_SESSIONS,
            base.connections,
        )?,
        modules: count(&raw.modules, "modules", MAX_MODULES, base.modules)?,
        module_bytes: size(
            &raw.module_bytes,
            "module_bytes",
            (1, MAX_MODULE_BYTES),
            base.module_bytes,
        )?,
        streams: count(&raw.streams, "streams", MAX_HANDLES, base.streams)?,
        events: count(&raw.events, "events", MAX_HANDLES, base.events)?,
        handles: count(&raw.handles, "handles", MAX_HANDLES, base.handles)?,
        queued_bytes: size(
            &raw.queued_bytes,
            "queued_bytes",
            (MIN_QUEUED_BYTES, MAX_QUEUED_BYTES),
            base.queued_bytes,
        )?,
        graph_bytes: size(
            &raw.graph_bytes,
            "graph_bytes",
            (1, MAX_GRAPH_BYTES),
            base.graph_bytes,
        )?,
        interpreter_bytes: size(
            &raw.interpreter_bytes,
            "interpreter_bytes",
            (MIN_INTERPRETER_BYTES, MAX_INTERPRETER_BYTES),
            base.interpreter_bytes,
        )?,
    })
}

fn parse_vm(
    cx: &Ctx<'_>,
    v: &Spanned<RawVm>,
    devices: &[DeviceConfig],
    profiles: &[ProfileConfig],
    limits: &VmLimits,
) -> Result<VmConfig, ConfigError> {
    let r = v.get_ref();
    let name = r.name.get_ref().clone();
    if !valid_name(&name) {
        return Err(cx.err(
            r.name.span(),
            format!("VM name `{name}` is invalid: use 1-64 letters, digits, '-', '_' or '.'"),
        ));
    }
    match r.mode.as_ref().map(|m| (m.get_ref().as_str(), m.span())) {
        None | Some(("shared", _)) => {}
        Some(("passthrough", _)) => return parse_passthrough(cx, v, name),
        Some((other, span)) => {
            return Err(cx.err(
                span,
                format!("unknown mode `{other}`: use \"shared\" (the default) or \"passthrough\""),
            ));
        }
    }
    if let Some(p) = &r.pci {
        return Err(cx.err(p.span(), "`pci` applies to mode = \"passthrough\" only"));
    }
    let device = match &r.device {
        Some(d) => {
            let dn = d.get_ref();
            if !devices.iter().any(|x| &x.name == dn) {
                let known: Vec<_> = devices.iter().map(|x| x.name.as_str()).collect();
                return Err(cx.err(d.span(), format!("VM `{name}` names device `{dn}`, which is not defined; defined devices: {}", known.join(", "))));
            }
            dn.clone()
        }
        None if devices.len() == 1 => devices[0].name.clone(),
        None => {
            return Err(cx.err(
                v.span(),
                format!(
                    "VM `{name}` needs `device = \"…\"`: there are {} devices",
                    devices.len()
                ),
            ));
        }
    };
    let profile = match &r.profile {
        Some(p) => Some(profiles.iter().find(|x| &x.name == p.get_ref()).ok_or_else(|| {
            let known: Vec<_> = profiles.iter().map(|x| x.name.as_str()).collect();
            cx.err(
                p.span(),
                format!(
                    "VM `{name}` names profile `{}`, which is not defined; defined profiles: {}",
                    p.get_ref(),
                    if known.is_empty() { "none (add a [[profile]] entry)".to_string() } else { known.join(", ") }
                ),
            )
        })?),
        None => None,
    };
    let memory = match (&r.memory, profile) {
        (Some(mem), _) => {
            let memory = cx.size(mem, "memory")?;
            if memory == 0 {
                return Err(cx.err(mem.span(), "the memory slice must be larger than 0"));
            }
            memory
        }
        (None, Some(p)) => {
            let dev = devices.iter().find(|d| d.name == device);
            match (p.memory, dev.map(|d| &d.kind)) {
                // A real GPU's memory is known once it is open:
                // `Config::resolve_profile_memory` sizes the slice then.
                (ProfileMemory::Fraction { .. }, Some(DeviceKind::Cuda { .. })) => 0,
                (m, _) => {
                    let b = m.bytes_of(dev.map_or(0, |d| d.memory));
                    if b == 0 {
                        return Err(cx.err(
                            v.span(),
                            format!("profile `{}` gives VM `{name}` a slice of 0 bytes", p.name),
                        ));
                    }
                    b
                }
            }
        }
        (None, None) => {
            return Err(cx.err(
                v.span(),
                format!(
                    "VM `{name}` needs `memory = \"…\"`: the size of its memory slice, e.g. \"2GiB\" (or `profile = \"…\"`)"
                ),
            ));
        }
    };
    let weight = match &r.weight {
        Some(w) if !(1..=MAX_WEIGHT).contains(w.get_ref()) => {
            return Err(cx.err(
                w.span(),
                format!("weight must be between 1 and {MAX_WEIGHT}"),
            ));
        }
        Some(w) => *w.get_ref(),
        None => profile.map_or(DEFAULT_WEIGHT, |p| p.weight),
    };
    let priority = match &r.priority {
        Some(p) => Priority::parse(p.get_ref()).ok_or_else(|| {
            cx.err(
                p.span(),
                format!(
                    "unknown priority `{}`: use \"realtime\", \"normal\" or \"batch\"",
                    p.get_ref()
                ),
            )
        })?,
        None => profile.map_or(Priority::Normal, |p| p.priority),
    };
    let device_model = parse_device_model(cx, r, &name)?;
    let guest_cid = r.guest_cid.as_ref().map(|c| *c.get_ref());
    if let Some(c) = &r.guest_cid
        && (*c.get_ref() < MIN_GUEST_CID || *c.get_ref() > u64::from(u32::MAX) - 1)
    {
        return Err(cx.err(
            c.span(),
            format!(
                "guest_cid must be between {MIN_GUEST_CID} and {} (0-2 are reserved)",
                u32::MAX - 1
            ),
        ));
    }
    if device_model == DeviceModel::Vsock {
        match (&r.vhost_user_socket, &r.guest_cid) {
            (Some(s), None) => {
                return Err(cx.err(s.span(), format!("VM `{name}` has vhost_user_socket but no guest_cid: add `guest_cid = N` (N >= 3, unique per VM), or `device_model = \"vgpu\"` for the virtio-vgpu device")));
            }
            (None, Some(c)) => {
                return Err(cx.err(
                    c.span(),
                    "guest_cid is used only with vhost_user_socket; add the socket or remove the CID",
                ));
            }
            _ => {}
        }
    }
    if let (Some(u), None) = (&r.vsock_uds_path, &r.vhost_user_socket) {
        return Err(cx.err(
            u.span(),
            "vsock_uds_path belongs to the vsock device: add vhost_user_socket or remove it",
        ));
    }
    let vhost_user_socket = r.vhost_user_socket.as_ref().map(|s| s.get_ref().clone());
    let vsock_uds_path = match (&r.vsock_uds_path, &vhost_user_socket, device_model) {
        (Some(u), _, _) => Some(u.get_ref().clone()),
        (None, Some(sock), DeviceModel::Vsock) => {
            Some(sock.with_file_name(format!("{name}.vsock")))
        }
        _ => None,
    };
    let schedule = parse_schedule(cx, r)?;
    let socket_owner = match &r.socket_owner {
        Some(o) if !valid_owner(o.get_ref()) => {
            return Err(cx.err(o.span(), format!("socket_owner `{}` is not user[:group]: write e.g. \"libvirt-qemu\" or \"107:107\"", o.get_ref())));
        }
        Some(o) => Some(o.get_ref().clone()),
        None => None,
    };
    let tuning = parse_vm_tuning(cx, r, weight)?;
    let memory_policy = parse_vm_memory(cx, v, memory)?;
    Ok(VmConfig {
        name,
        device,
        memory,
        weight,
        priority,
        unix_socket: r.unix_socket.as_ref().map(|s| s.get_ref().clone()),
        vhost_user_socket,
        guest_cid,
        vsock_uds_path,
        device_model,
        schedule,
        mode: VmMode::Shared,
        profile: profile.map(|p| p.name.clone()),
        socket_owner,
        tuning,
        limits: match &r.limits {
            Some(l) => parse_limits(cx, *limits, l, "limits")?,
            None => *limits,
        },
        memory_policy,
    })
}

fn parse_vm_memory(cx: &Ctx<'_>, v: &Spanned<RawVm>, memory: u64) -> Result<VmMemory, ConfigError> {
    let r = v.get_ref();
    let reserved = match &r.reserved {
        Some(s) => cx.size(s, "reserved")?,
        None => 0,
    };
    let overflow = match &r.overflow {
        Some(o) => Overflow::parse(o.get_ref()).ok_or_else(|| {
            cx.err(
                o.span(),
                format!(
                    "unknown overflow `{}`: use \"none\" (allocations past the device fail) or \"host\" (they go to host memory)",
                    o.get_ref()
                ),
            )
        })?,
        None => Overflow::None,
    };
    let overflow_limit = match (&r.overflow_limit, overflow) {
        (Some(s), _) => cx.size(s, "overflow_limit")?,
        // With overflow and no limit, the whole slice may overflow.
        (None, Overflow::Host) => memory,
        (None, Overflow::None) => 0,
    };
    let m = VmMemory {
        reserved,
        overflow,
        overflow_limit,
    };
    m.check(memory).map_err(|(key, msg)| {
        let span = match key {
            "reserved" => r.reserved.as_ref().map(|s| s.span()),
            _ => r.overflow_limit.as_ref().map(|s| s.span()),
        };
        cx.err(span.unwrap_or(v.span()), msg)
    })?;
    Ok(m)
}

fn parse_memory(cx: &Ctx<'_>, raw: Option<&RawMemory>) -> Result<MemoryConfig, ConfigError> {
    let host_overflow_budget = match raw.and_then(|r| r.host_overflow_budget.as_ref()) {
        Some(s) => Some(cx.size(s, "host_overflow_budget")?),
        None => None,
    };
    Ok(MemoryConfig {
        host_overflow_budget,
    })
}

fn parse_vm_tuning(cx: &Ctx<'_>, r: &RawVm, weight: u32) -> Result<VmTuning, ConfigError> {
    let target_wait_p99 = match &r.target_wait_p99 {
        Some(t) => Some(
            parse_duration(t.get_ref())
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    cx.err(
                        t.span(),
                        format!(
                            "`{}` is not a duration: write a number and ms, s or min, e.g. \"5ms\"",
                            t.get_ref()
                        ),
                    )
                })?,
        ),
        None => None,
    };
    let min_share = match &r.min_share {
        Some(m) if !(1..=100).contains(m.get_ref()) => {
            return Err(cx.err(m.span(), "min_share is a percentage between 1 and 100"));
        }
        m => m.as_ref().map(|m| *m.get_ref()),
    };
    let bound = |b: &Option<Spanned<u32>>, key: &str| -> Result<Option<u32>, ConfigError> {
        match b {
            Some(w) if !(1..=MAX_WEIGHT).contains(w.get_ref()) => Err(cx.err(
                w.span(),
                format!("{key} must be between 1 and {MAX_WEIGHT}"),
            )),
            w => Ok(w.as_ref().map(|w| *w.get_ref())),
        }
    };
    let weight_min = bound(&r.weight_min, "weight_min")?;
    let weight_max = bound(&r.weight_max, "weight_max")?;
    let (lo, hi) = (weight_min.unwrap_or(1), weight_max.unwrap_or(MAX_WEIGHT));
    if lo > hi || !(lo..=hi).contains(&weight) {
        let span = r
            .weight_min
            .as_ref()
            .or(r.weight_max.as_ref())
            .map_or(r.name.span(), |w| w.span());
        return Err(cx.err(
            span,
            format!("the weight bounds {lo}..{hi} must contain the VM's weight {weight}"),
        ));
    }
    Ok(VmTuning {
        target_wait_p99,
        min_share,
        weight_min,
        weight_max,
    })
}

fn parse_tuning(cx: &Ctx<'_>, r: Option<&RawTuning>) -> Result<TuningConfig, ConfigError> {
    let mut t = TuningConfig::default();
    let Some(r) = r else {
        return Ok(t);
    };
    if let Some(m) = &r.mode {
        t.mode = TuneMode::parse(m.get_ref()).ok_or_else(|| {
            cx.err(
                m.span(),
                format!(
                    "unknown tuning mode `{}`: use \"off\", \"advise\" or \"auto\"",
                    m.get_ref()
                ),
            )
        })?;
    }
    if let Some(i) = &r.tune_interval {
        t.interval = parse_duration(i.get_ref())
            .filter(|d| *d >= Duration::from_millis(100))
            .ok_or_else(|| {
                cx.err(
                    i.span(),
                    format!(
                        "`{}` is not a tuning interval: write a duration of at least 100ms, e.g. \"5min\"",
                        i.get_ref()
                    ),
                )
            })?;
    }
    Ok(t)
}

/// `device_model` and `vgpu_device_id`, checked against the vsock keys.
fn parse_device_model(cx: &Ctx<'_>, r: &RawVm, name: &str) -> Result<DeviceModel, ConfigError> {
    let model = match r
        .device_model
        .as_ref()
        .map(|m| (m.get_ref().as_str(), m.span()))
    {
        None | Some(("vsock", _)) => DeviceModel::Vsock,
        Some(("vgpu", _)) => DeviceModel::Vgpu {
            device_id: DEFAULT_VGPU_DEVICE_ID,
        },
        Some((other, span)) => {
            return Err(cx.err(
                span,
                format!("unknown device_model `{other}`: use \"vsock\" (the default) or \"vgpu\""),
            ));
        }
    };
    let DeviceModel::Vgpu { .. } = model else {
        if let Some(id) = &r.vgpu_device_id {
            return Err(cx.err(
                id.span(),
                "vgpu_device_id applies to device_model = \"vgpu\" only; add that or remove it",
            ));
        }
        return Ok(model);
    };
    let span = r.device_model.as_ref().map_or(0..0, |m| m.span());
    if r.vhost_user_socket.is_none() {
        return Err(cx.err(
            span,
            format!("VM `{name}` has device_model = \"vgpu\" but no vhost_user_socket: add `vhost_user_socket = \"/run/vgpu/{name}.vhost.sock\"`, where the VMM attaches the device"),
        ));
    }
    for (key, s) in [
        ("guest_cid", r.guest_cid.as_ref().map(|c| c.span())),
        (
            "vsock_uds_path",
            r.vsock_uds_path.as_ref().map(|c| c.span()),
        ),
    ] {
        if let Some(s) = s {
            return Err(cx.err(
                s,
                format!("`{key}` belongs to the vsock device; the virtio-vgpu device has none: remove it"),
            ));
        }
    }
    let device_id = match &r.vgpu_device_id {
        Some(id) if !(1..=MAX_VGPU_DEVICE_ID).contains(id.get_ref()) => {
            return Err(cx.err(
                id.span(),
                format!("vgpu_device_id must be between 1 and {MAX_VGPU_DEVICE_ID} (virtio PCI device IDs 0x1041-0x107f); the default is {DEFAULT_VGPU_DEVICE_ID}"),
            ));
        }
        Some(id) => *id.get_ref(),
        None => DEFAULT_VGPU_DEVICE_ID,
    };
    Ok(DeviceModel::Vgpu { device_id })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(src: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("vgpu.toml"), src)
    }

    fn err(src: &str) -> String {
        parse(src).unwrap_err().to_string()
    }

    #[test]
    fn the_design_example_parses() {
        let c = parse(
            r#"
[admin]
socket = "/run/vgpu/admin.sock"

[[device]]
name = "gpu0"
kind = "sim"
memory = "8GiB"

[[vm]]
name = "vm1"
device = "gpu0"
memory = "2GiB"
weight = 1
priority = "normal"
unix_socket = "/run/vgpu/vm1.sock"
vhost_user_socket = "/run/vgpu/vm1.vhost.sock"
guest_cid = 3
"#,
        )
        .unwrap();
        assert_eq!(
            c.admin.socket.as_deref(),
            Some(Path::new("/run/vgpu/admin.sock"))
        );
        assert_eq!(c.devices[0].memory, 8 << 30);
        let vm = &c.vms[0];
        assert_eq!((vm.memory, vm.weight, vm.guest_cid), (2 << 30, 1, Some(3)));
        assert_eq!(
            vm.vsock_uds_path.as_deref(),
            Some(Path::new("/run/vgpu/vm1.vsock"))
        );
        assert_eq!(vm.priority, Priority::Normal);
    }

    #[test]
    fn a_file_without_devices_gets_a_simulated_gpu() {
        let c = parse("[[vm]]\nname = \"a\"\nmemory = 1048576\n").unwrap();
        assert_eq!(c.devices[0].kind, DeviceKind::Sim);
        assert_eq!(c.vms[0].device, DEFAULT_DEVICE_NAME);
        assert_eq!(c.vms[0].memory, 1 << 20);
    }

    #[test]
    fn tuning_targets_bounds_and_mode() {
        let c = Config::parse(
            Path::new("t.toml"),
            "[tuning]\nmode = \"advise\"\ntune_interval = \"30s\"\n\
             [[vm]]\nname = \"inf\"\nmemory = 1\nweight = 3\n\
             target_wait_p99 = \"5ms\"\nmin_share = 30\nweight_min = 2\nweight_max = 12\n\
             [[vm]]\nname = \"b\"\nmemory = 1\n",
        )
        .unwrap();
        assert_eq!(c.tuning.mode, TuneMode::Advise);
        assert_eq!(c.tuning.interval, Duration::from_secs(30));
        let t = &c.vms[0].tuning;
        assert_eq!(t.target_wait_p99, Some(Duration::from_millis(5)));
        assert_eq!(
            (t.min_share, t.weight_min, t.weight_max),
            (Some(30), Some(2), Some(12))
        );
        assert!(t.has_target() && !c.vms[1].tuning.has_target());
        // Defaults: off, every 5 minutes.
        let d = Config::parse(Path::new("t.toml"), "").unwrap();
        assert_eq!(d.tuning, TuningConfig::default());
        assert_eq!(d.tuning.interval, Duration::from_secs(300));
        assert_eq!(parse_duration("1.5min"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("5"), None);
        let vm = "[[vm]]\nname = \"a\"\nmemory = 1\nweight = 3\n";
        assert!(err(&format!("{vm}target_wait_p99 = \"soon\"\n")).contains("not a duration"));
        assert!(err(&format!("{vm}min_share = 0\n")).contains("between 1 and 100"));
        assert!(err(&format!("{vm}weight_max = 2\n")).contains("must contain the VM's weight 3"));
        assert!(err("[tuning]\nmode = \"on\"\n").contains("\"off\", \"advise\" or \"auto\""));
        assert!(err("[tuning]\ntune_interval = \"1ms\"\n").contains("at least 100ms"));
    }

    #[test]
    fn errors_name_the_line_and_the_fix() {
        let e = err("[[vm]]\nname = \"a\"\nmemory = \"2GB\"\n");
        assert!(
            e.starts_with("vgpu.toml:3: memory: `2GB` is not a size"),
            "{e}"
        );

        let e = err("[[vm]]\nname = \"a\"\nmemory = \"1GiB\"\ndevice = \"nope\"\n");
        assert!(
            e.starts_with("vgpu.toml:4:") && e.contains("defined devices: gpu0"),
            "{e}"
        );

        let e = err("[[device]]\nname = \"g\"\nkind = \"tpu\"\n");
        assert!(
            e.starts_with("vgpu.toml:3:") && e.contains("use \"sim\""),
            "{e}"
        );

        let e = err("[[vm]]\nname = \"a\"\nmemory = \"1GiB\"\nwieght = 3\n");
        assert!(e.starts_with("vgpu.toml:") && e.contains("wieght"), "{e}");

        let e = err("[[vm]]\nname = \"a\"\nmemory = \"1GiB\"\npriority = \"urgent\"\n");
        assert!(
            e.starts_with("vgpu.toml:4:") && e.contains("realtime"),
            "{e}"
        );
    }

    #[test]
    fn duplicates_and_conflicts_are_refused() {
        let e = err("[[vm]]\nname = \"a\"\nmemory = 1\n[[vm]]\nname = \"a\"\nmemory = 1\n");
        assert!(e.starts_with("vgpu.toml:5:") && e.contains("unique"), "{e}");

        let e = err(
            "[[vm]]\nname = \"a\"\nmemory = 1\nvhost_user_socket = \"/a\"\nguest_cid = 3\n\
             [[vm]]\nname = \"b\"\nmemory = 1\nvhost_user_socket = \"/b\"\nguest_cid = 3\n",
        );
        assert!(e.contains("guest_cid 3 is already used by VM `a`"), "{e}");

        let e = err(
            "[[vm]]\nname = \"a\"\nmemory = 1\nunix_socket = \"/s\"\n[[vm]]\nname = \"b\"\nmemory = 1\nunix_socket = \"/s\"\n",
        );
        assert!(
            e.starts_with("vgpu.toml:8:") && e.contains("used twice"),
            "{e}"
        );

        let e = err("[[vm]]\nname = \"a\"\nmemory = 1\nvhost_user_socket = \"/a\"\n");
        assert!(e.contains("no guest_cid"), "{e}");
    }

    #[test]
    fn out_of_range_values_are_refused() {
        assert!(err("[[vm]]\nname = \"a\"\nmemory = 0\n").contains("larger than 0"));
        assert!(err("[[vm]]\nname = \"a\"\nmemory = 1\nweight = 0\n").contains("weight must be"));
        assert!(err("[[vm]]\nname = \"a b\"\nmemory = 1\n").contains("invalid"));
        assert!(
            err("[[vm]]\nname = \"a\"\nmemory = 1\nvhost_user_socket = \"/a\"\nguest_cid = 2\n")
                .contains("reserved")
        );
        assert!(
            err("[[device]]\nname = \"g\"\nkind = \"cuda\"\nmemory = \"1GiB\"\n")
                .contains("sim\" only")
        );
        // The watchdog cannot be disabled, and has a maximum.
        for ms in [0, MAX_WATCHDOG_MS + 1] {
            let e = err(&format!(
                "[[device]]\nname = \"g\"\nkind = \"sim\"\nwatchdog_ms = {ms}\n"
            ));
            assert!(
                e.starts_with("vgpu.toml:4:") && e.contains("cannot be disabled"),
                "{e}"
            );
        }
    }

    #[test]
    fn scheduling_settings_parse_and_are_checked() {
        let c = parse(
            "[[device]]\nname = \"g\"\nkind = \"sim\"\npolicy = \"fixed\"\nslice_ms = 5\nbatch_min_share = 10\n\
             [[vm]]\nname = \"inf\"\nmemory = 1\nweight = 30\n\
             [[vm.schedule]]\nfrom = \"08:00\"\nto = \"20:00\"\nweight = 70\n\
             [[vm.schedule]]\nfrom = \"22:00\"\nto = \"02:00\"\nweight = 10\n",
        )
        .unwrap();
        let s = c.devices[0].scheduling;
        assert_eq!(
            (s.policy, s.slice, s.batch_min_share),
            (Policy::Fixed, Duration::from_millis(5), 10)
        );
        let vm = &c.vms[0];
        let t = |s| TimeOfDay::parse(s).unwrap();
        assert_eq!(vm.weight_at(t("12:00")), 70);
        assert_eq!(vm.weight_at(t("20:00")), 30, "the end is exclusive");
        assert_eq!(vm.weight_at(t("23:30")), 10, "windows wrap past midnight");
        assert_eq!(vm.weight_at(t("01:59")), 10);
        assert_eq!(vm.weight_at(t("05:00")), 30);

        assert!(
            err("[[device]]\nname = \"g\"\nkind = \"sim\"\nslice_ms = 0\n")
                .contains("slice_ms must be between 1 and 100")
        );
        assert!(
            err("[[device]]\nname = \"g\"\nkind = \"sim\"\npolicy = \"rr\"\n")
                .contains("unknown policy")
        );
        let e = err(
            "[[vm]]\nname = \"a\"\nmemory = 1\n[[vm.schedule]]\nfrom = \"8:00\"\nto = \"20:00\"\nweight = 7\n",
        );
        assert!(e.starts_with("vgpu.toml:5:") && e.contains("HH:MM"), "{e}");
        let e = err(
            "[[vm]]\nname = \"a\"\nmemory = 1\n[[vm.schedule]]\nfrom = \"08:00\"\nto = \"20:00\"\nweight = 7\n\
             [[vm.schedule]]\nfrom = \"19:00\"\nto = \"21:00\"\nweight = 7\n",
        );
        assert!(e.contains("overlaps the window 08:00-20:00"), "{e}");
    }

    #[test]
    fn passthrough_vms_are_checked() {
        let c = parse("[[vm]]\nname = \"p\"\nmode = \"passthrough\"\npci = \"0000:3B:00.1\"\n")
            .unwrap();
        assert_eq!(
            c.vms[0].mode,
            VmMode::Passthrough {
                pci: "0000:3b:00.1".into()
            }
        );
        assert!(err("[[vm]]\nname = \"p\"\nmode = \"passthrough\"\n").contains("no pci"));
        assert!(
            err("[[vm]]\nname = \"p\"\nmode = \"passthrough\"\npci = \"3b:00.0\"\n")
                .contains("lspci -D")
        );
        assert!(err("[[vm]]\nname = \"p\"\nmode = \"passthrough\"\npci = \"0000:3b:00.0\"\nmemory = \"1GiB\"\n").contains("shared VMs only"));
        assert!(
            err("[[vm]]\nname = \"p\"\nmemory = 1\npci = \"0000:3b:00.0\"\n")
                .contains("passthrough\" only")
        );
        let e = err(
            "[[vm]]\nname = \"a\"\nmode = \"passthrough\"\npci = \"0000:3b:00.0\"\n[[vm]]\nname = \"b\"\nmode = \"passthrough\"\npci = \"0000:3b:00.0\"\n",
        );
        assert!(e.contains("already assigned to VM `a`"), "{e}");
        assert!(err("[[vm]]\nname = \"a\"\n").contains("needs `memory"));
    }

    #[test]
    fn admin_settings_parse() {
        let c = parse("[admin]\nmetrics_listen = \"127.0.0.1:9400\"\naudit_log = \"/var/log/vgpu/audit.jsonl\"\n").unwrap();
        assert_eq!(c.admin.metrics_listen.unwrap().port(), 9400);
        assert!(err("[admin]\nmetrics_listen = \"localhost\"\n").contains("IP:PORT"));
    }

    #[test]
    fn the_example_config_in_the_repository_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/vgpud.toml");
        let c = Config::load(&path).unwrap();
        assert_eq!(c.vms.len(), 2);
        assert_eq!(c.devices[0].watchdog, Some(Duration::from_secs(30)));
    }

    #[test]
    fn the_vgpu_device_model_is_parsed_and_checked() {
        let c = parse(
            "[[vm]]\nname = \"a\"\nmemory = 1\nvhost_user_socket = \"/run/a.sock\"\ndevice_model = \"vgpu\"\n\
             [[vm]]\nname = \"b\"\nmemory = 1\nvhost_user_socket = \"/run/b.sock\"\ndevice_model = \"vgpu\"\nvgpu_device_id = 42\n\
             [[vm]]\nname = \"c\"\nmemory = 1\nvhost_user_socket = \"/run/c.sock\"\nguest_cid = 3\n",
        )
        .unwrap();
        assert_eq!(
            c.vms[0].device_model,
            DeviceModel::Vgpu {
                device_id: DEFAULT_VGPU_DEVICE_ID
            }
        );
        assert_eq!(c.vms[0].vsock_uds_path, None, "no vsock, no hybrid socket");
        assert_eq!(c.vms[1].device_model, DeviceModel::Vgpu { device_id: 42 });
        assert_eq!(c.vms[2].device_model, DeviceModel::Vsock);
        assert_eq!(c.vms[2].device_model.as_str(), "vsock");

        let vgpu = "[[vm]]\nname = \"a\"\nmemory = 1\nvhost_user_socket = \"/a\"\ndevice_model = \"vgpu\"\n";
        let e = err(&format!("{vgpu}guest_cid = 3\n"));
        assert!(
            e.starts_with("vgpu.toml:6:") && e.contains("`guest_cid` belongs to the vsock device"),
            "{e}"
        );
        let e = err(&format!("{vgpu}vsock_uds_path = \"/u\"\n"));
        assert!(
            e.contains("`vsock_uds_path` belongs to the vsock device"),
            "{e}"
        );
        for bad in ["0", "64", "1000"] {
            let e = err(&format!("{vgpu}vgpu_device_id = {bad}\n"));
            assert!(
                e.starts_with("vgpu.toml:6:") && e.contains("between 1 and 63"),
                "{e}"
            );
        }
        let e = err("[[vm]]\nname = \"a\"\nmemory = 1\ndevice_model = \"vgpu\"\n");
        assert!(
            e.starts_with("vgpu.toml:4:") && e.contains("no vhost_user_socket"),
            "{e}"
        );
        let e = err("[[vm]]\nname = \"a\"\nmemory = 1\ndevice_model = \"virtio-gpu\"\n");
        assert!(e.contains("unknown device_model `virtio-gpu`"), "{e}");
        let e = err("[[vm]]\nname = \"a\"\nmemory = 1\nvgpu_device_id = 9\n");
        assert!(e.contains("applies to device_model = \"vgpu\" only"), "{e}");
        let e = err(
            "[[vm]]\nname = \"p\"\nmode = \"passthrough\"\npci = \"0000:3b:00.0\"\ndevice_model = \"vgpu\"\n",
        );
        assert!(
            e.contains("`device_model` applies to shared VMs only"),
            "{e}"
        );
        // The error for a vsock socket without a CID mentions the alternative.
        let e = err("[[vm]]\nname = \"a\"\nmemory = 1\nvhost_user_socket = \"/a\"\n");
        assert!(e.contains("device_model = \"vgpu\""), "{e}");
    }

    #[test]
    fn memory_keys_parse_and_slices_must_fit_the_overcommit() {
        const DEV: &str = "[[device]]\nname = \"g\"\nkind = \"sim\"\nmemory = \"4GiB\"\n";
        // Two VMs of 3 GiB on a 4 GiB device: refused by default, at the VM that went over.
        let e = err(&format!(
            "{DEV}[[vm]]\nname = \"a\"\nmemory = \"3GiB\"\n[[vm]]\nname = \"b\"\nmemory = \"3GiB\"\n"
        ));
        assert!(e.starts_with("vgpu.toml:8: "), "{e}");
        assert!(e.contains("`overcommit`"), "{e}");
        let c = parse(&format!("{DEV}overcommit = 1.5\n[[memory]]\n"));
        assert!(c.is_err(), "[memory] is a table, not an array");
        let c = parse(&format!(
            "[memory]\nhost_overflow_budget = \"8GiB\"\n{DEV}overcommit = 1.5\n\
             [[vm]]\nname = \"a\"\nmemory = \"3GiB\"\nreserved = \"2GiB\"\noverflow = \"host\"\n\
             [[vm]]\nname = \"b\"\nmemory = \"3GiB\"\nreserved = \"2GiB\"\noverflow = \"host\"\noverflow_limit = \"1GiB\"\n"
        ))
        .unwrap();
        assert_eq!(c.devices[0].overcommit.as_f64(), 1.5);
        assert_eq!(c.memory.host_overflow_budget, Some(8 << 30));
        let a = c.vms[0].memory_policy;
        assert_eq!(
            (a.reserved, a.overflow, a.overflow_limit),
            (2 << 30, Overflow::Host, 3 << 30),
            "without a limit the whole slice may overflow"
        );
        assert_eq!(c.vms[1].memory_policy.overflow_limit, 1 << 30);
        // Reservations past the device, past the slice; limits without overflow.
        let e = err(&format!(
            "{DEV}overcommit = 2\n[[vm]]\nname = \"a\"\nmemory = \"3GiB\"\nreserved = \"3GiB\"\n\
             [[vm]]\nname = \"b\"\nmemory = \"3GiB\"\nreserved = \"2GiB\"\n"
        ));
        assert!(
            e.contains("`reserved`") && e.contains("reservations"),
            "{e}"
        );
        let e = err(&format!(
            "{DEV}[[vm]]\nname = \"a\"\nmemory = \"1GiB\"\nreserved = \"2GiB\"\n"
        ));
        assert!(
            e.starts_with("vgpu.toml:8: reserved = 2.0 GiB is more than"),
            "{e}"
        );
        let e = err(&format!(
            "{DEV}[[vm]]\nname = \"a\"\nmemory = \"1GiB\"\noverflow_limit = \"1GiB\"\n"
        ));
        assert!(e.contains("overflow = \"host\""), "{e}");
        let e = err(&format!(
            "{DEV}[[vm]]\nname = \"a\"\nmemory = \"1GiB\"\noverflow = \"disk\"\n"
        ));
        assert!(e.contains("unknown overflow `disk`"), "{e}");
        let e = err(&format!("{DEV}overcommit = 0.5\n"));
        assert!(e.contains("overcommit must be between 1.0"), "{e}");
        let e = err(
            "[[vm]]\nname = \"p\"\nmode = \"passthrough\"\npci = \"0000:3b:00.0\"\nreserved = \"1GiB\"\n",
        );
        assert!(e.contains("`reserved` applies to shared VMs only"), "{e}");
    }

    #[test]
    fn profiles_size_vms_from_their_device() {
        let c = parse(
            "[[device]]\nname = \"g\"\nkind = \"sim\"\nmemory = \"8GiB\"\novercommit = 1.5\n\
             [[profile]]\nname = \"q8\"\nmemory = \"1/8\"\n\
             [[profile]]\nname = \"q4\"\nmemory = \"1/4\"\nweight = 2\npriority = \"normal\"\n\
             [[profile]]\nname = \"q2\"\nmemory = \"1/2\"\nweight = 4\npriority = \"realtime\"\n\
             [[profile]]\nname = \"small\"\nmemory = \"512MiB\"\npriority = \"batch\"\n\
             [[vm]]\nname = \"a\"\nprofile = \"q4\"\n\
             [[vm]]\nname = \"b\"\nprofile = \"q2\"\nweight = 7\n\
             [[vm]]\nname = \"c\"\nprofile = \"small\"\n\
             [[vm]]\nname = \"d\"\nprofile = \"q8\"\nmemory = \"3GiB\"\n",
        )
        .unwrap();
        assert_eq!(c.profiles.len(), 4);
        let vm = |n: &str| c.vms.iter().find(|v| v.name == n).unwrap();
        assert_eq!(
            (vm("a").memory, vm("a").weight, vm("a").priority),
            (2 << 30, 2, Priority::Normal)
        );
        assert_eq!(vm("a").profile.as_deref(), Some("q4"));
        // Keys the entry sets win over the profile's.
        assert_eq!(
            (vm("b").memory, vm("b").weight, vm("b").priority),
            (4 << 30, 7, Priority::Realtime)
        );
        assert_eq!(
            (vm("c").memory, vm("c").priority),
            (512 << 20, Priority::Batch)
        );
        assert_eq!(vm("d").memory, 3 << 30);
        assert_eq!(c.profile("q8").unwrap().memory.bytes_of(8 << 30), 1 << 30);
        let c = parse("[[vm]]\nname = \"a\"\nmemory = 1\nsocket_owner = \"libvirt-qemu:kvm\"\n")
            .unwrap();
        assert_eq!(c.vms[0].socket_owner.as_deref(), Some("libvirt-qemu:kvm"));
        assert!(
            err("[[vm]]\nname = \"a\"\nmemory = 1\nsocket_owner = \"a b\"\n")
                .contains("user[:group]")
        );
    }

    #[test]
    fn profiles_on_real_gpus_are_sized_when_the_gpu_is_open() {
        let mut c = parse(
            "[[device]]\nname = \"g\"\nkind = \"cuda\"\nindex = 0\n\
             [[profile]]\nname = \"q4\"\nmemory = \"1/4\"\n\
             [[vm]]\nname = \"a\"\nprofile = \"q4\"\n",
        )
        .unwrap();
        assert_eq!(c.vms[0].memory, 0, "unknown until the GPU is open");
        c.resolve_profile_memory(|d| (d == "g").then_some(80 << 30))
            .unwrap();
        assert_eq!(c.vms[0].memory, 20 << 30);
        let mut c2 = parse(
            "[[device]]\nname = \"g\"\nkind = \"cuda\"\n[[profile]]\nname = \"q4\"\nmemory = \"1/4\"\n[[vm]]\nname = \"a\"\nprofile = \"q4\"\n",
        )
        .unwrap();
        assert!(
            c2.resolve_profile_memory(|_| None)
                .unwrap_err()
                .contains("not open")
        );
    }

    #[test]
    fn bad_profiles_are_refused_with_the_fix() {
        let e = err("[[profile]]\nname = \"q4\"\nmemory = \"1/0\"\n");
        assert!(
            e.starts_with("vgpu.toml:3:") && e.contains("between 1/64 and 1/1"),
            "{e}"
        );
        let e = err("[[profile]]\nname = \"q4\"\nmemory = \"5/4\"\n");
        assert!(e.contains("between 1/64 and 1/1"), "{e}");
        let e = err("[[profile]]\nname = \"q4\"\nmemory = \"quarter\"\n");
        assert!(e.contains("\"1/4\""), "{e}");
        let e = err("[[profile]]\nname = \"q_4\"\nmemory = \"1/4\"\n");
        assert!(e.contains("vgpu.io/<name>"), "{e}");
        let e = err(
            "[[profile]]\nname = \"q4\"\nmemory = \"1/4\"\n[[profile]]\nname = \"q4\"\nmemory = \"1/2\"\n",
        );
        assert!(e.starts_with("vgpu.toml:5:") && e.contains("unique"), "{e}");
        let e = err(
            "[[profile]]\nname = \"q4\"\nmemory = \"1/4\"\n[[vm]]\nname = \"a\"\nprofile = \"q3\"\n",
        );
        assert!(
            e.starts_with("vgpu.toml:6:") && e.contains("defined profiles: q4"),
            "{e}"
        );
        let e = err(
            "[[profile]]\nname = \"q4\"\nmemory = \"1/4\"\n[[vm]]\nname = \"p\"\nmode = \"passthrough\"\npci = \"0000:3b:00.0\"\nprofile = \"q4\"\n",
        );
        assert!(e.contains("`profile` applies to shared VMs only"), "{e}");
    }

    #[test]
    fn limits_default_per_file_and_per_vm() {
        let c = parse(
            "[limits]\nsessions = 8\nmodule_bytes = \"64MiB\"\n\
             [[vm]]\nname = \"a\"\nmemory = \"1GiB\"\n\
             [[vm]]\nname = \"b\"\nmemory = \"1GiB\"\n[vm.limits]\nsessions = 2\nmodules = 16\n",
        )
        .unwrap();
        assert_eq!(c.limits.sessions, 8);
        let a = &c.vms[0].limits;
        assert_eq!((a.sessions, a.module_bytes), (8, 64 << 20));
        assert_eq!(a.connections, crate::limits::DEFAULT_CONNECTIONS);
        let b = &c.vms[1].limits;
        assert_eq!((b.sessions, b.modules, b.module_bytes), (2, 16, 64 << 20));
        let none = parse("[[vm]]\nname = \"a\"\nmemory = \"1GiB\"\n").unwrap();
        assert_eq!(none.vms[0].limits, VmLimits::default());
        let c = parse(
            "[limits]\nstreams = 64\nevents = 128\nhandles = 256\nqueued_bytes = \"32MiB\"\n\
             graph_bytes = \"8MiB\"\n[[vm]]\nname = \"a\"\nmemory = \"1GiB\"\n\
             [vm.limits]\nstreams = 8\n",
        )
        .unwrap();
        let a = &c.vms[0].limits;
        assert_eq!(
            (
                a.streams,
                a.events,
                a.handles,
                a.queued_bytes,
                a.graph_bytes
            ),
            (8, 128, 256, 32 << 20, 8 << 20)
        );
    }

    #[test]
    fn limits_out_of_range_name_the_key_and_line() {
        let e = err("[limits]\nsessions = 0\n");
        assert!(
            e.starts_with("vgpu.toml:2:") && e.contains("limits.sessions must be between 1 and"),
            "{e}"
        );
        let e = err("[[vm]]\nname = \"a\"\nmemory = \"1GiB\"\n[vm.limits]\nconnections = 100000\n");
        assert!(
            e.starts_with("vgpu.toml:5:") && e.contains("limits.connections"),
            "{e}"
        );
        let e = err("[limits]\nmodule_bytes = \"1TiB\"\n");
        assert!(e.contains("limits.module_bytes must be between"), "{e}");
        let e = err("[limits]\nthreads = 5\n");
        assert!(e.contains("threads"), "{e}");
        let e = err("[limits]\nstreams = 0\n");
        assert!(
            e.starts_with("vgpu.toml:2:") && e.contains("limits.streams must be between 1 and"),
            "{e}"
        );
        let e = err("[limits]\nhandles = 4194305\n");
        assert!(
            e.contains("limits.handles must be between 1 and 4194304"),
            "{e}"
        );
        let e =
            err("[[vm]]\nname = \"a\"\nmemory = \"1GiB\"\n[vm.limits]\nqueued_bytes = \"1MiB\"\n");
        assert!(
            e.starts_with("vgpu.toml:5:")
                && e.contains("limits.queued_bytes must be between 16MiB and 16GiB"),
            "{e}"
        );
        let e = err("[limits]\ngraph_bytes = \"65GiB\"\n");
        assert!(e.contains("limits.graph_bytes must be between"), "{e}");
        let e = err(
            "[[vm]]\nname = \"a\"\nmemory = \"1GiB\"\n[vm.limits]\ninterpreter_bytes = \"1MiB\"\n",
        );
        assert!(
            e.starts_with("vgpu.toml:5:")
                && e.contains("limits.interpreter_bytes must be between 64MiB and 64GiB"),
            "{e}"
        );
    }

    #[test]
    fn interpreter_bytes_default_per_file_and_per_vm() {
        let c = parse(
            "[limits]\ninterpreter_bytes = \"2GiB\"\n[[vm]]\nname = \"a\"\nmemory = \"1GiB\"\n\
             [[vm]]\nname = \"b\"\nmemory = \"1GiB\"\n[vm.limits]\ninterpreter_bytes = \"128MiB\"\n",
        )
        .unwrap();
        assert_eq!(c.vms[0].limits.interpreter_bytes, 2 << 30);
        assert_eq!(c.vms[1].limits.interpreter_bytes, 128 << 20);
        let none = parse("[[vm]]\nname = \"a\"\nmemory = \"1GiB\"\n").unwrap();
        assert_eq!(
            none.vms[0].limits.interpreter_bytes,
            crate::limits::DEFAULT_INTERPRETER_BYTES
        );
    }

    #[test]
    fn toml_syntax_errors_have_a_line() {
        let e = parse("[[vm]\nname = 1\n").unwrap_err();
        assert_eq!(e.line, 1, "{e}");
    }
}
