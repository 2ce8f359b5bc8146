//! Copy bandwidth through the virtio-vgpu device, measured host-side: an in-process vhost-user
//! frontend playing QEMU and the guest's `vgpu` module ([`DevGuest`]: real virtqueues in shared
//! memfd guest memory, each copy request a descriptor chain of the application buffer's 4 KiB
//! pages in scattered guest-physical order, as pinned user pages are) drives the virtio-vgpu
//! device of an in-process vgpud [`Daemon`]; vgpud copies straight between those pages and the
//! simulated GPU's memory.
//!
//! Baselines in the same run: a plain `memcpy` of the same size between two host buffers (the
//! design's yardstick); the floor, plain `memcpy`s between the same guest pages and a host buffer
//! in transparent huge pages, as the simulated GPU's memory is (what moving those pages costs
//! whoever does it: scattered pages defeat the CPU's prefetchers, which no device can avoid); and
//! the same copies through the vhost-user vsock device (the guest shim's protocol client over a
//! guest vsock stream, [`TestGuest`]). Host-to-device and device-to-host, 1, 16 and 256 MiB;
//! medians of several runs, printed as bandwidth and as ratios.
//!
//! Guest RAM is backed by 2 MiB huge pages when the host has enough free ones (as GPU VMs are
//! best run: QEMU `memory-backend-memfd,hugetlb=on`), else by 4 KiB pages; the report says which.

use std::path::Path;
use std::time::{Duration, Instant};

use cuda::client::Client;
use std::collections::VecDeque;
use vgpu_config::Config;
use vgpu_hugemem::HugeMapping;
use vgpu_proto::frame::MAX_BULK_CHUNK;
use vgpu_proto::msg;
use vgpu_ptx::mem::{COPY_PIECE, copy_in_pieces};
use vgpud::Daemon;

use vgpu_vhost_vgpu::wire::S_OK;
use vgpu_vmm_testutils::vgpu::{
    DEFAULT_TIMEOUT, DevGuest, DevGuestOptions, DevSession, GuestBuf, Pending,
};
use vgpu_vmm_testutils::vsock::{GuestOptions, GuestRam, HUGE_PAGE, TestGuest, free_huge_pages};

use crate::stats::median;

/// Parameters.
#[derive(Debug, Clone)]
pub struct Params {
    /// Repetitions (medians are reported).
    pub runs: usize,
    /// Transfer sizes in MiB.
    pub sizes_mib: Vec<usize>,
    /// What backs the fake guests' RAM.
    pub ram: RamChoice,
    /// How the fake guests wait for completions.
    pub wait: GuestWait,
}

/// How the benchmark's guests wait for a request to complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GuestWait {
    /// Sleep until the device's interrupt (the call eventfd), as a guest whose vCPU halts.
    Block,
    /// Spin on the used rings: what the device costs without this machine's thread wake-ups on
    /// the guest side (a real guest gets close with KVM's halt polling).
    Poll,
    /// Spin on the used rings for up to [`MODULE_POLL`], then sleep until the interrupt: what
    /// the guest module does for a synchronous call at its default `poll_us`, and what a vsock
    /// guest does while the shim's read polls for a copy's reply.
    Module,
}

/// How long the guest module polls for a synchronous call's answer by default
/// (`VGPU_POLL_US_DEFAULT` in `guest-shim/kmod/vgpu.c`).
pub const MODULE_POLL: Duration = Duration::from_micros(1000);

impl GuestWait {
    /// How long a virtio-vgpu guest polls in each wait before it sleeps.
    fn poll_first(self) -> Duration {
        match self {
            GuestWait::Module => MODULE_POLL,
            GuestWait::Block | GuestWait::Poll => Duration::ZERO,
        }
    }

    /// How long a vsock guest polls in each wait before it sleeps: in `Module` mode as long as
    /// the shim's reads poll for a copy's reply ([`vgpu_proto::spin::MAX_EXPECTED_SPIN`]), its
    /// vCPU running meanwhile, so that the device's interrupt wakes no halted vCPU.
    fn vsock_poll_first(self) -> Duration {
        match self {
            GuestWait::Module => vgpu_proto::spin::MAX_EXPECTED_SPIN,
            GuestWait::Block | GuestWait::Poll => Duration::ZERO,
        }
    }
}

/// What backs guest RAM in the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RamChoice {
    /// 2 MiB huge pages when the host has enough free (`vm.nr_hugepages`), else 4 KiB pages.
    Auto,
    /// 2 MiB huge pages (fails when the host has too few free).
    Huge,
    /// 4 KiB pages.
    Small,
}

