//! `enable-vfs` / `disable-vfs` against a fake host whose sysfs creates and
//! removes virtual functions as the kernel does.

use std::path::Path;

use serde_json::json;
use vgpu_host_tools::passthrough::PassthroughError;
use vgpu_host_tools::passthrough::testutils::{A100, A100_VF0, FakeHost, L4, RTX, diff};
use vgpu_pci::sysfs::Sysfs;

fn host() -> (tempfile::TempDir, FakeHost) {
    let d = tempfile::tempdir().unwrap();
    let h = FakeHost::datacenter(d.path());
    (d, h)
}

fn dev(h: &FakeHost, a: &str) -> std::path::PathBuf {
    h.sys().join("bus/pci/devices").join(a)
}

fn attr(h: &FakeHost, a: &str, f: &str) -> String {
    std::fs::read_to_string(dev(h, a).join(f))
        .unwrap()
        .trim_end()
        .to_string()
}

#[test]
fn the_fake_kernel_creates_vfs_like_linux_and_probes_them_when_asked() {
    // The fixture itself: writing sriov_numvfs directly (autoprobe on)
    // creates linked VFs in their own groups and lets nvidia take them.
    let (_d, h) = host();
    h.sysfs
        .write(
            &Path::new("bus/pci/devices").join(A100).join("sriov_numvfs"),
            "1\n",
        )
        .unwrap();
    let vf = dev(&h, A100_VF0);
    assert_eq!(
        std::fs::read_link(vf.join("physfn")).unwrap(),
        Path::new("../0000:3b:00.0")
    );
    assert_eq!(
        std::fs::read_link(dev(&h, A100).join("virtfn0")).unwrap(),
        Path::new("../0000:3b:00.4")
    );
    assert!(
        std::fs::read_link(vf.join("driver"))
            .unwrap()
            .ends_with("nvidia")
    );
    let group = std::fs::read_link(vf.join("iommu_group")).unwrap();
    assert!(
        h.sys()
            .join("kernel/iommu_groups")
            .join(group.file_name().unwrap())
            .join("devices")
            .join(A100_VF0)
            .exists()
    );
    // The kernel changes the count only from 0.
    let e = h
        .sysfs
        .write(
            &Path::new("bus/pci/devices").join(A100).join("sriov_numvfs"),
            "2\n",
        )
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBUSY));
}

#[test]
fn enable_creates_free_vfs_and_disable_restores_the_host_exactly() {
    let (_d, h) = host();
    let before = h.snapshot();
    let r = h.run(&["enable-vfs", A100, "4"]).unwrap();
    assert_eq!(attr(&h, A100, "sriov_numvfs"), "4");
    let vfs: Vec<&str> = r.json["vfs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["pci"].as_str().unwrap())
        .collect();
    // Offset 4, stride 1: functions 4-7 of device 0.
    assert_eq!(
        vfs,
        [
            "0000:3b:00.4",
            "0000:3b:00.5",
            "0000:3b:00.6",
            "0000:3b:00.7"
        ]
    );
    for v in r.json["vfs"].as_array().unwrap() {
        // No host driver took them (autoprobe was off while they were made)…
        assert_eq!(v["driver"], serde_json::Value::Null, "{v}");
        assert!(v["iommu_group"].as_u64().is_some(), "{v}");
    }
    // …and autoprobe is back to what it was.
    assert_eq!(attr(&h, A100, "sriov_drivers_autoprobe"), "1");
    assert!(r.text.contains("4 VFs enabled (was 0)"), "{}", r.text);

    // Same count again: nothing to do.
    let n = h.sysfs.writes().len();
    assert_eq!(
        h.run(&["enable-vfs", A100, "4"]).unwrap().json["changed"],
        false
    );
    assert_eq!(h.sysfs.writes().len(), n);

    // A different count goes through 0 while the VFs are free.
    h.run(&["enable-vfs", A100, "2"]).unwrap();
    assert_eq!(attr(&h, A100, "sriov_numvfs"), "2");
    assert!(!dev(&h, "0000:3b:00.6").exists());

    let r = h.run(&["disable-vfs", A100]).unwrap();
    assert_eq!(r.json["removed"], json!(["0000:3b:00.4", "0000:3b:00.5"]));
    let d = diff(&before, &h.snapshot());
    assert!(
        d.is_empty(),
        "enable + disable changed the host:\n{}",
        d.join("\n")
    );
    assert_eq!(
        h.run(&["disable-vfs", A100]).unwrap().json["changed"],
        false
    );
}

#[test]
fn bad_requests_are_refused_before_anything_is_written() {
    let (_d, h) = host();
    for (argv, want) in [
        (vec!["enable-vfs", A100, "17"], "at most 16 VFs"),
        (vec!["enable-vfs", A100, "0"], "disable-vfs"),
        (vec!["enable-vfs", RTX, "2"], "no SR-IOV capability"),
        (vec!["disable-vfs", L4], "no SR-IOV capability"),
    ] {
        let e = h.run(&argv).unwrap_err().to_string();
        assert!(e.contains(want), "{argv:?}: {e}");
    }
    h.run(&["enable-vfs", A100, "1"]).unwrap();
    let n = h.sysfs.writes().len();
    let e = h
        .run(&["enable-vfs", A100_VF0, "1"])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("is a virtual function; manage VFs on its physical function 0000:3b:00.0"),
        "{e}"
    );
    assert_eq!(h.sysfs.writes().len(), n);
}

