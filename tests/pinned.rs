//! Page-locked host memory shared with vgpud over the unix socket (issue 22): a C program
//! (tests/c/pinned.c) allocates with `cuMemAllocHost`/`cuMemHostAlloc` and copies from and to
//! the buffers, synchronously and asynchronously, at several sizes and offsets; the buffers are
//! memfds shared with vgpud, or private ones with sharing turned off, and the data is the same.

use std::process::Command;
use std::time::Duration;

use vgpu_tests::harness::{Run, TestVm, Vgpud, artifacts, build_c_program};

const MIB: u64 = 1 << 20;

fn run(share: bool) -> (Run, Vgpud) {
    let d = Vgpud::start(&[TestVm::new("vm1", 64 * MIB)]);
    let out = Command::new(build_c_program("pinned"))
        .arg(if share { "shared" } else { "private" })
        .env("VGPU_TRANSPORT", d.transport("vm1"))
        .env("VGPU_SHARE_PINNED", if share { "1" } else { "0" })
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
    let (r, d) = run(true);
    assert_passed(&r, &d);
}

#[test]
fn with_sharing_off_pinned_copies_take_the_ordinary_path() {
    let (r, d) = run(false);
    assert_passed(&r, &d);
}
