//! A real Linux guest under QEMU installs the guest shim with
//! `guest-shim/install.sh` and runs the demo CUDA workload
//! (`examples/workload.c`: an NVRTC-compiled matmul PTX kernel checked against
//! the CPU, then allocations up to the slice) over vgpud's vhost-user vsock
//! device. The host checks the guest's console and vgpud's admin view.
//!
//! Skips, with a printed reason, only when QEMU is missing and cannot be
//! installed.

use std::time::Duration;

use vgpu_tests::harness::{
    TestVm, Vgpud, artifacts, cuda_guest, guest_workload, ptx, workspace_root,
};
use vgpu_tests::qemu::{self, Guest};

const GUEST_TIMEOUT: Duration = Duration::from_secs(240);
const MIB: u64 = 1 << 20;
const SLICE_MIB: u64 = 256;
const GUEST_CID: u64 = 3;
const MATMUL_SIZE: u64 = 64;
const MATMUL_ROUNDS: u64 = 3;
const FLOAT_BYTES: u64 = 4;
/// The workload allocates 16 MiB blocks until the slice refuses; its three
/// 16 KiB matrices take the rest of the last block.
const BLOCK_MIB: u64 = 16;

#[test]
fn a_guest_installs_the_shim_and_runs_a_ptx_workload_over_vsock() {
    if let Some(reason) = qemu::skip_reason() {
        println!("SKIPPED: cannot boot QEMU guests here: {reason}");
        return;
    }
    let d = Vgpud::start(&[TestVm::new("vm1", SLICE_MIB * MIB).vsock(GUEST_CID)]);
    let workload = guest_workload();
    let body = format!(
        "echo '== install again'\n\
         sh /payload/vgpu/install.sh --from /payload/vgpu || exit 91\n\
         ldconfig -p | grep 'libcuda.so'\n\
         cat /etc/modules-load.d/vgpu.conf\n\
         echo '== workload'\n\
         workload /payload/matmul.ptx {MATMUL_SIZE} {MATMUL_ROUNDS}\n\
         echo \"workload status $?\"\n\
         echo '== uninstall'\n\
         sh /payload/vgpu/install.sh --uninstall || exit 92\n\
         workload /payload/matmul.ptx 16 1\n\
         echo \"after uninstall status $?\"\n"
    );
    let mut spec = cuda_guest(
        &d,
        "vm1",
        "vm-workload",
        &[workload],
        &[(ptx("matmul.sm_80.ptx"), "/payload/matmul.ptx")],
        &body,
    );
    spec.timeout = GUEST_TIMEOUT;
    let mut guest = d.guest_ok(Guest::boot(&spec), "boot");
    let outcome = d.guest_ok(guest.wait_exit(GUEST_TIMEOUT), "guest run");
    let out = outcome.output_text();
    assert_eq!(
        outcome.exit_code,
        0,
        "guest output:\n{out}\nvgpud log:\n{}",
        d.log()
    );

    // install.sh: first run installs, second finds everything in place.
    for line in [
        "vgpu-install: installed: /usr/local/lib/libcuda.so.1",
        "vgpu-install: linked: /usr/local/lib/libcuda.so -> libcuda.so.1",
        "vgpu-install: installed: /usr/local/bin/vgpu-smi",
        "vgpu-install: installed: /etc/ld.so.conf.d/vgpu.conf",
        "vgpu-install: installed: /etc/modules-load.d/vgpu.conf",
        "vgpu-install: virtio-vsock device present",
        "vgpu-install: up to date: /usr/local/lib/libcuda.so.1",
        "vgpu-install: done: everything was up to date",
        "libcuda.so.1 (libc6,x86-64) => /usr/local/lib/libcuda.so.1",
        "vmw_vsock_virtio_transport",
    ] {
        assert!(out.contains(line), "missing `{line}` in:\n{out}");
    }
    assert!(!out.contains("warning"), "install.sh warned:\n{out}");

    // The workload: the slice, the kernels, the result, the hard limit.
    let blocks = SLICE_MIB / BLOCK_MIB - 1;
    for line in [
        format!("gpu: vgpu Simulated GPU, memory slice {SLICE_MIB} MiB ({SLICE_MIB} MiB free)"),
        format!("matmul {MATMUL_SIZE}x{MATMUL_SIZE}: {MATMUL_ROUNDS} kernels in"),
        format!(
            "allocated {} MiB more before CUDA_ERROR_OUT_OF_MEMORY: the slice is a hard limit",
            blocks * BLOCK_MIB
        ),
        "workload status 0".to_string(),
    ] {
        assert!(out.contains(&line), "missing `{line}` in:\n{out}");
    }
    assert!(out.contains(": result OK"), "{out}");
    // The guest kernel took the shim's larger vsock receive buffer (it warns otherwise).
    assert!(!out.contains("vsock receive buffer"), "{out}");

    // Uninstalled: the loader no longer finds libcuda.so.1 (status 127).
    assert!(
        out.contains("vgpu-install: removed /usr/local/lib/libcuda.so.1"),
        "{out}"
    );
    assert!(out.contains("after uninstall status 127"), "{out}");

    // vgpud saw one session over the vsock device, every kernel, and got
    // all the memory back.
    let v = d.vm("vm1");
    assert_eq!(v["stats"]["kernels"], MATMUL_ROUNDS, "{v:#}");
    assert_eq!(v["stats"]["sessions_total"], 1, "{v:#}");
    assert_eq!(v["memory_used"], 0, "{v:#}");
    assert_eq!(v["sessions"].as_array().map(Vec::len), Some(0), "{v:#}");
    let vsock = &v["vsock"]["stats"];
    assert_eq!(vsock["connections_total"], 1, "{v:#}");
    assert_eq!(vsock["frontend_connections"], 1, "{v:#}");
    assert_eq!(vsock["dropped_chains"], 0, "{v:#}");
    // Quick calls of the idle session (synchronizations, queries) were answered by the device
    // thread itself.
    assert!(
        vsock["calls_on_device_thread"].as_u64().unwrap_or(0) >= 1,
        "{v:#}"
    );
    // The two input matrices went in, the product came back, all through
    // the device.
    let matrix = MATMUL_SIZE * MATMUL_SIZE * FLOAT_BYTES;
    assert_eq!(v["stats"]["bytes_htod"], 2 * matrix, "{v:#}");
    assert_eq!(v["stats"]["bytes_dtoh"], matrix, "{v:#}");
    assert!(
        vsock["bytes_guest_to_host"].as_u64().unwrap_or(0) > 2 * matrix,
        "{v:#}"
    );
    assert!(
        vsock["bytes_host_to_guest"].as_u64().unwrap_or(0) > matrix,
        "{v:#}"
    );
    println!(
        "vm_workload: boot to payload {:.2} s, whole run {:.2} s ({})",
        outcome.boot_to_payload.unwrap_or_default().as_secs_f64(),
        outcome.elapsed.as_secs_f64(),
        outcome.accel.as_str()
    );
}

