//! Concurrency of streams on the simulated GPU, through the guest shim, a
//! unix socket and vgpud: kernels of two streams against the same kernels on
//! one stream, and a 64 MiB host-to-device copy during a kernel of about the
//! same length against the copy after the kernel; and hand-offs between two
//! streams through stream memory operations (a write on one stream, a wait
//! for it on the other: vgpud's memory wait watcher) against the same
//! hand-offs through events (the engine's own dependencies). The baselines are
//! measured in the same run; medians and spreads (min–max) over the runs.
// The setup drives the shim's C ABI with one uniform safety argument: every
// call passes valid pointers. Splitting it per call would only add noise.
#![allow(clippy::multiple_unsafe_ops_per_block)]

use std::ffi::{CString, c_void};
use std::time::{Duration, Instant};

use vgpu_config::Config;
use vgpud::Daemon;

use crate::stats::{median, spread_of};

/// Parameters.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Kernels per measurement (split over two streams in the concurrent case).
    pub kernels: usize,
    /// Target length of one kernel.
    pub kernel_ms: u64,
    /// Repetitions (medians are reported).
    pub runs: usize,
    /// Worker threads of the simulated GPU.
    pub workers: usize,
}

/// Bytes of the copy of the overlap measurement.
pub const COPY_BYTES: usize = 64 << 20;
/// Threads per block of the spin kernel; each launch is one block, so that
/// a kernel fills one worker and two streams can fill two.
const BLOCK: u32 = 32;
/// Hand-offs between the two streams per measurement (there and back is two).
pub const HANDOFFS: u32 = 200;
/// `CU_STREAM_WAIT_VALUE_GEQ`.
const WAIT_GEQ: u32 = 0;

/// Ratios of one run (concurrent / serial).
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// Kernels on one stream, seconds.
    pub serial: f64,
    /// The same kernels on two streams, seconds.
    pub two_streams: f64,
    /// Kernel then copy on one stream, seconds.
    pub copy_serial: f64,
    /// Kernel and copy on two streams, seconds.
    pub copy_overlap: f64,
    /// [`HANDOFFS`] hand-offs between two streams through events, seconds.
    pub handoff_events: f64,
    /// The same through stream memory operations, each wait sent after the write it waits
    /// for (so met when its stream reaches it), seconds.
    pub handoff_mem_ops: f64,
    /// The same with each wait sent before its write (so released later, by vgpud's memory
    /// wait watcher), seconds.
    pub handoff_mem_ops_later: f64,
}

struct Gpu {
    spin: cuda::exports::CUhandle,
    out: u64,
    host: Vec<u8>,
    dst: u64,
    s1: cuda::exports::CUhandle,
    s2: cuda::exports::CUhandle,
    /// Two events, one per direction of a hand-off.
    events: [cuda::exports::CUhandle; 2],
}

fn check(r: u32, what: &str) {
    assert_eq!(r, 0, "{what} failed with CUresult {r}");
}

