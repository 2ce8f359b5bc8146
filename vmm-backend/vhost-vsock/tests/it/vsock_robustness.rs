//! Refusals, RSTs and hostile descriptor chains through the real vhost-user path.

use std::io;
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use vgpu_vhost_vsock::packet::{
    PKT_HEADER_SIZE, VSOCK_OP_REQUEST, VSOCK_OP_RST, VSOCK_OP_RW, VSOCK_TYPE_STREAM,
};
use vgpu_vhost_vsock::{MAX_CONNECTIONS, PortConnector};
use vgpu_vmm_testutils::vsock::{EchoConnector, GuestOptions, RawDesc, TestGuest, TestServer};

const ECHO: u32 = 9999;
const REFUSED: u32 = 6666;
const T: Duration = Duration::from_secs(10);

/// Echo on `ECHO`, refusal on `REFUSED`, forwarding elsewhere.
struct Mixed;
impl PortConnector for Mixed {
    fn connect(&self, port: u32) -> Option<io::Result<vgpu_vhost_vsock::Endpoint>> {
        match port {
            REFUSED => Some(Err(io::Error::other("GPU sessions exhausted"))),
            _ => EchoConnector(ECHO).connect(port),
        }
    }
}

fn echo_once(guest: &TestGuest, msg: &[u8]) {
    let s = guest.connect(ECHO).unwrap();
    s.write_all(msg).unwrap();
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, msg);
    s.close(T).unwrap();
}

#[test]
fn unknown_and_refused_ports_get_rst() {
    let server = TestServer::start(Arc::new(Mixed), |_| {}).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();
    // No `<uds>_4444` listener.
    let err = guest.connect(4444).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
    // The connector refuses.
    let err = guest.connect(REFUSED).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
    // A stale socket file with nobody listening.
    let stale = format!("{}_{}", server.config.uds_path.display(), 4445);
    drop(UnixListener::bind(&stale).unwrap());
    let err = guest.connect(4445).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
    let st = server
        .wait_stats(T, |s| s.connections_refused == 3)
        .unwrap();
    assert_eq!((st.rst_sent, st.connections_open), (3, 0));
    echo_once(&guest, b"still works");
    assert!(guest.violations().is_empty(), "{:?}", guest.violations());
}

#[test]
fn packets_for_unknown_connections_and_other_cids_get_rst_but_rst_is_never_answered() {
    let server = TestServer::start(Arc::new(Mixed), |_| {}).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();
    let mut rw = guest.raw_header(50_000, ECHO, VSOCK_OP_RW);
    rw.len = 3;
    assert!(guest.send_raw(rw, b"abc"));
    let rst = guest.recv_unmatched(T).unwrap();
    assert_eq!(
        (rst.op, rst.src_port, rst.dst_port),
        (VSOCK_OP_RST, ECHO, 50_000)
    );

    // A sibling-VM CID is not reachable through this device.
    let mut req = guest.raw_header(50_001, ECHO, VSOCK_OP_REQUEST);
    req.dst_cid = 7;
    assert!(guest.send_raw(req, b""));
    let rst = guest.recv_unmatched(T).unwrap();
    assert_eq!((rst.op, rst.dst_port), (VSOCK_OP_RST, 50_001));

    // SEQPACKET is not offered.
    let mut req = guest.raw_header(50_002, ECHO, VSOCK_OP_REQUEST);
    req.type_ = VSOCK_TYPE_STREAM + 1;
    assert!(guest.send_raw(req, b""));
    let rst = guest.recv_unmatched(T).unwrap();
    assert_eq!((rst.op, rst.dst_port), (VSOCK_OP_RST, 50_002));

    // An RST for an unknown connection is not answered (no RST ping-pong).
    assert!(guest.send_raw(guest.raw_header(50_003, ECHO, VSOCK_OP_RST), b""));
    echo_once(&guest, b"x");
    assert!(guest.recv_unmatched(Duration::from_millis(100)).is_err());
    // Three refusals plus the RST that confirms echo_once's graceful close.
    assert_eq!(server.stats.snapshot().rst_sent, 4);
}

