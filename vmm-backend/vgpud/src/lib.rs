//! vgpud: the host daemon that connects VMs and processes to the vgpu broker.
//!
//! - [`Daemon`] (`app.rs`): a running vgpud: the runtime plus the admin API and the metrics
//!   endpoint;
//! - [`daemon`]: the [`daemon::Runtime`]: builds devices and the broker from the config, runs
//!   the VMs' transports and applies live changes (API requests, `SIGHUP` reloads);
//! - [`listener`]: unix-socket listeners, one per VM;
//! - [`session_hub`]: session threads, ending a VM's sessions, session audit;
//! - [`admin`]: the REST/JSON admin API;
//! - [`metrics`]: the Prometheus text endpoint;
//! - [`http`]: the HTTP/1.1 layer both share;
//! - [`audit`]: the append-only JSON-lines audit log;
//! - [`signals`]: `SIGHUP`/`SIGTERM`/`SIGINT` read from a signalfd on tokio, with their sender;
//! - [`inventory`]: the host's real GPUs through NVML;
//! - [`usage`]: compute usage of VMs and devices;
//! - [`gpu_port`]: serves the GPU port of each VM's vsock device in-process;
//! - [`vgpu_service`]: the broker behind each VM's virtio-vgpu device.
//!
//! The config file, its rendering and the reload diff are `vgpu-config` (`broker/config`).
//! The vhost-user devices are crates of their own, composed here: `vgpu-vhost-vsock`
//! (`vmm-backend/vhost-vsock`), `vgpu-vhost-vgpu` (`vmm-backend/vhost-vgpu`), sharing
//! `vgpu-vhost-user` (`vmm-backend/vhost-user`).

pub mod admin;
mod app;
pub mod audit;
pub mod daemon;
pub mod gpu_port;
pub mod http;
pub mod inventory;
pub mod listener;
pub mod metrics;
pub mod passthrough;
pub mod server;
pub mod session_hub;
pub mod signals;
pub mod tuning;
pub mod usage;
pub mod vgpu_service;

pub use app::Daemon;
