//! The VFIO side of `verify`: opens the container, the group and the device
//! with `vfio-ioctls` as a VMM would, and reports regions and interrupts.
//!
//! `vfio-ioctls` opens `/dev/vfio/vfio` and `/dev/vfio/<group>` itself, so
//! this part always uses the host's `/dev`, whatever `--sysfs-root` says.

use std::path::Path;
use std::sync::Arc;

use serde::Serialize;
use thiserror::Error;
use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_INFO_AUTOMASKED, VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_MASKABLE,
    VFIO_IRQ_INFO_NORESIZE, VFIO_PCI_BAR0_REGION_INDEX, VFIO_PCI_ERR_IRQ_INDEX,
    VFIO_PCI_INTX_IRQ_INDEX, VFIO_PCI_MSI_IRQ_INDEX, VFIO_PCI_MSIX_IRQ_INDEX,
    VFIO_PCI_REQ_IRQ_INDEX, VFIO_PCI_VGA_REGION_INDEX, VFIO_REGION_INFO_FLAG_MMAP,
    VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
};
use vfio_ioctls::{VfioContainer, VfioDevice, VfioError};

/// The VFIO container node.
pub const VFIO_CONTAINER: &str = "/dev/vfio/vfio";
/// The IOMMU backend vgpu requires (and `vfio-ioctls` sets).
pub const IOMMU_TYPE: &str = "VFIO_TYPE1v2_IOMMU";

/// Names of the vfio-pci regions, by index.
const REGION_NAMES: [&str; 9] = [
    "BAR0", "BAR1", "BAR2", "BAR3", "BAR4", "BAR5", "ROM", "CONFIG", "VGA",
];
/// vfio-pci interrupt indices and their names.
const IRQS: [(u32, &str); 5] = [
    (VFIO_PCI_INTX_IRQ_INDEX, "INTx"),
    (VFIO_PCI_MSI_IRQ_INDEX, "MSI"),
    (VFIO_PCI_MSIX_IRQ_INDEX, "MSI-X"),
    (VFIO_PCI_ERR_IRQ_INDEX, "ERR"),
    (VFIO_PCI_REQ_IRQ_INDEX, "REQ"),
];

/// Why the VFIO check failed.
#[derive(Debug, Error)]
#[error("VFIO: {step} failed: {source}; {hint}")]
pub struct VfioCheckError {
    /// What was being done.
    pub step: &'static str,
    /// `vfio-ioctls`' error.
    #[source]
    pub source: VfioError,
    /// What to do.
    pub hint: String,
}

/// A device region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Region {
    /// vfio-pci region index.
    pub index: u32,
    /// `BAR0`…`VGA`.
    pub name: &'static str,
    /// Size in bytes.
    pub size: u64,
    /// `read`, `write`, `mmap`.
    pub flags: Vec<&'static str>,
}

/// A device interrupt type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Irq {
    /// vfio-pci interrupt index.
    pub index: u32,
    /// `INTx`, `MSI`, `MSI-X`, `ERR`, `REQ`.
    pub name: &'static str,
    /// Vectors.
    pub count: u32,
    /// `eventfd`, `maskable`, `automasked`, `noresize`.
    pub flags: Vec<&'static str>,
}

/// What VFIO reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VfioReport {
    /// The container node.
    pub container: &'static str,
    /// The IOMMU backend set on the container.
    pub iommu_type: &'static str,
    /// Implemented regions.
    pub regions: Vec<Region>,
    /// Interrupt types with at least one vector.
    pub irqs: Vec<Irq>,
}

fn hint(e: &VfioError, group: u32) -> String {
    let errno = |io: &std::io::Error| io.raw_os_error();
    match e {
        VfioError::OpenContainer(io) | VfioError::OpenGroup(io, _)
            if matches!(errno(io), Some(libc::EACCES | libc::EPERM)) =>
        {
            "run as root or give your user access to /dev/vfio (udev rule)".into()
        }
        VfioError::OpenContainer(_) => {
            "load vfio-pci (`modprobe vfio-pci`) so /dev/vfio/vfio exists".into()
        }
        VfioError::OpenGroup(io, _) if errno(io) == Some(libc::EBUSY) => {
            format!("IOMMU group {group} is open elsewhere (a running VM?); stop it and retry")
        }
        VfioError::OpenGroup(..) => format!(
            "/dev/vfio/{group} is missing: the device is not bound to vfio-pci (`vgpuctl passthrough bind`)"
        ),
        VfioError::GroupViable => format!(
            "a device of IOMMU group {group} is bound to a host driver: `vgpuctl passthrough bind --group`"
        ),
        VfioError::VfioExtension | VfioError::VfioInvalidType | VfioError::VfioType1V2 => {
            "the kernel lacks the type1v2 IOMMU backend: load vfio_iommu_type1".into()
        }
        VfioError::VfioApiVersion => {
            "the kernel's VFIO API version is not the one vgpu knows".into()
        }
        _ => "see `dmesg` for the kernel's reason".into(),
    }
}

