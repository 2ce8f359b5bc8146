//! An in-process stand-in for QEMU plus a guest vsock driver, for tests and benchmarks.
//!
//! [`TestGuest::start`] connects to a vsock device's vhost-user socket with the `vhost` crate's
//! [`Frontend`], shares a memfd-backed guest memory with it, sets the queues up the way QEMU does
//! (features, memory table, `SET_VRING_*`, kick/call eventfds) and then plays the guest's
//! `vmw_vsock_virtio_transport`: its own split-queue driver posts rx buffers, sends packets on the
//! tx queue, honours `VIRTIO_RING_F_EVENT_IDX` in both directions and implements vsock credit
//! flow control. [`GuestStream`] is a blocking, `Read`/`Write`-like guest socket.
//!
//! The driver also checks the device: packets with wrong addressing, or data beyond the credit
//! the guest granted, are recorded in [`TestGuest::violations`].
//!
//! Not part of the product: a dev-dependency of the tests, and a dependency of the benchmarks.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserHeaderFlag};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::vhost_user::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestRegionMmap, MmapRegion};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use crate::driver_queue::DriverQueue;
use vgpu_vhost_vsock::packet::{
    GuestMem, PKT_HEADER_SIZE, PacketHeader, VSOCK_HOST_CID, VSOCK_OP_CREDIT_REQUEST,
    VSOCK_OP_CREDIT_UPDATE, VSOCK_OP_REQUEST, VSOCK_OP_RESPONSE, VSOCK_OP_RST, VSOCK_OP_RW,
    VSOCK_OP_SHUTDOWN, VSOCK_SHUTDOWN_BOTH, VSOCK_SHUTDOWN_RCV, VSOCK_SHUTDOWN_SEND,
    VSOCK_TYPE_STREAM,
};
use vgpu_vhost_vsock::{EVENT_QUEUE, NUM_QUEUES, RX_QUEUE, TX_QUEUE};

/// How long blocking harness calls wait by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// First guest port used for guest-initiated connections (Linux's ephemeral range starts at 1024).
const FIRST_GUEST_PORT: u32 = 49152;
/// Guest physical address of the first queue; 0 is avoided because virtio-queue treats a ring at
/// address 0 as unconfigured.
const QUEUE_AREA: u64 = 0x1000;
const PAGE: u64 = 4096;
const MIB2: u64 = 2 << 20;
/// Cookie of chains submitted raw (hostile-descriptor tests).
const RAW_TOKEN: u64 = u64::MAX;
/// Size of the scratch area reserved for raw-chain tests.
const SCRATCH_SIZE: u64 = 64 * 1024;
/// Number of buffers posted on the event queue when it is set up.
const EVENT_BUFFERS: u16 = 4;
/// Size of `struct virtio_vsock_event`.
const EVENT_SIZE: u32 = 4;
/// Guest memory for rx buffers beyond those posted, which a connection holds while its bytes wait
/// to be read ([`Held::Buffer`]).
const SPARE_RX_BYTES: u64 = 4 << 20;
/// Longest single wait on the call eventfds before re-checking.
const POLL_SLICE: Duration = Duration::from_millis(20);

/// How the fake guest sets itself up.
#[derive(Debug, Clone)]
pub struct GuestOptions {
    /// Queue size requested from the device.
    pub queue_size: u16,
    /// Negotiate `VIRTIO_RING_F_EVENT_IDX`.
    pub event_idx: bool,
    /// Payload bytes per rx buffer (Linux: 4096).
    pub rx_buf_size: u32,
    /// Put the rx header and payload in separate descriptors (pre-6.3 Linux layout).
    pub rx_split_header: bool,
    /// Guest receive buffer per connection, advertised as `buf_alloc`.
    pub buf_alloc: u32,
    /// Largest payload per tx packet.
    pub max_tx_payload: u32,
    /// Put tx header and payload in one descriptor (instead of Linux's two).
    pub tx_single_descriptor: bool,
    /// Also configure the event queue (cloud-hypervisor does; QEMU keeps it for itself).
    pub setup_event_queue: bool,
    /// Rx buffers to keep posted (0: as many as the queue holds).
    pub rx_buffers: u16,
    /// Blocking calls spin on the used rings instead of sleeping until the interrupt thread
    /// wakes them (lowest latency, burns a core; for benchmarks). The guest then asks the device
    /// for no interrupts, and its interrupt thread looks at the rings every `POLL_SLICE` only.
    pub busy_poll: bool,
    /// Without `busy_poll`: blocking calls pump the rings themselves this long in each wait
    /// before they sleep until the interrupt thread wakes them, as a guest whose program polls
    /// its socket (the shim's reads do) keeps its vCPU running, so that the device's interrupt
    /// is taken at once instead of waking a halted vCPU. Zero: sleep at once.
    pub poll_first: Duration,
    /// Never kick the tx queue: a buggy or hostile guest whose packets the device finds only
    /// by its wake-up audit (once a second).
    pub mute_tx_kicks: bool,
}

impl Default for GuestOptions {
    fn default() -> Self {
        GuestOptions {
            queue_size: 256,
            event_idx: true,
            rx_buf_size: 4096,
            rx_split_header: false,
            buf_alloc: 256 * 1024,
            max_tx_payload: 64 * 1024,
            tx_single_descriptor: false,
            setup_event_queue: false,
            busy_poll: false,
            poll_first: Duration::ZERO,
            rx_buffers: 0,
            mute_tx_kicks: false,
        }
    }
}

/// One descriptor of a raw chain (hostile-descriptor tests): `next` is an index into the same
/// chain, or an absolute descriptor-table index with `next_absolute`.
#[derive(Debug, Clone, Copy)]
pub struct RawDesc {
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: Option<u16>,
    pub next_absolute: bool,
}

impl RawDesc {
    /// A device-readable descriptor.
    pub fn readable(addr: u64, len: u32) -> Self {
        RawDesc {
            addr,
            len,
            flags: 0,
            next: None,
            next_absolute: false,
        }
    }

    /// A device-writable descriptor.
    pub fn writable(addr: u64, len: u32) -> Self {
        RawDesc {
            flags: VRING_DESC_F_WRITE as u16,
            ..Self::readable(addr, len)
        }
    }

    /// Chains this descriptor to `next` (an index in the same chain).
    pub fn then(mut self, next: u16) -> Self {
        self.flags |= VRING_DESC_F_NEXT as u16;
        self.next = Some(next);
        self
    }
}

/// Bytes of the huge pages [`GuestRam::HugePages`] backs guest RAM with.
pub const HUGE_PAGE: u64 = 2 << 20;

/// What backs fake guest RAM: QEMU's `memory-backend-memfd,share=on`, with or without
/// `hugetlb=on,hugetlbsize=2M`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GuestRam {
    /// 4 KiB shared-memory pages.
    #[default]
    SmallPages,
    /// 2 MiB hugetlbfs pages (the host's `vm.nr_hugepages` must cover the guest).
    HugePages,
}

fn memfd(name: &str, size: u64, ram: GuestRam) -> io::Result<File> {
    let cname = std::ffi::CString::new(name).map_err(io::Error::other)?;
    let flags = match ram {
        GuestRam::SmallPages => libc::MFD_CLOEXEC,
        GuestRam::HugePages => libc::MFD_CLOEXEC | libc::MFD_HUGETLB | libc::MFD_HUGE_2MB,
    };
    // SAFETY: `cname` is a valid NUL-terminated string; memfd_create has no other inputs.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size)?;
    Ok(file)
}

