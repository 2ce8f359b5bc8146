//! The daemon: builds devices and the broker from a config, runs the VMs'
//! transports, the admin API and the metrics endpoint, and applies live
//! changes (API requests and `SIGHUP` reloads) with the config file's rules.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use thiserror::Error;
use tracing::{error, info, warn};
use vgpu_broker::device::Device;
use vgpu_broker::tenant::Tenant;
use vgpu_broker::{Broker, BrokerError, VmUpdate};
use vgpu_config::reload::{self, Change, ChangeError};
use vgpu_config::{Config, DeviceConfig, DeviceKind, DeviceModel, VmConfig, VmMode};
use vgpu_seccomp::ThreadKind;
use vgpu_sim::{SimConfig, SimDevice};
use vgpu_vhost_vgpu::{self as vgpu_dev, VgpuDevConfig, VgpuDevServer, VgpuDevStats};
use vgpu_vhost_vsock::{self as vsock, StopHandle, VsockConfig, VsockServer, VsockStats};

use crate::audit::{Actor, AuditError, AuditLog, Durability};
use crate::gpu_port::GpuPortConnector;
use crate::inventory::Inventory;
use crate::listener::{Listener, ListenerError};
use crate::session_hub::{EndReason, SessionHub};
use crate::vgpu_service::BrokerService;

/// How long removing a VM waits for its sessions to end and release their memory.
pub const SESSION_END_TIMEOUT: Duration = Duration::from_secs(10);
/// How often removing a VM looks whether its virtio-vgpu sessions have ended.
const DEVICE_SESSION_POLL: Duration = Duration::from_millis(5);

