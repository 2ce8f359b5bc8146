//! The device conformance suite: the same end-to-end checks against any
//! [`Device`] — the simulated GPU, the real-GPU executor on a real GPU, and
//! the real-GPU executor over vgpu's own shim.
//!
//! Every check builds an in-process broker over a fresh device, opens
//! sessions with the broker's protocol [`TestClient`] over a socket pair
//! (`broker::session_loop::serve` on the other end), and asserts what a guest
//! would see: copies that round-trip, slices that hold, foreign pointers
//! refused, every corpus kernel correct, faults confined to their VM, the
//! watchdog, and compute shares.

use std::collections::HashMap;
use std::fmt;
use std::os::unix::net::UnixStream;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vgpu_broker::Broker;
use vgpu_broker::device::Device;
use vgpu_broker::session_loop::{ServeError, SessionSummary, serve};
use vgpu_broker::testutils::{CallError, TestClient, vm};
use vgpu_corpus::{Arch, Arg, Gpu, ModuleId};
use vgpu_proto::cuda::{self, attr};
use vgpu_proto::frame::MAX_BULK_CHUNK;
use vgpu_proto::msg;

/// A kernel that spins for a given number of nanoseconds (`tests/gpu/kernels/spin.cu`).
pub const SPIN_PTX: &str = include_str!("../gpu/kernels/spin.sm_52.ptx");
/// A module with 48 MiB of globals (`tests/gpu/kernels/big_global.cu`).
pub const BIG_GLOBAL_PTX: &str = include_str!("../gpu/kernels/big_global.sm_52.ptx");
/// Kernels calling `printf` and `assert` (NVRTC's `vprintf` and `__assertfail`;
/// `devices/ptx/fixtures/deviceio.cu`).
pub const DEVICE_IO_PTX: &str = include_str!("../../devices/ptx/fixtures/deviceio.compute_52.ptx");
/// Bytes of `big_table` in [`BIG_GLOBAL_PTX`].
pub const BIG_GLOBAL_BYTES: u64 = 48 << 20;

const MIB: u64 = 1 << 20;
const DEVICE: &str = "gpu0";
/// Names the checks to run (see [`run_checks`]).
const ONLY_ENV: &str = "VGPU_CONFORMANCE_ONLY";

/// Makes a fresh device with the given watchdog.
pub type DeviceFactory = Box<dyn Fn(Option<Duration>) -> Arc<dyn Device>>;

/// A device under test.
pub struct Target {
    /// Name in the summary (`sim`, `cuda`, `cuda over the shim`).
    pub name: String,
    /// Makes a fresh device.
    pub make: DeviceFactory,
    /// Whether each VM has its own GPU address space, so that a kernel given
    /// another VM's pointer faults. Not over the shim: there, every local VM
    /// is a context of one remote VM.
    pub address_spaces: bool,
    /// The CUDA driver, for the real-GPU executor's own checks.
    pub cuda_driver: Option<Arc<vgpu_cuda::Driver>>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target").field("name", &self.name).finish()
    }
}

/// A broker over one device with some VMs.
pub struct Rig {
    /// The broker.
    pub broker: Arc<Broker>,
    /// Its device.
    pub device: Arc<dyn Device>,
}

impl Rig {
    /// A broker with VMs `(name, slice bytes, weight)` on `device`.
    pub fn new(device: Arc<dyn Device>, vms: &[(&str, u64, u32)]) -> Rig {
        let broker = Arc::new(Broker::new(vec![(DEVICE.into(), Arc::clone(&device))]));
        for &(name, memory, weight) in vms {
            let mut v = vm(name, memory);
            v.device = DEVICE.into();
            v.weight = weight;
            broker.add_tenant(&v).expect("adding a VM");
        }
        Rig { broker, device }
    }

    /// Opens a session of `vm` with a context.
    pub fn session(&self, vm: &str) -> Session {
        let (c, s) = UnixStream::pair().expect("socket pair");
        let b = Arc::clone(&self.broker);
        let t = self.broker.tenant(vm).expect("a VM of the rig");
        let served = std::thread::spawn(move || serve(&b, t, &s, &s, "conformance"));
        let mut client = TestClient::new(c);
        client.hello().expect("hello");
        let ctx = client
            .call(
                &msg::CtxCreate {
                    device: 0,
                    flags: 0,
                },
                &[],
            )
            .expect("cuCtxCreate")
            .0
            .handle;
        Session {
            client,
            served: Some(served),
            ctx,
            functions: HashMap::new(),
        }
    }
}

/// A failed call's `CUresult`.
pub type Code = u32;

pub(crate) fn code<T>(r: Result<T, CallError>) -> Result<T, Code> {
    r.map_err(|e| e.0)
}

/// A kernel handle with its parameter layout.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// Function handle.
    pub handle: u64,
    offsets: Vec<u32>,
    sizes: Vec<u32>,
}

/// One guest process: a protocol session with one context.
pub struct Session {
    pub(crate) client: TestClient<UnixStream>,
    served: Option<JoinHandle<Result<SessionSummary, ServeError>>>,
    /// Its context.
    pub ctx: u64,
    functions: HashMap<(u64, String), Kernel>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session").field("ctx", &self.ctx).finish()
    }
}

impl Session {
    /// `cuMemAlloc`.
    pub fn alloc(&mut self, size: u64) -> Result<u64, Code> {
        let ctx = self.ctx;
        code(self.client.call(&msg::MemAlloc { ctx, size }, &[])).map(|r| r.0.ptr)
    }

    /// `cuMemFree`.
    pub fn free(&mut self, ptr: u64) -> Result<(), Code> {
        let ctx = self.ctx;
        code(self.client.call(&msg::MemFree { ctx, ptr }, &[])).map(|_| ())
    }

    /// `cuMemcpyHtoD` (split into protocol-sized chunks, as the shim does).
    pub fn htod(&mut self, dst: u64, data: &[u8]) -> Result<(), Code> {
        let ctx = self.ctx;
        for (i, chunk) in data.chunks(MAX_BULK_CHUNK).enumerate() {
            let dst = dst + (i * MAX_BULK_CHUNK) as u64;
            code(self.client.call(
                &msg::MemcpyHtoD {
                    ctx,
                    stream: 0,
                    dst,
                },
                chunk,
            ))?;
        }
        Ok(())
    }

    /// `cuMemcpyDtoH`.
    pub fn dtoh(&mut self, src: u64, len: usize) -> Result<Vec<u8>, Code> {
        let ctx = self.ctx;
        let mut out = Vec::with_capacity(len);
        let mut off = 0;
        while off < len {
            let n = (len - off).min(MAX_BULK_CHUNK);
            let (_, data) = code(self.client.call(
                &msg::MemcpyDtoH {
                    ctx,
                    stream: 0,
                    src: src + off as u64,
                    len: n as u64,
                },
                &[],
            ))?;
            out.extend_from_slice(&data);
            off += n;
        }
        Ok(out)
    }

    /// `cuMemcpyDtoD`.
    pub fn dtod(&mut self, dst: u64, src: u64, len: u64) -> Result<(), Code> {
        let ctx = self.ctx;
        code(self.client.call(
            &msg::MemcpyDtoD {
                ctx,
                stream: 0,
                dst,
                src,
                len,
            },
            &[],
        ))
        .map(|_| ())
    }

    /// `cuMemsetD8/16/32`.
    pub fn memset(&mut self, dst: u64, value: u32, elem_size: u32, count: u64) -> Result<(), Code> {
        let ctx = self.ctx;
        code(self.client.call(
            &msg::Memset {
                ctx,
                stream: 0,
                dst,
                value,
                elem_size,
                count,
            },
            &[],
        ))
        .map(|_| ())
    }

    /// `cuMemGetInfo`: (free, total).
    pub fn mem_info(&mut self) -> Result<(u64, u64), Code> {
        let ctx = self.ctx;
        code(self.client.call(&msg::MemGetInfo { ctx }, &[])).map(|r| (r.0.free, r.0.total))
    }

    /// `cuDeviceGetProperties` as the VM sees it.
    pub fn properties(&mut self) -> Result<msg::DeviceProperties, Code> {
        code(
            self.client
                .call(&msg::DeviceGetProperties { device: 0 }, &[]),
        )
        .map(|r| r.0)
    }

    /// `cuModuleLoadData` with PTX text (or a binary image); the error
    /// keeps the broker's message.
    pub fn load(&mut self, image: &[u8]) -> Result<u64, CallError> {
        let ctx = self.ctx;
        self.client
            .call(&msg::ModuleLoad { ctx }, image)
            .map(|r| r.0.handle)
    }

    /// `cuModuleGetFunction`.
    pub fn kernel(&mut self, module: u64, name: &str) -> Result<Kernel, Code> {
        if let Some(k) = self.functions.get(&(module, name.to_string())) {
            return Ok(k.clone());
        }
        let ctx = self.ctx;
        let (f, _) = code(self.client.call(
            &msg::ModuleGetFunction {
                ctx,
                module,
                name: name.into(),
            },
            &[],
        ))?;
        let k = Kernel {
            handle: f.function,
            offsets: f.param_offsets,
            sizes: f.param_sizes,
        };
        self.functions.insert((module, name.to_string()), k.clone());
        Ok(k)
    }

    /// `cuLaunchKernel`, asynchronous: errors surface at [`Session::sync`].
    pub fn launch(
        &mut self,
        k: &Kernel,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        args: &[Arg],
    ) -> Result<(), Code> {
        self.launch_on(0, k, grid, block, shared, args)
    }

    /// `cuLaunchKernel` on `stream`, asynchronous.
    pub fn launch_on(
        &mut self,
        stream: u64,
        k: &Kernel,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        args: &[Arg],
    ) -> Result<(), Code> {
        self.launch_as(stream, k, [grid, block], shared, args, false)
    }

    /// `cuLaunchCooperativeKernel` on the default stream, asynchronous.
    pub fn launch_cooperative(
        &mut self,
        k: &Kernel,
        grid: [u32; 3],
        block: [u32; 3],
        args: &[Arg],
    ) -> Result<(), Code> {
        self.launch_as(0, k, [grid, block], 0, args, true)
    }

