//! Interpreter throughput on NVRTC-compiled kernels, against plain Rust doing the same work in
//! the same process. Run with `cargo bench -p vgpu-ptx`. Reports medians.
//!
//! * saxpy over 1M floats (memory-bound, 12 PTX instructions per thread)
//! * tiled 256x256 matmul with shared memory and barriers (compute-bound)
//! * launches of a tiny kernel (32 threads per block, 6 instructions): per-launch overhead of the
//!   persistent worker pool against starting threads for every launch, in the same process

use std::hint::black_box;
use std::time::{Duration, Instant};

use vgpu_ptx::testutils::*;
use vgpu_ptx::{Module, Progress};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut times = Vec::with_capacity(runs);
    let mut last = None;
    for _ in 0..runs {
        let t = Instant::now();
        let r = f();
        times.push(t.elapsed());
        last = Some(r);
    }
    (median(times), last.expect("at least one run"))
}

fn report(name: &str, interp: Duration, native: Duration, p: &Progress) {
    let insts = p.stats().thread_instructions;
    println!(
        "{name:<28} interpreter {:>9.2} ms   native {:>8.3} ms   ratio {:>7.1}x   {:>7.1} M thread-instr/s",
        interp.as_secs_f64() * 1e3,
        native.as_secs_f64() * 1e3,
        interp.as_secs_f64() / native.as_secs_f64(),
        insts as f64 / interp.as_secs_f64() / 1e6
    );
}

fn saxpy(workers: usize) {
    let n = 1 << 20;
    let m = load_fixture("saxpy", "compute_80");
    let mem = TestMemory::new();
    let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.001).collect();
    let y0: Vec<f32> = (0..n).map(|i| (i % 777) as f32).collect();
    let (dx, dy) = (mem.alloc_from(&x), mem.alloc_from(&y0));
    let a = 1.5f32;
    let cfg = Config {
        grid: [(n as u32).div_ceil(256), 1, 1],
        block: [256, 1, 1],
        dynamic_shared: 0,
        workers,
    };
    let args = [Arg::I32(n as i32), Arg::F32(a), Arg::U64(dx), Arg::U64(dy)];
    let (t_interp, p) = time(5, || {
        mem.write(dy, &y0);
        run(&m, "saxpy", &cfg, &args, &mem, &[]).expect("saxpy")
    });
    let got: Vec<f32> = mem.read(dy, n);
    let mut y = y0.clone();
    let (t_native, ()) = time(21, || {
        y.copy_from_slice(&y0);
        let (xs, ys) = (black_box(&x), black_box(&mut y));
        for i in 0..n {
            ys[i] = a.mul_add(xs[i], ys[i]);
        }
    });
    assert_eq!(got, y, "saxpy result");
    report(
        &format!("saxpy 1M, {workers} worker(s)"),
        t_interp,
        t_native,
        &p,
    );
}

fn matmul(workers: usize) {
    let n = 256usize;
    let m: Module = load_fixture("matmul", "compute_80");
    let mem = TestMemory::new();
    let a: Vec<f32> = (0..n * n)
        .map(|i| ((i * 7) % 13) as f32 * 0.5 - 3.0)
        .collect();
    let b: Vec<f32> = (0..n * n).map(|i| ((i * 5) % 11) as f32 * 0.25).collect();
    let (da, db, dc) = (mem.alloc_from(&a), mem.alloc_from(&b), mem.alloc(n * n * 4));
    let tiles = (n as u32).div_ceil(16);
    let cfg = Config {
        grid: [tiles, tiles, 1],
        block: [16, 16, 1],
        dynamic_shared: 0,
        workers,
    };
    let args = [Arg::U64(da), Arg::U64(db), Arg::U64(dc), Arg::I32(n as i32)];
    let (t_interp, p) = time(3, || {
        run(&m, "matmul", &cfg, &args, &mem, &[]).expect("matmul")
    });
    let got: Vec<f32> = mem.read(dc, n * n);
    let mut c = vec![0f32; n * n];
    let (t_native, ()) = time(5, || {
        let (a, b) = (black_box(&a), black_box(&b));
        for r in 0..n {
            for col in 0..n {
                let mut acc = 0f32;
                for k in 0..n {
                    acc = a[r * n + k].mul_add(b[k * n + col], acc);
                }
                c[r * n + col] = acc;
            }
        }
    });
    assert_eq!(got, c, "matmul result");
    report(
        &format!("matmul 256x256, {workers} worker(s)"),
        t_interp,
        t_native,
        &p,
    );
}

