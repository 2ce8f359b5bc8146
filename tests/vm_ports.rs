//! The VM keeps a general-purpose vsock next to the GPU: a guest connection
//! to another host port reaches a host unix socket at `<vsock_uds_path>_<port>`
//! through vgpud's device (the GPU port never does: it ends inside vgpud), a
//! host program reaches a guest listener with `CONNECT <port>`, and vgpu-smi
//! inside the guest shows the VM's slice and its processes. Real QEMU guest,
//! shim installed with `guest-shim/install.sh`.
//!
//! Skips, with a printed reason, only when QEMU is missing and cannot be
//! installed.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use vgpu_tests::harness::{TestVm, Vgpud, cuda_guest, guest_cuda_program, signal_guest};
use vgpu_tests::qemu::{self, Guest};

const GUEST_TIMEOUT: Duration = Duration::from_secs(240);
const MIB: u64 = 1 << 20;
const SLICE_MIB: u64 = 128;
const HOLD_MIB: u64 = 24;
const GUEST_CID: u64 = 4;
/// Guest → host, forwarded to the test's echo server.
const ECHO_PORT: u32 = 9000;
const ECHO_BYTES: u32 = 65_536;
const ECHO_ROUNDS: u32 = 2;
/// Host → guest: the guest waits here until the host has looked.
const GO_PORT: u32 = 7000;
const JSON_BEGIN: &str = "VGPU-SMI-JSON-BEGIN";
const JSON_END: &str = "VGPU-SMI-JSON-END";

fn serve_echo(listener: UnixListener) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { return };
        thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 || stream.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        });
    }
}

/// The lines between two markers of the console output.
fn between<'a>(lines: &'a [String], begin: &str, end: &str) -> Vec<&'a str> {
    lines
        .iter()
        .skip_while(|l| !l.contains(begin))
        .skip(1)
        .take_while(|l| !l.contains(end))
        .map(String::as_str)
        .collect()
}

