//! Compute-share accuracy of the scheduler, on the simulated GPU, with
//! tenants that drive saturating kernel streams through the guest shim.
//!
//! vgpud runs in this process; every tenant is a child process (this same
//! binary, started with [`CLIENT_ENV`] set) that loads the shim as its
//! `libcuda`, connects to its VM's unix socket and launches the `spin`
//! kernel (bench/kernels/spin.cu) back to back, keeping several batches in
//! flight so its queue never runs dry. Shares are measured twice: from the
//! broker's accounting (device time per VM) and from what the clients
//! observe (kernels completed × per-kernel cost, where the cost is the same
//! kernel's rate alone measured in the same run), so the figure is not only
//! the scheduler grading itself.
//!
//! Scenarios: weights 30/70 and 1:2:3:4 under `fair`, a VM capped at 25 %
//! under `fixed` running alone, work conservation when one of two VMs stops,
//! the launch-to-start wait of a `realtime` VM among three saturating `batch`
//! VMs, the throughput of one VM with the scheduler on vs off, and 30/70 and
//! 1:2:3:4 again with synchronous clients (each synchronizes after every 1,
//! 4 or 16 launches) with the scheduler's sync rules off and on.

use std::ffi::{CString, c_void};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use vgpu_broker::tenant::Tenant;
use vgpu_config::{Config, Policy};
use vgpud::Daemon;

use crate::stats::{median, percentile};

/// Environment variable that turns this process into a tenant client.
pub const CLIENT_ENV: &str = "VGPU_BENCH_SHARE_CLIENT";
/// The kernel every tenant runs.
pub const SPIN_PTX: &str = include_str!("../kernels/spin.ptx");
/// Threads per block of `spin` (one warp).
const BLOCK: u32 = 32;
/// Thread blocks of a saturating tenant's kernel.
const GRID: u32 = 64;
/// Time a saturating tenant's kernel takes alone (two default slices, so
/// kernels are preempted mid-way).
const KERNEL_TARGET: Duration = Duration::from_millis(4);
/// Kernels per batch.
const BATCH: u32 = 4;
/// Batches a saturating client keeps in flight.
const DEPTH: usize = 4;
/// Time for the clients to connect and fill their queues before a window.
const WARMUP: Duration = Duration::from_secs(1);
/// Broker accounting sample period for the work-conservation timeline.
const SAMPLE: Duration = Duration::from_millis(20);
/// Window over which the surviving VM's share must reach 95 %.
const RAMP_WINDOW: Duration = Duration::from_millis(100);
/// The realtime client sleeps 1 to this many milliseconds between kernels.
const RT_MAX_SLEEP_MS: u64 = 5;
/// Slice length of every scenario (the default).
const SLICE_MS: u64 = 2;
/// Rounds of the overhead scenario (the devices swap roles each round).
const OVERHEAD_ROUNDS: u64 = 4;
/// Launches between two synchronizes in the synchronous-client cases.
const SYNC_BATCHES: [u32; 3] = [1, 4, 16];
/// A synchronous client's batch (launches between two synchronizes) runs at
/// least this many saturating kernels' worth alone: a client that
/// synchronizes after every kernel gets kernels four times as long (about
/// 16 ms), one that synchronizes after 4 or 16 the usual ones. It can then
/// use 70 % of the device even when the host takes milliseconds to wake it
/// (its think time), so the cases measure the scheduler and not the host's
/// wake-up latency; and the clients still complete enough batches in a
/// window for their own count to mean something.
const SYNC_BATCH_KERNELS: u32 = 4;
/// Targets.
const FAIR_TARGET_POINTS: f64 = 2.0;
const FIXED_TARGET: f64 = 0.27;
const CONSERVATION_TARGET: f64 = 0.95;
const OVERHEAD_TARGET: f64 = 0.98;

/// Parameters.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Seconds per measurement window.
    pub seconds: u64,
    /// Repetitions (medians are reported).
    pub runs: usize,
    /// Only the synchronous-client cases.
    pub sync_only: bool,
}

/// Worker threads of the simulated GPU: all cores but one, which is left
/// to the control plane (clients, sessions, the scheduler), as a real GPU
/// leaves the host's CPUs to the host.
fn sim_workers() -> usize {
    vgpud::daemon::default_workers().saturating_sub(1).max(1)
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn sleep_until(t_unix_ns: u64) {
    let now = unix_ns();
    if t_unix_ns > now {
        std::thread::sleep(Duration::from_nanos(t_unix_ns - now));
    }
}

// ---------------------------------------------------------------------------
// The tenant client (a child process)

/// What a client does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Launch kernels back to back until `stop`; print `done <time> <n>` per batch.
    Saturate,
    /// Launch one kernel, wait for it, sleep 1–5 ms, until `stop`; print `rtt <ns>`.
    Latency,
    /// Launch N kernels, synchronize the context, repeat until `stop`;
    /// print `done <time> N` per synchronize.
    Sync(u32),
}

#[derive(Debug, Clone, Copy)]
struct ClientArgs {
    mode: Mode,
    iters: u32,
    grid: u32,
    stop_unix_ns: u64,
}

impl ClientArgs {
    fn encode(&self) -> String {
        let m = match self.mode {
            Mode::Saturate => "saturate".to_string(),
            Mode::Latency => "latency".to_string(),
            Mode::Sync(n) => format!("sync{n}"),
        };
        format!("{m} {} {} {}", self.iters, self.grid, self.stop_unix_ns)
    }

