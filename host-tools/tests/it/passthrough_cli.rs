//! The `vgpuctl passthrough` binary against a fake sysfs tree on disk (read
//! and written as plain files, without the kernel's reactions).

use std::process::{Command, Output};

use vgpu_host_tools::passthrough::testutils::{A100, FakeHost, RTX};

fn vgpuctl(h: &FakeHost, args: &[&str]) -> Output {
    let sys = h.sys();
    let proc = h.proc();
    let state = h.state_dir();
    Command::new(env!("CARGO_BIN_EXE_vgpuctl"))
        .arg("--socket")
        .arg(h.socket())
        .args(args)
        .args([
            "--sysfs-root",
            sys.to_str().unwrap(),
            "--proc-root",
            proc.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ])
        .output()
        .unwrap()
}

#[test]
fn list_prints_a_table_and_json() {
    let d = tempfile::tempdir().unwrap();
    let h = FakeHost::datacenter(d.path());
    let out = vgpuctl(&h, &["passthrough", "list"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("PCI "), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with(A100) && l.contains("nvidia") && l.contains("0/16")),
        "{text}"
    );

    let out = vgpuctl(&h, &["--json", "passthrough", "list"]);
    assert!(out.status.success());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["gpus"][1]["pci"], RTX);
}

#[test]
fn errors_go_to_stderr_with_a_failure_exit_code() {
    let d = tempfile::tempdir().unwrap();
    let h = FakeHost::datacenter(d.path());
    let out = vgpuctl(&h, &["passthrough", "bind", "0000:00:1f.6"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("vgpuctl: 0000:00:1f.6 is not an NVIDIA device"),
        "{err}"
    );

    // clap refuses a malformed address before anything runs.
    let out = vgpuctl(&h, &["passthrough", "verify", "3b-00.0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("lspci -D"));

    // On plain files the kernel never unbinds nvidia: the binary notices
    // that its write had no effect, undoes the override, and says so.
    let out = vgpuctl(&h, &["passthrough", "bind", "3b:00.0"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unbind 0000:3b:00.0 from nvidia, but it is bound to nvidia"),
        "{err}"
    );
    assert!(
        err.contains("The host is as it was (undone: clear driver_override of 0000:3b:00.0)"),
        "{err}"
    );
    assert!(!h.state_dir().join("passthrough.json").exists());
}