#[test]
fn vfs_in_use_are_never_removed() {
    let (d, h) = host();
    h.run(&["enable-vfs", A100, "2"]).unwrap();
    h.run(&["bind", A100_VF0]).unwrap();
    let before = h.snapshot();
    let e = h.run(&["disable-vfs", A100]).unwrap_err();
    assert!(matches!(e, PassthroughError::InUse { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("VF 0000:3b:00.4 is bound to vfio-pci"),
        "{e}"
    );
    let e = h.run(&["enable-vfs", A100, "4"]).unwrap_err().to_string();
    assert!(e.contains("VF 0000:3b:00.4 is bound to vfio-pci"), "{e}");
    assert!(diff(&before, &h.snapshot()).is_empty());

    // A running VM holds the group; and the config assigns the other VF.
    let g = std::fs::read_link(dev(&h, A100_VF0).join("iommu_group")).unwrap();
    let g = g.file_name().unwrap().to_str().unwrap().to_string();
    h.open_by(9000, "qemu-system-x86", &format!("/dev/vfio/{g}"));
    let cfg = d.path().join("vgpud.toml");
    std::fs::write(
        &cfg,
        "[[vm]]\nname = \"inf\"\nmode = \"passthrough\"\npci = \"0000:3b:00.5\"\n",
    )
    .unwrap();
    let e = h
        .run(&["--config", cfg.to_str().unwrap(), "disable-vfs", A100])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            "IOMMU group {g} of VF 0000:3b:00.4 is open by pid 9000 (qemu-system-x86)"
        )),
        "{e}"
    );
    assert!(
        e.contains("VF 0000:3b:00.5 is assigned to VM `inf` in the config"),
        "{e}"
    );
    assert!(e.contains("stop the VMs"), "{e}");
}

#[test]
fn a_failure_at_any_step_of_enable_leaves_the_vfs_as_they_were() {
    for prepare in [0u32, 2] {
        let count = {
            let d = tempfile::tempdir().unwrap();
            let h = FakeHost::datacenter(d.path());
            if prepare > 0 {
                h.run(&["enable-vfs", A100, &prepare.to_string()]).unwrap();
            }
            let base = h.sysfs.writes().len();
            h.run(&["enable-vfs", A100, "3"]).unwrap();
            h.sysfs.writes().len() - base
        };
        // autoprobe off, (0,) 3, autoprobe on.
        assert_eq!(count, if prepare > 0 { 4 } else { 3 });
        for k in 0..count {
            for ignore in [false, true] {
                let d = tempfile::tempdir().unwrap();
                let h = FakeHost::datacenter(d.path());
                if prepare > 0 {
                    h.run(&["enable-vfs", A100, &prepare.to_string()]).unwrap();
                }
                let before = h.snapshot();
                if ignore {
                    h.sysfs.ignore_nth_write(k);
                } else {
                    h.sysfs.fail_nth_write(k, libc::ENOMEM);
                }
                let e = h.run(&["enable-vfs", A100, "3"]).unwrap_err();
                let what = format!("from {prepare}, write {k} ignored={ignore}");
                assert!(
                    matches!(e, PassthroughError::RolledBack { .. }),
                    "{what}: {e}"
                );
                if prepare == 0 {
                    let d = diff(&before, &h.snapshot());
                    assert!(d.is_empty(), "{what}:\n{}", d.join("\n"));
                } else {
                    // VFs destroyed on the way are created again (with new
                    // IOMMU group numbers, as the kernel would).
                    assert_eq!(
                        attr(&h, A100, "sriov_numvfs"),
                        prepare.to_string(),
                        "{what}"
                    );
                    assert!(dev(&h, "0000:3b:00.5").exists(), "{what}");
                    assert!(!dev(&h, "0000:3b:00.6").exists(), "{what}");
                    assert_eq!(attr(&h, A100, "sriov_drivers_autoprobe"), "1", "{what}");
                }
            }
        }
    }
}

#[test]
fn a_pf_driver_without_sriov_support_gets_an_explanation() {
    let (_d, h) = host();
    h.sysfs.fail_writes_to("sriov_numvfs", libc::ENOENT);
    let e = h.run(&["enable-vfs", A100, "2"]).unwrap_err().to_string();
    assert!(
        e.contains("cannot configure SR-IOV: bind the GPU to the NVIDIA driver first"),
        "{e}"
    );
    assert!(e.contains("The host is as it was"), "{e}");
    assert_eq!(attr(&h, A100, "sriov_drivers_autoprobe"), "1");
}
