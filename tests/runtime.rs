//! NVIDIA's CUDA runtime, unmodified, on vgpu's libcuda.so.1 against a real
//! vgpud on the simulated GPU: programs built with nvcc 11.8 (static and
//! shared cudart; `<<<>>>` launches, templates, shared memory, atomics,
//! streams, events, host callbacks), the same programs linked against PyPI's
//! `libcudart.so.12` and `libcudart.so.13` (CUDA 12.9 and 13.5 load fat
//! binaries as libraries), and a C program linked against each (export
//! tables, the integrity check, context-local storage across
//! `cudaDeviceReset`).
//!
//! nvcc comes from Debian's `nvidia-cuda-toolkit` and the CUDA 12 runtime
//! from PyPI, both installed by scripts/prereqs.sh; without them these tests
//! fail and say so.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use vgpu_tests::harness::{
    Run, TestVm, Vgpud, artifacts, build_c_program, cuda_guest, headers, pypi_nvidia_package,
    run_with_shim, workspace_root,
};
use vgpu_tests::qemu::{self, Guest};

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
            .env("CUDA_VARIANTS", "static shared cudart12 cudart13")
            .env("CUDART12_DIR", pypi_cudart(12))
            .env("CUDART13_DIR", pypi_cudart(13))
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

/// Every runtime a program runs on: nvcc 11.8's static and shared cudart,
/// and CUDA 12's and 13's shared runtimes.
const ALL_RUNTIMES: &[&str] = &["static", "shared", "cudart12", "cudart13"];

fn run_nvcc_program(name: &str, min_checks: usize, runtimes: &[&str]) {
    let dir = nvcc_programs();
    let d = Vgpud::start(&[TestVm::new("vm1", 256 * MIB)]);
    for &cudart in runtimes {
        let prog = dir.join(format!("{name}.{cudart}"));
        let r = run_with_shim(&d, "vm1", &prog, &[]);
        assert_passed(&r, &format!("{name} (cudart {cudart})"), min_checks);
        // Everything the program held is back in the slice.
        d.wait_memory_used("vm1", 0, Duration::from_secs(5));
    }
}

#[test]
fn nvcc_programs_run_memory_and_errors() {
    // Not on CUDA 13: cudaDeviceProp's layout changed, so a program built
    // with 11.8's headers misreads what CUDA 13's runtime fills in.
    run_nvcc_program("runtime_basics", 40, &["static", "shared", "cudart12"]);
}

#[test]
fn nvcc_programs_run_pools_managed_and_mapped_memory() {
    // Not on CUDA 13: cudaMemAdvise and cudaMemPrefetchAsync take a cudaMemLocation there
    // instead of a device number, so a program built with 11.8's headers passes an invalid
    // location (CUDA itself refuses it the same way).
    run_nvcc_program("alloc_api", 60, &["static", "shared", "cudart12"]);
}

/// Separate compilation (`nvcc -rdc=true`, PTX only): a kernel calls a device function and
/// reads a variable of another translation unit; the runtime registers the units' images
/// together with libcudadevrt's, and vgpu links their PTX (before, the module failed to load
/// with the other unit's function undefined). Inline code both units use (a template's code,
/// an inline function's static table) is `.weak` in each and kept once (before, the link
/// failed and each unit's kernels failed to load).
#[test]
fn nvcc_programs_link_separately_compiled_device_code() {
    run_nvcc_program("rdc", 5, &["static", "shared"]);
}

/// Dynamic parallelism (`-rdc=true`, `libcudadevrt`): a child grid per block, children that see
/// their parent's writes and run in launch order, a recursive quicksort, launches nested to
/// CUDA's depth limit and refused past it, the device runtime's limits set and read back (4096
/// children all run once the pending launch count is raised), a bad child configuration
/// failing in the kernel, a kernel's attributes, occupancy and the limits read in a kernel as
/// the host reads them.
/// The runtime links libcudadevrt's PTX (`cudaLaunchDeviceV2`, with its address-valued error
/// table); the simulated GPU supplies the driver's `cnp*` calls it makes.
#[test]
fn nvcc_programs_launch_kernels_from_kernels() {
    run_nvcc_program("dynamic_parallelism", 29, &["static", "shared"]);
}

