//! In-process endpoints: a port served inside vgpud talks to the device thread through two
//! bounded byte rings in shared memory instead of a `UnixStream::pair()`.
//!
//! The device thread copies guest payload straight from descriptor memory into the ring towards
//! the session, and copies the session's output straight from its ring into rx descriptors: no
//! system call and no kernel copy per packet. A session that waits in
//! [`ReadInPlace::read_in_place`] for more bytes than the ring holds lends its function to the
//! device thread, which calls it with the ring's bytes and then the guest's straight from
//! descriptor memory: no copy into the ring at all (where an answerer is registered, that is
//! where the device thread may run the session's calls). The device side never blocks (a full or empty ring
//! is `WouldBlock`, like a nonblocking socket); the session side blocks on a condition variable.
//!
//! Wake-ups are sent on transitions only: the device thread's epoll watches an eventfd that the
//! session writes when its ring towards the device goes from empty to non-empty, when it frees
//! room the device was waiting for, and when it closes; the session is woken only while it waits.
//! So a burst of packets costs one wake-up, not one per packet.
//!
//! The device may enlarge both rings before either is used ([`DeviceEnd::enlarge`], with a
//! reservation of its per-VM budget); the large rings' memory is freed and the reservation
//! returned as soon as the data of both is dead or delivered. The ring towards the session is
//! done once the session end is closed, or the device end is closed (or shut for writing) and
//! the ring is drained; the ring towards the device once the device end is closed, or the
//! session end is closed and the ring is drained.
//!
//! Closing behaves like a socket pair: dropping (or shutting down) one end makes the other read
//! end of file once the ring is drained, and writes to a closed peer fail with `BrokenPipe`.

use std::io::{self, Read, Write};
use std::ops::ControlFlow;
use std::os::fd::{AsRawFd, RawFd};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use vgpu_hugemem::HugeMapping;
use vgpu_proto::frame::{
    AnswerHere, Answered, Borrower, FillFn, FrameRing, ReadInPlace, RunFn, WriteInPlace,
};
use vm_memory::bitmap::BitmapSlice;
use vm_memory::{ReadVolatile, VolatileMemoryError, VolatileSlice, WriteVolatile};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::VsockStats;

/// Default capacity of each ring of an in-process connection (the socket buffer size a
/// `UnixStream::pair()` has by default is about the same).
pub const DEFAULT_RING_CAPACITY: usize = 256 * 1024;

/// A session writer waiting for room in the ring towards the device is woken once at least this
/// fraction (1/n) of the ring is free.
const ROOM_WAKE_DIVISOR: usize = 4;

/// A reservation of a device's large-ring budget (`VsockStats::large_ring_bytes`), returned when
/// dropped.
pub(crate) struct RingLease {
    stats: Arc<VsockStats>,
    bytes: u64,
}

impl RingLease {
    /// Reserves `bytes` if the device's reservations stay within `limit`.
    pub(crate) fn try_new(stats: &Arc<VsockStats>, bytes: u64, limit: u64) -> Option<Self> {
        stats
            .try_reserve_large_ring(bytes, limit)
            .then(|| RingLease {
                stats: Arc::clone(stats),
                bytes,
            })
    }
}

impl std::fmt::Debug for RingLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingLease")
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Drop for RingLease {
    fn drop(&mut self) {
        self.stats.release_large_ring(self.bytes);
    }
}

/// Rings of at least this many bytes get a mapping of their own ([`HugeMapping`]), unmapped when
/// the ring goes: a large ring freed to the allocator stays in the process (glibc raises its mmap
/// threshold after freeing a mapped block, so the next ones come from the heap and are seldom
/// returned), and vgpud's memory would not come back after a burst of GPU-port connections.
const MAPPED_RING_BYTES: usize = vgpu_hugemem::HUGE_PAGE;

/// A ring's memory: a heap block, or a mapping of its own for large rings. It is read and
/// written only through [`Span`]s, from raw pointers: the two ends copy in and out of disjoint
/// parts of it at the same time, outside the state lock.
struct RingMem {
    ptr: NonNull<u8>,
    cap: usize,
    /// The mapping that holds the bytes; `None`: `ptr` is a leaked `Box<[u8]>` of `cap` bytes.
    mapping: Option<HugeMapping>,
}

// SAFETY: `RingMem` owns its bytes like a `Vec<u8>`; what is read and written concurrently is
// governed by the `Span` rules (disjoint parts, one reader and one writer per ring).
unsafe impl Send for RingMem {}
// SAFETY: as above; `&RingMem` gives out nothing but `Span`s.
unsafe impl Sync for RingMem {}

impl RingMem {
    /// `cap` zeroed bytes (at least one), mapped for large rings (on the heap where mapping
    /// fails).
    fn new(cap: usize) -> Self {
        if cap >= MAPPED_RING_BYTES
            && let Ok(m) = HugeMapping::new(cap)
        {
            return RingMem {
                ptr: m.as_non_null(),
                cap,
                mapping: Some(m),
            };
        }
        let heap: *mut [u8] = Box::into_raw(vec![0u8; cap].into_boxed_slice());
        RingMem {
            ptr: NonNull::new(heap.cast::<u8>()).unwrap_or(NonNull::dangling()),
            cap,
            mapping: None,
        }
    }
}

impl Drop for RingMem {
    fn drop(&mut self) {
        if self.mapping.is_none() {
            // SAFETY: `ptr` came from `Box::into_raw` of a `cap`-byte boxed slice in `new`, and
            // no `Span` outlives the `Arc` that owns this memory.
            drop(unsafe {
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                    self.ptr.as_ptr(),
                    self.cap,
                ))
            });
        }
    }
}

impl std::fmt::Debug for RingMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingMem")
            .field("cap", &self.cap)
            .field("mapped", &self.mapping.is_some())
            .finish()
    }
}

/// Up to two runs of a ring's memory (the second after the wrap), taken under the state lock for
/// a copy made outside it: the readable bytes for the ring's one reader, or the free room for
/// its one writer. The two never overlap: the reader's part becomes free, and the writer's
/// readable, only when the copy is committed under the lock. The `Arc` keeps the memory alive
/// if the ring is replaced meanwhile ([`State::release_large_ring`]).
struct Span {
    mem: Arc<RingMem>,
    parts: [(usize, usize); 2],
}

impl Span {
    /// The span's bytes, to read.
    fn slices(&self) -> [&[u8]; 2] {
        self.parts.map(|(at, n)| {
            // SAFETY: `at + n <= cap` (computed by `Ring`); this span is the readable part of
            // the ring, which its writer does not touch until the read is committed, and there
            // is one reader per ring at a time (the end's copy lock).
            unsafe { std::slice::from_raw_parts(self.mem.ptr.as_ptr().wrapping_add(at), n) }
        })
    }

    /// Bytes in the span.
    fn len(&self) -> usize {
        self.parts[0].1 + self.parts[1].1
    }

    /// The span's first `n` bytes (at most its length), as runs: the first `count` of `runs`.
    fn first(&self, n: usize) -> ([&[u8]; 2], usize) {
        let mut runs = [&[][..]; 2];
        let mut taken = 0;
        for (slot, run) in runs.iter_mut().zip(self.slices()) {
            let k = run.len().min(n - taken);
            *slot = &run[..k];
            taken += k;
        }
        let count = if runs[1].is_empty() { 1 } else { 2 };
        (runs, count)
    }

    /// The span's room, to write.
    #[allow(clippy::mut_from_ref)]
    fn slices_mut(&self) -> [&mut [u8]; 2] {
        self.parts.map(|(at, n)| {
            // SAFETY: `at + n <= cap`; this span is the free part of the ring, which its reader
            // does not touch until the write is committed, and there is one writer per ring at a
            // time (the end's copy lock); the two parts do not overlap.
            unsafe { std::slice::from_raw_parts_mut(self.mem.ptr.as_ptr().wrapping_add(at), n) }
        })
    }
}

/// A session reader's [`Borrower`], lent to the device thread while the reader waits for the
/// bytes it borrows (`SessionEnd::read_in_place`).
struct LentFn {
    /// The reader's borrower, its lifetime erased: the reader does not return from
    /// `read_in_place` before it took this back, and never while the device thread calls it.
    to: NonNull<Borrower<'static>>,
    /// Bytes the reader still wants.
    left: usize,
    /// The function panicked on the device thread: the reader resumes the panic.
    panic: Option<Box<dyn std::any::Any + Send>>,
}

// SAFETY: a `Borrower` is `Send` (its function is, `RunFn`); the pointer is dereferenced by one
// thread at a time: the device thread between taking the `LentFn` out of the state and putting it
// back, and the reader never while it waits for it.
unsafe impl Send for LentFn {}

impl std::fmt::Debug for LentFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LentFn")
            .field("left", &self.left)
            .field("panicked", &self.panic.is_some())
            .finish()
    }
}

/// The function of a session writer waiting in `write_in_place` (`SessionEnd`), lent to the device
/// thread, which calls it with rx descriptor memory once the ring towards the device is drained
/// ([`DeviceEnd::fill_here`]).
struct LentFill {
    /// The writer's function, its lifetime erased: the writer does not return from
    /// `write_in_place` before it took this back, and never while the device thread calls it.
    to: NonNull<Filler<'static>>,
    /// Bytes the writer still has to produce.
    left: usize,
    /// The function broke: the bytes left are never produced.
    broke: bool,
    /// The function panicked on the device thread: the writer resumes the panic.
    panic: Option<Box<dyn std::any::Any + Send>>,
}

/// A writer's [`FillFn`], sized so that a pointer to it can be kept.
struct Filler<'f>(&'f mut FillFn<'f>);

// SAFETY: a `FillFn` is `Send`; the pointer is dereferenced by one thread at a time: the device
// thread between taking the `LentFill` out of the state and putting it back, and the writer never
// while it waits for it.
unsafe impl Send for LentFill {}

impl std::fmt::Debug for LentFill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LentFill")
            .field("left", &self.left)
            .field("broke", &self.broke)
            .field("panicked", &self.panic.is_some())
            .finish()
    }
}

/// A bounded byte ring; its memory is allocated on the first write.
#[derive(Debug)]
struct Ring {
    mem: Option<Arc<RingMem>>,
    cap: usize,
    head: usize,
    len: usize,
}

impl Ring {
    fn new(cap: usize) -> Self {
        Ring {
            mem: None,
            cap: cap.max(1),
            head: 0,
            len: 0,
        }
    }

    fn free(&self) -> usize {
        self.cap - self.len
    }

    /// Runs of `n` bytes from `at`, wrapping at the end.
    fn runs(&self, at: usize, n: usize) -> [(usize, usize); 2] {
        let first = n.min(self.cap - at);
        [(at, first), (0, n - first)]
    }

    /// The readable bytes (`None`: there are none).
    fn readable(&self) -> Option<Span> {
        let mem = self.mem.as_ref().filter(|_| self.len > 0)?;
        Some(Span {
            mem: Arc::clone(mem),
            parts: self.runs(self.head, self.len),
        })
    }

    /// The free room (`None`: the ring is full); allocates the ring on first use.
    fn writable(&mut self) -> Option<Span> {
        if self.free() == 0 {
            return None;
        }
        let cap = self.cap;
        let mem = self.mem.get_or_insert_with(|| Arc::new(RingMem::new(cap)));
        let mem = Arc::clone(mem);
        let tail = (self.head + self.len) % self.cap;
        Some(Span {
            mem,
            parts: self.runs(tail, self.free()),
        })
    }

    /// Whether `span` is of this ring's memory (not of one replaced since it was taken).
    fn holds(&self, span: &Span) -> bool {
        self.mem.as_ref().is_some_and(|m| Arc::ptr_eq(m, &span.mem))
    }

    /// `n` bytes of `span` (from [`Ring::readable`]) were read; nothing if the ring was replaced.
    fn consume(&mut self, span: &Span, n: usize) {
        if self.holds(span) {
            debug_assert!(n <= self.len);
            self.head = (self.head + n) % self.cap;
            self.len -= n;
        }
    }

