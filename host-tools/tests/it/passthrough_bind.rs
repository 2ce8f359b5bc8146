//! `vgpuctl passthrough bind` / `unbind` against fake hosts whose sysfs
//! reacts to writes like the kernel's, including a failure injected at every
//! step.

use std::path::Path;

use vgpu_host_tools::passthrough::PassthroughError;
use vgpu_host_tools::passthrough::error::EXIT_HOST_CHANGED;
use vgpu_host_tools::passthrough::testutils::{
    A100, A100_GROUP, FakeHost, L4, NIC, RTX, RTX_AUDIO, diff,
};

fn host() -> (tempfile::TempDir, FakeHost) {
    let d = tempfile::tempdir().unwrap();
    let h = FakeHost::datacenter(d.path());
    (d, h)
}

fn driver(h: &FakeHost, a: &str) -> Option<String> {
    std::fs::read_link(h.sys().join("bus/pci/devices").join(a).join("driver"))
        .ok()
        .map(|t| t.file_name().unwrap().to_string_lossy().into_owned())
}

fn read(h: &FakeHost, a: &str, attr: &str) -> String {
    std::fs::read_to_string(h.sys().join("bus/pci/devices").join(a).join(attr))
        .unwrap()
        .trim_end()
        .to_string()
}

fn state(h: &FakeHost) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(h.state_dir().join("passthrough.json")).unwrap())
        .unwrap()
}

fn assert_unchanged(
    h: &FakeHost,
    before: &std::collections::BTreeMap<String, vgpu_host_tools::passthrough::testutils::Entry>,
    what: &str,
) {
    let d = diff(before, &h.snapshot());
    assert!(d.is_empty(), "{what}: host changed:\n{}", d.join("\n"));
}

#[test]
fn bind_moves_a_gpu_from_nvidia_to_vfio_and_unbind_restores_the_host_exactly() {
    let (_d, h) = host();
    let before = h.snapshot();
    let r = h.run(&["bind", A100]).unwrap();
    assert_eq!(driver(&h, A100).as_deref(), Some("vfio-pci"));
    assert_eq!(read(&h, A100, "driver_override"), "vfio-pci");
    // The kernel's way: override, unbind from nvidia, probe.
    let writes: Vec<(String, String)> = h
        .sysfs
        .writes()
        .into_iter()
        .map(|(p, v, ok)| {
            assert!(ok);
            (p, v)
        })
        .collect();
    assert_eq!(
        writes,
        vec![
            (
                format!("bus/pci/devices/{A100}/driver_override"),
                "vfio-pci\n".into()
            ),
            ("bus/pci/drivers/nvidia/unbind".into(), A100.into()),
            ("bus/pci/drivers_probe".into(), A100.into()),
        ]
    );
    // The NVIDIA driver let go of it: its procfs entry is gone.
    assert!(!h.proc().join("driver/nvidia/gpus").join(A100).exists());
    assert_eq!(r.json["changed"], true);
    assert_eq!(r.json["iommu_group"], A100_GROUP);
    assert!(
        r.text
            .contains("0000:3b:00.0 bound to vfio-pci (was nvidia)"),
        "{}",
        r.text
    );
    assert!(
        r.text.contains("passthrough verify 0000:3b:00.0"),
        "{}",
        r.text
    );
    let st = state(&h);
    assert_eq!(st["devices"][A100]["original_driver"], "nvidia");
    assert_eq!(
        st["devices"][A100]["original_override"],
        serde_json::Value::Null
    );

    // Binding again changes nothing.
    let n = h.sysfs.writes().len();
    let again = h.run(&["bind", A100]).unwrap();
    assert_eq!(again.json["changed"], false);
    assert!(again.text.contains("already bound"), "{}", again.text);
    assert_eq!(h.sysfs.writes().len(), n);

    let r = h.run(&["unbind", A100]).unwrap();
    assert!(
        r.text.contains("given back to nvidia (now nvidia)"),
        "{}",
        r.text
    );
    assert_eq!(driver(&h, A100).as_deref(), Some("nvidia"));
    assert!(state(&h)["devices"].as_object().unwrap().is_empty());
    // Apart from the state file, the host is exactly as before.
    assert_unchanged(&h, &before, "bind + unbind");
}

#[test]
fn a_group_shared_with_an_audio_function_needs_group_and_comes_back_whole() {
    let (_d, h) = host();
    let before = h.snapshot();
    let e = h.run(&["bind", RTX]).unwrap_err();
    assert!(
        matches!(e, PassthroughError::GroupNotViable { group: 17, .. }),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("0000:65:00.1 (audio, bound to snd_hda_intel)"),
        "{msg}"
    );
    assert!(msg.contains("bind --group 0000:65:00.0"), "{msg}");
    assert!(h.sysfs.writes().is_empty(), "a refusal writes nothing");
    assert_unchanged(&h, &before, "refused bind");

    let r = h.run(&["bind", "--group", RTX]).unwrap();
    assert_eq!(driver(&h, RTX).as_deref(), Some("vfio-pci"));
    assert_eq!(driver(&h, RTX_AUDIO).as_deref(), Some("vfio-pci"));
    assert_eq!(r.json["bound"], serde_json::json!([RTX_AUDIO, RTX]));
    let st = state(&h);
    assert_eq!(st["devices"][RTX_AUDIO]["original_driver"], "snd_hda_intel");
    assert_eq!(st["devices"][RTX_AUDIO]["bound_with"], RTX);

    // Unbinding the GPU gives both functions back.
    h.run(&["unbind", RTX]).unwrap();
    assert_eq!(driver(&h, RTX_AUDIO).as_deref(), Some("snd_hda_intel"));
    assert_unchanged(&h, &before, "bind --group + unbind");
}

