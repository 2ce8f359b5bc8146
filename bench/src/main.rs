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
    /// After the report, print the headline figures as `vgpu-bench-summary` JSON lines (what
    /// `all` collects).
    #[arg(long, global = true)]
    summary: bool,
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
        /// Calls per measurement (as `remoting`'s: 5000 posted calls last half a millisecond,
        /// where one thread's wake-up, tens of microseconds here, moves the figure by a tenth).
        #[arg(long, default_value_t = 20_000)]
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
        #[arg(long, value_enum, default_value_t = vgpu_bench::vgpu_dev::GuestWait::Module)]
        guest_wait: vgpu_bench::vgpu_dev::GuestWait,
    },
    /// Copies from and to pinned (`cuMemAllocHost`, shared with vgpud), registered
    /// (`cuMemHostRegister`) and pageable memory over the unix socket, vs the memcpy floor of
    /// the same pages.
    Pinned {
        /// Repetitions; medians and spreads are reported.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Copy sizes in MiB, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16, 256])]
        sizes: Vec<usize>,
    },
    /// Host copies in the simulated GPU's pieces vs one memcpy of the whole size (the floor the
    /// copy benchmarks use, and why it is copied in pieces).
    Memcpy {
        /// Repetitions; medians and spreads are reported.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Copy sizes in MiB, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16, 256])]
        sizes: Vec<usize>,
    },
    /// Host overflow: a kernel over device-resident vs host-overflowed memory, and one
    /// demotion/promotion vs a copy of the same size (simulated GPU, or a real one).
    Overflow {
        /// `sim` (the simulated GPU, in process) or `cuda` (CUDA device 0 through the real-GPU
        /// executor; needs a driver with host `cuMemCreate`, CUDA 12.2+).
        #[arg(long, default_value = "sim")]
        device: String,
        /// The CUDA driver library for `--device cuda`.
        #[arg(long, default_value = "libcuda.so.1")]
        cuda_library: String,
        /// Repetitions; medians are reported.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Size of the kernel's buffer in MiB.
        #[arg(long, default_value_t = 4)]
        kernel_mib: u64,
        /// Size of the buffer moved between device and host memory, in MiB.
        #[arg(long, default_value_t = 256)]
        move_mib: u64,
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
    /// Every benchmark with figures of the call path, copies, graphs and streams, each in a
    /// process of its own, then one table of their ratios.
    All {
        /// Fewer calls, runs and sizes: a quick look rather than figures to report.
        #[arg(long)]
        quick: bool,
        /// Print the table as JSON instead.
        #[arg(long)]
        json: bool,
    },
    /// Soak: concurrent sessions over the unix socket and the vsock device of a vgpud process,
    /// mixed checked calls, random client kills; checks replies, slices and vgpud's memory.
    Soak {
        /// Concurrent sessions (half over the unix socket, half over the vsock device).
        #[arg(long, default_value_t = 64)]
        sessions: usize,
        /// Calls per session.
        #[arg(long, default_value_t = 10_000)]
        calls: usize,
        /// Percentage of sessions killed once, at a random point, and restarted.
        #[arg(long, default_value_t = 25)]
        kill_percent: u32,
        /// The vgpud binary (default: the one next to vgpu-bench).
        #[arg(long, value_name = "PATH")]
        vgpud: Option<std::path::PathBuf>,
        /// Seed of the random choices (calls, kill points).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Soak waves one after the other, each of `--sessions` sessions; vgpud's resident set
        /// is read after each (memory that grows with every wave is a leak).
        #[arg(long, default_value_t = 1)]
        waves: usize,
        /// Print the figures as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `path`, or the vgpud built next to this binary.
fn sibling_vgpud(path: Option<std::path::PathBuf>) -> Result<std::path::PathBuf, String> {
    if let Some(p) = path {
        return Ok(p);
    }
    let exe = std::env::current_exe().map_err(|e| format!("locating vgpu-bench: {e}"))?;
    let vgpud = exe.with_file_name("vgpud");
    if vgpud.exists() {
        Ok(vgpud)
    } else {
        Err(format!(
            "no vgpud next to {} (build it with `cargo build -p vgpud`, or pass --vgpud)",
            exe.display()
        ))
    }
}

/// One benchmark `all` runs.
struct AllEntry {
    bench: &'static str,
    /// Its arguments.
    full: &'static [&'static str],
    /// Its arguments with `--quick`; `None`: left out.
    quick: Option<&'static [&'static str]>,
    /// The largest copy it makes, in MiB, where it needs host memory in proportion
    /// ([`vgpu_bench::vgpu_dev::fits`]): left out, with the reason, on a host without it.
    copies_mib: Option<usize>,
}