    fn launch_as(
        &mut self,
        stream: u64,
        k: &Kernel,
        [grid, block]: [[u32; 3]; 2],
        shared: u32,
        args: &[Arg],
        cooperative: bool,
    ) -> Result<(), Code> {
        if args.len() != k.offsets.len() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let size = k
            .offsets
            .iter()
            .zip(&k.sizes)
            .map(|(o, s)| (o + s) as usize)
            .max()
            .unwrap_or(0);
        let mut buf = vec![0u8; size];
        for ((a, &off), &sz) in args.iter().zip(&k.offsets).zip(&k.sizes) {
            let b = a.to_le_bytes();
            if b.len() != sz as usize {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
            buf[off as usize..off as usize + b.len()].copy_from_slice(&b);
        }
        let m = msg::LaunchKernel {
            ctx: self.ctx,
            stream,
            function: k.handle,
            grid_x: grid[0],
            grid_y: grid[1],
            grid_z: grid[2],
            block_x: block[0],
            block_y: block[1],
            block_z: block[2],
            shared_bytes: shared,
        };
        let sent = if cooperative {
            self.client.post(&m.cooperative(), &buf)
        } else {
            self.client.post(&m, &buf)
        };
        sent.map_err(|_| cuda::CUDA_ERROR_UNKNOWN)
    }

    /// `cuEventCreate`.
    pub fn event(&mut self) -> Result<u64, Code> {
        let ctx = self.ctx;
        code(self.client.call(&msg::EventCreate { ctx, flags: 0 }, &[])).map(|r| r.0.handle)
    }

    /// `cuEventRecord` on the default stream (asynchronous).
    pub fn record(&mut self, event: u64) -> Result<(), Code> {
        let m = msg::EventRecord {
            ctx: self.ctx,
            stream: 0,
            event,
        };
        self.client
            .post(&m, &[])
            .map_err(|_| cuda::CUDA_ERROR_UNKNOWN)
    }

    /// `cuEventSynchronize`.
    pub fn wait_event(&mut self, event: u64) -> Result<(), Code> {
        let ctx = self.ctx;
        code(self.client.call(&msg::EventSynchronize { ctx, event }, &[])).map(|_| ())
    }

    /// `cuCtxSynchronize`.
    pub fn sync(&mut self) -> Result<(), Code> {
        let ctx = self.ctx;
        code(self.client.call(&msg::CtxSynchronize { ctx }, &[])).map(|_| ())
    }

    /// Ends the session and waits until the broker released everything it held.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let _ = self.client.stream.shutdown(std::net::Shutdown::Both);
        if let Some(h) = self.served.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Gpu for Session {
    fn load_module(&mut self, ptx: &str) -> Result<ModuleId, i32> {
        self.load(ptx.as_bytes())
            .map(ModuleId)
            .map_err(|e| e.0 as i32)
    }

    fn global(&mut self, m: ModuleId, name: &str) -> Result<(u64, usize), i32> {
        let ctx = self.ctx;
        self.client
            .call(
                &msg::ModuleGetGlobal {
                    ctx,
                    module: m.0,
                    name: name.into(),
                },
                &[],
            )
            .map(|r| (r.0.base, r.0.size as usize))
            .map_err(|e| e.0 as i32)
    }

    fn alloc(&mut self, bytes: usize) -> Result<u64, i32> {
        Session::alloc(self, bytes as u64).map_err(|c| c as i32)
    }

    fn free(&mut self, ptr: u64) -> Result<(), i32> {
        Session::free(self, ptr).map_err(|c| c as i32)
    }

    fn htod(&mut self, dst: u64, data: &[u8]) -> Result<(), i32> {
        Session::htod(self, dst, data).map_err(|c| c as i32)
    }

    fn dtoh(&mut self, src: u64, out: &mut [u8]) -> Result<(), i32> {
        let v = Session::dtoh(self, src, out.len()).map_err(|c| c as i32)?;
        out.copy_from_slice(&v);
        Ok(())
    }

    fn memset_d32(&mut self, dst: u64, value: u32, count: usize) -> Result<(), i32> {
        self.memset(dst, value, 4, count as u64)
            .map_err(|c| c as i32)
    }

    fn launch(
        &mut self,
        m: ModuleId,
        kernel: &str,
        grid: [u32; 3],
        block: [u32; 3],
        dynamic_shared: u32,
        args: &[Arg],
    ) -> Result<(), i32> {
        let k = self.kernel(m.0, kernel).map_err(|c| c as i32)?;
        Session::launch(self, &k, grid, block, dynamic_shared, args).map_err(|c| c as i32)
    }

    fn synchronize(&mut self) -> Result<(), i32> {
        self.sync().map_err(|c| c as i32)
    }
}

/// Deterministic bytes (xorshift).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// One check of the suite.
pub type Check = fn(&Target);

/// The checks, in order.
pub const CHECKS: &[(&str, Check)] = &[
    ("device_properties", device_properties),
    ("memory_round_trips", memory_round_trips),
    ("scatter_gather_copies", scatter_gather_copies),
    ("fresh_memory_is_zeroed", fresh_memory_is_zeroed),
    ("slices_are_hard_limits", slices_are_hard_limits),
    ("foreign_pointers_are_refused", foreign_pointers_are_refused),
    (
        "small_overruns_stay_in_their_allocation",
        small_overruns_stay_in_their_allocation,
    ),
    ("bad_images_are_refused", bad_images_are_refused),
    ("fat_binaries_with_ptx_run", fat_binaries_with_ptx_run),
    ("kernel_corpus", kernel_corpus),
    ("faults_stay_in_their_vm", faults_stay_in_their_vm),
    ("device_printf_and_assert", device_printf_and_assert),
    ("watchdog", watchdog),
    ("compute_shares", compute_shares),
    (
        "mirrored_memory_is_aligned_and_charged",
        mirrored_memory_is_aligned_and_charged,
    ),
    (
        "pools_charge_their_reservation",
        pools_charge_their_reservation,
    ),
    ("vmm_charges_physical_memory", vmm_charges_physical_memory),
    (
        "streams_run_concurrently",
        crate::conformance_streams::streams_run_concurrently,
    ),
    (
        "event_waits_order_streams",
        crate::conformance_streams::event_waits_order_streams,
    ),
    ("graphs_replay_as_one_request", graphs_replay_as_one_request),
    (
        "graph_branches_run_concurrently",
        crate::conformance_streams::graph_branches_run_concurrently,
    ),
    ("cooperative_launches", cooperative_launches),
    (
        "tensor_core_fragments",
        crate::conformance_mma::tensor_core_fragments,
    ),
    (
        "textures_and_surfaces",
        crate::conformance_textures::textures_and_surfaces,
    ),
    (
        "stream_memory_operations",
        crate::conformance_mem_ops::stream_memory_operations,
    ),
    (
        "graph_conditional_nodes",
        crate::conformance_conditionals::graph_conditional_nodes,
    ),
    ("device_heap", crate::conformance_heap::device_heap),
    (
        "device_launch_limits",
        crate::conformance_heap::device_launch_limits,
    ),
    (
        "allocations_move_between_device_and_host",
        crate::conformance_overflow::allocations_move_between_device_and_host,
    ),
];

/// Cooperative groups' grid barrier (`grid.sync()`, compute 6.0), as NVRTC compiles it.
pub const COOPERATIVE_PTX: &str =
    include_str!("../../devices/ptx/fixtures/cooperative.compute_80.ptx");

/// A cooperative launch runs every block at once, so a grid-wide barrier orders them; a grid
/// larger than the device holds at once is refused with
/// `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE` and the context carries on.
pub fn cooperative_launches(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("a", 64 * MIB, 1)]);
    assert_eq!(
        rig.device.info().attribute(cuda::attr::COOPERATIVE_LAUNCH),
        1
    );
    let mut a = rig.session("a");
    let m = a.load(COOPERATIVE_PTX.as_bytes()).unwrap();
    let ring = a.kernel(m, "ring").unwrap();
    const BLOCKS: u32 = 4;
    const THREADS: u32 = 32;
    const PHASES: i32 = 3;
    let n = (BLOCKS * THREADS) as usize;
    let data = a.alloc(n as u64 * 4).unwrap();
    let out = a.alloc(n as u64 * 4).unwrap();
    a.launch_cooperative(
        &ring,
        [BLOCKS, 1, 1],
        [THREADS, 1, 1],
        &[Arg::Ptr(data), Arg::Ptr(out), Arg::I32(PHASES)],
    )
    .unwrap();
    a.sync().unwrap();
    let got = a.dtoh(out, n * 4).unwrap();
    for (i, v) in got.chunks(4).enumerate() {
        let v = i32::from_le_bytes(v.try_into().unwrap());
        assert_eq!(
            v as usize,
            (i + PHASES as usize * THREADS as usize) % n,
            "element {i}"
        );
    }
    // Far more blocks than any device holds at once.
    let e = a
        .launch_cooperative(
            &ring,
            [1 << 20, 1, 1],
            [THREADS, 1, 1],
            &[Arg::Ptr(data), Arg::Ptr(out), Arg::I32(PHASES)],
        )
        .and_then(|()| a.sync());
    assert_eq!(e, Err(cuda::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE));
    a.sync().expect("the context carries on");
}

impl Session {
    /// Any request, with its `CUresult` on failure.
    pub fn request<O: vgpu_proto::msg::Op>(&mut self, req: &O) -> Result<O::Reply, Code> {
        code(self.client.call(req, &[])).map(|r| r.0)
    }

    /// Any asynchronous request (its errors surface at a later synchronizing call).
    pub fn post<O: vgpu_proto::msg::Op>(&mut self, req: &O) -> Result<(), Code> {
        self.client
            .post(req, &[])
            .map_err(|_| cuda::CUDA_ERROR_UNKNOWN)
    }
}

/// Managed and mapped host memory (`MemAllocMapped`): page-aligned, so that the guest can
/// mirror it at the same address; charged to the slice; freed by `MemFree`.
pub fn mirrored_memory_is_aligned_and_charged(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("a", 16 * MIB, 1)]);
    let mut s = rig.session("a");
    let ctx = s.ctx;
    let (free0, _) = s.mem_info().unwrap();
    let mut ptrs = Vec::new();
    for kind in [1, 2, 3] {
        let p = s
            .request(&msg::MemAllocMapped {
                ctx,
                size: 10_000,
                kind,
            })
            .unwrap()
            .ptr;
        assert_eq!(p % 4096, 0, "kind {kind}: {p:#x}");
        let data = pattern(12_288, kind.into());
        s.htod(p, &data).unwrap();
        assert!(s.dtoh(p, data.len()).unwrap() == data, "kind {kind}");
        ptrs.push(p);
    }
    let (free1, _) = s.mem_info().unwrap();
    assert!(free0 - free1 >= 3 * 12_288, "{free0} -> {free1}");
    assert_eq!(
        s.request(&msg::MemAllocMapped {
            ctx,
            size: 32 * MIB,
            kind: 1
        })
        .unwrap_err(),
        cuda::CUDA_ERROR_OUT_OF_MEMORY
    );
    assert_eq!(
        s.request(&msg::MemAllocMapped {
            ctx,
            size: 1,
            kind: 9
        })
        .unwrap_err(),
        cuda::CUDA_ERROR_INVALID_VALUE
    );
    for p in ptrs {
        s.free(p).unwrap();
    }
    assert_eq!(s.mem_info().unwrap().0, free0);
}

/// Stream-ordered pools: the reservation is charged, freed blocks are reused, the release
/// threshold and trimming give memory back, forged pools are refused.
pub fn pools_charge_their_reservation(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("a", 16 * MIB, 1)]);
    let mut s = rig.session("a");
    let ctx = s.ctx;
    let (free0, _) = s.mem_info().unwrap();
    let pool = s
        .request(&msg::DeviceGetMemPool {
            device: 0,
            default: 1,
        })
        .unwrap()
        .handle;
    let alloc = |s: &mut Session, size| {
        s.request(&msg::MemAllocAsync {
            ctx,
            stream: 0,
            pool: 0,
            size,
        })
        .map(|r| r.ptr)
    };
    let a = alloc(&mut s, 4 * MIB).unwrap();
    s.memset(a, 0x01020304, 4, MIB).unwrap();
    assert_eq!(s.dtoh(a + 4 * MIB - 4, 4).unwrap(), [4, 3, 2, 1]);
    assert_eq!(s.mem_info().unwrap().0, free0 - 4 * MIB);
    s.request(&msg::MemPoolSetAttribute {
        pool,
        attribute: 4,
        value: u64::MAX,
    })
    .unwrap();
    s.request(&msg::MemFreeAsync {
        ctx,
        stream: 0,
        ptr: a,
    })
    .unwrap();
    assert!(
        s.dtoh(a, 4).is_err(),
        "a freed block is not the guest's any more"
    );
    let b = alloc(&mut s, 4 * MIB).unwrap();
    assert_eq!(b, a, "the free block is reused");
    s.request(&msg::MemFreeAsync {
        ctx,
        stream: 0,
        ptr: b,
    })
    .unwrap();
    s.sync().unwrap();
    let reserved = |s: &mut Session| {
        s.request(&msg::MemPoolGetAttribute { pool, attribute: 5 })
            .unwrap()
            .bytes
    };
    assert_eq!(reserved(&mut s), 4 * MIB, "kept below the threshold");
    assert_eq!(s.mem_info().unwrap().0, free0 - 4 * MIB);
    s.request(&msg::MemPoolTrimTo { pool, keep: 0 }).unwrap();
    assert_eq!(reserved(&mut s), 0);
    assert_eq!(s.mem_info().unwrap().0, free0);
    // Past the slice; free blocks of any pool are released to make room first.
    let big = alloc(&mut s, 12 * MIB).unwrap();
    assert_eq!(
        alloc(&mut s, 8 * MIB).unwrap_err(),
        cuda::CUDA_ERROR_OUT_OF_MEMORY
    );
    s.request(&msg::MemFreeAsync {
        ctx,
        stream: 0,
        ptr: big,
    })
    .unwrap();
    s.sync().unwrap();
    alloc(&mut s, 16 * MIB).unwrap();
    assert_eq!(
        s.request(&msg::MemAllocAsync {
            ctx,
            stream: 0,
            pool: 0x2a_0000_0001,
            size: 1
        })
        .unwrap_err(),
        cuda::CUDA_ERROR_INVALID_VALUE
    );
    s.close();
    assert_eq!(rig.broker.tenant("a").unwrap().slice.used(), 0);
}

