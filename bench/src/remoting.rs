//! The cost of remoting a CUDA call: a synchronous call's round trip and the
//! rate of asynchronous calls, through the guest shim, a unix socket and the
//! broker, compared with the same calls made directly on a broker session in
//! the same process.

use std::time::Instant;

use vgpu_config::Config;
use vgpud::Daemon;

use crate::direct::Direct;
use crate::stats::{median, percentile};

/// Parameters.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Calls per measurement.
    pub iters: usize,
    /// Repetitions (medians are reported).
    pub runs: usize,
}

/// One run's figures, in nanoseconds per call.
#[derive(Debug, Clone, Copy, Default)]
pub struct Figures {
    /// Synchronous round trip, median of the run's calls.
    pub sync_p50: f64,
    /// Synchronous round trip, 99th percentile.
    pub sync_p99: f64,
    /// Asynchronous call, amortized.
    pub async_ns: f64,
}

fn time_each(iters: usize, mut f: impl FnMut()) -> Vec<f64> {
    (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as f64
        })
        .collect()
}

fn time_total(iters: usize, mut f: impl FnMut(), mut finish: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    finish();
    t.elapsed().as_nanos() as f64 / iters as f64
}

/// The floor any socket transport pays: a 24-byte ping-pong over a unix
/// socket pair between two threads (one frame header each way), p50 in ns;
/// both ends read with a spin of `spin` (zero: blocking reads).
fn raw_socket_rtt(iters: usize, spin: std::time::Duration) -> f64 {
    use std::io::{Read, Write};
    use vgpu_proto::spin::SpinRead;
    let (a, b) = std::os::unix::net::UnixStream::pair().expect("socket pair");
    let (mut a, mut b) = (SpinRead::with_spin(a, spin), SpinRead::with_spin(b, spin));
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 24];
        while b.read_exact(&mut buf).is_ok() {
            if b.write_all(&buf).is_err() {
                break;
            }
        }
    });
    let mut buf = [0u8; 24];
    let lat = time_each(iters, || {
        a.write_all(&buf).expect("ping");
        a.read_exact(&mut buf).expect("pong");
    });
    drop(a);
    let _ = echo.join();
    median(&lat)
}

/// Direct calls on a broker session (no transport, no encoding).
fn direct(daemon: &Daemon, p: Params) -> Figures {
    let mut d = Direct::open(daemon, "bench").expect("direct session");
    let lat = time_each(p.iters, || d.synchronize().expect("direct CtxSynchronize"));
    let t = Instant::now();
    d.posted_memsets(p.iters).expect("direct Memsets");
    let async_ns = t.elapsed().as_nanos() as f64 / p.iters as f64;
    Figures {
        sync_p50: median(&lat),
        sync_p99: percentile(&lat, 99.0),
        async_ns,
    }
}

/// The same calls through the guest shim's C ABI over a unix socket.
fn through_shim(p: Params, ptr: u64) -> Figures {
    use cuda::exports::*;
    let lat = time_each(p.iters, || {
        assert_eq!(cuCtxSynchronize(), 0);
    });
    let async_ns = time_total(
        p.iters,
        || {
            assert_eq!(cuMemsetD8Async(ptr, 7, 64, std::ptr::null_mut()), 0);
        },
        || {
            assert_eq!(cuCtxSynchronize(), 0);
        },
    );
    Figures {
        sync_p50: median(&lat),
        sync_p99: percentile(&lat, 99.0),
        async_ns,
    }
}

