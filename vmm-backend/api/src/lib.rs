//! The bodies of vgpud's admin API (docs/admin-api.yaml) as Rust types: vgpud
//! serializes its responses from them and `vgpuctl` deserializes the same
//! types, so a field renamed on one side is a compile error on the other.
//!
//! The crate lives in `vmm-backend/api/`, beside the daemon that serves the
//! API (as cloud-hypervisor keeps its API types with the VMM): vgpud owns the
//! wire format, `vgpuctl` (`host-tools/`) is one client of it. It depends on
//! serde alone (serde_json for the few open-ended objects), not on the broker,
//! the config crate or vgpud, so any client can use it.
//!
//! The JSON is what the API served before these types existed: an `Option`
//! field that vgpud leaves empty is `null` (not left out), as it was. A test
//! (`tests/openapi.rs`) checks every schema of docs/admin-api.yaml against
//! the fields of its type.
//!
//! Request bodies ([`VmEntry`], [`VmUpdate`], [`SchedulingUpdate`]) are what
//! a client sends; vgpud checks them with the config file's rules (rendered
//! to TOML and parsed), so a request is refused with the file's messages.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

// ---------------------------------------------------------------------------
// Common

/// Every error response: `{"error": "…"}` (400, 403, 404, 405, 409, 413, 500).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiErrorBody {
    /// What is wrong and how to fix it.
    pub error: String,
}

/// A size in a request: bytes, or a whole number with B, KiB, MiB, GiB or TiB (`"2GiB"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Size {
    /// Bytes.
    Bytes(u64),
    /// A number with a unit, as the config file writes it.
    Text(String),
}

/// A device's counters that vgpud reports as an open set (`vsock.stats`,
/// `vgpu_device.stats`): name → value. The names are the device crates'
/// (docs/vsock.md, docs/vgpu-device.md).
pub type Counters = BTreeMap<String, u64>;

// ---------------------------------------------------------------------------
// GET /v1/info

/// `GET /v1/info`: the daemon.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Info {
    /// Always `vgpud`.
    pub name: String,
    /// vgpud's version.
    pub version: String,
    /// The guest protocol version.
    pub protocol_version: u32,
    /// Process id.
    pub pid: u32,
    /// Start time, seconds since the Unix epoch.
    pub started: u64,
    /// Seconds since the start.
    pub uptime_s: u64,
    /// The config file.
    pub config: String,
    /// The metrics endpoint's address (`IP:PORT`), if one.
    pub metrics_listen: Option<String>,
    /// The audit log, if one.
    pub audit_log: Option<String>,
    /// Number of devices.
    pub devices: u64,
    /// Number of VMs.
    pub vms: u64,
}

// ---------------------------------------------------------------------------
// Devices

/// `GET /v1/devices/{device}/scheduling` and the reply of its `PATCH`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scheduling {
    /// `fair` or `fixed`.
    pub policy: String,
    /// The time slice in milliseconds.
    pub slice_ms: u64,
    /// Percent of device time the batch class keeps.
    pub batch_min_share: u32,
}

/// The body of `PATCH /v1/devices/{device}/scheduling`: any subset.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedulingUpdate {
    /// `fair` or `fixed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The time slice in milliseconds (1-100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_ms: Option<u64>,
    /// Percent of device time the batch class keeps (0-50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_min_share: Option<u32>,
}

impl SchedulingUpdate {
    /// Whether the update changes nothing.
    pub fn is_empty(&self) -> bool {
        self.policy.is_none() && self.slice_ms.is_none() && self.batch_min_share.is_none()
    }
}

/// The body of `PATCH /v1/devices/{device}`: the device settings that change live besides its
/// scheduling.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceUpdate {
    /// How far the slices of the device's VMs may add up past its memory (1.0-16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overcommit: Option<f64>,
}

/// Time one VM had a kernel waiting while another ran (an entry of the contention matrix).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContentionUsage {
    /// The VM that waited.
    pub waiting: String,
    /// The VM that held the device.
    pub running: String,
    /// Since both VMs were created, in seconds.
    pub total_s: f64,
    /// Over the last hour, in seconds.
    pub last_hour_s: f64,
    /// Start (Unix seconds) of the minute of the last hour with the most, if any.
    pub peak_minute_start: Option<u64>,
    /// Contention in that minute, in seconds.
    pub peak_minute_s: f64,
}

