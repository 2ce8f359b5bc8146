//! vgpuctl against a running vgpud: every command, tables by default, JSON
//! with --json, and the documented exit codes; `vgpud --check-config`.

use crate::admin_support;

use std::process::Command;

use admin_support::{Admin, MIB, run, two_vms};
use serde_json::Value;
use vgpu_tests::harness::artifacts;

#[test]
fn every_command_works_against_a_running_daemon() {
    let d = Admin::start(&two_vms());
    let _h = d.hold("vm1", 16 * MIB);

    let o = d.vgpuctl(&["status"]);
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        o.stdout.starts_with(&format!(
            "vgpud {} (pid {}",
            env!("CARGO_PKG_VERSION"),
            d.pid()
        )),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("metrics: http://127.0.0.1:"),
        "{}",
        o.stdout
    );
    let s = d.vgpuctl_json(&["status"]);
    assert_eq!(s["vms"].as_array().unwrap().len(), 2);

    let o = d.vgpuctl(&["device", "list"]);
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        o.stdout.contains("gpu0") && o.stdout.contains("1 GiB") && o.stdout.contains("vm1,vm2"),
        "{}",
        o.stdout
    );
    // Also with NVIDIA's user-space libraries but no kernel driver.
    assert!(
        o.stdout
            .contains("No NVIDIA GPU found: no NVIDIA driver found")
            || o.stdout
                .contains("No NVIDIA GPU found: the NVIDIA kernel driver is not loaded"),
        "{}",
        o.stdout
    );
    let j = d.vgpuctl_json(&["device", "list"]);
    assert_eq!(j["devices"][0]["name"], "gpu0");
    assert_eq!(j["gpus"]["nvml"], false);
    let o = d.vgpuctl(&["device", "show", "gpu0"]);
    assert!(
        o.stdout.contains("GPU-") && o.stdout.contains("96 MiB"),
        "{}",
        o.stdout
    );
    let o = d.vgpuctl(&[
        "device",
        "set",
        "gpu0",
        "--slice-ms",
        "4",
        "--policy",
        "fixed",
    ]);
    assert_eq!(o.code, 0, "{o:?}");
    assert_eq!(
        o.stdout.trim(),
        "device gpu0: policy fixed, slice 4 ms, batch minimum share 5%"
    );

    let o = d.vgpuctl(&["vm", "list"]);
    assert!(
        o.stdout.lines().next().unwrap().starts_with("VM"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("16 MiB") && o.stdout.contains("64 MiB") && o.stdout.contains("75%"),
        "{}",
        o.stdout
    );
    let o = d.vgpuctl(&["vm", "show", "vm1"]);
    assert!(
        o.stdout.contains("c-driver_api") && o.stdout.contains("SESSION"),
        "{}",
        o.stdout
    );

    let sock = d.path("vm3.sock").display().to_string();
    let o = d.vgpuctl(&[
        "vm",
        "add",
        "vm3",
        "--memory",
        "8MiB",
        "--weight",
        "2",
        "--priority",
        "batch",
        "--unix-socket",
        &sock,
    ]);
    assert_eq!(o.code, 0, "{o:?}");
    assert_eq!(o.stdout.trim(), "VM vm3 added: 8 MiB slice on gpu0");
    let v = d.vgpuctl_json(&["vm", "set", "vm3", "--memory", "16MiB", "--weight", "5"]);
    assert_eq!(
        (v["memory_limit"].as_u64(), v["weight"].as_u64()),
        (Some(16 * MIB), Some(5))
    );
    let o = d.vgpuctl(&["vm", "drain", "vm3", "--wait", "--timeout", "5"]);
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains("draining"), "{}", o.stdout);
    let v = d.vgpuctl_json(&["vm", "remove", "vm3"]);
    assert_eq!(v["removed"], "vm3");

    let o = d.vgpuctl(&[
        "vm",
        "attach-args",
        "vm2",
        "--vmm",
        "qemu",
        "--guest-memory",
        "1G",
    ]);
    assert_eq!(o.code, 0, "{o:?}");
    let vhost = d.path("vm2.vhost").display().to_string();
    assert_eq!(
        o.stdout.trim(),
        format!(
            "-m 1G -object memory-backend-memfd,id=vgpu-mem-vm2,size=1G,share=on -numa node,memdev=vgpu-mem-vm2 -chardev socket,id=vgpu-vsock-vm2,path={vhost} -device vhost-user-vsock-pci,chardev=vgpu-vsock-vm2"
        )
    );
    let j = d.vgpuctl_json(&["vm", "attach-args", "vm2", "--vmm", "cloud-hypervisor"]);
    assert_eq!(j["args"][2], "--generic-vhost-user");
    assert!(
        j["args"][3]
            .as_str()
            .unwrap()
            .starts_with(&format!("socket={vhost},device_type=vsock"))
    );
    let o = d.vgpuctl(&["vm", "attach-args", "vm1", "--vmm", "qemu"]);
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("add vhost_user_socket and guest_cid"),
        "{o:?}"
    );

    let o = d.vgpuctl(&["metrics"]);
    assert!(
        o.stdout.contains("# TYPE vgpu_vm_fb_used_bytes gauge"),
        "{}",
        o.stdout
    );
    let m = d.vgpuctl_json(&["metrics"]);
    let used = m
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "vgpu_vm_fb_used_bytes" && s["labels"]["vm"] == "vm1")
        .unwrap();
    assert_eq!(used["value"], (16 * MIB) as f64);

    let o = d.vgpuctl(&["analyze"]);
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        o.stdout.contains("hotspots") && o.stdout.contains("recommendations:"),
        "{}",
        o.stdout
    );
    let a = d.vgpuctl_json(&["analyze"]);
    assert!(
        a["hotspots"].is_array() && a["tuning"]["mode"] == "off",
        "{a}"
    );
    // Tuning targets change live.
    let v = d.vgpuctl_json(&[
        "vm",
        "set",
        "vm1",
        "--target-wait-p99",
        "5ms",
        "--min-share",
        "20",
        "--weight-max",
        "40",
    ]);
    assert_eq!(v["tuning"]["target_wait_p99_s"], 0.005, "{v}");
    assert_eq!(v["tuning"]["weight_max"], 40, "{v}");
    let o = d.vgpuctl(&["vm", "show", "vm1"]);
    assert!(o.stdout.contains("(target 5.00 ms)"), "{}", o.stdout);

    let o = d.vgpuctl(&["top", "--once", "--interval", "0.2", "--width", "140"]);
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        o.stdout.contains("Devices")
            && o.stdout.contains("VMs")
            && o.stdout.contains("16 MiB/64 MiB"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("draining") || o.stdout.contains("running"),
        "{}",
        o.stdout
    );
    let t = d.vgpuctl_json(&["top", "--interval", "0.2"]);
    assert_eq!(t["vms"][0]["name"], "vm1");
    assert!(t["vms"][0]["kernels_per_s"].as_f64().is_some());
    // Without a terminal, the live view says what to use instead.
    let o = d.vgpuctl(&["top"]);
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains("--once"), "{o:?}");

    let o = d.vgpuctl(&["reload"]);
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains("nothing changed"), "{}", o.stdout);

    let o = d.vgpuctl(&[
        "doctor",
        "--config",
        &d.config().display().to_string(),
        "--qemu",
        "/nonexistent/qemu",
    ]);
    assert!(o.code == 0 || o.code == 4, "{o:?}");
    let j: Value = serde_json::from_str(
        &d.vgpuctl(&[
            "--json",
            "doctor",
            "--config",
            &d.config().display().to_string(),
            "--qemu",
            "/nonexistent/qemu",
        ])
        .stdout,
    )
    .unwrap();
    let checks = j["checks"].as_array().unwrap();
    let find = |n: &str| {
        checks
            .iter()
            .find(|c| c["check"] == n)
            .unwrap_or_else(|| panic!("no {n} in {j}"))
    };
    assert_eq!(find("shared-memory")["status"], "pass");
    assert_eq!(find("config")["status"], "pass");
    assert_eq!(find("vgpud")["status"], "pass");
    assert_eq!(find("qemu")["status"], "warn");
    assert_eq!(find("slices.gpu0")["status"], "pass");
    assert!(find("kvm")["detail"].as_str().is_some());
    assert_eq!(find("nvidia")["status"], "warn");
    assert!(
        checks
            .iter()
            .all(|c| c["status"] == "pass" || !c["fix"].as_str().unwrap_or_default().is_empty()),
        "every problem comes with a fix: {j}"
    );
    assert_eq!(j["failed"].as_u64().unwrap() > 0, o.code == 4);
}

