//! Kubernetes and KubeVirt integration for vgpu.
//!
//! - [`plugin`]: the kubelet device plugin (`vgpu-device-plugin`): one
//!   resource per vGPU profile, devices from vgpud's admin API.
//! - [`sidecar`]: the KubeVirt hook sidecar (`vgpu-kubevirt-sidecar`): adds
//!   the vgpu device and shared memory to a VMI's domain XML.
//! - [`api`]: the generated gRPC code (kubelet device-plugin v1beta1,
//!   pod-resources v1, KubeVirt hooks).
//! - [`admin`]: a small client of vgpud's admin API.

pub mod admin;
pub mod api;
pub mod plugin;
pub mod sidecar;
pub mod slots;
