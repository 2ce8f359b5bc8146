//! Soak and load: many concurrent sessions making mixed calls against a real
//! `vgpud` process, with clients killed at random points.
//!
//! Half the sessions connect over the VM's unix socket, half over its
//! vhost-user vsock device (an in-process frontend, [`TestGuest`], plays QEMU
//! and the guest kernel). Each session allocates, copies, fills, launches a
//! kernel, synchronizes and frees, checking every result against a model of
//! its memory; a chosen share of sessions drop their connection mid-stream
//! (with memory held and work posted, as a killed process does) and start a
//! new session to finish their calls.
//!
//! Checked: every call got its own reply (the protocol client matches call
//! ids; a lost, duplicated or misplaced reply fails a call or a data check),
//! every slice is back to 0 once the sessions end, and vgpud's heap in use and
//! its resident set after the soak are within [`HEAP_GROWTH_LIMIT`] and
//! [`RSS_GROWTH_LIMIT`] of their baselines, measured after a warm-up wave of
//! the same sessions. With several waves both are read after each, so memory
//! that grows with the work (a leak) can be told from memory that grows once
//! to a high-water mark (threads, allocator arenas) and stays.
//!
//! vgpud runs with glibc's per-thread caches of freed chunks off
//! ([`NO_THREAD_CACHE`]): `mallinfo2` counts a chunk held in such a cache as in
//! use, and with them on the heap in use rose by about 130 bytes per vsock
//! session from wave to wave, as the long-lived threads' caches filled up to
//! their bound, while with them off it stayed level (10 waves of 64 sessions:
//! 308 → 400 KiB on, 242 → 245 KiB off).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cuda::client::{CallError, Client};
use vgpu_proto::msg;
use vgpu_vmm_testutils::vsock::{GuestOptions, TestGuest};

/// vgpud's heap in use after the soak may exceed its baseline by this factor. It is the figure
/// a leak moves: a byte per call leaked by the default soak's 640 000 calls would more than
/// double it. What it does move without a leak is memory kept at a high-water mark of the
/// load, in steps of 4-8 KiB that then stay (as a container's capacity grows): with glibc's
/// per-thread caches off (as the soak runs vgpud) and two busy loops beside it, 136 runs of 10
/// waves of 64 sessions with kills ended at 0.98-1.14x, and 40 waves (1251 kills) went
/// 245 → 260 KiB by the 21st wave and stayed there for the other 19.
pub const HEAP_GROWTH_LIMIT: f64 = 1.25;

/// The glibc tunable vgpud runs under in the soak: no per-thread caches of freed chunks
/// (tcache), so that its heap in use counts live objects only. Each of vgpud's long-lived
/// threads otherwise keeps up to 7 freed chunks of every small size, which glibc counts as in
/// use: bounded, but it fills over many waves and looks like a slow leak.
pub const NO_THREAD_CACHE: &str = "glibc.malloc.tcache_count=0";

