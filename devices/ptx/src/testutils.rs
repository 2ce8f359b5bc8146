//! Test and benchmark helpers: a simple tenant memory, parameter packing and one-call launches.
//! Used by this crate's tests and benchmark; other crates may use them in their tests too. Being
//! test helpers, they panic on misuse (unknown kernel, unowned address) instead of returning
//! errors; nothing in the interpreter itself calls them.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::texture::{Layout, SurfaceView, TextureView};
use crate::{
    Buffer, Fault, GLOBAL_BASE, GlobalMemory, KernelInfo, Launch, LaunchControl, Module, Progress,
};

/// Gap left between test allocations so that small overruns hit unowned addresses.
const GUARD_GAP: u64 = 4096;

/// A plain-old-data element that can be stored in device memory.
pub trait Elem: Copy {
    /// Size in bytes.
    const SIZE: usize;
    /// Appends the little-endian bytes.
    fn put(self, out: &mut Vec<u8>);
    /// Reads from exactly `SIZE` little-endian bytes.
    fn get(b: &[u8]) -> Self;
}

macro_rules! elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(&b[..std::mem::size_of::<$t>()]);
                <$t>::from_le_bytes(a)
            }
        }
    )*};
}
elem!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

/// Converts elements to bytes.
pub fn to_bytes<T: Elem>(data: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() * T::SIZE);
    for &x in data {
        x.put(&mut out);
    }
    out
}

/// Converts bytes to elements.
pub fn from_bytes<T: Elem>(b: &[u8]) -> Vec<T> {
    b.chunks_exact(T::SIZE).map(T::get).collect()
}

/// A tenant's device memory for tests: allocations at increasing addresses from
/// [`GLOBAL_BASE`], separated by unowned guard gaps, and texture and surface objects registered
/// by handle.
#[derive(Debug)]
pub struct TestMemory {
    allocs: RwLock<BTreeMap<u64, Arc<Buffer>>>,
    next: AtomicU64,
    textures: RwLock<HashMap<u64, TextureView>>,
    levels: RwLock<HashMap<u64, Vec<Layout>>>,
    surfaces: RwLock<HashMap<u64, SurfaceView>>,
}

impl Default for TestMemory {
    fn default() -> Self {
        TestMemory::new()
    }
}

impl TestMemory {
    /// An empty memory.
    pub fn new() -> TestMemory {
        TestMemory {
            allocs: RwLock::new(BTreeMap::new()),
            next: AtomicU64::new(GLOBAL_BASE),
            textures: RwLock::new(HashMap::new()),
            levels: RwLock::new(HashMap::new()),
            surfaces: RwLock::new(HashMap::new()),
        }
    }

    /// Makes `handle` name the texture object `view` (replacing what it named).
    pub fn add_texture(&self, handle: u64, view: TextureView) {
        self.textures
            .write()
            .expect("test memory lock")
            .insert(handle, view);
    }

    /// Gives mipmapped texture `handle` its levels past the first (level 1 first).
    pub fn add_texture_levels(&self, handle: u64, levels: Vec<Layout>) {
        self.levels
            .write()
            .expect("test memory lock")
            .insert(handle, levels);
    }

    /// Makes `handle` name the surface object `view` (replacing what it named).
    pub fn add_surface(&self, handle: u64, view: SurfaceView) {
        self.surfaces
            .write()
            .expect("test memory lock")
            .insert(handle, view);
    }

    /// Allocates `len` zeroed bytes and returns the device address.
    pub fn alloc(&self, len: usize) -> u64 {
        let span = (len as u64).div_ceil(256) * 256 + GUARD_GAP;
        let addr = self.next.fetch_add(span, Ordering::SeqCst);
        let buf = Arc::new(Buffer::new_zeroed(len).expect("test allocation"));
        self.allocs
            .write()
            .expect("test memory lock")
            .insert(addr, buf);
        addr
    }

    /// Allocates and fills with `data`.
    pub fn alloc_from<T: Elem>(&self, data: &[T]) -> u64 {
        let a = self.alloc(data.len() * T::SIZE);
        self.write(a, data);
        a
    }

    /// Frees an allocation.
    pub fn free(&self, addr: u64) {
        self.allocs.write().expect("test memory lock").remove(&addr);
    }

    /// Writes elements at a device address.
    pub fn write<T: Elem>(&self, addr: u64, data: &[T]) {
        let (base, buf) = self.lookup(addr).expect("write to unowned address");
        buf.write((addr - base) as usize, &to_bytes(data))
            .expect("write in range");
    }

    /// Reads `n` elements from a device address.
    pub fn read<T: Elem>(&self, addr: u64, n: usize) -> Vec<T> {
        let (base, buf) = self.lookup(addr).expect("read from unowned address");
        let mut b = vec![0u8; n * T::SIZE];
        buf.read((addr - base) as usize, &mut b)
            .expect("read in range");
        from_bytes(&b)
    }
}

