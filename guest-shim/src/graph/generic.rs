//! The generic node API of CUDA 12.2+ (`cuGraphAddNode`, `cuGraphAddNode_v2`,
//! `cuGraphNodeSetParams`, `cuGraphExecNodeSetParams`): one `CUgraphNodeParams` structure
//! whose `type` selects a member of a union. Each node type goes to the code of its per-type
//! entry point ([`super::api`]), so a node is built and checked exactly as that call builds it.
//! Conditional nodes are built by [`super::conditional`]; external semaphore nodes are
//! `CUDA_ERROR_NOT_SUPPORTED`, as their per-type calls are.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::cell::Cell;
use std::ffi::c_int;
use std::mem::{offset_of, size_of};

use vgpu_proto::cuda;

use super::api::{
    HostNodeParams, KernelNodeParamsV2, MemAllocNodeParams, MemsetNodeParams, add, add_mem_alloc,
    child_kind, cuGraphHostNodeGetParams, cuGraphKernelNodeGetParams_v2,
    cuGraphMemcpyNodeGetParams, cuGraphMemsetNodeGetParams, host_kind, kernel_kind, mem_free_kind,
    memcpy_kind, memset_kind, set_kind,
};
use super::{NodeKind, exec, node_type, registry};
use crate::copies::Memcpy3D;
use crate::driver::CuRes;
use crate::exports::{CUdeviceptr, CUhandle, h};
use crate::ffi::{CUresult, ffi};
use crate::out;

/// `CUDA_MEMCPY_NODE_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemcpyNodeParams {
    /// Must be zero.
    pub flags: c_int,
    /// Must be zero.
    pub reserved: c_int,
    /// Context of the copy (vgpu runs it in the current one).
    pub copy_ctx: CUhandle,
    /// The copy.
    pub copy: Memcpy3D,
}

/// `CUDA_MEMSET_NODE_PARAMS_v2`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemsetNodeParamsV2 {
    /// The first version's fields.
    pub base: MemsetNodeParams,
    /// Context (vgpu runs the memset in the current one).
    pub ctx: CUhandle,
}

/// `CUDA_CHILD_GRAPH_NODE_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ChildGraphNodeParams {
    /// The child graph.
    pub graph: CUhandle,
    /// `CUgraphChildGraphNodeOwnership`.
    pub ownership: c_int,
}

/// `CUDA_EVENT_RECORD_NODE_PARAMS` and `CUDA_EVENT_WAIT_NODE_PARAMS` (one field, the event).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EventNodeParams {
    /// The event.
    pub event: CUhandle,
}

/// `CUDA_MEM_FREE_NODE_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemFreeNodeParams {
    /// The graph allocation to free.
    pub dptr: CUdeviceptr,
}

/// Padding words of the union in `CUgraphNodeParams`.
const UNION_WORDS: usize = 29;

/// The union of `CUgraphNodeParams` (members vgpu reads; the others fit in `reserved1`).
#[repr(C)]
#[derive(Clone, Copy)]
pub union NodeParamsUnion {
    /// Padding: the union's size.
    pub reserved1: [i64; UNION_WORDS],
    /// `CUDA_KERNEL_NODE_PARAMS_v3` (laid out as `_v2`).
    pub kernel: KernelNodeParamsV2,
    /// `CUDA_MEMCPY_NODE_PARAMS`.
    pub memcpy: MemcpyNodeParams,
    /// `CUDA_MEMSET_NODE_PARAMS_v2`.
    pub memset: MemsetNodeParamsV2,
    /// `CUDA_HOST_NODE_PARAMS_v2` (laid out as the first version).
    pub host: HostNodeParams,
    /// `CUDA_CHILD_GRAPH_NODE_PARAMS`.
    pub graph: ChildGraphNodeParams,
    /// `CUDA_EVENT_WAIT_NODE_PARAMS` / `CUDA_EVENT_RECORD_NODE_PARAMS`.
    pub event: EventNodeParams,
    /// `CUDA_MEM_ALLOC_NODE_PARAMS_v2` (laid out as the first version).
    pub alloc: MemAllocNodeParams,
    /// `CUDA_MEM_FREE_NODE_PARAMS`.
    pub free: MemFreeNodeParams,
    /// `CUDA_BATCH_MEM_OP_NODE_PARAMS_v2`.
    pub mem_op: crate::mem_ops::BatchMemOpNodeParams,
    /// `CUDA_CONDITIONAL_NODE_PARAMS`.
    pub conditional: super::conditional::ConditionalNodeParams,
}

