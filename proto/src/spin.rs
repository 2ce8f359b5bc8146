//! Reading a socket the way a request/reply protocol wants: poll for bytes
//! for a few microseconds before blocking, when that pays. A reply usually
//! comes back within a few microseconds, but on a virtual machine whose CPUs
//! idle, a thread that blocked first pays the halted CPU's wake-up, about
//! 50 µs; polling first turns that into the time the other side takes.
//!
//! On a busy machine the opposite holds: no CPU halts, wake-ups are fast,
//! and a polling thread takes the CPU the other side needs. So the spin
//! adapts ([`AdaptiveSpin`]): it grows while polling catches replies and
//! shrinks to nothing while it does not, probing now and then; a poller that
//! finds itself preempted blocks at once. Past the spin the reader blocks as
//! before, so an idle connection costs no CPU.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::fdpass::{FdSink, recv_with_fds};

/// The longest a wait polls before it blocks: a little longer than the slow
/// wake-up it avoids, so a reply that takes as long as a wake-up is caught.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(60);
/// The longest a wait whose caller said how long it expects to take ([`AdaptiveSpin::expect`])
/// polls: a synchronous copy of a few MiB that a pinned buffer lets vgpud make in place.
pub const MAX_EXPECTED_SPIN: Duration = Duration::from_millis(1);
/// The shortest spin worth making (about two round trips over a unix socket
/// when both ends poll); below it the spin is switched off.
const MIN_SPIN: Duration = Duration::from_micros(8);
/// With the spin off, one wait in this many polls for the whole maximum to
/// see whether polling pays again.
const PROBE_EVERY: u32 = 16;
/// A gap this long between two polls means the poller was preempted: the
/// machine has more runnable threads than CPUs, the other side may be
/// waiting for this one's, and polling on only delays it: block at once.
pub const PREEMPTED: Duration = Duration::from_micros(15);

/// How long the waits of one connection poll, learned from how they went.
#[derive(Debug, Clone)]
pub struct AdaptiveSpin {
    max: Duration,
    now: Duration,
    /// Waits since the last probe while the spin is off.
    idle_waits: u32,
    /// What the caller expects the next wait to take ([`AdaptiveSpin::expect`]).
    expected: Duration,
    /// The current wait polls for an expected time: how it goes says nothing about the
    /// connection's usual replies, so it leaves the spin as it is.
    expecting: bool,
}

impl AdaptiveSpin {
    /// Spins of at most `max` (zero: never poll).
    pub fn new(max: Duration) -> Self {
        AdaptiveSpin {
            max,
            now: max,
            idle_waits: 0,
            expected: Duration::ZERO,
            expecting: false,
        }
    }

    /// The next wait is expected to take about `d` (work of a known size, such as a copy
    /// made in place): it may poll that long, up to [`MAX_EXPECTED_SPIN`], even with the spin
    /// off, and does not change the spin. A connection that never polls (zero maximum) does
    /// not poll for it either.
    pub fn expect(&mut self, d: Duration) {
        self.expected = d.min(MAX_EXPECTED_SPIN);
    }

    /// How long the next wait may poll.
    pub fn budget(&mut self) -> Duration {
        let expected = std::mem::take(&mut self.expected);
        self.expecting = !self.max.is_zero() && expected > self.now;
        if self.expecting {
            return expected;
        }
        if self.max.is_zero() || !self.now.is_zero() {
            return self.now;
        }
        self.idle_waits += 1;
        if self.idle_waits >= PROBE_EVERY {
            self.idle_waits = 0;
            return self.max;
        }
        Duration::ZERO
    }

    /// A wait that polled found its data while polling (`true`: the spin goes back to its
    /// maximum) or had to block (`false`: it halves, and stops below [`MIN_SPIN`]).
    pub fn record(&mut self, caught: bool) {
        if std::mem::take(&mut self.expecting) {
            return;
        }
        self.now = if caught {
            self.max
        } else if self.now / 2 < MIN_SPIN {
            Duration::ZERO
        } else {
            self.now / 2
        };
    }

    /// The current spin.
    pub fn current(&self) -> Duration {
        self.now
    }
}

/// The clock of one wait that polls before it blocks.
#[derive(Debug)]
pub struct Poll {
    start: Instant,
    last: Instant,
    spin: Duration,
}

