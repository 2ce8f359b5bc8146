//! Credit-based flow control and concurrency through the vhost-user vsock device.

use std::io::{Read, Write};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use vgpu_vhost_vsock::{
    DEFAULT_TX_BUFFER_SIZE, Endpoint, GPU_PORT_BUFFER, GPU_PORT_REPLY_RING, MAX_LARGE_RING_BYTES,
    PortConnector, inproc,
};
use vgpu_vmm_testutils::vsock::{
    ChannelConnector, EchoConnector, GuestOptions, TestServer, pattern,
};

const PORT: u32 = 700;
const T: Duration = Duration::from_secs(20);
const MIB: usize = 1 << 20;

/// Guest → host through a 4 KiB device buffer to a host reader that takes small bites with
/// pauses: megabytes arrive intact, the device never buffers more than it advertised, and the
/// guest is throttled by credit instead.
#[test]
fn guest_to_slow_host_reader_through_small_buffer() {
    let (conn, rx) = ChannelConnector::new(&[PORT]);
    let server = TestServer::start(conn, |c| c.tx_buffer_size = 4096).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();
    let s = guest.connect(PORT).unwrap();
    let (_, mut host) = rx.recv_timeout(T).unwrap();
    let len = 3 * MIB;
    let data = pattern(1, len);
    let expect = data.clone();
    let reader = thread::spawn(move || {
        let mut got = Vec::with_capacity(len);
        let mut buf = [0u8; 1000];
        let mut reads = 0u32;
        while got.len() < len {
            let n = host.read(&mut buf).unwrap();
            assert!(n > 0, "early EOF after {} bytes", got.len());
            got.extend_from_slice(&buf[..n]);
            reads += 1;
            if reads.is_multiple_of(256) {
                thread::sleep(Duration::from_millis(2));
            }
        }
        got
    });
    s.write_all_timeout(&data, T).unwrap();
    let got = reader.join().unwrap();
    assert_eq!(got.len(), expect.len());
    let first_bad = got.iter().zip(&expect).position(|(a, b)| a != b);
    assert_eq!(first_bad, None, "data corrupted");
    let st = server.stats.snapshot();
    assert_eq!(st.bytes_guest_to_host, len as u64);
    assert!(guest.violations().is_empty(), "{:?}", guest.violations());
}

/// Host → guest into a 4 KiB guest buffer read slowly: the device must never exceed the guest's
/// credit (the harness records any overrun as a violation) and every byte arrives in order.
#[test]
fn host_to_slow_guest_reader_respects_guest_credit() {
    let (conn, rx) = ChannelConnector::new(&[PORT]);
    let server = TestServer::start(conn, |_| {}).unwrap();
    let guest = server
        .guest(GuestOptions {
            buf_alloc: 4096,
            ..GuestOptions::default()
        })
        .unwrap();
    let s = guest.connect(PORT).unwrap();
    let (_, mut host) = rx.recv_timeout(T).unwrap();
    let len = 2 * MIB;
    let data = pattern(2, len);
    let expect = data.clone();
    let writer = thread::spawn(move || {
        host.write_all(&data).unwrap();
        // Dropping the host end must not cut data still in flight.
    });
    let mut got = Vec::with_capacity(len);
    let mut buf = [0u8; 777];
    let mut reads = 0u32;
    loop {
        let n = s.read_timeout(&mut buf, T).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        reads += 1;
        if reads.is_multiple_of(512) {
            thread::sleep(Duration::from_millis(2));
        }
    }
    writer.join().unwrap();
    assert_eq!(got.len(), len);
    assert!(got == expect, "data corrupted");
    let v = guest.violations();
    assert!(v.is_empty(), "device broke flow control: {v:?}");
}

