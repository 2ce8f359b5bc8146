//! Host overflow (docs/memory.md): a kernel over a device-resident buffer vs
//! the same buffer overflowed to host memory (same address), and the cost of
//! moving 256 MiB between device and host memory (one demotion, one
//! promotion) vs a plain copy of the same size, all measured in the same run.
//!
//! On the simulated GPU (the default) the baseline is a host memcpy; on a real
//! GPU (`--device cuda`, through `devices/cuda`) it is a device-to-device copy,
//! and the kernel's bandwidth over device memory vs over host memory read
//! across PCIe is printed too.

use std::sync::Arc;
use std::time::Instant;

use vgpu_broker::device::{Device, DeviceContext, LaunchDims, Residence, RunControl};
use vgpu_sim::{SimConfig, SimDevice};

/// Which executor the benchmark runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The simulated GPU, in process.
    Sim,
    /// The real-GPU executor on CUDA device 0 of this driver library.
    Cuda {
        /// The driver (`libcuda.so.1` by default).
        library: String,
    },
}

use crate::stats::median;

/// Benchmark parameters.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Repetitions; medians are reported.
    pub runs: usize,
    /// Size of the kernel's buffer in MiB.
    pub kernel_mib: u64,
    /// Size moved by a demotion/promotion in MiB.
    pub move_mib: u64,
}

fn open(target: &Target, memory: u64) -> Result<Arc<dyn Device>, String> {
    match target {
        Target::Sim => Ok(Arc::new(SimDevice::new(SimConfig {
            name: "bench".into(),
            memory,
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            watchdog: None,
        }))),
        Target::Cuda { library } => {
            let driver = vgpu_cuda::Driver::load(library).map_err(|e| e.to_string())?;
            let dev = vgpu_cuda::CudaDevice::with_driver(
                driver,
                &vgpu_cuda::Selector::Index(0),
                vgpu_cuda::CudaOptions {
                    name: "bench".into(),
                    watchdog: None,
                },
            )
            .map_err(|e| e.to_string())?;
            if !dev.can_overflow_to_host() {
                return Err(format!(
                    "this GPU's driver cannot back GPU addresses with host memory (cuMemCreate \
                     with a host location, CUDA 12.2+; movable granularity {:?})",
                    dev.movable_granularity()
                ));
            }
            Ok(dev)
        }
    }
}

/// `inc(p, n)`: `p[i] += 1` for every `i < n`.
const PTX: &str = ".version 7.0\n.target sm_52\n.address_size 64\n\
.visible .entry inc(.param .u64 p, .param .u32 n)\n{\n\
 .reg .pred %p; .reg .b32 %r<7>; .reg .b64 %rd<5>;\n\
 ld.param.u64 %rd1, [p]; ld.param.u32 %r1, [n];\n\
 mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x;\n\
 mad.lo.s32 %r5, %r2, %r3, %r4;\n setp.ge.u32 %p, %r5, %r1;\n @%p bra DONE;\n\
 cvta.to.global.u64 %rd2, %rd1;\n mul.wide.u32 %rd3, %r5, 4;\n add.s64 %rd4, %rd2, %rd3;\n\
 ld.global.u32 %r6, [%rd4];\n add.s32 %r6, %r6, 1;\n st.global.u32 [%rd4], %r6;\nDONE:\n ret;\n}\n\0";

const MIB: u64 = 1 << 20;
const BLOCK: u32 = 256;

fn secs(f: impl FnOnce() -> Result<(), String>) -> Result<f64, String> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64())
}