/// Runs the benchmark and prints the figures; returns (direct, shim) medians.
pub fn run(p: Params) -> (Figures, Figures) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("bench.sock");
    let cfg = format!(
        "[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"1GiB\"\n\n[[vm]]\nname = \"bench\"\nmemory = \"256MiB\"\nunix_socket = \"{}\"\n",
        sock.display()
    );
    let config = Config::parse(&dir.path().join("bench.toml"), &cfg).expect("bench config");
    let daemon = Daemon::start(&config).expect("starting vgpud in-process");

    // SAFETY: set before the shim reads it, before any other thread of this process uses the environment.
    unsafe { std::env::set_var("VGPU_TRANSPORT", format!("unix:{}", sock.display())) };
    let ptr = {
        use cuda::exports::*;
        assert_eq!(cuInit(0), 0, "cuInit through the shim");
        let mut ctx = std::ptr::null_mut();
        let mut ptr = 0u64;
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { cuCtxCreate_v2(&mut ctx, 0, 0) }, 0);
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { cuMemAlloc_v2(&mut ptr, 4096) }, 0);
        ptr
    };

    let mut d = Vec::new();
    let mut s = Vec::new();
    let mut raw = Vec::new();
    let mut polled = Vec::new();
    // Warm-up.
    direct(
        &daemon,
        Params {
            iters: p.iters / 10 + 1,
            runs: 1,
        },
    );
    through_shim(
        Params {
            iters: p.iters / 10 + 1,
            runs: 1,
        },
        ptr,
    );
    for _ in 0..p.runs {
        d.push(direct(&daemon, p));
        s.push(through_shim(p, ptr));
        raw.push(raw_socket_rtt(p.iters, std::time::Duration::ZERO));
        polled.push(raw_socket_rtt(p.iters, vgpu_proto::spin::DEFAULT_SPIN));
    }
    let raw = median(&raw);
    let polled = median(&polled);
    let med = |v: &[Figures], f: fn(&Figures) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
    let dm = Figures {
        sync_p50: med(&d, |f| f.sync_p50),
        sync_p99: med(&d, |f| f.sync_p99),
        async_ns: med(&d, |f| f.async_ns),
    };
    let sm = Figures {
        sync_p50: med(&s, |f| f.sync_p50),
        sync_p99: med(&s, |f| f.sync_p99),
        async_ns: med(&s, |f| f.async_ns),
    };
    println!(
        "remoting: {} calls x {} runs (medians), simulated GPU, unix socket",
        p.iters, p.runs
    );
    println!(
        "{:<44} {:>12} {:>12} {:>8}",
        "call", "direct", "shim+socket", "ratio"
    );
    println!(
        "{:<44} {:>10.2}us {:>10.2}us {:>7.1}x",
        "cuCtxSynchronize round trip, p50",
        dm.sync_p50 / 1e3,
        sm.sync_p50 / 1e3,
        sm.sync_p50 / dm.sync_p50
    );
    println!(
        "{:<44} {:>10.2}us {:>10.2}us {:>7.1}x",
        "  floor: socket ping-pong, blocking, p50",
        raw / 1e3,
        sm.sync_p50 / 1e3,
        sm.sync_p50 / raw
    );
    println!(
        "{:<44} {:>10.2}us {:>10.2}us {:>7.1}x",
        "  floor: socket ping-pong, polling, p50",
        polled / 1e3,
        sm.sync_p50 / 1e3,
        sm.sync_p50 / polled
    );
    println!(
        "{:<44} {:>10.2}us {:>10.2}us {:>7.1}x",
        "cuCtxSynchronize round trip, p99",
        dm.sync_p99 / 1e3,
        sm.sync_p99 / 1e3,
        sm.sync_p99 / dm.sync_p99
    );
    println!(
        "{:<44} {:>10.3}us {:>10.3}us {:>7.1}x",
        "cuMemsetD8Async (64 B), amortized per call",
        dm.async_ns / 1e3,
        sm.async_ns / 1e3,
        sm.async_ns / dm.async_ns
    );
    println!(
        "{:<44} {:>11.0}/s {:>11.0}/s",
        "cuMemsetD8Async rate",
        1e9 / dm.async_ns,
        1e9 / sm.async_ns
    );
    daemon.shutdown();
    (dm, sm)
}
