//! `guest-shim/install.sh` run on this host into a scratch root (`--root`):
//! what it installs, that a second run changes nothing, that it never
//! clobbers another driver's `libcuda.so.1`, uninstall, and its argument
//! errors. Runs under `dash` (a strict POSIX sh) when available. The QEMU
//! tests (`vm_workload` and the others) run it for real inside busybox guests.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use vgpu_tests::harness::{artifacts, workspace_root};

const FOREIGN: &[u8] = b"\x7fELF not vgpu: NVIDIA libcuda";

fn shell() -> &'static str {
    if Path::new("/usr/bin/dash").exists() || Path::new("/bin/dash").exists() {
        "dash"
    } else {
        "sh"
    }
}

/// A directory with the files install.sh installs (as built by cargo).
fn bundle() -> (tempfile::TempDir, PathBuf) {
    let a = artifacts();
    let dir = tempfile::tempdir().expect("tempdir");
    let from = dir.path().join("bundle");
    fs::create_dir(&from).expect("mkdir");
    fs::copy(a.profile_dir.join("libcuda.so"), from.join("libcuda.so")).expect("copy shim");
    fs::copy(
        a.profile_dir.join("libnvidia_ml.so"),
        from.join("libnvidia_ml.so"),
    )
    .expect("copy the NVML library");
    fs::copy(&a.vgpu_smi, from.join("vgpu-smi")).expect("copy vgpu-smi");
    (dir, from)
}

