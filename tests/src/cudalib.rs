//! A CUDA driver library loaded at run time (vgpu's shim, or NVIDIA's
//! libcuda on a GPU machine) and a [`vgpu_corpus::Gpu`] over it, so the same
//! kernel corpus runs through the shim and on real hardware.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int, c_uint, c_void};
use std::path::Path;

use libloading::Library;
use vgpu_corpus::{Arg, Gpu, ModuleId};

type R = c_int;
type H = *mut c_void;

/// The driver entry points the corpus needs.
#[allow(missing_docs)]
pub struct CudaApi {
    pub init: unsafe extern "C" fn(c_uint) -> R,
    pub ctx_create: unsafe extern "C" fn(*mut H, c_uint, c_int) -> R,
    pub ctx_destroy: unsafe extern "C" fn(H) -> R,
    pub ctx_set_current: unsafe extern "C" fn(H) -> R,
    pub ctx_synchronize: unsafe extern "C" fn() -> R,
    pub module_load: unsafe extern "C" fn(*mut H, *const c_void) -> R,
    pub module_unload: unsafe extern "C" fn(H) -> R,
    pub module_get_function: unsafe extern "C" fn(*mut H, H, *const c_char) -> R,
    pub module_get_global: unsafe extern "C" fn(*mut u64, *mut usize, H, *const c_char) -> R,
    pub mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> R,
    pub mem_free: unsafe extern "C" fn(u64) -> R,
    pub htod: unsafe extern "C" fn(u64, *const c_void, usize) -> R,
    pub dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> R,
    pub memset_d32: unsafe extern "C" fn(u64, c_uint, usize) -> R,
    #[allow(clippy::type_complexity)]
    pub launch: unsafe extern "C" fn(
        H,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        H,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> R,
}

impl std::fmt::Debug for CudaApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CudaApi")
    }
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the symbol is a CUDA driver function with the signature of the field it fills.
        let s = unsafe { $lib.get($name.as_bytes()) }.map_err(|e| format!("{}: {e}", $name))?;
        *s
    }};
}

impl CudaApi {
    /// Loads the driver library at `path` and calls `cuInit`. The library
    /// stays loaded for the life of the process.
    pub fn load(path: &Path) -> Result<&'static CudaApi, String> {
        // SAFETY: loading a CUDA driver library, whose initialisers are sound.
        let lib = unsafe { Library::new(path) }.map_err(|e| format!("{}: {e}", path.display()))?;
        let lib: &'static Library = Box::leak(Box::new(lib));
        let api = CudaApi {
            init: sym!(lib, "cuInit"),
            ctx_create: sym!(lib, "cuCtxCreate_v2"),
            ctx_destroy: sym!(lib, "cuCtxDestroy_v2"),
            ctx_set_current: sym!(lib, "cuCtxSetCurrent"),
            ctx_synchronize: sym!(lib, "cuCtxSynchronize"),
            module_load: sym!(lib, "cuModuleLoadData"),
            module_unload: sym!(lib, "cuModuleUnload"),
            module_get_function: sym!(lib, "cuModuleGetFunction"),
            module_get_global: sym!(lib, "cuModuleGetGlobal_v2"),
            mem_alloc: sym!(lib, "cuMemAlloc_v2"),
            mem_free: sym!(lib, "cuMemFree_v2"),
            htod: sym!(lib, "cuMemcpyHtoD_v2"),
            dtoh: sym!(lib, "cuMemcpyDtoH_v2"),
            memset_d32: sym!(lib, "cuMemsetD32_v2"),
            launch: sym!(lib, "cuLaunchKernel"),
        };
        // SAFETY: plain call.
        let r = unsafe { (api.init)(0) };
        if r != 0 {
            return Err(format!("cuInit failed with CUresult {r}"));
        }
        Ok(Box::leak(Box::new(api)))
    }
}

fn check(r: R) -> Result<(), i32> {
    if r == 0 { Ok(()) } else { Err(r) }
}

/// A [`Gpu`] over a driver library: one fresh context per instance,
/// destroyed (with everything in it) when the instance is dropped.
pub struct CudaGpu {
    api: &'static CudaApi,
    ctx: H,
    functions: HashMap<(u64, String), u64>,
}

