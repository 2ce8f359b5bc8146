//! The graph entry points (`cuGraph*`) in the C ABI.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::BTreeMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::{Mutex, MutexGuard};

use vgpu_proto::cuda;
use vgpu_proto::msg;

use super::exec;
use super::{CopyParams, KernelParams, MemsetParams, NodeKind, Op, registry};
use crate::copies::Memcpy3D;
use crate::driver::{self as drv, CuRes};
use crate::exports::{CUdeviceptr, CUhandle, h, p};
use crate::ffi::{CUresult, ffi};
use crate::out;
use crate::stream_capture::{node_list, record};

/// `CUDA_KERNEL_NODE_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KernelNodeParams {
    /// Kernel.
    pub func: CUhandle,
    /// Grid dimensions.
    pub grid: [c_uint; 3],
    /// Block dimensions.
    pub block: [c_uint; 3],
    /// Dynamic shared memory.
    pub shared: c_uint,
    /// One pointer per parameter.
    pub kernel_params: *mut *mut c_void,
    /// Packed parameters (`CU_LAUNCH_PARAM_*`).
    pub extra: *mut *mut c_void,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KernelNodeParamsV2 {
    /// The first version's fields.
    pub base: KernelNodeParams,
    /// `CUkernel` used when `func` is NULL.
    pub kern: CUhandle,
    /// Context (NULL: the current one).
    pub ctx: CUhandle,
}

/// `CUDA_MEMSET_NODE_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemsetNodeParams {
    /// Destination.
    pub dst: CUdeviceptr,
    /// Row pitch.
    pub pitch: usize,
    /// Value.
    pub value: c_uint,
    /// Element size (1, 2 or 4).
    pub element_size: c_uint,
    /// Elements per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
}

