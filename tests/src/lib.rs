//! End-to-end test support for vgpu: a harness that runs vgpud and programs
//! using the guest shim, and the QEMU harness that boots real guests.

pub mod conformance;
pub mod conformance_conditionals;
pub mod conformance_heap;
pub mod conformance_mem_ops;
pub mod conformance_mma;
pub mod conformance_overflow;
pub mod conformance_streams;
pub mod conformance_textures;
pub mod cudalib;
pub mod harness;
pub mod qemu;
