//! Kernel node attributes (`cuGraphKernelNodeSetAttribute`, `…GetAttribute`,
//! `…CopyAttributes`). vgpu keeps none: every kernel node has the default attributes. A node
//! priority (`CU_LAUNCH_ATTRIBUTE_PRIORITY`) other than the default 0 is refused with
//! `CUDA_ERROR_NOT_SUPPORTED`: a graph's branches run at the launch stream's priority
//! ([docs/graphs.md](../../../docs/graphs.md)); other attributes are refused the same way.
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
/// A node's priority when none is set (CUDA's default).
const DEFAULT_PRIORITY: c_int = 0;

/// `CUkernelNodeAttrValue` (`CUlaunchAttributeValue`): a 64-byte union; `priority` is the
/// `int` at its start.
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelNodeAttrValue {
    /// The union's bytes as `int`s.
    pub words: [c_int; 16],
}

const _: () = assert!(size_of::<KernelNodeAttrValue>() == 64);

/// Checks that `node` is a kernel node of a graph.
fn kernel_node(node: CUhandle) -> CuRes<()> {
    match registry().node(h(node))?.kind {
        NodeKind::Kernel(_) => Ok(()),
        _ => Err(cuda::CUDA_ERROR_INVALID_VALUE),
    }
}

/// The refusal of an attribute vgpu does not keep.
fn refuse(attr: c_int) -> CUresult {
    if attr == ATTRIBUTE_PRIORITY {
        drv::unsupported(
            "kernel node priorities other than 0 (graph branches run at the launch stream's priority)",
        )
    } else {
        drv::unsupported(&format!("kernel node attribute {attr}"))
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphKernelNodeSetAttribute(
    node: CUhandle,
    attr: c_int,
    value: *const KernelNodeAttrValue,
) -> CUresult {
    ffi("cuGraphKernelNodeSetAttribute", || {
        kernel_node(node)?;
        // SAFETY: NULL or the caller's CUkernelNodeAttrValue (CUDA contract).
        let v = unsafe { value.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        if attr == ATTRIBUTE_PRIORITY && v.words[0] == DEFAULT_PRIORITY {
            return Ok(());
        }
        Err(refuse(attr))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphKernelNodeGetAttribute(
    node: CUhandle,
    attr: c_int,
    value: *mut KernelNodeAttrValue,
) -> CUresult {
    ffi("cuGraphKernelNodeGetAttribute", || {
        kernel_node(node)?;
        if attr != ATTRIBUTE_PRIORITY {
            return Err(refuse(attr));
        }
        let mut v = KernelNodeAttrValue { words: [0; 16] };
        v.words[0] = DEFAULT_PRIORITY;
        out!(value, v)
    })
}

/// Both nodes have the default attributes: there is nothing to copy.
#[unsafe(no_mangle)]
pub extern "C" fn cuGraphKernelNodeCopyAttributes(dst: CUhandle, src: CUhandle) -> CUresult {
    ffi("cuGraphKernelNodeCopyAttributes", || {
        kernel_node(dst)?;
        kernel_node(src)
    })
}