    fn decode(s: &str) -> Result<Self, String> {
        let f: Vec<&str> = s.split_whitespace().collect();
        let bad =
            || format!("{CLIENT_ENV}={s:?}: expected `saturate|latency|syncN ITERS GRID STOP_NS`");
        if f.len() != 4 {
            return Err(bad());
        }
        let mode = match f[0] {
            "saturate" => Mode::Saturate,
            "latency" => Mode::Latency,
            m => match m.strip_prefix("sync").and_then(|n| n.parse().ok()) {
                Some(n) if n > 0 => Mode::Sync(n),
                _ => return Err(bad()),
            },
        };
        Ok(ClientArgs {
            mode,
            iters: f[1].parse().map_err(|_| bad())?,
            grid: f[2].parse().map_err(|_| bad())?,
            stop_unix_ns: f[3].parse().map_err(|_| bad())?,
        })
    }
}

mod client {
    use super::*;
    use cuda::exports::*;

    fn ok(r: vgpu_proto::cuda::CuResult, what: &str) -> Result<(), String> {
        if r == 0 {
            Ok(())
        } else {
            Err(format!("{what} failed with CUresult {r}"))
        }
    }

    /// The spin kernel, loaded through the shim.
    pub struct Spin {
        func: CUhandle,
        out: CUdeviceptr,
    }

    impl Spin {
        pub fn load(grid: u32) -> Result<Spin, String> {
            ok(cuInit(0), "cuInit")?;
            let mut dev = 0;
            // SAFETY: valid out-pointer.
            ok(unsafe { cuDeviceGet(&mut dev, 0) }, "cuDeviceGet")?;
            let mut ctx = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            ok(unsafe { cuCtxCreate_v2(&mut ctx, 0, dev) }, "cuCtxCreate")?;
            let image = CString::new(SPIN_PTX).map_err(|e| e.to_string())?;
            let mut module = std::ptr::null_mut();
            // SAFETY: valid out-pointer and a NUL-terminated PTX image.
            let r = unsafe { cuModuleLoadData(&mut module, image.as_ptr().cast()) };
            ok(r, "cuModuleLoadData")?;
            let mut func = std::ptr::null_mut();
            // SAFETY: valid out-pointer, module handle and C string.
            let r = unsafe { cuModuleGetFunction(&mut func, module, c"spin".as_ptr()) };
            ok(r, "cuModuleGetFunction")?;
            let mut out = 0;
            let bytes = (grid * BLOCK) as usize * std::mem::size_of::<f32>();
            // SAFETY: valid out-pointer.
            ok(unsafe { cuMemAlloc_v2(&mut out, bytes) }, "cuMemAlloc")?;
            Ok(Spin { func, out })
        }