const MIB: usize = 1 << 20;
const DEV_VM: &str = "dev";
const VSOCK_VM: &str = "vsock";
const GUEST_CID: u64 = 3;
const DEVICE_MEMORY: &str = "4GiB";
const SLICE: &str = "1GiB";
/// Largest transfer measured: one allocation of that size per path must fit the VMs' slices
/// ([`SLICE`]) and the three of them the simulated GPU ([`DEVICE_MEMORY`]).
pub const MAX_SIZE_MIB: usize = 1024;
/// Host memory the benchmark touches, in multiples of the largest transfer: per device path
/// (one per layout) its guest's source and destination buffers, the floor's host buffer and its
/// device memory; the vsock path's two buffers and device memory; the two plain and the two
/// huge-page memcpy buffers; the buffer that fills a guest's at the start. Measured at 1 GiB:
/// the host's available memory fell by 15.9 GiB.
const TOUCHED_PER_MAX: u64 = LAYOUTS.len() as u64 * 4 + 3 + 4 + 1;
/// What the benchmark touches besides: the daemon, rings, the guests' other pages.
const TOUCHED_BESIDES: u64 = 512 * MIB as u64;
/// Most bulk bytes per request through the device: what the guest module reports as
/// `max_transfer` with 1024-entry rings (1024 descriptors less 20 reserved and one for
/// misalignment, in 4 KiB pages, rounded down to 64 KiB).
const DEV_CHUNK: usize = 4_063_232;
/// Each measurement moves at least this much, repeating small copies, so that timer and scheduling
/// noise stay small against it.
const MIN_BYTES_PER_MEASUREMENT: usize = 512 * MIB;
/// Requests of one copy in flight at once.
const WINDOW: usize = 8;
const BYTES_PER_GB: f64 = 1e9;
const GIB: f64 = (1u64 << 30) as f64;

/// How the guest's buffers lie in guest-physical memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Bytes of each physically contiguous run; runs are in shuffled order.
    pub run: usize,
    /// For the report.
    pub name: &'static str,
}

/// The layouts measured: transparent huge pages (the default of Debian's guest kernels, `always`),
/// and scattered 4 KiB pages, the worst case.
pub const LAYOUTS: [Layout; 2] = [
    Layout {
        run: 2 * MIB,
        name: "guest buffers in 2 MiB pages (transparent huge pages, the Debian guest default)",
    },
    Layout {
        run: 4096,
        name: "guest buffers in scattered 4 KiB pages (worst case: every page a descriptor)",
    },
];

/// One path's bandwidth and its ratio to memcpy.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Measured {
    /// Bytes per second.
    pub rate: f64,
    /// `rate` / the bandwidth of a plain memcpy of the same size measured right before it. Each
    /// measurement is paired with its own memcpy so that the machine's slow drifts (neighbours'
    /// load, how much of the L3 cache is ours) weigh on both sides of the ratio alike.
    pub ratio: f64,
    /// `rate` / the bandwidth of a memcpy of the same size between two huge-page buffers (in the
    /// simulated GPU's pieces), measured right before it too: the stricter yardstick, since the simulated GPU keeps large
    /// allocations in huge pages and guest RAM is in huge pages.
    pub ratio_huge: f64,
}

/// Bandwidth per path (medians over the runs; ratios are medians of the per-run ratios).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Row {
    /// Transfer size.
    pub bytes: usize,
    /// Plain memcpy of the same size between two host buffers, bytes per second.
    pub memcpy: f64,
    /// Memcpy of the same size between two huge-page host buffers, in the simulated GPU's pieces,
    /// bytes per second.
    pub memcpy_huge: f64,
    /// Plain memcpys from the same guest pages into a host buffer.
    pub floor_htod: Measured,
    /// Plain memcpys from a host buffer into the same guest pages.
    pub floor_dtoh: Measured,
    /// Host to device through the virtio-vgpu device.
    pub dev_htod: Measured,
    /// Device to host through the virtio-vgpu device.
    pub dev_dtoh: Measured,
    /// Host to device through the vsock device.
    pub vsock_htod: Measured,
    /// Device to host through the vsock device.
    pub vsock_dtoh: Measured,
}

fn err<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// The device path: a session on the virtio-vgpu device.
struct DevPath {
    guest: DevGuest,
    chunk: usize,
    session: DevSession,
    ctx: u64,
    ptr: u64,
    src: GuestBuf,
    dst: GuestBuf,
    /// Host memory for the floor's copies: in transparent huge pages, as the simulated GPU keeps
    /// the device memory the path copies to and from (a `Vec` in 4 KiB pages measured at a third
    /// of that speed in some processes on a 2-vCPU cloud VM, as if the floor were slower than the
    /// device; `docs/performance.md`, "The floor's host buffer").
    host: HugeMapping,
}

