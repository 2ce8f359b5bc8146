//! NVIDIA's CUDA runtime, unmodified, on vgpu's libcuda.so.1 against a real
//! vgpud on the simulated GPU: programs built with nvcc 11.8 (static and
//! shared cudart; `<<<>>>` launches, templates, shared memory, atomics,
//! streams, events, host callbacks) and a program linked against PyPI's
//! `libcudart.so.12` (CUDA 12.9: export tables, the integrity check,
//! context-local storage across `cudaDeviceReset`).
//!
//! nvcc comes from Debian's `nvidia-cuda-toolkit` and the CUDA 12 runtime
//! from PyPI, both installed by scripts/prereqs.sh; without them these tests
//! fail and say so.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use vgpu_tests::harness::{Run, TestVm, Vgpud, artifacts, run_with_shim, workspace_root};

const MIB: u64 = 1 << 20;

/// Builds tests/cuda/*.cu with nvcc once per test process.
fn nvcc_programs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let nvcc = Command::new("nvcc").arg("--version").output();
        assert!(
            nvcc.is_ok_and(|o| o.status.success()),
            "nvcc (CUDA 11.8, Debian's nvidia-cuda-toolkit) is not installed: run scripts/prereqs.sh"
        );
        let dir = artifacts().profile_dir.join("cuda-programs");
        let st = Command::new(workspace_root().join("tests/cuda/build.sh"))
            .arg(&dir)
            .status()
            .expect("running tests/cuda/build.sh");
        assert!(st.success(), "tests/cuda/build.sh failed");
        dir
    })
}

fn assert_passed(r: &Run, what: &str, min_checks: usize) {
    assert!(
        r.failures().is_empty() && r.code == 0,
        "{what}: exit {}\n{}\n{}",
        r.code,
        r.stdout,
        r.stderr
    );
    let checks = r.stdout.lines().filter(|l| l.starts_with("ok ")).count();
    assert!(
        checks >= min_checks,
        "{what}: only {checks} checks ran\n{}",
        r.stdout
    );
}

fn run_nvcc_program(name: &str, min_checks: usize) {
    let dir = nvcc_programs();
    let d = Vgpud::start(&[TestVm::new("vm1", 256 * MIB)]);
    for cudart in ["static", "shared"] {
        let prog = dir.join(format!("{name}.{cudart}"));
        let r = run_with_shim(&d, "vm1", &prog, &[]);
        assert_passed(&r, &format!("{name} (cudart {cudart})"), min_checks);
        // Everything the program held is back in the slice.
        d.wait_memory_used("vm1", 0, Duration::from_secs(5));
    }
}

#[test]
fn nvcc_programs_run_memory_and_errors() {
    run_nvcc_program("runtime_basics", 40);
}

#[test]
fn nvcc_programs_run_pools_managed_and_mapped_memory() {
    run_nvcc_program("alloc_api", 60);
}

#[test]
fn nvcc_programs_run_kernels() {
    run_nvcc_program("kernels", 20);
}

#[test]
fn nvcc_programs_run_streams_events_and_callbacks() {
    run_nvcc_program("streams", 30);
}

/// The directory of PyPI's CUDA 12 runtime (`nvidia-cuda-runtime-cu12`).
fn pypi_cudart12() -> PathBuf {
    let out = Command::new("python3")
        .args([
            "-c",
            "import nvidia.cuda_runtime as m; print(list(m.__path__)[0])",
        ])
        .output()
        .expect("running python3");
    assert!(
        out.status.success(),
        "PyPI's nvidia-cuda-runtime-cu12 is not installed: run scripts/prereqs.sh"
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

#[test]
fn a_program_linked_against_cuda_12_runtime_runs() {
    let rt = pypi_cudart12();
    let a = artifacts();
    let prog = a.profile_dir.join("c-runtime_api");
    let st = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&prog)
        .arg(workspace_root().join("tests/c/runtime_api.c"))
        .arg(format!("-I{}", rt.join("include").display()))
        .arg(format!("-L{}", rt.join("lib").display()))
        .arg("-l:libcudart.so.12")
        .arg(format!("-Wl,-rpath,{}", rt.join("lib").display()))
        .status()
        .expect("running cc");
    assert!(st.success(), "building tests/c/runtime_api.c failed");
    let d = Vgpud::start(&[TestVm::new("vm1", 96 * MIB)]);
    let r = run_with_shim(&d, "vm1", &prog, &[]);
    assert_passed(&r, "runtime_api (libcudart.so.12)", 35);
    assert!(
        r.stdout.contains(&format!("total {}", 96 * MIB)),
        "the runtime sees the VM's slice: {}",
        r.stdout
    );
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}