/// Compute usage of one device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceUsage {
    /// Device time used by all VMs, in seconds.
    pub busy_s: f64,
    /// Share of the last second the device ran kernels (0–1).
    pub utilization_1s: f64,
    /// … of the last 10 seconds.
    pub utilization_10s: f64,
    /// … of the last 60 seconds.
    pub utilization_60s: f64,
    /// … of the last 10 minutes.
    pub utilization_10m: f64,
    /// Times the device passed from one VM to another.
    pub switches: u64,
    /// Kernels stopped at a preemption point.
    pub preemptions: u64,
    /// Time no VM held the device while a kernel that could run waited (stays 0), in seconds.
    pub idle_with_work_s: f64,
    /// Time the device idled because waiting VMs had spent their `fixed` caps, in seconds.
    pub idle_capped_s: f64,
    /// Time the device was kept for its holder while another VM waited, in seconds.
    pub anticipation_s: f64,
    /// Time from grants to the granted kernels' start while another VM waited, in seconds.
    pub handover_s: f64,
    /// The contention matrix: pairs with any contention.
    pub contention: Vec<ContentionUsage>,
    /// Device memory not allocated.
    pub memory_free: u64,
    /// Device memory in no VM's slice.
    pub memory_unsliced: u64,
    /// Part of the free memory no new slice can get (0–1).
    pub fragmentation: f64,
}

/// Where a device's memory lives (docs/memory.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DevicePlacement {
    /// The device's `overcommit` ratio, if set.
    pub overcommit: Option<f64>,
    /// Bytes on the device.
    pub device_bytes: u64,
    /// Bytes overflowed to host memory.
    pub host_bytes: u64,
    /// Bytes reserved by VMs.
    pub reserved: u64,
    /// The host-overflow budget of all devices.
    pub host_overflow_budget: u64,
    /// What of it is used.
    pub host_overflow_used: u64,
}

/// `GET /v1/devices` (an array) and `GET /v1/devices/{device}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// The device's name in the config.
    pub name: String,
    /// `sim` or `cuda`.
    pub kind: String,
    /// The model name.
    pub model: String,
    /// `GPU-…`, as guests see it.
    pub uuid: String,
    /// Device memory.
    pub memory_total: u64,
    /// Allocated by all VMs.
    pub memory_used: u64,
    /// The slices of its VMs added up.
    pub memory_sliced: u64,
    /// Where its memory lives.
    pub memory_placement: Option<DevicePlacement>,
    /// Utilization over the last second (0–1).
    pub utilization: Option<f64>,
    /// Compute usage.
    pub usage: Option<DeviceUsage>,
    /// Scheduling settings.
    pub scheduling: Option<Scheduling>,
    /// How the kernels running at once share its execution units now; `null` for a real GPU,
    /// whose block scheduler shares them.
    #[serde(default)]
    pub execution_units: Option<ExecutionUnits>,
    /// Its VMs' names.
    pub vms: Vec<String>,
}

/// A simulated GPU's execution units at one moment (its interpreter's workers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionUnits {
    /// Units the device has (the sim device's `workers`).
    pub total: u32,
    /// Units running a thread block.
    pub busy: u32,
    /// Workers of running kernels waiting for a unit.
    pub waiting: u32,
}

// ---------------------------------------------------------------------------
// GET /v1/gpus

/// A MIG instance of a GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MigInstance {
    /// GPU instance index.
    pub index: u32,
    /// Name, e.g. "NVIDIA A100 MIG 1g.5gb".
    pub name: Option<String>,
    /// `MIG-…` UUID.
    pub uuid: Option<String>,
    /// Memory of the instance.
    pub memory_total: Option<u64>,
}

