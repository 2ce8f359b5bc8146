//! virtio-vsock vhost-user device (virtio ID 19), one per VM.
//!
//! vgpud listens on [`VsockConfig::socket`] for the VMM (QEMU `vhost-user-vsock-pci`,
//! cloud-hypervisor `--generic-vhost-user …,device_type=vsock`) and serves the guest's stock
//! `vmw_vsock_virtio_transport` driver:
//!
//! * a guest connection to port P is offered to the [`PortConnector`]; if it serves P in-process
//!   (the GPU port), the device shuttles bytes between the guest and the returned stream;
//!   otherwise it is forwarded to the unix socket `<uds_path>_<P>`;
//! * host clients connect to `uds_path`, write `CONNECT <port>\n` and, once the guest accepts,
//!   read `OK <host_port>\n` followed by the stream (hybrid vsock, as in Firecracker,
//!   cloud-hypervisor and vhost-device-vsock).
//!
//! When the VMM disconnects (or the driver resets the device) every connection is closed, so
//! in-process sessions see end of file and release what they hold; then the next VMM connection
//! is accepted. See `docs/vsock.md`.

mod backend;
mod connection;
mod device;
pub mod packet;
mod stats;
#[doc(hidden)]
pub mod testutils;

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use thiserror::Error;
use tracing::{debug, info, warn};
use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::GuestMemoryAtomic;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

pub use backend::{BACKEND_EVENT, VIRTIO_FEATURES, protocol_features};
pub use device::{
    HOST_PORT_BASE, MAX_CONNECT_LINE, MAX_CONNECTIONS, MAX_PENDING_HOST_CLIENTS, forward_path,
};
pub use stats::{VsockStats, VsockStatsSnapshot};

use backend::VsockBackend;
pub(crate) use backend::{ExitEvents, read_config};
use device::VsockDevice;
pub(crate) use device::{LogLimiter, next_chain, signal, vring_ready};
use packet::GuestMem;

/// The vsock port on the host where vgpud serves the GPU (`vgpu_proto::GPU_VSOCK_PORT`). The
/// device itself does not treat it specially: vgpud's [`PortConnector`] serves it in-process.
pub const GPU_PORT: u32 = vgpu_proto::GPU_VSOCK_PORT;

/// Index of the receive queue (device → driver).
pub const RX_QUEUE: usize = 0;
/// Index of the transmit queue (driver → device).
pub const TX_QUEUE: usize = 1;
/// Index of the event queue (transport resets; handled by QEMU itself for vhost-user-vsock).
pub const EVENT_QUEUE: usize = 2;
/// Number of virtqueues of a virtio-vsock device.
pub const NUM_QUEUES: usize = 3;

/// Default virtqueue size.
pub const DEFAULT_QUEUE_SIZE: u16 = 256;
/// Default per-connection receive buffer advertised to the guest (`buf_alloc`). 256 KiB matches
/// Linux's own `VIRTIO_VSOCK_DEFAULT_BUF_SIZE`, so a guest can keep four maximal 64 KiB packets
/// in flight towards vgpud (bulk `cuMemcpyHtoD` data) without waiting for a credit update. The
/// memory is only used while a host reader is slower than the guest writer: bytes go straight to
/// the host socket otherwise.
pub const DEFAULT_TX_BUFFER_SIZE: u32 = 256 * 1024;
/// Smallest accepted `tx_buffer_size`.
pub const MIN_TX_BUFFER_SIZE: u32 = 4 * 1024;
/// Largest accepted `tx_buffer_size` (bounds the memory a guest can pin: 1024 connections × this).
pub const MAX_TX_BUFFER_SIZE: u32 = 16 * 1024 * 1024;
/// Largest virtqueue size a split queue may have.
pub const MAX_QUEUE_SIZE: u16 = 32768;
/// The first CID a guest may use (0–2 are reserved).
pub const MIN_GUEST_CID: u64 = 3;
/// Largest CID (`VMADDR_CID_ANY` and above are reserved).
pub const MAX_GUEST_CID: u64 = u32::MAX as u64 - 1;

