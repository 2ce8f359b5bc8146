//! One VM's CUDA context: memory, copies staged through pinned buffers,
//! kernel launches timed with events, and isolation of sticky errors.
//!
//! A VM's [`crate::CudaContext`] (`vm_context.rs`) owns one *generation* at a time: a real
//! `CUcontext` with its stream, event pool, staging buffers and the ranges
//! (allocations and module globals) made in it. Every driver call pushes the
//! generation's context on the calling thread and pops it afterwards, so any
//! broker thread can use it.
//!
//! When a call or a kernel hits an error that leaves a CUDA context unusable
//! (700 illegal address, 716, 719, a watchdog timeout, …), the generation is
//! marked broken: every later call of the VM fails with that error, as CUDA
//! does, while other VMs' contexts are untouched. Once the processes that
//! used it have ended (their allocations freed, their modules unloaded), the
//! broken generation is destroyed on a background thread and the VM's next
//! call creates a fresh one.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use tracing::{debug, error, warn};
use vgpu_broker::device::{DeviceError, RunControl};
use vgpu_proto::cuda;

use crate::chain::GraphCache;
use crate::driver::{Ctx, Current, Driver, Event, Failed, HostPtr, Stream};
use crate::error::{Op, is_context_fatal};
use crate::gather::{Cursor, gather, scatter};
use crate::loader::DeadlineLoader;
use crate::printf::{self, PrintfBuffer};

pub(crate) mod movable;
pub(crate) mod vmm;

/// Every allocation is charged in units of this many bytes (the driver's
/// small-allocation alignment).
pub const ALLOC_GRANULARITY: u64 = 512;
/// Bytes of one half of a pinned staging buffer; copies move in chunks of
/// this size, one half filling while the other is in flight.
pub const STAGING_CHUNK: usize = 2 << 20;
/// Pinned staging buffers kept per context for reuse.
const STAGING_POOL: usize = 4;
/// `CU_MEMHOSTALLOC_PORTABLE`.
const MEMHOSTALLOC_PORTABLE: u32 = 1;
/// `CU_STREAM_NON_BLOCKING`: the VM's stream never waits for the legacy stream.
pub(crate) const STREAM_NON_BLOCKING: u32 = 1;
/// `CU_EVENT_DEFAULT`: timing enabled.
const EVENT_TIMING: u32 = 0;
/// Most CUDA streams per VM context besides its default one. Each guest
/// stream (engine lane) gets one of its own, in the order they first run
/// work, so copies and kernels of different streams overlap on the GPU; past
/// this many, later lanes share them.
pub const LANE_STREAMS: usize = 32;
/// Device bytes used to copy between overlapping ranges (memmove semantics).
const OVERLAP_SCRATCH: u64 = 4 << 20;
/// Polls of a pending event that only yield the thread before sleeping.
const SPIN_POLLS: u32 = 200;
/// First sleep between polls of a pending event.
const MIN_POLL_SLEEP: Duration = Duration::from_micros(20);
/// Longest sleep between polls.
const MAX_POLL_SLEEP: Duration = Duration::from_millis(1);
/// How long a kernel whose session ended may still run when the device has
/// no watchdog; past this the VM's context is abandoned.
pub const CANCEL_GRACE: Duration = Duration::from_secs(10);

/// How long a move of an allocation waits for the VM's running kernels and copies to finish
/// before it gives up (the allocation stays where it is).
pub const MOVE_GATE_WAIT: Duration = Duration::from_secs(10);
/// Pause between two tries of a move for the VM's gate.
const MOVE_GATE_POLL: Duration = Duration::from_micros(200);

/// Staging chunks a copy of `total` bytes takes.
fn chunk_count(total: u64) -> usize {
    usize::try_from(total.div_ceil(STAGING_CHUNK as u64)).unwrap_or(usize::MAX)
}

/// Bytes of chunk `i` of a copy of `total` bytes.
fn chunk_len(total: u64, i: usize) -> usize {
    let start = (i as u64).saturating_mul(STAGING_CHUNK as u64);
    usize::try_from(total.saturating_sub(start)).map_or(STAGING_CHUNK, |r| r.min(STAGING_CHUNK))
}

/// Zeroes what a completed copy of `total` bytes left in a staging buffer. Pinned host memory is
/// mapped into every CUDA context of the process (unified addressing), so a VM's bytes must not
/// stay there between its copies (docs/cuda.md, isolation model). Chunk `i` used half `i % 2`,
/// so half 0 holds at most the first chunk's length and half 1 the second's.
fn clear_staging(st: &Staging, total: u64) {
    for half in 0..2 {
        let used = chunk_len(total, half);
        if used == 0 {
            continue;
        }
        // SAFETY: half `half` of the 2 * STAGING_CHUNK byte buffer, `used` <= STAGING_CHUNK bytes;
        // the copy completed, so no DMA touches it, and this thread owns the buffer.
        let at = unsafe { st.buf.0.add(half * STAGING_CHUNK) };
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(at, 0, used) };
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to).saturating_mul(to)
}

