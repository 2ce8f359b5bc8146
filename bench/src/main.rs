//! vgpu-bench: benchmarks with in-run baselines.

use std::process::ExitCode;

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
    /// The same calls over the vhost-user vsock device, vs the unix socket and direct calls.
    Vhost {
        /// Calls per measurement.
        #[arg(long, default_value_t = 5_000)]
        iters: usize,
        /// Repetitions; medians are reported.
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// Copy bandwidth through the virtio-vgpu device (zero copy) vs the vsock device vs memcpy.
    VgpuDev {
        /// Repetitions; medians are reported.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Transfer sizes in MiB, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16, 256])]
        sizes: Vec<usize>,
        /// What backs the fake guests' RAM.
        #[arg(long, value_enum, default_value_t = vgpu_bench::vgpu_dev::RamChoice::Auto)]
        guest_ram: vgpu_bench::vgpu_dev::RamChoice,
        /// How the fake guests wait for a request to complete.
        #[arg(long, value_enum, default_value_t = vgpu_bench::vgpu_dev::GuestWait::Block)]
        guest_wait: vgpu_bench::vgpu_dev::GuestWait,
    },
    /// A CUDA graph of small kernels replayed with one request vs the same kernels launched one
    /// by one (shim over a unix socket, and the protocol client over unix and vhost-user vsock).
    Graphs {
        /// Kernels in the graph (and launches in the baseline).
        #[arg(long, default_value_t = 100)]
        kernels: usize,
        /// Repetitions; medians and spreads are reported.
        #[arg(long, default_value_t = 7)]
        runs: usize,
        /// Graph launches (and batches of launches) timed per run.
        #[arg(long, default_value_t = 20)]
        batches: usize,
    },
    /// Compute-share accuracy of the scheduler with saturating tenants.
    Share {
        /// Seconds per measurement window.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Repetitions; medians are reported.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Only the synchronous-client cases (clients that synchronize after
        /// every 1, 4 or 16 launches), with the sync rules off and on.
        #[arg(long)]
        sync_only: bool,
    },
}

fn main() -> ExitCode {
    let r = match Args::parse().bench {
        Bench::Remoting { iters, runs } => {
            vgpu_bench::remoting::run(vgpu_bench::remoting::Params { iters, runs });
            Ok(())
        }
        Bench::Vhost { iters, runs } => {
            vgpu_bench::vhost::run(vgpu_bench::vhost::Params { iters, runs })
        }
        Bench::VgpuDev {
            runs,
            sizes,
            guest_ram,
            guest_wait,
        } => vgpu_bench::vgpu_dev::run(vgpu_bench::vgpu_dev::Params {
            runs,
            sizes_mib: sizes,
            ram: guest_ram,
            wait: guest_wait,
        }),
        Bench::Graphs {
            kernels,
            runs,
            batches,
        } => vgpu_bench::graphs::run(vgpu_bench::graphs::Params {
            kernels,
            runs,
            batches,
        }),
        Bench::Share {
            seconds,
            runs,
            sync_only,
        } => vgpu_bench::share::run(vgpu_bench::share::Params {
            seconds,
            runs,
            sync_only,
        }),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpu-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
