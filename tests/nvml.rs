//! NVML in the guest: programs built against NVIDIA's nvml.h and linked with `-lnvidia-ml` get
//! the VM's GPU from vgpu's `libnvidia-ml.so.1` (a filter library whose symbols resolve in the
//! shim), with the same answers as CUDA's (tests/c/nvml.c). pynvml, NVIDIA's Python binding, is
//! in tests/python_driver.rs.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use vgpu_tests::harness::{
    TestVm, Vgpud, artifacts, build_c_program_linking, cuda_guest, headers, pypi_nvidia_package,
    run_against, workspace_root,
};
use vgpu_tests::qemu::{self, Guest};

const MIB: u64 = 1 << 20;
/// NVIDIA's header, from Debian's CUDA toolkit (scripts/prereqs.sh installs it).
const NVML_HEADER: &str = "/usr/include/nvml.h";
/// The spin kernel's first loop count in tests/c/nvml.c (it makes the kernel longer until one
/// outlasts its measuring window).
const SPIN_ITERS: &str = "100000";

fn nvml_program() -> Option<std::path::PathBuf> {
    if !Path::new(NVML_HEADER).exists() {
        println!(
            "SKIPPED: {NVML_HEADER} is not installed (Debian's nvidia-cuda-toolkit; run scripts/prereqs.sh)"
        );
        return None;
    }
    Some(build_c_program_linking("nvml", &["nvidia-ml"]))
}

#[test]
fn nvml_reports_the_vms_gpu_slice_processes_and_utilization() {
    let Some(prog) = nvml_program() else { return };
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    let spin = workspace_root().join("bench/kernels/spin.ptx");
    let r = run_against(&d, "vm1", &prog, &[spin.to_str().unwrap(), SPIN_ITERS]);
    r.assert_passed(&d);
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}

#[test]
fn without_vgpud_nvml_init_reports_the_driver_not_loaded() {
    let Some(prog) = nvml_program() else { return };
    let out = Command::new(prog)
        .arg("nodaemon")
        .env("VGPU_TRANSPORT", "unix:/nonexistent/vgpu.sock")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("ok nvmlInit without vgpud"), "{stdout}");
}

/// The names of the `nvml*` functions `lib` defines in its dynamic symbol table (`nm -D`).
fn nvml_symbols(lib: &Path) -> Vec<String> {
    let mut names: Vec<String> = headers::exported_symbols(lib)
        .into_iter()
        .filter(|n| n.starts_with("nvml"))
        .collect();
    names.sort();
    names
}

#[test]
fn the_nvml_library_is_a_filter_of_the_shim_with_every_entry_point() {
    let a = artifacts();
    let filter = a.lib_dir.join("libnvidia-ml.so.1");
    let dynamic = Command::new("readelf")
        .arg("-d")
        .arg(&filter)
        .output()
        .expect("running readelf (binutils)");
    let dynamic = String::from_utf8_lossy(&dynamic.stdout);
    assert!(
        dynamic.contains("Library soname: [libnvidia-ml.so.1]"),
        "{dynamic}"
    );
    assert!(
        dynamic.contains("Filter library: [libcuda.so.1]"),
        "{dynamic}"
    );
    let shim = nvml_symbols(&a.lib_dir.join("libcuda.so.1"));
    let listed: Vec<String> =
        std::fs::read_to_string(workspace_root().join("guest-shim/src/nvml/entry_points.txt"))
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("nvml"))
            .map(str::to_string)
            .collect();
    assert!(shim.len() >= 50, "{shim:?}");
    assert_eq!(
        listed, shim,
        "guest-shim/src/nvml/entry_points.txt must list exactly the shim's NVML exports"
    );
    assert_eq!(
        nvml_symbols(&filter),
        shim,
        "the filter's symbols are the shim's"
    );
}

/// How nvml.h declares a function.
const NVML_DECLARATION: &str = "nvmlReturn_t DECLDIR ";

/// A program compiled against NVML's headers, Debian's (CUDA 11.8's) or PyPI's
/// `nvidia-nvml-dev-cu12` (CUDA 12.9's) and `nvidia-nvml-dev` (CUDA 13.5's), links against vgpu's
/// `libnvidia-ml.so.1` whichever of their functions it calls (before, 103 of 438 were there and
/// such a program did not start;
/// pynvml raised `FunctionNotFound`, which nvitop printed as a traceback). What the new ones
/// answer is in tests/c/nvml.c and guest-shim/src/nvml/rest.rs.
#[test]
fn every_function_of_nvmls_headers_links_against_vgpus_nvml() {
    if !Path::new(NVML_HEADER).exists() {
        println!("SKIPPED: {NVML_HEADER} is not installed (run scripts/prereqs.sh)");
        return;
    }
    let exported = headers::exported_symbols(&artifacts().lib_dir.join("libnvidia-ml.so.1"));
    let includes = [
        Path::new(NVML_HEADER).parent().unwrap().to_path_buf(),
        pypi_nvidia_package("nvml_dev").join("include"),
        pypi_nvidia_package("cu13").join("include"),
    ];
    for include in includes {
        let declared = headers::declared_functions(&include, &["nvml.h"], NVML_DECLARATION);
        assert!(declared.len() > 250, "{}: {declared:?}", include.display());
        let missing = headers::missing(
            headers::linked_symbols(&include, &["nvml.h"], &declared, &[]),
            &exported,
        );
        assert!(
            missing.is_empty(),
            "{}: {} functions its nvml.h declares are not exported: {missing:?}",
            include.display(),
            missing.len()
        );
        println!(
            "{}: {} functions declared, each exported",
            include.display(),
            declared.len()
        );
    }
}

