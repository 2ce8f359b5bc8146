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
    /// Kernels of two streams vs one stream, and a 64 MiB copy during a kernel vs after it.
    Streams {
        /// Kernels per measurement (alternating between two streams in the concurrent case).
        #[arg(long, default_value_t = 8)]
        kernels: usize,
        /// Target length of one kernel in milliseconds.
        #[arg(long, default_value_t = 40)]
        kernel_ms: u64,
        /// Repetitions; medians and spreads are reported.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Worker threads of the simulated GPU.
        #[arg(long, default_value_t = 2)]
        workers: usize,
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
        Bench::Share {
            seconds,
            runs,
            sync_only,
        } => vgpu_bench::share::run(vgpu_bench::share::Params {
            seconds,
            runs,
            sync_only,
        }),
        Bench::Streams {
            kernels,
            kernel_ms,
            runs,
            workers,
        } => {
            vgpu_bench::streams::run(vgpu_bench::streams::Params {
                kernels,
                kernel_ms,
                runs,
                workers,
            });
            Ok(())
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpu-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