/// Runs `f` with `NEED_REPLY` set, so that it returns once the backend has applied the request
/// (REPLY_ACK), as QEMU waits for memory-table changes: without it a guest that uses hot-added
/// memory right away races the backend's update.
fn acked<T>(
    fe: &mut Frontend,
    f: impl FnOnce(&mut Frontend) -> vhost::Result<T>,
) -> vhost::Result<T> {
    fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    let r = f(fe);
    fe.set_hdr_flags(VhostUserHeaderFlag::empty());
    r
}

/// A guest memory region backed by a fresh memfd (shareable with a backend); with
/// [`GuestRam::HugePages`], `size` must be a multiple of [`HUGE_PAGE`].
pub(crate) fn memfd_region(gpa: u64, size: u64, ram: GuestRam) -> io::Result<GuestRegionMmap<()>> {
    let file = memfd("vgpu-test-guest", size, ram)?;
    let region = MmapRegion::<()>::from_file(FileOffset::new(file, 0), size as usize)
        .map_err(io::Error::other)?;
    GuestRegionMmap::new(region, GuestAddress(gpa))
        .ok_or_else(|| io::Error::other("invalid guest region"))
}

/// Free 2 MiB huge pages of the host (`HugePages_Free` in /proc/meminfo), 0 when unknown.
pub fn free_huge_pages() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("HugePages_Free:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The vhost-user description of the region containing `gpa`.
pub(crate) fn region_info(mem: &GuestMem, gpa: u64) -> io::Result<VhostUserMemoryRegionInfo> {
    let region = mem
        .find_region(GuestAddress(gpa))
        .ok_or_else(|| io::Error::other("no such region"))?;
    VhostUserMemoryRegionInfo::from_guest_region(region).map_err(io::Error::other)
}

/// Runs `f` on a test guest's frontend, which is `None` once it disconnected.
pub(crate) fn on_frontend<T>(
    frontend: &Mutex<Option<Frontend>>,
    f: impl FnOnce(&mut Frontend) -> vhost::Result<T>,
) -> io::Result<T> {
    let mut g = frontend.lock().unwrap_or_else(|p| p.into_inner());
    let fe = g
        .as_mut()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "frontend disconnected"))?;
    f(fe).map_err(vhost_err)
}

/// A vhost error as an I/O error.
pub(crate) fn vhost_err(e: vhost::Error) -> io::Error {
    io::Error::other(e)
}

fn align(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// Which setup sequence to run.
#[derive(Debug)]
enum Setup {
    /// Connect time: owner, protocol features, memory table, fresh rings.
    First,
    /// After RESET_DEVICE: features and fresh rings.
    Reboot,
    /// After GET_VRING_BASE: features and the same rings, restarted at these avail indices.
    Resume(Vec<u16>),
}

/// Adds a chain whose descriptors are written verbatim (for hostile-descriptor tests); its token
/// is [`RAW_TOKEN`]. Returns the head, `None` when out of descriptors.
fn add_raw(q: &mut DriverQueue, mem: &GuestMem, descs: &[RawDesc]) -> Option<u16> {
    let ids = q.take(descs.len())?;
    for (i, d) in descs.iter().enumerate() {
        let next = match d.next {
            Some(n) if d.next_absolute => n,
            Some(n) => ids.get(usize::from(n)).copied().unwrap_or(n),
            None => 0,
        };
        q.write_table_entry(mem, ids[i], (d.addr, d.len, d.flags, next));
    }
    Some(q.push(mem, ids, RAW_TOKEN))
}

/// The rx or tx slot a used chain's token names; `None` for raw chains and unknown ids.
fn slot_of(token: Option<u64>) -> Option<u32> {
    token
        .filter(|&t| t != RAW_TOKEN)
        .and_then(|t| u32::try_from(t).ok())
}

/// Guest-side state of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GState {
    Connecting,
    Established,
    /// We sent SHUTDOWN(both) and wait for the device's RST.
    Closing,
    /// Ended by an RST from the device.
    Reset,
    /// Ended gracefully.
    Closed,
}

/// Received bytes a connection holds for its reader.
#[derive(Debug)]
enum Held {
    /// In the rx buffer the device wrote them to (`slot`), from `at` in guest memory: a Linux
    /// guest keeps the buffer's skb on the socket until `recv` copies the bytes to the program.
    Buffer { slot: u32, at: u64, left: u32 },
    /// Copied out of their rx buffer, when no spare buffer was left to post in its place.
    Copied { bytes: Vec<u8>, read: usize },
}

#[derive(Debug)]
struct GConn {
    state: GState,
    rx_data: VecDeque<Held>,
    rx_total: u32,
    fwd_cnt: u32,
    last_sent_fwd: u32,
    tx_cnt: u32,
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
    peer_shutdown: u32,
    local_shutdown: u32,
}

impl GConn {
    fn new(state: GState) -> Self {
        GConn {
            state,
            rx_data: VecDeque::new(),
            rx_total: 0,
            fwd_cnt: 0,
            last_sent_fwd: 0,
            tx_cnt: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
            peer_shutdown: 0,
            local_shutdown: 0,
        }
    }

    fn peer_credit(&self) -> u32 {
        self.peer_buf_alloc
            .saturating_sub(self.tx_cnt.wrapping_sub(self.peer_fwd_cnt))
    }
}

/// Guest port, host port.
type GKey = (u32, u32);

#[derive(Debug, Clone, Copy)]
enum Ctrl {
    Conn { key: GKey, op: u16, flags: u32 },
    Raw(PacketHeader),
}

#[derive(Debug)]
struct Inner {
    mem: GuestMem,
    opts: GuestOptions,
    cid: u64,
    rxq: DriverQueue,
    txq: DriverQueue,
    evq: Option<DriverQueue>,
    rx_base: u64,
    rx_slot: u64,
    tx_base: u64,
    tx_slot: u64,
    tx_free: Vec<u32>,
    tx_slots: u32,
    /// Rx buffer slots neither posted nor held by a connection.
    rx_spare: Vec<u32>,
    /// All rx buffer slots.
    rx_slots: u32,
    scratch: u64,
    conns: HashMap<GKey, GConn>,
    listeners: HashMap<u32, VecDeque<GKey>>,
    unmatched: VecDeque<PacketHeader>,
    control: VecDeque<Ctrl>,
    next_port: u32,
    violations: Vec<String>,
    rx_packets: u64,
    tx_packets: u64,
}

impl Inner {
    fn rx_slot_addr(&self, slot: u32) -> u64 {
        self.rx_base + u64::from(slot) * self.rx_slot
    }

    fn post_rx(&mut self, slot: u32) {
        let addr = self.rx_slot_addr(slot);
        let payload = self.opts.rx_buf_size;
        let w = VRING_DESC_F_WRITE as u16;
        let bufs: Vec<(u64, u32, u16)> = if self.opts.rx_split_header {
            vec![
                (addr, PKT_HEADER_SIZE as u32, w),
                (addr + PKT_HEADER_SIZE as u64, payload, w),
            ]
        } else {
            vec![(addr, PKT_HEADER_SIZE as u32 + payload, w)]
        };
        self.rxq.add(&self.mem, &bufs, u64::from(slot));
    }

    fn fill_rx(&mut self) {
        let per = if self.opts.rx_split_header { 2 } else { 1 };
        let mut slots = u32::from(self.opts.queue_size) / per;
        if self.opts.rx_buffers > 0 {
            slots = slots.min(u32::from(self.opts.rx_buffers));
        }
        for slot in 0..slots {
            self.post_rx(slot);
        }
        self.rx_spare = (slots..self.rx_slots).rev().collect();
        self.rxq.publish(&self.mem);
        if let Some(evq) = self.evq.as_mut() {
            let base = self.rx_base - u64::from(EVENT_BUFFERS) * 64;
            for i in 0..EVENT_BUFFERS {
                evq.add(
                    &self.mem,
                    &[(
                        base + 64 * u64::from(i),
                        EVENT_SIZE,
                        VRING_DESC_F_WRITE as u16,
                    )],
                    u64::from(i),
                );
            }
            evq.publish(&self.mem);
        }
    }

