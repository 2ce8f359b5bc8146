//! Remoting over the vhost-user vsock path, measured host-side with an
//! in-process vhost-user frontend (being written).

/// Parameters.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Calls per measurement.
    pub iters: usize,
    /// Repetitions (medians are reported).
    pub runs: usize,
}

/// Runs the benchmark.
pub fn run(_p: Params) -> Result<(), String> {
    Err("the vhost-user benchmark is not built yet".into())
}
