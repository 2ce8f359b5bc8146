//! `cuPointerGetAttribute(s)`: what an address is, from the shim's record of
//! the device memory and page-locked host memory it handed out.
//!
//! Types and answers follow the CUDA driver: boolean attributes are one byte;
//! `cuPointerGetAttribute` on an address vgpu does not know is
//! `CUDA_ERROR_INVALID_VALUE`, while `cuPointerGetAttributes` succeeds and
//! reports it as unregistered host memory (memory type 0, host pointer the
//! address itself, device ordinal -2), which is how the CUDA runtime's
//! `cudaPointerGetAttributes` tells pageable host memory apart.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_uint, c_void};

use vgpu_proto::cuda;

use crate::driver::{self as drv, Allocation};
use crate::exports::CUdeviceptr;
use crate::ffi::{CUresult, ffi};
use crate::out;

/// `CUpointer_attribute` values.
pub mod attr {
    pub const CONTEXT: i32 = 1;
    pub const MEMORY_TYPE: i32 = 2;
    pub const DEVICE_POINTER: i32 = 3;
    pub const HOST_POINTER: i32 = 4;
    pub const P2P_TOKENS: i32 = 5;
    pub const SYNC_MEMOPS: i32 = 6;
    pub const BUFFER_ID: i32 = 7;
    pub const IS_MANAGED: i32 = 8;
    pub const DEVICE_ORDINAL: i32 = 9;
    pub const IS_LEGACY_CUDA_IPC_CAPABLE: i32 = 10;
    pub const RANGE_START_ADDR: i32 = 11;
    pub const RANGE_SIZE: i32 = 12;
    pub const MAPPED: i32 = 13;
    pub const ALLOWED_HANDLE_TYPES: i32 = 14;
    pub const IS_GPU_DIRECT_RDMA_CAPABLE: i32 = 15;
    pub const ACCESS_FLAGS: i32 = 16;
    pub const MEMPOOL_HANDLE: i32 = 17;
    pub const MAPPING_SIZE: i32 = 18;
    pub const MAPPING_BASE_ADDR: i32 = 19;
    pub const MEMORY_BLOCK_ID: i32 = 20;
    pub const IS_HW_DECOMPRESS_CAPABLE: i32 = 21;
}

/// `CU_MEMORYTYPE_HOST`.
const MEMORYTYPE_HOST: u32 = 1;
/// `CU_MEMORYTYPE_DEVICE`.
const MEMORYTYPE_DEVICE: u32 = 2;
/// `CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE`.
const ACCESS_READWRITE: u32 = 3;
/// The device ordinal `cuPointerGetAttributes` reports for unknown memory.
const NO_DEVICE_ORDINAL: i32 = -2;
/// Most attributes one `cuPointerGetAttributes` call asks for (CUDA has 21).
const MAX_ATTRIBUTES: c_uint = 64;

/// One attribute's value, in the type CUDA writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    Bool(bool),
    U32(u32),
    I32(i32),
    U64(u64),
}

