//! Device-side `printf` and `assert` output of a session, on its way to the guest process.
//!
//! CUDA buffers `printf` text in a per-context FIFO on the device (`CU_LIMIT_PRINTF_FIFO_SIZE`,
//! 1 MiB by default) and prints it on the host at the next synchronizing call; output past the
//! FIFO is lost. Here:
//!
//! * each launch writes into its own [`LaunchOutput`], whose room is what the session's FIFO
//!   has left when the launch starts; a `printf` record that does not fit is dropped whole;
//! * when the launch ends (completed or faulted) its text is appended to the session's FIFO
//!   ([`SessionOutput`]), so the output of one launch is never split by a synchronization;
//! * a synchronizing call *releases* what the FIFO holds; replies then carry
//!   `FLAG_OUTPUT` (to clients that enabled `FEATURE_DEVICE_OUTPUT`) and the client fetches
//!   the released bytes with `TakeOutput`, writing `printf` text to its stdout and `assert`
//!   messages to its stderr.
//!
//! Everything is bounded by the FIFO size (at most [`MAX_PRINTF_FIFO`]) per session: a guest
//! that never fetches its output only loses it, and the daemon holds no more.

use std::sync::{Arc, Mutex, MutexGuard};

use vgpu_proto::cuda;
use vgpu_proto::msg::{self, Request};

use crate::device::{DeviceContext, RunControl};
use crate::engine::Work;
use crate::error::CuError;

/// CUDA's default printf FIFO size.
pub const DEFAULT_PRINTF_FIFO: usize = 1 << 20;
/// Largest printf FIFO a session may ask for; vgpud holds up to twice this per session.
pub const MAX_PRINTF_FIFO: usize = 64 << 20;
/// Most bytes of `assert` messages kept per launch (a failed assert prints one line per
/// failing thread of a warp, then stops the kernel).
pub const MAX_ASSERT_TEXT: usize = 64 << 10;

#[derive(Debug, Default)]
struct Text {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    dropped: u64,
}

/// The `printf` text and `assert` messages of one launch, bounded. Devices write into it
/// through [`RunControl::output`].
#[derive(Debug)]
pub struct LaunchOutput {
    room: usize,
    text: Mutex<Text>,
}

