//! Tenants: one per `[[vm]]`, with its memory slice, its device context and
//! its live sessions.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use crate::config::{Priority, VmConfig};
use crate::device::{Device, DeviceContext, DeviceError};
use crate::memory::MemorySlice;
use crate::scheduler::{KernelTicket, SchedStats, Scheduler, TenantId};

/// Mutable scheduling settings of a tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantSettings {
    /// Compute weight.
    pub weight: u32,
    /// Scheduling class.
    pub priority: Priority,
}

/// Counters of a tenant since it was created.
#[derive(Debug, Default)]
pub struct TenantStats {
    /// Sessions opened.
    pub sessions_total: AtomicU64,
    /// Bytes copied host to device.
    pub bytes_htod: AtomicU64,
    /// Bytes copied device to host.
    pub bytes_dtoh: AtomicU64,
    /// Kernels launched.
    pub kernels: AtomicU64,
    /// Calls that failed.
    pub errors: AtomicU64,
}

/// A live session as the admin plane and vgpu-smi see it.
#[derive(Debug)]
pub struct SessionInfo {
    /// Session id.
    pub id: u64,
    /// Guest process id (as the guest reported it).
    pub pid: u32,
    /// Guest process name (as the guest reported it).
    pub process_name: String,
    /// Transport description (`unix:/run/vgpu/vm1.sock`, `vsock:3`).
    pub transport: String,
    /// When it started.
    pub started: SystemTime,
    /// Bytes of the slice this session holds.
    pub memory: AtomicU64,
}

/// A tenant (VM).
pub struct Tenant {
    /// Name from the config.
    pub name: String,
    /// Name of its device.
    pub device_name: String,
    device: Arc<dyn Device>,
    /// Its memory slice.
    pub slice: MemorySlice,
    settings: Mutex<TenantSettings>,
    context: Mutex<Option<Arc<dyn DeviceContext>>>,
    sessions: Mutex<BTreeMap<u64, Arc<SessionInfo>>>,
    /// Counters.
    pub stats: TenantStats,
    closed: AtomicBool,
    scheduler: Arc<Scheduler>,
    sched_id: TenantId,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("name", &self.name)
            .field("device", &self.device_name)
            .field("slice", &self.slice)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Tenant {
    /// A tenant for a VM entry, on `device`, whose kernels `scheduler` (the
    /// device's) schedules.
    pub fn new(vm: &VmConfig, device: Arc<dyn Device>, scheduler: Arc<Scheduler>) -> Self {
        let sched_id = scheduler.add_tenant(vm);
        Self {
            name: vm.name.clone(),
            device_name: vm.device.clone(),
            device,
            slice: MemorySlice::new(vm.memory),
            settings: Mutex::new(TenantSettings {
                weight: vm.weight,
                priority: vm.priority,
            }),
            context: Mutex::new(None),
            sessions: Mutex::new(BTreeMap::new()),
            stats: TenantStats::default(),
            closed: AtomicBool::new(false),
            scheduler,
            sched_id,
        }
    }

    /// The tenant's device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// The tenant's device context, opened on first use.
    pub fn context(&self) -> Result<Arc<dyn DeviceContext>, DeviceError> {
        let mut c = lock(&self.context);
        if let Some(ctx) = c.as_ref() {
            return Ok(Arc::clone(ctx));
        }
        let ctx = self.device.open(&self.name)?;
        *c = Some(Arc::clone(&ctx));
        Ok(ctx)
    }

    /// Scheduling settings.
    pub fn settings(&self) -> TenantSettings {
        *lock(&self.settings)
    }

    /// Changes the scheduling settings; the scheduler applies them at once.
    pub fn set_settings(&self, s: TenantSettings) {
        let mut cur = lock(&self.settings);
        *cur = s;
        self.scheduler
            .set_settings(self.sched_id, s.weight, s.priority);
    }

    /// Compute accounting: device time, kernels, queue waits and recent shares.
    pub fn sched_stats(&self) -> SchedStats {
        self.scheduler
            .stats(self.sched_id)
            .expect("a live tenant is registered with its scheduler")
    }

    /// The scheduler of the tenant's device.
    pub fn scheduler(&self) -> &Arc<Scheduler> {
        &self.scheduler
    }

    /// Notes a kernel launch; the ticket waits for the device when the
    /// kernel is next in its session.
    pub fn queue_kernel(&self) -> KernelTicket {
        self.scheduler.queue_kernel(self.sched_id)
    }

    /// Registers a session.
    pub fn add_session(&self, info: Arc<SessionInfo>) {
        self.stats.sessions_total.fetch_add(1, Ordering::Relaxed);
        lock(&self.sessions).insert(info.id, info);
    }

    /// Unregisters a session.
    pub fn remove_session(&self, id: u64) {
        lock(&self.sessions).remove(&id);
    }

    /// Live sessions.
    pub fn sessions(&self) -> Vec<Arc<SessionInfo>> {
        lock(&self.sessions).values().cloned().collect()
    }

    /// Marks the tenant closed: new sessions are refused.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Whether the tenant accepts new sessions.
    pub fn is_open(&self) -> bool {
        !self.closed.load(Ordering::Acquire)
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        self.scheduler.remove_tenant(self.sched_id);
    }
}
