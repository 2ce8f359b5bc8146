//! Python packages running unmodified on vgpu's libcuda.so.1: cuda-python
//! (cuda.bindings, which resolves every driver function through
//! cuGetProcAddress_v2) with NVRTC-compiled CUDA C++, CuPy (NVIDIA's CUDA 12
//! runtime underneath, kernels compiled at run time) and numba-cuda (NVVM,
//! linked through the driver's cuLink* API), cuda.core's graph builder with conditional
//! nodes, pynvml (NVIDIA's NVML binding) on the shim's libnvidia-ml.so.1, a Python
//! program's threads, one waiting while another works and releases it, green contexts, and
//! PyTorch (its allocator, copies, graphs, IPC; its kernels need a real GPU). Skipped with a
//! message when the Python packages are not installed (scripts/prereqs.sh
//! installs them).

use std::ffi::OsStr;
use std::process::Command;

use vgpu_tests::harness::{TestVm, Vgpud, artifacts, cuda_guest, hold, workspace_root};
use vgpu_tests::qemu::{self, Guest};

/// Runs `tests/python/<script>` (with `args` and `env`) against a fresh vgpud with a VM `vm` of
/// `slice` bytes: it must print PASS, and the VM's memory must all come back once it exits.
/// `None` (with a message) when `probe` (Python code importing the packages) fails: they are not
/// installed. Returns the script's output.
fn runs_unmodified(
    probe: &str,
    packages: &str,
    (vm, slice): (&str, u64),
    script: &str,
    args: &[String],
    env: &[(&str, &OsStr)],
) -> Option<String> {
    let probed = Command::new("python3").args(["-c", probe]).output();
    if !probed.is_ok_and(|o| o.status.success()) {
        println!("SKIPPED: {packages} not installed; run scripts/prereqs.sh");
        return None;
    }
    Some(runs_on(
        &Vgpud::start(&[TestVm::new(vm, slice)]),
        vm,
        script,
        args,
        env,
    ))
}

/// Runs `tests/python/<script>` against `d`'s VM `vm`: it must print PASS, and the VM's memory
/// must all come back once it exits. Returns the script's output.
fn runs_on(d: &Vgpud, vm: &str, script: &str, args: &[String], env: &[(&str, &OsStr)]) -> String {
    runs_with(OsStr::new("python3"), d, vm, script, args, env)
}

/// [`runs_on`] with the interpreter `python`.
fn runs_with(
    python: &OsStr,
    d: &Vgpud,
    vm: &str,
    script: &str,
    args: &[String],
    env: &[(&str, &OsStr)],
) -> String {
    let out = Command::new(python)
        .arg(workspace_root().join("tests/python").join(script))
        .args(args)
        .env("VGPU_TRANSPORT", d.transport(vm))
        .env("LD_LIBRARY_PATH", &artifacts().lib_dir)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("PASS"),
        "{stdout}\n{stderr}\n{}",
        d.log()
    );
    d.wait_memory_used(vm, 0, std::time::Duration::from_secs(5));
    stdout.into_owned()
}

#[test]
fn a_cuda_python_program_runs_unmodified() {
    let out = runs_unmodified(
        "import cuda.bindings.driver, cuda.bindings.nvrtc",
        "cuda-python (cuda-bindings) is",
        ("py", 64 << 20),
        "nvrtc_axpy.py",
        &[],
        &[],
    );
    if let Some(stdout) = out {
        assert!(stdout.contains("slice 64 MiB"), "{stdout}");
    }
}

/// Dynamic parallelism and the device heap from cuda-python: NVRTC with `-rdc=true`, the
/// driver's linker with CUDA 12's `libcudadevrt.a`, kernels that launch kernels (nested to
/// CUDA's limit and refused past it) and `malloc` memory a child fills and another frees
/// (tests/python/dynamic_parallelism.py), and read a kernel's attributes, its occupancy and a
/// limit as the host does; the heap comes back with the VM's memory.
#[test]
fn cuda_python_kernels_launch_kernels_and_malloc() {
    let out = runs_unmodified(
        "import cuda.bindings.driver, cuda.bindings.nvrtc, nvidia.cuda_runtime",
        "cuda-python (cuda-bindings) and nvidia-cuda-runtime-cu12 are",
        ("cdp", 64 << 20),
        "dynamic_parallelism.py",
        &[],
        &[],
    );
    if let Some(stdout) = out {
        assert!(stdout.contains("10 checks"), "{stdout}");
    }
}

#[test]
fn cuda_core_graphs_with_conditional_nodes_run_unmodified() {
    runs_unmodified(
        "import cuda.core.graph, cuda.bindings.nvrtc",
        "cuda.core (cuda-core) is",
        ("core", 64 << 20),
        "cuda_core_graphs.py",
        &[],
        &[],
    );
}

