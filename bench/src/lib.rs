//! vgpu benchmarks. Each prints its figures next to a baseline measured in
//! the same run and the ratio between them; medians over repeated runs.

pub mod direct;
pub mod graphs;
pub mod handoff;
pub mod memcpy;
pub mod overflow;
pub mod pinned;
pub mod remoting;
pub mod share;
pub mod soak;
pub mod stats;
pub mod streams;
pub mod summary;
pub mod vgpu_dev;
pub mod vhost;
