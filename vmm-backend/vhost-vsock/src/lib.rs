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
pub mod inproc;
pub mod packet;
mod stats;

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;

use thiserror::Error;
use tracing::{debug, info};
use vgpu_vhost_user::{
    IdleWork, SOCKET_MODE, SocketError, bind_socket, run_until_disconnect, serve_vmm_connections,
    start_daemon,
};
use vhost::vhost_user::Listener;

pub use backend::BACKEND_EVENT;
pub use connection::Endpoint;
pub use device::{
    HOST_PORT_BASE, MAX_CONNECT_LINE, MAX_CONNECTIONS, MAX_PENDING_HOST_CLIENTS, forward_path,
};
pub use stats::{VsockStats, VsockStatsSnapshot};
pub use vgpu_vhost_user::{StopHandle, VIRTIO_FEATURES, protocol_features};

use backend::VsockBackend;
use device::VsockDevice;

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
/// `buf_alloc` of an in-process connection (the GPU port) that got a large ring, and the size of
/// that ring towards the session. At 256 KiB a guest copying bulk data to vgpud waits for a credit
/// update (thread wake-ups) every 256 KiB; 4 MiB keeps 64 maximal packets in flight. Since
/// `fwd_cnt` counts bytes entering the ring, such a connection holds at most twice this much guest
/// data: a full ring plus `buf_alloc` bytes waiting in its `tx_buf`. A `tx_buffer_size` above this
/// is used instead.
pub const GPU_PORT_BUFFER: u32 = 4 * 1024 * 1024;
/// Size of the ring from the session back to the device of an in-process connection that got
/// large rings (the guest's `buf_alloc` bounds what the device sends, not this). A session
/// writing a large reply (a device-to-host copy) into the default 256 KiB ring slept for room
/// and was woken every 64 KiB, each wake-up tens of microseconds of both threads on these VMs;
/// with 1 MiB, once per 256 KiB.
pub const GPU_PORT_REPLY_RING: usize = 1024 * 1024;
/// Per-device (per-VM) budget for the large rings of in-process connections. A connection that
/// finds it spent gets a `DEFAULT_RING_CAPACITY` ring and advertises `tx_buffer_size`, as every
/// connection did before; the budget is returned when the ring is freed (the connection closes or
/// is reset, the device resets, the VMM disconnects, and the session has let go of its end).
pub const MAX_LARGE_RING_BYTES: u64 = 64 * 1024 * 1024;
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
    /// A socket could not be bound (it is served by another process, the path is not a socket,
    /// or binding failed).
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// An epoll or eventfd operation failed.
    #[error("vsock event loop failure")]
    EventLoop(#[source] io::Error),
    /// The vhost-user daemon could not be created or started.
    #[error("vhost-user daemon failure: {0}")]
    Daemon(String),
}

impl From<vgpu_vhost_user::Error> for Error {
    fn from(e: vgpu_vhost_user::Error) -> Self {
        match e {
            vgpu_vhost_user::Error::Socket(e) => Error::Socket(e),
            vgpu_vhost_user::Error::EventLoop(e) => Error::EventLoop(e),
            vgpu_vhost_user::Error::Daemon(why) => Error::Daemon(why),
        }
    }
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
    /// `Some(Ok(endpoint))`: the port is served in-process and the device shuttles bytes between
    /// the guest connection and `endpoint`: an [`inproc::DeviceEnd`] (the service keeps the
    /// [`inproc::SessionEnd`]; bytes move through shared rings, no socket) or a `UnixStream`.
    /// `None`: forward to `<uds_path>_<port>`. `Some(Err(_))` refuses the connection (the guest
    /// gets an RST).
    fn connect(&self, port: u32) -> Option<io::Result<Endpoint>>;
}

/// A connector that serves nothing in-process: every port is forwarded.
#[derive(Debug, Default, Clone, Copy)]
pub struct ForwardAll;

impl PortConnector for ForwardAll {
    fn connect(&self, _port: u32) -> Option<io::Result<Endpoint>> {
        None
    }
}

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

/// While no VM is attached, host clients of the hybrid-vsock socket are closed at once instead of
/// hanging.
struct TurnAwayHostClients<'a> {
    uds_listener: &'a UnixListener,
    stats: &'a VsockStats,
}

impl IdleWork for TurnAwayHostClients<'_> {
    fn fd(&self) -> RawFd {
        self.uds_listener.as_raw_fd()
    }

    fn run(&self) {
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
}

impl VsockServer {
    /// Validates `config` and binds the vhost-user socket and the hybrid-vsock socket with
    /// [`bind_socket`] (a stale socket from an earlier run is replaced, a live one or another
    /// file is refused).
    pub fn bind(config: VsockConfig, connector: Arc<dyn PortConnector>) -> Result<Self, Error> {
        config.validate()?;
        let vmm_listener = bind_socket(&config.socket, SOCKET_MODE)?;
        let uds_listener = match bind_socket(&config.uds_path, SOCKET_MODE) {
            Ok(l) => l,
            Err(e) => {
                let _ = std::fs::remove_file(&config.socket);
                return Err(e.into());
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
        info!(
            guest_cid = self.config.guest_cid,
            socket = %self.config.socket.display(),
            uds_path = %self.config.uds_path.display(),
            "vsock device waiting for the VMM"
        );
        let idle = TurnAwayHostClients {
            uds_listener: &self.uds_listener,
            stats: &self.stats,
        };
        let result = serve_vmm_connections(
            &format!("vsock-{}", self.config.guest_cid),
            &mut listener,
            stop,
            Some(&idle),
            |listener| self.serve_frontend(listener, stop),
        )
        .map_err(Error::from);
        drop(listener);
        let _ = std::fs::remove_file(&self.config.socket);
        let _ = std::fs::remove_file(&self.config.uds_path);
        info!(guest_cid = self.config.guest_cid, "vsock device stopped");
        result
    }

    fn serve_frontend(&self, listener: &mut Listener, stop: &StopHandle) -> Result<(), Error> {
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
        // Counted before the daemon starts serving, so the count never lags what the VMM
        // can already observe through the device.
        self.stats.add_frontend_connection();
        let daemon = start_daemon(
            format!("vsock-{cid}"),
            backend.clone(),
            backend.epoll_fd(),
            BACKEND_EVENT,
            listener,
        )?;
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
        assert!(
            matches!(err, Error::Socket(SocketError::NotASocket(_))),
            "{err}"
        );
        assert_eq!(std::fs::read(&uds).unwrap(), b"precious");
    }

    #[test]
    fn stop_handle_ends_an_idle_server_and_removes_its_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = VsockConfig::new(3, dir.path().join("v.sock"), dir.path().join("u"));
        let server = VsockServer::bind(cfg.clone(), Arc::new(ForwardAll)).unwrap();
        let stop = StopHandle::new().unwrap();
        let s2 = stop.clone();
        let t = std::thread::spawn(move || server.run(&s2));
        // A host client while no VM is attached is closed at once.
        let mut c = std::os::unix::net::UnixStream::connect(&cfg.uds_path).unwrap();
        let mut buf = [0u8; 1];
        use std::io::Read;
        assert_eq!(c.read(&mut buf).unwrap(), 0);
        stop.stop();
        t.join().unwrap().unwrap();
        assert!(!cfg.socket.exists() && !cfg.uds_path.exists());
    }
}
