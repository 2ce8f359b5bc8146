//! The session's side of a doorbell page ([`vgpu_proto::doorbell`]): on a unix socket, a
//! synchronous copy of pinned memory written into a shared page and served from there, with no
//! frame in either direction.
//!
//! A [`BellSlot`] is made per connection, before the session: the socket's reader watches it
//! ([`vgpu_proto::spin::SpinRead::watching`]) and the session holds it ([`Session::accept_bell`]).
//! `Doorbell { region }` puts one of the session's shared regions in it (once per session); from
//! then on the session loop, between frames, lets the reader report a request rung while the
//! socket held no byte, and serves it ([`serve_rung`]).
//!
//! [`Session::accept_bell`]: crate::session::Session::accept_bell

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use vgpu_proto::doorbell::{PAGE_BYTES, Page, Rung};
use vgpu_proto::msg::{self, Op, Request};
use vgpu_proto::spin::Bell;

use crate::error::CuError;
use crate::hostshare::SharedRegion;

/// Largest region a doorbell page may be: the session keeps its page mapped even after
/// `HostUnshare` (which then no longer counts it against the session's shared bytes), so the
/// region must be small.
pub const MAX_DOORBELL_REGION: u64 = 1 << 20;

/// One connection's doorbell: empty until the session's `Doorbell` request fills it.
#[derive(Debug, Default)]
pub struct BellSlot {
    page: OnceLock<(Arc<SharedRegion>, Page)>,
    /// The session loop is between frames, with nothing buffered: a rung request may be
    /// reported now.
    armed: AtomicBool,
    /// The number of the last request served.
    last: AtomicU32,
}

impl BellSlot {
    /// An empty slot.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Makes `region` the doorbell page (`Doorbell`): refused when the region is smaller than a
    /// page or larger than [`MAX_DOORBELL_REGION`], or the session has one already. A request
    /// already in the page is not served: the client rings after this returns.
    pub fn set(&self, region: Arc<SharedRegion>) -> Result<(), CuError> {
        if region.len() < PAGE_BYTES as u64 || region.len() > MAX_DOORBELL_REGION {
            return Err(CuError::invalid_value(format!(
                "a doorbell page needs {PAGE_BYTES} bytes to {MAX_DOORBELL_REGION}; the region has {}",
                region.len()
            )));
        }
        // SAFETY: the mapping is page-aligned, at least PAGE_BYTES long (checked above) and
        // writable, and lives as long as `region`, which the slot keeps with the page.
        let page = unsafe { Page::new(region.base()) };
        self.last.store(page.seq(), Ordering::Relaxed);
        self.page
            .set((region, page))
            .map_err(|_| CuError::invalid_value("the session has a doorbell page already"))
    }

    /// Whether a page is set.
    pub fn ready(&self) -> bool {
        self.page.get().is_some()
    }

    /// Whether the reader may report a rung request (`true` between frames).
    pub fn arm(&self, armed: bool) {
        self.armed.store(armed, Ordering::Relaxed);
    }

    /// The request waiting, copied out of the page.
    pub fn take(&self) -> Option<(Page, Rung)> {
        let (_, page) = self.page.get()?;
        let seq = page.rung(self.last.load(Ordering::Relaxed))?;
        Some((*page, page.take(seq)))
    }

    /// Records request `seq` as served.
    pub fn served(&self, seq: u32) {
        self.last.store(seq, Ordering::Relaxed);
    }
}

impl Bell for BellSlot {
    fn rung(&self, received: u64) -> bool {
        self.armed.load(Ordering::Relaxed)
            && self.page.get().is_some_and(|(_, p)| {
                p.rung(self.last.load(Ordering::Relaxed)).is_some() && received >= p.sent()
            })
    }

    fn socket_idle(&self, received: u64) -> bool {
        self.page
            .get()
            .is_some_and(|(_, p)| p.sending_now() <= received)
    }

    fn sleeping(&self, asleep: bool) {
        if let Some((_, page)) = self.page.get() {
            page.set_server_sleeping(asleep);
        }
    }
}

