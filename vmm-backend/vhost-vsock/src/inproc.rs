//! In-process endpoints: a port served inside vgpud talks to the device thread through two
//! bounded byte rings in shared memory instead of a `UnixStream::pair()`.
//!
//! The device thread copies guest payload straight from descriptor memory into the ring towards
//! the session, and copies the session's output straight from its ring into rx descriptors: no
//! system call and no kernel copy per packet. The device side never blocks (a full or empty ring
//! is `WouldBlock`, like a nonblocking socket); the session side blocks on a condition variable.
//!
//! Wake-ups are sent on transitions only: the device thread's epoll watches an eventfd that the
//! session writes when its ring towards the device goes from empty to non-empty, when it frees
//! room the device was waiting for, and when it closes; the session is woken only while it waits.
//! So a burst of packets costs one wake-up, not one per packet.
//!
//! The device may enlarge the ring towards the session before its first write
//! ([`DeviceEnd::enlarge_to_session`], with a reservation of its per-VM budget); the large ring's
//! memory is freed and the reservation returned as soon as its data is dead or delivered: the
//! session end is closed, or the device end is closed (or shut for writing) and the ring is
//! drained.
//!
//! Closing behaves like a socket pair: dropping (or shutting down) one end makes the other read
//! end of file once the ring is drained, and writes to a closed peer fail with `BrokenPipe`.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vgpu_hugemem::HugeMapping;
use vm_memory::bitmap::BitmapSlice;
use vm_memory::{ReadVolatile, VolatileMemoryError, VolatileSlice, WriteVolatile};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::VsockStats;

/// Default capacity of each ring of an in-process connection (the socket buffer size a
/// `UnixStream::pair()` has by default is about the same).
pub const DEFAULT_RING_CAPACITY: usize = 256 * 1024;

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

/// A ring's memory: none yet, a heap block, or a mapping of its own.
#[derive(Debug, Default)]
enum RingMem {
    #[default]
    None,
    Heap(Box<[u8]>),
    Mapped(HugeMapping),
}

impl RingMem {
    /// `cap` zeroed bytes, mapped for large rings (on the heap where mapping fails).
    fn new(cap: usize) -> Self {
        if cap >= MAPPED_RING_BYTES
            && let Ok(m) = HugeMapping::new(cap)
        {
            return RingMem::Mapped(m);
        }
        RingMem::Heap(vec![0u8; cap].into_boxed_slice())
    }
}

impl std::ops::Deref for RingMem {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            RingMem::None => &[],
            RingMem::Heap(b) => b,
            RingMem::Mapped(m) => m,
        }
    }
}

impl std::ops::DerefMut for RingMem {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            RingMem::None => &mut [],
            RingMem::Heap(b) => b,
            RingMem::Mapped(m) => m,
        }
    }
}

/// A bounded byte ring; its memory is allocated on the first write.
#[derive(Debug)]
struct Ring {
    buf: RingMem,
    cap: usize,
    head: usize,
    len: usize,
}

impl Ring {
    fn new(cap: usize) -> Self {
        Ring {
            buf: RingMem::None,
            cap: cap.max(1),
            head: 0,
            len: 0,
        }
    }

    fn free(&self) -> usize {
        self.cap - self.len
    }

    /// The readable bytes as up to two slices.
    fn readable(&self) -> (&[u8], &[u8]) {
        if self.len == 0 {
            return (&[], &[]);
        }
        let end = self.head + self.len;
        if end <= self.cap {
            (&self.buf[self.head..end], &[])
        } else {
            (&self.buf[self.head..], &self.buf[..end - self.cap])
        }
    }

    /// The free room as up to two slices (allocates the ring on first use).
    fn writable(&mut self) -> (&mut [u8], &mut [u8]) {
        if self.buf.is_empty() {
            self.buf = RingMem::new(self.cap);
        }
        let tail = (self.head + self.len) % self.cap;
        let free = self.free();
        if tail + free <= self.cap {
            (&mut self.buf[tail..tail + free], &mut [])
        } else {
            let (front, back) = self.buf.split_at_mut(tail);
            (back, &mut front[..free - (self.cap - tail)])
        }
    }

    fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.len);
        self.head = (self.head + n) % self.cap;
        self.len -= n;
        if self.len == 0 {
            self.head = 0;
        }
    }

    fn commit(&mut self, n: usize) {
        debug_assert!(n <= self.free());
        self.len += n;
    }

    /// Copies out up to `dst.len()` bytes.
    fn pop_into(&mut self, dst: &mut [u8]) -> usize {
        let (a, b) = self.readable();
        let n1 = a.len().min(dst.len());
        dst[..n1].copy_from_slice(&a[..n1]);
        let n2 = b.len().min(dst.len() - n1);
        dst[n1..n1 + n2].copy_from_slice(&b[..n2]);
        self.consume(n1 + n2);
        n1 + n2
    }

    /// Copies in as much of `src` as fits.
    fn push_from(&mut self, src: &[u8]) -> usize {
        let (a, b) = self.writable();
        let n1 = a.len().min(src.len());
        a[..n1].copy_from_slice(&src[..n1]);
        let n2 = b.len().min(src.len() - n1);
        b[..n2].copy_from_slice(&src[n1..n1 + n2]);
        self.commit(n1 + n2);
        n1 + n2
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
    /// The session sleeps on the condition variable.
    session_waiting: bool,
    /// The device found `to_session` full and waits for room (an eventfd write is owed).
    device_wants_room: bool,
    /// The budget reservation of an enlarged `to_session` ring.
    lease: Option<RingLease>,
}

impl State {
    /// Frees an enlarged `to_session` ring once its data is dead (the session is gone) or
    /// delivered (the device no longer writes and the ring is drained); the caller drops the
    /// returned reservation after unlocking.
    #[must_use]
    fn release_large_ring(&mut self) -> Option<RingLease> {
        self.lease.as_ref()?;
        let device_done = self.device_closed || self.device_write_closed;
        if self.session_closed || (device_done && self.to_session.len == 0) {
            self.to_session = Ring::new(DEFAULT_RING_CAPACITY);
            return self.lease.take();
        }
        None
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the session thread.
    cond: Condvar,
    /// Wakes the device thread (registered in its epoll).
    event: EventFd,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wake_device(&self) {
        // A full counter (never reached: the device drains it on every event) only means a
        // wake-up is already pending.
        let _ = self.event.write(1);
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
            device_wants_room: false,
            lease: None,
        }),
        cond: Condvar::new(),
        event: EventFd::new(EFD_NONBLOCK)?,
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