/// CUDA 11's device-side `cudaDeviceSynchronize` (`-rdc=true`, `libcudadevrt`): a block reads
/// what its child wrote once it waited, a merge sort whose parents wait for their halves on
/// device-side streams, a recursive sum of `malloc`'d partial sums, waits past
/// `cudaLimitDevRuntimeSyncDepth` refused with `cudaErrorSyncDepthExceeded`, a wait with
/// nothing launched, a wait that covers the child's own children.
#[test]
fn nvcc_programs_wait_for_kernels_they_launched() {
    run_nvcc_program("cdp_sync", 11, &["static", "shared"]);
}

#[test]
fn nvcc_programs_run_kernels() {
    run_nvcc_program("kernels", 27, ALL_RUNTIMES);
}

/// `cudaLaunchCooperativeKernel` and cooperative groups' grid barrier (a program built for
/// compute_70), on every runtime.
#[test]
fn nvcc_programs_run_cooperative_launches() {
    run_nvcc_program("cooperative", 12, ALL_RUNTIMES);
}

/// CUDA arrays, texture objects (arrays, pitched and linear memory; filtering and addressing
/// modes, 8-bit texels, 3-D and layered) and surface objects, on every runtime.
#[test]
fn nvcc_programs_sample_textures_and_write_surfaces() {
    run_nvcc_program("textures", 29, ALL_RUNTIMES);
}

/// Mipmapped arrays: levels filled from the host and generated on the device (a texture over
/// one level, a surface over the next), sampled by level of detail and by gradients under
/// point and linear mipmap filtering, a bias and clamps; 2-D, 3-D and layered; on every
/// runtime.
#[test]
fn nvcc_programs_sample_mipmapped_arrays() {
    run_nvcc_program("mipmaps", 16, ALL_RUNTIMES);
}

/// Tensor core matrix multiplies written with the `wmma` API, as the CUDA samples'
/// `*TensorCoreGemm` write them: f16 (f32 and f16 accumulators), bf16, tf32, int8, uint8 and
/// f64 fragments in every shape; and with `mma.sync` (f16 fed by `ldmatrix`, int8 fragments
/// built as the PTX ISA lays them out), against products computed on the host, on every
/// runtime.
#[test]
fn nvcc_programs_multiply_on_tensor_cores() {
    run_nvcc_program("tensor_cores", 11, ALL_RUNTIMES);
}

/// Thrust and CUB (nvcc 11.8's, version 1.17): radix and merge sorts, reductions, scans,
/// compaction, partitions, searches, histograms, segmented reductions, run-length encoding and
/// CUB's block and warp collectives, against the host's answers, on every runtime.
#[test]
fn nvcc_programs_run_thrust_and_cub() {
    run_nvcc_program("thrust", 23, ALL_RUNTIMES);
}

/// Asynchronous copies and split barriers (`cp.async`, `mbarrier`): cooperative groups'
/// `memcpy_async`, `cuda::barrier` with `cuda::memcpy_async` over several phases, tokens,
/// `arrive_and_drop`, `cuda::pipeline`, and a warp spinning with `__nanosleep` on another's
/// write, on every runtime.
#[test]
fn nvcc_programs_copy_asynchronously_and_wait_on_split_barriers() {
    run_nvcc_program("async_copies", 6, ALL_RUNTIMES);
}

/// The device heap: kernels' `malloc`, `free`, `new` and `delete`, its size set with
/// `cudaDeviceSetLimit` before the first kernel that uses it (and refused after), memory that
/// outlives its launch and is freed by another thread, `NULL` when full, the heap charged to the
/// slice (and given back when the program ends: `run_nvcc_program` waits for the slice to empty).
#[test]
fn nvcc_programs_allocate_on_the_device_heap() {
    run_nvcc_program("device_heap", 16, ALL_RUNTIMES);
}

