//! An in-process stand-in for QEMU plus the guest's `vgpu` kernel module, for tests and
//! benchmarks.
//!
//! [`DevGuest::start`] connects to a virtio-vgpu device's vhost-user socket with the `vhost`
//! crate's [`Frontend`], shares a memfd-backed guest memory with it and sets both queues up the
//! way QEMU does. It then plays the guest driver: its split-queue driver builds request chains
//! with indirect descriptor tables (as Linux does for multi-buffer requests), scatter-gather lists
//! of 4 KiB "pinned pages" spread over guest memory, and polls the used rings.
//! [`DevSession`] is one open `/dev/vgpuN`: it speaks vgpu protocol frames over the device.
//!
//! Not part of the product: a dev-dependency of the tests, and a dependency of the benchmarks.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vgpu_proto::frame::{FLAG_ASYNC, HEADER_LEN, Header};
use vgpu_proto::msg::{self, Op};
use vhost::vhost_user::message::VhostUserConfigFlags;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::vhost_user::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::{VhostBackend, VringConfigData};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT,
    VRING_DESC_F_WRITE,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use crate::driver_queue::DriverQueue;
use crate::vsock::{GuestRam, memfd_region, on_frontend, region_info, vhost_err};
use vgpu_vhost_vgpu::chain::{GuestMem, Segment, Segments};
use vgpu_vhost_vgpu::wire::{
    CONFIG_SIZE, CTRL_QUEUE, ConfigSpace, F_BATCH, NUM_QUEUES, REQ_BATCH, REQ_CALL, REQ_CLOSE,
    REQ_HEADER_LEN, REQ_OPEN, RESP_HEADER_LEN, ReqHeader, RespHeader, S_OK, SUBMIT_QUEUE,
};

/// How long blocking calls wait by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(20);
/// Guest page size.
pub const PAGE: u64 = 4096;
/// Guest physical address of the queue area (0 means "unconfigured" to virtio-queue).
const QUEUE_AREA: u64 = 0x1000;
/// Bytes per request slot: request header, inline bytes, response header, reply area.
const SLOT: u64 = 256 << 10;
/// Offset of the response header in a slot.
const SLOT_RESP: u64 = 128 << 10;
/// Largest inline part and reply area the harness supports.
pub const MAX_SLOT_BYTES: u32 = (SLOT_RESP - REQ_HEADER_LEN as u64) as u32;
/// Requests in flight per queue.
const SLOTS_PER_QUEUE: u16 = 32;
/// Descriptors per indirect table.
const TABLE_ENTRIES: u64 = 2048;
const MIB2: u64 = 2 << 20;

/// How the fake guest sets itself up.
#[derive(Debug, Clone)]
pub struct DevGuestOptions {
    /// Queue size requested from the device.
    pub queue_size: u16,
    /// Guest RAM in bytes (a memfd; pages are allocated on first use).
    pub memory: u64,
    /// Negotiate `VIRTIO_RING_F_EVENT_IDX`.
    pub event_idx: bool,
    /// Spin on the used rings instead of sleeping on the call eventfds (benchmarks).
    pub busy_poll: bool,
    /// Spin on the used rings this long in each wait before sleeping on the call eventfds, as
    /// the guest module does for a synchronous call (its `poll_us`); zero: sleep at once.
    pub poll_first: Duration,
    /// Put request chains in indirect tables (Linux does for more than one buffer).
    pub indirect: bool,
    /// What backs guest RAM.
    pub ram: GuestRam,
    /// Accept the device's BATCH feature (as the guest module does).
    pub batch: bool,
}

impl Default for DevGuestOptions {
    fn default() -> Self {
        DevGuestOptions {
            queue_size: 256,
            memory: 64 << 20,
            event_idx: true,
            busy_poll: false,
            poll_first: Duration::ZERO,
            indirect: true,
            ram: GuestRam::SmallPages,
            batch: true,
        }
    }
}

fn align(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// A guest buffer: "pinned pages" scattered over guest memory.
#[derive(Debug, Clone)]
pub struct GuestBuf {
    /// Guest-physical address of each page, in buffer order.
    pub pages: Vec<u64>,
    /// Bytes.
    pub len: usize,
}

impl GuestBuf {
    /// The buffer's bytes `[offset, offset + len)` as guest ranges, physically contiguous pages
    /// merged (as the guest module's scatter-gather tables are).
    pub fn segments(&self, offset: usize, len: usize) -> Vec<Segment> {
        let mut out: Vec<Segment> = Vec::new();
        let mut pos = offset;
        let end = (offset + len).min(self.len);
        while pos < end {
            let page = pos / PAGE as usize;
            let in_page = pos % PAGE as usize;
            let n = (PAGE as usize - in_page).min(end - pos);
            let addr = self.pages[page] + in_page as u64;
            match out.last_mut() {
                Some(last) if last.addr + last.len as u64 == addr => last.len += n,
                _ => out.push(Segment { addr, len: n }),
            }
            pos += n;
        }
        out
    }
}

/// What the device answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// The response header.
    pub resp: RespHeader,
    /// The reply area's first `resp.reply_len` bytes (when they fit the area).
    pub reply: Vec<u8>,
    /// Length in the used ring.
    pub used_len: u32,
}