impl Poll {
    /// A wait that may poll for `spin`.
    pub fn new(spin: Duration) -> Self {
        let now = Instant::now();
        Poll {
            start: now,
            last: now,
            spin,
        }
    }

    /// Whether to poll again (after a CPU pause hint), or block now: the spin is over, or the
    /// poller was preempted since the last poll ([`PREEMPTED`]).
    pub fn again(&mut self) -> bool {
        let now = Instant::now();
        let preempted = now - self.last >= PREEMPTED;
        self.last = now;
        if preempted || now - self.start >= self.spin {
            return false;
        }
        std::hint::spin_loop();
        true
    }
}

/// Waits with `try_once` (`Ok(None)`: nothing yet) for up to `spin`'s budget, then with
/// `block` (at once with no budget, without a first try); tells `spin` how it went. Data there
/// at the first try says nothing either way.
pub fn wait<T, E>(
    spin: &mut AdaptiveSpin,
    mut try_once: impl FnMut() -> Result<Option<T>, E>,
    block: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    let budget = spin.budget();
    if budget.is_zero() {
        return block();
    }
    if let Some(v) = try_once()? {
        return Ok(v);
    }
    let mut poll = Poll::new(budget);
    while poll.again() {
        if let Some(v) = try_once()? {
            spin.record(true);
            return Ok(v);
        }
    }
    spin.record(false);
    block()
}

/// Tells a [`SpinRead`]'s next wait how long it should take ([`AdaptiveSpin::expect`]), from
/// whoever writes the request, without a borrow of the reader.
#[derive(Debug, Clone, Default)]
pub struct Expectation(Arc<AtomicU64>);

impl Expectation {
    /// The next wait of the reader should take about `d`.
    pub fn next_wait(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.0.store(nanos, Ordering::Relaxed);
    }

    fn take(&self) -> Option<Duration> {
        match self.0.swap(0, Ordering::Relaxed) {
            0 => None,
            n => Some(Duration::from_nanos(n)),
        }
    }
}

/// Something besides the socket that may ask a waiting reader for its attention: a request in
/// a doorbell page ([`crate::doorbell`]).
pub trait Bell: Send + Sync {
    /// Whether a request waits that the reader's caller should serve now: only between frames
    /// (which the caller tells the bell), and once the reader has read the `received` bytes the
    /// client had sent when it rang.
    fn rung(&self, received: u64) -> bool;
    /// Whether the client says it sent nothing past the `received` bytes read: a poll may skip
    /// its system call.
    fn socket_idle(&self, received: u64) -> bool;
    /// The reader is about to block on its socket (`true`) or woke (`false`).
    fn sleeping(&self, asleep: bool);
}

/// The error a [`SpinRead`] watching a [`Bell`] returns, having read nothing, when the bell rang
/// and every byte sent before it was read ([`is_rung`]).
#[derive(Debug, thiserror::Error)]
#[error("a request waits in the doorbell page")]
pub struct Rung;

/// Whether `e` is [`Rung`].
pub fn is_rung(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Rung>())
}

/// What one poll of a [`SpinRead`] found.
enum Found {
    Bytes(usize),
    Rung,
}

/// A socket whose reads poll before they block ([`AdaptiveSpin`]); writes go straight through.
/// With [`SpinRead::receiving_fds`] it reads with `recvmsg` and hands the descriptors that
/// arrive to a sink ([`crate::fdpass`]); with [`SpinRead::watching`] its waits also look at a
/// [`Bell`].
pub struct SpinRead<S> {
    inner: S,
    spin: AdaptiveSpin,
    fds: Option<Arc<dyn FdSink>>,
    expected: Expectation,
    bell: Option<Arc<dyn Bell>>,
    /// Bytes read so far (what a [`Bell`] compares with the client's count).
    received: u64,
}

impl<S: std::fmt::Debug> std::fmt::Debug for SpinRead<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpinRead")
            .field("inner", &self.inner)
            .field("spin", &self.spin)
            .field("receives_fds", &self.fds.is_some())
            .field("watches_a_bell", &self.bell.is_some())
            .finish()
    }
}

