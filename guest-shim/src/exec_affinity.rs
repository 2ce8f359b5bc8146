//! Execution affinity (CUDA 11.4: a context limited to part of the device's SMs, as MPS
//! clients use it): the queries, answered as NVIDIA's driver answers them for a device without
//! it. A VM shares its GPU by time slices (vgpud's scheduler), not by SM partitions, so no
//! affinity type is supported, and a context asked for one (`cuCtxCreate_v3`, `_v4`) is refused
//! with `CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY`.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_int, c_void};

use vgpu_proto::cuda;

use crate::driver::{self as drv, CuRes};
use crate::exports::CUdevice;
use crate::ffi::{CUresult, ffi};
use crate::out;

/// `CU_EXEC_AFFINITY_TYPE_MAX`: the affinity types are 0 (`CU_EXEC_AFFINITY_TYPE_SM_COUNT`)
/// up to this.
const TYPE_MAX: c_int = 1;

fn check_type(ty: c_int) -> CuRes<()> {
    if (0..TYPE_MAX).contains(&ty) {
        Ok(())
    } else {
        Err(cuda::CUDA_ERROR_INVALID_VALUE)
    }
}

/// A context with execution affinity: refused, no type being supported.
pub fn refuse_context(what: &str) -> CUresult {
    crate::debug!("{what}: execution affinity is not supported (VMs share the GPU by time slices)");
    cuda::CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY
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
        out!(pi, 0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetExecAffinity(p: *mut c_void, ty: c_int) -> CUresult {
    ffi("cuCtxGetExecAffinity", || {
        drv::driver()?;
        drv::current_ctx().ok_or(cuda::CUDA_ERROR_INVALID_CONTEXT)?;
        if p.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        check_type(ty)?;
        Err(cuda::CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY)
    })
}
