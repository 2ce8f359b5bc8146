//! vhost-user plumbing shared by vgpud's devices (`vgpu-vhost-vsock`, `vgpu-vhost-vgpu`), as
//! rust-vmm's vhost-device crates share theirs:
//!
//! - [`socket`]: the one socket binder (refuses a live socket, replaces a stale one, sets the
//!   mode);
//! - [`serve`]: the connection loop (one VMM connection after the other until a [`StopHandle`]
//!   fires) and starting a vhost-user daemon for a connection;
//! - [`vring`]: features, taking chains off a queue, signalling the guest, vring-worker exit
//!   events, a log limiter for guest-triggered messages;
//! - [`descriptors`]: walking a descriptor chain in guest memory, for devices that read their
//!   descriptors themselves;
//! - [`GuestMem`]: the guest memory map every scatter-gather chain is resolved against.

pub mod descriptors;
pub mod memory;
pub mod serve;
pub mod socket;
pub mod vring;

use std::io;

use thiserror::Error;

pub use descriptors::Descriptors;
pub use memory::{
    GuestRegion, for_each_slice_of_ranges, in_memory, region_holding, write_in_one_region,
};
pub use serve::{
    IdleWork, SESSION_RETRY_DELAY, StopHandle, run_until_disconnect, serve_vmm_connections,
    start_daemon, wait_either, wait_stop,
};
pub use socket::{SOCKET_MODE, SocketError, bind_socket};
pub use vring::{
    ChainHead, ExitEvents, LogLimiter, Rearm, UsedBatch, VIRTIO_FEATURES, add_used, describe_ring,
    fd_readable, has_available, kick_pending, next_head, protocol_features, read_config, rearm,
    signal, take_head, vring_ready, watch_rings,
};

/// The guest's memory as the VMM shared it: every descriptor address is resolved against it.
pub type GuestMem = vm_memory::GuestMemoryMmap<()>;

/// Why a device's connection loop failed.
#[derive(Debug, Error)]
pub enum Error {
    /// The device socket could not be bound.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// An epoll or eventfd operation failed.
    #[error("vhost-user event loop failure")]
    EventLoop(#[source] io::Error),
    /// The vhost-user daemon could not be created or started.
    #[error("vhost-user daemon failure: {0}")]
    Daemon(String),
}