/// One request: headers and inline bytes go into a slot of the harness; data and reply data are
/// guest ranges.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The request header.
    pub hdr: ReqHeader,
    /// Inline bytes (a frame).
    pub inline: Vec<u8>,
    /// Request data.
    pub data: Vec<Segment>,
    /// Reply data.
    pub reply_data: Vec<Segment>,
}

/// A request in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    queue: usize,
    token: u64,
    slot: u16,
    table: Option<u16>,
    reply_cap: u32,
}

#[derive(Debug)]
struct Inner {
    mem: GuestMem,
    opts: DevGuestOptions,
    queues: Vec<DriverQueue>,
    slot_base: [u64; NUM_QUEUES],
    free_slots: [Vec<u16>; NUM_QUEUES],
    table_base: [u64; NUM_QUEUES],
    free_tables: [Vec<u16>; NUM_QUEUES],
    done: HashMap<(usize, u64), u32>,
    /// Times each chain came back (more than once for a reposted one).
    returns: HashMap<(usize, u64), u64>,
    /// Token of the next chain: heads are reused, tokens never.
    next_token: u64,
    heap_next: u64,
    heap_end: u64,
}

impl Inner {
    fn reap(&mut self) {
        for q in 0..NUM_QUEUES {
            // Chains that are no chain of ours (a device bug) get token 0, which nobody waits for.
            while let Some((token, len)) = self.queues[q].pop_used(&self.mem) {
                self.queues[q].rearm(&self.mem);
                self.done.insert((q, token.unwrap_or(0)), len);
                *self.returns.entry((q, token.unwrap_or(0))).or_default() += 1;
            }
        }
    }

    /// Adds a chain of `(addr, len, flags)` descriptors to queue `queue` and makes it visible
    /// (kicking as Linux does); its token, `None` when out of descriptors.
    fn add_chain(&mut self, queue: usize, descs: &[(u64, u32, u16)]) -> Option<u64> {
        let token = self.next_token;
        let q = &mut self.queues[queue];
        if !q.add(&self.mem, descs, token) {
            return None;
        }
        q.publish(&self.mem);
        self.next_token += 1;
        Some(token)
    }
}

struct GShared {
    inner: Mutex<Inner>,
    frontend: Mutex<Option<Frontend>>,
    epoll: Epoll,
}

/// The fake VMM + guest driver. Cheap to clone; clones drive the same guest.
#[derive(Clone)]
pub struct DevGuest {
    shared: Arc<GShared>,
}

impl std::fmt::Debug for DevGuest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevGuest").finish_non_exhaustive()
    }
}