/// The value of attribute `a` for `ptr` in allocation `alloc` (None: unknown
/// memory); `Err` for attributes that do not apply.
fn value(a: i32, ptr: u64, alloc: Option<Allocation>) -> drv::CuRes<Value> {
    use Value::*;
    let range = match alloc {
        Some(Allocation::Device { base, size } | Allocation::PinnedHost { base, size }) => {
            Some((base, size))
        }
        None => None,
    };
    let device = matches!(alloc, Some(Allocation::Device { .. }));
    let known = alloc.is_some();
    Ok(match a {
        attr::CONTEXT => {
            // Memory belongs to the VM's device, shared by its contexts: the
            // current context (the primary one when none is current).
            if !known {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
            U64(match drv::current_ctx() {
                Some(c) => c,
                None => drv::primary_handle(0)?,
            })
        }
        attr::MEMORY_TYPE => U32(match alloc {
            Some(Allocation::Device { .. }) => MEMORYTYPE_DEVICE,
            Some(Allocation::PinnedHost { .. }) => MEMORYTYPE_HOST,
            None => return Err(cuda::CUDA_ERROR_INVALID_VALUE),
        }),
        attr::DEVICE_POINTER if device => U64(ptr),
        attr::HOST_POINTER if known && !device => U64(ptr),
        attr::SYNC_MEMOPS if known => Bool(false),
        attr::BUFFER_ID if known => U64(range.map_or(0, |r| r.0)),
        // An unsigned int, not a one-byte bool: callers (XLA, NVIDIA's runtime)
        // read four bytes, often uninitialised.
        attr::IS_MANAGED => U32(0),
        attr::DEVICE_ORDINAL if known => I32(0),
        attr::IS_LEGACY_CUDA_IPC_CAPABLE if known => Bool(false),
        attr::RANGE_START_ADDR | attr::MAPPING_BASE_ADDR if known => U64(range.map_or(0, |r| r.0)),
        attr::RANGE_SIZE | attr::MAPPING_SIZE if known => U64(range.map_or(0, |r| r.1)),
        attr::MAPPED if known => Bool(true),
        attr::ALLOWED_HANDLE_TYPES if known => U64(0),
        attr::IS_GPU_DIRECT_RDMA_CAPABLE | attr::IS_HW_DECOMPRESS_CAPABLE if known => Bool(false),
        attr::ACCESS_FLAGS if device => U32(ACCESS_READWRITE),
        attr::MEMPOOL_HANDLE if known => U64(0),
        attr::MEMORY_BLOCK_ID if known => U64(range.map_or(0, |r| r.0)),
        attr::P2P_TOKENS => return Err(cuda::CUDA_ERROR_NOT_SUPPORTED),
        _ => return Err(cuda::CUDA_ERROR_INVALID_VALUE),
    })
}

/// What `cuPointerGetAttributes` reports for an attribute it cannot answer
/// (unknown memory, or an attribute that does not apply, such as the host
/// pointer of device memory).
fn fallback(a: i32, ptr: u64, known: bool) -> Value {
    match a {
        attr::MEMORY_TYPE => Value::U32(0),
        attr::HOST_POINTER if !known => Value::U64(ptr),
        attr::DEVICE_ORDINAL => Value::I32(NO_DEVICE_ORDINAL),
        attr::IS_MANAGED => Value::U32(0),
        attr::SYNC_MEMOPS
        | attr::IS_LEGACY_CUDA_IPC_CAPABLE
        | attr::MAPPED
        | attr::IS_GPU_DIRECT_RDMA_CAPABLE
        | attr::IS_HW_DECOMPRESS_CAPABLE => Value::Bool(false),
        attr::ACCESS_FLAGS => Value::U32(0),
        _ => Value::U64(0),
    }
}

/// Writes a value through the caller's untyped pointer.
fn write(data: *mut c_void, v: Value) -> drv::CuRes<()> {
    match v {
        Value::Bool(b) => out!(data.cast::<u8>(), u8::from(b)),
        Value::U32(x) => out!(data.cast::<u32>(), x),
        Value::I32(x) => out!(data.cast::<i32>(), x),
        Value::U64(x) => out!(data.cast::<u64>(), x),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: i32,
    ptr: CUdeviceptr,
) -> CUresult {
    ffi("cuPointerGetAttribute", || {
        if let Some(r) = crate::alloc_exports::pointer_attr_hook(attribute, ptr, data) {
            return r;
        }
        let v = value(attribute, ptr, drv::allocation_of(ptr)?)?;
        write(data, v)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttributes(
    n: c_uint,
    attributes: *const i32,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    ffi("cuPointerGetAttributes", || {
        if n == 0 || n > MAX_ATTRIBUTES || attributes.is_null() || data.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: both arrays have `n` entries (CUDA contract), checked non-NULL above.
        let attributes = unsafe { std::slice::from_raw_parts(attributes, n as usize) };
        // SAFETY: as above.
        let data = unsafe { std::slice::from_raw_parts(data, n as usize) };
        let alloc = drv::allocation_of(ptr)?;
        for (&a, &d) in attributes.iter().zip(data) {
            if let Some(r) = crate::alloc_exports::pointer_attr_hook(a, ptr, d) {
                r?;
                continue;
            }
            let v = match value(a, ptr, alloc) {
                Ok(v) => v,
                Err(e) if e == cuda::CUDA_ERROR_NOT_SUPPORTED => return Err(e),
                Err(_) if (attr::CONTEXT..=attr::IS_HW_DECOMPRESS_CAPABLE).contains(&a) => {
                    fallback(a, ptr, alloc.is_some())
                }
                Err(e) => return Err(e),
            };
            // A NULL data entry skips the attribute.
            if !d.is_null() {
                write(d, v)?;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_memory_answers_as_cuda_does() {
        let a = Some(Allocation::Device {
            base: 0x1000,
            size: 0x100,
        });
        assert_eq!(
            value(attr::MEMORY_TYPE, 0x1010, a),
            Ok(Value::U32(MEMORYTYPE_DEVICE))
        );
        assert_eq!(
            value(attr::RANGE_START_ADDR, 0x1010, a),
            Ok(Value::U64(0x1000))
        );
        assert_eq!(value(attr::RANGE_SIZE, 0x1010, a), Ok(Value::U64(0x100)));
        assert_eq!(
            value(attr::DEVICE_POINTER, 0x1010, a),
            Ok(Value::U64(0x1010))
        );
        assert_eq!(value(attr::IS_MANAGED, 0x1010, a), Ok(Value::U32(0)));
        assert_eq!(
            value(attr::HOST_POINTER, 0x1010, a),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn unknown_memory_is_an_error_alone_and_unregistered_host_memory_in_a_batch() {
        assert_eq!(
            value(attr::MEMORY_TYPE, 0xdead, None),
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(fallback(attr::MEMORY_TYPE, 0xdead, false), Value::U32(0));
        assert_eq!(
            fallback(attr::HOST_POINTER, 0xdead, false),
            Value::U64(0xdead)
        );
        assert_eq!(
            fallback(attr::DEVICE_ORDINAL, 0xdead, false),
            Value::I32(-2)
        );
        assert_eq!(fallback(attr::IS_MANAGED, 0xdead, false), Value::U32(0));
        // Device memory has no host pointer.
        assert_eq!(fallback(attr::HOST_POINTER, 0x1000, true), Value::U64(0));
    }

    #[test]
    fn booleans_are_one_byte() {
        let mut buf = [0xffu8; 8];
        write(buf.as_mut_ptr().cast(), Value::Bool(true)).unwrap();
        assert_eq!(buf, [1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
    }
}
