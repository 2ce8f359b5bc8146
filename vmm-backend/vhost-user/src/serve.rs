//! The connection loop every vhost-user device of vgpud runs: wait for a VMM on the device's
//! socket, serve that one connection until the VMM leaves, then wait for the next, until a
//! [`StopHandle`] fires.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use tracing::warn;
use vhost::vhost_user::Listener;
use vhost_user_backend::{VhostUserBackend, VhostUserDaemon, VringRwLock};
use vm_memory::GuestMemoryAtomic;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::{Error, GuestMem};

#[derive(Debug)]
struct StopInner {
    stopped: AtomicBool,
    event: EventFd,
}

/// Asks a device server's connection loop ([`serve_vmm_connections`]) to return. Clone it freely; `stop` is idempotent.
#[derive(Debug, Clone)]
pub struct StopHandle {
    inner: Arc<StopInner>,
}

impl StopHandle {
    /// Creates a handle that has not fired.
    pub fn new() -> io::Result<Self> {
        Ok(StopHandle {
            inner: Arc::new(StopInner {
                stopped: AtomicBool::new(false),
                event: EventFd::new(EFD_NONBLOCK)?,
            }),
        })
    }

    /// Fires the handle: the server closes every connection and returns.
    pub fn stop(&self) {
        self.inner.stopped.store(true, Ordering::SeqCst);
        // The eventfd stays readable from now on, waking every waiter.
        if let Err(e) = self.inner.event.write(1) {
            warn!(error = %e, "cannot signal vsock stop event");
        }
    }

    /// Whether [`stop`](Self::stop) was called.
    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::SeqCst)
    }

    pub fn fd(&self) -> i32 {
        self.inner.event.as_raw_fd()
    }
}

/// Pause after a VMM session that failed to start before accepting the next one.
pub const SESSION_RETRY_DELAY: Duration = Duration::from_millis(100);

const TOKEN_STOP: u64 = 1;
const TOKEN_VMM: u64 = 2;
const TOKEN_IDLE: u64 = 3;
const TOKEN_DONE: u64 = 4;

/// Work a device does on its own while no VMM is connected (the vsock device turns away host
/// clients of its hybrid-vsock socket).
pub trait IdleWork {
    /// The descriptor that becomes readable when there is work.
    fn fd(&self) -> RawFd;
    /// Does the work; must not block.
    fn run(&self);
}

/// What woke the idle server.
enum Wake {
    Stop,
    Frontend,
    Idle,
}

/// Serves VMM connections on `listener` one after the other until `stop` fires: waits for a VMM
/// (running `idle` whenever its descriptor is readable meanwhile), calls `serve_one` for it and
/// goes back to waiting. A connection that fails is logged under `name` and followed by a short
/// pause, so a persistent failure (say, out of descriptors) does not spin.
pub fn serve_vmm_connections<E: std::fmt::Display>(
    name: &str,
    listener: &mut Listener,
    stop: &StopHandle,
    idle: Option<&dyn IdleWork>,
    mut serve_one: impl FnMut(&mut Listener) -> Result<(), E>,
) -> Result<(), Error> {
    loop {
        match wait_idle(listener, stop, idle)? {
            Wake::Stop => return Ok(()),
            Wake::Idle => {
                if let Some(idle) = idle {
                    idle.run();
                }
            }
            Wake::Frontend => {
                if let Err(e) = serve_one(listener) {
                    warn!(device = name, error = %e, "VMM session failed");
                    if wait_stop(stop, SESSION_RETRY_DELAY)? {
                        return Ok(());
                    }
                }
                if stop.is_stopped() {
                    return Ok(());
                }
            }
        }
    }
}

fn wait_idle(
    listener: &Listener,
    stop: &StopHandle,
    idle: Option<&dyn IdleWork>,
) -> Result<Wake, Error> {
    let epoll = Epoll::new().map_err(Error::EventLoop)?;
    let mut fds = vec![(stop.fd(), TOKEN_STOP), (listener.as_raw_fd(), TOKEN_VMM)];
    if let Some(idle) = idle {
        fds.push((idle.fd(), TOKEN_IDLE));
    }
    for (fd, token) in fds {
        epoll
            .ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token),
            )
            .map_err(Error::EventLoop)?;
    }
    let mut events = [EpollEvent::default(); 3];
    loop {
        let n = match epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::EventLoop(e)),
        };
        let tokens: Vec<u64> = events[..n].iter().map(|e| e.data()).collect();
        if tokens.contains(&TOKEN_STOP) || stop.is_stopped() {
            return Ok(Wake::Stop);
        }
        if tokens.contains(&TOKEN_VMM) {
            return Ok(Wake::Frontend);
        }
        if tokens.contains(&TOKEN_IDLE) {
            return Ok(Wake::Idle);
        }
    }
}