        pub fn launch(&self, grid: u32, iters: u32) -> Result<(), String> {
            let mut out = self.out;
            let mut iters = iters;
            let mut params: [*mut c_void; 2] = [
                (&raw mut out).cast::<c_void>(),
                (&raw mut iters).cast::<c_void>(),
            ];
            // SAFETY: `params` points to two live parameters matching spin's signature.
            let r = unsafe {
                cuLaunchKernel(
                    self.func,
                    grid,
                    1,
                    1,
                    BLOCK,
                    1,
                    1,
                    0,
                    std::ptr::null_mut(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            };
            ok(r, "cuLaunchKernel")
        }
    }

    pub fn event() -> Result<CUhandle, String> {
        let mut e = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        ok(unsafe { cuEventCreate(&mut e, 0) }, "cuEventCreate")?;
        Ok(e)
    }

    pub fn record(e: CUhandle) -> Result<(), String> {
        ok(cuEventRecord(e, std::ptr::null_mut()), "cuEventRecord")
    }

    pub fn wait(e: CUhandle) -> Result<(), String> {
        ok(cuEventSynchronize(e), "cuEventSynchronize")
    }

    pub fn sync() -> Result<(), String> {
        ok(cuCtxSynchronize(), "cuCtxSynchronize")
    }
}

/// Runs the tenant client described by `spec`; its report goes to stdout.
fn run_client(spec: &str) -> Result<(), String> {
    let a = ClientArgs::decode(spec)?;
    let spin = client::Spin::load(a.grid)?;
    let mut lines = Vec::new();
    match a.mode {
        Mode::Saturate => {
            // DEPTH batches in flight: while the oldest is waited for, the
            // others keep the VM's queue full even if this process is slow
            // to wake up on a loaded machine.
            let events = (0..DEPTH)
                .map(|_| client::event())
                .collect::<Result<Vec<_>, _>>()?;
            let mut i = 0usize;
            while unix_ns() < a.stop_unix_ns {
                for _ in 0..BATCH {
                    spin.launch(a.grid, a.iters)?;
                }
                client::record(events[i % DEPTH])?;
                if i + 1 >= DEPTH {
                    client::wait(events[(i + 1) % DEPTH])?;
                    lines.push(format!("done {} {BATCH}", unix_ns()));
                }
                i += 1;
            }
            for j in i.saturating_sub(DEPTH - 1)..i {
                client::wait(events[j % DEPTH])?;
                lines.push(format!("done {} {BATCH}", unix_ns()));
            }
        }
        Mode::Sync(n) => {
            while unix_ns() < a.stop_unix_ns {
                for _ in 0..n {
                    spin.launch(a.grid, a.iters)?;
                }
                client::sync()?;
                lines.push(format!("done {} {n}", unix_ns()));
            }
        }
        Mode::Latency => {
            let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
            while unix_ns() < a.stop_unix_ns {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let sleep_us = 1000 + rng % ((RT_MAX_SLEEP_MS - 1) * 1000);
                std::thread::sleep(Duration::from_micros(sleep_us));
                let t = Instant::now();
                spin.launch(a.grid, a.iters)?;
                client::sync()?;
                lines.push(format!("rtt {}", t.elapsed().as_nanos()));
            }
        }
    }
    let mut out = std::io::stdout().lock();
    for l in lines {
        writeln!(out, "{l}").map_err(|e| e.to_string())?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The driver

/// What a client reported.
#[derive(Debug, Default)]
struct Report {
    /// (unix ns, kernels) per completed batch.
    done: Vec<(u64, u64)>,
    /// Round trips of latency mode, in ns.
    rtt: Vec<f64>,
}

impl Report {
    fn kernels_between(&self, a: u64, b: u64) -> u64 {
        self.done
            .iter()
            .filter(|(t, _)| *t >= a && *t < b)
            .map(|d| d.1)
            .sum()
    }
}

struct Tenant0 {
    name: String,
    weight: u32,
    priority: &'static str,
    device: &'static str,
}

fn vm(name: &str, weight: u32, priority: &'static str) -> Tenant0 {
    Tenant0 {
        name: name.into(),
        weight,
        priority,
        device: "gpu0",
    }
}

/// vgpud in this process with one simulated GPU and the given VMs.
struct Host {
    daemon: Option<Daemon>,
    dir: tempfile::TempDir,
}

impl Host {
    fn start(vms: &[Tenant0], policy: Policy) -> Result<Host, String> {
        Self::start_on(&[("gpu0", sim_workers())], vms, policy)
    }

    /// Simulated GPUs `(name, workers)` and VMs on them.
    fn start_on(
        devices: &[(&str, usize)],
        vms: &[Tenant0],
        policy: Policy,
    ) -> Result<Host, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut cfg = String::new();
        for (name, workers) in devices {
            cfg += &format!(
                "[[device]]\nname = \"{name}\"\nkind = \"sim\"\nmemory = \"1GiB\"\nworkers = {workers}\npolicy = \"{}\"\nslice_ms = {SLICE_MS}\n\n",
                policy.as_str()
            );
        }
        for v in vms {
            cfg += &format!(
                "\n[[vm]]\nname = \"{}\"\ndevice = \"{}\"\nmemory = \"64MiB\"\nweight = {}\npriority = \"{}\"\nunix_socket = \"{}\"\n",
                v.name,
                v.device,
                v.weight,
                v.priority,
                dir.path().join(format!("{}.sock", v.name)).display()
            );
        }
        let config =
            Config::parse(&dir.path().join("share.toml"), &cfg).map_err(|e| e.to_string())?;
        let daemon = Daemon::start(&config).map_err(|e| format!("starting vgpud: {e}"))?;
        Ok(Host {
            daemon: Some(daemon),
            dir,
        })
    }

    fn socket(&self, vm: &str) -> PathBuf {
        self.dir.path().join(format!("{vm}.sock"))
    }

    fn tenant(&self, vm: &str) -> Result<Arc<Tenant>, String> {
        self.daemon
            .as_ref()
            .and_then(|d| d.broker().tenant(vm))
            .ok_or_else(|| format!("no tenant {vm}"))
    }

    fn busy(&self, vm: &str) -> Result<Duration, String> {
        Ok(self.tenant(vm)?.sched_stats().busy)
    }

    fn set_enabled(&self, device: &str, on: bool) -> Result<(), String> {
        self.daemon
            .as_ref()
            .and_then(|d| d.broker().scheduler(device).cloned())
            .ok_or("no scheduler")?
            .set_enabled(on)
    }

    fn spawn(&self, vm: &str, args: ClientArgs) -> Result<Child, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        Command::new(exe)
            .arg("share")
            .env(CLIENT_ENV, args.encode())
            .env(
                "VGPU_TRANSPORT",
                format!("unix:{}", self.socket(vm).display()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting a client: {e}"))
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(d) = self.daemon.take() {
            d.shutdown();
        }
    }
}

fn collect(child: Child) -> Result<Report, String> {
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "a client failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let mut r = Report::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["done", t, n] => r.done.push((
                t.parse().map_err(|_| line.to_string())?,
                n.parse().map_err(|_| line.to_string())?,
            )),
            ["rtt", ns] => r.rtt.push(ns.parse().map_err(|_| line.to_string())?),
            _ => return Err(format!("unexpected client output `{line}`")),
        }
    }
    Ok(r)
}

/// Kernel size found by calibration.
#[derive(Debug, Clone, Copy)]
struct Kernel {
    iters: u32,
}

/// Sizes the spin kernel so that it takes about [`KERNEL_TARGET`] alone.
fn calibrate() -> Result<Kernel, String> {
    let host = Host::start(&[vm("probe", 1, "normal")], Policy::Fair)?;
    let mut iters: u32 = 2000;
    for _ in 0..6 {
        let stop = unix_ns() + 600_000_000;
        let r = collect(host.spawn(
            "probe",
            ClientArgs {
                mode: Mode::Saturate,
                iters,
                grid: GRID,
                stop_unix_ns: stop,
            },
        )?)?;
        let n: u64 = r.done.iter().skip(1).map(|d| d.1).sum();
        let span = r.done.last().map_or(0, |l| l.0) - r.done.first().map_or(0, |f| f.0);
        if n == 0 || span == 0 {
            iters = iters.saturating_mul(4);
            continue;
        }
        let per = span as f64 / n as f64;
        let scale = KERNEL_TARGET.as_nanos() as f64 / per;
        iters = ((f64::from(iters) * scale) as u32).max(1);
        if (0.8..1.25).contains(&scale) {
            break;
        }
    }
    Ok(Kernel { iters })
}