impl GlobalMemory for TestMemory {
    fn lookup(&self, addr: u64) -> Option<(u64, Arc<Buffer>)> {
        let g = self.allocs.read().ok()?;
        let (base, buf) = g.range(..=addr).next_back()?;
        if addr - base < buf.len() as u64 {
            Some((*base, buf.clone()))
        } else {
            None
        }
    }

    fn texture(&self, handle: u64) -> Option<TextureView> {
        self.textures.read().ok()?.get(&handle).copied()
    }

    fn texture_level(&self, handle: u64, level: u32) -> Option<Layout> {
        let i = usize::try_from(level).ok()?.checked_sub(1)?;
        self.levels.read().ok()?.get(&handle)?.get(i).copied()
    }

    fn surface(&self, handle: u64) -> Option<SurfaceView> {
        self.surfaces.read().ok()?.get(&handle).copied()
    }
}

/// A kernel argument.
#[derive(Debug, Clone)]
pub enum Arg {
    /// 32-bit unsigned.
    U32(u32),
    /// 32-bit signed.
    I32(i32),
    /// 64-bit (pointers too).
    U64(u64),
    /// 64-bit signed.
    I64(i64),
    /// Single precision.
    F32(f32),
    /// Double precision.
    F64(f64),
    /// Raw bytes (structs by value).
    Bytes(Vec<u8>),
}

/// Packs arguments at the offsets the kernel declares.
pub fn pack_params(info: &KernelInfo, args: &[Arg]) -> Vec<u8> {
    assert_eq!(
        args.len(),
        info.params.len(),
        "argument count of `{}`",
        info.name
    );
    let mut out = vec![0u8; info.param_bytes];
    for (a, p) in args.iter().zip(&info.params) {
        let b = match a {
            Arg::U32(v) => v.to_le_bytes().to_vec(),
            Arg::I32(v) => v.to_le_bytes().to_vec(),
            Arg::U64(v) => v.to_le_bytes().to_vec(),
            Arg::I64(v) => v.to_le_bytes().to_vec(),
            Arg::F32(v) => v.to_le_bytes().to_vec(),
            Arg::F64(v) => v.to_le_bytes().to_vec(),
            Arg::Bytes(v) => v.clone(),
        };
        assert_eq!(b.len(), p.size, "size of argument for `{}`", info.name);
        out[p.offset..p.offset + p.size].copy_from_slice(&b);
    }
    out
}

/// Allocates and initialises the module's globals; returns their addresses in module order.
pub fn alloc_globals(module: &Module, mem: &TestMemory) -> Vec<u64> {
    let addrs: Vec<u64> = module
        .globals()
        .iter()
        .map(|g| mem.alloc(g.size.max(1)))
        .collect();
    for (g, &a) in module.globals().iter().zip(&addrs) {
        let image = g.image(&addrs);
        if !image.is_empty() {
            mem.write(a, &image);
        }
    }
    addrs
}

/// Geometry and options of a test launch.
#[derive(Debug, Clone)]
pub struct Config {
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared bytes.
    pub dynamic_shared: u32,
    /// Worker threads.
    pub workers: usize,
}

impl Config {
    /// A 1-D launch on one worker.
    pub fn linear(grid: u32, block: u32) -> Config {
        Config {
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            dynamic_shared: 0,
            workers: 1,
        }
    }
}

/// Launches `kernel` to completion (following yields) with the module's globals allocated in
/// `mem` (pass the addresses from [`alloc_globals`]).
pub fn run(
    module: &Module,
    kernel: &str,
    cfg: &Config,
    args: &[Arg],
    mem: &TestMemory,
    globals: &[u64],
) -> Result<Progress, Fault> {
    run_controlled(
        module,
        kernel,
        cfg,
        args,
        mem,
        globals,
        &LaunchControl::new(),
    )
}

/// Loads `ptx`, runs its kernel `k(.param .u64 out)` in one block of `threads` threads and
/// returns the first `words` 32-bit words of `out` (zeroed before).
pub fn run_out_kernel(ptx: &str, threads: u32, words: usize) -> Vec<u32> {
    try_run_out_kernel(ptx, threads, words).unwrap_or_else(|f| panic!("{f}"))
}

/// [`run_out_kernel`], the launch's fault returned.
pub fn try_run_out_kernel(ptx: &str, threads: u32, words: usize) -> Result<Vec<u32>, Fault> {
    let m = Module::load(ptx).unwrap_or_else(|e| panic!("{e}"));
    let mem = TestMemory::new();
    let out = mem.alloc(4 * words);
    run(
        &m,
        "k",
        &Config::linear(1, threads),
        &[Arg::U64(out)],
        &mem,
        &alloc_globals(&m, &mem),
    )?;
    Ok(mem.read(out, words))
}

