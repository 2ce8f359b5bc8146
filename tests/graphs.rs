//! Stream capture and CUDA graphs through the shim, vgpud and the simulated GPU
//! (`tests/c/graphs.c`): captured sequences replayed with correct results, cross-stream
//! capture through events, CUDA's errors for illegal calls during capture, graphs built node
//! by node, executable graph updates, and graph allocations charged to the slice.

use std::time::Duration;

use vgpu_tests::harness::{Run, TestVm, Vgpud, build_c_program, ptx, run_against};

const MIB: u64 = 1 << 20;

fn saxpy_ptx() -> String {
    ptx("saxpy.sm_80.ptx").display().to_string()
}

/// Runs one mode of the C program against a fresh VM and checks that every check passed.
fn run_mode(slice: u64, args: &[&str], min_checks: usize) -> Run {
    run_mode_with(slice, args, min_checks, "")
}

/// [`run_mode`] with extra `[device]` settings.
fn run_mode_with(slice: u64, args: &[&str], min_checks: usize, device: &str) -> Run {
    let d = Vgpud::start_with(&[TestVm::new("vm", slice)], device);
    let prog = build_c_program("graphs");
    let ptx = saxpy_ptx();
    let mut all = vec![args[0], ptx.as_str()];
    all.extend_from_slice(&args[1..]);
    let r = run_against(&d, "vm", &prog, &all);
    assert!(
        r.failures().is_empty() && r.code == 0 && r.stdout.contains("done"),
        "{}\n{}\n{}",
        r.stdout,
        r.stderr,
        d.log()
    );
    let checks = r.stdout.lines().filter(|l| l.starts_with("ok ")).count();
    assert!(checks >= min_checks, "{checks} checks:\n{}", r.stdout);
    // The process ended and everything it held went back to the slice.
    d.wait_memory_used("vm", 0, Duration::from_secs(5));
    r
}

/// A graph's host copies run when the stream reaches them, after the nodes they depend on: an
/// HtoD node copies what the host node before it wrote in the same launch, a host node after a
/// DtoH node reads the copied bytes, and `cuGraphLaunch` does not wait for the stream.
#[test]
fn host_copy_nodes_run_in_graph_order_without_blocking_the_launch() {
    run_mode(64 * MIB, &["hostcopy"], 25);
}

#[test]
fn a_captured_sequence_replays_with_new_host_data() {
    run_mode(64 * MIB, &["capture"], 40);
}

#[test]
fn capture_forks_and_joins_streams_through_events() {
    run_mode(64 * MIB, &["fork"], 40);
}

/// Nothing here depends on timing: a replay of the branches one after the other spins until the
/// watchdog fails it with `CUDA_ERROR_LAUNCH_TIMEOUT`.
#[test]
fn independent_branches_of_a_graph_run_at_the_same_time() {
    run_mode_with(64 * MIB, &["branches"], 80, "watchdog_ms = 20000");
}

#[test]
fn illegal_calls_during_capture_fail_as_in_cuda() {
    run_mode(64 * MIB, &["errors"], 50);
}

#[test]
fn graphs_built_node_by_node_run_in_dependency_order() {
    let dir = tempfile::tempdir().unwrap();
    let dot = dir.path().join("graph.dot");
    run_mode(64 * MIB, &["explicit", dot.to_str().unwrap()], 50);
    let text = std::fs::read_to_string(&dot).unwrap();
    assert!(text.contains("host") && text.contains("memcpy"), "{text}");
}

/// User objects: a destructor runs once the program's, a graph's, its clone's and an
/// executable graph's references are gone, moved references go with their graph, refusals.
#[test]
fn user_objects_live_as_long_as_the_graphs_that_hold_them() {
    run_mode(64 * MIB, &["userobjects"], 25);
}

#[test]
fn executable_graph_updates_take_effect() {
    run_mode(64 * MIB, &["update"], 30);
}

#[test]
fn graph_allocations_are_charged_to_the_slice_and_refused_past_it() {
    let slice = 64 * MIB;
    run_mode(slice, &["mem", &slice.to_string()], 40);
}

/// The generic node API of CUDA 12.2+: nodes of every provided type added with
/// `cuGraphAddNode(_v2)`, parameters changed in a graph and in an executable graph, an allocation
/// node's address filled in and charged, and refused types.
#[test]
fn the_generic_node_api_builds_and_changes_every_provided_node_type() {
    run_mode(64 * MIB, &["generic"], 70);
}

/// The directory of PyPI's CUDA runtime of a major version (as tests/runtime.rs finds it).
fn pypi_cudart(major: u32) -> std::path::PathBuf {
    let module = if major == 12 {
        "nvidia.cuda_runtime"
    } else {
        "nvidia.cu13"
    };
    let out = std::process::Command::new("python3")
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
    std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// tests/cuda/graphs.cu (nvcc 11.8) on NVIDIA's own runtimes: capture, replay, an
/// invalidated capture, a node-by-node graph with a host node, exec parameter changes.
#[test]
fn nvcc_program_uses_graphs_through_the_cuda_runtime() {
    let dir = vgpu_tests::harness::artifacts()
        .profile_dir
        .join("cuda-programs-graphs");
    let st = std::process::Command::new(
        vgpu_tests::harness::workspace_root().join("tests/cuda/build.sh"),
    )
    .arg(&dir)
    .env("CUDA_VARIANTS", "static shared cudart12 cudart13")
    .env("CUDART12_DIR", pypi_cudart(12))
    .env("CUDART13_DIR", pypi_cudart(13))
    .status()
    .expect("running tests/cuda/build.sh");
    assert!(st.success(), "tests/cuda/build.sh failed");
    let d = Vgpud::start(&[TestVm::new("vm", 64 * MIB)]);
    for rt in ["static", "shared", "cudart12", "cudart13"] {
        let r =
            vgpu_tests::harness::run_with_shim(&d, "vm", &dir.join(format!("graphs.{rt}")), &[]);
        assert!(
            r.failures().is_empty() && r.code == 0,
            "graphs.{rt}:\n{}\n{}\n{}",
            r.stdout,
            r.stderr,
            d.log()
        );
        let checks = r.stdout.lines().filter(|l| l.starts_with("ok ")).count();
        assert!(checks >= 20, "graphs.{rt}: {checks} checks\n{}", r.stdout);
        d.wait_memory_used("vm", 0, Duration::from_secs(5));
    }
}

/// Conditional nodes (`tests/c/graph_conditionals.c`): if/else, while and switch nodes built
/// node by node and by capture into their bodies, run with the handles their kernels set; the
/// refusals; a body's kernel that calls `malloc` gets the process's device heap; a kernel
/// setting a handle outside a graph launch fails only its own context.
#[test]
fn conditional_nodes_run_the_bodies_their_kernels_choose() {
    let d = Vgpud::start(&[TestVm::new("vm", 64 * MIB)]);
    let prog = build_c_program("graph_conditionals");
    let fixture = vgpu_tests::harness::workspace_root()
        .join("devices/ptx/fixtures/conditionals.compute_80.ptx");
    run_against(&d, "vm", &prog, &[fixture.to_str().unwrap()]).assert_checks_passed(&d, 50);
    d.wait_memory_used("vm", 0, Duration::from_secs(5));
}
