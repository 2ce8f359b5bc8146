//! vgpu-smi (in the guest) and vgpuctl (on the host) against a running vgpud.

use std::process::Command;

use vgpu_tests::harness::{TestVm, Vgpud, artifacts, hold};

const MIB: u64 = 1 << 20;

#[test]
fn vgpu_smi_shows_the_slice_and_this_vms_processes_only() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 32 * MIB)]);
    let _h1 = hold(&d, "vm1", 8 * MIB);
    let _h2 = hold(&d, "vm2", 4 * MIB);
    let out = Command::new(&artifacts().vgpu_smi)
        .arg("--json")
        .env("VGPU_TRANSPORT", d.transport("vm1"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["vm"], "vm1");
    assert_eq!(v["memory"]["total"], 64 * MIB);
    assert_eq!(v["memory"]["used"], 8 * MIB);
    let procs = v["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{v}");
    assert_eq!(procs[0]["process"], "c-driver_api");
    assert_eq!(procs[0]["memory_used"], 8 * MIB);
    assert!(v["device"]["uuid"].as_str().unwrap().starts_with("GPU-"));

    let table = Command::new(&artifacts().vgpu_smi)
        .env("VGPU_TRANSPORT", d.transport("vm2"))
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&table.stdout);
    assert!(t.contains("4MiB / 32MiB"), "{t}");
    assert!(t.contains("c-driver_api"), "{t}");
}

#[test]
fn vgpu_smi_without_a_daemon_fails_with_a_hint() {
    let out = Command::new(&artifacts().vgpu_smi)
        .env("VGPU_TRANSPORT", "unix:/nonexistent.sock")
        .env("VGPU_LOG", "off")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is vgpud serving this VM"));
}

fn vgpuctl(d: &Vgpud, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(&artifacts().vgpuctl)
        .arg("--socket")
        .arg(d.admin_socket())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn vgpuctl_reports_vms_and_fails_with_useful_exit_codes() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    let _h = hold(&d, "vm1", 16 * MIB);
    let (code, out, _) = vgpuctl(&d, &["--json", "vm", "show", "vm1"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["memory_used"], 16 * MIB);
    assert_eq!(v["sessions"].as_array().unwrap().len(), 1);

    let (code, out, _) = vgpuctl(&d, &["vm", "list"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("vm1") && out.contains("16 MiB") && out.contains("64 MiB"),
        "{out}"
    );

    let (code, out, _) = vgpuctl(&d, &["status"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("vgpud "), "{out}");

    let (code, _, err) = vgpuctl(&d, &["vm", "show", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("no VM named `nope`"), "{err}");

    let out = Command::new(&artifacts().vgpuctl)
        .args(["--socket", "/nonexistent/admin.sock", "status"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is vgpud running?"));
}