/// Device-wide state shared by every context of one GPU.
#[derive(Debug)]
pub(crate) struct DeviceShared {
    /// The driver.
    pub driver: Arc<Driver>,
    /// The `CUdevice`.
    pub dev: i32,
    /// The `[[device]]` name, for logs.
    pub name: String,
    /// Bytes of device memory allocated by all contexts (charge units; a movable allocation's
    /// whole span while it is device-resident).
    pub used: AtomicU64,
    /// Bytes of host memory that host-resident movable allocations of all contexts take.
    pub host_used: AtomicU64,
    /// How movable allocations are made on this GPU; `None` when the driver or GPU has no
    /// virtual memory management (every allocation is then a `cuMemAlloc`).
    pub movable: Option<movable::MovableConfig>,
    /// What the VMM isolation probe found; movable allocations and guests' `cuMemCreate` are
    /// off unless it is [`VmmIsolation::Isolated`](crate::VmmIsolation::Isolated).
    pub vmm_isolation: crate::VmmIsolation,
}

/// What a range of device memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RangeKind {
    /// `alloc`.
    Alloc,
    /// A module global.
    Global,
    /// A mapping of physical memory (`vmm`); the physical memory holds the charge.
    Mapped,
    /// `alloc_aligned`: an aligned address inside a larger `cuMemAlloc` at this base.
    AllocAt(u64),
    /// `alloc` or `alloc_host` of a movable allocation: its own reserved range, mapped to
    /// physical memory from `cuMemCreate` on the device or in host memory
    /// ([`movable`]); the range's `charged` is its span while device-resident, 0 on the host.
    Movable,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Range {
    pub(crate) size: u64,
    pub(crate) charged: u64,
    pub(crate) kind: RangeKind,
}

/// A pinned host buffer of two [`STAGING_CHUNK`] halves with an event each.
pub(crate) struct Staging {
    pub(crate) buf: HostPtr,
    done: [Event; 2],
}

/// One `CUcontext` of a VM and what lives in it.
pub(crate) struct Generation {
    id: u64,
    pub(crate) shared: Arc<DeviceShared>,
    ctx: Ctx,
    /// Work outside any lane (zeroing new memory), and lanes whose stream
    /// could not be created.
    pub(crate) stream: Stream,
    /// The streams of guest streams' work, created on first use, by lane
    /// ([`vgpu_broker::device::current_lane`]).
    lane_streams: Mutex<Vec<(u64, Stream)>>,
    broken: Mutex<Option<DeviceError>>,
    pub(crate) ranges: Mutex<BTreeMap<u64, Range>>,
    events: Mutex<Vec<Event>>,
    pub(crate) staging: Mutex<Vec<Staging>>,
    scratch: Mutex<Option<u64>>,
    pub(crate) vmm: Mutex<vmm::Vmm>,
    /// Held while a launch issues its start event, kernel and end event, so
    /// the events of two launches never interleave on the stream.
    pub(crate) submit: Mutex<()>,
    /// Executable graphs of chains of kernels ([`crate::chain`]).
    pub(crate) graphs: Mutex<GraphCache>,
    /// Held shared by every copy, fill and launch of the VM until its work completed, and
    /// exclusively by a move of a movable allocation: the safe point at which an allocation's
    /// backing may change under its address (a real GPU cannot stop a running kernel, so a
    /// move waits for it).
    gate: RwLock<()>,
    /// The device runtime's limits (`CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH`,
    /// `…_PENDING_LAUNCH_COUNT`) as raised for the VM's processes so far (0: the driver's).
    pub(crate) device_runtime_limits: Mutex<[u64; 2]>,
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("id", &self.id)
            .field("broken", &*lock(&self.broken))
            .field("ranges", &lock(&self.ranges).len())
            .finish()
    }
}