#[test]
fn what_cannot_be_passed_through_is_refused_with_what_to_do_and_nothing_written() {
    let (d, h) = host();
    let before = h.snapshot();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["bind", NIC], "not an NVIDIA device (vendor 0x8086)"),
        (vec!["bind", RTX_AUDIO], "NVIDIA audio function, not a GPU"),
        (vec!["bind", "0000:3b:01.7"], "no PCI device 0000:3b:01.7"),
        (
            vec!["unbind", A100],
            "not bound to vfio-pci (its driver is nvidia)",
        ),
    ];
    for (argv, want) in cases {
        let e = h.run(&argv).unwrap_err().to_string();
        assert!(e.contains(want), "{argv:?}: {e}");
    }
    let e = h.run(&["bind", "0000:3b:01.7"]).unwrap_err().to_string();
    assert!(e.contains("lspci -D"), "{e}");

    // vfio-pci not loaded.
    let g = tempfile::tempdir().unwrap();
    let h2 = FakeHost::datacenter(g.path());
    h2.remove_driver("vfio-pci");
    let e = h2.run(&["bind", A100]).unwrap_err().to_string();
    assert!(e.contains("modprobe vfio-pci"), "{e}");
    assert!(h2.sysfs.writes().is_empty());

    // A host without IOMMU.
    let n = tempfile::tempdir().unwrap();
    let h3 = FakeHost::no_iommu(n.path());
    let e = h3.run(&["bind", A100]).unwrap_err();
    assert!(
        matches!(
            e,
            PassthroughError::NoIommu {
                host_has_iommu: false,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("intel_iommu=on"), "{e}");
    assert!(h3.sysfs.writes().is_empty());

    assert!(h.sysfs.writes().is_empty());
    assert_unchanged(&h, &before, "refusals");
    drop(d);
}

#[test]
fn a_gpu_in_use_by_vgpud_or_host_processes_is_not_taken() {
    let (_d, h) = host();
    h.open_by(4242, "vgpud", "/dev/nvidia0");
    let e = h.run(&["bind", A100]).unwrap_err();
    assert!(matches!(e, PassthroughError::InUse { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("vgpud shares it (pid 4242 (vgpud) has the GPU open)"),
        "{e}"
    );

    h.open_by(777, "python3", "/dev/nvidia1");
    let e = h.run(&["bind", "--group", RTX]).unwrap_err().to_string();
    assert!(e.contains("pid 777 (python3) has it open"), "{e}");
    assert!(e.contains("nvidia-persistenced"), "{e}");
    assert!(h.sysfs.writes().is_empty());

    // A GPU with VFs enabled cannot lose its driver.
    let (_d2, h2) = host();
    h2.run(&["enable-vfs", A100, "2"]).unwrap();
    let e = h2.run(&["bind", A100]).unwrap_err().to_string();
    assert!(e.contains("2 SR-IOV virtual functions are enabled"), "{e}");
    assert!(e.contains("disable-vfs 0000:3b:00.0"), "{e}");
}

#[test]
fn a_device_without_driver_is_bound_and_left_without_one_on_unbind() {
    let (_d, h) = host();
    let before = h.snapshot();
    h.run(&["bind", L4]).unwrap();
    assert_eq!(driver(&h, L4).as_deref(), Some("vfio-pci"));
    assert_eq!(
        h.sysfs.writes().len(),
        2,
        "override and probe, nothing to unbind"
    );
    assert_eq!(
        state(&h)["devices"][L4]["original_driver"],
        serde_json::Value::Null
    );
    let r = h.run(&["unbind", L4]).unwrap();
    assert!(r.text.contains("given back to no driver"), "{}", r.text);
    assert_eq!(driver(&h, L4), None);
    assert_unchanged(&h, &before, "bind + unbind of an unbound GPU");
}

#[test]
fn unbind_waits_for_the_vm_and_hands_unrecorded_devices_to_the_kernel() {
    let (_d, h) = host();
    h.run(&["bind", A100]).unwrap();
    h.open_by(9000, "qemu-system-x86", &format!("/dev/vfio/{A100_GROUP}"));
    let e = h.run(&["unbind", A100]).unwrap_err().to_string();
    assert!(
        e.contains("IOMMU group 42 is open by pid 9000 (qemu-system-x86)"),
        "{e}"
    );
    assert!(e.contains("shut the VM down"), "{e}");
    assert_eq!(driver(&h, A100).as_deref(), Some("vfio-pci"));

    // Bound to vfio-pci by someone else (no record): the kernel chooses.
    let (_d2, h2) = host();
    h2.run(&["bind", L4]).unwrap();
    std::fs::remove_file(h2.state_dir().join("passthrough.json")).unwrap();
    let r = h2.run(&["unbind", L4]).unwrap();
    assert!(
        r.text.contains("the driver the kernel chose (now nvidia)"),
        "{}",
        r.text
    );
    assert_eq!(driver(&h2, L4).as_deref(), Some("nvidia"));
}

/// Runs `argv` once to count its writes, then on fresh hosts makes each
/// write fail (or be ignored by the kernel) in turn: every run must fail,
/// say the host is as it was, and leave it so.
fn every_step_rolls_back(argv: &[&str], prepare: &dyn Fn(&FakeHost)) {
    let count = {
        let d = tempfile::tempdir().unwrap();
        let h = FakeHost::datacenter(d.path());
        prepare(&h);
        let base = h.sysfs.writes().len();
        h.run(argv).unwrap();
        h.sysfs.writes().len() - base
    };
    assert!(count >= 2, "{argv:?} makes {count} writes");
    for k in 0..count {
        for ignore in [false, true] {
            let d = tempfile::tempdir().unwrap();
            let h = FakeHost::datacenter(d.path());
            prepare(&h);
            let before = h.snapshot();
            let state_before = std::fs::read(h.state_dir().join("passthrough.json")).ok();
            if ignore {
                h.sysfs.ignore_nth_write(k);
            } else {
                h.sysfs.fail_nth_write(k, libc::EBUSY);
            }
            let e = h.run(argv).unwrap_err();
            let what = format!(
                "{argv:?} with write {k} {}",
                if ignore { "ignored" } else { "failing" }
            );
            assert!(
                matches!(e, PassthroughError::RolledBack { .. }),
                "{what}: {e}"
            );
            assert!(
                e.to_string().contains("The host is as it was"),
                "{what}: {e}"
            );
            if !ignore {
                assert!(
                    e.to_string().contains("Device or resource busy"),
                    "{what}: {e}"
                );
            }
            assert_unchanged(&h, &before, &what);
            assert_eq!(
                std::fs::read(h.state_dir().join("passthrough.json")).ok(),
                state_before,
                "{what}: state file changed"
            );
        }
    }
}

#[test]
fn a_failure_at_any_step_of_bind_leaves_the_host_as_it_was() {
    every_step_rolls_back(&["bind", A100], &|_| {});
    every_step_rolls_back(&["bind", "--group", RTX], &|_| {});
    every_step_rolls_back(&["bind", L4], &|_| {});
}

#[test]
fn a_failure_at_any_step_of_unbind_leaves_the_device_assigned() {
    every_step_rolls_back(&["unbind", A100], &|h| {
        h.run(&["bind", A100]).unwrap();
    });
    every_step_rolls_back(&["unbind", RTX], &|h| {
        h.run(&["bind", "--group", RTX]).unwrap();
    });
}

#[test]
fn a_state_file_that_cannot_be_written_undoes_the_binding() {
    let (_d, h) = host();
    let before = h.snapshot();
    // The temporary file that would be renamed over the state file is a
    // directory: saving fails after the sysfs steps.
    std::fs::create_dir_all(h.state_dir().join("passthrough.json.tmp")).unwrap();
    let e = h.run(&["bind", A100]).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("cannot write the passthrough state file"),
        "{msg}"
    );
    assert!(msg.contains("--state-dir"), "{msg}");
    assert!(
        msg.contains("The host is as it was (undone: unbind 0000:3b:00.0 from vfio-pci;"),
        "{msg}"
    );
    assert_unchanged(&h, &before, "state file failure");
}

#[test]
fn a_failed_rollback_says_how_to_finish_it_by_hand() {
    let (_d, h) = host();
    // Probing vfio-pci fails, and so does giving the GPU back to nvidia.
    h.sysfs.fail_writes_to("drivers_probe", libc::EIO);
    h.sysfs.fail_writes_to("drivers/nvidia/bind", libc::EIO);
    let e = h.run(&["bind", A100]).unwrap_err();
    assert_eq!(e.exit_code(), EXIT_HOST_CHANGED);
    let msg = e.to_string();
    assert!(msg.contains("the host is left changed"), "{msg}");
    let sys = h.sys();
    let manual = format!(
        "echo 0000:3b:00.0 > {}",
        Path::new(&sys)
            .join("bus/pci/drivers/nvidia/bind")
            .display()
    );
    assert!(msg.contains(&manual), "{msg}");
    // Following the advice (here: with the fault gone) restores the host.
    h.sysfs.clear_faults();
    assert_eq!(driver(&h, A100), None);
    vgpu_host_tools::passthrough::rollback::Action::Bound {
        address: A100.parse().unwrap(),
        driver: "nvidia".into(),
    }
    .apply(&h.sysfs)
    .unwrap();
    assert_eq!(driver(&h, A100).as_deref(), Some("nvidia"));
}