    fn header(&self, key: GKey, op: u16) -> PacketHeader {
        let (buf_alloc, fwd_cnt) = self
            .conns
            .get(&key)
            .map(|c| (self.opts.buf_alloc, c.fwd_cnt))
            .unwrap_or((self.opts.buf_alloc, 0));
        PacketHeader {
            src_cid: self.cid,
            dst_cid: VSOCK_HOST_CID,
            src_port: key.0,
            dst_port: key.1,
            len: 0,
            type_: VSOCK_TYPE_STREAM,
            op,
            flags: 0,
            buf_alloc,
            fwd_cnt,
        }
    }

    /// Sends one packet if a tx slot is free.
    fn send(&mut self, h: PacketHeader, data: &[u8]) -> bool {
        let Some(slot) = self.tx_free.pop() else {
            return false;
        };
        let addr = self.tx_base + u64::from(slot) * self.tx_slot;
        let _ = self.mem.write_slice(&h.to_bytes(), GuestAddress(addr));
        let _ = self
            .mem
            .write_slice(data, GuestAddress(addr + PKT_HEADER_SIZE as u64));
        let bufs: Vec<(u64, u32, u16)> = if data.is_empty() || self.opts.tx_single_descriptor {
            vec![(addr, (PKT_HEADER_SIZE + data.len()) as u32, 0)]
        } else {
            vec![
                (addr, PKT_HEADER_SIZE as u32, 0),
                (addr + PKT_HEADER_SIZE as u64, data.len() as u32, 0),
            ]
        };
        if !self.txq.add(&self.mem, &bufs, u64::from(slot)) {
            self.tx_free.push(slot);
            return false;
        }
        if let Some(c) = self.conns.get_mut(&(h.src_port, h.dst_port)) {
            c.last_sent_fwd = h.fwd_cnt;
        }
        self.tx_packets += 1;
        self.txq.publish(&self.mem);
        true
    }

    fn flush_control(&mut self) {
        while let Some(c) = self.control.front().copied() {
            let h = match c {
                Ctrl::Raw(h) => h,
                Ctrl::Conn { key, op, flags } => {
                    let mut h = self.header(key, op);
                    h.flags = flags;
                    h
                }
            };
            if !self.send(h, &[]) {
                return;
            }
            self.control.pop_front();
        }
    }

    fn violation(&mut self, what: String) {
        self.violations.push(what);
    }

    fn maybe_credit_update(&mut self, key: GKey) {
        let buf_alloc = self.opts.buf_alloc;
        let Some(c) = self.conns.get(&key) else {
            return;
        };
        let device_view_free = buf_alloc.saturating_sub(c.rx_total.wrapping_sub(c.last_sent_fwd));
        if c.fwd_cnt != c.last_sent_fwd && device_view_free < buf_alloc / 2 {
            self.control.push_back(Ctrl::Conn {
                key,
                op: VSOCK_OP_CREDIT_UPDATE,
                flags: 0,
            });
        }
    }

    /// Handles the packet the device returned in rx buffer `slot`; returns the slot to post in
    /// its place (a spare one where a connection keeps the buffer for its reader).
    fn on_rx(&mut self, slot: u32, len: u32) -> u32 {
        self.rx_packets += 1;
        let addr = self.rx_slot_addr(slot);
        if (len as usize) < PKT_HEADER_SIZE {
            self.violation(format!("rx buffer returned with {len} bytes"));
            return slot;
        }
        let mut raw = [0u8; PKT_HEADER_SIZE];
        let _ = self.mem.read_slice(&mut raw, GuestAddress(addr));
        let h = PacketHeader::from_bytes(&raw);
        if len as usize != PKT_HEADER_SIZE + h.len as usize {
            self.violation(format!(
                "used length {len} does not match header len {}",
                h.len
            ));
            return slot;
        }
        if h.len > self.opts.rx_buf_size {
            self.violation(format!("packet of {} bytes exceeds the rx buffer", h.len));
            return slot;
        }
        if h.src_cid != VSOCK_HOST_CID || h.dst_cid != self.cid || h.type_ != VSOCK_TYPE_STREAM {
            self.violation(format!("bad addressing in {h:?}"));
            return slot;
        }
        self.dispatch(h, slot, GuestAddress(addr + PKT_HEADER_SIZE as u64))
    }

    /// Handles packet `h`, whose payload lies at `data` in guest memory, in rx buffer `slot`;
    /// returns the slot to post in its place.
    fn dispatch(&mut self, h: PacketHeader, slot: u32, data: GuestAddress) -> u32 {
        let key = (h.dst_port, h.src_port);
        let buf_alloc = self.opts.buf_alloc;
        let Some(c) = self.conns.get_mut(&key) else {
            match h.op {
                VSOCK_OP_REQUEST if self.listeners.contains_key(&h.dst_port) => {
                    let mut c = GConn::new(GState::Established);
                    c.peer_buf_alloc = h.buf_alloc;
                    c.peer_fwd_cnt = h.fwd_cnt;
                    self.conns.insert(key, c);
                    self.control.push_back(Ctrl::Conn {
                        key,
                        op: VSOCK_OP_RESPONSE,
                        flags: 0,
                    });
                    if let Some(q) = self.listeners.get_mut(&h.dst_port) {
                        q.push_back(key);
                    }
                }
                VSOCK_OP_RST => self.unmatched.push_back(h),
                _ => {
                    self.unmatched.push_back(h);
                    let mut rst = self.header(key, VSOCK_OP_RST);
                    rst.buf_alloc = 0;
                    self.control.push_back(Ctrl::Raw(rst));
                }
            }
            return slot;
        };
        c.peer_buf_alloc = h.buf_alloc;
        c.peer_fwd_cnt = h.fwd_cnt;
        let mut problem = None;
        let mut reply = None;
        let mut post = slot;
        match h.op {
            VSOCK_OP_RESPONSE => {
                if c.state == GState::Connecting {
                    c.state = GState::Established;
                } else {
                    problem = Some(format!("RESPONSE in state {:?}", c.state));
                }
            }
            VSOCK_OP_RST => {
                c.state = if c.state == GState::Closing {
                    GState::Closed
                } else {
                    GState::Reset
                };
            }
            VSOCK_OP_SHUTDOWN => {
                c.peer_shutdown |= h.flags & VSOCK_SHUTDOWN_BOTH;
                if c.peer_shutdown == VSOCK_SHUTDOWN_BOTH && c.rx_data.is_empty() {
                    // Like Linux: nothing left to read, so confirm the close with an RST.
                    c.state = GState::Closed;
                    reply = Some(VSOCK_OP_RST);
                }
            }
            VSOCK_OP_RW => {
                if !matches!(c.state, GState::Established | GState::Closing) {
                    problem = Some(format!("RW in state {:?}", c.state));
                } else if c.peer_shutdown & VSOCK_SHUTDOWN_SEND != 0 {
                    problem = Some("RW after the device's SHUTDOWN(SEND)".into());
                } else {
                    let in_flight = c.rx_total.wrapping_add(h.len).wrapping_sub(c.fwd_cnt);
                    if in_flight > buf_alloc {
                        problem = Some(format!(
                            "device sent {} bytes beyond the guest's {buf_alloc}-byte credit",
                            in_flight - buf_alloc
                        ));
                    }
                    c.rx_total = c.rx_total.wrapping_add(h.len);
                    // The reader copies the bytes from the rx buffer, once, as a Linux guest's
                    // `recv` copies them from the buffer's skb; a spare buffer is posted in its
                    // place. With no spare left, the bytes are copied out now.
                    if h.len > 0 {
                        match self.rx_spare.pop() {
                            Some(spare) => {
                                c.rx_data.push_back(Held::Buffer {
                                    slot,
                                    at: data.0,
                                    left: h.len,
                                });
                                post = spare;
                            }
                            None => {
                                let mut bytes = vec![0; h.len as usize];
                                let _ = self.mem.read_slice(&mut bytes, data);
                                c.rx_data.push_back(Held::Copied { bytes, read: 0 });
                            }
                        }
                    }
                }
            }
            VSOCK_OP_CREDIT_UPDATE => {}
            VSOCK_OP_CREDIT_REQUEST => reply = Some(VSOCK_OP_CREDIT_UPDATE),
            other => problem = Some(format!("unexpected op {other} on a connection")),
        }
        if let Some(p) = problem {
            self.violation(p);
        }
        if let Some(op) = reply {
            self.control.push_back(Ctrl::Conn { key, op, flags: 0 });
        }
        post
    }