    /// `n` bytes of `span` (from [`Ring::writable`]) were written; nothing if the ring was
    /// replaced (its reader is gone, so the bytes are dead).
    fn commit(&mut self, span: &Span, n: usize) {
        if self.holds(span) {
            debug_assert!(n <= self.free());
            self.len += n;
        }
    }
}

/// Has `f` fill the start of `span`'s room, up to `len` bytes, run by run until it breaks;
/// returns the bytes it filled and whether it broke.
fn produce(span: &Span, len: usize, f: &mut FillFn<'_>) -> (usize, bool) {
    let mut n = 0;
    for part in span.slices_mut() {
        let k = part.len().min(len - n);
        if k == 0 {
            break;
        }
        if f(&mut part[..k]).is_break() {
            return (n, true);
        }
        n += k;
    }
    (n, false)
}

/// Copies `src` into the start of `span`'s room; returns the bytes copied.
fn fill(span: &Span, src: &[u8]) -> usize {
    produce(span, src.len(), &mut copy_from(src)).0
}

/// A [`FillFn`] that fills the room it is given with the next bytes of `src`, in order.
fn copy_from(src: &[u8]) -> impl FnMut(&mut [u8]) -> ControlFlow<()> + Send + '_ {
    let mut at = 0;
    move |room| {
        room.copy_from_slice(&src[at..at + room.len()]);
        at += room.len();
        ControlFlow::Continue(())
    }
}

#[derive(Debug)]
struct State {
    /// Device → session (guest payload).
    to_session: Ring,
    /// Session → device (replies).
    to_device: Ring,
    /// The device end was dropped: the session reads end of file, its writes fail.
    device_closed: bool,
    /// The device shut its writing side (the guest's `SHUTDOWN SEND`).
    device_write_closed: bool,
    /// The session end was dropped or shut down.
    session_closed: bool,
    /// The session shut its writing side.
    session_write_closed: bool,
    /// The session sleeps on the condition variable for bytes (or a kick, or the end).
    session_waiting: bool,
    /// The session sleeps on the condition variable for room in `to_device`.
    session_wants_room: bool,
    /// The device found `to_session` full and waits for room (an eventfd write is owed).
    device_wants_room: bool,
    /// The answerer kicked the session ([`FrameRing::kick`]).
    kicked: bool,
    /// Frames the answerer answered on the device thread since the device last asked
    /// ([`DeviceEnd::take_answered`]).
    answered: usize,
    /// The budget reservation of enlarged rings.
    lease: Option<RingLease>,
    /// The function of a session reader waiting in `read_in_place` for more bytes than the ring
    /// holds, lent to the device thread, which calls it with the ring's bytes and then the
    /// guest's straight from descriptor memory ([`DeviceEnd::lend_here`]); `None` while the
    /// device thread calls it (and when no reader lends).
    lent: Option<LentFn>,
    /// Bytes the device thread handed to a lent function since the device last asked
    /// ([`DeviceEnd::take_lent_bytes`]).
    lent_bytes: u64,
    /// The reader wants its function back (it timed out, or the stream ended) and waits for the
    /// device thread to return it.
    lent_wanted: bool,
    /// The function of a session writer waiting in `write_in_place`, lent to the device thread,
    /// which calls it with rx descriptor memory once the ring towards the device is drained
    /// ([`DeviceEnd::fill_here`]); `None` while the device thread calls it (and when no writer
    /// lends).
    filler: Option<LentFill>,
    /// The writer wants its function back (the stream ended) and waits for the device thread to
    /// return it.
    filler_wanted: bool,
    /// What the last [`DeviceEnd::settle`] saw and did, for the wake-up audit.
    last_settle: SettleTrace,
    /// Where the session last waited for bytes (the function), for the wake-up audit.
    waiter: &'static str,
    /// The thread that last waited for bytes (its kernel thread id), for the wake-up audit.
    waiter_tid: i32,
    /// What the session's last commit of bytes towards the device saw, for the wake-up audit.
    last_commit: CommitTrace,
    /// Commits (and lent writers) that owed the device an eventfd write: the session writes it
    /// after unlocking and then counts it in [`Shared::output_wakes_sent`]. The audit compares the
    /// two, so output whose wake-up is on its way (its writer preempted between the commit and
    /// the write, say by the device thread it unblocked) is not taken for a lost one.
    output_wakes_owed: u64,
}

/// What the session's last commit of output ([`SessionEnd`]'s writes) saw: shown by the wake-up
/// audit ([`RingAudit`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitTrace {
    /// Commits so far on this connection.
    pub count: u64,
    /// Bytes the last one committed.
    pub bytes: usize,
    /// Whether the ring was empty then (the session then owes the device an eventfd write).
    pub was_empty: bool,
    /// Bytes in the ring after it.
    pub len_after: usize,
}

/// What a [`DeviceEnd::settle`] saw and did: shown by the wake-up audit ([`RingAudit`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SettleTrace {
    /// Settles so far on this connection.
    pub count: u64,
    /// Calls the answerer answered in the last one.
    pub calls: usize,
    /// Whether the answerer asked for the reader to be woken (`None`: no answerer was reached).
    pub wake_reader: Option<bool>,
    /// Whether the session was waiting then.
    pub session_waiting: bool,
    /// Bytes waiting for the session after the answerer.
    pub to_session: usize,
    /// Whether the session was woken.
    pub woke: bool,
}

impl State {
    /// Frees enlarged rings once the data of both is dead or delivered: towards the session
    /// once the session is gone, or the device no longer writes and the ring is drained;
    /// towards the device once the device is gone, or the session is and the ring is drained.
    /// The caller drops the returned reservation after unlocking.
    #[must_use]
    fn release_large_ring(&mut self) -> Option<RingLease> {
        self.lease.as_ref()?;
        let device_done = self.device_closed || self.device_write_closed;
        let session_done = self.session_closed || self.session_write_closed;
        let to_session_done = self.session_closed || (device_done && self.to_session.len == 0);
        let to_device_done = self.device_closed || (session_done && self.to_device.len == 0);
        if to_session_done && to_device_done {
            self.to_session = Ring::new(DEFAULT_RING_CAPACITY);
            self.to_device = Ring::new(DEFAULT_RING_CAPACITY);
            return self.lease.take();
        }
        None
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Held by the device end while it copies, in either direction (it never waits): with the
    /// session's locks below, one reader and one writer per ring at a time ([`Span`]).
    device_copy: Mutex<()>,
    /// Held by the session end while it reads (and waits for bytes).
    session_read: Mutex<()>,
    /// Held by the session end while it writes (and waits for room).
    session_write: Mutex<()>,
    /// Wakes the session thread.
    cond: Condvar,
    /// Wakes the device thread (registered in its epoll).
    event: EventFd,
    /// Answers quick frames on the device thread ([`FrameRing::answer_with`]).
    answerer: OnceLock<Weak<dyn AnswerHere>>,
    /// Bytes a lent writer's function produced straight in rx descriptor memory since the device
    /// last asked ([`DeviceEnd::take_filled_bytes`]).
    filled_bytes: AtomicU64,
    /// Eventfd writes that announced output, made after the commit that owed them
    /// ([`State::output_wakes_owed`]): while fewer than owed, a wake-up is on its way.
    output_wakes_sent: AtomicU64,
    /// Eventfd writes that failed (none expected), for the wake-up audit.
    wake_failures: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes one of the copy locks (which guard no data of their own).
    fn copying(lock: &Mutex<()>) -> MutexGuard<'_, ()> {
        lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wake_device(&self) {
        // A full counter (never reached: the device drains it on every event) only means a
        // wake-up is already pending; any failure is counted for the audit.
        if self.event.write(1).is_err() {
            self.wake_failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Announces output whose commit owed the device a wake-up ([`State::output_wakes_owed`]).
    fn announce_output(&self) {
        self.wake_device();
        self.output_wakes_sent.fetch_add(1, Ordering::Release);
    }
}

/// Creates an in-process connection whose rings hold `capacity` bytes each: the device keeps
/// the [`DeviceEnd`], the service the [`SessionEnd`].
pub fn pair(capacity: usize) -> io::Result<(DeviceEnd, SessionEnd)> {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            to_session: Ring::new(capacity),
            to_device: Ring::new(capacity),
            device_closed: false,
            device_write_closed: false,
            session_closed: false,
            session_write_closed: false,
            session_waiting: false,
            session_wants_room: false,
            device_wants_room: false,
            kicked: false,
            answered: 0,
            lease: None,
            lent: None,
            lent_bytes: 0,
            lent_wanted: false,
            filler: None,
            filler_wanted: false,
            last_settle: SettleTrace::default(),
            waiter: "",
            waiter_tid: 0,
            last_commit: CommitTrace::default(),
            output_wakes_owed: 0,
        }),
        device_copy: Mutex::new(()),
        session_read: Mutex::new(()),
        session_write: Mutex::new(()),
        cond: Condvar::new(),
        event: EventFd::new(EFD_NONBLOCK)?,
        answerer: OnceLock::new(),
        filled_bytes: AtomicU64::new(0),
        output_wakes_sent: AtomicU64::new(0),
        wake_failures: AtomicU64::new(0),
    });
    Ok((
        DeviceEnd {
            shared: Arc::clone(&shared),
        },
        SessionEnd {
            shared,
            read_timeout: Mutex::new(None),
        },
    ))
}

/// The device thread's end: nonblocking, its readiness is the eventfd [`AsRawFd::as_raw_fd`]
/// returns (register it edge-triggered for `IN`, call [`DeviceEnd::clear_event`] on each event).
#[derive(Debug)]
pub struct DeviceEnd {
    shared: Arc<Shared>,
}

impl DeviceEnd {
    /// Consumes the pending wake-up.
    pub fn clear_event(&self) {
        let _ = self.shared.event.read();
    }

    /// Gives the ring towards the session `to_session` bytes and the ring towards the device
    /// `to_device`, holding `lease` until the rings are freed. Only before either ring is used;
    /// returns whether it took effect (otherwise the lease is returned at once).
    pub(crate) fn enlarge(&self, to_session: usize, to_device: usize, lease: RingLease) -> bool {
        let mut st = self.shared.lock();
        let untouched = |r: &Ring| r.mem.is_none() && r.len == 0;
        if !untouched(&st.to_session)
            || !untouched(&st.to_device)
            || st.session_closed
            || st.device_closed
            || st.lease.is_some()
        {
            return false;
        }
        st.to_session = Ring::new(to_session);
        st.to_device = Ring::new(to_device);
        st.lease = Some(lease);
        true
    }

    /// Capacity of the ring towards the device.
    pub fn to_device_capacity(&self) -> usize {
        self.shared.lock().to_device.cap
    }

    /// Capacity of the ring towards the session.
    pub fn to_session_capacity(&self) -> usize {
        self.shared.lock().to_session.cap
    }

    /// Shuts the device's writing side: the session reads end of file after the ring.
    pub fn shutdown_write(&self) {
        let mut st = self.shared.lock();
        st.device_write_closed = true;
        let wake = st.session_waiting;
        let lease = st.release_large_ring();
        drop(st);
        drop(lease);
        if wake {
            self.shared.cond.notify_all();
        }
    }

    /// Whether the session end is gone (dropped or shut down both ways).
    pub fn peer_gone(&self) -> bool {
        self.shared.lock().session_closed
    }
}

