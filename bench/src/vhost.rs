//! Remoting over the vhost-user vsock path, measured host-side: an in-process
//! vhost-user frontend ([`TestGuest`], which shares a memfd-backed guest
//! memory with the device and drives real virtqueues in it, like QEMU plus a
//! guest kernel would) connects to vgpud's vsock device of an in-process
//! [`Daemon`]; the guest shim's own protocol client ([`Client`]) talks to the
//! GPU port through it. The same client over a unix socket to the same
//! daemon, and the same calls made directly on a broker session, are measured
//! in the same run as baselines. The same calls also go through the
//! virtio-vgpu device of a second VM ([`DevGuest`]: the frontend playing QEMU
//! and the guest's `vgpu` module, one descriptor chain per frame), and, as a reference with no
//! transport at all, through an in-process ring to a session on another thread
//! ([`crate::handoff`]).
//!
//! Calls: `CtxSynchronize` on an idle context (a synchronous round trip) and
//! 64-byte `Memset`s posted asynchronously and closed by one synchronous
//! call (the amortized cost of an asynchronous call). The guests busy-poll for
//! answers; the virtio-vgpu guest waits for its posted batches asleep, as the
//! guest module waits for room for more of them.

use std::path::Path;
use std::time::Instant;

use cuda::client::Client;
use std::collections::VecDeque;
use vgpu_config::Config;
use vgpu_proto::msg;
use vgpu_vhost_vgpu::wire::{MAX_BATCH_FRAMES, S_OK};
use vgpu_vmm_testutils::vgpu::{DEFAULT_TIMEOUT, DevGuest, DevGuestOptions, DevSession, Pending};
use vgpu_vmm_testutils::vsock::{GuestOptions, TestGuest};
use vgpud::Daemon;

use crate::direct::{BUFFER_BYTES, Direct, memset};
use crate::handoff::Handoff;
use crate::stats::{median, percentile};

/// Parameters.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Calls per measurement.
    pub iters: usize,
    /// Repetitions (medians are reported).
    pub runs: usize,
}

/// The VM the benchmark daemon serves.
pub(crate) const VM: &str = "bench";
/// The VM with the virtio-vgpu device.
const DEV_VM: &str = "bench-dev";
/// Posted requests in flight on the virtio-vgpu device before the oldest is reaped (the fake
/// guest driver has 32 request slots per queue).
const DEV_WINDOW: usize = 16;
/// Bytes of one batch of asynchronous frames, as the shim sends them over the device: the guest
/// module's inline limit.
const DEV_BATCH_BYTES: usize = 16 << 10;
/// Bytes of one encoded `Memset` frame (header and fields).
const MEMSET_FRAME_BYTES: usize = 64;
const GUEST_CID: u64 = 3;
const SLICE: &str = "256MiB";
const DEVICE_MEMORY: &str = "1GiB";
const PERCENTILE_TAIL: f64 = 99.0;
/// Warm-up calls, as a fraction of `iters` (plus one).
const WARMUP_DIVISOR: usize = 10;
const NS_PER_US: f64 = 1e3;
const NS_PER_S: f64 = 1e9;

/// One path's figures, in nanoseconds per call.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Figures {
    /// Synchronous round trip, median of the run's calls.
    pub sync_p50: f64,
    /// Synchronous round trip, 99th percentile.
    pub sync_p99: f64,
    /// Asynchronous call, amortized.
    pub async_ns: f64,
}

impl Figures {
    /// Medians of several runs, figure by figure.
    fn medians(runs: &[Figures]) -> Figures {
        let med = |f: fn(&Figures) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
        Figures {
            sync_p50: med(|f| f.sync_p50),
            sync_p99: med(|f| f.sync_p99),
            async_ns: med(|f| f.async_ns),
        }
    }
}

/// Medians of every path.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Report {
    /// Calls on a broker session in this process.
    pub direct: Figures,
    /// The shim's client over a unix socket.
    pub unix: Figures,
    /// The shim's client over the vhost-user vsock device.
    pub vhost: Figures,
    /// Frames over the virtio-vgpu device.
    pub dev: Figures,
    /// The hand-off alone: the calls handed to a session on another thread through an
    /// in-process ring, with no transport ([`crate::handoff`]).
    pub handoff: Figures,
}

fn err(what: &str) -> impl FnOnce(cuda::client::CallError) -> String + '_ {
    move |e| format!("{what}: {} ({})", e.message, e.code)
}