    /// Forgets connection `key`, giving the rx buffers it held back to the spares.
    fn remove_conn(&mut self, key: GKey) -> Option<GConn> {
        let c = self.conns.remove(&key)?;
        for held in &c.rx_data {
            if let Held::Buffer { slot, .. } = held {
                self.rx_spare.push(*slot);
            }
        }
        Some(c)
    }

    /// Copies up to `buf.len()` bytes connection `key` holds into `buf`, giving the rx buffers it
    /// read to the end back to the spares; returns how many.
    fn take_rx(&mut self, key: GKey, buf: &mut [u8]) -> usize {
        let Some(c) = self.conns.get_mut(&key) else {
            return 0;
        };
        let mut n = 0;
        while n < buf.len() {
            let Some(held) = c.rx_data.front_mut() else {
                break;
            };
            let done = match held {
                Held::Buffer { slot, at, left } => {
                    let k = (buf.len() - n).min(*left as usize);
                    let _ = self.mem.read_slice(&mut buf[n..n + k], GuestAddress(*at));
                    n += k;
                    *at += k as u64;
                    *left -= k as u32;
                    (*left == 0).then_some(Some(*slot))
                }
                Held::Copied { bytes, read } => {
                    let k = (buf.len() - n).min(bytes.len() - *read);
                    buf[n..n + k].copy_from_slice(&bytes[*read..*read + k]);
                    n += k;
                    *read += k;
                    (*read == bytes.len()).then_some(None)
                }
            };
            if let Some(slot) = done {
                c.rx_data.pop_front();
                self.rx_spare.extend(slot);
            }
        }
        n
    }

    /// Where the guest's side stands, for a timeout's message: both queues, free tx slots,
    /// spare rx buffers, control packets not yet sent, and the connections still waiting for
    /// credit or holding received bytes.
    fn describe(&self) -> String {
        let starved = self
            .conns
            .values()
            .filter(|c| c.state == GState::Established && c.peer_credit() == 0)
            .count();
        let holding = self
            .conns
            .values()
            .filter(|c| !c.rx_data.is_empty())
            .count();
        format!(
            "tx queue: {}; rx queue: {}; {} of {} tx slots free, {} spare rx buffers, {} control \
             packets unsent, {} connections ({starved} without credit, {holding} holding \
             received bytes), {} packets received, {} sent",
            self.txq.describe(&self.mem),
            self.rxq.describe(&self.mem),
            self.tx_free.len(),
            self.tx_slots,
            self.rx_spare.len(),
            self.control.len(),
            self.conns.len(),
            self.rx_packets,
            self.tx_packets,
        )
    }

    /// Processes everything the device returned and re-posts rx buffers.
    fn pump(&mut self) {
        self.rxq.drain_call();
        self.txq.drain_call();
        loop {
            while let Some((token, _)) = self.txq.pop_used(&self.mem) {
                if let Some(slot) = slot_of(token) {
                    self.tx_free.push(slot);
                }
            }
            let mut reposted = false;
            while let Some((token, len)) = self.rxq.pop_used(&self.mem) {
                let Some(slot) = slot_of(token) else {
                    continue;
                };
                let post = self.on_rx(slot, len);
                self.post_rx(post);
                reposted = true;
            }
            if reposted {
                self.rxq.publish(&self.mem);
            }
            self.flush_control();
            if self.opts.busy_poll {
                // A guest that polls asks for no interrupts (it leaves `used_event` behind), as a
                // guest whose vCPUs poll its queues does: its callers look themselves, and the
                // interrupt thread looks every `POLL_SLICE` for what nobody waited for.
                break;
            }
            let more_tx = self.txq.rearm(&self.mem);
            let more_rx = self.rxq.rearm(&self.mem);
            if !more_tx && !more_rx {
                break;
            }
        }
    }
}

struct Shared {
    inner: Mutex<Inner>,
    /// The guest polls (`GuestOptions::busy_poll`): the interrupt thread looks on every timeout.
    polls: bool,
    /// Interrupts (call eventfd events) the interrupt thread took.
    interrupts: AtomicU64,
    /// Times a blocking call slept until the interrupt thread woke it.
    sleeps: AtomicU64,
    /// Signalled by the interrupt thread after it processed device output.
    progress: Condvar,
    epoll: Epoll,
    frontend: Mutex<Option<Frontend>>,
}

/// The fake VMM + guest. Cheap to clone; all clones drive the same guest.
#[derive(Clone)]
pub struct TestGuest {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TestGuest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestGuest").finish_non_exhaustive()
    }
}

/// Features the fake guest acks when the device offers them.
fn wanted_features(opts: &GuestOptions) -> u64 {
    let mut f = (1 << VIRTIO_F_VERSION_1)
        | (1 << VIRTIO_RING_F_INDIRECT_DESC)
        | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    if opts.event_idx {
        f |= 1 << VIRTIO_RING_F_EVENT_IDX;
    }
    f
}