impl std::fmt::Debug for CudaGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaGpu").field("ctx", &self.ctx).finish()
    }
}

impl CudaGpu {
    /// A device with a fresh context, current on this thread.
    pub fn new(api: &'static CudaApi) -> Result<CudaGpu, i32> {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check(unsafe { (api.ctx_create)(&mut ctx, 0, 0) })?;
        Ok(CudaGpu {
            api,
            ctx,
            functions: HashMap::new(),
        })
    }

    fn current(&self) -> Result<(), i32> {
        // SAFETY: our own context handle.
        check(unsafe { (self.api.ctx_set_current)(self.ctx) })
    }
}

impl Drop for CudaGpu {
    fn drop(&mut self) {
        // SAFETY: our own context handle, destroyed once.
        unsafe { (self.api.ctx_destroy)(self.ctx) };
    }
}

fn cname(s: &str) -> Result<CString, i32> {
    CString::new(s).map_err(|_| 1)
}

impl Gpu for CudaGpu {
    fn load_module(&mut self, ptx: &str) -> Result<ModuleId, i32> {
        self.current()?;
        let text = cname(ptx)?;
        let mut m = std::ptr::null_mut();
        // SAFETY: NUL-terminated PTX and a valid out-pointer.
        check(unsafe { (self.api.module_load)(&mut m, text.as_ptr().cast()) })?;
        Ok(ModuleId(m as u64))
    }

    fn global(&mut self, m: ModuleId, name: &str) -> Result<(u64, usize), i32> {
        self.current()?;
        let n = cname(name)?;
        let (mut p, mut s) = (0u64, 0usize);
        // SAFETY: valid out-pointers and C string.
        check(unsafe { (self.api.module_get_global)(&mut p, &mut s, m.0 as H, n.as_ptr()) })?;
        Ok((p, s))
    }

    fn alloc(&mut self, bytes: usize) -> Result<u64, i32> {
        self.current()?;
        let mut p = 0u64;
        // SAFETY: valid out-pointer.
        check(unsafe { (self.api.mem_alloc)(&mut p, bytes) })?;
        Ok(p)
    }

    fn free(&mut self, ptr: u64) -> Result<(), i32> {
        self.current()?;
        // SAFETY: plain call.
        check(unsafe { (self.api.mem_free)(ptr) })
    }

    fn htod(&mut self, dst: u64, data: &[u8]) -> Result<(), i32> {
        self.current()?;
        // SAFETY: `data` is valid for its length.
        check(unsafe { (self.api.htod)(dst, data.as_ptr().cast(), data.len()) })
    }

    fn dtoh(&mut self, src: u64, out: &mut [u8]) -> Result<(), i32> {
        self.current()?;
        // SAFETY: `out` is valid for its length.
        check(unsafe { (self.api.dtoh)(out.as_mut_ptr().cast(), src, out.len()) })
    }

    fn memset_d32(&mut self, dst: u64, value: u32, count: usize) -> Result<(), i32> {
        self.current()?;
        // SAFETY: plain call.
        check(unsafe { (self.api.memset_d32)(dst, value, count) })
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
        self.current()?;
        let key = (m.0, kernel.to_string());
        let f = match self.functions.get(&key) {
            Some(&f) => f,
            None => {
                let n = cname(kernel)?;
                let mut f = std::ptr::null_mut();
                // SAFETY: valid out-pointer and C string.
                check(unsafe { (self.api.module_get_function)(&mut f, m.0 as H, n.as_ptr()) })?;
                self.functions.insert(key, f as u64);
                f as u64
            }
        };
        let mut values: Vec<Vec<u8>> = args.iter().map(Arg::to_le_bytes).collect();
        let mut ptrs: Vec<*mut c_void> = values.iter_mut().map(|v| v.as_mut_ptr().cast()).collect();
        // SAFETY: one pointer per parameter, each to a value of the parameter's size.
        check(unsafe {
            (self.api.launch)(
                f as H,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                dynamic_shared,
                std::ptr::null_mut(),
                ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    fn synchronize(&mut self) -> Result<(), i32> {
        self.current()?;
        // SAFETY: plain call.
        check(unsafe { (self.api.ctx_synchronize)() })
    }
}
