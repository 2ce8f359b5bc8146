//! Passthrough VMs in vgpud: the registry of the config's
//! `mode = "passthrough"` VMs, the GPUs and VFs they own, and the checks
//! that keep them out of the shared pool.
//!
//! vgpud never touches a passthrough device (`vgpuctl passthrough` binds it
//! to vfio-pci and the VMM opens it); it only records it, shows it in
//! status, and refuses configurations where one device would be both
//! shared and passed through, or where VFIO could not give each VM its
//! device:
//! - a passthrough device that is not NVIDIA's;
//! - two VMs with devices in one IOMMU group (VFIO hands out whole groups);
//! - one VM with a GPU and another with a virtual function of it;
//! - a shared `kind = "cuda"` device that is a passthrough GPU, or sits in
//!   its IOMMU group.
//!
//! A shared device names its GPU by CUDA index or UUID, and CUDA is not
//! asked here (vgpud may run without the driver). What is checked at load:
//! a `GPU-…` UUID is tied to a PCI address through the NVIDIA driver's
//! `/proc/driver/nvidia/gpus/<address>/information`; a device named by
//! index (or `MIG-…` UUID, or a UUID the driver does not report) cannot be
//! tied, so it is refused only while some passthrough GPU is bound to the
//! `nvidia` driver (CUDA can then enumerate it); a GPU bound to vfio-pci or
//! to no driver is invisible to CUDA. Once the real-GPU executor opens a
//! device it knows its PCI address and calls
//! [`PassthroughRegistry::check_shared_device`].

use std::path::PathBuf;

use serde::Serialize;
use serde_json::Value;
use thiserror::Error;
use tracing::{info, warn};
use vgpu_api::PASSTHROUGH_READY;
use vgpu_config::{Config, DeviceKind, VmConfig, VmMode};
use vgpu_pci::procfs::Procfs;
use vgpu_pci::sysfs::RealSysfs;
use vgpu_pci::{NVIDIA_VENDOR, PciAddress, PciError, PciLinks, VFIO_PCI};

/// Roots of the host's sysfs and procfs (tests point them at fake trees).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoots {
    /// sysfs, normally `/sys`.
    pub sysfs: PathBuf,
    /// procfs, normally `/proc`.
    pub procfs: PathBuf,
}

impl Default for HostRoots {
    fn default() -> Self {
        Self {
            sysfs: PathBuf::from("/sys"),
            procfs: PathBuf::from("/proc"),
        }
    }
}

/// Why passthrough VMs were refused.
#[derive(Debug, Error)]
pub enum PassthroughError {
    /// A PCI address is malformed.
    #[error("`{0}` is not a PCI address: write domain:bus:device.function, e.g. 0000:3b:00.0")]
    BadAddress(String),
    /// The device is not NVIDIA's.
    #[error(
        "VM `{vm}`: {pci} is not an NVIDIA device (vendor {vendor:#06x}); a passthrough VM takes an NVIDIA GPU or one of its virtual functions (see `vgpuctl passthrough list`)"
    )]
    NotNvidia {
        /// The VM.
        vm: String,
        /// Its device.
        pci: String,
        /// The device's vendor.
        vendor: u16,
    },
    /// A shared device is a passthrough GPU.
    #[error(
        "shared device `{device}` is the GPU at {pci} ({how}), which VM `{vm}` has in passthrough: a GPU is either shared by vgpud or passed through to one VM; remove one of the two from the config"
    )]
    SharedDeviceAssigned {
        /// The shared device.
        device: String,
        /// Its address.
        pci: String,
        /// How the address was found.
        how: String,
        /// The passthrough VM.
        vm: String,
    },
    /// A shared device sits in a passthrough device's IOMMU group.
    #[error(
        "shared device `{device}` is the GPU at {pci}, in IOMMU group {group} with {vm_pci} that VM `{vm}` has in passthrough: VFIO needs every device of the group off host drivers, so the shared GPU would have to go; pass through a device of another group"
    )]
    SharedDeviceInGroup {
        /// The shared device.
        device: String,
        /// Its address.
        pci: String,
        /// The group.
        group: u32,
        /// The passthrough VM.
        vm: String,
        /// The VM's device.
        vm_pci: String,
    },
    /// A shared device might be a passthrough GPU.
    #[error(
        "shared device `{device}` ({selector}) may be the GPU at {pci} that VM `{vm}` has in passthrough: that GPU is bound to the nvidia driver, so CUDA can see it, and a {selector} cannot be tied to a PCI address without CUDA. Bind the GPU to vfio-pci first (`vgpuctl passthrough bind {pci}`), or name the shared device by its GPU-… UUID"
    )]
    MaybeShared {
        /// The shared device.
        device: String,
        /// How it names its GPU.
        selector: String,
        /// The passthrough GPU.
        pci: String,
        /// The passthrough VM.
        vm: String,
    },
    /// Two VMs' devices share an IOMMU group.
    #[error(
        "VMs `{vm_a}` ({pci_a}) and `{vm_b}` ({pci_b}) pass through devices of the same IOMMU group {group}: VFIO hands a whole group to one VM; give both devices to one VM or use a device of another group"
    )]
    SameGroup {
        /// First VM.
        vm_a: String,
        /// Its device.
        pci_a: String,
        /// Second VM.
        vm_b: String,
        /// Its device.
        pci_b: String,
        /// The group.
        group: u32,
    },
    /// A GPU and one of its VFs are given to different VMs.
    #[error(
        "VM `{vm_pf}` passes through the whole GPU {pf} while VM `{vm_vf}` has its virtual function {vf}: passing a GPU through removes its VFs; give VMs either the GPU or its VFs"
    )]
    GpuAndVf {
        /// The VM with the GPU.
        vm_pf: String,
        /// The GPU.
        pf: String,
        /// The VM with the VF.
        vm_vf: String,
        /// The VF.
        vf: String,
    },
    /// A device is already passed through to another VM.
    #[error(
        "{pci} is already passed through to VM `{vm}`; a device or VF can be passed through to one VM only"
    )]
    AlreadyAssigned {
        /// The device.
        pci: String,
        /// Its VM.
        vm: String,
    },
    /// sysfs could not be read (or holds what the kernel does not write).
    #[error(transparent)]
    Sysfs(#[from] PciError),
}

