//! Executable graphs (`cuGraphInstantiate`, `cuGraphLaunch`): the shim uploads a graph's nodes
//! once, in a topological order, with their dependencies ([`vgpu_proto::graph`]); a launch is
//! then one request, and the session replays the nodes, each through the same path as the
//! ordinary request it stands for. A replayed node is validated again (handles, pointers against
//! the process's allocations, sizes) exactly as that request would be, so a graph can do nothing
//! its nodes could not do one by one.
//!
//! The replay follows the dependency graph: at upload every node gets a *branch* (a node
//! continues the branch of its first dependency that no earlier node continued, otherwise it
//! starts a new one), and at launch each branch is a lane of the engine — branch 0 the launch
//! stream's own lane, the others internal lanes ([`LaneKey::Graph`]). A node whose dependencies
//! lie on other branches first gets a barrier job on its lane that waits for them, so
//! independent branches run at the same time and joins wait, as in CUDA. The other branches
//! start after a barrier of the launch lane (the work before the launch), and the launch lane
//! ends with a barrier that waits for every branch, so work after the launch on that stream —
//! and anything that synchronizes with it — waits for the whole graph.
//!
//! Consecutive kernel nodes of one branch form a *chain* ([`chains`]) when nothing else lies
//! between them and no other branch waits for one in its middle; on a device that launches
//! chains ([`DeviceContext::launch_chain`](crate::device::DeviceContext::launch_chain): a real
//! GPU, as one CUDA graph) a chain of up to [`MAX_GRAPH_CHAIN_KERNELS`] kernels is one engine
//! job with one scheduler grant. Elsewhere (the simulated GPU, which preempts between thread
//! blocks) each kernel stays a job of its own.
//!
//! Hostile input is bounded: a graph holds at most [`graph::MAX_GRAPH_NODES`] nodes, a session at
//! most [`MAX_GRAPH_EXECS`] executable graphs and [`MAX_GRAPH_BYTES`] bytes of them, and a VM's
//! sessions together their VM's `limits.handles` handles and `limits.graph_bytes` bytes.

use std::sync::Arc;

mod conditional;

use vgpu_proto::graph::{self, CONDITIONAL_NODE, EMPTY_NODE, MEM_ALLOC_NODE, MEM_FREE_NODE};
use vgpu_proto::msg::{self, Request};

use std::sync::atomic::{AtomicBool, Ordering};

use super::{
    ACCESS_READWRITE, ChainWork, GREATEST_STREAM_PRIORITY, MAX_GRAPH_CHAIN_KERNELS, Session, reply,
};
use crate::device::{GraphConditionals, RunControl};
use crate::engine::{Job, LaneKey, LaneKind, LaneSpec, MAX_GRAPH_BRANCHES};
use crate::error::CuError;
use crate::handles::{HandleKind, HandleTable};
use crate::limits::{HandleBudget, LimitUse};
use vgpu_config::limits::Budget;

/// Most executable graphs one session may hold.
pub const MAX_GRAPH_EXECS: usize = 4096;
/// Most bytes one session's executable graphs may hold (decoded nodes and their bulk bytes).
pub const MAX_GRAPH_BYTES: usize = 64 << 20;

/// What one node of an executable graph holds besides its bulk bytes and dependencies: the
/// decoded node, its dependency list, its branch and its chain length.
const NODE_BYTES: usize =
    std::mem::size_of::<Node>() + std::mem::size_of::<Vec<u32>>() + 2 * std::mem::size_of::<u32>();

/// One node, decoded and checked at upload.
#[derive(Debug)]
enum Node {
    /// An ordinary stream request and its bulk tail.
    Op(Request, Vec<u8>),
    /// Map `size` bytes charged to the slice at `ptr`.
    MemAlloc { ptr: u64, size: u64 },
    /// Unmap the graph allocation at `ptr`.
    MemFree { ptr: u64 },
    /// Nothing but its dependencies (a join point).
    Empty,
    /// A conditional node and its bodies.
    Conditional(Box<conditional::Conditional>),
}

/// An uploaded executable graph.
#[derive(Debug)]
struct GraphExec {
    ctx: u64,
    nodes: Vec<Node>,
    /// Each node's dependencies (indices of earlier nodes).
    deps: Vec<Vec<u32>>,
    /// Each node's branch (0: the launch lane), see [`branches`].
    branch: Vec<u32>,
    /// How many branches (lanes) a launch uses.
    branches: u32,
    /// For each node, the length of the chain it starts (0: none), see [`chains`].
    chain: Vec<u32>,
    /// The conditional handles of its conditional nodes (bodies included), with their values at
    /// the start of a launch.
    handles: Vec<(u64, u32)>,
    bytes: usize,
}

