//! `bind` and `unbind`: moving devices to vfio-pci and back, with rollback.

use serde_json::json;

use super::checks::{self, describe};
use super::error::PassthroughError;
use super::rollback::{Action, Step, execute};
use super::state::{Binding, now_secs};
use super::{Host, Report};
use vgpu_pci::sysfs::driver_dir;
use vgpu_pci::{PciAddress, PciDevice, VFIO_PCI};

/// The steps that move `d` to vfio-pci, each with its undo.
fn bind_steps(d: &PciDevice) -> Vec<Step> {
    let a = d.address;
    let vfio = || Some(VFIO_PCI.to_string());
    let mut steps = vec![Step::new(
        Action::Override {
            address: a,
            driver: vfio(),
        },
        vec![Action::Override {
            address: a,
            driver: d.driver_override.clone(),
        }],
    )];
    if let Some(drv) = &d.driver {
        steps.push(Step::new(
            Action::Unbound {
                address: a,
                driver: drv.clone(),
            },
            // The original driver only takes the device back once the
            // override no longer names vfio-pci.
            vec![
                Action::Override {
                    address: a,
                    driver: d.driver_override.clone(),
                },
                Action::Bound {
                    address: a,
                    driver: drv.clone(),
                },
            ],
        ));
    }
    steps.push(Step::new(
        Action::Probed {
            address: a,
            expect: vfio(),
        },
        vec![Action::Unbound {
            address: a,
            driver: VFIO_PCI.into(),
        }],
    ));
    steps
}

/// Binds a GPU (and with `group`, the rest of its IOMMU group) to vfio-pci.
pub fn bind(h: &Host<'_>, a: PciAddress, group: bool) -> Result<Report, PassthroughError> {
    let s = h.sysfs;
    let dev = checks::nvidia_gpu(s, a)?;
    let g = checks::iommu_group(s, &dev)?;
    checks::vfio_pci_loaded(s)?;
    if let Some(sr) = dev.sriov
        && sr.enabled > 0
    {
        return Err(PassthroughError::InUse {
            address: a,
            why: format!(
                "{} SR-IOV virtual functions are enabled, and unbinding the GPU's driver removes them",
                sr.enabled
            ),
            hint: format!(
                "pass one of its VFs instead, or remove them first with `vgpuctl passthrough disable-vfs {a}`"
            ),
        });
    }
    let mut state = h.store.load()?;
    let usage = h.usage()?;
    usage.ensure_not_used(&dev)?;
    let blockers = checks::group_blockers(s, &dev, g)?;
    if !blockers.is_empty() && !group {
        return Err(PassthroughError::GroupNotViable {
            address: a,
            group: g,
            blockers: blockers.iter().map(describe).collect(),
            hint: format!(
                "add --group to bind them to vfio-pci as well (`vgpuctl passthrough bind --group {a}`), or unbind them from their drivers"
            ),
        });
    }
    for b in &blockers {
        usage.ensure_not_used(b)?;
    }
    // The named device last: when another member fails, it was not touched.
    let targets: Vec<&PciDevice> = blockers.iter().chain([&dev]).collect();
    let steps: Vec<Step> = targets
        .iter()
        .filter(|t| t.driver.as_deref() != Some(VFIO_PCI))
        .flat_map(|t| bind_steps(t))
        .collect();
    let applied = execute(s, steps)?;
    let done = applied.done();
    let mut recorded = Vec::new();
    for t in targets
        .iter()
        .filter(|t| t.driver.as_deref() != Some(VFIO_PCI))
    {
        state.devices.insert(
            t.address.to_string(),
            Binding {
                original_driver: t.driver.clone(),
                original_override: t.driver_override.clone(),
                bound_with: (t.address != a).then(|| a.to_string()),
                bound_at: now_secs(),
            },
        );
        recorded.push(t.address);
    }
    if !recorded.is_empty()
        && let Err(e) = h.store.save(&state)
    {
        return Err(applied.roll_back(e.into()));
    }
    let mut text = String::new();
    if done.is_empty() {
        text.push_str(&format!("{a} is already bound to vfio-pci\n"));
    }
    for t in &targets {
        if t.driver.as_deref() != Some(VFIO_PCI) {
            text.push_str(&format!(
                "{} bound to vfio-pci (was {})\n",
                t.address,
                t.driver.as_deref().unwrap_or("unbound")
            ));
        }
    }
    if !recorded.is_empty() {
        text.push_str(&format!(
            "recorded the original drivers in {}; `vgpuctl passthrough unbind {a}` restores them\n",
            h.store.path().display()
        ));
    }
    text.push_str(&format!(
        "IOMMU group {g} is viable; next: `vgpuctl passthrough verify {a}`\n"
    ));
    Ok(Report {
        json: json!({
            "pci": a,
            "action": "bind",
            "changed": !done.is_empty(),
            "iommu_group": g,
            "bound": recorded,
            "steps": done,
            "state_file": h.store.path(),
        }),
        text,
        warnings: Vec::new(),
    })
}