/// Why the daemon could not start, or a VM could not be started.
#[derive(Debug, Error)]
pub enum DaemonError {
    /// A device could not be created.
    #[error("device `{name}`: {message}")]
    Device {
        /// Device name.
        name: String,
        /// Why.
        message: String,
    },
    /// A VM's profile could not be sized on its device.
    #[error("{0}")]
    Profile(String),
    /// A VM's sockets could not be given to its `socket_owner`.
    #[error("VM `{vm}`: socket_owner: {message}")]
    SocketOwner {
        /// VM name.
        vm: String,
        /// Why, and what to do.
        message: String,
    },
    /// A tenant could not be added.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// A socket could not be set up.
    #[error(transparent)]
    Listener(#[from] ListenerError),
    /// A VM's vsock device could not be set up.
    #[error("VM `{vm}`: cannot start its vsock device")]
    Vsock {
        /// VM name.
        vm: String,
        /// Cause.
        #[source]
        source: vsock::Error,
    },
    /// A VM's virtio-vgpu device could not be set up.
    #[error("VM `{vm}`: cannot start its virtio-vgpu device")]
    VgpuDev {
        /// VM name.
        vm: String,
        /// Cause.
        #[source]
        source: vgpu_dev::Error,
    },
    /// The audit log could not be opened.
    #[error(transparent)]
    Audit(#[from] AuditError),
    /// A passthrough assignment conflicts or names an unusable device.
    #[error(transparent)]
    Passthrough(#[from] crate::passthrough::PassthroughError),
    /// The metrics endpoint could not be opened.
    #[error(
        "cannot serve metrics on {addr}: is another exporter using the port? change [admin] metrics_listen"
    )]
    Metrics {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// A VM's vsock device while it runs.
#[derive(Debug)]
pub struct RunningVsock {
    /// VM name.
    pub vm: String,
    /// Its configuration.
    pub config: VsockConfig,
    /// Its counters.
    pub stats: Arc<VsockStats>,
    stop: StopHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for RunningVsock {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A VM's virtio-vgpu device while it runs.
#[derive(Debug)]
pub struct RunningVgpuDev {
    /// Its configuration.
    pub config: VgpuDevConfig,
    /// Its counters.
    pub stats: Arc<VgpuDevStats>,
    stop: StopHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for RunningVgpuDev {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The transports of one VM.
#[derive(Debug, Default)]
pub struct VmTransports {
    /// Its unix-socket listener.
    pub listener: Option<Listener>,
    /// Its vsock device.
    pub vsock: Option<RunningVsock>,
    /// Its virtio-vgpu device.
    pub vgpu_dev: Option<RunningVgpuDev>,
}

/// Worker threads of a simulated GPU when the config does not say.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Resolves `user[:group]` (names or numbers) to ids; a user without a
/// group gets the user's primary group.
pub fn resolve_owner(owner: &str) -> Result<(u32, u32), String> {
    let (user, group) = match owner.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (owner, None),
    };
    let cstr = |s: &str| std::ffi::CString::new(s).map_err(|_| format!("`{s}` holds a NUL byte"));
    let (uid, primary) = match user.parse::<u32>() {
        Ok(n) => (n, None),
        Err(_) => {
            let c = cstr(user)?;
            // SAFETY: `c` is a valid C string; getpwnam's result is read
            // at once, before another call can overwrite it.
            let pw = unsafe { libc::getpwnam(c.as_ptr()) };
            if pw.is_null() {
                return Err(format!(
                    "no user `{user}` on this host (is libvirt installed? its QEMU runs as libvirt-qemu on Debian, qemu on Fedora)"
                ));
            }
            // SAFETY: `pw` is non-null and points at getpwnam's static record.
            let pw = unsafe { &*pw };
            let (u, g) = (pw.pw_uid, pw.pw_gid);
            (u, Some(g))
        }
    };
    let gid = match group {
        None => primary.unwrap_or(uid),
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => {
                let c = cstr(g)?;
                // SAFETY: as for getpwnam above.
                let gr = unsafe { libc::getgrnam(c.as_ptr()) };
                if gr.is_null() {
                    return Err(format!("no group `{g}` on this host"));
                }
                // SAFETY: `gr` is non-null and points at getgrnam's static record.
                unsafe { (*gr).gr_gid }
            }
        },
    };
    Ok((uid, gid))
}

/// Gives a VM's sockets to its `socket_owner`, mode 0660.
fn give_sockets(vm: &VmConfig, owner: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let (uid, gid) = resolve_owner(owner)?;
    for p in [&vm.unix_socket, &vm.vhost_user_socket, &vm.vsock_uds_path]
        .into_iter()
        .flatten()
    {
        if !p.exists() {
            continue;
        }
        std::os::unix::fs::chown(p, Some(uid), Some(gid))
            .and_then(|()| std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o660)))
            .map_err(|e| format!("cannot give {} to {owner} ({uid}:{gid}): {e}; vgpud must run as root to give sockets away", p.display()))?;
    }
    Ok(())
}

/// Devices with their config names.
pub type NamedDevices = Vec<(String, Arc<dyn Device>)>;

/// Creates the devices a config declares.
pub fn build_devices(config: &Config) -> Result<NamedDevices, DaemonError> {
    config
        .devices
        .iter()
        .map(|d| {
            let dev: Arc<dyn Device> = match &d.kind {
                DeviceKind::Sim => Arc::new(SimDevice::new(SimConfig {
                    name: d.name.clone(),
                    memory: d.memory,
                    workers: d.workers.unwrap_or_else(default_workers),
                    watchdog: d.watchdog,
                })),
                DeviceKind::Cuda { .. } => {
                    vgpu_cuda::CudaDevice::open(d).map_err(|e| DaemonError::Device {
                        name: d.name.clone(),
                        message: e.to_string(),
                    })?
                }
            };
            Ok((d.name.clone(), dev))
        })
        .collect()
}

/// What kind of failure an admin operation met (the admin API maps each to an HTTP status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpErrorKind {
    /// The request is invalid.
    Invalid,
    /// No such VM or device.
    NotFound,
    /// The request conflicts with the current state (e.g. shrinking a slice below its use).
    Conflict,
    /// vgpud failed to carry it out.
    Failed,
}

/// Why an admin operation failed: its kind and a message that says what to do.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct OpError {
    /// What kind of failure.
    pub kind: OpErrorKind,
    /// What went wrong and what to do.
    pub message: String,
}

impl OpError {
    fn new(kind: OpErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
    fn not_found_vm(name: &str) -> Self {
        Self::new(
            OpErrorKind::NotFound,
            format!("no VM named `{name}`; `vgpuctl vm list` shows the VMs"),
        )
    }
    fn not_found_device(name: &str) -> Self {
        Self::new(
            OpErrorKind::NotFound,
            format!("no device named `{name}`; `vgpuctl device list` shows the devices"),
        )
    }
}

impl From<ChangeError> for OpError {
    fn from(e: ChangeError) -> Self {
        OpError::new(OpErrorKind::Invalid, e.to_string())
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

impl From<DaemonError> for OpError {
    fn from(e: DaemonError) -> Self {
        let kind = match &e {
            DaemonError::Listener(_) | DaemonError::Vsock { .. } => OpErrorKind::Conflict,
            DaemonError::SocketOwner { .. } => OpErrorKind::Invalid,
            _ => OpErrorKind::Failed,
        };
        OpError::new(kind, error_chain(&e))
    }
}

/// What removing a VM did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Removal {
    /// Connections that were ended.
    pub sessions_ended: usize,
    /// Bytes of the slice that were in use when it was removed.
    pub memory_released: u64,
    /// Whether every session had ended (and released its memory) in time.
    pub complete: bool,
}

/// What a reload did (`POST /v1/reload`).
pub use vgpu_api::ReloadReport;

struct State {
    /// The configuration running now (the file plus API changes).
    running: Config,
    /// The file as last applied: reloads apply the file's differences to it.
    baseline: Config,
    transports: BTreeMap<String, VmTransports>,
}

/// Everything the admin API, the metrics endpoint and reloads work on.
pub struct Runtime {
    broker: Arc<Broker>,
    hub: Arc<SessionHub>,
    audit: Option<Arc<AuditLog>>,
    inventory: Inventory,
    started: SystemTime,
    /// Serialises changes (each may wait for sessions to end).
    changes: Mutex<()>,
    state: RwLock<State>,
    metrics_addr: Mutex<Option<SocketAddr>>,
    passthrough: RwLock<crate::passthrough::PassthroughRegistry>,
    host_roots: crate::passthrough::HostRoots,
    tuner: Arc<crate::tuning::Tuner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("broker", &self.broker)
            .finish()
    }
}

fn vm_json_config(v: &VmConfig) -> Value {
    serde_json::to_value(reload::vm_table(v)).unwrap_or(Value::Null)
}

impl Runtime {
    /// The broker.
    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    /// The session hub.
    pub fn hub(&self) -> &Arc<SessionHub> {
        &self.hub
    }

    /// The tuning controller.
    pub fn tuner(&self) -> &Arc<crate::tuning::Tuner> {
        &self.tuner
    }

    /// Records a change of the tuning controller in the audit log (`vm.tune`).
    pub fn record_tuning(&self, actor: Actor, detail: Value) {
        self.record(actor, "vm.tune", detail, Ok(()));
    }

    /// The NVML inventory.
    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// The audit log, if configured.
    pub fn audit(&self) -> Option<&Arc<AuditLog>> {
        self.audit.as_ref()
    }

    /// When the daemon started.
    pub fn started(&self) -> SystemTime {
        self.started
    }

    /// Where the metrics endpoint listens (the bound address, also when the
    /// config asked for port 0).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        *self.metrics_addr.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    fn serialise(&self) -> MutexGuard<'_, ()> {
        self.changes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The running configuration (the file plus live changes).
    pub fn running_config(&self) -> Config {
        self.read().running.clone()
    }

    /// The running configuration of a VM.
    pub fn vm_config(&self, name: &str) -> Option<VmConfig> {
        self.read()
            .running
            .vms
            .iter()
            .find(|v| v.name == name)
            .cloned()
    }

