//! cuda-python (cuda.bindings, which resolves every driver function through
//! cuGetProcAddress_v2) with NVRTC-compiled CUDA C++, running unmodified on
//! vgpu's libcuda.so.1. Skipped with a message when the Python packages are
//! not installed (scripts/prereqs.sh installs them).

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
