//! Python packages running unmodified on vgpu's libcuda.so.1: cuda-python
//! (cuda.bindings, which resolves every driver function through
//! cuGetProcAddress_v2) with NVRTC-compiled CUDA C++, CuPy (NVIDIA's CUDA 12
//! runtime underneath, kernels compiled at run time) and numba-cuda (NVVM,
//! linked through the driver's cuLink* API), and cuda.core's graph builder with conditional
//! nodes. Skipped with a
//! message when the Python packages are not installed (scripts/prereqs.sh
//! installs them).

use std::process::Command;

use vgpu_tests::harness::{TestVm, Vgpud, artifacts, cuda_guest, workspace_root};
use vgpu_tests::qemu::{self, Guest};

#[test]
fn a_cuda_python_program_runs_unmodified() {
    let probe = Command::new("python3")
        .args(["-c", "import cuda.bindings.driver, cuda.bindings.nvrtc"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        println!("SKIPPED: cuda-python (cuda-bindings) is not installed; run scripts/prereqs.sh");
        return;
    }
    let d = Vgpud::start(&[TestVm::new("py", 64 << 20)]);
    let out = Command::new("python3")
        .arg(workspace_root().join("tests/python/nvrtc_axpy.py"))
        .env("VGPU_TRANSPORT", d.transport("py"))
        .env("LD_LIBRARY_PATH", &artifacts().lib_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("PASS"),
        "{stdout}\n{stderr}\n{}",
        d.log()
    );
    assert!(stdout.contains("slice 64 MiB"), "{stdout}");
}

#[test]
fn cuda_core_graphs_with_conditional_nodes_run_unmodified() {
    let probe = Command::new("python3")
        .args(["-c", "import cuda.core.graph, cuda.bindings.nvrtc"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        println!("SKIPPED: cuda.core (cuda-core) is not installed; run scripts/prereqs.sh");
        return;
    }
    let d = Vgpud::start(&[TestVm::new("core", 64 << 20)]);
    let out = Command::new("python3")
        .arg(workspace_root().join("tests/python/cuda_core_graphs.py"))
        .env("VGPU_TRANSPORT", d.transport("core"))
        .env("LD_LIBRARY_PATH", &artifacts().lib_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("PASS"),
        "{stdout}\n{stderr}\n{}",
        d.log()
    );
    d.wait_memory_used("core", 0, std::time::Duration::from_secs(5));
}

#[test]
fn cupy_runs_unmodified() {
    let probe = Command::new("python3").args(["-c", "import cupy"]).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        println!("SKIPPED: CuPy (cupy-cuda12x) is not installed; run scripts/prereqs.sh");
        return;
    }
    const SLICE: u64 = 256 << 20;
    let d = Vgpud::start(&[TestVm::new("cupy", SLICE)]);
    let cache = tempfile::tempdir().unwrap();
    let out = Command::new("python3")
        .arg(workspace_root().join("tests/python/cupy_basics.py"))
        .arg(SLICE.to_string())
        .env("VGPU_TRANSPORT", d.transport("cupy"))
        .env("LD_LIBRARY_PATH", &artifacts().lib_dir)
        // The simulated GPU runs PTX: NVRTC emits PTX, and CuPy's own
        // reduction kernels stand in for CUB's (cubins only).
        .env("CUPY_COMPILE_WITH_PTX", "1")
        .env("CUPY_ACCELERATORS", "")
        .env("CUPY_CACHE_DIR", cache.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("PASS"),
        "{stdout}\n{stderr}\n{}",
        d.log()
    );
    d.wait_memory_used("cupy", 0, std::time::Duration::from_secs(5));
}

#[test]
fn numba_cuda_runs_unmodified() {
    let probe = Command::new("python3")
        .args(["-c", "import numba.cuda, cuda.core"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        println!("SKIPPED: numba-cuda is not installed; run scripts/prereqs.sh");
        return;
    }
    const SLICE: u64 = 128 << 20;
    let d = Vgpud::start(&[TestVm::new("numba", SLICE)]);
    let cache = tempfile::tempdir().unwrap();
    let out = Command::new("python3")
        .arg(workspace_root().join("tests/python/numba_basics.py"))
        .arg(SLICE.to_string())
        .env("VGPU_TRANSPORT", d.transport("numba"))
        .env("LD_LIBRARY_PATH", &artifacts().lib_dir)
        .env("NUMBA_CACHE_DIR", cache.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("PASS"),
        "{stdout}\n{stderr}\n{}",
        d.log()
    );
    d.wait_memory_used("numba", 0, std::time::Duration::from_secs(5));
}

/// CuPy, unmodified, in a real Linux guest under QEMU that installed the guest
/// shim: the host's Python and packages arrive on a read-only virtio disk
/// (tests/python/disk.sh) mounted at the same path, and the kernels CuPy
/// compiles run on vgpud's simulated GPU over the vsock device.
#[test]
fn cupy_runs_unmodified_in_a_qemu_guest() {
    if let Some(reason) = qemu::skip_reason() {
        println!("SKIPPED: cannot boot QEMU guests here: {reason}");
        return;
    }
    let probe = Command::new("python3")
        .args(["-c", "import cupy, sys; print(sys.prefix)"])
        .output();
    let Some(prefix) = probe
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    else {
        println!("SKIPPED: CuPy (cupy-cuda12x) is not installed; run scripts/prereqs.sh");
        return;
    };
    const GUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);
    let disk = qemu::out_dir().join("python-cupy.img");
    let st = Command::new(workspace_root().join("tests/python/disk.sh"))
        .arg(&disk)
        .args([
            "cupy",
            "cupy_backends",
            "cupyx",
            "numpy",
            "numpy.libs",
            "cuda/pathfinder",
            "nvidia/cuda_nvrtc",
            "nvidia/cuda_runtime",
        ])
        .status()
        .unwrap();
    assert!(st.success(), "tests/python/disk.sh failed");
    let d = Vgpud::start(&[TestVm::new("vm1", 256 << 20).vsock(3)]);
    let body = format!(
        "mkdir -p {prefix} && mount -t ext4 -o ro /dev/vda {prefix} || exit 93\n\
         export HOME=/tmp CUPY_CACHE_DIR=/tmp/cupy CUPY_COMPILE_WITH_PTX=1 CUPY_ACCELERATORS=\n\
         export LD_LIBRARY_PATH={prefix}/lib-extra\n\
         {prefix}/bin/python3 /payload/cupy_guest.py\n\
         echo \"cupy status $?\"\n"
    );
    let script = workspace_root().join("tests/python/cupy_guest.py");
    let mut spec = cuda_guest(
        &d,
        "vm1",
        "vm-cupy",
        &[],
        &[(script, "/payload/cupy_guest.py")],
        &body,
    );
    spec.memory_mib = 1024;
    spec.timeout = GUEST_TIMEOUT;
    spec.extra_args.extend([
        "-drive".to_string(),
        format!("file={},format=raw,if=virtio,readonly=on", disk.display()),
    ]);
    let mut guest = d.guest_ok(Guest::boot(&spec), "boot");
    let outcome = d.guest_ok(guest.wait_exit(GUEST_TIMEOUT), "guest run");
    let out = outcome.output_text();
    assert!(
        out.contains("cupy status 0") && out.contains("PASS"),
        "{out}\nvgpud log:\n{}",
        d.log()
    );
    d.wait_memory_used("vm1", 0, std::time::Duration::from_secs(10));
}
