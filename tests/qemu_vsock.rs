//! A real guest talks to vgpud's vhost-user vsock device (vgpu_vhost_vsock)
//! under QEMU's `vhost-user-vsock-pci`: the guest gets its configured CID,
//! guest→host connections to CID 2 reach `<uds_path>_<port>`, a refused port
//! resets the guest's connect, and host→guest connections made with
//! `CONNECT <port>` on `uds_path` reach a guest listener. Data is checked
//! byte for byte in both directions.
//!
//! Skips, with a printed reason, when QEMU is missing and cannot be installed.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use vgpu_tests::qemu::{self, Guest, GuestSpec};
use vgpu_vhost_vsock::{PortConnector, StopHandle, VsockConfig, serve};

const GUEST_TIMEOUT: Duration = Duration::from_secs(180);
const SOCKET_WAIT: Duration = Duration::from_secs(10);
const GUEST_CID: u64 = 7;
/// Guest→host: forwarded to the echo server at `<uds_path>_9000`.
const ECHO_PORT: u32 = 9000;
/// Guest→host: refused by the connector.
const REFUSED_PORT: u32 = 9001;
/// Host→guest: the guest's `vsock-echo listen`.
const GUEST_PORT: u32 = 7000;
const GUEST_TO_HOST_BYTES: u32 = 262_144;
const GUEST_TO_HOST_ROUNDS: u32 = 4;
const HOST_TO_GUEST_BYTES: usize = 100_000;

/// Forwards every port except [`REFUSED_PORT`], which it refuses.
struct RefuseOne;

impl PortConnector for RefuseOne {
    fn connect(&self, port: u32) -> Option<io::Result<vgpu_vhost_vsock::Endpoint>> {
        (port == REFUSED_PORT).then(|| {
            Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "refused by the test",
            ))
        })
    }
}

fn wait_for_path(path: &Path) {
    let deadline = Instant::now() + SOCKET_WAIT;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} did not appear within {SOCKET_WAIT:?}",
            path.display()
        );
        thread::sleep(Duration::from_millis(10));
    }
}

fn serve_echo(listener: UnixListener) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { return };
        thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if stream.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
}

#[test]
fn guest_and_host_talk_over_the_vhost_user_vsock_device() {
    if let Some(reason) = qemu::skip_reason() {
        println!("SKIPPED: cannot boot QEMU guests here: {reason}");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("vm.vhost.sock");
    let uds = dir.path().join("vm.vsock");
    let echo_listener = UnixListener::bind(format!("{}_{ECHO_PORT}", uds.display()))
        .expect("bind the host echo socket");
    thread::spawn(move || serve_echo(echo_listener));

    let stop = StopHandle::new().expect("stop handle");
    let server = {
        let config = VsockConfig::new(GUEST_CID, &socket, &uds);
        let stop = stop.clone();
        thread::spawn(move || serve(config, Arc::new(RefuseOne), stop))
    };
    wait_for_path(&socket);

    let echo = qemu::build_guest_program("vsock-echo").expect("build vsock-echo");
    let script = format!(
        "vsock-echo local-cid\n\
         vsock-echo connect {host} {ECHO_PORT} {GUEST_TO_HOST_BYTES} {GUEST_TO_HOST_ROUNDS} || exit 10\n\
         vsock-echo connect {host} {REFUSED_PORT} 16\n\
         echo \"refused status $?\"\n\
         vsock-echo listen {GUEST_PORT} 1 || exit 11\n",
        host = qemu::HOST_CID
    );
    let mut spec = GuestSpec::new("qemu-vsock-vgpud", script);
    spec.timeout = GUEST_TIMEOUT;
    spec.vhost_user_vsock = Some(socket.clone());
    spec.payload.push((echo, "/payload/bin/vsock-echo".into()));

    let mut guest = Guest::boot(&spec).expect("boot");
    let ready = guest
        .wait_for_line(qemu::MARKER_READY, GUEST_TIMEOUT)
        .expect("ready marker");
    assert!(
        ready.contains("vsock=yes"),
        "the guest bound no vsock device: {ready}"
    );
    guest
        .wait_for_line(
            &format!("VSOCK-ECHO listening port={GUEST_PORT}"),
            GUEST_TIMEOUT,
        )
        .expect("guest listener");

    // Host → guest, hybrid-vsock style.
    let mut stream = UnixStream::connect(&uds).expect("connect to uds_path");
    stream
        .set_read_timeout(Some(GUEST_TIMEOUT))
        .expect("read timeout");
    stream
        .write_all(format!("CONNECT {GUEST_PORT}\n").as_bytes())
        .expect("CONNECT");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut reply = String::new();
    reader.read_line(&mut reply).expect("CONNECT reply");
    assert!(reply.starts_with("OK "), "CONNECT reply: {reply:?}");
    let data: Vec<u8> = (0..HOST_TO_GUEST_BYTES)
        .map(|i| (i * 7 + 3) as u8)
        .collect();
    // The guest echoes as it reads; write from another thread so neither side
    // blocks on a full buffer.
    let writer = {
        let mut stream = stream.try_clone().expect("clone");
        let data = data.clone();
        thread::spawn(move || stream.write_all(&data))
    };
    let mut back = vec![0u8; data.len()];
    reader.read_exact(&mut back).expect("echo from the guest");
    writer
        .join()
        .expect("writer thread")
        .expect("write to the guest");
    assert!(back == data, "the guest echoed different bytes");
    drop(reader);
    drop(stream);

    let outcome = guest.wait_exit(GUEST_TIMEOUT).expect("guest run");
    stop.stop();
    server
        .join()
        .expect("server thread")
        .expect("vsock server result");

    let output = outcome.output_text();
    assert_eq!(outcome.exit_code, 0, "{output}");
    assert!(
        output.contains(&format!("VSOCK-ECHO local-cid {GUEST_CID}")),
        "{output}"
    );
    assert!(
        output.contains(&format!(
            "VSOCK-ECHO connect ok cid=2 port={ECHO_PORT} bytes={GUEST_TO_HOST_BYTES} rounds={GUEST_TO_HOST_ROUNDS}"
        )),
        "{output}"
    );
    assert!(
        output.contains("VSOCK-ECHO connect error: connect: Connection reset by peer"),
        "{output}"
    );
    assert!(output.contains("refused status 1"), "{output}");
    assert!(output.contains("VSOCK-ECHO accepted cid=2"), "{output}");
    assert!(
        output.contains(&format!(
            "VSOCK-ECHO listen ok connections=1 bytes={HOST_TO_GUEST_BYTES}"
        )),
        "{output}"
    );
    println!(
        "vsock guest: boot to payload {:.2} s, whole run {:.2} s ({})",
        outcome.boot_to_payload.unwrap_or_default().as_secs_f64(),
        outcome.elapsed.as_secs_f64(),
        outcome.accel.as_str()
    );
}