/// vgpud's own resident set after the soak may exceed its baseline by this factor. It moves by
/// as much as a megabyte (a tenth of it) with what the allocator keeps of freed memory: in one
/// run it grew 1.0 MiB while the heap in use grew 26 KiB.
pub const RSS_GROWTH_LIMIT: f64 = 1.25;
/// The VM whose sessions come over the unix socket.
const UNIX_VM: &str = "soak-unix";
/// The VM whose sessions come over the vsock device.
const VSOCK_VM: &str = "soak-vsock";
/// Guest CID of the vsock VM.
const GUEST_CID: u64 = 3;
/// Each VM's slice.
const SLICE: &str = "2GiB";
/// The simulated device's memory.
const DEVICE_MEMORY: &str = "8GiB";
/// Elements (u32) of each session's checked buffer.
const BUFFER_ELEMS: u32 = 4096;
/// Threads per block of the kernel.
const BLOCK: u32 = 256;
/// vgpud's warnings and errors a failed soak reports (the last ones).
const WARNINGS_KEPT: usize = 20;
/// Extra allocations a session may hold at once.
const MAX_HELD: usize = 8;
/// Largest extra allocation.
const MAX_ALLOC: u64 = 256 << 10;
/// Most calls per session in the warm-up wave (fewer when the soak's sessions make fewer). Long
/// enough for its sessions to overlap as the soak's do, so the baseline includes what vgpud
/// keeps once it has served that many at once (heap arenas' high-water marks, idle threads):
/// after 50 calls the baseline was 10.9 MiB, after the first full wave of 1000 calls 12.7 MiB
/// and after thirteen more 12.1–13.5 MiB.
const WARMUP_CALLS: usize = 500;
/// vgpud's metric of its heap in use (bytes).
const HEAP_METRIC: &str = "vgpu_heap_in_use_bytes ";
/// vgpud's metric of the lost wake-ups its vsock devices' audits made up for (per VM).
const LOST_WAKEUPS_METRIC: &str = "vgpu_vm_vsock_lost_wakeups_total";
/// Mixed into the seed for the warm-up's choices, so they differ from the first wave's.
const WARMUP_SEED: u64 = 0x5741_524d;
/// How long vgpud may take to start, and the slices to drain after the soak.
const SETTLE: Duration = Duration::from_secs(20);
/// Between two readings of vgpud's resident set while it settles.
const RSS_STEP: Duration = Duration::from_millis(100);
/// The longest vgpud's resident set is watched for settling.
const RSS_SETTLE: Duration = Duration::from_secs(3);

/// `add_one(p, n)`: `p[i] += 1` for `i < n`.
const KERNEL_PTX: &str = "\
.version 7.0
.target sm_70
.address_size 64
.visible .entry add_one(.param .u64 p, .param .u32 n)
{
    .reg .pred %p1;
    .reg .b32 %r<7>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [p];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd2, %rd2, %rd3;
    ld.global.u32 %r6, [%rd2];
    add.s32 %r6, %r6, 1;
    st.global.u32 [%rd2], %r6;
DONE:
    ret;
}
";

/// What to run.
#[derive(Debug, Clone)]
pub struct Params {
    /// Concurrent sessions (half over the unix socket, half over vsock).
    pub sessions: usize,
    /// Calls each session makes.
    pub calls: usize,
    /// Percentage of sessions killed once at a random point.
    pub kill_percent: u32,
    /// The vgpud binary.
    pub vgpud: PathBuf,
    /// Seed of the random choices.
    pub seed: u64,
    /// Soak waves, one after the other (at least 1); each has `sessions` sessions of `calls`
    /// calls and its own kill points.
    pub waves: usize,
}

/// What a soak run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Sessions run concurrently.
    pub sessions: usize,
    /// Calls that completed with the expected result.
    pub calls_ok: u64,
    /// Calls that failed or returned wrong data (lost, duplicated or mixed-up replies).
    pub failures: u64,
    /// The first failures, for the report.
    pub failure_examples: Vec<String>,
    /// The last warnings and errors vgpud logged, kept when calls failed or wake-ups were lost
    /// (what the daemon saw of it).
    pub vgpud_warnings: Vec<String>,
    /// Wake-ups the vsock device's audit found lost and made up for (calls delayed up to a
    /// second, not failed; 0 in a healthy run).
    pub lost_wakeups: u64,
    /// Connections dropped mid-stream.
    pub kills: u64,
    /// Wall time of the soak wave.
    pub seconds: f64,
    /// Device memory still charged to each VM after the sessions ended.
    pub memory_used_after: Vec<(String, u64)>,
    /// vgpud's own resident set (less the VM RAM it maps) after the warm-up wave (KiB).
    pub rss_baseline_kib: u64,
    /// vgpud's largest resident set seen during the soak (KiB).
    pub rss_peak_kib: u64,
    /// vgpud's settled resident set after each wave (KiB).
    pub rss_after_waves_kib: Vec<u64>,
    /// vgpud's heap in use after the warm-up wave (KiB, its `vgpu_heap_in_use_bytes`).
    pub heap_baseline_kib: u64,
    /// vgpud's heap in use after each wave (KiB).
    pub heap_after_waves_kib: Vec<u64>,
    /// vgpud's resident set after the last wave, read as soon as the slices were drained
    /// (KiB).
    pub rss_after_first_kib: u64,
}

