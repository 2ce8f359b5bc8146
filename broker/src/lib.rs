//! The vgpu broker: the one place every guest CUDA call passes through.
//!
//! It holds the tenants (one per VM) with their memory slices, runs one
//! [`session::Session`] per guest process with that process's handle tables
//! and allocations, validates every pointer and handle, charges every
//! allocation before it happens, and drives a [`device::Device`] — the
//! simulated GPU or a real one — through the transport-independent session
//! loop in [`server`].

pub mod device;
pub mod devio;
pub mod doorbell;
pub mod engine;
pub mod error;
pub mod handles;
pub mod host_gate;
pub mod hostshare;
pub mod limits;
pub mod mem_wait;
pub mod memory;
pub mod scheduler;
pub mod session;
pub mod session_loop;
pub mod sync_ticket;
pub mod tenant;
#[doc(hidden)]
pub mod testutils;
pub mod texture;
pub mod usage;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use thiserror::Error;

use crate::device::Device;
use crate::memory::placement::{DevicePlacement, HostBudget};
use crate::scheduler::{Clock, LocalClock, Scheduler};
use crate::tenant::Tenant;
use vgpu_config::{
    MAX_BATCH_MIN_SHARE, MAX_SLICE, MAX_WEIGHT, MIN_SLICE, Priority, SchedulingConfig, VmConfig,
};

pub use error::CuError;

/// Returns the heap memory freed by an ended session to the system. glibc keeps
/// freed memory in per-thread arenas; a session's thread has exited, so what its
/// arena held would otherwise stay in the daemon's resident set until another
/// thread reuses the arena.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap pages; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Fewest glibc heap arenas [`limit_heap_arenas`] leaves a process.
pub const MIN_HEAP_ARENAS: usize = 2;
/// Most glibc heap arenas [`limit_heap_arenas`] leaves a process.
pub const MAX_HEAP_ARENAS: usize = 8;

/// Caps glibc's heap arenas at one per CPU (between [`MIN_HEAP_ARENAS`] and
/// [`MAX_HEAP_ARENAS`]) unless `MALLOC_ARENA_MAX` says otherwise; call it before any thread
/// starts. glibc's default, eight per CPU, lets each of a daemon's many session threads get an
/// arena of its own, and a session that ends while another thread still holds memory from its
/// arena leaves that arena fragmented: `malloc_trim` cannot return the pages around what is
/// still held. Measured with `vgpu-bench soak --waves 14` (64 sessions of 1000 calls, every
/// one killed once, per wave): with the default vgpud's resident set grew from 12.5 MiB to
/// 17.6 MiB over the waves; with four arenas or two it stayed between 12.5 and 15.3 MiB.
///
/// Returns the cap it set (`None`: `MALLOC_ARENA_MAX` governs, or glibc refused).
pub fn limit_heap_arenas() -> Option<usize> {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return None;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cpus = std::thread::available_parallelism().map_or(MIN_HEAP_ARENAS, |n| n.get());
        let arenas = cpus.clamp(MIN_HEAP_ARENAS, MAX_HEAP_ARENAS);
        // SAFETY: mallopt only changes an allocator setting; M_ARENA_MAX takes a count.
        let set = unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas as libc::c_int) } != 0;
        set.then_some(arenas)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// Bytes the process's heap has handed out and not had back (glibc's `mallinfo2`: in-use
/// chunks of every arena plus blocks mapped on their own); `None` where that is not known.
/// Unlike the resident set it counts neither freed pages the allocator keeps nor other
/// processes' memory the daemon maps (a VM's RAM), so work that leaks nothing leaves it where
/// it was.
pub fn heap_in_use() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics; it is thread-safe.
        let m = unsafe { libc::mallinfo2() };
        Some((m.uordblks as u64).saturating_add(m.hblkhd as u64))
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// A live change to a VM (any subset of its settings).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmUpdate {
    /// New memory slice in bytes (refused below current use).
    pub memory: Option<u64>,
    /// New compute weight.
    pub weight: Option<u32>,
    /// New scheduling class.
    pub priority: Option<Priority>,
    /// New budgets (sessions, connections, modules).
    pub limits: Option<vgpu_config::limits::VmLimits>,
    /// New reservation and overflow settings.
    pub memory_policy: Option<vgpu_config::VmMemory>,
}

