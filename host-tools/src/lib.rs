//! vgpuctl: the administration CLI of vgpud.

pub mod api;
pub mod cli;
pub mod passthrough;