/// One real GPU as NVML reports it; what NVML cannot tell is `null`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    /// NVML index.
    pub index: u32,
    /// Product name.
    pub name: Option<String>,
    /// `GPU-…` UUID.
    pub uuid: Option<String>,
    /// PCI bus id (`0000:3b:00.0`).
    pub pci: Option<String>,
    /// Total memory.
    pub memory_total: Option<u64>,
    /// Used memory.
    pub memory_used: Option<u64>,
    /// GPU utilization, percent.
    pub utilization_gpu: Option<u32>,
    /// Memory-controller utilization, percent.
    pub utilization_memory: Option<u32>,
    /// Temperature, °C.
    pub temperature_c: Option<u32>,
    /// Power draw, W.
    pub power_w: Option<f64>,
    /// MIG mode currently on.
    pub mig_enabled: Option<bool>,
    /// MIG mode after the next reset.
    pub mig_pending: Option<bool>,
    /// MIG instances.
    pub mig_instances: Vec<MigInstance>,
    /// SR-IOV virtual functions enabled.
    pub sriov_vfs: Option<u32>,
    /// SR-IOV virtual functions supported.
    pub sriov_vfs_total: Option<u32>,
}

/// `GET /v1/gpus`: the NVML inventory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    /// Whether NVML could be loaded.
    pub nvml: bool,
    /// The driver's version.
    pub driver_version: Option<String>,
    /// Why there are no GPUs.
    pub reason: Option<String>,
    /// The GPUs.
    pub gpus: Vec<Gpu>,
}

// ---------------------------------------------------------------------------
// GET /v1/profiles

/// A profile on one device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileDevice {
    /// The device.
    pub device: String,
    /// Its memory.
    pub memory_total: u64,
    /// The slices of every VM on it, added up.
    pub memory_sliced: u64,
    /// The slice a VM of this profile gets on it.
    pub memory: u64,
    /// VMs of this profile the whole device holds.
    pub slots: u64,
    /// VMs of this profile that fit in the unsliced memory now.
    pub free: u64,
    /// The VMs created from the profile on this device.
    pub vms: Vec<String>,
}

/// An element of `GET /v1/profiles`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    /// Its name.
    pub name: String,
    /// A fraction of the GPU (`1/4`) or a size.
    pub memory: String,
    /// Weight.
    pub weight: u32,
    /// Priority class.
    pub priority: String,
    /// Per device.
    pub devices: Vec<ProfileDevice>,
}

// ---------------------------------------------------------------------------
// VMs

/// A VM's charged memory by kind of allocation (docs/memory.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryByKind {
    /// `cuMemAlloc*`, module globals.
    pub plain: u64,
    /// Held by memory pools, in use or free.
    pub pool_reserved: u64,
    /// Handed out of pools (part of `pool_reserved`).
    pub pool_used: u64,
    /// `cuMemAllocManaged`.
    pub managed: u64,
    /// `cuMemHostAlloc`/`cuMemHostRegister` with `DEVICEMAP`.
    pub mapped_host: u64,
    /// `cuMemCreate`, mapped or not.
    pub vmm_physical: u64,
}

/// One budget of a VM and its use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// The budget.
    pub limit: u64,
    /// Requests refused for passing it since vgpud started.
    pub refused: u64,
    /// What is held against it (absent for `connections`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<u64>,
}

/// A VM's budgets besides memory, by config key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmLimits {
    /// Guest processes.
    pub sessions: Budget,
    /// Connections, greeted or not.
    pub connections: Budget,
    /// Modules loaded.
    pub modules: Budget,
    /// Bytes of module images.
    pub module_bytes: Budget,
    /// Streams.
    pub streams: Budget,
    /// Events.
    pub events: Budget,
    /// Other handles.
    pub handles: Budget,
    /// Host memory of queued asynchronous work.
    pub queued_bytes: Budget,
    /// Bytes of executable graphs.
    pub graph_bytes: Budget,
    /// Host memory of interpreter state of running launches.
    pub interpreter_bytes: Budget,
}

/// Where a VM's memory lives: reservation, overflow, and moves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmPlacement {
    /// Reserved device bytes.
    pub reserved: u64,
    /// `none` or `host`.
    pub overflow: String,
    /// Most bytes it may overflow to host memory.
    pub overflow_limit: u64,
    /// Bytes on the device.
    pub device_bytes: u64,
    /// Bytes overflowed to host memory.
    pub host_bytes: u64,
    /// Device bytes past the reservation.
    pub borrowed_bytes: u64,
    /// Moves to host memory.
    pub demotions: u64,
    /// Bytes moved to host memory.
    pub demoted_bytes: u64,
    /// Moves back to the device.
    pub promotions: u64,
    /// Bytes moved back.
    pub promoted_bytes: u64,
}