/// Many connections at once, each echoing a distinct pattern, driven from several threads and
/// interleaved within each thread.
#[test]
fn many_concurrent_connections_stay_separate() {
    let server = TestServer::start(Arc::new(EchoConnector(PORT)), |_| {}).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();
    const THREADS: u64 = 4;
    const PER_THREAD: u64 = 16;
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let guest = guest.clone();
            thread::spawn(move || {
                let streams: Vec<_> = (0..PER_THREAD)
                    .map(|_| guest.connect(PORT).unwrap())
                    .collect();
                for round in 0..4u64 {
                    let msgs: Vec<Vec<u8>> = (0..PER_THREAD)
                        .map(|i| pattern(t * 1000 + i * 10 + round, 5000 + (i as usize) * 397))
                        .collect();
                    for (s, m) in streams.iter().zip(&msgs) {
                        s.write_all(m).unwrap();
                    }
                    for (s, m) in streams.iter().zip(&msgs) {
                        let mut back = vec![0u8; m.len()];
                        s.read_exact(&mut back).unwrap();
                        assert!(&back == m, "thread {t} round {round}: stream mixed up");
                    }
                }
                for s in streams {
                    s.close(T).unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let st = server.wait_stats(T, |s| s.connections_open == 0).unwrap();
    assert_eq!(st.connections_total, THREADS * PER_THREAD);
    assert!(guest.violations().is_empty(), "{:?}", guest.violations());
}

/// The same echo with EVENT_IDX off (plain notification flags) and with the event queue set up
/// as cloud-hypervisor does.
#[test]
fn works_without_event_idx_and_with_event_queue() {
    for opts in [
        GuestOptions {
            event_idx: false,
            ..GuestOptions::default()
        },
        GuestOptions {
            setup_event_queue: true,
            queue_size: 64,
            ..GuestOptions::default()
        },
    ] {
        let server = TestServer::start(Arc::new(EchoConnector(PORT)), |_| {}).unwrap();
        let guest = server.guest(opts.clone()).unwrap();
        let s = guest.connect(PORT).unwrap();
        assert_eq!(s.peer_port(), PORT);
        let data = pattern(9, 512 * 1024);
        s.write_all(&data).unwrap();
        let mut back = vec![0u8; data.len()];
        s.read_exact(&mut back).unwrap();
        assert!(back == data, "echo differs with {opts:?}");
        assert!(guest.violations().is_empty(), "{:?}", guest.violations());
    }
}

/// A host stream that never reads: the guest fills the device buffer and then gets no more
/// credit; the device's memory stays bounded and other connections keep working.
#[test]
fn stalled_host_reader_blocks_only_its_connection() {
    let (conn, rx) = ChannelConnector::new(&[PORT]);
    let server = TestServer::start(conn, |c| c.tx_buffer_size = 64 * 1024).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();
    let stuck = guest.connect(PORT).unwrap();
    let (_, _stuck_host) = rx.recv_timeout(T).unwrap();
    // Far more than socket buffer + device buffer: the write cannot complete.
    let err = stuck
        .write_all_timeout(&pattern(3, 8 * MIB), Duration::from_millis(500))
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    let other = guest.connect(PORT).unwrap();
    let (_, mut other_host) = rx.recv_timeout(T).unwrap();
    other.write_all(b"still alive").unwrap();
    let mut buf = [0u8; 11];
    other_host.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"still alive");
    other_host.write_all(b"ack").unwrap();
    let mut ack = [0u8; 3];
    other.read_exact(&mut ack).unwrap();
    assert_eq!(&ack, b"ack");
    assert!(guest.violations().is_empty(), "{:?}", guest.violations());
}

/// Serves `PORT` in-process and hands each session end to the test, which reads it only when it
/// wants to (a session that lags behind the guest, or a hostile guest's connections piling up).
#[derive(Debug)]
struct HoldConnector(std::sync::Mutex<std::sync::mpsc::Sender<inproc::SessionEnd>>);

impl PortConnector for HoldConnector {
    fn connect(&self, port: u32) -> Option<std::io::Result<Endpoint>> {
        if port != PORT {
            return None;
        }
        Some(
            inproc::pair(inproc::DEFAULT_RING_CAPACITY).and_then(|(device, session)| {
                self.0
                    .lock()
                    .unwrap()
                    .send(session)
                    .map_err(|_| std::io::Error::other("test gone"))?;
                Ok(device.into())
            }),
        )
    }
}

/// Reads a session end to end of file and returns how many bytes it delivered.
fn drain(session: &inproc::SessionEnd) -> usize {
    session.set_read_timeout(Some(T));
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0;
    loop {
        match (&*session).read(&mut buf) {
            Ok(0) => return total,
            Ok(n) => total += n,
            Err(e) => panic!("session read after {total} bytes: {e}"),
        }
    }
}

/// A guest opening more in-process connections than the large-ring budget covers and filling
/// them all: the first `MAX_LARGE_RING_BYTES / (GPU_PORT_BUFFER + GPU_PORT_REPLY_RING)`
/// advertise `GPU_PORT_BUFFER`, the
/// rest today's `tx_buffer_size`; each holds at most twice its `buf_alloc` (ring + `tx_buf`) and
/// gets no credit beyond; the budget comes back when the connections close (guest RST with the
/// ring drained by the session, the session dropping its end, a device reset), and a later
/// connection gets a large ring again.
#[test]
fn large_rings_are_bounded_per_device_and_returned_on_close() {
    let (tx, sessions) = std::sync::mpsc::channel();
    let server =
        TestServer::start(Arc::new(HoldConnector(std::sync::Mutex::new(tx))), |_| {}).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();
    let per_conn = u64::from(GPU_PORT_BUFFER) + GPU_PORT_REPLY_RING as u64;
    let large = (MAX_LARGE_RING_BYTES / per_conn) as usize;
    let extra = 2;
    let mut conns = Vec::new();
    for i in 0..large + extra {
        let s = guest.connect(PORT).unwrap();
        let session = sessions.recv_timeout(T).unwrap();
        let want = if i < large {
            GPU_PORT_BUFFER
        } else {
            DEFAULT_TX_BUFFER_SIZE
        };
        assert_eq!(s.peer_buf_alloc(), want, "connection {i}");
        conns.push((s, session));
    }
    assert_eq!(
        server.stats.snapshot().large_ring_bytes,
        large as u64 * per_conn
    );

    // Fill every connection: ring plus tx_buf take exactly 2 × buf_alloc, then the credit is 0.
    for (i, (s, _)) in conns.iter().enumerate() {
        let cap = 2 * s.peer_buf_alloc() as usize;
        s.write_all_timeout(&vec![i as u8; cap], T).unwrap();
        let err = s
            .write_all_timeout(b"x", Duration::from_millis(200))
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "connection {i}");
        assert_eq!(s.peer_credit(), 0, "connection {i}");
    }
    assert!(guest.violations().is_empty(), "{:?}", guest.violations());

    // Half of the large connections: the session goes away. The others: the guest resets the
    // connection and the session reads what was delivered (the full ring) to end of file.
    let rest = conns.split_off(large / 2);
    for (s, session) in conns {
        drop(session);
        s.close(T).ok();
    }
    for (i, (s, session)) in rest.into_iter().enumerate() {
        let alloc = s.peer_buf_alloc() as usize;
        s.reset();
        let got = drain(&session);
        assert!(
            got <= 2 * alloc && got >= alloc,
            "connection {i} delivered {got} bytes of {}",
            2 * alloc
        );
    }
    server
        .wait_stats(T, |s| s.large_ring_bytes == 0 && s.connections_open == 0)
        .unwrap();

    // The budget is back: a new connection gets a large ring, and a device reset returns it.
    let s = guest.connect(PORT).unwrap();
    let session = sessions.recv_timeout(T).unwrap();
    assert_eq!(s.peer_buf_alloc(), GPU_PORT_BUFFER);
    let delivered = server.stats.snapshot().bytes_guest_to_host;
    s.write_all_timeout(&pattern(5, MIB), T).unwrap();
    assert_eq!(server.stats.snapshot().large_ring_bytes, per_conn);
    // The guest's writes return once its packets are queued; the reset would drop those the
    // device has not taken yet.
    server
        .wait_stats(T, |s| s.bytes_guest_to_host >= delivered + MIB as u64)
        .unwrap();
    guest.reboot().unwrap();
    assert_eq!(drain(&session), MIB);
    server.wait_stats(T, |s| s.large_ring_bytes == 0).unwrap();
    assert!(guest.violations().is_empty(), "{:?}", guest.violations());
}

/// The number after `label` in `text` (`"avail 3 (…"` → 3).
fn number_after(text: &str, label: &str) -> u64 {
    let at = text
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in {text}"))
        + label.len();
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {label:?} in {text}"))
}

/// A read that times out says where both queues stand, so a stall tells which side stopped: here
/// the host peer never answers, and the message shows that the device took every packet the
/// guest sent and still holds rx buffers (nothing was owed to the guest).
#[test]
fn a_read_timeout_reports_both_queues() {
    let (conn, rx) = ChannelConnector::new(&[PORT]);
    let server = TestServer::start(conn, |_| {}).unwrap();
    let guest = server.guest(GuestOptions::default()).unwrap();
    let s = guest.connect(PORT).unwrap();
    let (_, _host) = rx.recv_timeout(T).unwrap();
    s.write_all_timeout(b"a request nobody answers", T).unwrap();
    let err = s
        .read_timeout(&mut [0u8; 64], Duration::from_millis(300))
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    let msg = err.to_string();
    let (tx, rx_part) = msg
        .split_once("; rx queue: ")
        .unwrap_or_else(|| panic!("no rx queue in {msg}"));
    let tx_avail = number_after(tx, "tx queue: avail ");
    assert!(tx_avail >= 2, "the connect and the request: {msg}");
    assert_eq!(number_after(tx, "used "), tx_avail, "all taken: {msg}");
    assert!(
        number_after(rx_part, "avail ") > number_after(rx_part, "used "),
        "rx buffers left with the device: {msg}"
    );
    assert!(msg.contains("kick pending false"), "{msg}");
}