fn install(args: &[&str]) -> (i32, String) {
    let out = Command::new(shell())
        .arg(workspace_root().join("guest-shim/install.sh"))
        .args(args)
        .output()
        .expect("running install.sh");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn install_fills_a_root_idempotently_and_uninstall_removes_it() {
    let (tmp, from) = bundle();
    let root = tmp.path().join("root");
    fs::create_dir(&root).unwrap();
    let (code, out) = install(&["--from", s(&from), "--root", s(&root)]);
    assert_eq!(code, 0, "{out}");
    let lib = root.join("usr/local/lib/libcuda.so.1");
    assert_eq!(
        fs::read(&lib).unwrap(),
        fs::read(from.join("libcuda.so")).unwrap()
    );
    assert_eq!(
        fs::read_link(root.join("usr/local/lib/libcuda.so")).unwrap(),
        Path::new("libcuda.so.1")
    );
    assert_eq!(
        fs::read(root.join("usr/local/lib/libnvidia-ml.so.1")).unwrap(),
        fs::read(from.join("libnvidia_ml.so")).unwrap()
    );
    assert_eq!(
        fs::read_link(root.join("usr/local/lib/libnvidia-ml.so")).unwrap(),
        Path::new("libnvidia-ml.so.1")
    );
    assert_eq!(
        fs::read_link(root.join("usr/local/bin/nvidia-smi")).unwrap(),
        Path::new("vgpu-smi"),
        "scripts that call nvidia-smi get vgpu-smi"
    );
    let smi = root.join("usr/local/bin/vgpu-smi");
    assert_eq!(
        fs::metadata(&smi).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let ld = fs::read_to_string(root.join("etc/ld.so.conf.d/vgpu.conf")).unwrap();
    assert!(ld.lines().any(|l| l == "/usr/local/lib"), "{ld}");
    let modules = fs::read_to_string(root.join("etc/modules-load.d/vgpu.conf")).unwrap();
    assert!(
        modules.lines().any(|l| l == "vmw_vsock_virtio_transport"),
        "{modules}"
    );
    assert!(
        out.contains("installed: /usr/local/lib/libcuda.so.1"),
        "{out}"
    );
    assert!(out.contains("not running ldconfig for --root"), "{out}");

    let mtime = fs::metadata(&lib).unwrap().modified().unwrap();
    let (code, out) = install(&["--from", s(&from), "--root", s(&root)]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("up to date: /usr/local/lib/libcuda.so.1"),
        "{out}"
    );
    assert!(out.contains("done: everything was up to date"), "{out}");
    assert!(!out.contains("installed:"), "{out}");
    assert_eq!(fs::metadata(&lib).unwrap().modified().unwrap(), mtime);

    let (code, out) = install(&["--root", s(&root), "--uninstall"]);
    assert_eq!(code, 0, "{out}");
    for gone in [
        "usr/local/lib/libcuda.so.1",
        "usr/local/lib/libcuda.so",
        "usr/local/lib/libnvidia-ml.so.1",
        "usr/local/lib/libnvidia-ml.so",
        "usr/local/bin/vgpu-smi",
        "usr/local/bin/nvidia-smi",
        "etc/ld.so.conf.d/vgpu.conf",
        "etc/modules-load.d/vgpu.conf",
    ] {
        assert!(
            fs::symlink_metadata(root.join(gone)).is_err(),
            "{gone} left behind: {out}"
        );
    }
    assert!(out.contains("uninstalled (8 files)"), "{out}");
    let (code, out) = install(&["--root", s(&root), "--uninstall"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("nothing to remove"), "{out}");
}

#[test]
fn another_drivers_libcuda_is_never_replaced_silently() {
    let (tmp, from) = bundle();
    let root = tmp.path().join("root");
    let lib = root.join("usr/local/lib/libcuda.so.1");
    fs::create_dir_all(lib.parent().unwrap()).unwrap();
    fs::write(&lib, FOREIGN).unwrap();
    let (code, out) = install(&["--from", s(&from), "--root", s(&root)]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("is not vgpu's shim"), "{out}");
    assert!(out.contains("--force"), "{out}");
    assert_eq!(fs::read(&lib).unwrap(), FOREIGN, "left alone");

    // Uninstall keeps what is not ours.
    let (code, out) = install(&["--root", s(&root), "--uninstall"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("is not vgpu's shim; left in place"), "{out}");
    assert_eq!(fs::read(&lib).unwrap(), FOREIGN);

    let (code, out) = install(&["--from", s(&from), "--root", s(&root), "--force"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("warning: replacing /usr/local/lib/libcuda.so.1"),
        "{out}"
    );
    assert_eq!(
        fs::read(&lib).unwrap(),
        fs::read(from.join("libcuda.so")).unwrap()
    );
}

#[test]
fn an_nvidia_smi_that_is_not_vgpus_is_left_alone() {
    let (tmp, from) = bundle();
    let root = tmp.path().join("root");
    let theirs = root.join("usr/local/bin/nvidia-smi");
    fs::create_dir_all(theirs.parent().unwrap()).unwrap();
    fs::write(&theirs, FOREIGN).unwrap();
    let (code, out) = install(&["--from", s(&from), "--root", s(&root)]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("/usr/local/bin/nvidia-smi is not vgpu's; left in place"),
        "{out}"
    );
    assert_eq!(fs::read(&theirs).unwrap(), FOREIGN);
    let (code, out) = install(&["--root", s(&root), "--uninstall"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        fs::read(&theirs).unwrap(),
        FOREIGN,
        "uninstall keeps it: {out}"
    );
}

#[test]
fn another_drivers_nvml_is_never_replaced_silently() {
    let (tmp, from) = bundle();
    let root = tmp.path().join("root");
    let nvml = root.join("usr/local/lib/libnvidia-ml.so.1");
    fs::create_dir_all(nvml.parent().unwrap()).unwrap();
    fs::write(&nvml, FOREIGN).unwrap();
    let (code, out) = install(&["--from", s(&from), "--root", s(&root)]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("/usr/local/lib/libnvidia-ml.so.1 exists and is not vgpu's shim"),
        "{out}"
    );
    assert_eq!(fs::read(&nvml).unwrap(), FOREIGN, "left alone");
    assert!(
        !root.join("usr/local/lib/libcuda.so.1").exists(),
        "nothing is installed halfway: {out}"
    );
    let (code, out) = install(&["--from", s(&from), "--root", s(&root), "--force"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("warning: replacing /usr/local/lib/libnvidia-ml.so.1"),
        "{out}"
    );
    assert_eq!(
        fs::read(&nvml).unwrap(),
        fs::read(from.join("libnvidia_ml.so")).unwrap(),
        "{out}"
    );
}

#[test]
fn a_default_loader_directory_needs_no_ld_so_conf_entry_and_prefix_moves_everything() {
    let (tmp, from) = bundle();
    let root = tmp.path().join("root");
    fs::create_dir(&root).unwrap();
    let (code, out) = install(&[
        "--from",
        s(&from),
        "--root",
        s(&root),
        "--libdir",
        "/usr/lib/x86_64-linux-gnu",
        "--prefix",
        "/opt/vgpu",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(root.join("usr/lib/x86_64-linux-gnu/libcuda.so.1").is_file());
    assert!(root.join("opt/vgpu/bin/vgpu-smi").is_file());
    assert!(!root.join("etc/ld.so.conf.d/vgpu.conf").exists(), "{out}");
    assert!(out.contains("is a default loader directory"), "{out}");
}

#[test]
fn bad_arguments_and_sources_get_clear_errors() {
    let (tmp, from) = bundle();
    let root = tmp.path().join("root");
    fs::create_dir(&root).unwrap();
    let (code, out) = install(&["--bogus"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("unknown argument '--bogus'"), "{out}");
    let (code, out) = install(&["--prefix", "relative/dir", "--root", s(&root)]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("is not an absolute path"), "{out}");
    let (code, out) = install(&["--prefix"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("--prefix needs a value"), "{out}");
    let (code, out) = install(&["--help"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("--uninstall"), "{out}");

    let empty = tmp.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let (code, out) = install(&["--from", s(&empty), "--root", s(&root)]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("no libcuda.so.1 or libcuda.so in"), "{out}");
    let shim = fs::read(from.join("libcuda.so")).unwrap();
    fs::write(from.join("libcuda.so"), FOREIGN).unwrap();
    let (code, out) = install(&["--from", s(&from), "--root", s(&root)]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("is not the vgpu guest shim"), "{out}");
    fs::write(from.join("libcuda.so"), shim).unwrap();
    fs::write(from.join("libnvidia_ml.so"), FOREIGN).unwrap();
    let (code, out) = install(&["--from", s(&from), "--root", s(&root)]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("is not vgpu's NVML library"), "{out}");
    fs::remove_file(from.join("libnvidia_ml.so")).unwrap();
    let (code, out) = install(&["--from", s(&from), "--root", s(&root)]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("no libnvidia-ml.so.1 or libnvidia_ml.so in"),
        "{out}"
    );
    let (code, out) = install(&["--from", "/nonexistent", "--root", s(&root)]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("is not a directory"), "{out}");
    assert_eq!(
        fs::read_dir(&root).unwrap().count(),
        0,
        "nothing was written on errors"
    );
}