impl LaunchOutput {
    /// Takes at most `room` bytes of `printf` text.
    pub fn new(room: usize) -> LaunchOutput {
        LaunchOutput {
            room,
            text: Mutex::new(Text::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Text> {
        self.text.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes of `printf` text still accepted.
    pub fn room(&self) -> usize {
        self.room.saturating_sub(self.lock().stdout.len())
    }

    /// Appends one `printf` record, or drops it whole when it does not fit (as CUDA drops
    /// output past its FIFO). Returns whether it was kept.
    pub fn printf(&self, record: &[u8]) -> bool {
        let mut t = self.lock();
        if t.stdout.len() + record.len() > self.room {
            t.dropped += 1;
            return false;
        }
        t.stdout.extend_from_slice(record);
        true
    }

    /// Appends a failed assert's message (bounded by [`MAX_ASSERT_TEXT`]).
    pub fn assert_failed(&self, message: &[u8]) {
        let mut t = self.lock();
        if t.stderr.len() + message.len() <= MAX_ASSERT_TEXT {
            t.stderr.extend_from_slice(message);
        } else {
            t.dropped += 1;
        }
    }

    /// Takes the text: (`printf` text, `assert` messages).
    pub fn take(&self) -> (Vec<u8>, Vec<u8>) {
        let mut t = self.lock();
        (std::mem::take(&mut t.stdout), std::mem::take(&mut t.stderr))
    }
}

#[derive(Debug, Default)]
struct Fifo {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// Bytes of each released by synchronizing calls (a prefix).
    released: (usize, usize),
    dropped: u64,
}

/// One session's printf FIFO: launches append, synchronizing calls release, the client takes.
#[derive(Debug)]
pub struct SessionOutput {
    size: usize,
    enabled: bool,
    fifo: Arc<Mutex<Fifo>>,
}

impl Default for SessionOutput {
    fn default() -> Self {
        SessionOutput {
            size: DEFAULT_PRINTF_FIFO,
            enabled: false,
            fifo: Arc::default(),
        }
    }
}

fn lock(f: &Mutex<Fifo>) -> MutexGuard<'_, Fifo> {
    f.lock().unwrap_or_else(|p| p.into_inner())
}

impl SessionOutput {
    /// The client fetches output (it enabled `FEATURE_DEVICE_OUTPUT`).
    pub fn enable(&mut self) {
        self.enabled = true;
    }

    /// Sets the FIFO size (`cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE)`); sizes past
    /// [`MAX_PRINTF_FIFO`] are refused with `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn set_fifo_size(&mut self, bytes: u64) -> Result<(), CuError> {
        match usize::try_from(bytes) {
            Ok(b) if b <= MAX_PRINTF_FIFO => {
                self.size = b;
                Ok(())
            }
            _ => Err(CuError::out_of_memory(format!(
                "a printf FIFO of {bytes} bytes: vgpud allows at most {MAX_PRINTF_FIFO}"
            ))),
        }
    }

    /// The FIFO size.
    pub fn fifo_size(&self) -> usize {
        self.size
    }

    /// Wraps a kernel launch so that its output lands in this FIFO when it ends. A client that
    /// does not fetch output gets none collected (its kernels' `printf` prints nothing).
    pub fn wrap(&self, work: Box<dyn Work>) -> Box<dyn Work> {
        if !self.enabled {
            return work;
        }
        Box::new(WithOutput {
            work,
            size: self.size,
            fifo: Arc::clone(&self.fifo),
        })
    }

    /// A synchronizing call: everything launches have finished writing becomes the client's.
    pub fn release(&self) {
        let mut f = lock(&self.fifo);
        f.released = (f.stdout.len(), f.stderr.len());
    }

    /// Whether released output waits for the client (and it fetches output at all).
    pub fn ready(&self) -> bool {
        if !self.enabled {
            return false;
        }
        let f = lock(&self.fifo);
        f.released != (0, 0)
    }

    /// Takes up to `max` bytes of released output: (stdout, stderr, whether more is waiting).
    /// `assert` messages go first: they are short and say why the context failed.
    pub fn take(&self, max: usize) -> (Vec<u8>, Vec<u8>, bool) {
        let mut f = lock(&self.fifo);
        let e = f.released.1.min(max);
        let err: Vec<u8> = f.stderr.drain(..e).collect();
        let o = f.released.0.min(max - e);
        let out: Vec<u8> = f.stdout.drain(..o).collect();
        f.released.0 -= o;
        f.released.1 -= e;
        let more = f.released != (0, 0);
        (out, err, more)
    }

    /// Records dropped because the FIFO was full.
    pub fn dropped(&self) -> u64 {
        lock(&self.fifo).dropped
    }
}

/// A launch whose device output goes to a session's FIFO.
struct WithOutput {
    work: Box<dyn Work>,
    size: usize,
    fifo: Arc<Mutex<Fifo>>,
}

impl Work for WithOutput {
    fn run(self: Box<Self>, dev: &dyn DeviceContext) -> Result<(), CuError> {
        let WithOutput { work, size, fifo } = *self;
        let Some(control) = work.control() else {
            return work.run(dev);
        };
        let used = {
            let f = lock(&fifo);
            f.stdout.len() + f.stderr.len()
        };
        let out = Arc::new(LaunchOutput::new(size.saturating_sub(used)));
        control.set_output(Some(Arc::clone(&out)));
        let r = work.run(dev);
        control.set_output(None);
        let (stdout, stderr) = out.take();
        let mut f = lock(&fifo);
        f.dropped += out.lock().dropped;
        // The FIFO was drained meanwhile, or not: never past its size.
        let room = size.saturating_sub(f.stdout.len() + f.stderr.len());
        if stdout.len() <= room {
            f.stdout.extend_from_slice(&stdout);
        } else {
            f.dropped += 1;
        }
        // Assert messages are kept even in a full FIFO (bounded per launch), since they
        // explain the error every later call returns.
        if f.stderr.len() + stderr.len() <= MAX_ASSERT_TEXT {
            f.stderr.extend_from_slice(&stderr);
        }
        r
    }

    fn quick(&self) -> bool {
        self.work.quick()
    }

    fn bytes(&self) -> usize {
        self.work.bytes()
    }

    fn control(&self) -> Option<Arc<RunControl>> {
        self.work.control()
    }
}

/// Whether `req` sent synchronously is a call at which CUDA prints device `printf` output: a
/// context, stream or event synchronization, a blocking copy or memset, a module unload, a
/// context's destruction or reset.
pub fn synchronizes(req: &Request) -> bool {
    use Request as R;
    req.flags() & msg::ASYNC_OK != 0
        || matches!(
            req,
            R::CtxSynchronize(_)
                | R::StreamSynchronize(_)
                | R::EventSynchronize(_)
                | R::SyncBegin(_)
                | R::SyncFinish(_)
                | R::MemcpyDtoH(_)
                | R::ModuleUnload(_)
                | R::CtxDestroy(_)
                | R::PrimaryCtxRelease(_)
                | R::PrimaryCtxReset(_)
        )
}

/// The error for a limit the host does not handle.
pub fn unsupported_limit(limit: u32) -> CuError {
    CuError::new(
        cuda::CUDA_ERROR_UNSUPPORTED_LIMIT,
        format!("limit {limit} is not set through vgpud"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_output_drops_records_that_do_not_fit() {
        let o = LaunchOutput::new(10);
        assert!(o.printf(b"12345"));
        assert!(!o.printf(b"123456"));
        assert!(o.printf(b"12345"));
        assert_eq!(o.room(), 0);
        o.assert_failed(b"a.cu:1: k: failed\n");
        let (out, err) = o.take();
        assert_eq!(out, b"1234512345");
        assert_eq!(err, b"a.cu:1: k: failed\n");
        let big = vec![b'x'; MAX_ASSERT_TEXT + 1];
        o.assert_failed(&big);
        assert!(o.take().1.is_empty());
    }

    struct Printing {
        control: Arc<RunControl>,
        text: &'static [u8],
    }

    impl Work for Printing {
        fn run(self: Box<Self>, _dev: &dyn DeviceContext) -> Result<(), CuError> {
            let out = self.control.output().expect("the launch has an output");
            out.printf(self.text);
            Ok(())
        }
        fn control(&self) -> Option<Arc<RunControl>> {
            Some(Arc::clone(&self.control))
        }
    }

    fn run(s: &SessionOutput, text: &'static [u8]) {
        let dev = crate::testutils::MemDevice::new(1 << 20, std::time::Duration::ZERO);
        let ctx = crate::device::Device::open(&dev, "t").unwrap();
        let w = s.wrap(Box::new(Printing {
            control: Arc::default(),
            text,
        }));
        w.run(ctx.as_ref()).unwrap();
    }

    #[test]
    fn nothing_is_collected_for_a_client_that_does_not_fetch_output() {
        let s = SessionOutput::default();
        let dev = crate::testutils::MemDevice::new(1 << 20, std::time::Duration::ZERO);
        let ctx = crate::device::Device::open(&dev, "t").unwrap();
        let control: Arc<RunControl> = Arc::default();
        struct NoOutput(Arc<RunControl>);
        impl Work for NoOutput {
            fn run(self: Box<Self>, _dev: &dyn DeviceContext) -> Result<(), CuError> {
                assert!(self.0.output().is_none());
                Ok(())
            }
            fn control(&self) -> Option<Arc<RunControl>> {
                Some(Arc::clone(&self.0))
            }
        }
        s.wrap(Box::new(NoOutput(control)))
            .run(ctx.as_ref())
            .unwrap();
        s.release();
        assert!(!s.ready());
    }

    #[test]
    fn output_is_released_at_synchronization_and_taken_in_pieces() {
        let mut s = SessionOutput::default();
        s.enable();
        run(&s, b"first\n");
        assert!(!s.ready(), "nothing released before a synchronizing call");
        s.release();
        run(&s, b"second\n");
        assert!(s.ready());
        let (out, err, more) = s.take(3);
        assert_eq!(
            (out.as_slice(), err.as_slice(), more),
            (&b"fir"[..], &b""[..], true)
        );
        let (out, _, more) = s.take(100);
        assert_eq!((out.as_slice(), more), (&b"st\n"[..], false));
        assert!(!s.ready());
        s.release();
        assert_eq!(s.take(100).0, b"second\n");
    }

    #[test]
    fn the_fifo_is_bounded_by_its_size() {
        let mut s = SessionOutput::default();
        s.enable();
        s.set_fifo_size(10).unwrap();
        run(&s, b"0123456789");
        run(&s, b"x");
        s.release();
        assert_eq!(s.take(100).0, b"0123456789");
        assert_eq!(s.dropped(), 1);
        assert!(s.set_fifo_size(MAX_PRINTF_FIFO as u64 + 1).is_err());
        assert_eq!(s.fifo_size(), 10);
    }
}
