//! Runs the shared kernel corpus (tests/kernels + the vgpu-corpus crate) directly on the
//! interpreter, for every fixture architecture.

use std::collections::HashMap;

use vgpu_corpus::{Arch, Arg, Gpu, ModuleId};
use vgpu_ptx::testutils::{TestMemory, alloc_globals};
use vgpu_ptx::{GlobalMemory, Launch, LaunchControl, Module};

/// CUDA_ERROR_INVALID_PTX.
const INVALID_PTX: i32 = 218;
const INVALID_VALUE: i32 = 1;
const NOT_FOUND: i32 = 500;

struct Interp {
    mem: TestMemory,
    modules: Vec<(Module, Vec<u64>)>,
    sizes: HashMap<u64, usize>,
    sticky: Option<i32>,
}

impl Interp {
    fn check(&self) -> Result<(), i32> {
        self.sticky.map_or(Ok(()), Err)
    }

    fn range(&self, addr: u64, len: usize) -> Result<(u64, std::sync::Arc<vgpu_ptx::Buffer>), i32> {
        let (base, buf) = self.mem.lookup(addr).ok_or(INVALID_VALUE)?;
        if (addr - base) as usize + len > buf.len() {
            return Err(INVALID_VALUE);
        }
        Ok((base, buf))
    }
}

impl Gpu for Interp {
    fn load_module(&mut self, ptx: &str) -> Result<ModuleId, i32> {
        self.check()?;
        let m = Module::load(ptx).map_err(|e| {
            eprintln!("load failed: {e}");
            INVALID_PTX
        })?;
        let g = alloc_globals(&m, &self.mem);
        self.modules.push((m, g));
        Ok(ModuleId(self.modules.len() as u64 - 1))
    }

    fn global(&mut self, m: ModuleId, name: &str) -> Result<(u64, usize), i32> {
        let (module, addrs) = self.modules.get(m.0 as usize).ok_or(INVALID_VALUE)?;
        let i = module
            .globals()
            .iter()
            .position(|g| g.name == name)
            .ok_or(NOT_FOUND)?;
        Ok((addrs[i], module.globals()[i].size))
    }

    fn alloc(&mut self, bytes: usize) -> Result<u64, i32> {
        self.check()?;
        let a = self.mem.alloc(bytes.max(1));
        self.sizes.insert(a, bytes);
        Ok(a)
    }

    fn free(&mut self, ptr: u64) -> Result<(), i32> {
        self.sizes.remove(&ptr).ok_or(INVALID_VALUE)?;
        self.mem.free(ptr);
        Ok(())
    }

    fn htod(&mut self, dst: u64, data: &[u8]) -> Result<(), i32> {
        self.check()?;
        let (base, buf) = self.range(dst, data.len())?;
        buf.write((dst - base) as usize, data)
            .map_err(|_| INVALID_VALUE)
    }

    fn dtoh(&mut self, src: u64, out: &mut [u8]) -> Result<(), i32> {
        self.check()?;
        let (base, buf) = self.range(src, out.len())?;
        buf.read((src - base) as usize, out)
            .map_err(|_| INVALID_VALUE)
    }

    fn memset_d32(&mut self, dst: u64, value: u32, count: usize) -> Result<(), i32> {
        self.check()?;
        let (base, buf) = self.range(dst, count * 4)?;
        buf.fill((dst - base) as usize, &value.to_le_bytes(), count)
            .map_err(|_| INVALID_VALUE)
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
        let (module, globals) = self.modules.get(m.0 as usize).ok_or(INVALID_VALUE)?;
        let info = module.kernel(kernel).ok_or(NOT_FOUND)?;
        if args.len() != info.params.len() {
            return Err(INVALID_VALUE);
        }
        let mut params = vec![0u8; info.param_bytes];
        for (a, p) in args.iter().zip(&info.params) {
            let b = a.to_le_bytes();
            if b.len() != p.size {
                return Err(INVALID_VALUE);
            }
            params[p.offset..p.offset + p.size].copy_from_slice(&b);
        }
        let control = LaunchControl::new();
        control.set_timeout(std::time::Duration::from_secs(60));
        let r = module.launch(&Launch {
            kernel,
            grid,
            block,
            dynamic_shared,
            params: &params,
            globals,
            memory: &self.mem,
            start_block: 0,
            workers: 2,
            control: &control,
        });
        match r {
            Ok(_) => Ok(()),
            Err(f) => {
                let code = f.cuda_error() as i32;
                if f.is_sticky() {
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

#[test]
fn kernel_corpus_passes() {
    let mut factory = || -> Result<Box<dyn Gpu>, i32> {
        Ok(Box::new(Interp {
            mem: TestMemory::new(),
            modules: Vec::new(),
            sizes: HashMap::new(),
            sticky: None,
        }))
    };
    let report = vgpu_corpus::run_all(&mut factory, &Arch::ALL);
    println!("{report}");
    assert_eq!(report.failed(), 0, "{report}");
}