impl DevGuest {
    /// Connects to the device at `socket` and brings the guest driver up.
    pub fn start(socket: &Path, opts: DevGuestOptions) -> io::Result<DevGuest> {
        let n = opts.queue_size;
        if !n.is_power_of_two() || n < 4 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "bad queue size",
            ));
        }
        let qfoot = DriverQueue::footprint(n);
        let slot_area = QUEUE_AREA + NUM_QUEUES as u64 * qfoot;
        let slot_base = [
            align(slot_area, PAGE),
            align(slot_area, PAGE) + u64::from(SLOTS_PER_QUEUE) * SLOT,
        ];
        let tables = slot_base[1] + u64::from(SLOTS_PER_QUEUE) * SLOT;
        let table_size = TABLE_ENTRIES * 16;
        let table_base = [tables, tables + u64::from(SLOTS_PER_QUEUE) * table_size];
        let heap = align(
            table_base[1] + u64::from(SLOTS_PER_QUEUE) * table_size,
            MIB2,
        );
        let size = align(opts.memory.max(heap + MIB2), MIB2);
        let mem = GuestMem::from_regions(vec![memfd_region(0, size, opts.ram)?])
            .map_err(io::Error::other)?;
        let queues = (0..NUM_QUEUES)
            .map(|i| DriverQueue::new(QUEUE_AREA + i as u64 * qfoot, n, opts.event_idx))
            .collect::<io::Result<Vec<_>>>()?;
        let epoll = Epoll::new()?;
        for q in &queues {
            epoll.ctl(
                ControlOperation::Add,
                q.call.as_raw_fd(),
                EpollEvent::new(EventSet::IN, 0),
            )?;
        }
        let slots = || (0..SLOTS_PER_QUEUE).rev().collect::<Vec<u16>>();
        let inner = Inner {
            mem,
            opts,
            queues,
            slot_base,
            free_slots: [slots(), slots()],
            table_base,
            free_tables: [slots(), slots()],
            done: HashMap::new(),
            returns: HashMap::new(),
            next_token: 1,
            heap_next: heap,
            heap_end: size,
        };
        let frontend = Frontend::connect(socket, NUM_QUEUES as u64).map_err(vhost_err)?;
        let guest = DevGuest {
            shared: Arc::new(GShared {
                inner: Mutex::new(inner),
                frontend: Mutex::new(Some(frontend)),
                epoll,
            }),
        };
        guest.setup(true, [0; NUM_QUEUES])?;
        Ok(guest)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn with_frontend<T>(&self, f: impl FnOnce(&mut Frontend) -> vhost::Result<T>) -> io::Result<T> {
        on_frontend(&self.shared.frontend, f)
    }

    /// The QEMU-like setup sequence (`first`: also owner, protocol features, memory table).
    fn setup(&self, first: bool, bases: [u16; NUM_QUEUES]) -> io::Result<()> {
        self.setup_queues(first, bases, &[CTRL_QUEUE, SUBMIT_QUEUE])
    }

    /// [`DevGuest::setup`] for the queues `which` only.
    fn setup_queues(
        &self,
        first: bool,
        bases: [u16; NUM_QUEUES],
        which: &[usize],
    ) -> io::Result<()> {
        let inner = self.lock();
        let mut want = (1u64 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        if inner.opts.event_idx {
            want |= 1 << VIRTIO_RING_F_EVENT_IDX;
        }
        if inner.opts.batch {
            want |= 1 << F_BATCH;
        }
        let size = inner.opts.queue_size;
        let region = region_info(&inner.mem, 0)?;
        let va = |gpa: u64| -> io::Result<u64> {
            inner
                .mem
                .get_host_address(GuestAddress(gpa))
                .map(|p| p as u64)
                .map_err(io::Error::other)
        };
        let mut rings = Vec::new();
        for q in &inner.queues {
            rings.push((
                va(q.desc)?,
                va(q.avail)?,
                va(q.used)?,
                q.call.try_clone()?,
                q.kick.try_clone()?,
            ));
        }
        drop(inner);
        self.with_frontend(|fe| {
            if first {
                fe.set_owner()?;
            }
            let offered = fe.get_features()?;
            if first {
                let pf = fe.get_protocol_features()?;
                fe.set_protocol_features(
                    pf & (VhostUserProtocolFeatures::MQ
                        | VhostUserProtocolFeatures::CONFIG
                        | VhostUserProtocolFeatures::RESET_DEVICE
                        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS),
                )?;
                fe.get_queue_num()?;
            }
            fe.set_features(offered & want)?;
            if first {
                fe.set_mem_table(&[region])?;
            }
            for (i, (desc, avail, used, call, kick)) in rings.iter().enumerate() {
                if !which.contains(&i) {
                    continue;
                }
                fe.set_vring_num(i, size)?;
                fe.set_vring_addr(
                    i,
                    &VringConfigData {
                        queue_max_size: size,
                        queue_size: size,
                        flags: 0,
                        desc_table_addr: *desc,
                        used_ring_addr: *used,
                        avail_ring_addr: *avail,
                        log_addr: None,
                    },
                )?;
                fe.set_vring_base(i, bases[i])?;
                fe.set_vring_call(i, call)?;
                fe.set_vring_kick(i, kick)?;
                fe.set_vring_enable(i, true)?;
            }
            // A request with a reply: once answered, the backend handled everything above.
            fe.get_features()?;
            Ok(())
        })
    }

    /// The device's config space.
    pub fn config(&self) -> io::Result<ConfigSpace> {
        let (_, bytes) = self.with_frontend(|fe| {
            fe.get_config(
                0,
                CONFIG_SIZE as u32,
                VhostUserConfigFlags::empty(),
                &[0u8; CONFIG_SIZE],
            )
        })?;
        let arr: [u8; CONFIG_SIZE] = bytes
            .get(..CONFIG_SIZE)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| io::Error::other("short config space"))?;
        Ok(ConfigSpace::from_bytes(&arr))
    }

    /// Allocates a buffer of `len` bytes whose pages are spread over guest memory in shuffled
    /// order (as pinned user pages are), or contiguous with `contiguous`.
    pub fn alloc(&self, len: usize, contiguous: bool) -> io::Result<GuestBuf> {
        let run = if contiguous {
            len.max(1)
        } else {
            PAGE as usize
        };
        self.alloc_runs(len, run)
    }

    /// Allocates a buffer of `len` bytes made of physically contiguous runs of `run` bytes (a
    /// multiple of the page size: 2 MiB for memory backed by transparent huge pages), the runs
    /// in shuffled order.
    pub fn alloc_runs(&self, len: usize, run: usize) -> io::Result<GuestBuf> {
        let mut g = self.lock();
        let pages = (len as u64).div_ceil(PAGE).max(1);
        let per_run = (run as u64 / PAGE).max(1);
        let runs = pages.div_ceil(per_run);
        let start = g.heap_next;
        if start + runs * per_run * PAGE > g.heap_end {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "guest memory exhausted; start the guest with more memory",
            ));
        }
        g.heap_next += runs * per_run * PAGE;
        let mut order: Vec<u64> = (0..runs).collect();
        // A fixed permutation: odd runs first, then even ones, each half reversed. No run is
        // next to its successor (when there are more than two).
        order.sort_by_key(|&r| (r % 2 == 0, std::cmp::Reverse(r)));
        let pages = order
            .into_iter()
            .flat_map(|r| (0..per_run).map(move |p| start + (r * per_run + p) * PAGE))
            .take(pages as usize)
            .collect();
        Ok(GuestBuf { pages, len })
    }

    /// Frees every buffer (the heap restarts).
    pub fn free_all(&self) {
        let mut g = self.lock();
        let base = align(
            g.table_base[1] + u64::from(SLOTS_PER_QUEUE) * TABLE_ENTRIES * 16,
            MIB2,
        );
        g.heap_next = base;
    }

    /// Writes `data` into `buf` at `offset`.
    pub fn write_buf(&self, buf: &GuestBuf, offset: usize, data: &[u8]) -> io::Result<()> {
        let g = self.lock();
        let mut pos = 0;
        for s in buf.segments(offset, data.len()) {
            g.mem
                .write_slice(&data[pos..pos + s.len], GuestAddress(s.addr))
                .map_err(io::Error::other)?;
            pos += s.len;
        }
        Ok(())
    }

    /// Reads `out.len()` bytes of `buf` at `offset`.
    pub fn read_buf(&self, buf: &GuestBuf, offset: usize, out: &mut [u8]) -> io::Result<()> {
        let g = self.lock();
        let mut pos = 0;
        for s in buf.segments(offset, out.len()) {
            g.mem
                .read_slice(&mut out[pos..pos + s.len], GuestAddress(s.addr))
                .map_err(io::Error::other)?;
            pos += s.len;
        }
        Ok(())
    }

    /// Calls `f` with `len` bytes of `buf` at `offset` as host slices of the guest pages, run by
    /// run: what plain `memcpy`s of those pages cost is the floor of any device implementation
    /// (the benchmarks measure it inside `f`).
    pub fn with_buf_slices<R>(
        &self,
        buf: &GuestBuf,
        offset: usize,
        len: usize,
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> io::Result<R> {
        let g = self.lock();
        let segs = Segments::new(buf.segments(offset, len));
        let slices = segs.slices(&g.mem).map_err(io::Error::other)?;
        Ok(f(&slices))
    }

    /// Like [`DevGuest::with_buf_slices`], with slices to write into.
    ///
    /// # Safety
    ///
    /// No device request may be using `buf` while `f` runs (the caller's requests have all
    /// completed), and `f` must not reach the same bytes another way.
    pub unsafe fn with_buf_slices_mut<R>(
        &self,
        buf: &GuestBuf,
        offset: usize,
        len: usize,
        f: impl FnOnce(&mut [&mut [u8]]) -> R,
    ) -> io::Result<R> {
        let g = self.lock();
        let segs = Segments::new(buf.segments(offset, len));
        // SAFETY: a `GuestBuf`'s pages are distinct guest RAM pages, and the caller guarantees
        // that nothing else uses them while `f` runs.
        let r = unsafe { segs.with_slices_mut(&g.mem, f) };
        r.map_err(io::Error::other)
    }

    /// Writes raw bytes at a guest-physical address.
    pub fn write_mem(&self, gpa: u64, data: &[u8]) -> io::Result<()> {
        self.lock()
            .mem
            .write_slice(data, GuestAddress(gpa))
            .map_err(io::Error::other)
    }

    /// Reads raw bytes at a guest-physical address.
    pub fn read_mem(&self, gpa: u64, out: &mut [u8]) -> io::Result<()> {
        self.lock()
            .mem
            .read_slice(out, GuestAddress(gpa))
            .map_err(io::Error::other)
    }

    /// Bytes of guest RAM.
    pub fn memory_size(&self) -> u64 {
        self.lock().heap_end
    }

    /// Posts a request on `queue`. `reply_cap` bytes of the slot are the reply area.
    pub fn submit(&self, queue: usize, req: &Request, reply_cap: u32) -> io::Result<Pending> {
        if req.inline.len() as u32 > MAX_SLOT_BYTES || reply_cap > MAX_SLOT_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "inline bytes or reply area larger than a harness slot",
            ));
        }
        let since = Instant::now();
        let deadline = Instant::now() + DEFAULT_TIMEOUT;
        loop {
            let mut g = self.lock();
            g.reap();
            if let Some(p) = self.try_submit(&mut g, queue, req, reply_cap)? {
                return Ok(p);
            }
            drop(g);
            if Instant::now() > deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "queue stays full"));
            }
            self.idle(since);
        }
    }

    fn try_submit(
        &self,
        g: &mut Inner,
        queue: usize,
        req: &Request,
        reply_cap: u32,
    ) -> io::Result<Option<Pending>> {
        let Some(slot) = g.free_slots[queue].pop() else {
            return Ok(None);
        };
        let base = g.slot_base[queue] + u64::from(slot) * SLOT;
        let mem = &g.mem;
        let mut hdr = req.hdr;
        hdr.inline_len = req.inline.len() as u32;
        mem.write_slice(&hdr.to_bytes(), GuestAddress(base))
            .map_err(io::Error::other)?;
        mem.write_slice(&req.inline, GuestAddress(base + REQ_HEADER_LEN as u64))
            .map_err(io::Error::other)?;
        mem.write_slice(&[0xa5u8; RESP_HEADER_LEN], GuestAddress(base + SLOT_RESP))
            .map_err(io::Error::other)?;
        let write = VRING_DESC_F_WRITE as u16;
        let mut descs: Vec<(u64, u32, u16)> =
            vec![(base, (REQ_HEADER_LEN + req.inline.len()) as u32, 0)];
        descs.extend(req.data.iter().map(|s| (s.addr, s.len as u32, 0)));
        descs.push((base + SLOT_RESP, RESP_HEADER_LEN as u32, write));
        if reply_cap > 0 {
            descs.push((base + SLOT_RESP + RESP_HEADER_LEN as u64, reply_cap, write));
        }
        descs.extend(req.reply_data.iter().map(|s| (s.addr, s.len as u32, write)));
        let (token, table) = if g.opts.indirect && descs.len() > 1 {
            if descs.len() as u64 > TABLE_ENTRIES {
                g.free_slots[queue].push(slot);
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "more descriptors than an indirect table holds",
                ));
            }
            let Some(t) = g.free_tables[queue].pop() else {
                g.free_slots[queue].push(slot);
                return Ok(None);
            };
            let tbase = g.table_base[queue] + u64::from(t) * TABLE_ENTRIES * 16;
            // Built in the driver's memory and stored in one go, as Linux fills a table it
            // allocated: not a guest-memory lookup per descriptor.
            let mut table = Vec::with_capacity(16 * descs.len());
            for (i, &(a, l, f)) in descs.iter().enumerate() {
                let (f, next) = if i + 1 < descs.len() {
                    (f | VRING_DESC_F_NEXT as u16, i as u16 + 1)
                } else {
                    (f, 0)
                };
                table.extend_from_slice(&DriverQueue::encode_desc((a, l, f, next)));
            }
            if let Err(e) = g.mem.write_slice(&table, GuestAddress(tbase)) {
                g.free_tables[queue].push(t);
                g.free_slots[queue].push(slot);
                return Err(io::Error::other(e));
            }
            let d = [(
                tbase,
                (descs.len() * 16) as u32,
                VRING_DESC_F_INDIRECT as u16,
            )];
            match g.add_chain(queue, &d) {
                Some(token) => (token, Some(t)),
                None => {
                    g.free_tables[queue].push(t);
                    g.free_slots[queue].push(slot);
                    return Ok(None);
                }
            }
        } else {
            match g.add_chain(queue, &descs) {
                Some(token) => (token, None),
                None => {
                    g.free_slots[queue].push(slot);
                    return Ok(None);
                }
            }
        };
        Ok(Some(Pending {
            queue,
            token,
            slot,
            table,
            reply_cap,
        }))
    }

    /// Posts a chain of raw `(addr, len, device-writable)` descriptors (hostile-input tests);
    /// returns a token for [`DevGuest::wait_raw`].
    pub fn submit_raw(&self, queue: usize, descs: &[(u64, u32, bool)]) -> io::Result<u64> {
        let d: Vec<(u64, u32, u16)> = descs
            .iter()
            .map(|&(a, l, w)| (a, l, if w { VRING_DESC_F_WRITE as u16 } else { 0 }))
            .collect();
        self.lock()
            .add_chain(queue, &d)
            .ok_or_else(|| io::Error::other("queue full"))
    }

    /// Places the chain of `p`, not returned yet, on its avail ring again, up to `max` times as
    /// far as the ring allows, and makes it visible: what a hostile driver that hands the device
    /// one request over and over does. Returns how many times it was placed (0 once the device
    /// stops reading the ring). Each placing comes back on its own ([`DevGuest::returned`]);
    /// wait for all of them before waiting for `p`, which frees its slot. Needs
    /// `VIRTIO_RING_F_EVENT_IDX`.
    pub fn repost(&self, p: &Pending, max: usize) -> usize {
        let mut g = self.lock();
        let g = &mut *g;
        g.reap();
        let q = &mut g.queues[p.queue];
        let n = q.repost(&g.mem, p.token, max);
        q.publish(&g.mem);
        n
    }

    /// Times the chain of `p` came back so far (once, unless it was reposted).
    pub fn returned(&self, p: &Pending) -> u64 {
        let mut g = self.lock();
        g.reap();
        g.returns.get(&(p.queue, p.token)).copied().unwrap_or(0)
    }

    /// Posts raw descriptors as they are given (hostile-input tests): `(addr, len, flags, next)`
    /// with `flags` the `VRING_DESC_F_*` bits (`NEXT` only where given) and `next` an index into
    /// `descs` ([`Next::Desc`]) or a ring index ([`Next::Raw`], possibly out of range). The
    /// first is the head; returns a token for [`DevGuest::wait_raw`].
    pub fn submit_wired(&self, queue: usize, descs: &[(u64, u32, u16, Next)]) -> io::Result<u64> {
        let mut g = self.lock();
        let g = &mut *g;
        let token = g.next_token;
        let q = &mut g.queues[queue];
        let ids = q
            .take(descs.len())
            .ok_or_else(|| io::Error::other("queue full"))?;
        for (i, &(addr, len, flags, next)) in descs.iter().enumerate() {
            let next = match next {
                Next::Desc(j) => *ids
                    .get(j)
                    .ok_or_else(|| io::Error::other("next names no descriptor of the chain"))?,
                Next::Raw(r) => r,
            };
            q.write_table_entry(&g.mem, ids[i], (addr, len, flags, next));
        }
        q.push(&g.mem, ids, token);
        q.publish(&g.mem);
        g.next_token += 1;
        Ok(token)
    }

    /// Waits until the raw chain `token` on `queue` is returned; its used length.
    pub fn wait_raw(&self, queue: usize, token: u64, timeout: Duration) -> io::Result<u32> {
        let since = Instant::now();
        let deadline = Instant::now() + timeout;
        loop {
            let mut g = self.lock();
            g.reap();
            if let Some(len) = g.done.remove(&(queue, token)) {
                return Ok(len);
            }
            drop(g);
            if Instant::now() > deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no completion"));
            }
            self.idle(since);
        }
    }

    /// Waits a little for the device, in a wait that began at `since`: spins while the guest
    /// polls, otherwise sleeps until an interrupt (at most a millisecond).
    fn idle(&self, since: Instant) {
        let polls = {
            let g = self.lock();
            g.opts.busy_poll || since.elapsed() < g.opts.poll_first
        };
        if polls {
            std::hint::spin_loop();
            return;
        }
        self.sleep();
    }

    /// Sleeps until an interrupt (at most a millisecond).
    fn sleep(&self) {
        let mut events = [EpollEvent::default(); NUM_QUEUES];
        if let Ok(n) = self.shared.epoll.wait(1, &mut events)
            && n > 0
        {
            let g = self.lock();
            for q in &g.queues {
                let _ = q.call.read();
            }
        }
    }

    /// Whether `p` has completed (without waiting).
    pub fn poll(&self, p: Pending) -> Option<Completed> {
        let mut g = self.lock();
        g.reap();
        let len = g.done.remove(&(p.queue, p.token))?;
        Some(Self::finish(&mut g, p, len))
    }

    fn finish(g: &mut Inner, p: Pending, used_len: u32) -> Completed {
        let base = g.slot_base[p.queue] + u64::from(p.slot) * SLOT;
        let mut rb = [0u8; RESP_HEADER_LEN];
        let _ = g.mem.read_slice(&mut rb, GuestAddress(base + SLOT_RESP));
        let resp = RespHeader::from_bytes(&rb);
        let n = (resp.reply_len.min(p.reply_cap)) as usize;
        let mut reply = vec![0u8; if resp.status == S_OK { n } else { 0 }];
        let _ = g.mem.read_slice(
            &mut reply,
            GuestAddress(base + SLOT_RESP + RESP_HEADER_LEN as u64),
        );
        g.free_slots[p.queue].push(p.slot);
        if let Some(t) = p.table {
            g.free_tables[p.queue].push(t);
        }
        Completed {
            resp,
            reply,
            used_len,
        }
    }

    /// Waits for `p` to complete.
    pub fn wait(&self, p: Pending, timeout: Duration) -> io::Result<Completed> {
        self.wait_as(p, timeout, true)
    }

    /// Waits for a posted request's chain as the guest module waits for room for more posted
    /// requests (`wait_event` until the interrupt): sleeping, never spinning, whatever
    /// [`DevGuestOptions::busy_poll`] says.
    pub fn wait_posted(&self, p: Pending, timeout: Duration) -> io::Result<Completed> {
        self.wait_as(p, timeout, false)
    }

    /// Waits for `p`; `polls`: as the options say (spin, or spin first), otherwise sleep at once.
    fn wait_as(&self, p: Pending, timeout: Duration, polls: bool) -> io::Result<Completed> {
        let since = Instant::now();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(c) = self.poll(p) {
                return Ok(c);
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("request {} on queue {} not completed", p.token, p.queue),
                ));
            }
            if polls {
                self.idle(since);
            } else {
                self.sleep();
            }
        }
    }

    /// Posts a request and waits for it.
    pub fn request(&self, queue: usize, req: &Request, reply_cap: u32) -> io::Result<Completed> {
        let p = self.submit(queue, req, reply_cap)?;
        self.wait(p, DEFAULT_TIMEOUT)
    }

    /// What QEMU does when the guest driver resets the device or the guest reboots: stop both
    /// queues (`GET_VRING_BASE`); then set them up afresh, as the new driver does.
    pub fn reboot(&self) -> io::Result<()> {
        self.with_frontend(|fe| {
            for i in 0..NUM_QUEUES {
                fe.get_vring_base(i)?;
            }
            Ok(())
        })?;
        {
            let mut g = self.lock();
            let g = &mut *g;
            let n = g.opts.queue_size;
            let zero = vec![0u8; (NUM_QUEUES as u64 * DriverQueue::footprint(n)) as usize];
            let _ = g.mem.write_slice(&zero, GuestAddress(QUEUE_AREA));
            for (i, q) in g.queues.iter_mut().enumerate() {
                let mut fresh = DriverQueue::new(
                    QUEUE_AREA + i as u64 * DriverQueue::footprint(n),
                    n,
                    g.opts.event_idx,
                )?;
                fresh.kick = q.kick.try_clone()?;
                fresh.call = q.call.try_clone()?;
                *q = fresh;
            }
            for q in 0..NUM_QUEUES {
                g.free_slots[q] = (0..SLOTS_PER_QUEUE).rev().collect();
                g.free_tables[q] = (0..SLOTS_PER_QUEUE).rev().collect();
            }
            g.done.clear();
            g.returns.clear();
        }
        self.setup(false, [0; NUM_QUEUES])
    }

    /// What QEMU does when the VM is paused (`stop`): stop both queues (`GET_VRING_BASE`),
    /// remembering where the device stood. The guest is frozen meanwhile: call nothing but
    /// [`DevGuest::resume`] (or [`DevGuest::reboot`]).
    pub fn pause(&self) -> io::Result<[u16; NUM_QUEUES]> {
        let mut bases = [0u16; NUM_QUEUES];
        self.with_frontend(|fe| {
            for (i, b) in bases.iter_mut().enumerate() {
                *b = fe.get_vring_base(i)? as u16;
            }
            Ok(())
        })?;
        Ok(bases)
    }

    /// What QEMU does when a paused VM continues (`cont`): start the queues again where they
    /// stood (the same rings, the avail indexes `pause` returned).
    pub fn resume(&self, bases: [u16; NUM_QUEUES]) -> io::Result<()> {
        self.setup(false, bases)
    }

    /// Starts only the queues `which` again, where they stood: a VMM half-way through `cont`
    /// (the device cannot resume until every queue runs, while the guest may already kick).
    pub fn resume_queues(&self, bases: [u16; NUM_QUEUES], which: &[usize]) -> io::Result<()> {
        self.setup_queues(false, bases, which)
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

/// Where a raw descriptor of [`DevGuest::submit_wired`] points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The descriptor at this index of the same list.
    Desc(usize),
    /// This ring index, whatever it holds.
    Raw(u16),
}