    /// Counters and configuration of a VM's vsock device.
    pub fn vsock_of(&self, vm: &str) -> Option<(VsockConfig, vsock::VsockStatsSnapshot)> {
        let st = self.read();
        let d = st.transports.get(vm)?.vsock.as_ref()?;
        Some((d.config.clone(), d.stats.snapshot()))
    }

    /// Counters and configuration of a VM's virtio-vgpu device.
    pub fn vgpu_dev_of(&self, vm: &str) -> Option<(VgpuDevConfig, vgpu_dev::VgpuDevStatsSnapshot)> {
        let st = self.read();
        let d = st.transports.get(vm)?.vgpu_dev.as_ref()?;
        Some((d.config.clone(), d.stats.snapshot()))
    }

    /// The path of a VM's unix-socket listener.
    pub fn unix_socket_of(&self, vm: &str) -> Option<PathBuf> {
        let st = self.read();
        Some(
            st.transports
                .get(vm)?
                .listener
                .as_ref()?
                .path()
                .to_path_buf(),
        )
    }

    fn record(&self, actor: Actor, event: &str, detail: Value, outcome: Result<(), &str>) {
        if let Some(a) = &self.audit {
            a.change(actor, event, detail, outcome);
        }
    }

    /// Starts a VM's tenant and transports; on failure nothing is left.
    fn start_vm(&self, vm: &VmConfig) -> Result<VmTransports, DaemonError> {
        let tenant = self.broker.add_tenant(vm)?;
        let started = self.start_transports(vm, &tenant);
        if started.is_err() {
            self.broker.remove_tenant(&vm.name);
        }
        started
    }

    fn start_transports(
        &self,
        vm: &VmConfig,
        tenant: &Arc<Tenant>,
    ) -> Result<VmTransports, DaemonError> {
        let mut t = VmTransports::default();
        if let Some(path) = &vm.unix_socket {
            t.listener = Some(Listener::start(
                Arc::clone(&self.hub),
                Arc::clone(&self.broker),
                Arc::clone(tenant),
                path,
            )?);
            info!(vm = %vm.name, socket = %path.display(), "listening");
        }
        if let (Some(socket), DeviceModel::Vgpu { device_id }) =
            (&vm.vhost_user_socket, vm.device_model)
        {
            let mut config = VgpuDevConfig::new(&vm.name, socket);
            config.device_id = device_id;
            let service = Arc::new(BrokerService::new(
                Arc::clone(&self.broker),
                Arc::clone(tenant),
                self.audit.clone(),
            ));
            t.vgpu_dev = Some(start_vgpu_dev(&vm.name, config, service)?);
            info!(vm = %vm.name, socket = %socket.display(), device_id, "vhost-user virtio-vgpu device ready");
        } else if let (Some(socket), Some(cid), Some(uds)) =
            (&vm.vhost_user_socket, vm.guest_cid, &vm.vsock_uds_path)
        {
            let connector = Arc::new(GpuPortConnector::new(
                Arc::clone(&self.hub),
                Arc::clone(&self.broker),
                Arc::clone(tenant),
                cid,
            ));
            t.vsock = Some(start_vsock(
                &vm.name,
                VsockConfig::new(cid, socket, uds),
                connector,
            )?);
            info!(vm = %vm.name, socket = %socket.display(), cid, "vhost-user vsock device ready");
        }
        if let Some(owner) = &vm.socket_owner {
            give_sockets(vm, owner).map_err(|message| DaemonError::SocketOwner {
                vm: vm.name.clone(),
                message,
            })?;
        }
        Ok(t)
    }

    /// Removes a VM: refuses new sessions, closes its transports, ends its
    /// sessions and waits (bounded) until they have released everything.
    fn stop_vm(&self, name: &str, reason: EndReason) -> Removal {
        let transports = self.write().transports.remove(name);
        let tenant = self.broker.remove_tenant(name);
        let memory = tenant.as_ref().map_or(0, |t| t.slice.used());
        // Every session (unix socket or vsock GPU port) is ended through its
        // socket; then the listener and the vsock device close. Closing the
        // virtio-vgpu device resets it, which ends its sessions (open files of
        // the guest's /dev/vgpuN) once their current call returns.
        let device = transports
            .as_ref()
            .and_then(|t| t.vgpu_dev.as_ref())
            .map(|d| Arc::clone(&d.stats));
        let device_sessions = device.as_ref().map_or(0, |s| s.snapshot().sessions_open) as usize;
        let sessions_ended = self.hub.end_sessions_of(name, reason) + device_sessions;
        drop(transports);
        let deadline = Instant::now() + SESSION_END_TIMEOUT;
        let complete = self.hub.wait_ended(Some(name), SESSION_END_TIMEOUT)
            && device.is_none_or(|s| wait_device_sessions_ended(&s, deadline));
        if !complete {
            warn!(
                vm = name,
                "some sessions are still finishing their current call"
            );
        }
        info!(vm = name, sessions = sessions_ended, memory, "VM removed");
        Removal {
            sessions_ended,
            memory_released: memory,
            complete,
        }
    }

    /// Adds a VM from a JSON `[[vm]]` entry.
    pub fn add_vm(&self, actor: Actor, body: &Value) -> Result<VmConfig, OpError> {
        let _g = self.serialise();
        let r = self.add_vm_locked(body);
        let name = body.get("name").cloned().unwrap_or(Value::Null);
        match &r {
            Ok(vm) => self.record(
                actor,
                "vm.add",
                json!({ "vm": name, "before": null, "after": vm_json_config(vm) }),
                Ok(()),
            ),
            Err(e) => self.record(
                actor,
                "vm.add",
                json!({ "vm": name, "request": body }),
                Err(&e.message),
            ),
        }
        r
    }

    /// Sizes the slices of VMs whose profile is a fraction of a real GPU.
    fn resolve_profiles(&self, c: &mut Config) -> Result<(), OpError> {
        c.resolve_profile_memory(|d| self.broker.device(d).map(|x| x.info().total_memory))
            .map_err(|e| OpError::new(OpErrorKind::Invalid, e))
    }