/// Errors of the vsock device server.
#[derive(Debug, Error)]
pub enum Error {
    /// The configuration is unusable.
    #[error("invalid vsock configuration: {0}")]
    InvalidConfig(String),
    /// A socket path exists and is not a socket, so it was not replaced.
    #[error("{0} exists and is not a unix socket; refusing to replace it")]
    PathInUse(PathBuf),
    /// Binding a listening socket failed.
    #[error("cannot listen on {path}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// An epoll or eventfd operation failed.
    #[error("vsock event loop failure")]
    EventLoop(#[source] io::Error),
    /// The vhost-user daemon could not be created or started.
    #[error("vhost-user daemon failure: {0}")]
    Daemon(String),
}

/// Configuration of one VM's vsock device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VsockConfig {
    /// The guest's context id (≥ 3).
    pub guest_cid: u64,
    /// The vhost-user socket vgpud listens on for the VMM.
    pub socket: PathBuf,
    /// Hybrid-vsock base path: guest→host port P connects to `<uds_path>_<P>`; host→guest clients
    /// connect to `uds_path` and write `CONNECT <port>\n`.
    pub uds_path: PathBuf,
    /// Virtqueue size offered to the VMM (power of two).
    pub queue_size: u16,
    /// Per-connection receive buffer advertised to the guest as `buf_alloc`.
    pub tx_buffer_size: u32,
}

impl VsockConfig {
    /// A configuration with the default queue and buffer sizes.
    pub fn new(guest_cid: u64, socket: impl Into<PathBuf>, uds_path: impl Into<PathBuf>) -> Self {
        VsockConfig {
            guest_cid,
            socket: socket.into(),
            uds_path: uds_path.into(),
            queue_size: DEFAULT_QUEUE_SIZE,
            tx_buffer_size: DEFAULT_TX_BUFFER_SIZE,
        }
    }

    /// Checks the values a device can work with.
    pub fn validate(&self) -> Result<(), Error> {
        if !(MIN_GUEST_CID..=MAX_GUEST_CID).contains(&self.guest_cid) {
            return Err(Error::InvalidConfig(format!(
                "guest_cid {} is reserved; use {MIN_GUEST_CID}..={MAX_GUEST_CID}",
                self.guest_cid
            )));
        }
        if !self.queue_size.is_power_of_two() || self.queue_size > MAX_QUEUE_SIZE {
            return Err(Error::InvalidConfig(format!(
                "queue_size {} must be a power of two up to {MAX_QUEUE_SIZE}",
                self.queue_size
            )));
        }
        if !(MIN_TX_BUFFER_SIZE..=MAX_TX_BUFFER_SIZE).contains(&self.tx_buffer_size) {
            return Err(Error::InvalidConfig(format!(
                "tx_buffer_size {} must be between {MIN_TX_BUFFER_SIZE} and {MAX_TX_BUFFER_SIZE} bytes",
                self.tx_buffer_size
            )));
        }
        if self.socket == self.uds_path {
            return Err(Error::InvalidConfig(
                "socket and uds_path must be different paths".into(),
            ));
        }
        Ok(())
    }
}

/// Decides what happens to a guest connection to a port.
///
/// Called on the device thread for every guest connection request; it must not block.
pub trait PortConnector: Send + Sync + 'static {
    /// `Some(Ok(stream))`: the port is served in-process and the device shuttles bytes between the
    /// guest connection and `stream` (for example one end of a `UnixStream::pair()` whose other end
    /// is served by a broker session). `None`: forward to `<uds_path>_<port>`. `Some(Err(_))`
    /// refuses the connection (the guest gets an RST).
    fn connect(&self, port: u32) -> Option<io::Result<UnixStream>>;
}

/// A connector that serves nothing in-process: every port is forwarded.
#[derive(Debug, Default, Clone, Copy)]
pub struct ForwardAll;

impl PortConnector for ForwardAll {
    fn connect(&self, _port: u32) -> Option<io::Result<UnixStream>> {
        None
    }
}

#[derive(Debug)]
struct StopInner {
    stopped: AtomicBool,
    event: EventFd,
}

/// Asks [`serve`] / [`VsockServer::run`] to return. Clone it freely; `stop` is idempotent.
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

    pub(crate) fn fd(&self) -> i32 {
        self.inner.event.as_raw_fd()
    }
}

/// Removes a stale socket at `path`; refuses to touch anything that is not a socket.
fn clear_stale_socket(path: &Path) -> Result<(), Error> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|source| Error::Bind {
                path: path.to_owned(),
                source,
            })
        }
        Ok(_) => Err(Error::PathInUse(path.to_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Bind {
            path: path.to_owned(),
            source,
        }),
    }
}

pub(crate) fn bind(path: &Path) -> Result<UnixListener, Error> {
    clear_stale_socket(path)?;
    UnixListener::bind(path).map_err(|source| Error::Bind {
        path: path.to_owned(),
        source,
    })
}

/// What woke the idle server.
enum Wake {
    Stop,
    Frontend,
    HostClient,
}

/// Pause after a VMM session that failed to start before accepting the next one.
pub(crate) const SESSION_RETRY_DELAY: Duration = Duration::from_millis(100);