/// Why a session call failed.
#[derive(Debug)]
pub enum DevError {
    /// The device refused the request (`S_*` status).
    Device(u32),
    /// The call failed: `CUresult` and message.
    Cuda(u32, String),
    /// The harness or the transport failed.
    Io(io::Error),
}

impl std::fmt::Display for DevError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DevError::Device(s) => {
                write!(
                    f,
                    "device status {s} ({})",
                    vgpu_vhost_vgpu::wire::status_name(*s)
                )
            }
            DevError::Cuda(c, m) => write!(f, "CUresult {c}: {m}"),
            DevError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl From<io::Error> for DevError {
    fn from(e: io::Error) -> Self {
        DevError::Io(e)
    }
}

/// One open `/dev/vgpuN`: a session speaking vgpu frames over the device.
#[derive(Debug)]
pub struct DevSession {
    guest: DevGuest,
    id: u32,
    seq: u64,
    call_id: u64,
    /// Reply area offered with synchronous calls.
    pub reply_cap: u32,
}

/// Reply area a session offers by default.
pub const DEFAULT_REPLY_CAP: u32 = 64 << 10;

/// The posted frames of one batch, built with [`DevSession::add_to_batch`].
#[derive(Debug, Default)]
pub struct Batch {
    first: u64,
    count: u32,
    inline: Vec<u8>,
}