    fn add_vm_locked(&self, body: &Value) -> Result<VmConfig, OpError> {
        let entry = reload::json_to_table(body)?;
        let running = self.running_config();
        let (mut candidate, mut vm) = reload::with_vm_added(&running, entry)?;
        if vm.memory == 0 {
            self.resolve_profiles(&mut candidate)?;
            if let Some(v) = candidate.vms.iter().find(|v| v.name == vm.name) {
                vm = v.clone();
            }
        }
        let t = self.start_vm(&vm)?;
        let mut st = self.write();
        st.transports.insert(vm.name.clone(), t);
        st.running = candidate;
        info!(vm = %vm.name, "VM added");
        Ok(vm)
    }

    /// Removes a VM; its sessions end and release everything.
    pub fn remove_vm(&self, actor: Actor, name: &str) -> Result<Removal, OpError> {
        let _g = self.serialise();
        let before = self.vm_config(name);
        let Some(before) = before.filter(|v| v.mode == VmMode::Shared) else {
            let e = OpError::not_found_vm(name);
            self.record(actor, "vm.remove", json!({ "vm": name }), Err(&e.message));
            return Err(e);
        };
        let r = self.stop_vm(name, EndReason::VmRemoved);
        self.write().running.vms.retain(|v| v.name != name);
        self.record(
            actor,
            "vm.remove",
            json!({
                "vm": name, "before": vm_json_config(&before), "after": null,
                "sessions_ended": r.sessions_ended, "memory_released": r.memory_released,
            }),
            Ok(()),
        );
        Ok(r)
    }

    /// Changes a VM's memory slice, weight or priority live.
    pub fn update_vm(&self, actor: Actor, name: &str, body: &Value) -> Result<VmConfig, OpError> {
        let _g = self.serialise();
        let before = self.vm_config(name);
        let r = self.update_vm_locked(name, body);
        match &r {
            Ok(after) => self.record(
                actor,
                "vm.update",
                json!({ "vm": name, "before": before.as_ref().map(vm_json_config), "after": vm_json_config(after) }),
                Ok(()),
            ),
            Err(e) => self.record(
                actor,
                "vm.update",
                json!({ "vm": name, "request": body }),
                Err(&e.message),
            ),
        }
        r
    }

    fn update_vm_locked(&self, name: &str, body: &Value) -> Result<VmConfig, OpError> {
        const LIVE_KEYS: [&str; 11] = [
            "limits",
            "memory",
            "reserved",
            "overflow",
            "overflow_limit",
            "weight",
            "priority",
            "target_wait_p99",
            "min_share",
            "weight_min",
            "weight_max",
        ];
        let Some(old) = self.vm_config(name).filter(|v| v.mode == VmMode::Shared) else {
            return Err(OpError::not_found_vm(name));
        };
        let changes = reload::json_to_table(body)?;
        if changes.is_empty() {
            return Err(OpError::new(
                OpErrorKind::Invalid,
                "nothing to change: give memory, reserved, overflow, overflow_limit, weight, priority, target_wait_p99, min_share, weight_min, weight_max and/or limits",
            ));
        }
        if let Some(k) = changes.keys().find(|k| !LIVE_KEYS.contains(&k.as_str())) {
            return Err(OpError::new(
                OpErrorKind::Invalid,
                format!(
                    "`{k}` cannot change while the VM runs (memory, reserved, overflow, weight and priority can); remove the VM and add it again to change it"
                ),
            ));
        }
        let mut entry = reload::vm_table(&old);
        // Without overflow there is no limit: `overflow = "none"` drops the old one.
        let drops_limit = changes.get("overflow").and_then(|v| v.as_str()) == Some("none")
            && !changes.contains_key("overflow_limit");
        entry.extend(changes);
        if drops_limit {
            entry.remove("overflow_limit");
        }
        let new = self.validated_vm_entry(name, entry)?;
        self.apply_vm_update(&old, &new)?;
        Ok(new)
    }

    /// The running config with `name`'s entry replaced by `entry`, checked
    /// with the config rules; returns the VM as the rules read it.
    fn validated_vm_entry(&self, name: &str, entry: toml::Table) -> Result<VmConfig, OpError> {
        let mut others = self.running_config();
        others.vms.retain(|v| v.name != name);
        let (_, vm) = reload::with_vm_added(&others, entry)?;
        Ok(vm)
    }

    /// Applies a live-updatable difference of one VM to the broker and the
    /// running config.
    fn apply_vm_update(&self, old: &VmConfig, new: &VmConfig) -> Result<(), OpError> {
        let u = VmUpdate {
            memory: (new.memory != old.memory).then_some(new.memory),
            weight: (new.weight != old.weight).then_some(new.weight),
            priority: (new.priority != old.priority).then_some(new.priority),
            limits: (new.limits != old.limits).then_some(new.limits),
            memory_policy: (new.memory_policy != old.memory_policy).then_some(new.memory_policy),
        };
        self.broker.update_vm(&new.name, &u).map_err(|e| match e {
            BrokerError::NoSuchVm(n) => OpError::not_found_vm(&n),
            other => OpError::new(OpErrorKind::Conflict, other.to_string()),
        })?;
        if let Some(t) = self.broker.tenant(&new.name) {
            t.scheduler()
                .set_target_wait(t.sched_id(), new.tuning.target_wait_p99);
        }
        let mut st = self.write();
        if let Some(v) = st.running.vms.iter_mut().find(|v| v.name == new.name) {
            *v = new.clone();
        }
        info!(vm = %new.name, memory = new.memory, weight = new.weight, priority = new.priority.as_str(), "VM updated");
        Ok(())
    }

