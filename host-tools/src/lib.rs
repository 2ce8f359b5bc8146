//! vgpuctl: the administration CLI of vgpud.
//!
//! - [`cli`]: the commands and their output;
//! - [`api`]: the admin API client (HTTP/1.1 + JSON over a unix socket);
//! - [`top`]: the live terminal view;
//! - [`doctor`]: host checks;
//! - [`attach`]: VMM arguments for a VM;
//! - [`libvirt`]: `vm attach`/`detach` of libvirt domains;
//! - [`manpages`]: man pages generated from the command definitions;
//! - [`table`]: tables and human-readable numbers;
//! - [`outcome`]: a command's error, exit codes and JSON output (used by every command module);
//! - [`vm_transport`]: a VM's transports from its running config (for `attach` and `libvirt`).

pub mod api;
pub mod attach;
pub mod cli;
pub mod doctor;
pub mod libvirt;
pub mod manpages;
pub mod outcome;
pub mod passthrough;
pub mod table;
pub mod top;
pub mod vm_transport;