/// Normalizes a PCI address to `dddd:bb:dd.f` (lowercase; 8-digit domains
/// as NVML writes them and domain-less `bb:dd.f` accepted).
pub fn normalize_pci(s: &str) -> Result<String, PassthroughError> {
    parse_pci(s).map(|a| a.to_string())
}

fn parse_pci(s: &str) -> Result<PciAddress, PassthroughError> {
    s.parse()
        .map_err(|_| PassthroughError::BadAddress(s.to_string()))
}

/// A passthrough VM and its device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Assignment {
    /// The VM.
    pub vm: String,
    /// Its device, `dddd:bb:dd.f`.
    pub pci: String,
}

/// An assignment as the host shows it now (the admin API's type).
pub use vgpu_api::PassthroughAssignment as AssignmentStatus;

/// The config's passthrough VMs, checked against the host.
#[derive(Debug, Clone)]
pub struct PassthroughRegistry {
    roots: HostRoots,
    assignments: Vec<Assignment>,
}

impl PassthroughRegistry {
    /// An empty registry (no passthrough VMs).
    pub fn new(roots: &HostRoots) -> Self {
        Self {
            roots: roots.clone(),
            assignments: Vec::new(),
        }
    }

    /// Builds the registry from the config's passthrough VMs and refuses
    /// every conflict listed in the module documentation.
    pub fn from_config(config: &Config, roots: &HostRoots) -> Result<Self, PassthroughError> {
        let mut reg = Self::new(roots);
        for vm in &config.vms {
            reg.check_vm(vm)?;
            if let VmMode::Passthrough { pci } = &vm.mode {
                reg.assignments.push(Assignment {
                    vm: vm.name.clone(),
                    pci: normalize_pci(pci)?,
                });
            }
        }
        for d in &config.devices {
            if let DeviceKind::Cuda { index, uuid } = &d.kind {
                reg.check_cuda_device(&d.name, *index, uuid.as_deref())?;
            }
        }
        for s in reg.status() {
            match s.state.as_str() {
                PASSTHROUGH_READY => {
                    info!(vm = %s.vm, pci = %s.pci, "passthrough device bound to vfio-pci")
                }
                _ => {
                    warn!(vm = %s.vm, pci = %s.pci, state = s.state, hint = s.hint.as_deref().unwrap_or(""), "passthrough device not ready")
                }
            }
        }
        Ok(reg)
    }

    /// The passthrough VMs and their devices.
    pub fn assignments(&self) -> &[Assignment] {
        &self.assignments
    }

    /// The VM a device is passed through to.
    pub fn assigned_vm(&self, pci: &str) -> Option<&str> {
        let pci = normalize_pci(pci).ok()?;
        self.assignments
            .iter()
            .find(|a| a.pci == pci)
            .map(|a| a.vm.as_str())
    }

