//! [`Daemon`]: a running vgpud, composed of the [`Runtime`] (`daemon.rs`: the broker, the VMs and
//! their transports) and the endpoints that work on it: the admin API (`admin.rs`) and the
//! metrics endpoint (`metrics.rs`). They depend on the runtime, the runtime on neither.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;
use tracing::info;
use vgpu_broker::Broker;
use vgpu_config::Config;

use crate::admin::AdminServer;
use crate::audit::{Actor, Durability};
use crate::daemon::{DaemonError, OpError, ReloadReport, Runtime};
use crate::metrics::MetricsServer;
use crate::passthrough::HostRoots;

/// A running vgpud.
pub struct Daemon {
    rt: Arc<Runtime>,
    admin: Option<AdminServer>,
    metrics: Option<MetricsServer>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon").field("runtime", &self.rt).finish()
    }
}

impl Daemon {
    /// Starts everything the config declares.
    pub fn start(config: &Config) -> Result<Daemon, DaemonError> {
        Self::start_with(config, HostRoots::default())
    }

    /// [`Daemon::start`], reading passthrough devices from the sysfs and procfs at `host_roots`.
    pub fn start_with(config: &Config, host_roots: HostRoots) -> Result<Daemon, DaemonError> {
        let rt = Runtime::start_with(config, host_roots)?;
        // Recorded before the admin API listens, so that the log's first entry is the start and
        // every change made through the API comes after it.
        if let Some(a) = rt.audit() {
            a.record(
                "daemon.start",
                json!({
                    "actor": Actor::Daemon, "pid": std::process::id(),
                    "version": env!("CARGO_PKG_VERSION"), "config": config.path,
                    "vms": config.vms.iter().map(|v| v.name.clone()).collect::<Vec<_>>(),
                }),
                Durability::Synced,
            );
        }
        let metrics = match config.admin.metrics_listen {
            Some(addr) => {
                let m = MetricsServer::start(Arc::clone(&rt), addr)
                    .map_err(|source| DaemonError::Metrics { addr, source })?;
                info!(addr = %m.local_addr(), "metrics endpoint listening");
                rt.set_metrics_addr(m.local_addr());
                Some(m)
            }
            None => None,
        };
        let admin = match &config.admin.socket {
            Some(p) => {
                let a = AdminServer::start(Arc::clone(&rt), p, &config.path)?;
                info!(socket = %p.display(), "admin API listening");
                Some(a)
            }
            None => None,
        };
        crate::tuning::Tuner::start(&rt);
        Ok(Daemon { rt, admin, metrics })
    }

    /// The broker.
    pub fn broker(&self) -> &Arc<Broker> {
        self.rt.broker()
    }

    /// The runtime (what the admin API works on).
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.rt
    }

    /// Paths of the VM sockets.
    pub fn socket_paths(&self) -> Vec<PathBuf> {
        self.rt.socket_paths()
    }

    /// Reloads the config file (`SIGHUP`).
    pub fn reload(&self, actor: Actor, path: &Path) -> Result<ReloadReport, OpError> {
        self.rt.reload(actor, path)
    }

    /// Stops listening and removes the sockets; every session ends and
    /// releases its resources (bounded wait).
    pub fn shutdown(self) {
        drop(self.admin);
        drop(self.metrics);
        self.rt.shutdown();
    }
}