impl DevSession {
    /// Opens session `id`.
    pub fn open(guest: &DevGuest, id: u32) -> Result<DevSession, DevError> {
        let c = guest.request(
            CTRL_QUEUE,
            &Request {
                hdr: ReqHeader {
                    kind: REQ_OPEN,
                    session: id,
                    ..Default::default()
                },
                ..Default::default()
            },
            0,
        )?;
        if c.resp.status != S_OK {
            return Err(DevError::Device(c.resp.status));
        }
        Ok(DevSession {
            guest: guest.clone(),
            id,
            seq: 0,
            call_id: 0,
            reply_cap: DEFAULT_REPLY_CAP,
        })
    }

    /// The session id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The guest.
    pub fn guest(&self) -> &DevGuest {
        &self.guest
    }

    /// Builds the request for a frame.
    fn frame<O: Op>(&mut self, req: &O, flags: u16, data_len: usize) -> Request {
        let mut inline = Vec::new();
        self.encode_frame(req, flags, data_len, &mut inline);
        Request {
            hdr: ReqHeader {
                kind: REQ_CALL,
                session: self.id,
                seq: self.seq,
                ..Default::default()
            },
            inline,
            ..Default::default()
        }
    }

    /// Appends one frame of `req` (its header and fields; `data_len` bulk bytes follow it
    /// elsewhere) to `out`, taking the session's next sequence number, as the shim encodes
    /// frames: in place, nothing allocated per frame.
    fn encode_frame<O: Op>(&mut self, req: &O, flags: u16, data_len: usize, out: &mut Vec<u8>) {
        self.seq += 1;
        self.call_id += 1;
        let at = out.len();
        out.resize(at + HEADER_LEN, 0);
        req.encode(out);
        let h = Header {
            opcode: O::OPCODE,
            flags,
            call_id: self.call_id,
            payload_len: (out.len() - at - HEADER_LEN + data_len) as u32,
            status: 0,
        };
        out[at..at + HEADER_LEN].copy_from_slice(&h.encode());
    }

