//! Fake hosts for tests: sysfs and procfs trees laid out like the kernel's
//! (the same symbolic links between `bus/pci/devices`, `devices/…`,
//! `bus/pci/drivers/…` and `kernel/iommu_groups/…`), and [`FakeSysfs`],
//! which reacts to writes as the kernel does.
//!
//! Why a [`Sysfs`] implementation and not only a tree: on a host, writing
//! `sriov_numvfs` creates devices and writing a driver's `bind` creates the
//! `driver` link; a plain file does nothing. [`FakeSysfs`] reads through
//! [`RealSysfs`] (so the code under test reads real files and links, as on a
//! host) and emulates the kernel's side of each write: driver matching with
//! `driver_override`, `bind`/`unbind`/`drivers_probe`, VF creation with
//! `virtfn`/`physfn` links and IOMMU groups, `sriov_drivers_autoprobe`, and
//! the NVIDIA driver's `/proc/driver/nvidia/gpus` entries. It records every
//! write and can fail or silently ignore the n-th one, so each step of a
//! plan can be made to fail.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use clap::Parser;

use super::{Host, PassthroughArgs, PassthroughError, Report, execute};
use vgpu_pci::procfs::NVIDIA_GPUS;
use vgpu_pci::sysfs::{
    IOMMU_CLASS, IOMMU_GROUPS, NO_OVERRIDE, PCI_DEVICES, PCI_DRIVERS, PCI_DRIVERS_PROBE, RealSysfs,
    Sysfs,
};
use vgpu_pci::{PciAddress, VFIO_PCI};

/// The data-center GPU of [`FakeHost::datacenter`]: SR-IOV capable, bound to nvidia.
pub const A100: &str = "0000:3b:00.0";
/// Its first VF once VFs are enabled (offset 4, stride 1).
pub const A100_VF0: &str = "0000:3b:00.4";
/// The workstation GPU, sharing IOMMU group 17 with its audio function.
pub const RTX: &str = "0000:65:00.0";
/// The workstation GPU's HDMI audio function.
pub const RTX_AUDIO: &str = "0000:65:00.1";
/// A GPU bound to no driver, alone in its group.
pub const L4: &str = "0000:af:00.0";
/// A network card (not NVIDIA).
pub const NIC: &str = "0000:00:1f.6";
/// The root port above the A100.
pub const ROOT_PORT: &str = "0000:3a:00.0";
/// IOMMU group of the A100.
pub const A100_GROUP: u32 = 42;
/// IOMMU group of the workstation GPU and its audio function.
pub const RTX_GROUP: u32 = 17;
/// UUID of the A100.
pub const A100_UUID: &str = "GPU-5a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9";

/// An SR-IOV capability.
#[derive(Debug, Clone)]
pub struct SriovSpec {
    /// `sriov_totalvfs`.
    pub total: u32,
    /// `sriov_offset` (routing-ID distance from the PF to VF 0).
    pub offset: u16,
    /// `sriov_stride`.
    pub stride: u16,
    /// `sriov_vf_device`.
    pub vf_device: u16,
    /// The driver that takes new VFs when autoprobe is on.
    pub vf_driver: Option<String>,
}

/// A device to add to a fake host.
#[derive(Debug, Clone)]
pub struct DeviceSpec {
    /// Address.
    pub address: PciAddress,
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// 24-bit class code.
    pub class: u32,
    /// Bound driver.
    pub driver: Option<String>,
    /// The driver the kernel picks for it when no override is set.
    pub native: Option<String>,
    /// IOMMU group.
    pub group: Option<u32>,
    /// SR-IOV capability.
    pub sriov: Option<SriovSpec>,
    /// BAR sizes in bytes (BAR0 upwards; 0: unimplemented).
    pub bars: Vec<u64>,
}

impl DeviceSpec {
    /// A device bound to `driver` (which is also its native driver).
    pub fn new(address: &str, vendor: u16, device: u16, class: u32, driver: Option<&str>) -> Self {
        Self {
            address: address.parse().expect("valid test address"),
            vendor,
            device,
            class,
            driver: driver.map(str::to_string),
            native: driver.map(str::to_string),
            group: None,
            sriov: None,
            bars: vec![16 << 20],
        }
    }