impl TestGuest {
    /// Connects to the device at `socket` and brings the guest up.
    pub fn start(socket: &Path, opts: GuestOptions) -> io::Result<TestGuest> {
        let n = opts.queue_size;
        if !n.is_power_of_two() || n < 4 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "bad queue size",
            ));
        }
        let qfoot = DriverQueue::footprint(n);
        let ev_area = u64::from(EVENT_BUFFERS) * 64;
        let rx_base = align(QUEUE_AREA + 3 * qfoot + ev_area, PAGE);
        let rx_slot = align(PKT_HEADER_SIZE as u64 + u64::from(opts.rx_buf_size), 64);
        let rx_slots = u32::from(n) + u32::try_from(SPARE_RX_BYTES / rx_slot).unwrap_or(0);
        let tx_slots = u32::from(n) / 2;
        let tx_base = align(rx_base + u64::from(rx_slots) * rx_slot, PAGE);
        let tx_slot = align(PKT_HEADER_SIZE as u64 + u64::from(opts.max_tx_payload), 64);
        let scratch = align(tx_base + u64::from(tx_slots) * tx_slot, PAGE);
        let size = align(scratch + SCRATCH_SIZE, MIB2);

        let mem = GuestMem::from_regions(vec![memfd_region(0, size, GuestRam::SmallPages)?])
            .map_err(io::Error::other)?;
        let mk = |i: usize| DriverQueue::new(QUEUE_AREA + i as u64 * qfoot, n, opts.event_idx);
        let rxq = mk(RX_QUEUE)?;
        let mut txq = mk(TX_QUEUE)?;
        txq.mute = opts.mute_tx_kicks;
        let evq = if opts.setup_event_queue {
            Some(mk(EVENT_QUEUE)?)
        } else {
            None
        };
        // Event buffers sit just below the rx buffers.
        let epoll = Epoll::new()?;
        for q in [&rxq, &txq] {
            epoll.ctl(
                ControlOperation::Add,
                q.call.as_raw_fd(),
                EpollEvent::new(EventSet::IN, 0),
            )?;
        }
        let inner = Inner {
            mem,
            opts,
            cid: 0,
            rxq,
            txq,
            evq,
            rx_base,
            rx_slot,
            tx_base,
            tx_slot,
            tx_free: (0..tx_slots).rev().collect(),
            tx_slots,
            rx_spare: Vec::new(),
            rx_slots,
            scratch,
            conns: HashMap::new(),
            listeners: HashMap::new(),
            unmatched: VecDeque::new(),
            control: VecDeque::new(),
            next_port: FIRST_GUEST_PORT,
            violations: Vec::new(),
            rx_packets: 0,
            tx_packets: 0,
        };
        let frontend = Frontend::connect(socket, NUM_QUEUES as u64).map_err(vhost_err)?;
        let guest = TestGuest {
            shared: Arc::new(Shared {
                polls: inner.opts.busy_poll,
                interrupts: AtomicU64::new(0),
                sleeps: AtomicU64::new(0),
                inner: Mutex::new(inner),
                progress: Condvar::new(),
                epoll,
                frontend: Mutex::new(Some(frontend)),
            }),
        };
        guest.setup(Setup::First)?;
        guest.spawn_interrupt_thread()?;
        Ok(guest)
    }

    /// Like a guest kernel, answers the device (RST to unknown ports, credit updates, accepting
    /// host connections) even while no test thread is waiting on the guest. Exits once every
    /// handle to the guest is dropped.
    fn spawn_interrupt_thread(&self) -> io::Result<()> {
        let weak = Arc::downgrade(&self.shared);
        std::thread::Builder::new()
            .name("vsock-test-guest-irq".into())
            .spawn(move || {
                let mut events = [EpollEvent::default(); 2];
                let ms = i32::try_from(POLL_SLICE.as_millis()).unwrap_or(20);
                loop {
                    let Some(shared) = weak.upgrade() else {
                        return;
                    };
                    let n = shared.epoll.wait(ms, &mut events).unwrap_or(0);
                    if n > 0 {
                        shared.interrupts.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    if n > 0 || shared.polls {
                        let mut g = shared.inner.lock().unwrap_or_else(|p| p.into_inner());
                        g.pump();
                        drop(g);
                        shared.progress.notify_all();
                    }
                }
            })?;
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn with_frontend<T>(&self, f: impl FnOnce(&mut Frontend) -> vhost::Result<T>) -> io::Result<T> {
        on_frontend(&self.shared.frontend, f)
    }

    /// The QEMU-like setup sequence.
    fn setup(&self, mode: Setup) -> io::Result<()> {
        let first = matches!(mode, Setup::First);
        let mut inner = self.lock();
        let inner = &mut *inner;
        let want = wanted_features(&inner.opts);
        let event_idx = inner.opts.event_idx;
        let queue_size = inner.opts.queue_size;
        let mut queues: Vec<(usize, &DriverQueue)> =
            vec![(RX_QUEUE, &inner.rxq), (TX_QUEUE, &inner.txq)];
        if let Some(evq) = inner.evq.as_ref() {
            queues.push((EVENT_QUEUE, evq));
        }
        let region = region_info(&inner.mem, 0)?;
        let mut vas = Vec::new();
        for (i, q) in &queues {
            let va = |gpa: u64| -> io::Result<u64> {
                inner
                    .mem
                    .get_host_address(GuestAddress(gpa))
                    .map(|p| p as u64)
                    .map_err(io::Error::other)
            };
            vas.push((*i, va(q.desc)?, va(q.avail)?, va(q.used)?));
        }
        let calls: Vec<EventFd> = queues
            .iter()
            .map(|(_, q)| q.call.try_clone())
            .collect::<io::Result<_>>()?;
        let kicks: Vec<EventFd> = queues
            .iter()
            .map(|(_, q)| q.kick.try_clone())
            .collect::<io::Result<_>>()?;
        let cid = self.with_frontend(|fe| {
            if first {
                fe.set_owner()?;
            }
            let offered = fe.get_features()?;
            let acked = offered & want;
            if first {
                let pf = fe.get_protocol_features()?;
                fe.set_protocol_features(
                    pf & (VhostUserProtocolFeatures::MQ
                        | VhostUserProtocolFeatures::CONFIG
                        | VhostUserProtocolFeatures::RESET_DEVICE
                        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
                        | VhostUserProtocolFeatures::REPLY_ACK),
                )?;
                fe.get_queue_num()?;
            }
            fe.set_features(acked)?;
            let (_, cfg) = fe.get_config(0, 8, VhostUserConfigFlags::empty(), &[0u8; 8])?;
            if first {
                fe.set_mem_table(&[region])?;
            }
            for (j, (i, desc, avail, used)) in vas.iter().enumerate() {
                fe.set_vring_num(*i, queue_size)?;
                fe.set_vring_addr(
                    *i,
                    &VringConfigData {
                        queue_max_size: queue_size,
                        queue_size,
                        flags: 0,
                        desc_table_addr: *desc,
                        used_ring_addr: *used,
                        avail_ring_addr: *avail,
                        log_addr: None,
                    },
                )?;
                let base = match &mode {
                    Setup::Resume(bases) => bases.get(j).copied().unwrap_or(0),
                    Setup::First | Setup::Reboot => 0,
                };
                fe.set_vring_base(*i, base)?;
                fe.set_vring_call(*i, &calls[j])?;
                fe.set_vring_kick(*i, &kicks[j])?;
                fe.set_vring_enable(*i, true)?;
            }
            // A request with a reply: once it is answered the backend has handled every message
            // above (SET_VRING_ENABLE has no reply without REPLY_ACK).
            fe.get_features()?;
            let mut b = [0u8; 8];
            b.copy_from_slice(&cfg[..8.min(cfg.len())]);
            Ok(u64::from_le_bytes(b))
        })?;
        inner.cid = cid;
        inner.rxq.event_idx = event_idx;
        inner.txq.event_idx = event_idx;
        if !matches!(mode, Setup::Resume(_)) {
            inner.fill_rx();
        }
        Ok(())
    }

    /// The CID the device reported in its config space.
    pub fn cid(&self) -> u64 {
        self.lock().cid
    }

    /// Device misbehaviour seen so far (must stay empty in every test).
    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    /// Interrupts the guest's interrupt thread took so far (a busy-polling guest asks for none).
    pub fn interrupts(&self) -> u64 {
        self.shared.interrupts.load(Ordering::Relaxed)
    }

    /// Times a blocking call slept until the interrupt thread woke it (or a slice passed).
    pub fn sleeps(&self) -> u64 {
        self.shared.sleeps.load(Ordering::Relaxed)
    }

    /// Packets received and sent by the guest so far.
    pub fn packet_counts(&self) -> (u64, u64) {
        let g = self.lock();
        (g.rx_packets, g.tx_packets)
    }

    /// Runs `f` after processing device output until it returns `Some`, or times out.
    fn wait_for<T>(
        &self,
        timeout: Duration,
        mut f: impl FnMut(&mut Inner) -> Option<T>,
    ) -> io::Result<T> {
        let start = Instant::now();
        let deadline = start + timeout;
        let mut g = self.lock();
        loop {
            g.pump();
            let r = f(&mut g);
            g.flush_control();
            if let Some(v) = r {
                return Ok(v);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("timed out waiting for the device ({})", g.describe()),
                ));
            }
            if g.opts.busy_poll {
                drop(g);
                std::thread::yield_now();
                g = self.lock();
            } else if now - start < g.opts.poll_first {
                drop(g);
                std::hint::spin_loop();
                g = self.lock();
            } else {
                let slice = (deadline - now).min(POLL_SLICE);
                self.shared.sleeps.fetch_add(1, Ordering::Relaxed);
                g = match self.shared.progress.wait_timeout(g, slice) {
                    Ok((g, _)) => g,
                    Err(p) => p.into_inner().0,
                };
            }
        }
    }

    /// Connects a guest socket to `port` on the host (CID 2).
    pub fn connect(&self, port: u32) -> io::Result<GuestStream> {
        self.connect_timeout(port, DEFAULT_TIMEOUT)
    }

    /// [`connect`](Self::connect) with a deadline.
    pub fn connect_timeout(&self, port: u32, timeout: Duration) -> io::Result<GuestStream> {
        let key = {
            let mut g = self.lock();
            let local = g.next_port;
            g.next_port = g.next_port.wrapping_add(1).max(FIRST_GUEST_PORT);
            let key = (local, port);
            g.conns.insert(key, GConn::new(GState::Connecting));
            g.control.push_back(Ctrl::Conn {
                key,
                op: VSOCK_OP_REQUEST,
                flags: 0,
            });
            g.flush_control();
            key
        };
        let state = self.wait_for(timeout, |g| match g.conns.get(&key).map(|c| c.state) {
            Some(GState::Connecting) => None,
            other => Some(other),
        })?;
        match state {
            Some(GState::Established) => Ok(GuestStream {
                guest: self.clone(),
                key,
            }),
            _ => {
                self.lock().remove_conn(key);
                Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("port {port}: connection refused"),
                ))
            }
        }
    }

    /// Starts listening on guest port `port`.
    pub fn listen(&self, port: u32) {
        self.lock().listeners.entry(port).or_default();
    }

    /// Waits for a host-initiated connection on a listened port.
    pub fn accept(&self, port: u32, timeout: Duration) -> io::Result<GuestStream> {
        let key = self.wait_for(timeout, |g| g.listeners.get_mut(&port)?.pop_front())?;
        Ok(GuestStream {
            guest: self.clone(),
            key,
        })
    }

    /// Sends an arbitrary packet (protocol-level tests). Returns false without free tx space.
    pub fn send_raw(&self, h: PacketHeader, data: &[u8]) -> bool {
        let mut g = self.lock();
        g.pump();
        g.send(h, data)
    }

    /// A header from this guest with the given ports and op.
    pub fn raw_header(&self, src_port: u32, dst_port: u32, op: u16) -> PacketHeader {
        let g = self.lock();
        let mut h = g.header((src_port, dst_port), op);
        h.buf_alloc = g.opts.buf_alloc;
        h
    }

    /// Waits for a packet that matched no guest connection (for example an RST).
    pub fn recv_unmatched(&self, timeout: Duration) -> io::Result<PacketHeader> {
        self.wait_for(timeout, |g| g.unmatched.pop_front())
    }

    /// Places a raw descriptor chain on the tx queue (or the rx queue with `rx`) and kicks.
    /// Returns its head index.
    pub fn post_raw_chain(&self, rx: bool, descs: &[RawDesc]) -> io::Result<u16> {
        let mut g = self.lock();
        let g = &mut *g;
        let q = if rx { &mut g.rxq } else { &mut g.txq };
        let head =
            add_raw(q, &g.mem, descs).ok_or_else(|| io::Error::other("no free descriptors"))?;
        q.publish(&g.mem);
        Ok(head)
    }

    /// Waits until the device returned the raw chain with head `head`.
    pub fn wait_raw_returned(&self, rx: bool, head: u16, timeout: Duration) -> io::Result<()> {
        self.wait_for(timeout, |g| {
            let q = if rx { &g.rxq } else { &g.txq };
            (!q.in_flight(head)).then_some(())
        })
    }

    /// [`post_raw_chain`](Self::post_raw_chain) followed by
    /// [`wait_raw_returned`](Self::wait_raw_returned).
    pub fn submit_raw_chain(
        &self,
        rx: bool,
        descs: &[RawDesc],
        timeout: Duration,
    ) -> io::Result<()> {
        let head = self.post_raw_chain(rx, descs)?;
        self.wait_raw_returned(rx, head, timeout)
    }

    /// Guest physical address and length of a scratch area reserved for raw-chain tests.
    pub fn scratch_area(&self) -> (u64, u64) {
        (self.lock().scratch, SCRATCH_SIZE)
    }

    /// Writes bytes into guest memory.
    pub fn write_mem(&self, gpa: u64, data: &[u8]) -> io::Result<()> {
        self.lock()
            .mem
            .write_slice(data, GuestAddress(gpa))
            .map_err(io::Error::other)
    }

    /// End of the guest memory currently mapped.
    pub fn memory_end(&self) -> u64 {
        self.lock().mem.last_addr().0 + 1
    }

    /// Hot-adds a memfd-backed region at `gpa` (VHOST_USER_ADD_MEM_REG).
    pub fn add_memory_region(&self, gpa: u64, size: u64) -> io::Result<()> {
        let region = Arc::new(memfd_region(gpa, size, GuestRam::SmallPages)?);
        let mut g = self.lock();
        let new_mem = g.mem.insert_region(region).map_err(io::Error::other)?;
        let info = region_info(&new_mem, gpa)?;
        self.with_frontend(|fe| acked(fe, |fe| fe.add_mem_region(&info).map(|_| ())))?;
        g.mem = new_mem;
        Ok(())
    }

    /// Removes a hot-added region (VHOST_USER_REM_MEM_REG). Tx slots must not live there.
    pub fn remove_memory_region(&self, gpa: u64) -> io::Result<()> {
        let mut g = self.lock();
        let info = region_info(&g.mem, gpa)?;
        self.with_frontend(|fe| acked(fe, |fe| fe.remove_mem_region(&info)))?;
        let (new_mem, _) = g
            .mem
            .remove_region(GuestAddress(gpa), info.memory_size)
            .map_err(io::Error::other)?;
        g.mem = new_mem;
        Ok(())
    }

    /// Moves the tx packet buffers to `gpa` (which must hold them all), waiting until none is in
    /// flight. `None` moves them back to their original place.
    pub fn relocate_tx_buffers(&self, gpa: Option<u64>, timeout: Duration) -> io::Result<()> {
        self.wait_for(timeout, |g| {
            (g.tx_free.len() as u32 == g.tx_slots).then_some(())
        })?;
        let mut g = self.lock();
        g.tx_base = match gpa {
            Some(a) => a,
            None => {
                let n = g.opts.queue_size;
                align(g.rx_base + u64::from(n) * g.rx_slot, PAGE)
            }
        };
        Ok(())
    }

    /// Bytes needed to hold every tx buffer (for [`relocate_tx_buffers`](Self::relocate_tx_buffers)).
    pub fn tx_buffers_size(&self) -> u64 {
        let g = self.lock();
        u64::from(g.tx_slots) * g.tx_slot
    }

    /// Simulates a guest reboot the way QEMU drives it: stop the rings (GET_VRING_BASE), send
    /// VHOST_USER_RESET_DEVICE, then set the device up again with fresh rings. Guest sockets are
    /// forgotten.
    pub fn reboot(&self) -> io::Result<()> {
        let queues: Vec<usize> = {
            let g = self.lock();
            let mut q = vec![RX_QUEUE, TX_QUEUE];
            if g.evq.is_some() {
                q.push(EVENT_QUEUE);
            }
            q
        };
        self.with_frontend(|fe| {
            for &i in &queues {
                fe.get_vring_base(i)?;
            }
            fe.reset_device()
        })?;
        {
            let mut g = self.lock();
            let g = &mut *g;
            let n = g.opts.queue_size;
            let event_idx = g.opts.event_idx;
            let zero = vec![0u8; (3 * DriverQueue::footprint(n)) as usize];
            let _ = g.mem.write_slice(&zero, GuestAddress(QUEUE_AREA));
            for (q, i) in [(&mut g.rxq, RX_QUEUE), (&mut g.txq, TX_QUEUE)] {
                let mut fresh = DriverQueue::new(
                    QUEUE_AREA + i as u64 * DriverQueue::footprint(n),
                    n,
                    event_idx,
                )?;
                fresh.kick = q.kick.try_clone()?;
                fresh.call = q.call.try_clone()?;
                fresh.mute = q.mute;
                *q = fresh;
            }
            if let Some(evq) = g.evq.as_mut() {
                let mut fresh = DriverQueue::new(
                    QUEUE_AREA + EVENT_QUEUE as u64 * DriverQueue::footprint(n),
                    n,
                    event_idx,
                )?;
                fresh.kick = evq.kick.try_clone()?;
                fresh.call = evq.call.try_clone()?;
                *evq = fresh;
            }
            g.conns.clear();
            g.listeners.clear();
            g.control.clear();
            g.unmatched.clear();
            g.tx_free = (0..g.tx_slots).rev().collect();
        }
        self.setup(Setup::Reboot)
    }

    /// Simulates QEMU's `stop` then `cont`: every ring is stopped with GET_VRING_BASE, `during`
    /// runs while the VM is paused, then the rings are started again where they stopped (no
    /// device reset).
    pub fn pause_resume(&self, during: impl FnOnce()) -> io::Result<()> {
        let queues: Vec<usize> = {
            let g = self.lock();
            let mut q = vec![RX_QUEUE, TX_QUEUE];
            if g.evq.is_some() {
                q.push(EVENT_QUEUE);
            }
            q
        };
        let bases = self.with_frontend(|fe| {
            queues
                .iter()
                .map(|&i| fe.get_vring_base(i).map(|b| b as u16))
                .collect::<vhost::Result<Vec<u16>>>()
        })?;
        during();
        self.setup(Setup::Resume(bases))
    }

    /// Closes the vhost-user connection, as a VMM does when it exits.
    pub fn disconnect(&self) {
        let fe = self
            .shared
            .frontend
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        drop(fe);
    }
}

