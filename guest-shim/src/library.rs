//! The C ABI of modules and libraries beyond loading and lookup by name:
//! `cuLibrary*`, `cuKernel*`, module and function enumeration and
//! introspection, and loading from files.
//!
//! In vgpu a library is a module of the context that was current when it was
//! loaded (the primary context when none was), and a kernel (`CUkernel`) is a
//! function of that module (`CUfunction`): the CUDA 12 runtime loads every
//! fat binary with `cuLibraryLoadData`, takes the module with
//! `cuLibraryGetModule` and looks its kernels up with `cuModuleGetFunction`.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use vgpu_proto::cuda;

use crate::driver as drv;
use crate::exports::{CUdevice, CUdeviceptr, CUhandle, c_name, h, load_image, module_load, p};
use crate::ffi::{CUresult, ffi};
use crate::out;

/// `CU_MODULE_LAZY_LOADING`, CUDA's default since 12.2: the runtime takes a
/// library's kernels when they are first used, so a library whose images
/// the device cannot run (cuBLAS ships cubins for architectures a device may
/// not be) fails only if it is used. vgpu sends a usable image to the host at
/// load; an unusable one fails at first use.
pub const MODULE_LAZY_LOADING: c_int = 0x2;

/// The largest module file `cuModuleLoad`/`cuLibraryLoadFromFile` read (images larger than one
/// request go to vgpud in parts; vgpud charges them to the VM's `limits.module_bytes`).
const MAX_MODULE_FILE: u64 = 1 << 30;

/// Checks that `dev` names the device (vgpu shows one per VM).
fn check_device(dev: CUdevice) -> drv::CuRes<()> {
    if (0..drv::device_count()?).contains(&dev) {
        Ok(())
    } else {
        Err(cuda::CUDA_ERROR_INVALID_DEVICE)
    }
}

/// Whether this process has said on stderr that code cannot run on this device (an unusable
/// library, a cubin's kernel): later cases go to the debug log (a library such as NCCL asks for
/// dozens of SASS-only kernels at start, and one line says why they fail). CUDA's error log
/// (`cuLogsCurrent`) gets every one.
static UNUSABLE_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Says why code cannot run here: the first time in a process on stderr, later at debug
/// level ([`UNUSABLE_WARNED`]); CUDA's error log gets each.
pub(crate) fn no_binary(why: &str) {
    if UNUSABLE_WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        crate::debug!("{why}");
        crate::logs::warning(why.to_string());
    } else {
        crate::warn!("{why} (further code this device cannot run is logged with VGPU_LOG=debug)");
    }
}

/// A library's module: `CUDA_ERROR_NO_BINARY_FOR_GPU` for a library whose
/// images the device cannot run (it loaded, as CUDA's lazy loading lets it;
/// its first use fails and says why).
fn library(lib: CUhandle) -> drv::CuRes<u64> {
    if let Some(why) = drv::unusable_reason(h(lib))? {
        no_binary(&format!("cannot use a library: {why}"));
        return Err(cuda::CUDA_ERROR_NO_BINARY_FOR_GPU);
    }
    Ok(h(lib))
}

/// Loads a library in the current (or the primary) context; a library with
/// no image the device runs loads as a handle whose first use fails.
fn load_library(image: *const c_void) -> drv::CuRes<u64> {
    let mut unusable = None;
    let r = drv::library_load(|| match load_image(image) {
        Ok(m) => Ok(m),
        Err((code, why)) => {
            if code == cuda::CUDA_ERROR_NO_BINARY_FOR_GPU {
                unusable = Some(why);
            }
            Err(code)
        }
    });
    match (r, unusable) {
        (Ok(m), _) => Ok(m),
        (Err(_), Some(why)) => {
            crate::debug!("library loaded, unusable on this device: {why}");
            drv::unusable_library(why)
        }
        (Err(e), None) => Err(e),
    }
}

/// A loaded module, or `CUDA_ERROR_INVALID_HANDLE`.
fn module(m: CUhandle) -> drv::CuRes<u64> {
    if drv::is_module(h(m))? {
        Ok(h(m))
    } else {
        Err(cuda::CUDA_ERROR_INVALID_HANDLE)
    }
}

/// Reads a module file into memory, NUL-terminated so PTX text is a C string.
fn read_module_file(name: *const c_char) -> drv::CuRes<Vec<u8>> {
    // SAFETY: `name` is the caller's C string (CUDA contract).
    let name = unsafe { c_name(name) }?;
    let file = std::fs::File::open(name).map_err(|e| {
        crate::debug!("cannot open module file {name}: {e}");
        cuda::CUDA_ERROR_FILE_NOT_FOUND
    })?;
    let len = file
        .metadata()
        .map_err(|_| cuda::CUDA_ERROR_FILE_NOT_FOUND)?
        .len();
    if len > MAX_MODULE_FILE {
        crate::warn!("module file {name} has {len} bytes; at most {MAX_MODULE_FILE} are loaded");
        return Err(cuda::CUDA_ERROR_INVALID_IMAGE);
    }
    let mut bytes = Vec::with_capacity(len as usize + 1);
    std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_MODULE_FILE), &mut bytes)
        .map_err(|_| cuda::CUDA_ERROR_FILE_NOT_FOUND)?;
    bytes.push(0);
    Ok(bytes)
}

