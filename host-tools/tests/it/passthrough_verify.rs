//! `verify` and `attach-args`: the sysfs checks against fake hosts, and the
//! VFIO ioctls against the real host where it has VFIO.

use std::path::Path;

use vgpu_host_tools::passthrough::testutils::{A100, A100_GROUP, FakeHost, RTX, RTX_AUDIO};
use vgpu_host_tools::passthrough::{PassthroughError, vfio};

fn host() -> (tempfile::TempDir, FakeHost) {
    let d = tempfile::tempdir().unwrap();
    let h = FakeHost::datacenter(d.path());
    (d, h)
}

#[test]
fn verify_and_attach_args_need_a_bound_device_in_a_viable_group() {
    let (_d, h) = host();
    for argv in [
        vec!["verify", A100],
        vec!["attach-args", A100, "--vmm", "qemu"],
    ] {
        let e = h.run(&argv).unwrap_err().to_string();
        assert!(
            e.contains("is not bound to vfio-pci (its driver is nvidia): run `vgpuctl passthrough bind 0000:3b:00.0` first"),
            "{argv:?}: {e}"
        );
    }
    // The GPU on vfio-pci but its audio function back on its host driver.
    h.run(&["bind", "--group", RTX]).unwrap();
    h.run(&["unbind", RTX_AUDIO]).unwrap();
    let e = h.run(&["verify", RTX]).unwrap_err();
    assert!(
        matches!(e, PassthroughError::GroupNotViable { group: 17, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("bind --group 0000:65:00.0"), "{e}");
}

#[test]
fn verify_refuses_while_a_vm_holds_the_group_and_otherwise_reaches_vfio() {
    let (_d, h) = host();
    h.run(&["bind", A100]).unwrap();
    h.open_by(9000, "cloud-hypervisor", &format!("/dev/vfio/{A100_GROUP}"));
    let e = h.run(&["verify", A100]).unwrap_err().to_string();
    assert!(e.contains("open by pid 9000 (cloud-hypervisor)"), "{e}");

    let (_d2, h2) = host();
    h2.run(&["bind", A100]).unwrap();
    // Every sysfs check passes; then VFIO itself is asked. The fake device
    // is not in the host's /dev/vfio, so this step fails here with advice.
    let e = h2.run(&["verify", A100]).unwrap_err();
    assert!(matches!(e, PassthroughError::Vfio(_)), "{e}");
    let msg = e.to_string();
    if Path::new(vfio::VFIO_CONTAINER).exists() {
        assert!(msg.starts_with("VFIO: opening the"), "{msg}");
    } else {
        assert!(msg.contains("opening the container failed"), "{msg}");
        assert!(msg.contains("modprobe vfio-pci"), "{msg}");
    }
}

#[test]
fn attach_args_for_qemu_and_cloud_hypervisor() {
    let (_d, h) = host();
    h.run(&["bind", A100]).unwrap();
    let q = h.run(&["attach-args", A100, "--vmm", "qemu"]).unwrap();
    assert_eq!(q.text, "-device vfio-pci,host=0000:3b:00.0\n");
    assert_eq!(
        q.json["args"],
        serde_json::json!(["-device", "vfio-pci,host=0000:3b:00.0"])
    );
    // 64 GiB BAR1: OVMF needs a larger 64-bit window (a power of two, MiB).
    assert!(
        q.warnings
            .iter()
            .any(|w| w.contains("-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144")),
        "{:?}",
        q.warnings
    );
    let c = h
        .run(&["attach-args", A100, "--vmm", "cloud-hypervisor"])
        .unwrap();
    assert_eq!(
        c.text,
        format!(
            "--device path={}/bus/pci/devices/0000:3b:00.0/\n",
            h.sys().display()
        )
    );
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);

    // A group partner bound too is pointed out.
    h.run(&["bind", "--group", RTX]).unwrap();
    let q = h.run(&["attach-args", RTX, "--vmm", "qemu"]).unwrap();
    assert_eq!(q.text, "-device vfio-pci,host=0000:65:00.0\n");
    assert!(
        q.warnings[0].contains("0000:65:00.1 (audio, bound to vfio-pci) shares IOMMU group 17")
            && q.warnings[0].contains("-device vfio-pci,host=0000:65:00.1"),
        "{:?}",
        q.warnings
    );
}

/// The VFIO ioctl path on the real host: opens the container, group and
/// device of any device bound to vfio-pci and reads its regions.
#[test]
fn vfio_ioctls_on_the_real_host() {
    if !Path::new(vfio::VFIO_CONTAINER).exists() {
        eprintln!(
            "skipped: {} does not exist on this host (no vfio-pci / no IOMMU)",
            vfio::VFIO_CONTAINER
        );
        return;
    }
    let drv = Path::new("/sys/bus/pci/drivers/vfio-pci");
    let bound: Vec<_> = std::fs::read_dir(drv)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().contains(':'))
                .collect()
        })
        .unwrap_or_default();
    let Some(dev) = bound.first() else {
        eprintln!("skipped: no device is bound to vfio-pci on this host");
        return;
    };
    let dir = std::fs::canonicalize(dev.path()).unwrap();
    let group: u32 = std::fs::read_link(dir.join("iommu_group"))
        .unwrap()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    match vfio::inspect(&dir, group) {
        Ok(r) => {
            assert!(
                r.regions
                    .iter()
                    .any(|x| x.name == "CONFIG" && x.size >= 256),
                "{r:?}"
            );
            assert_eq!(r.iommu_type, vfio::IOMMU_TYPE);
        }
        // Not root, or a VM owns it: the error must say what to do.
        Err(e) => {
            eprintln!("VFIO refused {}: {e}", dir.display());
            assert!(!e.hint.is_empty());
        }
    }
}
