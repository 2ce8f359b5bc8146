//! Shared fixtures of the scheduler tests (tests/sched_*.rs): vgpud in the
//! test process (so the tests read the broker's accounting and make live
//! changes through the broker API) with one simulated GPU, and tenants that
//! are separate C programs (tests/c/sched_client.c) using the shim.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use vgpu_broker::Broker;
use vgpu_config::Config;
use vgpu_tests::harness::{build_c_program, workspace_root};
use vgpud::Daemon;

/// Threads per block of `spin`.
pub const BLOCK: u32 = 32;
/// Blocks of a saturating tenant's kernel.
pub const GRID: u32 = 64;
/// Worker threads of the simulated GPU: one, so that the other core of a
/// 2-core machine is left to the clients, sessions and scheduler (as a
/// real GPU leaves the CPUs to the host).
pub const WORKERS: u32 = 1;

/// The tests of one binary run one at a time: each measures shares of a
/// CPU-bound device and must not share the CPUs with another.
pub fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

pub fn sleep_until(t: u64) {
    let now = unix_ns();
    if t > now {
        std::thread::sleep(Duration::from_nanos(t - now));
    }
}

/// A VM: name, weight, priority.
pub struct Vm(pub &'static str, pub u32, pub &'static str);

/// vgpud in this process.
pub struct Host {
    daemon: Option<Daemon>,
    dir: tempfile::TempDir,
}

impl Host {
    /// One simulated GPU (`device_extra`: more lines of its table) and `vms`.
    pub fn start(device_extra: &str, vms: &[Vm]) -> Host {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = format!(
            "[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"1GiB\"\nworkers = {WORKERS}\n{device_extra}\n"
        );
        for Vm(name, weight, prio) in vms {
            cfg += &format!(
                "\n[[vm]]\nname = \"{name}\"\ndevice = \"gpu0\"\nmemory = \"64MiB\"\nweight = {weight}\npriority = \"{prio}\"\nunix_socket = \"{}\"\n",
                dir.path().join(format!("{name}.sock")).display()
            );
        }
        let config = Config::parse(&dir.path().join("vgpud.toml"), &cfg).expect("config");
        let daemon = Daemon::start(&config).expect("vgpud starts");
        Host {
            daemon: Some(daemon),
            dir,
        }
    }

    pub fn broker(&self) -> &Arc<Broker> {
        self.daemon.as_ref().expect("running").broker()
    }

    pub fn busy(&self, vm: &str) -> Duration {
        self.broker().tenant(vm).expect("vm").sched_stats().busy
    }

    /// Starts a client of `vm`: `sched_client MODE spin.ptx ITERS GRID [SECONDS]`.
    pub fn spawn(&self, vm: &str, mode: &str, iters: u32, grid: u32, seconds: f64) -> Child {
        Command::new(client())
            .args([
                mode,
                &ptx().display().to_string(),
                &iters.to_string(),
                &grid.to_string(),
                &seconds.to_string(),
            ])
            .env(
                "VGPU_TRANSPORT",
                format!(
                    "unix:{}",
                    self.dir.path().join(format!("{vm}.sock")).display()
                ),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting sched_client")
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(d) = self.daemon.take() {
            d.shutdown();
        }
    }
}

/// Waits until every VM in `vms` has run kernels (its client is up), then
/// a little longer for the clients' queues to fill.
pub fn wait_busy(host: &Host, vms: &[&str]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !vms.iter().all(|v| host.busy(v) > Duration::ZERO) {
        assert!(
            std::time::Instant::now() < deadline,
            "clients did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
}

pub fn client() -> PathBuf {
    build_c_program("sched_client")
}

pub fn ptx() -> PathBuf {
    workspace_root().join("bench/kernels/spin.ptx")
}

/// What a client printed.
#[derive(Debug, Default)]
pub struct Report {
    /// (CLOCK_REALTIME ns, kernels) per completed batch.
    pub done: Vec<(u64, u64)>,
    /// Launch-to-synchronize round trips, ns.
    pub rtt: Vec<u64>,
    /// `once`: (CUresult, ns).
    pub result: Option<(i32, u64)>,
}

impl Report {
    pub fn kernels_between(&self, a: u64, b: u64) -> u64 {
        self.done
            .iter()
            .filter(|d| d.0 >= a && d.0 < b)
            .map(|d| d.1)
            .sum()
    }
}

pub fn collect(c: Child) -> Report {
    let out = c.wait_with_output().expect("client output");
    assert!(
        out.status.success(),
        "sched_client failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut r = Report::default();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            ["done", t, n] => r.done.push((t.parse().unwrap(), n.parse().unwrap())),
            ["rtt", ns] => r.rtt.push(ns.parse().unwrap()),
            ["result", code, ns] => r.result = Some((code.parse().unwrap(), ns.parse().unwrap())),
            _ => panic!("unexpected client output {l:?}"),
        }
    }
    r
}

/// Iterations of `spin` for a [`GRID`]-block kernel of about `target` on
/// this machine and build (the debug interpreter is much slower); measured
/// once per test process.
pub fn calibrate(target: Duration) -> u32 {
    static ITERS: std::sync::OnceLock<(Duration, u32)> = std::sync::OnceLock::new();
    let (t, iters) = *ITERS.get_or_init(|| (target, measure(target)));
    (f64::from(iters) * target.as_secs_f64() / t.as_secs_f64()).max(1.0) as u32
}

fn measure(target: Duration) -> u32 {
    let host = Host::start("", &[Vm("probe", 1, "normal")]);
    let mut iters: u32 = 16;
    for _ in 0..8 {
        let r = collect(host.spawn("probe", "saturate", iters, GRID, 0.5));
        let n: u64 = r.done.iter().skip(1).map(|d| d.1).sum();
        let span = r.done.last().map_or(0, |l| l.0) - r.done.first().map_or(0, |f| f.0);
        if n == 0 || span == 0 {
            iters = iters.saturating_mul(4);
            continue;
        }
        let scale = target.as_nanos() as f64 / (span as f64 / n as f64);
        iters = ((f64::from(iters) * scale) as u32).max(1);
        if (0.8..1.25).contains(&scale) {
            break;
        }
    }
    iters
}
