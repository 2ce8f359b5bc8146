//! vgpud: the host daemon that connects VMs and processes to the vgpu broker.
//!
//! - [`daemon`]: builds devices and the broker from the config, runs
//!   everything and applies live changes (API requests, `SIGHUP` reloads);
//! - [`listener`]: unix-socket listeners, one per VM;
//! - [`sessions`]: session threads, ending a VM's sessions, session audit;
//! - [`admin`]: the REST/JSON admin API;
//! - [`metrics`]: the Prometheus text endpoint;
//! - [`audit`]: the append-only JSON-lines audit log;
//! - [`reload`]: live changes checked with the config file's rules;
//! - [`inventory`]: the host's real GPUs through NVML;
//! - [`usage`]: compute usage of VMs and devices;
//! - [`vsock`]: the vhost-user virtio-vsock device for VMs;
//! - [`vgpu_dev`]: the vhost-user virtio-vgpu device (paravirtual GPU, zero-copy transfers);
//! - [`gpu_port`]: serves the GPU port of each VM's vsock device in-process.

pub mod admin;
pub mod audit;
pub mod daemon;
mod driver_queue;
pub mod gpu_port;
pub mod inventory;
pub mod listener;
pub mod metrics;
pub mod passthrough;
pub mod reload;
pub mod sessions;
pub mod tuning;
pub mod usage;
pub mod vgpu_dev;
pub mod vsock;

/// Returns the heap memory freed by an ended session to the system. glibc keeps
/// freed memory in per-thread arenas; a session's thread has exited, so what its
/// arena held would otherwise stay in vgpud's resident set until another thread
/// reuses the arena.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap pages; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}
