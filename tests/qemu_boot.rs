//! Boots the vgpu test guest under QEMU (TCG unless KVM really works) and
//! checks what the end-to-end tests rely on: the payload runs, its exit status
//! and output come back, the vsock modules are loaded, and AF_VSOCK works in
//! the guest (over the loopback transport, so no vsock device is needed).
//!
//! Skips, with a printed reason, when QEMU is missing and cannot be installed.

use std::time::Duration;

use vgpu_tests::qemu::{self, Guest, GuestSpec, QemuError};

/// Generous for TCG on a loaded 2-core machine; a boot takes ~4 s.
const GUEST_TIMEOUT: Duration = Duration::from_secs(180);
const VSOCK_MODULES: &[&str] = &[
    "vsock",
    "vmw_vsock_virtio_transport_common",
    "vmw_vsock_virtio_transport",
    "virtio_pci",
];

fn skip() -> bool {
    match qemu::skip_reason() {
        Some(reason) => {
            println!("SKIPPED: cannot boot QEMU guests here: {reason}");
            true
        }
        None => false,
    }
}

#[test]
fn guest_runs_the_payload_and_reports_kernel_modules_and_exit_status() {
    if skip() {
        return;
    }
    let image = qemu::ensure_image().expect("guest image");
    let mut script = String::from("echo \"kernel $(uname -r)\"\n");
    for module in VSOCK_MODULES {
        script.push_str(&format!(
            "if [ -d /sys/module/{module} ]; then echo 'module {module} loaded'; \
             else echo 'module {module} MISSING'; fi\n"
        ));
    }
    script.push_str("echo \"payload dir $(pwd)\"\nprintf 'no newline'\nexit 7\n");
    let mut spec = GuestSpec::new("qemu-boot-basic", script);
    spec.timeout = GUEST_TIMEOUT;

    let mut guest = Guest::boot(&spec).expect("boot");
    let boot_line = guest
        .wait_for_line(qemu::MARKER_BOOT, GUEST_TIMEOUT)
        .expect("boot marker");
    assert!(
        boot_line.contains(&format!("kernel={}", image.manifest.kernel_release)),
        "{boot_line}"
    );
    let outcome = guest.wait_exit(GUEST_TIMEOUT).expect("guest run");

    assert_eq!(
        outcome.exit_code,
        7,
        "console:\n{}",
        outcome.console.join("\n")
    );
    let output = outcome.output_text();
    assert!(
        output.contains(&format!("kernel {}", image.manifest.kernel_release)),
        "{output}"
    );
    for module in VSOCK_MODULES {
        assert!(
            output.contains(&format!("module {module} loaded")),
            "{output}"
        );
    }
    assert!(output.contains("payload dir /payload"), "{output}");
    assert_eq!(
        outcome.payload_output.last().map(String::as_str),
        Some("no newline")
    );
    assert!(
        !outcome
            .console
            .iter()
            .any(|l| l.contains(qemu::MARKER_WARN)),
        "/init warned:\n{}",
        outcome.console.join("\n")
    );
    let boot = outcome.boot_to_payload.expect("payload start marker");
    println!(
        "boot to payload: {:.2} s, whole run: {:.2} s ({})",
        boot.as_secs_f64(),
        outcome.elapsed.as_secs_f64(),
        outcome.accel.as_str()
    );
}