/// A connected guest socket.
#[derive(Debug)]
pub struct GuestStream {
    guest: TestGuest,
    key: GKey,
}

/// A socket the guest program drops without closing it (a process killed or ending without
/// `close`) is aborted with an RST, as the guest kernel does when it releases the socket.
impl Drop for GuestStream {
    fn drop(&mut self) {
        let mut g = self.guest.lock();
        let key = self.key;
        if g.remove_conn(key).is_some() {
            let mut h = g.header(key, VSOCK_OP_RST);
            h.buf_alloc = 0;
            g.control.push_back(Ctrl::Raw(h));
            g.flush_control();
        }
    }
}

/// A guest socket as a byte stream (what a protocol client wants): reads and writes wait up to
/// [`DEFAULT_TIMEOUT`].
impl io::Read for GuestStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        GuestStream::read(self, buf)
    }
}

impl io::Write for GuestStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        GuestStream::write_all(self, buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl GuestStream {
    /// Guest-side port.
    pub fn local_port(&self) -> u32 {
        self.key.0
    }

    /// Host-side port.
    pub fn peer_port(&self) -> u32 {
        self.key.1
    }

    /// The device's receive buffer for this connection (`buf_alloc` of its last packet).
    pub fn peer_buf_alloc(&self) -> u32 {
        self.guest
            .lock()
            .conns
            .get(&self.key)
            .map_or(0, |c| c.peer_buf_alloc)
    }

    /// The credit the device last granted: bytes this stream may send before it must wait.
    pub fn peer_credit(&self) -> u32 {
        self.guest
            .lock()
            .conns
            .get(&self.key)
            .map_or(0, GConn::peer_credit)
    }

    /// Sends all of `data`, waiting for credit as needed.
    pub fn write_all(&self, data: &[u8]) -> io::Result<()> {
        self.write_all_timeout(data, DEFAULT_TIMEOUT)
    }

    /// [`write_all`](Self::write_all) with a deadline.
    pub fn write_all_timeout(&self, data: &[u8], timeout: Duration) -> io::Result<()> {
        let key = self.key;
        let mut off = 0usize;
        self.guest.wait_for(timeout, |g| {
            loop {
                let max = g.opts.max_tx_payload as usize;
                let Some(c) = g.conns.get(&key) else {
                    return Some(Err(io::ErrorKind::NotConnected.into()));
                };
                match c.state {
                    GState::Established => {}
                    GState::Reset => return Some(Err(io::ErrorKind::ConnectionReset.into())),
                    _ => return Some(Err(io::ErrorKind::BrokenPipe.into())),
                }
                if c.peer_shutdown & VSOCK_SHUTDOWN_RCV != 0
                    || c.local_shutdown & VSOCK_SHUTDOWN_SEND != 0
                {
                    return Some(Err(io::ErrorKind::BrokenPipe.into()));
                }
                if off == data.len() {
                    return Some(Ok(()));
                }
                let n = (c.peer_credit() as usize).min(max).min(data.len() - off);
                if n == 0 {
                    return None;
                }
                let mut h = g.header(key, VSOCK_OP_RW);
                h.len = n as u32;
                if !g.send(h, &data[off..off + n]) {
                    return None;
                }
                if let Some(c) = g.conns.get_mut(&key) {
                    c.tx_cnt = c.tx_cnt.wrapping_add(n as u32);
                }
                off += n;
            }
        })?
    }

    /// Reads available bytes (waiting for at least one); 0 means the host closed its side.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_timeout(buf, DEFAULT_TIMEOUT)
    }

    /// [`read`](Self::read) with a deadline.
    pub fn read_timeout(&self, buf: &mut [u8], timeout: Duration) -> io::Result<usize> {
        let key = self.key;
        self.guest.wait_for(timeout, |g| {
            let Some(c) = g.conns.get_mut(&key) else {
                return Some(Err(io::ErrorKind::NotConnected.into()));
            };
            if !c.rx_data.is_empty() {
                let n = g.take_rx(key, buf);
                let Some(c) = g.conns.get_mut(&key) else {
                    return Some(Ok(n));
                };
                c.fwd_cnt = c.fwd_cnt.wrapping_add(n as u32);
                let close = c.peer_shutdown == VSOCK_SHUTDOWN_BOTH
                    && c.rx_data.is_empty()
                    && c.state == GState::Established;
                if close {
                    c.state = GState::Closed;
                    g.control.push_back(Ctrl::Conn {
                        key,
                        op: VSOCK_OP_RST,
                        flags: 0,
                    });
                } else {
                    g.maybe_credit_update(key);
                }
                return Some(Ok(n));
            }
            if c.state == GState::Reset {
                return Some(Err(io::ErrorKind::ConnectionReset.into()));
            }
            if c.peer_shutdown & VSOCK_SHUTDOWN_SEND != 0 || c.state == GState::Closed {
                return Some(Ok(0));
            }
            None
        })?
    }

    /// Reads exactly `buf.len()` bytes.
    pub fn read_exact(&self, buf: &mut [u8]) -> io::Result<()> {
        let mut off = 0;
        while off < buf.len() {
            match self.read(&mut buf[off..])? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => off += n,
            }
        }
        Ok(())
    }

    /// Reads until the host closes its side.
    pub fn read_to_end(&self, out: &mut Vec<u8>) -> io::Result<usize> {
        let mut buf = vec![0u8; 64 * 1024];
        let start = out.len();
        loop {
            match self.read(&mut buf)? {
                0 => return Ok(out.len() - start),
                n => out.extend_from_slice(&buf[..n]),
            }
        }
    }

    /// `shutdown(SHUT_WR)`: the host sees end of file.
    pub fn shutdown_write(&self) -> io::Result<()> {
        let key = self.key;
        let mut g = self.guest.lock();
        let c = g.conns.get_mut(&key).ok_or(io::ErrorKind::NotConnected)?;
        c.local_shutdown |= VSOCK_SHUTDOWN_SEND;
        g.control.push_back(Ctrl::Conn {
            key,
            op: VSOCK_OP_SHUTDOWN,
            flags: VSOCK_SHUTDOWN_SEND,
        });
        g.flush_control();
        Ok(())
    }

    /// Graceful close like Linux: SHUTDOWN(both), then wait for the device's RST.
    pub fn close(self, timeout: Duration) -> io::Result<()> {
        let key = self.key;
        {
            let mut g = self.guest.lock();
            let c = g.conns.get_mut(&key).ok_or(io::ErrorKind::NotConnected)?;
            if c.state == GState::Established {
                c.state = GState::Closing;
                c.local_shutdown = VSOCK_SHUTDOWN_BOTH;
                g.control.push_back(Ctrl::Conn {
                    key,
                    op: VSOCK_OP_SHUTDOWN,
                    flags: VSOCK_SHUTDOWN_BOTH,
                });
                g.flush_control();
            }
        }
        let r = self
            .guest
            .wait_for(timeout, |g| match g.conns.get(&key).map(|c| c.state) {
                Some(GState::Closing) => None,
                _ => Some(()),
            });
        self.guest.lock().remove_conn(key);
        r
    }

    /// Aborts the connection with an RST.
    pub fn reset(self) {
        drop(self);
    }

    /// Whether the device reset the connection.
    pub fn is_reset(&self) -> bool {
        let mut g = self.guest.lock();
        g.pump();
        matches!(
            g.conns.get(&self.key).map(|c| c.state),
            Some(GState::Reset) | None
        )
    }
}

