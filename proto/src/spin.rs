//! Reading a socket the way a request/reply protocol wants: poll for bytes
//! for a few microseconds before blocking. A reply usually comes back within
//! a few microseconds, but a thread that blocked first pays the scheduler's
//! wake-up, which on some virtual machines costs 50 µs; polling first turns
//! that into the time the other side takes. Past the spin the reader blocks
//! as before, so an idle connection costs no CPU.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

/// How long a read polls before it blocks: a little longer than the slow
/// wake-up it avoids, so a reply that takes as long as a wake-up is still
/// caught.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(60);
/// Polls between yields of the CPU while spinning: on a machine with fewer
/// CPUs than busy threads the other side may need this one's.
const POLLS_PER_YIELD: u32 = 8;

/// A socket whose reads poll for up to `spin` before they block; writes go
/// straight through.
#[derive(Debug)]
pub struct SpinRead<S> {
    inner: S,
    spin: Duration,
}

impl<S> SpinRead<S> {
    /// `inner`, read with [`DEFAULT_SPIN`].
    pub fn new(inner: S) -> Self {
        Self::with_spin(inner, DEFAULT_SPIN)
    }

    /// `inner`, read with a spin of `spin` (zero: block at once, as `inner` does).
    pub fn with_spin(inner: S, spin: Duration) -> Self {
        SpinRead { inner, spin }
    }

    /// The socket.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// One non-blocking receive: `Ok(None)` when no byte is there yet.
fn try_recv(fd: &impl AsFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
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
        if buf.is_empty() || self.spin.is_zero() {
            return self.inner.read(buf);
        }
        let start = Instant::now();
        let mut polls = 0u32;
        loop {
            match try_recv(&self.inner, buf) {
                Ok(Some(n)) => return Ok(n),
                Ok(None) => {}
                // Not a socket (a test's pipe): read it plainly.
                Err(e) if e.raw_os_error() == Some(libc::ENOTSOCK) => {
                    return self.inner.read(buf);
                }
                Err(e) => return Err(e),
            }
            if start.elapsed() >= self.spin {
                return self.inner.read(buf);
            }
            polls += 1;
            if polls.is_multiple_of(POLLS_PER_YIELD) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
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
}