fn saturate(k: Kernel, stop: u64) -> ClientArgs {
    ClientArgs {
        mode: Mode::Saturate,
        iters: k.iters,
        grid: GRID,
        stop_unix_ns: stop,
    }
}

/// Shares of one window: (broker, client) per VM.
#[derive(Debug, Clone)]
struct Shares {
    broker: Vec<f64>,
    client: Vec<f64>,
    utilization: f64,
    /// Each VM's think time between batches (the scheduler's estimate).
    think: Vec<Duration>,
    /// Fraction of the window the device was kept idle for a holder's next
    /// kernel while another VM waited, and idle with runnable work (must be 0).
    anticipation: f64,
    idle_with_work: f64,
}

/// Saturating tenants with the given weights; shares over one window.
fn fair(k: Kernel, weights: &[u32], seconds: u64) -> Result<Shares, String> {
    fair_with(k, weights, seconds, Mode::Saturate, true)
}

/// Tenants with the given weights, each a client in `mode`, with the
/// scheduler's sync rules on or off; shares over one window.
fn fair_with(
    k: Kernel,
    weights: &[u32],
    seconds: u64,
    mode: Mode,
    sync_rules: bool,
) -> Result<Shares, String> {
    let vms: Vec<Tenant0> = weights
        .iter()
        .enumerate()
        .map(|(i, &w)| vm(&format!("vm{i}"), w, "normal"))
        .collect();
    let host = Host::start(&vms, Policy::Fair)?;
    host.daemon
        .as_ref()
        .and_then(|d| d.broker().scheduler("gpu0").cloned())
        .ok_or("no scheduler")?
        .set_sync_rules(sync_rules);
    let t0 = unix_ns();
    let w0 = t0 + WARMUP.as_nanos() as u64;
    let w1 = w0 + seconds * 1_000_000_000;
    let children: Vec<Child> = vms
        .iter()
        .map(|v| {
            let mut a = saturate(k, w1 + 200_000_000);
            a.mode = mode;
            host.spawn(&v.name, a)
        })
        .collect::<Result<_, _>>()?;
    let sched = host
        .daemon
        .as_ref()
        .and_then(|d| d.broker().scheduler("gpu0").cloned())
        .ok_or("no scheduler")?;
    sleep_until(w0);
    let b0: Vec<Duration> = vms
        .iter()
        .map(|v| host.busy(&v.name))
        .collect::<Result<_, _>>()?;
    let d0 = sched.device_stats();
    sleep_until(w1);
    let b1: Vec<Duration> = vms
        .iter()
        .map(|v| host.busy(&v.name))
        .collect::<Result<_, _>>()?;
    let d1 = sched.device_stats();
    let think: Vec<Duration> = vms
        .iter()
        .map(|v| host.tenant(&v.name).map(|t| t.sched_stats().think_time))
        .collect::<Result<_, _>>()?;
    let reports: Vec<Report> = children
        .into_iter()
        .map(collect)
        .collect::<Result<_, _>>()?;
    let used: Vec<f64> = b0
        .iter()
        .zip(&b1)
        .map(|(a, b)| (*b - *a).as_secs_f64())
        .collect();
    let total: f64 = used.iter().sum();
    let done: Vec<f64> = reports
        .iter()
        .map(|r| r.kernels_between(w0, w1) as f64)
        .collect();
    let total_done: f64 = done.iter().sum();
    Ok(Shares {
        broker: used.iter().map(|u| u / total).collect(),
        // Every tenant runs the same kernel: kernels × cost normalizes to kernels.
        client: done.iter().map(|d| d / total_done).collect(),
        utilization: total / seconds as f64,
        think,
        anticipation: (d1.anticipation - d0.anticipation).as_secs_f64() / seconds as f64,
        idle_with_work: (d1.idle_with_work - d0.idle_with_work).as_secs_f64() / seconds as f64,
    })
}

/// One VM capped at 25 % (weight 1 of 4) running alone under `fixed`.
///
/// The VM runs under `fair` for half a window, under `fixed` for a window
/// (switched live through the broker API) and under `fair` again: the
/// client-side share is its kernel rate under `fixed` over its rate alone
/// under `fair` measured around it, so machine load cancels out.
fn fixed(k: Kernel, seconds: u64) -> Result<(f64, f64), String> {
    let host = Host::start(
        &[vm("capped", 1, "normal"), vm("idle", 3, "normal")],
        Policy::Fair,
    )?;
    let broker = host.daemon.as_ref().ok_or("no daemon")?.broker();
    let mut cfg = broker.scheduling("gpu0").ok_or("no gpu0")?;
    let half = seconds * 500_000_000;
    let w0 = unix_ns() + WARMUP.as_nanos() as u64;
    let (f0, f1) = (w0 + half, w0 + half + seconds * 1_000_000_000);
    let w1 = f1 + half;
    let c = host.spawn("capped", saturate(k, w1 + 200_000_000))?;
    sleep_until(f0);
    cfg.policy = Policy::Fixed;
    broker
        .set_scheduling("gpu0", cfg)
        .map_err(|e| e.to_string())?;
    let b0 = host.busy("capped")?;
    sleep_until(f1);
    let b1 = host.busy("capped")?;
    cfg.policy = Policy::Fair;
    broker
        .set_scheduling("gpu0", cfg)
        .map_err(|e| e.to_string())?;
    let r = collect(c)?;
    let window = seconds as f64;
    let broker_share = (b1 - b0).as_secs_f64() / window;
    let alone = (r.kernels_between(w0, f0) + r.kernels_between(f1, w1)) as f64 / window;
    let capped = r.kernels_between(f0, f1) as f64 / window;
    Ok((broker_share, capped / alone.max(1e-9)))
}

