//! Integration tests of the daemon: one test binary, one module per topic (a new topic is a new
//! file here plus a `mod` line below).

mod admin_runtime;
mod daemon_stdout;
mod daemon_vsock;
mod gpu_port_ring;