/// A tiny kernel: each thread stores its global index.
const TINY_PTX: &str = ".version 8.0
.target sm_80
.address_size 64
.visible .entry tiny(.param .u64 out)
{
.reg .b32 %r<4>;
.reg .b64 %rd<4>;
ld.param.u64 %rd1, [out];
mov.u32 %r1, %tid.x;
mov.u32 %r2, %ctaid.x;
mad.lo.s32 %r3, %r2, 32, %r1;
mul.wide.u32 %rd2, %r3, 4;
add.s64 %rd3, %rd1, %rd2;
st.global.u32 [%rd3], %r3;
ret;
}
";

/// Launches of the tiny kernel timed one by one.
const TINY_LAUNCHES: usize = 2000;
/// Threads per block of the tiny kernel.
const TINY_BLOCK: u32 = 32;

/// Per-launch times of `TINY_LAUNCHES` launches of `blocks` blocks on `workers` workers:
/// (median, 10th percentile, 90th percentile).
fn tiny_launches(
    m: &Module,
    mem: &TestMemory,
    out: u64,
    blocks: u32,
    workers: usize,
) -> [Duration; 3] {
    let cfg = Config {
        grid: [blocks, 1, 1],
        block: [TINY_BLOCK, 1, 1],
        dynamic_shared: 0,
        workers,
    };
    let mut times = Vec::with_capacity(TINY_LAUNCHES);
    for _ in 0..TINY_LAUNCHES {
        let t = Instant::now();
        run(m, "tiny", &cfg, &[Arg::U64(out)], mem, &[]).expect("tiny");
        times.push(t.elapsed());
    }
    let got: Vec<u32> = mem.read(out, (blocks * TINY_BLOCK) as usize);
    assert!(
        got.iter().enumerate().all(|(i, &v)| v == i as u32),
        "tiny result"
    );
    times.sort();
    let at = |q: usize| times[(times.len() - 1) * q / 100];
    [at(50), at(10), at(90)]
}

fn tiny(blocks: u32, workers: usize) {
    let m = Module::load(TINY_PTX).expect("tiny kernel");
    let mem = TestMemory::new();
    let out = mem.alloc((blocks * TINY_BLOCK) as usize * 4);
    // Warm the pool up (its threads start at the first launch that needs them).
    tiny_launches(&m, &mem, out, blocks, workers);
    let mut rows = Vec::new();
    for spawn in [true, false] {
        vgpu_ptx::set_spawn_per_launch(spawn);
        rows.push(tiny_launches(&m, &mem, out, blocks, workers));
    }
    vgpu_ptx::set_spawn_per_launch(false);
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let [spawn, pool] = [rows[0], rows[1]];
    println!(
        "tiny {blocks} block(s) x {TINY_BLOCK}, {workers} worker(s)   spawn {:>7.1} us (p10 {:.1}, p90 {:.1})   pool {:>7.1} us (p10 {:.1}, p90 {:.1})   pool/spawn {:.2}",
        us(spawn[0]),
        us(spawn[1]),
        us(spawn[2]),
        us(pool[0]),
        us(pool[1]),
        us(pool[2]),
        pool[0].as_secs_f64() / spawn[0].as_secs_f64()
    );
}

fn main() {
    // `cargo test --benches` runs this too; keep that quick by skipping the timing loops.
    if std::env::args().any(|a| a == "--test") {
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "vgpu-ptx interpreter benchmark (medians; native = plain Rust, same process; {cores} cores)"
    );
    // `VGPU_PTX_BENCH=tiny` runs only the launch-overhead figures.
    let only_tiny = std::env::var("VGPU_PTX_BENCH").is_ok_and(|v| v == "tiny");
    if !only_tiny {
        saxpy(1);
        matmul(1);
        if cores > 1 {
            saxpy(cores);
            matmul(cores);
        }
    }
    tiny(1, 1);
    tiny(4, 4);
    tiny(8, 8);
}