/// Texture and surface references (CUDA 11's `texture<>` and `surface<>`, gone from CUDA 12's
/// runtime): bound to arrays, linear and pitched memory, rebound, queried.
#[test]
fn nvcc_programs_bind_texture_and_surface_references() {
    run_nvcc_program("texrefs", 10, &["static", "shared"]);
}

#[test]
fn nvcc_programs_run_streams_events_and_callbacks() {
    run_nvcc_program("streams", 30, ALL_RUNTIMES);
}

/// Device-side printf and assert through the runtime, shim, vgpud and the simulated GPU:
/// `printf` text reaches the program's stdout at the synchronizing call, a failed `assert`
/// prints CUDA's message and makes the context fail with cudaErrorAssert (710), sticky for that
/// process only: another VM, and the same VM's next process, run normally.
#[test]
fn nvcc_programs_run_device_printf_and_assert() {
    let dir = nvcc_programs();
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 64 * MIB)]);
    for cudart in ["static", "shared"] {
        let prog = dir.join(format!("device_io.{cudart}"));
        let r = run_with_shim(&d, "vm1", &prog, &[]);
        assert_passed(&r, &format!("device_io (cudart {cudart})"), 8);
        // The program captured its own fds; what it saw is echoed as `#   ` lines.
        assert!(
            r.stdout
                .contains("#   device_io: fmt d=-7 u=42 x=beef lld=-1234567890123 f=3.142 e=6.02e+23 s=str c=Z p=%"),
            "{}",
            r.stdout
        );

        let r = run_with_shim(&d, "vm1", &prog, &["assert"]);
        assert_passed(&r, &format!("device_io assert (cudart {cudart})"), 7);
        let msg = "device_io.cu:44: void check_values(const int *, int): block: [0,0,0], thread: [13,0,0] Assertion `v[i] != 13` failed.";
        assert!(
            r.stdout.contains(msg),
            "CUDA's assert message: {}",
            r.stdout
        );

        // The fault poisoned that process's context only.
        let r = run_with_shim(&d, "vm2", &prog, &[]);
        assert_passed(&r, &format!("device_io in another VM (cudart {cudart})"), 8);
        let r = run_with_shim(&d, "vm1", &prog, &[]);
        assert_passed(
            &r,
            &format!("device_io after the assert (cudart {cudart})"),
            8,
        );
        d.wait_memory_used("vm1", 0, Duration::from_secs(5));
    }
}