/// Virtual memory management: physical memory is charged when created, maps where it was
/// reserved, and every byte goes back.
pub fn vmm_charges_physical_memory(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("a", 16 * MIB, 1)]);
    let mut s = rig.session("a");
    let ctx = s.ctx;
    let (free0, _) = s.mem_info().unwrap();
    let g = vgpu_broker::device::VMM_GRANULARITY;
    if let Some(why) = cuda_executor::vmm_refusal(t) {
        // The real-GPU executor's isolation probe did not prove VMM mappings private to their
        // VM: guests' cuMemCreate is refused, and refunded.
        assert_eq!(
            s.request(&msg::MemCreate { ctx, size: g }).unwrap_err(),
            cuda::CUDA_ERROR_NOT_SUPPORTED,
            "cuMemCreate where VMM isolation is not proven"
        );
        assert_eq!(
            s.mem_info().unwrap().0,
            free0,
            "a refused cuMemCreate charges nothing"
        );
        println!("conformance [{}]: guests' VMM is off here: {why}", t.name);
        s.close();
        return;
    }
    let h = s.request(&msg::MemCreate { ctx, size: g }).unwrap().handle;
    assert_eq!(s.mem_info().unwrap().0, free0 - g, "charged when created");
    let va = s
        .request(&msg::MemAddressReserve {
            ctx,
            size: 2 * g,
            align: 0,
        })
        .unwrap()
        .ptr;
    s.request(&msg::MemMap {
        ptr: va + g,
        size: g,
        offset: 0,
        handle: h,
    })
    .unwrap();
    assert!(
        s.htod(va + g, b"x").is_err(),
        "no access before cuMemSetAccess"
    );
    s.request(&msg::MemSetAccess {
        ptr: va + g,
        size: g,
        flags: 3,
    })
    .unwrap();
    assert_eq!(s.dtoh(va + 2 * g - 4, 4).unwrap(), [0; 4], "zeroed");
    let data = pattern(g as usize, 3);
    s.htod(va + g, &data).unwrap();
    assert!(s.dtoh(va + g, data.len()).unwrap() == data);
    s.request(&msg::MemRelease { handle: h }).unwrap();
    assert!(
        s.dtoh(va + g, 4).is_ok(),
        "mapped memory outlives its handle"
    );
    assert_eq!(
        s.request(&msg::MemCreate {
            ctx,
            size: 16 * MIB
        })
        .unwrap_err(),
        cuda::CUDA_ERROR_OUT_OF_MEMORY
    );
    s.request(&msg::MemUnmap {
        ptr: va + g,
        size: g,
    })
    .unwrap();
    s.request(&msg::MemAddressFree {
        ptr: va,
        size: 2 * g,
    })
    .unwrap();
    assert_eq!(s.mem_info().unwrap().0, free0);
    s.close();
    assert_eq!(rig.broker.tenant("a").unwrap().slice.used(), 0);
}

/// What the device reports, and what a VM sees of it.
pub fn device_properties(t: &Target) {
    let dev = (t.make)(None);
    let info = dev.info().clone();
    assert!(!info.name.is_empty());
    assert!(info.total_memory >= 256 * MIB, "{}", info.total_memory);
    assert_eq!(info.attribute(attr::WARP_SIZE), 32);
    assert!(info.attribute(attr::COMPUTE_CAPABILITY_MAJOR) >= 5);
    assert!(info.attribute(attr::MULTIPROCESSOR_COUNT) >= 1);
    assert!(info.attribute(attr::MAX_THREADS_PER_BLOCK) >= 512);
    assert!(info.alloc_granularity >= 1);
    let rig = Rig::new(dev, &[("a", 64 * MIB, 1)]);
    let mut s = rig.session("a");
    let p = s.properties().unwrap();
    assert_eq!(p.name, info.name);
    assert_eq!(p.uuid, info.uuid);
    assert_eq!(p.total_mem, 64 * MIB, "a VM sees its slice, not the GPU");
    assert_eq!(p.attributes[attr::WARP_SIZE], 32);
    assert_eq!(s.mem_info().unwrap(), (64 * MIB, 64 * MIB));
}

/// Host↔device copies of several sizes (beyond the protocol's and the
/// staging buffers' chunk sizes), device copies including overlapping ones,
/// fills of 1, 2 and 4 bytes, and frees that give everything back.
pub fn memory_round_trips(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("a", 256 * MIB, 1)]);
    let base = rig.device.memory_used();
    let mut s = rig.session("a");
    for (i, &len) in [1usize, 4099, 5 * MIB as usize + 7].iter().enumerate() {
        let data = pattern(len, 0x1234 + i as u64);
        let p = s.alloc(len as u64).unwrap();
        s.htod(p, &data).unwrap();
        assert!(s.dtoh(p, len).unwrap() == data, "{len} bytes round trip");
        let q = s.alloc(len as u64).unwrap();
        s.dtod(q, p, len as u64).unwrap();
        assert!(s.dtoh(q, len).unwrap() == data, "{len} bytes device copy");
        s.free(q).unwrap();
        s.free(p).unwrap();
    }
    // Overlapping device copies move like memmove, both directions.
    let len = 3 * MIB as usize;
    let data = pattern(len, 99);
    let p = s.alloc(len as u64).unwrap();
    for (dst, src) in [(4096usize, 0usize), (0, 4096), (1, 0)] {
        s.htod(p, &data).unwrap();
        let n = len - dst.max(src);
        s.dtod(p + dst as u64, p + src as u64, n as u64).unwrap();
        let mut want = data.clone();
        want.copy_within(src..src + n, dst);
        assert!(
            s.dtoh(p, len).unwrap() == want,
            "overlapping copy {src} -> {dst}"
        );
    }
    // Fills at odd offsets, each element size.
    s.htod(p, &data).unwrap();
    s.memset(p + 3, 0xab, 1, 1001).unwrap();
    s.memset(p + 2048, 0xbeef, 2, 333).unwrap();
    s.memset(p + 8192, 0xdead_beef, 4, 777).unwrap();
    let mut want = data.clone();
    want[3..1004].fill(0xab);
    for i in 0..333 {
        want[2048 + 2 * i..2050 + 2 * i].copy_from_slice(&0xbeefu16.to_le_bytes());
    }
    for i in 0..777 {
        want[8192 + 4 * i..8196 + 4 * i].copy_from_slice(&0xdead_beefu32.to_le_bytes());
    }
    assert!(s.dtoh(p, len).unwrap() == want, "fills");
    s.free(p).unwrap();
    assert_eq!(
        s.mem_info().unwrap().0,
        256 * MIB,
        "the slice is whole again"
    );
    s.close();
    assert_eq!(
        rig.device.memory_used(),
        base,
        "the device memory was freed"
    );
}

/// A VM never sees what another VM (or an earlier process of its own) left in device memory:
/// fresh allocations read as zero after others freed patterned memory of the same sizes.
pub fn fresh_memory_is_zeroed(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("a", 64 * MIB, 1), ("b", 64 * MIB, 1)]);
    let sizes = [4096usize, 3 * MIB as usize + 5, 24 * MIB as usize];
    {
        let mut a = rig.session("a");
        for (i, &len) in sizes.iter().enumerate() {
            let p = a.alloc(len as u64).unwrap();
            let secret: Vec<u8> = pattern(len, 0x5ec + i as u64)
                .iter()
                .map(|b| b | 1)
                .collect();
            a.htod(p, &secret).unwrap();
            a.free(p).unwrap();
        }
        a.close();
    }
    for vm in ["b", "a"] {
        let mut s = rig.session(vm);
        for &len in &sizes {
            let p = s.alloc(len as u64).unwrap();
            let got = s.dtoh(p, len).unwrap();
            assert!(
                got.iter().all(|&b| b == 0),
                "VM {vm}: a fresh {len}-byte allocation holds old bytes"
            );
            s.free(p).unwrap();
        }
        s.close();
    }
}

/// `write_gathered` and `read_scattered` (what a copy through the virtio-vgpu device uses: the
/// pieces are the guest pages of the transfer) lay pieces back to back: a page-scattered layout,
/// pieces larger than any staging chunk, empty pieces, an odd start; the bytes read back with
/// another layout are the ones written. A range past the allocation is refused.
pub fn scatter_gather_copies(t: &Target) {
    let dev = (t.make)(None);
    let ctx = dev.open("a").expect("a context");
    let len = 9 * MIB as usize + 4099;
    let p = ctx.alloc(len as u64 + 64).expect("an allocation");
    let data = pattern(len, 0x5ca7);
    // Pieces of 4 KiB pages with an odd first and last one, a 5 MiB run, empty pieces.
    let mut cuts = vec![0usize, 1000, 1000];
    let mut at = 1000;
    while at + 4096 <= 4 * MIB as usize {
        at += 4096;
        cuts.push(at);
    }
    cuts.extend([at + 5 * MIB as usize, at + 5 * MIB as usize, len]);
    let pieces: Vec<&[u8]> = cuts.windows(2).map(|w| &data[w[0]..w[1]]).collect();
    ctx.write_gathered(p + 3, &pieces)
        .expect("a gathered write");
    let mut back = vec![0u8; len];
    ctx.read(p + 3, &mut back).expect("a plain read");
    assert!(back == data, "gathered pieces land back to back");
    // Read them into a different layout: 3 MiB + 7, then 64 KiB pieces, then the rest.
    let mut out = vec![0u8; len];
    let mut rest: &mut [u8] = &mut out;
    let mut pieces: Vec<&mut [u8]> = Vec::new();
    for n in std::iter::once(3 * MIB as usize + 7).chain(std::iter::repeat_n(65536, 40)) {
        let (head, tail) = rest.split_at_mut(n);
        pieces.push(head);
        rest = tail;
    }
    pieces.push(&mut []);
    pieces.push(rest);
    ctx.read_scattered(p + 3, &mut pieces)
        .expect("a scattered read");
    drop(pieces);
    assert!(out == data, "scattered pieces are filled in order");
    // Past the end of the allocation: refused.
    let over = [&data[..40], &data[..40]];
    assert!(ctx.write_gathered(p + len as u64, &over).is_err());
    let (mut a, mut b) = ([0u8; 40], [0u8; 40]);
    assert!(
        ctx.read_scattered(p + len as u64, &mut [&mut a, &mut b])
            .is_err()
    );
    ctx.free(p).expect("free");
}

/// Past the slice, allocations and module loads fail with
/// `CUDA_ERROR_OUT_OF_MEMORY` and nothing changes.
pub fn slices_are_hard_limits(t: &Target) {
    let slice = 8 * MIB;
    let rig = Rig::new((t.make)(None), &[("a", slice, 1)]);
    let mut s = rig.session("a");
    let a = s.alloc(6 * MIB).unwrap();
    let data = pattern(6 * MIB as usize, 7);
    s.htod(a, &data).unwrap();
    let before = s.mem_info().unwrap();
    let used = rig.device.memory_used();
    assert_eq!(s.alloc(3 * MIB), Err(cuda::CUDA_ERROR_OUT_OF_MEMORY));
    let e = s.load(BIG_GLOBAL_PTX.as_bytes()).unwrap_err();
    assert_eq!(e.0, cuda::CUDA_ERROR_OUT_OF_MEMORY, "{}", e.1);
    assert_eq!(s.mem_info().unwrap(), before, "refusals change nothing");
    assert_eq!(rig.device.memory_used(), used, "nothing was left allocated");
    assert!(s.dtoh(a, data.len()).unwrap() == data, "data intact");
    s.free(a).unwrap();
    // The whole slice is usable, and not a byte more.
    let all = s.alloc(slice).unwrap();
    assert_eq!(s.alloc(1), Err(cuda::CUDA_ERROR_OUT_OF_MEMORY));
    s.free(all).unwrap();
    // A module whose globals fit loads, and its globals are charged.
    let rig2 = Rig::new((t.make)(None), &[("b", 64 * MIB, 1)]);
    let mut s2 = rig2.session("b");
    let m = s2.load(BIG_GLOBAL_PTX.as_bytes()).unwrap();
    let (free, total) = s2.mem_info().unwrap();
    assert!(
        total - free >= BIG_GLOBAL_BYTES,
        "globals charged: {}",
        total - free
    );
    let (addr, size) = s2.global(ModuleId(m), "big_table").unwrap();
    assert_eq!(size as u64, BIG_GLOBAL_BYTES);
    s2.htod(addr + BIG_GLOBAL_BYTES - 4, b"glob").unwrap();
    assert_eq!(s2.dtoh(addr + BIG_GLOBAL_BYTES - 4, 4).unwrap(), b"glob");
}