/// Why a broker operation was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BrokerError {
    /// A tenant with that name exists.
    #[error("a VM named `{0}` already exists")]
    DuplicateTenant(String),
    /// The VM names an unknown device.
    #[error("VM `{vm}` names device `{device}`, which does not exist")]
    UnknownDevice {
        /// VM name.
        vm: String,
        /// Device name.
        device: String,
    },
    /// No VM has that name.
    #[error("no VM named `{0}`")]
    NoSuchVm(String),
    /// No device has that name.
    #[error("no device named `{0}`")]
    NoSuchDevice(String),
    /// The change is not acceptable (the message says why and what to do).
    #[error("{0}")]
    Refused(String),
}

/// Devices and tenants.
pub struct Broker {
    devices: Vec<(String, Arc<dyn Device>)>,
    /// One scheduler per device, in the order of `devices`.
    schedulers: Vec<Arc<Scheduler>>,
    /// One memory ledger per device, in the order of `devices`.
    placements: Vec<Arc<DevicePlacement>>,
    host_budget: Arc<HostBudget>,
    tenants: RwLock<BTreeMap<String, Arc<Tenant>>>,
    next_session: AtomicU64,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field(
                "devices",
                &self.devices.iter().map(|d| &d.0).collect::<Vec<_>>(),
            )
            .field("tenants", &self.tenant_names())
            .finish()
    }
}

impl Broker {
    /// A broker over named devices; weight schedules follow the host's local time.
    pub fn new(devices: Vec<(String, Arc<dyn Device>)>) -> Self {
        Self::with_clock(devices, Arc::new(LocalClock))
    }

    /// A broker whose schedulers read the time of day from `clock`.
    pub fn with_clock(devices: Vec<(String, Arc<dyn Device>)>, clock: Arc<dyn Clock>) -> Self {
        let schedulers = devices
            .iter()
            .map(|(n, _)| {
                Arc::new(Scheduler::new(
                    n,
                    SchedulingConfig::default(),
                    Arc::clone(&clock),
                ))
            })
            .collect();
        let host_budget = Arc::new(HostBudget::new(
            vgpu_config::memory::default_host_overflow_budget(),
        ));
        let placements = devices
            .iter()
            .map(|(n, d)| DevicePlacement::new(n, d.info().total_memory, Arc::clone(&host_budget)))
            .collect();
        Self {
            devices,
            schedulers,
            placements,
            host_budget,
            tenants: RwLock::new(BTreeMap::new()),
            next_session: AtomicU64::new(1),
        }
    }

    /// The named device.
    pub fn device(&self, name: &str) -> Option<&Arc<dyn Device>> {
        self.devices.iter().find(|d| d.0 == name).map(|d| &d.1)
    }

    /// All devices with their names.
    pub fn devices(&self) -> &[(String, Arc<dyn Device>)] {
        &self.devices
    }

    /// The compute scheduler of the named device.
    pub fn scheduler(&self, device: &str) -> Option<&Arc<Scheduler>> {
        self.devices
            .iter()
            .position(|d| d.0 == device)
            .map(|i| &self.schedulers[i])
    }

    /// The memory ledger of the named device.
    pub fn placement(&self, device: &str) -> Option<&Arc<DevicePlacement>> {
        self.devices
            .iter()
            .position(|d| d.0 == device)
            .map(|i| &self.placements[i])
    }

    /// The host memory all VMs' overflow may take together.
    pub fn host_budget(&self) -> &Arc<HostBudget> {
        &self.host_budget
    }

    /// Sets how far the slices on `device` may add up past its memory; refused (naming
    /// `overcommit`) when the VMs' slices do not fit.
    pub fn set_overcommit(
        &self,
        device: &str,
        oc: vgpu_config::Overcommit,
    ) -> Result<(), BrokerError> {
        self.placement(device)
            .ok_or_else(|| BrokerError::NoSuchDevice(device.to_string()))?
            .set_overcommit(oc)
            .map_err(BrokerError::Refused)
    }

