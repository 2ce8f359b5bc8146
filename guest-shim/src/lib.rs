//! `libcuda.so.1` for vgpu guests.
//!
//! Programs load this library instead of NVIDIA's driver. Each CUDA driver
//! API call is encoded with `vgpu-proto` and sent to vgpud over the
//! virtio-vgpu device (`/dev/vgpu0` of the `vgpu` kernel module, bulk data
//! passed in place: [`devlink`]) or vsock (inside a VM), or a unix socket
//! (`VGPU_TRANSPORT`), where the broker runs it within the VM's memory slice
//! and compute share.
//!
//! It also implements NVML ([`nvml`]; the guest's `libnvidia-ml.so.1` is a filter library
//! whose symbols resolve here): NVML's answers about the VM's GPU, over the same session.
//!
//! Layers: [`exports`] is the C ABI, a thin wrapper over [`driver`] (safe
//! Rust), which talks through [`client`] over a [`transport`].

pub mod alloc_api;
pub mod alloc_exports;
pub mod arrays;
pub mod async_notify;
pub mod client;
pub mod compat;
pub mod copies;
pub mod ctx_storage;
pub mod devlink;
pub mod devout;
pub mod doorbell;
pub mod driver;
pub mod exec_affinity;
pub mod export_tables;
pub mod exports;
pub mod ffi;
pub mod graph;
pub mod green_ctx;
pub mod host_func;
pub mod integrity;
pub mod interop;
pub mod legacy_launch;
pub mod library;
pub mod linker;
pub mod log;
pub mod logs;
pub mod mem_ops;
pub mod not_supported;
pub mod nvml;
pub mod peer;
pub mod per_thread;
pub mod pinned;
pub mod pinned_uva;
pub mod pointer;
pub mod procaddr;
pub mod stream_attrs;
pub mod stream_capture;
pub mod sync_wait;
pub mod texrefs;
pub mod textures;
pub mod transport;
pub mod user_objects;
pub mod visible;