#[test]
fn vsock_echo_runs_in_the_guest_over_the_loopback_transport() {
    if skip() {
        return;
    }
    const PORT: u32 = 5123;
    const BYTES: u32 = 200_000;
    const ROUNDS: u32 = 3;
    let echo = qemu::build_guest_program("vsock-echo").expect("build vsock-echo");
    let smoke = qemu::build_guest_program("cuda-smoke").expect("build cuda-smoke");
    let script = format!(
        "vsock-echo listen {PORT} 1 >/tmp/listen.log 2>&1 &\n\
         for i in $(seq 100); do grep -q listening /tmp/listen.log && break; usleep 50000; done\n\
         vsock-echo connect 1 {PORT} {BYTES} {ROUNDS} || exit 10\n\
         wait $! || exit 11\n\
         cat /tmp/listen.log\n\
         vsock-echo local-cid\n\
         vsock-echo connect 1 {} 16\n\
         echo \"refused status $?\"\n\
         cuda-smoke\n\
         echo \"cuda-smoke status $?\"\n",
        PORT + 1
    );
    let mut spec = GuestSpec::new("qemu-boot-vsock-loopback", script);
    spec.timeout = GUEST_TIMEOUT;
    spec.payload.push((echo, "/payload/bin/vsock-echo".into()));
    spec.payload
        .push((smoke, "/usr/local/bin/cuda-smoke".into()));
    let outcome = qemu::run_guest(&spec).expect("guest run");
    let output = outcome.output_text();
    assert_eq!(outcome.exit_code, 0, "{output}");
    assert!(
        output.contains(&format!(
            "VSOCK-ECHO connect ok cid=1 port={PORT} bytes={BYTES} rounds={ROUNDS}"
        )),
        "{output}"
    );
    assert!(output.contains("VSOCK-ECHO accepted cid=1"), "{output}");
    assert!(
        output.contains(&format!(
            "VSOCK-ECHO listen ok connections=1 bytes={}",
            BYTES * ROUNDS
        )),
        "{output}"
    );
    // No vsock device: only the loopback transport, whose CID is 1
    // (VMADDR_CID_LOCAL); with vgpud's device it is the configured guest_cid.
    assert!(output.contains("VSOCK-ECHO local-cid 1"), "{output}");
    // Nobody listens on the next port: the connection is refused, status 1.
    assert!(
        output.contains("VSOCK-ECHO connect error: connect: Connection reset by peer"),
        "{output}"
    );
    assert!(output.contains("refused status 1"), "{output}");
    // No libcuda.so.1 in this guest: the smoke test says so and exits 3.
    assert!(
        output.contains("CUDA-SMOKE NO-DRIVER libcuda.so.1"),
        "{output}"
    );
    assert!(output.contains("cuda-smoke status 3"), "{output}");
}

#[test]
fn without_a_script_the_guest_offers_a_shell_on_the_console() {
    if skip() {
        return;
    }
    let mut spec = GuestSpec::new("qemu-boot-shell", "");
    spec.timeout = GUEST_TIMEOUT;
    let mut guest = Guest::boot(&spec).expect("boot");
    guest
        .wait_for_line(qemu::MARKER_SHELL, GUEST_TIMEOUT)
        .expect("shell marker");
    guest.send_line("echo typed-$((6 * 7))").expect("type");
    // The echoed command line has `$((6 * 7))`; only the shell's answer has 42.
    guest
        .wait_for_line("typed-42", GUEST_TIMEOUT)
        .expect("shell output");
    guest.send_line("exit 5").expect("type");
    let outcome = guest.wait_exit(GUEST_TIMEOUT).expect("power off");
    assert_eq!(outcome.exit_code, 5, "{}", outcome.console.join("\n"));
    assert!(outcome.boot_to_payload.is_none());
}

#[test]
fn qemu_failures_reach_the_caller_with_qemu_messages() {
    if skip() {
        return;
    }
    // A path that exists but is no socket: QEMU cannot connect and exits at once.
    let dir = tempfile::tempdir().expect("tempdir");
    let not_a_socket = dir.path().join("vm.vhost.sock");
    std::fs::write(&not_a_socket, b"").expect("write");
    let mut spec = GuestSpec::new("qemu-boot-bad-socket", "true");
    spec.timeout = GUEST_TIMEOUT;
    spec.vhost_user_vsock = Some(not_a_socket.clone());
    let mut guest = Guest::boot(&spec).expect("QEMU starts");
    let err = guest.wait_exit(GUEST_TIMEOUT).expect_err("QEMU must fail");
    let message = err.to_string();
    assert!(matches!(err, QemuError::NoExitMarker { .. }), "{message}");
    assert!(message.contains("[qemu]"), "{message}");
    assert!(
        message.contains(&*not_a_socket.to_string_lossy()),
        "QEMU's message names the socket: {message}"
    );
}

#[test]
fn a_guest_that_overruns_its_wait_times_out_and_is_killed() {
    if skip() {
        return;
    }
    const SHORT: Duration = Duration::from_secs(1);
    let mut spec = GuestSpec::new("qemu-boot-timeout", "sleep 600");
    spec.timeout = GUEST_TIMEOUT;
    let mut guest = Guest::boot(&spec).expect("boot");
    let pid = guest.pid();
    let err = guest
        .wait_for_line("never printed", SHORT)
        .expect_err("must time out");
    assert!(matches!(err, QemuError::Timeout { .. }), "{err}");
    // After wait_for_line QEMU still runs; wait_exit's timeout kills it.
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    let err = guest.wait_exit(SHORT).expect_err("must time out");
    let message = err.to_string();
    assert!(matches!(err, QemuError::Timeout { .. }), "{message}");
    assert!(message.contains("the guest to power off"), "{message}");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "QEMU (pid {pid}) still exists after the timeout"
    );
}