impl<S> SpinRead<S> {
    /// `inner`, read with spins of up to [`DEFAULT_SPIN`].
    pub fn new(inner: S) -> Self {
        Self::with_spin(inner, DEFAULT_SPIN)
    }

    /// `inner`, read with spins of up to `spin` (zero: block at once, as `inner` does).
    pub fn with_spin(inner: S, spin: Duration) -> Self {
        SpinRead {
            inner,
            spin: AdaptiveSpin::new(spin),
            fds: None,
            expected: Expectation::default(),
            bell: None,
            received: 0,
        }
    }

    /// Waits look at `bell` as well: a read that finds the bell rung (once every byte sent
    /// before it was read) returns [`Rung`], having read nothing; before it blocks it tells the
    /// bell it sleeps, and looks at the bell and the socket once more.
    #[must_use]
    pub fn watching(mut self, bell: Arc<dyn Bell>) -> Self {
        self.bell = Some(bell);
        self
    }

    /// Reads with `recvmsg` from now on: descriptors that arrive go to `sink` (a unix socket
    /// only; without a sink they are closed by the kernel when the bytes are read).
    #[must_use]
    pub fn receiving_fds(mut self, sink: Arc<dyn FdSink>) -> Self {
        self.fds = Some(sink);
        self
    }

    /// A handle that tells the next read how long it should wait ([`AdaptiveSpin::expect`]).
    pub fn expectation(&self) -> Expectation {
        self.expected.clone()
    }

    /// The socket.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// One non-blocking receive: `Ok(None)` when no byte is there yet.
fn try_recv(
    fd: &impl AsFd,
    buf: &mut [u8],
    sink: Option<&dyn FdSink>,
) -> io::Result<Option<usize>> {
    if let Some(sink) = sink {
        return match recv_with_fds(fd.as_fd(), buf, libc::MSG_DONTWAIT, sink) {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        };
    }
    loop {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes, and the
        // descriptor is open for as long as `fd` is borrowed.
        let n = unsafe {
            libc::recv(
                fd.as_fd().as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if let Ok(n) = usize::try_from(n) {
            return Ok(Some(n));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(None),
            _ => return Err(e),
        }
    }
}

impl<S: Read + AsFd> Read for SpinRead<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return self.inner.read(buf);
        }
        let SpinRead {
            inner,
            spin,
            fds,
            expected,
            bell,
            received,
        } = self;
        if let Some(d) = expected.take() {
            spin.expect(d);
        }
        let sink = fds.as_deref();
        let bell = bell.as_deref();
        let got = *received;
        let poll_once = |buf: &mut [u8]| -> io::Result<Option<Found>> {
            // The bell first: atomic loads, where the socket costs a system call.
            if let Some(b) = bell {
                if b.rung(got) {
                    return Ok(Some(Found::Rung));
                }
                if b.socket_idle(got) {
                    return Ok(None);
                }
            }
            Ok(try_recv(&*inner, buf, sink)?.map(Found::Bytes))
        };
        // `Ok(None)`: block; that needs `inner` mutably, so it is done here.
        let polled = wait(spin, || poll_once(buf).map(|f| f.map(Some)), || Ok(None));
        let polled = match (polled, bell) {
            (Ok(None), Some(bell)) => {
                // Said before the last look, so that a request rung after it finds the flag.
                bell.sleeping(true);
                let last = poll_once(buf);
                if !matches!(last, Ok(None)) {
                    bell.sleeping(false);
                }
                last
            }
            (polled, _) => polled,
        };
        let blocked = match polled {
            Ok(Some(Found::Bytes(n))) => {
                *received += n as u64;
                return Ok(n);
            }
            Ok(Some(Found::Rung)) => return Err(io::Error::other(Rung)),
            Ok(None) if let Some(sink) = sink => recv_with_fds(inner.as_fd(), buf, 0, sink),
            Ok(None) => inner.read(buf),
            // Not a socket (a test's pipe): read it plainly.
            Err(e) if e.raw_os_error() == Some(libc::ENOTSOCK) => inner.read(buf),
            Err(e) => Err(e),
        };
        if let Some(bell) = bell {
            bell.sleeping(false);
        }
        if let Ok(n) = &blocked {
            *received += *n as u64;
        }
        blocked
    }
}