/// A client with a context and a buffer, ready to measure.
struct Remote {
    client: Client,
    ctx: u64,
    ptr: u64,
}

impl Remote {
    fn open(stream: Box<dyn cuda::transport::Stream>) -> Result<Remote, String> {
        let mut client = Client::new(stream);
        let hello = client.hello("vgpu-bench").map_err(err("handshake"))?;
        if hello.tenant != VM {
            return Err(format!("connected to VM `{}`, not `{VM}`", hello.tenant));
        }
        let (ctx, _) = client
            .call(
                &msg::CtxCreate {
                    device: 0,
                    flags: 0,
                },
                &[],
            )
            .map_err(err("CtxCreate"))?;
        let ctx = ctx.handle;
        let (ptr, _) = client
            .call(
                &msg::MemAlloc {
                    ctx,
                    size: BUFFER_BYTES,
                },
                &[],
            )
            .map_err(err("MemAlloc"))?;
        Ok(Remote {
            client,
            ctx,
            ptr: ptr.ptr,
        })
    }
}

impl CallPath for Remote {
    fn synchronize(&mut self) -> Result<(), String> {
        self.client
            .call(&msg::CtxSynchronize { ctx: self.ctx }, &[])
            .map_err(err("CtxSynchronize"))?;
        Ok(())
    }

    fn memsets(&mut self, n: usize) -> Result<(), String> {
        let m = memset(self.ctx, self.ptr);
        for _ in 0..n {
            self.client.post(&m, &[]).map_err(err("Memset"))?;
        }
        self.synchronize()
    }
}

/// The same calls through the virtio-vgpu device, as the shim makes them: synchronous frames one
/// chain each on the control queue, asynchronous ones in `BATCH` requests on the submission queue
/// (up to [`DEV_BATCH_BYTES`] each; their chains reaped as the guest module does, on completion).
struct DevRemote {
    _guest: DevGuest,
    session: DevSession,
    ctx: u64,
    ptr: u64,
    /// Posted batches whose chains are not reaped yet.
    inflight: VecDeque<Pending>,
}

fn dev_err(what: &str) -> impl FnOnce(vgpu_vmm_testutils::vgpu::DevError) -> String + '_ {
    move |e| format!("{what} (virtio-vgpu): {e}")
}

impl DevRemote {
    fn open(socket: &Path) -> Result<DevRemote, String> {
        let guest = DevGuest::start(
            socket,
            DevGuestOptions {
                busy_poll: true,
                ..DevGuestOptions::default()
            },
        )
        .map_err(|e| format!("attaching the in-process frontend to the virtio-vgpu device: {e}"))?;
        let mut session = DevSession::open(&guest, 1).map_err(dev_err("opening a session"))?;
        let hello = session.hello("vgpu-bench").map_err(dev_err("handshake"))?;
        if hello.tenant != DEV_VM {
            return Err(format!(
                "connected to VM `{}`, not `{DEV_VM}`",
                hello.tenant
            ));
        }
        let ctx = session.ctx_create().map_err(dev_err("CtxCreate"))?;
        let ptr = session
            .call(
                &msg::MemAlloc {
                    ctx,
                    size: BUFFER_BYTES,
                },
                &[],
            )
            .map_err(dev_err("MemAlloc"))?
            .ptr;
        Ok(DevRemote {
            _guest: guest,
            session,
            ctx,
            ptr,
            inflight: VecDeque::with_capacity(DEV_WINDOW),
        })
    }
}

impl CallPath for DevRemote {
    fn synchronize(&mut self) -> Result<(), String> {
        self.session
            .call(&msg::CtxSynchronize { ctx: self.ctx }, &[])
            .map_err(dev_err("CtxSynchronize"))?;
        Ok(())
    }

    fn memsets(&mut self, n: usize) -> Result<(), String> {
        let per_batch = (DEV_BATCH_BYTES / MEMSET_FRAME_BYTES).min(MAX_BATCH_FRAMES);
        let mut left = n;
        while left > 0 {
            let k = left.min(per_batch);
            if self.inflight.len() == DEV_WINDOW
                && let Some(p) = self.inflight.pop_front()
            {
                self.reap(p)?;
            }
            let batch = vec![memset(self.ctx, self.ptr); k];
            let p = self
                .session
                .submit_batch(&batch)
                .map_err(dev_err("Memset batch"))?;
            self.inflight.push_back(p);
            left -= k;
        }
        self.synchronize()
    }