    /// Gives the ring towards the session `capacity` bytes, holding `lease` until the ring is
    /// freed. Only before the device's first write; returns whether it took effect (otherwise
    /// the lease is returned at once).
    pub(crate) fn enlarge_to_session(&self, capacity: usize, lease: RingLease) -> bool {
        let mut st = self.shared.lock();
        let untouched = st.to_session.buf.is_empty() && st.to_session.len == 0;
        if !untouched || st.session_closed || st.lease.is_some() {
            return false;
        }
        st.to_session = Ring::new(capacity);
        st.lease = Some(lease);
        true
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
    fn push_volatile<B: BitmapSlice>(
        &self,
        src: &VolatileSlice<'_, B>,
    ) -> Result<usize, VolatileMemoryError> {
        let mut st = self.shared.lock();
        if st.session_closed {
            return Err(VolatileMemoryError::IOError(broken_pipe()));
        }
        if st.to_session.free() == 0 {
            st.device_wants_room = true;
            return Err(would_block());
        }
        let (a, b) = st.to_session.writable();
        let n1 = a.len().min(src.len());
        let s1 = src.subslice(0, n1)?;
        s1.copy_to(&mut a[..n1]);
        let n2 = b.len().min(src.len() - n1);
        if n2 > 0 {
            src.subslice(n1, n2)?.copy_to(&mut b[..n2]);
        }
        st.to_session.commit(n1 + n2);
        let wake = st.session_waiting;
        drop(st);
        if wake {
            self.shared.cond.notify_all();
        }
        Ok(n1 + n2)
    }

    fn pop_volatile<B: BitmapSlice>(
        &self,
        dst: &mut VolatileSlice<'_, B>,
    ) -> Result<usize, VolatileMemoryError> {
        let mut st = self.shared.lock();
        if st.to_device.len == 0 {
            return if st.session_write_closed || st.session_closed {
                Ok(0)
            } else {
                Err(would_block())
            };
        }
        let (a, b) = st.to_device.readable();
        let n1 = a.len().min(dst.len());
        dst.subslice(0, n1)?.copy_from(&a[..n1]);
        let n2 = b.len().min(dst.len() - n1);
        if n2 > 0 {
            dst.subslice(n1, n2)?.copy_from(&b[..n2]);
        }
        st.to_device.consume(n1 + n2);
        let wake = st.session_waiting;
        drop(st);
        if wake {
            self.shared.cond.notify_all();
        }
        Ok(n1 + n2)
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
        let mut st = self.shared.lock();
        if st.session_closed {
            return Err(broken_pipe());
        }
        let n = st.to_session.push_from(buf);
        if n == 0 && !buf.is_empty() {
            st.device_wants_room = true;
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let wake = st.session_waiting;
        drop(st);
        if wake {
            self.shared.cond.notify_all();
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

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

    fn wait<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        deadline: Option<Instant>,
    ) -> io::Result<MutexGuard<'a, State>> {
        let mut st = st;
        st.session_waiting = true;
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
}

impl Read for &SessionEnd {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let deadline = self
            .read_timeout
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| Instant::now() + t);
        let mut st = self.shared.lock();
        loop {
            if st.session_closed {
                return Ok(0);
            }
            if st.to_session.len > 0 {
                let n = st.to_session.pop_into(buf);
                let wake = std::mem::take(&mut st.device_wants_room);
                let lease = st.release_large_ring();
                drop(st);
                drop(lease);
                if wake {
                    self.shared.wake_device();
                }
                return Ok(n);
            }
            if st.device_closed || st.device_write_closed {
                return Ok(0);
            }
            st = self.wait(st, deadline)?;
        }
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
        let mut st = self.shared.lock();
        loop {
            if st.session_closed || st.session_write_closed || st.device_closed {
                return Err(broken_pipe());
            }
            if st.to_device.free() > 0 {
                let was_empty = st.to_device.len == 0;
                let n = st.to_device.push_from(buf);
                drop(st);
                if was_empty {
                    self.shared.wake_device();
                }
                return Ok(n);
            }
            st = self.wait(st, None)?;
        }
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

    #[test]
    fn the_ring_is_bounded_and_wraps() {
        let mut r = Ring::new(8);
        assert_eq!(r.push_from(b"abcdef"), 6);
        let mut b = [0u8; 4];
        assert_eq!(r.pop_into(&mut b), 4);
        assert_eq!(&b, b"abcd");
        // 2 bytes left, 6 free; the write wraps around the end.
        assert_eq!(r.push_from(b"0123456789"), 6);
        assert_eq!(r.free(), 0);
        let mut all = [0u8; 16];
        assert_eq!(r.pop_into(&mut all), 8);
        assert_eq!(&all[..8], b"ef012345");
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
        assert!(d.enlarge_to_session(64, lease(64)));
        assert!(
            RingLease::try_new(&stats, 64, 100).is_none(),
            "over the budget"
        );
        assert_eq!((&d).write(&[3u8; 100]).unwrap(), 64);
        assert!(
            !d.enlarge_to_session(80, lease(30)),
            "only before the first write"
        );
        assert_eq!(stats.snapshot().large_ring_bytes, 64);
        drop(d);
        let mut buf = [0u8; 40];
        assert_eq!((&s).read(&mut buf).unwrap(), 40);
        assert_eq!(stats.snapshot().large_ring_bytes, 64);
        assert_eq!((&s).read(&mut buf).unwrap(), 24);
        assert_eq!(stats.snapshot().large_ring_bytes, 0);
        assert_eq!((&s).read(&mut buf).unwrap(), 0);
        // The session goes away with data unread: returned at once.
        let (d, s) = pair(16).unwrap();
        assert!(d.enlarge_to_session(64, lease(64)));
        (&d).write_all(&[1u8; 50]).unwrap();
        drop(s);
        assert_eq!(stats.snapshot().large_ring_bytes, 0);
        assert_eq!(d.to_session_capacity(), DEFAULT_RING_CAPACITY);
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
}
