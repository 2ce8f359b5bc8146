//! The whole corpus on the PTX interpreter directly (no shim, no broker), for
//! every fixture architecture.
//!
//! `VGPU_CORPUS_CASES=name1,name2` restricts the run to cases whose names
//! contain one of the given substrings.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use vgpu_corpus::{Arch, Arg, Case, Gpu, ModuleId, cases, cuda, run_cases};
use vgpu_ptx::{Buffer, GLOBAL_BASE, GlobalMemory, Launch, LaunchControl, Module, Progress};

/// `CUDA_ERROR_INVALID_PTX`.
const ERROR_INVALID_PTX: i32 = 218;
/// Allocation granularity of the bump allocator (cudaMalloc's alignment).
const ALIGN: u64 = 256;
/// Watchdog for one launch: far above what any corpus kernel needs.
const LAUNCH_TIMEOUT: Duration = Duration::from_secs(60);

/// Device memory: live allocations by base address.
#[derive(Default)]
struct Memory {
    allocs: BTreeMap<u64, Arc<Buffer>>,
}

impl GlobalMemory for Memory {
    fn lookup(&self, addr: u64) -> Option<(u64, Arc<Buffer>)> {
        let (&base, buf) = self.allocs.range(..=addr).next_back()?;
        (addr - base < buf.len() as u64).then(|| (base, Arc::clone(buf)))
    }
}

struct LoadedModule {
    module: Module,
    /// Device address of each `module.globals()` entry.
    globals: Vec<u64>,
}

/// A [`Gpu`] over `vgpu_ptx` with a bump allocator. Launches run synchronously;
/// a fault poisons the device like a real context (every later call fails with it).
struct InterpGpu {
    mem: Memory,
    next: u64,
    modules: Vec<LoadedModule>,
    workers: usize,
    sticky: Option<i32>,
}

impl InterpGpu {
    fn new() -> InterpGpu {
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        InterpGpu {
            mem: Memory::default(),
            next: GLOBAL_BASE,
            modules: Vec::new(),
            workers,
            sticky: None,
        }
    }

    fn check(&self) -> Result<(), i32> {
        self.sticky.map_or(Ok(()), Err)
    }

    fn alloc_buffer(&mut self, bytes: usize) -> Result<(u64, Arc<Buffer>), i32> {
        let buf =
            Arc::new(Buffer::new_zeroed(bytes.max(1)).map_err(|_| cuda::ERROR_OUT_OF_MEMORY)?);
        let base = self.next;
        self.next += (bytes as u64).max(1).div_ceil(ALIGN) * ALIGN;
        self.mem.allocs.insert(base, Arc::clone(&buf));
        Ok((base, buf))
    }

    /// The allocation holding `[ptr, ptr + len)` and the offset of `ptr` in it.
    fn range(&self, ptr: u64, len: usize) -> Result<(Arc<Buffer>, usize), i32> {
        let (base, buf) = self.mem.lookup(ptr).ok_or(cuda::ERROR_INVALID_VALUE)?;
        let off = (ptr - base) as usize;
        if off + len > buf.len() {
            return Err(cuda::ERROR_INVALID_VALUE);
        }
        Ok((buf, off))
    }

    fn module(&self, m: ModuleId) -> Result<&LoadedModule, i32> {
        self.modules
            .get(m.0 as usize)
            .ok_or(cuda::ERROR_INVALID_VALUE)
    }
}

impl Gpu for InterpGpu {
    fn load_module(&mut self, ptx: &str) -> Result<ModuleId, i32> {
        self.check()?;
        let module = Module::load(ptx).map_err(|e| {
            eprintln!("Module::load: {e:?}");
            ERROR_INVALID_PTX
        })?;
        let mut globals = Vec::new();
        let mut bufs = Vec::new();
        for g in module.globals() {
            let (addr, buf) = self.alloc_buffer(g.size)?;
            globals.push(addr);
            bufs.push(buf);
        }
        for (g, buf) in module.globals().iter().zip(&bufs) {
            let image = g.image(&globals);
            if !image.is_empty() {
                buf.write(0, &image)
                    .map_err(|_| cuda::ERROR_INVALID_VALUE)?;
            }
        }
        self.modules.push(LoadedModule { module, globals });
        Ok(ModuleId(self.modules.len() as u64 - 1))
    }

