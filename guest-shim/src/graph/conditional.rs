//! Conditional nodes (CUDA 12.3+): `cuGraphConditionalHandleCreate`, and nodes of type
//! `CU_GRAPH_NODE_TYPE_CONDITIONAL` added with `cuGraphAddNode(_v2)` (or by libraries that
//! capture into their bodies with `cuStreamBeginCaptureToGraph`). A conditional node owns its
//! body graphs, as a child graph node owns its graph; at instantiation each body becomes a node
//! list of its own inside the node's upload ([`vgpu_proto::graph::CONDITIONAL_NODE`]), and
//! vgpud runs the chosen body when the launch reaches the node, with the handle's value that the
//! launch's kernels set with `cudaGraphSetConditional`.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_int, c_uint};

use vgpu_proto::cuda;
use vgpu_proto::graph::conditional;

use super::api::add;
use super::generic::GraphNodeParams;
use super::{NodeKind, registry};
use crate::driver::CuRes;
use crate::exports::{CUhandle, h};
use crate::ffi::{CUresult, ffi};
use crate::out;

/// `CUDA_CONDITIONAL_NODE_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ConditionalNodeParams {
    /// `CUgraphConditionalHandle`.
    pub handle: u64,
    /// `CUgraphConditionalNodeType`.
    pub ty: c_int,
    /// How many body graphs.
    pub size: c_uint,
    /// Out: the node's array of body graphs (owned by the node).
    pub bodies_out: *mut CUhandle,
    /// Context (vgpu runs the node in the graph launch's).
    pub ctx: CUhandle,
}

const _: () = {
    assert!(std::mem::size_of::<ConditionalNodeParams>() == 32);
    assert!(std::mem::offset_of!(ConditionalNodeParams, bodies_out) == 16);
};

/// A conditional handle: the graph it was created for and its value at each launch's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle {
    /// The graph it belongs to.
    pub graph: u64,
    /// `defaultLaunchValue`.
    pub default: u32,
    /// `CU_GRAPH_COND_*` flags.
    pub flags: u32,
}

/// A conditional node's work: its handle, its type and the body graphs it owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conditional {
    /// The conditional handle.
    pub handle: u64,
    /// The handle's default value and flags (kept with the node: the handle goes with its
    /// graph, and an executable graph outlives the graph it was made from).
    pub start: Handle,
    /// `CUgraphConditionalNodeType`.
    pub kind: u32,
    /// The body graphs (owned by the node). Boxed: the application keeps the array's address
    /// (`phGraph_out`) for the node's lifetime, and the box's contents do not move with it.
    pub bodies: Box<[u64]>,
}

/// Most conditional handles one process may hold.
const MAX_HANDLES: usize = 1 << 16;

/// `cuGraphConditionalHandleCreate`.
fn create_handle(out: *mut u64, graph: CUhandle, default: c_uint, flags: c_uint) -> CuRes<()> {
    if out.is_null() || flags & !conditional::ASSIGN_DEFAULT != 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let mut reg = registry();
    reg.graph(h(graph))?;
    if reg.cond_handles.len() >= MAX_HANDLES {
        return Err(cuda::CUDA_ERROR_OUT_OF_MEMORY);
    }
    let handle = reg.handle();
    reg.cond_handles.insert(
        handle,
        Handle {
            graph: h(graph),
            default,
            flags,
        },
    );
    out!(out, handle)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphConditionalHandleCreate(
    out: *mut u64,
    graph: CUhandle,
    _ctx: CUhandle,
    default: c_uint,
    flags: c_uint,
) -> CUresult {
    ffi("cuGraphConditionalHandleCreate", || {
        create_handle(out, graph, default, flags)
    })
}

/// `cuGraphAddNode` of a conditional node: creates its `size` empty body graphs and hands
/// their array back in `phGraph_out`.
///
/// Pointer contract (CUDA's): `prm` is a valid, writable `CUgraphNodeParams` of that type;
/// `deps` holds `n` nodes.
pub(super) fn add_node(
    out: *mut CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    n: usize,
    prm: *mut GraphNodeParams,
) -> CuRes<()> {
    // SAFETY: `prm` is valid for reads (this function's contract).
    let params = unsafe { &(*prm).params };
    // SAFETY: the member of the type's union (CUDA contract); integers and pointers.
    let c = unsafe { params.conditional };
    let kind = u32::try_from(c.ty).map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?;
    if !conditional::valid(kind, c.size) {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let start = *registry()
        .cond_handles
        .get(&c.handle)
        .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    let mut created = Vec::new();
    let r = add(out, graph, deps, n, || {
        let mut reg = registry();
        for _ in 0..c.size {
            let body = reg.create_graph()?;
            reg.graph_mut(body)?.owned = true;
            created.push(body);
        }
        Ok(NodeKind::Conditional(Conditional {
            handle: c.handle,
            start,
            kind,
            bodies: created.clone().into_boxed_slice(),
        }))
    });
    let mut reg = registry();
    if let Err(e) = r {
        for b in created {
            let _ = reg.destroy_graph(b);
        }
        return Err(e);
    }
    // SAFETY: `out` was written by `add` (valid, this function's contract).
    let node = h(unsafe { out.read() });
    let NodeKind::Conditional(cond) = &reg.node(node)?.kind else {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    };
    let array = cond.bodies.as_ptr().cast_mut().cast::<CUhandle>();
    // SAFETY: `prm` is valid and writable (this function's contract); the address of the
    // union member's out-field.
    let field = unsafe { &raw mut (*prm).params.conditional.bodies_out };
    out!(field, array)
}

/// The operation a conditional node becomes at instantiation: its bodies lowered as a graph's
/// nodes are (`lower` turns a body graph into its operations). A body may hold kernels, device
/// copies and memsets, empty nodes, child graphs and conditional nodes, as CUDA allows; anything
/// else (host functions, copies from or to pageable host memory, events, allocations) is
/// `CUDA_ERROR_NOT_SUPPORTED`.
pub(super) fn lower(
    c: &Conditional,
    mut lower_body: impl FnMut(u64) -> CuRes<Vec<super::exec::PlanOp>>,
) -> CuRes<super::Op> {
    let mut bodies = Vec::with_capacity(c.bodies.len());
    for &b in c.bodies.iter() {
        let ops = lower_body(b)?;
        let allowed = |op: &Option<super::Op>| {
            matches!(
                op,
                None | Some(
                    super::Op::Kernel { .. }
                        | super::Op::Memset { .. }
                        | super::Op::DtoD { .. }
                        | super::Op::Conditional { .. }
                )
            )
        };
        if let Some((op, _)) = ops.iter().find(|(op, _)| !allowed(op)) {
            crate::debug!(
                "a conditional body holds only kernels, device copies and memsets, empty, child \
                 graph and conditional nodes, not {op:?}"
            );
            return Err(cuda::CUDA_ERROR_NOT_SUPPORTED);
        }
        bodies.push(ops);
    }
    Ok(super::Op::Conditional {
        handle: c.handle,
        kind: c.kind,
        default: c.start.default,
        flags: c.start.flags,
        bodies,
    })
}