/// A guest process whose threads wait in synchronizations (each on a vsock connection of its
/// own to the GPU port) while another of its threads works and releases them
/// (tests/c/sync_threads.c; the virtio-vgpu device's run is in tests/vgpu_dev_vm.rs).
#[test]
fn a_guest_processs_waiting_threads_do_not_stop_its_others_over_vsock() {
    if let Some(reason) = qemu::skip_reason() {
        println!("SKIPPED: cannot boot QEMU guests here: {reason}");
        return;
    }
    let d = Vgpud::start(&[TestVm::new("vm1", SLICE_MIB * MIB).vsock(GUEST_CID)]);
    let program = qemu::build_guest_cuda_program(
        &workspace_root().join("tests/c/sync_threads.c"),
        "sync_threads",
        &artifacts().lib_dir,
    )
    .expect("sync_threads for guests");
    let body = "sync_threads > /tmp/sync.log 2>&1; echo \"sync_threads status $?\"\n\
                grep -cE '^ok ' /tmp/sync.log; grep -E 'FAIL|^#' /tmp/sync.log\n";
    let mut spec = cuda_guest(&d, "vm1", "vm-sync-threads", &[program], &[], body);
    spec.timeout = GUEST_TIMEOUT;
    let mut guest = d.guest_ok(Guest::boot(&spec), "boot");
    let outcome = d.guest_ok(guest.wait_exit(GUEST_TIMEOUT), "guest run");
    let out = outcome.output_text();
    assert!(out.contains("sync_threads status 0"), "{out}\n{}", d.log());
    assert!(!out.contains("FAIL"), "{out}");
    let v = d.wait_vm(
        "vm1",
        "sessions closed and memory returned",
        GUEST_TIMEOUT,
        |v| v["memory_used"] == 0 && v["sessions"].as_array().is_some_and(Vec::is_empty),
    );
    // The waiting threads' connections came over the vsock device too.
    assert!(
        v["vsock"]["stats"]["connections_total"].as_u64() > Some(1),
        "{v:#}"
    );
    assert_eq!(v["vsock"]["stats"]["dropped_chains"], 0, "{v:#}");
}