impl Gpu {
    fn launch(&self, iters: u32, stream: cuda::exports::CUhandle) {
        let mut out = self.out;
        let mut n = iters;
        let mut params = [(&raw mut out).cast::<c_void>(), (&raw mut n).cast()];
        // SAFETY: `spin(float *out, unsigned iters)`; params points at both.
        let r = unsafe {
            cuda::exports::cuLaunchKernel(
                self.spin,
                1,
                1,
                1,
                BLOCK,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check(r, "cuLaunchKernel");
    }

    fn copy(&self, stream: cuda::exports::CUhandle) {
        // SAFETY: `host` holds COPY_BYTES bytes; `dst` is an allocation of that size.
        let r = unsafe {
            cuda::exports::cuMemcpyHtoDAsync_v2(
                self.dst,
                self.host.as_ptr().cast(),
                COPY_BYTES,
                stream,
            )
        };
        check(r, "cuMemcpyHtoDAsync");
    }

    fn sync(&self) {
        check(cuda::exports::cuCtxSynchronize(), "cuCtxSynchronize");
    }

    /// Hand-off `i`'s streams: from the first to the second, then back.
    fn ends(&self, i: u32) -> (cuda::exports::CUhandle, cuda::exports::CUhandle) {
        if i.is_multiple_of(2) {
            (self.s1, self.s2)
        } else {
            (self.s2, self.s1)
        }
    }

    /// Hands the work back and forth between the two streams [`HANDOFFS`] times through
    /// events: each side records an event after a one-word fill, the other waits for it.
    fn handoffs_by_events(&self) {
        use cuda::exports::*;
        for i in 0..HANDOFFS {
            let (from, to) = self.ends(i);
            let ev = self.events[(i % 2) as usize];
            check(cuMemsetD32Async(self.out, i, 1, from), "cuMemsetD32Async");
            check(cuEventRecord(ev, from), "cuEventRecord");
            check(cuStreamWaitEvent(to, ev, 0), "cuStreamWaitEvent");
        }
    }

    /// The same hand-offs through stream memory operations: each side writes a growing count
    /// to a word, the other waits until the word reaches it; with `wait_first` the wait is sent
    /// before the write that meets it.
    fn handoffs_by_mem_ops(&self, wait_first: bool) {
        use cuda::mem_ops::{cuStreamWaitValue32_v2, cuStreamWriteValue32_v2};
        // The word starts at 0 for every measurement.
        check(cuda::exports::cuMemsetD32_v2(self.dst, 0, 1), "cuMemsetD32");
        for i in 0..HANDOFFS {
            let (from, to) = self.ends(i);
            let count = i + 1;
            let wait = || {
                check(
                    cuStreamWaitValue32_v2(to, self.dst, count, WAIT_GEQ),
                    "cuStreamWaitValue32",
                );
            };
            if wait_first {
                wait();
            }
            check(
                cuda::exports::cuMemsetD32Async(self.out, i, 1, from),
                "cuMemsetD32Async",
            );
            check(
                cuStreamWriteValue32_v2(from, self.dst, count, 0),
                "cuStreamWriteValue32",
            );
            if !wait_first {
                wait();
            }
        }
    }

    fn time(&self, f: impl FnOnce()) -> f64 {
        let t = Instant::now();
        f();
        self.sync();
        t.elapsed().as_secs_f64()
    }
}

fn setup(sock: &std::path::Path) -> Gpu {
    use cuda::exports::*;
    // SAFETY: set before the shim reads it, before other threads use the environment.
    unsafe { std::env::set_var("VGPU_TRANSPORT", format!("unix:{}", sock.display())) };
    check(cuInit(0), "cuInit");
    let ptx = CString::new(include_str!("../kernels/spin.ptx")).expect("PTX text");
    let mut ctx = std::ptr::null_mut();
    let (mut module, mut spin) = (std::ptr::null_mut(), std::ptr::null_mut());
    let (mut out, mut dst) = (0u64, 0u64);
    let (mut s1, mut s2) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid out-pointers and a NUL-terminated image.
    unsafe {
        check(cuCtxCreate_v2(&mut ctx, 0, 0), "cuCtxCreate");
        check(
            cuModuleLoadData(&mut module, ptx.as_ptr().cast()),
            "cuModuleLoadData",
        );
        check(
            cuModuleGetFunction(&mut spin, module, c"spin".as_ptr()),
            "cuModuleGetFunction",
        );
        check(cuMemAlloc_v2(&mut out, 4 * BLOCK as usize), "cuMemAlloc");
        check(cuMemAlloc_v2(&mut dst, COPY_BYTES), "cuMemAlloc");
        check(cuStreamCreate(&mut s1, 1), "cuStreamCreate");
        check(cuStreamCreate(&mut s2, 1), "cuStreamCreate");
    }
    let mut events = [std::ptr::null_mut(); 2];
    for e in &mut events {
        // SAFETY: a valid out-pointer; CU_EVENT_DISABLE_TIMING.
        check(unsafe { cuEventCreate(e, 2) }, "cuEventCreate");
    }
    // The hand-offs' word (in the copy's buffer, which no hand-off copies into) starts at 0.
    check(cuMemsetD32_v2(dst, 0, 1), "cuMemsetD32");
    Gpu {
        spin,
        out,
        host: vec![0x5a; COPY_BYTES],
        dst,
        s1,
        s2,
        events,
    }
}

/// Iterations of `spin` for a kernel of about `target`.
fn calibrate(g: &Gpu, target: Duration) -> u32 {
    let mut iters = 1000u32;
    loop {
        let t = g.time(|| g.launch(iters, g.s1));
        if t >= target.as_secs_f64() / 4.0 || iters >= u32::MAX / 64 {
            let scaled = f64::from(iters) * target.as_secs_f64() / t.max(1e-6);
            return scaled.clamp(1.0, f64::from(u32::MAX)) as u32;
        }
        iters *= 4;
    }
}

/// Runs the benchmark and prints the figures; returns every run's figures.
pub fn run(p: Params) -> Vec<Figures> {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("bench.sock");
    let cfg = format!(
        "[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"1GiB\"\nworkers = {}\n\n[[vm]]\nname = \"bench\"\nmemory = \"512MiB\"\nunix_socket = \"{}\"\n",
        p.workers,
        sock.display()
    );
    let config = Config::parse(&dir.path().join("bench.toml"), &cfg).expect("bench config");
    let daemon = Daemon::start(&config).expect("starting vgpud in-process");
    let g = setup(&sock);
    let iters = calibrate(&g, Duration::from_millis(p.kernel_ms));
    // A kernel about as long as the copy, for the overlap measurement.
    let copy_s = median(&(0..3).map(|_| g.time(|| g.copy(g.s2))).collect::<Vec<_>>());
    let kernel_s = g.time(|| g.launch(iters, g.s1));
    let copy_iters = ((f64::from(iters) * copy_s / kernel_s.max(1e-6)) as u32).max(1);
    let mut runs = Vec::new();
    for _ in 0..p.runs {
        let serial = g.time(|| {
            for _ in 0..p.kernels {
                g.launch(iters, g.s1);
            }
        });
        let two_streams = g.time(|| {
            for i in 0..p.kernels {
                g.launch(iters, if i % 2 == 0 { g.s1 } else { g.s2 });
            }
        });
        let copy_serial = g.time(|| {
            g.launch(copy_iters, g.s1);
            g.copy(g.s1);
        });
        let copy_overlap = g.time(|| {
            g.launch(copy_iters, g.s1);
            g.copy(g.s2);
        });
        let handoff_events = g.time(|| g.handoffs_by_events());
        let handoff_mem_ops = g.time(|| g.handoffs_by_mem_ops(false));
        let handoff_mem_ops_later = g.time(|| g.handoffs_by_mem_ops(true));
        runs.push(Figures {
            serial,
            two_streams,
            copy_serial,
            copy_overlap,
            handoff_events,
            handoff_mem_ops,
            handoff_mem_ops_later,
        });
    }
    let col = |f: fn(&Figures) -> f64| spread_of(&runs, f);
    let (sm, _, _) = col(|f| f.serial);
    let (tm, _, _) = col(|f| f.two_streams);
    let (rm, rlo, rhi) = col(|f| f.two_streams / f.serial);
    let (cm, _, _) = col(|f| f.copy_serial);
    let (om, _, _) = col(|f| f.copy_overlap);
    let (qm, qlo, qhi) = col(|f| f.copy_overlap / f.copy_serial);
    println!(
        "streams: simulated GPU with {} workers, shim + unix socket; {} runs, medians [min-max]",
        p.workers, p.runs
    );
    println!(
        "{} kernels of {:.1} ms (1 block each): one stream {:.1} ms, two streams {:.1} ms, ratio {:.2}x [{:.2}-{:.2}] (goal <= 0.60x)",
        p.kernels,
        kernel_s * 1e3,
        sm * 1e3,
        tm * 1e3,
        rm,
        rlo,
        rhi
    );
    println!(
        "64 MiB host-to-device copy ({:.1} ms alone) with a kernel of about the same length: serialized {:.1} ms, overlapped {:.1} ms, ratio {:.2}x [{:.2}-{:.2}] (ideal 0.50x)",
        copy_s * 1e3,
        cm * 1e3,
        om * 1e3,
        qm,
        qlo,
        qhi
    );
    let (em, _, _) = col(|f| f.handoff_events);
    let (mm, _, _) = col(|f| f.handoff_mem_ops);
    let (hm, hlo, hhi) = col(|f| f.handoff_mem_ops / f.handoff_events);
    let (lm, _, _) = col(|f| f.handoff_mem_ops_later);
    let (km, klo, khi) = col(|f| f.handoff_mem_ops_later / f.handoff_events);
    let per = |s: f64| s * 1e6 / f64::from(HANDOFFS);
    println!(
        "{HANDOFFS} hand-offs between two streams: through events {:.1} us each; through stream memory operations, each wait sent after its write {:.1} us each, ratio {:.2}x [{:.2}-{:.2}]; each wait sent first (released by the watcher) {:.1} us each, ratio {:.2}x [{:.2}-{:.2}]",
        per(em),
        per(mm),
        hm,
        hlo,
        hhi,
        per(lm),
        km,
        klo,
        khi
    );
    daemon.shutdown();
    runs
}