/// `CUgraphNodeParams`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GraphNodeParams {
    /// `CUgraphNodeType`.
    pub ty: c_int,
    /// Must be zero.
    pub reserved0: [c_int; 3],
    /// The type's parameters.
    pub params: NodeParamsUnion,
    /// Must be zero.
    pub reserved2: i64,
}

/// `CUgraphEdgeData`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphEdgeData {
    /// Upstream port (0: the node's completion).
    pub from_port: u8,
    /// Downstream port (0: the whole node).
    pub to_port: u8,
    /// `CUgraphDependencyType` (0: default).
    pub ty: u8,
    /// Must be zero.
    pub reserved: [u8; 5],
}

// The layouts of CUDA 12.x's cuda.h (x86-64 and aarch64 Linux).
const _: () = {
    assert!(size_of::<GraphNodeParams>() == 256);
    assert!(offset_of!(GraphNodeParams, params) == 16);
    assert!(offset_of!(GraphNodeParams, reserved2) == 248);
    assert!(size_of::<NodeParamsUnion>() == UNION_WORDS * 8);
    assert!(size_of::<KernelNodeParamsV2>() == 72);
    assert!(offset_of!(KernelNodeParamsV2, kern) == 56);
    assert!(size_of::<Memcpy3D>() == 200);
    assert!(size_of::<MemcpyNodeParams>() == 216);
    assert!(offset_of!(MemcpyNodeParams, copy) == 16);
    assert!(size_of::<MemsetNodeParamsV2>() == 48);
    assert!(offset_of!(MemsetNodeParamsV2, ctx) == 40);
    assert!(size_of::<HostNodeParams>() == 16);
    assert!(size_of::<ChildGraphNodeParams>() == 16);
    assert!(size_of::<EventNodeParams>() == 8);
    assert!(size_of::<MemAllocNodeParams>() == 120);
    assert!(offset_of!(MemAllocNodeParams, bytesize) == 104);
    assert!(offset_of!(MemAllocNodeParams, dptr) == 112);
    assert!(size_of::<MemFreeNodeParams>() == 8);
    assert!(size_of::<GraphEdgeData>() == 8);
};

/// `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE`.
const OWNERSHIP_CLONE: c_int = 0;
/// `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`.
const OWNERSHIP_MOVE: c_int = 1;