#[test]
fn exit_codes_and_messages_scripts_rely_on() {
    let d = Admin::start(&two_vms());
    let o = d.vgpuctl(&["vm", "show", "nope"]);
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("no VM named `nope`") && o.stderr.contains("vgpuctl vm list"),
        "{o:?}"
    );
    let o = d.vgpuctl(&["vm", "add", "vm1", "--memory", "1MiB"]);
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains("already defined"), "{o:?}");
    let o = d.vgpuctl(&["vm", "set", "vm1"]);
    assert_eq!(o.code, 2, "a usage error: {o:?}");
    let o = d.vgpuctl(&["device", "set", "gpu0", "--slice-ms", "1000"]);
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("slice_ms must be between 1 and 100"),
        "{o:?}"
    );
    let _h = d.hold("vm2", 4 * MIB);
    let o = d.vgpuctl(&["vm", "drain", "vm2", "--wait", "--timeout", "1"]);
    assert_eq!(o.code, 5, "{o:?}");
    assert!(o.stderr.contains("vgpuctl vm remove vm2"), "{o:?}");
    let o = run(Command::new(&artifacts().vgpuctl).args([
        "--socket",
        "/nonexistent/admin.sock",
        "status",
    ]));
    assert_eq!(o.code, 3);
    assert!(o.stderr.contains("is vgpud running?"), "{o:?}");
    let o = run(Command::new(&artifacts().vgpuctl)
        .args(["status"])
        .env("VGPU_ADMIN_SOCKET", d.admin_socket()));
    assert_eq!(o.code, 0, "VGPU_ADMIN_SOCKET names the socket: {o:?}");
}