    /// In IOMMU group `g`.
    pub fn group(mut self, g: u32) -> Self {
        self.group = Some(g);
        self
    }

    /// With the kernel's choice of driver.
    pub fn native(mut self, d: &str) -> Self {
        self.native = Some(d.to_string());
        self
    }

    /// With an SR-IOV capability.
    pub fn sriov(mut self, s: SriovSpec) -> Self {
        self.sriov = Some(s);
        self
    }

    /// With these BARs.
    pub fn bars(mut self, b: &[u64]) -> Self {
        self.bars = b.to_vec();
        self
    }
}

/// A fault to inject into writes.
#[derive(Debug, Clone)]
enum Fault {
    /// The n-th write (0-based) fails with errno and changes nothing.
    Fail { nth: usize, errno: i32 },
    /// The n-th write reports success and changes nothing.
    Ignore { nth: usize },
    /// Every write to a path ending in `suffix` fails.
    FailPath { suffix: String, errno: i32 },
}

#[derive(Debug, Default)]
struct Kernel {
    /// Driver the kernel picks per device when no override is set.
    native: HashMap<PciAddress, String>,
    /// Driver that takes a PF's new VFs.
    vf_native: HashMap<PciAddress, String>,
    /// `/proc/driver/nvidia/gpus/<addr>/information` of GPUs, present while
    /// the nvidia driver drives them.
    nvidia_info: HashMap<PciAddress, String>,
    faults: Vec<Fault>,
    /// Every write: (path relative to the root, value, accepted).
    log: Vec<(String, String, bool)>,
}

/// sysfs that behaves like the kernel's when written (see the module docs).
#[derive(Debug)]
pub struct FakeSysfs {
    real: RealSysfs,
    proc: PathBuf,
    kernel: Mutex<Kernel>,
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

fn up(n: usize) -> String {
    "../".repeat(n)
}

impl FakeSysfs {
    fn new(root: &Path, proc: &Path) -> Self {
        Self {
            real: RealSysfs::new(root),
            proc: proc.to_path_buf(),
            kernel: Mutex::new(Kernel::default()),
        }
    }

    fn k(&self) -> std::sync::MutexGuard<'_, Kernel> {
        self.kernel.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The n-th write from now on (0-based, counting every write) fails
    /// with `errno` and changes nothing.
    pub fn fail_nth_write(&self, nth: usize, errno: i32) {
        let base = self.k().log.len();
        self.k().faults.push(Fault::Fail {
            nth: base + nth,
            errno,
        });
    }

    /// The n-th write from now on is accepted but does nothing.
    pub fn ignore_nth_write(&self, nth: usize) {
        let base = self.k().log.len();
        self.k().faults.push(Fault::Ignore { nth: base + nth });
    }

    /// Every write to a path ending in `suffix` fails with `errno`.
    pub fn fail_writes_to(&self, suffix: &str, errno: i32) {
        self.k().faults.push(Fault::FailPath {
            suffix: suffix.into(),
            errno,
        });
    }

    /// Removes every injected fault.
    pub fn clear_faults(&self) {
        self.k().faults.clear();
    }

    /// Every write so far: (path relative to the root, value, accepted).
    pub fn writes(&self) -> Vec<(String, String, bool)> {
        self.k().log.clone()
    }

    fn abs(&self, rel: &str) -> PathBuf {
        self.real.root().join(rel)
    }

    /// The real directory of a device.
    fn dev_dir(&self, a: PciAddress) -> io::Result<PathBuf> {
        std::fs::canonicalize(self.abs(PCI_DEVICES).join(a.to_string()))
            .map_err(|_| errno(libc::ENODEV))
    }

    /// Depth of a directory below the root.
    fn depth(&self, dir: &Path) -> usize {
        let root = std::fs::canonicalize(self.real.root()).unwrap_or_default();
        dir.strip_prefix(&root)
            .map_or(0, |r| r.components().count())
    }

    fn rel_to_root(&self, dir: &Path) -> PathBuf {
        let root = std::fs::canonicalize(self.real.root()).unwrap_or_default();
        dir.strip_prefix(&root).unwrap_or(dir).to_path_buf()
    }