/// The caller's structure, its reserved fields checked.
///
/// Pointer contract (CUDA's): `prm` must be NULL or valid for reads of a `CUgraphNodeParams`.
fn read_params<'a>(prm: *const GraphNodeParams) -> CuRes<&'a GraphNodeParams> {
    // SAFETY: NULL or valid (this function's contract); every bit pattern is a valid
    // `GraphNodeParams` (integers, raw pointers, a union).
    let p = unsafe { prm.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    if p.reserved0 != [0; 3] || p.reserved2 != 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(p)
}

/// The answer for a type vgpu does not build (or that does not exist).
fn refused<T>(ty: c_int) -> CuRes<T> {
    let what = match ty {
        node_type::EXT_SEMAS_SIGNAL | node_type::EXT_SEMAS_WAIT => "external semaphore nodes",
        node_type::CONDITIONAL => {
            crate::debug!("a conditional node's parameters cannot be changed");
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        _ => {
            crate::debug!("CUgraphNodeParams: unknown node type {ty}");
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
    };
    crate::debug!("CUgraphNodeParams type {ty}: {what} are not provided by vgpu");
    Err(cuda::CUDA_ERROR_NOT_SUPPORTED)
}

/// The work of a node of type `p.ty` that is built the same way when added and when its
/// parameters are set: every provided type but allocation, free and child graph nodes.
fn plain_kind(p: &GraphNodeParams) -> CuRes<NodeKind> {
    let u = &p.params;
    match p.ty {
        node_type::KERNEL => kernel_kind((&raw const u.kernel).cast(), true),
        node_type::MEMCPY => {
            // SAFETY: the member of the type's union (CUDA contract); integers and pointers.
            let m = unsafe { u.memcpy };
            if m.flags != 0 || m.reserved != 0 {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
            memcpy_kind(&m.copy)
        }
        node_type::MEMSET => memset_kind((&raw const u.memset).cast()),
        node_type::HOST => host_kind(&raw const u.host),
        node_type::EMPTY => Ok(NodeKind::Empty),
        node_type::BATCH_MEM_OP => crate::mem_ops::batch_kind(&raw const u.mem_op),
        node_type::WAIT_EVENT | node_type::EVENT_RECORD => {
            // SAFETY: as above; a handle.
            let event = unsafe { u.event }.event;
            if event.is_null() {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
            Ok(if p.ty == node_type::WAIT_EVENT {
                NodeKind::EventWait(h(event))
            } else {
                NodeKind::EventRecord(h(event))
            })
        }
        ty => refused(ty),
    }
}

/// A child graph node's work: a copy of the graph, or with `OWNERSHIP_MOVE` the graph itself
/// (then owned by the node; `moved` records it so a failed add can give it back).
fn child_node(parent: CUhandle, c: ChildGraphNodeParams, moved: &Cell<u64>) -> CuRes<NodeKind> {
    match c.ownership {
        OWNERSHIP_CLONE => child_kind(c.graph),
        OWNERSHIP_MOVE => {
            let mut reg = registry();
            let child = h(c.graph);
            // A graph that is already a node's, or the parent itself, cannot move; nor can a
            // graph move into a child graph (vgpu does not track where that one sits, so it
            // could not rule out a cycle).
            if child == h(parent) || reg.graph(h(parent))?.owned || reg.graph(child)?.owned {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
            reg.graph_mut(child)?.owned = true;
            moved.set(child);
            Ok(NodeKind::Child(child))
        }
        _ => Err(cuda::CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuGraphAddNode(_v2)`.
///
/// Pointer contract (CUDA's): `deps` holds `n` nodes; `prm` is NULL or a valid
/// `CUgraphNodeParams`, writable for an allocation node's `dptr`.
fn add_node(
    out: *mut CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    n: usize,
    prm: *mut GraphNodeParams,
) -> CuRes<()> {
    let p = read_params(prm)?;
    match p.ty {
        node_type::MEM_ALLOC => {
            // SAFETY: the member of the type's union (CUDA contract); integers and pointers.
            let size = unsafe { p.params.alloc }.bytesize as u64;
            let ptr = add_mem_alloc(out, graph, deps, n, size)?;
            // SAFETY: `prm` is valid and writable (this function's contract); the address of
            // the union member's out-field.
            let dptr = unsafe { &raw mut (*prm).params.alloc.dptr };
            out!(dptr, ptr)
        }
        node_type::MEM_FREE => {
            // SAFETY: as above.
            let dptr = unsafe { p.params.free }.dptr;
            add(out, graph, deps, n, || mem_free_kind(dptr))
        }
        node_type::GRAPH => {
            // SAFETY: as above.
            let c = unsafe { p.params.graph };
            let moved = Cell::new(0);
            let r = add(out, graph, deps, n, || child_node(graph, c, &moved));
            if r.is_err()
                && moved.get() != 0
                && let Ok(g) = registry().graph_mut(moved.get())
            {
                g.owned = false;
            }
            r
        }
        node_type::CONDITIONAL => super::conditional::add_node(out, graph, deps, n, prm),
        _ => add(out, graph, deps, n, || plain_kind(p)),
    }
}

/// Refuses edge data other than the default (vgpu has full-completion edges only).
///
/// Pointer contract (CUDA's): `edges` is NULL or holds `n` entries.
fn default_edges(edges: *const GraphEdgeData, n: usize) -> CuRes<()> {
    if edges.is_null() || n == 0 {
        return Ok(());
    }
    // SAFETY: this function's contract; every bit pattern is a valid `GraphEdgeData`.
    let list = unsafe { std::slice::from_raw_parts(edges, n) };
    if list.iter().any(|e| *e != GraphEdgeData::default()) {
        crate::debug!("cuGraphAddNode_v2: only default edge data (type 0, ports 0) is provided");
        return Err(cuda::CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(())
}

/// The answer for setting the parameters of a node whose type cannot change them here.
fn fixed_params(ty: c_int) -> CuRes<NodeKind> {
    match ty {
        node_type::MEM_ALLOC | node_type::MEM_FREE => {
            crate::debug!("allocation and free nodes' parameters cannot be changed");
            Err(cuda::CUDA_ERROR_INVALID_VALUE)
        }
        _ => {
            crate::debug!(
                "changing a child graph node's graph in a graph is not provided by vgpu \
                 (in an executable graph it is)"
            );
            Err(cuda::CUDA_ERROR_NOT_SUPPORTED)
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddNode(
    out: *mut CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    n: usize,
    prm: *mut GraphNodeParams,
) -> CUresult {
    ffi("cuGraphAddNode", || add_node(out, graph, deps, n, prm))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddNode_v2(
    out: *mut CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    edges: *const GraphEdgeData,
    n: usize,
    prm: *mut GraphNodeParams,
) -> CUresult {
    ffi("cuGraphAddNode_v2", || {
        default_edges(edges, n)?;
        add_node(out, graph, deps, n, prm)
    })
}

/// `cuGraphAddNode_v3` (CUDA 13.4): `cuGraphAddNode_v2`'s form. CUDA 13.4 also checks here that a
/// kernel node's function was loaded in the node's context; vgpu leaves that to the launch.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddNode_v3(
    out: *mut CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    edges: *const GraphEdgeData,
    n: usize,
    prm: *mut GraphNodeParams,
) -> CUresult {
    // SAFETY: the same contract as cuGraphAddNode_v2's.
    unsafe { cuGraphAddNode_v2(out, graph, deps, edges, n, prm) }
}

/// CUDA 13.1's `cuGraphNodeGetParams`: the node's type and the parameters its per-type getter
/// reports, in the union member of that type (a memset's and a conditional node's context: the
/// current one; a child graph node's graph: the copy the node holds, with clone ownership).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetParams(
    node: CUhandle,
    prm: *mut GraphNodeParams,
) -> CUresult {
    ffi("cuGraphNodeGetParams", || {
        if prm.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let mut p = GraphNodeParams {
            ty: 0,
            reserved0: [0; 3],
            params: NodeParamsUnion {
                reserved1: [0; UNION_WORDS],
            },
            reserved2: 0,
        };
        let ctx = crate::driver::current_ctx().unwrap_or(0) as CUhandle;
        // The types whose parameters are the node's own handles are read here, under one lock;
        // the others below from their per-type getters.
        p.ty = {
            let reg = registry();
            let kind = &reg.node(h(node))?.kind;
            match kind {
                NodeKind::Child(g) => {
                    p.params.graph = ChildGraphNodeParams {
                        graph: *g as CUhandle,
                        ownership: OWNERSHIP_CLONE,
                    };
                }
                NodeKind::EventRecord(e) | NodeKind::EventWait(e) => {
                    p.params.event = EventNodeParams {
                        event: *e as CUhandle,
                    };
                }
                NodeKind::Conditional(c) => {
                    // The node's own array of bodies, which stays put while the node lives.
                    p.params.conditional = super::conditional::ConditionalNodeParams {
                        handle: c.handle,
                        ty: c.kind as c_int,
                        size: c.bodies.len() as std::ffi::c_uint,
                        bodies_out: c.bodies.as_ptr() as *mut CUhandle,
                        ctx,
                    };
                }
                _ => {}
            }
            kind.type_code()
        };
        // Each getter writes its type's member of `p`'s union, a local the right size for it.
        let r = match p.ty {
            node_type::KERNEL => {
                let out = (&raw mut p.params.kernel).cast();
                // SAFETY: see above.
                unsafe { cuGraphKernelNodeGetParams_v2(node, out) }
            }
            node_type::MEMCPY => {
                // SAFETY: plain integers and pointers, all zero: a valid `Memcpy3D`.
                let mut copy: Memcpy3D = unsafe { std::mem::zeroed() };
                // SAFETY: `copy` is a `Memcpy3D` to write.
                let r = unsafe { cuGraphMemcpyNodeGetParams(node, &mut copy) };
                p.params.memcpy = MemcpyNodeParams {
                    flags: 0,
                    reserved: 0,
                    copy_ctx: ctx,
                    copy,
                };
                r
            }
            node_type::MEMSET => {
                // SAFETY: plain integers, all zero: a valid `MemsetNodeParams`.
                let mut base: MemsetNodeParams = unsafe { std::mem::zeroed() };
                // SAFETY: `base` is a `MemsetNodeParams` to write.
                let r = unsafe { cuGraphMemsetNodeGetParams(node, &mut base) };
                p.params.memset = MemsetNodeParamsV2 { base, ctx };
                r
            }
            node_type::HOST => {
                let out = &raw mut p.params.host;
                // SAFETY: see above.
                unsafe { cuGraphHostNodeGetParams(node, out) }
            }
            node_type::MEM_ALLOC => {
                let out = (&raw mut p.params.alloc).cast();
                // SAFETY: see above.
                unsafe { super::api::cuGraphMemAllocNodeGetParams(node, out) }
            }
            node_type::MEM_FREE => {
                let mut dptr = 0;
                // SAFETY: `dptr` is a `CUdeviceptr` to write.
                let r = unsafe { super::api::cuGraphMemFreeNodeGetParams(node, &mut dptr) };
                p.params.free = MemFreeNodeParams { dptr };
                r
            }
            node_type::BATCH_MEM_OP => {
                let out = &raw mut p.params.mem_op;
                // SAFETY: see above.
                unsafe { crate::mem_ops::cuGraphBatchMemOpNodeGetParams(node, out) }
            }
            _ => cuda::CUDA_SUCCESS,
        };
        if r != cuda::CUDA_SUCCESS {
            return Err(r);
        }
        out!(prm, p)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeSetParams(
    node: CUhandle,
    prm: *mut GraphNodeParams,
) -> CUresult {
    ffi("cuGraphNodeSetParams", || {
        let p = read_params(prm)?;
        let kind = match p.ty {
            node_type::MEM_ALLOC | node_type::MEM_FREE | node_type::GRAPH => fixed_params(p.ty)?,
            _ => plain_kind(p)?,
        };
        set_kind(node, kind)
    })
}

/// `cuGraphNodeSetParams_v2` (CUDA 13.4): `cuGraphNodeSetParams`'s form (see
/// [`cuGraphAddNode_v3`]).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeSetParams_v2(
    node: CUhandle,
    prm: *mut GraphNodeParams,
) -> CUresult {
    // SAFETY: the same contract as cuGraphNodeSetParams's.
    unsafe { cuGraphNodeSetParams(node, prm) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecNodeSetParams(
    e: CUhandle,
    node: CUhandle,
    prm: *mut GraphNodeParams,
) -> CUresult {
    ffi("cuGraphExecNodeSetParams", || {
        let p = read_params(prm)?;
        let kind = match p.ty {
            node_type::GRAPH => {
                // SAFETY: the member of the type's union (CUDA contract); a handle and an int.
                let c = unsafe { p.params.graph };
                if c.ownership != OWNERSHIP_CLONE {
                    return Err(cuda::CUDA_ERROR_INVALID_VALUE);
                }
                return exec::set_child(h(e), h(node), h(c.graph));
            }
            node_type::MEM_ALLOC | node_type::MEM_FREE => fixed_params(p.ty)?,
            _ => plain_kind(p)?,
        };
        exec::set_node(h(e), h(node), kind)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(ty: c_int) -> GraphNodeParams {
        GraphNodeParams {
            ty,
            reserved0: [0; 3],
            params: NodeParamsUnion {
                reserved1: [0; UNION_WORDS],
            },
            reserved2: 0,
        }
    }

    fn graph() -> CUhandle {
        crate::exports::p(registry().create_graph().unwrap())
    }

    #[test]
    fn the_union_members_sit_where_cuda_h_puts_them() {
        let mut p = params(node_type::MEM_ALLOC);
        let mut alloc = MemAllocNodeParams {
            pool_props: [0; 88],
            access_descs: std::ptr::null(),
            access_desc_count: 0,
            bytesize: 0,
            dptr: 0,
        };
        alloc.dptr = 0x1234;
        p.params.alloc = alloc;
        // SAFETY: reading back the padding words of a plain-data union.
        let words = unsafe { p.params.reserved1 };
        // `dptr` is at byte 112 of CUDA_MEM_ALLOC_NODE_PARAMS_v2.
        assert_eq!(words[112 / 8], 0x1234);
        // The copy of CUDA_MEMCPY_NODE_PARAMS starts at byte 32 of CUgraphNodeParams.
        assert_eq!(
            offset_of!(GraphNodeParams, params)
                + offset_of!(NodeParamsUnion, memcpy)
                + offset_of!(MemcpyNodeParams, copy),
            32
        );
    }

    #[test]
    fn types_vgpu_does_not_build_are_not_supported() {
        let g = graph();
        let mut node = std::ptr::null_mut();
        for ty in [node_type::EXT_SEMAS_SIGNAL, node_type::EXT_SEMAS_WAIT] {
            let mut p = params(ty);
            // SAFETY: valid pointers throughout.
            let r = unsafe { cuGraphAddNode(&mut node, g, std::ptr::null(), 0, &mut p) };
            assert_eq!(r, cuda::CUDA_ERROR_NOT_SUPPORTED, "type {ty}");
        }
        // An unknown type, and a conditional node of no bodies on a handle nobody created.
        for ty in [14, node_type::CONDITIONAL] {
            let mut p = params(ty);
            // SAFETY: as above.
            let r = unsafe { cuGraphAddNode(&mut node, g, std::ptr::null(), 0, &mut p) };
            assert_eq!(r, cuda::CUDA_ERROR_INVALID_VALUE, "type {ty}");
        }
        assert!(registry().graph(h(g)).unwrap().order.is_empty());
    }

    #[test]
    fn reserved_fields_and_edge_data_are_checked() {
        let g = graph();
        let mut node = std::ptr::null_mut();
        let mut p = params(node_type::EMPTY);
        p.reserved2 = 1;
        // SAFETY: valid pointers throughout.
        let r = unsafe { cuGraphAddNode(&mut node, g, std::ptr::null(), 0, &mut p) };
        assert_eq!(r, cuda::CUDA_ERROR_INVALID_VALUE);
        p.reserved2 = 0;
        // SAFETY: as above.
        let r = unsafe { cuGraphAddNode(&mut node, g, std::ptr::null(), 0, &mut p) };
        assert_eq!(r, cuda::CUDA_SUCCESS);
        let first = node;
        let programmatic = GraphEdgeData {
            ty: 1,
            ..Default::default()
        };
        // SAFETY: as above; one dependency with one edge entry.
        let r = unsafe { cuGraphAddNode_v2(&mut node, g, &first, &programmatic, 1, &mut p) };
        assert_eq!(r, cuda::CUDA_ERROR_NOT_SUPPORTED);
        let default = GraphEdgeData::default();
        // SAFETY: as above.
        let r = unsafe { cuGraphAddNode_v2(&mut node, g, &first, &default, 1, &mut p) };
        assert_eq!(r, cuda::CUDA_SUCCESS);
        assert_eq!(registry().node(h(node)).unwrap().deps, vec![h(first)]);
        // An empty node's parameters can be "set" to an empty node's, not to another type's.
        // SAFETY: as above.
        assert_eq!(unsafe { cuGraphNodeSetParams(node, &mut p) }, 0);
        let mut wait = params(node_type::WAIT_EVENT);
        wait.params.event = EventNodeParams {
            event: 0x10 as CUhandle,
        };
        // SAFETY: as above.
        let r = unsafe { cuGraphNodeSetParams(node, &mut wait) };
        assert_eq!(r, cuda::CUDA_ERROR_INVALID_VALUE);
    }

    #[test]
    fn a_moved_child_graph_becomes_the_node_s() {
        let (parent, child) = (graph(), graph());
        let mut node = std::ptr::null_mut();
        let mut p = params(node_type::GRAPH);
        p.params.graph = ChildGraphNodeParams {
            graph: parent,
            ownership: OWNERSHIP_MOVE,
        };
        // SAFETY: valid pointers throughout.
        let r = unsafe { cuGraphAddNode(&mut node, parent, std::ptr::null(), 0, &mut p) };
        assert_eq!(r, cuda::CUDA_ERROR_INVALID_VALUE, "a graph into itself");
        p.params.graph = ChildGraphNodeParams {
            graph: child,
            ownership: OWNERSHIP_MOVE,
        };
        // SAFETY: as above.
        let r = unsafe { cuGraphAddNode(&mut node, parent, std::ptr::null(), 0, &mut p) };
        assert_eq!(r, cuda::CUDA_SUCCESS);
        assert!(
            matches!(registry().node(h(node)).unwrap().kind, NodeKind::Child(c) if c == h(child))
        );
        // The node owns it now: it cannot be destroyed or moved again.
        assert_eq!(
            super::super::api::cuGraphDestroy(child),
            cuda::CUDA_ERROR_INVALID_VALUE
        );
        let other = graph();
        // SAFETY: as above.
        let r = unsafe { cuGraphAddNode(&mut node, other, std::ptr::null(), 0, &mut p) };
        assert_eq!(r, cuda::CUDA_ERROR_INVALID_VALUE);
        // A failed move leaves the graph as it was.
        let free = graph();
        p.params.graph = ChildGraphNodeParams {
            graph: free,
            ownership: OWNERSHIP_MOVE,
        };
        let bad_dep = 0x8 as CUhandle;
        // SAFETY: as above; one (unknown) dependency.
        let r = unsafe { cuGraphAddNode(&mut node, other, &bad_dep, 1, &mut p) };
        assert_eq!(r, cuda::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(super::super::api::cuGraphDestroy(free), cuda::CUDA_SUCCESS);
    }
}
