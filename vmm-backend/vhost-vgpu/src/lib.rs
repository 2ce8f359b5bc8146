//! The virtio-vgpu device: a paravirtual GPU on the guest's PCI bus, served over vhost-user, one
//! per VM.
//!
//! vgpud listens on [`VgpuDevConfig::socket`] for the VMM (QEMU ≥ 10.2
//! `vhost-user-test-device-pci`, cloud-hypervisor ≥ v53 `--generic-vhost-user`) and serves the
//! guest's `vgpu` kernel module (`guest-shim/kmod`), which exposes `/dev/vgpu0…` to the guest shim:
//!
//! * the device has its own virtio device ID ([`DEFAULT_DEVICE_ID`] unless configured), a control
//!   queue (synchronous calls, session open and close) and a submission queue (asynchronous
//!   calls), and a config space with the protocol version, the VM's slice size and the GPU's name
//!   ([`wire`]);
//! * every open file of `/dev/vgpuN` is a session of the VM's tenant; its vgpu protocol frames
//!   travel one per descriptor chain, and their bulk bytes (copies, module images, kernel
//!   parameters) as descriptors that point at the application's pinned pages: vgpud validates
//!   every range against the guest memory map and copies straight between those pages and device
//!   memory, with no buffer in between ([`chain`], [`exec`]);
//! * when the VMM disconnects, resets the device or stops its queues (guest driver reset, reboot),
//!   every session ends and releases its GPU memory ([`device`]).
//!
//! See `docs/vgpu-device.md`.

mod backend;
pub mod chain;
mod device;
pub mod exec;
mod session_thread;
mod shared;
mod stats;
pub mod wire;

use std::io;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;

use thiserror::Error;
use tracing::info;
use vgpu_vhost_user::{
    SOCKET_MODE, SocketError, bind_socket, run_until_disconnect, serve_vmm_connections,
    start_daemon,
};
use vhost::vhost_user::Listener;

pub use backend::VgpuBackend;
pub use device::{MAX_SESSIONS, VgpuDevice};
pub use exec::{
    BatchResult, BulkSink, BulkSource, Call, NoBulk, Reply, SessionExecutor, VgpuService,
    call_batched,
};
pub use session_thread::MAX_REORDER;
pub use stats::{VgpuDevStats, VgpuDevStatsSnapshot};
pub use vgpu_vhost_user::StopHandle;

/// The device ID when `vgpu_device_id` is not configured: the last one the virtio PCI transport
/// can carry (PCI device ID 0x1040 + 63 = 0x107f), unassigned by the VIRTIO specification (whose
/// IDs run from 1 into the forties).
pub const DEFAULT_DEVICE_ID: u16 = vgpu_config::DEFAULT_VGPU_DEVICE_ID;
/// The device ID to configure for QEMU, whose generic device presents only IDs it has a name for
/// (`vgpu_config::qemu_presents_device_id`); the guest module binds it besides
/// [`DEFAULT_DEVICE_ID`], and only when the config space carries the vgpu magic.
pub const QEMU_DEVICE_ID: u16 = vgpu_config::QEMU_VGPU_DEVICE_ID;
/// Largest device ID a modern virtio PCI device can have (Linux binds 0x1040..=0x107f).
pub const MAX_DEVICE_ID: u16 = vgpu_config::MAX_VGPU_DEVICE_ID;
/// Default (and largest) virtqueue size: the most descriptors a request chain may use.
pub const DEFAULT_QUEUE_SIZE: u16 = vgpu_config::VGPU_QUEUE_SIZE;

/// Why the device could not be served.
#[derive(Debug, Error)]
pub enum Error {
    /// The configuration cannot work.
    #[error("invalid virtio-vgpu device configuration: {0}")]
    InvalidConfig(String),
    /// The vhost-user socket could not be bound (it is served by another process, the path is not
    /// a socket, or binding failed).
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// An epoll or eventfd operation failed.
    #[error("virtio-vgpu event loop failure")]
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

/// Configuration of one VM's virtio-vgpu device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VgpuDevConfig {
    /// The VM's name (for logs and thread names).
    pub vm: String,
    /// The vhost-user socket vgpud listens on for the VMM.
    pub socket: PathBuf,
    /// The virtio device ID the VMM must present (informational here: the VMM sets it).
    pub device_id: u16,
    /// Virtqueue size offered to the VMM (power of two).
    pub queue_size: u16,
}

impl VgpuDevConfig {
    /// A configuration with the default device ID and queue size.
    pub fn new(vm: &str, socket: impl Into<PathBuf>) -> Self {
        VgpuDevConfig {
            vm: vm.to_string(),
            socket: socket.into(),
            device_id: DEFAULT_DEVICE_ID,
            queue_size: DEFAULT_QUEUE_SIZE,
        }
    }

