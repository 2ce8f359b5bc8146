//! vgpud: the host daemon that connects VMs and processes to the vgpu broker.
//!
//! - [`daemon`]: builds devices and the broker from the config and runs everything;
//! - [`listener`]: unix-socket listeners, one per VM;
//! - [`admin`]: the REST/JSON admin API;
//! - [`vsock`]: the vhost-user virtio-vsock device for VMs;
//! - [`gpu_port`]: serves the GPU port of each VM's vsock device in-process.

pub mod admin;
pub mod daemon;
pub mod gpu_port;
pub mod listener;
pub mod vsock;