    fn driver_of(&self, a: PciAddress) -> Option<String> {
        let d = self.dev_dir(a).ok()?;
        std::fs::read_link(d.join("driver"))
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
    }

    fn override_of(&self, a: PciAddress) -> Option<String> {
        let d = self.dev_dir(a).ok()?;
        let o = std::fs::read_to_string(d.join("driver_override")).ok()?;
        let o = o.trim_end();
        (o != NO_OVERRIDE && !o.is_empty()).then(|| o.to_string())
    }

    /// Whether `drv` would take `a` (`driver_override` wins over IDs).
    fn matches(&self, a: PciAddress, drv: &str) -> bool {
        match self.override_of(a) {
            Some(o) => o == drv,
            None => self.k().native.get(&a).is_some_and(|n| n == drv),
        }
    }

    fn link_driver(&self, a: PciAddress, drv: &str) -> io::Result<()> {
        let dir = self.dev_dir(a)?;
        let n = self.depth(&dir);
        symlink(format!("{}{PCI_DRIVERS}/{drv}", up(n)), dir.join("driver"))?;
        symlink(
            format!("{}{}", up(4), self.rel_to_root(&dir).display()),
            self.abs(PCI_DRIVERS).join(drv).join(a.to_string()),
        )?;
        if drv == "nvidia"
            && let Some(info) = self.k().nvidia_info.get(&a).cloned()
        {
            let d = self.proc.join(NVIDIA_GPUS).join(a.to_string());
            std::fs::create_dir_all(&d)?;
            std::fs::write(d.join("information"), info)?;
        }
        Ok(())
    }

    fn unlink_driver(&self, a: PciAddress) -> io::Result<()> {
        let Some(drv) = self.driver_of(a) else {
            return Ok(());
        };
        let dir = self.dev_dir(a)?;
        std::fs::remove_file(dir.join("driver"))?;
        std::fs::remove_file(self.abs(PCI_DRIVERS).join(&drv).join(a.to_string()))?;
        if drv == "nvidia" {
            let d = self.proc.join(NVIDIA_GPUS).join(a.to_string());
            if d.exists() {
                std::fs::remove_dir_all(d)?;
            }
        }
        Ok(())
    }

    fn loaded(&self, drv: &str) -> bool {
        self.abs(PCI_DRIVERS).join(drv).is_dir()
    }

    fn iommu_on(&self) -> bool {
        self.real
            .list(Path::new(IOMMU_CLASS))
            .is_ok_and(|l| !l.is_empty())
    }

    fn next_group(&self) -> u32 {
        self.real
            .list(Path::new(IOMMU_GROUPS))
            .unwrap_or_default()
            .iter()
            .filter_map(|g| g.parse::<u32>().ok())
            .max()
            .map_or(0, |m| m + 1)
    }

    fn read_num(&self, dir: &Path, f: &str) -> u32 {
        std::fs::read_to_string(dir.join(f))
            .ok()
            .and_then(|v| {
                let v = v.trim();
                v.strip_prefix("0x")
                    .map_or_else(|| v.parse().ok(), |h| u32::from_str_radix(h, 16).ok())
            })
            .unwrap_or(0)
    }