#[test]
fn forged_source_cid_is_dropped_and_counted() {
    let server = TestServer::start(Arc::new(Mixed), |_| {}).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();
    let mut req = guest.raw_header(50_000, ECHO, VSOCK_OP_REQUEST);
    req.src_cid = 1234;
    assert!(guest.send_raw(req, b""));
    let st = server.wait_stats(T, |s| s.dropped_chains == 1).unwrap();
    assert_eq!(
        (st.rst_sent, st.connections_total),
        (0, 0),
        "no reply to a forged packet"
    );
    echo_once(&guest, b"ok");
    assert!(guest.recv_unmatched(Duration::from_millis(50)).is_err());
}

/// Every kind of malformed tx chain, submitted through the real vring, is dropped and counted;
/// an open connection keeps working throughout.
#[test]
fn hostile_tx_chains_are_dropped_without_harm() {
    let server = TestServer::start(Arc::new(Mixed), |_| {}).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();
    let live = guest.connect(ECHO).unwrap();
    let (scratch, _) = guest.scratch_area();
    let beyond = guest.memory_end() + 0x1000;
    let mut h = guest.raw_header(live.local_port(), ECHO, VSOCK_OP_RW);
    let mut hdr_at = |len: u32| {
        h.len = len;
        h.to_bytes()
    };
    let hdr_big = hdr_at(100);
    let hdr_huge = hdr_at(u32::MAX);
    let hdr_ok = hdr_at(4);
    guest.write_mem(scratch, &hdr_big).unwrap();
    guest.write_mem(scratch + 0x100, &hdr_huge).unwrap();
    guest.write_mem(scratch + 0x200, &hdr_ok).unwrap();
    let hlen = PKT_HEADER_SIZE as u32;
    let cases: Vec<(&str, Vec<RawDesc>)> = vec![
        (
            "header outside guest memory",
            vec![RawDesc::readable(beyond, hlen)],
        ),
        (
            "header straddling the end of memory",
            vec![RawDesc::readable(guest.memory_end() - 8, hlen)],
        ),
        (
            "payload outside guest memory",
            vec![
                RawDesc::readable(scratch + 0x200, hlen).then(1),
                RawDesc::readable(beyond, 4),
            ],
        ),
        (
            "writable header on tx",
            vec![RawDesc::writable(scratch + 0x200, hlen)],
        ),
        (
            "writable payload on tx",
            vec![
                RawDesc::readable(scratch + 0x200, hlen).then(1),
                RawDesc::writable(scratch + 0x1000, 4),
            ],
        ),
        (
            "header of 43 bytes",
            vec![RawDesc::readable(scratch + 0x200, hlen - 1)],
        ),
        (
            "len beyond the chain",
            vec![
                RawDesc::readable(scratch, hlen).then(1),
                RawDesc::readable(scratch + 0x1000, 99),
            ],
        ),
        (
            "absurd len",
            vec![
                RawDesc::readable(scratch + 0x100, hlen).then(1),
                RawDesc::readable(scratch + 0x1000, 8),
            ],
        ),
        (
            "descriptor loop",
            vec![
                RawDesc::readable(scratch + 0x200, hlen).then(1),
                RawDesc::readable(scratch + 0x1000, 4).then(0),
            ],
        ),
        (
            "next index outside the table",
            vec![RawDesc {
                next_absolute: true,
                ..RawDesc::readable(scratch + 0x200, hlen).then(60_000)
            }],
        ),
    ];
    for (i, (what, descs)) in cases.iter().enumerate() {
        guest
            .submit_raw_chain(false, descs, T)
            .unwrap_or_else(|e| panic!("{what}: chain not returned: {e}"));
        let st = server
            .wait_stats(T, |s| s.dropped_chains == i as u64 + 1)
            .unwrap_or_else(|s| panic!("{what}: not counted as dropped ({s:?})"));
        assert_eq!(st.connections_open, 1, "{what}");
        live.write_all(what.as_bytes()).unwrap();
        let mut back = vec![0u8; what.len()];
        live.read_exact(&mut back).unwrap();
        assert_eq!(back, what.as_bytes(), "{what}: live connection disturbed");
    }
    assert!(guest.violations().is_empty(), "{:?}", guest.violations());
}