impl Generation {
    fn new(shared: &Arc<DeviceShared>, id: u64) -> Result<Generation, DeviceError> {
        let d = &shared.driver;
        let ctx = d.ctx_create(shared.dev).map_err(|f| f.device(Op::Other))?;
        // cuCtxCreate made it current on this thread.
        let stream = d.stream_create(STREAM_NON_BLOCKING);
        if let Err(e) = d.ctx_pop() {
            warn!(
                call = e.call,
                code = e.code,
                "popping a new CUDA context failed"
            );
        }
        let stream = match stream {
            Ok(s) => s,
            Err(f) => {
                let _ = d.ctx_destroy(ctx);
                return Err(f.device(Op::Other));
            }
        };
        Ok(Generation {
            id,
            shared: Arc::clone(shared),
            ctx,
            stream,
            lane_streams: Mutex::new(Vec::new()),
            broken: Mutex::new(None),
            ranges: Mutex::new(BTreeMap::new()),
            events: Mutex::new(Vec::new()),
            staging: Mutex::new(Vec::new()),
            scratch: Mutex::new(None),
            vmm: Mutex::new(vmm::Vmm::default()),
            submit: Mutex::new(()),
            graphs: Mutex::new(GraphCache::default()),
            gate: RwLock::new(()),
            device_runtime_limits: Mutex::new([0; 2]),
        })
    }

    pub(crate) fn driver(&self) -> &Driver {
        &self.shared.driver
    }

    /// Shared hold of the gate: no move of an allocation runs meanwhile.
    pub(crate) fn work_gate(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Exclusive hold of the gate: none of the VM's copies, fills or kernels runs meanwhile.
    /// Polls rather than queues, so that the VM's other work keeps running while a kernel
    /// finishes (a kernel may be waiting for a copy of another stream: a queued writer would
    /// block that copy and the kernel with it); `None` when the gate stayed busy for
    /// [`MOVE_GATE_WAIT`].
    pub(crate) fn move_gate(&self) -> Option<RwLockWriteGuard<'_, ()>> {
        let until = Instant::now() + MOVE_GATE_WAIT;
        loop {
            match self.gate.try_write() {
                Ok(g) => return Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < until => {
                    std::thread::sleep(MOVE_GATE_POLL);
                }
                Err(std::sync::TryLockError::WouldBlock) => return None,
            }
        }
    }

    /// The error that broke this generation, if any.
    pub(crate) fn broken(&self) -> Option<DeviceError> {
        lock(&self.broken).clone()
    }