#[test]
fn completions_and_man_pages_are_generated() {
    let o = run(Command::new(&artifacts().vgpuctl).args(["completions", "bash"]));
    assert_eq!(o.code, 0);
    assert!(
        o.stdout.contains("attach-args") && o.stdout.contains("complete -F"),
        "{}",
        &o.stdout[..200.min(o.stdout.len())]
    );
    let o = run(Command::new(&artifacts().vgpuctl).args(["completions", "zsh"]));
    assert!(
        o.stdout.starts_with("#compdef vgpuctl"),
        "{}",
        &o.stdout[..100.min(o.stdout.len())]
    );
    let dir = tempfile::tempdir().unwrap();
    let o = run(Command::new(&artifacts().vgpuctl)
        .arg("man")
        .arg(dir.path()));
    assert_eq!(o.code, 0, "{o:?}");
    let page = std::fs::read_to_string(dir.path().join("vgpuctl-vm-drain.1")).unwrap();
    assert!(page.contains(".TH") && page.contains("wait"), "{page}");
    // man(1) renders it, where man is installed.
    if let Ok(m) = Command::new("man")
        .arg("-l")
        .arg(dir.path().join("vgpuctl.1"))
        .env("MANPAGER", "cat")
        .output()
        && m.status.success()
    {
        assert!(String::from_utf8_lossy(&m.stdout).contains("Exit codes"));
    }
}

#[test]
fn check_config_validates_without_starting() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        two_vms().replace(admin_support::DIR, &dir.path().display().to_string()),
    )
    .unwrap();
    let o = run(Command::new(&artifacts().vgpud)
        .arg("--check-config")
        .arg(&good));
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains("valid (1 devices, 2 VMs)"), "{o:?}");
    assert!(
        !dir.path().join("admin.sock").exists(),
        "nothing was started"
    );
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[[vm]]\nname = \"a\"\nmemory = \"2GB\"\n").unwrap();
    let o = run(Command::new(&artifacts().vgpud)
        .arg("--check-config")
        .arg(&bad));
    assert_eq!(o.code, 2);
    assert!(
        o.stderr
            .starts_with(&format!("{}:3: memory: `2GB` is not a size", bad.display())),
        "{o:?}"
    );
    assert!(
        o.stderr.contains("e.g. \"2GiB\""),
        "the message says how to fix it: {o:?}"
    );
    let example = vgpu_tests::harness::workspace_root().join("examples/vgpud-admin.toml");
    let o = run(Command::new(&artifacts().vgpud)
        .arg("--check-config")
        .arg(&example));
    assert_eq!(o.code, 0, "the example config is valid: {o:?}");
}

#[test]
fn a_vm_added_from_a_profile_gets_its_slice_and_share() {
    let config = format!(
        "{}[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"1GiB\"\nworkers = 1\n\n\
         [[profile]]\nname = \"q4\"\nmemory = \"1/4\"\nweight = 3\npriority = \"batch\"\n",
        admin_support::admin_table()
    );
    let d = Admin::start(&config);
    let v = d.vgpuctl_json(&["vm", "add", "k1", "--profile", "q4"]);
    assert_eq!(v["memory_limit"], 256 * MIB, "{v:#}");
    assert_eq!(
        (v["weight"].as_u64(), v["priority"].as_str()),
        (Some(3), Some("batch"))
    );
    assert_eq!(v["config"]["profile"], "q4");
    // Options given with the profile win.
    let v = d.vgpuctl_json(&["vm", "add", "k2", "--profile", "q4", "--weight", "7"]);
    assert_eq!(
        (v["memory_limit"].as_u64(), v["weight"].as_u64()),
        (Some(256 * MIB), Some(7))
    );
    let p = d.vgpuctl_json(&["vm", "list"]);
    assert_eq!(p.as_array().map(Vec::len), Some(2));
    let o = d.vgpuctl(&["vm", "add", "k3", "--profile", "q3"]);
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains("defined profiles: q4"), "{o:?}");
    let o = d.vgpuctl(&["vm", "add", "k4"]);
    assert_eq!(o.code, 2, "--memory or --profile is needed: {o:?}");
}
