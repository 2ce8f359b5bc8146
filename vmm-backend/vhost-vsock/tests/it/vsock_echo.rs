//! Data paths through the vhost-user vsock device, driven by the in-process frontend harness:
//! in-process (PortConnector) echo, forwarding to `<uds_path>_<port>`, host-initiated
//! `CONNECT <port>` to a guest listener.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use vgpu_vhost_vsock::ForwardAll;
use vgpu_vmm_testutils::vsock::{
    ChannelConnector, EchoConnector, GuestOptions, GuestStream, TestServer, pattern,
};

const GPU_PORT: u32 = 9999;
const T: Duration = Duration::from_secs(10);

#[test]
fn in_process_echo_round_trips_and_counts_bytes() {
    let server = TestServer::start(Arc::new(EchoConnector(GPU_PORT)), |_| {}).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();
    assert_eq!(guest.cid(), 3);
    let s = guest.connect(GPU_PORT).unwrap();
    for size in [1usize, 100, 4096, 4097, 70_000, 300_000] {
        let data = pattern(size as u64, size);
        s.write_all(&data).unwrap();
        let mut back = vec![0u8; size];
        s.read_exact(&mut back).unwrap();
        assert!(back == data, "echo of {size} bytes differs");
    }
    let total: u64 = [1u64, 100, 4096, 4097, 70_000, 300_000].iter().sum();
    let st = server
        .wait_stats(T, |s| s.bytes_host_to_guest == total)
        .unwrap();
    assert_eq!(st.bytes_guest_to_host, total);
    assert_eq!((st.connections_open, st.connections_total), (1, 1));
    s.close(T).unwrap();
    server.wait_stats(T, |s| s.connections_open == 0).unwrap();
    assert!(guest.violations().is_empty(), "{:?}", guest.violations());
}

/// `rounds` echo round trips of growing sizes on `s`, each checked byte for byte.
fn echo_round_trips(s: &GuestStream, rounds: usize, what: &str) {
    for i in 0..rounds {
        let data = pattern(i as u64, 100 + i);
        s.write_all(&data).unwrap();
        let mut back = vec![0u8; data.len()];
        s.read_exact(&mut back).unwrap();
        assert!(back == data, "round trip {i} ({what})");
    }
}

/// A guest that polls its queues asks for no interrupts, and the device sends none (it honours
/// `used_event`); the echo works all the same. A guest that sleeps takes them.
#[test]
fn a_polling_guest_takes_no_interrupts() {
    const ROUND_TRIPS: usize = 300;
    let server = TestServer::start(Arc::new(EchoConnector(GPU_PORT)), |_| {}).unwrap();
    let mut taken = Vec::new();
    for busy_poll in [true, false] {
        let guest = server
            .guest(GuestOptions {
                busy_poll,
                ..GuestOptions::default()
            })
            .unwrap();
        let s = guest.connect(GPU_PORT).unwrap();
        echo_round_trips(&s, ROUND_TRIPS, &format!("busy_poll: {busy_poll}"));
        assert!(guest.violations().is_empty(), "{:?}", guest.violations());
        taken.push(guest.interrupts());
        s.close(T).unwrap();
        drop(guest);
        server.wait_stats(T, |s| s.connections_open == 0).unwrap();
    }
    // The first used entries of each queue may signal once: the guest's `used_event` starts at 0.
    assert!(
        taken[0] <= 4,
        "a polling guest took {} interrupts",
        taken[0]
    );
    assert!(
        taken[1] >= 10,
        "a sleeping guest took {} interrupts in {ROUND_TRIPS} round trips",
        taken[1]
    );
}

/// A guest whose program polls for its reply (`poll_first`, as the shim's reads do) takes the
/// reply by looking at the rings itself, never sleeping until its interrupt thread wakes it; a
/// guest that sleeps at once does.
#[test]
fn a_guest_that_polls_first_takes_its_replies_awake() {
    const ROUND_TRIPS: usize = 300;
    let server = TestServer::start(Arc::new(EchoConnector(GPU_PORT)), |_| {}).unwrap();
    let mut slept = Vec::new();
    for poll_first in [T, Duration::ZERO] {
        let guest = server
            .guest(GuestOptions {
                poll_first,
                ..GuestOptions::default()
            })
            .unwrap();
        let s = guest.connect(GPU_PORT).unwrap();
        let before = guest.sleeps();
        echo_round_trips(&s, ROUND_TRIPS, &format!("poll_first: {poll_first:?}"));
        assert!(guest.violations().is_empty(), "{:?}", guest.violations());
        slept.push(guest.sleeps() - before);
        s.close(T).unwrap();
        drop(guest);
        server.wait_stats(T, |s| s.connections_open == 0).unwrap();
    }
    assert_eq!(slept[0], 0, "a guest polling first slept");
    assert!(
        slept[1] >= 10,
        "a sleeping guest slept {} times in {ROUND_TRIPS} round trips",
        slept[1]
    );
}