/// Work conservation: two equal VMs; `b` stops; how fast does `a` take it all?
#[derive(Debug, Clone, Copy)]
struct Conservation {
    /// a's share while both ran.
    before: f64,
    /// a's share (broker) in the first second after b stopped.
    broker: f64,
    /// a's kernels in the same second over its kernels in the second after
    /// (alone, at full rate): the clients' view.
    client: f64,
    /// Time from b's stop to the end of the first window in which a had ≥ 95 %.
    ramp: Duration,
}

fn conservation(k: Kernel) -> Result<Conservation, String> {
    let host = Host::start(&[vm("a", 1, "normal"), vm("b", 1, "normal")], Policy::Fair)?;
    let t0 = unix_ns();
    let both = t0 + WARMUP.as_nanos() as u64;
    let b_stop = both + 2_000_000_000;
    let a_stop = b_stop + 2_500_000_000;
    let ca = host.spawn("a", saturate(k, a_stop))?;
    let cb = host.spawn("b", saturate(k, b_stop))?;
    sleep_until(both);
    let mut samples: Vec<(u64, Duration, Duration)> = Vec::new();
    while unix_ns() < a_stop {
        samples.push((unix_ns(), host.busy("a")?, host.busy("b")?));
        std::thread::sleep(SAMPLE);
    }
    let ra = collect(ca)?;
    collect(cb)?;
    // b stopped when its busy time stopped growing.
    let last_b = samples
        .windows(2)
        .rposition(|w| w[1].2 > w[0].2)
        .ok_or("b never ran")?
        + 1;
    let t_stop = samples[last_b].0;
    let at = |t: u64| -> Option<&(u64, Duration, Duration)> { samples.iter().find(|s| s.0 >= t) };
    let s0 = &samples[0];
    let s_mid = at(b_stop.saturating_sub(200_000_000)).ok_or("short run")?;
    let before = (s_mid.1 - s0.1).as_secs_f64() / ((s_mid.0 - s0.0) as f64 / 1e9);
    let s1 = at(t_stop + 1_000_000_000).ok_or("short run")?;
    let broker = (s1.1 - samples[last_b].1).as_secs_f64() / ((s1.0 - t_stop) as f64 / 1e9);
    // Client side: a's kernels in that second over its kernels in the next
    // second, when it had long been alone (its full rate).
    let first = ra.kernels_between(t_stop, t_stop + 1_000_000_000) as f64;
    let second = ra.kernels_between(t_stop + 1_000_000_000, t_stop + 2_000_000_000) as f64;
    let client = first / second.max(1.0);
    let win = RAMP_WINDOW.as_nanos() as u64;
    let mut ramp = Duration::MAX;
    for (i, s) in samples.iter().enumerate().skip(last_b) {
        if let Some(e) = samples[i..].iter().find(|e| e.0 >= s.0 + win)
            && (e.1 - s.1).as_secs_f64() / ((e.0 - s.0) as f64 / 1e9) >= CONSERVATION_TARGET
        {
            ramp = Duration::from_nanos(e.0 - t_stop);
            break;
        }
    }
    Ok(Conservation {
        before,
        broker,
        client,
        ramp,
    })
}

/// Realtime launch-to-start waits among three saturating batch VMs.
#[derive(Debug, Clone, Copy)]
struct Priority {
    broker_p50: Duration,
    broker_p99: Duration,
    /// Client round trip (launch + synchronize) minus the same alone, p50/p99.
    client_p50: Duration,
    client_p99: Duration,
    /// Share of the device the batch VMs got meanwhile.
    batch_share: f64,
    kernels: u64,
}

fn priority(k: Kernel, seconds: u64) -> Result<Priority, String> {
    // The short kernel: one block per worker, about one block's time.
    let short = |stop| ClientArgs {
        mode: Mode::Latency,
        iters: k.iters,
        grid: sim_workers() as u32,
        stop_unix_ns: stop,
    };
    let alone = {
        let host = Host::start(&[vm("rt", 1, "realtime")], Policy::Fair)?;
        let r = collect(host.spawn("rt", short(unix_ns() + 1_500_000_000))?)?;
        median(&r.rtt)
    };
    let vms = [
        vm("rt", 1, "realtime"),
        vm("b1", 1, "batch"),
        vm("b2", 1, "batch"),
        vm("b3", 1, "batch"),
    ];
    let host = Host::start(&vms, Policy::Fair)?;
    let t0 = unix_ns();
    let w0 = t0 + WARMUP.as_nanos() as u64;
    let w1 = w0 + seconds * 1_000_000_000;
    let batch: Vec<Child> = vms[1..]
        .iter()
        .map(|v| host.spawn(&v.name, saturate(k, w1)))
        .collect::<Result<_, _>>()?;
    sleep_until(w0);
    let rt = host.spawn("rt", short(w1))?;
    let b0: Vec<Duration> = vms[1..]
        .iter()
        .map(|v| host.busy(&v.name))
        .collect::<Result<_, _>>()?;
    let r = collect(rt)?;
    let b1: Vec<Duration> = vms[1..]
        .iter()
        .map(|v| host.busy(&v.name))
        .collect::<Result<_, _>>()?;
    let stats = host.tenant("rt")?.sched_stats();
    for c in batch {
        collect(c)?;
    }
    let span = (unix_ns() - w0) as f64 / 1e9;
    let batch_used: f64 = b0
        .iter()
        .zip(&b1)
        .map(|(a, b)| (*b - *a).as_secs_f64())
        .sum();
    let waits: Vec<f64> = r.rtt.iter().map(|x| (x - alone).max(0.0)).collect();
    Ok(Priority {
        broker_p50: stats.queue_wait_p50,
        broker_p99: stats.queue_wait_p99,
        client_p50: Duration::from_nanos(percentile(&waits, 50.0) as u64),
        client_p99: Duration::from_nanos(percentile(&waits, 99.0) as u64),
        batch_share: batch_used / span.max(1e-9),
        kernels: stats.kernels,
    })
}

