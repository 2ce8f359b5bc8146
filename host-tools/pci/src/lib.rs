//! PCI devices, their IOMMU groups and SR-IOV functions, as sysfs shows them,
//! and the GPUs the NVIDIA driver describes in procfs: the one reader of
//! these trees for vgpud (which checks its passthrough VMs) and `vgpuctl`
//! (which lists, binds and verifies devices). It is host inspection, not
//! configuration, so it is a crate of its own beside `vgpu-config`.
//!
//! - [`sysfs`]: the [`Sysfs`](sysfs::Sysfs) seam, every path relative to a
//!   root that tests point at a fake tree;
//! - this module: [`PciAddress`], [`PciDevice`] (vendor, class, driver,
//!   IOMMU group, SR-IOV VFs), [`PciLinks`] (what vgpud needs of a device),
//!   IOMMU groups and the NVIDIA GPUs of a host;
//! - [`procfs`]: the NVIDIA driver's GPU information and open device nodes.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Serialize;
use thiserror::Error;

pub mod procfs;
pub mod sysfs;

use crate::sysfs::{IOMMU_CLASS, IOMMU_GROUPS, NO_OVERRIDE, PCI_DEVICES, Sysfs, attr, link_name};

/// NVIDIA's PCI vendor ID.
pub const NVIDIA_VENDOR: u16 = 0x10de;
/// Class code (base class and subclass) of a VGA display controller.
pub const CLASS_VGA: u16 = 0x0300;
/// Class code of a 3D controller (data-center GPUs and their VFs).
pub const CLASS_3D: u16 = 0x0302;
/// Class code of a PCI-to-PCI bridge.
pub const CLASS_BRIDGE: u16 = 0x0604;
/// Class code of an HD audio controller (a GPU's HDMI/DP audio function).
pub const CLASS_AUDIO: u16 = 0x0403;
/// Class code of a USB controller (USB-C ports of some GPUs).
pub const CLASS_USB: u16 = 0x0c03;
/// Class code of a serial bus controller (UCSI of some GPUs).
pub const CLASS_SERIAL_BUS: u16 = 0x0c80;
/// Base class of network controllers.
pub const BASE_CLASS_NETWORK: u16 = 0x02;
/// Highest device number on a bus.
const MAX_DEVICE: u8 = 0x1f;
/// Highest function number of a device.
const MAX_FUNCTION: u8 = 7;
/// Prefix of the links from a physical function to its virtual functions.
const VIRTFN_PREFIX: &str = "virtfn";

/// The driver that hands devices to VMs.
pub const VFIO_PCI: &str = "vfio-pci";
/// Drivers VFIO accepts in a viable group besides itself: the PCIe port
/// driver of bridges and the stub that only holds a device.
pub const GROUP_SAFE_DRIVERS: [&str; 2] = ["pcieport", "pci-stub"];

/// Why a PCI device could not be read.
#[derive(Debug, Error)]
pub enum PciError {
    /// The address is malformed.
    #[error(
        "`{0}` is not a PCI address: write domain:bus:device.function, e.g. 0000:3b:00.0 (see lspci -D)"
    )]
    BadAddress(String),
    /// No such device.
    #[error(
        "no PCI device {address} under {}: check the address with `lspci -D` (virtual functions exist only after `vgpuctl passthrough enable-vfs`)",
        dir.display()
    )]
    NotFound {
        /// The address.
        address: PciAddress,
        /// Where it was looked for.
        dir: PathBuf,
    },
    /// An attribute could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The attribute.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// An attribute holds something unexpected.
    #[error("{} holds `{value}`, which is not what the kernel writes there", path.display())]
    Malformed {
        /// The attribute.
        path: PathBuf,
        /// Its content.
        value: String,
    },
}

/// A PCI address, `DDDD:BB:DD.F`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    /// Segment (domain).
    pub domain: u32,
    /// Bus.
    pub bus: u8,
    /// Device.
    pub device: u8,
    /// Function.
    pub function: u8,
}

impl PciAddress {
    /// The routing ID (bus, device and function in 16 bits).
    pub fn routing_id(self) -> u16 {
        u16::from(self.bus) << 8 | u16::from(self.device) << 3 | u16::from(self.function)
    }