    fn global(&mut self, m: ModuleId, name: &str) -> Result<(u64, usize), i32> {
        self.check()?;
        let lm = self.module(m)?;
        let i = lm
            .module
            .globals()
            .iter()
            .position(|g| g.name == name)
            .ok_or(cuda::ERROR_NOT_FOUND)?;
        Ok((lm.globals[i], lm.module.globals()[i].size))
    }

    fn alloc(&mut self, bytes: usize) -> Result<u64, i32> {
        self.check()?;
        if bytes == 0 {
            return Err(cuda::ERROR_INVALID_VALUE);
        }
        Ok(self.alloc_buffer(bytes)?.0)
    }

    fn free(&mut self, ptr: u64) -> Result<(), i32> {
        self.check()?;
        self.mem
            .allocs
            .remove(&ptr)
            .map(drop)
            .ok_or(cuda::ERROR_INVALID_VALUE)
    }

    fn htod(&mut self, dst: u64, data: &[u8]) -> Result<(), i32> {
        self.check()?;
        let (buf, off) = self.range(dst, data.len())?;
        buf.write(off, data).map_err(|_| cuda::ERROR_INVALID_VALUE)
    }

    fn dtoh(&mut self, src: u64, out: &mut [u8]) -> Result<(), i32> {
        self.check()?;
        let (buf, off) = self.range(src, out.len())?;
        buf.read(off, out).map_err(|_| cuda::ERROR_INVALID_VALUE)
    }

    fn memset_d32(&mut self, dst: u64, value: u32, count: usize) -> Result<(), i32> {
        self.check()?;
        let (buf, off) = self.range(dst, count * 4)?;
        buf.fill(off, &value.to_le_bytes(), count)
            .map_err(|_| cuda::ERROR_INVALID_VALUE)
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
        self.check()?;
        let lm = self.module(m)?;
        let info = lm.module.kernel(kernel).ok_or(cuda::ERROR_NOT_FOUND)?;
        if info.params.len() != args.len() {
            return Err(cuda::ERROR_INVALID_VALUE);
        }
        let mut params = vec![0u8; info.param_bytes];
        for (p, a) in info.params.iter().zip(args) {
            let bytes = a.to_le_bytes();
            if bytes.len() != p.size {
                eprintln!(
                    "{kernel}: argument {a:?} is {} bytes, the parameter {}",
                    bytes.len(),
                    p.size
                );
                return Err(cuda::ERROR_INVALID_VALUE);
            }
            params[p.offset..p.offset + p.size].copy_from_slice(&bytes);
        }
        let control = LaunchControl::new();
        control.set_timeout(LAUNCH_TIMEOUT);
        let launch = Launch {
            kernel,
            grid,
            block,
            dynamic_shared,
            params: &params,
            globals: &lm.globals,
            memory: &self.mem,
            start_block: 0,
            workers: self.workers,
            control: &control,
        };
        match lm.module.launch(&launch) {
            Ok(Progress::Completed(_)) => Ok(()),
            Ok(Progress::Yielded { .. }) => Err(cuda::ERROR_LAUNCH_FAILED),
            Err(fault) => {
                let code = fault.cuda_error() as i32;
                eprintln!("{kernel}: fault {fault:?}");
                if code != cuda::ERROR_INVALID_VALUE {
                    self.sticky = Some(code);
                }
                Err(code)
            }
        }
    }

    fn synchronize(&mut self) -> Result<(), i32> {
        self.check()
    }
}

fn selected() -> Vec<Case> {
    let filter = std::env::var("VGPU_CORPUS_CASES").unwrap_or_default();
    let wanted: Vec<&str> = filter
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    cases()
        .into_iter()
        .filter(|c| wanted.is_empty() || wanted.iter().any(|w| c.name.contains(w)))
        .collect()
}

#[test]
fn corpus_passes_on_the_interpreter() {
    let mut factory = || -> Result<Box<dyn Gpu>, i32> { Ok(Box::new(InterpGpu::new())) };
    let report = run_cases(&selected(), &mut factory, &Arch::ALL);
    println!("{report}");
    assert_eq!(
        report.failed(),
        0,
        "corpus failures on the interpreter:\n{report}"
    );
}