fn vector_add(s: &mut Session) -> Kernel {
    let m = s
        .load(vgpu_corpus::ptx("vector_add", Arch::Sm52).as_bytes())
        .unwrap();
    s.kernel(m, "vector_add").unwrap()
}

/// Runs vector_add on n elements in session `s`; returns whether it was correct.
fn add_works(s: &mut Session, k: &Kernel, n: usize) -> Result<(), Code> {
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 2.0 * i as f32 + 0.5).collect();
    let bytes = (n * 4) as u64;
    let (pa, pb, pc) = (s.alloc(bytes)?, s.alloc(bytes)?, s.alloc(bytes)?);
    s.htod(pa, &f32s(&a))?;
    s.htod(pb, &f32s(&b))?;
    s.launch(
        k,
        [(n as u32).div_ceil(128), 1, 1],
        [128, 1, 1],
        0,
        &[Arg::Ptr(pa), Arg::Ptr(pb), Arg::Ptr(pc), Arg::I32(n as i32)],
    )?;
    s.sync()?;
    let c = s.dtoh(pc, n * 4)?;
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert!(c == f32s(&want), "vector_add computed a wrong result");
    for p in [pa, pb, pc] {
        s.free(p)?;
    }
    Ok(())
}

/// A kernel that overruns small allocations by a few elements (numba-cuda's own dispatcher test
/// launches 16 threads over 10-element arrays) runs as on a GPU, where the overrun lands in
/// the allocation's page and does not fault: each allocation's bytes run to its size rounded
/// up to CUDA's 256-byte alignment. The elements inside the allocations are right, and the
/// allocations next to them are untouched.
pub fn small_overruns_stay_in_their_allocation(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("a", 64 * MIB, 1)]);
    let mut s = rig.session("a");
    let k = vector_add(&mut s);
    let (n, run) = (10usize, 16usize);
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 3.0 * i as f32).collect();
    let bytes = (n * 4) as u64;
    let guard_pattern = pattern(256, 0x9a);
    let guard = s.alloc(256).unwrap();
    s.htod(guard, &guard_pattern).unwrap();
    let (pa, pb, pc) = (
        s.alloc(bytes).unwrap(),
        s.alloc(bytes).unwrap(),
        s.alloc(bytes).unwrap(),
    );
    let after = s.alloc(256).unwrap();
    s.htod(after, &guard_pattern).unwrap();
    s.htod(pa, &f32s(&a)).unwrap();
    s.htod(pb, &f32s(&b)).unwrap();
    s.launch(
        &k,
        [1, 1, 1],
        [32, 1, 1],
        0,
        &[
            Arg::Ptr(pa),
            Arg::Ptr(pb),
            Arg::Ptr(pc),
            Arg::I32(run as i32),
        ],
    )
    .unwrap();
    s.sync()
        .expect("an overrun within the allocations' alignment does not fault");
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert!(
        s.dtoh(pc, n * 4).unwrap() == f32s(&want),
        "the elements inside are right"
    );
    for p in [guard, after] {
        assert!(
            s.dtoh(p, 256).unwrap() == guard_pattern,
            "a neighbour was overwritten"
        );
    }
    for p in [guard, pa, pb, pc, after] {
        s.free(p).unwrap();
    }
    s.close();
}

/// Pointers of another VM, of another session of the same VM, and freed
/// pointers are refused with `CUDA_ERROR_INVALID_VALUE`; the owner's data
/// stays intact. Where VMs have separate GPU address spaces, a kernel given
/// another VM's pointer faults in its own VM only.
pub fn foreign_pointers_are_refused(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("a", 64 * MIB, 1), ("b", 64 * MIB, 1)]);
    let mut a1 = rig.session("a");
    let mut a2 = rig.session("a");
    let mut b = rig.session("b");
    let data = pattern(4096, 5);
    let p = a1.alloc(4096).unwrap();
    a1.htod(p, &data).unwrap();
    let q = b.alloc(4096).unwrap();
    let inval = Err(cuda::CUDA_ERROR_INVALID_VALUE);
    for s in [&mut b, &mut a2] {
        assert_eq!(s.htod(p, b"evil"), inval);
        assert_eq!(s.dtoh(p, 16).err(), Some(cuda::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(s.memset(p, 0, 4, 16), inval);
        assert_eq!(s.free(p), inval);
        assert_eq!(s.dtod(p + 8, p, 8), inval);
    }
    assert_eq!(b.dtod(q, p, 64), inval);
    assert_eq!(b.dtod(p, q, 64), inval);
    assert_eq!(b.dtod(q, q + 4000, 200), inval, "past the end of its own");
    assert!(
        a1.dtoh(p, 4096).unwrap() == data,
        "the owner's data is intact"
    );
    if t.address_spaces {
        // The broker cannot see pointers inside kernel arguments: the GPU's
        // address spaces refuse them.
        let k = vector_add(&mut b);
        b.launch(
            &k,
            [1, 1, 1],
            [64, 1, 1],
            0,
            &[Arg::Ptr(p), Arg::Ptr(p), Arg::Ptr(q), Arg::I32(64)],
        )
        .unwrap();
        assert_eq!(b.sync(), Err(cuda::CUDA_ERROR_ILLEGAL_ADDRESS));
        assert!(a1.dtoh(p, 4096).unwrap() == data, "the owner is unaffected");
        let ka = vector_add(&mut a1);
        add_works(&mut a1, &ka, 1000).unwrap();
    }
    // A freed pointer is stale.
    a1.free(p).unwrap();
    assert_eq!(a1.dtoh(p, 16).err(), Some(cuda::CUDA_ERROR_INVALID_VALUE));
    assert_eq!(a1.free(p), inval);
}

/// Malformed modules fail with the driver's codes and a message that says why.
pub fn bad_images_are_refused(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("a", 64 * MIB, 1)]);
    let mut s = rig.session("a");
    let bad = ".version 7.0\n.target sm_52\n.address_size 64\n\
               .visible .entry k(.param .u64 p)\n{\n\tret;\n"; // the body is never closed
    let e = s.load(bad.as_bytes()).unwrap_err();
    assert_eq!(e.0, cuda::CUDA_ERROR_INVALID_PTX, "{}", e.1);
    assert!(e.1.len() > 10, "the message explains: {}", e.1);
    let e = s.load(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]).unwrap_err();
    assert!(
        matches!(
            e.0,
            cuda::CUDA_ERROR_INVALID_IMAGE | cuda::CUDA_ERROR_NO_BINARY_FOR_GPU
        ),
        "{e:?}"
    );
    // The session still works.
    let k = vector_add(&mut s);
    add_works(&mut s, &k, 300).unwrap();
}

/// A fat binary carrying PTX (what nvcc embeds with
/// `-gencode arch=compute_52,code=compute_52`, plain and LZ4-compressed)
/// loads and runs; one carrying only a cubin for an architecture no device
/// has is refused with `CUDA_ERROR_NO_BINARY_FOR_GPU` (or, where the driver
/// reads the cubin first, `CUDA_ERROR_INVALID_IMAGE`), and the session
/// carries on.
pub fn fat_binaries_with_ptx_run(t: &Target) {
    use vgpu_fatbin::{KIND_ELF, KIND_PTX, NewEntry, write};
    let rig = Rig::new((t.make)(None), &[("a", 64 * MIB, 1)]);
    let mut s = rig.session("a");
    let ptx = vgpu_corpus::ptx("vector_add", Arch::Sm52);
    let mut text = ptx.as_bytes().to_vec();
    text.push(0);
    let plain = write(&[NewEntry {
        kind: KIND_PTX,
        arch: 52,
        flags: 0,
        payload: &text,
        uncompressed_len: 0,
    }]);
    // The same text as one LZ4 literal run (a valid block, as nvcc's compressor may emit).
    let mut lz4 = vec![0xF0];
    let mut rest = text.len() - 15;
    while rest >= 255 {
        lz4.push(255);
        rest -= 255;
    }
    lz4.push(rest as u8);
    lz4.extend_from_slice(&text);
    let compressed = write(&[NewEntry {
        kind: KIND_PTX,
        arch: 52,
        flags: 0x2000,
        payload: &lz4,
        uncompressed_len: text.len() as u64,
    }]);
    for (what, image) in [("plain", plain), ("LZ4", compressed)] {
        let m = s
            .load(&image)
            .unwrap_or_else(|e| panic!("{what} fat binary: {e:?}"));
        let k = s.kernel(m, "vector_add").unwrap();
        add_works(&mut s, &k, 300).unwrap();
    }
    let cubin_only = write(&[NewEntry {
        kind: KIND_ELF,
        arch: 10,
        flags: 0,
        payload: b"\x7fELF\x02\x01\x01\0not a real cubin",
        uncompressed_len: 0,
    }]);
    let e = s.load(&cubin_only).unwrap_err();
    assert!(
        matches!(
            e.0,
            cuda::CUDA_ERROR_NO_BINARY_FOR_GPU | cuda::CUDA_ERROR_INVALID_IMAGE
        ),
        "{e:?}"
    );
    let k = vector_add(&mut s);
    add_works(&mut s, &k, 100).unwrap();
}

/// Every corpus kernel (sm_52, sm_80 and sm_90 PTX) is correct through a
/// broker session; each case runs in a fresh session of one VM.
pub fn kernel_corpus(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("corpus", 512 * MIB, 1)]);
    let mut factory = || Ok(Box::new(rig.session("corpus")) as Box<dyn Gpu>);
    let report = vgpu_corpus::run_all(&mut factory, &Arch::ALL);
    println!("{report}");
    assert_eq!(report.failed(), 0, "{report}");
    assert!(report.passed() >= 150, "only {} runs", report.passed());
    let mut s = rig.session("corpus");
    assert_eq!(
        s.mem_info().unwrap().0,
        512 * MIB,
        "every case gave its memory back"
    );
}

/// A kernel fault (`CUDA_ERROR_ILLEGAL_ADDRESS`) poisons its own context
/// only: the other VM computes correctly meanwhile, and the faulting VM's
/// next process starts clean.
pub fn faults_stay_in_their_vm(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("a", 64 * MIB, 1), ("b", 64 * MIB, 1)]);
    let mut b = rig.session("b");
    let kb = vector_add(&mut b);
    add_works(&mut b, &kb, 5000).unwrap();
    let mut a = rig.session("a");
    let m = a
        .load(vgpu_corpus::ptx("oob", Arch::Sm52).as_bytes())
        .unwrap();
    let k = a.kernel(m, "oob_write").unwrap();
    let buf = a.alloc(1024).unwrap();
    a.launch(
        &k,
        [1, 1, 1],
        [64, 1, 1],
        0,
        &[Arg::Ptr(buf), Arg::I64(1 << 38), Arg::I32(42)],
    )
    .unwrap();
    assert_eq!(a.sync(), Err(cuda::CUDA_ERROR_ILLEGAL_ADDRESS));
    assert_eq!(
        a.alloc(4096),
        Err(cuda::CUDA_ERROR_ILLEGAL_ADDRESS),
        "the error is sticky"
    );
    add_works(&mut b, &kb, 5000).unwrap();
    a.close();
    let mut a = rig.session("a");
    let ka = vector_add(&mut a);
    add_works(&mut a, &ka, 5000).unwrap();
    add_works(&mut b, &kb, 5000).unwrap();
}