    /// Submits a synchronous frame whose request data and reply data are guest ranges, without
    /// waiting.
    pub fn submit_call<O: Op>(
        &mut self,
        req: &O,
        data: &[Segment],
        reply_data: &[Segment],
    ) -> Result<Pending, DevError> {
        let data_len = data.iter().map(|s| s.len).sum();
        let mut r = self.frame(req, 0, data_len);
        r.hdr.reply_cap = self.reply_cap;
        r.data = data.to_vec();
        r.reply_data = reply_data.to_vec();
        Ok(self.guest.submit(CTRL_QUEUE, &r, self.reply_cap)?)
    }

    /// Decodes the completion of a synchronous frame.
    pub fn reply_of<O: Op>(c: &Completed) -> Result<(O::Reply, RespHeader), DevError> {
        if c.resp.status != S_OK {
            return Err(DevError::Device(c.resp.status));
        }
        if c.reply.len() < HEADER_LEN {
            return Err(DevError::Io(io::Error::other("short reply frame")));
        }
        let mut hb = [0u8; HEADER_LEN];
        hb.copy_from_slice(&c.reply[..HEADER_LEN]);
        let h = Header::decode(&hb).map_err(|e| DevError::Io(io::Error::other(e)))?;
        let payload = &c.reply[HEADER_LEN..];
        if h.status != 0 {
            return Err(DevError::Cuda(
                h.status,
                String::from_utf8_lossy(payload).into_owned(),
            ));
        }
        let (r, _) = msg::decode_reply::<O>(payload)
            .map_err(|e| DevError::Io(io::Error::other(format!("malformed reply: {e}"))))?;
        Ok((r, c.resp))
    }