impl Report {
    /// vgpud's resident set after the soak (the last wave), once settled (KiB).
    pub fn rss_after_kib(&self) -> u64 {
        self.rss_after_waves_kib.last().copied().unwrap_or(0)
    }

    /// vgpud's heap in use after the soak (the last wave) (KiB).
    pub fn heap_after_kib(&self) -> u64 {
        self.heap_after_waves_kib.last().copied().unwrap_or(0)
    }

    /// `rss_after / rss_baseline`.
    pub fn rss_ratio(&self) -> f64 {
        self.rss_after_kib() as f64 / self.rss_baseline_kib.max(1) as f64
    }

    /// vgpud's heap in use after the last wave over its baseline.
    pub fn heap_ratio(&self) -> f64 {
        self.heap_after_kib() as f64 / self.heap_baseline_kib.max(1) as f64
    }

    /// Why the run failed, if it did.
    pub fn verdict(&self) -> Result<(), String> {
        if self.failures > 0 {
            return Err(format!(
                "{} calls failed: {:?}; vgpud's last warnings: {:?}",
                self.failures, self.failure_examples, self.vgpud_warnings
            ));
        }
        if let Some((vm, used)) = self.memory_used_after.iter().find(|(_, u)| *u != 0) {
            return Err(format!(
                "{vm} still has {used} bytes charged after its sessions ended"
            ));
        }
        if self.heap_ratio() > HEAP_GROWTH_LIMIT {
            return Err(format!(
                "vgpud's heap in use grew from {} KiB to {} KiB ({:.3}×, limit {HEAP_GROWTH_LIMIT}×)",
                self.heap_baseline_kib,
                self.heap_after_kib(),
                self.heap_ratio()
            ));
        }
        if self.rss_ratio() > RSS_GROWTH_LIMIT {
            return Err(format!(
                "vgpud grew from {} KiB to {} KiB ({:.3}×, limit {RSS_GROWTH_LIMIT}×)",
                self.rss_baseline_kib,
                self.rss_after_kib(),
                self.rss_ratio()
            ));
        }
        Ok(())
    }
}

/// A small xorshift generator: reproducible choices from `--seed`.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A running vgpud child with its sockets.
struct Daemon {
    child: Child,
    dir: tempfile::TempDir,
}

impl Daemon {
    fn start(vgpud: &Path) -> Result<Daemon, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
        let d = dir.path();
        let config = format!(
            "[admin]\nsocket = \"{admin}\"\n\n\
             [[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"{DEVICE_MEMORY}\"\n\n\
             [[vm]]\nname = \"{UNIX_VM}\"\ndevice = \"gpu0\"\nmemory = \"{SLICE}\"\n\
             unix_socket = \"{unix}\"\n\n\
             [[vm]]\nname = \"{VSOCK_VM}\"\ndevice = \"gpu0\"\nmemory = \"{SLICE}\"\n\
             vhost_user_socket = \"{vhost}\"\nguest_cid = {GUEST_CID}\n",
            admin = d.join("admin.sock").display(),
            unix = d.join("unix.sock").display(),
            vhost = d.join("vhost.sock").display(),
        );
        let path = d.join("vgpud.toml");
        std::fs::write(&path, config).map_err(|e| format!("writing the config: {e}"))?;
        let log = std::fs::File::create(d.join("vgpud.log"))
            .map_err(|e| format!("creating the log: {e}"))?;
        // Tunables the caller set stay; the soak's is added to them.
        let tunables = match std::env::var("GLIBC_TUNABLES") {
            Ok(set) if !set.is_empty() => format!("{set}:{NO_THREAD_CACHE}"),
            _ => NO_THREAD_CACHE.to_string(),
        };
        let child = Command::new(vgpud)
            .arg("--config")
            .arg(&path)
            .env("GLIBC_TUNABLES", tunables)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", vgpud.display()))?;
        let mut daemon = Daemon { child, dir };
        let start = Instant::now();
        while !(daemon.path("admin.sock").exists() && daemon.path("vhost.sock").exists()) {
            if start.elapsed() > SETTLE || daemon.child.try_wait().ok().flatten().is_some() {
                return Err(format!("vgpud did not start:\n{}", daemon.log()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(daemon)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("vgpud.log")).unwrap_or_default()
    }

    /// vgpud's resident set once it stops falling, and the first reading. A session's slice
    /// is freed as its session ends, and only then does its thread return the freed heap
    /// (`release_freed_memory`): on a loaded machine a reading taken as soon as the slices
    /// are drained can come before the last sessions' threads got there.
    fn settled_rss_kib(&self) -> (u64, u64) {
        let start = Instant::now();
        let first = self.rss_kib();
        let mut last = first;
        loop {
            std::thread::sleep(RSS_STEP);
            let now = self.rss_kib();
            if now >= last || start.elapsed() > RSS_SETTLE {
                return (now.min(last), first);
            }
            last = now;
        }
    }

    /// vgpud's own resident set (KiB): `VmRSS` less `RssShmem`, the shared memory it maps, which
    /// is mostly the VM's RAM (the test guest's pages vgpud has touched, bounded by the VM's
    /// size and not vgpud's to free).
    fn rss_kib(&self) -> u64 {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
        else {
            return 0;
        };
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0)
        };
        field("VmRSS:").saturating_sub(field("RssShmem:"))
    }

