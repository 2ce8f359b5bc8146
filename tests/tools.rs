//! vgpu-smi (in the guest) and vgpuctl (on the host) against a running vgpud.

use std::process::Command;

use vgpu_tests::harness::{TestVm, Vgpud, artifacts, hold, run_against};

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

/// vgpu-smi run with `args` against VM `vm` of `d`: (exit code, stdout, stderr).
fn vgpu_smi(d: &Vgpud, vm: &str, args: &[&str]) -> (i32, String, String) {
    let r = run_against(d, vm, &artifacts().vgpu_smi, args);
    (r.code, r.stdout, r.stderr)
}

#[test]
fn vgpu_smi_answers_nvidia_smis_queries_for_scripts() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 32 * MIB)]);
    let held = hold(&d, "vm1", 8 * MIB);
    let _other = hold(&d, "vm2", 4 * MIB);
    let (code, out, err) = vgpu_smi(
        &d,
        "vm1",
        &[
            "--query-gpu=name,memory.total,memory.used,memory.free,utilization.gpu,temperature.gpu",
            "--format=csv,noheader,nounits",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "vgpu Simulated GPU, 64, 8, 56, 0, [N/A]\n");
    let (code, out, err) = vgpu_smi(
        &d,
        "vm1",
        &["--query-gpu=memory.used,pci.bus_id", "--format=csv"],
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "memory.used [MiB], pci.bus_id", "{out}");
    // nvidia-smi's eight-digit domain; the location names no PCI function (docs/guest.md).
    assert_eq!(lines[1], "8 MiB, 0000FFFF:00:00.0", "{out}");

    // This VM's processes only, each once.
    let (code, out, err) = vgpu_smi(
        &d,
        "vm1",
        &[
            "--query-compute-apps=pid,process_name,used_memory",
            "--format=csv,noheader",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!("{}, c-driver_api, 8 MiB\n", held.child.id()),
        "vgpu-smi's own session has no context and is not listed"
    );

    let (code, out, _) = vgpu_smi(&d, "vm2", &["-L"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("GPU 0: vgpu Simulated GPU (UUID: GPU-") && out.lines().count() == 1,
        "{out}"
    );
    let uuid = out
        .trim_end()
        .trim_end_matches(')')
        .rsplit(' ')
        .next()
        .unwrap()
        .to_string();
    let (code, out, _) = vgpu_smi(
        &d,
        "vm2",
        &[
            "-i",
            &uuid,
            "--query-gpu=memory.used",
            "--format=csv,noheader",
        ],
    );
    assert_eq!((code, out.as_str()), (0, "4 MiB\n"));

    // Errors as nvidia-smi gives them.
    let (code, out, _) = vgpu_smi(&d, "vm1", &["-i", "1", "-L"]);
    assert_eq!((code, out.as_str()), (6, "No devices were found\n"));
    let (code, _, err) = vgpu_smi(&d, "vm1", &["--query-gpu=name,bogus", "--format=csv"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("Field \"bogus\" is not a valid field to query."),
        "{err}"
    );
    let (code, _, err) = vgpu_smi(&d, "vm1", &["--query-gpu=name"]);
    assert_eq!(code, 2, "--format is required: {err}");
    let (code, _, err) = vgpu_smi(&d, "vm1", &["--query-gpu=name", "--format=xml"]);
    assert_eq!(code, 2, "{err}");
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
    let out = Command::new(&artifacts().vgpu_smi)
        .args(["--query-gpu=name", "--format=csv"])
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

/// vgpud with a `kind = "cuda"` device on a host without a usable GPU (this
/// kind of machine: no NVIDIA library, or NVIDIA's user-space libraries from
/// the CUDA toolkit without the kernel driver) exits with a message that says
/// what to check, never a bare CUresult.
#[test]
fn vgpud_without_a_gpu_says_what_to_check() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("vgpud.toml");
    std::fs::write(
        &config,
        format!(
            "[admin]\nsocket = \"{}\"\n\n[[device]]\nname = \"gpu0\"\nkind = \"cuda\"\nindex = 0\n\n[[vm]]\nname = \"vm1\"\ndevice = \"gpu0\"\nmemory = \"1GiB\"\nunix_socket = \"{}\"\n",
            dir.path().join("admin.sock").display(),
            dir.path().join("vm1.sock").display()
        ),
    )
    .unwrap();
    let mut child = Command::new(&artifacts().vgpud)
        .arg("--config")
        .arg(&config)
        .env_remove("LD_LIBRARY_PATH")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A host with a GPU keeps vgpud running: stop it and skip.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let Some(status) = status else {
        println!("SKIPPED: this host has a usable NVIDIA GPU");
        return;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    println!("{stderr}");
    let no_library = stderr.contains("no NVIDIA driver found");
    let no_gpu = stderr.contains("cuInit failed with")
        && stderr.contains("nvidia-smi")
        && stderr.contains("kernel driver");
    assert!(no_library || no_gpu, "{stderr}");
}
