//! QEMU killed in the middle of a run: a guest program holds device memory
//! and keeps the GPU busy (saxpy rounds, each checked) when its QEMU gets
//! SIGKILL. vgpud must free that VM's memory and end its session (seen
//! through `GET /v1/vms/<name>`), keep serving the other VM, which runs
//! kernels concurrently the whole time, and accept the restarted VM on the
//! same vhost-user socket, which can then use its whole slice again.
//!
//! Skips, with a printed reason, only when QEMU is missing and cannot be
//! installed.

use std::time::{Duration, Instant};

use vgpu_tests::harness::{TestVm, Vgpud, cuda_guest, guest_cuda_program, ptx, signal_guest};
use vgpu_tests::qemu::{self, Guest};

const GUEST_TIMEOUT: Duration = Duration::from_secs(240);
/// vgpud notices a dead VMM at once (the vhost-user socket closes); this only
/// bounds the wait on a loaded machine.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(30);
const MIB: u64 = 1 << 20;
const SLICE_MIB: u64 = 128;
const VICTIM_HOLD_MIB: u64 = 64;
/// Fits the slice only if the killed guest's 64 MiB were given back.
const RESTART_ALLOC_MIB: u64 = 100;
const BYSTANDER_HOLD_MIB: u64 = 16;
/// Kernels the bystander must complete after the kill to count as served.
const KERNELS_AFTER_KILL: u64 = 5;
const GO_PORT: u32 = 7000;
const SAXPY: &str = "/payload/saxpy.ptx";