/// The request a rung page holds: a shared-memory copy, decoded from the bytes copied out of
/// the page (so the guest cannot change them under the checks); anything else is refused.
pub fn request_of(rung: &Rung) -> Result<Request, CuError> {
    if rung.opcode != msg::MemcpyHtoDShared::OPCODE && rung.opcode != msg::MemcpyDtoHShared::OPCODE
    {
        return Err(CuError::invalid_value(format!(
            "a doorbell serves shared-memory copies only, not opcode {:#06x}",
            rung.opcode
        )));
    }
    match Request::decode(rung.opcode, rung.fields()) {
        Ok((req, used)) if used == rung.len => Ok(req),
        Ok(_) => Err(CuError::invalid_value(
            "the doorbell request has bytes past its fields",
        )),
        Err(e) => Err(CuError::invalid_value(format!(
            "malformed doorbell request: {e}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::io::{Read, Write};
    use std::os::fd::{AsFd, OwnedFd};
    use std::os::unix::net::UnixStream;
    use std::ptr::NonNull;
    use std::time::{Duration, Instant};

    use vgpu_proto::cuda;
    use vgpu_proto::frame;
    use vgpu_proto::msg::{Message, Op};

    use super::*;
    use crate::Broker;
    use crate::hostshare::HostSharing;
    use crate::session_loop::{ServeError, SessionSummary};
    use crate::testutils::{self, MemDevice, TestClient, map_shared, vm};

    const MIB: u64 = 1 << 20;
    const DATA: u64 = 64 << 10;
    /// Long enough for anything these tests wait for; they pass long before.
    const PATIENCE: Duration = Duration::from_secs(20);

    /// A socket that counts the bytes written on it, and says so in the doorbell page before
    /// each write when it has one, as the shim's client does.
    struct Counting<'a> {
        s: &'a UnixStream,
        sent: &'a Cell<u64>,
        page: Option<Page>,
    }

    impl Read for Counting<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            (&*self.s).read(buf)
        }
    }

    impl Write for Counting<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if let Some(page) = &self.page {
                page.sending(self.sent.get() + buf.len() as u64);
            }
            let n = (&*self.s).write(buf)?;
            self.sent.set(self.sent.get() + n as u64);
            Ok(n)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A sealed memfd of `len` zero bytes, every page allocated.
    fn memfd(len: u64) -> OwnedFd {
        testutils::memfd(len, crate::hostshare::REQUIRED_SEALS, |_| 0)
    }

    /// A client of a session served over a socket pair, with a context and an allocation.
    struct Client {
        sock: UnixStream,
        sent: Cell<u64>,
        /// The doorbell page, once open (the client keeps `sending` in it).
        page: Option<Page>,
        ctx: u64,
        dptr: u64,
        served: std::thread::JoinHandle<Result<SessionSummary, ServeError>>,
    }

    impl Client {
        fn open(sharing: bool) -> Client {
            let dev: Arc<dyn crate::device::Device> =
                Arc::new(MemDevice::new(1 << 30, Duration::ZERO));
            let b = Arc::new(Broker::new(vec![("gpu0".into(), dev)]));
            b.add_tenant(&vm("vm1", 64 * MIB)).unwrap();
            let (sock, srv) = UnixStream::pair().unwrap();
            let t = b.tenant("vm1").unwrap();
            let served = std::thread::spawn(move || {
                let r = vgpu_proto::spin::SpinRead::new(&srv);
                if sharing {
                    let sharing = HostSharing::new();
                    let r = sharing.reader(r);
                    crate::session_loop::serve_with_fds(&b, t, r, &srv, "test", None, Some(sharing))
                } else {
                    crate::session_loop::serve(&b, t, r, &srv, "test")
                }
            });
            let mut c = Client {
                sock,
                sent: Cell::new(0),
                page: None,
                ctx: 0,
                dptr: 0,
                served,
            };
            c.with(|t| t.hello()).unwrap();
            c.ctx = c.with(|t| t.ctx_create()).unwrap();
            let ctx = c.ctx;
            c.dptr = c
                .with(|t| t.call(&msg::MemAlloc { ctx, size: DATA }, &[]))
                .unwrap()
                .0
                .ptr;
            c
        }

        /// Runs `f` with a protocol client over the counting socket.
        fn with<T>(&self, f: impl FnOnce(&mut TestClient<Counting<'_>>) -> T) -> T {
            f(&mut TestClient::new(Counting {
                s: &self.sock,
                sent: &self.sent,
                page: self.page,
            }))
        }

        /// Shares a memfd of `len` bytes (`HostShare` with the descriptor): its region.
        fn share(&mut self, fd: &OwnedFd, len: u64) -> u64 {
            let mut f = Vec::new();
            let p = msg::encode(&msg::HostShare { size: len });
            frame::write_frame(&mut f, msg::HostShare::OPCODE, 0, 1, 0, &[&p]).unwrap();
            if let Some(page) = &self.page {
                page.sending(self.sent.get() + f.len() as u64);
            }
            vgpu_proto::fdpass::send_with_fd(self.sock.as_fd(), &f, fd.as_fd()).unwrap();
            self.sent.set(self.sent.get() + f.len() as u64);
            let mut payload = Vec::new();
            let h = frame::read_frame(&mut &self.sock, &mut payload).unwrap();
            assert_eq!(h.status, 0, "{}", String::from_utf8_lossy(&payload));
            msg::decode_reply::<msg::HostShare>(&payload)
                .unwrap()
                .0
                .handle
        }

        /// A copy of `len` bytes from the start of the allocation into `region`.
        fn dtoh(&self, region: u64, len: u64) -> msg::MemcpyDtoHShared {
            msg::MemcpyDtoHShared {
                ctx: self.ctx,
                stream: 0,
                src: self.dptr,
                region,
                offset: 0,
                len,
            }
        }

        /// Rings `req` (with a `Ring` frame when the session thread sleeps, as the shim does) and
        /// waits for its completion in the page.
        fn ring<M: Message + Op>(&self, page: &Page, req: &M) -> vgpu_proto::doorbell::Completion {
            self.ring_raw(page, M::OPCODE, &msg::encode(req))
        }

        fn ring_raw(
            &self,
            page: &Page,
            opcode: u16,
            fields: &[u8],
        ) -> vgpu_proto::doorbell::Completion {
            let seq = page.ring(opcode, fields, self.sent.get());
            if page.server_sleeping() {
                self.with(|t| t.post(&msg::Ring {}, &[])).unwrap();
            }
            wait(page, seq)
        }
    }

    fn wait(page: &Page, seq: u32) -> vgpu_proto::doorbell::Completion {
        let start = Instant::now();
        while !page.wait_done(seq, Duration::from_millis(10)) {
            assert!(start.elapsed() < PATIENCE, "request {seq} never completed");
        }
        page.completion()
    }

    /// A session with a doorbell page and a data region of [`DATA`] bytes.
    fn with_bell() -> (Client, Page, u64, NonNull<u8>) {
        let mut c = Client::open(true);
        // Mapped before they are shared: vgpud seals them against new writable mappings.
        let page_fd = memfd(PAGE_BYTES as u64);
        // SAFETY: our mapping of PAGE_BYTES bytes, page-aligned, kept for the whole test.
        let page = unsafe { Page::new(map_shared(&page_fd, PAGE_BYTES as u64)) };
        let page_region = c.share(&page_fd, PAGE_BYTES as u64);
        c.with(|t| {
            t.call(
                &msg::Doorbell {
                    region: page_region,
                },
                &[],
            )
        })
        .unwrap();
        c.page = Some(page);
        let data_fd = memfd(DATA);
        let view = map_shared(&data_fd, DATA);
        let data = c.share(&data_fd, DATA);
        (c, page, data, view)
    }

    fn bytes(p: NonNull<u8>, len: u64) -> Vec<u8> {
        // SAFETY: `len` bytes of a live mapping of ours.
        unsafe { std::slice::from_raw_parts(p.as_ptr(), len as usize) }.to_vec()
    }

    #[test]
    fn rung_copies_run_after_the_frames_sent_before_them() {
        let (c, page, data, view) = with_bell();
        let (ctx, dptr) = (c.ctx, c.dptr);
        for round in 1..=250u8 {
            // A posted fill of device memory, then a rung copy of it into the shared region:
            // the copy sees the fill.
            c.with(|t| {
                t.post(
                    &msg::Memset {
                        ctx,
                        stream: 0,
                        dst: dptr,
                        value: u32::from(round),
                        elem_size: 1,
                        count: DATA,
                    },
                    &[],
                )
            })
            .unwrap();
            let done = c.ring(&page, &c.dtoh(data, DATA));
            assert_eq!(done.status, 0, "{done:?}");
            assert!(
                bytes(view, DATA).iter().all(|&b| b == round),
                "round {round}"
            );
        }
        // And the other way: the region's bytes to the device, read back by a frame.
        // SAFETY: our mapping; nothing reads it meanwhile.
        unsafe { std::ptr::write_bytes(view.as_ptr(), 0xc3, DATA as usize) };
        let req = msg::MemcpyHtoDShared {
            ctx,
            stream: 0,
            dst: dptr,
            region: data,
            offset: 0,
            len: DATA,
        };
        assert_eq!(c.ring(&page, &req).status, 0);
        let back = c
            .with(|t| {
                t.call(
                    &msg::MemcpyDtoH {
                        ctx,
                        stream: 0,
                        src: dptr,
                        len: DATA,
                    },
                    &[],
                )
            })
            .unwrap()
            .1;
        assert!(back.iter().all(|&b| b == 0xc3));
        drop(c.sock);
        assert!(c.served.join().unwrap().is_ok());
    }

    #[test]
    fn a_rung_request_waits_for_the_bytes_sent_before_it_and_for_a_frame_boundary() {
        let fd = memfd(PAGE_BYTES as u64);
        // SAFETY: our mapping of PAGE_BYTES bytes, kept for the whole test.
        let page = unsafe { Page::new(map_shared(&fd, PAGE_BYTES as u64)) };
        let slot = BellSlot::new();
        slot.set(Arc::new(SharedRegion::map(&fd, PAGE_BYTES as u64).unwrap()))
            .unwrap();
        slot.arm(true);
        assert!(!slot.rung(0));
        let seq = page.ring(msg::Ping::OPCODE, &[], 1000);
        // Not before the reader has read the 1000 bytes sent before the request.
        assert!(!slot.rung(999));
        assert!(slot.rung(1000));
        assert!(slot.rung(1001));
        // Not in the middle of a frame.
        slot.arm(false);
        assert!(!slot.rung(1000));
        slot.arm(true);
        let (_, rung) = slot.take().unwrap();
        assert_eq!(rung.seq, seq);
        slot.served(seq);
        assert!(!slot.rung(1000));
        // The reader's sleeping word is the page's.
        slot.sleeping(true);
        assert!(page.server_sleeping());
        slot.sleeping(false);
        assert!(!page.server_sleeping());
    }

    #[test]
    fn a_session_thread_asleep_on_its_socket_is_woken_by_a_ring_frame() {
        let (c, page, data, _) = with_bell();
        // Idle far longer than any spin: the session thread blocks on its socket, and says so.
        let start = Instant::now();
        while !page.server_sleeping() {
            assert!(start.elapsed() < PATIENCE);
            std::thread::sleep(Duration::from_millis(5));
        }
        let req = c.dtoh(data, 16);
        let seq = page.ring(
            msg::MemcpyDtoHShared::OPCODE,
            &msg::encode(&req),
            c.sent.get(),
        );
        // Asleep, it does not see the request.
        assert!(page.server_sleeping());
        assert!(!page.wait_done(seq, Duration::from_millis(50)));
        c.with(|t| t.post(&msg::Ring {}, &[])).unwrap();
        assert_eq!(wait(&page, seq).status, 0);
        assert!(!page.server_sleeping() || page.is_done(seq));
    }

    #[test]
    fn forged_and_malformed_rung_requests_fail_in_the_page_and_the_session_goes_on() {
        let (c, page, data, _) = with_bell();
        let good = msg::MemcpyHtoDShared {
            ctx: c.ctx,
            stream: 0,
            dst: c.dptr,
            region: data,
            offset: 0,
            len: 8,
        };
        let cases: Vec<(u16, Vec<u8>, &str)> = vec![
            (msg::Ping::OPCODE, Vec::new(), "shared-memory copies only"),
            (
                msg::MemcpyHtoDShared::OPCODE,
                msg::encode(&good)[..10].to_vec(),
                "malformed",
            ),
            (
                msg::MemcpyHtoDShared::OPCODE,
                msg::encode(&msg::MemcpyHtoDShared {
                    region: 0x999,
                    ..good
                }),
                "not a shared region",
            ),
            (
                msg::MemcpyHtoDShared::OPCODE,
                msg::encode(&msg::MemcpyHtoDShared {
                    offset: DATA,
                    ..good
                }),
                "outside the shared region",
            ),
            (
                msg::MemcpyDtoHShared::OPCODE,
                msg::encode(&msg::MemcpyDtoHShared {
                    ctx: c.ctx,
                    stream: 0,
                    src: c.dptr + DATA,
                    region: data,
                    offset: 0,
                    len: 8,
                }),
                "",
            ),
        ];
        for (opcode, fields, what) in cases {
            let done = c.ring_raw(&page, opcode, &fields);
            assert_eq!(done.status, cuda::CUDA_ERROR_INVALID_VALUE, "{done:?}");
            assert!(done.message.contains(what), "{done:?} lacks {what:?}");
        }
        // The session serves frames and rung requests as before.
        c.with(|t| t.call(&msg::Ping {}, &[])).unwrap();
        assert_eq!(c.ring(&page, &good).status, 0);
    }

    #[test]
    fn a_request_claiming_bytes_never_sent_waits_and_frames_are_still_served() {
        let (c, page, data, _) = with_bell();
        let req = c.dtoh(data, 16);
        // A guest that says it sent more than it did: its request waits for those bytes.
        let seq = page.ring(
            msg::MemcpyDtoHShared::OPCODE,
            &msg::encode(&req),
            c.sent.get() + (1 << 40),
        );
        c.with(|t| t.post(&msg::Ring {}, &[])).unwrap();
        for _ in 0..20 {
            c.with(|t| t.call(&msg::Ping {}, &[])).unwrap();
        }
        assert!(!page.wait_done(seq, Duration::from_millis(50)));
        // The session ends as any other when the guest goes.
        drop(c.sock);
        assert!(c.served.join().unwrap().is_ok());
    }

    #[test]
    fn frames_of_a_client_that_does_not_keep_its_byte_count_are_still_served() {
        let (mut c, page, data, _) = with_bell();
        // The page says nothing was sent since: the session thread's polls skip the socket, and
        // the frames are read once it blocks on it.
        page.sending(0);
        c.page = None;
        for _ in 0..20 {
            c.with(|t| t.call(&msg::Ping {}, &[])).unwrap();
        }
        let req = c.dtoh(data, 16);
        assert_eq!(c.ring(&page, &req).status, 0);
    }

    #[test]
    fn doorbell_requests_are_checked() {
        // No doorbell where the transport has none.
        let plain = Client::open(false);
        let e = plain
            .with(|t| t.call(&msg::Doorbell { region: 1 }, &[]))
            .unwrap_err();
        assert_eq!(e.0, cuda::CUDA_ERROR_NOT_SUPPORTED, "{e:?}");
        let mut c = Client::open(true);
        // An unknown region, one smaller than a page.
        let e = c
            .with(|t| t.call(&msg::Doorbell { region: 7 }, &[]))
            .unwrap_err();
        assert_eq!(e.0, cuda::CUDA_ERROR_INVALID_VALUE, "{e:?}");
        let small_fd = memfd(100);
        let small = c.share(&small_fd, 100);
        let e = c
            .with(|t| t.call(&msg::Doorbell { region: small }, &[]))
            .unwrap_err();
        assert!(e.1.contains("needs 4096 bytes"), "{e:?}");
        let large_fd = memfd(2 * MAX_DOORBELL_REGION);
        let large = c.share(&large_fd, 2 * MAX_DOORBELL_REGION);
        let e = c
            .with(|t| t.call(&msg::Doorbell { region: large }, &[]))
            .unwrap_err();
        assert!(e.1.contains("needs 4096 bytes"), "{e:?}");
        // One page per session.
        let fd = memfd(PAGE_BYTES as u64);
        // SAFETY: our mapping of PAGE_BYTES bytes, kept for the whole test.
        let page = unsafe { Page::new(map_shared(&fd, PAGE_BYTES as u64)) };
        let region = c.share(&fd, PAGE_BYTES as u64);
        c.with(|t| t.call(&msg::Doorbell { region }, &[])).unwrap();
        let e = c
            .with(|t| t.call(&msg::Doorbell { region }, &[]))
            .unwrap_err();
        assert!(e.1.contains("already"), "{e:?}");
        // Unsharing the page leaves the session's mapping in place: rung requests still work.
        c.with(|t| t.call(&msg::HostUnshare { region }, &[]))
            .unwrap();
        let req = c.dtoh(small, 100);
        assert_eq!(c.ring(&page, &req).status, 0);
    }
}