    /// Makes the context current on this thread (fails once it is broken).
    pub(crate) fn enter(&self) -> Result<Current<'_>, DeviceError> {
        if let Some(e) = self.broken() {
            return Err(e);
        }
        Current::push(self.driver(), self.ctx).map_err(|f| self.fail(f, Op::Other))
    }

    /// Records `e` as the error that broke the context.
    pub(crate) fn break_with(&self, e: DeviceError) -> DeviceError {
        let mut b = lock(&self.broken);
        if let Some(first) = b.as_ref() {
            return first.clone();
        }
        error!(
            device = %self.shared.name,
            generation = self.id,
            error = %e,
            "a VM's GPU context is unusable; its later calls fail until its processes end"
        );
        *b = Some(e.clone());
        e
    }

    /// The broker's error for a failed call; a fatal one breaks the context.
    pub(crate) fn fail(&self, f: Failed, op: Op) -> DeviceError {
        let e = f.device(op);
        if is_context_fatal(f.code) {
            self.break_with(e)
        } else {
            e
        }
    }

    fn idle(&self) -> bool {
        lock(&self.ranges).is_empty()
    }

    pub(crate) fn check_range(&self, addr: u64, len: u64) -> Result<(), DeviceError> {
        let bad = DeviceError::InvalidAddress { addr, len };
        let r = lock(&self.ranges);
        let (&base, range) = r.range(..=addr).next_back().ok_or(bad.clone())?;
        match addr.checked_add(len) {
            Some(end) if end <= base + range.size => Ok(()),
            _ => Err(bad),
        }
    }

    pub(crate) fn add_global(&self, addr: u64, size: u64, charged: u64) {
        lock(&self.ranges).insert(
            addr,
            Range {
                size,
                charged,
                kind: RangeKind::Global,
            },
        );
        self.shared.used.fetch_add(charged, Ordering::Relaxed);
    }

    pub(crate) fn remove_global(&self, addr: u64) {
        let mut r = lock(&self.ranges);
        if r.get(&addr).is_some_and(|x| x.kind == RangeKind::Global)
            && let Some(x) = r.remove(&addr)
        {
            self.shared.used.fetch_sub(x.charged, Ordering::Relaxed);
        }
    }

    pub(crate) fn take_event(&self) -> Result<Event, DeviceError> {
        if let Some(e) = lock(&self.events).pop() {
            return Ok(e);
        }
        let _c = self.enter()?;
        self.driver()
            .event_create(EVENT_TIMING)
            .map_err(|f| self.fail(f, Op::Other))
    }

    pub(crate) fn put_event(&self, e: Event) {
        lock(&self.events).push(e);
    }

    /// The start and end timing events of one launch.
    pub(crate) fn take_event_pair(&self) -> Result<(Event, Event), DeviceError> {
        let start = self.take_event()?;
        match self.take_event() {
            Ok(end) => Ok((start, end)),
            Err(e) => {
                self.put_event(start);
                Err(e)
            }
        }
    }

    /// A launch that could not be issued: nothing of it is pending once the stream drains, and
    /// its events are reused, unless the context broke.
    pub(crate) fn abandon_launch(&self, start: Event, end: Event) {
        if self.broken().is_none() {
            let _ = self.finish();
            self.put_event(start);
            self.put_event(end);
        }
    }

    /// What a launch whose end event was waited for (`waited`) comes to: a device-side assert is
    /// reported to the launch's output (`what` says which kernels: NVIDIA's driver prints the
    /// assertion message to vgpud's stdout, not to anything attributable to this VM), else the
    /// GPU time between the two events.
    pub(crate) fn launch_time(
        &self,
        (start, end): (Event, Event),
        waited: Result<(), DeviceError>,
        control: &RunControl,
        what: &str,
    ) -> Result<Duration, DeviceError> {
        if let Err(e) = waited {
            if e.cu_result() == cuda::CUDA_ERROR_ASSERT
                && let Some(out) = control.output()
            {
                out.assert_failed(
                    format!(
                        "{what}: device-side assert triggered (vgpu's real-GPU executor cannot \
                         return CUDA's assertion message)\n"
                    )
                    .as_bytes(),
                );
            }
            return Err(e);
        }
        let ms = {
            let _c = self.enter()?;
            self.driver()
                .event_elapsed_ms(start, end)
                .map_err(|f| self.fail(f, Op::Other))?
        };
        self.put_event(start);
        self.put_event(end);
        Ok(Duration::try_from_secs_f64(f64::from(ms) / 1e3).unwrap_or_default())
    }

    /// The CUDA stream of the calling thread's lane: a stream of its own for
    /// each of the first [`LANE_STREAMS`] lanes, a shared one past them, the
    /// default stream outside any lane. The engine orders lanes (a job starts
    /// once what it depends on completed, and every call here waits for its
    /// own work), so sharing a stream costs overlap, never order.
    pub(crate) fn lane_stream(&self) -> Stream {
        let lane = vgpu_broker::device::current_lane();
        if lane == 0 {
            return self.stream;
        }
        let mut pool = lock(&self.lane_streams);
        if let Some(&(_, s)) = pool.iter().find(|(l, _)| *l == lane) {
            return s;
        }
        if pool.len() >= LANE_STREAMS {
            // Lane ids of guest streams are odd: spread them by their upper bits.
            return pool[((lane >> 1) as usize) % pool.len()].1;
        }
        let created = self.enter().ok().and_then(|_c| {
            self.driver()
                .stream_create(STREAM_NON_BLOCKING)
                .map_err(|f| {
                    warn!(
                        call = f.call,
                        code = f.code,
                        "cannot create a CUDA stream for a guest stream; using the VM's default one"
                    );
                })
                .ok()
        });
        match created {
            Some(s) => {
                pool.push((lane, s));
                s
            }
            None => self.stream,
        }
    }

    /// Records an event on the calling lane's stream and waits for it:
    /// everything issued on that stream before has completed.
    pub(crate) fn finish(&self) -> Result<(), DeviceError> {
        self.finish_on(self.lane_stream())
    }

    /// Records an event on `stream` and waits for it.
    pub(crate) fn finish_on(&self, stream: Stream) -> Result<(), DeviceError> {
        let ev = self.take_event()?;
        {
            let _c = self.enter()?;
            self.driver()
                .event_record(ev, stream)
                .map_err(|f| self.fail(f, Op::Other))?;
        }
        self.wait(ev, None, None)?;
        self.put_event(ev);
        Ok(())
    }

    /// Polls `ev` until it completes, the context breaks, `deadline` passes
    /// (→ `CUDA_ERROR_LAUNCH_TIMEOUT`, which breaks the context: a running
    /// kernel cannot be stopped), or `control` is cancelled and the grace
    /// period ends.
    pub(crate) fn wait(
        &self,
        ev: Event,
        deadline: Option<Instant>,
        control: Option<(&RunControl, &str)>,
    ) -> Result<(), DeviceError> {
        let mut polls = 0u32;
        let mut sleep = MIN_POLL_SLEEP;
        let mut cancelled_at: Option<Instant> = None;
        loop {
            let done = {
                let _c = self.enter()?;
                self.driver().event_query(ev)
            };
            match done {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(f) => return Err(self.fail(f, Op::Other)),
            }
            let now = Instant::now();
            if let Some((c, _)) = control
                && cancelled_at.is_none()
                && c.cancelled()
            {
                cancelled_at = Some(now);
            }
            let grace_end = cancelled_at.map(|t| t + CANCEL_GRACE);
            let limit = match (deadline, grace_end) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if let Some(limit) = limit
                && now >= limit
            {
                let kernel = control.map_or("", |c| c.1);
                let why = if deadline.is_some_and(|d| now >= d) {
                    "ran past the device's watchdog"
                } else {
                    "was still running long after its session ended"
                };
                return Err(self.break_with(DeviceError::Fault {
                    code: cuda::CUDA_ERROR_LAUNCH_TIMEOUT,
                    message: format!(
                        "kernel `{kernel}` {why}; a GPU cannot stop a running kernel, so the VM's GPU context is abandoned"
                    ),
                }));
            }
            polls += 1;
            if polls < SPIN_POLLS {
                std::thread::yield_now();
            } else {
                std::thread::sleep(sleep);
                sleep = (sleep * 2).min(MAX_POLL_SLEEP);
            }
        }
    }

    fn take_staging(&self) -> Result<Staging, DeviceError> {
        if let Some(s) = lock(&self.staging).pop() {
            return Ok(s);
        }
        let first = self.take_event()?;
        let second = match self.take_event() {
            Ok(e) => e,
            Err(e) => {
                self.put_event(first);
                return Err(e);
            }
        };
        let buf = {
            let _c = self.enter()?;
            self.driver()
                .mem_host_alloc(2 * STAGING_CHUNK, MEMHOSTALLOC_PORTABLE)
                .map_err(|f| self.fail(f, Op::Other))?
        };
        Ok(Staging {
            buf,
            done: [first, second],
        })
    }

    fn put_staging(&self, s: Staging) {
        let mut pool = lock(&self.staging);
        if pool.len() < STAGING_POOL {
            pool.push(s);
            return;
        }
        drop(pool);
        self.free_staging(s);
    }

    fn free_staging(&self, s: Staging) {
        let d = self.driver();
        if let Err(f) = d.mem_free_host(s.buf) {
            debug!(
                call = f.call,
                code = f.code,
                "freeing a staging buffer failed"
            );
        }
        for e in s.done {
            let _ = d.event_destroy(e);
        }
    }

    /// Host to device from pieces laid back to back (one piece for a plain copy, the guest pages
    /// of a transfer for a scatter-gather one) through pinned memory: the pieces fill whole
    /// staging chunks, one half filling while the other is copied.
    pub(crate) fn write_gathered(
        &self,
        dst: u64,
        pieces: &[&[u8]],
        total: u64,
    ) -> Result<(), DeviceError> {
        let st = self.take_staging()?;
        let r = self.write_staged(&st, dst, pieces, total);
        self.release_staging(st, r.is_ok(), total);
        r
    }

    fn write_staged(
        &self,
        st: &Staging,
        dst: u64,
        pieces: &[&[u8]],
        total: u64,
    ) -> Result<(), DeviceError> {
        let d = self.driver();
        let mut issued = [false; 2];
        let mut cur = Cursor::default();
        let mut at = dst;
        for i in 0..chunk_count(total) {
            let half = i % 2;
            if issued[half] {
                self.wait(st.done[half], None, None)?;
            }
            let len = chunk_len(total, i);
            // SAFETY: the staging buffer holds 2 * STAGING_CHUNK bytes.
            let staged = unsafe { st.buf.0.add(half * STAGING_CHUNK) };
            // SAFETY: `staged` is valid for `len` <= STAGING_CHUNK bytes and this thread owns the
            // buffer; the last copy out of this half has completed, so nothing else reads or
            // writes these bytes while the slice lives (it ends before the copy is issued).
            let chunk = unsafe { std::slice::from_raw_parts_mut(staged, len) };
            if gather(pieces, &mut cur, chunk) != len {
                return Err(DeviceError::InvalidAddress {
                    addr: at,
                    len: len as u64,
                });
            }
            let stream = self.lane_stream();
            let _c = self.enter()?;
            // SAFETY: the half stays untouched until `done[half]` completes:
            // it is waited for before reuse and before the buffer is released.
            unsafe { d.memcpy_htod_async(at, staged, len, stream) }
                .map_err(|f| self.fail(f, Op::Other))?;
            d.event_record(st.done[half], stream)
                .map_err(|f| self.fail(f, Op::Other))?;
            issued[half] = true;
            at += len as u64;
        }
        for (&ev, was) in st.done.iter().zip(issued) {
            if was {
                self.wait(ev, None, None)?;
            }
        }
        Ok(())
    }

    /// Device to host into pieces filled in order, through pinned memory, the next chunk in
    /// flight while the previous one is copied out.
    pub(crate) fn read_scattered(
        &self,
        src: u64,
        pieces: &mut [&mut [u8]],
        total: u64,
    ) -> Result<(), DeviceError> {
        let st = self.take_staging()?;
        let r = self.read_staged(&st, src, pieces, total);
        self.release_staging(st, r.is_ok(), total);
        r
    }

    fn issue_read(&self, st: &Staging, src: u64, i: usize, len: usize) -> Result<(), DeviceError> {
        let d = self.driver();
        let half = i % 2;
        let stream = self.lane_stream();
        let _c = self.enter()?;
        // SAFETY: within the 2 * STAGING_CHUNK byte buffer.
        let dst = unsafe { st.buf.0.add(half * STAGING_CHUNK) };
        // SAFETY: this half is not read until `done[half]` completes.
        unsafe { d.memcpy_dtoh_async(dst, src + (i * STAGING_CHUNK) as u64, len, stream) }
            .map_err(|f| self.fail(f, Op::Other))?;
        d.event_record(st.done[half], stream)
            .map_err(|f| self.fail(f, Op::Other))
    }

    fn read_staged(
        &self,
        st: &Staging,
        src: u64,
        pieces: &mut [&mut [u8]],
        total: u64,
    ) -> Result<(), DeviceError> {
        let n = chunk_count(total);
        for i in 0..n.min(2) {
            self.issue_read(st, src, i, chunk_len(total, i))?;
        }
        let mut cur = Cursor::default();
        for i in 0..n {
            let half = i % 2;
            self.wait(st.done[half], None, None)?;
            let len = chunk_len(total, i);
            // SAFETY: the staging buffer holds 2 * STAGING_CHUNK bytes.
            let staged = unsafe { st.buf.0.add(half * STAGING_CHUNK) }.cast_const();
            // SAFETY: `staged` is valid for `len` <= STAGING_CHUNK bytes; the copy into this half
            // has completed and the next one into it is issued only after this slice's last use.
            let chunk = unsafe { std::slice::from_raw_parts(staged, len) };
            if scatter(pieces, &mut cur, chunk) != len {
                return Err(DeviceError::InvalidAddress {
                    addr: src + (i * STAGING_CHUNK) as u64,
                    len: len as u64,
                });
            }
            if i + 2 < n {
                self.issue_read(st, src, i + 2, chunk_len(total, i + 2))?;
            }
        }
        Ok(())
    }

    /// Returns a staging buffer after use. After a failure a copy may still
    /// be in flight: the buffer is reused only once both halves are idle.
    fn release_staging(&self, st: Staging, ok: bool, total: u64) {
        if ok {
            clear_staging(&st, total);
            self.put_staging(st);
        } else if self.wait(st.done[0], None, None).is_ok()
            && self.wait(st.done[1], None, None).is_ok()
        {
            // Idle again, but how far the copy got is unknown: clear both halves.
            clear_staging(&st, 2 * STAGING_CHUNK as u64);
            self.put_staging(st);
        } else if self.broken().is_none() {
            self.free_staging(st);
        }
        // A broken context keeps it until the context itself is destroyed.
    }

    pub(crate) fn copy(&self, dst: u64, src: u64, len: u64) -> Result<(), DeviceError> {
        if len == 0 || dst == src {
            return Ok(());
        }
        let d = self.driver();
        let overlap = src < dst.saturating_add(len) && dst < src.saturating_add(len);
        let stream = self.lane_stream();
        if !overlap {
            let _c = self.enter()?;
            d.memcpy_dtod_async(dst, src, len as usize, stream)
                .map_err(|f| self.fail(f, Op::Other))?;
            drop(_c);
            return self.finish();
        }
        // memmove: through a scratch buffer, in the direction that never
        // overwrites source bytes not yet copied.
        let mut scratch = lock(&self.scratch);
        let _c = self.enter()?;
        let buf = match *scratch {
            Some(b) => b,
            None => {
                let b = d
                    .mem_alloc(OVERLAP_SCRATCH)
                    .map_err(|f| self.fail(f, Op::Other))?;
                *scratch = Some(b);
                b
            }
        };
        let chunks = len.div_ceil(OVERLAP_SCRATCH);
        for k in 0..chunks {
            let k = if dst > src { chunks - 1 - k } else { k };
            let off = k * OVERLAP_SCRATCH;
            let n = (len - off).min(OVERLAP_SCRATCH) as usize;
            d.memcpy_dtod_async(buf, src + off, n, stream)
                .and_then(|()| d.memcpy_dtod_async(dst + off, buf, n, stream))
                .map_err(|f| self.fail(f, Op::Other))?;
        }
        drop(_c);
        // The scratch buffer stays locked until the copies completed.
        let r = self.finish();
        drop(scratch);
        r
    }

    /// After a launch of a kernel of a module with a printf buffer ([`printf`]): reads the
    /// records the launch wrote, resets the head and hands the records' text to the launch's
    /// output. Nothing is read from a broken context (its launch's text is lost with it). The
    /// copies run on the calling lane's stream, after the kernel. Launches of the same module
    /// running at the same time on other streams share its buffer: their records may come
    /// with this launch's text, or be lost when they land between the read and the reset.
    pub(crate) fn take_printf(
        &self,
        b: PrintfBuffer,
        control: &RunControl,
    ) -> Result<(), DeviceError> {
        if self.broken().is_some() {
            return Ok(());
        }
        let mut head = [0u8; printf::HEAD_SIZE];
        self.read_scattered(b.head, &mut [&mut head], printf::HEAD_SIZE as u64)?;
        let used = u64::from_le_bytes(head);
        if used == 0 {
            return Ok(());
        }
        let out = control.output();
        let mut buf = Vec::new();
        if out.is_some() {
            // Never more than the buffer, whatever a kernel wrote into the head.
            let len = used.min(printf::BUFFER_SIZE as u64);
            buf.resize(len as usize, 0);
            self.read_scattered(b.buf, &mut [&mut buf], len)?;
        }
        self.write_gathered(
            b.head,
            &[&[0u8; printf::HEAD_SIZE]],
            printf::HEAD_SIZE as u64,
        )?;
        if let Some(out) = out {
            let records = printf::deliver(&buf, &|| out.room(), &mut |t| {
                out.printf(t);
            });
            debug!(records, bytes = buf.len(), "device printf text returned");
        }
        if used > printf::BUFFER_SIZE as u64 {
            debug!(
                reserved = used,
                "the printf buffer filled up: later records were dropped"
            );
        }
        Ok(())
    }

    pub(crate) fn memset(
        &self,
        dst: u64,
        value: u32,
        elem_size: u32,
        count: u64,
    ) -> Result<(), DeviceError> {
        if count == 0 {
            return Ok(());
        }
        let stream = self.lane_stream();
        {
            let _c = self.enter()?;
            self.driver()
                .memset_async(dst, value, elem_size, count as usize, stream)
                .map_err(|f| self.fail(f, Op::Other))?;
        }
        self.finish_on(stream)
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        let d = Arc::clone(&self.shared.driver);
        let left: u64 = lock(&self.ranges).values().map(|r| r.charged).sum();
        self.shared.used.fetch_sub(left, Ordering::Relaxed);
        if self.broken().is_some() {
            // A kernel may still run in it: destroying it can take as long as
            // the driver needs to tear the context down. Never on a broker thread.
            let (ctx, id) = (self.ctx, self.id);
            // Physical memory is the device's, not the context's: released after it.
            let vmm = self.take_vmm();
            let spawned = std::thread::Builder::new()
                .name("vgpu-cuda-reaper".into())
                .spawn(move || {
                    match d.ctx_destroy(ctx) {
                        Ok(()) => debug!(generation = id, "broken CUDA context destroyed"),
                        Err(f) => warn!(
                            generation = id,
                            call = f.call,
                            code = f.code,
                            "destroying a broken CUDA context failed"
                        ),
                    }
                    vmm::release(&d, vmm);
                });
            if let Err(e) = spawned {
                warn!(error = %e, "cannot start a thread to destroy a broken CUDA context; it leaks");
            }
            return;
        }
        // Healthy: release what it holds, then the context (which frees the rest).
        if let Ok(_c) = Current::push(&d, self.ctx) {
            lock(&self.graphs).clear(&d);
            self.release_vmm();
            for s in std::mem::take(&mut *lock(&self.staging)) {
                self.free_staging(s);
            }
            for e in std::mem::take(&mut *lock(&self.events)) {
                let _ = d.event_destroy(e);
            }
            if let Some(b) = lock(&self.scratch).take() {
                let _ = d.mem_free(b);
            }
            for &(_, s) in lock(&self.lane_streams).iter() {
                let _ = d.stream_destroy(s);
            }
            let _ = d.stream_destroy(self.stream);
        }
        if let Err(f) = d.ctx_destroy(self.ctx) {
            warn!(
                call = f.call,
                code = f.code,
                "destroying a CUDA context failed"
            );
        }
    }
}