    fn set_numvfs(&self, pf: PciAddress, value: &str) -> io::Result<()> {
        let dir = self.dev_dir(pf)?;
        let n: u32 = value.trim().parse().map_err(|_| errno(libc::EINVAL))?;
        let cur = self.read_num(&dir, "sriov_numvfs");
        if self.driver_of(pf).is_none() {
            return Err(errno(libc::ENOENT));
        }
        if n == cur {
            return Ok(());
        }
        if n > self.read_num(&dir, "sriov_totalvfs") {
            return Err(errno(libc::ERANGE));
        }
        if cur != 0 && n != 0 {
            return Err(errno(libc::EBUSY));
        }
        if n == 0 {
            for i in 0..cur {
                let link = dir.join(format!("virtfn{i}"));
                if let Some(vf) = std::fs::read_link(&link)
                    .ok()
                    .and_then(|t| t.file_name()?.to_str()?.parse().ok())
                {
                    self.remove_vf(vf)?;
                }
                std::fs::remove_file(link)?;
            }
        } else {
            let offset = self.read_num(&dir, "sriov_offset") as u16;
            let stride = self.read_num(&dir, "sriov_stride") as u16;
            for i in 0..n as u16 {
                let vf = pf.with_routing_id(pf.routing_id() + offset + i * stride);
                self.create_vf(pf, &dir, vf, u32::from(i))?;
            }
        }
        std::fs::write(dir.join("sriov_numvfs"), format!("{n}\n"))?;
        if n > 0 && std::fs::read_to_string(dir.join("sriov_drivers_autoprobe"))?.trim() == "1" {
            for i in 0..n {
                let vf: PciAddress = std::fs::read_link(dir.join(format!("virtfn{i}")))?
                    .file_name()
                    .and_then(|f| f.to_str()?.parse().ok())
                    .ok_or_else(|| errno(libc::EIO))?;
                let native = self.k().native.get(&vf).cloned();
                if let Some(d) = native
                    && self.loaded(&d)
                {
                    self.link_driver(vf, &d)?;
                }
            }
        }
        Ok(())
    }

    fn create_vf(&self, pf: PciAddress, pf_dir: &Path, vf: PciAddress, i: u32) -> io::Result<()> {
        let parent = pf_dir.parent().ok_or_else(|| errno(libc::EIO))?;
        let dir = parent.join(vf.to_string());
        std::fs::create_dir_all(&dir)?;
        let read = |f: &str| std::fs::read_to_string(pf_dir.join(f));
        std::fs::write(dir.join("vendor"), read("vendor")?)?;
        std::fs::write(dir.join("device"), read("sriov_vf_device")?)?;
        std::fs::write(dir.join("class"), read("class")?)?;
        std::fs::write(dir.join("driver_override"), format!("{NO_OVERRIDE}\n"))?;
        std::fs::write(dir.join("resource"), resource(&[16 << 20, 0, 8 << 30]))?;
        symlink(format!("../{pf}"), dir.join("physfn"))?;
        symlink(format!("../{vf}"), pf_dir.join(format!("virtfn{i}")))?;
        let n = self.depth(&dir);
        symlink(
            format!("{}{}", up(3), self.rel_to_root(&dir).display()),
            self.abs(PCI_DEVICES).join(vf.to_string()),
        )?;
        if self.iommu_on() {
            let g = self.next_group();
            self.add_to_group(vf, &dir, n, g)?;
        }
        let vf_driver = self.k().vf_native.get(&pf).cloned();
        if let Some(d) = vf_driver {
            self.k().native.insert(vf, d);
        }
        Ok(())
    }

    fn add_to_group(&self, a: PciAddress, dir: &Path, depth: usize, g: u32) -> io::Result<()> {
        let gdir = self.abs(IOMMU_GROUPS).join(g.to_string());
        std::fs::create_dir_all(gdir.join("devices"))?;
        if !gdir.join("type").exists() {
            std::fs::write(gdir.join("type"), "DMA-FQ\n")?;
        }
        symlink(
            format!("{}{}", up(4), self.rel_to_root(dir).display()),
            gdir.join("devices").join(a.to_string()),
        )?;
        symlink(
            format!("{}{IOMMU_GROUPS}/{g}", up(depth)),
            dir.join("iommu_group"),
        )
    }

    fn remove_vf(&self, vf: PciAddress) -> io::Result<()> {
        self.unlink_driver(vf)?;
        let dir = self.dev_dir(vf)?;
        if let Ok(t) = std::fs::read_link(dir.join("iommu_group"))
            && let Some(g) = t.file_name()
        {
            let gdir = self.abs(IOMMU_GROUPS).join(g);
            std::fs::remove_file(gdir.join("devices").join(vf.to_string()))?;
            if std::fs::read_dir(gdir.join("devices"))?.next().is_none() {
                std::fs::remove_dir_all(gdir)?;
            }
        }
        std::fs::remove_file(self.abs(PCI_DEVICES).join(vf.to_string()))?;
        std::fs::remove_dir_all(dir)?;
        self.k().native.remove(&vf);
        Ok(())
    }

