//! A plain C program linked against vgpu's libcuda.so, talking to a real
//! vgpud over unix sockets: results, slice enforcement, isolation between
//! tenants, and release of everything when a client is killed mid-call.

use std::process::Command;
use std::time::Duration;

use vgpu_tests::harness::{
    TestVm, Vgpud, artifacts, build_c_program, hold, run_against, run_against_with,
};

const MIB: u64 = 1 << 20;

#[test]
fn the_driver_api_works_end_to_end() {
    let d = Vgpud::start(&[TestVm::new("vm1", 256 * MIB)]);
    let prog = build_c_program("driver_api");
    let r = run_against(&d, "vm1", &prog, &["basic"]);
    r.assert_checks_passed(&d, 50);
    assert!(
        r.stdout.contains(&format!("total {}", 256 * MIB)),
        "{}",
        r.stdout
    );
    // The session ended and released everything it held.
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}

/// `CUDA_VISIBLE_DEVICES` as NVIDIA's driver reads it: the VM's GPU by index or UUID (prefix),
/// or no GPU for CUDA (an empty list, another index), while NVML and vgpu-smi still answer.
#[test]
fn cuda_visible_devices_shows_or_hides_the_gpu_as_nvidias_driver_does() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    let prog = build_c_program("driver_api");
    let listed = Command::new(&artifacts().vgpu_smi)
        .arg("-L")
        .env("VGPU_TRANSPORT", d.transport("vm1"))
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    let uuid = listed
        .split("(UUID: ")
        .nth(1)
        .and_then(|u| u.split(')').next())
        .unwrap_or_else(|| {
            panic!("vgpu-smi -L printed no UUID (it ignores CUDA_VISIBLE_DEVICES): {listed}")
        });
    let run = |visible: &str| {
        let out = Command::new(&prog)
            .arg("basic")
            .env("VGPU_TRANSPORT", d.transport("vm1"))
            .env("CUDA_VISIBLE_DEVICES", visible)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for shown in ["0", "0,1", &uuid[..12], uuid] {
        let (ok, stdout, stderr) = run(shown);
        assert!(ok, "CUDA_VISIBLE_DEVICES={shown:?}:\n{stdout}\n{stderr}");
    }
    for hidden in ["", "1", "1,0", "GPU-00000000", "MIG-0"] {
        let (ok, stdout, stderr) = run(hidden);
        assert!(
            !ok,
            "CUDA_VISIBLE_DEVICES={hidden:?} showed the GPU:\n{stdout}"
        );
        assert!(
            stdout.contains("FAIL cuInit: got 100 (CUDA_ERROR_NO_DEVICE)"),
            "CUDA_VISIBLE_DEVICES={hidden:?}:\n{stdout}"
        );
        assert!(
            stderr.contains("does not name this VM's GPU"),
            "CUDA_VISIBLE_DEVICES={hidden:?}:\n{stderr}"
        );
    }
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}

/// Runs the C program `name` against a fresh vgpud with a 64 MiB VM: every check passes, at
/// least `min_ok` of them ran, and the VM's memory is all given back.
fn runs_clean(name: &str, min_ok: usize) {
    runs_clean_with(name, min_ok, &[]);
}

/// [`runs_clean`] with more environment variables for the program.
fn runs_clean_with(name: &str, min_ok: usize, env: &[(&str, &str)]) {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    let prog = build_c_program(name);
    run_against_with(&d, "vm1", &prog, &[], env).assert_checks_passed(&d, min_ok);
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}

/// A thread waiting in `cuStreamSynchronize`, `cuEventSynchronize` or `cuCtxSynchronize` (or
/// in a call that waits for earlier work: synchronous copies, `cuMemFree`, `cuCtxDestroy`,
/// `cuMemFreeHost` of a mapped buffer, `cuMemHostUnregister`) does not stop the process's other
/// threads, whose calls complete meanwhile and whose write releases the wait
/// (tests/c/sync_threads.c; before, the program deadlocked). Also with registered memory kept
/// private, as on the VM transports: an asynchronous copy into it waits for its bytes.
#[test]
fn a_waiting_thread_does_not_stop_the_others() {
    runs_clean("sync_threads", 100);
    runs_clean_with("sync_threads", 100, &[("VGPU_SHARE_PINNED", "0")]);
}