    /// The body of `GET path` on the admin API.
    fn admin_get(&self, path: &str) -> Result<String, String> {
        let mut s = UnixStream::connect(self.path("admin.sock"))
            .map_err(|e| format!("connecting to the admin API: {e}"))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: vgpud\r\nConnection: close\r\n\r\n"
        )
        .map_err(|e| format!("admin request: {e}"))?;
        let mut text = String::new();
        s.read_to_string(&mut text)
            .map_err(|e| format!("admin reply: {e}"))?;
        Ok(text
            .split("\r\n\r\n")
            .nth(1)
            .unwrap_or_default()
            .to_string())
    }

    /// vgpud's heap in use (KiB), from its metrics.
    fn heap_kib(&self) -> Result<u64, String> {
        let body = self.admin_get("/v1/metrics")?;
        body.lines()
            .find_map(|l| l.strip_prefix(HEAP_METRIC))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|b| b as u64 / 1024)
            .ok_or_else(|| format!("no {HEAP_METRIC} in vgpud's metrics"))
    }

    /// The lost wake-ups vgpud's vsock devices made up for, from its metrics (summed over VMs).
    fn lost_wakeups(&self) -> Result<u64, String> {
        let body = self.admin_get("/v1/metrics")?;
        Ok(body
            .lines()
            .filter(|l| l.starts_with(LOST_WAKEUPS_METRIC))
            .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
            .sum::<f64>() as u64)
    }

    /// `memory_used` of a VM, from the admin API.
    fn memory_used(&self, vm: &str) -> Result<u64, String> {
        let body = self.admin_get(&format!("/v1/vms/{vm}"))?;
        let key = "\"memory_used\":";
        body.find(key)
            .and_then(|i| {
                body[i + key.len()..]
                    .trim_start()
                    .split(|c: char| !c.is_ascii_digit())
                    .next()
                    .and_then(|n| n.parse().ok())
            })
            .ok_or_else(|| format!("no memory_used for {vm} in: {body}"))
    }

    /// Waits until every VM's slice is back to 0 (or the deadline passes).
    fn settled_usage(&self) -> Result<Vec<(String, u64)>, String> {
        let start = Instant::now();
        loop {
            let used = [UNIX_VM, VSOCK_VM]
                .iter()
                .map(|vm| Ok((vm.to_string(), self.memory_used(vm)?)))
                .collect::<Result<Vec<_>, String>>()?;
            if used.iter().all(|(_, u)| *u == 0) || start.elapsed() > SETTLE {
                return Ok(used);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the child this run started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// Where a session connects.
#[derive(Clone)]
enum Route {
    Unix(PathBuf),
    Vsock(Arc<TestGuest>),
}

impl Route {
    fn connect(&self) -> Result<Client, String> {
        let stream: Box<dyn cuda::transport::Stream> = match self {
            Route::Unix(path) => {
                Box::new(UnixStream::connect(path).map_err(|e| format!("unix connect: {e}"))?)
            }
            Route::Vsock(guest) => Box::new(
                guest
                    .connect(vgpu_proto::GPU_VSOCK_PORT)
                    .map_err(|e| format!("vsock connect: {e}"))?,
            ),
        };
        let mut client = Client::new(stream);
        client.hello("vgpu-soak").map_err(call_err("Hello"))?;
        Ok(client)
    }
}

fn call_err(what: &'static str) -> impl Fn(CallError) -> String {
    move |e| format!("{what}: {} ({})", e.message, e.code)
}

/// One session's state and its model of the device memory it owns.
struct Session {
    client: Client,
    ctx: u64,
    function: u64,
    buffer: u64,
    /// What every element of `buffer` holds once posted work completes.
    expected: u32,
    held: Vec<u64>,
}

impl Session {
    fn open(route: &Route) -> Result<Session, String> {
        let mut client = route.connect()?;
        let (ctx, _) = client
            .call(
                &msg::CtxCreate {
                    device: 0,
                    flags: 0,
                },
                &[],
            )
            .map_err(call_err("CtxCreate"))?;
        let ctx = ctx.handle;
        let (module, _) = client
            .call(&msg::ModuleLoad { ctx }, KERNEL_PTX.as_bytes())
            .map_err(call_err("ModuleLoad"))?;
        let (function, _) = client
            .call(
                &msg::ModuleGetFunction {
                    ctx,
                    module: module.handle,
                    name: "add_one".into(),
                },
                &[],
            )
            .map_err(call_err("ModuleGetFunction"))?;
        let (buffer, _) = client
            .call(
                &msg::MemAlloc {
                    ctx,
                    size: u64::from(BUFFER_ELEMS) * 4,
                },
                &[],
            )
            .map_err(call_err("MemAlloc"))?;
        let mut s = Session {
            client,
            ctx,
            function: function.function,
            buffer: buffer.ptr,
            expected: 0,
            held: Vec::new(),
        };
        s.fill(0)?;
        Ok(s)
    }

    fn fill(&mut self, value: u32) -> Result<(), String> {
        self.client
            .post(
                &msg::Memset {
                    ctx: self.ctx,
                    stream: 0,
                    dst: self.buffer,
                    value,
                    elem_size: 4,
                    count: u64::from(BUFFER_ELEMS),
                },
                &[],
            )
            .map_err(call_err("Memset"))?;
        self.expected = value;
        Ok(())
    }

    fn upload(&mut self, value: u32) -> Result<(), String> {
        let data: Vec<u8> = (0..BUFFER_ELEMS)
            .flat_map(|_| value.to_le_bytes())
            .collect();
        self.client
            .post(
                &msg::MemcpyHtoD {
                    ctx: self.ctx,
                    stream: 0,
                    dst: self.buffer,
                },
                &data,
            )
            .map_err(call_err("MemcpyHtoD"))?;
        self.expected = value;
        Ok(())
    }

    fn launch(&mut self) -> Result<(), String> {
        // add_one(u64 p, u32 n): packed as the kernel declares them.
        let mut params = [0u8; 12];
        params[..8].copy_from_slice(&self.buffer.to_le_bytes());
        params[8..].copy_from_slice(&BUFFER_ELEMS.to_le_bytes());
        self.client
            .post(
                &msg::LaunchKernel {
                    ctx: self.ctx,
                    stream: 0,
                    function: self.function,
                    grid_x: BUFFER_ELEMS.div_ceil(BLOCK),
                    grid_y: 1,
                    grid_z: 1,
                    block_x: BLOCK,
                    block_y: 1,
                    block_z: 1,
                    shared_bytes: 0,
                },
                &params,
            )
            .map_err(call_err("LaunchKernel"))?;
        self.expected = self.expected.wrapping_add(1);
        Ok(())
    }

    fn check(&mut self) -> Result<(), String> {
        let (_, data) = self
            .client
            .call(
                &msg::MemcpyDtoH {
                    ctx: self.ctx,
                    stream: 0,
                    src: self.buffer,
                    len: u64::from(BUFFER_ELEMS) * 4,
                },
                &[],
            )
            .map_err(call_err("MemcpyDtoH"))?;
        let wrong = data
            .chunks_exact(4)
            .position(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) != self.expected);
        match (data.len() == BUFFER_ELEMS as usize * 4, wrong) {
            (true, None) => Ok(()),
            (len_ok, at) => Err(format!(
                "read back {} bytes, element {at:?} differs from {} (a reply lost or mixed up; length ok: {len_ok})",
                data.len(),
                self.expected
            )),
        }
    }

    fn alloc(&mut self, size: u64) -> Result<(), String> {
        let (r, _) = self
            .client
            .call(
                &msg::MemAlloc {
                    ctx: self.ctx,
                    size,
                },
                &[],
            )
            .map_err(call_err("MemAlloc"))?;
        self.held.push(r.ptr);
        Ok(())
    }

    fn free(&mut self, index: usize) -> Result<(), String> {
        let ptr = self.held.swap_remove(index);
        self.client
            .call(&msg::MemFree { ctx: self.ctx, ptr }, &[])
            .map_err(call_err("MemFree"))?;
        Ok(())
    }

    fn synchronize(&mut self) -> Result<(), String> {
        self.client
            .call(&msg::CtxSynchronize { ctx: self.ctx }, &[])
            .map_err(call_err("CtxSynchronize"))?;
        Ok(())
    }

    /// One random call (or a call and its check).
    fn step(&mut self, rng: &mut Rng) -> Result<(), String> {
        const KINDS: u64 = 8;
        match rng.below(KINDS) {
            0 if self.held.len() < MAX_HELD => {
                let size = 4096 + rng.below(MAX_ALLOC);
                self.alloc(size)
            }
            1 if !self.held.is_empty() => {
                let i = rng.below(self.held.len() as u64) as usize;
                self.free(i)
            }
            2 => self.fill(rng.next() as u32),
            3 => self.upload(rng.next() as u32),
            4 | 5 => self.launch(),
            6 => self.synchronize(),
            _ => self.check(),
        }
    }
}

/// The last [`WARNINGS_KEPT`] warnings and errors in vgpud's log.
fn last_warnings(log: &str) -> Vec<String> {
    let mut lines: Vec<String> = log
        .lines()
        .rev()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .take(WARNINGS_KEPT)
        .map(str::to_owned)
        .collect();
    lines.reverse();
    lines
}

/// Counters shared by the session threads.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failures: AtomicU64,
    kills: AtomicU64,
    examples: std::sync::Mutex<Vec<String>>,
}

impl Tally {
    fn fail(&self, why: String) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let mut e = self.examples.lock().unwrap_or_else(|p| p.into_inner());
        if e.len() < 5 {
            e.push(why);
        }
    }
}