/// The directory of PyPI's CUDA runtime of a major version
/// (`nvidia-cuda-runtime-cu12`, `nvidia-cuda-runtime` 13), with include/ and lib/.
fn pypi_cudart(major: u32) -> PathBuf {
    let module = match major {
        12 => "nvidia.cuda_runtime",
        _ => "nvidia.cu13",
    };
    let out = Command::new("python3")
        .args([
            "-c",
            &format!("import {module} as m; print(list(m.__path__)[0])"),
        ])
        .output()
        .expect("running python3");
    assert!(
        out.status.success(),
        "PyPI's CUDA {major} runtime ({module}) is not installed: run scripts/prereqs.sh"
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Builds tests/c/runtime_api.c against a runtime's headers and library and
/// runs it through the shim.
fn run_runtime_api_program(major: u32) {
    let rt = pypi_cudart(major);
    let a = artifacts();
    let prog = a.profile_dir.join(format!("c-runtime_api-{major}"));
    let st = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&prog)
        .arg(workspace_root().join("tests/c/runtime_api.c"))
        .arg(format!("-I{}", rt.join("include").display()))
        .arg(format!("-L{}", rt.join("lib").display()))
        .arg(format!("-l:libcudart.so.{major}"))
        .arg(format!("-Wl,-rpath,{}", rt.join("lib").display()))
        .status()
        .expect("running cc");
    assert!(st.success(), "building tests/c/runtime_api.c failed");
    let d = Vgpud::start(&[TestVm::new("vm1", 96 * MIB)]);
    let r = run_with_shim(&d, "vm1", &prog, &[]);
    assert_passed(&r, &format!("runtime_api (libcudart.so.{major})"), 35);
    assert!(
        r.stdout.contains(&format!("total {}", 96 * MIB)),
        "the runtime sees the VM's slice: {}",
        r.stdout
    );
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}

#[test]
fn a_program_linked_against_cuda_12_runtime_runs() {
    run_runtime_api_program(12);
}

#[test]
fn a_program_linked_against_cuda_13_runtime_runs() {
    run_runtime_api_program(13);
}

/// The driver API's headers in PyPI's runtime: cuda.h and the graphics interop headers (which
/// include OpenGL's, EGL's and VDPAU's: Debian's libgl-dev, libegl-dev and libvdpau-dev, which
/// scripts/prereqs.sh installs).
const DRIVER_HEADERS: [&str; 4] = ["cuda.h", "cudaGL.h", "cudaEGL.h", "cudaVDPAU.h"];
/// How the driver API's headers declare a function.
const DRIVER_DECLARATION: &str = "CUresult CUDAAPI ";
/// Declared for Windows only.
const WINDOWS_ONLY: [&str; 1] = ["cuWGLGetDevice"];
/// cudaProfiler.h's functions (PyPI's runtime ships only that header's typedefs).
const PROFILER_FUNCTIONS: [&str; 3] = ["cuProfilerInitialize", "cuProfilerStart", "cuProfilerStop"];

/// `name` without its ABI version (`cuGraphAddNode_v3` is `cuGraphAddNode`), as callers ask
/// `cuGetProcAddress` for it.
fn base_name(name: &str) -> &str {
    match name.rsplit_once("_v") {
        Some((base, v)) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => name,
    }
}

/// A program compiled against CUDA 12.9's or 13.5's driver API headers links against vgpu's
/// libcuda.so.1 whichever of the headers' functions it calls, with the legacy or the per-thread
/// default stream, and `cuGetProcAddress` answers each of them for callers of that version (as
/// cuda-python and NVIDIA's runtime resolve the driver). Before, 47 of CUDA 12.9's functions were
/// missing (graphics interop, external memory, checkpoints…), and a program calling any of them,
/// even on a path it never takes on a VM, did not start. What each does is in
/// tests/c/driver_api_rest.c.
#[test]
fn every_function_of_cudas_driver_headers_links_and_resolves() {
    let exported = headers::exported_symbols(&artifacts().lib_dir.join("libcuda.so.1"));
    let prog = build_c_program("proc_address");
    for major in [12, 13] {
        let include = pypi_cudart(major).join("include");
        let cuda_h = std::fs::read_to_string(include.join("cuda.h")).unwrap();
        let version: i32 = cuda_h
            .lines()
            .find_map(|l| l.strip_prefix("#define CUDA_VERSION "))
            .and_then(|v| v.trim().parse().ok())
            .expect("CUDA_VERSION in cuda.h");
        let declared: Vec<String> =
            headers::declared_functions(&include, &DRIVER_HEADERS, DRIVER_DECLARATION)
                .into_iter()
                .filter(|n| !WINDOWS_ONLY.contains(&n.as_str()))
                .collect();
        assert!(declared.len() > 400, "CUDA {version}: {declared:?}");
        let linked = [&[][..], &["CUDA_API_PER_THREAD_DEFAULT_STREAM"][..]]
            .into_iter()
            .flat_map(|defines| {
                headers::linked_symbols(&include, &DRIVER_HEADERS, &declared, defines)
            })
            .chain(PROFILER_FUNCTIONS.iter().map(|p| p.to_string()));
        let missing = headers::missing(linked, &exported);
        assert!(
            missing.is_empty(),
            "CUDA {version}: {} symbols a program compiled against its headers links are not \
             exported: {missing:?}",
            missing.len()
        );

        let mut bases: Vec<&str> = declared
            .iter()
            .map(|n| base_name(n))
            .chain(PROFILER_FUNCTIONS)
            .collect();
        bases.sort_unstable();
        bases.dedup();
        let mut child = Command::new(&prog)
            .arg(version.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(bases.join("\n").as_bytes()).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "CUDA {version}: cuGetProcAddress finds not every function:\n{stdout}"
        );
        assert!(
            stdout.contains(&format!("# {} names", bases.len())),
            "{stdout}"
        );
        println!(
            "CUDA {version}: {} functions declared ({} base names), each exported and resolvable",
            declared.len(),
            bases.len()
        );
    }
}

/// What vgpu answers for the rest of the driver API's headers: graphics interop, external memory
/// and semaphores, features a VM's device lacks, CUDA 2.0's attach/detach and texture references
/// outside modules, CUDA 13.1's host functions with a sync mode (tests/c/driver_api_rest.c).
#[test]
fn the_rest_of_the_driver_api_refuses_what_a_vms_device_lacks_as_cuda_does() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    let prog = build_c_program("driver_api_rest");
    let r = run_with_shim(&d, "vm1", &prog, &[]);
    assert_passed(&r, "driver_api_rest", 90);
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}