/// A thread of a Python program waiting in `cuStreamSynchronize` does not stop the program's
/// other threads (tests/python/threads_sync.py, through cuda-python).
#[test]
fn a_python_threads_wait_does_not_stop_the_others() {
    runs_unmodified(
        "import cuda.bindings.driver",
        "cuda-python (cuda-bindings) is",
        ("threads", 64 << 20),
        "threads_sync.py",
        &[],
        &[],
    );
}

/// Green contexts through cuda-python and cuda.core, on a simulated GPU of 8 units: the
/// device's SMs split, green contexts of one SM (cuda.bindings) and of four (cuda.core's
/// `SMResource.split` and `Device.create_context`), and kernels on their streams that read
/// `%nsmid` 1 and 4 (the primary context's: 8) (tests/python/green_ctx.py).
#[test]
fn green_contexts_from_cuda_python_run_on_their_sms() {
    let probe = "import numpy, cuda.core, cuda.bindings.driver, cuda.bindings.nvrtc";
    if !Command::new("python3")
        .args(["-c", probe])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        println!("SKIPPED: cuda-python, cuda.core or numpy not installed; run scripts/prereqs.sh");
        return;
    }
    let d = Vgpud::start_config(
        &Vgpud::config_for(&[TestVm::new("green", 64 << 20)], "")
            .replace("workers = 2\n", "workers = 8\n"),
    );
    let out = runs_on(&d, "green", "green_ctx.py", &[], &[]);
    assert!(out.contains("cuda.core"), "{out}");
}

#[test]
fn pynvml_reports_the_vms_gpu_as_cuda_does() {
    const SLICE: u64 = 96 << 20;
    runs_unmodified(
        "import pynvml, cuda.bindings.driver",
        "pynvml (nvidia-ml-py) or cuda-python is",
        ("nvml", SLICE),
        "nvml_pynvml.py",
        &[SLICE.to_string()],
        &[],
    );
}

/// The GPU monitors tenants run, gpustat and nvitop (both on pynvml and the shim's
/// libnvidia-ml.so.1), show the VM's GPU: the slice as its memory and a process's allocation
/// against its PID, with no error (nvitop printed a traceback for `nvmlDeviceGetDriverModel`
/// before vgpu's NVML had every function of nvml.h).
#[test]
fn gpu_monitors_show_the_vms_slice_and_its_processes() {
    const SLICE_MIB: u64 = 64;
    const HELD_MIB: u64 = 8;
    let probed = Command::new("python3")
        .args(["-c", "import gpustat, nvitop"])
        .output();
    if !probed.is_ok_and(|o| o.status.success()) {
        println!("SKIPPED: gpustat or nvitop not installed; run scripts/prereqs.sh");
        return;
    }
    let d = Vgpud::start(&[TestVm::new("mon", SLICE_MIB << 20)]);
    let holder = hold(&d, "mon", HELD_MIB << 20);
    let pid = u64::from(holder.child.id());
    let run = |args: &[&str]| {
        let out = Command::new("python3")
            .args(args)
            .env("VGPU_TRANSPORT", d.transport("mon"))
            .env("LD_LIBRARY_PATH", &artifacts().lib_dir)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success() && !stderr.contains("Traceback") && !stdout.contains("Traceback"),
            "{args:?}:\n{stdout}\n{stderr}"
        );
        stdout
    };

    let json = run(&["-m", "gpustat", "--json"]);
    let report: serde_json::Value = serde_json::from_str(&json).expect("gpustat's JSON");
    let gpus = report["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 1, "{json}");
    assert_eq!(gpus[0]["memory.total"], SLICE_MIB, "{json}");
    assert_eq!(gpus[0]["memory.used"], HELD_MIB, "{json}");
    let processes = gpus[0]["processes"].as_array().expect("processes");
    assert!(
        processes
            .iter()
            .any(|p| p["pid"] == pid && p["gpu_memory_usage"] == HELD_MIB),
        "the holder {pid} with {HELD_MIB} MiB: {json}"
    );

    let screen = run(&["-m", "nvitop", "--once"]);
    assert!(
        screen.contains(&format!("{HELD_MIB}MiB / {SLICE_MIB}MiB"))
            || screen.contains(&format!("{HELD_MIB}.00MiB / {SLICE_MIB}.00MiB")),
        "nvitop shows the slice and what is held of it:\n{screen}"
    );
    assert!(
        screen.contains(&pid.to_string()),
        "nvitop lists the holder {pid}:\n{screen}"
    );
    drop(holder);
    d.wait_memory_used("mon", 0, std::time::Duration::from_secs(5));
}