/// Host memory the benchmark touches when its largest transfer is `max` bytes.
pub fn memory_needed(max: usize) -> u64 {
    TOUCHED_PER_MAX * max as u64 + TOUCHED_BESIDES
}

/// `MemAvailable` of `/proc/meminfo` in bytes, `None` when unknown.
pub fn memory_available() -> Option<u64> {
    cuda::pinned::mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// Whether the host has the memory to measure transfers of up to `max_mib` MiB; the reason
/// when it has not.
pub fn fits(max_mib: usize) -> Result<(), String> {
    let needed = memory_needed(max_mib.saturating_mul(MIB));
    match memory_available() {
        Some(available) if available < needed => Err(format!(
            "transfers of {max_mib} MiB need about {:.1} GiB of host memory, {:.1} GiB is \
             available",
            needed as f64 / GIB,
            available as f64 / GIB
        )),
        _ => Ok(()),
    }
}

/// Guest RAM of one device path's guest.
fn dev_guest_memory(max: usize) -> u64 {
    ((3 * max + 64 * MIB) as u64).div_ceil(HUGE_PAGE) * HUGE_PAGE
}

impl DevPath {
    fn open(
        socket: &Path,
        max: usize,
        layout: Layout,
        ram: GuestRam,
        wait: GuestWait,
    ) -> Result<DevPath, String> {
        let guest = DevGuest::start(
            socket,
            DevGuestOptions {
                queue_size: 1024,
                memory: dev_guest_memory(max),
                ram,
                busy_poll: wait == GuestWait::Poll,
                poll_first: wait.poll_first(),
                ..DevGuestOptions::default()
            },
        )
        .map_err(err(
            "attaching the in-process frontend to the virtio-vgpu device",
        ))?;
        let mut session = DevSession::open(&guest, 1).map_err(err("opening a session"))?;
        session.hello("vgpu-bench").map_err(err("handshake"))?;
        let ctx = session.ctx_create().map_err(err("CtxCreate"))?;
        let ptr = session
            .call(
                &msg::MemAlloc {
                    ctx,
                    size: max as u64,
                },
                &[],
            )
            .map_err(err("MemAlloc"))?
            .ptr;
        let src = guest
            .alloc_runs(max, layout.run)
            .map_err(err("guest buffer"))?;
        let dst = guest
            .alloc_runs(max, layout.run)
            .map_err(err("guest buffer"))?;
        let fill = vec![0x5au8; max];
        guest
            .write_buf(&src, 0, &fill)
            .map_err(err("guest buffer"))?;
        guest
            .write_buf(&dst, 0, &fill)
            .map_err(err("guest buffer"))?;
        Ok(DevPath {
            guest,
            chunk: DEV_CHUNK,
            session,
            ctx,
            ptr,
            src,
            dst,
            host: {
                let mut host = HugeMapping::new(max).map_err(err("huge-page buffer"))?;
                host.fill(0xa5);
                host
            },
        })
    }

    /// The floor of a host-to-device copy: the source pages read by memcpys, each page run in
    /// the pieces the simulated GPU copies in ([`copy_in_pieces`]).
    fn floor_htod(&mut self, bytes: usize) -> Result<f64, String> {
        let host = &mut self.host[..bytes];
        let r = self.guest.with_buf_slices(&self.src, 0, bytes, |pages| {
            rate(bytes, || {
                let mut at = 0;
                for p in pages {
                    copy_in_pieces(&mut host[at..at + p.len()], std::hint::black_box(p));
                    at += p.len();
                }
                Ok(())
            })
        });
        r.map_err(err("guest buffer"))?
    }

    /// The floor of a device-to-host copy: the destination pages written by memcpys, in pieces
    /// as [`DevPath::floor_htod`] reads them.
    fn floor_dtoh(&mut self, bytes: usize) -> Result<f64, String> {
        let host = &self.host[..bytes];
        // SAFETY: every request of this path has completed, so nothing else uses `dst`.
        let r = unsafe {
            self.guest
                .with_buf_slices_mut(&self.dst, 0, bytes, |pages| {
                    rate(bytes, || {
                        let mut at = 0;
                        for p in pages.iter_mut() {
                            let n = p.len();
                            copy_in_pieces(p, std::hint::black_box(&host[at..at + n]));
                            at += n;
                        }
                        Ok(())
                    })
                })
        };
        r.map_err(err("guest buffer"))?
    }

    /// Host to device, as the shim does it: every chunk but the last posted without waiting
    /// (at most [`WINDOW`] in flight), the last a call, which returns once all of them ran.
    fn htod(&mut self, bytes: usize) -> Result<(), String> {
        let mut inflight = VecDeque::new();
        let mut off = 0;
        while off < bytes {
            let n = self.chunk.min(bytes - off);
            let req = msg::MemcpyHtoD {
                ctx: self.ctx,
                stream: 0,
                dst: self.ptr + off as u64,
            };
            let segs = self.src.segments(off, n);
            if off + n < bytes {
                if inflight.len() == WINDOW {
                    self.reap(inflight.pop_front())?;
                }
                inflight.push_back(
                    self.session
                        .submit_post(&req, &segs)
                        .map_err(err("MemcpyHtoD (posted)"))?,
                );
            } else {
                self.session
                    .call_sg(&req, &segs, &[])
                    .map_err(err("MemcpyHtoD"))?;
            }
            off += n;
        }
        while let Some(p) = inflight.pop_front() {
            self.reap(Some(p))?;
        }
        Ok(())
    }

    fn reap(&self, p: Option<Pending>) -> Result<(), String> {
        if let Some(p) = p {
            let c = self
                .guest
                .wait(p, DEFAULT_TIMEOUT)
                .map_err(err("posted copy"))?;
            if c.resp.status != S_OK {
                return Err(format!("posted copy refused: status {}", c.resp.status));
            }
        }
        Ok(())
    }

    /// Device to host: every chunk a call, at most [`WINDOW`] submitted before the first is
    /// waited for (the module's submit-then-wait ioctls).
    fn dtoh(&mut self, bytes: usize) -> Result<(), String> {
        let chunk = self.chunk;
        let mut inflight: VecDeque<(Pending, usize)> = VecDeque::new();
        let mut off = 0;
        while off < bytes || !inflight.is_empty() {
            if off < bytes && inflight.len() < WINDOW {
                let n = chunk.min(bytes - off);
                let req = msg::MemcpyDtoH {
                    ctx: self.ctx,
                    stream: 0,
                    src: self.ptr + off as u64,
                    len: n as u64,
                };
                let p = self
                    .session
                    .submit_call(&req, &[], &self.dst.segments(off, n))
                    .map_err(err("MemcpyDtoH"))?;
                inflight.push_back((p, n));
                off += n;
                continue;
            }
            if let Some((p, n)) = inflight.pop_front() {
                let c = self
                    .guest
                    .wait(p, DEFAULT_TIMEOUT)
                    .map_err(err("MemcpyDtoH"))?;
                let (_, resp) =
                    DevSession::reply_of::<msg::MemcpyDtoH>(&c).map_err(err("MemcpyDtoH"))?;
                if resp.data_len != n as u64 {
                    return Err(format!("MemcpyDtoH wrote {} of {n} bytes", resp.data_len));
                }
            }
        }
        Ok(())
    }

    /// Checks that a device-to-host copy brings back what the host-to-device copy sent.
    fn verify(&mut self, bytes: usize) -> Result<(), String> {
        let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
        self.guest
            .write_buf(&self.src, 0, &data)
            .map_err(err("guest buffer"))?;
        self.htod(bytes)?;
        self.dtoh(bytes)?;
        let mut back = vec![0u8; bytes];
        self.guest
            .read_buf(&self.dst, 0, &mut back)
            .map_err(err("guest buffer"))?;
        if back != data {
            return Err("the virtio-vgpu device returned different bytes".into());
        }
        Ok(())
    }
}

/// The vsock path: the shim's protocol client over a guest vsock stream.
struct VsockPath {
    _guest: TestGuest,
    client: Client,
    ctx: u64,
    ptr: u64,
    src: Vec<u8>,
    dst: Vec<u8>,
}

impl VsockPath {
    fn open(socket: &Path, max: usize, wait: GuestWait) -> Result<VsockPath, String> {
        let guest = TestGuest::start(
            socket,
            GuestOptions {
                busy_poll: wait == GuestWait::Poll,
                poll_first: wait.vsock_poll_first(),
                // What a guest kernel advertises for the shim's connection (the shim asks it for
                // this receive buffer), not Linux's 256 KiB default.
                buf_alloc: u32::try_from(cuda::transport::VSOCK_RECEIVE_BUFFER)
                    .map_err(err("the shim's vsock receive buffer"))?,
                ..GuestOptions::default()
            },
        )
        .map_err(err("attaching the in-process frontend to the vsock device"))?;
        let stream = guest
            .connect(vgpu_proto::GPU_VSOCK_PORT)
            .map_err(err("connecting to the GPU port"))?;
        let mut client = Client::new(Box::new(stream));
        client
            .hello("vgpu-bench")
            .map_err(|e| format!("handshake: {}", e.message))?;
        let ctx = client
            .call(
                &msg::CtxCreate {
                    device: 0,
                    flags: 0,
                },
                &[],
            )
            .map_err(|e| format!("CtxCreate: {}", e.message))?
            .0
            .handle;
        let ptr = client
            .call(
                &msg::MemAlloc {
                    ctx,
                    size: max as u64,
                },
                &[],
            )
            .map_err(|e| format!("MemAlloc: {}", e.message))?
            .0
            .ptr;
        Ok(VsockPath {
            _guest: guest,
            client,
            ctx,
            ptr,
            src: vec![0x5a; max],
            dst: vec![0x5a; max],
        })
    }

    /// As the shim's `cuMemcpyHtoD` does it over a stream.
    fn htod(&mut self, bytes: usize) -> Result<(), String> {
        let chunks: Vec<&[u8]> = self.src[..bytes].chunks(MAX_BULK_CHUNK).collect();
        let last = chunks.len() - 1;
        for (i, c) in chunks.into_iter().enumerate() {
            let req = msg::MemcpyHtoD {
                ctx: self.ctx,
                stream: 0,
                dst: self.ptr + (i * MAX_BULK_CHUNK) as u64,
            };
            if i == last {
                self.client
                    .call(&req, c)
                    .map_err(|e| format!("MemcpyHtoD: {}", e.message))?;
            } else {
                self.client
                    .post(&req, c)
                    .map_err(|e| format!("MemcpyHtoD: {}", e.message))?;
            }
        }
        Ok(())
    }

    /// As the shim's `cuMemcpyDtoH` does it over a stream: chunks pipelined
    /// ([`Client::call_into_chunks`]).
    fn dtoh(&mut self, bytes: usize) -> Result<(), String> {
        let outs: Vec<&mut [u8]> = self.dst[..bytes].chunks_mut(MAX_BULK_CHUNK).collect();
        let reqs: Vec<msg::MemcpyDtoH> = outs
            .iter()
            .enumerate()
            .map(|(i, c)| msg::MemcpyDtoH {
                ctx: self.ctx,
                stream: 0,
                src: self.ptr + (i * MAX_BULK_CHUNK) as u64,
                len: c.len() as u64,
            })
            .collect();
        self.client
            .call_into_chunks(&reqs, outs)
            .map_err(|e| format!("MemcpyDtoH: {}", e.message))
    }
}

/// Seconds per byte of `f` moving `bytes`, repeated to at least [`MIN_BYTES_PER_MEASUREMENT`].
fn rate(bytes: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    let reps = MIN_BYTES_PER_MEASUREMENT.div_ceil(bytes).max(1);
    let t = Instant::now();
    for _ in 0..reps {
        f()?;
    }
    Ok((bytes * reps) as f64 / t.elapsed().as_secs_f64())
}

/// Bytes per second of `copy` (a plain `<[u8]>::copy_from_slice`, or [`copy_in_pieces`] as the
/// simulated GPU copies) from `src` into `dst` (same length).
fn memcpy_rate(dst: &mut [u8], src: &[u8], copy: fn(&mut [u8], &[u8])) -> Result<f64, String> {
    rate(dst.len(), || {
        copy(dst, std::hint::black_box(src));
        std::hint::black_box(&mut *dst);
        Ok(())
    })
}

/// One virtio-vgpu VM per layout (`dev0`, `dev1`, …) and one vsock VM.
fn config(dir: &Path) -> Result<Config, String> {
    let mut text = format!(
        "[[device]]\nname = \"gpu0\"\nkind = \"sim\"\nmemory = \"{DEVICE_MEMORY}\"\n\n\
         [[vm]]\nname = \"{VSOCK_VM}\"\nmemory = \"{SLICE}\"\n\
         vhost_user_socket = \"{}\"\nguest_cid = {GUEST_CID}\n",
        dir.join("vsock.sock").display(),
    );
    for i in 0..LAYOUTS.len() {
        text += &format!(
            "\n[[vm]]\nname = \"{DEV_VM}{i}\"\nmemory = \"{SLICE}\"\n\
             vhost_user_socket = \"{}\"\ndevice_model = \"vgpu\"\n",
            dir.join(format!("dev{i}.sock")).display()
        );
    }
    Config::parse(&dir.join("bench.toml"), &text).map_err(|e| format!("benchmark config: {e}"))
}

/// What backs guest RAM for `choice`, given the largest transfer.
fn guest_ram(choice: RamChoice, max: usize) -> Result<GuestRam, String> {
    let needed = LAYOUTS.len() as u64 * dev_guest_memory(max) / HUGE_PAGE;
    let free = free_huge_pages();
    match choice {
        RamChoice::Small => Ok(GuestRam::SmallPages),
        RamChoice::Auto if free < needed => Ok(GuestRam::SmallPages),
        RamChoice::Huge if free < needed => Err(format!(
            "the guests need {needed} free 2 MiB huge pages but the host has {free} \
             (sysctl vm.nr_hugepages)"
        )),
        RamChoice::Auto | RamChoice::Huge => Ok(GuestRam::HugePages),
    }
}

/// The benchmark's results.
#[derive(Debug, Clone)]
pub struct Results {
    /// What backed guest RAM.
    pub ram: GuestRam,
    /// How the guests waited.
    pub wait: GuestWait,
    /// One table per layout.
    pub tables: Vec<(Layout, Vec<Row>)>,
}

/// Measures every size, layout and path `runs` times (interleaved), each path right after a plain
/// memcpy of the same size, and returns the medians, one table per layout (the vsock path does
/// not depend on the layout: it is measured once per run and size and shown in both).
pub fn measure(p: &Params) -> Result<Results, String> {
    if p.runs == 0 || p.sizes_mib.is_empty() || p.sizes_mib.contains(&0) {
        return Err("--runs and every size must be at least 1".into());
    }
    let max_mib = p.sizes_mib.iter().max().copied().unwrap_or(1);
    if max_mib > MAX_SIZE_MIB {
        return Err(format!(
            "--sizes: at most {MAX_SIZE_MIB} MiB (each VM's slice is {SLICE})"
        ));
    }
    fits(max_mib)?;
    let max = max_mib * MIB;
    let ram = guest_ram(p.ram, max)?;
    let dir = tempfile::tempdir().map_err(err("temporary directory"))?;
    let daemon = Daemon::start(&config(dir.path())?).map_err(err("starting vgpud in-process"))?;
    let mut devs = Vec::new();
    for (i, layout) in LAYOUTS.iter().enumerate() {
        let mut dev = DevPath::open(
            &dir.path().join(format!("dev{i}.sock")),
            max,
            *layout,
            ram,
            p.wait,
        )?;
        dev.verify(max.min(16 * MIB))?;
        // Warm-up: device memory and every buffer touched once.
        dev.htod(max)?;
        dev.dtoh(max)?;
        devs.push(dev);
    }
    let mut vsock = VsockPath::open(&dir.path().join("vsock.sock"), max, p.wait)?;
    vsock.htod(max)?;
    vsock.dtoh(max)?;
    let src = vec![0x5au8; max];
    let mut dst = vec![0xa5u8; max];
    dst.copy_from_slice(&src);
    let mut huge_src = HugeMapping::new(max).map_err(err("huge-page buffer"))?;
    let mut huge_dst = HugeMapping::new(max).map_err(err("huge-page buffer"))?;
    // Touched before anything is timed, so that their huge pages exist.
    huge_src.fill(0x5a);
    huge_dst.fill(0xa5);

    // samples[layout][size]
    let mut samples: Vec<Vec<Vec<Row>>> = vec![vec![Vec::new(); p.sizes_mib.len()]; LAYOUTS.len()];
    for _ in 0..p.runs {
        for (i, &mib) in p.sizes_mib.iter().enumerate() {
            let bytes = mib * MIB;
            let (mut memcpys, mut huge_memcpys) = (Vec::new(), Vec::new());
            // Measures `path` right after a plain memcpy and a huge-page memcpy (in pieces) of
            // the same size.
            let mut paired = |path: &mut dyn FnMut() -> Result<f64, String>| {
                let m = memcpy_rate(&mut dst[..bytes], &src[..bytes], <[u8]>::copy_from_slice)?;
                memcpys.push(m);
                let h = memcpy_rate(&mut huge_dst[..bytes], &huge_src[..bytes], copy_in_pieces)?;
                huge_memcpys.push(h);
                let r = path()?;
                Ok::<_, String>(Measured {
                    rate: r,
                    ratio: r / m,
                    ratio_huge: r / h,
                })
            };
            let vsock_htod = paired(&mut || rate(bytes, || vsock.htod(bytes)))?;
            let vsock_dtoh = paired(&mut || rate(bytes, || vsock.dtoh(bytes)))?;
            for (l, dev) in devs.iter_mut().enumerate() {
                let floor_htod = paired(&mut || dev.floor_htod(bytes))?;
                let floor_dtoh = paired(&mut || dev.floor_dtoh(bytes))?;
                let dev_htod = paired(&mut || rate(bytes, || dev.htod(bytes)))?;
                let dev_dtoh = paired(&mut || rate(bytes, || dev.dtoh(bytes)))?;
                samples[l][i].push(Row {
                    bytes,
                    memcpy: 0.0,
                    memcpy_huge: 0.0,
                    floor_htod,
                    floor_dtoh,
                    dev_htod,
                    dev_dtoh,
                    vsock_htod,
                    vsock_dtoh,
                });
            }
            let (memcpy, memcpy_huge) = (median(&memcpys), median(&huge_memcpys));
            for layout in &mut samples {
                if let Some(row) = layout[i].last_mut() {
                    row.memcpy = memcpy;
                    row.memcpy_huge = memcpy_huge;
                }
            }
        }
    }
    drop(vsock);
    drop(devs);
    daemon.shutdown();
    let medians = |s: &[Row]| {
        let med = |f: fn(&Row) -> Measured| {
            let rate: Vec<f64> = s.iter().map(|r| f(r).rate).collect();
            let ratio: Vec<f64> = s.iter().map(|r| f(r).ratio).collect();
            let ratio_huge: Vec<f64> = s.iter().map(|r| f(r).ratio_huge).collect();
            Measured {
                rate: median(&rate),
                ratio: median(&ratio),
                ratio_huge: median(&ratio_huge),
            }
        };
        Row {
            bytes: s[0].bytes,
            memcpy: median(&s.iter().map(|r| r.memcpy).collect::<Vec<_>>()),
            memcpy_huge: median(&s.iter().map(|r| r.memcpy_huge).collect::<Vec<_>>()),
            floor_htod: med(|r| r.floor_htod),
            floor_dtoh: med(|r| r.floor_dtoh),
            dev_htod: med(|r| r.dev_htod),
            dev_dtoh: med(|r| r.dev_dtoh),
            vsock_htod: med(|r| r.vsock_htod),
            vsock_dtoh: med(|r| r.vsock_dtoh),
        }
    };
    Ok(Results {
        ram,
        wait: p.wait,
        tables: LAYOUTS
            .iter()
            .zip(&samples)
            .map(|(l, sizes)| (*l, sizes.iter().map(|s| medians(s)).collect()))
            .collect(),
    })
}

/// Formats the report.
pub fn report(r: &Results, runs: usize) -> String {
    let gb = |v: f64| v / BYTES_PER_GB;
    let ram = match r.ram {
        GuestRam::HugePages => "guest RAM in 2 MiB huge pages (memory-backend-memfd,hugetlb=on)",
        GuestRam::SmallPages => {
            "guest RAM in 4 KiB pages (memory-backend-memfd; reserve huge pages with \
             sysctl vm.nr_hugepages for the hugetlb=on figures)"
        }
    };
    let wait = match r.wait {
        GuestWait::Block => "guests sleep until their interrupt (--guest-wait block)",
        GuestWait::Poll => "guests poll their used rings (--guest-wait poll)",
        GuestWait::Module => {
            "guests poll up to 1 ms, then sleep until their interrupt, as the guest module does \
             (virtio-vgpu) and the shim's reads of a copy's reply do (vsock) (--guest-wait module)"
        }
    };
    let mut out = format!(
        "virtio-vgpu copy bandwidth: GB/s, medians of {runs} runs, {ram}, {wait}\n\
         (x %) = path / a plain memcpy of the same size between two host buffers, measured \
         right before it (median of the runs' ratios); \
         floor = memcpys between the same guest pages and host memory in huge pages, in the \
         simulated GPU's {piece} KiB pieces; \
         dev/floor = the device's share of the floor; \
         huge-page memcpy = a memcpy between two buffers in transparent huge pages (where the \
         simulated GPU keeps large allocations), in the same pieces, measured right before each \
         path too, and the device's ratio to it (the stricter yardstick)\n",
        piece = COPY_PIECE >> 10
    );
    for (layout, rows) in &r.tables {
        out += &format!(
            "{}\n{:>8}  {:>7}  {:>16}  {:>16}  {:>16}  {:>16}  {:>11}  {:>16}  {:>16}\n",
            layout.name,
            "size",
            "memcpy",
            "floor HtoD",
            "vgpu-dev HtoD",
            "floor DtoH",
            "vgpu-dev DtoH",
            "dev/floor",
            "vsock HtoD",
            "vsock DtoH"
        );
        for row in rows {
            let cell = |m: Measured| format!("{:5.2} ({:5.1} %)", gb(m.rate), 100.0 * m.ratio);
            out += &format!(
                "{:>5} MiB  {:7.2}  {:>16}  {:>16}  {:>16}  {:>16}  {:>4.0} / {:>3.0} %  {:>16}  {:>16}\n",
                row.bytes / MIB,
                gb(row.memcpy),
                cell(row.floor_htod),
                cell(row.dev_htod),
                cell(row.floor_dtoh),
                cell(row.dev_dtoh),
                100.0 * row.dev_htod.rate / row.floor_htod.rate,
                100.0 * row.dev_dtoh.rate / row.floor_dtoh.rate,
                cell(row.vsock_htod),
                cell(row.vsock_dtoh)
            );
        }
        out += &format!(
            "{:>8}  {:>16}  {:>19}  {:>19}\n",
            "size", "huge-page memcpy", "vgpu-dev HtoD / it", "vgpu-dev DtoH / it"
        );
        for row in rows {
            out += &format!(
                "{:>5} MiB  {:>16.2}  {:>17.1} %  {:>17.1} %\n",
                row.bytes / MIB,
                gb(row.memcpy_huge),
                100.0 * row.dev_htod.ratio_huge,
                100.0 * row.dev_dtoh.ratio_huge
            );
        }
    }
    out
}

/// Runs the benchmark, prints the tables and returns them.
pub fn run(p: Params) -> Result<Results, String> {
    let results = measure(&p)?;
    print!("{}", report(&results, p.runs));
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_shows_ratios_against_memcpy() {
        let m = |rate: f64, ratio: f64| Measured {
            rate,
            ratio,
            ratio_huge: ratio * 0.5,
        };
        let r = Row {
            bytes: 16 * MIB,
            memcpy: 10e9,
            memcpy_huge: 19e9,
            floor_htod: m(9.8e9, 0.98),
            floor_dtoh: m(10e9, 1.0),
            // Paired ratios, not rate / memcpy: the memcpy beside this run was slower.
            dev_htod: m(9.5e9, 0.93),
            dev_dtoh: m(9e9, 0.9),
            vsock_htod: m(2e9, 0.2),
            vsock_dtoh: m(1e9, 0.1),
        };
        let results = Results {
            ram: GuestRam::HugePages,
            wait: GuestWait::Poll,
            tables: vec![(LAYOUTS[0], vec![r])],
        };
        let text = report(&results, 5);
        assert!(text.contains("medians of 5 runs"), "{text}");
        assert!(text.contains("2 MiB huge pages"), "{text}");
        assert!(text.contains("guests poll their used rings"), "{text}");
        assert!(text.contains("  97 /  90 %"), "{text}");
        assert!(text.contains("2 MiB pages"), "{text}");
        assert!(text.contains("16 MiB"), "{text}");
        assert!(text.contains("9.50 ( 93.0 %)"), "{text}");
        assert!(text.contains("1.00 ( 10.0 %)"), "{text}");
        // The huge-page yardstick: its bandwidth and the device's paired ratios to it.
        assert!(
            text.contains("19.00               46.5 %               45.0 %"),
            "{text}"
        );
    }

    /// `--guest-wait module` polls as long as the guest module does by default.
    #[test]
    fn module_guests_poll_as_long_as_the_guest_module() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-shim/kmod/vgpu.c");
        let src = std::fs::read_to_string(src).unwrap();
        let line = src
            .lines()
            .find(|l| l.starts_with("#define VGPU_POLL_US_DEFAULT"))
            .expect("the module's default poll_us");
        let us: u64 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
        assert_eq!(GuestWait::Module.poll_first(), Duration::from_micros(us));
        assert_eq!(MODULE_POLL, Duration::from_micros(us));
        assert!(GuestWait::Block.poll_first().is_zero());
    }

    /// `bench/probes/copy_placement.c`, which docs/vgpu-device.md cites, still builds.
    #[test]
    fn the_copy_placement_probe_builds() {
        let probe = Path::new(env!("CARGO_MANIFEST_DIR")).join("probes/copy_placement.c");
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("cc")
            .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(dir.path().join("copy_placement"))
            .arg(&probe)
            .output();
        match out {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!("skipped: no C compiler (cc) here");
            }
            Err(e) => panic!("running cc: {e}"),
            Ok(o) => assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr)),
        }
    }

    #[test]
    fn bad_parameters_are_refused() {
        let bad = Params {
            runs: 0,
            sizes_mib: vec![1],
            ram: RamChoice::Small,
            wait: GuestWait::Block,
        };
        assert!(measure(&bad).is_err());
        let bad = Params {
            runs: 1,
            sizes_mib: vec![0],
            ram: RamChoice::Small,
            wait: GuestWait::Block,
        };
        assert!(measure(&bad).is_err());
        let too_large = Params {
            runs: 1,
            sizes_mib: vec![1, MAX_SIZE_MIB + 1],
            ram: RamChoice::Small,
            wait: GuestWait::Block,
        };
        let e = measure(&too_large).unwrap_err();
        assert!(e.contains("at most 1024 MiB"), "{e}");
    }

    #[test]
    fn the_memory_check_counts_every_large_buffer() {
        // 1 GiB transfers touch about 16 GiB: more than a small host has, which must be said
        // before anything is allocated, not found by the OOM killer.
        let needed = memory_needed(1 << 30);
        assert!((16 << 30..17 << 30).contains(&needed), "{needed}");
        assert!(memory_available().is_some_and(|a| a > 0));
        assert!(fits(1).is_ok());
        let e = fits(1 << 20).unwrap_err();
        assert!(e.contains("need about") && e.contains("available"), "{e}");
    }
}