    /// The address of routing ID `rid` in this address's domain.
    pub fn with_routing_id(self, rid: u16) -> PciAddress {
        let [bus, devfn] = rid.to_be_bytes();
        PciAddress {
            domain: self.domain,
            bus,
            device: devfn >> 3,
            function: devfn & MAX_FUNCTION,
        }
    }

    /// The device's directory relative to the sysfs root.
    pub fn sysfs_dir(self) -> PathBuf {
        Path::new(PCI_DEVICES).join(self.to_string())
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl FromStr for PciAddress {
    type Err = PciError;

    /// Parses `DDDD:BB:DD.F`, also with an 8-digit domain (as NVML writes it)
    /// or without a domain (as `lspci` writes it; domain 0).
    fn from_str(s: &str) -> Result<Self, PciError> {
        let bad = || PciError::BadAddress(s.to_string());
        let hex = |t: &str, max: usize| {
            (!t.is_empty() && t.len() <= max && t.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u32::from_str_radix(t, 16).ok())
                .flatten()
        };
        let (rest, function) = s.rsplit_once('.').ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, dev] => (hex(d, 8).ok_or_else(bad)?, *b, *dev),
            [b, dev] => (0, *b, *dev),
            _ => return Err(bad()),
        };
        let bus = hex(bus, 2).ok_or_else(bad)?;
        let device = hex(device, 2).ok_or_else(bad)?;
        let function = hex(function, 1).ok_or_else(bad)?;
        if device > u32::from(MAX_DEVICE) || function > u32::from(MAX_FUNCTION) {
            return Err(bad());
        }
        Ok(PciAddress {
            domain,
            bus: bus as u8,
            device: device as u8,
            function: function as u8,
        })
    }
}

impl Serialize for PciAddress {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// SR-IOV capability of a physical function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Sriov {
    /// VFs the device supports (`sriov_totalvfs`).
    pub total: u32,
    /// VFs enabled now (`sriov_numvfs`).
    pub enabled: u32,
}

impl Sriov {
    /// Reads a function's SR-IOV capability (`sriov_totalvfs`, `sriov_numvfs`); `None` when it
    /// has none or does not exist.
    pub fn read(s: &dyn Sysfs, address: PciAddress) -> Result<Option<Sriov>, PciError> {
        let dir = address.sysfs_dir();
        let Some(total) = dec_attr(s, &dir.join("sriov_totalvfs"))? else {
            return Ok(None);
        };
        Ok(Some(Sriov {
            total,
            enabled: dec_attr(s, &dir.join("sriov_numvfs"))?.unwrap_or(0),
        }))
    }
}

/// A PCI function as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PciDevice {
    /// Address.
    pub address: PciAddress,
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// Class code (24 bits: class, subclass, programming interface).
    pub class: u32,
    /// Bound driver.
    pub driver: Option<String>,
    /// `driver_override` (None when unset).
    pub driver_override: Option<String>,
    /// IOMMU group (None: the IOMMU is off or does not cover the device).
    pub iommu_group: Option<u32>,
    /// SR-IOV capability (physical functions that have it).
    pub sriov: Option<Sriov>,
    /// The physical function of a virtual function.
    pub physfn: Option<PciAddress>,
    /// Enabled virtual functions of a physical function, in VF order.
    pub virtfns: Vec<PciAddress>,
}

fn read_err(s: &dyn Sysfs, rel: &Path) -> impl FnOnce(io::Error) -> PciError {
    let path = s.path(rel);
    move |source| PciError::Read { path, source }
}

fn hex_attr(s: &dyn Sysfs, rel: &Path) -> Result<Option<u32>, PciError> {
    let Some(v) = attr(s, rel).map_err(read_err(s, rel))? else {
        return Ok(None);
    };
    u32::from_str_radix(v.trim_start_matches("0x"), 16)
        .map(Some)
        .map_err(|_| PciError::Malformed {
            path: s.path(rel),
            value: v,
        })
}

