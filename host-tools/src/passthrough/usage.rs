//! Who uses a GPU: a passthrough VM, vgpud's shared pool, host processes,
//! or nobody.
//!
//! How a GPU is found to be *shared* (used by vgpud), since a real-GPU
//! device in vgpud's config is named by CUDA index or UUID, not by PCI
//! address, and CUDA cannot be asked without the driver:
//! 1. the admin API (`GET /v1/devices`) lists a device with a `pci` field
//!    equal to the GPU's address;
//! 2. a `kind = "cuda"` device of the config (`--config`) names a `GPU-…`
//!    UUID that the NVIDIA driver reports for the GPU's address in
//!    `/proc/driver/nvidia/gpus/<address>/information`;
//! 3. a `vgpud` process holds the GPU's `/dev/nvidia<minor>` open (the minor
//!    comes from the same file).
//!
//! Devices named by CUDA index or by `MIG-…` UUID cannot be tied to an
//! address this way; the notes of `list` name them, and rule 3 still finds
//! them while vgpud runs.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use vgpu_config::{Config, DeviceKind, VmMode};

use super::error::PassthroughError;
use super::state::State;
use crate::api::{ApiError, Client};
use vgpu_pci::procfs::{Holder, Procfs};
use vgpu_pci::{PciAddress, PciDevice, VFIO_PCI};

/// The process name of the vgpu daemon.
pub const VGPUD_COMM: &str = "vgpud";

/// How a device is used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Usage {
    /// Nobody uses it: it can be bound for passthrough.
    Free,
    /// vgpud shares it between VMs.
    Shared {
        /// Why it is considered shared.
        by: Vec<String>,
    },
    /// Host processes other than vgpud have it open.
    InUse {
        /// The processes.
        by: Vec<Holder>,
    },
    /// A VM owns it through VFIO: the config assigns it, or it is bound to
    /// vfio-pci.
    Assigned {
        /// The passthrough VM of the config.
        vm: Option<String>,
        /// Whether it is bound to vfio-pci now.
        bound_to_vfio: bool,
    },
    /// The config assigns it to a VM while vgpud shares it.
    Conflict {
        /// The passthrough VM.
        vm: String,
        /// Why it is considered shared.
        by: Vec<String>,
    },
}

impl Usage {
    /// A short word for tables.
    pub fn word(&self) -> String {
        match self {
            Usage::Free => "free".into(),
            Usage::Shared { .. } => "shared".into(),
            Usage::InUse { .. } => "in-use".into(),
            Usage::Assigned { vm: Some(vm), .. } => format!("assigned:{vm}"),
            Usage::Assigned { vm: None, .. } => "assigned".into(),
            Usage::Conflict { vm, .. } => format!("CONFLICT:{vm}"),
        }
    }
}

/// What is known about the use of the host's GPUs.
#[derive(Debug)]
pub struct UsageContext {
    procfs: Procfs,
    /// Passthrough VMs of the config, by address.
    assigned: BTreeMap<PciAddress, String>,
    /// Shared devices resolved to an address, with the reason.
    shared: BTreeMap<PciAddress, Vec<String>>,
    /// Things the user should know (unreachable daemon, unresolved devices).
    pub notes: Vec<String>,
}

impl UsageContext {
    /// Gathers the config (when given), the admin API (when reachable) and
    /// procfs.
    pub fn gather(
        procfs: Procfs,
        config: Option<&Path>,
        socket: Option<&Path>,
    ) -> Result<Self, PassthroughError> {
        let mut cx = UsageContext {
            procfs,
            assigned: BTreeMap::new(),
            shared: BTreeMap::new(),
            notes: Vec::new(),
        };
        let config = config.map(Config::load).transpose()?;
        if let Some(c) = &config {
            cx.add_config(c);
        }
        if let Some(socket) = socket {
            cx.add_api(socket, config.as_ref());
        }
        Ok(cx)
    }

    fn add_config(&mut self, c: &Config) {
        for vm in &c.vms {
            if let VmMode::Passthrough { pci } = &vm.mode {
                match pci.parse() {
                    Ok(a) => {
                        self.assigned.insert(a, vm.name.clone());
                    }
                    Err(e) => self.notes.push(format!("VM `{}`: {e}", vm.name)),
                }
            }
        }
        for d in &c.devices {
            let DeviceKind::Cuda { index, uuid } = &d.kind else {
                continue;
            };
            let resolved = uuid.as_deref().and_then(|u| {
                u.starts_with("GPU-")
                    .then(|| self.procfs.address_of_uuid(u))
                    .flatten()
            });
            match resolved {
                Some(a) => self.shared.entry(a).or_default().push(format!(
                    "device `{}` of {} (uuid {})",
                    d.name,
                    c.path.display(),
                    uuid.as_deref().unwrap_or_default()
                )),
                None => self.notes.push(format!(
                    "shared device `{}` ({}) cannot be tied to a PCI address without the CUDA driver; while vgpud runs, its open /dev/nvidiaN shows which GPU it uses",
                    d.name,
                    match (index, uuid) {
                        (_, Some(u)) => format!("uuid {u}"),
                        (Some(i), None) => format!("CUDA index {i}"),
                        (None, None) => "CUDA index 0".into(),
                    }
                )),
            }
        }
    }