/// Kernel time measured with CUDA events, for the scheduler to charge.
#[derive(Debug, Default)]
pub struct KernelTimes {
    count: AtomicU64,
    total_ns: AtomicU64,
    last_ns: AtomicU64,
}

impl KernelTimes {
    pub(crate) fn record(&self, t: Duration) {
        let ns = u64::try_from(t.as_nanos()).unwrap_or(u64::MAX);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.total_ns.fetch_add(ns, Ordering::Relaxed);
        self.last_ns.store(ns, Ordering::Relaxed);
    }

    /// `n` kernels that ran as one unit (a chain, one CUDA graph) took `t` together; the
    /// latest kernel's time is their average.
    pub(crate) fn record_chain(&self, t: Duration, n: u64) {
        let ns = u64::try_from(t.as_nanos()).unwrap_or(u64::MAX);
        self.count.fetch_add(n, Ordering::Relaxed);
        self.total_ns.fetch_add(ns, Ordering::Relaxed);
        self.last_ns.store(ns / n.max(1), Ordering::Relaxed);
    }

    /// Kernels completed.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// GPU time of all completed kernels.
    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.total_ns.load(Ordering::Relaxed))
    }

    /// GPU time of the latest completed kernel.
    pub fn last(&self) -> Duration {
        Duration::from_nanos(self.last_ns.load(Ordering::Relaxed))
    }
}