    /// The kernel's reaction to a write that passed fault injection.
    fn kernel_write(&self, rel: &Path, value: &str) -> io::Result<()> {
        let parts: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
        let addr =
            || -> io::Result<PciAddress> { value.trim().parse().map_err(|_| errno(libc::ENODEV)) };
        match parts.as_slice() {
            ["bus", "pci", "drivers", drv, "bind"] => {
                let a = addr()?;
                self.dev_dir(a)?;
                if self.driver_of(a).is_some() {
                    return Err(errno(libc::EBUSY));
                }
                if !self.matches(a, drv) {
                    return Err(errno(libc::ENODEV));
                }
                self.link_driver(a, drv)
            }
            ["bus", "pci", "drivers", drv, "unbind"] => {
                let a = addr()?;
                if self.driver_of(a).as_deref() != Some(*drv) {
                    return Err(errno(libc::ENODEV));
                }
                self.unlink_driver(a)
            }
            ["bus", "pci", "drivers_probe"] => {
                let a = addr()?;
                self.dev_dir(a)?;
                if self.driver_of(a).is_some() {
                    return Ok(());
                }
                let candidate = self
                    .override_of(a)
                    .or_else(|| self.k().native.get(&a).cloned());
                match candidate {
                    Some(d) if self.loaded(&d) && self.matches(a, &d) => self.link_driver(a, &d),
                    // No driver wants it: the kernel reports success anyway.
                    _ => Ok(()),
                }
            }
            ["bus", "pci", "devices", dev, "driver_override"] => {
                let a: PciAddress = dev.parse().map_err(|_| errno(libc::ENOENT))?;
                let v = value.trim();
                let v = if v.is_empty() { NO_OVERRIDE } else { v };
                std::fs::write(self.dev_dir(a)?.join("driver_override"), format!("{v}\n"))
            }
            ["bus", "pci", "devices", dev, "sriov_numvfs"] => {
                self.set_numvfs(dev.parse().map_err(|_| errno(libc::ENOENT))?, value)
            }
            ["bus", "pci", "devices", _, "sriov_drivers_autoprobe"] => match value.trim() {
                "0" | "1" => self.real.write(rel, &format!("{}\n", value.trim())),
                _ => Err(errno(libc::EINVAL)),
            },
            _ => self.real.write(rel, value),
        }
    }
}

impl Sysfs for FakeSysfs {
    fn root(&self) -> &Path {
        self.real.root()
    }

    fn read(&self, rel: &Path) -> io::Result<String> {
        self.real.read(rel)
    }

    fn write(&self, rel: &Path, value: &str) -> io::Result<()> {
        let fault = {
            let mut k = self.k();
            let n = k.log.len();
            k.log
                .push((rel.display().to_string(), value.to_string(), false));
            let path = rel.display().to_string();
            k.faults
                .iter()
                .find(|f| match f {
                    Fault::Fail { nth, .. } | Fault::Ignore { nth } => *nth == n,
                    Fault::FailPath { suffix, .. } => path.ends_with(suffix.as_str()),
                })
                .cloned()
        };
        let result = match fault {
            Some(Fault::Fail { errno: e, .. } | Fault::FailPath { errno: e, .. }) => Err(errno(e)),
            Some(Fault::Ignore { .. }) => Ok(()),
            None => self.kernel_write(rel, value),
        };
        if result.is_ok()
            && let Some(last) = self.k().log.last_mut()
        {
            last.2 = true;
        }
        result
    }

    fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        self.real.read_link(rel)
    }

    fn list(&self, rel: &Path) -> io::Result<Vec<String>> {
        self.real.list(rel)
    }

    fn exists(&self, rel: &Path) -> bool {
        self.real.exists(rel)
    }
}