/// `CUDA_HOST_NODE_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HostNodeParams {
    /// The function.
    pub f: Option<unsafe extern "C" fn(*mut c_void)>,
    /// Its argument.
    pub user_data: *mut c_void,
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemAllocNodeParams {
    /// `CUmemPoolProps` (device-local memory is all vgpu gives).
    pub pool_props: [u8; 88],
    /// `CUmemAccessDesc` array.
    pub access_descs: *const c_void,
    /// Entries in it.
    pub access_desc_count: usize,
    /// Bytes asked for.
    pub bytesize: usize,
    /// Out: the allocation's address.
    pub dptr: CUdeviceptr,
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
#[derive(Debug)]
pub struct InstantiateParams {
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_*`.
    pub flags: u64,
    /// Stream to upload on (with `FLAG_UPLOAD`).
    pub upload_stream: CUhandle,
    /// Out: the node that failed.
    pub err_node: CUhandle,
    /// Out: `CUgraphInstantiateResult`.
    pub result: c_int,
}

/// `CUgraphExecUpdateResultInfo`.
#[repr(C)]
#[derive(Debug)]
pub struct UpdateResultInfo {
    /// `CUgraphExecUpdateResult`.
    pub result: c_int,
    /// The node that failed.
    pub error_node: CUhandle,
    /// The original graph's node it was matched with.
    pub error_from_node: CUhandle,
}

/// `CUDA_GRAPH_INSTANTIATE_SUCCESS`.
const INSTANTIATE_SUCCESS: c_int = 0;
/// `CUDA_GRAPH_INSTANTIATE_ERROR`.
const INSTANTIATE_ERROR: c_int = 1;

/// Graph allocations this process reserved: address → bytes reserved.
static GRAPH_ALLOCS: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());

fn graph_allocs() -> MutexGuard<'static, BTreeMap<u64, u64>> {
    GRAPH_ALLOCS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reserves the address of a graph allocation of `size` bytes: (address, bytes reserved).
pub fn reserve(size: u64) -> CuRes<(u64, u64)> {
    let g = crate::alloc_api::VMM_GRANULARITY;
    if size == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let reserved = size
        .checked_next_multiple_of(g)
        .ok_or(cuda::CUDA_ERROR_OUT_OF_MEMORY)?;
    let ptr = crate::alloc_api::address_reserve(reserved, 0)?;
    drv::note_device_range(ptr, reserved);
    graph_allocs().insert(ptr, reserved);
    Ok((ptr, reserved))
}

/// Whether `ptr` is the address of a graph allocation.
pub fn is_graph_alloc(ptr: u64) -> bool {
    graph_allocs().contains_key(&ptr)
}

/// `cuMemFree` (`stream` `None`) or `cuMemFreeAsync` of a graph allocation: unmaps it once the
/// work before is done; its memory returns to the slice.
pub fn free_graph_alloc(ptr: u64, stream: Option<u64>) -> CuRes<()> {
    let size = *graph_allocs()
        .get(&ptr)
        .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    match stream {
        Some(s) => drv::stream_synchronize(s)?,
        None => drv::ctx_synchronize()?,
    }
    drv::driver()?
        .call(&msg::MemUnmap { ptr, size }, &[])
        .map(drop)
}

/// The single operation a recorded call made.
fn single(ops: Vec<Op>) -> CuRes<Op> {
    let mut it = ops.into_iter();
    match (it.next(), it.next()) {
        (Some(op), None) => Ok(op),
        _ => Err(cuda::CUDA_ERROR_INVALID_VALUE),
    }
}

/// A kernel node's work from its parameters.
///
/// Pointer contract (CUDA's): `prm` must be NULL or a valid `CUDA_KERNEL_NODE_PARAMS` (`v2`: of the second version).
pub(super) fn kernel_kind(prm: *const KernelNodeParams, v2: bool) -> CuRes<NodeKind> {
    // SAFETY: NULL or valid (this function's contract).
    let k = unsafe { prm.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    let mut f = h(k.func);
    if f == 0 && v2 {
        // SAFETY: a v2 structure (this function's contract).
        f = h(unsafe { (*prm.cast::<KernelNodeParamsV2>()).kern });
    }
    if f == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    drv::func_layout(f)?;
    // SAFETY: kernelParams/extra follow the cuLaunchKernel contract (CUDA's for this structure).
    let packed = unsafe { crate::exports::pack_params(f, k.kernel_params, k.extra) }?;
    let op = single(record(|| {
        drv::launch(f, k.grid, k.block, k.shared, 0, &packed)
    })?)?;
    match op {
        Op::Kernel { params, .. } => Ok(NodeKind::Kernel(KernelParams::new(
            f, k.grid, k.block, k.shared, params,
        ))),
        _ => Err(cuda::CUDA_ERROR_INVALID_VALUE),
    }
}

/// A memcpy node's work from a `CUDA_MEMCPY3D`.
pub(super) fn memcpy_kind(prm: *const Memcpy3D) -> CuRes<NodeKind> {
    // SAFETY: NULL or the caller's CUDA_MEMCPY3D (CUDA contract).
    let copy = *unsafe { prm.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    let ops = record(|| crate::copies::copy_3d(prm, 0, false))?;
    Ok(NodeKind::Memcpy(CopyParams(copy), ops))
}

/// A memset node's work.
pub(super) fn memset_kind(prm: *const MemsetNodeParams) -> CuRes<NodeKind> {
    // SAFETY: NULL or the caller's CUDA_MEMSET_NODE_PARAMS (CUDA contract).
    let m = *unsafe { prm.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    if !matches!(m.element_size, 1 | 2 | 4) || m.width == 0 || m.height == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let ops = record(|| {
        crate::copies::memset_2d(
            m.dst,
            m.pitch,
            (m.value, m.element_size),
            m.width,
            m.height,
            0,
            false,
        )
    })?;
    let params = MemsetParams {
        dst: m.dst,
        pitch: m.pitch,
        value: m.value,
        elem: m.element_size,
        width: m.width,
        height: m.height,
    };
    Ok(NodeKind::Memset(params, ops))
}

pub(super) fn host_kind(prm: *const HostNodeParams) -> CuRes<NodeKind> {
    // SAFETY: NULL or the caller's CUDA_HOST_NODE_PARAMS (CUDA contract).
    let p = unsafe { prm.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    let f = p.f.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    Ok(NodeKind::Host {
        f: f as usize,
        data: p.user_data as usize,
    })
}

/// Adds a node made by `kind` to `graph` after `n` dependencies at `deps`; writes its handle.
///
/// Pointer contract (CUDA's): `deps` must hold `n` node handles (or be NULL with `n` 0).
pub(crate) fn add(
    out: *mut CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    n: usize,
    kind: impl FnOnce() -> CuRes<NodeKind>,
) -> CuRes<()> {
    if out.is_null() {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let deps = node_list(deps, n)?;
    registry().graph(h(graph))?;
    let kind = kind()?;
    let node = registry().add_node(h(graph), kind, &deps)?;
    out!(out, p(node))
}

/// Writes up to `*n` handles of `list` to `arr` (or only the count when `arr` is NULL).
///
/// Pointer contract (CUDA's): `n` must be a valid in/out count; `arr` NULL or valid for `*n` writes.
fn write_list(list: &[u64], arr: *mut CUhandle, n: *mut usize) -> CuRes<()> {
    if n.is_null() {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    if arr.is_null() {
        return out!(n, list.len());
    }
    // SAFETY: valid in/out count (this function's contract).
    let cap = unsafe { n.read() };
    for i in 0..cap {
        let v = list.get(i).map_or(std::ptr::null_mut(), |&x| p(x));
        let slot = arr.wrapping_add(i);
        // SAFETY: `arr` holds `cap` entries (this function's contract) and `i < cap`.
        unsafe { slot.write(v) };
    }
    if cap > list.len() {
        out!(n, list.len())?;
    }
    Ok(())
}

/// The value of an in/out count (0 for NULL).
fn read_count(n: *mut usize) -> usize {
    if n.is_null() {
        return 0;
    }
    // SAFETY: a non-NULL in/out count argument (CUDA contract).
    unsafe { n.read() }
}

/// Clears `n` 8-byte edge data entries (vgpu keeps default edges only).
///
/// Pointer contract (CUDA's): `edges` must be NULL or valid for `n` writes of `CUgraphEdgeData`.
fn clear_edges(edges: *mut u64, n: usize) {
    if !edges.is_null() {
        // SAFETY: this function's contract.
        unsafe { std::ptr::write_bytes(edges, 0, n) };
    }
}

/// Refuses edge data other than the default.
///
/// Pointer contract (CUDA's): `edges` must be NULL or valid for `n` reads of `CUgraphEdgeData`.
pub(super) fn default_edges(edges: *const u64, n: usize) -> CuRes<()> {
    if edges.is_null() || n == 0 {
        return Ok(());
    }
    // SAFETY: this function's contract.
    let e = unsafe { std::slice::from_raw_parts(edges, n) };
    if e.iter().any(|&x| x != 0) {
        return Err(cuda::CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(())
}

// ---- graphs -------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphCreate(out: *mut CUhandle, flags: c_uint) -> CUresult {
    ffi("cuGraphCreate", || {
        if flags != 0 || out.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(out, p(registry().create_graph()?))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphDestroy(graph: CUhandle) -> CUresult {
    ffi("cuGraphDestroy", || {
        let mut reg = registry();
        if reg.graph(h(graph))?.owned {
            // A child graph belongs to its node.
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        reg.destroy_graph(h(graph))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphClone(out: *mut CUhandle, graph: CUhandle) -> CUresult {
    ffi("cuGraphClone", || {
        if out.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(out, p(registry().clone_graph(h(graph))?))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeFindInClone(
    out: *mut CUhandle,
    original: CUhandle,
    clone: CUhandle,
) -> CUresult {
    ffi("cuGraphNodeFindInClone", || {
        let reg = registry();
        let g = reg.graph(h(clone))?;
        let n = g
            .order
            .iter()
            .find(|n| reg.cloned_from.get(n) == Some(&h(original)))
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        out!(out, p(*n))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetNodes(
    graph: CUhandle,
    nodes: *mut CUhandle,
    n: *mut usize,
) -> CUresult {
    ffi("cuGraphGetNodes", || {
        let list = registry().graph(h(graph))?.order.clone();
        write_list(&list, nodes, n)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetRootNodes(
    graph: CUhandle,
    nodes: *mut CUhandle,
    n: *mut usize,
) -> CUresult {
    ffi("cuGraphGetRootNodes", || {
        let reg = registry();
        let g = reg.graph(h(graph))?;
        let list: Vec<u64> = g
            .order
            .iter()
            .filter(|x| g.nodes[x].deps.is_empty())
            .copied()
            .collect();
        drop(reg);
        write_list(&list, nodes, n)
    })
}

/// `cuGraphGetEdges` for both versions.
///
/// Pointer contract (CUDA's): CUDA's contract for the arrays and count.
fn get_edges(
    graph: CUhandle,
    from: *mut CUhandle,
    to: *mut CUhandle,
    edges: *mut u64,
    n: *mut usize,
) -> CuRes<()> {
    let list = registry().edges(h(graph))?;
    if n.is_null() || from.is_null() != to.is_null() {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let froms: Vec<u64> = list.iter().map(|e| e.0).collect();
    let tos: Vec<u64> = list.iter().map(|e| e.1).collect();
    let cap = read_count(n);
    if from.is_null() {
        return write_list(&froms, from, n);
    }
    write_list(&froms, from, n)?;
    // SAFETY: `n` is a valid in/out count (CUDA contract, non-NULL checked above).
    unsafe { n.write(cap) };
    write_list(&tos, to, n)?;
    clear_edges(edges, cap);
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetEdges(
    graph: CUhandle,
    from: *mut CUhandle,
    to: *mut CUhandle,
    n: *mut usize,
) -> CUresult {
    ffi("cuGraphGetEdges", || {
        get_edges(graph, from, to, std::ptr::null_mut(), n)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetEdges_v2(
    graph: CUhandle,
    from: *mut CUhandle,
    to: *mut CUhandle,
    edges: *mut u64,
    n: *mut usize,
) -> CUresult {
    ffi("cuGraphGetEdges_v2", || {
        get_edges(graph, from, to, edges, n)
    })
}

/// Adds (or with `remove`, removes) `n` edges.
///
/// Pointer contract (CUDA's): `from` and `to` must hold `n` nodes each.
fn change_deps(
    graph: CUhandle,
    from: *const CUhandle,
    to: *const CUhandle,
    n: usize,
    remove: bool,
) -> CuRes<()> {
    let (from, to) = (node_list(from, n)?, node_list(to, n)?);
    let mut reg = registry();
    let g = h(graph);
    for (f, t) in from.iter().zip(&to) {
        let graph = reg.graph(g)?;
        if !graph.nodes.contains_key(f) || !graph.nodes.contains_key(t) || f == t {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let deps = &mut reg.node_mut(*t)?.deps;
        match (remove, deps.contains(f)) {
            (false, false) => deps.push(*f),
            (true, true) => deps.retain(|d| d != f),
            _ => return Err(cuda::CUDA_ERROR_INVALID_VALUE),
        }
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddDependencies(
    graph: CUhandle,
    from: *const CUhandle,
    to: *const CUhandle,
    n: usize,
) -> CUresult {
    ffi("cuGraphAddDependencies", || {
        change_deps(graph, from, to, n, false)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddDependencies_v2(
    graph: CUhandle,
    from: *const CUhandle,
    to: *const CUhandle,
    edges: *const u64,
    n: usize,
) -> CUresult {
    ffi("cuGraphAddDependencies_v2", || {
        default_edges(edges, n)?;
        change_deps(graph, from, to, n, false)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphRemoveDependencies(
    graph: CUhandle,
    from: *const CUhandle,
    to: *const CUhandle,
    n: usize,
) -> CUresult {
    ffi("cuGraphRemoveDependencies", || {
        change_deps(graph, from, to, n, true)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphRemoveDependencies_v2(
    graph: CUhandle,
    from: *const CUhandle,
    to: *const CUhandle,
    edges: *const u64,
    n: usize,
) -> CUresult {
    ffi("cuGraphRemoveDependencies_v2", || {
        default_edges(edges, n)?;
        change_deps(graph, from, to, n, true)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetDependencies(
    node: CUhandle,
    deps: *mut CUhandle,
    n: *mut usize,
) -> CUresult {
    ffi("cuGraphNodeGetDependencies", || {
        let list = registry().node(h(node))?.deps.clone();
        write_list(&list, deps, n)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetDependencies_v2(
    node: CUhandle,
    deps: *mut CUhandle,
    edges: *mut u64,
    n: *mut usize,
) -> CUresult {
    ffi("cuGraphNodeGetDependencies_v2", || {
        let list = registry().node(h(node))?.deps.clone();
        let cap = read_count(n);
        write_list(&list, deps, n)?;
        if !deps.is_null() {
            clear_edges(edges, cap);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetDependentNodes(
    node: CUhandle,
    out: *mut CUhandle,
    n: *mut usize,
) -> CUresult {
    ffi("cuGraphNodeGetDependentNodes", || {
        let list = registry().dependents(h(node))?;
        write_list(&list, out, n)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetDependentNodes_v2(
    node: CUhandle,
    out: *mut CUhandle,
    edges: *mut u64,
    n: *mut usize,
) -> CUresult {
    ffi("cuGraphNodeGetDependentNodes_v2", || {
        let list = registry().dependents(h(node))?;
        let cap = read_count(n);
        write_list(&list, out, n)?;
        if !out.is_null() {
            clear_edges(edges, cap);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetType(node: CUhandle, ty: *mut c_int) -> CUresult {
    ffi("cuGraphNodeGetType", || {
        out!(ty, registry().node(h(node))?.kind.type_code())
    })
}

/// CUDA 13: the graph a node is in (a child graph's node: the child graph).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetContainingGraph(
    node: CUhandle,
    graph: *mut CUhandle,
) -> CUresult {
    ffi("cuGraphNodeGetContainingGraph", || {
        let g = registry().graph_of(h(node))?;
        out!(graph, p(g))
    })
}

/// CUDA 13: a node's ID, as `cuGraphDebugDotPrint` prints it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetLocalId(node: CUhandle, id: *mut c_uint) -> CUresult {
    ffi("cuGraphNodeGetLocalId", || {
        registry().node(h(node))?;
        out!(id, super::handle_id(h(node)))
    })
}

/// CUDA 13: the ID tools know a node by: its graph's ID above its own.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetToolsId(node: CUhandle, id: *mut u64) -> CUresult {
    ffi("cuGraphNodeGetToolsId", || {
        let g = registry().graph_of(h(node))?;
        out!(
            id,
            u64::from(super::handle_id(g)) << 32 | u64::from(super::handle_id(h(node)))
        )
    })
}

/// CUDA 13: a graph's ID, as `cuGraphDebugDotPrint` prints it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetId(graph: CUhandle, id: *mut c_uint) -> CUresult {
    ffi("cuGraphGetId", || {
        registry().graph(h(graph))?;
        out!(id, super::handle_id(h(graph)))
    })
}

/// CUDA 13: an executable graph's ID.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecGetId(exec: CUhandle, id: *mut c_uint) -> CUresult {
    ffi("cuGraphExecGetId", || {
        if !registry().execs.contains_key(&h(exec)) {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(id, super::handle_id(h(exec)))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphDestroyNode(node: CUhandle) -> CUresult {
    ffi("cuGraphDestroyNode", || registry().destroy_node(h(node)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphDebugDotPrint(
    graph: CUhandle,
    path: *const c_char,
    _flags: c_uint,
) -> CUresult {
    ffi("cuGraphDebugDotPrint", || {
        if path.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated path (CUDA contract).
        let path = unsafe { CStr::from_ptr(path) }
            .to_str()
            .map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?;
        let text = registry().dot(h(graph))?;
        std::fs::write(path, text).map_err(|_| cuda::CUDA_ERROR_OPERATING_SYSTEM)
    })
}

// ---- nodes --------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddEmptyNode(
    out: *mut CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    n: usize,
) -> CUresult {
    ffi("cuGraphAddEmptyNode", || {
        add(out, graph, deps, n, || Ok(NodeKind::Empty))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddKernelNode(
    out: *mut CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    n: usize,
    prm: *const KernelNodeParams,
) -> CUresult {
    ffi("cuGraphAddKernelNode", || {
        add(out, graph, deps, n, || kernel_kind(prm, false))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddKernelNode_v2(
    out: *mut CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    n: usize,
    prm: *const KernelNodeParamsV2,
) -> CUresult {
    ffi("cuGraphAddKernelNode_v2", || {
        add(out, graph, deps, n, || kernel_kind(prm.cast(), true))
    })
}

/// Writes a kernel node's parameters.
///
/// Pointer contract (CUDA's): `prm` must be NULL or valid for a write of the version's structure.
fn kernel_get(node: CUhandle, prm: *mut KernelNodeParams, v2: bool) -> CuRes<()> {
    let reg = registry();
    let NodeKind::Kernel(k) = &reg.node(h(node))?.kind else {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    };
    let base = KernelNodeParams {
        func: p(k.f),
        grid: k.grid,
        block: k.block,
        shared: k.shared,
        kernel_params: k.arg_ptrs.as_ptr() as *mut *mut c_void,
        extra: std::ptr::null_mut(),
    };
    if v2 {
        let ctx = drv::current_ctx().unwrap_or(0);
        out!(
            prm.cast::<KernelNodeParamsV2>(),
            KernelNodeParamsV2 {
                base,
                kern: std::ptr::null_mut(),
                ctx: p(ctx),
            }
        )
    } else {
        out!(prm, base)
    }
}

/// Replaces a node's work (same type) in its graph.
pub(crate) fn set_kind(node: CUhandle, kind: NodeKind) -> CuRes<()> {
    let mut reg = registry();
    let slot = reg.node_mut(h(node))?;
    if slot.kind.type_code() != kind.type_code() {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let mut kind = kind;
    kind.keep_attributes(&slot.kind);
    slot.kind = kind;
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphKernelNodeGetParams(
    node: CUhandle,
    prm: *mut KernelNodeParams,
) -> CUresult {
    ffi("cuGraphKernelNodeGetParams", || {
        kernel_get(node, prm, false)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphKernelNodeGetParams_v2(
    node: CUhandle,
    prm: *mut KernelNodeParamsV2,
) -> CUresult {
    ffi("cuGraphKernelNodeGetParams_v2", || {
        kernel_get(node, prm.cast(), true)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphKernelNodeSetParams(
    node: CUhandle,
    prm: *const KernelNodeParams,
) -> CUresult {
    ffi("cuGraphKernelNodeSetParams", || {
        set_kind(node, kernel_kind(prm, false)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphKernelNodeSetParams_v2(
    node: CUhandle,
    prm: *const KernelNodeParamsV2,
) -> CUresult {
    ffi("cuGraphKernelNodeSetParams_v2", || {
        set_kind(node, kernel_kind(prm.cast(), true)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemcpyNode(
    out: *mut CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    n: usize,
    prm: *const Memcpy3D,
    _ctx: CUhandle,
) -> CUresult {
    ffi("cuGraphAddMemcpyNode", || {
        add(out, graph, deps, n, || memcpy_kind(prm))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphMemcpyNodeGetParams(
    node: CUhandle,
    prm: *mut Memcpy3D,
) -> CUresult {
    ffi("cuGraphMemcpyNodeGetParams", || {
        let reg = registry();
        let NodeKind::Memcpy(c, _) = &reg.node(h(node))?.kind else {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        };
        out!(prm, c.0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphMemcpyNodeSetParams(
    node: CUhandle,
    prm: *const Memcpy3D,
) -> CUresult {
    ffi("cuGraphMemcpyNodeSetParams", || {
        set_kind(node, memcpy_kind(prm)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemsetNode(
    out: *mut CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    n: usize,
    prm: *const MemsetNodeParams,
    _ctx: CUhandle,
) -> CUresult {
    ffi("cuGraphAddMemsetNode", || {
        add(out, graph, deps, n, || memset_kind(prm))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphMemsetNodeGetParams(
    node: CUhandle,
    prm: *mut MemsetNodeParams,
) -> CUresult {
    ffi("cuGraphMemsetNodeGetParams", || {
        let reg = registry();
        let NodeKind::Memset(m, _) = &reg.node(h(node))?.kind else {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        };
        out!(
            prm,
            MemsetNodeParams {
                dst: m.dst,
                pitch: m.pitch,
                value: m.value,
                element_size: m.elem,
                width: m.width,
                height: m.height,
            }
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphMemsetNodeSetParams(
    node: CUhandle,
    prm: *const MemsetNodeParams,
) -> CUresult {
    ffi("cuGraphMemsetNodeSetParams", || {
        set_kind(node, memset_kind(prm)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddHostNode(
    out: *mut CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    n: usize,
    prm: *const HostNodeParams,
) -> CUresult {
    ffi("cuGraphAddHostNode", || {
        add(out, graph, deps, n, || host_kind(prm))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphHostNodeGetParams(
    node: CUhandle,
    prm: *mut HostNodeParams,
) -> CUresult {
    ffi("cuGraphHostNodeGetParams", || {
        let reg = registry();
        let NodeKind::Host { f, data } = reg.node(h(node))?.kind else {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        };
        // SAFETY: `f` is the non-NULL CUhostFn the application gave for this node.
        let f = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void)>(f) };
        out!(
            prm,
            HostNodeParams {
                f: Some(f),
                user_data: data as *mut c_void,
            }
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphHostNodeSetParams(
    node: CUhandle,
    prm: *const HostNodeParams,
) -> CUresult {
    ffi("cuGraphHostNodeSetParams", || {
        set_kind(node, host_kind(prm)?)
    })
}

/// A child graph node's work: a copy of `child` (later changes to `child` do not reach it, as
/// in CUDA).
pub(super) fn child_kind(child: CUhandle) -> CuRes<NodeKind> {
    let mut reg = registry();
    let copy = reg.clone_graph(h(child))?;
    reg.graph_mut(copy)?.owned = true;
    Ok(NodeKind::Child(copy))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddChildGraphNode(
    out: *mut CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    n: usize,
    child: CUhandle,
) -> CUresult {
    ffi("cuGraphAddChildGraphNode", || {
        add(out, graph, deps, n, || child_kind(child))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphChildGraphNodeGetGraph(
    node: CUhandle,
    out: *mut CUhandle,
) -> CUresult {
    ffi("cuGraphChildGraphNodeGetGraph", || {
        let NodeKind::Child(c) = registry().node(h(node))?.kind else {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        };
        out!(out, p(c))
    })
}

macro_rules! event_node {
    ($add:ident, $get:ident, $set:ident, $exec_set:ident, $variant:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $add(
            out: *mut CUhandle,
            graph: CUhandle,
            deps: *const CUhandle,
            n: usize,
            event: CUhandle,
        ) -> CUresult {
            ffi(stringify!($add), || {
                add(out, graph, deps, n, || {
                    if event.is_null() {
                        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
                    }
                    Ok(NodeKind::$variant(h(event)))
                })
            })
        }

        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $get(node: CUhandle, event: *mut CUhandle) -> CUresult {
            ffi(stringify!($get), || {
                let NodeKind::$variant(e) = registry().node(h(node))?.kind else {
                    return Err(cuda::CUDA_ERROR_INVALID_VALUE);
                };
                out!(event, p(e))
            })
        }

        #[unsafe(no_mangle)]
        pub extern "C" fn $set(node: CUhandle, event: CUhandle) -> CUresult {
            ffi(stringify!($set), || {
                set_kind(node, NodeKind::$variant(h(event)))
            })
        }

        #[unsafe(no_mangle)]
        pub extern "C" fn $exec_set(e: CUhandle, node: CUhandle, event: CUhandle) -> CUresult {
            ffi(stringify!($exec_set), || {
                exec::set_node(h(e), h(node), NodeKind::$variant(h(event)))
            })
        }
    };
}

event_node!(
    cuGraphAddEventRecordNode,
    cuGraphEventRecordNodeGetEvent,
    cuGraphEventRecordNodeSetEvent,
    cuGraphExecEventRecordNodeSetEvent,
    EventRecord
);
event_node!(
    cuGraphAddEventWaitNode,
    cuGraphEventWaitNodeGetEvent,
    cuGraphEventWaitNodeSetEvent,
    cuGraphExecEventWaitNodeSetEvent,
    EventWait
);

/// Adds a memory allocation node of `size` bytes (its address reserved now); returns the address.
///
/// Pointer contract (CUDA's): as [`add`].
pub(super) fn add_mem_alloc(
    out: *mut CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    n: usize,
    size: u64,
) -> CuRes<u64> {
    let mut ptr = 0;
    add(out, graph, deps, n, || {
        let (p, reserved) = reserve(size)?;
        ptr = p;
        Ok(NodeKind::MemAlloc {
            bytesize: size,
            ptr,
            reserved,
        })
    })?;
    Ok(ptr)
}

/// A memory free node's work: `dptr` must be a graph allocation.
pub(super) fn mem_free_kind(dptr: CUdeviceptr) -> CuRes<NodeKind> {
    if !is_graph_alloc(dptr) {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(NodeKind::MemFree(dptr))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    out: *mut CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    n: usize,
    prm: *mut MemAllocNodeParams,
) -> CUresult {
    ffi("cuGraphAddMemAllocNode", || {
        if prm.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's CUDA_MEM_ALLOC_NODE_PARAMS (CUDA contract).
        let size = unsafe { (*prm).bytesize } as u64;
        let ptr = add_mem_alloc(out, graph, deps, n, size)?;
        // SAFETY: as above; `dptr` is the structure's out-field.
        unsafe { (*prm).dptr = ptr };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphMemAllocNodeGetParams(
    node: CUhandle,
    prm: *mut MemAllocNodeParams,
) -> CUresult {
    ffi("cuGraphMemAllocNodeGetParams", || {
        let NodeKind::MemAlloc { bytesize, ptr, .. } = registry().node(h(node))?.kind else {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        };
        let mut pool_props = [0u8; 88];
        // allocType = CU_MEM_ALLOCATION_TYPE_PINNED (1), location = device 0.
        pool_props[0] = 1;
        pool_props[8] = 1;
        out!(
            prm,
            MemAllocNodeParams {
                pool_props,
                access_descs: std::ptr::null(),
                access_desc_count: 0,
                bytesize: bytesize as usize,
                dptr: ptr,
            }
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    out: *mut CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    n: usize,
    dptr: CUdeviceptr,
) -> CUresult {
    ffi("cuGraphAddMemFreeNode", || {
        add(out, graph, deps, n, || mem_free_kind(dptr))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphMemFreeNodeGetParams(
    node: CUhandle,
    dptr: *mut CUdeviceptr,
) -> CUresult {
    ffi("cuGraphMemFreeNodeGetParams", || {
        let NodeKind::MemFree(ptr) = registry().node(h(node))?.kind else {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        };
        out!(dptr, ptr)
    })
}

/// `cuDeviceGraphMemTrim`: graph allocations are unmapped when freed; nothing is cached.
#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGraphMemTrim(_device: c_int) -> CUresult {
    ffi("cuDeviceGraphMemTrim", || Ok(()))
}

/// `CUgraphMem_attribute` values.
mod graph_mem_attr {
    pub const USED_MEM_CURRENT: i32 = 0;
    pub const USED_MEM_HIGH: i32 = 1;
    pub const RESERVED_MEM_CURRENT: i32 = 2;
    pub const RESERVED_MEM_HIGH: i32 = 3;
}

/// This process's graph memory from vgpud, with the watermarks of `reset` reset first.
fn graph_mem_use(device: c_int, reset: u32) -> CuRes<msg::GraphMemUse> {
    let device = u32::try_from(device).map_err(|_| cuda::CUDA_ERROR_INVALID_DEVICE)?;
    drv::driver()?.call(&msg::GraphMemAttributes { device, reset }, &[])
}

/// `cuDeviceGetGraphMemAttribute`: bytes of graph allocations mapped now and their high
/// watermark; the reserved figures are the same bytes (nothing is cached for later graphs),
/// with a watermark of their own.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    device: c_int,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    ffi("cuDeviceGetGraphMemAttribute", || {
        use graph_mem_attr::*;
        if !(USED_MEM_CURRENT..=RESERVED_MEM_HIGH).contains(&attr) {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let u = graph_mem_use(device, 0)?;
        let v = match attr {
            USED_MEM_CURRENT | RESERVED_MEM_CURRENT => u.used,
            USED_MEM_HIGH => u.used_high,
            _ => u.reserved_high,
        };
        out!(value.cast::<u64>(), v)
    })
}

/// `cuDeviceSetGraphMemAttribute`: only the high watermarks can be set, and only to 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceSetGraphMemAttribute(
    device: c_int,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    ffi("cuDeviceSetGraphMemAttribute", || {
        use graph_mem_attr::*;
        // SAFETY: NULL or the caller's cuuint64_t (CUDA contract).
        let v = unsafe { value.cast::<u64>().as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        let reset = match attr {
            USED_MEM_HIGH => msg::GRAPH_MEM_RESET_USED_HIGH,
            RESERVED_MEM_HIGH => msg::GRAPH_MEM_RESET_RESERVED_HIGH,
            _ => return Err(cuda::CUDA_ERROR_INVALID_VALUE),
        };
        if *v != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        graph_mem_use(device, reset).map(drop)
    })
}

// ---- executable graphs --------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    out: *mut CUhandle,
    graph: CUhandle,
    flags: u64,
) -> CUresult {
    ffi("cuGraphInstantiateWithFlags", || {
        if out.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(out, p(exec::instantiate(h(graph), flags)?))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate(
    out: *mut CUhandle,
    graph: CUhandle,
    err_node: *mut CUhandle,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    ffi("cuGraphInstantiate", || {
        if out.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        if !err_node.is_null() {
            out!(err_node, std::ptr::null_mut())?;
        }
        match exec::instantiate(h(graph), 0) {
            Ok(e) => out!(out, p(e)),
            Err(code) => {
                if !log.is_null() && log_size > 0 {
                    let msg = cuda::result_name(code).unwrap_or("instantiation failed");
                    // SAFETY: `log` holds `log_size` bytes (CUDA contract).
                    let _ = unsafe {
                        crate::ffi::write_cstr(log, log_size.min(i32::MAX as usize) as i32, msg)
                    };
                }
                Err(code)
            }
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    out: *mut CUhandle,
    graph: CUhandle,
    err_node: *mut CUhandle,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    // SAFETY: the same contract.
    unsafe { cuGraphInstantiate(out, graph, err_node, log, log_size) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    out: *mut CUhandle,
    graph: CUhandle,
    prm: *mut InstantiateParams,
) -> CUresult {
    ffi("cuGraphInstantiateWithParams", || {
        if out.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: NULL or the caller's CUDA_GRAPH_INSTANTIATE_PARAMS (CUDA contract).
        let prm = unsafe { prm.as_mut() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        prm.err_node = std::ptr::null_mut();
        match exec::instantiate(h(graph), prm.flags) {
            Ok(e) => {
                prm.result = INSTANTIATE_SUCCESS;
                out!(out, p(e))
            }
            Err(code) => {
                prm.result = INSTANTIATE_ERROR;
                Err(code)
            }
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecGetFlags(e: CUhandle, flags: *mut u64) -> CUresult {
    ffi("cuGraphExecGetFlags", || {
        let f = registry()
            .execs
            .get(&h(e))
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?
            .flags();
        out!(flags, f)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphUpload(e: CUhandle, _stream: CUhandle) -> CUresult {
    ffi("cuGraphUpload", || exec::upload(h(e)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch(e: CUhandle, stream: CUhandle) -> CUresult {
    ffi("cuGraphLaunch", || exec::launch(h(e), h(stream)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphExecDestroy(e: CUhandle) -> CUresult {
    ffi("cuGraphExecDestroy", || exec::destroy(h(e)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecUpdate(
    e: CUhandle,
    graph: CUhandle,
    err_node: *mut CUhandle,
    result: *mut c_int,
) -> CUresult {
    ffi("cuGraphExecUpdate", || {
        let (r, node) = exec::update(h(e), h(graph))?;
        if !err_node.is_null() {
            out!(err_node, p(node))?;
        }
        out!(result, r)?;
        if r == exec::update_result::SUCCESS {
            Ok(())
        } else {
            Err(cuda::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecUpdate_v2(
    e: CUhandle,
    graph: CUhandle,
    info: *mut UpdateResultInfo,
) -> CUresult {
    ffi("cuGraphExecUpdate_v2", || {
        let (r, node) = exec::update(h(e), h(graph))?;
        out!(
            info,
            UpdateResultInfo {
                result: r,
                error_node: p(node),
                error_from_node: std::ptr::null_mut(),
            }
        )?;
        if r == exec::update_result::SUCCESS {
            Ok(())
        } else {
            Err(cuda::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecKernelNodeSetParams(
    e: CUhandle,
    node: CUhandle,
    prm: *const KernelNodeParams,
) -> CUresult {
    ffi("cuGraphExecKernelNodeSetParams", || {
        exec::set_node(h(e), h(node), kernel_kind(prm, false)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecKernelNodeSetParams_v2(
    e: CUhandle,
    node: CUhandle,
    prm: *const KernelNodeParamsV2,
) -> CUresult {
    ffi("cuGraphExecKernelNodeSetParams_v2", || {
        exec::set_node(h(e), h(node), kernel_kind(prm.cast(), true)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecMemcpyNodeSetParams(
    e: CUhandle,
    node: CUhandle,
    prm: *const Memcpy3D,
    _ctx: CUhandle,
) -> CUresult {
    ffi("cuGraphExecMemcpyNodeSetParams", || {
        exec::set_node(h(e), h(node), memcpy_kind(prm)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecMemsetNodeSetParams(
    e: CUhandle,
    node: CUhandle,
    prm: *const MemsetNodeParams,
    _ctx: CUhandle,
) -> CUresult {
    ffi("cuGraphExecMemsetNodeSetParams", || {
        exec::set_node(h(e), h(node), memset_kind(prm)?)
    })
}

/// `cuGraphNodeSetEnabled`: a disabled kernel, memcpy or memset node runs as an empty node.
#[unsafe(no_mangle)]
pub extern "C" fn cuGraphNodeSetEnabled(e: CUhandle, node: CUhandle, on: c_uint) -> CUresult {
    ffi("cuGraphNodeSetEnabled", || {
        exec::set_enabled(h(e), h(node), on != 0)
    })
}

/// `cuGraphNodeGetEnabled`.
///
/// # Safety
/// `on` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetEnabled(
    e: CUhandle,
    node: CUhandle,
    on: *mut c_uint,
) -> CUresult {
    ffi("cuGraphNodeGetEnabled", || {
        if on.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let v = exec::enabled(h(e), h(node))?;
        // SAFETY: non-NULL, and the caller's writable out-pointer (CUDA contract).
        unsafe { *on = c_uint::from(v) };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphExecChildGraphNodeSetParams(
    e: CUhandle,
    node: CUhandle,
    child: CUhandle,
) -> CUresult {
    ffi("cuGraphExecChildGraphNodeSetParams", || {
        exec::set_child(h(e), h(node), h(child))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecHostNodeSetParams(
    e: CUhandle,
    node: CUhandle,
    prm: *const HostNodeParams,
) -> CUresult {
    ffi("cuGraphExecHostNodeSetParams", || {
        exec::set_node(h(e), h(node), host_kind(prm)?)
    })
}