/// One session thread: `calls` calls, killed once at `kill_at` if given.
fn run_session(route: &Route, calls: usize, kill_at: Option<usize>, seed: u64, tally: &Tally) {
    let mut rng = Rng::new(seed);
    let mut session = match Session::open(route) {
        Ok(s) => s,
        Err(e) => return tally.fail(e),
    };
    for i in 0..calls {
        if kill_at == Some(i) {
            // Gone without a word: memory held, work posted, nothing freed.
            let _ = session.launch();
            drop(session);
            tally.kills.fetch_add(1, Ordering::Relaxed);
            session = match Session::open(route) {
                Ok(s) => s,
                Err(e) => return tally.fail(format!("reconnecting after a kill: {e}")),
            };
        }
        match session.step(&mut rng) {
            Ok(()) => {
                tally.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tally.fail(e);
                return;
            }
        }
    }
    match session.check() {
        Ok(()) => {
            tally.ok.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => tally.fail(e),
    }
}

/// Runs one wave of `sessions` concurrent sessions; returns the peak RSS seen.
fn wave(
    daemon: &Daemon,
    routes: &[Route; 2],
    p: &Params,
    calls: usize,
    kills: bool,
    tally: &Arc<Tally>,
) -> u64 {
    let mut rng = Rng::new(p.seed ^ calls as u64);
    let threads: Vec<_> = (0..p.sessions)
        .map(|i| {
            let route = routes[i % 2].clone();
            let kill_at = (kills && rng.below(100) < u64::from(p.kill_percent))
                .then(|| rng.below(calls as u64) as usize);
            let seed = rng.next();
            let tally = Arc::clone(tally);
            std::thread::spawn(move || run_session(&route, calls, kill_at, seed, &tally))
        })
        .collect();
    let mut peak = 0;
    while threads.iter().any(|t| !t.is_finished()) {
        peak = peak.max(daemon.rss_kib());
        std::thread::sleep(Duration::from_millis(100));
    }
    for t in threads {
        if t.join().is_err() {
            tally.fail("a session thread panicked".into());
        }
    }
    peak
}

/// Runs the soak and returns what it measured.
pub fn measure(p: &Params) -> Result<Report, String> {
    if p.sessions == 0 || p.calls == 0 || p.waves == 0 || p.kill_percent > 100 {
        return Err(
            "--sessions, --calls and --waves must be at least 1, --kill-percent at most 100".into(),
        );
    }
    let daemon = Daemon::start(&p.vgpud)?;
    let guest = TestGuest::start(&daemon.path("vhost.sock"), GuestOptions::default())
        .map_err(|e| format!("attaching the vhost-user frontend: {e}"))?;
    let routes = [
        Route::Unix(daemon.path("unix.sock")),
        Route::Vsock(Arc::new(guest)),
    ];
    // Warm-up: the same sessions, shorter, killed as the soak's are; its end is the baseline.
    let warm = Arc::new(Tally::default());
    let warm_params = Params {
        seed: p.seed ^ WARMUP_SEED,
        ..p.clone()
    };
    wave(
        &daemon,
        &routes,
        &warm_params,
        WARMUP_CALLS.min(p.calls),
        true,
        &warm,
    );
    if warm.failures.load(Ordering::Relaxed) > 0 {
        return Err(format!(
            "the warm-up failed: {:?}\n{}",
            warm.examples.lock().unwrap_or_else(|e| e.into_inner()),
            daemon.log()
        ));
    }
    daemon.settled_usage()?;
    let (rss_baseline_kib, _) = daemon.settled_rss_kib();
    let heap_baseline_kib = daemon.heap_kib()?;

    let tally = Arc::new(Tally::default());
    let mut seconds = 0.0;
    let mut rss_peak_kib = 0;
    let mut memory_used_after = Vec::new();
    let mut rss_after_first_kib = 0;
    let mut rss_after_waves_kib = Vec::with_capacity(p.waves);
    let mut heap_after_waves_kib = Vec::with_capacity(p.waves);
    for w in 0..p.waves {
        // Each wave its own calls and kill points.
        let pw = Params {
            seed: p.seed.wrapping_add(w as u64),
            ..p.clone()
        };
        let start = Instant::now();
        rss_peak_kib = rss_peak_kib.max(wave(&daemon, &routes, &pw, p.calls, true, &tally));
        seconds += start.elapsed().as_secs_f64();
        memory_used_after = daemon.settled_usage()?;
        let (settled, first) = daemon.settled_rss_kib();
        rss_after_waves_kib.push(settled);
        rss_after_first_kib = first;
        heap_after_waves_kib.push(daemon.heap_kib()?);
        if memory_used_after.iter().any(|(_, u)| *u != 0) {
            break;
        }
    }
    if let Route::Vsock(guest) = &routes[1] {
        let violations = guest.violations();
        if !violations.is_empty() {
            tally.fail(format!(
                "the vsock device broke the protocol: {violations:?}"
            ));
        }
    }
    let lost_wakeups = daemon.lost_wakeups()?;
    let vgpud_warnings = if tally.failures.load(Ordering::Relaxed) > 0 || lost_wakeups > 0 {
        last_warnings(&daemon.log())
    } else {
        Vec::new()
    };
    let failure_examples = tally
        .examples
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    Ok(Report {
        sessions: p.sessions,
        calls_ok: tally.ok.load(Ordering::Relaxed),
        failures: tally.failures.load(Ordering::Relaxed),
        failure_examples,
        vgpud_warnings,
        lost_wakeups,
        kills: tally.kills.load(Ordering::Relaxed),
        seconds,
        memory_used_after,
        rss_baseline_kib,
        rss_peak_kib,
        rss_after_waves_kib,
        rss_after_first_kib,
        heap_baseline_kib,
        heap_after_waves_kib,
    })
}

/// Runs the soak and prints its table (or JSON).
pub fn run(p: &Params, json: bool) -> Result<(), String> {
    let r = measure(p)?;
    if json {
        let used: Vec<String> = r
            .memory_used_after
            .iter()
            .map(|(vm, u)| format!("\"{vm}\":{u}"))
            .collect();
        println!(
            "{{\"sessions\":{},\"calls_ok\":{},\"failures\":{},\"kills\":{},\"seconds\":{:.3},\
             \"memory_used_after\":{{{}}},\"rss_baseline_kib\":{},\"rss_peak_kib\":{},\
             \"rss_after_kib\":{},\"rss_after_waves_kib\":{:?},\"rss_after_first_kib\":{},\
             \"rss_ratio\":{:.4},\"heap_baseline_kib\":{},\"heap_after_waves_kib\":{:?},\
             \"heap_ratio\":{:.4},\"lost_wakeups\":{}}}",
            r.sessions,
            r.calls_ok,
            r.failures,
            r.kills,
            r.seconds,
            used.join(","),
            r.rss_baseline_kib,
            r.rss_peak_kib,
            r.rss_after_kib(),
            r.rss_after_waves_kib,
            r.rss_after_first_kib,
            r.rss_ratio(),
            r.heap_baseline_kib,
            r.heap_after_waves_kib,
            r.heap_ratio(),
            r.lost_wakeups
        );
    } else {
        println!(
            "soak: {} sessions (half unix socket, half vsock device)",
            r.sessions
        );
        println!("  calls completed and checked  {}", r.calls_ok);
        println!("  calls failed or wrong        {}", r.failures);
        println!("  clients killed mid-stream    {}", r.kills);
        println!("  vsock lost wake-ups made up  {}", r.lost_wakeups);
        if r.lost_wakeups > 0 {
            for w in &r.vgpud_warnings {
                println!("    {w}");
            }
        }
        println!(
            "  wall time                    {:.1} s ({:.0} calls/s)",
            r.seconds,
            r.calls_ok as f64 / r.seconds.max(f64::EPSILON)
        );
        for (vm, used) in &r.memory_used_after {
            println!("  {vm:<28} {used} bytes charged after the sessions ended");
        }
        println!(
            "  vgpud RSS                    baseline {} KiB, peak {} KiB, after {} KiB ({:.3}× baseline, limit {RSS_GROWTH_LIMIT}×; {} KiB at the first reading)",
            r.rss_baseline_kib,
            r.rss_peak_kib,
            r.rss_after_kib(),
            r.rss_ratio(),
            r.rss_after_first_kib
        );
        println!(
            "  vgpud heap in use            baseline {} KiB, after each wave {:?} KiB ({:.3}× baseline, limit {HEAP_GROWTH_LIMIT}×)",
            r.heap_baseline_kib,
            r.heap_after_waves_kib,
            r.heap_ratio()
        );
        if r.rss_after_waves_kib.len() > 1 {
            println!(
                "  vgpud RSS after each wave    {:?} KiB",
                r.rss_after_waves_kib
            );
        }
    }
    r.verdict()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_soak_keeps_vgpud_s_last_warnings_and_errors_only() {
        let mut log = String::new();
        for i in 0..30 {
            log.push_str(&format!(
                "2026-12-04T10:00:00Z  INFO vgpud: session {i} opened\n"
            ));
            log.push_str(&format!("2026-12-04T10:00:00Z  WARN vgpud: warning {i}\n"));
        }
        log.push_str("2026-12-04T10:00:01Z ERROR vgpu_vhost_vsock: tx ring is unusable\n");
        let kept = last_warnings(&log);
        assert_eq!(kept.len(), WARNINGS_KEPT);
        assert!(kept.iter().all(|l| !l.contains("INFO")), "{kept:?}");
        assert!(kept[0].ends_with("warning 11"), "{kept:?}");
        assert!(kept[WARNINGS_KEPT - 1].ends_with("tx ring is unusable"));
    }
}
