//! The test harness of vgpud's vhost-user devices: in-process stand-ins for QEMU plus a guest
//! driver. Not part of the product: a dev-dependency of the tests, and a dependency of the
//! benchmarks (`vgpu-bench`).
//!
//! - [`vsock`]: QEMU plus the guest's `vmw_vsock_virtio_transport`, against `vgpu-vhost-vsock`;
//! - [`vgpu`]: QEMU plus the guest's `vgpu` kernel module, against `vgpu-vhost-vgpu`;
//! - [`driver_queue`]: the driver side of one split virtqueue, shared by both.

pub mod driver_queue;
pub mod vgpu;
pub mod vsock;