/// Throughput of one VM alone with the scheduler on and off (kernels/s).
///
/// Two simulated GPUs in one vgpud, each with one VM running the same
/// saturating client at the same time: one device scheduled, the other with
/// scheduling switched off, so machine load hits both alike. The devices
/// swap roles in each of [`OVERHEAD_ROUNDS`] rounds, which cancels any
/// difference between them. Returns (rate on, rate off, geometric mean of
/// the rounds' on/off ratios).
fn overhead(k: Kernel, seconds: u64) -> Result<(f64, f64, f64), String> {
    let workers = (vgpud::daemon::default_workers().saturating_sub(1) / 2).max(1);
    let mut b = vm("b", 1, "normal");
    b.device = "gpu1";
    let host = Host::start_on(
        &[("gpu0", workers), ("gpu1", workers)],
        &[vm("a", 1, "normal"), b],
        Policy::Fair,
    )?;
    let round = seconds * 1_000_000_000 * 2 / OVERHEAD_ROUNDS;
    let (mut on, mut off, mut log_ratio) = (0.0, 0.0, 0.0);
    for i in 0..OVERHEAD_ROUNDS {
        let (vm_on, vm_off) = if i % 2 == 0 { ("a", "b") } else { ("b", "a") };
        // The previous round's clients have drained: both devices are idle.
        host.set_enabled(if i % 2 == 0 { "gpu0" } else { "gpu1" }, true)?;
        host.set_enabled(if i % 2 == 0 { "gpu1" } else { "gpu0" }, false)?;
        let busy0 = (host.busy(vm_on)?, host.busy(vm_off)?);
        let w0 = unix_ns() + WARMUP.as_nanos() as u64 / 2;
        let w1 = w0 + round;
        let c_on = host.spawn(vm_on, saturate(k, w1 + 100_000_000))?;
        let c_off = host.spawn(vm_off, saturate(k, w1 + 100_000_000))?;
        let (r_on, r_off) = (collect(c_on)?, collect(c_off)?);
        // Sanity: the scheduled device accounted its work, the other nothing.
        if host.busy(vm_on)? == busy0.0 || host.busy(vm_off)? != busy0.1 {
            return Err("scheduling was not on for one device and off for the other".into());
        }
        let secs = round as f64 / 1e9;
        let (a, b) = (
            r_on.kernels_between(w0, w1) as f64 / secs,
            r_off.kernels_between(w0, w1) as f64 / secs,
        );
        on += a / OVERHEAD_ROUNDS as f64;
        off += b / OVERHEAD_ROUNDS as f64;
        log_ratio += (a / b.max(1e-9)).ln() / OVERHEAD_ROUNDS as f64;
    }
    Ok((on, off, log_ratio.exp()))
}

fn points(share: f64, want: f64) -> f64 {
    (share - want).abs() * 100.0
}

fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

fn ms(d: Duration) -> String {
    if d == Duration::MAX {
        "never".into()
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    }
}

/// Worst error (points) of a fair scenario against its weights.
fn worst(s: &[f64], weights: &[u32]) -> f64 {
    let total: u32 = weights.iter().sum();
    s.iter()
        .zip(weights)
        .map(|(x, &w)| points(*x, f64::from(w) / f64::from(total)))
        .fold(0.0, f64::max)
}