/// The content of a `resource` file for these BAR sizes (start, end,
/// flags per line; bridge windows and ROM lines as zeros).
fn resource(bars: &[u64]) -> String {
    const LINES: usize = 13;
    const BAR_BASE: u64 = 0x38_0000_0000;
    const MEM64_PREFETCH: u64 = 0x14_220c;
    let mut base = BAR_BASE;
    let mut out = String::new();
    for i in 0..LINES {
        match bars.get(i) {
            Some(&size) if size > 0 => {
                out.push_str(&format!(
                    "0x{base:016x} 0x{:016x} 0x{MEM64_PREFETCH:016x}\n",
                    base + size - 1
                ));
                base += size.next_power_of_two();
            }
            _ => out.push_str("0x0000000000000000 0x0000000000000000 0x0000000000000000\n"),
        }
    }
    out
}

/// A directory entry of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory.
    Dir,
    /// A file and its content.
    File(String),
    /// A symbolic link and its target.
    Link(PathBuf),
}

/// A fake host: `sys/` and `proc/` under a directory.
#[derive(Debug)]
pub struct FakeHost {
    dir: PathBuf,
    /// Its sysfs.
    pub sysfs: FakeSysfs,
}

/// The drivers a fake host has loaded.
const DRIVERS: [&str; 5] = ["nvidia", VFIO_PCI, "snd_hda_intel", "pcieport", "e1000e"];

impl FakeHost {
    /// An empty host (drivers loaded, no devices) under `dir`.
    pub fn empty(dir: &Path, iommu: bool) -> Self {
        let sys = dir.join("sys");
        let proc = dir.join("proc");
        for d in [PCI_DEVICES, IOMMU_GROUPS, IOMMU_CLASS] {
            std::fs::create_dir_all(sys.join(d)).expect("create fake sysfs");
        }
        std::fs::write(sys.join(PCI_DRIVERS_PROBE), "").expect("create fake sysfs");
        std::fs::create_dir_all(proc.join(NVIDIA_GPUS)).expect("create fake procfs");
        if iommu {
            for unit in ["dmar0", "dmar1"] {
                std::fs::create_dir_all(sys.join(IOMMU_CLASS).join(unit))
                    .expect("create fake sysfs");
            }
        }
        let host = Self {
            dir: dir.to_path_buf(),
            sysfs: FakeSysfs::new(&sys, &proc),
        };
        for d in DRIVERS {
            host.add_driver(d);
        }
        host
    }

    /// A data-center host with the IOMMU on:
    /// - [`ROOT_PORT`] (Intel root port, pcieport, group 40);
    /// - [`A100`] (NVIDIA A100 PCIe, nvidia, group 42, SR-IOV: 16 VFs at
    ///   offset 4 stride 1, VFs probed by nvidia), with its procfs entry
    ///   (uuid [`A100_UUID`], `/dev/nvidia0`);
    /// - [`RTX`] (RTX A6000, nvidia, `/dev/nvidia1`) and [`RTX_AUDIO`]
    ///   (its HDMI audio, snd_hda_intel), both in group 17;
    /// - [`L4`] (NVIDIA L4, no driver, group 60);
    /// - [`NIC`] (Intel, e1000e, group 9).
    pub fn datacenter(dir: &Path) -> Self {
        let h = Self::empty(dir, true);
        h.add(DeviceSpec::new(ROOT_PORT, 0x8086, 0x347a, 0x060400, Some("pcieport")).group(40));
        h.add(
            DeviceSpec::new(A100, 0x10de, 0x20f1, 0x030200, Some("nvidia"))
                .group(A100_GROUP)
                .bars(&[16 << 20, 64 << 30, 0, 32 << 20])
                .sriov(SriovSpec {
                    total: 16,
                    offset: 4,
                    stride: 1,
                    vf_device: 0x20f1,
                    vf_driver: Some("nvidia".into()),
                }),
        );
        h.nvidia_info(A100, A100_UUID, 0, "NVIDIA A100-PCIE-40GB");
        h.add(
            DeviceSpec::new(RTX, 0x10de, 0x2230, 0x030000, Some("nvidia"))
                .group(RTX_GROUP)
                .bars(&[16 << 20, 256 << 20, 0, 32 << 20]),
        );
        h.nvidia_info(
            RTX,
            "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
            1,
            "NVIDIA RTX A6000",
        );
        h.add(
            DeviceSpec::new(RTX_AUDIO, 0x10de, 0x1aef, 0x040300, Some("snd_hda_intel"))
                .group(RTX_GROUP),
        );
        h.add(
            DeviceSpec::new(L4, 0x10de, 0x27b8, 0x030200, None)
                .native("nvidia")
                .group(60)
                .bars(&[16 << 20, 32 << 30, 0, 32 << 20]),
        );
        h.add(DeviceSpec::new(NIC, 0x8086, 0x15bb, 0x020000, Some("e1000e")).group(9));
        h
    }

