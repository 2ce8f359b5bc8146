//! Interpreter throughput on NVRTC-compiled kernels, against plain Rust doing the same work in
//! the same process. Run with `cargo bench -p vgpu-ptx`. Reports medians.
//!
//! * saxpy over 1M floats (memory-bound, 12 PTX instructions per thread)
//! * tiled 256x256 matmul with shared memory and barriers (compute-bound)

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

fn main() {
    // `cargo test --benches` runs this too; keep that quick by skipping the timing loops.
    if std::env::args().any(|a| a == "--test") {
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "vgpu-ptx interpreter benchmark (medians; native = plain Rust, same process; {cores} cores)"
    );
    saxpy(1);
    matmul(1);
    if cores > 1 {
        saxpy(cores);
        matmul(cores);
    }
}