    fn read_info(&self, pci: &str) -> Result<Option<PciLinks>, PassthroughError> {
        let sysfs = RealSysfs::new(&self.roots.sysfs);
        Ok(PciLinks::read(&sysfs, parse_pci(pci)?)?)
    }

    /// Checks a VM before it is added (at load, or by the admin API): a
    /// passthrough VM must take an NVIDIA device that no other VM has, in an
    /// IOMMU group no other VM uses, and not be a GPU whose VF another VM
    /// has (or the reverse). Shared VMs pass.
    pub fn check_vm(&self, vm: &VmConfig) -> Result<(), PassthroughError> {
        let VmMode::Passthrough { pci } = &vm.mode else {
            return Ok(());
        };
        let pci = normalize_pci(pci)?;
        if let Some(a) = self
            .assignments
            .iter()
            .find(|a| a.pci == pci && a.vm != vm.name)
        {
            return Err(PassthroughError::AlreadyAssigned {
                pci,
                vm: a.vm.clone(),
            });
        }
        let Some(info) = self.read_info(&pci)? else {
            return Ok(());
        };
        if info.vendor != NVIDIA_VENDOR {
            return Err(PassthroughError::NotNvidia {
                vm: vm.name.clone(),
                pci,
                vendor: info.vendor,
            });
        }
        for other in self.assignments.iter().filter(|a| a.vm != vm.name) {
            let Some(o) = self.read_info(&other.pci)? else {
                continue;
            };
            if let (Some(g), Some(og)) = (info.iommu_group, o.iommu_group)
                && g == og
            {
                return Err(PassthroughError::SameGroup {
                    vm_a: other.vm.clone(),
                    pci_a: other.pci.clone(),
                    vm_b: vm.name.clone(),
                    pci_b: pci,
                    group: g,
                });
            }
            if o.physfn.is_some_and(|p| p.to_string() == pci) {
                return Err(PassthroughError::GpuAndVf {
                    vm_pf: vm.name.clone(),
                    pf: pci,
                    vm_vf: other.vm.clone(),
                    vf: other.pci.clone(),
                });
            }
            if info.physfn.is_some_and(|p| p.to_string() == other.pci) {
                return Err(PassthroughError::GpuAndVf {
                    vm_pf: other.vm.clone(),
                    pf: other.pci.clone(),
                    vm_vf: vm.name.clone(),
                    vf: pci,
                });
            }
        }
        Ok(())
    }

    /// The PCI address the NVIDIA driver reports for a `GPU-…` UUID.
    fn address_of_uuid(&self, uuid: &str) -> Option<String> {
        Procfs::new(&self.roots.procfs)
            .address_of_uuid(uuid)
            .map(|a| a.to_string())
    }

    fn check_cuda_device(
        &self,
        device: &str,
        index: Option<u32>,
        uuid: Option<&str>,
    ) -> Result<(), PassthroughError> {
        if self.assignments.is_empty() {
            return Ok(());
        }
        if let Some(u) = uuid.filter(|u| u.starts_with("GPU-"))
            && let Some(pci) = self.address_of_uuid(u)
        {
            return self.check_shared_address(device, &pci, &format!("uuid {u}"));
        }
        let selector = match (uuid, index) {
            (Some(u), _) => format!("uuid {u}"),
            (None, i) => format!("CUDA index {}", i.unwrap_or(0)),
        };
        for a in &self.assignments {
            if let Some(info) = self.read_info(&a.pci)?
                && info.physfn.is_none()
                && info.driver.as_deref() == Some("nvidia")
            {
                return Err(PassthroughError::MaybeShared {
                    device: device.to_string(),
                    selector,
                    pci: a.pci.clone(),
                    vm: a.vm.clone(),
                });
            }
        }
        Ok(())
    }

    fn check_shared_address(
        &self,
        device: &str,
        pci: &str,
        how: &str,
    ) -> Result<(), PassthroughError> {
        if let Some(a) = self.assignments.iter().find(|a| a.pci == pci) {
            return Err(PassthroughError::SharedDeviceAssigned {
                device: device.to_string(),
                pci: pci.to_string(),
                how: how.to_string(),
                vm: a.vm.clone(),
            });
        }
        let Some(group) = self.read_info(pci)?.and_then(|i| i.iommu_group) else {
            return Ok(());
        };
        for a in &self.assignments {
            if self.read_info(&a.pci)?.and_then(|i| i.iommu_group) == Some(group) {
                return Err(PassthroughError::SharedDeviceInGroup {
                    device: device.to_string(),
                    pci: pci.to_string(),
                    group,
                    vm: a.vm.clone(),
                    vm_pci: a.pci.clone(),
                });
            }
        }
        Ok(())
    }