/// Synchronous clients: each case's worst error (points) per run, broker
/// and clients, with the sync rules off (the baseline) and on.
fn sync_cases(k: Kernel, p: Params) -> Result<(), String> {
    let cases: Vec<(&[u32], u32)> = [&[30u32, 70][..], &[1, 2, 3, 4][..]]
        .into_iter()
        .flat_map(|w| SYNC_BATCHES.into_iter().map(move |b| (w, b)))
        .collect();
    // (case, rules) -> per run (broker error, client error, utilization)
    let mut results: Vec<[Vec<(f64, f64, f64)>; 2]> = vec![[Vec::new(), Vec::new()]; cases.len()];
    for run in 0..p.runs {
        for (ci, (w, batch)) in cases.iter().enumerate() {
            for (ri, rules) in [false, true].into_iter().enumerate() {
                let long = Kernel {
                    iters: k.iters.saturating_mul((SYNC_BATCH_KERNELS / batch).max(1)),
                };
                let s = fair_with(long, w, p.seconds, Mode::Sync(*batch), rules)?;
                println!(
                    "run {}: sync every {batch:>2}, weights {}, sync rules {}: broker {}, clients {}, device busy {} (anticipation {}, idle with work {}), think times {}",
                    run + 1,
                    w.iter()
                        .map(|x| x.to_string())
                        .collect::<Vec<_>>()
                        .join(":"),
                    if rules { "on " } else { "off" },
                    s.broker
                        .iter()
                        .map(|x| pct(*x))
                        .collect::<Vec<_>>()
                        .join(" / "),
                    s.client
                        .iter()
                        .map(|x| pct(*x))
                        .collect::<Vec<_>>()
                        .join(" / "),
                    pct(s.utilization),
                    pct(s.anticipation),
                    pct(s.idle_with_work),
                    s.think
                        .iter()
                        .map(|d| ms(*d))
                        .collect::<Vec<_>>()
                        .join(" / ")
                );
                results[ci][ri].push((worst(&s.broker, w), worst(&s.client, w), s.utilization));
            }
        }
    }
    println!();
    println!(
        "synchronous clients, worst error in points (median [min–max] of {} runs)   target <= {FAIR_TARGET_POINTS}",
        p.runs
    );
    println!(
        "case                    rules off: broker / clients        rules on: broker / clients         busy off / on"
    );
    let spread = |v: Vec<f64>| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        format!("{:.2} [{lo:.2}–{hi:.2}]", median(&v))
    };
    for (ci, (w, batch)) in cases.iter().enumerate() {
        let r = &results[ci];
        let col = |ri: usize, f: fn(&(f64, f64, f64)) -> f64| spread(r[ri].iter().map(f).collect());
        println!(
            "{:<8} sync every {batch:<2} ({}x)  {} / {}   {} / {}   {} / {}",
            w.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(":"),
            (SYNC_BATCH_KERNELS / batch).max(1),
            col(0, |x| x.0),
            col(0, |x| x.1),
            col(1, |x| x.0),
            col(1, |x| x.1),
            pct(median(&r[0].iter().map(|x| x.2).collect::<Vec<_>>())),
            pct(median(&r[1].iter().map(|x| x.2).collect::<Vec<_>>())),
        );
    }
    Ok(())
}

/// Nice value the benchmark asks for (inherited by vgpud's threads and the
/// client processes, which start after it).
const NICE: i32 = -10;

/// Raises this process's CPU priority, so that on a shared machine other
/// users' builds delay neither vgpud's threads nor the clients (which stand
/// for guests with vCPUs of their own): a synchronous client's think time
/// is otherwise how long the host takes to wake it. Needs CAP_SYS_NICE; the
/// benchmark says whether it got it.
fn raise_priority() {
    // SAFETY: setpriority has no memory-safety preconditions.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, NICE) };
    if r == 0 {
        println!("priority: nice {NICE} (vgpud's threads and the clients)");
    } else {
        println!(
            "priority: unchanged ({}); other processes' load delays the clients",
            std::io::Error::last_os_error()
        );
    }
}

