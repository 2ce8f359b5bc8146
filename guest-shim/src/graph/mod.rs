//! CUDA graphs in the guest process: graphs, their nodes and dependencies live here, in the
//! shim; an instantiated graph is uploaded to vgpud once ([`exec`]) and each launch is then one
//! request. [`api`] is the C ABI (`cuGraph*`); [`crate::stream_capture`] builds graphs from
//! captured streams.
//!
//! A node's work is a list of [`Op`]s: the primitive operations the shim's ordinary entry points
//! send (a kernel launch, a device copy, a memset, an event record or wait, a host-side copy, a
//! host function). Explicit nodes get theirs by running those entry points in recording mode
//! ([`crate::stream_capture::record`]), so a node is checked exactly as the call it stands for.

pub mod api;
pub mod attrs;
pub mod conditional;
pub mod exec;
pub mod generic;

use std::collections::{HashMap, HashSet};
use std::fmt::Write;
use std::sync::{LazyLock, Mutex, MutexGuard};

use vgpu_proto::cuda;

use crate::copies::Memcpy3D;
use crate::driver::CuRes;

/// `CUgraphNodeType` values.
pub mod node_type {
    /// `CU_GRAPH_NODE_TYPE_KERNEL`.
    pub const KERNEL: i32 = 0;
    /// `CU_GRAPH_NODE_TYPE_MEMCPY`.
    pub const MEMCPY: i32 = 1;
    /// `CU_GRAPH_NODE_TYPE_MEMSET`.
    pub const MEMSET: i32 = 2;
    /// `CU_GRAPH_NODE_TYPE_HOST`.
    pub const HOST: i32 = 3;
    /// `CU_GRAPH_NODE_TYPE_GRAPH`.
    pub const GRAPH: i32 = 4;
    /// `CU_GRAPH_NODE_TYPE_EMPTY`.
    pub const EMPTY: i32 = 5;
    /// `CU_GRAPH_NODE_TYPE_WAIT_EVENT`.
    pub const WAIT_EVENT: i32 = 6;
    /// `CU_GRAPH_NODE_TYPE_EVENT_RECORD`.
    pub const EVENT_RECORD: i32 = 7;
    /// `CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL` (not provided).
    pub const EXT_SEMAS_SIGNAL: i32 = 8;
    /// `CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT` (not provided).
    pub const EXT_SEMAS_WAIT: i32 = 9;
    /// `CU_GRAPH_NODE_TYPE_MEM_ALLOC`.
    pub const MEM_ALLOC: i32 = 10;
    /// `CU_GRAPH_NODE_TYPE_MEM_FREE`.
    pub const MEM_FREE: i32 = 11;
    /// `CU_GRAPH_NODE_TYPE_BATCH_MEM_OP`.
    pub const BATCH_MEM_OP: i32 = 12;
    /// `CU_GRAPH_NODE_TYPE_CONDITIONAL`.
    pub const CONDITIONAL: i32 = 13;
}

/// Most nodes one graph may hold (children included when instantiated).
pub const MAX_NODES: usize = vgpu_proto::graph::MAX_GRAPH_NODES;
/// Most graphs and executable graphs one process may hold at a time.
pub const MAX_GRAPHS: usize = 1 << 16;
/// First handle value: handles look like user-space pointers and are never NULL.
const FIRST_HANDLE: u64 = 0x6770_0000_0000;
/// Distance between two handles.
const HANDLE_STEP: u64 = 0x10;