    /// Refuses to share the GPU at `pci_bus_id` (as `cuDeviceGetPCIBusId`
    /// or NVML report it) when it is a passthrough device or in one's IOMMU
    /// group. The real-GPU executor calls this once it has opened a device.
    pub fn check_shared_device(
        &self,
        device: &str,
        pci_bus_id: &str,
    ) -> Result<(), PassthroughError> {
        let pci = normalize_pci(pci_bus_id)?;
        self.check_shared_address(device, &pci, "as the GPU driver reports it")
    }

    /// Each assignment as the host shows it now.
    pub fn status(&self) -> Vec<AssignmentStatus> {
        self.assignments
            .iter()
            .map(|a| {
                let info = self.read_info(&a.pci).ok().flatten();
                let (state, hint) = match &info {
                    None => (
                        "missing",
                        Some(format!(
                            "no device {} in sysfs: for a VF, enable VFs on its GPU (`vgpuctl passthrough enable-vfs`); check the address with `vgpuctl passthrough list`",
                            a.pci
                        )),
                    ),
                    Some(i) if i.driver.as_deref() == Some(VFIO_PCI) => (PASSTHROUGH_READY, None),
                    Some(i) => (
                        if i.driver.is_some() { "host-driver" } else { "unbound" },
                        Some(format!("run `vgpuctl passthrough bind {}` before starting the VM", a.pci)),
                    ),
                };
                AssignmentStatus {
                    vm: a.vm.clone(),
                    pci: a.pci.clone(),
                    state: state.to_string(),
                    driver: info.as_ref().and_then(|i| i.driver.clone()),
                    iommu_group: info.as_ref().and_then(|i| i.iommu_group),
                    physfn: info.and_then(|i| i.physfn).map(|a| a.to_string()),
                    hint,
                }
            })
            .collect()
    }

    /// [`status`](Self::status) as JSON (an array), for the admin API.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self.status()).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::path::Path;
    use vgpu_pci::procfs::NVIDIA_GPUS;
    use vgpu_pci::sysfs::PCI_DEVICES;

    /// A minimal host tree: devices with vendor, driver, group and physfn
    /// links laid out as the kernel lays them out.
    struct Tree {
        dir: tempfile::TempDir,
    }

