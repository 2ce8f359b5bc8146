//! Page-locked host memory shared with vgpud over the unix socket (issue 22): a C program
//! (tests/c/pinned.c) allocates with `cuMemAllocHost`/`cuMemHostAlloc` and copies from and to
//! the buffers, synchronously and asynchronously, at several sizes and offsets; the buffers are
//! memfds shared with vgpud, or private ones with sharing turned off, and the data is the same.
//! Synchronous copies of shared buffers are rung in the session's doorbell page (no frames), or
//! sent as frames with `VGPU_DOORBELL=off`: the data is the same too. Kernels use the buffers at
//! their host addresses (tests/c/pinned_kernels.c).

use std::process::Command;
use std::time::Duration;

use vgpu_tests::harness::{Run, TestVm, Vgpud, artifacts, build_c_program, run_against_with};

const MIB: u64 = 1 << 20;

/// What the shim's debug log says when it opened the doorbell page.
const DOORBELL_OPEN: &str = "doorbell page open";

fn run(share: bool, doorbell: bool) -> (Run, Vgpud) {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    let out = Command::new(build_c_program("pinned"))
        .arg(if share { "shared" } else { "private" })
        .env("VGPU_TRANSPORT", d.transport("vm1"))
        .env("VGPU_SHARE_PINNED", if share { "1" } else { "0" })
        .env("VGPU_DOORBELL", if doorbell { "on" } else { "off" })
        .env("VGPU_LOG", "debug")
        .env("LD_LIBRARY_PATH", &artifacts().lib_dir)
        .output()
        .expect("running the test program");
    let r = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    (r, d)
}

fn assert_passed(r: &Run, d: &Vgpud) {
    assert!(
        r.failures().is_empty() && r.code == 0,
        "exit {}\n{}\n{}\n{}",
        r.code,
        r.stdout,
        r.stderr,
        d.log()
    );
    let n = r.stdout.lines().filter(|l| l.starts_with("ok ")).count();
    assert!(n >= 140, "only {n} checks\n{}", r.stdout);
    for l in r
        .stdout
        .lines()
        .filter(|l| l.contains("straddl") && l.ends_with("data"))
    {
        eprintln!("{l}");
    }
    // Every byte of device memory came back.
    d.wait_memory_used("vm1", 0, Duration::from_secs(5));
}

#[test]
fn pinned_buffers_are_shared_with_vgpud_and_copies_check_out() {
    let (r, d) = run(true, true);
    assert_passed(&r, &d);
    assert!(r.stderr.contains(DOORBELL_OPEN), "{}", r.stderr);
}

#[test]
fn with_the_doorbell_off_shared_copies_go_in_frames_and_check_out() {
    let (r, d) = run(true, false);
    assert_passed(&r, &d);
    assert!(!r.stderr.contains(DOORBELL_OPEN), "{}", r.stderr);
}

#[test]
fn with_sharing_off_pinned_copies_take_the_ordinary_path() {
    let (r, d) = run(false, true);
    assert_passed(&r, &d);
    // No shared buffer, no shared copy: no doorbell either.
    assert!(!r.stderr.contains(DOORBELL_OPEN), "{}", r.stderr);
}

/// Kernels on page-locked memory at its host address (tests/c/pinned_kernels.c), with the
/// buffers shared with vgpud and with them private.
#[test]
fn kernels_use_page_locked_memory_at_its_host_address() {
    for share in ["1", "0"] {
        println!("VGPU_SHARE_PINNED={share}");
        let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
        let prog = build_c_program("pinned_kernels");
        let r = run_against_with(&d, "vm1", &prog, &[], &[("VGPU_SHARE_PINNED", share)]);
        r.assert_passed(&d);
        d.wait_memory_used("vm1", 0, Duration::from_secs(5));
    }
}