/// State of a VM's context shared with its modules.
pub(crate) struct ContextInner {
    pub(crate) shared: Arc<DeviceShared>,
    pub(crate) tenant: String,
    slot: Mutex<Option<Arc<Generation>>>,
    pub(crate) generations: AtomicU64,
    pub(crate) times: KernelTimes,
    /// Module loads, one at a time in the driver, not waited for past their deadline.
    pub(crate) loader: DeadlineLoader,
}

impl ContextInner {
    /// The state of `tenant`'s context on the device of `shared`, before its first generation.
    pub(crate) fn new(shared: &Arc<DeviceShared>, tenant: &str) -> Self {
        ContextInner {
            shared: Arc::clone(shared),
            tenant: tenant.to_string(),
            slot: Mutex::new(None),
            generations: AtomicU64::new(0),
            times: KernelTimes::default(),
            loader: DeadlineLoader::new(),
        }
    }

    /// The live generation, creating one if there is none (or if a broken
    /// one is no longer used by anything).
    pub(crate) fn generation(&self) -> Result<Arc<Generation>, DeviceError> {
        let mut slot = lock(&self.slot);
        if let Some(g) = slot.as_ref() {
            match g.broken() {
                None => return Ok(Arc::clone(g)),
                Some(e) => {
                    if !(g.idle() && Arc::strong_count(g) == 1) {
                        return Err(e);
                    }
                    tracing::info!(vm = %self.tenant, "replacing the VM's broken GPU context with a fresh one");
                    *slot = None;
                }
            }
        }
        let id = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let g = Arc::new(Generation::new(&self.shared, id)?);
        *slot = Some(Arc::clone(&g));
        Ok(g)
    }

