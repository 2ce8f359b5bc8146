//! VMM disconnect and reconnect, guest reboot (device reset), memory-table changes and stopping.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use vgpu_vmm_testutils::vsock::{
    ChannelConnector, EchoConnector, GuestOptions, RawDesc, TestGuest, TestServer, pattern,
};

const PORT: u32 = 9999;
const T: Duration = Duration::from_secs(10);

fn echo(guest: &TestGuest, port: u32, msg: &[u8]) {
    let s = guest.connect(port).unwrap();
    s.write_all(msg).unwrap();
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, msg);
    s.close(T).unwrap();
}

fn assert_eof(mut s: UnixStream, what: &str) {
    s.set_read_timeout(Some(T)).unwrap();
    let mut rest = Vec::new();
    match s.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{what}: {e}"),
    }
}

#[test]
fn vmm_disconnect_closes_everything_and_a_new_vmm_is_served() {
    let (conn, rx) = ChannelConnector::new(&[PORT]);
    let server = TestServer::start(conn, |_| {}).unwrap();
    let fwd_path = format!("{}_{}", server.config.uds_path.display(), 1234);
    let fwd = UnixListener::bind(&fwd_path).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();

    let a = guest.connect(PORT).unwrap();
    let (_, session) = rx.recv_timeout(T).unwrap();
    let b = guest.connect(1234).unwrap();
    let (forwarded, _) = fwd.accept().unwrap();
    guest.listen(5000);
    let mut client = UnixStream::connect(&server.config.uds_path).unwrap();
    client.write_all(b"CONNECT 5000\n").unwrap();
    let c = guest.accept(5000, T).unwrap();
    let mut ok = [0u8; 14];
    client.read_exact(&mut ok).unwrap();
    assert_eq!(&ok, b"OK 1073741824\n");
    a.write_all(b"in flight").unwrap();
    server.wait_stats(T, |s| s.connections_open == 3).unwrap();

    // The VMM goes away (QEMU killed): every host side sees end of file.
    guest.disconnect();
    drop((a, b, c));
    assert_eof(session, "in-process session");
    assert_eof(forwarded, "forwarded socket");
    assert_eof(client, "host-initiated client");
    let st = server
        .wait_stats(T, |s| s.device_resets == 1 && s.connections_open == 0)
        .unwrap();
    assert_eq!(st.frontend_connections, 1);

    // While no VMM is attached, host clients are turned away at once.
    let mut early = UnixStream::connect(&server.config.uds_path).unwrap();
    let _ = early.write_all(b"CONNECT 5000\n");
    assert_eof(early, "client without a VM");

    // A restarted VMM gets a fresh device.
    let guest2 = server.guest(GuestOptions::default()).unwrap();
    let s = guest2.connect(PORT).unwrap();
    let (_, mut session2) = rx.recv_timeout(T).unwrap();
    s.write_all(b"hello again").unwrap();
    let mut buf = [0u8; 11];
    session2.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello again");
    assert_eq!(server.stats.snapshot().frontend_connections, 2);
    assert!(guest2.violations().is_empty(), "{:?}", guest2.violations());
}

#[test]
fn vmm_disconnect_during_a_blocked_transfer_does_not_hang() {
    let (conn, rx) = ChannelConnector::new(&[PORT]);
    let server = TestServer::start(conn, |c| c.tx_buffer_size = 64 * 1024).unwrap();
    let guest = server
        .guest(GuestOptions {
            buf_alloc: 4096,
            ..GuestOptions::default()
        })
        .unwrap();
    let s = guest.connect(PORT).unwrap();
    let (_, mut session) = rx.recv_timeout(T).unwrap();
    // The host writes far more than the guest (which never reads) will take.
    let writer = thread::spawn(move || {
        let chunk = vec![7u8; 64 * 1024];
        loop {
            if session.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let stuck = guest.clone();
    let blocked = thread::spawn(move || {
        // The guest also pushes data the host never reads.
        let _ = s.write_all_timeout(&pattern(1, 4 << 20), Duration::from_secs(30));
        drop(stuck);
    });
    thread::sleep(Duration::from_millis(200));
    guest.disconnect();
    writer.join().unwrap();
    server
        .wait_stats(T, |s| s.device_resets == 1 && s.connections_open == 0)
        .unwrap();
    drop(blocked);
    let guest2 = server.guest(GuestOptions::default()).unwrap();
    let s2 = guest2.connect(PORT).unwrap();
    let (_, mut fresh) = rx.recv_timeout(T).unwrap();
    fresh.write_all(b"fresh").unwrap();
    let mut buf = [0u8; 5];
    s2.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"fresh");
}

#[test]
fn guest_reboot_resets_the_device_and_frees_sessions() {
    let (conn, rx) = ChannelConnector::new(&[PORT]);
    let server = TestServer::start(conn, |_| {}).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();
    let s = guest.connect(PORT).unwrap();
    let (_, session) = rx.recv_timeout(T).unwrap();
    s.write_all(b"before reboot").unwrap();
    drop(s);
    guest.reboot().unwrap();
    assert_eof(session, "session across a guest reboot");
    let st = server
        .wait_stats(T, |s| s.device_resets == 1 && s.connections_open == 0)
        .unwrap();
    assert_eq!(st.frontend_connections, 1, "same VMM connection");
    // The rebooted guest's driver works on fresh rings.
    let s = guest.connect(PORT).unwrap();
    let (_, mut session) = rx.recv_timeout(T).unwrap();
    s.write_all(b"after").unwrap();
    let mut buf = [0u8; 5];
    session.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"after");
    session.write_all(b"reply").unwrap();
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"reply");
    assert!(guest.violations().is_empty(), "{:?}", guest.violations());
}