/// Device-side `printf` and `assert`. Every executor runs the kernels and fails a failed
/// assert with `CUDA_ERROR_ASSERT` (710), sticky for that context only. Where the device hands
/// its output to the broker (the simulated GPU), the `printf` text and CUDA's assert message
/// reach the client at the synchronizing call, flagged on its reply.
pub fn device_printf_and_assert(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("a", 64 * MIB, 1), ("b", 64 * MIB, 1)]);
    // The real-GPU executor returns the text of PTX modules' printf (devices/cuda/src/printf.rs).
    let kind = rig.device.info().kind;
    let returns_output = matches!(kind, "sim" | "cuda");
    // Only the simulated GPU returns CUDA's assertion message.
    let returns_assert_message = kind == "sim";
    let mut a = rig.session("a");
    let (f, _) = a
        .client
        .call(
            &msg::SetFeatures {
                features: msg::FEATURE_DEVICE_OUTPUT,
            },
            &[],
        )
        .unwrap();
    assert_eq!(f.features, msg::FEATURE_DEVICE_OUTPUT);
    let m = a.load(DEVICE_IO_PTX.as_bytes()).unwrap();
    let hello = a.kernel(m, "hello").unwrap();
    a.launch(&hello, [4, 1, 1], [64, 1, 1], 0, &[Arg::I32(77)])
        .unwrap();
    let s = a.alloc(16).unwrap();
    a.htod(s, b"vgpu\0").unwrap();
    let formats = a.kernel(m, "formats").unwrap();
    a.launch(
        &formats,
        [1, 1, 1],
        [32, 1, 1],
        0,
        &[
            Arg::Ptr(s),
            Arg::F32(2.5),
            Arg::F64(-1.25e-5),
            Arg::I64(1 << 40),
        ],
    )
    .unwrap();
    a.sync().unwrap();
    let take = |a: &mut Session| {
        let (o, _) = a
            .client
            .call(&msg::TakeOutput { max_bytes: 1 << 20 }, &[])
            .unwrap();
        assert_eq!(o.more, 0);
        (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    if returns_output {
        assert_ne!(a.client.last_flags & vgpu_proto::frame::FLAG_OUTPUT, 0);
        let (out, err) = take(&mut a);
        for b in 0..4 {
            let line = format!("block {b} of 4 says hello (tag 77)\n");
            assert_eq!(out.matches(&line).count(), 1, "{out}");
        }
        assert!(
            out.ends_with(
                "d=-7 u=42 x=0xbeef lld=1099511627776 f=2.500 e=-1.25e-05 g=-1.25e-05 s=vgpu c=Z p=%\nreturned 9\n"
            ),
            "{out}"
        );
        assert_eq!(err, "");
        a.sync().unwrap();
        assert_eq!(a.client.last_flags & vgpu_proto::frame::FLAG_OUTPUT, 0);
    }

    let v: Vec<u8> = (0..64i32).flat_map(|i| i.to_le_bytes()).collect();
    let p = a.alloc(256).unwrap();
    a.htod(p, &v).unwrap();
    let check = a.kernel(m, "check").unwrap();
    a.launch(
        &check,
        [2, 1, 1],
        [32, 1, 1],
        0,
        &[Arg::Ptr(p), Arg::I32(64)],
    )
    .unwrap();
    assert_eq!(a.sync(), Err(cuda::CUDA_ERROR_ASSERT));
    if returns_assert_message {
        let (_, err) = take(&mut a);
        assert!(
            err.starts_with("deviceio.cu:")
                && err.ends_with(
                    ": check: block: [0,0,0], thread: [13,0,0] Assertion `v[i] != 13` failed.\n"
                ),
            "{err}"
        );
    }
    assert_eq!(a.alloc(64), Err(cuda::CUDA_ERROR_ASSERT), "sticky");
    assert_eq!(a.sync(), Err(cuda::CUDA_ERROR_ASSERT), "sticky");
    let mut b = rig.session("b");
    let kb = vector_add(&mut b);
    add_works(&mut b, &kb, 3000).unwrap();
    a.close();
    let mut a = rig.session("a");
    let ka = vector_add(&mut a);
    add_works(&mut a, &ka, 3000).unwrap();
}

/// Launches `spin` for `ns` nanoseconds (one thread); `out` receives the time spun.
fn spin(s: &mut Session, k: &Kernel, ns: u64, out: u64) -> Result<(), Code> {
    s.launch(k, [1, 1, 1], [1, 1, 1], 0, &[Arg::U64(ns), Arg::Ptr(out)])
}

fn spin_kernel(s: &mut Session) -> Kernel {
    let m = s.load(SPIN_PTX.as_bytes()).unwrap();
    s.kernel(m, "spin").unwrap()
}

/// A kernel running past the device's watchdog fails with
/// `CUDA_ERROR_LAUNCH_TIMEOUT` for its VM only.
pub fn watchdog(t: &Target) {
    let rig = Rig::new(
        (t.make)(Some(Duration::from_millis(300))),
        &[("a", 64 * MIB, 1), ("b", 64 * MIB, 1)],
    );
    let mut a = rig.session("a");
    let mut b = rig.session("b");
    let ka = spin_kernel(&mut a);
    let kb = vector_add(&mut b);
    let out = a.alloc(8).unwrap();
    // A short kernel is fine.
    spin(&mut a, &ka, 1_000_000, out).unwrap();
    a.sync().unwrap();
    let t0 = Instant::now();
    spin(&mut a, &ka, 2_000_000_000, out).unwrap();
    assert_eq!(a.sync(), Err(cuda::CUDA_ERROR_LAUNCH_TIMEOUT));
    assert!(
        t0.elapsed() < Duration::from_millis(1900),
        "the watchdog fired before the kernel ended: {:?}",
        t0.elapsed()
    );
    add_works(&mut b, &kb, 2000).unwrap();
    a.close();
    let mut a = rig.session("a");
    let k = vector_add(&mut a);
    add_works(&mut a, &k, 2000).unwrap();
}

/// Two VMs with weights 1 and 3 keep the device busy with equal 2 ms
/// kernels; each gets device time in proportion (loose bounds: 15–35 % for
/// the lighter one). On a real GPU the scheduler gates at kernel
/// boundaries, so shares are exact only to a kernel's length.
pub fn compute_shares(t: &Target) {
    const KERNEL_NS: u64 = 2_000_000;
    const BATCH: u64 = 16;
    const WINDOW: Duration = Duration::from_millis(3000);
    let rig = Rig::new(
        (t.make)(None),
        &[("light", 64 * MIB, 1), ("heavy", 64 * MIB, 3)],
    );
    let run = |vm: &'static str, end: Instant| {
        let mut s = rig.session(vm);
        let k = spin_kernel(&mut s);
        let out = s.alloc(8).unwrap();
        let events = [s.event().unwrap(), s.event().unwrap()];
        move || {
            // Two batches in flight, so the VM never runs dry between its
            // kernels; only batches completed inside the window count (work
            // done after it, when one VM may run alone, would bias the shares).
            let mut n = 0u64;
            let batch = |s: &mut Session, i: usize| {
                for _ in 0..BATCH {
                    spin(s, &k, KERNEL_NS, out).unwrap();
                }
                s.record(events[i % 2]).unwrap();
            };
            batch(&mut s, 0);
            for i in 0.. {
                batch(&mut s, i + 1);
                s.wait_event(events[i % 2]).unwrap();
                if Instant::now() > end {
                    break;
                }
                n += BATCH;
            }
            s.sync().unwrap();
            n
        }
    };
    let end = Instant::now() + WINDOW;
    let (light, heavy) = (run("light", end), run("heavy", end));
    let (l, h) = std::thread::scope(|sc| {
        let l = sc.spawn(light);
        let h = sc.spawn(heavy);
        (l.join().unwrap(), h.join().unwrap())
    });
    let share = l as f64 / (l + h) as f64;
    println!(
        "compute shares: light {l} kernels, heavy {h} kernels, light share {share:.3} (configured 0.25)"
    );
    assert!(l + h >= 40, "too few kernels ran: {l} + {h}");
    assert!(
        (0.15..=0.35).contains(&share),
        "light share {share:.3}, configured 0.25"
    );
}

/// The outcome of one check.
#[derive(Debug)]
pub struct CheckResult {
    /// Check name.
    pub name: &'static str,
    /// `None` when it passed.
    pub failure: Option<String>,
    /// Wall time.
    pub elapsed: Duration,
}

/// Outcomes of a suite run.
#[derive(Debug)]
pub struct SuiteReport {
    /// The target's name.
    pub target: String,
    /// One per check.
    pub results: Vec<CheckResult>,
}

impl SuiteReport {
    /// Checks that failed.
    pub fn failed(&self) -> usize {
        self.results.iter().filter(|r| r.failure.is_some()).count()
    }
}

impl fmt::Display for SuiteReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "conformance on {}:", self.target)?;
        for r in &self.results {
            let verdict = if r.failure.is_some() { "FAIL" } else { "ok" };
            writeln!(
                f,
                "  {:32} {:>4} {:>9.2}s",
                r.name,
                verdict,
                r.elapsed.as_secs_f64()
            )?;
        }
        for r in &self.results {
            if let Some(e) = &r.failure {
                writeln!(f, "FAIL {}: {e}", r.name)?;
            }
        }
        write!(
            f,
            "conformance on {}: {} passed, {} failed",
            self.target,
            self.results.len() - self.failed(),
            self.failed()
        )
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panicked".into())
}

/// Runs `checks` against `target`; with `VGPU_CONFORMANCE_ONLY` set (names separated by
/// commas), only those named there (a developer's shortcut; the test command runs them all).
pub fn run_checks(target: &Target, checks: &[(&'static str, Check)]) -> SuiteReport {
    let only = std::env::var(ONLY_ENV).ok();
    let chosen = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|n| n == name))
    };
    let mut results = Vec::new();
    for &(name, check) in checks.iter().filter(|(name, _)| chosen(name)) {
        let t0 = Instant::now();
        let r = catch_unwind(AssertUnwindSafe(|| check(target)));
        let elapsed = t0.elapsed();
        let failure = r.err().map(|p| panic_text(p.as_ref()));
        println!(
            "conformance [{}] {name}: {} in {:.2}s",
            target.name,
            if failure.is_some() { "FAIL" } else { "ok" },
            elapsed.as_secs_f64()
        );
        results.push(CheckResult {
            name,
            failure,
            elapsed,
        });
    }
    SuiteReport {
        target: target.name.clone(),
        results,
    }
}

/// Runs every check.
pub fn run_suite(target: &Target) -> SuiteReport {
    run_checks(target, CHECKS)
}

/// Checks of the real-GPU executor beyond the [`Device`] trait: device
/// selection, kernel times, context recreation after a sticky error, the
/// JIT error log.
pub mod cuda_executor {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use vgpu_broker::device::{DeviceContext, DeviceError, LaunchDims, RunControl};
    use vgpu_cuda::select::{GPU_PREFIX, format_uuid};
    use vgpu_cuda::{CudaDevice, CudaError, CudaOptions, Driver, Selector};
    use vgpu_proto::cuda;

    use super::{BIG_GLOBAL_PTX, Check, SPIN_PTX, Target, pattern};

    /// The driver and which device the checks use.
    pub fn open(driver: &Arc<Driver>, watchdog: Option<Duration>) -> Arc<CudaDevice> {
        CudaDevice::with_driver(
            Arc::clone(driver),
            &Selector::Index(0),
            CudaOptions {
                name: "gpu0".into(),
                watchdog,
            },
        )
        .expect("opening CUDA device 0")
    }

    /// Why the real-GPU executor refuses guests' `cuMemCreate` on the target's device (its
    /// VMM isolation probe did not prove isolation); `None` on other targets.
    pub fn vmm_refusal(t: &Target) -> Option<String> {
        let d = t.cuda_driver.as_ref()?;
        open(d, None).vmm_isolation().refusal()
    }

    fn driver_of(t: &Target) -> Arc<Driver> {
        t.cuda_driver
            .clone()
            .expect("the real-GPU executor checks run on cuda targets")
    }

    /// The checks, in order.
    pub const CHECKS: &[(&str, Check)] = &[
        ("cuda_selects_devices", selects_devices),
        ("cuda_measures_kernel_time", measures_kernel_time),
        ("cuda_recreates_broken_contexts", recreates_broken_contexts),
        ("cuda_reports_jit_errors", reports_jit_errors),
        ("cuda_charges_module_globals", charges_module_globals),
        ("cuda_loads_cubins", loads_cubins),
        ("cuda_clears_staging_buffers", clears_staging_buffers),
        ("cuda_launches_at_priority", launches_at_priority),
        (
            "cuda_runs_graph_chains_as_cuda_graphs",
            runs_graph_chains_as_cuda_graphs,
        ),
    ];