/// Compute and memory usage of one VM.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VmUsage {
    /// The weight in force now (a `[[vm.schedule]]` window's, or the base weight).
    pub weight_now: u32,
    /// The weight in force over the sum of its device's VMs' (the share when all are busy).
    pub configured_share: f64,
    /// Device time its kernels held the device, in seconds.
    pub busy_s: f64,
    /// Kernels run to completion.
    pub kernels_completed: u64,
    /// Kernels submitted and not finished.
    pub queued: u32,
    /// Times a running kernel of it was stopped.
    pub preemptions: u64,
    /// Total launch-to-start wait, in seconds.
    pub queue_wait_s: f64,
    /// Median launch-to-start wait of recent kernels, in seconds.
    pub queue_wait_p50_s: f64,
    /// 90th percentile, in seconds.
    pub queue_wait_p90_s: f64,
    /// 99th percentile, in seconds.
    pub queue_wait_p99_s: f64,
    /// Its `target_wait_p99`, in seconds.
    pub target_wait_p99_s: Option<f64>,
    /// Realtime kernels that waited past their deadline.
    pub deadline_misses: u64,
    /// Time it waited on a device idle because of its `fixed` cap, in seconds.
    pub capped_wait_s: f64,
    /// Think time between two batches of kernels, in seconds.
    pub think_time_s: f64,
    /// Share of the device's time over the last second (0–1).
    pub share_1s: f64,
    /// … over the last 10 seconds.
    pub share_10s: f64,
    /// … over the last 60 seconds.
    pub share_60s: f64,
    /// … over the last 10 minutes.
    pub share_10m: f64,
    /// Bytes charged to its slice now.
    pub memory_used: u64,
    /// Most bytes ever charged at once.
    pub memory_peak: u64,
    /// Most bytes charged at once over the last 24 hours.
    pub memory_high_water_24h: u64,
    /// The slice.
    pub memory_limit: u64,
}

/// [`PassthroughAssignment::state`] of a device bound to vfio-pci, ready for its VM.
pub const PASSTHROUGH_READY: &str = "ready";

/// A passthrough VM's device as the host shows it now (`GET /v1/passthrough`, an array).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassthroughAssignment {
    /// The VM.
    pub vm: String,
    /// Its device (PCI address).
    pub pci: String,
    /// `ready` (bound to vfio-pci), `unbound` (no driver), `host-driver` (bound to another
    /// driver) or `missing` (no such device now; VFs appear only once enabled).
    pub state: String,
    /// Bound driver.
    pub driver: Option<String>,
    /// IOMMU group.
    pub iommu_group: Option<u32>,
    /// The GPU of a virtual function.
    pub physfn: Option<String>,
    /// What to do when not ready.
    pub hint: Option<String>,
}

/// A session: one guest process's connection.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// Session id.
    pub id: u64,
    /// The guest process id, as the guest reported it.
    pub pid: u32,
    /// The process name.
    pub process: String,
    /// `unix:PATH`, `vsock:…` or `vgpu:…`.
    pub transport: String,
    /// Start, Unix seconds.
    pub started: u64,
    /// Bytes it holds.
    pub memory_used: u64,
}

/// A VM's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmStats {
    /// Sessions opened.
    pub sessions_total: u64,
    /// Bytes copied host to device.
    pub bytes_htod: u64,
    /// Bytes copied device to host.
    pub bytes_dtoh: u64,
    /// Kernels launched.
    pub kernels: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Module loads stopped at the device's watchdog deadline (`CUDA_ERROR_INVALID_PTX` to
    /// the guest); absent from older daemons' replies.
    #[serde(default)]
    pub module_loads_stopped: u64,
}

/// A VM's virtio-vsock device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VmVsock {
    /// The guest's CID.
    pub guest_cid: u64,
    /// The vhost-user socket.
    pub socket: String,
    /// Where other ports are forwarded.
    pub uds_path: String,
    /// The device's counters (`connections_open`, `device_resets`, …).
    pub stats: Counters,
}

/// A VM's virtio-vgpu device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VmVgpuDevice {
    /// The PCI device id it shows.
    pub device_id: u16,
    /// The vhost-user socket.
    pub socket: String,
    /// The device's counters (`sessions_open`, `bytes_from_guest`, …).
    pub stats: Counters,
}