/// Gives `a` (and the devices bound with it by `bind --group`) back to the
/// drivers they had.
pub fn unbind(h: &Host<'_>, a: PciAddress) -> Result<Report, PassthroughError> {
    let s = h.sysfs;
    let dev = PciDevice::read(s, a)?;
    let mut state = h.store.load()?;
    let recorded = state.binding(a).is_some();
    if dev.driver.as_deref() != Some(VFIO_PCI) && !recorded {
        return Err(PassthroughError::Refused(format!(
            "{a} is not bound to vfio-pci ({}) and vgpuctl did not bind it: nothing to undo",
            dev.driver
                .as_deref()
                .map_or("it has no driver".into(), |d| format!("its driver is {d}"))
        )));
    }
    let targets: Vec<PciDevice> = if recorded {
        state
            .bound_with(a)
            .into_iter()
            .map(|t| PciDevice::read(s, t))
            .collect::<Result<_, _>>()?
    } else {
        vec![dev.clone()]
    };
    for t in &targets {
        if let Some(g) = t.iommu_group {
            let holders = h.procfs.vfio_group_holders(g);
            if !holders.is_empty() {
                return Err(PassthroughError::InUse {
                    address: t.address,
                    why: format!(
                        "its IOMMU group {g} is open by {}",
                        holders
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    hint: "shut the VM down (or hot-unplug the device from it) first".into(),
                });
            }
        }
        if let Some(Binding {
            original_driver: Some(d),
            ..
        }) = state.binding(t.address)
            && !s.exists(&driver_dir(d))
        {
            return Err(PassthroughError::Refused(format!(
                "{} was bound to {d}, which is not loaded now: load it (`modprobe {}`) and retry",
                t.address,
                d.replace('-', "_")
            )));
        }
    }
    let mut steps = Vec::new();
    let mut restored = Vec::new();
    for t in &targets {
        let b = state.binding(t.address).cloned();
        let ta = t.address;
        steps.push(Step::new(
            Action::Unbound {
                address: ta,
                driver: VFIO_PCI.into(),
            },
            vec![
                Action::Override {
                    address: ta,
                    driver: Some(VFIO_PCI.into()),
                },
                Action::Probed {
                    address: ta,
                    expect: Some(VFIO_PCI.into()),
                },
            ],
        ));
        steps.push(Step::new(
            Action::Override {
                address: ta,
                driver: b.as_ref().and_then(|b| b.original_override.clone()),
            },
            vec![Action::Override {
                address: ta,
                driver: t.driver_override.clone(),
            }],
        ));
        match &b {
            Some(Binding {
                original_driver: Some(d),
                ..
            }) => {
                steps.push(Step::new(
                    Action::Bound {
                        address: ta,
                        driver: d.clone(),
                    },
                    vec![Action::Unbound {
                        address: ta,
                        driver: d.clone(),
                    }],
                ));
                restored.push((ta, d.clone()));
            }
            // It had no driver: leave it without one.
            Some(_) => restored.push((ta, "no driver".into())),
            // Not bound by vgpuctl: let the kernel choose.
            None => {
                steps.push(Step::new(
                    Action::Probed {
                        address: ta,
                        expect: None,
                    },
                    vec![Action::NoDriver { address: ta }],
                ));
                restored.push((ta, "the driver the kernel chose".into()));
            }
        }
    }
    let applied = execute(s, steps)?;
    for t in &targets {
        state.devices.remove(&t.address.to_string());
    }
    if recorded && let Err(e) = h.store.save(&state) {
        return Err(applied.roll_back(e.into()));
    }
    let mut text = String::new();
    let mut now = Vec::new();
    for (ta, what) in &restored {
        let driver = PciDevice::read(s, *ta).ok().and_then(|d| d.driver);
        text.push_str(&format!(
            "{ta} released from vfio-pci and given back to {what}{}\n",
            driver
                .as_deref()
                .map_or(String::new(), |d| format!(" (now {d})"))
        ));
        now.push(json!({ "pci": ta, "driver": driver }));
    }
    if let Some(vm) = usage_vm(h, a) {
        text.push_str(&format!(
            "note: the config still assigns {a} to VM `{vm}`; it cannot start until the device is bound again\n"
        ));
    }
    Ok(Report {
        json: json!({
            "pci": a,
            "action": "unbind",
            "changed": !applied.done().is_empty(),
            "steps": applied.done(),
            "devices": now,
        }),
        text,
        warnings: Vec::new(),
    })
}

fn usage_vm(h: &Host<'_>, a: PciAddress) -> Option<String> {
    h.usage().ok()?.assigned_vm(a).map(str::to_string)
}