impl Node {
    /// Bulk bytes the node holds (a conditional node's: its bodies').
    fn bulk_bytes(&self) -> usize {
        match self {
            Node::Op(_, t) => t.len(),
            Node::Conditional(c) => c.bytes(),
            _ => 0,
        }
    }

    /// For a kernel node that may be part of a chain: the priority it runs at (`None`: its
    /// lane's); `None` for other nodes.
    fn chain_priority(&self) -> Option<Option<i32>> {
        match self {
            Node::Op(Request::LaunchKernel(_), _) => Some(None),
            Node::Op(Request::LaunchKernelPriority(p), _) if p.cooperative == 0 => {
                Some(Some(p.priority.clamp(GREATEST_STREAM_PRIORITY, 0)))
            }
            _ => None,
        }
    }
}

/// The chains of a graph: runs of consecutive nodes that are kernels of one branch at one
/// priority (`priority[i]`: `Some` for a kernel node, with the priority it runs at), where each
/// node after the first depends only on nodes of its branch and no node of another branch
/// depends on any node but the last, at most [`MAX_GRAPH_CHAIN_KERNELS`] long. Returns, for
/// each node, the length of the chain it starts (0 when it starts none of 2 or more nodes).
fn chains(priority: &[Option<Option<i32>>], deps: &[Vec<u32>], branch: &[u32]) -> Vec<u32> {
    let n = priority.len();
    // Nodes another branch waits for.
    let mut exported = vec![false; n];
    for (m, d) in deps.iter().enumerate() {
        for &p in d {
            if branch[p as usize] != branch[m] {
                exported[p as usize] = true;
            }
        }
    }
    let mut len = vec![0u32; n];
    let mut i = 0;
    while i < n {
        let Some(p) = priority[i] else {
            i += 1;
            continue;
        };
        let b = branch[i];
        let mut j = i;
        while j + 1 < n
            && j + 1 - i < MAX_GRAPH_CHAIN_KERNELS
            && priority[j + 1] == Some(p)
            && branch[j + 1] == b
            && !exported[j]
            && deps[j + 1].iter().all(|&d| branch[d as usize] == b)
        {
            j += 1;
        }
        if j > i {
            len[i] = (j - i + 1) as u32;
        }
        i = j + 1;
    }
    len
}

/// Gives each node a branch: a node continues the branch of its first dependency that no earlier
/// node continued; otherwise (a root, or a node after a fork) it starts a new branch. Past
/// [`MAX_GRAPH_BRANCHES`] branches share lanes. Returns the branches and how many lanes they use.
fn branches(deps: &[Vec<u32>]) -> (Vec<u32>, u32) {
    let mut continued = vec![false; deps.len()];
    let mut branch = Vec::with_capacity(deps.len());
    let mut started = 0u32;
    for d in deps {
        let cont = d.iter().find(|&&p| !continued[p as usize]);
        let b = match cont {
            Some(&p) => {
                continued[p as usize] = true;
                branch[p as usize]
            }
            None => {
                let b = started % MAX_GRAPH_BRANCHES;
                started = started.saturating_add(1);
                b
            }
        };
        branch.push(b);
    }
    (branch, started.clamp(1, MAX_GRAPH_BRANCHES))
}

/// A session's executable graphs.
#[derive(Debug)]
pub(super) struct Graphs {
    execs: HandleTable<Arc<GraphExec>>,
    bytes: usize,
    /// Graph allocations mapped now: address → size.
    mapped: std::collections::BTreeMap<u64, u64>,
    /// High watermarks of graph memory used and reserved (the same bytes: nothing is cached)
    /// since each was last reset (`cuDeviceSetGraphMemAttribute`).
    used_high: u64,
    reserved_high: u64,
    /// The VM's budgets, charged `bytes` (`limits.graph_bytes`).
    vm: Option<Arc<LimitUse>>,
    /// While a launch replays a node: the lane of the node's branch, which the node's request
    /// uses instead of its stream's ([`Session::lane`]).
    pub(super) route: Option<LaneSpec>,
    /// While a launch of a graph with conditional nodes replays its nodes: the launch's
    /// conditional values, which its kernels may set.
    pub(super) conditionals: Option<Arc<GraphConditionals>>,
    /// Whether the device was asked if it launches chains of kernels.
    chains_probed: bool,
    /// Set when the device refuses chains (at the probe or when one runs): kernels then run one
    /// by one.
    chains_refused: Arc<AtomicBool>,
}

