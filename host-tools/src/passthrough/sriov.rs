//! `enable-vfs` and `disable-vfs`: SR-IOV virtual functions of a GPU.

use serde_json::json;

use super::checks;
use super::error::PassthroughError;
use super::rollback::{Action, Step, execute};
use super::{Host, Report};
use vgpu_pci::sysfs::attr;
use vgpu_pci::{PciAddress, PciDevice, Sriov, VFIO_PCI};

/// The physical function at `a`, with its SR-IOV capability.
fn physical_function(h: &Host<'_>, a: PciAddress) -> Result<(PciDevice, Sriov), PassthroughError> {
    let pf = checks::nvidia_gpu(h.sysfs, a)?;
    if let Some(p) = pf.physfn {
        return Err(PassthroughError::Refused(format!(
            "{a} is a virtual function; manage VFs on its physical function {p}"
        )));
    }
    let Some(sr) = pf.sriov else {
        return Err(PassthroughError::Refused(format!(
            "{a} has no SR-IOV capability (no sriov_totalvfs): pass the whole GPU, or use a GPU that offers VFs (A100, H100, L40 and later data-center GPUs, with NVIDIA's vGPU host driver)"
        )));
    };
    Ok((pf, sr))
}

/// Refuses when any VF of `pf` is in use.
fn ensure_vfs_free(h: &Host<'_>, pf: &PciDevice) -> Result<(), PassthroughError> {
    let usage = h.usage()?;
    let state = h.store.load()?;
    let mut why = Vec::new();
    for vf in &pf.virtfns {
        let d = PciDevice::read(h.sysfs, *vf)?;
        why.extend(usage.vf_use(&d, &state));
    }
    if why.is_empty() {
        return Ok(());
    }
    Err(PassthroughError::InUse {
        address: pf.address,
        why: why.join("; "),
        hint: "stop the VMs that use the VFs, run `vgpuctl passthrough unbind VF` for each bound VF, and remove them from the config's passthrough VMs first".into(),
    })
}

fn vf_rows(h: &Host<'_>, pf: PciAddress) -> Vec<serde_json::Value> {
    PciDevice::read(h.sysfs, pf)
        .map(|d| d.virtfns)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|a| PciDevice::read(h.sysfs, a).ok())
        .map(|d| json!({ "pci": d.address, "iommu_group": d.iommu_group, "driver": d.driver }))
        .collect()
}

/// Creates `count` VFs on the GPU at `a`. Existing VFs (when a different
/// count is asked) must be free: the kernel changes the count only from 0.
/// New VFs are created without host drivers, ready for `bind`.
pub fn enable_vfs(h: &Host<'_>, a: PciAddress, count: u32) -> Result<Report, PassthroughError> {
    let (pf, sr) = physical_function(h, a)?;
    if count == 0 {
        return Err(PassthroughError::Refused(format!(
            "asked for 0 VFs: use `vgpuctl passthrough disable-vfs {a}` to remove them"
        )));
    }
    if count > sr.total {
        return Err(PassthroughError::Refused(format!(
            "{a} supports at most {} VFs (sriov_totalvfs); asked for {count}",
            sr.total
        )));
    }
    match pf.driver.as_deref() {
        None => {
            return Err(PassthroughError::Refused(format!(
                "{a} has no driver: VFs are created by the GPU's driver, so bind it to the NVIDIA (vGPU host) driver first"
            )));
        }
        Some(VFIO_PCI) => {
            return Err(PassthroughError::Refused(format!(
                "{a} is itself passed through (bound to vfio-pci): `vgpuctl passthrough unbind {a}` first"
            )));
        }
        Some(_) => {}
    }
    if sr.enabled == count {
        return Ok(Report {
            json: json!({ "pci": a, "action": "enable-vfs", "changed": false, "vfs": vf_rows(h, a) }),
            text: format!("{a} already has {count} VFs\n"),
            warnings: Vec::new(),
        });
    }
    let mut steps = Vec::new();
    if sr.enabled > 0 {
        ensure_vfs_free(h, &pf)?;
        steps.push(Step::new(
            Action::NumVfs { pf: a, count: 0 },
            vec![Action::NumVfs {
                pf: a,
                count: sr.enabled,
            }],
        ));
    }
    // Keep host drivers off the new VFs so they are free for passthrough;
    // the setting only matters while VFs are created, so restore it after.
    let autoprobe_rel = a.sysfs_dir().join("sriov_drivers_autoprobe");
    let autoprobe_on = attr(h.sysfs, &autoprobe_rel)
        .ok()
        .flatten()
        .is_some_and(|v| v == "1");
    if autoprobe_on {
        steps.push(Step::new(
            Action::Autoprobe { pf: a, on: false },
            vec![Action::Autoprobe { pf: a, on: true }],
        ));
    }
    steps.push(Step::new(
        Action::NumVfs { pf: a, count },
        vec![Action::NumVfs { pf: a, count: 0 }],
    ));
    if autoprobe_on {
        steps.push(Step::new(
            Action::Autoprobe { pf: a, on: true },
            vec![Action::Autoprobe { pf: a, on: false }],
        ));
    }
    execute(h.sysfs, steps)?;
    let vfs = vf_rows(h, a);
    let mut text = format!("{a}: {count} VFs enabled (was {})\n", sr.enabled);
    for v in &vfs {
        text.push_str(&format!(
            "  {} IOMMU group {}\n",
            v["pci"].as_str().unwrap_or("?"),
            v["iommu_group"]
        ));
    }
    text.push_str("next: `vgpuctl passthrough bind VF` for each VF a VM gets\n");
    Ok(Report {
        json: json!({ "pci": a, "action": "enable-vfs", "changed": true, "vfs": vfs }),
        text,
        warnings: Vec::new(),
    })
}

/// Removes every VF of the GPU at `a`; refused while any is in use.
pub fn disable_vfs(h: &Host<'_>, a: PciAddress) -> Result<Report, PassthroughError> {
    let (pf, sr) = physical_function(h, a)?;
    if sr.enabled == 0 {
        return Ok(Report {
            json: json!({ "pci": a, "action": "disable-vfs", "changed": false }),
            text: format!("{a} has no VFs enabled\n"),
            warnings: Vec::new(),
        });
    }
    ensure_vfs_free(h, &pf)?;
    execute(
        h.sysfs,
        vec![Step::new(
            Action::NumVfs { pf: a, count: 0 },
            vec![Action::NumVfs {
                pf: a,
                count: sr.enabled,
            }],
        )],
    )?;
    Ok(Report {
        json: json!({ "pci": a, "action": "disable-vfs", "changed": true, "removed": pf.virtfns }),
        text: format!("{a}: {} VFs removed\n", sr.enabled),
        warnings: Vec::new(),
    })
}