/// The driver's private tables as NVIDIA's libraries call them (tests/c/export_tables.c): the
/// CUDA 13 tools table's stream entries (51 and 39, which cuBLAS's reductions call) name a stream
/// and number it as `cuStreamGetId` does, refusing forged handles; entries past a table's
/// declared size refuse instead of running whatever follows the table in memory.
#[test]
fn the_driver_tables_name_streams_and_refuse_past_their_end() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    let prog = build_c_program("export_tables");
    let r = run_with_shim(&d, "vm1", &prog, &[]);
    assert_passed(&r, "export_tables", 24);
    assert!(
        r.stderr
            .contains("entry 40 of the driver's export table 21318c60")
            && r.stderr
                .contains("entry 9 of the driver's export table 42d85a81"),
        "{}",
        r.stderr
    );
}

/// Builds tests/c/NAME.c against PyPI's CUDA 12 runtime and the PyPI
/// package `nvidia.PACKAGE`'s library `LIB` (e.g. `libcublas.so.12`).
fn build_library_program(name: &str, package: &str, lib: &str) -> PathBuf {
    let rt = pypi_cudart(12);
    let pkg = pypi_nvidia_package(package);
    build_linked_program(name, name, &[&rt, &pkg], &["libcudart.so.12", lib])
}

/// Builds tests/c/NAME.c into `c-OUT` against the headers and libraries of each of `dirs` (their
/// `include` and `lib`), linking `libs` (file names) and the math library.
fn build_linked_program(name: &str, out: &str, dirs: &[&Path], libs: &[&str]) -> PathBuf {
    let prog = artifacts().profile_dir.join(format!("c-{out}"));
    let lib_dirs: Vec<String> = dirs
        .iter()
        .map(|d| d.join("lib").display().to_string())
        .collect();
    let st = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&prog)
        .arg(workspace_root().join(format!("tests/c/{name}.c")))
        .args(
            dirs.iter()
                .map(|d| format!("-I{}", d.join("include").display())),
        )
        .args(lib_dirs.iter().map(|d| format!("-L{d}")))
        .args(libs.iter().map(|l| format!("-l:{l}")))
        .arg("-lm")
        .arg(format!("-Wl,-rpath,{}", lib_dirs.join(":")))
        .status()
        .expect("running cc");
    assert!(st.success(), "building tests/c/{name}.c ({out}) failed");
    prog
}

/// cuBLAS (tests/c/cublas.c) on the simulated GPU: libcublas's compute 12.0 PTX runs saxpy, gemv,
/// a small gemm, scal, geam, strided batched and typed (`cublasGemmEx`) products and the
/// reductions (dot in single and double precision, nrm2, asum, amax) with the right results. Before 2026-12-06 its kernels were cubins to it, and
/// matrix products failed on any device (the shim refused the tools tables' thread context and
/// context number), and so did the reductions, in either pointer mode, until the same table's
/// stream entries were answered (the dot, nrm2, asum and amax checks, on a created stream and on
/// the default one).
#[test]
fn cublas_runs_its_ptx_kernels_on_the_simulated_gpu() {
    let prog = build_library_program("cublas", "cublas", "libcublas.so.12");
    let d = Vgpud::start(&[TestVm::new("vm1", 256 * MIB)]);
    let r = run_with_shim(&d, "vm1", &prog, &["sim"]);
    assert_passed(&r, "cublas", 20);
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}

