//! vgpu-bench: benchmarks with in-run baselines.

use clap::{Parser, Subcommand};

/// vgpu benchmarks (each prints a ratio against a baseline measured in the same run).
#[derive(Debug, Parser)]
#[command(name = "vgpu-bench", version)]
struct Args {
    /// Benchmark to run.
    #[command(subcommand)]
    bench: Bench,
}

/// Benchmarks.
#[derive(Debug, Subcommand)]
enum Bench {
    /// Sync call round trip and async call rate through shim + unix socket + broker vs direct broker calls.
    Remoting {
        /// Calls per measurement.
        #[arg(long, default_value_t = 20_000)]
        iters: usize,
        /// Repetitions; medians are reported.
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
}

fn main() {
    match Args::parse().bench {
        Bench::Remoting { iters, runs } => {
            vgpu_bench::remoting::run(vgpu_bench::remoting::Params { iters, runs });
        }
    }
}
