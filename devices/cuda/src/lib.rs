//! The real-GPU executor of vgpu: [`CudaDevice`] implements the broker's
//! [`Device`] trait on the host's CUDA driver, loaded at run time.
//!
//! Each VM gets its own CUDA context on its GPU ([`CudaContext`]): the GPU's
//! MMU keeps VMs' memory apart, the broker validates every pointer before
//! it gets here, and a VM whose context hits a sticky error is isolated
//! until its processes end. Modules come from the guest's PTX, cubin or fat
//! binary; kernels launch with the guest's packed parameter buffer on the
//! VM's own stream and are timed with CUDA events; copies are staged
//! through pinned host buffers. See `docs/cuda.md`.
//!
//! Nothing here links against NVIDIA's libraries: vgpud builds and runs on
//! machines without a driver and reports a clear error only when a
//! `kind = "cuda"` device is configured there.

pub mod chain;
pub mod context;
pub mod driver;
pub mod error;
mod gather;
pub mod image;
pub mod isolation;
pub mod loader;
pub mod module;
pub mod printf;
pub mod ptx;
pub mod select;
pub mod texture_abi;
pub mod vm_context;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use vgpu_broker::device::{Device, DeviceContext, DeviceError, DeviceInfo};
use vgpu_config::{DeviceConfig, DeviceKind};
use vgpu_proto::cuda::attr;

pub use context::{ALLOC_GRANULARITY, KernelTimes};
pub use driver::Driver;
pub use error::CudaError;
pub use isolation::{VmmIsolation, override_verdict as override_vmm_isolation};
pub use select::Selector;
pub use vm_context::{AllocPath, CudaContext};

use crate::context::DeviceShared;
use crate::select::{VISIBLE_DEVICES, Visibility};

/// How to open a device besides which one.
#[derive(Debug, Clone, Default)]
pub struct CudaOptions {
    /// The `[[device]]` name (for logs).
    pub name: String,
    /// Kernels running longer fail with `CUDA_ERROR_LAUNCH_TIMEOUT`.
    pub watchdog: Option<Duration>,
}

/// A GPU driven through the CUDA driver API.
pub struct CudaDevice {
    shared: Arc<DeviceShared>,
    info: DeviceInfo,
    selector: Selector,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("name", &self.shared.name)
            .field("selector", &self.selector)
            .field("gpu", &self.info.name)
            .finish()
    }
}

/// Sets `CUDA_VISIBLE_DEVICES` so that a configured MIG instance is visible
/// to CUDA (only when the variable is unset and a MIG UUID is configured).
/// A process can use one MIG instance and no other GPU; other combinations
/// are refused with a message that says what to do.
///
/// # Safety
/// Changes the process environment: call it before any other thread runs
/// (vgpud calls it first thing in `main`), and before any CUDA device is opened.
pub unsafe fn make_mig_visible(devices: &[DeviceConfig]) -> Result<(), CudaError> {
    let mut selectors = Vec::new();
    for d in devices {
        if let DeviceKind::Cuda { index, uuid } = &d.kind {
            selectors.push(Selector::from_config(*index, uuid.as_deref())?);
        }
    }
    let current = std::env::var(VISIBLE_DEVICES).ok();
    match select::mig_visibility(&selectors, current.as_deref(), Driver::system_initialised())? {
        Visibility::Keep => Ok(()),
        Visibility::Set(v) => {
            tracing::info!(value = %v, "setting {VISIBLE_DEVICES} so CUDA sees the MIG instance");
            // SAFETY: the caller guarantees no other thread reads or writes the environment now.
            unsafe { std::env::set_var(VISIBLE_DEVICES, v) };
            Ok(())
        }
    }
}

impl CudaDevice {
    /// Opens the device of a `kind = "cuda"` config entry on the system
    /// driver (`libcuda.so.1`).
    pub fn open(config: &DeviceConfig) -> Result<Arc<CudaDevice>, CudaError> {
        let DeviceKind::Cuda { index, uuid } = &config.kind else {
            return Err(CudaError::NotCuda(config.name.clone()));
        };
        let selector = Selector::from_config(*index, uuid.as_deref())?;
        let driver = Driver::system()?;
        Self::with_driver(
            driver,
            &selector,
            CudaOptions {
                name: config.name.clone(),
                watchdog: config.watchdog,
            },
        )
    }