/// cuSOLVER (tests/c/cusolver.c; Debian's libcusolver 11.4 and CUDA 11.8's runtime, from
/// `nvidia-cuda-toolkit`) on the simulated GPU: its kernels and its cuBLAS 11's carry PTX for
/// compute 9.0, which the simulated GPU runs. LU and Cholesky solves, a QR factorization and
/// the symmetric eigensolver give the known answers; the context carries on.
#[test]
fn cusolver_factors_and_solves_on_the_simulated_gpu() {
    let header = Path::new("/usr/include/cusolverDn.h");
    assert!(
        header.exists(),
        "{} is missing (Debian's nvidia-cuda-toolkit): run scripts/prereqs.sh",
        header.display()
    );
    // Debian's headers are in /usr/include, its libraries in the system's library path.
    let prog = build_linked_program(
        "cusolver",
        "cusolver",
        &[Path::new("/usr")],
        &["libcusolver.so.11", "libcudart.so.11.0"],
    );
    let d = Vgpud::start(&[TestVm::new("vm1", 256 * MIB)]);
    let r = run_with_shim(&d, "vm1", &prog, &["sim"]);
    assert_passed(&r, "cusolver", 8);
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}

/// A cubin on the simulated GPU (ptxas, from PyPI's nvidia-cuda-nvcc-cu12, compiles
/// tests/kernels/ptx/saxpy.sm_80.ptx): it loads with its kernel known, and a launch of it is
/// refused at once with `CUDA_ERROR_NO_BINARY_FOR_GPU` (directly, as a graph node, in a capture),
/// with nothing left pending for a later call to trip on (tests/c/cubin_launch.c). Before, the
/// launch was queued and failed on the host, while copies went on with the kernel's output
/// never written (JAX printed zeros).
#[test]
fn a_cubins_kernel_is_refused_at_its_launch_on_the_simulated_gpu() {
    let ptxas = pypi_nvidia_package("cuda_nvcc").join("bin/ptxas");
    let dir = tempfile::tempdir().unwrap();
    let cubin = dir.path().join("saxpy.sm_80.cubin");
    let st = Command::new(&ptxas)
        .arg("-arch=sm_80")
        .arg(workspace_root().join("tests/kernels/ptx/saxpy.sm_80.ptx"))
        .arg("-o")
        .arg(&cubin)
        .status()
        .expect("running ptxas");
    assert!(st.success(), "ptxas failed");
    let prog = build_c_program("cubin_launch");
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    let r = run_with_shim(&d, "vm1", &prog, &[cubin.to_str().unwrap()]);
    assert_passed(&r, "cubin_launch", 18);
    assert!(
        r.stderr.contains("comes from a cubin (SASS)"),
        "{}",
        r.stderr
    );
}

/// cuFFT's transforms (C2C forward and inverse at a power of two and at
/// 1000, R2C on a stream) give the CPU's DFT on the simulated GPU: cuFFT
/// builds its kernels as PTX at run time and walks them through the driver's
/// module-tools table.
#[test]
fn cufft_transforms_match_the_cpu_on_the_simulated_gpu() {
    let prog = build_library_program("cufft", "cufft", "libcufft.so.11");
    let d = Vgpud::start(&[TestVm::new("vm1", 256 * MIB)]);
    let r = run_with_shim(&d, "vm1", &prog, &[]);
    assert_passed(&r, "cufft", 14);
    // Nothing refused on the way, and every buffer cuFFT took came back.
    assert!(
        !r.stderr.contains("vgpu does not implement"),
        "{}",
        r.stderr
    );
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}