    /// A replayed graph's chain of dependent kernels runs as one CUDA graph: the broker hands
    /// it to the executor as one job, which captures it once (one instantiation, then the
    /// cached executable graph) and launches it with one `cuGraphLaunch` per replay; the
    /// results are those of the kernels one by one, every kernel is counted, a chain longer
    /// than the bound is split, and a faulting kernel in a chain fails the context as it would
    /// alone.
    pub fn runs_graph_chains_as_cuda_graphs(t: &Target) {
        use vgpu_broker::session::MAX_GRAPH_CHAIN_KERNELS;
        use vgpu_corpus::{Arch, Arg};
        use vgpu_proto::graph::push_op;
        use vgpu_proto::msg;

        use super::{MIB, Rig, code, f32s, packed};

        let d = driver_of(t);
        if !d.has_graphs() {
            println!("the driver has no graphs: chains run kernel by kernel");
            return;
        }
        let rig = Rig::new(open(&d, None), &[("a", 64 * MIB, 1)]);
        let mut s = rig.session("a");
        let ctx = s.ctx;
        let m = s
            .load(vgpu_corpus::ptx("saxpy", Arch::Sm52).as_bytes())
            .unwrap();
        let saxpy = s.kernel(m, "saxpy").unwrap();
        let n = 1000usize;
        let x: Vec<f32> = (0..n).map(|i| (i % 97) as f32).collect();
        let (px, py) = (
            s.alloc(4 * n as u64).unwrap(),
            s.alloc(4 * n as u64).unwrap(),
        );
        s.htod(px, &f32s(&x)).unwrap();
        s.memset(py, 0, 4, n as u64).unwrap();
        // y += x, `len` times, each node after the one before (push_op's default dependency).
        let line = |len: usize| {
            let launch = msg::LaunchKernel {
                ctx,
                stream: 0,
                function: saxpy.handle,
                grid_x: (n as u32).div_ceil(128),
                grid_y: 1,
                grid_z: 1,
                block_x: 128,
                block_y: 1,
                block_z: 1,
                shared_bytes: 0,
            };
            let params = packed(
                &saxpy,
                &[
                    Arg::I32(n as i32),
                    Arg::F32(1.0),
                    Arg::Ptr(px),
                    Arg::Ptr(py),
                ],
            );
            let mut nodes = Vec::new();
            for _ in 0..len {
                push_op(&mut nodes, &launch, &params);
            }
            nodes
        };
        let instantiate = |s: &mut super::Session, nodes: &[u8]| {
            code(
                s.client
                    .call(&msg::GraphInstantiate { ctx, replace: 0 }, nodes),
            )
            .expect("uploading the graph")
            .0
            .handle
        };
        let launch = |s: &mut super::Session, exec: u64| {
            s.client
                .post(
                    &msg::GraphLaunch {
                        ctx,
                        stream: 0,
                        exec,
                    },
                    &[],
                )
                .unwrap();
        };
        let kernels = || {
            rig.broker
                .tenant("a")
                .unwrap()
                .stats
                .kernels
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let mut added = 0usize;
        let check = |s: &mut super::Session, added: usize, what: &str| {
            let want: Vec<f32> = x.iter().map(|v| v * added as f32).collect();
            assert!(s.dtoh(py, 4 * n).unwrap() == f32s(&want), "{what}");
        };

        // A chain of 5 kernels, replayed 3 times: one instantiation, 3 graph launches.
        let exec = instantiate(&mut s, &line(5));
        let (l0, i0, k0) = (d.graph_launches(), d.graph_instantiations(), kernels());
        for _ in 0..3 {
            launch(&mut s, exec);
        }
        s.sync().unwrap();
        added += 15;
        check(&mut s, added, "5 kernels replayed 3 times");
        assert_eq!(
            d.graph_launches() - l0,
            3,
            "one cuGraphLaunch per replay of the chain"
        );
        assert_eq!(
            d.graph_instantiations() - i0,
            1,
            "the executable graph is instantiated once and reused"
        );
        assert_eq!(kernels() - k0, 15, "every kernel of the chains is counted");

        // Longer than the bound: split into chains of at most MAX_GRAPH_CHAIN_KERNELS.
        let long = MAX_GRAPH_CHAIN_KERNELS + 3;
        let exec = instantiate(&mut s, &line(long));
        let (l0, i0) = (d.graph_launches(), d.graph_instantiations());
        for _ in 0..2 {
            launch(&mut s, exec);
        }
        s.sync().unwrap();
        added += 2 * long;
        check(&mut s, added, "a chain longer than the bound");
        assert_eq!(d.graph_launches() - l0, 4, "two chains per replay");
        assert_eq!(
            d.graph_instantiations() - i0,
            2,
            "a graph for each of the two chains, reused by the second replay"
        );

        // A faulting kernel in the middle of a chain: the context's error, as alone.
        let oob = s
            .load(vgpu_corpus::ptx("oob", Arch::Sm52).as_bytes())
            .unwrap();
        let oob = s.kernel(oob, "oob_write").unwrap();
        let buf = s.alloc(1024).unwrap();
        let ok = line(1);
        let mut nodes = ok.clone();
        push_op(
            &mut nodes,
            &msg::LaunchKernel {
                ctx,
                stream: 0,
                function: oob.handle,
                grid_x: 1,
                grid_y: 1,
                grid_z: 1,
                block_x: 64,
                block_y: 1,
                block_z: 1,
                shared_bytes: 0,
            },
            &packed(&oob, &[Arg::Ptr(buf), Arg::I64(1 << 38), Arg::I32(42)]),
        );
        nodes.extend_from_slice(&ok);
        let exec = instantiate(&mut s, &nodes);
        let l0 = d.graph_launches();
        launch(&mut s, exec);
        assert_eq!(s.sync(), Err(cuda::CUDA_ERROR_ILLEGAL_ADDRESS));
        assert_eq!(
            d.graph_launches() - l0,
            1,
            "the three kernels were one graph"
        );
        assert_eq!(
            s.alloc(4096),
            Err(cuda::CUDA_ERROR_ILLEGAL_ADDRESS),
            "the error is sticky"
        );
    }

    /// A kernel the engine runs at a non-zero priority is launched with `cuLaunchKernelEx` and
    /// a `CU_LAUNCH_ATTRIBUTE_PRIORITY` attribute, and computes what it computes at priority 0
    /// (over the shim, a wrong `CUlaunchConfig` layout would give the driver wrong dimensions,
    /// stream or parameters).
    pub fn launches_at_priority(t: &Target) {
        let d = driver_of(t);
        if !d.has_launch_priority() {
            println!("the driver has no cuLaunchKernelEx: launches keep their stream's priority");
            return;
        }
        let dev = open(&d, None);
        let ctx = dev.open_context("priority").unwrap();
        let m = ctx
            .load_module(
                vgpu_corpus::ptx("vector_add", vgpu_corpus::Arch::Sm52).as_bytes(),
                1 << 20,
                &Default::default(),
            )
            .unwrap();
        let n: u32 = 1000;
        let bytes = u64::from(n) * 4;
        let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| 3.0 * i as f32 + 0.25).collect();
        let (pa, pb) = (ctx.alloc(bytes).unwrap(), ctx.alloc(bytes).unwrap());
        ctx.write(pa, &super::f32s(&a)).unwrap();
        ctx.write(pb, &super::f32s(&b)).unwrap();
        let want = super::f32s(&a.iter().zip(&b).map(|(x, y)| x + y).collect::<Vec<_>>());
        let dims = LaunchDims {
            grid: [n.div_ceil(128), 1, 1],
            block: [128, 1, 1],
            shared_bytes: 0,
            cooperative: false,
            units: None,
        };
        for priority in [0, -3, -5] {
            let pc = ctx.alloc(bytes).unwrap();
            let mut params = Vec::new();
            for p in [pa, pb, pc] {
                params.extend_from_slice(&p.to_le_bytes());
            }
            params.extend_from_slice(&n.to_le_bytes());
            let before = d.priority_launches();
            vgpu_broker::device::with_lane_at(7, priority, || {
                ctx.launch(m.as_ref(), 0, &dims, &params, 0, &RunControl::default())
            })
            .unwrap_or_else(|e| panic!("launch at priority {priority}: {e}"));
            let mut c = vec![0u8; bytes as usize];
            ctx.read(pc, &mut c).unwrap();
            assert!(
                c == want,
                "vector_add at priority {priority} computed a wrong result"
            );
            assert_eq!(
                d.priority_launches() - before,
                u64::from(priority != 0),
                "priority {priority}: cuLaunchKernelEx is used exactly for non-zero priorities"
            );
            ctx.free(pc).unwrap();
        }
        ctx.free(pa).unwrap();
        ctx.free(pb).unwrap();
    }

    /// Pinned host memory is mapped into every context of the process: after each copy, in
    /// either direction and scattered or not, the staging buffers keep none of the VM's bytes.
    pub fn clears_staging_buffers(t: &Target) {
        let dev = open(&driver_of(t), None);
        let ctx = dev.open_context("staging").unwrap();
        let len = 5 * (1 << 20) + 123;
        let data: Vec<u8> = pattern(len, 0x57a6).iter().map(|b| b | 1).collect();
        let p = ctx.alloc(len as u64).unwrap();
        ctx.write(p, &data).unwrap();
        assert_eq!(ctx.staging_bytes_at_rest(), 0, "after a write");
        let mut back = vec![0u8; len];
        ctx.read(p, &mut back).unwrap();
        assert!(back == data);
        assert_eq!(ctx.staging_bytes_at_rest(), 0, "after a read");
        let pieces: Vec<&[u8]> = data.chunks(4096).collect();
        ctx.write_gathered(p, &pieces).unwrap();
        let mut out: Vec<&mut [u8]> = back.chunks_mut(65536).collect();
        ctx.read_scattered(p, &mut out).unwrap();
        assert_eq!(
            ctx.staging_bytes_at_rest(),
            0,
            "after scatter-gather copies"
        );
        // A small copy too (it uses part of one half).
        ctx.write(p, &data[..100]).unwrap();
        assert_eq!(ctx.staging_bytes_at_rest(), 0, "after a small write");
        ctx.free(p).unwrap();
    }

    /// An NVRTC cubin for sm_90 (`devices/cuda/testdata/layouts.cu`).
    pub const LAYOUTS_CUBIN: &[u8] =
        include_bytes!("../../devices/cuda/testdata/layouts.sm_90.cubin");

    /// By index and by `GPU-…` UUID (as nvidia-smi -L prints it) the same
    /// GPU opens; unknown ones are refused with the list of what exists.
    pub fn selects_devices(t: &Target) {
        let d = driver_of(t);
        let by_index = open(&d, None);
        let uuid = format_uuid(
            GPU_PREFIX,
            &vgpu_broker::device::Device::info(&*by_index).uuid,
        );
        let sel = vgpu_cuda::select::parse_uuid(&uuid).unwrap();
        let by_uuid =
            CudaDevice::with_driver(Arc::clone(&d), &sel, CudaOptions::default()).unwrap();
        let (a, b) = (
            vgpu_broker::device::Device::info(&*by_index),
            vgpu_broker::device::Device::info(&*by_uuid),
        );
        assert_eq!(
            (a.uuid, &a.name, a.total_memory),
            (b.uuid, &b.name, b.total_memory)
        );
        let mut other = a.uuid;
        other[0] ^= 0xff;
        let e = CudaDevice::with_driver(
            Arc::clone(&d),
            &Selector::Gpu(other),
            CudaOptions::default(),
        )
        .unwrap_err();
        assert!(matches!(e, CudaError::NoSuchUuid { .. }), "{e}");
        assert!(e.to_string().contains(&uuid[4..]), "lists what exists: {e}");
        let e = CudaDevice::with_driver(
            Arc::clone(&d),
            &Selector::Index(4096),
            CudaOptions::default(),
        )
        .unwrap_err();
        assert!(matches!(e, CudaError::NoSuchIndex { .. }), "{e}");
    }

