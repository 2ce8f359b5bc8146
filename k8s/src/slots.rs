//! What the device plugin offers, computed from vgpud's state: per profile,
//! the slots of every GPU (how many VMs of the profile the GPU holds), which
//! slots are taken by a pod, and which free slots still fit.
//!
//! A slot's kubelet device ID is `<gpu>_<profile>_<n>`; the vgpud VM an
//! allocation creates is named `k8s-<id>`, so vgpud's VM list is the
//! plugin's only state (a restarted plugin finds its allocations there).

use std::collections::{BTreeMap, BTreeSet};

use vgpu_api::{PASSTHROUGH_READY, PassthroughAssignment, Profile, Vm};

/// The resource (under the domain) of GPUs and VFs passed through whole
/// (`vgpuctl passthrough`), for KubeVirt's `permittedHostDevices`.
pub const PASSTHROUGH: &str = "passthrough";

/// Prefix of the names of the VMs the plugin creates.
pub const VM_PREFIX: &str = "k8s-";
/// Longest slot ID: the kubelet takes device IDs of up to 63 characters, and
/// the VM name (`k8s-` + ID) must fit vgpud's 64.
pub const MAX_ID_LEN: usize = 60;

/// Health strings of the device-plugin API.
pub const HEALTHY: &str = "Healthy";
/// See [`HEALTHY`].
pub const UNHEALTHY: &str = "Unhealthy";

/// A slot: one VM of a profile on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotId {
    /// vgpud's device name.
    pub device: String,
    /// Profile name.
    pub profile: String,
    /// Slot number on the device, from 0.
    pub index: u64,
}

impl SlotId {
    /// The kubelet device ID.
    pub fn id(&self) -> String {
        format!("{}_{}_{}", self.device, self.profile, self.index)
    }

    /// Parses a kubelet device ID (profile names never contain `_`).
    pub fn parse(id: &str) -> Option<SlotId> {
        let (rest, index) = id.rsplit_once('_')?;
        let (device, profile) = rest.rsplit_once('_')?;
        if device.is_empty() || profile.is_empty() {
            return None;
        }
        Some(SlotId {
            device: device.to_string(),
            profile: profile.to_string(),
            index: index.parse().ok()?,
        })
    }

    /// The vgpud VM an allocation of this slot creates.
    pub fn vm_name(&self) -> String {
        format!("{VM_PREFIX}{}", self.id())
    }

    /// The slot of a VM the plugin created.
    pub fn from_vm_name(name: &str) -> Option<SlotId> {
        SlotId::parse(name.strip_prefix(VM_PREFIX)?)
    }
}

/// One GPU as seen by one profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSlots {
    /// vgpud's device name.
    pub device: String,
    /// Bytes of the slice of one VM of the profile on this GPU.
    pub slice: u64,
    /// VMs of the profile the whole GPU holds.
    pub slots: u64,
    /// VMs of the profile that fit in the GPU's unsliced memory now.
    pub free: u64,
    /// Unsliced memory of the GPU, bytes.
    pub unsliced: u64,
}

/// A profile and its GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileSlots {
    /// Profile name.
    pub name: String,
    /// Per GPU.
    pub gpus: Vec<GpuSlots>,
}

/// vgpud's state as the plugin needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inventory {
    /// Whether vgpud answered (if not, every slot is unhealthy).
    pub reachable: bool,
    /// The profiles.
    pub profiles: Vec<ProfileSlots>,
    /// The slots taken: VMs named `k8s-…` in vgpud.
    pub allocated: BTreeSet<SlotId>,
    /// Guest CIDs in use by any VM.
    pub cids: BTreeSet<u64>,
    /// Devices assigned to passthrough VMs: (PCI address, bound to vfio-pci, IOMMU group).
    pub passthrough: Vec<(String, bool, Option<u32>)>,
}

impl Inventory {
    /// Adds `GET /v1/passthrough`'s answer.
    pub fn with_passthrough(mut self, assignments: &[PassthroughAssignment]) -> Inventory {
        self.passthrough = assignments
            .iter()
            .map(|a| (a.pci.clone(), a.state == PASSTHROUGH_READY, a.iommu_group))
            .collect();
        self
    }