/// Stream capture of the per-thread default stream (`_ptsz` entry points with stream 0,
/// `CU_STREAM_PER_THREAD`, and the forms `cuGetProcAddress` hands out for it), two threads at
/// once (tests/c/capture_per_thread.c; before, the capture never saw the work sent to it).
#[test]
fn the_per_thread_default_stream_is_captured() {
    runs_clean("capture_per_thread", 60);
}

/// Green contexts: the device's SMs split as CUDA splits them for compute capability 8.0, a
/// green context from a piece, its streams, events and resources, and its kernels on its share
/// of a simulated GPU of 8 units (`%nsmid` 4, `%smid` below 4), the primary context's on all 8;
/// what it allocated outlives it (tests/c/green_ctx.c).
#[test]
fn a_green_contexts_kernels_run_on_its_multiprocessors() {
    let d = Vgpud::start_config(
        &Vgpud::config_for(&[TestVm::new("vm1", 64 * MIB)], "")
            .replace("workers = 2\n", "workers = 8\n"),
    );
    let prog = build_c_program("green_ctx");
    run_against_with(&d, "vm1", &prog, &[], &[]).assert_checks_passed(&d, 80);
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}

/// CUDA 12.5's context-wide events: `cuCtxRecordEvent` captures every stream's work,
/// `cuCtxWaitEvent` holds all later work of the context (tests/c/ctx_events.c).
#[test]
fn context_wide_events_record_and_hold_every_stream() {
    runs_clean("ctx_events", 40);
}

/// CUDA 12.8's batches of 3-D copies between pitched device memory, host memory and CUDA
/// arrays, and their refusals (tests/c/memcpy_batch3d.c).
#[test]
fn batches_of_3d_copies_move_boxes_through_pointers_and_arrays() {
    runs_clean("memcpy_batch3d", 30);
}

#[test]
fn the_driver_api_the_runtimes_resolve_works() {
    runs_clean("driver_api_ext", 100);
}

/// CUDA's error log: failed calls leave messages with vgpud's reasons, read from an advancing
/// iterator, through a callback and into a file (tests/c/logs.c).
#[test]
fn failed_calls_leave_messages_with_vgpuds_reasons_in_cudas_error_log() {
    const SLICE: u64 = 16 * MIB;
    let d = Vgpud::start(&[TestVm::new("vm1", SLICE)]);
    let prog = build_c_program("logs");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cuda.log");
    let r = run_against(
        &d,
        "vm1",
        &prog,
        &[&SLICE.to_string(), file.to_str().unwrap()],
    );
    r.assert_passed(&d);
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}

#[test]
fn stream_memory_operations_order_streams() {
    runs_clean("stream_mem_ops", 60);
}

#[test]
fn each_vm_fills_exactly_its_own_slice() {
    let d = Vgpud::start(&[TestVm::new("small", 48 * MIB), TestVm::new("big", 96 * MIB)]);
    let prog = build_c_program("driver_api");
    for (vm, slice) in [("small", 48 * MIB), ("big", 96 * MIB)] {
        let r = run_against(&d, vm, &prog, &["fill", &slice.to_string()]);
        assert!(r.failures().is_empty(), "{vm}: {}\n{}", r.stdout, r.stderr);
        assert!(
            r.stdout
                .contains(&format!("allocated {slice} bytes before result 2")),
            "{}",
            r.stdout
        );
    }
    d.wait_memory_used("small", 0, Duration::from_secs(5));
    d.wait_memory_used("big", 0, Duration::from_secs(5));
}

#[test]
fn tenants_cannot_read_write_or_free_each_others_memory() {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 64 * MIB)]);
    let mut h = hold(&d, "vm1", 4 * MIB);
    let prog = build_c_program("driver_api");
    let ptr = format!("{:#x}", h.ptr);
    // Another VM, and another process of the same VM: both refused.
    for vm in ["vm2", "vm1"] {
        let r = run_against(&d, vm, &prog, &["probe", &ptr]);
        assert!(r.failures().is_empty(), "{vm}: {}\n{}", r.stdout, r.stderr);
        assert_eq!(r.stdout.matches("refused").count(), 4, "{}", r.stdout);
    }
    // The holder's memory is still allocated and it is still working.
    assert!(h.child.try_wait().unwrap().is_none(), "the holder died");
    assert_eq!(d.vm("vm1")["memory_used"], 4 * MIB);
    assert_eq!(d.vm("vm2")["memory_used"], 0);
    h.child.kill().unwrap();
    h.child.wait().unwrap();
}