/// A weight change the tuning controller made or would make.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WeightChange {
    /// The VM.
    pub vm: String,
    /// Its device.
    pub device: String,
    /// Weight in force before.
    pub from: u32,
    /// Weight after.
    pub to: u32,
    /// The baseline it adjusts (schedule window or base weight).
    pub baseline: u32,
    /// Why, with the numbers.
    pub reason: String,
    /// Unix time (seconds).
    pub time: u64,
    /// Applied (`auto`) or only advised.
    pub applied: bool,
}

/// The tuning controller's view of a VM.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VmTuning {
    /// `off`, `advise` or `auto`.
    pub mode: String,
    /// The weight it adjusts.
    pub baseline_weight: u32,
    /// Its adjustment (weight in force = baseline + adjust).
    pub adjust: i32,
    /// Lowest weight it may set.
    pub weight_min: u32,
    /// Highest weight it may set.
    pub weight_max: u32,
    /// The p99 launch-to-start target, in seconds.
    pub target_wait_p99_s: Option<f64>,
    /// The share the VM keeps, percent.
    pub min_share: Option<u32>,
    /// Its latest change.
    pub last_change: Option<WeightChange>,
}

/// `GET /v1/vms` (an array), `GET`, `PATCH /v1/vms/{vm}`, `POST /v1/vms`, `POST /v1/vms/{vm}/drain`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Vm {
    /// Its name.
    pub name: String,
    /// Its device.
    pub device: String,
    /// `running` or `draining`.
    pub state: String,
    /// Whether new sessions are accepted.
    pub accepting_sessions: bool,
    /// The memory slice.
    pub memory_limit: u64,
    /// Bytes charged to it.
    pub memory_used: u64,
    /// `memory_used` by kind.
    pub memory_by_kind: MemoryByKind,
    /// Budgets besides memory and their use.
    pub limits: VmLimits,
    /// Where its memory lives.
    pub memory_placement: Option<VmPlacement>,
    /// Base weight.
    pub weight: u32,
    /// Priority class.
    pub priority: String,
    /// Its device's policy.
    pub policy: Option<String>,
    /// Compute and memory usage.
    pub usage: VmUsage,
    /// Its sessions.
    pub sessions: Vec<Session>,
    /// Distinct guest processes.
    pub processes: u64,
    /// Counters.
    pub stats: VmStats,
    /// Its unix socket, if one.
    pub unix_socket: Option<String>,
    /// Its virtio-vsock device, if one.
    pub vsock: Option<VmVsock>,
    /// Its virtio-vgpu device, if one.
    pub vgpu_device: Option<VmVgpuDevice>,
    /// Its `[[vm]]` entry as it runs now, keys as in the config file (vgpu-config renders it).
    pub config: Option<Value>,
    /// The tuning controller's view.
    pub tuning: Option<VmTuning>,
}

/// `DELETE /v1/vms/{vm}`: what was released.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removal {
    /// The VM.
    pub removed: String,
    /// Sessions ended.
    pub sessions_ended: u64,
    /// Bytes released.
    pub memory_released: u64,
    /// Whether every session finished in time.
    pub complete: bool,
}

/// A `[[vm.schedule]]` window.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    /// Start, `HH:MM`.
    pub from: String,
    /// End, `HH:MM`.
    pub to: String,
    /// Weight in the window.
    pub weight: u32,
}

/// Budgets in a request (`[vm.limits]`): keys left out keep their values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Guest processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<u64>,
    /// Connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<u64>,
    /// Modules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modules: Option<u64>,
    /// Bytes of module images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_bytes: Option<Size>,
    /// Streams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<u64>,
    /// Events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<u64>,
    /// Other handles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handles: Option<u64>,
    /// Host memory of queued work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_bytes: Option<Size>,
    /// Bytes of executable graphs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_bytes: Option<Size>,
    /// Host memory of interpreter state of running launches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interpreter_bytes: Option<Size>,
}