#[test]
fn killing_qemu_mid_run_frees_the_vm_and_a_restarted_vm_works() {
    if let Some(reason) = qemu::skip_reason() {
        println!("SKIPPED: cannot boot QEMU guests here: {reason}");
        return;
    }
    let d = Vgpud::start(&[
        TestVm::new("victim", SLICE_MIB * MIB).vsock(7),
        TestVm::new("bystander", SLICE_MIB * MIB).vsock(8),
    ]);
    let gpu_task = guest_cuda_program("gpu-task");
    let vsock_echo = qemu::build_guest_program("vsock-echo").expect("vsock-echo");
    let programs = [gpu_task, vsock_echo];
    let files = [(ptx("saxpy.sm_80.ptx"), SAXPY)];

    // The victim holds 64 MiB and launches kernels until it dies.
    let mut victim_spec = cuda_guest(
        &d,
        "victim",
        "vm-kill-victim",
        &programs,
        &files,
        &format!("gpu-task hold {VICTIM_HOLD_MIB} 0 {SAXPY}\necho \"holder status $?\"\n"),
    );
    victim_spec.timeout = GUEST_TIMEOUT;
    // The bystander is busy too, until the host says stop.
    let mut bystander_spec = cuda_guest(
        &d,
        "bystander",
        "vm-kill-bystander",
        &programs,
        &files,
        &format!(
            "gpu-task hold {BYSTANDER_HOLD_MIB} 0 {SAXPY} >/tmp/hold.log 2>&1 &\n\
             HOLDER=$!\n\
             for i in $(seq 600); do grep -q holding /tmp/hold.log && break; usleep 50000; done\n\
             echo BYSTANDER-BUSY\n\
             VSOCK_ECHO_TIMEOUT=200 vsock-echo listen {GO_PORT} 1 || exit 11\n\
             kill $HOLDER; wait $HOLDER; echo \"holder status $?\"\n\
             cat /tmp/hold.log\n"
        ),
    );
    bystander_spec.timeout = GUEST_TIMEOUT;
    let mut victim = d.guest_ok(Guest::boot(&victim_spec), "boot the victim");
    let mut bystander = d.guest_ok(Guest::boot(&bystander_spec), "boot the bystander");

    d.guest_ok(
        victim.wait_for_line("GPU-TASK progress", GUEST_TIMEOUT),
        "the victim holds memory and runs kernels",
    );
    d.guest_ok(
        bystander.wait_for_line("BYSTANDER-BUSY", GUEST_TIMEOUT),
        "the bystander runs kernels",
    );
    let before = d.vm("victim");
    assert!(
        before["memory_used"].as_u64().unwrap_or(0) >= VICTIM_HOLD_MIB * MIB,
        "{before:#}"
    );
    assert_eq!(
        before["sessions"].as_array().map(Vec::len),
        Some(1),
        "{before:#}"
    );
    let kernels = |v: &serde_json::Value| v["stats"]["kernels"].as_u64().unwrap_or(0);
    // Busy: its kernel count moves.
    let k0 = kernels(&before);
    d.wait_vm("victim", "kernels while busy", RELEASE_TIMEOUT, |v| {
        kernels(v) > k0
    });

    // SIGKILL QEMU in the middle of the run.
    let killed_at = Instant::now();
    victim.kill();
    let after = d.wait_vm(
        "victim",
        "memory freed after SIGKILL",
        RELEASE_TIMEOUT,
        |v| v["memory_used"] == 0 && v["sessions"].as_array().is_some_and(Vec::is_empty),
    );
    let released_in = killed_at.elapsed();
    assert_eq!(after["accepting_sessions"], true, "{after:#}");
    assert_eq!(after["vsock"]["stats"]["connections_open"], 0, "{after:#}");
    assert!(
        after["vsock"]["stats"]["device_resets"]
            .as_u64()
            .unwrap_or(0)
            >= 1,
        "{after:#}"
    );

    // The other VM is still served: its kernels keep completing.
    let k_by = kernels(&d.vm("bystander"));
    d.wait_vm(
        "bystander",
        "kernels after the other VM was killed",
        RELEASE_TIMEOUT,
        |v| kernels(v) >= k_by + KERNELS_AFTER_KILL,
    );

    // The restarted VM, on the same socket, gets its whole slice back.
    let mut restart_spec = cuda_guest(
        &d,
        "victim",
        "vm-kill-restarted",
        &programs,
        &files,
        &format!(
            "gpu-task alloc {RESTART_ALLOC_MIB} 0; echo \"alloc status $?\"\n\
             gpu-task saxpy {SAXPY} 1024 3; echo \"saxpy status $?\"\n"
        ),
    );
    restart_spec.timeout = GUEST_TIMEOUT;
    let restarted = d.guest_ok(qemu::run_guest(&restart_spec), "the restarted guest");
    let out = restarted.output_text();
    assert_eq!(restarted.exit_code, 0, "{out}\nvgpud log:\n{}", d.log());
    assert!(
        out.contains(&format!(
            "GPU-TASK alloc mib={RESTART_ALLOC_MIB} result=0 CUDA_SUCCESS"
        )),
        "{out}"
    );
    assert!(out.contains("alloc status 0"), "{out}");
    assert!(out.contains("GPU-TASK saxpy n=1024 rounds=3 ok"), "{out}");
    let v = d.vm("victim");
    assert_eq!(v["vsock"]["stats"]["frontend_connections"], 2, "{v:#}");
    assert_eq!(v["memory_used"], 0, "{v:#}");

    // The bystander ran through all of it; stop it and check its results.
    signal_guest(&d, "bystander", GO_PORT, GUEST_TIMEOUT);
    let by = d.guest_ok(bystander.wait_exit(GUEST_TIMEOUT), "the bystander's run");
    let by_out = by.output_text();
    assert_eq!(by.exit_code, 0, "{by_out}\nvgpud log:\n{}", d.log());
    assert!(by_out.contains("holder status 0"), "{by_out}");
    assert!(by_out.contains("GPU-TASK hold done rounds="), "{by_out}");
    assert!(!by_out.contains("FAIL"), "{by_out}");
    d.wait_vm("bystander", "memory returned", RELEASE_TIMEOUT, |v| {
        v["memory_used"] == 0
    });
    println!(
        "vm_kill: victim memory released {:.2} s after SIGKILL; restarted guest ran in {:.2} s; \
         bystander ran {:.2} s ({})",
        released_in.as_secs_f64(),
        restarted.elapsed.as_secs_f64(),
        by.elapsed.as_secs_f64(),
        by.accel.as_str()
    );
}