fn flags<const N: usize>(value: u32, names: [(u32, &'static str); N]) -> Vec<&'static str> {
    names
        .iter()
        .filter(|(bit, _)| value & bit != 0)
        .map(|(_, n)| *n)
        .collect()
}

/// Opens a VFIO container (checking the API version and the type1v2 IOMMU
/// backend). Fails where VFIO is not available.
pub fn open_container() -> Result<Arc<VfioContainer>, VfioCheckError> {
    VfioContainer::new(None)
        .map(Arc::new)
        .map_err(|source| VfioCheckError {
            step: "opening the container",
            hint: hint(&source, 0),
            source,
        })
}

/// Opens the device at `device_dir` (its sysfs directory, whose
/// `iommu_group` link names the group) in a new container, as a VMM does,
/// and reports its regions and interrupts. Opening the group checks that it
/// is viable and sets the IOMMU type.
pub fn inspect(device_dir: &Path, group: u32) -> Result<VfioReport, VfioCheckError> {
    let container = open_container()?;
    let device =
        VfioDevice::new(device_dir, container, false).map_err(|source| VfioCheckError {
            step: "opening the group and the device",
            hint: hint(&source, group),
            source,
        })?;
    let regions = (VFIO_PCI_BAR0_REGION_INDEX..=VFIO_PCI_VGA_REGION_INDEX)
        .zip(REGION_NAMES)
        .filter(|(i, _)| device.get_region_size(*i) > 0)
        .map(|(index, name)| Region {
            index,
            name,
            size: device.get_region_size(index),
            flags: flags(
                device.get_region_flags(index),
                [
                    (VFIO_REGION_INFO_FLAG_READ, "read"),
                    (VFIO_REGION_INFO_FLAG_WRITE, "write"),
                    (VFIO_REGION_INFO_FLAG_MMAP, "mmap"),
                ],
            ),
        })
        .collect();
    let irqs = IRQS
        .iter()
        .filter_map(|(index, name)| {
            let i = device.get_irq_info(*index)?;
            (i.count > 0).then(|| Irq {
                index: *index,
                name,
                count: i.count,
                flags: flags(
                    i.flags,
                    [
                        (VFIO_IRQ_INFO_EVENTFD, "eventfd"),
                        (VFIO_IRQ_INFO_MASKABLE, "maskable"),
                        (VFIO_IRQ_INFO_AUTOMASKED, "automasked"),
                        (VFIO_IRQ_INFO_NORESIZE, "noresize"),
                    ],
                ),
            })
        })
        .collect();
    Ok(VfioReport {
        container: VFIO_CONTAINER,
        iommu_type: IOMMU_TYPE,
        regions,
        irqs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vfio_errors_say_what_to_do() {
        let busy = VfioError::OpenGroup(std::io::Error::from_raw_os_error(libc::EBUSY), "7".into());
        assert!(hint(&busy, 7).contains("group 7 is open elsewhere"));
        assert!(hint(&VfioError::GroupViable, 7).contains("--group"));
        let denied = VfioError::OpenContainer(std::io::Error::from_raw_os_error(libc::EACCES));
        assert!(hint(&denied, 0).contains("root"));
        assert_eq!(
            flags(0b101, [(1, "read"), (2, "write"), (4, "mmap")]),
            vec!["read", "mmap"]
        );
    }

    /// Runs the container ioctls (API version, type1v2 extension) where the
    /// host has VFIO.
    #[test]
    fn container_opens_where_the_host_has_vfio() {
        if !Path::new(VFIO_CONTAINER).exists() {
            eprintln!("skipped: {VFIO_CONTAINER} does not exist on this host (no vfio module)");
            return;
        }
        match open_container() {
            Ok(_) => {}
            // Present but not ours to open (not root): the error must say so.
            Err(e) => assert!(e.to_string().contains("root"), "{e}"),
        }
    }
}