    /// The resources to offer: every profile, and passthrough if vgpud has
    /// passthrough assignments.
    pub fn resources(&self) -> BTreeSet<String> {
        let mut r: BTreeSet<String> = self.profiles.iter().map(|p| p.name.clone()).collect();
        if !self.passthrough.is_empty() {
            r.insert(PASSTHROUGH.into());
        }
        r
    }

    /// Reads `GET /v1/profiles` and `GET /v1/vms` answers.
    pub fn from_api(profiles: &[Profile], vms: &[Vm]) -> Inventory {
        let profiles = profiles
            .iter()
            .map(|p| ProfileSlots {
                name: p.name.clone(),
                gpus: p
                    .devices
                    .iter()
                    .map(|d| GpuSlots {
                        device: d.device.clone(),
                        slice: d.memory,
                        slots: d.slots,
                        free: d.free,
                        unsliced: d.memory_total.saturating_sub(d.memory_sliced),
                    })
                    .collect(),
            })
            .collect();
        Inventory {
            reachable: true,
            profiles,
            allocated: vms
                .iter()
                .filter_map(|v| SlotId::from_vm_name(&v.name))
                .collect(),
            cids: vms
                .iter()
                .filter_map(|v| v.vsock.as_ref().map(|s| s.guest_cid))
                .collect(),
            passthrough: Vec::new(),
        }
    }

    /// The profile named `name`.
    pub fn profile(&self, name: &str) -> Option<&ProfileSlots> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// The kubelet devices of a profile: `(id, health)`. A slot held by a
    /// pod is healthy; of the free slots of a GPU, as many as still fit in
    /// its unsliced memory are healthy and the rest unhealthy, so the
    /// kubelet's allocatable count follows what other profiles and VMs use.
    pub fn devices(&self, profile: &str) -> Vec<(String, &'static str)> {
        if profile == PASSTHROUGH && self.profile(profile).is_none() {
            return self
                .passthrough
                .iter()
                .map(|(pci, ready, _)| {
                    (
                        pci.clone(),
                        if *ready && self.reachable {
                            HEALTHY
                        } else {
                            UNHEALTHY
                        },
                    )
                })
                .collect();
        }
        let Some(p) = self.profile(profile) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for g in &p.gpus {
            let mut fit = g.free;
            for index in 0..g.slots {
                let slot = SlotId {
                    device: g.device.clone(),
                    profile: profile.to_string(),
                    index,
                };
                if slot.id().len() > MAX_ID_LEN {
                    // Not offered: rename the device or the profile (docs/kubernetes.md).
                    continue;
                }
                let health = if !self.reachable {
                    UNHEALTHY
                } else if self.allocated.contains(&slot) {
                    HEALTHY
                } else if fit > 0 {
                    fit -= 1;
                    HEALTHY
                } else {
                    UNHEALTHY
                };
                out.push((slot.id(), health));
            }
        }
        out
    }

    /// The same inventory with every slot unhealthy (vgpud unreachable).
    pub fn unreachable(&self) -> Inventory {
        Inventory {
            reachable: false,
            ..self.clone()
        }
    }