/// A client blocked in `cuCtxSynchronize` behind kernels that would run for
/// minutes is killed: its session notices the hang-up while it waits,
/// cancels the kernels and frees the slice at once, long before the
/// watchdog (30 s) would have ended them.
#[test]
fn a_client_killed_while_waiting_for_long_kernels_frees_its_slice_at_once() {
    let mut d = Vgpud::start_limited(&[TestVm::new("vm1", 64 * MIB)], HOSTILE_DATA_LIMIT);
    let prog = build_c_program("driver_api");
    let mut child = Command::new(prog)
        .args(["wait", &(32 * MIB).to_string()])
        .env("VGPU_TRANSPORT", d.transport("vm1"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    for l in lines.by_ref() {
        let l = l.unwrap();
        assert!(!l.starts_with("FAIL"), "{l}");
        if l == "waiting" {
            break;
        }
    }
    assert_eq!(d.vm("vm1")["memory_used"], 32 * MIB);
    // Let the synchronize reach vgpud and block there.
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = std::time::Instant::now();
    // Well under the 30 s watchdog, with room for a loaded machine (the
    // session checks every 100 ms; on an idle one this takes ~0.1 s).
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
    println!("slice freed {:?} after the kill", killed.elapsed());
    assert!(d.vm("vm1")["sessions"].as_array().unwrap().is_empty());
    assert!(d.is_running(), "vgpud died");
    assert_eq!(d.data_limit(), Some(HOSTILE_DATA_LIMIT));
}

/// SIGTERM stops vgpud promptly even while a client waits for kernels that
/// would run for minutes: the sessions end, their kernels are cancelled, and
/// the daemon logs its orderly stop.
#[test]
fn vgpud_stops_within_seconds_of_sigterm_with_kernels_running() {
    let mut d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    let prog = build_c_program("driver_api");
    let mut child = Command::new(prog)
        .args(["wait", &MIB.to_string()])
        .env("VGPU_TRANSPORT", d.transport("vm1"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    assert!(lines.any(|l| l.unwrap() == "waiting"));
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill(2) of the daemon this test started.
    assert_eq!(unsafe { libc::kill(d.pid() as i32, libc::SIGTERM) }, 0);
    let t = std::time::Instant::now();
    while d.is_running() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "vgpud still runs 5 s after SIGTERM:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("vgpud stopped {:?} after SIGTERM", t.elapsed());
    assert!(d.log().contains("vgpud stopped"), "{}", d.log());
    let _ = child.kill();
    let _ = child.wait();
}

/// Private memory vgpud may map in the tests of hostile clients below (`RLIMIT_DATA`): two VMs'
/// slices (128 MiB), a few session threads and the daemon's own 15 MiB, with room to spare. A
/// regression that made vgpud allocate what the guest declares would abort it there.
const HOSTILE_DATA_LIMIT: u64 = 1 << 30;

/// The vgpud resident set in KiB (`VmRSS`).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The register bomb from issue 17: a kernel declaring a million 64-bit
/// registers, launched with 1024-thread blocks, used to grow vgpud by about
/// 0.5 GB/s. Now it runs in a frame of the few registers it uses, the same
/// declaration with control flow that defeats register packing fails with
/// CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (701, not sticky), vgpud's memory
/// stays put, and another VM runs normally.
#[test]
fn a_register_bomb_is_refused_and_vgpud_does_not_grow() {
    let mut d = Vgpud::start_limited(
        &[TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 64 * MIB)],
        HOSTILE_DATA_LIMIT,
    );
    let prog = build_c_program("driver_api");
    let before = rss_kib(d.pid());
    let r = run_against(&d, "vm1", &prog, &["bomb"]);
    assert!(
        r.failures().is_empty() && r.code == 0,
        "{}\n{}",
        r.stdout,
        d.log()
    );
    let after = rss_kib(d.pid());
    assert!(
        after < before + 200 * 1024,
        "vgpud grew from {before} KiB to {after} KiB"
    );
    let r = run_against(&d, "vm2", &prog, &["basic"]);
    assert!(r.failures().is_empty(), "{}", r.stdout);
    assert!(d.is_running(), "vgpud died");
    assert_eq!(d.data_limit(), Some(HOSTILE_DATA_LIMIT));
}

#[test]
fn killing_a_client_mid_call_releases_its_memory_and_others_carry_on() {
    let mut d = Vgpud::start_limited(
        &[TestVm::new("vm1", 64 * MIB), TestVm::new("vm2", 64 * MIB)],
        HOSTILE_DATA_LIMIT,
    );
    let mut h = hold(&d, "vm1", 32 * MIB);
    let prog = build_c_program("driver_api");
    assert_eq!(d.vm("vm1")["memory_used"], 32 * MIB);
    assert_eq!(d.vm("vm1")["sessions"].as_array().unwrap().len(), 1);
    // The holder is copying 8 MiB at a time in a loop: SIGKILL lands mid-call.
    std::thread::sleep(Duration::from_millis(200));
    h.child.kill().unwrap();
    h.child.wait().unwrap();
    d.wait_memory_used("vm1", 0, Duration::from_secs(10));
    assert!(d.vm("vm1")["sessions"].as_array().unwrap().is_empty());
    assert!(d.is_running(), "vgpud died");
    // Both VMs work, and vm1 can use its whole slice again.
    let r = run_against(&d, "vm2", &prog, &["basic"]);
    assert!(r.failures().is_empty(), "{}", r.stdout);
    let r = run_against(&d, "vm1", &prog, &["fill", &(64 * MIB).to_string()]);
    assert!(r.failures().is_empty(), "{}", r.stdout);
    assert_eq!(d.data_limit(), Some(HOSTILE_DATA_LIMIT));
}

#[test]
fn without_a_daemon_cuinit_reports_no_device_and_says_why() {
    let prog = build_c_program("driver_api");
    let out = Command::new(prog)
        .arg("basic")
        .env("VGPU_TRANSPORT", "unix:/nonexistent/vgpu.sock")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains("FAIL cuInit: got 100 (CUDA_ERROR_NO_DEVICE)"),
        "{stdout}"
    );
    assert!(
        stderr.contains("cannot reach vgpud at unix:/nonexistent/vgpu.sock"),
        "{stderr}"
    );
}

/// `(thread name, seccomp mode, filter count)` of every thread of `pid`.
fn seccomp_of_threads(pid: u32) -> Vec<(String, u32, u32)> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue; // the thread ended meanwhile
        };
        let Ok(status) = std::fs::read_to_string(dir.join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().parse::<u32>().unwrap())
                .unwrap_or_else(|| panic!("no {name} in {}", dir.display()))
        };
        threads.push((
            comm.trim().to_string(),
            field("Seccomp:"),
            field("Seccomp_filters:"),
        ));
    }
    threads
}