impl<S: Write> Write for SpinRead<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.inner.write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn bytes_sent_before_during_and_after_the_spin_all_arrive_in_order() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut r = SpinRead::new(a);
        // Already there: the first poll takes it.
        b.write_all(b"one").unwrap();
        let mut buf = [0u8; 3];
        r.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"one");
        // Sent long after the spin: the blocking read takes it.
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            b.write_all(b"two").unwrap();
            b
        });
        r.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"two");
        // End of stream is end of stream, whether polled or blocked on.
        drop(t.join().unwrap());
        assert_eq!(r.read(&mut buf).unwrap(), 0);
    }

    #[test]
    fn writes_go_through_and_a_zero_spin_blocks_at_once() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut w = SpinRead::with_spin(a, Duration::ZERO);
        w.write_all(b"ping").unwrap();
        let mut r = SpinRead::new(b);
        let mut buf = [0u8; 4];
        r.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        assert!(w.get_ref().peer_addr().is_ok());
    }

    #[test]
    fn the_spin_shrinks_to_nothing_while_it_misses_and_probes_its_way_back() {
        let mut s = AdaptiveSpin::new(DEFAULT_SPIN);
        assert_eq!(s.budget(), DEFAULT_SPIN);
        let mut misses = 0;
        while !s.current().is_zero() {
            s.record(false);
            misses += 1;
        }
        assert_eq!(misses, 3, "60 -> 30 -> 15 -> off");
        // Off: no polling, except one probe of the whole maximum in PROBE_EVERY waits.
        let budgets: Vec<Duration> = (0..PROBE_EVERY).map(|_| s.budget()).collect();
        assert_eq!(budgets.iter().filter(|b| !b.is_zero()).count(), 1);
        assert_eq!(budgets.last(), Some(&DEFAULT_SPIN));
        // A probe that catches its data switches polling back on at the maximum.
        s.record(true);
        assert_eq!(s.current(), DEFAULT_SPIN);
        // A zero maximum never polls.
        let mut never = AdaptiveSpin::new(Duration::ZERO);
        assert!((0..100).all(|_| never.budget().is_zero()));
    }

    #[test]
    fn an_expected_wait_polls_past_the_maximum_once_and_leaves_the_spin_alone() {
        let mut s = AdaptiveSpin::new(DEFAULT_SPIN);
        while !s.current().is_zero() {
            s.record(false);
        }
        // Off, yet a wait of known length polls for it (capped), once.
        s.expect(Duration::from_micros(300));
        assert_eq!(s.budget(), Duration::from_micros(300));
        s.record(false);
        assert!(
            s.current().is_zero(),
            "a missed expected wait changes nothing"
        );
        s.expect(Duration::from_secs(1));
        assert_eq!(s.budget(), MAX_EXPECTED_SPIN);
        s.record(true);
        assert!(
            s.current().is_zero(),
            "a caught expected wait changes nothing"
        );
        // The expectation was for one wait only.
        assert!((1..PROBE_EVERY).all(|_| s.budget().is_zero()));
        // Shorter than the current spin: the usual spin, which learns as usual.
        let mut on = AdaptiveSpin::new(DEFAULT_SPIN);
        on.expect(Duration::from_micros(1));
        assert_eq!(on.budget(), DEFAULT_SPIN);
        on.record(false);
        assert!(on.current() < DEFAULT_SPIN);
        // A connection that never polls ignores expectations.
        let mut never = AdaptiveSpin::new(Duration::ZERO);
        never.expect(Duration::from_micros(300));
        assert!(never.budget().is_zero());
    }

    #[test]
    fn data_there_at_once_leaves_the_spin_alone() {
        let mut s = AdaptiveSpin::new(DEFAULT_SPIN);
        s.record(false);
        let before = s.current();
        let got: Result<u8, ()> = wait(&mut s, || Ok(Some(7)), || Ok(0));
        assert_eq!(got, Ok(7));
        assert_eq!(s.current(), before);
        // Nothing while polling: the blocking form answers, and the spin shrinks.
        let got: Result<u8, ()> = wait(&mut s, || Ok(None), || Ok(9));
        assert_eq!(got, Ok(9));
        assert!(s.current() < before);
    }
}
