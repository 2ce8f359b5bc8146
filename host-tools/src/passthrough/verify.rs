//! `verify` (can a VMM open the device?) and `attach-args` (how to give it
//! to one).

use clap::ValueEnum;
use serde_json::json;

use super::checks::{self, describe};
use super::error::PassthroughError;
use super::{Host, Report, vfio};
use vgpu_pci::{PciAddress, PciDevice, VFIO_PCI, group_type};

/// Size of the 64-bit MMIO window OVMF reserves by default, in MiB.
pub const OVMF_DEFAULT_MMIO64_MIB: u64 = 32 << 10;
/// Number of BAR lines at the top of a device's `resource` file.
const BAR_COUNT: usize = 6;
const MIB: u64 = 1 << 20;

/// The VMM to print arguments for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Vmm {
    /// QEMU (`-device vfio-pci,host=…`).
    Qemu,
    /// cloud-hypervisor (`--device path=…`).
    CloudHypervisor,
}

/// "16 MiB", "128 GiB", "256 B".
pub fn human_size(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024 && v.is_multiple_of(1024) && u + 1 < UNITS.len() {
        v /= 1024;
        u += 1;
    }
    format!("{v} {}", UNITS[u])
}

/// The checks both commands make: an NVIDIA GPU bound to vfio-pci whose
/// IOMMU group is viable. Returns the device and its group.
fn ready(h: &Host<'_>, a: PciAddress) -> Result<(PciDevice, u32), PassthroughError> {
    let dev = checks::nvidia_gpu(h.sysfs, a)?;
    let g = checks::iommu_group(h.sysfs, &dev)?;
    checks::bound_to_vfio(&dev)?;
    let blockers = checks::group_blockers(h.sysfs, &dev, g)?;
    if !blockers.is_empty() {
        return Err(PassthroughError::GroupNotViable {
            address: a,
            group: g,
            blockers: blockers.iter().map(describe).collect(),
            hint: format!("run `vgpuctl passthrough bind --group {a}`"),
        });
    }
    Ok((dev, g))
}

/// Opens the device through VFIO as a VMM would and reports what it offers.
pub fn verify(h: &Host<'_>, a: PciAddress) -> Result<Report, PassthroughError> {
    let (dev, g) = ready(h, a)?;
    let holders = h.procfs.vfio_group_holders(g);
    if !holders.is_empty() {
        return Err(PassthroughError::InUse {
            address: a,
            why: format!(
                "its IOMMU group {g} is open by {} (a running VM?)",
                holders
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            hint: "VFIO lets one process open a group: verify while no VM uses the device".into(),
        });
    }
    let domain = group_type(h.sysfs, g);
    let members = checks::group_devices(h.sysfs, g)?;
    let report = vfio::inspect(&h.sysfs.path(&a.sysfs_dir()), g)?;
    let mut text = format!(
        "{a}: {:04x}:{:04x}, bound to vfio-pci\nIOMMU group {g}{}: {} (viable)\nVFIO: container {}, IOMMU {}\nregions:\n",
        dev.vendor,
        dev.device,
        domain
            .as_deref()
            .map_or(String::new(), |d| format!(" ({d} domain)")),
        members.iter().map(describe).collect::<Vec<_>>().join(", "),
        report.container,
        report.iommu_type
    );
    for r in &report.regions {
        text.push_str(&format!(
            "  {:<7} {:>10}  {}\n",
            r.name,
            human_size(r.size),
            r.flags.join(",")
        ));
    }
    text.push_str("interrupts:\n");
    for i in &report.irqs {
        text.push_str(&format!(
            "  {:<7} {:>4}  {}\n",
            i.name,
            i.count,
            i.flags.join(",")
        ));
    }
    text.push_str(&format!("ok: a VMM can open {a}\n"));
    Ok(Report {
        json: json!({
            "pci": a,
            "driver": VFIO_PCI,
            "iommu_group": g,
            "iommu_domain": domain,
            "group": members.iter().map(|m| m.address).collect::<Vec<_>>(),
            "viable": true,
            "vfio": report,
        }),
        text,
        warnings: Vec::new(),
    })
}

/// Total size of the device's BARs, from its `resource` file.
fn bar_total(h: &Host<'_>, a: PciAddress) -> u64 {
    let Ok(Some(text)) = vgpu_pci::sysfs::attr(h.sysfs, &a.sysfs_dir().join("resource")) else {
        return 0;
    };
    text.lines()
        .take(BAR_COUNT)
        .filter_map(|l| {
            let mut f = l
                .split_whitespace()
                .map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).ok());
            let (start, end) = (f.next()??, f.next()??);
            (end > start).then(|| end - start + 1)
        })
        .sum()
}

/// Prints the arguments that give the device to a VM.
pub fn attach_args(h: &Host<'_>, a: PciAddress, vmm: Vmm) -> Result<Report, PassthroughError> {
    let (_, g) = ready(h, a)?;
    let dir = h.sysfs.path(&a.sysfs_dir());
    let args = match vmm {
        Vmm::Qemu => vec!["-device".to_string(), format!("vfio-pci,host={a}")],
        Vmm::CloudHypervisor => vec!["--device".to_string(), format!("path={}/", dir.display())],
    };
    let mut notes = Vec::new();
    for m in checks::group_devices(h.sysfs, g)? {
        if m.address != a && m.driver.as_deref() == Some(VFIO_PCI) {
            notes.push(format!(
                "{} shares IOMMU group {g}: it can only go to this same VM ({}), or stay unused",
                describe(&m),
                match vmm {
                    Vmm::Qemu => format!("-device vfio-pci,host={}", m.address),
                    Vmm::CloudHypervisor => format!(
                        "--device path={}/",
                        h.sysfs.path(&m.address.sysfs_dir()).display()
                    ),
                }
            ));
        }
    }
    let bars = bar_total(h, a);
    if vmm == Vmm::Qemu && bars / MIB > OVMF_DEFAULT_MMIO64_MIB / 2 {
        let window = (bars / MIB * 2).next_power_of_two();
        notes.push(format!(
            "the GPU's BARs total {}: with OVMF, enlarge the 64-bit MMIO window: -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string={window}",
            human_size(bars)
        ));
    }
    Ok(Report {
        json: json!({ "pci": a, "vmm": vmm.to_possible_value().map(|v| v.get_name().to_string()), "args": args, "notes": notes }),
        text: format!("{}\n", args.join(" ")),
        warnings: notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_in_the_largest_exact_unit() {
        assert_eq!(human_size(256), "256 B");
        assert_eq!(human_size(16 << 20), "16 MiB");
        assert_eq!(human_size(128 << 30), "128 GiB");
        assert_eq!(human_size((16 << 20) + 1), "16777217 B");
    }
}