fn dec_attr(s: &dyn Sysfs, rel: &Path) -> Result<Option<u32>, PciError> {
    let Some(v) = attr(s, rel).map_err(read_err(s, rel))? else {
        return Ok(None);
    };
    v.parse().map(Some).map_err(|_| PciError::Malformed {
        path: s.path(rel),
        value: v,
    })
}

fn address_link(s: &dyn Sysfs, rel: &Path) -> Result<Option<PciAddress>, PciError> {
    let Some(name) = link_name(s, rel).map_err(read_err(s, rel))? else {
        return Ok(None);
    };
    name.parse().map(Some).map_err(|_| PciError::Malformed {
        path: s.path(rel),
        value: name,
    })
}

/// A hex attribute the kernel always writes (`vendor`, `device`, `class`).
fn required_hex(s: &dyn Sysfs, dir: &Path, name: &str) -> Result<u32, PciError> {
    let rel = dir.join(name);
    hex_attr(s, &rel)?.ok_or_else(|| PciError::Read {
        path: s.path(&rel),
        source: io::Error::from(io::ErrorKind::NotFound),
    })
}

/// What vgpud checks of a passthrough device: who made it and the kernel's
/// links to its driver, IOMMU group and physical function.
/// [`PciDevice::read`] reads these and the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciLinks {
    /// Vendor ID.
    pub vendor: u16,
    /// Bound driver.
    pub driver: Option<String>,
    /// IOMMU group (None: the IOMMU is off or does not cover the device).
    pub iommu_group: Option<u32>,
    /// The physical function of a virtual function.
    pub physfn: Option<PciAddress>,
}

impl PciLinks {
    /// Reads a device's vendor and links; `None` when it does not exist.
    pub fn read(s: &dyn Sysfs, address: PciAddress) -> Result<Option<PciLinks>, PciError> {
        let dir = address.sysfs_dir();
        if !s.exists(&dir) {
            return Ok(None);
        }
        let vendor = required_hex(s, &dir, "vendor")? as u16;
        let driver_rel = dir.join("driver");
        let driver = link_name(s, &driver_rel).map_err(read_err(s, &driver_rel))?;
        let group_rel = dir.join("iommu_group");
        let iommu_group = match link_name(s, &group_rel).map_err(read_err(s, &group_rel))? {
            None => None,
            Some(g) => Some(g.parse().map_err(|_| PciError::Malformed {
                path: s.path(&group_rel),
                value: g,
            })?),
        };
        Ok(Some(PciLinks {
            vendor,
            driver,
            iommu_group,
            physfn: address_link(s, &dir.join("physfn"))?,
        }))
    }
}

impl PciDevice {
    /// Reads a device; [`PciError::NotFound`] when it does not exist.
    pub fn read(s: &dyn Sysfs, address: PciAddress) -> Result<PciDevice, PciError> {
        let dir = address.sysfs_dir();
        let Some(links) = PciLinks::read(s, address)? else {
            return Err(PciError::NotFound {
                address,
                dir: s.path(Path::new(PCI_DEVICES)),
            });
        };
        let device = required_hex(s, &dir, "device")? as u16;
        let class = required_hex(s, &dir, "class")?;
        let driver_override = attr(s, &dir.join("driver_override"))
            .map_err(read_err(s, &dir.join("driver_override")))?
            .filter(|o| o != NO_OVERRIDE && !o.is_empty());
        let sriov = Sriov::read(s, address)?;
        let mut indexed: Vec<(u32, PciAddress)> = Vec::new();
        if sriov.is_some() {
            for name in s.list(&dir).map_err(read_err(s, &dir))? {
                if let Some(i) = name
                    .strip_prefix(VIRTFN_PREFIX)
                    .and_then(|i| i.parse().ok())
                    && let Some(a) = address_link(s, &dir.join(&name))?
                {
                    indexed.push((i, a));
                }
            }
        }
        indexed.sort();
        Ok(PciDevice {
            address,
            vendor: links.vendor,
            device,
            class,
            driver: links.driver,
            driver_override,
            iommu_group: links.iommu_group,
            sriov,
            physfn: links.physfn,
            virtfns: indexed.into_iter().map(|(_, a)| a).collect(),
        })
    }

