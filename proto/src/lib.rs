//! The vgpu wire protocol, shared by the guest shim (`libcuda.so.1`) and the
//! host daemon. docs/protocol.md is its specification.
//!
//! A session is a byte stream (unix socket, vsock connection, or the
//! virtio-vgpu device) carrying [`frame`]s. The client opens with
//! [`msg::Hello`]; the server answers with the tenant the transport
//! identified. Every later request either waits for one reply (synchronous)
//! or, for ops flagged [`msg::ASYNC_OK`] and sent with
//! [`frame::FLAG_ASYNC`], gets none: its error, if any, is returned by the
//! next synchronizing call, as CUDA reports errors of asynchronous work.

pub mod cuda;
pub mod doorbell;
pub mod fdpass;
pub mod frame;
pub mod graph;
pub mod msg;
pub mod pagehash;
pub mod spec;
pub mod spin;
pub mod wire;

/// Protocol version spoken by this build. A server refuses other versions.
pub const PROTOCOL_VERSION: u32 = 1;

/// The vsock port on the host (CID 2) where vgpud serves the GPU.
pub const GPU_VSOCK_PORT: u32 = 0x5647; // "VG"

/// The host's vsock CID.
pub const HOST_CID: u32 = 2;

/// The CUDA driver version the shim reports (`cuDriverGetVersion`): 12.9.
pub const CUDA_DRIVER_VERSION: i32 = 13000;

/// Version of this crate, sent in the handshake.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