/// The body of `POST /v1/vms`: a `[[vm]]` entry of the config file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmEntry {
    /// The VM's name.
    pub name: String,
    /// Its device (may be left out when vgpud has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Its slice (or from `profile`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Size>,
    /// A `[[profile]]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// `user[:group]` its sockets are given to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_owner: Option<String>,
    /// Weight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// `realtime`, `normal` or `batch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    /// A unix socket for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unix_socket: Option<String>,
    /// A vhost-user socket (needs `guest_cid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost_user_socket: Option<String>,
    /// The guest's CID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_cid: Option<u64>,
    /// Where other vsock ports are forwarded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock_uds_path: Option<String>,
    /// Weight windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Vec<Window>>,
    /// Budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
}

/// The body of `PATCH /v1/vms/{vm}`: any subset.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmUpdate {
    /// The slice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Size>,
    /// Reserved device memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved: Option<Size>,
    /// `none` or `host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overflow: Option<String>,
    /// Most bytes overflowed to host memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overflow_limit: Option<Size>,
    /// Weight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// `realtime`, `normal` or `batch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    /// The p99 launch-to-start target (`"5ms"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_wait_p99: Option<String>,
    /// The share the tuner keeps, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_share: Option<u32>,
    /// Lowest weight the tuner may set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_min: Option<u32>,
    /// Highest weight the tuner may set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_max: Option<u32>,
    /// Budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
}

// ---------------------------------------------------------------------------
// POST /v1/reload

/// One applied or refused change of a reload.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReloadChange {
    /// What changed.
    pub change: String,
    /// The state before (a VM's `[[vm]]` entry or a device's scheduling).
    pub before: Option<Value>,
    /// The state after.
    pub after: Option<Value>,
    /// `ok` or `refused`.
    pub result: String,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `POST /v1/reload`: what a reload did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReloadReport {
    /// Changes applied.
    pub applied: Vec<String>,
    /// Changes refused, with why.
    pub refused: Vec<String>,
    /// Changes that need a restart.
    pub restart_needed: Vec<String>,
    /// Every applied or refused change with the state before and after.
    pub changes: Vec<ReloadChange>,
}

impl ReloadReport {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.applied.is_empty()
            && self.refused.is_empty()
            && self.restart_needed.is_empty()
            && self.changes.is_empty()
    }
}

// ---------------------------------------------------------------------------
// GET /v1/analyze

/// A pair of VMs that contend.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Hotspot {
    /// Device.
    pub device: String,
    /// The VM that waited.
    pub waiting: String,
    /// The VM it waited behind.
    pub running: String,
    /// Contention over the last hour, in seconds.
    pub last_hour_s: f64,
    /// Since both VMs were created, in seconds.
    pub total_s: f64,
    /// Start (Unix seconds) of the minute with the most contention.
    pub peak_minute_start: Option<u64>,
    /// Contention in that minute, in seconds.
    pub peak_minute_s: f64,
}

/// Something that limits a device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Bottleneck {
    /// `capped_while_idle`, `oversized_slice`, `fragmentation`,
    /// `memory_full_compute_idle`, `target_missed_at_bound`.
    pub kind: String,
    /// Device.
    pub device: String,
    /// The VM concerned, if one.
    pub vm: Option<String>,
    /// What, with the numbers.
    pub detail: String,
}

/// A concrete change to make.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recommendation {
    /// The VM.
    pub vm: String,
    /// `memory` or `weight`.
    pub setting: String,
    /// Current value (bytes for memory).
    pub from: u64,
    /// Recommended value.
    pub to: u64,
    /// The sentence an operator reads.
    pub text: String,
}

/// The tuning controller in `GET /v1/analyze`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TuningReport {
    /// `off`, `advise` or `auto`.
    pub mode: String,
    /// Seconds between rounds.
    pub interval_s: f64,
    /// Rounds run.
    pub runs: u64,
    /// The changes of the latest round that still hold.
    pub latest: Vec<WeightChange>,
    /// Every change, oldest first.
    pub history: Vec<WeightChange>,
}

/// `GET /v1/analyze`: what `vgpuctl analyze` shows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Analysis {
    /// The most contended pairs, the worst first.
    pub hotspots: Vec<Hotspot>,
    /// What limits the devices.
    pub bottlenecks: Vec<Bottleneck>,
    /// Changes with numbers.
    pub recommendations: Vec<Recommendation>,
    /// The controller.
    pub tuning: TuningReport,
}