/// Every NVML function pynvml (nvidia-ml-py 13.580, which scripts/prereqs.sh installs) resolves
/// is in vgpu's library, so none raises `NVMLError_FunctionNotFound` (pynvml resolves each at its
/// first call; monitors like nvitop printed a traceback for a missing one).
#[test]
fn every_function_pynvml_resolves_is_in_vgpus_nvml() {
    let out = Command::new("python3")
        .args(["-c", "import pynvml; print(pynvml.__file__)"])
        .output()
        .expect("running python3");
    if !out.status.success() {
        println!("SKIPPED: pynvml (nvidia-ml-py) is not installed (run scripts/prereqs.sh)");
        return;
    }
    let source = std::fs::read_to_string(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    const LOOKUP: &str = "_nvmlGetFunctionPointer(\"";
    let mut wanted: Vec<&str> = source
        .match_indices(LOOKUP)
        .filter_map(|(at, _)| source[at + LOOKUP.len()..].split('"').next())
        .filter(|n| n.starts_with("nvml"))
        .collect();
    wanted.sort_unstable();
    wanted.dedup();
    assert!(wanted.len() > 300, "{wanted:?}");
    let exported = headers::exported_symbols(&artifacts().lib_dir.join("libnvidia-ml.so.1"));
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|n| !exported.contains(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of pynvml's {} functions are missing: {missing:?}",
        missing.len(),
        wanted.len()
    );
}

/// In a real Linux guest under QEMU, after `guest-shim/install.sh`, a program linked with
/// `-lnvidia-ml` finds vgpu's NVML library through the loader cache (as on any machine, no
/// `LD_LIBRARY_PATH`) and gets the VM's GPU over the vsock device; `nvidia-smi` queries answer
/// too (vgpu-smi under that name).
#[test]
fn a_guest_program_finds_nvml_through_the_loader_cache() {
    const GUEST_CID: u64 = 3;
    const GUEST_TIMEOUT: Duration = Duration::from_secs(240);
    if let Some(reason) = qemu::skip_reason() {
        println!("SKIPPED: cannot boot QEMU guests here: {reason}");
        return;
    }
    if !Path::new(NVML_HEADER).exists() {
        println!("SKIPPED: {NVML_HEADER} is not installed (run scripts/prereqs.sh)");
        return;
    }
    let a = artifacts();
    let libs: Vec<std::ffi::OsString> = vec![
        "-L".into(),
        a.lib_dir.clone().into_os_string(),
        "-lnvidia-ml".into(),
        "-lcuda".into(),
    ];
    let flags: Vec<std::ffi::OsString> = vec!["-O2".into(), "-Wall".into(), "-Werror".into()];
    let program = qemu::build_guest_program_from(
        &workspace_root().join("tests/c/nvml.c"),
        "nvml",
        &flags,
        &libs,
    )
    .expect("building tests/c/nvml.c for guests");
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB).vsock(GUEST_CID)]);
    let body = format!(
        "ldconfig -p | grep 'libnvidia-ml'\n\
         nvidia-smi --query-gpu=name,memory.total --format=csv,noheader\n\
         nvml /payload/spin.ptx {SPIN_ITERS}\n\
         echo \"nvml status $?\"\n"
    );
    let mut spec = cuda_guest(
        &d,
        "vm1",
        "nvml",
        &[program],
        &[(
            workspace_root().join("bench/kernels/spin.ptx"),
            "/payload/spin.ptx",
        )],
        &body,
    );
    spec.timeout = GUEST_TIMEOUT;
    let mut guest = d.guest_ok(Guest::boot(&spec), "boot");
    let outcome = d.guest_ok(guest.wait_exit(GUEST_TIMEOUT), "guest run");
    let out = outcome.output_text();
    for line in [
        "vgpu-install: installed: /usr/local/lib/libnvidia-ml.so.1",
        "vgpu-install: linked: /usr/local/lib/libnvidia-ml.so -> libnvidia-ml.so.1",
        "libnvidia-ml.so.1 (libc6,x86-64) => /usr/local/lib/libnvidia-ml.so.1",
        "vgpu-install: linked: /usr/local/bin/nvidia-smi -> vgpu-smi",
        "vgpu Simulated GPU, 64 MiB",
        "nvml status 0",
    ] {
        assert!(
            out.contains(line),
            "missing `{line}` in:\n{out}\n{}",
            d.log()
        );
    }
    assert!(!out.contains("FAIL"), "{out}");
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}