#[test]
fn guest_ports_are_forwarded_and_vgpu_smi_shows_the_vm() {
    if let Some(reason) = qemu::skip_reason() {
        println!("SKIPPED: cannot boot QEMU guests here: {reason}");
        return;
    }
    let d = Vgpud::start(&[TestVm::new("smi", SLICE_MIB * MIB).vsock(GUEST_CID)]);
    let uds = d.vsock_uds("smi");
    let echo = UnixListener::bind(format!("{}_{ECHO_PORT}", uds.display())).expect("echo socket");
    thread::spawn(move || serve_echo(echo));
    // A listener where a forwarded GPU port would arrive: it must stay unused.
    let gpu_port_spy =
        UnixListener::bind(format!("{}_{}", uds.display(), vgpu_proto::GPU_VSOCK_PORT))
            .expect("spy socket");
    let spied = Arc::new(AtomicUsize::new(0));
    {
        let spied = Arc::clone(&spied);
        thread::spawn(move || {
            for _ in gpu_port_spy.incoming() {
                spied.fetch_add(1, Ordering::SeqCst);
            }
        });
    }

    let gpu_task = guest_cuda_program("gpu-task");
    let vsock_echo = qemu::build_guest_program("vsock-echo").expect("vsock-echo");
    let body = format!(
        "gpu-task hold {HOLD_MIB} 0 >/tmp/hold.log 2>&1 &\n\
         HOLDER=$!\n\
         for i in $(seq 600); do grep -q holding /tmp/hold.log && break; usleep 50000; done\n\
         cat /tmp/hold.log\n\
         echo {JSON_BEGIN}\n\
         vgpu-smi --json || exit 20\n\
         echo {JSON_END}\n\
         vgpu-smi || exit 21\n\
         vsock-echo connect {host} {ECHO_PORT} {ECHO_BYTES} {ECHO_ROUNDS} || exit 22\n\
         VSOCK_ECHO_TIMEOUT=200 vsock-echo listen {GO_PORT} 1 || exit 23\n\
         kill $HOLDER; wait $HOLDER; echo \"holder status $?\"\n\
         cat /tmp/hold.log\n",
        host = qemu::HOST_CID
    );
    let mut spec = cuda_guest(&d, "smi", "vm-ports", &[gpu_task, vsock_echo], &[], &body);
    spec.timeout = GUEST_TIMEOUT;
    let mut guest = d.guest_ok(Guest::boot(&spec), "boot");
    d.guest_ok(
        guest.wait_for_line(
            &format!("VSOCK-ECHO listening port={GO_PORT}"),
            GUEST_TIMEOUT,
        ),
        "the guest reaches its listener",
    );

    // While the guest holds its memory: vgpud's view of the VM.
    let v = d.vm("smi");
    assert_eq!(v["memory_limit"], SLICE_MIB * MIB, "{v:#}");
    assert!(
        v["memory_used"].as_u64().unwrap_or(0) >= HOLD_MIB * MIB,
        "{v:#}"
    );
    let sessions = v["sessions"].as_array().expect("sessions");
    assert_eq!(sessions.len(), 1, "only the holder is connected: {v:#}");
    assert_eq!(sessions[0]["process"], "gpu-task", "{v:#}");
    assert_eq!(
        sessions[0]["transport"],
        format!("vsock:{GUEST_CID}"),
        "the session came over the vsock device: {v:#}"
    );
    let holder_pid = sessions[0]["pid"].as_u64().expect("pid");
    signal_guest(&d, "smi", GO_PORT, GUEST_TIMEOUT);

    let outcome = d.guest_ok(guest.wait_exit(GUEST_TIMEOUT), "guest run");
    let out = outcome.output_text();
    assert_eq!(
        outcome.exit_code,
        0,
        "guest output:\n{out}\nvgpud log:\n{}",
        d.log()
    );
    assert!(
        out.contains(&format!("GPU-TASK holding mib={HOLD_MIB} ")),
        "{out}"
    );
    assert!(out.contains(&format!("pid={holder_pid}")), "{out}");

    // vgpu-smi --json inside the guest: this VM, its slice, its process.
    let json = between(&outcome.payload_output, JSON_BEGIN, JSON_END).join("\n");
    let smi: serde_json::Value = serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("vgpu-smi --json printed no JSON ({e}):\n{json}\n{out}"));
    assert_eq!(smi["vm"], "smi", "{smi:#}");
    assert_eq!(smi["memory"]["total"], SLICE_MIB * MIB, "{smi:#}");
    assert!(
        smi["memory"]["used"].as_u64().unwrap_or(0) >= HOLD_MIB * MIB,
        "{smi:#}"
    );
    assert_eq!(smi["device"]["kind"], "sim", "{smi:#}");
    let procs = smi["processes"].as_array().expect("processes");
    assert_eq!(procs.len(), 1, "vgpu-smi lists the holder only: {smi:#}");
    assert_eq!(procs[0]["process"], "gpu-task", "{smi:#}");
    assert_eq!(procs[0]["pid"], holder_pid, "{smi:#}");
    assert!(
        procs[0]["memory_used"].as_u64().unwrap_or(0) >= HOLD_MIB * MIB,
        "{smi:#}"
    );
    // ... and its table.
    assert!(
        out.contains(&format!("Memory-Usage: {HOLD_MIB}MiB / {SLICE_MIB}MiB")),
        "{out}"
    );
    assert!(out.contains("VM: smi"), "{out}");
    assert!(
        outcome
            .payload_output
            .iter()
            .any(|l| l.contains(&holder_pid.to_string()) && l.contains("gpu-task")),
        "{out}"
    );

    // Forwarding both ways.
    assert!(
        out.contains(&format!(
            "VSOCK-ECHO connect ok cid=2 port={ECHO_PORT} bytes={ECHO_BYTES} rounds={ECHO_ROUNDS}"
        )),
        "{out}"
    );
    assert!(out.contains("VSOCK-ECHO listen ok connections=1"), "{out}");
    assert!(out.contains("holder status 0"), "{out}");
    assert!(out.contains("GPU-TASK hold done"), "{out}");
    assert_eq!(
        spied.load(Ordering::SeqCst),
        0,
        "the GPU port must end inside vgpud, never at <uds>_{}",
        vgpu_proto::GPU_VSOCK_PORT
    );

    let v = d.wait_vm("smi", "memory returned", GUEST_TIMEOUT, |v| {
        v["memory_used"] == 0
    });
    let vsock = &v["vsock"]["stats"];
    // Sessions: the holder and two vgpu-smi runs; plus the echo connection
    // and the host's CONNECT.
    assert_eq!(v["stats"]["sessions_total"], 3, "{v:#}");
    assert_eq!(vsock["connections_total"], 5, "{v:#}");
    assert_eq!(vsock["dropped_chains"], 0, "{v:#}");
    println!(
        "vm_ports: boot to payload {:.2} s, whole run {:.2} s ({})",
        outcome.boot_to_payload.unwrap_or_default().as_secs_f64(),
        outcome.elapsed.as_secs_f64(),
        outcome.accel.as_str()
    );
}
