//! The harness a case runs in: one module, tracked allocations that are always
//! freed, typed uploads and downloads, and launch-then-synchronize.

use crate::check::CaseError;
use crate::fixtures::try_ptx;
use crate::{Arch, Arg, Gpu, ModuleId};

/// Word written over fresh output buffers so that elements a kernel fails to
/// write cannot pass as zeros.
pub(crate) const POISON: u32 = 0xdead_beef;

/// A plain value that travels to and from the device as little-endian bytes.
pub(crate) trait Elem: Copy {
    const SIZE: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(bytes: &[u8]) -> Self;
}

macro_rules! elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(bytes: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(bytes);
                <$t>::from_le_bytes(a)
            }
        }
    )*};
}
elem!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

/// Little-endian bytes of a slice.
pub(crate) fn to_bytes<T: Elem>(data: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() * T::SIZE);
    for &v in data {
        v.put(&mut out);
    }
    out
}

/// Decodes a slice from little-endian bytes.
pub(crate) fn from_bytes<T: Elem>(bytes: &[u8]) -> Vec<T> {
    bytes.chunks_exact(T::SIZE).map(T::get).collect()
}

/// A case's view of the device.
pub(crate) struct Ctx<'g> {
    gpu: &'g mut dyn Gpu,
    module: ModuleId,
    allocs: Vec<u64>,
    /// A code that frees may return after the case provoked it on purpose
    /// (a real GPU's context stays poisoned after an illegal address).
    sticky: Option<i32>,
}

