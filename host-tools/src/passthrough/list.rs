//! `vgpuctl passthrough list`.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::checks::describe;
use super::error::PassthroughError;
use super::{Host, Report};
use vgpu_pci::{PciDevice, group_members, iommu_enabled, nvidia_gpus};

fn peers(h: &Host<'_>, d: &PciDevice) -> Vec<PciDevice> {
    let Some(g) = d.iommu_group else {
        return Vec::new();
    };
    group_members(h.sysfs, g)
        .unwrap_or_default()
        .into_iter()
        .filter(|a| *a != d.address)
        .filter_map(|a| PciDevice::read(h.sysfs, a).ok())
        .collect()
}

/// Lists the NVIDIA GPUs and VFs with their group, driver, SR-IOV and use.
pub fn list(h: &Host<'_>) -> Result<Report, PassthroughError> {
    let usage = h.usage()?;
    let state = h.store.load()?;
    let iommu = iommu_enabled(h.sysfs);
    let gpus = nvidia_gpus(h.sysfs)?;
    let mut notes = usage.notes.clone();
    if !iommu {
        notes.push(
            "the host has no active IOMMU, so no device can be passed through: enable VT-d/AMD-Vi in the firmware and boot with intel_iommu=on or amd_iommu=on".into(),
        );
    }
    if gpus.is_empty() {
        notes.push(format!(
            "no NVIDIA GPU under {}",
            h.sysfs
                .path(std::path::Path::new(vgpu_pci::sysfs::PCI_DEVICES))
                .display()
        ));
    }
    let mut rows = Vec::new();
    let mut text = format!(
        "{:<16} {:<4} {:<11} {:<10} {:>5} {:>7}  {:<16} {}\n",
        "PCI", "KIND", "ID", "DRIVER", "GROUP", "SR-IOV", "STATE", "GROUP PEERS"
    );
    for d in &gpus {
        let peers = peers(h, d);
        let use_ = usage.usage(d);
        let model = usage.procfs().nvidia_gpu(d.address).and_then(|g| g.model);
        let kind = if d.physfn.is_some() { "vf" } else { "pf" };
        rows.push(json!({
            "pci": d.address,
            "kind": kind,
            "vendor": format!("{:04x}", d.vendor),
            "device": format!("{:04x}", d.device),
            "class": format!("{:06x}", d.class),
            "model": model,
            "driver": d.driver,
            "driver_override": d.driver_override,
            "iommu_group": d.iommu_group,
            "group_peers": peers.iter().map(|p| json!({
                "pci": p.address,
                "class": p.class_name(),
                "driver": p.driver,
            })).collect::<Vec<_>>(),
            "sriov": d.sriov,
            "physfn": d.physfn,
            "virtfns": d.virtfns,
            "usage": use_,
            "bound_by_vgpuctl": state.binding(d.address),
        }));
        let _ = writeln!(
            text,
            "{:<16} {:<4} {:<11} {:<10} {:>5} {:>7}  {:<16} {}",
            if d.physfn.is_some() {
                format!("  {}", d.address)
            } else {
                d.address.to_string()
            },
            kind,
            format!("{:04x}:{:04x}", d.vendor, d.device),
            d.driver.as_deref().unwrap_or("-"),
            d.iommu_group.map_or("-".into(), |g| g.to_string()),
            d.sriov
                .map_or("-".into(), |s| format!("{}/{}", s.enabled, s.total)),
            use_.word(),
            if peers.is_empty() {
                "-".into()
            } else {
                peers.iter().map(describe).collect::<Vec<_>>().join(", ")
            }
        );
    }
    for n in &notes {
        let _ = writeln!(text, "note: {n}");
    }
    Ok(Report {
        json: json!({ "iommu": iommu, "gpus": Value::Array(rows), "notes": notes }),
        text,
        warnings: Vec::new(),
    })
}
