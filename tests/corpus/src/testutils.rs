//! A memory-only fake device for testing the harness without a GPU.

use std::collections::BTreeMap;

use crate::cuda::{ERROR_INVALID_VALUE, ERROR_NOT_FOUND};
use crate::{Arg, Gpu, ModuleId};

/// How the fake answers kernel launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LaunchMode {
    /// Accepts the launch and does nothing.
    Ignore,
    /// Refuses it with this code.
    Fail(i32),
}

/// Device memory without compute: allocations are bounds-checked byte vectors.
pub(crate) struct FakeGpu {
    mode: LaunchMode,
    next: u64,
    mem: BTreeMap<u64, Vec<u8>>,
    pub(crate) allocs: usize,
    pub(crate) frees: usize,
    pub(crate) launches: Vec<String>,
}

const BASE: u64 = 0x7f00_0000_0000;
const ALIGN: u64 = 256;

impl FakeGpu {
    pub(crate) fn new(mode: LaunchMode) -> FakeGpu {
        FakeGpu {
            mode,
            next: BASE,
            mem: BTreeMap::new(),
            allocs: 0,
            frees: 0,
            launches: Vec::new(),
        }
    }

    pub(crate) fn live(&self) -> usize {
        self.mem.len()
    }

    fn region(&mut self, ptr: u64, len: usize) -> Result<&mut [u8], i32> {
        let (&base, buf) = self
            .mem
            .range_mut(..=ptr)
            .next_back()
            .ok_or(ERROR_INVALID_VALUE)?;
        let off = (ptr - base) as usize;
        buf.get_mut(off..off + len).ok_or(ERROR_INVALID_VALUE)
    }
}

impl Gpu for FakeGpu {
    fn load_module(&mut self, ptx: &str) -> Result<ModuleId, i32> {
        if ptx.contains(".entry") {
            Ok(ModuleId(1))
        } else {
            Err(ERROR_INVALID_VALUE)
        }
    }

    fn global(&mut self, _m: ModuleId, _name: &str) -> Result<(u64, usize), i32> {
        Err(ERROR_NOT_FOUND)
    }

    fn alloc(&mut self, bytes: usize) -> Result<u64, i32> {
        let ptr = self.next;
        self.next += (bytes as u64).div_ceil(ALIGN).max(1) * ALIGN;
        self.mem.insert(ptr, vec![0; bytes]);
        self.allocs += 1;
        Ok(ptr)
    }

    fn free(&mut self, ptr: u64) -> Result<(), i32> {
        self.mem.remove(&ptr).ok_or(ERROR_INVALID_VALUE)?;
        self.frees += 1;
        Ok(())
    }

    fn htod(&mut self, dst: u64, data: &[u8]) -> Result<(), i32> {
        self.region(dst, data.len())?.copy_from_slice(data);
        Ok(())
    }

    fn dtoh(&mut self, src: u64, out: &mut [u8]) -> Result<(), i32> {
        out.copy_from_slice(self.region(src, out.len())?);
        Ok(())
    }

    fn memset_d32(&mut self, dst: u64, value: u32, count: usize) -> Result<(), i32> {
        for w in self.region(dst, count * 4)?.chunks_exact_mut(4) {
            w.copy_from_slice(&value.to_le_bytes());
        }
        Ok(())
    }

    fn launch(
        &mut self,
        _m: ModuleId,
        kernel: &str,
        _grid: [u32; 3],
        _block: [u32; 3],
        _dynamic_shared: u32,
        _args: &[Arg],
    ) -> Result<(), i32> {
        self.launches.push(kernel.to_string());
        match self.mode {
            LaunchMode::Ignore => Ok(()),
            LaunchMode::Fail(code) => Err(code),
        }
    }

    fn synchronize(&mut self) -> Result<(), i32> {
        Ok(())
    }
}