#[test]
fn cupy_runs_unmodified() {
    const SLICE: u64 = 256 << 20;
    let cache = tempfile::tempdir().unwrap();
    // The simulated GPU runs PTX: NVRTC emits PTX. CuPy's CUB and Thrust modules carry PTX for
    // compute 10.0 only, which the simulated GPU runs (CUB is CuPy's default accelerator).
    runs_unmodified(
        "import cupy",
        "CuPy (cupy-cuda12x) is",
        ("cupy", SLICE),
        "cupy_basics.py",
        &[SLICE.to_string()],
        &[
            ("CUPY_COMPILE_WITH_PTX", OsStr::new("1")),
            ("CUPY_CACHE_DIR", cache.path().as_os_str()),
        ],
    );
}

#[test]
fn numba_cuda_runs_unmodified() {
    const SLICE: u64 = 128 << 20;
    let cache = tempfile::tempdir().unwrap();
    runs_unmodified(
        "import numba.cuda, cuda.core",
        "numba-cuda is",
        ("numba", SLICE),
        "numba_basics.py",
        &[SLICE.to_string()],
        &[("NUMBA_CACHE_DIR", cache.path().as_os_str())],
    );
}

/// numba-cuda's own tests of what it compiles (tests/python/numba_suite.py: its intrinsics,
/// dispatcher, device-function, debug-information and cooperative-groups modules, 200 tests)
/// pass unmodified. Before 2026-12-06, 87 of them failed: half-precision comparisons did not
/// load, a test overrunning 10-element arrays faulted and poisoned its context for 30 more,
/// C-ABI `void` functions and `.common` variables did not link, and 1024 grid barriers ran
/// into the watchdog.
#[test]
fn numba_cudas_own_tests_pass() {
    const SLICE: u64 = 256 << 20;
    let cache = tempfile::tempdir().unwrap();
    runs_unmodified(
        "import numba.cuda, cuda.core, pytest, filecheck",
        "numba-cuda, pytest or filecheck is",
        ("numba", SLICE),
        "numba_suite.py",
        &[],
        &[("NUMBA_CACHE_DIR", cache.path().as_os_str())],
    );
}

/// The Python of the virtual environment `scripts/prereqs.sh` installs PyTorch into
/// (`$VGPU_TORCH_VENV`, by default `~/.cache/vgpu/torch-venv`: PyTorch pins NVIDIA's CUDA 13
/// libraries, which the other packages' CUDA 12 ones must not meet), if it holds PyTorch.
fn torch_python() -> Option<std::path::PathBuf> {
    let venv = std::env::var_os("VGPU_TORCH_VENV")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| std::path::Path::new(&h).join(".cache/vgpu/torch-venv"))
        })?;
    let python = venv.join("bin/python");
    Command::new(&python)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success())
        .then_some(python)
}

/// PyTorch, unmodified (tests/python/torch_basics.py): the slice as its total memory, tensors
/// copied both ways (pinned too, on side streams, timed with events), a CUDA graph of copies,
/// the caching allocator running out at the slice with torch's own `OutOfMemoryError` and going
/// on, a memory fraction, a memory pool, an interprocess event, a tensor shared with a spawned
/// process and an NCCL process group of one rank (it failed while the GPU's PCI location named
/// the machine's host bridge); once with the default allocator and once with expandable segments (the driver's
/// virtual memory API, shared as file descriptors). Its kernels are SASS, so on the simulated
/// GPU a kernel fails with "no kernel image is available" and the rest goes on. Before vgpu
/// exported the `cuMulticast*` functions, its first CUDA tensor failed with "named symbol not
/// found" (its allocator resolves them when it starts).
#[test]
fn pytorch_runs_unmodified() {
    const SLICE: u64 = 512 << 20;
    let Some(python) = torch_python() else {
        println!(
            "SKIPPED: PyTorch is not installed in its virtual environment; run scripts/prereqs.sh"
        );
        return;
    };
    let d = Vgpud::start(&[TestVm::new("torch", SLICE)]);
    for conf in ["", "expandable_segments:True"] {
        let out = runs_with(
            python.as_os_str(),
            &d,
            "torch",
            "torch_basics.py",
            &[SLICE.to_string()],
            &[("PYTORCH_CUDA_ALLOC_CONF", OsStr::new(conf))],
        );
        let mode = if conf.is_empty() { "off" } else { "on" };
        assert!(
            out.contains(&format!("expandable segments {mode}")),
            "{out}"
        );
    }
}

/// CuPy, unmodified, in a real Linux guest under QEMU that installed the guest
/// shim: the host's Python and packages arrive on a read-only virtio disk
/// (tests/python/disk.sh) mounted at the same path, and the kernels CuPy
/// compiles run on vgpud's simulated GPU over the vsock device, with CuPy's default accelerators
/// (a sum runs its CUB module; a sort its Thrust module, sent in parts).
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
         export HOME=/tmp CUPY_CACHE_DIR=/tmp/cupy CUPY_COMPILE_WITH_PTX=1\n\
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