fn kernel_seconds(ctx: &dyn DeviceContext, ptr: u64, bytes: u64) -> Result<f64, String> {
    let m = ctx
        .load_module(PTX.as_bytes(), MIB, &Default::default())
        .map_err(|e| e.to_string())?;
    let k = &m.kernels()[0];
    let n = u32::try_from(bytes / 4).map_err(|_| "buffer too large".to_string())?;
    let mut params = vec![0u8; k.param_offsets[1] as usize + 4];
    params[..8].copy_from_slice(&ptr.to_le_bytes());
    let o = k.param_offsets[1] as usize;
    params[o..o + 4].copy_from_slice(&n.to_le_bytes());
    let dims = LaunchDims {
        grid: [n.div_ceil(BLOCK), 1, 1],
        block: [BLOCK, 1, 1],
        shared_bytes: 0,
        cooperative: false,
        units: None,
    };
    secs(|| {
        ctx.launch(&*m, 0, &dims, &params, 0, &RunControl::default())
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
}

/// Runs the benchmark and prints its table.
pub fn run(p: Params, target: &Target) -> Result<(), String> {
    let runs = p.runs.max(1);
    let device = open(target, 4 * p.move_mib.max(p.kernel_mib) * MIB)?;
    let ctx = device.open("bench").map_err(|e| e.to_string())?;
    let kbytes = p.kernel_mib * MIB;
    let kbuf = ctx.alloc(kbytes).map_err(|e| e.to_string())?;
    let (mut on_dev, mut on_host) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        ctx.migrate(kbuf, Residence::Device)
            .map_err(|e| e.to_string())?;
        on_dev.push(kernel_seconds(&*ctx, kbuf, kbytes)?);
        ctx.migrate(kbuf, Residence::Host)
            .map_err(|e| e.to_string())?;
        on_host.push(kernel_seconds(&*ctx, kbuf, kbytes)?);
    }
    let mbytes = p.move_mib * MIB;
    let mbuf = ctx.alloc(mbytes).map_err(|e| e.to_string())?;
    ctx.memset(mbuf, 0x5a, 1, mbytes)
        .map_err(|e| e.to_string())?;
    let len = usize::try_from(mbytes).map_err(|e| e.to_string())?;
    let (src, mut dst) = match target {
        Target::Sim => (vec![0x5au8; len], vec![0u8; len]),
        Target::Cuda { .. } => (Vec::new(), Vec::new()),
    };
    // On a GPU the baseline is a device-to-device copy of the same size.
    let dev_copy = match target {
        Target::Sim => None,
        Target::Cuda { .. } => Some(ctx.alloc(mbytes).map_err(|e| e.to_string())?),
    };
    let (mut copy, mut demote, mut promote) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        copy.push(secs(|| match dev_copy {
            Some(to) => ctx.copy(to, mbuf, mbytes).map_err(|e| e.to_string()),
            None => {
                dst.copy_from_slice(std::hint::black_box(&src));
                std::hint::black_box(&dst);
                Ok(())
            }
        })?);
        demote.push(secs(|| {
            ctx.migrate(mbuf, Residence::Host)
                .map_err(|e| e.to_string())
        })?);
        promote.push(secs(|| {
            ctx.migrate(mbuf, Residence::Device)
                .map_err(|e| e.to_string())
        })?);
    }
    let (kd, kh) = (median(&on_dev), median(&on_host));
    let (c, d, pr) = (median(&copy), median(&demote), median(&promote));
    let (on, baseline) = match target {
        Target::Sim => ("the simulated GPU", "memcpy"),
        Target::Cuda { .. } => ("a real GPU", "device-to-device copy"),
    };
    println!("host overflow on {on} (medians of {runs} runs)");
    // `inc` reads and writes every byte once.
    let gbs = |t: f64| 2.0 * kbytes as f64 / t / 1e9;
    println!(
        "kernel over {} MiB: device-resident {:.2} ms ({:.1} GB/s), host-overflowed {:.2} ms \
         ({:.1} GB/s), ratio {:.2}",
        p.kernel_mib,
        kd * 1e3,
        gbs(kd),
        kh * 1e3,
        gbs(kh),
        kh / kd
    );
    println!(
        "{} MiB: {baseline} {:.1} ms (baseline); demotion {:.2} ms ({:.3}x); promotion {:.2} ms ({:.3}x)",
        p.move_mib,
        c * 1e3,
        d * 1e3,
        d / c,
        pr * 1e3,
        pr / c
    );
    let span = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        format!("{:.2}-{:.2}", lo * 1e3, hi * 1e3)
    };
    println!(
        "spread (lowest-highest ms): {baseline} {}, demotion {}, promotion {}",
        span(&copy),
        span(&demote),
        span(&promote)
    );
    for p in [Some(kbuf), Some(mbuf), dev_copy].into_iter().flatten() {
        ctx.free(p).map_err(|e| e.to_string())?;
    }
    Ok(())
}