    /// A synchronous call whose request data and reply data are guest ranges.
    pub fn call_sg<O: Op>(
        &mut self,
        req: &O,
        data: &[Segment],
        reply_data: &[Segment],
    ) -> Result<(O::Reply, RespHeader), DevError> {
        let p = self.submit_call(req, data, reply_data)?;
        let c = self.guest.wait(p, DEFAULT_TIMEOUT)?;
        Self::reply_of::<O>(&c)
    }

    /// A synchronous call; `tail` (bulk bytes) is copied into a fresh guest buffer first.
    pub fn call<O: Op>(&mut self, req: &O, tail: &[u8]) -> Result<O::Reply, DevError> {
        let segs = if tail.is_empty() {
            Vec::new()
        } else {
            let buf = self.guest.alloc(tail.len(), false)?;
            self.guest.write_buf(&buf, 0, tail)?;
            buf.segments(0, tail.len())
        };
        Ok(self.call_sg(req, &segs, &[])?.0)
    }

    /// An asynchronous frame on the submission queue; waits until the device returned the chain
    /// (its data was consumed).
    pub fn post_sg<O: Op>(&mut self, req: &O, data: &[Segment]) -> Result<(), DevError> {
        let p = self.submit_post(req, data)?;
        let c = self.guest.wait(p, DEFAULT_TIMEOUT)?;
        match c.resp.status {
            S_OK => Ok(()),
            s => Err(DevError::Device(s)),
        }
    }

