//! Two real guests run at once on one simulated GPU with different memory
//! slices and weights: the same allocation fails with
//! `CUDA_ERROR_OUT_OF_MEMORY` in the VM whose slice it exceeds and succeeds
//! (written and read back) in the other; each sees its own slice; vgpud's
//! admin view shows both VMs' memory while they hold it; both then run a PTX
//! kernel with checked results.
//!
//! Skips, with a printed reason, only when QEMU is missing and cannot be
//! installed.

use std::thread;
use std::time::Duration;

use vgpu_tests::harness::{TestVm, Vgpud, cuda_guest, guest_cuda_program, ptx, signal_guest};
use vgpu_tests::qemu::{self, Guest, GuestOutcome};

const GUEST_TIMEOUT: Duration = Duration::from_secs(240);
const MIB: u64 = 1 << 20;
const SMALL_MIB: u64 = 64;
const LARGE_MIB: u64 = 256;
/// Past the small slice, well inside the large one.
const ALLOC_MIB: u64 = 96;
const HOLD_MIB: u64 = 40;
const OOM: i32 = 2;
const GO_PORT: u32 = 7000;
const SAXPY_N: u32 = 2048;
const SAXPY_ROUNDS: u32 = 4;

fn script(expect: i32) -> String {
    format!(
        "gpu-task info || exit 10\n\
         gpu-task alloc {ALLOC_MIB} {expect}; echo \"alloc status $?\"\n\
         gpu-task hold {HOLD_MIB} 0 >/tmp/hold.log 2>&1 &\n\
         HOLDER=$!\n\
         for i in $(seq 600); do grep -q holding /tmp/hold.log && break; usleep 50000; done\n\
         cat /tmp/hold.log\n\
         VSOCK_ECHO_TIMEOUT=200 vsock-echo listen {GO_PORT} 1 || exit 11\n\
         kill $HOLDER; wait $HOLDER; echo \"holder status $?\"\n\
         gpu-task saxpy /payload/saxpy.ptx {SAXPY_N} {SAXPY_ROUNDS}; echo \"saxpy status $?\"\n"
    )
}

fn check_guest(name: &str, outcome: &GuestOutcome, slice_mib: u64, alloc: i32, log: &str) {
    let out = outcome.output_text();
    assert_eq!(outcome.exit_code, 0, "{name}:\n{out}\nvgpud log:\n{log}");
    let alloc_name = if alloc == 0 {
        "CUDA_SUCCESS"
    } else {
        "CUDA_ERROR_OUT_OF_MEMORY"
    };
    for line in [
        format!(
            "GPU-TASK info name=\"vgpu Simulated GPU\" total={} free={}",
            slice_mib * MIB,
            slice_mib * MIB
        ),
        format!("GPU-TASK alloc mib={ALLOC_MIB} result={alloc} {alloc_name}"),
        "alloc status 0".to_string(),
        format!("GPU-TASK holding mib={HOLD_MIB} "),
        "holder status 0".to_string(),
        format!("GPU-TASK saxpy n={SAXPY_N} rounds={SAXPY_ROUNDS} ok"),
        "saxpy status 0".to_string(),
    ] {
        assert!(out.contains(&line), "{name}: missing `{line}` in:\n{out}");
    }
    assert!(!out.contains("FAIL"), "{name}:\n{out}");
}

#[test]
fn two_vms_with_different_slices_run_at_once() {
    if let Some(reason) = qemu::skip_reason() {
        println!("SKIPPED: cannot boot QEMU guests here: {reason}");
        return;
    }
    let d = Vgpud::start(&[
        TestVm::new("small", SMALL_MIB * MIB).weight(1).vsock(5),
        TestVm::new("large", LARGE_MIB * MIB).weight(3).vsock(6),
    ]);
    let gpu_task = guest_cuda_program("gpu-task");
    let vsock_echo = qemu::build_guest_program("vsock-echo").expect("vsock-echo");
    let programs = [gpu_task, vsock_echo];
    let files = [(ptx("saxpy.sm_80.ptx"), "/payload/saxpy.ptx")];
    let mut guests = Vec::new();
    for (vm, expect) in [("small", OOM), ("large", 0)] {
        let mut spec = cuda_guest(
            &d,
            vm,
            &format!("vm-slices-{vm}"),
            &programs,
            &files,
            &script(expect),
        );
        spec.timeout = GUEST_TIMEOUT;
        guests.push(d.guest_ok(Guest::boot(&spec), "boot"));
    }
    for g in &mut guests {
        let listening = format!("VSOCK-ECHO listening port={GO_PORT}");
        d.guest_ok(
            g.wait_for_line(&listening, GUEST_TIMEOUT),
            "the guest holds its memory and waits",
        );
    }

    // Both hold 40 MiB at once; each is charged to its own slice.
    let (status, list) = d.get("/v1/vms");
    assert_eq!(status, 200, "{list}");
    for (vm, slice, weight) in [("small", SMALL_MIB, 1), ("large", LARGE_MIB, 3)] {
        let v = list
            .as_array()
            .and_then(|a| a.iter().find(|v| v["name"] == vm))
            .unwrap_or_else(|| panic!("{vm} missing from /v1/vms: {list:#}"));
        assert_eq!(v["memory_limit"], slice * MIB, "{v:#}");
        assert_eq!(v["memory_used"], HOLD_MIB * MIB, "{v:#}");
        assert_eq!(v["weight"], weight, "{v:#}");
        assert_eq!(v["sessions"].as_array().map(Vec::len), Some(1), "{v:#}");
    }
    for vm in ["small", "large"] {
        signal_guest(&d, vm, GO_PORT, GUEST_TIMEOUT);
    }
    let daemon = &d;
    let outcomes: Vec<GuestOutcome> = thread::scope(|s| {
        let handles: Vec<_> = guests
            .iter_mut()
            .map(|g| s.spawn(move || daemon.guest_ok(g.wait_exit(GUEST_TIMEOUT), "guest run")))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("waiter"))
            .collect()
    });
    let log = d.log();
    check_guest("small", &outcomes[0], SMALL_MIB, OOM, &log);
    check_guest("large", &outcomes[1], LARGE_MIB, 0, &log);

    for (vm, _) in [("small", 0), ("large", 0)] {
        let v = d.wait_vm(vm, "memory returned", GUEST_TIMEOUT, |v| {
            v["memory_used"] == 0
        });
        assert_eq!(v["stats"]["kernels"], SAXPY_ROUNDS, "{v:#}");
        assert_eq!(v["vsock"]["stats"]["dropped_chains"], 0, "{v:#}");
    }
    for (vm, o) in ["small", "large"].iter().zip(&outcomes) {
        println!(
            "vm_slices {vm}: boot to payload {:.2} s, whole run {:.2} s ({})",
            o.boot_to_payload.unwrap_or_default().as_secs_f64(),
            o.elapsed.as_secs_f64(),
            o.accel.as_str()
        );
    }
}