    /// Checks the values a device can work with.
    pub fn validate(&self) -> Result<(), Error> {
        if !(1..=MAX_DEVICE_ID).contains(&self.device_id) {
            return Err(Error::InvalidConfig(format!(
                "device ID {} must be between 1 and {MAX_DEVICE_ID}",
                self.device_id
            )));
        }
        if !self.queue_size.is_power_of_two() || self.queue_size > DEFAULT_QUEUE_SIZE {
            return Err(Error::InvalidConfig(format!(
                "queue_size {} must be a power of two up to {DEFAULT_QUEUE_SIZE}",
                self.queue_size
            )));
        }
        Ok(())
    }
}

/// A bound virtio-vgpu device server: the socket exists once this is constructed.
pub struct VgpuDevServer {
    config: VgpuDevConfig,
    service: Arc<dyn VgpuService>,
    stats: Arc<VgpuDevStats>,
    listener: Option<UnixListener>,
}

impl std::fmt::Debug for VgpuDevServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VgpuDevServer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl VgpuDevServer {
    /// Validates `config` and binds the vhost-user socket with [`bind_socket`] (a stale socket
    /// from an earlier run is replaced, a live one or another file is refused).
    pub fn bind(config: VgpuDevConfig, service: Arc<dyn VgpuService>) -> Result<Self, Error> {
        config.validate()?;
        let listener = bind_socket(&config.socket, SOCKET_MODE)?;
        Ok(VgpuDevServer {
            config,
            service,
            stats: Arc::new(VgpuDevStats::default()),
            listener: Some(listener),
        })
    }

    /// The device's counters; stay valid after the server returns.
    pub fn stats(&self) -> Arc<VgpuDevStats> {
        self.stats.clone()
    }

    /// The configuration in use.
    pub fn config(&self) -> &VgpuDevConfig {
        &self.config
    }

    /// Serves VMM connections one after the other until `stop` fires.
    pub fn run(mut self, stop: &StopHandle) -> Result<(), Error> {
        let Some(l) = self.listener.take() else {
            return Err(Error::Daemon("server already ran".into()));
        };
        let mut listener = Listener::from(l);
        info!(
            vm = %self.config.vm,
            socket = %self.config.socket.display(),
            device_id = self.config.device_id,
            "virtio-vgpu device waiting for the VMM"
        );
        let result = serve_vmm_connections(
            &format!("vgpu-dev-{}", self.config.vm),
            &mut listener,
            stop,
            None,
            |listener| self.serve_frontend(listener, stop),
        )
        .map_err(Error::from);
        drop(listener);
        let _ = std::fs::remove_file(&self.config.socket);
        info!(vm = %self.config.vm, "virtio-vgpu device stopped");
        result
    }

    fn serve_frontend(&self, listener: &mut Listener, stop: &StopHandle) -> Result<(), Error> {
        let vm = self.config.vm.clone();
        let device = VgpuDevice::new(&vm, self.service.clone(), self.stats.clone());
        let backend = Arc::new(
            VgpuBackend::new(device, self.service.clone(), self.config.queue_size)
                .map_err(Error::EventLoop)?,
        );
        // Counted before the daemon starts serving, so the count never lags what the VMM
        // can already observe through the device.
        self.stats.add_frontend_connection();
        let daemon = start_daemon(
            format!("vgpu-dev-{vm}"),
            backend.clone(),
            backend.rescan_fd(),
            shared::RESCAN_EVENT,
            listener,
        )?;
        info!(vm = %vm, "VMM connected to the virtio-vgpu device");

        let (stopped, result) = run_until_disconnect(daemon, format!("vgpu-dev-{vm}-wait"), stop)?;
        backend.reclaim_exit_fds();
        let reason = if stopped {
            "vgpud stopping"
        } else {
            "VMM disconnected"
        };
        backend.device().reset(reason);
        match result {
            Ok(()) => info!(vm = %vm, "{reason}"),
            Err(e) => info!(vm = %vm, error = %e, "{reason}"),
        }
        Ok(())
    }
}

/// Serves one VM's virtio-vgpu device until `stop` fires.
pub fn serve(
    config: VgpuDevConfig,
    service: Arc<dyn VgpuService>,
    stop: StopHandle,
) -> Result<(), Error> {
    VgpuDevServer::bind(config, service)?.run(&stop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation() {
        let ok = VgpuDevConfig::new("vm1", "/tmp/x.sock");
        ok.validate().unwrap();
        for bad in [
            VgpuDevConfig {
                device_id: 0,
                ..ok.clone()
            },
            VgpuDevConfig {
                device_id: 64,
                ..ok.clone()
            },
            VgpuDevConfig {
                queue_size: 100,
                ..ok.clone()
            },
            VgpuDevConfig {
                queue_size: 2048,
                ..ok.clone()
            },
        ] {
            assert!(
                matches!(bad.validate(), Err(Error::InvalidConfig(_))),
                "{bad:?}"
            );
        }
    }
}