    fn settle(&mut self) -> Result<(), String> {
        while let Some(p) = self.inflight.pop_front() {
            self.reap(p)?;
        }
        Ok(())
    }
}

impl DevRemote {
    /// Waits for a posted batch's chain, as the guest module waits for room for more posted
    /// requests: asleep until its interrupt (only synchronous calls poll).
    fn reap(&self, p: Pending) -> Result<(), String> {
        match self.session.guest().wait_posted(p, DEFAULT_TIMEOUT) {
            Ok(c) if c.resp.status == S_OK => Ok(()),
            Ok(c) => Err(format!("posted Memset refused: status {}", c.resp.status)),
            Err(e) => Err(format!("posted Memset (virtio-vgpu): {e}")),
        }
    }
}

impl CallPath for Direct {
    fn synchronize(&mut self) -> Result<(), String> {
        Direct::synchronize(self)
    }

    fn memsets(&mut self, n: usize) -> Result<(), String> {
        self.posted_memsets(n)
    }
}

/// One way of making the benchmark's calls; [`measure_path`] times every path alike.
pub(crate) trait CallPath {
    /// One `CtxSynchronize` on the idle context (a synchronous round trip).
    fn synchronize(&mut self) -> Result<(), String>;
    /// `n` asynchronous 64-byte `Memset`s, then the `CtxSynchronize` that closes them.
    fn memsets(&mut self, n: usize) -> Result<(), String>;
    /// Work after the timed part (completions not waited for yet).
    fn settle(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// `iters` synchronous round trips one by one, then `iters` asynchronous calls, timed.
fn measure_path(p: &mut dyn CallPath, iters: usize) -> Result<Figures, String> {
    let mut lat = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        p.synchronize()?;
        lat.push(t.elapsed().as_nanos() as f64);
    }
    let t = Instant::now();
    p.memsets(iters)?;
    let async_ns = t.elapsed().as_nanos() as f64 / iters as f64;
    p.settle()?;
    Ok(Figures {
        sync_p50: median(&lat),
        sync_p99: percentile(&lat, PERCENTILE_TAIL),
        async_ns,
    })
}

pub(crate) fn config(dir: &Path) -> Result<Config, String> {
    let text = format!(
        "[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"{DEVICE_MEMORY}\"\n\n\
         [[vm]]\nname = \"{VM}\"\nmemory = \"{SLICE}\"\n\
         unix_socket = \"{}\"\nvhost_user_socket = \"{}\"\nguest_cid = {GUEST_CID}\n\n\
         [[vm]]\nname = \"{DEV_VM}\"\nmemory = \"{SLICE}\"\n\
         vhost_user_socket = \"{}\"\ndevice_model = \"vgpu\"\n",
        dir.join("bench.sock").display(),
        dir.join("bench.vhost.sock").display(),
        dir.join("bench.vgpu.sock").display(),
    );
    Config::parse(&dir.join("bench.toml"), &text).map_err(|e| format!("benchmark config: {e}"))
}

/// Measures every path (`runs` times `iters` calls each, after a
/// warm-up) and returns the medians.
pub fn measure(p: Params) -> Result<Report, String> {
    if p.iters == 0 || p.runs == 0 {
        return Err("--iters and --runs must be at least 1".into());
    }
    let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    let config = config(dir.path())?;
    let daemon = Daemon::start(&config).map_err(|e| format!("starting vgpud in-process: {e}"))?;

    let mut direct = Direct::open(&daemon, VM)?;
    // As the shim connects (its reads poll briefly before they block).
    let unix = cuda::transport::connect(&cuda::transport::Endpoint::Unix(
        dir.path().join("bench.sock"),
    ))
    .map_err(|e| format!("connecting to the unix socket: {e}"))?;
    let mut unix = Remote::open(unix)?;
    let guest = TestGuest::start(
        &dir.path().join("bench.vhost.sock"),
        GuestOptions {
            busy_poll: true,
            ..GuestOptions::default()
        },
    )
    .map_err(|e| format!("attaching the in-process vhost-user frontend: {e}"))?;
    let stream = guest
        .connect(vgpu_proto::GPU_VSOCK_PORT)
        .map_err(|e| format!("connecting to the GPU port over vsock: {e}"))?;
    let mut vhost = Remote::open(Box::new(stream))?;
    let mut dev = DevRemote::open(&dir.path().join("bench.vgpu.sock"))?;
    let mut handoff = Handoff::open(&daemon, VM)?;

    let warmup = p.iters / WARMUP_DIVISOR + 1;
    measure_path(&mut direct, warmup)?;
    measure_path(&mut unix, warmup)?;
    measure_path(&mut vhost, warmup)?;
    measure_path(&mut dev, warmup)?;
    measure_path(&mut handoff, warmup)?;
    let (mut d, mut u, mut v, mut g, mut h) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Interleaved, so that a burst of load on the machine hits every path.
    for _ in 0..p.runs {
        d.push(measure_path(&mut direct, p.iters)?);
        u.push(measure_path(&mut unix, p.iters)?);
        v.push(measure_path(&mut vhost, p.iters)?);
        g.push(measure_path(&mut dev, p.iters)?);
        h.push(measure_path(&mut handoff, p.iters)?);
    }
    let violations = guest.violations();
    if !violations.is_empty() {
        return Err(format!(
            "the device broke the vsock protocol: {violations:?}"
        ));
    }
    drop(handoff);
    drop(dev);
    drop(vhost);
    drop(guest);
    drop(unix);
    drop(direct);
    daemon.shutdown();
    Ok(Report {
        direct: Figures::medians(&d),
        unix: Figures::medians(&u),
        vhost: Figures::medians(&v),
        dev: Figures::medians(&g),
        handoff: Figures::medians(&h),
    })
}

/// A table row: its label and the figure it shows.
type Row = (&'static str, fn(&Figures) -> f64);

fn print(p: Params, r: &Report) {
    println!(
        "vhost: {} calls x {} runs (medians), simulated GPU; vhost-user vsock device and \
         virtio-vgpu device driven by in-process frontends (busy-polling guests; posted \
         virtio-vgpu batches reaped asleep, as the guest module does)",
        p.iters, p.runs
    );
    println!(
        "{:<42} {:>10} {:>11} {:>11} {:>11} {:>12} {:>11} {:>10}",
        "call",
        "direct",
        "unix",
        "vhost-user",
        "vhost/unix",
        "vhost/direct",
        "vgpu-dev",
        "dev/direct"
    );
    let rows: [Row; 3] = [
        ("CtxSynchronize round trip, p50", |f| f.sync_p50),
        ("CtxSynchronize round trip, p99", |f| f.sync_p99),
        ("Memset (64 B) async, amortized per call", |f| f.async_ns),
    ];
    for (name, f) in rows {
        let (d, u, v, g) = (f(&r.direct), f(&r.unix), f(&r.vhost), f(&r.dev));
        println!(
            "{name:<42} {:>8.3}us {:>9.3}us {:>9.3}us {:>10.1}x {:>11.1}x {:>9.3}us {:>9.1}x",
            d / NS_PER_US,
            u / NS_PER_US,
            v / NS_PER_US,
            v / u,
            v / d,
            g / NS_PER_US,
            g / d
        );
    }
    let rate = |f: &Figures| NS_PER_S / f.async_ns;
    println!(
        "{:<42} {:>9.0}/s {:>10.0}/s {:>10.0}/s {:>24.0}/s",
        "Memset async rate",
        rate(&r.direct),
        rate(&r.unix),
        rate(&r.vhost),
        rate(&r.dev)
    );
    println!(
        "reference: the same calls handed to a broker session on another thread through an \
         in-process ring (no transport), against the direct calls"
    );
    for (name, f) in rows {
        let (d, h) = (f(&r.direct), f(&r.handoff));
        println!(
            "  {name:<40} {:>8.3}us {:>9.3}us {:>10.2}x",
            d / NS_PER_US,
            h / NS_PER_US,
            h / d
        );
    }
}

/// Runs the benchmark, prints the figures with their ratios and returns them.
pub fn run(p: Params) -> Result<Report, String> {
    let report = measure(p)?;
    print(p, &report);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_completes_real_calls() {
        let r = measure(Params { iters: 50, runs: 1 }).expect("benchmark");
        for f in [r.direct, r.unix, r.vhost, r.dev, r.handoff] {
            assert!(f.sync_p50 > 0.0 && f.sync_p99 >= f.sync_p50, "{r:?}");
            assert!(f.async_ns > 0.0, "{r:?}");
        }
    }

    #[test]
    fn zero_iterations_are_refused() {
        assert!(measure(Params { iters: 0, runs: 1 }).is_err());
        assert!(measure(Params { iters: 1, runs: 0 }).is_err());
    }
}