/// A primitive operation of a node, as the shim would send it on a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A kernel launch with its packed parameters.
    Kernel {
        /// `CUfunction`.
        f: u64,
        /// Grid dimensions.
        grid: [u32; 3],
        /// Block dimensions.
        block: [u32; 3],
        /// Dynamic shared memory.
        shared: u32,
        /// Packed parameter buffer.
        params: Vec<u8>,
        /// The node's priority (`CU_LAUNCH_ATTRIBUTE_PRIORITY`, clamped to the device's range):
        /// used when the graph is instantiated with `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`.
        priority: i32,
    },
    /// A memset of `count` elements.
    Memset {
        /// Destination.
        dst: u64,
        /// Value.
        value: u32,
        /// Element size (1, 2 or 4).
        elem: u32,
        /// Elements.
        count: u64,
    },
    /// Device to device.
    DtoD {
        /// Destination.
        dst: u64,
        /// Source.
        src: u64,
        /// Bytes.
        len: u64,
    },
    /// Host to device (the host bytes are read when the node runs).
    HtoD {
        /// Destination.
        dst: u64,
        /// Host source address.
        src: usize,
        /// Bytes.
        len: usize,
    },
    /// Device to host.
    DtoH {
        /// Host destination address.
        dst: usize,
        /// Source.
        src: u64,
        /// Bytes.
        len: usize,
    },
    /// Records an event.
    EventRecord(u64),
    /// Waits for an event.
    EventWait(u64),
    /// A host function (`CUhostFn`) and its argument.
    Host {
        /// The function's address.
        f: usize,
        /// Its argument.
        data: usize,
    },
    /// Maps a graph allocation of `size` bytes (a granularity multiple) at `ptr`.
    MemAlloc {
        /// Reserved address.
        ptr: u64,
        /// Bytes.
        size: u64,
    },
    /// Unmaps a graph allocation.
    MemFree {
        /// Its address.
        ptr: u64,
    },
    /// Stream memory operations, in order (a captured `cuStreamBatchMemOp`; in an executable
    /// graph's plan one write or wait each, [`crate::mem_ops::graph_ops`]).
    MemOps(Vec<crate::mem_ops::MemOp>),
    /// A conditional node: its handle, type, the handle's default value and flags, and each
    /// body's operations with their dependencies.
    Conditional {
        /// The conditional handle.
        handle: u64,
        /// `CUgraphConditionalNodeType`.
        kind: u32,
        /// The handle's default value.
        default: u32,
        /// `CU_GRAPH_COND_*` flags.
        flags: u32,
        /// Each body's operations.
        bodies: Vec<Vec<exec::PlanOp>>,
    },
}

/// A `CUDA_MEMCPY3D` kept for `cuGraphMemcpyNodeGetParams`.
#[derive(Debug, Clone, Copy)]
pub struct CopyParams(pub Memcpy3D);

// SAFETY: the raw pointers inside are addresses the application handed over, kept to be handed
// back or read by the thread that launches the graph (CUDA's contract: they stay valid while the
// graph may run); the shim never dereferences them from another thread on its own.
unsafe impl Send for CopyParams {}

/// A kernel node's parameters.
#[derive(Debug)]
pub struct KernelParams {
    /// `CUfunction`.
    pub f: u64,
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory.
    pub shared: u32,
    /// Packed parameters (boxed: `arg_ptrs` point into it).
    pub params: Box<[u8]>,
    /// One pointer per parameter into `params`, for `kernelParams` in the queries.
    pub arg_ptrs: Box<[usize]>,
    /// The node's priority attribute (`CU_LAUNCH_ATTRIBUTE_PRIORITY`; 0 unless set, captured
    /// from the launch or its stream).
    pub priority: i32,
}

impl Clone for KernelParams {
    fn clone(&self) -> Self {
        // The copy's pointer table points into its own buffer.
        let mut k = Self::new(
            self.f,
            self.grid,
            self.block,
            self.shared,
            self.params.to_vec(),
        );
        k.priority = self.priority;
        k
    }
}

impl KernelParams {
    /// Parameters of a launch of `f`, with the pointer table for queries.
    pub fn new(f: u64, grid: [u32; 3], block: [u32; 3], shared: u32, params: Vec<u8>) -> Self {
        let params = params.into_boxed_slice();
        let base = params.as_ptr() as usize;
        let arg_ptrs = crate::driver::func_layout(f)
            .map(|l| l.offsets.iter().map(|&o| base + o as usize).collect())
            .unwrap_or_default();
        Self {
            f,
            grid,
            block,
            shared,
            params,
            arg_ptrs,
            priority: 0,
        }
    }

    /// The launch this node makes.
    pub fn op(&self) -> Op {
        Op::Kernel {
            f: self.f,
            grid: self.grid,
            block: self.block,
            shared: self.shared,
            params: self.params.to_vec(),
            priority: self.priority,
        }
    }
}

/// `CUDA_MEMSET_NODE_PARAMS` without the context.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemsetParams {
    /// Destination.
    pub dst: u64,
    /// Row pitch.
    pub pitch: usize,
    /// Value.
    pub value: u32,
    /// Element size.
    pub elem: u32,
    /// Elements per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
}