    /// `GetPreferredAllocation`: `size` of the `available` slots, with
    /// `must` first, packed onto the least loaded GPUs (most unsliced memory
    /// first), lowest slot numbers first.
    pub fn preferred(&self, available: &[String], must: &[String], size: usize) -> Vec<String> {
        let mut out: Vec<String> = must.iter().take(size).cloned().collect();
        let unsliced: BTreeMap<&str, u64> = self
            .profiles
            .iter()
            .flat_map(|p| p.gpus.iter())
            .map(|g| (g.device.as_str(), g.unsliced))
            .collect();
        let mut rest: Vec<(u64, SlotId, &String)> = available
            .iter()
            .filter(|a| !out.contains(a))
            .filter_map(|a| {
                let s = SlotId::parse(a)?;
                Some((unsliced.get(s.device.as_str()).copied().unwrap_or(0), s, a))
            })
            .collect();
        rest.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        for (_, _, a) in rest {
            if out.len() >= size {
                break;
            }
            out.push(a.clone());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_api::{ProfileDevice, VmVsock};

    const GIB: u64 = 1 << 30;

    fn device(name: &str, sliced: u64, free: u64) -> ProfileDevice {
        ProfileDevice {
            device: name.into(),
            memory_total: 8 * GIB,
            memory_sliced: sliced,
            memory: 2 * GIB,
            slots: 4,
            free,
            vms: Vec::new(),
        }
    }

    fn q4(devices: Vec<ProfileDevice>) -> Vec<Profile> {
        vec![Profile {
            name: "q4".into(),
            memory: "1/4".into(),
            weight: 1,
            priority: "normal".into(),
            devices,
        }]
    }

    fn inv() -> Inventory {
        let profiles = q4(vec![device("gpu0", 4 * GIB, 2), device("gpu1", 0, 4)]);
        let vms = [
            Vm {
                name: "k8s-gpu0_q4_1".into(),
                vsock: Some(VmVsock {
                    guest_cid: 1000,
                    ..VmVsock::default()
                }),
                ..Vm::default()
            },
            Vm {
                name: "other".into(),
                ..Vm::default()
            },
        ];
        Inventory::from_api(&profiles, &vms)
    }

    #[test]
    fn ids_round_trip_through_vm_names() {
        let s = SlotId {
            device: "gpu_a.0".into(),
            profile: "q-4".into(),
            index: 12,
        };
        assert_eq!(SlotId::from_vm_name(&s.vm_name()), Some(s.clone()));
        assert_eq!(SlotId::parse("nounderscore"), None);
        assert_eq!(SlotId::from_vm_name("vm1"), None);
    }

    #[test]
    fn free_slots_beyond_the_unsliced_memory_are_unhealthy() {
        let i = inv();
        let d = i.devices("q4");
        assert_eq!(d.len(), 8);
        let healthy: Vec<_> = d
            .iter()
            .filter(|x| x.1 == HEALTHY)
            .map(|x| x.0.as_str())
            .collect();
        // gpu0: slot 1 is taken (healthy), 2 more fit; gpu1: all 4 fit.
        assert_eq!(
            healthy,
            [
                "gpu0_q4_0",
                "gpu0_q4_1",
                "gpu0_q4_2",
                "gpu1_q4_0",
                "gpu1_q4_1",
                "gpu1_q4_2",
                "gpu1_q4_3"
            ]
        );
        assert!(
            i.unreachable()
                .devices("q4")
                .iter()
                .all(|x| x.1 == UNHEALTHY)
        );
        assert_eq!(i.cids.iter().copied().collect::<Vec<_>>(), [1000]);
    }

    #[test]
    fn slots_whose_ids_are_too_long_for_the_kubelet_are_not_offered() {
        let long = "g".repeat(57);
        let profiles = q4(vec![device(&long, 0, 4), device("gpu1", 0, 4)]);
        let i = Inventory::from_api(&profiles, &[]);
        let d = i.devices("q4");
        assert_eq!(d.len(), 4);
        assert!(
            d.iter()
                .all(|(id, _)| id.len() <= MAX_ID_LEN && id.starts_with("gpu1_"))
        );
    }

    #[test]
    fn passthrough_devices_are_healthy_when_bound_to_vfio() {
        let assigned = |vm: &str, pci: &str, state: &str, group| PassthroughAssignment {
            vm: vm.into(),
            pci: pci.into(),
            state: state.into(),
            iommu_group: Some(group),
            ..PassthroughAssignment::default()
        };
        let i = inv().with_passthrough(&[
            assigned("p1", "0000:3b:00.4", "ready", 61),
            assigned("p2", "0000:3b:00.5", "host-driver", 62),
        ]);
        assert!(i.resources().contains(PASSTHROUGH));
        assert_eq!(
            i.devices(PASSTHROUGH),
            [
                ("0000:3b:00.4".to_string(), HEALTHY),
                ("0000:3b:00.5".to_string(), UNHEALTHY)
            ]
        );
        assert!(!inv().resources().contains(PASSTHROUGH));
    }

    #[test]
    fn preferred_allocations_pack_the_least_loaded_gpu() {
        let i = inv();
        let avail: Vec<String> = [
            "gpu0_q4_0",
            "gpu0_q4_2",
            "gpu1_q4_0",
            "gpu1_q4_1",
            "gpu1_q4_2",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(i.preferred(&avail, &[], 2), ["gpu1_q4_0", "gpu1_q4_1"]);
        assert_eq!(
            i.preferred(&avail, &["gpu0_q4_2".into()], 2),
            ["gpu0_q4_2", "gpu1_q4_0"]
        );
    }
}