    /// Drains a VM: new sessions are refused, running sessions go on until
    /// they end.
    pub fn drain_vm(&self, actor: Actor, name: &str) -> Result<Arc<Tenant>, OpError> {
        let _g = self.serialise();
        let Some(t) = self.broker.tenant(name) else {
            let e = OpError::not_found_vm(name);
            self.record(actor, "vm.drain", json!({ "vm": name }), Err(&e.message));
            return Err(e);
        };
        let was_open = t.is_open();
        t.close();
        info!(vm = name, sessions = t.sessions().len(), "VM draining");
        self.record(
            actor,
            "vm.drain",
            json!({
                "vm": name, "before": { "accepting_sessions": was_open },
                "after": { "accepting_sessions": false }, "sessions": t.sessions().len(),
            }),
            Ok(()),
        );
        Ok(t)
    }

    /// Changes a device's scheduling settings (`policy`, `slice_ms`,
    /// `batch_min_share`).
    pub fn set_scheduling(
        &self,
        actor: Actor,
        device: &str,
        body: &Value,
    ) -> Result<vgpu_api::Scheduling, OpError> {
        let _g = self.serialise();
        let before = self.broker.scheduling(device).map(|s| scheduling(&s));
        let r = self.set_scheduling_locked(device, body);
        match &r {
            Ok(after) => self.record(
                actor,
                "device.scheduling",
                json!({ "device": device, "before": before, "after": after }),
                Ok(()),
            ),
            Err(e) => self.record(
                actor,
                "device.scheduling",
                json!({ "device": device, "request": body }),
                Err(&e.message),
            ),
        }
        r
    }

    fn set_scheduling_locked(
        &self,
        device: &str,
        body: &Value,
    ) -> Result<vgpu_api::Scheduling, OpError> {
        const KEYS: [&str; 3] = ["policy", "slice_ms", "batch_min_share"];
        if self.broker.device(device).is_none() {
            return Err(OpError::not_found_device(device));
        }
        let changes = reload::json_to_table(body)?;
        if changes.is_empty() {
            return Err(OpError::new(
                OpErrorKind::Invalid,
                "nothing to change: give policy, slice_ms and/or batch_min_share",
            ));
        }
        if let Some(k) = changes.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(OpError::new(
                OpErrorKind::Invalid,
                format!(
                    "`{k}` is not a scheduling setting: use policy, slice_ms or batch_min_share"
                ),
            ));
        }
        let mut candidate = self.running_config();
        let Some(i) = candidate.devices.iter().position(|d| d.name == device) else {
            return Err(OpError::not_found_device(device));
        };
        let policy = changes.get("policy");
        if let Some(p) = policy {
            let s = p.as_str().ok_or_else(|| {
                OpError::new(OpErrorKind::Invalid, "policy must be \"fair\" or \"fixed\"")
            })?;
            candidate.devices[i].scheduling.policy =
                vgpu_config::Policy::parse(s).ok_or_else(|| {
                    OpError::new(
                        OpErrorKind::Invalid,
                        format!("unknown policy `{s}`: use \"fair\" (weighted, work-conserving) or \"fixed\" (hard caps)"),
                    )
                })?;
        }
        let int = |k: &str| -> Result<Option<u64>, OpError> {
            changes
                .get(k)
                .map(|v| {
                    v.as_integer()
                        .and_then(|i| u64::try_from(i).ok())
                        .ok_or_else(|| {
                            OpError::new(
                                OpErrorKind::Invalid,
                                format!("{k} must be a whole number"),
                            )
                        })
                })
                .transpose()
        };
        if let Some(ms) = int("slice_ms")? {
            candidate.devices[i].scheduling.slice = Duration::from_millis(ms);
        }
        if let Some(b) = int("batch_min_share")? {
            candidate.devices[i].scheduling.batch_min_share = u32::try_from(b).unwrap_or(u32::MAX);
        }
        let checked = reload::validate(&candidate)?;
        let s = checked.devices[i].scheduling;
        self.broker
            .set_scheduling(device, s)
            .map_err(|e| OpError::new(OpErrorKind::Conflict, e.to_string()))?;
        self.write().running.devices[i].scheduling = s;
        info!(
            device,
            policy = s.policy.as_str(),
            slice_ms = s.slice.as_millis() as u64,
            "scheduling changed"
        );
        Ok(scheduling(&s))
    }

    /// Changes a device's settings that are not scheduling (`overcommit`), live.
    pub fn set_device(&self, actor: Actor, device: &str, body: &Value) -> Result<(), OpError> {
        let _g = self.serialise();
        let before = self.overcommit_json(device);
        let r = self.set_device_locked(device, body);
        let detail = match &r {
            Ok(()) => {
                json!({ "device": device, "before": before, "after": self.overcommit_json(device) })
            }
            Err(_) => json!({ "device": device, "request": body }),
        };
        self.record(
            actor,
            "device.set",
            detail,
            r.as_ref().map(|_| ()).map_err(|e| e.message.as_str()),
        );
        r
    }

    fn set_device_locked(&self, device: &str, body: &Value) -> Result<(), OpError> {
        if self.broker.device(device).is_none() {
            return Err(OpError::not_found_device(device));
        }
        let update: vgpu_api::DeviceUpdate = serde_json::from_value(body.clone())
            .map_err(|e| OpError::new(OpErrorKind::Invalid, format!("bad device change: {e}")))?;
        let Some(oc) = update.overcommit else {
            return Err(OpError::new(
                OpErrorKind::Invalid,
                "nothing to change: give overcommit",
            ));
        };
        let oc = vgpu_config::Overcommit::checked(oc)
            .map_err(|m| OpError::new(OpErrorKind::Invalid, m))?;
        self.apply_overcommit(device, oc)?;
        info!(device, overcommit = oc.as_f64(), "overcommit changed");
        Ok(())
    }