/// Loads `file`'s fixture for `arch`, runs `body`, then frees every allocation
/// `body` made, whatever it returned.
pub(crate) fn with_module(
    gpu: &mut dyn Gpu,
    arch: Arch,
    file: &str,
    body: impl FnOnce(&mut Ctx<'_>) -> Result<(), CaseError>,
) -> Result<(), CaseError> {
    let ptx = try_ptx(file, arch)
        .ok_or_else(|| CaseError::Invalid(format!("no PTX fixture for {file}")))?;
    let module = gpu
        .load_module(ptx)
        .map_err(|code| CaseError::cuda(format!("cuModuleLoadData({file}.{arch})"), code))?;
    let mut ctx = Ctx {
        gpu,
        module,
        allocs: Vec::new(),
        sticky: None,
    };
    let result = body(&mut ctx);
    let freed = ctx.free_all();
    result.and(freed)
}

impl Ctx<'_> {
    fn free_all(&mut self) -> Result<(), CaseError> {
        let mut first_err = None;
        while let Some(ptr) = self.allocs.pop() {
            match self.gpu.free(ptr) {
                Ok(()) => {}
                Err(code) if Some(code) == self.sticky => {}
                Err(code) => {
                    first_err.get_or_insert(CaseError::cuda(format!("cuMemFree({ptr:#x})"), code));
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Lets frees fail with `code` without failing the case.
    pub(crate) fn tolerate_sticky(&mut self, code: i32) {
        self.sticky = Some(code);
    }

    /// Raw access for cases that check error codes themselves.
    pub(crate) fn gpu(&mut self) -> &mut dyn Gpu {
        &mut *self.gpu
    }

    pub(crate) fn module(&self) -> ModuleId {
        self.module
    }

    /// Allocates `bytes` (rounded up to whole 32-bit words) and fills them with `word`.
    pub(crate) fn alloc_filled(&mut self, bytes: usize, word: u32) -> Result<u64, CaseError> {
        let words = bytes.div_ceil(4).max(1);
        let ptr = self
            .gpu
            .alloc(words * 4)
            .map_err(|code| CaseError::cuda(format!("cuMemAlloc({})", words * 4), code))?;
        self.allocs.push(ptr);
        self.gpu.memset_d32(ptr, word, words).map_err(|code| {
            CaseError::cuda(format!("cuMemsetD32({ptr:#x}, {word:#x}, {words})"), code)
        })?;
        Ok(ptr)
    }

    /// An output buffer of `n` elements, pre-filled with [`POISON`].
    pub(crate) fn output<T: Elem>(&mut self, n: usize) -> Result<u64, CaseError> {
        self.alloc_filled(n * T::SIZE, POISON)
    }

    /// A zero-filled buffer of `n` elements.
    pub(crate) fn zeros<T: Elem>(&mut self, n: usize) -> Result<u64, CaseError> {
        self.alloc_filled(n * T::SIZE, 0)
    }

    /// Allocates and uploads `data`.
    pub(crate) fn upload<T: Elem>(&mut self, data: &[T]) -> Result<u64, CaseError> {
        let ptr = self.alloc_filled(data.len() * T::SIZE, POISON)?;
        self.write(ptr, data)?;
        Ok(ptr)
    }

    /// Copies `data` to `ptr`.
    pub(crate) fn write<T: Elem>(&mut self, ptr: u64, data: &[T]) -> Result<(), CaseError> {
        let bytes = to_bytes(data);
        self.gpu.htod(ptr, &bytes).map_err(|code| {
            CaseError::cuda(
                format!("cuMemcpyHtoD({ptr:#x}, {} bytes)", bytes.len()),
                code,
            )
        })
    }

    /// Reads `n` elements from `ptr`.
    pub(crate) fn read<T: Elem>(&mut self, ptr: u64, n: usize) -> Result<Vec<T>, CaseError> {
        let mut bytes = vec![0u8; n * T::SIZE];
        self.gpu.dtoh(ptr, &mut bytes).map_err(|code| {
            CaseError::cuda(
                format!("cuMemcpyDtoH({ptr:#x}, {} bytes)", bytes.len()),
                code,
            )
        })?;
        Ok(from_bytes(&bytes))
    }

    /// `cuModuleGetGlobal`, checking the size the module reports.
    pub(crate) fn global(&mut self, name: &str, expected_size: usize) -> Result<u64, CaseError> {
        let (ptr, size) = self
            .gpu
            .global(self.module, name)
            .map_err(|code| CaseError::cuda(format!("cuModuleGetGlobal({name})"), code))?;
        if size != expected_size {
            return Err(CaseError::Invalid(format!(
                "cuModuleGetGlobal({name}) reports {size} bytes, the PTX declares {expected_size}"
            )));
        }
        Ok(ptr)
    }

    /// Launches on the default stream and synchronizes.
    pub(crate) fn launch(
        &mut self,
        kernel: &str,
        grid: [u32; 3],
        block: [u32; 3],
        dynamic_shared: u32,
        args: &[Arg],
    ) -> Result<(), CaseError> {
        self.gpu
            .launch(self.module, kernel, grid, block, dynamic_shared, args)
            .map_err(|code| CaseError::cuda(format!("cuLaunchKernel({kernel})"), code))?;
        self.gpu
            .synchronize()
            .map_err(|code| CaseError::cuda(format!("cuCtxSynchronize after {kernel}"), code))
    }

    /// 1-D launch of `n` threads in blocks of `block` (last block partial).
    pub(crate) fn launch_1d(
        &mut self,
        kernel: &str,
        n: usize,
        block: u32,
        args: &[Arg],
    ) -> Result<(), CaseError> {
        self.launch(kernel, [blocks(n, block), 1, 1], [block, 1, 1], 0, args)
    }
}

/// Blocks of `block` threads needed to cover `n`.
pub(crate) fn blocks(n: usize, block: u32) -> u32 {
    n.div_ceil(block as usize) as u32
}

/// `n` as a kernel `int`.
pub(crate) fn int(n: usize) -> crate::Arg {
    crate::Arg::I32(n as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip() {
        let v = [1.5f32, -0.0, f32::MAX];
        assert_eq!(from_bytes::<f32>(&to_bytes(&v)), v);
        assert_eq!(to_bytes(&[0x0102_0304u32]), vec![4, 3, 2, 1]);
        assert_eq!(from_bytes::<i16>(&[0xff, 0xff, 2, 0]), vec![-1, 2]);
    }

    #[test]
    fn block_counts() {
        assert_eq!(blocks(1, 256), 1);
        assert_eq!(blocks(256, 256), 1);
        assert_eq!(blocks(257, 256), 2);
    }
}