    /// Submits `reqs` as one `BATCH` request (asynchronous frames without bulk data, taking
    /// consecutive sequence numbers) without waiting.
    pub fn submit_batch<O: Op>(&mut self, reqs: &[O]) -> Result<Pending, DevError> {
        let mut batch = Batch::default();
        for r in reqs {
            self.add_to_batch(&mut batch, r, &[]);
        }
        self.submit_frames(batch)
    }

    /// Adds a posted frame of `req`, with `tail` as the bulk bytes after its fields (inline, in
    /// the batch's bytes), to `batch`: frames of different ops may share one.
    pub fn add_to_batch<O: Op>(&mut self, batch: &mut Batch, req: &O, tail: &[u8]) {
        if batch.count == 0 {
            batch.first = self.seq + 1;
        }
        self.encode_frame(req, FLAG_ASYNC, tail.len(), &mut batch.inline);
        batch.inline.extend_from_slice(tail);
        batch.count += 1;
    }

    /// Submits `batch` as one `BATCH` request, without waiting.
    pub fn submit_frames(&mut self, batch: Batch) -> Result<Pending, DevError> {
        let req = Request {
            hdr: ReqHeader {
                kind: REQ_BATCH,
                session: self.id,
                seq: batch.first,
                reply_cap: batch.count,
                ..Default::default()
            },
            inline: batch.inline,
            ..Default::default()
        };
        Ok(self.guest.submit(SUBMIT_QUEUE, &req, 0)?)
    }

    /// The request for one frame of `req` with `data_len` bytes of bulk data after its fields
    /// (to be added to its inline bytes or as data segments), taking the session's next
    /// sequence number: for tests that post it their own way.
    pub fn frame_request<O: Op>(
        &mut self,
        req: &O,
        asynchronous: bool,
        data_len: usize,
    ) -> Request {
        let flags = if asynchronous { FLAG_ASYNC } else { 0 };
        self.frame(req, flags, data_len)
    }

    /// Submits an asynchronous frame without waiting.
    pub fn submit_post<O: Op>(&mut self, req: &O, data: &[Segment]) -> Result<Pending, DevError> {
        let data_len = data.iter().map(|s| s.len).sum();
        let mut r = self.frame(req, FLAG_ASYNC, data_len);
        r.data = data.to_vec();
        Ok(self.guest.submit(SUBMIT_QUEUE, &r, 0)?)
    }

    /// The handshake.
    pub fn hello(&mut self, process: &str) -> Result<msg::HelloReply, DevError> {
        self.call(
            &msg::Hello {
                protocol_version: vgpu_proto::PROTOCOL_VERSION,
                pid: std::process::id(),
                shim_version: vgpu_proto::VERSION.to_string(),
                process_name: process.to_string(),
            },
            &[],
        )
    }

    /// `cuCtxCreate` on device 0: the context handle.
    pub fn ctx_create(&mut self) -> Result<u64, DevError> {
        self.call(
            &msg::CtxCreate {
                device: 0,
                flags: 0,
            },
            &[],
        )
        .map(|r| r.handle)
    }

    /// Closes the session; the device answers once it released everything.
    pub fn close(self) -> Result<(), DevError> {
        let c = self.guest.request(
            CTRL_QUEUE,
            &Request {
                hdr: ReqHeader {
                    kind: REQ_CLOSE,
                    session: self.id,
                    ..Default::default()
                },
                ..Default::default()
            },
            0,
        )?;
        match c.resp.status {
            S_OK => Ok(()),
            s => Err(DevError::Device(s)),
        }
    }
}