    fn spin_params(ns: u64, out: u64) -> Vec<u8> {
        let mut p = ns.to_le_bytes().to_vec();
        p.extend_from_slice(&out.to_le_bytes());
        p
    }

    const ONE: LaunchDims = LaunchDims {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_bytes: 0,
        cooperative: false,
        units: None,
    };

    /// Kernel time comes from CUDA events: a 50 ms kernel measures 50 ms.
    pub fn measures_kernel_time(t: &Target) {
        let dev = open(&driver_of(t), None);
        let ctx = dev.open_context("timing").unwrap();
        let m = ctx
            .load_module(SPIN_PTX.as_bytes(), 1 << 20, &Default::default())
            .unwrap();
        let k = &m.kernels()[0];
        assert_eq!(k.name, "spin");
        assert_eq!(
            (k.param_offsets.clone(), k.param_sizes.clone()),
            (vec![0, 8], vec![8, 8])
        );
        let out = ctx.alloc(8).unwrap();
        let t0 = Instant::now();
        ctx.launch(
            m.as_ref(),
            0,
            &ONE,
            &spin_params(50_000_000, out),
            0,
            &RunControl::default(),
        )
        .unwrap();
        let wall = t0.elapsed();
        let mut spun = [0u8; 8];
        ctx.read(out, &mut spun).unwrap();
        let spun = Duration::from_nanos(u64::from_le_bytes(spun));
        let times = ctx.kernel_times();
        assert_eq!(times.count(), 1);
        let measured = times.last();
        println!("kernel time: spun {spun:?}, events {measured:?}, wall {wall:?}");
        assert!(spun >= Duration::from_millis(50), "{spun:?}");
        assert!(
            measured >= Duration::from_millis(45) && measured <= wall + Duration::from_millis(5),
            "events measured {measured:?} for a kernel that spun {spun:?} in {wall:?}"
        );
    }

    /// A sticky error breaks only this VM's context; once its users are gone
    /// the next call gets a fresh context.
    pub fn recreates_broken_contexts(t: &Target) {
        let dev = open(&driver_of(t), None);
        let a = dev.open_context("a").unwrap();
        let b = dev.open_context("b").unwrap();
        let pb = b.alloc(4096).unwrap();
        let data = pattern(4096, 3);
        b.write(pb, &data).unwrap();
        let m = a
            .load_module(
                vgpu_corpus::ptx("oob", vgpu_corpus::Arch::Sm52).as_bytes(),
                1 << 20,
                &Default::default(),
            )
            .unwrap();
        let buf = a.alloc(1024).unwrap();
        let mut params = buf.to_le_bytes().to_vec();
        params.extend_from_slice(&(1i64 << 38).to_le_bytes());
        params.extend_from_slice(&42i32.to_le_bytes());
        let dims = LaunchDims {
            grid: [1, 1, 1],
            block: [64, 1, 1],
            shared_bytes: 0,
            cooperative: false,
            units: None,
        };
        let e = a
            .launch(m.as_ref(), 0, &dims, &params, 0, &RunControl::default())
            .unwrap_err();
        assert_eq!(e.cu_result(), cuda::CUDA_ERROR_ILLEGAL_ADDRESS, "{e}");
        assert!(a.broken().is_some());
        assert_eq!(a.alloc(64).unwrap_err().cu_result(), 700, "sticky");
        assert!(b.broken().is_none(), "the other VM is untouched");
        let mut back = vec![0u8; 4096];
        b.read(pb, &mut back).unwrap();
        assert!(back == data);
        assert_eq!(a.generations(), 1);
        // The processes end: their memory and modules are released.
        drop(m);
        a.free(buf).unwrap();
        let p = a.alloc(64).expect("a fresh context");
        assert_eq!(a.generations(), 2);
        assert!(a.broken().is_none());
        a.write(p, b"fresh").unwrap();
        let mut back = [0u8; 5];
        a.read(p, &mut back).unwrap();
        assert_eq!(&back, b"fresh");
    }

    /// A PTX the JIT refuses fails with `CUDA_ERROR_INVALID_PTX` and the JIT's log.
    pub fn reports_jit_errors(t: &Target) {
        let dev = open(&driver_of(t), None);
        let ctx = dev.open_context("jit").unwrap();
        let bad = ".version 7.0\n.target sm_52\n.address_size 64\n\
                   .visible .entry k(.param .u64 p)\n{\n\tret;\n"; // the body is never closed
        match ctx.load_module(bad.as_bytes(), 1 << 20, &Default::default()) {
            Err(DeviceError::InvalidImage { code, message }) => {
                assert_eq!(code, cuda::CUDA_ERROR_INVALID_PTX, "{message}");
                let prefix =
                    "cuModuleLoadDataEx refused the module image with CUDA_ERROR_INVALID_PTX: ";
                assert!(
                    message.starts_with(prefix) && message.len() > prefix.len() + 5,
                    "the JIT log is in the message: {message}"
                );
                println!("JIT error: {message}");
            }
            Err(e) => panic!("wrong error: {e:?}"),
            Ok(_) => panic!("bogus PTX was accepted"),
        }
        assert!(ctx.broken().is_none(), "a refused image breaks nothing");
    }

    /// Module globals are found with their device addresses, counted in the
    /// device's memory, and refused past the budget without leaking.
    pub fn charges_module_globals(t: &Target) {
        let dev = open(&driver_of(t), None);
        let ctx = dev.open_context("globals").unwrap();
        let used = vgpu_broker::device::Device::memory_used(&*dev);
        assert!(matches!(
            ctx.load_module(BIG_GLOBAL_PTX.as_bytes(), 1 << 20, &Default::default()),
            Err(DeviceError::OutOfMemory)
        ));
        assert_eq!(vgpu_broker::device::Device::memory_used(&*dev), used);
        let m = ctx
            .load_module(BIG_GLOBAL_PTX.as_bytes(), 64 << 20, &Default::default())
            .unwrap();
        let g = &m.globals()[0];
        assert_eq!(
            (g.name.as_str(), g.size),
            ("big_table", super::BIG_GLOBAL_BYTES)
        );
        assert_eq!(m.global_bytes(), super::BIG_GLOBAL_BYTES);
        assert_eq!(
            vgpu_broker::device::Device::memory_used(&*dev),
            used + super::BIG_GLOBAL_BYTES
        );
        ctx.write(g.addr + 100, b"abc").unwrap();
        let mut back = [0u8; 3];
        ctx.read(g.addr + 100, &mut back).unwrap();
        assert_eq!(&back, b"abc");
        assert!(
            ctx.write(g.addr + g.size - 1, b"xy").is_err(),
            "past the global"
        );
        drop(m);
        assert_eq!(vgpu_broker::device::Device::memory_used(&*dev), used);
    }

    /// Median of some durations.
    fn median(mut v: Vec<Duration>) -> Duration {
        v.sort();
        v[v.len() / 2]
    }

    /// Waits for an event by polling it.
    fn wait(d: &Driver, ev: vgpu_cuda::driver::Event) {
        while !d.event_query(ev).expect("cuEventQuery") {
            std::hint::spin_loop();
        }
    }

    /// Benchmark (prints, asserts nothing): host↔device bandwidth of a VM
    /// context's staged copies (guest data → pinned staging → GPU) against
    /// the driver's own copies from a pinned buffer, measured in the same
    /// run on the same GPU. Medians of several repetitions.
    pub fn copy_bandwidth(driver: &Arc<Driver>, size_mib: usize) -> String {
        const REPS: usize = 7;
        let size = size_mib << 20;
        let dev = open(driver, None);
        let ctx = dev.open_context("bench").unwrap();
        let p = ctx.alloc(size as u64).unwrap();
        let host = pattern(size, 1);
        let mut back = vec![0u8; size];
        let (mut w, mut r) = (Vec::new(), Vec::new());
        for _ in 0..REPS {
            let t = Instant::now();
            ctx.write(p, &host).unwrap();
            w.push(t.elapsed());
            let t = Instant::now();
            ctx.read(p, &mut back).unwrap();
            r.push(t.elapsed());
        }
        assert!(back == host, "the benchmark's data round-tripped");
        // Baseline: one DMA from/to a pinned buffer in a context of its own.
        let d = driver.as_ref();
        let ordinal = d.device(0).unwrap();
        let c = d.ctx_create(ordinal).unwrap();
        let q = d.mem_alloc(size as u64).unwrap();
        let pinned = d.mem_host_alloc(size, 0).unwrap();
        let s = d.stream_create(1).unwrap();
        let ev = d.event_create(0).unwrap();
        // SAFETY: `pinned` holds `size` bytes and nothing else uses it.
        unsafe { std::ptr::copy_nonoverlapping(host.as_ptr(), pinned.as_ptr(), size) };
        let (mut bw, mut br) = (Vec::new(), Vec::new());
        for _ in 0..REPS {
            let t = Instant::now();
            // SAFETY: `pinned` stays valid and untouched until the event completes.
            unsafe { d.memcpy_htod_async(q, pinned.as_ptr(), size, s) }.unwrap();
            d.event_record(ev, s).unwrap();
            wait(d, ev);
            bw.push(t.elapsed());
            let t = Instant::now();
            // SAFETY: as above.
            unsafe { d.memcpy_dtoh_async(pinned.as_ptr(), q, size, s) }.unwrap();
            d.event_record(ev, s).unwrap();
            wait(d, ev);
            br.push(t.elapsed());
        }
        let _ = d.event_destroy(ev);
        let _ = d.stream_destroy(s);
        let _ = d.mem_free_host(pinned);
        let _ = d.mem_free(q);
        let _ = d.ctx_pop();
        let _ = d.ctx_destroy(c);
        let gbs = |t: Duration| size as f64 / t.as_secs_f64() / 1e9;
        let (w, r, bw, br) = (median(w), median(r), median(bw), median(br));
        format!(
            "copy bandwidth, {} MiB, median of {REPS}: host->device staged {:.1} GB/s vs pinned baseline {:.1} GB/s (ratio {:.2}); device->host staged {:.1} GB/s vs pinned baseline {:.1} GB/s (ratio {:.2})",
            size_mib,
            gbs(w),
            gbs(bw),
            bw.as_secs_f64() / w.as_secs_f64(),
            gbs(r),
            gbs(br),
            br.as_secs_f64() / r.as_secs_f64()
        )
    }

    /// A cubin loads on a GPU of its architecture (sm_90) and is refused with
    /// `CUDA_ERROR_NO_BINARY_FOR_GPU` elsewhere. Its kernels' parameter
    /// layouts agree with what the executor reads from the ELF image, its
    /// module variables (local symbols) are found with real addresses, and a
    /// kernel reading them computes the right result.
    pub fn loads_cubins(t: &Target) {
        use vgpu_proto::cuda::attr;
        let dev = open(&driver_of(t), None);
        let info = vgpu_broker::device::Device::info(&*dev);
        let cc = (
            info.attribute(attr::COMPUTE_CAPABILITY_MAJOR),
            info.attribute(attr::COMPUTE_CAPABILITY_MINOR),
        );
        let ctx = dev.open_context("cubin").unwrap();
        let r = ctx.load_module(LAYOUTS_CUBIN, 1 << 20, &Default::default());
        if cc != (9, 0) {
            let e = r.err().expect("an sm_90 cubin on another architecture");
            assert!(
                matches!(
                    e.cu_result(),
                    cuda::CUDA_ERROR_NO_BINARY_FOR_GPU | cuda::CUDA_ERROR_INVALID_IMAGE
                ),
                "{e}"
            );
            println!("cubin: refused on compute capability {cc:?} as expected: {e}");
            return;
        }
        let m = r.unwrap();
        let declared = vgpu_cuda::image::prepare(LAYOUTS_CUBIN).unwrap().decls;
        let mut want: Vec<(String, Vec<u32>, Vec<u32>)> = declared
            .entries
            .iter()
            .map(|e| {
                (
                    e.name.clone(),
                    e.params.iter().map(|p| p.offset).collect(),
                    e.params.iter().map(|p| p.size).collect(),
                )
            })
            .collect();
        let mut got: Vec<(String, Vec<u32>, Vec<u32>)> = m
            .kernels()
            .iter()
            .map(|k| {
                (
                    k.name.clone(),
                    k.param_offsets.clone(),
                    k.param_sizes.clone(),
                )
            })
            .collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "the driver's layouts against the ELF's");
        let mut globals: Vec<(&str, u64)> = m
            .globals()
            .iter()
            .map(|g| (g.name.as_str(), g.size))
            .collect();
        globals.sort();
        assert_eq!(
            globals,
            [
                ("c_bytes", 3),
                ("c_coeffs", 64),
                ("d_counter", 4),
                ("d_table", 400)
            ]
        );
        let table = m.globals().iter().find(|g| g.name == "d_table").unwrap();
        let values: Vec<f32> = (0..100).map(|i| i as f32 * 1.5).collect();
        ctx.write(table.addr, &super::f32s(&values)).unwrap();
        let n = 300usize;
        let out = ctx.alloc((n * 4) as u64).unwrap();
        let (i, k) = m
            .kernels()
            .iter()
            .enumerate()
            .find(|(_, k)| k.name == "use_tables")
            .unwrap();
        let mut params = vec![0u8; (k.param_offsets[1] + k.param_sizes[1]) as usize];
        params[..8].copy_from_slice(&out.to_le_bytes());
        let at = k.param_offsets[1] as usize;
        params[at..at + 4].copy_from_slice(&(n as i32).to_le_bytes());
        let dims = LaunchDims {
            grid: [3, 1, 1],
            block: [128, 1, 1],
            shared_bytes: 0,
            cooperative: false,
            units: None,
        };
        ctx.launch(m.as_ref(), i, &dims, &params, 0, &RunControl::default())
            .unwrap();
        let mut back = vec![0u8; n * 4];
        ctx.read(out, &mut back).unwrap();
        let want: Vec<f32> = (0..n)
            .map(|i| values[i % 100] + [1.0, 2.0, 3.0][i % 3])
            .collect();
        assert!(
            back == super::f32s(&want),
            "use_tables read the module variables"
        );
    }
}

