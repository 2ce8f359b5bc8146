//! The signals vgpud acts on (`SIGHUP`: reload the config; `SIGTERM`, `SIGINT`: stop), read on
//! tokio with the sender of each.
//!
//! The signals are blocked in every thread ([`block`], called before any thread starts, so every
//! thread inherits the mask): none is delivered to a handler, all stay pending for the process
//! until [`Signals`] reads them from a `signalfd(2)` registered with tokio ([`AsyncFd`]). A
//! signalfd hands over the whole `signalfd_siginfo`, so the audit log can name the process and
//! user that sent a signal ([`Actor::Signal`]); tokio's own signal streams do not say.

use std::io;
use std::mem::{MaybeUninit, size_of};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use thiserror::Error;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::audit::Actor;

/// The signals vgpud handles: `SIGHUP` reloads, the others stop it.
pub const HANDLED: [libc::c_int; 3] = [libc::SIGHUP, libc::SIGTERM, libc::SIGINT];

/// Why the signals cannot be read.
#[derive(Debug, Error)]
pub enum SignalError {
    /// The signal mask cannot be changed.
    #[error("cannot block SIGHUP, SIGTERM and SIGINT")]
    Block(#[source] io::Error),
    /// The kernel refused a signalfd (or tokio could not register it).
    #[error("cannot open a signalfd for SIGHUP, SIGTERM and SIGINT")]
    Open(#[source] io::Error),
    /// Reading the signalfd failed.
    #[error("cannot read the signalfd")]
    Read(#[source] io::Error),
}

/// The set of [`HANDLED`] signals.
#[derive(Clone, Copy)]
pub struct SignalSet(libc::sigset_t);

impl std::fmt::Debug for SignalSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SignalSet").field(&HANDLED).finish()
    }
}

impl SignalSet {
    /// [`HANDLED`].
    pub fn handled() -> SignalSet {
        let mut set = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the set it is given.
        unsafe { libc::sigemptyset(set.as_mut_ptr()) };
        // SAFETY: initialised by sigemptyset just above.
        let mut set = unsafe { set.assume_init() };
        for sig in HANDLED {
            // SAFETY: `set` is an initialised sigset_t and `sig` a valid signal number.
            unsafe { libc::sigaddset(&mut set, sig) };
        }
        SignalSet(set)
    }
}

/// Blocks [`HANDLED`] in the calling thread; threads it starts afterwards inherit the mask. Call
/// it on the main thread before any other thread starts, so that no thread takes the signals
/// with their default action (termination) and [`Signals`] sees every one.
pub fn block() -> Result<SignalSet, SignalError> {
    let set = SignalSet::handled();
    // SAFETY: `set.0` is an initialised sigset_t; the old mask is not wanted (NULL).
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set.0, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(SignalError::Block(io::Error::from_raw_os_error(rc)));
    }
    Ok(set)
}

/// The blocked signals as a stream on tokio. Create it inside a runtime with I/O enabled; read it
/// from that runtime. The runtime must be a current-thread one (or the signals process-directed,
/// as `kill(1)` sends them): a signalfd reports the signals pending for the process and for the
/// thread that reads it.
#[derive(Debug)]
pub struct Signals {
    fd: AsyncFd<OwnedFd>,
}

impl Signals {
    /// A signalfd for `set`, which must be blocked ([`block`]).
    pub fn open(set: &SignalSet) -> Result<Signals, SignalError> {
        // SAFETY: `set.0` is initialised; -1 asks for a new descriptor; the flags are valid.
        let raw = unsafe { libc::signalfd(-1, &set.0, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
        if raw < 0 {
            return Err(SignalError::Open(io::Error::last_os_error()));
        }
        // SAFETY: signalfd returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: the descriptor is open and owned by the `OwnedFd` the `AsyncFd` takes, which
        // neither closes nor replaces it while registered.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|e| SignalError::Open(e.into_parts().1))?;
        Ok(Signals { fd })
    }

    /// The next signal and its sender ([`Actor::Signal`]; pid and uid 0 when the kernel sent it).
    pub async fn next(&self) -> Result<Actor, SignalError> {
        loop {
            let mut ready = self.fd.readable().await.map_err(SignalError::Read)?;
            match ready.try_io(|fd| read_one(fd.get_ref())) {
                Ok(Ok(info)) => {
                    return Ok(Actor::Signal {
                        signal: info.ssi_signo as i32,
                        // The kernel writes the sender's pid as a pid_t into this u32.
                        pid: info.ssi_pid as i32,
                        uid: info.ssi_uid,
                    });
                }
                Ok(Err(e)) => return Err(SignalError::Read(e)),
                // Nothing pending after all (another reader took it): wait again.
                Err(_would_block) => {}
            }
        }
    }
}

/// Reads one `signalfd_siginfo`; `WouldBlock` when none is pending.
fn read_one(fd: &OwnedFd) -> io::Result<libc::signalfd_siginfo> {
    let mut info = MaybeUninit::<libc::signalfd_siginfo>::uninit();
    loop {
        // SAFETY: `info` is valid for writes of one signalfd_siginfo, the size passed.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                info.as_mut_ptr().cast(),
                size_of::<libc::signalfd_siginfo>(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if usize::try_from(n).ok() != Some(size_of::<libc::signalfd_siginfo>()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a signalfd read returned {n} bytes"),
            ));
        }
        // SAFETY: the kernel wrote a whole signalfd_siginfo (checked just above).
        return Ok(unsafe { info.assume_init() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends `sig` to the calling thread only, so that the test process's other threads (which
    /// do not block it) never see it.
    fn raise_in_this_thread(sig: libc::c_int) {
        let pid = std::process::id();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        // SAFETY: tgkill on this process and thread; `sig` is blocked here, so it stays pending.
        let rc = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig) };
        assert_eq!(rc, 0, "tgkill: {}", io::Error::last_os_error());
    }

    #[test]
    fn a_signal_is_read_with_the_process_and_user_that_sent_it() {
        let set = block().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        let got = rt.block_on(async {
            let signals = Signals::open(&set).unwrap();
            raise_in_this_thread(libc::SIGHUP);
            let first = signals.next().await.unwrap();
            raise_in_this_thread(libc::SIGTERM);
            let second = signals.next().await.unwrap();
            (first, second)
        });
        // SAFETY: `set.0` is initialised; both signals were consumed above, so unblocking
        // delivers nothing.
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set.0, std::ptr::null_mut()) };
        let pid = i32::try_from(std::process::id()).unwrap();
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        assert_eq!(
            got,
            (
                Actor::Signal {
                    signal: libc::SIGHUP,
                    pid,
                    uid
                },
                Actor::Signal {
                    signal: libc::SIGTERM,
                    pid,
                    uid
                }
            )
        );
    }
}