/// Looks every kernel of a module up, at most `max`.
pub(crate) fn module_functions(m: u64, max: usize) -> drv::CuRes<Vec<u64>> {
    drv::module_function_names(m)?
        .iter()
        .take(max)
        .map(|name| drv::module_get_function(m, name))
        .collect()
}

/// Writes kernel handles to a caller's array of `n` entries.
fn write_handles(out: *mut CUhandle, n: c_uint, handles: &[u64]) -> drv::CuRes<()> {
    if out.is_null() || n == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    for (i, &f) in handles.iter().enumerate().take(n as usize) {
        out!(out.wrapping_add(i), p(f))?;
    }
    Ok(())
}

/// A parameter's offset and size from the cached layout.
fn param_info(f: u64, index: usize, offset: *mut usize, size: *mut usize) -> drv::CuRes<()> {
    let l = drv::func_layout(f)?;
    let (Some(&o), Some(&s)) = (l.offsets.get(index), l.sizes.get(index)) else {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    };
    if offset.is_null() && size.is_null() {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    if !offset.is_null() {
        out!(offset, o as usize)?;
    }
    if !size.is_null() {
        out!(size, s as usize)?;
    }
    Ok(())
}

// ---- modules and functions ---------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut c_int) -> CUresult {
    ffi("cuModuleGetLoadingMode", || out!(mode, MODULE_LAZY_LOADING))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoad(m: *mut CUhandle, fname: *const c_char) -> CUresult {
    ffi("cuModuleLoad", || {
        let bytes = read_module_file(fname)?;
        module_load(m, bytes.as_ptr().cast(), None)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadFatBinary(m: *mut CUhandle, fat: *const c_void) -> CUresult {
    ffi("cuModuleLoadFatBinary", || module_load(m, fat, None))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunctionCount(count: *mut c_uint, m: CUhandle) -> CUresult {
    ffi("cuModuleGetFunctionCount", || {
        let n = drv::module_function_names(module(m)?)?.len();
        out!(count, c_uint::try_from(n).unwrap_or(c_uint::MAX))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleEnumerateFunctions(
    functions: *mut CUhandle,
    n: c_uint,
    m: CUhandle,
) -> CUresult {
    ffi("cuModuleEnumerateFunctions", || {
        write_handles(functions, n, &module_functions(module(m)?, n as usize)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetName(name: *mut *const c_char, f: CUhandle) -> CUresult {
    ffi("cuFuncGetName", || {
        // The pointer stays valid while the function's module is loaded: the
        // cached entry owns the string and is not replaced.
        out!(name, drv::func_layout(h(f))?.name.as_ptr())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetModule(m: *mut CUhandle, f: CUhandle) -> CUresult {
    ffi("cuFuncGetModule", || {
        out!(m, p(drv::func_layout(h(f))?.module))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetParamInfo(
    f: CUhandle,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    ffi("cuFuncGetParamInfo", || {
        param_info(h(f), index, offset, size)
    })
}

/// CUDA 13's `cuFuncGetParamCount`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetParamCount(f: CUhandle, count: *mut usize) -> CUresult {
    ffi("cuFuncGetParamCount", || {
        out!(count, drv::func_layout(h(f))?.offsets.len())
    })
}

// ---- libraries -----------------------------------------------------------------

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLibraryLoadData(
    lib: *mut CUhandle,
    code: *const c_void,
    _jit_opts: *mut c_int,
    _jit_vals: *mut *mut c_void,
    _n_jit: c_uint,
    _lib_opts: *mut c_int,
    _lib_vals: *mut *mut c_void,
    _n_lib: c_uint,
) -> CUresult {
    // A library is loaded as a module of the current context (or the primary
    // one). The options (JIT options, CU_LIBRARY_BINARY_IS_PRESERVED) need no
    // action: the image is copied to the host at once.
    ffi("cuLibraryLoadData", || {
        let h = load_library(code)?;
        out!(lib, p(h))
    })
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    lib: *mut CUhandle,
    fname: *const c_char,
    _jit_opts: *mut c_int,
    _jit_vals: *mut *mut c_void,
    _n_jit: c_uint,
    _lib_opts: *mut c_int,
    _lib_vals: *mut *mut c_void,
    _n_lib: c_uint,
) -> CUresult {
    ffi("cuLibraryLoadFromFile", || {
        let bytes = read_module_file(fname)?;
        let h = load_library(bytes.as_ptr().cast())?;
        out!(lib, p(h))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLibraryUnload(lib: CUhandle) -> CUresult {
    ffi("cuLibraryUnload", || {
        if drv::drop_unusable(h(lib))? {
            return Ok(());
        }
        drv::in_library_context(|| drv::module_unload(h(lib)))?;
        drv::library_unloaded(h(lib))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetModule(m: *mut CUhandle, lib: CUhandle) -> CUresult {
    ffi("cuLibraryGetModule", || {
        library(lib)?;
        out!(m, p(module(lib)?))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetKernel(
    k: *mut CUhandle,
    lib: CUhandle,
    name: *const c_char,
) -> CUresult {
    ffi("cuLibraryGetKernel", || {
        // SAFETY: `name` is the caller's C string (CUDA contract).
        let name = unsafe { c_name(name) }?;
        let lib = library(lib)?;
        let kernel = drv::in_library_context(|| drv::module_get_function(lib, name))?;
        out!(k, p(kernel))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetKernelCount(count: *mut c_uint, lib: CUhandle) -> CUresult {
    ffi("cuLibraryGetKernelCount", || {
        library(lib)?;
        let lib = module(lib)?;
        let n = drv::in_library_context(|| drv::module_function_names(lib))?.len();
        out!(count, c_uint::try_from(n).unwrap_or(c_uint::MAX))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryEnumerateKernels(
    kernels: *mut CUhandle,
    n: c_uint,
    lib: CUhandle,
) -> CUresult {
    ffi("cuLibraryEnumerateKernels", || {
        library(lib)?;
        let lib = module(lib)?;
        let handles = drv::in_library_context(|| module_functions(lib, n as usize))?;
        write_handles(kernels, n, &handles)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetGlobal(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    lib: CUhandle,
    name: *const c_char,
) -> CUresult {
    ffi("cuLibraryGetGlobal", || {
        // SAFETY: `name` is the caller's C string (CUDA contract).
        let name = unsafe { c_name(name) }?;
        let lib = library(lib)?;
        let (a, s) = drv::in_library_context(|| drv::module_get_global(lib, name))?;
        if !dptr.is_null() {
            out!(dptr, a)?;
        }
        if !bytes.is_null() {
            out!(bytes, s as usize)?;
        }
        Ok(())
    })
}

/// `cuLibraryGetManaged`: a `__managed__` variable, reachable from the host at the
/// address it returns (`CUDA_ERROR_NOT_FOUND` for a variable that is not managed).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetManaged(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    lib: CUhandle,
    name: *const c_char,
) -> CUresult {
    ffi("cuLibraryGetManaged", || {
        // SAFETY: `name` is the caller's C string (CUDA contract).
        let name = unsafe { c_name(name) }?;
        let lib = library(lib)?;
        let (a, s, managed) = drv::in_library_context(|| drv::module_global(lib, name))?;
        if !managed {
            return Err(cuda::CUDA_ERROR_NOT_FOUND);
        }
        if !dptr.is_null() {
            out!(dptr, a)?;
        }
        if !bytes.is_null() {
            out!(bytes, s as usize)?;
        }
        Ok(())
    })
}

// ---- kernels -------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetFunction(f: *mut CUhandle, k: CUhandle) -> CUresult {
    ffi("cuKernelGetFunction", || {
        drv::func_layout(h(k)).inspect_err(|_| {
            crate::debug!(
                "cuKernelGetFunction({:#x}): not a kernel vgpu handed out",
                h(k)
            );
        })?;
        out!(f, k)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetName(name: *mut *const c_char, k: CUhandle) -> CUresult {
    // SAFETY: same contract as cuFuncGetName.
    unsafe { cuFuncGetName(name, k) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetLibrary(lib: *mut CUhandle, k: CUhandle) -> CUresult {
    ffi("cuKernelGetLibrary", || {
        out!(lib, p(drv::func_layout(h(k))?.module))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetParamInfo(
    k: CUhandle,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    ffi("cuKernelGetParamInfo", || {
        param_info(h(k), index, offset, size)
    })
}

/// CUDA 13's `cuKernelGetParamCount`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetParamCount(k: CUhandle, count: *mut usize) -> CUresult {
    ffi("cuKernelGetParamCount", || {
        out!(count, drv::func_layout(h(k))?.offsets.len())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetAttribute(
    pi: *mut c_int,
    attr: c_int,
    k: CUhandle,
    dev: CUdevice,
) -> CUresult {
    ffi("cuKernelGetAttribute", || {
        check_device(dev)?;
        out!(
            pi,
            drv::in_library_context(|| drv::func_get_attribute(h(k), attr))?
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuKernelSetAttribute(
    attr: c_int,
    value: c_int,
    k: CUhandle,
    dev: CUdevice,
) -> CUresult {
    ffi("cuKernelSetAttribute", || {
        check_device(dev)?;
        drv::in_library_context(|| drv::func_set_attribute(h(k), attr, value))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuKernelSetCacheConfig(k: CUhandle, _config: c_int, dev: CUdevice) -> CUresult {
    // The cache split is a hint; the simulated GPU has no L1 to split.
    ffi("cuKernelSetCacheConfig", || {
        check_device(dev)?;
        drv::func_layout(h(k)).map(drop)
    })
}
