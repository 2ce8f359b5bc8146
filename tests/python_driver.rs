//! Python packages running unmodified on vgpu's libcuda.so.1: cuda-python
//! (cuda.bindings, which resolves every driver function through
//! cuGetProcAddress_v2) with NVRTC-compiled CUDA C++, CuPy (NVIDIA's CUDA 12
//! runtime underneath, kernels compiled at run time) and numba-cuda (NVVM,
//! linked through the driver's cuLink* API). Skipped with a
//! message when the Python packages are not installed (scripts/prereqs.sh
//! installs them).

use std::process::Command;

use vgpu_tests::harness::{TestVm, Vgpud, artifacts, workspace_root};

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