/// [`run`] under `control` (a heap, device-side launches, output, a deadline).
pub fn run_controlled(
    module: &Module,
    kernel: &str,
    cfg: &Config,
    args: &[Arg],
    mem: &TestMemory,
    globals: &[u64],
    control: &LaunchControl,
) -> Result<Progress, Fault> {
    let info = module
        .kernel(kernel)
        .unwrap_or_else(|| panic!("no kernel `{kernel}`"));
    let params = pack_params(info, args);
    module.launch(&Launch {
        kernel,
        grid: cfg.grid,
        block: cfg.block,
        dynamic_shared: cfg.dynamic_shared,
        params: &params,
        globals,
        memory: mem,
        start_block: 0,
        workers: cfg.workers,
        control,
    })
}

/// Reads a PTX fixture `devices/ptx/fixtures/NAME.ARCH.ptx`.
pub fn fixture(name: &str, arch: &str) -> String {
    let path = format!("{}/fixtures/{name}.{arch}.ptx", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The virtual architectures the fixtures are compiled for.
pub const ARCHS: [&str; 3] = ["compute_52", "compute_80", "compute_90"];

/// Loads a fixture module.
pub fn load_fixture(name: &str, arch: &str) -> Module {
    Module::load(&fixture(name, arch)).unwrap_or_else(|e| panic!("{name}.{arch}: {e}"))
}

/// A [`crate::DeviceOutput`] collecting `printf` text and `assert` messages, bounded like
/// CUDA's printf FIFO.
#[derive(Debug)]
pub struct TestOutput {
    limit: usize,
    text: Mutex<(Vec<u8>, Vec<u8>)>,
}

impl TestOutput {
    /// Takes at most `limit` bytes of `printf` text.
    pub fn new(limit: usize) -> TestOutput {
        TestOutput {
            limit,
            text: Mutex::new((Vec::new(), Vec::new())),
        }
    }

    /// The `printf` text so far.
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.text.lock().unwrap().0).into_owned()
    }

    /// The `assert` messages so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.text.lock().unwrap().1).into_owned()
    }
}

impl crate::DeviceOutput for TestOutput {
    fn room(&self) -> usize {
        self.limit.saturating_sub(self.text.lock().unwrap().0.len())
    }

    fn printf(&self, text: &[u8]) {
        let mut t = self.text.lock().unwrap();
        if t.0.len() + text.len() <= self.limit {
            t.0.extend_from_slice(text);
        }
    }

    fn assert_failed(&self, message: &[u8]) {
        self.text.lock().unwrap().1.extend_from_slice(message);
    }
}

/// A [`crate::StateBudget`] of `limit` bytes that remembers its peak use and refusals.
#[derive(Debug)]
pub struct CountingBudget {
    limit: u64,
    used: Mutex<u64>,
    peak: AtomicU64,
    refused: AtomicU64,
}

impl CountingBudget {
    /// A budget of `limit` bytes, nothing taken.
    pub fn new(limit: u64) -> CountingBudget {
        CountingBudget {
            limit,
            used: Mutex::new(0),
            peak: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Bytes taken now.
    pub fn used(&self) -> u64 {
        *self.used.lock().unwrap()
    }

    /// Most bytes taken at once so far.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Requests refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl crate::StateBudget for CountingBudget {
    fn take(&self, bytes: u64) -> bool {
        let mut u = self.used.lock().unwrap();
        if u.saturating_add(bytes) > self.limit {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        *u += bytes;
        self.peak.fetch_max(*u, Ordering::Relaxed);
        true
    }

    fn give_back(&self, bytes: u64) {
        let mut u = self.used.lock().unwrap();
        *u = u.checked_sub(bytes).expect("gave back more than was taken");
    }
}

/// PTX that keeps `count` 64-bit registers live at once, in two parts: the first declares
/// `%{name}0` … and sets each, the second adds them all into `%{name}_sum` (declared in the
/// first). Everything between the parts runs with all of them live, so a frame of the
/// function holds at least `count` registers however the interpreter packs them.
pub fn live_registers(name: &str, count: usize) -> (String, String) {
    use std::fmt::Write;
    let mut set = format!(".reg .b64 %{name}<{count}>;\n.reg .b64 %{name}_sum;\n");
    let mut add = format!("mov.u64 %{name}_sum, 0;\n");
    // One immediate for all (each distinct immediate is a register of its own).
    let _ = writeln!(set, "mov.u64 %{name}0, 1;");
    for i in 1..count {
        let _ = writeln!(set, "add.u64 %{name}{i}, %{name}{}, 1;", i - 1);
    }
    for i in 0..count {
        let _ = writeln!(add, "add.u64 %{name}_sum, %{name}_sum, %{name}{i};");
    }
    (set, add)
}