    /// The A100 of [`FakeHost::datacenter`] on a host whose IOMMU is off.
    pub fn no_iommu(dir: &Path) -> Self {
        let h = Self::empty(dir, false);
        h.add(DeviceSpec::new(
            A100,
            0x10de,
            0x20f1,
            0x030200,
            Some("nvidia"),
        ));
        h.nvidia_info(A100, A100_UUID, 0, "NVIDIA A100-PCIE-40GB");
        h
    }

    /// The sysfs root.
    pub fn sys(&self) -> PathBuf {
        self.dir.join("sys")
    }

    /// The procfs root.
    pub fn proc(&self) -> PathBuf {
        self.dir.join("proc")
    }

    /// A state directory for `bind`.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// Loads a driver (creates its directory with `bind` and `unbind`).
    pub fn add_driver(&self, name: &str) {
        let d = self.sys().join(PCI_DRIVERS).join(name);
        std::fs::create_dir_all(&d).expect("create driver");
        for f in ["bind", "unbind", "new_id", "remove_id"] {
            std::fs::write(d.join(f), "").expect("create driver");
        }
    }

    /// Unloads a driver that drives nothing.
    pub fn remove_driver(&self, name: &str) {
        std::fs::remove_dir_all(self.sys().join(PCI_DRIVERS).join(name)).expect("remove driver");
    }

    /// Adds a device.
    pub fn add(&self, spec: DeviceSpec) {
        let a = spec.address;
        let parent = format!("devices/pci{:04x}:{:02x}", a.domain, a.bus);
        let dir = self.sys().join(&parent).join(a.to_string());
        std::fs::create_dir_all(&dir).expect("create device");
        let w = |f: &str, v: String| std::fs::write(dir.join(f), v).expect("create device");
        w("vendor", format!("0x{:04x}\n", spec.vendor));
        w("device", format!("0x{:04x}\n", spec.device));
        w("class", format!("0x{:06x}\n", spec.class));
        w("driver_override", format!("{NO_OVERRIDE}\n"));
        w("resource", resource(&spec.bars));
        if let Some(s) = &spec.sriov {
            w("sriov_totalvfs", format!("{}\n", s.total));
            w("sriov_numvfs", "0\n".into());
            w("sriov_offset", format!("{}\n", s.offset));
            w("sriov_stride", format!("{}\n", s.stride));
            w("sriov_vf_device", format!("{:04x}\n", s.vf_device));
            w("sriov_drivers_autoprobe", "1\n".into());
            if let Some(d) = &s.vf_driver {
                self.sysfs.k().vf_native.insert(a, d.clone());
            }
        }
        symlink(
            format!("../../../{parent}/{a}"),
            self.sys().join(PCI_DEVICES).join(a.to_string()),
        )
        .expect("create device");
        if let Some(g) = spec.group {
            let canon = std::fs::canonicalize(&dir).expect("device dir");
            let depth = self.sysfs.depth(&canon);
            self.sysfs
                .add_to_group(a, &canon, depth, g)
                .expect("create group");
        }
        if let Some(n) = &spec.native {
            self.sysfs.k().native.insert(a, n.clone());
        }
        if let Some(d) = &spec.driver {
            self.sysfs.link_driver(a, d).expect("bind fake driver");
        }
    }

    /// Gives a GPU a `/proc/driver/nvidia/gpus` entry (present while it is
    /// bound to nvidia).
    pub fn nvidia_info(&self, address: &str, uuid: &str, minor: u32, model: &str) {
        let a: PciAddress = address.parse().expect("valid test address");
        let info = format!(
            "Model: \t\t {model}\nIRQ:   \t\t 156\nGPU UUID: \t {uuid}\nVideo BIOS: \t 92.00.25.00.08\nBus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\nBus Location: \t {a}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n"
        );
        self.sysfs.k().nvidia_info.insert(a, info.clone());
        if self.sysfs.driver_of(a).as_deref() == Some("nvidia") {
            let d = self.proc().join(NVIDIA_GPUS).join(a.to_string());
            std::fs::create_dir_all(&d).expect("create procfs entry");
            std::fs::write(d.join("information"), info).expect("create procfs entry");
        }
    }