/// Where an in-process connection's rings stand, as the device's wake-up audit sees them
/// ([`DeviceEnd::audit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingAudit {
    /// Bytes waiting for the session.
    pub to_session: usize,
    /// Room left in the ring towards the session.
    pub to_session_free: usize,
    /// Bytes waiting for the device (replies).
    pub to_device: usize,
    /// A session writer lent its function and waits for the device to call it.
    pub filler_lent: bool,
    /// A session reader lent its function and waits for guest bytes.
    pub reader_lent: bool,
    /// The session sleeps waiting for bytes (or a kick).
    pub session_waiting: bool,
    /// The session sleeps waiting for room towards the device.
    pub session_wants_room: bool,
    /// The device waits for room towards the session (an eventfd write is owed).
    pub device_wants_room: bool,
    /// An eventfd write is pending: the device has not seen the last change yet.
    pub event_pending: bool,
    /// Either end is closed or shut for writing: nothing is owed.
    pub ending: bool,
    /// The session was kicked and has not taken the kick yet.
    pub kicked: bool,
    /// An answerer is registered (the device thread may answer the session's calls).
    pub answerer: bool,
    /// The first bytes waiting for the session (up to [`AUDIT_FRONT_BYTES`]; a frame's header).
    pub front: [u8; AUDIT_FRONT_BYTES],
    /// What the last settle after a write towards the session saw and did.
    pub last_settle: SettleTrace,
    /// Where the session last waited for bytes.
    pub waiter: &'static str,
    /// The kernel thread id of the thread that last waited for bytes ([`RingAudit::waiter_state`]).
    pub waiter_tid: i32,
    /// What the session's last commit of output saw.
    pub last_commit: CommitTrace,
    /// A wake-up for output is on its way: committed (or lent) under the lock, the eventfd
    /// write not made yet.
    pub wake_in_flight: bool,
    /// Output wake-ups owed so far (tells one in flight from the next).
    pub output_wakes_owed: u64,
    /// Eventfd writes that failed.
    pub wake_failures: u64,
}

thread_local! {
    /// This thread's kernel thread id, asked once per thread: a session records it each time it
    /// waits, which must not cost a system call.
    // SAFETY: gettid takes no arguments and cannot fail.
    static THREAD_ID: i32 = unsafe { libc::gettid() };
}

/// Bytes of the ring towards the session a [`RingAudit`] shows.
pub const AUDIT_FRONT_BYTES: usize = 24;

/// The scheduler state of thread `tid` of this process (`/proc/self/task/<tid>/stat`'s third
/// field), `?` when it cannot be read.
fn thread_state(tid: i32) -> char {
    if tid <= 0 {
        return '?';
    }
    std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
        .ok()
        .and_then(|stat| {
            // The command name (in parentheses) may hold spaces: the state follows its end.
            let rest = &stat[stat.rfind(')')? + 1..];
            rest.trim_start().chars().next()
        })
        .unwrap_or('?')
}

impl RingAudit {
    /// The scheduler state of the thread that last waited for bytes, from
    /// `/proc/self/task/<tid>/stat` (`S`: asleep, `R`: runnable or running; `?`: unknown). Read
    /// now, not when the audit was taken.
    pub fn waiter_state(&self) -> char {
        thread_state(self.waiter_tid)
    }

    /// Where the thread that last waited for bytes is now: its scheduler state, the system call
    /// it is in (`/proc/self/task/<tid>/syscall`: number and first arguments), the kernel
    /// function it sleeps in (`wchan`) and its time on the CPU and waiting for one
    /// (`schedstat`, nanoseconds).
    pub fn waiter_where(&self) -> String {
        let tid = self.waiter_tid;
        let read = |what: &str| {
            std::fs::read_to_string(format!("/proc/self/task/{tid}/{what}"))
                .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                .unwrap_or_else(|e| format!("({e})"))
        };
        format!(
            "state {} syscall [{}] wchan {} schedstat [{}]",
            self.waiter_state(),
            read("syscall"),
            read("wchan"),
            read("schedstat")
        )
    }

    /// Whether the session has output for the device: bytes in the ring, or a lent writer.
    pub fn has_output(&self) -> bool {
        self.to_device > 0 || self.filler_lent
    }
}

impl DeviceEnd {
    /// A snapshot of both rings and the wake-up flags, for the device's audit of lost
    /// wake-ups.
    pub fn audit(&self) -> RingAudit {
        let st = self.shared.lock();
        RingAudit {
            to_session: st.to_session.len,
            to_session_free: st.to_session.free(),
            to_device: st.to_device.len,
            filler_lent: st
                .filler
                .as_ref()
                .is_some_and(|f| f.left > 0 && !f.broke && f.panic.is_none()),
            reader_lent: st.lent.is_some(),
            session_waiting: st.session_waiting,
            session_wants_room: st.session_wants_room,
            device_wants_room: st.device_wants_room,
            event_pending: vgpu_vhost_user::fd_readable(self.shared.event.as_raw_fd()),
            ending: st.session_closed
                || st.session_write_closed
                || st.device_closed
                || st.device_write_closed,
            kicked: st.kicked,
            answerer: self.shared.answerer.get().is_some(),
            last_settle: st.last_settle,
            waiter: st.waiter,
            waiter_tid: st.waiter_tid,
            last_commit: st.last_commit,
            wake_in_flight: self.shared.output_wakes_sent.load(Ordering::Acquire)
                != st.output_wakes_owed,
            output_wakes_owed: st.output_wakes_owed,
            wake_failures: self.shared.wake_failures.load(Ordering::Relaxed),
            front: {
                let mut front = [0u8; AUDIT_FRONT_BYTES];
                if let Some(span) = st.to_session.readable() {
                    // Only this (the device) thread writes the ring, into its free room; the
                    // readable bytes stay as they are until consumed under the state lock,
                    // which this thread holds. The session may read them meanwhile: reads only.
                    drain_into(&span.slices(), &mut front);
                }
                front
            },
        }
    }

    /// Wakes the session thread whatever it waits for (the audit found it asleep with work).
    pub fn wake_session(&self) {
        self.shared.cond.notify_all();
    }
}

impl AsRawFd for DeviceEnd {
    fn as_raw_fd(&self) -> RawFd {
        self.shared.event.as_raw_fd()
    }
}

impl Drop for DeviceEnd {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.device_closed = true;
        let lease = st.release_large_ring();
        drop(st);
        drop(lease);
        self.shared.cond.notify_all();
    }
}

fn would_block() -> VolatileMemoryError {
    VolatileMemoryError::IOError(io::ErrorKind::WouldBlock.into())
}

fn broken_pipe() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the in-process peer is gone")
}

impl DeviceEnd {
    /// Copies guest payload into the ring towards the session, outside the state lock, or hands
    /// it to a reader that lends ([`DeviceEnd::lend_here`]).
    fn push_volatile<B: BitmapSlice>(
        &self,
        src: &VolatileSlice<'_, B>,
    ) -> Result<usize, VolatileMemoryError> {
        if self.lends() {
            let guard = src.ptr_guard();
            // SAFETY: vm-memory checked that `src` lies in the guest's mapped memory, which the
            // caller's memory guard keeps mapped for this call. The guest may write the bytes
            // meanwhile, as during any copy from its memory: the reader's function only copies
            // them (into device memory), once.
            let bytes = unsafe { std::slice::from_raw_parts(guard.as_ptr(), src.len()) };
            if let Some(n) = self.lend_here(bytes) {
                return Ok(n);
            }
        }
        self.push_with(src.len(), VolatileMemoryError::IOError, |span| {
            let [a, b] = span.slices_mut();
            let n1 = a.len().min(src.len());
            src.subslice(0, n1)?.copy_to(&mut a[..n1]);
            let n2 = b.len().min(src.len() - n1);
            if n2 > 0 {
                src.subslice(n1, n2)?.copy_to(&mut b[..n2]);
            }
            Ok(n1 + n2)
        })
    }

    /// Copies up to `want` bytes into the ring towards the session with `copy`, outside the
    /// state lock, and makes them readable: `BrokenPipe` once the session is gone, `WouldBlock`
    /// (an eventfd write owed when room frees up) while the ring is full.
    fn push_with<E>(
        &self,
        want: usize,
        io_error: impl Fn(io::Error) -> E,
        copy: impl FnOnce(&Span) -> Result<usize, E>,
    ) -> Result<usize, E> {
        let n = self.push_only(want, io_error, copy)?;
        if n > 0 {
            self.settle();
        }
        Ok(n)
    }

    /// [`DeviceEnd::push_with`] without [`DeviceEnd::settle`]: wakes the session itself unless
    /// an answerer is registered.
    fn push_only<E>(
        &self,
        want: usize,
        io_error: impl Fn(io::Error) -> E,
        copy: impl FnOnce(&Span) -> Result<usize, E>,
    ) -> Result<usize, E> {
        let _copy = Shared::copying(&self.shared.device_copy);
        let mut st = self.shared.lock();
        if st.session_closed {
            return Err(io_error(broken_pipe()));
        }
        let span = match st.to_session.writable() {
            Some(span) => span,
            None if want == 0 => return Ok(0),
            None => {
                st.device_wants_room = true;
                return Err(io_error(io::ErrorKind::WouldBlock.into()));
            }
        };
        drop(st);
        let n = copy(&span)?;
        let mut st = self.shared.lock();
        st.to_session.commit(&span, n);
        // With an answerer, `settle` decides whether the session is woken.
        let wake = st.session_waiting && self.shared.answerer.get().is_none();
        drop(st);
        if wake {
            self.shared.cond.notify_all();
        }
        Ok(n)
    }

    /// Whether bytes may go to a lending reader at all: only where an answerer is registered,
    /// that is where the device thread may run the session's device calls (vgpud registers one
    /// only where its seccomp filters allow that), which the reader's function makes.
    fn lends(&self) -> bool {
        self.shared.answerer.get().is_some()
    }

    /// Hands the start of `src` straight to a session reader that waits in `read_in_place` for
    /// bytes and lent its function (`SessionEnd::read_in_place`): the bytes are not copied into
    /// the ring, and the reader is woken only once it has all it asked for. Bytes the ring held
    /// when the reader lent go first (the reader lends with some there when more are to come).
    /// Returns the bytes of `src` it took, `None` when no reader lends or it wants none of them
    /// (the bytes go to the ring).
    fn lend_here(&self, src: &[u8]) -> Option<usize> {
        if src.is_empty() || !self.lends() {
            return None;
        }
        let _copy = Shared::copying(&self.shared.device_copy);
        let mut st = self.shared.lock();
        if st.session_closed {
            return None;
        }
        let mut lent = st.lent.take_if(|l| l.left > 0 && l.panic.is_none())?;
        // This thread reads the ring for the reader, which does not while it lends.
        let ring = st.to_session.readable();
        drop(st);
        let from_ring = ring.as_ref().map_or(0, |span| span.len().min(lent.left));
        let n = src.len().min(lent.left - from_ring);
        // SAFETY: the reader's borrower is alive and used by no one else: the reader waits in
        // `read_in_place` until it took the `LentFn` back, which it cannot while this thread
        // holds it.
        let to = unsafe { lent.to.as_mut() };
        let offered = catch_unwind(AssertUnwindSafe(|| {
            if let Some(span) = &ring
                && from_ring > 0
            {
                let (runs, count) = span.first(from_ring);
                to.offer(&runs[..count]);
            }
            if n > 0 {
                to.offer(&[&src[..n]]);
            }
        }));
        if let Err(panic) = offered {
            lent.panic = Some(panic);
        }
        lent.left -= from_ring + n;
        let mut st = self.shared.lock();
        if let Some(span) = &ring {
            st.to_session.consume(span, from_ring);
        }
        let wake = lent.left == 0 || lent.panic.is_some() || st.lent_wanted;
        st.lent_bytes += n as u64;
        st.lent = Some(lent);
        drop(st);
        if wake {
            self.shared.cond.notify_all();
        }
        (n > 0).then_some(n)
    }