#[test]
fn hostile_rx_chains_are_dropped_and_returned_empty() {
    let server = TestServer::start(Arc::new(Mixed), |_| {}).unwrap();
    let guest = server
        .guest(GuestOptions {
            rx_buffers: 4,
            ..GuestOptions::default()
        })
        .unwrap();
    let live = guest.connect(ECHO).unwrap();
    let (scratch, _) = guest.scratch_area();
    let cases = [
        vec![RawDesc::readable(scratch, 4096)],
        vec![RawDesc::writable(scratch, 20)],
        vec![RawDesc::writable(guest.memory_end() + 4096, 4096)],
        vec![
            RawDesc::writable(scratch, 44).then(1),
            RawDesc::readable(scratch + 64, 100),
        ],
    ];
    let heads: Vec<u16> = cases
        .iter()
        .map(|c| guest.post_raw_chain(true, c).unwrap())
        .collect();
    // Traffic makes the device walk through the posted buffers, the hostile ones included.
    let pump = thread::spawn({
        let guest = guest.clone();
        move || {
            for head in heads {
                guest.wait_raw_returned(true, head, T).unwrap();
            }
        }
    });
    for i in 0..40u32 {
        let msg = i.to_le_bytes();
        live.write_all(&msg).unwrap();
        let mut back = [0u8; 4];
        live.read_exact(&mut back).unwrap();
        assert_eq!(back, msg);
    }
    pump.join().unwrap();
    server.wait_stats(T, |s| s.dropped_chains == 4).unwrap();
    assert!(guest.violations().is_empty(), "{:?}", guest.violations());
}

/// The device refuses connections beyond its limit instead of growing without bound.
#[test]
fn connection_limit_is_enforced() {
    let server = TestServer::start(Arc::new(Mixed), |_| {}).unwrap();
    let path = format!("{}_{}", server.config.uds_path.display(), 80);
    let listener = UnixListener::bind(&path).unwrap();
    let acceptor = thread::spawn(move || {
        let mut held = Vec::new();
        while held.len() < MAX_CONNECTIONS {
            held.push(listener.accept().unwrap().0);
        }
        held
    });
    let guest = server.guest(GuestOptions::default()).unwrap();
    let streams: Vec<_> = (0..MAX_CONNECTIONS)
        .map(|i| {
            guest
                .connect(80)
                .unwrap_or_else(|e| panic!("connection {i}: {e}"))
        })
        .collect();
    let err = guest.connect(80).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
    let mut held = acceptor.join().unwrap();
    assert_eq!(
        server.stats.snapshot().connections_open,
        MAX_CONNECTIONS as u64
    );
    // Closing one frees a slot.
    drop(held.pop());
    let mut eof = Vec::new();
    streams.last().unwrap().read_to_end(&mut eof).unwrap();
    server
        .wait_stats(T, |s| s.connections_open < MAX_CONNECTIONS as u64)
        .unwrap();
    let _again = guest.connect(ECHO).unwrap();
    drop(held);
    drop(streams);
}

/// A guest that never kicks its tx queue (a driver bug, or a hostile guest) is still served,
/// slowly: the device's wake-up audit finds its packets once a second and counts each find. A
/// guest that kicks as it should has nothing found.
#[test]
fn a_guest_that_never_kicks_tx_is_served_by_the_wake_up_audit() {
    let server = TestServer::start(Arc::new(Mixed), |_| {}).unwrap();
    let kicking = server.guest(GuestOptions::default()).unwrap();
    echo_once(&kicking, b"kicked");
    assert_eq!(server.snapshot().lost_wakeups, 0);
    drop(kicking);

    let guest = server
        .guest(GuestOptions {
            mute_tx_kicks: true,
            ..GuestOptions::default()
        })
        .unwrap();
    // The REQUEST, the data and the close each wait for an audit.
    echo_once(&guest, b"never kicked");
    let st = server.wait_stats(T, |s| s.lost_wakeups >= 2).unwrap();
    assert!(st.lost_wakeups >= 2, "{st:?}");
    assert!(guest.violations().is_empty(), "{:?}", guest.violations());
}
