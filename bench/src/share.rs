//! Compute-share accuracy of the scheduler (being written).

/// Parameters.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Seconds per measurement window.
    pub seconds: u64,
    /// Repetitions (medians are reported).
    pub runs: usize,
}

/// Runs the benchmark.
pub fn run(_p: Params) -> Result<(), String> {
    Err("the share benchmark is not built yet".into())
}
