//! Integration tests of the vsock device, against the in-process QEMU and guest driver of
//! `vgpu-vmm-testutils`: one test binary, one module per topic (a new topic is a new file here
//! plus a `mod` line below). `vsock_fds.rs` counts the process's descriptors, so it is a binary of
//! its own.

mod vsock_echo;
mod vsock_flow;
mod vsock_lifecycle;
mod vsock_robustness;