    /// Reloads the config file: applies what changed in it since it was
    /// last applied, with the same rules as the API.
    pub fn reload(&self, actor: Actor, path: &Path) -> Result<ReloadReport, OpError> {
        let _g = self.serialise();
        let new = match Config::load(path)
            .map_err(|e| e.to_string())
            .and_then(|mut c| {
                self.resolve_profiles(&mut c).map_err(|e| e.message)?;
                Ok(c)
            }) {
            Ok(c) => c,
            Err(e) => {
                let msg = format!("the config file is invalid, nothing was changed: {e}");
                error!("{msg}");
                self.record(actor, "config.reload", json!({ "file": path }), Err(&msg));
                return Err(OpError::new(OpErrorKind::Invalid, msg));
            }
        };
        // Passthrough assignments change only if the new set is consistent.
        match crate::passthrough::PassthroughRegistry::from_config(&new, &self.host_roots) {
            Ok(r) => *self.passthrough.write().unwrap_or_else(|p| p.into_inner()) = r,
            Err(e) => {
                let msg = format!(
                    "the config's passthrough assignments are refused, nothing was changed: {e}"
                );
                error!("{msg}");
                self.record(actor, "config.reload", json!({ "file": path }), Err(&msg));
                return Err(OpError::new(OpErrorKind::Invalid, msg));
            }
        }
        let report = self.apply_file(&new);
        self.record(
            actor,
            "config.reload",
            json!({
                "file": path, "applied": report.applied, "refused": report.refused,
                "restart_needed": report.restart_needed, "changes": report.changes,
            }),
            if report.refused.is_empty() {
                Ok(())
            } else {
                Err("some changes were refused")
            },
        );
        Ok(report)
    }

    /// The passthrough assignments as JSON (`GET /v1/passthrough`).
    pub fn passthrough_json(&self) -> Value {
        self.passthrough
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .to_json()
    }

    fn apply_file(&self, new: &Config) -> ReloadReport {
        // Profiles apply to VMs added from now on.
        self.write().running.profiles = new.profiles.clone();
        let old = self.read().baseline.clone();
        let mut report = ReloadReport::default();
        // The new baseline: the file, except what could not be applied.
        let mut baseline = new.clone();
        // Devices and [admin] change only at a restart: keep the running ones.
        baseline.devices = old.devices.clone();
        baseline.admin = old.admin.clone();
        baseline.vms.retain(|v| v.mode == VmMode::Shared);
        baseline
            .vms
            .extend(old.vms.iter().filter(|v| v.mode != VmMode::Shared).cloned());
        for change in reload::diff(&old, new) {
            let before = match &change {
                Change::RemoveVm(n) => self.vm_config(n).as_ref().map(vm_json_config),
                Change::UpdateVm { new: v, .. } | Change::ReplaceVm { new: v, .. } => {
                    self.vm_config(&v.name).as_ref().map(vm_json_config)
                }
                Change::Scheduling { device, .. } => {
                    self.broker.scheduling(device).map(|s| scheduling_json(&s))
                }
                Change::Overcommit { device, .. } => self.overcommit_json(device),
                Change::AddVm(_) | Change::NeedsRestart(_) => None,
            };
            let (what, r) = match &change {
                Change::RemoveVm(name) => (format!("remove VM `{name}`"), self.reload_remove(name)),
                Change::AddVm(vm) => (format!("add VM `{}`", vm.name), self.reload_add(vm)),
                Change::UpdateVm { new, .. } => (
                    format!("update VM `{}` (memory, weight, priority)", new.name),
                    self.reload_update(new),
                ),
                Change::ReplaceVm { old, new } => (
                    format!(
                        "restart VM `{}` (its device or sockets changed; its sessions ended)",
                        new.name
                    ),
                    self.reload_remove(&old.name)
                        .and_then(|()| self.reload_add(new)),
                ),
                Change::Scheduling { device, new, .. } => (
                    format!(
                        "set scheduling of device `{device}` to {} / {} ms",
                        new.policy.as_str(),
                        new.slice.as_millis()
                    ),
                    self.reload_scheduling(device, *new),
                ),
                Change::Overcommit { device, new, .. } => (
                    format!("set overcommit of device `{device}` to {new}"),
                    self.apply_overcommit(device, *new),
                ),
                Change::NeedsRestart(msg) => {
                    warn!("config reload: {msg}");
                    report.restart_needed.push(msg.clone());
                    continue;
                }
            };
            let after = match &change {
                Change::AddVm(v)
                | Change::UpdateVm { new: v, .. }
                | Change::ReplaceVm { new: v, .. } => {
                    self.vm_config(&v.name).as_ref().map(vm_json_config)
                }
                Change::Scheduling { device, .. } => {
                    self.broker.scheduling(device).map(|s| scheduling_json(&s))
                }
                Change::Overcommit { device, .. } => self.overcommit_json(device),
                Change::RemoveVm(_) | Change::NeedsRestart(_) => None,
            };
            report.changes.push(vgpu_api::ReloadChange {
                change: what.clone(),
                before,
                after,
                result: if r.is_ok() { "ok" } else { "refused" }.into(),
                error: r.as_ref().err().map(|e| e.message.clone()),
            });
            match (r, &change) {
                (Ok(()), Change::Scheduling { device, new, .. }) => {
                    if let Some(d) = baseline.devices.iter_mut().find(|d| &d.name == device) {
                        d.scheduling = *new;
                    }
                    info!("config reload: {what}");
                    report.applied.push(what);
                }
                (Ok(()), Change::Overcommit { device, new, .. }) => {
                    if let Some(d) = baseline.devices.iter_mut().find(|d| &d.name == device) {
                        d.overcommit = *new;
                    }
                    info!("config reload: {what}");
                    report.applied.push(what);
                }
                (Ok(()), _) => {
                    info!("config reload: {what}");
                    report.applied.push(what);
                }
                (Err(e), _) => {
                    error!("config reload: cannot {what}: {}", e.message);
                    report.refused.push(format!("{what}: {}", e.message));
                    // Keep the old entry so that the next reload tries again.
                    let name = match &change {
                        Change::RemoveVm(n) => Some(n.as_str()),
                        Change::AddVm(v)
                        | Change::UpdateVm { new: v, .. }
                        | Change::ReplaceVm { new: v, .. } => Some(v.name.as_str()),
                        _ => None,
                    };
                    if let Some(n) = name {
                        baseline.vms.retain(|v| v.name != n);
                        if let Some(o) = old.vms.iter().find(|v| v.name == n) {
                            baseline.vms.push(o.clone());
                        }
                    }
                }
            }
        }
        // `[tuning]` applies at once (the controller reads it every round), and so does the
        // host overflow budget.
        self.write().running.tuning = new.tuning;
        self.write().running.memory = new.memory;
        if let Some(b) = new.memory.host_overflow_budget {
            self.broker.host_budget().set_limit(b);
        }
        self.write().baseline = baseline;
        report
    }