    /// Adds a tenant for a VM entry.
    pub fn add_tenant(&self, vm: &VmConfig) -> Result<Arc<Tenant>, BrokerError> {
        let unknown = || BrokerError::UnknownDevice {
            vm: vm.name.clone(),
            device: vm.device.clone(),
        };
        let device = self.device(&vm.device).ok_or_else(unknown)?;
        let scheduler = self.scheduler(&vm.device).ok_or_else(unknown)?;
        let mut t = self.tenants.write().unwrap_or_else(|p| p.into_inner());
        if t.contains_key(&vm.name) {
            return Err(BrokerError::DuplicateTenant(vm.name.clone()));
        }
        let placement = self.placement(&vm.device).ok_or_else(unknown)?;
        let memory = placement
            .register(&vm.name, vm.memory, vm.memory_policy)
            .map_err(BrokerError::Refused)?;
        let tenant = Arc::new(Tenant::new(vm, Arc::clone(device), Arc::clone(scheduler)));
        tenant.attach_placement(memory);
        t.insert(vm.name.clone(), Arc::clone(&tenant));
        Ok(tenant)
    }

    /// Removes a tenant; it refuses new sessions, and its live sessions keep
    /// their resources until they end.
    pub fn remove_tenant(&self, name: &str) -> Option<Arc<Tenant>> {
        let t = self
            .tenants
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name)?;
        t.close();
        Some(t)
    }

    /// The named tenant.
    pub fn tenant(&self, name: &str) -> Option<Arc<Tenant>> {
        self.tenants
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// All tenants, by name.
    pub fn tenants(&self) -> Vec<Arc<Tenant>> {
        self.tenants
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    fn tenant_names(&self) -> Vec<String> {
        self.tenants().iter().map(|t| t.name.clone()).collect()
    }

    /// Applies a live change to a VM. A memory slice below what the VM uses
    /// is refused and nothing changes. Weight and priority take effect at the
    /// scheduler's next decision (at the latest, the end of the running
    /// slice); a `[[vm.schedule]]` window in force overrides the base weight.
    pub fn update_vm(&self, name: &str, u: &VmUpdate) -> Result<(), BrokerError> {
        let t = self
            .tenant(name)
            .ok_or_else(|| BrokerError::NoSuchVm(name.to_string()))?;
        if let Some(w) = u.weight
            && !(1..=MAX_WEIGHT).contains(&w)
        {
            return Err(BrokerError::Refused(format!(
                "weight must be between 1 and {MAX_WEIGHT}"
            )));
        }
        if let Some(m) = u.memory
            && m == 0
        {
            return Err(BrokerError::Refused(
                "the memory slice must be larger than 0".into(),
            ));
        }
        if u.memory.is_some() || u.memory_policy.is_some() {
            let old_slice = t.slice.limit();
            let slice = u.memory.unwrap_or(old_slice);
            if let Some(pm) = t.placement() {
                let old = pm.snapshot().policy;
                pm.set_policy(slice, u.memory_policy.unwrap_or(old))
                    .map_err(BrokerError::Refused)?;
                if let Err(e) = t.slice.resize(slice) {
                    let _ = pm.set_policy(old_slice, old);
                    return Err(BrokerError::Refused(e.message));
                }
            } else {
                t.slice
                    .resize(slice)
                    .map_err(|e| BrokerError::Refused(e.message))?;
            }
        }
        if let Some(l) = u.limits {
            t.limits.set_limits(l);
        }
        let mut s = t.settings();
        if let Some(w) = u.weight {
            s.weight = w;
        }
        if let Some(p) = u.priority {
            s.priority = p;
        }
        t.set_settings(s);
        Ok(())
    }

    /// The scheduling settings of a device.
    pub fn scheduling(&self, device: &str) -> Option<SchedulingConfig> {
        self.scheduler(device).map(|s| s.config())
    }

    /// Changes the scheduling settings of a device (live: the running slice
    /// is cut to the new length, and the policy applies from the next decision).
    pub fn set_scheduling(&self, device: &str, s: SchedulingConfig) -> Result<(), BrokerError> {
        let sched = self
            .scheduler(device)
            .ok_or_else(|| BrokerError::NoSuchDevice(device.to_string()))?;
        if !(MIN_SLICE..=MAX_SLICE).contains(&s.slice) {
            return Err(BrokerError::Refused(format!(
                "the slice must be between {} and {} ms",
                MIN_SLICE.as_millis(),
                MAX_SLICE.as_millis()
            )));
        }
        if s.batch_min_share > MAX_BATCH_MIN_SHARE {
            return Err(BrokerError::Refused(format!(
                "batch_min_share is a percentage from 0 to {MAX_BATCH_MIN_SHARE}"
            )));
        }
        sched.set_config(s);
        Ok(())
    }

    /// A fresh session id.
    pub fn next_session_id(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }
}