    /// The current generation as it is (broken or not), without creating one.
    pub(crate) fn existing(&self) -> Option<Arc<Generation>> {
        lock(&self.slot).clone()
    }

    /// Destroys a broken generation nothing uses any more.
    pub(crate) fn retire_if_idle(&self) {
        let mut slot = lock(&self.slot);
        let retire = slot
            .as_ref()
            .is_some_and(|g| g.broken().is_some() && g.idle() && Arc::strong_count(g) == 1);
        if retire {
            debug!(vm = %self.tenant, "destroying the VM's broken GPU context");
            *slot = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_cut_into_whole_staging_chunks() {
        let c = STAGING_CHUNK as u64;
        assert_eq!(chunk_count(0), 0);
        assert_eq!(chunk_count(1), 1);
        assert_eq!(chunk_count(c), 1);
        assert_eq!(chunk_count(c + 1), 2);
        assert_eq!(chunk_len(c + 1, 0), STAGING_CHUNK);
        assert_eq!(chunk_len(c + 1, 1), 1);
        assert_eq!(chunk_len(5, 0), 5);
        // The chunks add up to the copy.
        let total = 5 * c + 4099;
        let sum: u64 = (0..chunk_count(total))
            .map(|i| chunk_len(total, i) as u64)
            .sum();
        assert_eq!(sum, total);
    }
}
