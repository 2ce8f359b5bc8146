//! The GPU port's session loop (`serve_ring`) over an in-process vsock connection, with this
//! thread playing the vsock device thread: which thread answers a call, and replies larger than
//! the room the device thread finds.

use std::io::Write;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use vgpu_broker::Broker;
use vgpu_broker::testutils::{MemDevice, vm};
use vgpu_proto::frame::{self, HEADER_LEN, Header};
use vgpu_proto::msg::{self, Message, Op};
use vgpu_vhost_vsock::inproc::{self, DeviceEnd};
use vm_memory::{ReadVolatile, VolatileSlice};

/// Ring capacity each way: two synchronize replies (24 bytes each) fit, a third only in part.
const RING: usize = 64;
const PATIENCE: Duration = Duration::from_secs(10);
const NAP: Duration = Duration::from_millis(10);

struct Rig {
    device: DeviceEnd,
    session: Option<JoinHandle<()>>,
    next_id: u64,
    got: Vec<u8>,
}

impl Rig {
    fn start() -> Rig {
        let dev: Arc<dyn vgpu_broker::device::Device> =
            Arc::new(MemDevice::new(1 << 30, Duration::ZERO));
        let broker = Arc::new(Broker::new(vec![("gpu0".into(), dev)]));
        broker.add_tenant(&vm("vm1", 1 << 20)).unwrap();
        let tenant = broker.tenant("vm1").unwrap();
        let (device, end) = inproc::pair(RING).unwrap();
        let end = Arc::new(end);
        let session = std::thread::spawn(move || {
            let writer: &inproc::SessionEnd = &end;
            let _ = vgpu_broker::session_loop::serve_ring(
                &broker,
                tenant,
                Arc::clone(&end),
                writer,
                "test",
                None,
                true,
            );
        });
        Rig {
            device,
            session: Some(session),
            next_id: 0,
            got: Vec::new(),
        }
    }

    /// Writes one synchronous request; returns its call id.
    fn send<O: Op + Message>(&mut self, req: &O) -> u64 {
        self.next_id += 1;
        let mut body = Vec::new();
        req.encode(&mut body);
        let mut bytes = Vec::new();
        frame::write_frame(&mut bytes, O::OPCODE, 0, self.next_id, 0, &[&body]).unwrap();
        let mut at = 0;
        let deadline = std::time::Instant::now() + PATIENCE;
        while at < bytes.len() {
            match (&self.device).write(&bytes[at..]) {
                Ok(n) => at += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the session reads nothing"
                    );
                    self.drain();
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        }
        self.next_id
    }

    /// Takes what the session wrote so far.
    fn drain(&mut self) {
        let mut buf = [0u8; RING];
        while let Ok(n) = (&self.device).read_volatile(&mut VolatileSlice::from(&mut buf[..])) {
            if n == 0 {
                break;
            }
            self.got.extend_from_slice(&buf[..n]);
        }
    }

    /// The next reply: its header and payload.
    fn reply(&mut self) -> (Header, Vec<u8>) {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            self.drain();
            if self.got.len() >= HEADER_LEN {
                let h = Header::decode(self.got[..HEADER_LEN].try_into().unwrap()).unwrap();
                let end = HEADER_LEN + h.payload_len as usize;
                if self.got.len() >= end {
                    let payload = self.got[HEADER_LEN..end].to_vec();
                    self.got.drain(..end);
                    return (h, payload);
                }
            }
            assert!(std::time::Instant::now() < deadline, "no reply");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn call<O: Op + Message>(&mut self, req: &O) -> Vec<u8> {
        let id = self.send(req);
        let (h, payload) = self.reply();
        assert_eq!((h.call_id, h.status), (id, 0));
        payload
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.device.shutdown_write();
        while self.session.as_ref().is_some_and(|s| !s.is_finished()) {
            self.drain();
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Some(s) = self.session.take() {
            s.join().unwrap();
        }
    }
}

/// Quick calls are answered on the thread that writes them, and a reply that does not fit the
/// room left is finished by the session thread, in order.
#[test]
fn replies_larger_than_the_room_left_are_finished_by_the_session_thread() {
    let mut rig = Rig::start();
    rig.call(&msg::Hello {
        protocol_version: vgpu_proto::PROTOCOL_VERSION,
        pid: 1,
        shim_version: vgpu_proto::VERSION.into(),
        process_name: "t".into(),
    });
    let out = rig.call(&msg::CtxCreate {
        device: 0,
        flags: 0,
    });
    let ctx = msg::decode_reply::<msg::CtxCreate>(&out).unwrap().0.handle;
    // Once the session thread sleeps, a synchronize is answered on this thread, in its write.
    let sync = msg::CtxSynchronize { ctx };
    let mut tries = 0;
    loop {
        std::thread::sleep(NAP);
        let id = rig.send(&sync);
        let here = rig.device.take_answered();
        let (h, _) = rig.reply();
        assert_eq!((h.call_id, h.status), (id, 0));
        if here == 1 {
            break;
        }
        tries += 1;
        assert!(tries < 100, "never answered on the writing thread");
    }
    // Three replies, undrained, into a 64-byte ring: two whole, the third in part.
    std::thread::sleep(NAP);
    let ids: Vec<u64> = (0..3).map(|_| rig.send(&sync)).collect();
    assert_eq!(rig.device.take_answered(), 3, "all three answered here");
    for id in ids {
        let (h, _) = rig.reply();
        assert_eq!(
            (h.call_id, h.status),
            (id, 0),
            "replies out of order or torn"
        );
    }
    // The session goes on as before.
    rig.call(&sync);
}