const TOKEN_STOP: u64 = 1;
const TOKEN_VMM: u64 = 2;
const TOKEN_UDS: u64 = 3;
const TOKEN_DONE: u64 = 4;

/// A bound vsock device server: both sockets exist once this is constructed.
#[derive(Debug)]
pub struct VsockServer {
    config: VsockConfig,
    connector: Arc<dyn PortConnector>,
    stats: Arc<VsockStats>,
    vmm_listener: Option<UnixListener>,
    uds_listener: UnixListener,
}

impl std::fmt::Debug for dyn PortConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PortConnector")
    }
}

impl VsockServer {
    /// Validates `config` and binds the vhost-user socket and the hybrid-vsock socket (stale
    /// sockets from an earlier run are replaced; other files are not).
    pub fn bind(config: VsockConfig, connector: Arc<dyn PortConnector>) -> Result<Self, Error> {
        config.validate()?;
        let vmm_listener = bind(&config.socket)?;
        let uds_listener = match bind(&config.uds_path) {
            Ok(l) => l,
            Err(e) => {
                let _ = std::fs::remove_file(&config.socket);
                return Err(e);
            }
        };
        Ok(VsockServer {
            config,
            connector,
            stats: Arc::new(VsockStats::default()),
            vmm_listener: Some(vmm_listener),
            uds_listener,
        })
    }

    /// The device's counters; stay valid after the server returns.
    pub fn stats(&self) -> Arc<VsockStats> {
        self.stats.clone()
    }

    /// The configuration in use.
    pub fn config(&self) -> &VsockConfig {
        &self.config
    }

    /// Serves VMM connections one after the other until `stop` fires.
    pub fn run(mut self, stop: &StopHandle) -> Result<(), Error> {
        let Some(vmm) = self.vmm_listener.take() else {
            return Err(Error::Daemon("server already ran".into()));
        };
        let mut listener = Listener::from(vmm);
        let result = self.run_loop(&mut listener, stop);
        drop(listener);
        let _ = std::fs::remove_file(&self.config.socket);
        let _ = std::fs::remove_file(&self.config.uds_path);
        info!(guest_cid = self.config.guest_cid, "vsock device stopped");
        result
    }

