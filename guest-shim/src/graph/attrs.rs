//! Kernel node attributes (`cuGraphKernelNodeSetAttribute`, `…GetAttribute`,
//! `…CopyAttributes`). vgpu keeps a node's priority (`CU_LAUNCH_ATTRIBUTE_PRIORITY`, clamped to
//! the device's range as CUDA clamps it), which a graph instantiated with
//! `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY` runs the node with
//! ([docs/graphs.md](../../../docs/graphs.md)); other attributes are refused with
//! `CUDA_ERROR_NOT_SUPPORTED`.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_int;

use vgpu_proto::cuda;

use super::{NodeKind, registry};
use crate::driver::{self as drv, CuRes};
use crate::exports::{CUhandle, h};
use crate::ffi::{CUresult, ffi};
use crate::out;

/// `CU_LAUNCH_ATTRIBUTE_PRIORITY`.
pub const ATTRIBUTE_PRIORITY: c_int = 8;

/// `CUkernelNodeAttrValue` (`CUlaunchAttributeValue`): a 64-byte union; `priority` is the
/// `int` at its start.
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelNodeAttrValue {
    /// The union's bytes as `int`s.
    pub words: [c_int; 16],
}

const _: () = assert!(size_of::<KernelNodeAttrValue>() == 64);

/// A kernel node's priority; `CUDA_ERROR_INVALID_VALUE` for another node.
fn kernel_priority(node: CUhandle) -> CuRes<c_int> {
    match &registry().node(h(node))?.kind {
        NodeKind::Kernel(k) => Ok(k.priority),
        _ => Err(cuda::CUDA_ERROR_INVALID_VALUE),
    }
}

/// Sets a kernel node's priority.
fn set_kernel_priority(node: CUhandle, priority: c_int) -> CuRes<()> {
    match &mut registry().node_mut(h(node))?.kind {
        NodeKind::Kernel(k) => {
            k.priority = priority;
            Ok(())
        }
        _ => Err(cuda::CUDA_ERROR_INVALID_VALUE),
    }
}

/// The refusal of an attribute vgpu does not keep.
fn refuse(attr: c_int) -> CUresult {
    drv::unsupported(&format!("kernel node attribute {attr}"))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphKernelNodeSetAttribute(
    node: CUhandle,
    attr: c_int,
    value: *const KernelNodeAttrValue,
) -> CUresult {
    ffi("cuGraphKernelNodeSetAttribute", || {
        kernel_priority(node)?;
        // SAFETY: NULL or the caller's CUkernelNodeAttrValue (CUDA contract).
        let v = unsafe { value.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        if attr != ATTRIBUTE_PRIORITY {
            return Err(refuse(attr));
        }
        set_kernel_priority(node, v.words[0].clamp(drv::GREATEST_PRIORITY, 0))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphKernelNodeGetAttribute(
    node: CUhandle,
    attr: c_int,
    value: *mut KernelNodeAttrValue,
) -> CUresult {
    ffi("cuGraphKernelNodeGetAttribute", || {
        let priority = kernel_priority(node)?;
        if attr != ATTRIBUTE_PRIORITY {
            return Err(refuse(attr));
        }
        let mut v = KernelNodeAttrValue { words: [0; 16] };
        v.words[0] = priority;
        out!(value, v)
    })
}

/// Copies the attributes vgpu keeps (the priority) from `src` to `dst`.
#[unsafe(no_mangle)]
pub extern "C" fn cuGraphKernelNodeCopyAttributes(dst: CUhandle, src: CUhandle) -> CUresult {
    ffi("cuGraphKernelNodeCopyAttributes", || {
        kernel_priority(dst)?;
        set_kernel_priority(dst, kernel_priority(src)?)
    })
}