impl Default for Graphs {
    fn default() -> Self {
        Self {
            execs: HandleTable::new(HandleKind::GraphExec),
            bytes: 0,
            mapped: Default::default(),
            used_high: 0,
            reserved_high: 0,
            vm: None,
            route: None,
            conditionals: None,
            chains_probed: false,
            chains_refused: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Graphs {
    /// Counts the executable graphs against `budget` (their handles) and their
    /// bytes against the same VM's `graph_bytes`.
    pub(super) fn set_budget(&mut self, budget: HandleBudget) {
        let vm = Arc::clone(&budget.use_);
        vm.force_charge(Budget::GraphBytes, self.bytes as u64);
        if let Some(old) = self.vm.replace(vm) {
            old.refund(Budget::GraphBytes, self.bytes as u64);
        }
        self.execs.set_budget(budget);
    }

    /// Changes the bytes held from `old` to `new`, charged to the VM's
    /// `graph_bytes` (`CUDA_ERROR_OUT_OF_MEMORY` past it).
    fn rebytes(&mut self, old: usize, new: usize) -> Result<(), CuError> {
        if let Some(vm) = &self.vm {
            if new > old {
                vm.charge(Budget::GraphBytes, (new - old) as u64)?;
            } else {
                vm.refund(Budget::GraphBytes, (old - new) as u64);
            }
        }
        self.bytes = self.bytes - old + new;
        Ok(())
    }
}

impl Drop for Graphs {
    fn drop(&mut self) {
        if let Some(vm) = &self.vm {
            vm.refund(Budget::GraphBytes, self.bytes as u64);
        }
    }
}

/// Sets a stream request's context and stream to the launch's.
fn on_stream(req: &Request, ctx: u64, stream: u64) -> Request {
    let mut r = req.clone();
    match &mut r {
        Request::LaunchKernel(m) => (m.ctx, m.stream) = (ctx, stream),
        Request::LaunchKernelPriority(m) => (m.ctx, m.stream) = (ctx, stream),
        Request::MemcpyDtoD(m) => (m.ctx, m.stream) = (ctx, stream),
        Request::Memset(m) => (m.ctx, m.stream) = (ctx, stream),
        Request::EventRecord(m) => (m.ctx, m.stream) = (ctx, stream),
        Request::StreamWaitEvent(m) => (m.ctx, m.stream) = (ctx, stream),
        Request::StreamMemOp(m) => (m.ctx, m.stream) = (ctx, stream),
        _ => {}
    }
    r
}

impl Session {
    /// The graph requests; `None` for other requests.
    pub(super) fn dispatch_graph(
        &mut self,
        req: &Request,
        tail: &[u8],
        out: &mut Vec<u8>,
    ) -> Option<Result<(), CuError>> {
        Some(match req {
            Request::GraphInstantiate(m) => self
                .graph_instantiate(m, tail)
                .and_then(|handle| reply(out, msg::Handle { handle })),
            Request::GraphLaunch(m) => self
                .graph_launch(m)
                .and_then(|()| reply(out, msg::Empty {})),
            Request::GraphMemAttributes(m) => self.check_device(m.device).and_then(|()| {
                if m.reset & msg::GRAPH_MEM_RESET_USED_HIGH != 0 {
                    self.graphs.used_high = 0;
                }
                if m.reset & msg::GRAPH_MEM_RESET_RESERVED_HIGH != 0 {
                    self.graphs.reserved_high = 0;
                }
                reply(
                    out,
                    msg::GraphMemUse {
                        used: self.graph_mem_used(),
                        used_high: self.graphs.used_high,
                        reserved_high: self.graphs.reserved_high,
                    },
                )
            }),
            Request::GraphExecDestroy(m) => self.ctx(m.ctx).map(drop).and_then(|()| {
                let g = self.graphs.execs.remove(m.exec).ok_or_else(|| {
                    CuError::invalid_value(format!(
                        "{:#x} is not an executable graph of this process",
                        m.exec
                    ))
                })?;
                self.graphs.rebytes(g.bytes, 0)?;
                reply(out, msg::Empty {})
            }),
            _ => return None,
        })
    }

    fn graph_instantiate(
        &mut self,
        m: &msg::GraphInstantiate,
        tail: &[u8],
    ) -> Result<u64, CuError> {
        self.ctx(m.ctx)?;
        let old_bytes = match m.replace {
            0 => 0,
            h => self.graphs.execs.get(h).map(|g| g.bytes).ok_or_else(|| {
                CuError::invalid_value(format!("{h:#x} is not an executable graph of this process"))
            })?,
        };
        let too_big = |bytes: usize| {
            CuError::out_of_memory(format!(
                "this process's executable graphs would hold {bytes} bytes, more than {MAX_GRAPH_BYTES}"
            ))
        };
        if self.graphs.bytes - old_bytes + tail.len() > MAX_GRAPH_BYTES {
            return Err(too_big(self.graphs.bytes - old_bytes + tail.len()));
        }
        let list = graph::split_graph(tail).map_err(|e| CuError::invalid_value(e.to_string()))?;
        let allocs: Vec<(u64, u64)> = list
            .iter()
            .filter(|n| n.node.opcode == MEM_ALLOC_NODE)
            .filter_map(|n| msg::decode_exact::<msg::GraphMemAllocNode>(n.node.payload, false).ok())
            .map(|(a, _)| (a.ptr, a.size))
            .collect();
        let mut nodes = Vec::with_capacity(list.len());
        let mut deps = Vec::with_capacity(list.len());
        for (i, n) in list.into_iter().enumerate() {
            let node = self
                .check_node(m.ctx, &n.node, &allocs)
                .map_err(|e| CuError::new(e.code, format!("graph node {i}: {}", e.message)))?;
            nodes.push(node);
            deps.push(n.deps);
        }
        let (branch, lanes) = branches(&deps);
        let priority: Vec<_> = nodes.iter().map(Node::chain_priority).collect();
        let chain = chains(&priority, &deps, &branch);
        // What the graph holds in memory: its decoded nodes, dependencies and bulk bytes.
        let bytes = nodes.len() * NODE_BYTES
            + deps.iter().map(|d| d.len() * 4).sum::<usize>()
            + nodes.iter().map(Node::bulk_bytes).sum::<usize>();
        if self.graphs.bytes - old_bytes + bytes > MAX_GRAPH_BYTES {
            return Err(too_big(self.graphs.bytes - old_bytes + bytes));
        }
        let mut handles = Vec::new();
        for n in &nodes {
            if let Node::Conditional(c) = n {
                c.handles(&mut handles);
            }
        }
        handles.sort_unstable_by_key(|&(h, _)| h);
        handles.dedup();
        if let Some(w) = handles.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(CuError::invalid_value(format!(
                "conditional handle {:#x} has two default values",
                w[0].0
            )));
        }
        let exec = Arc::new(GraphExec {
            ctx: m.ctx,
            nodes,
            deps,
            branch,
            branches: lanes,
            chain,
            handles,
            bytes,
        });
        if m.replace != 0 {
            self.graphs.rebytes(old_bytes, bytes)?;
            let slot = self.graphs.execs.get_mut(m.replace).expect("checked above");
            *slot = exec;
            return Ok(m.replace);
        }
        if self.graphs.execs.len() >= MAX_GRAPH_EXECS {
            return Err(CuError::out_of_memory(format!(
                "a process may hold at most {MAX_GRAPH_EXECS} executable graphs"
            )));
        }
        self.graphs.rebytes(0, bytes)?;
        let h = match self.graphs.execs.insert(exec) {
            Ok(h) => h,
            Err(e) => {
                self.graphs.rebytes(bytes, 0)?;
                return Err(e);
            }
        };
        Ok(h)
    }

    /// Decodes and checks one node as its request would be checked; `allocs` are the graph's own
    /// allocations (mapped only while it runs), which its other nodes may use.
    fn check_node(
        &self,
        ctx: u64,
        n: &graph::NodeBytes<'_>,
        allocs: &[(u64, u64)],
    ) -> Result<Node, CuError> {
        let bad = |e: vgpu_proto::wire::DecodeError| CuError::invalid_value(e.to_string());
        match n.opcode {
            MEM_ALLOC_NODE => {
                let (a, _) =
                    msg::decode_exact::<msg::GraphMemAllocNode>(n.payload, false).map_err(bad)?;
                if a.size == 0 || !a.size.is_multiple_of(crate::device::VMM_GRANULARITY) {
                    return Err(CuError::invalid_value(
                        "a graph allocation's size must be a multiple of the granularity",
                    ));
                }
                if !self.va_is_reserved(a.ptr, a.size) {
                    return Err(CuError::invalid_value(format!(
                        "{:#x}+{} is not an address reservation of this process",
                        a.ptr, a.size
                    )));
                }
                return Ok(Node::MemAlloc {
                    ptr: a.ptr,
                    size: a.size,
                });
            }
            EMPTY_NODE => {
                msg::decode_exact::<msg::Empty>(n.payload, false).map_err(bad)?;
                return Ok(Node::Empty);
            }
            MEM_FREE_NODE => {
                let (f, _) =
                    msg::decode_exact::<msg::GraphMemFreeNode>(n.payload, false).map_err(bad)?;
                return Ok(Node::MemFree { ptr: f.ptr });
            }
            CONDITIONAL_NODE => return self.check_conditional(ctx, n.payload, allocs, 0),
            _ => {}
        }
        let (req, at) = Request::decode(n.opcode, n.payload).map_err(bad)?;
        let tail = &n.payload[at..];
        let in_graph_alloc = |p: u64, len: u64| {
            allocs
                .iter()
                .any(|&(b, s)| p >= b && p.checked_add(len).is_some_and(|e| e <= b + s))
        };
        let check = |p: u64, len: u64, what: &str| {
            if in_graph_alloc(p, len) {
                Ok(())
            } else {
                self.allocs.check(p, len, what)
            }
        };
        let kernel = match &req {
            Request::LaunchKernel(m) => Some(m.function),
            Request::LaunchKernelPriority(m) if m.cooperative == 0 => Some(m.function),
            _ => None,
        };
        match (&req, kernel) {
            (_, Some(function)) => {
                let f = self.function(function)?;
                if tail.len() != f.param_bytes {
                    return Err(CuError::invalid_value(format!(
                        "kernel `{}` takes {} bytes of parameters, got {}",
                        f.desc.name,
                        f.param_bytes,
                        tail.len()
                    )));
                }
            }
            (Request::MemcpyDtoD(m), None) => {
                check(m.src, m.len, "copy source")?;
                check(m.dst, m.len, "copy destination")?;
            }
            (Request::Memset(m), None) => {
                check(m.dst, super::memset_bytes(m)?, "memset destination")?;
            }
            (Request::EventRecord(m), None) => {
                self.event(m.event)?;
            }
            (Request::StreamWaitEvent(m), None) => {
                self.event(m.event)?;
            }
            (Request::StreamMemOp(m), None) => {
                if let Some(width) = super::mem_op::checked_kind(m)?.width() {
                    check(m.addr, u64::from(width), "stream memory operation")?;
                }
            }
            (other, None) => {
                return Err(CuError::invalid_value(format!(
                    "{} cannot be a graph node",
                    other.name()
                )));
            }
        }
        let req = on_stream(&req, ctx, 0);
        Ok(Node::Op(req, tail.to_vec()))
    }

    fn graph_launch(&mut self, m: &msg::GraphLaunch) -> Result<(), CuError> {
        let ctx = self.stream_ctx(m.ctx, m.stream)?;
        let g = Arc::clone(self.graphs.execs.get(m.exec).ok_or_else(|| {
            CuError::invalid_value(format!(
                "{:#x} is not an executable graph of this process",
                m.exec
            ))
        })?);
        if g.ctx != ctx {
            return Err(CuError::invalid_context(
                "the graph was instantiated in another context than the stream's",
            ));
        }
        // A graph whose allocation is still mapped cannot run again until it is freed (CUDA).
        for n in &g.nodes {
            if let Node::MemAlloc { ptr, .. } = n
                && self.graphs.mapped.contains_key(ptr)
                && self.va_is_mapped(*ptr)
            {
                return Err(CuError::invalid_value(format!(
                    "the graph's allocation at {ptr:#x} has not been freed since its last launch"
                )));
            }
        }
        let launch = self.lane(m.ctx, m.stream)?;
        // The launch's own conditional values, which its kernels set.
        self.graphs.conditionals = (!g.handles.is_empty())
            .then(|| Arc::new(GraphConditionals::new(g.handles.iter().copied())));
        let r = self.replay(&g, m, &launch);
        self.graphs.route = None;
        self.graphs.conditionals = None;
        r
    }

    /// Replays `g`'s nodes, branch by branch (see the module's doc).
    fn replay(
        &mut self,
        g: &GraphExec,
        m: &msg::GraphLaunch,
        launch: &LaneSpec,
    ) -> Result<(), CuError> {
        let lanes: Vec<LaneSpec> = (0..g.branches)
            .map(|b| match b {
                0 => *launch,
                branch => LaneSpec {
                    key: LaneKey::Graph {
                        stream: launch.key.id(),
                        branch,
                    },
                    ctx: launch.ctx,
                    kind: LaneKind::NonBlocking,
                    priority: launch.priority,
                },
            })
            .collect();
        // The other branches start after the work before the launch on its stream (with the
        // legacy stream's implicit synchronization, which the barrier gets as any job does).
        let fork = (g.branches > 1).then(|| self.engine.submit(launch, Job::Barrier));
        let mut started = vec![false; lanes.len()];
        started[0] = true;
        // The last job of each node (0: none, or done).
        let mut done = vec![0u64; g.nodes.len()];
        let mut scratch = Vec::new();
        let chains = g.chain.iter().any(|&c| c > 1) && self.launches_chains();
        let replayed: Result<(), CuError> = 'nodes: {
            let mut i = 0;
            while i < g.nodes.len() {
                let n = &g.nodes[i];
                let b = g.branch[i] as usize;
                let lane = lanes[b];
                let mut after: Vec<u64> = g.deps[i]
                    .iter()
                    .filter(|&&d| g.branch[d as usize] as usize != b)
                    .map(|&d| done[d as usize])
                    .filter(|&s| s != 0)
                    .collect();
                if !started[b] {
                    started[b] = true;
                    after.extend(fork);
                }
                if !after.is_empty() {
                    // The join before a kernel with a priority of its own starts with that
                    // priority too, so the kernel is not held behind its lane's.
                    let priority = match n {
                        Node::Op(Request::LaunchKernelPriority(p), _) => {
                            Some(p.priority.clamp(super::GREATEST_STREAM_PRIORITY, 0))
                        }
                        _ => None,
                    };
                    self.engine
                        .submit_with_priority(&lane, Job::Barrier, &after, priority);
                }
                let len = if chains { g.chain[i] as usize } else { 0 };
                if len > 1 {
                    self.graphs.route = Some(lane);
                    let r = self.replay_chain(&g.nodes[i..i + len], m, &lane);
                    self.graphs.route = None;
                    if let Err(e) = r {
                        break 'nodes Err(e);
                    }
                    let last = self.engine.lane_last(lane.key);
                    done[i..i + len].fill(last);
                    i += len;
                    continue;
                }
                scratch.clear();
                self.graphs.route = Some(lane);
                let r = match n {
                    Node::Op(req, tail) => {
                        let r = on_stream(req, m.ctx, m.stream);
                        self.dispatch(&r, tail, &mut scratch)
                    }
                    Node::MemAlloc { ptr, size } => self.graph_map(m.ctx, *ptr, *size),
                    Node::MemFree { ptr } => self.graph_free(*ptr),
                    Node::Empty => Ok(()),
                    Node::Conditional(c) => match self.graphs.conditionals.clone() {
                        Some(values) => self.submit_conditional(c, m, &lane, &values),
                        None => Err(CuError::invalid_value("a conditional node without handles")),
                    },
                };
                self.graphs.route = None;
                if let Err(e) = r {
                    break 'nodes Err(e);
                }
                done[i] = self.engine.lane_last(lane.key);
                i += 1;
            }
            Ok(())
        };
        if g.branches > 1 {
            // Later work on the launch stream waits for every branch.
            let ends: Vec<u64> = lanes[1..]
                .iter()
                .map(|l| self.engine.lane_last(l.key))
                .filter(|&s| s != 0)
                .collect();
            self.engine.submit_after(launch, Job::Barrier, &ends);
            for l in &lanes[1..] {
                // Their pending work still runs; the lanes go once idle.
                self.engine.forget_lane(l.key);
            }
        }
        replayed
    }

    /// Whether the device launches chains of kernels as one unit: asked once per session (an
    /// empty chain), and no longer once a chain was refused.
    fn launches_chains(&mut self) -> bool {
        if !self.graphs.chains_probed {
            self.graphs.chains_probed = true;
            if let Err(crate::device::DeviceError::NotSupported(_)) =
                self.dev.launch_chain(&[], &RunControl::default())
            {
                self.graphs.chains_refused.store(true, Ordering::Relaxed);
            }
        }
        !self.graphs.chains_refused.load(Ordering::Relaxed)
    }

    /// Submits a chain's kernels (see [`chains`]) as one job on `lane`; each is checked as its
    /// launch would be. When one fails its check, the kernels before it still run (as they would
    /// node by node) and the check's error is returned.
    fn replay_chain(
        &mut self,
        nodes: &[Node],
        m: &msg::GraphLaunch,
        lane: &LaneSpec,
    ) -> Result<(), CuError> {
        let mut runs = Vec::with_capacity(nodes.len());
        let mut priority = None;
        let mut checked = Ok(());
        for n in nodes {
            let r = match n {
                Node::Op(req, tail) => match on_stream(req, m.ctx, m.stream) {
                    Request::LaunchKernel(k) => self
                        .lane(k.ctx, k.stream)
                        .and_then(|_| self.check_launch(&k, tail, false)),
                    Request::LaunchKernelPriority(p) => {
                        priority = Some(p.priority.clamp(GREATEST_STREAM_PRIORITY, 0));
                        self.lane(p.ctx, p.stream)
                            .and_then(|_| self.check_launch(&p.launch(), tail, false))
                    }
                    other => Err(CuError::invalid_value(format!(
                        "{} is not a kernel launch",
                        other.name()
                    ))),
                },
                _ => Err(CuError::invalid_value("a chain holds kernel launches only")),
            };
            // The heap of a kernel that calls malloc is made before the chain runs (a device
            // that runs chains keeps it in its context).
            match r.and_then(|run| self.heap_for(run.module.as_ref()).map(|_| run)) {
                Ok(run) => runs.push(run),
                Err(e) => {
                    checked = Err(e);
                    break;
                }
            }
        }
        if !runs.is_empty() {
            let work = ChainWork {
                runs,
                control: Arc::new(RunControl::default()),
                watchdog: self.device.watchdog,
                tenant: Arc::clone(&self.tenant),
                ticket: self.tenant.queue_kernel(),
                refused: Arc::clone(&self.graphs.chains_refused),
            };
            let work = self.output.wrap(Box::new(work));
            self.engine
                .submit_with_priority(lane, Job::Other(work), &[], priority);
        }
        checked
    }

    /// Maps `size` bytes of new physical memory, charged to the slice, at `ptr`.
    fn graph_map(&mut self, ctx: u64, ptr: u64, size: u64) -> Result<(), CuError> {
        let mut out = Vec::new();
        self.dispatch(
            &Request::MemCreate(msg::MemCreate { ctx, size }),
            &[],
            &mut out,
        )?;
        let (h, _) = msg::decode_exact::<msg::Handle>(&out, false)
            .map_err(|e| CuError::invalid_value(e.to_string()))?;
        let handle = h.handle;
        let mapped = self
            .dispatch(
                &Request::MemMap(msg::MemMap {
                    ptr,
                    size,
                    offset: 0,
                    handle,
                }),
                &[],
                &mut out,
            )
            .and_then(|()| {
                self.dispatch(
                    &Request::MemSetAccess(msg::MemSetAccess {
                        ptr,
                        size,
                        flags: ACCESS_READWRITE,
                    }),
                    &[],
                    &mut out,
                )
            });
        // The mapping holds the memory from now on (or nothing does, on failure).
        let released = self.dispatch(
            &Request::MemRelease(msg::MemRelease { handle }),
            &[],
            &mut out,
        );
        mapped.and(released)?;
        self.graphs.mapped.insert(ptr, size);
        let used = self.graph_mem_used();
        self.graphs.used_high = self.graphs.used_high.max(used);
        self.graphs.reserved_high = self.graphs.reserved_high.max(used);
        Ok(())
    }

    /// Bytes of graph allocations mapped now (an allocation the application freed with
    /// `cuMemFree` is unmapped, though still listed until its node runs again).
    fn graph_mem_used(&self) -> u64 {
        self.graphs
            .mapped
            .iter()
            .filter(|(ptr, _)| self.va_is_mapped(**ptr))
            .map(|(_, size)| size)
            .sum()
    }

    /// Unmaps a graph allocation once the work before it is done; its memory returns to the
    /// slice. (The shim unmaps one the application frees with `cuMemFree`/`cuMemFreeAsync`
    /// with `MemUnmap`.)
    fn graph_free(&mut self, ptr: u64) -> Result<(), CuError> {
        let size = self.graphs.mapped.remove(&ptr).ok_or_else(|| {
            CuError::invalid_value(format!("{ptr:#x} is not a graph allocation mapped now"))
        })?;
        self.engine.drain()?;
        let mut out = Vec::new();
        self.dispatch(
            &Request::MemUnmap(msg::MemUnmap { ptr, size }),
            &[],
            &mut out,
        )
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use vgpu_proto::cuda;
    use vgpu_proto::graph::push_op;

    use super::*;
    use crate::testutils::{MemDevice, TestClient, vm};

    /// A session of a broker on the in-memory device, with a context and an event.
    fn open() -> (TestClient<UnixStream>, u64, u64) {
        let dev: Arc<dyn crate::device::Device> =
            Arc::new(MemDevice::new(1 << 30, std::time::Duration::ZERO));
        let b = Arc::new(crate::Broker::new(vec![("gpu0".into(), dev)]));
        b.add_tenant(&vm("vm1", 1 << 20)).unwrap();
        let (mut c, ctx) = crate::testutils::serve_session(&b, "vm1");
        let event = c
            .call(&msg::EventCreate { ctx, flags: 0 }, &[])
            .unwrap()
            .0
            .handle;
        (c, ctx, event)
    }

    #[test]
    fn a_session_cannot_hold_more_graph_memory_than_its_budget() {
        let (mut c, ctx, event) = open();
        let mut nodes = Vec::new();
        let record = msg::EventRecord {
            ctx,
            stream: 0,
            event,
        };
        for _ in 0..vgpu_proto::graph::MAX_GRAPH_NODES {
            push_op(&mut nodes, &record, &[]);
        }
        // Each node but the first depends on the one before it.
        let per_graph = vgpu_proto::graph::MAX_GRAPH_NODES * (NODE_BYTES + 4) - 4;
        let fit = MAX_GRAPH_BYTES / per_graph;
        let mut execs = Vec::new();
        for _ in 0..fit {
            let r = c.call(&msg::GraphInstantiate { ctx, replace: 0 }, &nodes);
            execs.push(r.unwrap().0.handle);
        }
        let err = c
            .call(&msg::GraphInstantiate { ctx, replace: 0 }, &nodes)
            .unwrap_err();
        assert_eq!(err.0, cuda::CUDA_ERROR_OUT_OF_MEMORY, "{}", err.1);
        // Destroying one makes room again.
        c.call(
            &msg::GraphExecDestroy {
                ctx,
                exec: execs[0],
            },
            &[],
        )
        .unwrap();
        c.call(&msg::GraphInstantiate { ctx, replace: 0 }, &nodes)
            .unwrap();
        // The replayed graph records the event 65536 times.
        c.call(
            &msg::GraphLaunch {
                ctx,
                stream: 0,
                exec: execs[1],
            },
            &[],
        )
        .unwrap();
    }

    #[test]
    fn independent_nodes_get_branches_of_their_own() {
        // A chain stays on the launch lane.
        let chain = vec![vec![], vec![0], vec![1]];
        assert_eq!(branches(&chain), (vec![0, 0, 0], 1));
        // Fork after 0 into 1 and 2, join in 3, then 4 after 3; a second root 5.
        let fork_join = vec![vec![], vec![0], vec![0], vec![1, 2], vec![3], vec![]];
        assert_eq!(branches(&fork_join), (vec![0, 0, 1, 0, 0, 2], 3));
        // More roots than lanes share them.
        let roots = vec![vec![]; MAX_GRAPH_BRANCHES as usize + 2];
        let (b, lanes) = branches(&roots);
        assert_eq!(lanes, MAX_GRAPH_BRANCHES);
        assert_eq!(b[MAX_GRAPH_BRANCHES as usize], 0);
        assert_eq!(b[MAX_GRAPH_BRANCHES as usize + 1], 1);
    }

    #[test]
    fn consecutive_kernels_of_one_branch_form_chains() {
        const K: Option<Option<i32>> = Some(None);
        // A straight line of 4 kernels: one chain.
        let line = vec![vec![], vec![0], vec![1], vec![2]];
        let (b, _) = branches(&line);
        assert_eq!(chains(&[K; 4], &line, &b), vec![4, 0, 0, 0]);
        // A memset (not a kernel) in the middle splits it; a lone kernel is no chain.
        assert_eq!(
            chains(&[K, K, None, K], &line, &b),
            vec![2, 0, 0, 0],
            "a non-kernel node ends a chain"
        );
        // Another priority starts another chain.
        let p = [K, K, Some(Some(-2)), Some(Some(-2))];
        assert_eq!(chains(&p, &line, &b), vec![2, 0, 2, 0]);
        // Fork after 0 into 1 (branch 0) and 2 (branch 1), 3 after 2 on branch 1, 4 joins 1 and 3.
        let fork = vec![vec![], vec![0], vec![0], vec![2], vec![1, 3]];
        let (b, _) = branches(&fork);
        assert_eq!(b, vec![0, 0, 1, 1, 0]);
        // 0 is waited for by branch 1: the chain cannot go on past it (1 is alone on its branch
        // between 0 and 2); 2-3 chain on branch 1; 4 depends on branch 1's 3 (a join).
        assert_eq!(chains(&[K; 5], &fork, &b), vec![0, 0, 2, 0, 0]);
        // Nodes of one branch that are not consecutive in the graph's order do not chain.
        let interleaved = vec![vec![], vec![], vec![0], vec![1]];
        let (b, _) = branches(&interleaved);
        assert_eq!(b, vec![0, 1, 0, 1]);
        assert_eq!(chains(&[K; 4], &interleaved, &b), vec![0; 4]);
        // A join in the middle (a dependency from another branch) starts a new chain there.
        let join = vec![vec![], vec![0], vec![], vec![1, 2], vec![3]];
        let (b, _) = branches(&join);
        assert_eq!(b, vec![0, 0, 1, 0, 0]);
        assert_eq!(chains(&[K; 5], &join, &b), vec![2, 0, 0, 2, 0]);
        // Long runs are cut into chains of at most MAX_GRAPH_CHAIN_KERNELS.
        let n = 2 * MAX_GRAPH_CHAIN_KERNELS + 3;
        let long: Vec<Vec<u32>> = (0..n)
            .map(|i| if i == 0 { vec![] } else { vec![i as u32 - 1] })
            .collect();
        let (b, _) = branches(&long);
        let c = chains(&vec![K; n], &long, &b);
        let max = MAX_GRAPH_CHAIN_KERNELS as u32;
        assert_eq!(c[0], max);
        assert_eq!(c[MAX_GRAPH_CHAIN_KERNELS], max);
        assert_eq!(c[2 * MAX_GRAPH_CHAIN_KERNELS], 3);
        assert_eq!(c.iter().filter(|&&l| l > 0).count(), 3);
    }

    #[test]
    fn nodes_run_on_the_launch_stream() {
        let r = Request::Memset(msg::Memset {
            ctx: 1,
            stream: 2,
            ..Default::default()
        });
        let Request::Memset(m) = on_stream(&r, 5, 6) else {
            unreachable!()
        };
        assert_eq!((m.ctx, m.stream), (5, 6));
    }
}