/// What a node does.
#[derive(Debug, Clone)]
pub enum NodeKind {
    /// A kernel launch.
    Kernel(KernelParams),
    /// A copy and the operations it became.
    Memcpy(CopyParams, Vec<Op>),
    /// A memset and the operations it became.
    Memset(MemsetParams, Vec<Op>),
    /// A host function.
    Host {
        /// The function.
        f: usize,
        /// Its argument.
        data: usize,
    },
    /// A child graph (a graph of its own, owned by the node).
    Child(u64),
    /// Nothing (a dependency point).
    Empty,
    /// Records an event.
    EventRecord(u64),
    /// Waits for an event.
    EventWait(u64),
    /// A graph allocation: the requested size and its reserved address and size.
    MemAlloc {
        /// Bytes asked for.
        bytesize: u64,
        /// The address the application uses.
        ptr: u64,
        /// Bytes reserved (a granularity multiple).
        reserved: u64,
    },
    /// Frees a graph allocation.
    MemFree(u64),
    /// Stream memory operations.
    BatchMemOp(crate::mem_ops::BatchNode),
    /// A conditional node and the body graphs it owns.
    Conditional(conditional::Conditional),
}

impl NodeKind {
    /// Keeps the attributes of `old` (a kernel node's priority) in new parameters of the same
    /// node: setting a node's parameters leaves its attributes, as in CUDA.
    pub fn keep_attributes(&mut self, old: &NodeKind) {
        if let (NodeKind::Kernel(new), NodeKind::Kernel(old)) = (self, old) {
            new.priority = old.priority;
        }
    }

    /// The `CUgraphNodeType`.
    pub fn type_code(&self) -> i32 {
        match self {
            NodeKind::Kernel(_) => node_type::KERNEL,
            NodeKind::Memcpy(..) => node_type::MEMCPY,
            NodeKind::Memset(..) => node_type::MEMSET,
            NodeKind::Host { .. } => node_type::HOST,
            NodeKind::Child(_) => node_type::GRAPH,
            NodeKind::Empty => node_type::EMPTY,
            NodeKind::EventRecord(_) => node_type::EVENT_RECORD,
            NodeKind::EventWait(_) => node_type::WAIT_EVENT,
            NodeKind::MemAlloc { .. } => node_type::MEM_ALLOC,
            NodeKind::MemFree(_) => node_type::MEM_FREE,
            NodeKind::BatchMemOp(_) => node_type::BATCH_MEM_OP,
            NodeKind::Conditional(_) => node_type::CONDITIONAL,
        }
    }

    fn label(&self) -> &'static str {
        match self {
            NodeKind::Kernel(_) => "kernel",
            NodeKind::Memcpy(..) => "memcpy",
            NodeKind::Memset(..) => "memset",
            NodeKind::Host { .. } => "host",
            NodeKind::Child(_) => "graph",
            NodeKind::Empty => "empty",
            NodeKind::EventRecord(_) => "event record",
            NodeKind::EventWait(_) => "event wait",
            NodeKind::MemAlloc { .. } => "mem alloc",
            NodeKind::MemFree(_) => "mem free",
            NodeKind::BatchMemOp(_) => "batch mem op",
            NodeKind::Conditional(_) => "conditional",
        }
    }

    /// The graphs the node owns: a child graph, a conditional node's bodies.
    pub fn owned_graphs(&self) -> &[u64] {
        match self {
            NodeKind::Child(c) => std::slice::from_ref(c),
            NodeKind::Conditional(c) => &c.bodies,
            _ => &[],
        }
    }
}

/// A node: its work and the nodes it depends on.
#[derive(Debug, Clone)]
pub struct Node {
    /// Its work.
    pub kind: NodeKind,
    /// Nodes of the same graph that must finish first.
    pub deps: Vec<u64>,
}

/// A graph: nodes in creation order.
#[derive(Debug, Default)]
pub struct Graph {
    /// Node handles in creation order.
    pub order: Vec<u64>,
    /// The nodes.
    pub nodes: HashMap<u64, Node>,
    /// Whether a node owns this graph (a child graph): it is destroyed with its node.
    pub owned: bool,
    /// The user objects it holds references on, and how many ([`crate::user_objects`]).
    pub user_objects: HashMap<u64, u64>,
}