    impl Tree {
        fn new() -> Self {
            let t = Tree {
                dir: tempfile::tempdir().unwrap(),
            };
            std::fs::create_dir_all(t.sys().join(PCI_DEVICES)).unwrap();
            t
        }
        fn sys(&self) -> PathBuf {
            self.dir.path().join("sys")
        }
        fn roots(&self) -> HostRoots {
            HostRoots {
                sysfs: self.sys(),
                procfs: self.dir.path().join("proc"),
            }
        }
        fn add(
            &self,
            pci: &str,
            vendor: u16,
            driver: Option<&str>,
            group: u32,
            physfn: Option<&str>,
        ) {
            let rel = format!("devices/pci0000:00/{pci}");
            let d = self.sys().join(&rel);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("vendor"), format!("0x{vendor:04x}\n")).unwrap();
            if let Some(drv) = driver {
                std::fs::create_dir_all(self.sys().join("bus/pci/drivers").join(drv)).unwrap();
                symlink(format!("../../../bus/pci/drivers/{drv}"), d.join("driver")).unwrap();
            }
            let g = self
                .sys()
                .join(format!("kernel/iommu_groups/{group}/devices"));
            std::fs::create_dir_all(&g).unwrap();
            symlink(format!("../../../../{rel}"), g.join(pci)).unwrap();
            symlink(
                format!("../../../kernel/iommu_groups/{group}"),
                d.join("iommu_group"),
            )
            .unwrap();
            if let Some(pf) = physfn {
                symlink(format!("../{pf}"), d.join("physfn")).unwrap();
            }
            symlink(
                format!("../../../{rel}"),
                self.sys().join(PCI_DEVICES).join(pci),
            )
            .unwrap();
        }
        fn nvidia_info(&self, pci: &str, uuid: &str) {
            let d = self.dir.path().join("proc").join(NVIDIA_GPUS).join(pci);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("information"),
                format!("Model: \t\t NVIDIA A100\nGPU UUID: \t {uuid}\nBus Location: \t {pci}\nDevice Minor: \t 0\n"),
            )
            .unwrap();
        }
    }

    fn config(src: &str) -> Config {
        Config::parse(Path::new("vgpud.toml"), src).unwrap()
    }

    fn pt(name: &str, pci: &str) -> String {
        format!("[[vm]]\nname = \"{name}\"\nmode = \"passthrough\"\npci = \"{pci}\"\n")
    }

    const SIM: &str = "[[device]]\nname = \"sim0\"\nkind = \"sim\"\n";
    const UUID: &str = "GPU-5a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9";

    #[test]
    fn passthrough_vms_are_recorded_and_shown_with_their_state() {
        let t = Tree::new();
        t.add("0000:3b:00.0", NVIDIA_VENDOR, Some(VFIO_PCI), 42, None);
        t.add("0000:3c:00.0", NVIDIA_VENDOR, Some("nvidia"), 43, None);
        let c = config(&format!(
            "{SIM}{}{}{}[[vm]]\nname = \"shared\"\ndevice = \"sim0\"\nmemory = \"1GiB\"\n",
            pt("a", "0000:3B:00.0"),
            pt("b", "0000:3c:00.0"),
            pt("c", "0000:3b:00.5")
        ));
        let r = PassthroughRegistry::from_config(&c, &t.roots()).unwrap();
        assert_eq!(r.assignments().len(), 3);
        assert_eq!(r.assigned_vm("3b:00.0"), Some("a"));
        assert_eq!(r.assigned_vm("00000000:3B:00.0"), Some("a"));
        assert_eq!(r.assigned_vm("0000:3d:00.0"), None);
        let j = r.to_json();
        assert_eq!(j[0]["state"], "ready");
        assert_eq!(j[0]["iommu_group"], 42);
        assert_eq!(j[1]["state"], "host-driver");
        assert!(
            j[1]["hint"]
                .as_str()
                .unwrap()
                .contains("vgpuctl passthrough bind 0000:3c:00.0")
        );
        assert_eq!(j[2]["state"], "missing");
        assert!(j[2]["hint"].as_str().unwrap().contains("enable-vfs"));
        // The registry is live: binding shows up without a reload.
        std::fs::remove_file(t.sys().join("devices/pci0000:00/0000:3c:00.0/driver")).unwrap();
        assert_eq!(r.to_json()[1]["state"], "unbound");
    }

    #[test]
    fn devices_that_vfio_cannot_give_to_each_vm_are_refused() {
        let t = Tree::new();
        t.add("0000:65:00.0", NVIDIA_VENDOR, Some(VFIO_PCI), 17, None);
        t.add("0000:65:00.1", NVIDIA_VENDOR, Some(VFIO_PCI), 17, None);
        t.add("0000:3b:00.0", NVIDIA_VENDOR, Some(VFIO_PCI), 42, None);
        t.add(
            "0000:3b:00.4",
            NVIDIA_VENDOR,
            None,
            60,
            Some("0000:3b:00.0"),
        );
        t.add("0000:00:1f.6", 0x8086, Some("e1000e"), 9, None);
        let load = |src: String| PassthroughRegistry::from_config(&config(&src), &t.roots());

        let e = load(format!(
            "{}{}",
            pt("a", "0000:65:00.0"),
            pt("b", "0000:65:00.1")
        ))
        .unwrap_err();
        assert!(
            matches!(e, PassthroughError::SameGroup { group: 17, .. }),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("`a` (0000:65:00.0) and `b` (0000:65:00.1)"),
            "{e}"
        );

        for src in [
            format!("{}{}", pt("a", "0000:3b:00.0"), pt("b", "0000:3b:00.4")),
            format!("{}{}", pt("b", "0000:3b:00.4"), pt("a", "0000:3b:00.0")),
        ] {
            let e = load(src).unwrap_err();
            assert!(matches!(e, PassthroughError::GpuAndVf { .. }), "{e}");
            assert!(e.to_string().contains("VM `a` passes through the whole GPU 0000:3b:00.0 while VM `b` has its virtual function 0000:3b:00.4"), "{e}");
        }

        let e = load(pt("nic", "0000:00:1f.6")).unwrap_err();
        assert!(
            e.to_string()
                .contains("not an NVIDIA device (vendor 0x8086)"),
            "{e}"
        );

        // A VM added later (admin API) is checked against the registry.
        let r = load(pt("a", "0000:65:00.0")).unwrap();
        let vm = |src: String| config(&src).vms.remove(0);
        let e = r.check_vm(&vm(pt("z", "0000:65:00.0"))).unwrap_err();
        assert!(
            e.to_string().contains("already passed through to VM `a`"),
            "{e}"
        );
        assert!(matches!(
            r.check_vm(&vm(pt("z", "0000:65:00.1"))),
            Err(PassthroughError::SameGroup { .. })
        ));
        r.check_vm(&vm(pt("z", "0000:3b:00.4"))).unwrap();
        r.check_vm(&vm(format!(
            "{SIM}[[vm]]\nname = \"s\"\ndevice = \"sim0\"\nmemory = 1\n"
        )))
        .unwrap();
    }

    #[test]
    fn shared_cuda_devices_on_passthrough_gpus_are_refused() {
        let t = Tree::new();
        t.add("0000:3b:00.0", NVIDIA_VENDOR, Some("nvidia"), 42, None);
        t.add(
            "0000:3b:00.1",
            NVIDIA_VENDOR,
            Some("snd_hda_intel"),
            42,
            None,
        );
        t.add("0000:af:00.0", NVIDIA_VENDOR, Some("nvidia"), 60, None);
        t.nvidia_info("0000:3b:00.0", UUID);
        let cuda = |sel: &str| format!("[[device]]\nname = \"gpu0\"\nkind = \"cuda\"\n{sel}\n");
        let load = |src: String| PassthroughRegistry::from_config(&config(&src), &t.roots());

        // Named by UUID, resolved through the NVIDIA driver's procfs entry.
        let e = load(format!(
            "{}{}",
            cuda(&format!("uuid = \"{UUID}\"")),
            pt("p", "0000:3b:00.0")
        ))
        .unwrap_err();
        assert!(
            matches!(e, PassthroughError::SharedDeviceAssigned { .. }),
            "{e}"
        );
        assert!(
            e.to_string().contains(&format!(
                "`gpu0` is the GPU at 0000:3b:00.0 (uuid {UUID}), which VM `p`"
            )),
            "{e}"
        );
        // The passthrough device is another function of the shared GPU's group.
        let e = load(format!(
            "{}{}",
            cuda(&format!("uuid = \"{UUID}\"")),
            pt("p", "0000:3b:00.1")
        ))
        .unwrap_err();
        assert!(
            matches!(e, PassthroughError::SharedDeviceInGroup { group: 42, .. }),
            "{e}"
        );
        // Another GPU: fine.
        load(format!(
            "{}{}",
            cuda(&format!("uuid = \"{UUID}\"")),
            pt("p", "0000:af:00.0")
        ))
        .unwrap();

        // Named by index: refused while the passthrough GPU is on nvidia…
        let e = load(format!("{}{}", cuda("index = 0"), pt("p", "0000:af:00.0"))).unwrap_err();
        assert!(matches!(e, PassthroughError::MaybeShared { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("vgpuctl passthrough bind 0000:af:00.0"),
            "{e}"
        );
        // …and accepted once it is bound to vfio-pci (CUDA cannot see it).
        let drv = t.sys().join("devices/pci0000:00/0000:af:00.0/driver");
        std::fs::remove_file(&drv).unwrap();
        symlink("../../../bus/pci/drivers/vfio-pci", &drv).unwrap();
        let r = load(format!("{}{}", cuda("index = 0"), pt("p", "0000:af:00.0"))).unwrap();

        // The executor's check once it knows the address from CUDA/NVML.
        let e = r
            .check_shared_device("gpu0", "00000000:AF:00.0")
            .unwrap_err();
        assert!(
            matches!(e, PassthroughError::SharedDeviceAssigned { .. }),
            "{e}"
        );
        r.check_shared_device("gpu0", "0000:3b:00.0").unwrap();
        assert!(matches!(
            r.check_shared_device("gpu0", "nonsense"),
            Err(PassthroughError::BadAddress(_))
        ));
    }

    #[test]
    fn addresses_normalize_like_sysfs_writes_them() {
        assert_eq!(normalize_pci("0000:3B:00.0").unwrap(), "0000:3b:00.0");
        assert_eq!(normalize_pci("3b:00.0").unwrap(), "0000:3b:00.0");
        assert_eq!(normalize_pci("00000001:3B:1f.7").unwrap(), "0001:3b:1f.7");
        for bad in ["", "3b:00", "0000:3b:20.0", "0000:3b:00.8", "0000:zz:00.0"] {
            assert!(normalize_pci(bad).is_err(), "{bad}");
        }
    }
}