/// Accepts the VMM waiting on `listener` and starts a vhost-user daemon named `name` for
/// `backend`, with the backend's own descriptor `event_fd` registered in every vring worker under
/// the custom event id `event_id`.
pub fn start_daemon<T>(
    name: String,
    backend: T,
    event_fd: RawFd,
    event_id: u16,
    listener: &mut Listener,
) -> Result<VhostUserDaemon<T>, Error>
where
    T: VhostUserBackend<Bitmap = (), Vring = VringRwLock> + Clone + Send + Sync + 'static,
{
    let mut daemon = VhostUserDaemon::new(name, backend, GuestMemoryAtomic::new(GuestMem::new()))
        .map_err(|e| Error::Daemon(e.to_string()))?;
    for handler in daemon.get_epoll_handlers() {
        handler
            .register_listener(event_fd, EventSet::IN, u64::from(event_id))
            .map_err(Error::EventLoop)?;
    }
    // The listener is readable, so this accept does not block.
    daemon
        .start(listener)
        .map_err(|e| Error::Daemon(e.to_string()))?;
    Ok(daemon)
}

/// Runs a started vhost-user daemon (one VMM connection) until the VMM disconnects or `stop`
/// fires, then drops it, which stops and joins its vring workers: nothing touches the device
/// afterwards. Returns whether `stop` fired and how the connection ended.
pub fn run_until_disconnect<T>(
    mut daemon: VhostUserDaemon<T>,
    waiter_name: String,
    stop: &StopHandle,
) -> Result<(bool, Result<(), vhost_user_backend::Error>), Error>
where
    T: vhost_user_backend::VhostUserBackend<Bitmap = (), Vring = vhost_user_backend::VringRwLock>
        + Clone
        + Send
        + Sync
        + 'static,
{
    let shutdown = daemon.shutdown_handle();
    let done = EventFd::new(EFD_NONBLOCK).map_err(Error::EventLoop)?;
    let done_signal = done.try_clone().map_err(Error::EventLoop)?;
    let waiter = thread::Builder::new()
        .name(waiter_name)
        .spawn(move || {
            let result = daemon.wait();
            let _ = done_signal.write(1);
            (daemon, result)
        })
        .map_err(|e| Error::Daemon(e.to_string()))?;
    let stopped = wait_either(stop, &done)?;
    if stopped && let Some(handle) = shutdown {
        handle.shutdown();
    }
    let (daemon, result) = waiter
        .join()
        .map_err(|_| Error::Daemon("vhost-user thread panicked".into()))?;
    drop(daemon);
    Ok((stopped, result))
}

/// Waits up to `delay` for `stop`; true if it fired.
pub fn wait_stop(stop: &StopHandle, delay: Duration) -> Result<bool, Error> {
    let epoll = Epoll::new().map_err(Error::EventLoop)?;
    epoll
        .ctl(
            ControlOperation::Add,
            stop.fd(),
            EpollEvent::new(EventSet::IN, TOKEN_STOP),
        )
        .map_err(Error::EventLoop)?;
    let mut events = [EpollEvent::default(); 1];
    let ms = i32::try_from(delay.as_millis()).unwrap_or(i32::MAX);
    match epoll.wait(ms, &mut events) {
        Ok(_) | Err(_) => Ok(stop.is_stopped()),
    }
}

/// Waits until `stop` fires (returns true) or `other` becomes readable —
/// a completion eventfd, or a listener with a VMM waiting (returns false).
pub fn wait_either(stop: &StopHandle, other: &impl AsRawFd) -> Result<bool, Error> {
    let epoll = Epoll::new().map_err(Error::EventLoop)?;
    for (fd, token) in [(stop.fd(), TOKEN_STOP), (other.as_raw_fd(), TOKEN_DONE)] {
        epoll
            .ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token),
            )
            .map_err(Error::EventLoop)?;
    }
    let mut events = [EpollEvent::default(); 2];
    loop {
        match epoll.wait(-1, &mut events) {
            Ok(n) => {
                if stop.is_stopped() || events[..n].iter().any(|e| e.data() == TOKEN_STOP) {
                    return Ok(true);
                }
                if n > 0 {
                    return Ok(false);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::EventLoop(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_handle_fires_once_for_every_waiter() {
        let stop = StopHandle::new().unwrap();
        assert!(!stop.is_stopped());
        assert!(!wait_stop(&stop, Duration::from_millis(1)).unwrap());
        let other = stop.clone();
        other.stop();
        other.stop();
        assert!(stop.is_stopped());
        assert!(wait_stop(&stop, Duration::from_secs(60)).unwrap());
        let never = EventFd::new(EFD_NONBLOCK).unwrap();
        assert!(wait_either(&stop, &never).unwrap());
    }
}