/// NVIDIA's CUDA 13 libraries (cuBLAS 13, cuFFT 12, cuSOLVER 12, cuSPARSE 12 and
/// `libcudart.so.13`, the ones PyTorch's wheels bring; from the virtual environment
/// `scripts/prereqs.sh` installs PyTorch into) run the same programs as the CUDA 11.8 and 12 ones
/// above on the simulated GPU, with the same results, and cuSPARSE's sparse matrix-vector
/// products (tests/c/cusparse.c): their kernels carry PTX the simulated GPU runs. cuSOLVER 12 asks for a 192 MiB
/// workspace for the QR factorization of a 4 x 4 matrix.
#[test]
fn cuda_13_libraries_run_on_the_simulated_gpu() {
    let Some(cu13) = torch_venv_cuda_13() else {
        println!(
            "SKIPPED: PyTorch's virtual environment (CUDA 13's libraries) is not installed; run scripts/prereqs.sh"
        );
        return;
    };
    let d = Vgpud::start(&[TestVm::new("vm1", 512 * MIB)]);
    for (name, lib, checks) in [
        ("cublas", "libcublas.so.13", 20),
        ("cufft", "libcufft.so.12", 14),
        ("cusolver", "libcusolver.so.12", 8),
        ("cusparse", "libcusparse.so.12", 5),
    ] {
        let prog = build_linked_program(
            name,
            &format!("{name}-13"),
            &[&cu13],
            &["libcudart.so.13", lib],
        );
        let r = run_with_shim(&d, "vm1", &prog, &["sim"]);
        assert_passed(&r, name, checks);
        assert!(
            !r.stderr.contains("vgpu does not implement"),
            "{name}: {}",
            r.stderr
        );
        d.wait_memory_used("vm1", 0, Duration::from_secs(5));
    }
}

/// `nvidia/cu13` of PyTorch's virtual environment (`$VGPU_TORCH_VENV`, by default
/// `~/.cache/vgpu/torch-venv`), where its CUDA 13 libraries and headers are, if it is installed.
fn torch_venv_cuda_13() -> Option<PathBuf> {
    let venv = std::env::var_os("VGPU_TORCH_VENV")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/vgpu/torch-venv"))
        })?;
    std::fs::read_dir(venv.join("lib"))
        .ok()?
        .flatten()
        .map(|e| e.path().join("site-packages/nvidia/cu13"))
        .find(|p| p.join("lib/libcublas.so.13").exists() && p.join("include/cublas_v2.h").exists())
}

/// The same nvcc-built programs, unmodified, in a real Linux guest under QEMU
/// that installed the guest shim: nvcc 11.8's static runtime and CUDA 12.9's
/// `libcudart.so.12` (its libraries come with the program in the payload),
/// over vgpud's vhost-user vsock device.
#[test]
fn runtime_programs_run_unmodified_in_a_qemu_guest() {
    if let Some(reason) = qemu::skip_reason() {
        println!("SKIPPED: cannot boot QEMU guests here: {reason}");
        return;
    }
    const GUEST_TIMEOUT: Duration = Duration::from_secs(300);
    let dir = nvcc_programs();
    let programs = ["kernels.static", "kernels.cudart12"].map(|p| dir.join(p));
    let d = Vgpud::start(&[TestVm::new("vm1", 256 * MIB).vsock(3)]);
    let body = "for p in kernels.static kernels.cudart12; do\n\
                  echo \"== $p\"\n\
                  $p\n\
                  echo \"$p status $?\"\n\
                done\n";
    let mut spec = cuda_guest(&d, "vm1", "vm-runtime", &programs, &[], body);
    spec.timeout = GUEST_TIMEOUT;
    let mut guest = d.guest_ok(Guest::boot(&spec), "boot");
    let outcome = d.guest_ok(guest.wait_exit(GUEST_TIMEOUT), "guest run");
    let out = outcome.output_text();
    for p in ["kernels.static", "kernels.cudart12"] {
        assert!(
            out.contains(&format!("{p} status 0")),
            "{p} failed in the guest:\n{out}\nvgpud log:\n{}",
            d.log()
        );
    }
    assert!(!out.contains("FAIL "), "{out}");
    assert!(out.matches("# kernels: ").count() == 2, "{out}");
    d.wait_memory_used("vm1", 0, Duration::from_secs(10));
}
