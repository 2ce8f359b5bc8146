//! Inventory of the host's real NVIDIA GPUs through NVML (`nvml-wrapper`,
//! which loads `libnvidia-ml.so.1` at run time, so vgpud runs without the
//! driver): name, UUID, PCI address, memory, utilization, temperature, power,
//! MIG mode and instances, and SR-IOV virtual functions (from sysfs).
//!
//! Without the driver the report says so plainly; the simulated devices are
//! listed by the admin API either way.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::error::NvmlError;

/// The library NVML is loaded from (the driver installs the `.so.1` name;
/// the unversioned name needs the development package).
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";
/// Environment variable that overrides [`NVML_LIBRARY`] (a full path).
pub const NVML_LIBRARY_ENV: &str = "VGPU_NVML_LIBRARY";
/// Where PCI devices are described.
const SYSFS_PCI: &str = "/sys/bus/pci/devices";
/// NVML reports milliwatts.
const MILLIWATTS_PER_WATT: f64 = 1000.0;

/// What NVML found: `GET /v1/gpus` (the API crate's [`vgpu_api::Inventory`]).
pub use vgpu_api::Inventory as Report;
pub use vgpu_api::{Gpu, MigInstance};

/// NVML, initialised on first use; a failure is remembered and retried
/// only by [`Inventory::refresh`].
pub struct Inventory {
    library: PathBuf,
    sysfs_pci: PathBuf,
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
        Self::new(&library, Path::new(SYSFS_PCI))
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
    /// from `sysfs_pci` (normally `/sys/bus/pci/devices`).
    pub fn new(library: &Path, sysfs_pci: &Path) -> Self {
        Self {
            library: library.to_path_buf(),
            sysfs_pci: sysfs_pci.to_path_buf(),
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
        let pci = d.pci_info().ok().and_then(|p| sysfs_address(&p.bus_id));
        let (sriov_vfs, sriov_vfs_total) = pci
            .as_deref()
            .map_or((None, None), |a| sriov(&self.sysfs_pci, a));
        Some(Gpu {
            index,
            name: d.name().ok(),
            uuid: d.uuid().ok(),
            pci,
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
            sriov_vfs,
            sriov_vfs_total,
        })
    }
}

/// NVML's bus id (`00000000:3B:00.0`) as sysfs writes it (`0000:3b:00.0`).
pub fn sysfs_address(bus_id: &str) -> Option<String> {
    bus_id
        .trim()
        .parse::<vgpu_pci::PciAddress>()
        .ok()
        .map(|a| a.to_string())
}

/// SR-IOV virtual functions (enabled, supported) of a PCI device.
pub fn sriov(sysfs_pci: &Path, address: &str) -> (Option<u32>, Option<u32>) {
    let read = |f: &str| {
        std::fs::read_to_string(sysfs_pci.join(address).join(f))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    };
    (read("sriov_numvfs"), read("sriov_totalvfs"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_driver_the_report_says_so_plainly() {
        let inv = Inventory::new(
            Path::new("/nonexistent/libnvidia-ml.so.1"),
            Path::new(SYSFS_PCI),
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

    #[test]
    fn nvml_bus_ids_become_sysfs_addresses() {
        assert_eq!(
            sysfs_address("00000000:3B:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(
            sysfs_address("0001:C1:1F.7").as_deref(),
            Some("0001:c1:1f.7")
        );
        assert_eq!(sysfs_address("garbage"), None);
    }

    #[test]
    fn sriov_counts_come_from_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("0000:3b:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("sriov_numvfs"), "4\n").unwrap();
        std::fs::write(dev.join("sriov_totalvfs"), "16\n").unwrap();
        assert_eq!(sriov(dir.path(), "0000:3b:00.0"), (Some(4), Some(16)));
        assert_eq!(sriov(dir.path(), "0000:3c:00.0"), (None, None));
    }
}