/// The benchmarks `all` runs, in order.
const ALL: [AllEntry; 8] = [
    AllEntry {
        bench: "memcpy",
        full: &[],
        quick: Some(&["--sizes", "1,16", "--runs", "3"]),
        copies_mib: None,
    },
    AllEntry {
        bench: "remoting",
        full: &[],
        quick: Some(&["--iters", "5000", "--runs", "3"]),
        copies_mib: None,
    },
    AllEntry {
        bench: "vhost",
        full: &[],
        quick: Some(&["--iters", "2000", "--runs", "3"]),
        copies_mib: None,
    },
    AllEntry {
        bench: "vgpu-dev",
        full: &["--sizes", "1,16,256"],
        quick: Some(&["--sizes", "1,16", "--runs", "3"]),
        copies_mib: None,
    },
    // Issue 22's range ends at 1 GiB; in a process of its own, which touches about 16 GiB.
    AllEntry {
        bench: "vgpu-dev",
        full: &["--sizes", "1024", "--runs", "3"],
        quick: None,
        copies_mib: Some(vgpu_bench::vgpu_dev::MAX_SIZE_MIB),
    },
    AllEntry {
        bench: "pinned",
        full: &["--sizes", "1,16,256"],
        quick: Some(&["--sizes", "1,16", "--runs", "3"]),
        copies_mib: None,
    },
    AllEntry {
        bench: "graphs",
        full: &[],
        quick: Some(&["--runs", "3", "--batches", "10"]),
        copies_mib: None,
    },
    AllEntry {
        bench: "streams",
        full: &[],
        quick: Some(&["--runs", "3", "--kernel-ms", "20"]),
        copies_mib: None,
    },
];

/// Runs every benchmark of [`ALL`] in a child process and prints their figures as one table.
fn all(quick: bool, json: bool) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating vgpu-bench: {e}"))?;
    let mut figures = Vec::new();
    for entry in &ALL {
        let args = if quick { entry.quick } else { Some(entry.full) };
        let Some(args) = args else { continue };
        if let Some(Err(why)) = entry.copies_mib.map(vgpu_bench::vgpu_dev::fits) {
            eprintln!(
                "vgpu-bench all: left out `{} {}`: {why}",
                entry.bench,
                args.join(" ")
            );
            continue;
        }
        let bench = entry.bench;
        let out = std::process::Command::new(&exe)
            .arg(bench)
            .args(args)
            .arg("--summary")
            .stderr(std::process::Stdio::inherit())
            .output()
            .map_err(|e| format!("running vgpu-bench {bench}: {e}"))?;
        let (found, report) = vgpu_bench::summary::parse(&String::from_utf8_lossy(&out.stdout));
        if !json {
            print!("{report}");
            println!();
        }
        if !out.status.success() || found.is_empty() {
            return Err(format!("vgpu-bench {bench} failed ({})", out.status));
        }
        figures.extend(found);
    }
    if json {
        println!("{}", vgpu_bench::summary::to_json(&figures));
    } else {
        println!("all: each figure against the baseline measured beside it in the same run");
        print!("{}", vgpu_bench::summary::table(&figures));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let summary = args.summary;
    let emit = |figures: Vec<vgpu_bench::summary::Figure>| {
        if summary {
            vgpu_bench::summary::emit(&figures);
        }
    };
    let r = match args.bench {
        Bench::Remoting { iters, runs } => {
            let (direct, shim) =
                vgpu_bench::remoting::run(vgpu_bench::remoting::Params { iters, runs });
            emit(vgpu_bench::summary::remoting(&direct, &shim));
            Ok(())
        }
        Bench::Vhost { iters, runs } => {
            vgpu_bench::vhost::run(vgpu_bench::vhost::Params { iters, runs })
                .map(|r| emit(vgpu_bench::summary::vhost(&r)))
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
        })
        .map(|r| emit(vgpu_bench::summary::vgpu_dev(&r))),
        Bench::Pinned { runs, sizes } => vgpu_bench::pinned::run(&vgpu_bench::pinned::Params {
            runs,
            sizes_mib: sizes,
        })
        .map(|r| emit(vgpu_bench::summary::pinned(&r))),
        Bench::Memcpy { runs, sizes } => vgpu_bench::memcpy::run(&vgpu_bench::memcpy::Params {
            runs,
            sizes_mib: sizes,
        })
        .map(|r| emit(vgpu_bench::summary::memcpy(&r))),
        Bench::Overflow {
            device,
            cuda_library,
            runs,
            kernel_mib,
            move_mib,
        } => match device.as_str() {
            "sim" => Ok(vgpu_bench::overflow::Target::Sim),
            "cuda" => Ok(vgpu_bench::overflow::Target::Cuda {
                library: cuda_library,
            }),
            other => Err(format!("--device {other}: expected sim or cuda")),
        }
        .and_then(|target| {
            vgpu_bench::overflow::run(
                vgpu_bench::overflow::Params {
                    runs,
                    kernel_mib,
                    move_mib,
                },
                &target,
            )
        }),
        Bench::Graphs {
            kernels,
            runs,
            batches,
        } => vgpu_bench::graphs::run(vgpu_bench::graphs::Params {
            kernels,
            runs,
            batches,
        })
        .map(|r| emit(vgpu_bench::summary::graphs(&r))),
        Bench::Share {
            seconds,
            runs,
            sync_only,
        } => vgpu_bench::share::run(vgpu_bench::share::Params {
            seconds,
            runs,
            sync_only,
        }),
        Bench::All { quick, json } => all(quick, json),
        Bench::Soak {
            sessions,
            calls,
            kill_percent,
            vgpud,
            seed,
            waves,
            json,
        } => sibling_vgpud(vgpud).and_then(|vgpud| {
            vgpu_bench::soak::run(
                &vgpu_bench::soak::Params {
                    sessions,
                    calls,
                    kill_percent,
                    vgpud,
                    seed,
                    waves,
                },
                json,
            )
        }),
        Bench::Streams {
            kernels,
            kernel_ms,
            runs,
            workers,
        } => {
            let figures = vgpu_bench::streams::run(vgpu_bench::streams::Params {
                kernels,
                kernel_ms,
                runs,
                workers,
            });
            emit(vgpu_bench::summary::streams(&figures));
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
