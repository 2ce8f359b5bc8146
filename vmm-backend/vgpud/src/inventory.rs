//! Inventory of the host's real NVIDIA GPUs through NVML (`nvml-wrapper`,
//! which loads `libnvidia-ml.so.1` at run time, so vgpud runs without the
//! driver): name, UUID, PCI address, memory, utilization, temperature, power,
//! MIG mode and instances, and SR-IOV virtual functions (from sysfs, read by `vgpu-pci` as
//! `vgpuctl passthrough` reads them).
//!
//! Without the driver the report says so plainly; the simulated devices are
//! listed by the admin API either way.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::error::NvmlError;
use tracing::debug;
use vgpu_pci::sysfs::RealSysfs;
use vgpu_pci::{PciAddress, Sriov};

/// The library NVML is loaded from (the driver installs the `.so.1` name;
/// the unversioned name needs the development package).
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";
/// Environment variable that overrides [`NVML_LIBRARY`] (a full path).
pub const NVML_LIBRARY_ENV: &str = "VGPU_NVML_LIBRARY";
/// The host's sysfs.
const SYSFS: &str = "/sys";
/// NVML reports milliwatts.
const MILLIWATTS_PER_WATT: f64 = 1000.0;

/// What NVML found: `GET /v1/gpus` (the API crate's [`vgpu_api::Inventory`]).
pub use vgpu_api::Inventory as Report;
pub use vgpu_api::{Gpu, MigInstance};

/// NVML, initialised on first use; a failure is remembered and retried
/// only by [`Inventory::refresh`].
pub struct Inventory {
    library: PathBuf,
    sysfs: RealSysfs,
    nvml: Mutex<Option<Result<Nvml, String>>>,
}

impl std::fmt::Debug for Inventory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inventory")
            .field("library", &self.library)
            .finish()
    }
}

impl Default for Inventory {
    fn default() -> Self {
        let library = std::env::var_os(NVML_LIBRARY_ENV)
            .map_or_else(|| PathBuf::from(NVML_LIBRARY), PathBuf::from);
        Self::new(&library, Path::new(SYSFS))
    }
}

/// Explains an NVML initialisation failure and what to do.
pub fn explain(library: &Path, e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(le) => format!(
            "no NVIDIA driver found: {} cannot be loaded ({le}); install the NVIDIA driver to use real GPUs (kind = \"cuda\"); the simulated GPU works without it",
            library.display()
        ),
        NvmlError::DriverNotLoaded => "the NVIDIA kernel driver is not loaded: load it (modprobe nvidia) or check `dmesg` and `nvidia-smi`".into(),
        NvmlError::NoPermission => "NVML refused access: run vgpud as a user allowed to open /dev/nvidia*".into(),
        other => format!("NVML failed to start: {other}; check `nvidia-smi`"),
    }
}

impl Inventory {
    /// An inventory loading NVML from `library`, with SR-IOV information
    /// from the sysfs tree at `sysfs` (normally `/sys`).
    pub fn new(library: &Path, sysfs: &Path) -> Self {
        Self {
            library: library.to_path_buf(),
            sysfs: RealSysfs::new(sysfs),
            nvml: Mutex::new(None),
        }
    }

    /// Forgets a failed or working NVML so the next report starts afresh
    /// (e.g. after the driver was installed).
    pub fn refresh(&self) {
        *self.nvml.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The GPUs now, with live utilization, temperature and power.
    pub fn report(&self) -> Report {
        let mut guard = self.nvml.lock().unwrap_or_else(|p| p.into_inner());
        let nvml = guard.get_or_insert_with(|| {
            Nvml::builder()
                .lib_path(OsStr::new(self.library.as_os_str()))
                .init()
                .map_err(|e| explain(&self.library, &e))
        });
        match nvml {
            Err(reason) => Report {
                nvml: false,
                driver_version: None,
                reason: Some(reason.clone()),
                gpus: Vec::new(),
            },
            Ok(nvml) => {
                let count = nvml.device_count().unwrap_or(0);
                let gpus: Vec<Gpu> = (0..count).filter_map(|i| self.gpu(nvml, i)).collect();
                let reason = gpus
                    .is_empty()
                    .then(|| "the NVIDIA driver is loaded but reports no GPU".to_string());
                Report {
                    nvml: true,
                    driver_version: nvml.sys_driver_version().ok(),
                    reason,
                    gpus,
                }
            }
        }
    }

    fn gpu(&self, nvml: &Nvml, index: u32) -> Option<Gpu> {
        let d = nvml.device_by_index(index).ok()?;
        let mem = d.memory_info().ok();
        let util = d.utilization_rates().ok();
        let mig = d.mig_mode().ok();
        let mig_enabled = mig.as_ref().map(|m| m.current != 0);
        let mut mig_instances = Vec::new();
        if mig_enabled == Some(true) {
            for i in 0..d.mig_device_count().unwrap_or(0) {
                if let Ok(m) = d.mig_device_by_index(i) {
                    mig_instances.push(MigInstance {
                        index: i,
                        name: m.name().ok(),
                        uuid: m.uuid().ok(),
                        memory_total: m.memory_info().ok().map(|x| x.total),
                    });
                }
            }
        }
        let pci = d
            .pci_info()
            .ok()
            .and_then(|p| p.bus_id.trim().parse::<PciAddress>().ok());
        let sriov = pci.and_then(|a| {
            Sriov::read(&self.sysfs, a)
                .map_err(|e| debug!(pci = %a, error = %e, "SR-IOV capability unreadable"))
                .ok()
                .flatten()
        });
        Some(Gpu {
            index,
            name: d.name().ok(),
            uuid: d.uuid().ok(),
            pci: pci.map(|a| a.to_string()),
            memory_total: mem.as_ref().map(|m| m.total),
            memory_used: mem.as_ref().map(|m| m.used),
            utilization_gpu: util.as_ref().map(|u| u.gpu),
            utilization_memory: util.as_ref().map(|u| u.memory),
            temperature_c: d.temperature(TemperatureSensor::Gpu).ok(),
            power_w: d
                .power_usage()
                .ok()
                .map(|mw| f64::from(mw) / MILLIWATTS_PER_WATT),
            mig_enabled,
            mig_pending: mig.as_ref().map(|m| m.pending != 0),
            mig_instances,
            sriov_vfs: sriov.map(|s| s.enabled),
            sriov_vfs_total: sriov.map(|s| s.total),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_driver_the_report_says_so_plainly() {
        let inv = Inventory::new(
            Path::new("/nonexistent/libnvidia-ml.so.1"),
            Path::new(SYSFS),
        );
        let r = inv.report();
        assert!(!r.nvml);
        assert!(r.gpus.is_empty());
        let reason = r.reason.unwrap();
        assert!(reason.starts_with("no NVIDIA driver found"), "{reason}");
        assert!(
            reason.contains("/nonexistent/libnvidia-ml.so.1"),
            "{reason}"
        );
        // The failure is remembered until a refresh.
        assert_eq!(inv.report().reason.as_deref(), Some(reason.as_str()));
        inv.refresh();
        assert!(!inv.report().nvml);
    }
}