#[test]
fn memory_regions_added_and_removed_at_runtime_are_used_and_forgotten() {
    let server = TestServer::start(Arc::new(EchoConnector(PORT)), |_| {}).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();
    echo(&guest, PORT, b"before hotplug");

    let gpa = 0x1_0000_0000u64;
    let size = guest.tx_buffers_size().next_multiple_of(2 << 20);
    guest.add_memory_region(gpa, size).unwrap();
    // Packets now come from the new region: the device must read them there.
    guest.relocate_tx_buffers(Some(gpa), T).unwrap();
    let big = pattern(5, 300_000);
    let s = guest.connect(PORT).unwrap();
    s.write_all(&big).unwrap();
    let mut back = vec![0u8; big.len()];
    s.read_exact(&mut back).unwrap();
    assert!(back == big, "data from the hot-added region was corrupted");
    s.close(T).unwrap();

    guest.relocate_tx_buffers(None, T).unwrap();
    guest.remove_memory_region(gpa).unwrap();
    // A chain pointing into the removed region is now outside guest memory.
    let dropped = server.stats.snapshot().dropped_chains;
    guest
        .submit_raw_chain(false, &[RawDesc::readable(gpa, 44)], T)
        .unwrap();
    server
        .wait_stats(T, |s| s.dropped_chains == dropped + 1)
        .unwrap();
    echo(&guest, PORT, b"after unplug");
    assert!(guest.violations().is_empty(), "{:?}", guest.violations());
}

#[test]
fn stop_closes_sessions_and_returns_while_a_vmm_is_attached() {
    let (conn, rx) = ChannelConnector::new(&[PORT]);
    let server = TestServer::start(conn, |_| {}).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();
    let _s = guest.connect(PORT).unwrap();
    let (_, session) = rx.recv_timeout(T).unwrap();
    let socket = server.config.socket.clone();
    let stop = thread::spawn(move || server.stop());
    stop.join().unwrap().unwrap();
    assert_eof(session, "session at shutdown");
    assert!(!socket.exists(), "vhost-user socket removed");
}

/// QEMU `stop`/`cont` stops and restarts the rings without a device reset: connections survive,
/// and data the host sent while the VM was paused arrives afterwards.
#[test]
fn vm_pause_and_resume_keeps_connections() {
    let (conn, rx) = ChannelConnector::new(&[PORT]);
    let server = TestServer::start(conn, |_| {}).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();
    let s = guest.connect(PORT).unwrap();
    let (_, mut session) = rx.recv_timeout(T).unwrap();
    s.write_all(b"before").unwrap();
    let mut buf = [0u8; 6];
    session.read_exact(&mut buf).unwrap();
    guest
        .pause_resume(|| {
            session.write_all(b"while paused").unwrap();
            thread::sleep(Duration::from_millis(50));
        })
        .unwrap();
    let mut got = [0u8; 12];
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"while paused");
    s.write_all(b"after").unwrap();
    let mut after = [0u8; 5];
    session.read_exact(&mut after).unwrap();
    assert_eq!(&after, b"after");
    let st = server.stats.snapshot();
    assert_eq!((st.device_resets, st.connections_open), (0, 1));
    assert!(guest.violations().is_empty(), "{:?}", guest.violations());
}
