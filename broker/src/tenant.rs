//! Tenants: one per `[[vm]]`, with its memory slice, its device context and
//! its live sessions.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use crate::device::{Device, DeviceContext, DeviceError};
use crate::memory::MemorySlice;
use crate::memory::placement::TenantMemory;
use crate::scheduler::{KernelTicket, SchedStats, Scheduler, TenantId};
use vgpu_config::{Priority, VmConfig};

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
    /// Module loads stopped at the device's watchdog deadline (not those a departed client
    /// cancelled).
    pub module_loads_stopped: AtomicU64,
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
    /// Contexts the session has now (a guest's NVML lists a process as using the GPU once it
    /// has one, as NVIDIA's does).
    pub contexts: AtomicU64,
}

impl SessionInfo {
    /// A session starting now, holding nothing yet.
    pub fn new(id: u64, pid: u32, process_name: String, transport: String) -> Self {
        SessionInfo {
            id,
            pid,
            process_name,
            transport,
            started: SystemTime::now(),
            memory: AtomicU64::new(0),
            contexts: AtomicU64::new(0),
        }
    }
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
    /// Memory charged, by kind.
    pub usage: crate::usage::MemUsage,
    /// Budgets besides memory, and what the VM's sessions hold against them.
    pub limits: Arc<crate::limits::LimitUse>,
    /// Pending host functions of the VM's processes.
    pub host_gates: crate::host_gate::HostGates,
    /// Its processes' synchronizing calls waiting on connections of their own.
    pub sync_tickets: crate::sync_ticket::SyncTickets,
    closed: AtomicBool,
    scheduler: Arc<Scheduler>,
    sched_id: TenantId,
    placement: std::sync::OnceLock<Arc<TenantMemory>>,
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
            usage: crate::usage::MemUsage::default(),
            limits: Arc::new(crate::limits::LimitUse::new(vm.limits)),
            host_gates: crate::host_gate::HostGates::default(),
            sync_tickets: crate::sync_ticket::SyncTickets::default(),
            closed: AtomicBool::new(false),
            scheduler,
            sched_id,
            placement: std::sync::OnceLock::new(),
        }
    }

    /// Connects the tenant to its entry in the device's memory ledger: from now on every
    /// charge of its slice is admitted there (reservations, overcommit, overflow).
    pub fn attach_placement(&self, m: Arc<TenantMemory>) {
        if self.placement.set(Arc::clone(&m)).is_ok() {
            self.slice.set_admission(m);
        }
    }

    /// The tenant's entry in its device's memory ledger (`None` until attached).
    pub fn placement(&self) -> Option<&Arc<TenantMemory>> {
        self.placement.get()
    }

    /// The tenant's device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// The tenant's device context, opened on first use.
    pub fn context(&self) -> Result<Arc<dyn DeviceContext>, DeviceError> {
        let mut c = lock(&self.context);
        if let Some(ctx) = c.as_ref() {
            match ctx.health() {
                Ok(()) => return Ok(Arc::clone(ctx)),
                Err(e) => tracing::info!(
                    tenant = %self.name,
                    error = %e,
                    "the VM's device context is broken; new sessions get a fresh one"
                ),
            }
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

    /// The tenant's id in its device's scheduler.
    pub fn sched_id(&self) -> TenantId {
        self.sched_id
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use super::*;
    use crate::Broker;
    use crate::device::DeviceInfo;
    use crate::testutils::{MemDevice, vm};

    /// A device whose contexts break (report unhealthy) when a flag is set.
    struct Breakable {
        inner: MemDevice,
        broken: Arc<AtomicBool>,
    }

    struct BreakableCtx {
        inner: Arc<dyn DeviceContext>,
        broken: Arc<AtomicBool>,
    }

    impl Device for Breakable {
        fn info(&self) -> &DeviceInfo {
            self.inner.info()
        }
        fn open(&self, t: &str) -> Result<Arc<dyn DeviceContext>, DeviceError> {
            Ok(Arc::new(BreakableCtx {
                inner: self.inner.open(t)?,
                broken: Arc::clone(&self.broken),
            }))
        }
        fn memory_used(&self) -> u64 {
            self.inner.memory_used()
        }
    }

    impl DeviceContext for BreakableCtx {
        fn health(&self) -> Result<(), DeviceError> {
            if self.broken.load(Ordering::SeqCst) {
                Err(DeviceError::Fault {
                    code: 700,
                    message: "broken".into(),
                })
            } else {
                Ok(())
            }
        }
        fn alloc(&self, size: u64) -> Result<u64, DeviceError> {
            self.inner.alloc(size)
        }
        fn free(&self, ptr: u64) -> Result<(), DeviceError> {
            self.inner.free(ptr)
        }
        fn write(&self, dst: u64, data: &[u8]) -> Result<(), DeviceError> {
            self.inner.write(dst, data)
        }
        fn read(&self, src: u64, out: &mut [u8]) -> Result<(), DeviceError> {
            self.inner.read(src, out)
        }
        fn copy(&self, dst: u64, src: u64, len: u64) -> Result<(), DeviceError> {
            self.inner.copy(dst, src, len)
        }
        fn memset(
            &self,
            dst: u64,
            value: u32,
            elem_size: u32,
            count: u64,
        ) -> Result<(), DeviceError> {
            self.inner.memset(dst, value, elem_size, count)
        }
    }

    #[test]
    fn a_broken_context_is_replaced_for_the_next_session() {
        let broken = Arc::new(AtomicBool::new(false));
        let dev: Arc<dyn Device> = Arc::new(Breakable {
            inner: MemDevice::new(1 << 20, Duration::ZERO),
            broken: Arc::clone(&broken),
        });
        let b = Broker::new(vec![("gpu0".into(), dev)]);
        let t = b.add_tenant(&vm("vm1", 1 << 20)).unwrap();
        let c1 = t.context().unwrap();
        assert!(
            Arc::ptr_eq(&c1, &t.context().unwrap()),
            "one context per VM while healthy"
        );
        broken.store(true, Ordering::SeqCst);
        let c2 = t.context().unwrap();
        assert!(
            !Arc::ptr_eq(&c1, &c2),
            "a broken context is not handed out again"
        );
    }
}
