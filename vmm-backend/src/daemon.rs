//! The daemon: builds devices and the broker from a config, and runs the
//! listeners and the admin API until shut down.

use std::path::PathBuf;
use std::sync::Arc;

use thiserror::Error;
use tracing::info;
use vgpu_broker::config::{Config, DeviceKind, VmMode};
use vgpu_broker::device::Device;
use vgpu_broker::{Broker, BrokerError};
use vgpu_sim::{SimConfig, SimDevice};

use crate::admin::AdminServer;
use crate::gpu_port::GpuPortConnector;
use crate::listener::{Listener, ListenerError};
use crate::vsock::{self, StopHandle, VsockConfig, VsockServer, VsockStats};

/// Why the daemon could not start.
#[derive(Debug, Error)]
pub enum DaemonError {
    /// A device could not be created.
    #[error("device `{name}`: {message}")]
    Device {
        /// Device name.
        name: String,
        /// Why.
        message: String,
    },
    /// A tenant could not be added.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// A socket could not be set up.
    #[error(transparent)]
    Listener(#[from] ListenerError),
    /// A VM's vsock device could not be set up.
    #[error("VM `{vm}`: cannot start its vsock device")]
    Vsock {
        /// VM name.
        vm: String,
        /// Cause.
        #[source]
        source: vsock::Error,
    },
}

/// A VM's vsock device while it runs.
#[derive(Debug)]
pub struct VsockDevice {
    /// VM name.
    pub vm: String,
    /// Its configuration.
    pub config: VsockConfig,
    /// Its counters.
    pub stats: Arc<VsockStats>,
    stop: StopHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for VsockDevice {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the admin API shows of the daemon's transports.
#[derive(Debug, Default)]
pub struct Transports {
    /// Running vsock devices.
    pub vsock: Vec<VsockDevice>,
}

impl Transports {
    /// The vsock device of a VM.
    pub fn vsock_of(&self, vm: &str) -> Option<&VsockDevice> {
        self.vsock.iter().find(|d| d.vm == vm)
    }
}

/// A running vgpud.
#[derive(Debug)]
pub struct Daemon {
    broker: Arc<Broker>,
    listeners: Vec<Listener>,
    transports: Arc<Transports>,
    admin: Option<AdminServer>,
}

/// Worker threads of a simulated GPU when the config does not say.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Devices with their config names.
pub type NamedDevices = Vec<(String, Arc<dyn Device>)>;

/// Creates the devices a config declares.
pub fn build_devices(config: &Config) -> Result<NamedDevices, DaemonError> {
    config
        .devices
        .iter()
        .map(|d| {
            let dev: Arc<dyn Device> = match &d.kind {
                DeviceKind::Sim => Arc::new(SimDevice::new(SimConfig {
                    name: d.name.clone(),
                    memory: d.memory,
                    workers: d.workers.unwrap_or_else(default_workers),
                    watchdog: d.watchdog,
                })),
                DeviceKind::Cuda { .. } => {
                    return Err(DaemonError::Device {
                        name: d.name.clone(),
                        message:
                            "kind = \"cuda\" is not available in this build yet; use kind = \"sim\""
                                .into(),
                    });
                }
            };
            Ok((d.name.clone(), dev))
        })
        .collect()
}

impl Daemon {
    /// Starts everything the config declares.
    pub fn start(config: &Config) -> Result<Daemon, DaemonError> {
        let broker = Arc::new(Broker::new(build_devices(config)?));
        for d in &config.devices {
            broker.set_scheduling(&d.name, d.scheduling)?;
        }
        let mut listeners = Vec::new();
        let mut transports = Transports::default();
        for vm in &config.vms {
            if vm.mode != VmMode::Shared {
                // A passthrough VM owns a whole device through VFIO; vgpud
                // only records it (see docs/passthrough.md).
                continue;
            }
            let tenant = broker.add_tenant(vm)?;
            if let Some(path) = &vm.unix_socket {
                listeners.push(Listener::start(
                    Arc::clone(&broker),
                    Arc::clone(&tenant),
                    path,
                )?);
                info!(vm = %vm.name, socket = %path.display(), "listening");
            }
            if let (Some(socket), Some(cid), Some(uds)) =
                (&vm.vhost_user_socket, vm.guest_cid, &vm.vsock_uds_path)
            {
                let connector = Arc::new(GpuPortConnector::new(Arc::clone(&broker), tenant, cid));
                transports.vsock.push(start_vsock(
                    &vm.name,
                    VsockConfig::new(cid, socket, uds),
                    connector,
                )?);
                info!(vm = %vm.name, socket = %socket.display(), cid, "vhost-user vsock device ready");
            }
        }
        let transports = Arc::new(transports);
        let admin = match &config.admin.socket {
            Some(p) => {
                let a = AdminServer::start(Arc::clone(&broker), Arc::clone(&transports), p)?;
                info!(socket = %p.display(), "admin API listening");
                Some(a)
            }
            None => None,
        };
        Ok(Daemon {
            broker,
            listeners,
            transports,
            admin,
        })
    }

    /// The broker.
    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    /// Paths of the VM sockets.
    pub fn socket_paths(&self) -> Vec<PathBuf> {
        self.listeners
            .iter()
            .map(|l| l.path().to_path_buf())
            .collect()
    }

    /// The running transports.
    pub fn transports(&self) -> &Arc<Transports> {
        &self.transports
    }

    /// Stops listening and removes the sockets; vsock devices close their
    /// connections, so their sessions end. Sessions on unix sockets end when
    /// their clients disconnect.
    pub fn shutdown(self) {
        drop(self.admin);
        drop(self.listeners);
        drop(self.transports);
        info!("vgpud stopped");
    }
}

fn start_vsock(
    vm: &str,
    config: VsockConfig,
    connector: Arc<GpuPortConnector>,
) -> Result<VsockDevice, DaemonError> {
    let err = |source| DaemonError::Vsock {
        vm: vm.to_string(),
        source,
    };
    let server = VsockServer::bind(config.clone(), connector).map_err(err)?;
    let stats = server.stats();
    let stop = StopHandle::new().map_err(|e| err(vsock::Error::EventLoop(e)))?;
    let stop2 = stop.clone();
    let name = vm.to_string();
    let thread = std::thread::Builder::new()
        .name(format!("vgpu-vsock-{vm}"))
        .spawn(move || {
            if let Err(e) = server.run(&stop2) {
                tracing::error!(vm = %name, error = %e, "vsock device stopped");
            }
        })
        .map_err(|e| err(vsock::Error::EventLoop(e)))?;
    Ok(VsockDevice {
        vm: vm.to_string(),
        config,
        stats,
        stop,
        thread: Some(thread),
    })
}