/// A one-thread launch of `k` in context `ctx` on the default stream (as graph nodes carry it).
pub(crate) fn one_thread(ctx: u64, k: &Kernel) -> msg::LaunchKernel {
    msg::LaunchKernel {
        ctx,
        stream: 0,
        function: k.handle,
        grid_x: 1,
        grid_y: 1,
        grid_z: 1,
        block_x: 1,
        block_y: 1,
        block_z: 1,
        shared_bytes: 0,
    }
}

/// A kernel's packed parameter buffer.
pub(crate) fn packed(k: &Kernel, args: &[Arg]) -> Vec<u8> {
    let size = k
        .offsets
        .iter()
        .zip(&k.sizes)
        .map(|(o, s)| (o + s) as usize)
        .max()
        .unwrap_or(0);
    let mut buf = vec![0u8; size];
    for (a, &off) in args.iter().zip(&k.offsets) {
        let b = a.to_le_bytes();
        buf[off as usize..off as usize + b.len()].copy_from_slice(&b);
    }
    buf
}

/// Executable graphs (issue 16): the nodes are uploaded once, in a topological order; each
/// launch is one request that replays them through the ordinary per-operation paths. Forged and
/// hostile node lists are refused; graph allocations are charged to the slice while mapped.
pub fn graphs_replay_as_one_request(t: &Target) {
    use vgpu_proto::graph::{MEM_ALLOC_NODE, MEM_FREE_NODE, push_node, push_op};
    let rig = Rig::new((t.make)(None), &[("a", 16 * MIB, 1), ("b", 16 * MIB, 1)]);
    let mut s = rig.session("a");
    let mut other = rig.session("b");
    let ctx = s.ctx;
    let k = vector_add(&mut s);
    let n = 1024usize;
    let bytes = (n * 4) as u64;
    let (pa, pb, pc) = (
        s.alloc(bytes).unwrap(),
        s.alloc(bytes).unwrap(),
        s.alloc(bytes).unwrap(),
    );
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 2.0 * i as f32 + 0.5).collect();
    s.htod(pa, &f32s(&a)).unwrap();
    s.htod(pb, &f32s(&b)).unwrap();
    // c = 0; c = a + b; a = c: each launch adds b to a.
    let launch = msg::LaunchKernel {
        ctx,
        stream: 0,
        function: k.handle,
        grid_x: (n as u32).div_ceil(128),
        grid_y: 1,
        grid_z: 1,
        block_x: 128,
        block_y: 1,
        block_z: 1,
        shared_bytes: 0,
    };
    let params = packed(
        &k,
        &[Arg::Ptr(pa), Arg::Ptr(pb), Arg::Ptr(pc), Arg::I32(n as i32)],
    );
    let mut nodes = Vec::new();
    let memset = msg::Memset {
        ctx,
        stream: 0,
        dst: pc,
        value: 0,
        elem_size: 4,
        count: n as u64,
    };
    push_op(&mut nodes, &memset, &[]);
    push_op(&mut nodes, &launch, &params);
    let copy = msg::MemcpyDtoD {
        ctx,
        stream: 0,
        dst: pa,
        src: pc,
        len: bytes,
    };
    push_op(&mut nodes, &copy, &[]);
    let instantiate = |s: &mut Session, replace: u64, list: &[u8]| {
        let ctx = s.ctx;
        code(s.client.call(&msg::GraphInstantiate { ctx, replace }, list)).map(|r| r.0.handle)
    };
    let exec = instantiate(&mut s, 0, &nodes).unwrap();
    for _ in 0..3 {
        s.client
            .post(
                &msg::GraphLaunch {
                    ctx,
                    stream: 0,
                    exec,
                },
                &[],
            )
            .unwrap();
    }
    s.sync().unwrap();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + 3.0 * y).collect();
    assert!(s.dtoh(pa, n * 4).unwrap() == f32s(&want), "3 replays");

    // Forged and hostile node lists.
    let refused = |s: &mut Session, list: &[u8], what: &str| {
        assert_eq!(
            instantiate(s, 0, list),
            Err(cuda::CUDA_ERROR_INVALID_VALUE),
            "{what}"
        );
    };
    let mut nested = Vec::new();
    push_op(
        &mut nested,
        &msg::GraphLaunch {
            ctx,
            stream: 0,
            exec,
        },
        &[],
    );
    refused(&mut s, &nested, "a graph launch inside a graph");
    let mut alloc_op = Vec::new();
    push_op(&mut alloc_op, &msg::MemAlloc { ctx, size: 4096 }, &[]);
    refused(&mut s, &alloc_op, "an allocation request as a node");
    refused(&mut s, &nodes[..nodes.len() - 3], "a truncated node list");
    let foreign = other.alloc(4096).unwrap();
    let mut theirs = Vec::new();
    push_op(
        &mut theirs,
        &msg::Memset {
            dst: foreign,
            ..memset.clone()
        },
        &[],
    );
    refused(&mut s, &theirs, "another VM's pointer");
    let mut short = Vec::new();
    push_op(&mut short, &launch, &params[..4]);
    refused(&mut s, &short, "parameters of the wrong size");
    let mut odd = Vec::new();
    push_op(
        &mut odd,
        &msg::Memset {
            elem_size: 3,
            ..memset.clone()
        },
        &[],
    );
    refused(&mut s, &odd, "a memset of 3-byte elements");
    let mut many = Vec::new();
    for _ in 0..=vgpu_proto::graph::MAX_GRAPH_NODES {
        push_op(&mut many, &msg::EventRecord::default(), &[]);
    }
    refused(&mut s, &many, "too many nodes");
    // Handles are per session: a forged value or a destroyed graph's handle names nothing.
    let stale = instantiate(&mut s, 0, &[]).unwrap();
    s.request(&msg::GraphExecDestroy { ctx, exec: stale })
        .unwrap();
    for (bad, what) in [
        (stale, "a destroyed graph"),
        (0x6702_dead_beef, "a forged handle"),
    ] {
        assert_eq!(
            instantiate(&mut s, bad, &nodes),
            Err(cuda::CUDA_ERROR_INVALID_VALUE),
            "replacing {what}"
        );
        assert_eq!(
            s.request(&msg::GraphLaunch {
                ctx,
                stream: 0,
                exec: bad
            }),
            Err(cuda::CUDA_ERROR_INVALID_VALUE),
            "launching {what}"
        );
    }
    // A node's pointer is checked again at every launch.
    s.free(pc).unwrap();
    assert_eq!(
        s.request(&msg::GraphLaunch {
            ctx,
            stream: 0,
            exec
        }),
        Err(cuda::CUDA_ERROR_INVALID_VALUE),
        "a launch after the memory was freed"
    );
    s.request(&msg::GraphExecDestroy { ctx, exec }).unwrap();

    // Graph allocations: charged while mapped, refused past the slice.
    let g = vgpu_broker::device::VMM_GRANULARITY;
    let (free0, _) = s.mem_info().unwrap();
    let va = s
        .request(&msg::MemAddressReserve {
            ctx,
            size: 16 * MIB,
            align: 0,
        })
        .unwrap()
        .ptr;
    let mut mem = Vec::new();
    push_node(
        &mut mem,
        MEM_ALLOC_NODE,
        &msg::GraphMemAllocNode { ptr: va, size: g },
        &[],
    );
    push_op(
        &mut mem,
        &msg::Memset {
            dst: va,
            value: 7,
            count: g / 4,
            ..memset.clone()
        },
        &[],
    );
    push_op(
        &mut mem,
        &msg::MemcpyDtoD {
            ctx,
            stream: 0,
            dst: pb,
            src: va + g - bytes,
            len: bytes,
        },
        &[],
    );
    let alloc_only = mem.clone();
    push_node(
        &mut mem,
        MEM_FREE_NODE,
        &msg::GraphMemFreeNode { ptr: va },
        &[],
    );
    let exec = instantiate(&mut s, 0, &mem).unwrap();
    if let Some(why) = cuda_executor::vmm_refusal(t) {
        // Graph memory is cuMemCreate memory: refused where the real-GPU executor's isolation
        // probe did not prove VMM mappings private to their VM, and nothing stays charged.
        assert_eq!(
            s.request(&msg::GraphLaunch {
                ctx,
                stream: 0,
                exec
            }),
            Err(cuda::CUDA_ERROR_NOT_SUPPORTED),
            "graph memory where VMM isolation is not proven"
        );
        assert_eq!(s.mem_info().unwrap().0, free0, "a refused graph allocation");
        println!("conformance [{}]: graph memory is off here: {why}", t.name);
        s.close();
        other.close();
        assert_eq!(rig.broker.tenant("a").unwrap().slice.used(), 0);
        return;
    }
    for _ in 0..2 {
        s.request(&msg::GraphLaunch {
            ctx,
            stream: 0,
            exec,
        })
        .unwrap();
    }
    assert_eq!(s.dtoh(pb, 4).unwrap(), 7u32.to_le_bytes(), "graph memory");
    assert_eq!(s.mem_info().unwrap().0, free0, "freed inside the graph");
    let exec2 = instantiate(&mut s, 0, &alloc_only).unwrap();
    s.request(&msg::GraphLaunch {
        ctx,
        stream: 0,
        exec: exec2,
    })
    .unwrap();
    assert_eq!(s.mem_info().unwrap().0, free0 - g, "charged while mapped");
    assert_eq!(
        s.request(&msg::GraphLaunch {
            ctx,
            stream: 0,
            exec: exec2
        }),
        Err(cuda::CUDA_ERROR_INVALID_VALUE),
        "relaunch before the free"
    );
    s.request(&msg::MemUnmap { ptr: va, size: g }).unwrap();
    assert_eq!(s.mem_info().unwrap().0, free0);
    let mut huge = Vec::new();
    push_node(
        &mut huge,
        MEM_ALLOC_NODE,
        &msg::GraphMemAllocNode {
            ptr: va,
            size: 16 * MIB,
        },
        &[],
    );
    let exec3 = instantiate(&mut s, 0, &huge).unwrap();
    assert_eq!(
        s.request(&msg::GraphLaunch {
            ctx,
            stream: 0,
            exec: exec3
        }),
        Err(cuda::CUDA_ERROR_OUT_OF_MEMORY),
        "past the slice"
    );
    assert_eq!(s.mem_info().unwrap().0, free0);
    s.close();
    other.close();
    assert_eq!(rig.broker.tenant("a").unwrap().slice.used(), 0);
}