    fn reload_remove(&self, name: &str) -> Result<(), OpError> {
        if self.vm_config(name).is_none() {
            return Ok(()); // already removed through the API
        }
        self.stop_vm(name, EndReason::VmRemoved);
        self.write().running.vms.retain(|v| v.name != name);
        Ok(())
    }

    fn reload_add(&self, vm: &VmConfig) -> Result<(), OpError> {
        let body = serde_json::to_value(reload::vm_table(vm)).unwrap_or(Value::Null);
        self.add_vm_locked(&body).map(|_| ())
    }

    fn reload_update(&self, new: &VmConfig) -> Result<(), OpError> {
        let Some(old) = self.vm_config(&new.name) else {
            return Err(OpError::new(
                OpErrorKind::Conflict,
                format!(
                    "VM `{}` was removed through the API; restart vgpud or rename it in the file to add it again",
                    new.name
                ),
            ));
        };
        let mut entry = reload::vm_table(&old);
        const LIVE: [&str; 12] = [
            "limits",
            "memory",
            "reserved",
            "overflow",
            "overflow_limit",
            "weight",
            "priority",
            "schedule",
            "target_wait_p99",
            "min_share",
            "weight_min",
            "weight_max",
        ];
        for k in LIVE {
            entry.remove(k);
        }
        for (k, v) in reload::vm_table(new) {
            if LIVE.contains(&k.as_str()) {
                entry.insert(k, v);
            }
        }
        let checked = self.validated_vm_entry(&new.name, entry)?;
        self.apply_vm_update(&old, &checked)
    }

    /// Sets a device's `overcommit` in the broker and the running config; refused (naming
    /// `overcommit`) when the device's slices do not fit it.
    fn apply_overcommit(&self, device: &str, oc: vgpu_config::Overcommit) -> Result<(), OpError> {
        self.broker
            .set_overcommit(device, oc)
            .map_err(|e| OpError::new(OpErrorKind::Conflict, e.to_string()))?;
        self.update_running_device(device, |d| d.overcommit = oc);
        Ok(())
    }

    /// Changes device `device`'s entry in the running config.
    fn update_running_device(&self, device: &str, f: impl FnOnce(&mut DeviceConfig)) {
        if let Some(d) = self
            .write()
            .running
            .devices
            .iter_mut()
            .find(|d| d.name == device)
        {
            f(d);
        }
    }

    /// A device's overcommit as the audit log records it.
    fn overcommit_json(&self, device: &str) -> Option<Value> {
        self.broker
            .placement(device)
            .and_then(|p| p.snapshot().overcommit)
            .map(|o| json!({ "overcommit": o.as_f64() }))
    }

    fn reload_scheduling(
        &self,
        device: &str,
        s: vgpu_config::SchedulingConfig,
    ) -> Result<(), OpError> {
        self.broker
            .set_scheduling(device, s)
            .map_err(|e| OpError::new(OpErrorKind::Conflict, e.to_string()))?;
        self.update_running_device(device, |d| d.scheduling = s);
        Ok(())
    }
}

/// A device's scheduling settings as the API shows them.
pub fn scheduling(s: &vgpu_config::SchedulingConfig) -> vgpu_api::Scheduling {
    vgpu_api::Scheduling {
        policy: s.policy.as_str().into(),
        slice_ms: s.slice.as_millis() as u64,
        batch_min_share: s.batch_min_share,
    }
}

/// The JSON form of a device's scheduling settings (the audit log's `before` and `after`).
pub fn scheduling_json(s: &vgpu_config::SchedulingConfig) -> Value {
    serde_json::to_value(scheduling(s)).unwrap_or(Value::Null)
}

impl Runtime {
    /// Builds the broker and the devices the config declares and starts every VM's transports;
    /// the admin API and the metrics endpoint are started on top of it by [`crate::Daemon`].
    pub fn start(config: &Config) -> Result<Arc<Runtime>, DaemonError> {
        Self::start_with(config, crate::passthrough::HostRoots::default())
    }

    /// [`Runtime::start`], reading passthrough devices from the sysfs and procfs at `host_roots`
    /// (a container that mounts the host's `/sys` elsewhere; tests with a fake tree).
    pub fn start_with(
        config: &Config,
        host_roots: crate::passthrough::HostRoots,
    ) -> Result<Arc<Runtime>, DaemonError> {
        let audit = match &config.admin.audit_log {
            Some(p) => Some(Arc::new(AuditLog::open(p)?)),
            None => None,
        };
        // Passthrough devices leave the shared pool: conflicts stop the start.
        let passthrough =
            crate::passthrough::PassthroughRegistry::from_config(config, &host_roots)?;
        let broker = Arc::new(Broker::new(build_devices(config)?));
        let mut config = config.clone();
        config
            .resolve_profile_memory(|d| broker.device(d).map(|x| x.info().total_memory))
            .map_err(DaemonError::Profile)?;
        let config = &config;
        for d in &config.devices {
            broker.set_scheduling(&d.name, d.scheduling)?;
            broker.set_overcommit(&d.name, d.overcommit)?;
        }
        if let Some(b) = config.memory.host_overflow_budget {
            broker.host_budget().set_limit(b);
        }
        let rt = Arc::new(Runtime {
            passthrough: RwLock::new(passthrough),
            host_roots,
            broker,
            hub: Arc::new(SessionHub::new(audit.clone())),
            audit,
            inventory: Inventory::default(),
            started: SystemTime::now(),
            changes: Mutex::new(()),
            state: RwLock::new(State {
                running: config.clone(),
                baseline: config.clone(),
                transports: BTreeMap::new(),
            }),
            metrics_addr: Mutex::new(None),
            tuner: Arc::default(),
        });
        for vm in &config.vms {
            if vm.mode != VmMode::Shared {
                // A passthrough VM owns a whole device through VFIO; vgpud
                // only records it (see docs/passthrough.md).
                continue;
            }
            // On failure the VMs started so far are dropped with `rt`.
            let t = rt.start_vm(vm)?;
            rt.write().transports.insert(vm.name.clone(), t);
        }
        Ok(rt)
    }