    /// Whether NVIDIA made it.
    pub fn is_nvidia(&self) -> bool {
        self.vendor == NVIDIA_VENDOR
    }

    /// Class and subclass (the top 16 bits of the class code).
    pub fn class_code(&self) -> u16 {
        (self.class >> 8) as u16
    }

    /// Whether it is a display or 3D controller.
    pub fn is_gpu(&self) -> bool {
        matches!(self.class_code(), CLASS_VGA | CLASS_3D)
    }

    /// Whether it is a PCI bridge.
    pub fn is_bridge(&self) -> bool {
        self.class_code() == CLASS_BRIDGE
    }

    /// Whether VFIO accepts it in a viable group as it is now: bound to
    /// vfio-pci, to no driver, or (bridges) to a driver VFIO tolerates.
    pub fn group_safe(&self) -> bool {
        match self.driver.as_deref() {
            None | Some(VFIO_PCI) => true,
            Some(d) => GROUP_SAFE_DRIVERS.contains(&d),
        }
    }

    /// A short description of the function's class, for listings.
    pub fn class_name(&self) -> &'static str {
        match self.class_code() {
            CLASS_VGA => "vga",
            CLASS_3D => "3d",
            CLASS_BRIDGE => "bridge",
            CLASS_AUDIO => "audio",
            CLASS_USB => "usb",
            CLASS_SERIAL_BUS => "serial-bus",
            c if c >> 8 == BASE_CLASS_NETWORK => "network",
            _ => "other",
        }
    }
}

/// Whether the host has an active IOMMU (at least one IOMMU unit or group).
pub fn iommu_enabled(s: &dyn Sysfs) -> bool {
    [IOMMU_GROUPS, IOMMU_CLASS]
        .iter()
        .any(|d| s.list(Path::new(d)).is_ok_and(|l| !l.is_empty()))
}

/// The devices of an IOMMU group.
pub fn group_members(s: &dyn Sysfs, group: u32) -> Result<Vec<PciAddress>, PciError> {
    let rel = Path::new(IOMMU_GROUPS)
        .join(group.to_string())
        .join("devices");
    let mut out = Vec::new();
    for name in s.list(&rel).map_err(read_err(s, &rel))? {
        // Non-PCI members (rare) cannot be bound to vfio-pci; report them by
        // name through the error path of the caller.
        out.push(name.parse().map_err(|_| PciError::Malformed {
            path: s.path(&rel),
            value: name,
        })?);
    }
    Ok(out)
}

/// The default DMA domain type of an IOMMU group (`DMA`, `DMA-FQ`,
/// `identity`, …), when the kernel says.
pub fn group_type(s: &dyn Sysfs, group: u32) -> Option<String> {
    attr(
        s,
        &Path::new(IOMMU_GROUPS).join(group.to_string()).join("type"),
    )
    .ok()
    .flatten()
}

/// Every PCI device, sorted by address; unreadable entries are skipped.
pub fn all_devices(s: &dyn Sysfs) -> Result<Vec<PciDevice>, PciError> {
    let rel = Path::new(PCI_DEVICES);
    let mut out = Vec::new();
    for name in s.list(rel).map_err(read_err(s, rel))? {
        let Ok(a) = name.parse::<PciAddress>() else {
            continue;
        };
        if let Ok(d) = PciDevice::read(s, a) {
            out.push(d);
        }
    }
    out.sort_by_key(|d| d.address);
    Ok(out)
}