    fn add_api(&mut self, socket: &Path, config: Option<&Config>) {
        let devices = match Client::new(socket).get("/v1/devices") {
            Ok(v) => v,
            Err(ApiError::Connect { .. }) => {
                self.notes.push(format!(
                    "vgpud is not reachable at {}: shared use is known from --config and open device nodes only",
                    socket.display()
                ));
                return;
            }
            Err(e) => {
                self.notes.push(format!("vgpud's admin API failed: {e}"));
                return;
            }
        };
        let devices: Vec<vgpu_api::Device> = match serde_json::from_value(devices) {
            Ok(d) => d,
            Err(e) => {
                self.notes.push(format!(
                    "vgpud's admin API answered /v1/devices with an unexpected shape ({e}): is vgpuctl as new as vgpud?"
                ));
                return;
            }
        };
        for d in devices.iter().filter(|d| d.kind == "cuda") {
            // The API names a real GPU by its UUID; the NVIDIA driver's procfs ties it to a PCI
            // address.
            let resolved = d
                .uuid
                .starts_with("GPU-")
                .then(|| self.procfs.address_of_uuid(&d.uuid))
                .flatten();
            if let Some(a) = resolved {
                self.shared.entry(a).or_default().push(format!(
                    "device `{}` of the running vgpud (uuid {})",
                    d.name, d.uuid
                ));
            } else if !config.is_some_and(|c| c.devices.iter().any(|cd| cd.name == d.name)) {
                self.notes.push(format!(
                    "vgpud's device `{}` (uuid `{}`) is not in the NVIDIA driver's /proc/driver/nvidia/gpus: its PCI address is unknown",
                    d.name, d.uuid
                ));
            }
        }
    }

    /// The passthrough VM the config gives `a` to.
    pub fn assigned_vm(&self, a: PciAddress) -> Option<&str> {
        self.assigned.get(&a).map(String::as_str)
    }

    /// Processes holding the GPU's `/dev/nvidiaN` open (NVIDIA driver only).
    pub fn holders(&self, d: &PciDevice) -> Vec<Holder> {
        if d.driver.as_deref() != Some("nvidia") {
            return Vec::new();
        }
        self.procfs
            .nvidia_gpu(d.address)
            .and_then(|g| g.dev_node())
            .map(|n| self.procfs.holders(&n))
            .unwrap_or_default()
    }

    /// How `d` is used.
    pub fn usage(&self, d: &PciDevice) -> Usage {
        let holders = self.holders(d);
        let mut shared = self.shared.get(&d.address).cloned().unwrap_or_default();
        let (vgpud, others): (Vec<Holder>, Vec<Holder>) =
            holders.into_iter().partition(|h| h.comm == VGPUD_COMM);
        shared.extend(vgpud.iter().map(|h| format!("{h} has the GPU open")));
        let vm = self.assigned_vm(d.address).map(str::to_string);
        let bound_to_vfio = d.driver.as_deref() == Some(VFIO_PCI);
        match (vm, shared.is_empty()) {
            (Some(vm), false) => Usage::Conflict { vm, by: shared },
            (vm @ Some(_), true) => Usage::Assigned { vm, bound_to_vfio },
            (None, _) if bound_to_vfio => Usage::Assigned {
                vm: None,
                bound_to_vfio,
            },
            (None, false) => Usage::Shared { by: shared },
            (None, true) if !others.is_empty() => Usage::InUse { by: others },
            (None, true) => Usage::Free,
        }
    }

    /// Refuses when `d` is shared by vgpud or open by host processes.
    pub fn ensure_not_used(&self, d: &PciDevice) -> Result<(), PassthroughError> {
        match self.usage(d) {
            Usage::Shared { by } | Usage::Conflict { by, .. } => Err(PassthroughError::InUse {
                address: d.address,
                why: format!("vgpud shares it ({})", by.join(", ")),
                hint: "remove it from vgpud's [[device]] list and restart vgpud, or pass a different GPU".into(),
            }),
            Usage::InUse { by } => Err(PassthroughError::InUse {
                address: d.address,
                why: format!(
                    "{} {} it open",
                    by.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                    if by.len() == 1 { "has" } else { "have" }
                ),
                hint: "stop them first (e.g. `systemctl stop nvidia-persistenced`; `nvidia-smi` lists GPU processes)".into(),
            }),
            _ => Ok(()),
        }
    }

    /// Reasons a VF counts as in use: bound to a driver, given to a VM by
    /// the config, recorded in the state file, or its group open.
    pub fn vf_use(&self, vf: &PciDevice, state: &State) -> Vec<String> {
        let mut why = Vec::new();
        if let Some(d) = &vf.driver {
            why.push(format!("VF {} is bound to {d}", vf.address));
        }
        if let Some(vm) = self.assigned_vm(vf.address) {
            why.push(format!(
                "VF {} is assigned to VM `{vm}` in the config",
                vf.address
            ));
        }
        if vf.driver.is_none() && state.binding(vf.address).is_some() {
            why.push(format!(
                "VF {} is recorded as bound by vgpuctl in the state file",
                vf.address
            ));
        }
        if let Some(g) = vf.iommu_group {
            for h in self.procfs.vfio_group_holders(g) {
                why.push(format!(
                    "IOMMU group {g} of VF {} is open by {h}",
                    vf.address
                ));
            }
        }
        why
    }

    /// The procfs in use.
    pub fn procfs(&self) -> &Procfs {
        &self.procfs
    }
}