    /// Paths of the VM sockets.
    pub fn socket_paths(&self) -> Vec<PathBuf> {
        self.read()
            .transports
            .values()
            .filter_map(|t| t.listener.as_ref().map(|l| l.path().to_path_buf()))
            .collect()
    }

    /// Records where the metrics endpoint listens (shown by the admin API).
    pub(crate) fn set_metrics_addr(&self, addr: SocketAddr) {
        *self.metrics_addr.lock().unwrap_or_else(|p| p.into_inner()) = Some(addr);
    }

    /// Ends every VM's transports and sessions (bounded wait) and records the stop; the admin
    /// API and the metrics endpoint are stopped first.
    pub(crate) fn shutdown(&self) {
        self.tuner.stop();
        let transports = std::mem::take(&mut self.write().transports);
        drop(transports);
        self.hub.end_all(EndReason::Shutdown);
        if !self.hub.wait_ended(None, SESSION_END_TIMEOUT) {
            warn!("some sessions were still finishing when vgpud stopped");
        }
        if let Some(a) = &self.audit {
            a.record(
                "daemon.stop",
                json!({ "actor": Actor::Daemon, "pid": std::process::id() }),
                Durability::Synced,
            );
        }
        info!("vgpud stopped");
    }
}

impl crate::tuning::TuningHost for Runtime {
    fn broker(&self) -> &Arc<Broker> {
        Runtime::broker(self)
    }

    fn running_config(&self) -> Config {
        Runtime::running_config(self)
    }

    fn tuner(&self) -> &Arc<crate::tuning::Tuner> {
        Runtime::tuner(self)
    }

    fn record_tuning(&self, actor: Actor, detail: Value) {
        Runtime::record_tuning(self, actor, detail);
    }
}

/// Starts thread `thread` serving a vhost-user device (`what`) of VM `vm`: the VMM's messages
/// and the guest's queues are handled only under the vhost seccomp allowlist.
fn spawn_device_thread<E: std::fmt::Display>(
    thread: String,
    vm: &str,
    what: &'static str,
    run: impl FnOnce() -> Result<(), E> + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let vm = vm.to_string();
    std::thread::Builder::new().name(thread).spawn(move || {
        if let Err(e) = vgpu_seccomp::enter(ThreadKind::Vhost) {
            tracing::error!(vm = %vm, error = %e, device = what, "device not started");
            return;
        }
        if let Err(e) = run() {
            tracing::error!(vm = %vm, error = %e, device = what, "device stopped");
        }
    })
}

fn start_vsock(
    vm: &str,
    config: VsockConfig,
    connector: Arc<GpuPortConnector>,
) -> Result<RunningVsock, DaemonError> {
    let err = |source| DaemonError::Vsock {
        vm: vm.to_string(),
        source,
    };
    let server = VsockServer::bind(config.clone(), connector).map_err(err)?;
    let stats = server.stats();
    let stop = StopHandle::new().map_err(|e| err(vsock::Error::EventLoop(e)))?;
    let stop2 = stop.clone();
    let thread = spawn_device_thread(format!("vgpu-vsock-{vm}"), vm, "vsock", move || {
        server.run(&stop2)
    })
    .map_err(|e| err(vsock::Error::EventLoop(e)))?;
    Ok(RunningVsock {
        vm: vm.to_string(),
        config,
        stats,
        stop,
        thread: Some(thread),
    })
}

/// Waits until a virtio-vgpu device has no session left, or `deadline`; whether it has none.
fn wait_device_sessions_ended(stats: &VgpuDevStats, deadline: Instant) -> bool {
    loop {
        if stats.snapshot().sessions_open == 0 {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(DEVICE_SESSION_POLL);
    }
}

fn start_vgpu_dev(
    vm: &str,
    config: VgpuDevConfig,
    service: Arc<BrokerService>,
) -> Result<RunningVgpuDev, DaemonError> {
    let err = |source| DaemonError::VgpuDev {
        vm: vm.to_string(),
        source,
    };
    let server = VgpuDevServer::bind(config.clone(), service).map_err(err)?;
    let stats = server.stats();
    let stop = StopHandle::new().map_err(|e| err(vgpu_dev::Error::EventLoop(e)))?;
    let stop2 = stop.clone();
    let thread = spawn_device_thread(format!("vgpu-dev-{vm}"), vm, "virtio-vgpu", move || {
        server.run(&stop2)
    })
    .map_err(|e| err(vgpu_dev::Error::EventLoop(e)))?;
    Ok(RunningVgpuDev {
        config,
        stats,
        stop,
        thread: Some(thread),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_owners_resolve_by_name_or_number() {
        assert_eq!(resolve_owner("root"), Ok((0, 0)));
        assert_eq!(resolve_owner("0:0"), Ok((0, 0)));
        assert_eq!(resolve_owner("107:107"), Ok((107, 107)));
        assert_eq!(resolve_owner("107"), Ok((107, 107)));
        let e = resolve_owner("no-such-user-vgpu").unwrap_err();
        assert!(e.contains("no user `no-such-user-vgpu`"), "{e}");
        let e = resolve_owner("root:no-such-group-vgpu").unwrap_err();
        assert!(e.contains("no group"), "{e}");
    }
}