    /// After bytes were written towards the session: lets the answerer answer what it can on
    /// this thread, then wakes the session if bytes are left for it (not for the start of a
    /// frame the answerer waits to take whole).
    fn settle(&self) {
        let Some(answerer) = self.shared.answerer.get() else {
            return;
        };
        let upgraded = answerer.upgrade();
        let reached = upgraded.is_some();
        let answered = upgraded.map_or(
            Answered {
                calls: 0,
                wake_reader: true,
            },
            |a| a.answer_here(),
        );
        let mut st = self.shared.lock();
        st.answered += answered.calls;
        let wake =
            st.session_waiting && (st.kicked || (answered.wake_reader && st.to_session.len > 0));
        st.last_settle = SettleTrace {
            count: st.last_settle.count + 1,
            calls: answered.calls,
            wake_reader: reached.then_some(answered.wake_reader),
            session_waiting: st.session_waiting,
            to_session: st.to_session.len,
            woke: wake,
        };
        drop(st);
        if wake {
            self.shared.cond.notify_all();
        }
    }

    /// How many frames the answerer answered on this thread since the last call: their replies
    /// wait in the ring towards the device, and no eventfd write announced them.
    pub fn take_answered(&self) -> usize {
        std::mem::take(&mut self.shared.lock().answered)
    }

    /// How many bytes the device thread handed to a lending reader since the last call
    /// ([`DeviceEnd::lend_here`]).
    pub fn take_lent_bytes(&self) -> u64 {
        std::mem::take(&mut self.shared.lock().lent_bytes)
    }

    /// Copies the session's output into rx descriptor memory, outside the state lock.
    fn pop_volatile<B: BitmapSlice>(
        &self,
        dst: &mut VolatileSlice<'_, B>,
    ) -> Result<usize, VolatileMemoryError> {
        let _copy = Shared::copying(&self.shared.device_copy);
        let mut st = self.shared.lock();
        let Some(span) = st.to_device.readable() else {
            if let Some(fill) = st
                .filler
                .take_if(|f| f.left > 0 && !f.broke && f.panic.is_none())
            {
                drop(st);
                return self.fill_here(fill, dst);
            }
            return if st.session_write_closed || st.session_closed {
                Ok(0)
            } else {
                Err(would_block())
            };
        };
        drop(st);
        let [a, b] = span.slices();
        let n1 = a.len().min(dst.len());
        dst.subslice(0, n1)?.copy_from(&a[..n1]);
        let n2 = b.len().min(dst.len() - n1);
        if n2 > 0 {
            dst.subslice(n1, n2)?.copy_from(&b[..n2]);
        }
        let mut st = self.shared.lock();
        st.to_device.consume(&span, n1 + n2);
        // A writer waiting for room is woken once a good part of the ring is free, not for every
        // rx buffer's worth (4 KiB from a Linux guest): one wake-up per burst.
        let wake = st.session_wants_room
            && st.to_device.free() >= st.to_device.cap.div_ceil(ROOM_WAKE_DIVISOR);
        let lease = st.release_large_ring();
        drop(st);
        drop(lease);
        if wake {
            self.shared.cond.notify_all();
        }
        Ok(n1 + n2)
    }
}

impl DeviceEnd {
    /// Lets a session writer waiting in `write_in_place` produce the next bytes of its stream
    /// straight in `dst` (rx descriptor memory; the ring towards the device is empty, so these
    /// bytes come next): no ring in between, no copy on the session thread. The writer is woken
    /// once it has produced all it wanted, its function broke or panicked, or it wants the
    /// function back. The caller holds the device's copy lock.
    fn fill_here<B: BitmapSlice>(
        &self,
        mut fill: LentFill,
        dst: &mut VolatileSlice<'_, B>,
    ) -> Result<usize, VolatileMemoryError> {
        let n = dst.len().min(fill.left);
        let guard = dst.ptr_guard_mut();
        // SAFETY: vm-memory checked that `dst` lies in the guest's mapped memory, which the
        // caller's memory guard keeps mapped for this call, and `n <= dst.len()`. The guest may
        // touch the bytes meanwhile, as during any copy into its memory: the writer's function
        // only writes them (from device memory), and the guest reads them once the buffer is
        // returned.
        let room = unsafe { std::slice::from_raw_parts_mut(guard.as_ptr(), n) };
        // SAFETY: the writer's function is alive and used by no one else: the writer waits in
        // `write_in_place` until it took the `LentFill` back, which it cannot while this thread
        // holds it.
        let to = unsafe { fill.to.as_mut() };
        match catch_unwind(AssertUnwindSafe(|| (to.0)(room))) {
            Ok(ControlFlow::Continue(())) => fill.left -= n,
            Ok(ControlFlow::Break(())) => fill.broke = true,
            Err(panic) => fill.panic = Some(panic),
        }
        let produced = if fill.broke || fill.panic.is_some() {
            0
        } else {
            n
        };
        dst.bitmap().mark_dirty(0, produced);
        if produced > 0 {
            self.shared
                .filled_bytes
                .fetch_add(produced as u64, Ordering::Relaxed);
        }
        let mut st = self.shared.lock();
        let wake = fill.left == 0 || fill.broke || fill.panic.is_some() || st.filler_wanted;
        st.filler = Some(fill);
        drop(st);
        if wake {
            self.shared.cond.notify_all();
        }
        if produced == 0 {
            // The writer shuts the stream for writing once it has its function back.
            return Err(would_block());
        }
        Ok(produced)
    }

    /// How many bytes lent writers produced straight in rx descriptor memory since the last
    /// call ([`DeviceEnd::fill_here`]).
    pub fn take_filled_bytes(&self) -> u64 {
        // Asked for every rx packet: a load, and a swap only when there is something to take.
        match self.shared.filled_bytes.load(Ordering::Relaxed) {
            0 => 0,
            _ => self.shared.filled_bytes.swap(0, Ordering::Relaxed),
        }
    }
}

impl WriteVolatile for &DeviceEnd {
    fn write_volatile<B: BitmapSlice>(
        &mut self,
        buf: &VolatileSlice<B>,
    ) -> Result<usize, VolatileMemoryError> {
        self.push_volatile(buf)
    }
}

impl ReadVolatile for &DeviceEnd {
    fn read_volatile<B: BitmapSlice>(
        &mut self,
        buf: &mut VolatileSlice<B>,
    ) -> Result<usize, VolatileMemoryError> {
        self.pop_volatile(buf)
    }
}

impl Write for &DeviceEnd {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(n) = self.lend_here(buf) {
            return Ok(n);
        }
        self.push_with(buf.len(), |e| e, |span| Ok(fill(span, buf)))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What [`SessionEnd::read_runs`] calls with the readable runs: how many bytes it took, and
/// whether it wants more.
type TakeRuns<'a> = dyn FnMut(&[&[u8]]) -> (usize, ControlFlow<()>) + 'a;

/// The session thread's end: blocking reads and writes, like a blocking socket.
#[derive(Debug)]
pub struct SessionEnd {
    shared: Arc<Shared>,
    read_timeout: Mutex<Option<Duration>>,
}

/// Ends an in-process session from another thread (vgpud's session hub when a VM is removed):
/// the session reads end of file and its writes fail, as after `shutdown(Both)` of a socket.
#[derive(Debug, Clone)]
pub struct SessionShutdown {
    shared: Arc<Shared>,
}

impl SessionShutdown {
    /// Shuts the session's end down both ways.
    pub fn shutdown(&self) {
        close_session(&self.shared);
    }

    /// Whether the device end is gone or no longer sends (`POLLRDHUP` of a socket): the probe
    /// a session checks while it waits for its work.
    pub fn peer_gone(&self) -> bool {
        let st = self.shared.lock();
        st.device_closed || st.device_write_closed
    }
}

fn close_session(shared: &Shared) {
    let mut st = shared.lock();
    if st.session_closed {
        return;
    }
    st.session_closed = true;
    let lease = st.release_large_ring();
    drop(st);
    drop(lease);
    shared.cond.notify_all();
    shared.wake_device();
}

impl SessionEnd {
    /// A handle that shuts this end down from elsewhere.
    pub fn shutdown_handle(&self) -> SessionShutdown {
        SessionShutdown {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Reads fail with `WouldBlock` after `timeout` without data (`None`: wait forever), as
    /// `UnixStream::set_read_timeout`.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) {
        *self.read_timeout.lock().unwrap_or_else(|p| p.into_inner()) = timeout;
    }

    /// Whether the device end is gone or no longer sends (`POLLRDHUP` of a socket).
    pub fn peer_gone(&self) -> bool {
        let st = self.shared.lock();
        st.device_closed || st.device_write_closed
    }

    /// Waits for bytes (or the end of the stream) and calls `f` with the readable ones as runs
    /// (one or two non-empty slices, in order), outside the state lock: `f` returns how many of
    /// them it took and whether it wants more. Returns `false` at the end of the stream (no
    /// call), `true` once `f` breaks.
    fn read_runs(&self, f: &mut TakeRuns<'_>) -> io::Result<bool> {
        let deadline = self.deadline();
        let _copy = Shared::copying(&self.shared.session_read);
        let mut st = self.shared.lock();
        loop {
            if st.session_closed {
                return Ok(false);
            }
            if let Some(span) = st.to_session.readable() {
                drop(st);
                let [a, b] = span.slices();
                let both = [a, b];
                let runs = if b.is_empty() { &both[..1] } else { &both[..] };
                let (taken, flow) = f(runs);
                self.consumed(&span, taken);
                if flow.is_break() {
                    return Ok(true);
                }
                st = self.shared.lock();
                continue;
            }
            if st.device_closed || st.device_write_closed {
                return Ok(false);
            }
            st = self.wait(st, deadline, "read")?;
        }
    }

    /// `n` bytes of `span` (readable bytes of the ring towards the session) were read: frees
    /// them, tells the device if it waits for room, and frees a large ring that is done.
    fn consumed(&self, span: &Span, n: usize) {
        let mut st = self.shared.lock();
        st.to_session.consume(span, n);
        let wake = std::mem::take(&mut st.device_wants_room);
        let lease = st.release_large_ring();
        drop(st);
        drop(lease);
        if wake {
            self.shared.wake_device();
        }
    }

    /// When a read that starts now times out.
    fn deadline(&self) -> Option<Instant> {
        self.read_timeout
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| Instant::now() + t)
    }

    /// Lends `to`, which wants `left` more bytes (more than the ring towards the session
    /// holds), to the device thread ([`DeviceEnd::lend_here`]), and waits until the device
    /// thread has given it all of them (those in the ring first), the stream ended or the read
    /// timed out. Returns with the function taken back, the bytes it still wants, and whether the
    /// read timed out. Resumes a panic of the function on the device thread.
    fn lend<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        to: &mut Borrower<'_>,
        left: usize,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, State>, usize, bool) {
        st.lent = Some(LentFn {
            to: NonNull::from(&mut *to).cast::<Borrower<'static>>(),
            left,
            panic: None,
        });
        if std::mem::take(&mut st.device_wants_room) {
            // Guest bytes wait in the device for room in the ring: they may come now.
            self.shared.wake_device();
        }
        let mut timed_out = false;
        let lent = loop {
            let want_back =
                timed_out || st.session_closed || st.device_closed || st.device_write_closed;
            // The ring may hold all the bytes the function wants after all: a copy into it that
            // began before the function was lent was committed since. This thread takes them.
            let in_ring = st.to_session.len;
            // `None`: the device thread is calling the function; it puts it back before long.
            if let Some(l) = st
                .lent
                .take_if(|l| want_back || l.left == 0 || l.panic.is_some() || in_ring >= l.left)
            {
                break l;
            }
            st.lent_wanted = want_back;
            match self.wait(st, deadline.filter(|_| !want_back), "lend") {
                Ok(g) => st = g,
                Err(_) => {
                    st = self.shared.lock();
                    timed_out = true;
                }
            }
        };
        st.lent_wanted = false;
        if let Some(panic) = lent.panic {
            drop(st);
            resume_unwind(panic);
        }
        (st, lent.left, timed_out)
    }

