//! The launch API of CUDA before 4.0, which `cuda.h` still declares (deprecated) and older
//! programs and bindings still call: a function's block shape, dynamic shared memory and
//! parameter bytes are set one call at a time (`cuFuncSetBlockShape`, `cuFuncSetSharedSize`,
//! `cuParamSetSize`, `cuParamSeti`, `cuParamSetf`, `cuParamSetv`), then `cuLaunch`,
//! `cuLaunchGrid` or `cuLaunchGridAsync` launches it. Each launch is a `cuLaunchKernel` of the
//! bytes set so far, which must cover the kernel's parameters, as an `extra` buffer must.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{c_float, c_int, c_uint, c_void};
use std::sync::{Mutex, MutexGuard, OnceLock};

use vgpu_proto::cuda;

use crate::driver as drv;
use crate::exports::{CUhandle, h};
use crate::ffi::{CUresult, ffi};

/// Most parameter bytes a function takes this way: the 4 KiB of kernel parameters CUDA allowed
/// when this API was current.
const MAX_PARAM_BYTES: usize = 4096;

/// What the calls before a launch set for one function.
#[derive(Debug, Default)]
struct Pending {
    /// `cuFuncSetBlockShape`; a launch without it is refused.
    block: Option<[u32; 3]>,
    /// `cuFuncSetSharedSize`.
    shared: u32,
    /// The bytes written by `cuParamSet*`, zero elsewhere.
    params: Vec<u8>,
    /// `cuParamSetSize`; the bytes written so far when unset.
    size: Option<usize>,
}

fn pending() -> MutexGuard<'static, HashMap<u64, Pending>> {
    static PENDING: OnceLock<Mutex<HashMap<u64, Pending>>> = OnceLock::new();
    PENDING
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `f` on function `func`'s settings, after checking the handle. A new entry first drops
/// those of functions that are gone (their modules unloaded), so the map holds live functions
/// only.
fn with_pending<T>(func: u64, f: impl FnOnce(&mut Pending) -> drv::CuRes<T>) -> drv::CuRes<T> {
    drv::func_layout(func)?;
    let mut map = pending();
    if !map.contains_key(&func) {
        map.retain(|&g, _| drv::func_layout(g).is_ok());
    }
    f(map.entry(func).or_default())
}

/// Writes `bytes` at `offset` of the function's parameter bytes.
fn set_param(func: u64, offset: c_int, bytes: &[u8]) -> drv::CuRes<()> {
    let at = usize::try_from(offset).map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?;
    let end = at
        .checked_add(bytes.len())
        .filter(|&e| e <= MAX_PARAM_BYTES)
        .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    with_pending(func, |p| {
        if p.params.len() < end {
            p.params.resize(end, 0);
        }
        p.params[at..end].copy_from_slice(bytes);
        Ok(())
    })
}

/// Launches `func` with what was set for it: the kernel's parameter bytes, of at most the size
/// set, which must cover them.
fn launch(func: u64, grid: [u32; 3], stream: u64) -> drv::CuRes<()> {
    let needed = drv::func_layout(func)?.param_bytes();
    let (block, shared, params) = {
        let map = pending();
        let p = map.get(&func).ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        let block = p.block.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        if p.size.unwrap_or(p.params.len()) < needed {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let mut bytes = p.params[..needed.min(p.params.len())].to_vec();
        bytes.resize(needed, 0);
        (block, p.shared, bytes)
    };
    drv::launch(func, grid, block, shared, stream, &params)
}

fn grid_dim(n: c_int) -> drv::CuRes<u32> {
    u32::try_from(n)
        .ok()
        .filter(|&n| n > 0)
        .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetBlockShape(f: CUhandle, x: c_int, y: c_int, z: c_int) -> CUresult {
    ffi("cuFuncSetBlockShape", || {
        let block = [grid_dim(x)?, grid_dim(y)?, grid_dim(z)?];
        with_pending(h(f), |p| {
            p.block = Some(block);
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuFuncSetSharedSize(f: CUhandle, bytes: c_uint) -> CUresult {
    ffi("cuFuncSetSharedSize", || {
        with_pending(h(f), |p| {
            p.shared = bytes;
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuParamSetSize(f: CUhandle, bytes: c_uint) -> CUresult {
    ffi("cuParamSetSize", || {
        let size = usize::try_from(bytes)
            .ok()
            .filter(|&n| n <= MAX_PARAM_BYTES)
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        with_pending(h(f), |p| {
            p.size = Some(size);
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuParamSeti(f: CUhandle, offset: c_int, value: c_uint) -> CUresult {
    ffi("cuParamSeti", || {
        set_param(h(f), offset, &value.to_ne_bytes())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuParamSetf(f: CUhandle, offset: c_int, value: c_float) -> CUresult {
    ffi("cuParamSetf", || {
        set_param(h(f), offset, &value.to_ne_bytes())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuParamSetv(
    f: CUhandle,
    offset: c_int,
    ptr: *mut c_void,
    bytes: c_uint,
) -> CUresult {
    ffi("cuParamSetv", || {
        let n = usize::try_from(bytes).map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?;
        if n > MAX_PARAM_BYTES {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        if n == 0 {
            return set_param(h(f), offset, &[]);
        }
        if ptr.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's `bytes` readable bytes at `ptr` (CUDA contract), at most
        // MAX_PARAM_BYTES (checked above).
        let v = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), n) };
        set_param(h(f), offset, v)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunch(f: CUhandle) -> CUresult {
    ffi("cuLaunch", || launch(h(f), [1, 1, 1], 0))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchGrid(f: CUhandle, width: c_int, height: c_int) -> CUresult {
    ffi("cuLaunchGrid", || {
        launch(h(f), [grid_dim(width)?, grid_dim(height)?, 1], 0)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchGridAsync(
    f: CUhandle,
    width: c_int,
    height: c_int,
    stream: CUhandle,
) -> CUresult {
    ffi("cuLaunchGridAsync", || {
        launch(h(f), [grid_dim(width)?, grid_dim(height)?, 1], h(stream))
    })
}
