//! The daemon: builds devices and the broker from a config, and runs the
//! listeners and the admin API until shut down.

use std::path::PathBuf;
use std::sync::Arc;

use thiserror::Error;
use tracing::info;
use vgpu_broker::config::{Config, DeviceKind};
use vgpu_broker::device::Device;
use vgpu_broker::{Broker, BrokerError};
use vgpu_sim::{SimConfig, SimDevice};

use crate::admin::AdminServer;
use crate::listener::{Listener, ListenerError};

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
}

/// A running vgpud.
#[derive(Debug)]
pub struct Daemon {
    broker: Arc<Broker>,
    listeners: Vec<Listener>,
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
        let mut listeners = Vec::new();
        for vm in &config.vms {
            let tenant = broker.add_tenant(vm)?;
            if let Some(path) = &vm.unix_socket {
                listeners.push(Listener::start(Arc::clone(&broker), tenant, path)?);
                info!(vm = %vm.name, socket = %path.display(), "listening");
            }
        }
        let admin = match &config.admin.socket {
            Some(p) => {
                let a = AdminServer::start(Arc::clone(&broker), p)?;
                info!(socket = %p.display(), "admin API listening");
                Some(a)
            }
            None => None,
        };
        Ok(Daemon {
            broker,
            listeners,
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

    /// Stops listening and removes the sockets. Live sessions end when their
    /// clients disconnect.
    pub fn shutdown(self) {
        drop(self.admin);
        drop(self.listeners);
        info!("vgpud stopped");
    }
}