    /// Waits for bytes, a kick or the end of the stream (until `deadline`); `waiter` names the
    /// caller for the wake-up audit.
    fn wait<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        deadline: Option<Instant>,
        waiter: &'static str,
    ) -> io::Result<MutexGuard<'a, State>> {
        let mut st = st;
        st.session_waiting = true;
        st.waiter = waiter;
        st.waiter_tid = THREAD_ID.with(|id| *id);
        let mut st = match deadline {
            None => self.shared.cond.wait(st).unwrap_or_else(|p| p.into_inner()),
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    st.session_waiting = false;
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                self.shared
                    .cond
                    .wait_timeout(st, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
        };
        st.session_waiting = false;
        Ok(st)
    }

    /// Waits for room in the ring towards the device (or its end).
    fn wait_room<'a>(&'a self, st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        let mut st = st;
        st.session_wants_room = true;
        let mut st = self.shared.cond.wait(st).unwrap_or_else(|p| p.into_inner());
        st.session_wants_room = false;
        st
    }

    /// Whether this end may no longer write.
    fn write_closed(st: &State) -> bool {
        st.session_closed || st.session_write_closed || st.device_closed
    }

    /// Lends `f`, which has `left` bytes to produce, to the device thread, which calls it with rx
    /// descriptor memory once the ring towards the device is drained ([`DeviceEnd::fill_here`]),
    /// and waits until it has produced them all, broke or panicked, or the stream ended. Returns
    /// the function taken back.
    fn lend_fill(
        &self,
        mut st: MutexGuard<'_, State>,
        f: &mut Filler<'_>,
        left: usize,
    ) -> LentFill {
        st.filler = Some(LentFill {
            to: NonNull::from(&mut *f).cast::<Filler<'static>>(),
            left,
            broke: false,
            panic: None,
        });
        st.output_wakes_owed += 1;
        drop(st);
        // The device may have found the ring empty and nothing lent: the bytes may go now.
        self.shared.announce_output();
        let mut st = self.shared.lock();
        let lent = loop {
            let want_back = Self::write_closed(&st);
            // `None`: the device thread is calling the function; it puts it back before long.
            if let Some(l) = st
                .filler
                .take_if(|l| want_back || l.left == 0 || l.broke || l.panic.is_some())
            {
                break l;
            }
            st.filler_wanted = want_back;
            st = self.wait_room(st);
        };
        st.filler_wanted = false;
        lent
    }

    /// Produces `left` bytes with `f` in the ring's free room, where no device thread may run
    /// it (no answerer: see [`DeviceEnd::lends`]); returns the bytes it did not produce (more than
    /// none: `f` broke).
    fn fill_ring(&self, f: &mut FillFn<'_>, mut left: usize) -> io::Result<usize> {
        while left > 0 {
            let (n, broke) = self.produce_waiting(left, f)?;
            left -= n;
            if broke {
                break;
            }
        }
        Ok(left)
    }

    /// Waits for room in the ring towards the device (or the end of the stream), has `f` produce
    /// up to `len` bytes in it, and commits them; returns the bytes produced and whether `f`
    /// broke. The caller holds the session's write lock.
    fn produce_waiting(&self, len: usize, f: &mut FillFn<'_>) -> io::Result<(usize, bool)> {
        let mut st = self.shared.lock();
        let span = loop {
            if Self::write_closed(&st) {
                return Err(broken_pipe());
            }
            if let Some(span) = st.to_device.writable() {
                break span;
            }
            st = self.wait_room(st);
        };
        drop(st);
        let (n, broke) = produce(&span, len, f);
        let mut st = self.shared.lock();
        // Whether the device may have found the ring empty: decided at the commit, as it may
        // have drained the ring while the bytes were produced.
        let was_empty = st.to_device.len == 0;
        st.to_device.commit(&span, n);
        st.last_commit = CommitTrace {
            count: st.last_commit.count + 1,
            bytes: n,
            was_empty,
            len_after: st.to_device.len,
        };
        let announce = was_empty && n > 0;
        st.output_wakes_owed += u64::from(announce);
        drop(st);
        if announce {
            self.shared.announce_output();
        }
        Ok((n, broke))
    }

    /// Shuts this end for writing: the device sends what the ring holds, then end of file.
    fn shutdown_write(&self) {
        let mut st = self.shared.lock();
        st.session_write_closed = true;
        let lease = st.release_large_ring();
        drop(st);
        drop(lease);
        self.shared.wake_device();
    }
}

/// How long a test waits for what must happen.
#[cfg(test)]
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(test)]
impl SessionEnd {
    /// Waits for bytes on another thread; the receiver gets `wait_readable`'s answer. Returns
    /// once that thread sleeps.
    pub(crate) fn waiter(self: &Arc<Self>) -> std::sync::mpsc::Receiver<bool> {
        let (tx, rx) = std::sync::mpsc::channel();
        let end = Arc::clone(self);
        std::thread::spawn(move || {
            let _ = tx.send(end.wait_readable().unwrap());
        });
        let deadline = std::time::Instant::now() + PATIENCE;
        while !self.shared.lock().session_waiting {
            assert!(
                std::time::Instant::now() < deadline,
                "the waiter never slept"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        rx
    }

    /// Writes `buf` (which must fit the ring) as a write does, but makes the eventfd write it
    /// owes only when the returned function is called: a writer preempted between the two.
    pub(crate) fn write_announcing_later(&self, buf: &[u8]) -> impl FnOnce() + '_ {
        let mut st = self.shared.lock();
        let span = st.to_device.writable().expect("room in the ring");
        assert_eq!(fill(&span, buf), buf.len(), "the bytes fit");
        let was_empty = st.to_device.len == 0;
        st.to_device.commit(&span, buf.len());
        st.output_wakes_owed += u64::from(was_empty);
        drop(st);
        move || {
            if was_empty {
                self.shared.announce_output();
            }
        }
    }
}

impl WriteInPlace for &SessionEnd {
    fn write_in_place(&mut self, len: usize, f: &mut FillFn<'_>) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let _copy = Shared::copying(&self.shared.session_write);
        let st = self.shared.lock();
        if SessionEnd::write_closed(&st) {
            return Err(broken_pipe());
        }
        let left = if self.shared.answerer.get().is_some() {
            // The device thread may run the session's device calls: it runs `f` itself, with the
            // guest's rx buffers.
            let mut filler = Filler(f);
            let lent = self.lend_fill(st, &mut filler, len);
            if let Some(panic) = lent.panic {
                resume_unwind(panic);
            }
            if !lent.broke && lent.left > 0 {
                return Err(broken_pipe());
            }
            lent.left
        } else {
            drop(st);
            self.fill_ring(f, len)?
        };
        if left > 0 {
            self.shutdown_write();
            return Err(io::Error::other(
                "the writer could not produce the bytes of its frame; the stream is shut",
            ));
        }
        Ok(())
    }
}

impl WriteInPlace for SessionEnd {
    fn write_in_place(&mut self, len: usize, f: &mut FillFn<'_>) -> io::Result<()> {
        (&*self).write_in_place(len, f)
    }
}

impl Read for &SessionEnd {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut n = 0;
        self.read_runs(&mut |runs| {
            n = drain_into(runs, buf);
            (n, ControlFlow::Break(()))
        })?;
        Ok(n)
    }
}

/// Copies the start of `runs` into `dst`; returns the bytes copied.
fn drain_into(runs: &[&[u8]], dst: &mut [u8]) -> usize {
    let mut done = 0;
    for run in runs {
        let n = run.len().min(dst.len() - done);
        dst[done..done + n].copy_from_slice(&run[..n]);
        done += n;
    }
    done
}

/// The most bytes [`ReadInPlace::read_in_place`] lends at once: the room they take is given back
/// to the device when the call returns, so smaller runs let the device refill the ring while the
/// session works on the bytes.
pub const IN_PLACE_RUN: usize = 1 << 20;