    /// Opens the device `selector` names on a given driver.
    pub fn with_driver(
        driver: Arc<Driver>,
        selector: &Selector,
        options: CudaOptions,
    ) -> Result<Arc<CudaDevice>, CudaError> {
        let count = driver.device_count().map_err(|f| f.open())?;
        let mut uuids = Vec::new();
        for i in 0..count {
            let dev = driver.device(i).map_err(|f| f.open())?;
            uuids.push(driver.device_uuid(dev).map_err(|f| f.open())?);
        }
        let ordinal = select::find(selector, &uuids)?;
        let dev = driver.device(ordinal).map_err(|f| f.open())?;
        let mut attributes = vec![0; attr::COUNT];
        for (a, slot) in attributes.iter_mut().enumerate().skip(1) {
            // Attribute numbers this driver does not know stay 0.
            *slot = driver.device_attribute(dev, a as i32).unwrap_or(0);
        }
        let info = DeviceInfo {
            name: driver.device_name(dev).map_err(|f| f.open())?,
            kind: "cuda",
            uuid: uuids[ordinal as usize],
            total_memory: driver.device_total_mem(dev).map_err(|f| f.open())?,
            alloc_granularity: ALLOC_GRANULARITY,
            attributes,
            watchdog: options.watchdog,
        };
        let vmm_supported = info.attribute(attr::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
        let vmm_isolation = isolation::probe(&driver, dev, info.uuid, vmm_supported);
        match vmm_isolation.refusal() {
            None => tracing::info!(
                device = %options.name,
                vmm_isolation = %vmm_isolation,
                "VMM isolation probe: another context's kernel faulted on a cuMemCreate \
                 mapping, so VMM mappings are private to their VM; movable allocations and \
                 guests' cuMemCreate are on"
            ),
            Some(why) => tracing::warn!(
                device = %options.name,
                vmm_isolation = %vmm_isolation,
                "VMM isolation probe: {why}; on this device movable allocations are off \
                 (allocations cannot overflow to host memory, as with overflow = \"none\") \
                 and guests' cuMemCreate fails with CUDA_ERROR_NOT_SUPPORTED"
            ),
        }
        let movable = if vmm_isolation.proven() {
            context::movable::probe(
                &driver,
                dev,
                vmm_supported,
                info.attribute(attr::HOST_NUMA_ID),
            )
        } else {
            None
        };
        tracing::info!(
            device = %options.name,
            vmm_isolation = vmm_isolation.as_str(),
            movable_granularity = movable.map_or(0, |m| m.granularity),
            host_overflow = movable.is_some_and(|m| m.host.is_some()),
            gpu = %info.name,
            uuid = %select::format_uuid(select::GPU_PREFIX, &info.uuid),
            memory = info.total_memory,
            driver = driver.version(),
            param_info = driver.has_param_info(),
            "CUDA device opened"
        );
        Ok(Arc::new(CudaDevice {
            shared: Arc::new(DeviceShared {
                driver,
                dev,
                name: options.name,
                used: AtomicU64::new(0),
                host_used: AtomicU64::new(0),
                movable,
                vmm_isolation,
            }),
            info,
            selector: selector.clone(),
        }))
    }

    /// The driver it runs on.
    pub fn driver(&self) -> &Arc<Driver> {
        &self.shared.driver
    }

    /// Bytes of host memory that host-resident (overflowed) allocations of all contexts take.
    pub fn host_memory_used(&self) -> u64 {
        self.shared.host_used.load(Ordering::Relaxed)
    }

    /// Allocations of at least this many bytes are movable (their own range mapped to
    /// `cuMemCreate` memory); `None` without virtual memory management.
    pub fn movable_granularity(&self) -> Option<u64> {
        self.shared.movable.map(|m| m.granularity)
    }

    /// What the VMM isolation probe found when the device was opened ([`isolation`]); movable
    /// allocations and guests' `cuMemCreate` are on only when it is
    /// [`VmmIsolation::Isolated`].
    pub fn vmm_isolation(&self) -> &VmmIsolation {
        &self.shared.vmm_isolation
    }

    /// Whether movable allocations can be placed in (and moved to) host memory: the driver
    /// creates host memory with `cuMemCreate` (CUDA 12.2+).
    pub fn can_overflow_to_host(&self) -> bool {
        self.shared.movable.is_some_and(|m| m.host.is_some())
    }

    /// Opens a VM's context with its concrete type (kernel times, health).
    pub fn open_context(&self, tenant: &str) -> Result<Arc<CudaContext>, DeviceError> {
        Ok(Arc::new(CudaContext::new(&self.shared, tenant)?))
    }
}

impl Device for CudaDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn open(&self, tenant: &str) -> Result<Arc<dyn DeviceContext>, DeviceError> {
        Ok(self.open_context(tenant)?)
    }

    fn memory_used(&self) -> u64 {
        self.shared.used.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cuda_config(index: Option<u32>, uuid: Option<&str>) -> DeviceConfig {
        DeviceConfig {
            name: "gpu0".into(),
            kind: DeviceKind::Cuda {
                index,
                uuid: uuid.map(String::from),
            },
            memory: 0,
            workers: None,
            watchdog: None,
            scheduling: Default::default(),
            overcommit: Default::default(),
        }
    }

    #[test]
    fn mig_visibility_is_refused_for_two_instances() {
        let a = cuda_config(None, Some("MIG-2c5a9e1f-7d3b-4a8c-9e2f-0123456789ab"));
        let b = cuda_config(None, Some("MIG-3c5a9e1f-7d3b-4a8c-9e2f-0123456789ab"));
        // SAFETY: the refusal happens before the environment is touched.
        let e = unsafe { make_mig_visible(&[a, b]) };
        // Only when the operator has not set the variable in this test's environment.
        if std::env::var(VISIBLE_DEVICES).is_err() {
            assert!(matches!(e, Err(CudaError::Mig(_))), "{e:?}");
        }
        let bad = cuda_config(None, Some("MIG-nothex"));
        // SAFETY: refused while parsing, before the environment is touched.
        let e = unsafe { make_mig_visible(&[bad]) };
        assert!(matches!(e, Err(CudaError::BadUuid(_))), "{e:?}");
    }
}