/// NVIDIA GPUs: physical functions in address order, each followed by its
/// virtual functions in VF order.
pub fn nvidia_gpus(s: &dyn Sysfs) -> Result<Vec<PciDevice>, PciError> {
    let all = all_devices(s)?;
    let gpus: Vec<&PciDevice> = all.iter().filter(|d| d.is_nvidia() && d.is_gpu()).collect();
    let mut out = Vec::new();
    for pf in gpus.iter().filter(|d| d.physfn.is_none()) {
        out.push((*pf).clone());
        for vf in &pf.virtfns {
            if let Some(v) = gpus.iter().find(|d| d.address == *vf) {
                out.push((*v).clone());
            }
        }
    }
    // VFs whose PF is not an NVIDIA GPU (should not happen) still show.
    for vf in gpus.iter().filter(|d| d.physfn.is_some()) {
        if !out.iter().any(|d| d.address == vf.address) {
            out.push((*vf).clone());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_in_every_spelling_and_print_like_lspci() {
        let a: PciAddress = "0000:3b:00.0".parse().unwrap();
        assert_eq!(a.to_string(), "0000:3b:00.0");
        assert_eq!("3B:00.0".parse::<PciAddress>().unwrap(), a);
        assert_eq!("00000000:3B:00.0".parse::<PciAddress>().unwrap(), a);
        for bad in [
            "",
            "3b:00",
            "0000:3b:20.0",
            "0000:3b:00.8",
            "g000:3b:00.0",
            "0:0:0:0.0",
            "x",
        ] {
            assert!(bad.parse::<PciAddress>().is_err(), "{bad}");
        }
        let e = "3b-00.0".parse::<PciAddress>().unwrap_err().to_string();
        assert!(e.contains("lspci -D"), "{e}");
    }

    #[test]
    fn routing_ids_round_trip_across_device_boundaries() {
        let pf: PciAddress = "0000:3b:00.0".parse().unwrap();
        // Offset 4, stride 1: VF 4 of this PF is function 0 of device 1.
        let vf4 = pf.with_routing_id(pf.routing_id() + 4 + 4);
        assert_eq!(vf4.to_string(), "0000:3b:01.0");
        assert_eq!(vf4.routing_id(), pf.routing_id() + 8);
    }

    #[test]
    fn links_need_only_the_vendor_and_read_what_the_kernel_links() {
        use std::os::unix::fs::symlink;
        let d = tempfile::tempdir().unwrap();
        let s = crate::sysfs::RealSysfs::new(d.path());
        let dev = d.path().join("devices/pci0000:00/0000:3b:00.4");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::create_dir_all(d.path().join(PCI_DEVICES)).unwrap();
        symlink(&dev, d.path().join(PCI_DEVICES).join("0000:3b:00.4")).unwrap();
        std::fs::write(dev.join("vendor"), "0x10de\n").unwrap();
        symlink("../../../bus/pci/drivers/vfio-pci", dev.join("driver")).unwrap();
        symlink("../../../kernel/iommu_groups/60", dev.join("iommu_group")).unwrap();
        symlink("../0000:3b:00.0", dev.join("physfn")).unwrap();
        let a: PciAddress = "0000:3b:00.4".parse().unwrap();
        assert_eq!(
            PciLinks::read(&s, a).unwrap(),
            Some(PciLinks {
                vendor: NVIDIA_VENDOR,
                driver: Some(VFIO_PCI.into()),
                iommu_group: Some(60),
                physfn: Some("0000:3b:00.0".parse().unwrap()),
            })
        );
        assert_eq!(
            PciLinks::read(&s, "0000:3c:00.0".parse().unwrap()).unwrap(),
            None
        );
        // A whole device needs its IDs and class too.
        assert!(matches!(PciDevice::read(&s, a), Err(PciError::Read { .. })));
    }

    #[test]
    fn sriov_counts_come_from_sysfs_and_garbage_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let s = crate::sysfs::RealSysfs::new(d.path());
        let a: PciAddress = "0000:3b:00.0".parse().unwrap();
        let dev = d.path().join(a.sysfs_dir());
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("sriov_numvfs"), "4\n").unwrap();
        std::fs::write(dev.join("sriov_totalvfs"), "16\n").unwrap();
        assert_eq!(
            Sriov::read(&s, a).unwrap(),
            Some(Sriov {
                total: 16,
                enabled: 4
            })
        );
        // No such device, or no SR-IOV capability.
        assert_eq!(
            Sriov::read(&s, "0000:3c:00.0".parse().unwrap()).unwrap(),
            None
        );
        std::fs::write(dev.join("sriov_totalvfs"), "lots\n").unwrap();
        assert!(matches!(
            Sriov::read(&s, a),
            Err(PciError::Malformed { value, .. }) if value == "lots"
        ));
    }
}