/// Runs the benchmark (or, with [`CLIENT_ENV`] set, one tenant client).
pub fn run(p: Params) -> Result<(), String> {
    if let Ok(spec) = std::env::var(CLIENT_ENV) {
        return run_client(&spec);
    }
    if p.seconds == 0 || p.runs == 0 {
        return Err("--seconds and --runs must be at least 1".into());
    }
    raise_priority();
    if p.sync_only {
        let k = calibrate()?;
        println!(
            "share (synchronous clients): simulated GPU ({} workers), {SLICE_MS} ms slices, {}-second windows, {} runs; kernel: spin, {GRID} blocks, {} iterations (~{} ms alone)",
            sim_workers(),
            p.seconds,
            p.runs,
            k.iters,
            KERNEL_TARGET.as_millis()
        );
        return sync_cases(k, p);
    }
    let workers = sim_workers();
    println!(
        "share: simulated GPU ({workers} workers, one core left to the control plane), {SLICE_MS} ms slices, {}-second windows, {} runs (medians); tenants are client processes through the shim",
        p.seconds, p.runs
    );
    let k = calibrate()?;
    println!(
        "kernel: spin, {GRID} blocks x {BLOCK} threads, {} iterations (~{} ms alone)",
        k.iters,
        KERNEL_TARGET.as_millis()
    );
    let (w2, w4) = ([30u32, 70], [1u32, 2, 3, 4]);
    let mut f2 = Vec::new();
    let mut f4 = Vec::new();
    let mut fx = Vec::new();
    let mut cons = Vec::new();
    let mut prio = Vec::new();
    let mut ovh = Vec::new();
    for run in 0..p.runs {
        let (on, off, ratio) = overhead(k, p.seconds)?;
        ovh.push((on, off, ratio));
        println!(
            "run {}: overhead: scheduler on {on:.1} kernels/s, off {off:.1} kernels/s, ratio {ratio:.3}",
            run + 1
        );
        let s = fair(k, &w2, p.seconds)?;
        println!(
            "run {}: fair 30/70: broker {} / {}, clients {} / {}, device busy {}",
            run + 1,
            pct(s.broker[0]),
            pct(s.broker[1]),
            pct(s.client[0]),
            pct(s.client[1]),
            pct(s.utilization)
        );
        f2.push(s);
        let s = fair(k, &w4, p.seconds)?;
        println!(
            "run {}: fair 1:2:3:4: broker {}, clients {}, device busy {}",
            run + 1,
            s.broker
                .iter()
                .map(|x| pct(*x))
                .collect::<Vec<_>>()
                .join(" / "),
            s.client
                .iter()
                .map(|x| pct(*x))
                .collect::<Vec<_>>()
                .join(" / "),
            pct(s.utilization)
        );
        f4.push(s);
        let (b, c) = fixed(k, p.seconds)?;
        println!(
            "run {}: fixed 25 % alone: broker {}, client {}",
            run + 1,
            pct(b),
            pct(c)
        );
        fx.push((b, c));
        let c = conservation(k)?;
        println!(
            "run {}: work conservation: a had {} with b busy; first second after b stopped: broker {}, client {}; >= 95 % over {} ms after {}",
            run + 1,
            pct(c.before),
            pct(c.broker),
            pct(c.client),
            RAMP_WINDOW.as_millis(),
            ms(c.ramp)
        );
        cons.push(c);
        let pr = priority(k, p.seconds)?;
        println!(
            "run {}: realtime among 3 batch: launch-to-start p50 {} p99 {} (broker, {} kernels); client round trip minus alone p50 {} p99 {}; batch got {}",
            run + 1,
            ms(pr.broker_p50),
            ms(pr.broker_p99),
            pr.kernels,
            ms(pr.client_p50),
            ms(pr.client_p99),
            pct(pr.batch_share)
        );
        prio.push(pr);
    }
    let med = |v: Vec<f64>| median(&v);
    let slice = Duration::from_millis(SLICE_MS);
    println!();
    println!(
        "medians over {} runs                        measured          target",
        p.runs
    );
    let e2b = med(f2.iter().map(|s| worst(&s.broker, &w2)).collect());
    let e2c = med(f2.iter().map(|s| worst(&s.client, &w2)).collect());
    println!(
        "fair 30/70, worst error (broker / client)   {e2b:.2} / {e2c:.2} points   <= {FAIR_TARGET_POINTS} points"
    );
    for (i, w) in w2.iter().enumerate() {
        println!(
            "  weight {w:<2} share (broker / client)         {} / {}",
            pct(med(f2.iter().map(|s| s.broker[i]).collect())),
            pct(med(f2.iter().map(|s| s.client[i]).collect()))
        );
    }
    let e4b = med(f4.iter().map(|s| worst(&s.broker, &w4)).collect());
    let e4c = med(f4.iter().map(|s| worst(&s.client, &w4)).collect());
    println!(
        "fair 1:2:3:4, worst error (broker / client) {e4b:.2} / {e4c:.2} points   <= {FAIR_TARGET_POINTS} points"
    );
    for (i, w) in w4.iter().enumerate() {
        println!(
            "  weight {w:<2} share (broker / client)         {} / {}",
            pct(med(f4.iter().map(|s| s.broker[i]).collect())),
            pct(med(f4.iter().map(|s| s.client[i]).collect()))
        );
    }
    println!(
        "fixed 25 % alone (broker / client)          {} / {}     <= {}",
        pct(med(fx.iter().map(|x| x.0).collect())),
        pct(med(fx.iter().map(|x| x.1).collect())),
        pct(FIXED_TARGET)
    );
    println!(
        "work conservation, 1st s after stop (b/c)   {} / {}     >= {}",
        pct(med(cons.iter().map(|c| c.broker).collect())),
        pct(med(cons.iter().map(|c| c.client).collect())),
        pct(CONSERVATION_TARGET)
    );
    println!(
        "  reached >= 95 % (100 ms window) after     {}",
        ms(Duration::from_secs_f64(med(cons
            .iter()
            .map(|c| c.ramp.min(Duration::from_secs(3600)).as_secs_f64())
            .collect())))
    );
    println!(
        "realtime launch-to-start p50 / p99 (broker) {} / {}   p99 <= {}",
        ms(Duration::from_secs_f64(med(prio
            .iter()
            .map(|x| x.broker_p50.as_secs_f64())
            .collect()))),
        ms(Duration::from_secs_f64(med(prio
            .iter()
            .map(|x| x.broker_p99.as_secs_f64())
            .collect()))),
        ms(2 * slice)
    );
    println!(
        "  client-observed extra wait p50 / p99      {} / {}",
        ms(Duration::from_secs_f64(med(prio
            .iter()
            .map(|x| x.client_p50.as_secs_f64())
            .collect()))),
        ms(Duration::from_secs_f64(med(prio
            .iter()
            .map(|x| x.client_p99.as_secs_f64())
            .collect())))
    );
    println!(
        "  batch VMs' share meanwhile                {}",
        pct(med(prio.iter().map(|x| x.batch_share).collect()))
    );
    let ratio = med(ovh.iter().map(|x| x.2).collect());
    println!(
        "overhead: one VM, scheduler on / off        {ratio:.3} ({:.1} / {:.1} kernels/s)   >= {OVERHEAD_TARGET}",
        med(ovh.iter().map(|x| x.0).collect()),
        med(ovh.iter().map(|x| x.1).collect())
    );
    println!();
    sync_cases(k, p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_arguments_round_trip_and_bad_ones_are_refused() {
        let a = ClientArgs {
            mode: Mode::Latency,
            iters: 7,
            grid: 2,
            stop_unix_ns: 99,
        };
        let b = ClientArgs::decode(&a.encode()).unwrap();
        assert_eq!(
            (b.mode, b.iters, b.grid, b.stop_unix_ns),
            (Mode::Latency, 7, 2, 99)
        );
        assert!(ClientArgs::decode("spin 1 2").is_err());
        assert!(ClientArgs::decode("saturate x 2 3").is_err());
    }

    #[test]
    fn errors_are_the_worst_deviation_in_points() {
        assert!((worst(&[0.31, 0.69], &[30, 70]) - 1.0).abs() < 1e-9);
        let r = Report {
            done: vec![(5, 2), (10, 2), (20, 2)],
            rtt: vec![],
        };
        assert_eq!(r.kernels_between(5, 20), 4);
    }

    #[test]
    fn the_spin_kernel_is_embedded() {
        assert!(SPIN_PTX.contains(".entry spin("));
        assert!(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("kernels/spin.cu")
                .exists()
        );
    }
}