impl ReadInPlace for &SessionEnd {
    fn read_in_place(&mut self, len: usize, f: &mut RunFn<'_>) -> io::Result<()> {
        let mut left = len;
        if left == 0 {
            return Ok(());
        }
        let mut to = Borrower::new(f);
        let deadline = self.deadline();
        let _copy = Shared::copying(&self.shared.session_read);
        let mut st = self.shared.lock();
        loop {
            if st.session_closed {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let lends = self.shared.answerer.get().is_some();
            if let Some(span) = st
                .to_session
                .readable()
                .filter(|span| !lends || span.len() >= left)
            {
                drop(st);
                let n = span.len().min(left).min(IN_PLACE_RUN);
                let (runs, count) = span.first(n);
                to.offer(&runs[..count]);
                self.consumed(&span, n);
                left -= n;
                if left == 0 {
                    return Ok(());
                }
                st = self.shared.lock();
                continue;
            }
            if st.device_closed || st.device_write_closed {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            if !lends {
                st = self.wait(st, deadline, "read_in_place")?;
                continue;
            }
            // With more bytes to come than the ring holds, the device thread hands over those
            // it holds, then the rest as they arrive: this thread copies none of them.
            let timed_out;
            (st, left, timed_out) = self.lend(st, &mut to, left, deadline);
            if left == 0 {
                return Ok(());
            }
            if timed_out {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
    }
}

impl ReadInPlace for SessionEnd {
    fn read_in_place(&mut self, len: usize, f: &mut RunFn<'_>) -> io::Result<()> {
        (&*self).read_in_place(len, f)
    }
}

impl Read for SessionEnd {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for &SessionEnd {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let _copy = Shared::copying(&self.shared.session_write);
        let (n, _) = self.produce_waiting(buf.len(), &mut copy_from(buf))?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for SessionEnd {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The session's side of answering on the device thread: the answerer (the broker's session
/// loop) takes whole frames from the ring towards the session while the session thread waits, and
/// writes their replies for the device thread, which called it, to deliver.
impl FrameRing for SessionEnd {
    fn readable(&self) -> usize {
        let st = self.shared.lock();
        if st.session_closed {
            0
        } else {
            st.to_session.len
        }
    }

    fn peek(&self, buf: &mut [u8]) -> usize {
        let _copy = Shared::copying(&self.shared.session_read);
        let st = self.shared.lock();
        let Some(span) = st.to_session.readable().filter(|_| !st.session_closed) else {
            return 0;
        };
        drop(st);
        drain_into(&span.slices(), buf)
    }

    fn consume(&self, n: usize) {
        let _copy = Shared::copying(&self.shared.session_read);
        let st = self.shared.lock();
        let Some(span) = st.to_session.readable() else {
            return;
        };
        drop(st);
        let n = n.min(span.parts[0].1 + span.parts[1].1);
        self.consumed(&span, n);
    }

    fn writable(&self) -> usize {
        self.shared.lock().to_device.free()
    }

    fn write_here(&self, buf: &[u8]) -> io::Result<usize> {
        self.fill_here(buf.len(), &mut copy_from(buf))
    }

    fn fill_here(&self, len: usize, f: &mut FillFn<'_>) -> io::Result<usize> {
        let _copy = Shared::copying(&self.shared.session_write);
        let mut st = self.shared.lock();
        if SessionEnd::write_closed(&st) {
            return Err(broken_pipe());
        }
        let Some(span) = st.to_device.writable() else {
            return Ok(0);
        };
        drop(st);
        let (n, _) = produce(&span, len, f);
        // No eventfd write: the device thread that called the answerer reads the ring itself
        // (`DeviceEnd::take_answered`).
        self.shared.lock().to_device.commit(&span, n);
        Ok(n)
    }

    fn wait_readable(&self) -> io::Result<bool> {
        let mut st = self.shared.lock();
        loop {
            if std::mem::take(&mut st.kicked) {
                return Ok(true);
            }
            if st.session_closed {
                return Ok(false);
            }
            if st.to_session.len > 0 {
                return Ok(true);
            }
            if st.device_closed || st.device_write_closed {
                return Ok(false);
            }
            st = self.wait(st, None, "wait_readable")?;
        }
    }

    fn kick(&self) {
        let mut st = self.shared.lock();
        st.kicked = true;
        let wake = st.session_waiting;
        drop(st);
        if wake {
            self.shared.cond.notify_all();
        }
    }

    fn answer_with(&self, answerer: Weak<dyn AnswerHere>) {
        // Set once per connection: a second answerer is ignored.
        let _ = self.shared.answerer.set(answerer);
    }
}

impl Drop for SessionEnd {
    fn drop(&mut self) {
        close_session(&self.shared);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device_read(d: &DeviceEnd, n: usize) -> io::Result<Vec<u8>> {
        let mut out = vec![0u8; n];
        let mut vs = VolatileSlice::from(&mut out[..]);
        let got = (&*d).read_volatile(&mut vs).map_err(|e| match e {
            VolatileMemoryError::IOError(e) => e,
            o => io::Error::other(o),
        })?;
        out.truncate(got);
        Ok(out)
    }

    fn push(r: &mut Ring, src: &[u8]) -> usize {
        let Some(span) = r.writable() else { return 0 };
        let n = fill(&span, src);
        r.commit(&span, n);
        n
    }

    fn pop(r: &mut Ring, dst: &mut [u8]) -> usize {
        let Some(span) = r.readable() else { return 0 };
        let n = drain_into(&span.slices(), dst);
        r.consume(&span, n);
        n
    }

    #[test]
    fn the_ring_is_bounded_and_wraps() {
        let mut r = Ring::new(8);
        assert_eq!(push(&mut r, b"abcdef"), 6);
        let mut b = [0u8; 4];
        assert_eq!(pop(&mut r, &mut b), 4);
        assert_eq!(&b, b"abcd");
        // 2 bytes left, 6 free; the write wraps around the end.
        assert_eq!(push(&mut r, b"0123456789"), 6);
        assert_eq!(r.free(), 0);
        assert!(r.writable().is_none());
        let mut all = [0u8; 16];
        assert_eq!(pop(&mut r, &mut all), 8);
        assert_eq!(&all[..8], b"ef012345");
        assert!(r.readable().is_none());
    }

    #[test]
    fn a_copy_into_a_replaced_ring_is_dropped() {
        let mut r = Ring::new(8);
        assert_eq!(push(&mut r, b"ab"), 2);
        let write = r.writable().unwrap();
        let read = r.readable().unwrap();
        // The session went away during the copies: the ring is replaced.
        r = Ring::new(8);
        assert_eq!(fill(&write, b"cd"), 2);
        r.commit(&write, 2);
        r.consume(&read, 2);
        assert_eq!((r.len, r.head), (0, 0), "the new ring is untouched");
        // The old memory stayed valid for the copies made meanwhile.
        assert_eq!(drain_into(&read.slices(), &mut [0u8; 2]), 2);
    }

    #[test]
    fn bulk_bytes_are_lent_in_place_through_a_smaller_ring() {
        const TOTAL: usize = 3 * IN_PLACE_RUN + 12_345;
        let (d, s) = pair(256 << 10).unwrap();
        let data: Vec<u8> = (0..TOTAL + 5).map(|i| (i * 7 + i / 4096) as u8).collect();
        let send = data.clone();
        let t = std::thread::spawn(move || {
            let mut off = 0;
            while off < send.len() {
                match (&d).write(&send[off..]) {
                    Ok(n) => off += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                    Err(e) => panic!("{e}"),
                }
            }
            d
        });
        let mut got = Vec::new();
        let mut calls = 0;
        (&s).read_in_place(TOTAL - 100, &mut |runs| {
            calls += 1;
            let n: usize = runs.iter().map(|r| r.len()).sum();
            assert!((1..=IN_PLACE_RUN).contains(&n), "a run of {n} bytes");
            assert!(runs.len() <= 2 && runs.iter().all(|r| !r.is_empty()));
            runs.iter().for_each(|r| got.extend_from_slice(r));
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(got, data[..TOTAL - 100], "in order, nothing lost");
        assert!(
            calls >= 4,
            "the ring is smaller than the bytes: {calls} calls"
        );
        // A consumer that stops early still consumes its bytes: the stream stays in step.
        let mut first = 0;
        (&s).read_in_place(95, &mut |runs| {
            first += runs.iter().map(|r| r.len()).sum::<usize>();
            ControlFlow::Break(())
        })
        .unwrap();
        assert!(first > 0);
        let d = t.join().unwrap();
        let mut rest = [0u8; 16];
        assert_eq!((&s).read(&mut rest).unwrap(), 10);
        assert_eq!(rest[..10], data[TOTAL - 5..]);
        // The stream ends before the bytes: an error, not a short read.
        drop(d);
        let e = (&s)
            .read_in_place(1, &mut |_| ControlFlow::Continue(()))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn both_ends_copy_at_once_and_lose_nothing() {
        // The device pushes while the session drains, through a ring a fraction of the data,
        // with the copies outside the lock: every byte arrives, in order.
        let (d, s) = pair(4096).unwrap();
        let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
        let send = data.clone();
        let t = std::thread::spawn(move || {
            let mut off = 0;
            while off < send.len() {
                let end = (off + 1500).min(send.len());
                match (&d).write(&send[off..end]) {
                    Ok(n) => off += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                    Err(e) => panic!("{e}"),
                }
            }
        });
        let mut got = vec![0u8; data.len()];
        (&s).read_exact(&mut got).unwrap();
        t.join().unwrap();
        assert!(got == data, "the bytes arrived intact and in order");
    }

    #[test]
    fn device_writes_stop_at_the_capacity_and_resume_with_a_wakeup() {
        let (d, s) = pair(16).unwrap();
        assert_eq!((&d).write(&[7u8; 40]).unwrap(), 16);
        assert_eq!(
            (&d).write(&[7u8; 1]).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        d.clear_event();
        let mut buf = [0u8; 10];
        assert_eq!((&s).read(&mut buf).unwrap(), 10);
        // The device was waiting for room: it is woken.
        assert_eq!(d.shared.event.read().unwrap(), 1);
        assert_eq!((&d).write(&[1u8; 40]).unwrap(), 10);
    }

    #[test]
    fn session_output_wakes_the_device_once_per_burst() {
        let (d, s) = pair(64).unwrap();
        (&s).write_all(b"hello").unwrap();
        (&s).write_all(b" world").unwrap();
        assert_eq!(
            d.shared.event.read().unwrap(),
            1,
            "one wake-up for the burst"
        );
        assert_eq!(device_read(&d, 64).unwrap(), b"hello world");
        let e = device_read(&d, 64).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn a_session_writer_larger_than_the_ring_blocks_until_the_device_drains() {
        let (d, s) = pair(1024).unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 13) as u8).collect();
        let want = data.clone();
        let t = std::thread::spawn(move || {
            (&s).write_all(&data).unwrap();
            drop(s);
        });
        let mut got = Vec::new();
        loop {
            match device_read(&d, 700) {
                Ok(b) if b.is_empty() => break,
                Ok(b) => got.extend_from_slice(&b),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        t.join().unwrap();
        assert_eq!(got, want);
    }

    #[test]
    fn a_session_writer_waiting_for_room_is_woken_once_a_quarter_is_free() {
        let (d, s) = pair(64).unwrap();
        let writer = std::thread::spawn(move || (&s).write_all(&[9u8; 200]).unwrap());
        let deadline = Instant::now() + Duration::from_secs(20);
        while !d.shared.lock().session_wants_room {
            assert!(Instant::now() < deadline, "the writer never waited");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(device_read(&d, 8).unwrap().len(), 8);
        std::thread::sleep(Duration::from_millis(30));
        {
            let st = d.shared.lock();
            assert!(st.session_wants_room, "8 bytes free do not wake the writer");
            assert_eq!(st.to_device.len, 56);
        }
        let mut got = 8 + device_read(&d, 8).unwrap().len();
        while got < 200 {
            got += device_read(&d, 64).map_or(0, |b| b.len());
            assert!(Instant::now() < deadline, "the writer never woke");
        }
        writer.join().unwrap();
        assert_eq!(got, 200);
    }

    #[test]
    fn closing_either_end_is_seen_by_the_other() {
        let (d, s) = pair(64).unwrap();
        (&d).write_all(b"tail").unwrap();
        d.shutdown_write();
        assert!(s.peer_gone());
        let mut buf = [0u8; 8];
        assert_eq!((&s).read(&mut buf).unwrap(), 4);
        assert_eq!((&s).read(&mut buf).unwrap(), 0);
        drop(d);
        assert_eq!(
            (&s).write(b"x").unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );

        let (d, s) = pair(64).unwrap();
        let stop = s.shutdown_handle();
        let t = std::thread::spawn(move || {
            let mut buf = [0u8; 8];
            (&s).read(&mut buf).unwrap()
        });
        std::thread::sleep(Duration::from_millis(20));
        stop.shutdown();
        assert_eq!(t.join().unwrap(), 0, "a blocked reader sees end of file");
        assert!(d.peer_gone());
        assert_eq!(
            (&d).write(b"x").unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
        assert_eq!(device_read(&d, 8).unwrap(), b"");
    }

    #[test]
    fn an_enlarged_ring_returns_its_reservation_once_drained_or_dead() {
        let stats = Arc::new(VsockStats::default());
        let lease = |n| RingLease::try_new(&stats, n, 100).unwrap();
        // The device closes with data left: the reservation stays until the session drains it.
        let (d, s) = pair(16).unwrap();
        assert!(d.enlarge(64, 16, lease(80)));
        assert!(
            RingLease::try_new(&stats, 64, 100).is_none(),
            "over the budget"
        );
        assert_eq!((&d).write(&[3u8; 100]).unwrap(), 64);
        assert!(!d.enlarge(80, 16, lease(16)), "only before the first write");
        assert_eq!(stats.snapshot().large_ring_bytes, 80);
        drop(d);
        let mut buf = [0u8; 40];
        assert_eq!((&s).read(&mut buf).unwrap(), 40);
        assert_eq!(stats.snapshot().large_ring_bytes, 80);
        assert_eq!((&s).read(&mut buf).unwrap(), 24);
        assert_eq!(stats.snapshot().large_ring_bytes, 0);
        assert_eq!((&s).read(&mut buf).unwrap(), 0);
        // The session goes away with data unread: returned at once.
        let (d, s) = pair(16).unwrap();
        assert!(d.enlarge(64, 16, lease(80)));
        (&d).write_all(&[1u8; 50]).unwrap();
        drop(s);
        assert_eq!(stats.snapshot().large_ring_bytes, 0);
        assert_eq!(d.to_session_capacity(), DEFAULT_RING_CAPACITY);
        assert_eq!(d.to_device_capacity(), DEFAULT_RING_CAPACITY);
    }

    #[test]
    fn an_enlarged_reply_ring_holds_a_large_reply_and_is_returned_once_delivered() {
        let stats = Arc::new(VsockStats::default());
        let lease = |n| RingLease::try_new(&stats, n, 1000).unwrap();
        let (d, s) = pair(16).unwrap();
        assert!(d.enlarge(64, 256, lease(320)));
        assert_eq!(d.to_device_capacity(), 256);
        // A 200-byte reply goes in at once, no waiting for the device.
        let reply: Vec<u8> = (0..200u8).collect();
        assert_eq!((&s).write(&reply).unwrap(), 200);
        // The session goes away before the device read its reply: the reply is still
        // delivered, and the reservation returned only then.
        drop(s);
        assert_eq!(stats.snapshot().large_ring_bytes, 320);
        assert_eq!(device_read(&d, 120).unwrap(), &reply[..120]);
        assert_eq!(stats.snapshot().large_ring_bytes, 320);
        assert_eq!(device_read(&d, 120).unwrap(), &reply[120..]);
        assert_eq!(stats.snapshot().large_ring_bytes, 0);
        assert_eq!(d.to_device_capacity(), DEFAULT_RING_CAPACITY);
        assert_eq!(device_read(&d, 8).unwrap(), b"");
        // The device goes away with a reply unread: returned at once.
        let (d, s) = pair(16).unwrap();
        assert!(d.enlarge(64, 256, lease(320)));
        (&s).write_all(&reply).unwrap();
        drop(d);
        assert_eq!(stats.snapshot().large_ring_bytes, 0);
        // Neither ring may be enlarged once one was used.
        let (d, s) = pair(16).unwrap();
        (&s).write_all(b"x").unwrap();
        assert!(!d.enlarge(64, 256, lease(320)));
        assert_eq!(stats.snapshot().large_ring_bytes, 0);
    }

    #[test]
    fn the_read_timeout_gives_would_block() {
        let (_d, s) = pair(64).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(10)));
        let mut buf = [0u8; 4];
        assert_eq!(
            (&s).read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
    }
    /// A toy answerer: frames are 4 bytes; it answers those not starting with `THEIRS` by
    /// writing them back reversed, on the thread that calls it.
    struct Reverser {
        end: Arc<SessionEnd>,
        threads: Mutex<Vec<std::thread::ThreadId>>,
    }

    const THEIRS: u8 = 0xff;

    impl AnswerHere for Reverser {
        fn answer_here(&self) -> Answered {
            let mut calls = 0;
            loop {
                let mut f = [0u8; 4];
                if self.end.peek(&mut f) < f.len() {
                    return Answered {
                        calls,
                        wake_reader: false,
                    };
                }
                if f[0] == THEIRS {
                    return Answered {
                        calls,
                        wake_reader: true,
                    };
                }
                self.end.consume(f.len());
                f.reverse();
                assert_eq!(self.end.write_here(&f).unwrap(), f.len());
                self.threads
                    .lock()
                    .unwrap()
                    .push(std::thread::current().id());
                calls += 1;
            }
        }
    }

    const QUIET: Duration = Duration::from_millis(50);

    #[test]
    fn an_answerer_takes_whole_frames_on_the_device_thread() {
        let (d, s) = pair(64).unwrap();
        let s = Arc::new(s);
        let answerer = Arc::new(Reverser {
            end: Arc::clone(&s),
            threads: Mutex::new(Vec::new()),
        });
        let weak: Arc<dyn AnswerHere> = answerer.clone();
        s.answer_with(Arc::downgrade(&weak));
        let woken = s.waiter();
        // Half a frame: the answerer waits for the rest, the session is not woken.
        (&d).write_all(&[1, 2]).unwrap();
        assert_eq!(d.take_answered(), 0);
        assert!(woken.recv_timeout(QUIET).is_err(), "woken for half a frame");
        // The rest, and a second whole frame: both answered here, the replies readable at once
        // with no eventfd write, the session still asleep.
        (&d).write_all(&[3, 4, 5, 6, 7, 8]).unwrap();
        assert_eq!(d.take_answered(), 2);
        assert_eq!(d.take_answered(), 0, "counted once");
        assert_eq!(
            d.shared.event.read().unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        assert_eq!(device_read(&d, 64).unwrap(), [4, 3, 2, 1, 8, 7, 6, 5]);
        assert_eq!(
            *answerer.threads.lock().unwrap(),
            vec![std::thread::current().id(); 2]
        );
        assert!(
            woken.recv_timeout(QUIET).is_err(),
            "woken with nothing to read"
        );
        assert_eq!(s.readable(), 0);
        // A frame the answerer leaves: the session is woken and reads it.
        (&d).write_all(&[THEIRS, 1, 2, 3]).unwrap();
        assert_eq!(woken.recv_timeout(PATIENCE), Ok(true));
        assert_eq!(d.take_answered(), 0);
        let mut buf = [0u8; 4];
        (&*s).read_exact(&mut buf).unwrap();
        assert_eq!(buf, [THEIRS, 1, 2, 3]);
        // The end of the stream with nothing left to read.
        drop(d);
        assert!(!s.wait_readable().unwrap());
    }

    #[test]
    fn a_kick_wakes_a_waiting_reader_and_is_taken_once() {
        let (_d, s) = pair(64).unwrap();
        let s = Arc::new(s);
        let woken = s.waiter();
        s.kick();
        assert_eq!(woken.recv_timeout(PATIENCE), Ok(true));
        let again = s.waiter();
        assert!(
            again.recv_timeout(QUIET).is_err(),
            "the kick was taken twice"
        );
        s.kick();
        assert_eq!(again.recv_timeout(PATIENCE), Ok(true));
    }

    /// The audit sees each ring's bytes, the front of the session's, and whether a wake-up is
    /// on its way (an unread eventfd write) or nobody announced the bytes.
    #[test]
    fn the_audit_shows_the_rings_and_pending_wake_ups() {
        let (d, s) = pair(64).unwrap();
        let a = d.audit();
        assert_eq!((a.to_session, a.to_device, a.event_pending), (0, 0, false));
        assert!(!a.has_output());
        (&d).write_all(b"hello").unwrap();
        (&s).write_all(b"reply").unwrap();
        let a = d.audit();
        assert_eq!((a.to_session, a.to_session_free, a.to_device), (5, 59, 5));
        assert_eq!(&a.front[..6], b"hello\0");
        assert!(a.has_output() && a.event_pending, "{a:?}");
        let commit = CommitTrace {
            count: 1,
            bytes: 5,
            was_empty: true,
            len_after: 5,
        };
        assert_eq!(a.last_commit, commit);
        assert_eq!(
            (a.wake_in_flight, a.output_wakes_owed, a.wake_failures),
            (false, 1, 0)
        );
        d.clear_event();
        assert!(!d.audit().event_pending, "the device took the wake-up");
        assert_eq!(s.write_here(b"!").unwrap(), 1);
        let a = d.audit();
        assert_eq!(
            (
                a.to_device,
                a.event_pending,
                a.wake_in_flight,
                a.last_commit
            ),
            (6, false, false, commit),
            "nobody announced it, and nobody owes it"
        );
        assert!(
            a.waiter_where().starts_with("state ?"),
            "no session waited yet: {}",
            a.waiter_where()
        );
        assert_eq!(device_read(&d, 6).unwrap(), b"reply!");
        let announce = s.write_announcing_later(b"late");
        let a = d.audit();
        assert_eq!((a.to_device, a.event_pending), (4, false));
        assert!(a.wake_in_flight, "committed, the eventfd write still owed");
        announce();
        let a = d.audit();
        assert!(a.event_pending && !a.wake_in_flight, "{a:?}");
        drop(s);
        assert!(d.audit().ending);
    }

    #[test]
    fn write_here_never_waits_and_peek_does_not_consume() {
        let (d, s) = pair(8).unwrap();
        assert_eq!(s.writable(), 8);
        assert_eq!(s.write_here(&[9u8; 12]).unwrap(), 8);
        assert_eq!(
            s.write_here(&[9u8; 1]).unwrap(),
            0,
            "a full ring takes nothing"
        );
        assert_eq!(s.writable(), 0);
        (&d).write_all(&[1, 2, 3]).unwrap();
        let mut two = [0u8; 2];
        assert_eq!(s.peek(&mut two), 2);
        assert_eq!(s.peek(&mut two), 2);
        assert_eq!((two, s.readable()), ([1, 2], 3));
        s.consume(2);
        assert_eq!(s.readable(), 1);
        s.consume(5);
        assert_eq!(s.readable(), 0, "consumes at most what is readable");
        drop(d);
        assert_eq!(
            s.write_here(&[1]).unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
    }

    /// An answerer that answers nothing: with it registered, a waiting reader lends.
    struct Declines;

    impl AnswerHere for Declines {
        fn answer_here(&self) -> Answered {
            Answered {
                calls: 0,
                wake_reader: true,
            }
        }
    }

    /// A session end with an answerer registered, and the answerer to keep alive.
    fn lending_pair(capacity: usize) -> (DeviceEnd, Arc<SessionEnd>, Arc<dyn AnswerHere>) {
        let (d, s) = pair(capacity).unwrap();
        let answerer: Arc<dyn AnswerHere> = Arc::new(Declines);
        s.answer_with(Arc::downgrade(&answerer));
        (d, Arc::new(s), answerer)
    }

    /// Waits until the session lends its function.
    fn until_lent(d: &DeviceEnd) {
        until(d, "the reader never lent", |st| st.lent.is_some());
    }

    /// Waits until `done` holds of the connection's state; fails saying `what` after 20 s.
    fn until(d: &DeviceEnd, what: &str, done: impl Fn(&State) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done(&d.shared.lock()) {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Joins a thread that must have panicked with `message`.
    fn assert_panicked_with<T: std::fmt::Debug>(t: std::thread::JoinHandle<T>, message: &str) {
        let e = t.join().unwrap_err();
        assert_eq!(e.downcast_ref::<&str>(), Some(&message));
    }

    /// Reads `len` bytes in place on another thread; gives them back with the calls made.
    fn read_lent(
        s: &Arc<SessionEnd>,
        len: usize,
    ) -> std::thread::JoinHandle<(io::Result<()>, Vec<u8>, Vec<std::thread::ThreadId>)> {
        let s = Arc::clone(s);
        std::thread::spawn(move || {
            let (mut got, mut threads) = (Vec::new(), Vec::new());
            let r = (&*s).read_in_place(len, &mut |runs| {
                threads.push(std::thread::current().id());
                for run in runs {
                    got.extend_from_slice(run);
                }
                ControlFlow::Continue(())
            });
            (r, got, threads)
        })
    }

    #[test]
    fn bytes_go_from_the_device_thread_straight_to_a_lending_reader() {
        const TOTAL: usize = 1 << 20;
        const PIECE: usize = 64 << 10;
        let data: Vec<u8> = (0..TOTAL + 10).map(|i| (i % 251) as u8).collect();
        // A 4 KiB ring: a 64 KiB write that went through it would be cut to 4 KiB.
        let (d, s, _a) = lending_pair(4096);
        (&d).write_all(&data[..100]).unwrap();
        let reader = read_lent(&s, TOTAL);
        let mut at = 100;
        while at < TOTAL {
            let end = (at + PIECE).min(data.len());
            until_lent(&d);
            let n = (&d).write(&data[at..end]).unwrap();
            assert_eq!(
                n,
                end.min(TOTAL) - at,
                "the reader takes what it asked for, no more"
            );
            at += n;
        }
        // The bytes past the read go to the ring, for the next read.
        (&d).write_all(&data[TOTAL..]).unwrap();
        let (r, got, threads) = reader.join().unwrap();
        r.unwrap();
        assert!(got == data[..TOTAL], "the bytes arrive whole and in order");
        let here = std::thread::current().id();
        assert!(
            threads.iter().all(|t| *t == here),
            "the reader copied nothing itself"
        );
        assert_eq!(
            threads.len(),
            TOTAL.div_ceil(PIECE) + 1,
            "one call per write, and one for the bytes the ring held"
        );
        let mut rest = [0u8; 16];
        assert_eq!((&*s).read(&mut rest).unwrap(), 10);
        assert_eq!(rest[..10], data[TOTAL..]);
    }

    #[test]
    fn a_full_ring_goes_to_a_lending_reader_first_and_the_device_is_told() {
        let data: Vec<u8> = (0..200u8).collect();
        let (d, s, _a) = lending_pair(64);
        assert_eq!((&d).write(&data).unwrap(), 64);
        assert_eq!(
            (&d).write(&data[64..]).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        d.clear_event();
        let reader = read_lent(&s, 200);
        until_lent(&d);
        assert!(
            d.shared.event.read().is_ok(),
            "the device waiting for room is woken to hand over the rest"
        );
        assert_eq!((&d).write(&data[64..]).unwrap(), 136);
        let (r, got, threads) = reader.join().unwrap();
        r.unwrap();
        assert_eq!(got, data);
        assert_eq!(threads, [std::thread::current().id(); 2]);
        assert_eq!(d.shared.lock().to_session.len, 0);
    }

    #[test]
    fn bytes_committed_to_the_ring_after_the_reader_lent_are_read_by_the_reader() {
        let (d, s, _a) = lending_pair(4096);
        let d = Arc::new(d);
        // A device copy into the ring that began before the reader lent, committed after.
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let writer = {
            let d = Arc::clone(&d);
            std::thread::spawn(move || {
                d.push_with(
                    100,
                    |e| e,
                    |span| {
                        wait.recv().unwrap();
                        Ok(fill(span, &[4u8; 100]))
                    },
                )
            })
        };
        let reader = read_lent(&s, 100);
        until_lent(&d);
        go.send(()).unwrap();
        assert_eq!(writer.join().unwrap().unwrap(), 100);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !reader.is_finished() {
            assert!(
                Instant::now() < deadline,
                "the reader waits for bytes the ring holds"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let (r, got, threads) = reader.join().unwrap();
        r.unwrap();
        assert_eq!(got, [4u8; 100]);
        assert_ne!(threads[0], std::thread::current().id());
    }

    #[test]
    fn a_lending_reader_that_times_out_or_is_closed_takes_its_function_back() {
        let (d, s, _a) = lending_pair(4096);
        s.set_read_timeout(Some(Duration::from_millis(30)));
        let (r, got, _) = read_lent(&s, 100).join().unwrap();
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::WouldBlock);
        assert!(got.is_empty());
        assert!(d.shared.lock().lent.is_none(), "taken back");
        assert_eq!((&d).write(b"abc").unwrap(), 3);
        assert_eq!(
            d.shared.lock().to_session.len,
            3,
            "with no reader waiting, bytes go to the ring"
        );

        // Half the bytes given on the device thread, then the device end goes away.
        let (d, s, _a) = lending_pair(4096);
        let reader = read_lent(&s, 100);
        until_lent(&d);
        assert_eq!((&d).write(&[7u8; 50]).unwrap(), 50);
        drop(d);
        let (r, got, _) = reader.join().unwrap();
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(got, [7u8; 50]);

        // The session is shut down by another thread while it lends.
        let (d, s, _a) = lending_pair(4096);
        let reader = read_lent(&s, 100);
        until_lent(&d);
        s.shutdown_handle().shutdown();
        assert_eq!(
            reader.join().unwrap().0.unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert_eq!(
            (&d).write(b"x").unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
    }

    #[test]
    fn a_panic_of_the_lent_function_on_the_device_thread_reaches_the_reader() {
        let (d, s, _a) = lending_pair(4096);
        let s2 = Arc::clone(&s);
        let reader = std::thread::spawn(move || {
            (&*s2).read_in_place(100, &mut |_| panic!("the reader's function failed"))
        });
        until_lent(&d);
        assert_eq!(
            (&d).write(&[1u8; 40]).unwrap(),
            40,
            "the device thread goes on"
        );
        assert_panicked_with(reader, "the reader's function failed");
        assert!(d.shared.lock().lent.is_none());
    }

    #[test]
    fn without_an_answerer_nothing_is_lent() {
        let (d, s) = pair(4096).unwrap();
        let s = Arc::new(s);
        let reader = read_lent(&s, 100);
        std::thread::sleep(Duration::from_millis(20));
        assert!(d.shared.lock().lent.is_none());
        (&d).write_all(&[2u8; 100]).unwrap();
        let (r, got, threads) = reader.join().unwrap();
        r.unwrap();
        assert_eq!(got, [2u8; 100]);
        assert!(!threads.contains(&std::thread::current().id()));
    }

    /// Byte `i` of the test pattern the writers below produce.
    fn pattern_byte(i: usize) -> u8 {
        (i % 253) as u8
    }

    /// Produces `len` bytes of the pattern in place on another thread, breaking (once) after
    /// `break_at` bytes if given; gives back the result and the threads the function ran on.
    fn write_filled(
        s: &Arc<SessionEnd>,
        len: usize,
        break_at: Option<usize>,
    ) -> std::thread::JoinHandle<(io::Result<()>, Vec<std::thread::ThreadId>)> {
        let s = Arc::clone(s);
        std::thread::spawn(move || {
            let (mut at, mut threads) = (0, Vec::new());
            let r = (&*s).write_in_place(len, &mut |room| {
                threads.push(std::thread::current().id());
                if break_at.is_some_and(|b| at + room.len() > b) {
                    return ControlFlow::Break(());
                }
                for b in room.iter_mut() {
                    *b = pattern_byte(at);
                    at += 1;
                }
                ControlFlow::Continue(())
            });
            (r, threads)
        })
    }

    /// Waits until the session lends its writing function.
    fn until_filler(d: &DeviceEnd) {
        until(d, "the writer never lent", |st| st.filler.is_some());
    }

    /// Reads from the device end in rx-buffer-sized pieces until `want` bytes came or it
    /// would block for long; returns what came and how the last read ended.
    fn device_read_all(d: &DeviceEnd, want: usize) -> (Vec<u8>, io::Result<usize>) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut got = Vec::new();
        loop {
            match device_read(d, RX_PIECE.min(want.saturating_sub(got.len()).max(1))) {
                Ok(piece) if piece.is_empty() => return (got, Ok(0)),
                Ok(piece) if got.len() + piece.len() >= want => {
                    let n = piece.len();
                    got.extend(piece);
                    return (got, Ok(n));
                }
                Ok(piece) => got.extend(piece),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return (got, Err(e)),
            }
        }
    }

    /// A Linux guest's rx buffer payload.
    const RX_PIECE: usize = 4096;

    #[test]
    fn a_writer_fills_rx_memory_on_the_device_thread_after_what_the_ring_holds() {
        const TOTAL: usize = 1 << 20;
        // A 4 KiB ring: the bytes cannot have gone through it.
        let (d, s, _a) = lending_pair(4096);
        (&*s).write_all(b"header").unwrap();
        let writer = write_filled(&s, TOTAL, None);
        until_filler(&d);
        let (got, last) = device_read_all(&d, 6 + TOTAL);
        last.unwrap();
        let (r, threads) = writer.join().unwrap();
        r.unwrap();
        assert_eq!(&got[..6], b"header", "the ring's bytes go first");
        assert!(
            got[6..]
                .iter()
                .enumerate()
                .all(|(i, b)| *b == pattern_byte(i)),
            "the bytes arrive whole and in order"
        );
        assert_eq!(got.len(), 6 + TOTAL);
        let here = std::thread::current().id();
        assert!(
            threads.iter().all(|t| *t == here),
            "the writer produced nothing on its own thread"
        );
        assert_eq!(d.take_filled_bytes(), TOTAL as u64);
        assert!(d.shared.lock().filler.is_none(), "taken back");
        // The stream goes on: the next bytes go through the ring.
        (&*s).write_all(b"next").unwrap();
        assert_eq!(device_read(&d, 16).unwrap(), b"next");
    }

    #[test]
    fn a_writer_whose_function_breaks_cuts_the_stream() {
        for lending in [true, false] {
            let (d, s, _a) = if lending {
                lending_pair(4096)
            } else {
                let (d, s) = pair(4096).unwrap();
                let keep: Arc<dyn AnswerHere> = Arc::new(Declines);
                (d, Arc::new(s), keep)
            };
            (&*s).write_all(b"header").unwrap();
            let writer = write_filled(&s, 1 << 20, Some(3 * RX_PIECE));
            let (got, last) = device_read_all(&d, 1 << 20);
            let (r, _) = writer.join().unwrap();
            assert_eq!(
                r.unwrap_err().kind(),
                io::ErrorKind::Other,
                "lending: {lending}"
            );
            assert_eq!(
                last.unwrap(),
                0,
                "the device reads end of file (lending: {lending})"
            );
            assert_eq!(&got[..6], b"header");
            assert!(
                got.len() - 6 <= 3 * RX_PIECE,
                "none of the bytes the function did not produce are sent (lending: {lending})"
            );
            assert!(
                got[6..]
                    .iter()
                    .enumerate()
                    .all(|(i, b)| *b == pattern_byte(i))
            );
            assert_eq!(
                (&*s).write(b"x").unwrap_err().kind(),
                io::ErrorKind::BrokenPipe,
                "the stream is shut for writing"
            );
        }
    }

    #[test]
    fn a_lending_writer_takes_its_function_back_when_the_stream_ends() {
        // The device end goes away after part of the bytes.
        let (d, s, _a) = lending_pair(4096);
        let writer = write_filled(&s, 1 << 20, None);
        until_filler(&d);
        assert_eq!(device_read(&d, RX_PIECE).unwrap().len(), RX_PIECE);
        drop(d);
        assert_eq!(
            writer.join().unwrap().0.unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );

        // The session is shut down by another thread while it lends.
        let (d, s, _a) = lending_pair(4096);
        let writer = write_filled(&s, 1 << 20, None);
        until_filler(&d);
        s.shutdown_handle().shutdown();
        assert_eq!(
            writer.join().unwrap().0.unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
        assert!(d.shared.lock().filler.is_none(), "taken back");
        assert_eq!(device_read(&d, 16).unwrap(), b"", "end of file");
    }

    #[test]
    fn a_panic_of_the_lent_writer_on_the_device_thread_reaches_the_writer() {
        let (d, s, _a) = lending_pair(4096);
        let s2 = Arc::clone(&s);
        let writer = std::thread::spawn(move || {
            (&*s2).write_in_place(100, &mut |_| panic!("the writer's function failed"))
        });
        until_filler(&d);
        assert_eq!(
            device_read(&d, 100).unwrap_err().kind(),
            io::ErrorKind::WouldBlock,
            "the device thread goes on"
        );
        assert_panicked_with(writer, "the writer's function failed");
        assert!(d.shared.lock().filler.is_none());
    }

    #[test]
    fn without_an_answerer_a_writer_fills_the_ring_itself() {
        const TOTAL: usize = 64 << 10;
        let (d, s) = pair(4096).unwrap();
        let s = Arc::new(s);
        let writer = write_filled(&s, TOTAL, None);
        let (got, last) = device_read_all(&d, TOTAL);
        last.unwrap();
        let (r, threads) = writer.join().unwrap();
        r.unwrap();
        assert!(got.len() == TOTAL && got.iter().enumerate().all(|(i, b)| *b == pattern_byte(i)));
        assert!(d.shared.lock().filler.is_none(), "nothing was lent");
        assert!(!threads.contains(&std::thread::current().id()));
        assert_eq!(d.take_filled_bytes(), 0);
    }

    #[test]
    fn an_answerer_fills_the_ring_room_without_waiting() {
        let (d, s) = pair(64).unwrap();
        (&s).write_all(b"0123456789").unwrap();
        let mut at = 0;
        let mut pattern = |room: &mut [u8]| {
            for b in room.iter_mut() {
                *b = pattern_byte(at);
                at += 1;
            }
            ControlFlow::Continue(())
        };
        assert_eq!(
            s.fill_here(100, &mut pattern).unwrap(),
            54,
            "no more than the room"
        );
        assert_eq!(
            s.fill_here(100, &mut pattern).unwrap(),
            0,
            "the ring is full"
        );
        let got = device_read(&d, 64).unwrap();
        assert_eq!(&got[..10], b"0123456789");
        assert!(
            got[10..]
                .iter()
                .enumerate()
                .all(|(i, b)| *b == pattern_byte(i))
        );
        // Across the ring's end, up to `len`, and not past a break.
        assert_eq!(s.fill_here(40, &mut pattern).unwrap(), 40);
        let mut calls = 0;
        assert_eq!(
            s.fill_here(20, &mut |_| {
                calls += 1;
                ControlFlow::Break(())
            })
            .unwrap(),
            0
        );
        assert_eq!(calls, 1);
        let got = device_read(&d, 64).unwrap();
        assert!(
            got.len() == 40
                && got
                    .iter()
                    .enumerate()
                    .all(|(i, b)| *b == pattern_byte(54 + i))
        );
        drop(d);
        assert_eq!(
            s.fill_here(1, &mut pattern).unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
    }
}