/// Every graph, node and executable graph of the process.
#[derive(Debug)]
pub struct Registry {
    next: u64,
    /// Graphs by handle.
    pub graphs: HashMap<u64, Graph>,
    /// The graph each node belongs to.
    pub node_graph: HashMap<u64, u64>,
    /// Executable graphs by handle.
    pub execs: HashMap<u64, exec::Exec>,
    /// For each node of a clone, the node it was cloned from (`cuGraphNodeFindInClone`).
    pub cloned_from: HashMap<u64, u64>,
    /// Conditional handles (`cuGraphConditionalHandleCreate`), until their graph is destroyed.
    pub cond_handles: HashMap<u64, conditional::Handle>,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| {
    Mutex::new(Registry {
        next: FIRST_HANDLE,
        graphs: HashMap::new(),
        node_graph: HashMap::new(),
        execs: HashMap::new(),
        cloned_from: HashMap::new(),
        cond_handles: HashMap::new(),
    })
});

/// The registry, locked.
pub fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// The ID CUDA 13's `cuGraphGetId`, `cuGraphExecGetId` and `cuGraphNodeGetLocalId` report for
/// a graph, executable graph or node handle, and `cuGraphDebugDotPrint` prints: its place in the
/// process's sequence of handles, so unique among them.
pub fn handle_id(h: u64) -> u32 {
    (h.wrapping_sub(FIRST_HANDLE) / HANDLE_STEP) as u32
}

impl Registry {
    /// A fresh handle.
    pub fn handle(&mut self) -> u64 {
        let h = self.next;
        self.next += HANDLE_STEP;
        h
    }

    /// Creates an empty graph.
    pub fn create_graph(&mut self) -> CuRes<u64> {
        if self.graphs.len() >= MAX_GRAPHS {
            return Err(cuda::CUDA_ERROR_OUT_OF_MEMORY);
        }
        let h = self.handle();
        self.graphs.insert(h, Graph::default());
        Ok(h)
    }

    /// A graph.
    pub fn graph(&self, g: u64) -> CuRes<&Graph> {
        self.graphs.get(&g).ok_or(cuda::CUDA_ERROR_INVALID_VALUE)
    }

