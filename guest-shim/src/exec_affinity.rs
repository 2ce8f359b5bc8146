//! Execution affinity (CUDA 11.4: a context limited to part of the device's SMs, as MPS
//! clients use it). `CU_EXEC_AFFINITY_TYPE_SM_COUNT` is supported: a context created with it
//! (`cuCtxCreate_v3`, `_v4`) runs its kernels on that many of the device's multiprocessors,
//! vgpud's `CtxCreateAffinity` (the mechanism of green contexts, [`crate::green_ctx`]). The
//! count is rounded up to the device's partition granularity and capped at its SM count, as
//! NVIDIA's driver may round it; `cuCtxGetExecAffinity` reports what the context got.
#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Mutex, MutexGuard, OnceLock};

use vgpu_proto::{cuda, msg};

use crate::driver::{self as drv, CuRes};
use crate::exports::CUdevice;
use crate::ffi::{CUresult, ffi};
use crate::green_ctx::{self, Granularity};
use crate::{in_bytes, out_bytes};

/// `CU_EXEC_AFFINITY_TYPE_SM_COUNT`.
pub const TYPE_SM_COUNT: c_int = 0;
/// `CU_EXEC_AFFINITY_TYPE_MAX`: the affinity types are 0 up to this.
const TYPE_MAX: c_int = 1;
/// `sizeof(CUexecAffinityParam)`: the type and a union of one `unsigned int`.
pub const PARAM_BYTES: usize = 8;

fn check_type(ty: c_int) -> CuRes<()> {
    if (0..TYPE_MAX).contains(&ty) {
        Ok(())
    } else {
        Err(cuda::CUDA_ERROR_INVALID_VALUE)
    }
}

/// The contexts created with an SM count: handle → SMs.
fn limited() -> MutexGuard<'static, HashMap<u64, u32>> {
    static M: OnceLock<Mutex<HashMap<u64, u32>>> = OnceLock::new();
    M.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The SMs of context `c` if it was created with an SM count.
pub fn sms_of(c: u64) -> Option<u32> {
    limited().get(&c).copied()
}

/// Forgets a destroyed context.
pub fn context_gone(c: u64) {
    limited().remove(&c);
}

/// The SMs a context asked for with `want` gets on a device of `sms` SMs: rounded up to the
/// partition granularity, at most `sms`; 0 is refused.
pub fn granted(want: u32, sms: u32, g: Granularity) -> CuRes<u32> {
    if want == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let rounded = want.max(g.min).div_ceil(g.align).saturating_mul(g.align);
    Ok(rounded.min(sms))
}

/// The SM count of the affinity parameters (`CUexecAffinityParam[n]`): each type at most once,
/// only `CU_EXEC_AFFINITY_TYPE_SM_COUNT` known.
pub fn sm_count_of(params: &[u8]) -> CuRes<u32> {
    let mut count = None;
    for p in params.chunks_exact(PARAM_BYTES) {
        let ty = c_int::from_le_bytes([p[0], p[1], p[2], p[3]]);
        let val = u32::from_le_bytes([p[4], p[5], p[6], p[7]]);
        check_type(ty)?;
        if count.replace(val).is_some() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
    }
    count.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)
}

/// `cuCtxCreate_v3`/`_v4` with `n` affinity parameters at `params`: creates the context (made
/// current) on the SMs they ask for.
pub fn create(params: *const c_void, n: c_int, flags: c_uint, dev: CUdevice) -> CuRes<u64> {
    drv::driver()?;
    drv::check_device(dev)?;
    let n = usize::try_from(n).map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?;
    let want = sm_count_of(in_bytes!(params, n * PARAM_BYTES))?;
    let sm_count = granted(want, green_ctx::device_sms()?, green_ctx::granularity(0)?)?;
    let c = drv::ctx_create_with(
        &msg::CtxCreateAffinity {
            device: 0,
            flags,
            sm_count,
        },
        flags,
    )?;
    limited().insert(c, sm_count);
    Ok(c)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetExecAffinitySupport(
    pi: *mut c_int,
    ty: c_int,
    dev: CUdevice,
) -> CUresult {
    ffi("cuDeviceGetExecAffinitySupport", || {
        drv::driver()?;
        drv::check_device(dev)?;
        check_type(ty)?;
        crate::out!(pi, 1)
    })
}

/// `cuCtxGetExecAffinity`: the current context's SMs (a green context's, one created with an
/// affinity, or the device's).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetExecAffinity(p: *mut c_void, ty: c_int) -> CUresult {
    ffi("cuCtxGetExecAffinity", || {
        drv::driver()?;
        let c = drv::current_ctx().ok_or(cuda::CUDA_ERROR_INVALID_CONTEXT)?;
        let out = out_bytes!(p, PARAM_BYTES);
        check_type(ty)?;
        let sms = match sms_of(c).or_else(|| green_ctx::sms_of(c)) {
            Some(n) => n,
            None => green_ctx::device_sms()?,
        };
        out[..4].copy_from_slice(&TYPE_SM_COUNT.to_le_bytes());
        out[4..].copy_from_slice(&sms.to_le_bytes());
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(ty: c_int, val: u32) -> Vec<u8> {
        [ty.to_le_bytes(), val.to_le_bytes()].concat()
    }

    #[test]
    fn an_sm_count_is_rounded_up_to_the_granularity_and_capped() {
        let g8 = Granularity::of(8, 0);
        assert_eq!(granted(3, 108, g8), Ok(4));
        assert_eq!(granted(1, 108, g8), Ok(2));
        assert_eq!(granted(500, 108, g8), Ok(108));
        assert_eq!(granted(9, 132, Granularity::of(9, 0)), Ok(16));
        assert_eq!(granted(0, 108, g8), Err(cuda::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(granted(u32::MAX, 8, g8), Ok(8));
    }

    #[test]
    fn affinity_parameters_name_the_sm_count_once() {
        assert_eq!(sm_count_of(&param(0, 6)), Ok(6));
        assert_eq!(
            sm_count_of(&[param(0, 6), param(0, 4)].concat()),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            sm_count_of(&param(1, 6)),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(sm_count_of(&[]), Err(cuda::CUDA_ERROR_INVALID_VALUE));
    }
}
