//! Executable graphs: instantiation, upload, launch and update.
//!
//! At instantiation the graph is copied (later changes to it do not affect the executable
//! graph, as in CUDA), its nodes are put in a topological order, child graphs are inlined and
//! every node becomes its [`Op`]s, with the dependencies between them (a node's first operation
//! depends on the last operations of the nodes it depends on, its others on the one before).
//! Runs of device operations (kernels, device copies, memsets, event records and waits, graph
//! allocations) are uploaded to vgpud as one executable graph each (`GraphInstantiate`), with
//! those dependencies, so that vgpud runs independent branches at the same time; a launch sends
//! one `GraphLaunch` per run. Operations that need the
//! guest process (copies from or to host memory, host functions) are queued between runs as
//! gates on the stream ([`crate::host_func`]): the shim's host-function thread runs them when the
//! stream reaches them, in the graph's order, so a copy from host memory reads what an earlier
//! host node wrote and a host node after a copy to host memory sees the copied bytes;
//! `cuGraphLaunch` waits for none of them. A graph made only of device work is one request per
//! launch.

use std::sync::Arc;

use vgpu_proto::cuda;
use vgpu_proto::frame::MAX_BULK_CHUNK;
use vgpu_proto::graph::{
    CONDITIONAL_NODE, EMPTY_NODE, MEM_ALLOC_NODE, MEM_FREE_NODE, push_body, push_deps, push_node,
    push_op,
};
use vgpu_proto::msg;

use super::{MAX_NODES, NodeKind, Op, Registry, registry};
use crate::driver::{self as drv, CuRes};

/// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`.
pub const FLAG_AUTO_FREE_ON_LAUNCH: u64 = 0x1;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`.
pub const FLAG_UPLOAD: u64 = 0x2;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`.
pub const FLAG_DEVICE_LAUNCH: u64 = 0x4;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`.
pub const FLAG_USE_NODE_PRIORITY: u64 = 0x8;

/// `CUgraphExecUpdateResult` values.
pub mod update_result {
    /// `CU_GRAPH_EXEC_UPDATE_SUCCESS`.
    pub const SUCCESS: i32 = 0;
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED`.
    pub const TOPOLOGY_CHANGED: i32 = 2;
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED`.
    pub const NODE_TYPE_CHANGED: i32 = 3;
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED`.
    pub const PARAMETERS_CHANGED: i32 = 5;
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED`.
    pub const NOT_SUPPORTED: i32 = 6;
}

/// One step of a launch.
#[derive(Debug, Clone)]
enum Step {
    /// An uploaded run of device operations; `sync` when it maps graph memory (its launch then
    /// waits, so that running out of the slice fails `cuGraphLaunch`).
    Device { handle: u64, sync: bool },
    /// An operation the shim runs.
    Host(Op),
}

/// An executable graph.
#[derive(Debug)]
pub struct Exec {
    /// The context it was instantiated in.
    pub ctx: u64,
    /// A private copy of the graph it was made from (updated by `cuGraphExecUpdate` and the
    /// `cuGraphExec*SetParams` calls).
    pub source: u64,
    /// The original graph's nodes in topological order; node `i` of `source` in that order
    /// stands for `nodes[i]`.
    pub nodes: Vec<u64>,
    /// The copy's nodes in the same order.
    pub copy_nodes: Vec<u64>,
    /// Uploaded runs (vgpud handles).
    uploaded: Vec<u64>,
    /// What a launch does; `None` until (re)uploaded.
    plan: Option<Arc<Vec<Step>>>,
    /// `FLAG_*` given at instantiation.
    flags: u64,
    /// Nodes of `copy_nodes` disabled with `cuGraphNodeSetEnabled`: they run as empty nodes.
    disabled: std::collections::HashSet<u64>,
}

/// One operation of an executable graph: an [`Op`], or (`None`) a join point that waits for its
/// dependencies and does nothing else; and the operations it depends on (indices, all earlier).
pub type PlanOp = (Option<Op>, Vec<usize>);

/// The operations of a node that is not a child graph.
fn node_ops(kind: &NodeKind, out: &mut Vec<Op>) {
    match kind {
        NodeKind::Kernel(k) => out.push(k.op()),
        NodeKind::Memcpy(_, ops) | NodeKind::Memset(_, ops) => out.extend(ops.iter().cloned()),
        NodeKind::Host { f, data } => out.push(Op::Host { f: *f, data: *data }),
        // Graphs of their own: lowered by `graph_ops`.
        NodeKind::Child(_) | NodeKind::Conditional(_) | NodeKind::Empty => {}
        NodeKind::EventRecord(e) => out.push(Op::EventRecord(*e)),
        NodeKind::EventWait(e) => out.push(Op::EventWait(*e)),
        NodeKind::MemAlloc { ptr, reserved, .. } => out.push(Op::MemAlloc {
            ptr: *ptr,
            size: *reserved,
        }),
        NodeKind::MemFree(p) => out.push(Op::MemFree { ptr: *p }),
        NodeKind::BatchMemOp(b) => out.extend(crate::mem_ops::graph_ops(&b.ops)),
    }
}

/// Appends the operations of `nodes` (a graph's nodes in topological order; child graphs
/// inlined) to `out` with their dependencies; the graph's roots depend on `entry`. Returns the
/// operation the graph's end stands for (`None`: nothing, i.e. `entry`'s). Where several
/// operations meet (a node without operations of its own, or a child graph, that depends on
/// several) a join point stands for them, so that every node ends in at most one operation.
fn graph_ops(
    reg: &Registry,
    nodes: &[u64],
    disabled: &std::collections::HashSet<u64>,
    entry: Option<usize>,
    out: &mut Vec<PlanOp>,
    depth: usize,
) -> CuRes<Option<usize>> {
    if depth > MAX_NODES {
        return Err(cuda::CUDA_ERROR_OUT_OF_MEMORY);
    }
    let mut end: std::collections::HashMap<u64, Option<usize>> = Default::default();
    let mut depended: std::collections::HashSet<u64> = Default::default();
    let mut ops = Vec::new();
    for &n in nodes {
        let node = reg.node(n)?;
        let mut incoming: Vec<usize> = if node.deps.is_empty() {
            entry.into_iter().collect()
        } else {
            node.deps
                .iter()
                .filter_map(|d| end.get(d).copied().flatten())
                .collect()
        };
        incoming.sort_unstable();
        incoming.dedup();
        depended.extend(node.deps.iter().copied());
        let join = |out: &mut Vec<PlanOp>, incoming: Vec<usize>| -> Option<usize> {
            match incoming.len() {
                0 => None,
                1 => Some(incoming[0]),
                _ => {
                    out.push((None, incoming));
                    Some(out.len() - 1)
                }
            }
        };
        let last = if let NodeKind::Child(c) = node.kind {
            let start = join(out, incoming);
            graph_ops(
                reg,
                &reg.topo_order(c)?,
                &Default::default(),
                start,
                out,
                depth + 1,
            )?
        } else if let NodeKind::Conditional(c) = &node.kind {
            let op = super::conditional::lower(c, |body| {
                let mut ops = Vec::new();
                graph_ops(
                    reg,
                    &reg.topo_order(body)?,
                    &Default::default(),
                    None,
                    &mut ops,
                    depth + 1,
                )?;
                Ok(ops)
            })?;
            out.push((Some(op), incoming));
            Some(out.len() - 1)
        } else {
            ops.clear();
            if !disabled.contains(&n) {
                node_ops(&node.kind, &mut ops);
            }
            if ops.is_empty() {
                join(out, incoming)
            } else {
                let mut deps = incoming;
                for op in ops.drain(..) {
                    out.push((Some(op), deps));
                    deps = vec![out.len() - 1];
                }
                Some(out.len() - 1)
            }
        };
        if out.len() > MAX_NODES {
            return Err(cuda::CUDA_ERROR_OUT_OF_MEMORY);
        }
        end.insert(n, last);
    }
    let exits: Vec<usize> = nodes
        .iter()
        .filter(|n| !depended.contains(n))
        .filter_map(|n| end.get(n).copied().flatten())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    Ok(match exits.len() {
        0 => entry,
        1 => Some(exits[0]),
        _ => {
            out.push((None, exits));
            Some(out.len() - 1)
        }
    })
}

/// Appends a device operation to a run's node list; `false` for an operation the shim runs.
/// With `node_priority` (`FLAG_USE_NODE_PRIORITY`) a kernel carries its node's priority
/// (`LaunchKernelPriority`); otherwise it runs at the launch stream's.
fn encode(ctx: u64, op: &Op, node_priority: bool, out: &mut Vec<u8>) -> bool {
    match op {
        Op::Kernel {
            f,
            grid,
            block,
            shared,
            params,
            priority,
        } => {
            // Page-locked buffers the kernel is handed get device memory now, so that the
            // launches' copy-in includes them (crate::pinned_uva); without it the kernel faults
            // on them as it would have before.
            if let Err(code) = crate::pinned_uva::back_args(ctx, params) {
                crate::debug!("graph kernel node: page-locked memory not backed ({code})");
            }
            let launch = msg::LaunchKernel {
                ctx,
                stream: 0,
                function: *f,
                grid_x: grid[0],
                grid_y: grid[1],
                grid_z: grid[2],
                block_x: block[0],
                block_y: block[1],
                block_z: block[2],
                shared_bytes: *shared,
            };
            if node_priority {
                push_op(out, &launch.with_priority(false, *priority), params);
            } else {
                push_op(out, &launch, params);
            }
        }
        Op::Memset {
            dst,
            value,
            elem,
            count,
        } => push_op(
            out,
            &msg::Memset {
                ctx,
                stream: 0,
                dst: *dst,
                value: *value,
                elem_size: *elem,
                count: *count,
            },
            &[],
        ),
        Op::DtoD { dst, src, len } => push_op(
            out,
            &msg::MemcpyDtoD {
                ctx,
                stream: 0,
                dst: *dst,
                src: *src,
                len: *len,
            },
            &[],
        ),
        Op::EventRecord(e) => push_op(
            out,
            &msg::EventRecord {
                ctx,
                stream: 0,
                event: *e,
            },
            &[],
        ),
        Op::EventWait(e) => push_op(
            out,
            &msg::StreamWaitEvent {
                ctx,
                stream: 0,
                event: *e,
                flags: 0,
            },
            &[],
        ),
        Op::MemAlloc { ptr, size } => push_node(
            out,
            MEM_ALLOC_NODE,
            &msg::GraphMemAllocNode {
                ptr: *ptr,
                size: *size,
            },
            &[],
        ),
        Op::MemFree { ptr } => push_node(
            out,
            MEM_FREE_NODE,
            &msg::GraphMemFreeNode { ptr: *ptr },
            &[],
        ),
        Op::MemOps(ops) => {
            for o in ops {
                push_op(out, &o.request(ctx, 0), &[]);
            }
        }
        Op::Conditional {
            handle,
            kind,
            default,
            flags,
            bodies,
        } => {
            let mut tail = Vec::new();
            for body in bodies {
                let mut list = Vec::new();
                for (i, (op, deps)) in body.iter().enumerate() {
                    let implied: &[usize] = if i == 0 { &[] } else { &[i - 1] };
                    if deps.as_slice() != implied {
                        let deps: Vec<u32> = deps.iter().map(|&d| d as u32).collect();
                        push_deps(&mut list, &deps);
                    }
                    match op {
                        // Bodies hold device operations only (`conditional::lower`).
                        Some(op) => {
                            encode(ctx, op, node_priority, &mut list);
                        }
                        None => push_node(&mut list, EMPTY_NODE, &msg::Empty {}, &[]),
                    }
                }
                push_body(&mut tail, &list);
            }
            push_node(
                out,
                CONDITIONAL_NODE,
                &msg::GraphConditionalNode {
                    handle: *handle,
                    kind: *kind,
                    bodies: bodies.len() as u32,
                    default: *default,
                    flags: *flags,
                },
                &tail,
            );
        }
        Op::HtoD { .. } | Op::DtoH { .. } | Op::Host { .. } => return false,
    }
    true
}

impl Exec {
    /// The operations of every node, in a topological order, with their dependencies.
    fn ops(&self, reg: &Registry) -> CuRes<Vec<PlanOp>> {
        let mut ops = Vec::new();
        graph_ops(reg, &self.copy_nodes, &self.disabled, None, &mut ops, 0)?;
        if ops.len() > MAX_NODES {
            return Err(cuda::CUDA_ERROR_OUT_OF_MEMORY);
        }
        Ok(ops)
    }

    /// Uploads the runs of device operations (replacing those uploaded before) if needed.
    fn upload(&mut self, reg: &Registry) -> CuRes<Arc<Vec<Step>>> {
        if let Some(p) = &self.plan {
            return Ok(Arc::clone(p));
        }
        let ops = self.ops(reg)?;
        if self.flags & FLAG_AUTO_FREE_ON_LAUNCH != 0
            && ops.iter().any(|o| matches!(o.0, Some(Op::MemAlloc { .. })))
        {
            crate::debug!("CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH is not supported");
            return Err(cuda::CUDA_ERROR_NOT_SUPPORTED);
        }
        let d = drv::driver()?;
        // Runs of device operations, each at most one bulk chunk of nodes.
        let mut runs: Vec<(Vec<u8>, bool)> = Vec::new();
        let mut layout: Vec<Option<usize>> = Vec::new();
        let mut cur: Option<(Vec<u8>, bool)> = None;
        let mut hosts = Vec::new();
        // Where each operation went: (run, position in it); `usize::MAX` for host operations.
        let mut placed: Vec<(usize, u32)> = Vec::with_capacity(ops.len());
        // Nodes in the run being built.
        let mut in_run = 0u32;
        for (op, deps) in ops {
            let mut bytes = Vec::new();
            let device = match &op {
                Some(op) => encode(
                    self.ctx,
                    op,
                    self.flags & FLAG_USE_NODE_PRIORITY != 0,
                    &mut bytes,
                ),
                None => {
                    push_node(&mut bytes, EMPTY_NODE, &msg::Empty {}, &[]);
                    true
                }
            };
            if bytes.len() > MAX_BULK_CHUNK {
                // Only a conditional node's bodies grow a node this large.
                crate::debug!(
                    "a graph node of {} bytes (a conditional node's bodies) is larger than one \
                     upload ({MAX_BULK_CHUNK} bytes)",
                    bytes.len()
                );
                return Err(cuda::CUDA_ERROR_OUT_OF_MEMORY);
            }
            if device {
                let full = cur
                    .as_ref()
                    .is_some_and(|(b, _)| !b.is_empty() && b.len() + bytes.len() > MAX_BULK_CHUNK);
                if let Some(run) = cur.take_if(|_| full) {
                    runs.push(run);
                    layout.push(Some(runs.len() - 1));
                    in_run = 0;
                }
                let run = runs.len();
                // Dependencies inside this run; earlier runs (and host operations) are done
                // before it starts.
                let mut local: Vec<u32> = deps
                    .iter()
                    .filter_map(|&d| placed.get(d))
                    .filter(|(r, _)| *r == run)
                    .map(|&(_, p)| p)
                    .collect();
                local.sort_unstable();
                local.dedup();
                let default: &[u32] = if in_run == 0 { &[] } else { &[in_run - 1] };
                let (buf, alloc) = cur.get_or_insert_with(|| (Vec::new(), false));
                if local != default {
                    push_deps(buf, &local);
                }
                buf.extend_from_slice(&bytes);
                *alloc |= matches!(op, Some(Op::MemAlloc { .. }));
                placed.push((run, in_run));
                in_run += 1;
            } else {
                if let Some(run) = cur.take() {
                    runs.push(run);
                    layout.push(Some(runs.len() - 1));
                }
                in_run = 0;
                placed.push((usize::MAX, 0));
                hosts.push(op.expect("host operations are operations"));
                layout.push(None);
            }
        }
        if let Some(run) = cur.take() {
            runs.push(run);
            layout.push(Some(runs.len() - 1));
        }
        let mut handles = Vec::with_capacity(runs.len());
        for (i, (bytes, _)) in runs.iter().enumerate() {
            let replace = self.uploaded.get(i).copied().unwrap_or(0);
            let r = d.call(
                &msg::GraphInstantiate {
                    ctx: self.ctx,
                    replace,
                },
                bytes,
            );
            match r {
                Ok(h) => handles.push(h.handle),
                Err(e) => {
                    // Keep what vgpud holds known, so that destroying the graph frees it.
                    for (j, h) in handles.iter().enumerate() {
                        match self.uploaded.get_mut(j) {
                            Some(slot) => *slot = *h,
                            None => self.uploaded.push(*h),
                        }
                    }
                    return Err(e);
                }
            }
        }
        let keep = handles.len().min(self.uploaded.len());
        for stale in self.uploaded.drain(keep..) {
            let _ = d.call(
                &msg::GraphExecDestroy {
                    ctx: self.ctx,
                    exec: stale,
                },
                &[],
            );
        }
        self.uploaded = handles;
        let mut hosts = hosts.into_iter();
        let plan: Vec<Step> = layout
            .into_iter()
            .map(|l| match l {
                Some(i) => Step::Device {
                    handle: self.uploaded[i],
                    sync: runs[i].1,
                },
                None => Step::Host(hosts.next().expect("one host op per slot")),
            })
            .collect();
        let plan = Arc::new(plan);
        self.plan = Some(Arc::clone(&plan));
        Ok(plan)
    }

    /// The `CUDA_GRAPH_INSTANTIATE_FLAG_*` it was instantiated with.
    pub fn flags(&self) -> u64 {
        self.flags
    }

    /// Marks the executable graph changed: the next launch or upload sends it again.
    pub fn changed(&mut self) {
        self.plan = None;
    }
}

/// `cuGraphInstantiateWithFlags`: returns the executable graph.
pub fn instantiate(g: u64, flags: u64) -> CuRes<u64> {
    let known =
        FLAG_AUTO_FREE_ON_LAUNCH | FLAG_UPLOAD | FLAG_DEVICE_LAUNCH | FLAG_USE_NODE_PRIORITY;
    if flags & !known != 0 || flags & FLAG_DEVICE_LAUNCH != 0 {
        // Device-side launch needs a device runtime vgpu does not have.
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = drv::current_ctx().ok_or(cuda::CUDA_ERROR_INVALID_CONTEXT)?;
    let mut reg = registry();
    let nodes = reg.topo_order(g)?;
    let source = reg.clone_graph(g)?;
    let copy_nodes = reg.topo_order(source)?;
    for n in &copy_nodes {
        reg.cloned_from.remove(n);
    }
    let mut exec = Exec {
        ctx,
        source,
        nodes,
        copy_nodes,
        uploaded: Vec::new(),
        plan: None,
        flags,
        disabled: Default::default(),
    };
    if let Err(e) = exec.upload(&reg) {
        let _ = destroy_parts(&mut reg, exec);
        return Err(e);
    }
    let h = reg.handle();
    reg.execs.insert(h, exec);
    Ok(h)
}

fn destroy_parts(reg: &mut Registry, exec: Exec) -> CuRes<()> {
    let _ = reg.destroy_graph(exec.source);
    if let Ok(d) = drv::driver() {
        for h in exec.uploaded {
            d.call(
                &msg::GraphExecDestroy {
                    ctx: exec.ctx,
                    exec: h,
                },
                &[],
            )?;
        }
    }
    Ok(())
}

/// `cuGraphExecDestroy`.
pub fn destroy(e: u64) -> CuRes<()> {
    let mut reg = registry();
    let exec = reg.execs.remove(&e).ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    destroy_parts(&mut reg, exec)
}

/// `cuGraphUpload`: sends the executable graph now if it changed.
pub fn upload(e: u64) -> CuRes<()> {
    let mut reg = registry();
    let mut exec = reg.execs.remove(&e).ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    let r = exec.upload(&reg).map(drop);
    reg.execs.insert(e, exec);
    r
}

/// `cuGraphLaunch`.
pub fn launch(e: u64, stream: u64) -> CuRes<()> {
    if let Some(r) = crate::stream_capture::capture_graph_launch(e, stream) {
        return r;
    }
    let stream = drv::wire_stream(stream)?;
    let (ctx, plan) = {
        let mut reg = registry();
        let mut exec = reg.execs.remove(&e).ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        let r = exec.upload(&reg);
        let ctx = exec.ctx;
        reg.execs.insert(e, exec);
        (ctx, r?)
    };
    let d = drv::driver()?;
    for step in plan.iter() {
        match step {
            Step::Device { handle, sync } => {
                let req = msg::GraphLaunch {
                    ctx,
                    stream,
                    exec: *handle,
                };
                if *sync {
                    d.call(&req, &[])?;
                } else {
                    crate::alloc_api::before_launch(stream)?;
                    d.post(&req, &[])?;
                }
            }
            Step::Host(op) => run_host(op, stream)?,
        }
    }
    Ok(())
}

/// Runs an operation that needs the guest process, in stream order: on the shim's host-function
/// thread when the stream reaches it ([`crate::host_func`]). Host copies go in gates of at most
/// one bulk chunk each. With a vgpud that predates host copies, a copy to the device reads the
/// host bytes now and one to the host waits for the stream, as before.
fn run_host(op: &Op, stream: u64) -> CuRes<()> {
    use crate::host_func::{HostCopy, launch_host_copy};
    match *op {
        Op::HtoD { dst, src, len } => {
            let mut done = 0;
            while done < len {
                let n = (len - done).min(MAX_BULK_CHUNK);
                let copy = HostCopy::ToDevice {
                    dst: dst + done as u64,
                    src: src + done,
                    len: n,
                };
                if !launch_host_copy(stream, copy)? {
                    // SAFETY: the node's host source, which CUDA requires to stay valid and
                    // readable for the copy's size while the graph may run.
                    let bytes = unsafe {
                        std::slice::from_raw_parts((src + done) as *const u8, len - done)
                    };
                    return drv::memcpy_htod(dst + done as u64, bytes, stream, false);
                }
                done += n;
            }
            Ok(())
        }
        Op::DtoH { dst, src, len } => {
            let mut done = 0;
            while done < len {
                let n = (len - done).min(MAX_BULK_CHUNK);
                let copy = HostCopy::ToHost {
                    dst: dst + done,
                    src: src + done as u64,
                    len: n,
                };
                if !launch_host_copy(stream, copy)? {
                    // SAFETY: the node's host destination, which CUDA requires to stay valid and
                    // writable for the copy's size while the graph may run.
                    let bytes = unsafe {
                        std::slice::from_raw_parts_mut((dst + done) as *mut u8, len - done)
                    };
                    return drv::memcpy_dtoh(bytes, src + done as u64, stream);
                }
                done += n;
            }
            Ok(())
        }
        Op::Host { f, data } => {
            // SAFETY: `f` is the CUhostFn the application gave for this node (never 0: checked
            // when the node was made); it is called once per launch with its argument, as CUDA
            // does.
            let f: unsafe extern "C" fn(*mut std::ffi::c_void) = unsafe { std::mem::transmute(f) };
            // Runs on the host-function thread when the stream reaches it; the graph's later
            // nodes on the stream wait for it, and the launch does not.
            crate::host_func::launch_host_func(
                stream,
                crate::host_func::HostCall::Func {
                    f,
                    data: data as *mut std::ffi::c_void,
                },
            )
        }
        _ => Err(cuda::CUDA_ERROR_UNKNOWN),
    }
}

/// The position of original node `node` in executable graph `exec`, and the copy's node there.
pub fn exec_node(reg: &Registry, e: u64, node: u64) -> CuRes<(usize, u64)> {
    let exec = reg.execs.get(&e).ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    let i = exec
        .nodes
        .iter()
        .position(|&n| n == node)
        .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    Ok((i, exec.copy_nodes[i]))
}

/// Replaces the work of `node` in `exec` (`cuGraphExec*NodeSetParams`); the kind must stay.
pub fn set_node(e: u64, node: u64, kind: NodeKind) -> CuRes<()> {
    let mut reg = registry();
    let (_, copy) = exec_node(&reg, e, node)?;
    let slot = reg.node_mut(copy)?;
    if slot.kind.type_code() != kind.type_code() {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    if matches!(
        slot.kind,
        NodeKind::MemAlloc { .. }
            | NodeKind::MemFree(_)
            | NodeKind::Child(_)
            | NodeKind::Conditional(_)
    ) {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let mut kind = kind;
    kind.keep_attributes(&slot.kind);
    slot.kind = kind;
    reg.execs.get_mut(&e).expect("found above").changed();
    Ok(())
}

/// Whether graphs `a` and `b` have the same shape: as many nodes, in the same insertion order,
/// of the same types, with the same dependencies (child graphs: as many nodes).
fn same_shape(reg: &Registry, a: u64, b: u64) -> CuRes<bool> {
    let (ga, gb) = (reg.graph(a)?, reg.graph(b)?);
    if ga.order.len() != gb.order.len() {
        return Ok(false);
    }
    let index_of = |list: &[u64], n: u64| list.iter().position(|&x| x == n);
    for (na, nb) in ga.order.iter().zip(&gb.order) {
        let (na, nb) = (&ga.nodes[na], &gb.nodes[nb]);
        if na.kind.type_code() != nb.kind.type_code() {
            return Ok(false);
        }
        let da: Vec<_> = na.deps.iter().map(|d| index_of(&ga.order, *d)).collect();
        let db: Vec<_> = nb.deps.iter().map(|d| index_of(&gb.order, *d)).collect();
        if da != db {
            return Ok(false);
        }
        if let (NodeKind::Child(ca), NodeKind::Child(cb)) = (&na.kind, &nb.kind)
            && reg.graph(*ca)?.order.len() != reg.graph(*cb)?.order.len()
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether graph `g` (its child graphs included) holds allocation or free nodes.
fn has_mem_nodes(reg: &Registry, g: u64) -> CuRes<bool> {
    for node in reg.graph(g)?.nodes.values() {
        match node.kind {
            NodeKind::MemAlloc { .. } | NodeKind::MemFree(_) => return Ok(true),
            NodeKind::Child(c) if has_mem_nodes(reg, c)? => return Ok(true),
            _ => {}
        }
    }
    Ok(false)
}

/// `cuGraphExecChildGraphNodeSetParams`: the child graph node `node` of `exec` runs a copy of
/// `child`, which must have the shape of the graph it replaces and no allocation or free
/// nodes (as in CUDA).
pub fn set_child(e: u64, node: u64, child: u64) -> CuRes<()> {
    let mut reg = registry();
    let (_, copy) = exec_node(&reg, e, node)?;
    let NodeKind::Child(old) = reg.node(copy)?.kind else {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    };
    if !same_shape(&reg, old, child)? || has_mem_nodes(&reg, child)? || has_mem_nodes(&reg, old)? {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let new = reg.clone_graph(child)?;
    reg.graph_mut(new)?.owned = true;
    reg.node_mut(copy)?.kind = NodeKind::Child(new);
    let _ = reg.destroy_graph(old);
    reg.execs.get_mut(&e).expect("found above").changed();
    Ok(())
}

/// `cuGraphNodeSetEnabled`: a disabled kernel, memcpy or memset node of `exec` runs as an empty
/// node (its dependencies still order the graph) until enabled again.
pub fn set_enabled(e: u64, node: u64, enabled: bool) -> CuRes<()> {
    let mut reg = registry();
    let (_, copy) = exec_node(&reg, e, node)?;
    if !matches!(
        reg.node(copy)?.kind,
        NodeKind::Kernel(_) | NodeKind::Memcpy(..) | NodeKind::Memset(..)
    ) {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let exec = reg.execs.get_mut(&e).expect("found above");
    let changed = if enabled {
        exec.disabled.remove(&copy)
    } else {
        exec.disabled.insert(copy)
    };
    if changed {
        exec.changed();
    }
    Ok(())
}

/// `cuGraphNodeGetEnabled`.
pub fn enabled(e: u64, node: u64) -> CuRes<bool> {
    let reg = registry();
    let (_, copy) = exec_node(&reg, e, node)?;
    if !matches!(
        reg.node(copy)?.kind,
        NodeKind::Kernel(_) | NodeKind::Memcpy(..) | NodeKind::Memset(..)
    ) {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(!reg.execs[&e].disabled.contains(&copy))
}

/// `cuGraphExecUpdate`: gives `exec` the parameters of graph `g`, whose topology must be the
/// same. Returns (`CUgraphExecUpdateResult`, the node that failed or 0).
pub fn update(e: u64, g: u64) -> CuRes<(i32, u64)> {
    let mut reg = registry();
    let order = reg.topo_order(g)?;
    let exec = reg.execs.get(&e).ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    let copy_nodes = exec.copy_nodes.clone();
    if order.len() != copy_nodes.len() {
        return Ok((update_result::TOPOLOGY_CHANGED, 0));
    }
    let index_of = |list: &[u64], n: u64| list.iter().position(|&x| x == n);
    let mut kinds = Vec::with_capacity(order.len());
    for (new, old) in order.iter().zip(&copy_nodes) {
        let (nn, on) = (reg.node(*new)?, reg.node(*old)?);
        let mut nd: Vec<_> = nn.deps.iter().map(|d| index_of(&order, *d)).collect();
        let mut od: Vec<_> = on.deps.iter().map(|d| index_of(&copy_nodes, *d)).collect();
        nd.sort_unstable();
        od.sort_unstable();
        if nd != od {
            return Ok((update_result::TOPOLOGY_CHANGED, *new));
        }
        if nn.kind.type_code() != on.kind.type_code() {
            return Ok((update_result::NODE_TYPE_CHANGED, *new));
        }
        match (&nn.kind, &on.kind) {
            (NodeKind::MemAlloc { .. } | NodeKind::MemFree(_), _) => {
                let same = format!("{:?}", nn.kind) == format!("{:?}", on.kind);
                if !same {
                    return Ok((update_result::NOT_SUPPORTED, *new));
                }
            }
            (NodeKind::Child(a), NodeKind::Child(b)) => {
                let (a, b) = (reg.graph(*a)?.order.len(), reg.graph(*b)?.order.len());
                if a != b {
                    return Ok((update_result::PARAMETERS_CHANGED, *new));
                }
            }
            (NodeKind::Conditional(_), _) => {
                // Updating a conditional node's bodies in place is not provided.
                return Ok((update_result::NOT_SUPPORTED, *new));
            }
            _ => {}
        }
        kinds.push(nn.kind.clone());
    }
    for (old, kind) in copy_nodes.iter().zip(kinds) {
        let mut kind = kind;
        reg.clone_owned(&mut kind)?;
        let slot = reg.node_mut(*old)?;
        if let NodeKind::Child(c) = std::mem::replace(&mut slot.kind, kind) {
            let _ = reg.destroy_graph(c);
        }
    }
    reg.execs.get_mut(&e).expect("found above").changed();
    Ok((update_result::SUCCESS, 0))
}

/// A copy of `exec`'s graph, for a launch captured into another graph.
pub fn source_clone(e: u64) -> CuRes<u64> {
    let mut reg = registry();
    let source = reg
        .execs
        .get(&e)
        .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?
        .source;
    let c = reg.clone_graph(source)?;
    reg.graph_mut(c)?.owned = true;
    Ok(c)
}