    /// A graph, mutably.
    pub fn graph_mut(&mut self, g: u64) -> CuRes<&mut Graph> {
        self.graphs
            .get_mut(&g)
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)
    }

    /// The graph node `n` is in.
    pub fn graph_of(&self, n: u64) -> CuRes<u64> {
        self.node_graph
            .get(&n)
            .copied()
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)
    }

    /// A node of any graph.
    pub fn node(&self, n: u64) -> CuRes<&Node> {
        let g = self.graph_of(n)?;
        self.graph(g)?
            .nodes
            .get(&n)
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)
    }

    /// A node of any graph, mutably.
    pub fn node_mut(&mut self, n: u64) -> CuRes<&mut Node> {
        let g = *self
            .node_graph
            .get(&n)
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        self.graph_mut(g)?
            .nodes
            .get_mut(&n)
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)
    }

    /// Adds a node depending on `deps` (nodes of the same graph, no duplicates).
    pub fn add_node(&mut self, g: u64, kind: NodeKind, deps: &[u64]) -> CuRes<u64> {
        let graph = self.graph(g)?;
        if graph.nodes.len() >= MAX_NODES {
            return Err(cuda::CUDA_ERROR_OUT_OF_MEMORY);
        }
        let mut seen = HashSet::new();
        for d in deps {
            if !graph.nodes.contains_key(d) || !seen.insert(*d) {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
        }
        let h = self.handle();
        let graph = self.graph_mut(g)?;
        graph.order.push(h);
        graph.nodes.insert(
            h,
            Node {
                kind,
                deps: deps.to_vec(),
            },
        );
        self.node_graph.insert(h, g);
        Ok(h)
    }

    /// Destroys a graph, its nodes and the child graphs they own.
    pub fn destroy_graph(&mut self, g: u64) -> CuRes<()> {
        let graph = self
            .graphs
            .remove(&g)
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        for (object, refs) in graph.user_objects {
            let _ = crate::user_objects::release(object, refs);
        }
        self.cond_handles.retain(|_, c| c.graph != g);
        for (n, node) in graph.nodes {
            self.node_graph.remove(&n);
            self.cloned_from.remove(&n);
            for &c in node.kind.owned_graphs() {
                let _ = self.destroy_graph(c);
            }
        }
        Ok(())
    }

    /// Removes a node and the edges to and from it.
    pub fn destroy_node(&mut self, n: u64) -> CuRes<()> {
        let g = self
            .node_graph
            .remove(&n)
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        let graph = self.graph_mut(g)?;
        let node = graph.nodes.remove(&n);
        graph.order.retain(|&x| x != n);
        for other in graph.nodes.values_mut() {
            other.deps.retain(|&d| d != n);
        }
        if let Some(node) = node {
            for &c in node.kind.owned_graphs() {
                let _ = self.destroy_graph(c);
            }
        }
        Ok(())
    }

    /// A deep copy of graph `g` (child graphs copied too); records each copy's original.
    pub fn clone_graph(&mut self, g: u64) -> CuRes<u64> {
        let (order, nodes): (Vec<u64>, Vec<Node>) = {
            let graph = self.graph(g)?;
            (
                graph.order.clone(),
                graph.order.iter().map(|n| graph.nodes[n].clone()).collect(),
            )
        };
        let new = self.create_graph()?;
        // The clone holds references of its own on the graph's user objects.
        let objects = self.graph(g)?.user_objects.clone();
        for (&object, &refs) in &objects {
            crate::user_objects::retain(object, refs)?;
        }
        self.graph_mut(new)?.user_objects = objects;
        let mut map = HashMap::new();
        for (old, mut node) in order.into_iter().zip(nodes) {
            self.clone_owned(&mut node.kind)?;
            let deps: Vec<u64> = node.deps.iter().map(|d| map[d]).collect();
            let h = self.add_node(new, node.kind, &deps)?;
            map.insert(old, h);
            self.cloned_from.insert(h, old);
        }
        Ok(new)
    }

    /// Gives a copied node graphs of its own in place of those it owned (deep copies).
    pub fn clone_owned(&mut self, kind: &mut NodeKind) -> CuRes<()> {
        match kind {
            NodeKind::Child(c) => {
                let copy = self.clone_graph(*c)?;
                self.graph_mut(copy)?.owned = true;
                *c = copy;
            }
            NodeKind::Conditional(cond) => {
                let mut bodies = Vec::with_capacity(cond.bodies.len());
                for &b in cond.bodies.iter() {
                    let copy = self.clone_graph(b)?;
                    self.graph_mut(copy)?.owned = true;
                    bodies.push(copy);
                }
                cond.bodies = bodies.into_boxed_slice();
            }
            _ => {}
        }
        Ok(())
    }

    /// Graph `g`'s nodes in a topological order (creation order among ready nodes);
    /// `CUDA_ERROR_INVALID_VALUE` when its edges form a cycle.
    pub fn topo_order(&self, g: u64) -> CuRes<Vec<u64>> {
        let graph = self.graph(g)?;
        let mut done: HashSet<u64> = HashSet::new();
        let mut out = Vec::with_capacity(graph.order.len());
        // Kahn's algorithm over creation order: each pass takes every node whose dependencies
        // are done; a pass that takes nothing means a cycle.
        let mut left: Vec<u64> = graph.order.clone();
        while !left.is_empty() {
            let before = left.len();
            left.retain(|n| {
                if graph.nodes[n].deps.iter().all(|d| done.contains(d)) {
                    done.insert(*n);
                    out.push(*n);
                    false
                } else {
                    true
                }
            });
            if left.len() == before {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
        }
        Ok(out)
    }

    /// Graph `g`'s edges (from, to), in node creation order.
    pub fn edges(&self, g: u64) -> CuRes<Vec<(u64, u64)>> {
        let graph = self.graph(g)?;
        Ok(graph
            .order
            .iter()
            .flat_map(|to| graph.nodes[to].deps.iter().map(move |from| (*from, *to)))
            .collect())
    }

    /// The nodes that depend on `n`.
    pub fn dependents(&self, n: u64) -> CuRes<Vec<u64>> {
        let g = *self
            .node_graph
            .get(&n)
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        let graph = self.graph(g)?;
        Ok(graph
            .order
            .iter()
            .filter(|m| graph.nodes[m].deps.contains(&n))
            .copied()
            .collect())
    }

    /// Graphviz text of graph `g` (`cuGraphDebugDotPrint`).
    pub fn dot(&self, g: u64) -> CuRes<String> {
        let mut s = String::from("digraph vgpu_graph {\n");
        self.dot_into(g, &mut s, 0)?;
        s.push_str("}\n");
        Ok(s)
    }

    fn dot_into(&self, g: u64, s: &mut String, depth: usize) -> CuRes<()> {
        let graph = self.graph(g)?;
        let _ = writeln!(
            s,
            "subgraph cluster_{g:x} {{\nlabel=\"graph {}\";",
            handle_id(g)
        );
        for n in &graph.order {
            let node = &graph.nodes[n];
            let detail = match &node.kind {
                NodeKind::Kernel(k) => {
                    let name = crate::driver::func_layout(k.f)
                        .map(|l| l.name.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    format!(
                        "\\n{name}\\ngrid {:?} block {:?} shared {}",
                        k.grid, k.block, k.shared
                    )
                }
                NodeKind::Memset(p, _) => format!(
                    "\\ndst {:#x} value {:#x} elem {} width {} height {}",
                    p.dst, p.value, p.elem, p.width, p.height
                ),
                NodeKind::Memcpy(_, ops) => format!("\\n{} transfers", ops.len()),
                NodeKind::MemAlloc { ptr, bytesize, .. } => {
                    format!("\\nptr {ptr:#x} size {bytesize}")
                }
                NodeKind::MemFree(p) => format!("\\nptr {p:#x}"),
                NodeKind::BatchMemOp(b) => format!("\\n{} operations", b.ops.len()),
                NodeKind::EventRecord(e) | NodeKind::EventWait(e) => format!("\\nevent {e:#x}"),
                NodeKind::Conditional(c) => format!(
                    "\\n{} handle {:#x}, {} bodies",
                    match c.kind {
                        vgpu_proto::graph::conditional::IF => "if",
                        vgpu_proto::graph::conditional::WHILE => "while",
                        _ => "switch",
                    },
                    c.handle,
                    c.bodies.len()
                ),
                _ => String::new(),
            };
            let _ = writeln!(
                s,
                "\"n{n:x}\" [label=\"{} {}{detail}\"];",
                node.kind.label(),
                handle_id(*n)
            );
            for d in &node.deps {
                let _ = writeln!(s, "\"n{d:x}\" -> \"n{n:x}\";");
            }
            if depth < MAX_DOT_DEPTH {
                for &c in node.kind.owned_graphs() {
                    self.dot_into(c, s, depth + 1)?;
                }
            }
        }
        s.push_str("}\n");
        Ok(())
    }
}

/// Deepest child graph nesting `cuGraphDebugDotPrint` writes out.
const MAX_DOT_DEPTH: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topological_order_follows_dependencies_and_refuses_cycles() {
        let mut r = registry();
        let g = r.create_graph().unwrap();
        let a = r.add_node(g, NodeKind::Empty, &[]).unwrap();
        let b = r.add_node(g, NodeKind::Empty, &[]).unwrap();
        let c = r.add_node(g, NodeKind::Empty, &[b, a]).unwrap();
        // a duplicate or foreign dependency is refused
        assert!(r.add_node(g, NodeKind::Empty, &[a, a]).is_err());
        assert!(r.add_node(g, NodeKind::Empty, &[0x1234]).is_err());
        r.node_mut(b).unwrap().deps.push(c);
        assert_eq!(r.topo_order(g), Err(cuda::CUDA_ERROR_INVALID_VALUE));
        r.node_mut(b).unwrap().deps.clear();
        assert_eq!(r.topo_order(g).unwrap(), vec![a, b, c]);
        let copy = r.clone_graph(g).unwrap();
        let order = r.topo_order(copy).unwrap();
        assert_eq!(order.len(), 3);
        assert_eq!(r.cloned_from[&order[2]], c);
        assert_eq!(r.edges(copy).unwrap().len(), 2);
        r.destroy_graph(copy).unwrap();
        r.destroy_graph(g).unwrap();
    }
}