#[test]
fn in_process_stream_sees_guest_half_close_and_host_close_reaches_guest() {
    let (conn, rx) = ChannelConnector::new(&[GPU_PORT]);
    let server = TestServer::start(conn, |_| {}).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();
    let s = guest.connect(GPU_PORT).unwrap();
    let (port, mut host) = rx.recv_timeout(T).unwrap();
    assert_eq!(port, GPU_PORT);
    s.write_all(b"request").unwrap();
    s.shutdown_write().unwrap();
    let mut got = Vec::new();
    host.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"request");
    host.write_all(b"reply").unwrap();
    drop(host);
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    assert_eq!(reply, b"reply");
    // Both sides are done: the device tears the connection down.
    server.wait_stats(T, |s| s.connections_open == 0).unwrap();
    assert!(guest.violations().is_empty(), "{:?}", guest.violations());
}

#[test]
fn guest_connections_to_other_ports_are_forwarded_to_uds_port_sockets() {
    let server = TestServer::start(Arc::new(EchoConnector(GPU_PORT)), |_| {}).unwrap();
    let path = format!("{}_{}", server.config.uds_path.display(), 1234);
    let listener = UnixListener::bind(&path).unwrap();
    let host = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut req = [0u8; 5];
        s.read_exact(&mut req).unwrap();
        assert_eq!(&req, b"hello");
        let big = pattern(7, 1 << 20);
        s.write_all(&big).unwrap();
        // Close: the guest must see every byte, then end of file.
    });
    let guest = server
        .guest(GuestOptions {
            rx_split_header: true,
            tx_single_descriptor: true,
            ..GuestOptions::default()
        })
        .unwrap();
    let s = guest.connect(1234).unwrap();
    s.write_all(b"hello").unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    host.join().unwrap();
    assert!(
        got == pattern(7, 1 << 20),
        "forwarded data differs ({} bytes)",
        got.len()
    );
    // The in-process port is still served while forwarding works.
    let e = guest.connect(GPU_PORT).unwrap();
    e.write_all(b"x").unwrap();
    let mut one = [0u8; 1];
    e.read_exact(&mut one).unwrap();
    assert_eq!(&one, b"x");
    assert!(guest.violations().is_empty(), "{:?}", guest.violations());
}

#[test]
fn host_initiated_connect_reaches_a_guest_listener() {
    let server = TestServer::start(Arc::new(ForwardAll), |_| {}).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();
    guest.listen(5000);
    let uds = server.config.uds_path.clone();
    let client = thread::spawn(move || {
        let mut c = UnixStream::connect(&uds).unwrap();
        // Data right behind the CONNECT line must not be lost.
        c.write_all(b"CONNECT 5000\nearly bytes").unwrap();
        let mut r = BufReader::new(c.try_clone().unwrap());
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let port: u32 = line
            .strip_prefix("OK ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("bad reply {line:?}"));
        assert!(port >= 1 << 30, "host port {port} below the host range");
        let mut rest = [0u8; 6];
        r.read_exact(&mut rest).unwrap();
        assert_eq!(&rest, b"answer");
        c.write_all(b" and more").unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut tail = Vec::new();
        r.read_to_end(&mut tail).unwrap();
        assert!(tail.is_empty());
        port
    });
    let s = guest.accept(5000, T).unwrap();
    s.write_all(b"answer").unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"early bytes and more");
    s.close(T).unwrap();
    let port = client.join().unwrap();
    assert_eq!(port, 1 << 30);
    assert!(guest.violations().is_empty(), "{:?}", guest.violations());
}

#[test]
fn host_connect_to_a_port_without_guest_listener_is_closed() {
    let server = TestServer::start(Arc::new(ForwardAll), |_| {}).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();
    let mut c = UnixStream::connect(&server.config.uds_path).unwrap();
    c.set_read_timeout(Some(T)).unwrap();
    c.write_all(b"CONNECT 4321\n").unwrap();
    let mut buf = Vec::new();
    assert_eq!(c.read_to_end(&mut buf).unwrap(), 0, "no OK line, just EOF");
    // Malformed requests are closed as well.
    for bad in [&b"CONNECT x\n"[..], b"HELLO 1\n", &[b'A'; 100][..]] {
        let mut c = UnixStream::connect(&server.config.uds_path).unwrap();
        c.set_read_timeout(Some(T)).unwrap();
        c.write_all(bad).unwrap();
        let mut buf = Vec::new();
        // Closed with unread bytes the client may see a reset instead of a clean EOF.
        match c.read_to_end(&mut buf) {
            Ok(n) => assert_eq!(n, 0),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset),
        }
    }
    let st = server
        .wait_stats(T, |s| s.connections_refused >= 3)
        .unwrap();
    assert_eq!(st.connections_open, 0);
    assert!(guest.violations().is_empty(), "{:?}", guest.violations());
}