    fn run_loop(&mut self, listener: &mut Listener, stop: &StopHandle) -> Result<(), Error> {
        info!(
            guest_cid = self.config.guest_cid,
            socket = %self.config.socket.display(),
            uds_path = %self.config.uds_path.display(),
            "vsock device waiting for the VMM"
        );
        loop {
            match self.wait_idle(listener, stop)? {
                Wake::Stop => return Ok(()),
                Wake::HostClient => self.turn_away_host_clients(),
                Wake::Frontend => {
                    if let Err(e) = self.serve_frontend(listener, stop) {
                        warn!(guest_cid = self.config.guest_cid, error = %e, "VMM session failed");
                        // A persistent failure (say, out of descriptors) must not spin.
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

    fn wait_idle(&self, listener: &Listener, stop: &StopHandle) -> Result<Wake, Error> {
        let epoll = Epoll::new().map_err(Error::EventLoop)?;
        for (fd, token) in [
            (stop.fd(), TOKEN_STOP),
            (listener.as_raw_fd(), TOKEN_VMM),
            (self.uds_listener.as_raw_fd(), TOKEN_UDS),
        ] {
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
            if tokens.contains(&TOKEN_UDS) {
                return Ok(Wake::HostClient);
            }
        }
    }

    /// No VM is attached: host clients are closed at once instead of hanging.
    fn turn_away_host_clients(&self) {
        if self.uds_listener.set_nonblocking(true).is_err() {
            return;
        }
        while let Ok((stream, _)) = self.uds_listener.accept() {
            debug!("no VM attached; closing host vsock client");
            self.stats.add_refused();
            drop(stream);
        }
        let _ = self.uds_listener.set_nonblocking(false);
    }

    fn serve_frontend(&mut self, listener: &mut Listener, stop: &StopHandle) -> Result<(), Error> {
        let cid = self.config.guest_cid;
        let uds = self.uds_listener.try_clone().map_err(Error::EventLoop)?;
        let device = VsockDevice::new(
            cid,
            self.config.tx_buffer_size,
            self.config.uds_path.clone(),
            self.connector.clone(),
            self.stats.clone(),
            Some(uds),
        )
        .map_err(Error::EventLoop)?;
        let backend = Arc::new(
            VsockBackend::new(device, cid, self.config.queue_size).map_err(Error::EventLoop)?,
        );
        let mut daemon = VhostUserDaemon::new(
            format!("vsock-{cid}"),
            backend.clone(),
            GuestMemoryAtomic::new(GuestMem::new()),
        )
        .map_err(|e| Error::Daemon(e.to_string()))?;
        for handler in daemon.get_epoll_handlers() {
            handler
                .register_listener(backend.epoll_fd(), EventSet::IN, u64::from(BACKEND_EVENT))
                .map_err(Error::EventLoop)?;
        }
        // The listener is readable, so this accept does not block.
        daemon
            .start(listener)
            .map_err(|e| Error::Daemon(e.to_string()))?;
        self.stats.add_frontend_connection();
        info!(guest_cid = cid, "VMM connected to the vsock device");

        let (stopped, result) = run_until_disconnect(daemon, format!("vsock-{cid}-wait"), stop)?;
        backend.reclaim_exit_fds();
        let reason = if stopped {
            "vgpud stopping"
        } else {
            "VMM disconnected"
        };
        backend.device().reset(reason);
        match result {
            Ok(()) => info!(guest_cid = cid, "{reason}"),
            Err(e) => info!(guest_cid = cid, error = %e, "{reason}"),
        }
        Ok(())
    }
}

/// Runs a started vhost-user daemon (one VMM connection) until the VMM disconnects or `stop`
/// fires, then drops it, which stops and joins its vring workers: nothing touches the device
/// afterwards. Returns whether `stop` fired and how the connection ended.
pub(crate) fn run_until_disconnect<T>(
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
pub(crate) fn wait_stop(stop: &StopHandle, delay: Duration) -> Result<bool, Error> {
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
pub(crate) fn wait_either(stop: &StopHandle, other: &impl AsRawFd) -> Result<bool, Error> {
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

/// Serves one VM's vsock device until `stop` fires: listens on `config.socket`, serves each VMM
/// connection in turn and resets the device (closing every connection) whenever the VMM leaves.
///
/// Use [`VsockServer::bind`] + [`VsockServer::run`] to read the counters while it runs.
pub fn serve(
    config: VsockConfig,
    connector: Arc<dyn PortConnector>,
    stop: StopHandle,
) -> Result<(), Error> {
    VsockServer::bind(config, connector)?.run(&stop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation() {
        let ok = VsockConfig::new(3, "/tmp/a", "/tmp/b");
        ok.validate().unwrap();
        for bad in [
            VsockConfig {
                guest_cid: 2,
                ..ok.clone()
            },
            VsockConfig {
                guest_cid: u64::from(u32::MAX),
                ..ok.clone()
            },
            VsockConfig {
                queue_size: 100,
                ..ok.clone()
            },
            VsockConfig {
                queue_size: 0,
                ..ok.clone()
            },
            VsockConfig {
                tx_buffer_size: 1,
                ..ok.clone()
            },
            VsockConfig {
                uds_path: "/tmp/a".into(),
                ..ok.clone()
            },
        ] {
            assert!(
                matches!(bad.validate(), Err(Error::InvalidConfig(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn bind_replaces_stale_sockets_but_not_files() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("vhost.sock");
        let uds = dir.path().join("vsock");
        drop(UnixListener::bind(&sock).unwrap());
        let s = VsockServer::bind(VsockConfig::new(3, &sock, &uds), Arc::new(ForwardAll)).unwrap();
        drop(s);
        std::fs::remove_file(&uds).unwrap();
        std::fs::write(&uds, b"precious").unwrap();
        let err =
            VsockServer::bind(VsockConfig::new(3, &sock, &uds), Arc::new(ForwardAll)).unwrap_err();
        assert!(matches!(err, Error::PathInUse(_)), "{err}");
        assert_eq!(std::fs::read(&uds).unwrap(), b"precious");
    }

    #[test]
    fn stop_handle_ends_an_idle_server_and_removes_its_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = VsockConfig::new(3, dir.path().join("v.sock"), dir.path().join("u"));
        let server = VsockServer::bind(cfg.clone(), Arc::new(ForwardAll)).unwrap();
        let stop = StopHandle::new().unwrap();
        let s2 = stop.clone();
        let t = thread::spawn(move || server.run(&s2));
        // A host client while no VM is attached is closed at once.
        let mut c = UnixStream::connect(&cfg.uds_path).unwrap();
        let mut buf = [0u8; 1];
        use std::io::Read;
        assert_eq!(c.read(&mut buf).unwrap(), 0);
        stop.stop();
        t.join().unwrap().unwrap();
        assert!(!cfg.socket.exists() && !cfg.uds_path.exists());
    }
}
