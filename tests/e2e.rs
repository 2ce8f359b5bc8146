//! End-to-end tests that can share one process: a real vgpud on the simulated GPU, programs
//! through the shim in child processes, real QEMU guests, the admin API and tools. One test binary
//! (each binary links the whole workspace), one module per file.
//!
//! A new test file `tests/foo.rs` joins this binary with a `mod foo;` line below, unless it loads
//! `libcuda.so.1` into the test process or measures CPU shares (see tests/Cargo.toml). Run one
//! module with `cargo test -p vgpu-tests --test e2e foo::`.

mod admin_support;

mod admin_api;
mod admin_cli;
mod admin_reload;
mod alloc_api;
mod attacks;
mod conformance_sim;
mod graphs;
mod ipc;
mod kernels_c;
mod libvirt_domain;
mod memory_policy;
mod nvml;
mod pinned;
mod python_driver;
mod qemu_boot;
mod qemu_vsock;
mod runtime;
mod shim_c;
mod soak;
mod tools;
mod vgpu_dev;
mod vgpu_dev_vm;
mod vm_hybrid;
mod vm_install;
mod vm_kill;
mod vm_ports;
mod vm_slices;
mod vm_workload;