/// A [`VsockServer`](vgpu_vhost_vsock::VsockServer) running on its own thread with sockets in a private
/// temporary directory; stopped (and the directory removed) on drop.
#[derive(Debug)]
pub struct TestServer {
    pub dir: std::path::PathBuf,
    pub config: vgpu_vhost_vsock::VsockConfig,
    pub stats: Arc<vgpu_vhost_vsock::VsockStats>,
    stop: vgpu_vhost_vsock::StopHandle,
    thread: Option<std::thread::JoinHandle<Result<(), vgpu_vhost_vsock::Error>>>,
}

fn private_dir() -> io::Result<std::path::PathBuf> {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("vgpu-vsock-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

impl TestServer {
    /// Starts a device for CID 3 with `connector`; `tweak` may adjust the configuration.
    pub fn start(
        connector: Arc<dyn vgpu_vhost_vsock::PortConnector>,
        tweak: impl FnOnce(&mut vgpu_vhost_vsock::VsockConfig),
    ) -> io::Result<TestServer> {
        let dir = private_dir()?;
        let mut config =
            vgpu_vhost_vsock::VsockConfig::new(3, dir.join("vhost.sock"), dir.join("vsock"));
        tweak(&mut config);
        let server = vgpu_vhost_vsock::VsockServer::bind(config.clone(), connector)
            .map_err(io::Error::other)?;
        let stats = server.stats();
        let stop = vgpu_vhost_vsock::StopHandle::new()?;
        let s2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("vsock-test-server".into())
            .spawn(move || server.run(&s2))?;
        Ok(TestServer {
            dir,
            config,
            stats,
            stop,
            thread: Some(thread),
        })
    }

    /// Connects a fake VMM + guest.
    pub fn guest(&self, opts: GuestOptions) -> io::Result<TestGuest> {
        TestGuest::start(&self.config.socket, opts)
    }

    /// The device's counters now.
    pub fn snapshot(&self) -> vgpu_vhost_vsock::VsockStatsSnapshot {
        self.stats.snapshot()
    }

    /// Waits until `cond` holds for the counters (they are updated asynchronously).
    pub fn wait_stats(
        &self,
        timeout: Duration,
        cond: impl Fn(&vgpu_vhost_vsock::VsockStatsSnapshot) -> bool,
    ) -> Result<vgpu_vhost_vsock::VsockStatsSnapshot, vgpu_vhost_vsock::VsockStatsSnapshot> {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.stats.snapshot();
            if cond(&s) {
                return Ok(s);
            }
            if Instant::now() >= deadline {
                return Err(s);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Stops the server and returns its result.
    pub fn stop(mut self) -> Result<(), vgpu_vhost_vsock::Error> {
        self.stop.stop();
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| {
                Err(vgpu_vhost_vsock::Error::Daemon(
                    "server thread panicked".into(),
                ))
            }),
            None => Ok(()),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A connector that serves the given ports in-process and hands the host end of each new
/// connection to the test through a channel.
#[derive(Debug)]
pub struct ChannelConnector {
    ports: Vec<u32>,
    tx: Mutex<std::sync::mpsc::Sender<(u32, std::os::unix::net::UnixStream)>>,
}

impl ChannelConnector {
    /// The connector and the receiving end of its channel.
    pub fn new(
        ports: &[u32],
    ) -> (
        Arc<ChannelConnector>,
        std::sync::mpsc::Receiver<(u32, std::os::unix::net::UnixStream)>,
    ) {
        let (tx, rx) = std::sync::mpsc::channel();
        (
            Arc::new(ChannelConnector {
                ports: ports.to_vec(),
                tx: Mutex::new(tx),
            }),
            rx,
        )
    }
}

impl vgpu_vhost_vsock::PortConnector for ChannelConnector {
    fn connect(&self, port: u32) -> Option<io::Result<vgpu_vhost_vsock::Endpoint>> {
        if !self.ports.contains(&port) {
            return None;
        }
        Some(
            std::os::unix::net::UnixStream::pair().and_then(|(ours, theirs)| {
                self.tx
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .send((port, theirs))
                    .map_err(|_| io::Error::other("test dropped the receiver"))?;
                Ok(ours.into())
            }),
        )
    }
}

/// A connector that serves `port` in-process with an echo thread per connection, over an
/// in-process endpoint (`vgpu_vhost_vsock::inproc`, the way vgpud serves the GPU port).
#[derive(Debug, Clone, Copy)]
pub struct EchoConnector(pub u32);

impl vgpu_vhost_vsock::PortConnector for EchoConnector {
    fn connect(&self, port: u32) -> Option<io::Result<vgpu_vhost_vsock::Endpoint>> {
        if port != self.0 {
            return None;
        }
        Some(
            vgpu_vhost_vsock::inproc::pair(vgpu_vhost_vsock::inproc::DEFAULT_RING_CAPACITY)
                .and_then(|(ours, theirs)| {
                    std::thread::Builder::new()
                        .name("vsock-echo".into())
                        .spawn(move || echo(theirs))?;
                    Ok(ours.into())
                }),
        )
    }
}

/// Echoes everything read from `s` back to it until end of file.
pub fn echo(mut s: impl io::Read + io::Write) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if s.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

/// Deterministic test pattern: byte `i` of stream `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
