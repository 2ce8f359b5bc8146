//! Preconditions shared by the commands.

use super::error::PassthroughError;
use vgpu_pci::sysfs::{Sysfs, driver_dir};
use vgpu_pci::{PciAddress, PciDevice, VFIO_PCI, group_members, iommu_enabled};

/// The NVIDIA GPU (physical or virtual function) at `a`.
pub fn nvidia_gpu(s: &dyn Sysfs, a: PciAddress) -> Result<PciDevice, PassthroughError> {
    let d = PciDevice::read(s, a)?;
    if !d.is_nvidia() {
        return Err(PassthroughError::NotNvidia {
            address: a,
            vendor: d.vendor,
        });
    }
    if !d.is_gpu() {
        return Err(PassthroughError::NotGpu {
            address: a,
            class: d.class_name(),
        });
    }
    Ok(d)
}

/// The IOMMU group of `d`; refuses when there is none.
pub fn iommu_group(s: &dyn Sysfs, d: &PciDevice) -> Result<u32, PassthroughError> {
    d.iommu_group.ok_or_else(|| PassthroughError::NoIommu {
        address: d.address,
        host_has_iommu: iommu_enabled(s),
    })
}

/// Every device of group `g`.
pub fn group_devices(s: &dyn Sysfs, g: u32) -> Result<Vec<PciDevice>, PassthroughError> {
    group_members(s, g)?
        .into_iter()
        .map(|a| PciDevice::read(s, a).map_err(PassthroughError::from))
        .collect()
}

/// The devices of `d`'s group, other than `d`, that make the group not
/// viable (bound to a host driver).
pub fn group_blockers(
    s: &dyn Sysfs,
    d: &PciDevice,
    g: u32,
) -> Result<Vec<PciDevice>, PassthroughError> {
    Ok(group_devices(s, g)?
        .into_iter()
        .filter(|m| m.address != d.address && !m.group_safe())
        .collect())
}

/// "0000:65:00.1 (audio, bound to snd_hda_intel)".
pub fn describe(d: &PciDevice) -> String {
    format!(
        "{} ({}, {})",
        d.address,
        d.class_name(),
        d.driver
            .as_deref()
            .map_or("no driver".into(), |x| format!("bound to {x}"))
    )
}

/// Refuses when the vfio-pci driver is not loaded.
pub fn vfio_pci_loaded(s: &dyn Sysfs) -> Result<(), PassthroughError> {
    if s.exists(&driver_dir(VFIO_PCI)) {
        return Ok(());
    }
    Err(PassthroughError::Refused(format!(
        "the vfio-pci driver is not loaded ({} is missing): run `modprobe vfio-pci` (and list vfio-pci in /etc/modules-load.d/ to load it at boot), then retry",
        s.path(&driver_dir(VFIO_PCI)).display()
    )))
}

/// Refuses unless `d` is bound to vfio-pci.
pub fn bound_to_vfio(d: &PciDevice) -> Result<(), PassthroughError> {
    if d.driver.as_deref() == Some(VFIO_PCI) {
        return Ok(());
    }
    Err(PassthroughError::Refused(format!(
        "{} is not bound to vfio-pci ({}): run `vgpuctl passthrough bind {}` first",
        d.address,
        d.driver
            .as_deref()
            .map_or("it has no driver".into(), |x| format!("its driver is {x}")),
        d.address
    )))
}