/// Every vgpud thread runs under a system-call filter, and the threads that
/// read what guests and VMMs send (sessions, vhost-user devices) add their own,
/// narrower one on top of the daemon's.
#[test]
fn every_vgpud_thread_runs_under_a_seccomp_filter() {
    /// `SECCOMP_MODE_FILTER` in /proc/PID/status.
    const MODE_FILTER: u32 = 2;
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB).vsock(41)]);
    let holder = hold(&d, "vm1", MIB);
    let threads = seccomp_of_threads(d.pid());
    let named = |prefix: &str| {
        threads
            .iter()
            .filter(|(name, ..)| name.starts_with(prefix))
            .collect::<Vec<_>>()
    };
    assert!(
        threads.iter().all(|(_, mode, _)| *mode == MODE_FILTER),
        "{threads:?}"
    );
    let base = named("vgpud")[0].2;
    assert!(base >= 1, "{threads:?}");
    for kind in ["vgpu-session-", "vgpu-vsock-"] {
        let list = named(kind);
        assert!(!list.is_empty(), "no {kind} thread: {threads:?}");
        assert!(list.iter().all(|t| t.2 > base), "{kind}: {threads:?}");
    }
    drop(holder);
    assert!(d.log().contains("seccomp filters installed"), "{}", d.log());
}