    /// A process `pid` named `comm` that holds `node` (e.g. `/dev/nvidia0`,
    /// `/dev/vfio/42`) open.
    pub fn open_by(&self, pid: u32, comm: &str, node: &str) {
        let p = self.proc().join(pid.to_string());
        std::fs::create_dir_all(p.join("fd")).expect("create process");
        std::fs::write(p.join("comm"), format!("{comm}\n")).expect("create process");
        let n = std::fs::read_dir(p.join("fd")).map_or(0, Iterator::count);
        symlink(node, p.join("fd").join((n + 3).to_string())).expect("create fd");
    }

    /// Every directory, file and link under `sys/` and `proc/`.
    pub fn snapshot(&self) -> BTreeMap<String, Entry> {
        fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, Entry>) {
            let Ok(rd) = std::fs::read_dir(dir) else {
                return;
            };
            for e in rd.flatten() {
                let p = e.path();
                let key = p.strip_prefix(base).unwrap_or(&p).display().to_string();
                let Ok(meta) = std::fs::symlink_metadata(&p) else {
                    continue;
                };
                if meta.file_type().is_symlink() {
                    out.insert(key, Entry::Link(std::fs::read_link(&p).unwrap_or_default()));
                } else if meta.is_dir() {
                    out.insert(key, Entry::Dir);
                    walk(base, &p, out);
                } else {
                    out.insert(
                        key,
                        Entry::File(std::fs::read_to_string(&p).unwrap_or_default()),
                    );
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(&self.dir, &self.sys(), &mut out);
        walk(&self.dir, &self.proc(), &mut out);
        out
    }

    /// The admin socket path given to commands (nothing listens there).
    pub fn socket(&self) -> PathBuf {
        self.dir.join("admin.sock")
    }

    /// Parses `vgpuctl passthrough …` for this host: `--sysfs-root`,
    /// `--proc-root`, `--state-dir` and `--socket` point into it; `argv`
    /// is what follows `passthrough`.
    pub fn args(&self, argv: &[&str]) -> PassthroughArgs {
        let sys = self.sys();
        let proc = self.proc();
        let state = self.state_dir();
        let sock = self.socket();
        let mut full: Vec<&str> = vec![
            "vgpuctl",
            "--socket",
            sock.to_str().expect("utf-8 path"),
            "passthrough",
            "--sysfs-root",
            sys.to_str().expect("utf-8 path"),
            "--proc-root",
            proc.to_str().expect("utf-8 path"),
            "--state-dir",
            state.to_str().expect("utf-8 path"),
        ];
        full.extend_from_slice(argv);
        match crate::cli::Cli::try_parse_from(full) {
            Ok(crate::cli::Cli {
                command: crate::cli::Command::Passthrough(a),
                ..
            }) => a,
            Ok(other) => panic!("not a passthrough command: {other:?}"),
            Err(e) => panic!("bad test command line {argv:?}: {e}"),
        }
    }

    /// Runs `vgpuctl passthrough …` (`argv` after `passthrough`) on this
    /// host through [`FakeSysfs`].
    pub fn run(&self, argv: &[&str]) -> Result<Report, PassthroughError> {
        let args = self.args(argv);
        execute(&Host::new(&self.sysfs, &args), &args.command)
    }
}

/// The paths whose entries differ between two snapshots, described.
pub fn diff(before: &BTreeMap<String, Entry>, after: &BTreeMap<String, Entry>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in before {
        match after.get(k) {
            None => out.push(format!("removed {k}")),
            Some(w) if w != v => out.push(format!("changed {k}: {v:?} -> {w:?}")),
            Some(_) => {}
        }
    }
    for k in after.keys().filter(|k| !before.contains_key(*k)) {
        out.push(format!("added {k}"));
    }
    out
}
