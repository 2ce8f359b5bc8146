//! Conditional graph nodes (CUDA 12.3's `CU_GRAPH_NODE_TYPE_CONDITIONAL`): if, if/else, while
//! and switch nodes whose body graphs run or not as a conditional handle's value says, the value
//! set by the launch's own kernels with `cudaGraphSetConditional`.
//!
//! Each launch of a graph with conditional nodes gets its handles' values
//! ([`GraphConditionals`]: the default at the start with `CU_GRAPH_COND_ASSIGN_DEFAULT`, 0
//! without), which every kernel of the launch can set through its [`RunControl`]. A conditional
//! node is one engine job on its branch's lane: when the lane reaches it, the job reads the
//! handle, runs the chosen body's operations one after the other in the body's topological order
//! (a body's independent branches do not overlap, which CUDA allows), and, for a while loop,
//! reads the handle again. Every kernel of a body is checked at the launch as its own launch
//! would be, and runs under the scheduler like any other (a grant per kernel, the watchdog per
//! kernel), so a loop of many iterations shares the device as a stream of kernels does. A while
//! loop whose body launches no kernel cannot change its handle: if it would run at all, it
//! fails at once with `CUDA_ERROR_LAUNCH_TIMEOUT` instead of holding its lane for ever. Bodies
//! hold kernels, device-to-device copies, memsets, empty nodes and conditional nodes, as CUDA
//! allows, nested at most [`graph::MAX_CONDITIONAL_DEPTH`] deep.

use std::sync::Arc;
use std::time::Duration;

use vgpu_proto::cuda;
use vgpu_proto::graph::{self, CONDITIONAL_NODE, EMPTY_NODE, conditional};
use vgpu_proto::msg::{self, Request};

use super::super::{KernelRun, Session, run_kernel};
use super::{Node, on_stream};
use crate::device::{DeviceContext, DeviceModule, GraphConditionals, RunControl};
use crate::engine::{Job, LaneSpec, Work};
use crate::error::CuError;
use crate::tenant::Tenant;

/// A conditional node as uploaded and checked: its handle, its type and its bodies' nodes in a
/// topological order.
#[derive(Debug)]
pub(super) struct Conditional {
    pub(super) handle: u64,
    kind: u32,
    /// The handle's value at the start of each launch.
    pub(super) start: u32,
    bodies: Vec<Vec<Node>>,
}

impl Conditional {
    /// The handles of this node and of the conditional nodes in its bodies, with their values at
    /// the start of a launch.
    pub(super) fn handles(&self, out: &mut Vec<(u64, u32)>) {
        out.push((self.handle, self.start));
        for n in self.bodies.iter().flatten() {
            if let Node::Conditional(c) = n {
                c.handles(out);
            }
        }
    }

    /// Bytes the node holds: its bodies' nodes and their bulk bytes.
    pub(super) fn bytes(&self) -> usize {
        self.bodies
            .iter()
            .flatten()
            .map(|n| super::NODE_BYTES + n.bulk_bytes())
            .sum()
    }
}

/// What a body runs, checked at the launch.
enum BodyOp {
    Kernel(KernelRun),
    Copy {
        dst: u64,
        src: u64,
        len: u64,
    },
    Fill {
        dst: u64,
        value: u32,
        elem_size: u32,
        count: u64,
    },
    Conditional(CondRun),
}

/// A conditional node ready to run.
struct CondRun {
    handle: u64,
    kind: u32,
    bodies: Vec<Vec<BodyOp>>,
}

impl CondRun {
    /// The modules of the kernels its bodies run (once per kernel node).
    fn modules(&self, out: &mut Vec<Arc<dyn DeviceModule>>) {
        for op in self.bodies.iter().flatten() {
            match op {
                BodyOp::Kernel(run) => out.push(Arc::clone(&run.module)),
                BodyOp::Conditional(c) => c.modules(out),
                _ => {}
            }
        }
    }

    /// Whether a body runs a kernel (only kernels set handles).
    fn runs_kernels(body: &[BodyOp]) -> bool {
        body.iter().any(|op| match op {
            BodyOp::Kernel(_) => true,
            BodyOp::Conditional(c) => c.bodies.iter().any(|b| Self::runs_kernels(b)),
            _ => false,
        })
    }
}

/// One conditional node of one launch, as an engine job.
struct ConditionalWork {
    node: CondRun,
    values: Arc<GraphConditionals>,
    control: Arc<RunControl>,
    watchdog: Option<Duration>,
    tenant: Arc<Tenant>,
}

impl ConditionalWork {
    fn run_node(&self, dev: &dyn DeviceContext, c: &CondRun) -> Result<(), CuError> {
        loop {
            if self.control.cancelled() {
                return Err(CuError::new(
                    cuda::CUDA_ERROR_LAUNCH_FAILED,
                    "the graph launch was cancelled",
                ));
            }
            let value = self.values.get(c.handle).unwrap_or(0);
            let Some(b) = conditional::chosen(c.kind, c.bodies.len() as u32, value) else {
                return Ok(());
            };
            let body = &c.bodies[b as usize];
            if c.kind == conditional::WHILE && !CondRun::runs_kernels(body) {
                return Err(CuError::new(
                    cuda::CUDA_ERROR_LAUNCH_TIMEOUT,
                    format!(
                        "a while loop on conditional handle {:#x} (value {value}) whose body \
                         launches no kernel would never end",
                        c.handle
                    ),
                ));
            }
            for op in body {
                match op {
                    BodyOp::Kernel(run) => {
                        self.control.clear_yield();
                        let mut ticket = self.tenant.queue_kernel();
                        run_kernel(
                            dev,
                            run,
                            &self.control,
                            self.watchdog,
                            &self.tenant,
                            &mut ticket,
                        )?;
                    }
                    BodyOp::Copy { dst, src, len } => dev.copy(*dst, *src, *len)?,
                    BodyOp::Fill {
                        dst,
                        value,
                        elem_size,
                        count,
                    } => dev.memset(*dst, *value, *elem_size, *count)?,
                    BodyOp::Conditional(inner) => self.run_node(dev, inner)?,
                }
            }
            if c.kind != conditional::WHILE {
                return Ok(());
            }
        }
    }
}

impl Work for ConditionalWork {
    fn run(self: Box<Self>, dev: &dyn DeviceContext) -> Result<(), CuError> {
        self.control
            .set_state_budget(Some(Arc::clone(&self.tenant.limits) as _));
        self.run_node(dev, &self.node)
    }

    fn bytes(&self) -> usize {
        fn params(c: &CondRun) -> usize {
            c.bodies
                .iter()
                .flatten()
                .map(|op| match op {
                    BodyOp::Kernel(r) => r.params.len(),
                    BodyOp::Conditional(c) => params(c),
                    _ => 0,
                })
                .sum()
        }
        params(&self.node)
    }

    fn control(&self) -> Option<Arc<RunControl>> {
        Some(Arc::clone(&self.control))
    }
}

impl Session {
    /// Decodes and checks a conditional node and its bodies (`depth`: how many conditional
    /// nodes it lies in).
    pub(super) fn check_conditional(
        &self,
        ctx: u64,
        payload: &[u8],
        allocs: &[(u64, u64)],
        depth: usize,
    ) -> Result<Node, CuError> {
        let bad = |e: vgpu_proto::wire::DecodeError| CuError::invalid_value(e.to_string());
        let (c, at) = msg::decode_exact::<msg::GraphConditionalNode>(payload, true).map_err(bad)?;
        if depth >= graph::MAX_CONDITIONAL_DEPTH {
            return Err(CuError::invalid_value(format!(
                "conditional nodes nest at most {} deep",
                graph::MAX_CONDITIONAL_DEPTH
            )));
        }
        if !conditional::valid(c.kind, c.bodies) {
            return Err(CuError::invalid_value(format!(
                "a conditional node of type {} cannot have {} bodies",
                c.kind, c.bodies
            )));
        }
        if c.flags & !conditional::ASSIGN_DEFAULT != 0 {
            return Err(CuError::invalid_value(format!(
                "unknown conditional handle flags {:#x}",
                c.flags
            )));
        }
        let mut bodies = Vec::with_capacity(c.bodies as usize);
        for (b, list) in graph::split_bodies(&payload[at..], c.bodies)
            .map_err(|e| CuError::invalid_value(e.to_string()))?
            .into_iter()
            .enumerate()
        {
            let list =
                graph::split_graph(list).map_err(|e| CuError::invalid_value(e.to_string()))?;
            let mut nodes = Vec::with_capacity(list.len());
            for (i, n) in list.into_iter().enumerate() {
                let node = self
                    .check_body_node(ctx, &n.node, allocs, depth + 1)
                    .map_err(|e| {
                        CuError::new(e.code, format!("body {b}, node {i}: {}", e.message))
                    })?;
                nodes.push(node);
            }
            bodies.push(nodes);
        }
        // Checked last, so that a hostile upload is told what is wrong with it on any device.
        if !self.dev.sets_graph_conditionals() {
            return Err(CuError::new(
                cuda::CUDA_ERROR_NOT_SUPPORTED,
                "this device does not run conditional graph nodes",
            ));
        }
        Ok(Node::Conditional(Box::new(Conditional {
            handle: c.handle,
            kind: c.kind,
            start: if c.flags & conditional::ASSIGN_DEFAULT != 0 {
                c.default
            } else {
                0
            },
            bodies,
        })))
    }

    /// Checks one node of a conditional body: a kernel, a device copy, a memset, an empty node
    /// or a conditional node, as CUDA allows there.
    fn check_body_node(
        &self,
        ctx: u64,
        n: &graph::NodeBytes<'_>,
        allocs: &[(u64, u64)],
        depth: usize,
    ) -> Result<Node, CuError> {
        match n.opcode {
            CONDITIONAL_NODE => self.check_conditional(ctx, n.payload, allocs, depth),
            EMPTY_NODE => self.check_node(ctx, n, allocs),
            op if op == <msg::LaunchKernel as msg::Op>::OPCODE
                || op == <msg::LaunchKernelPriority as msg::Op>::OPCODE
                || op == <msg::MemcpyDtoD as msg::Op>::OPCODE
                || op == <msg::Memset as msg::Op>::OPCODE =>
            {
                self.check_node(ctx, n, allocs)
            }
            _ => Err(CuError::invalid_value(
                "a conditional body holds only kernels, device copies, memsets, empty and \
                 conditional nodes",
            )),
        }
    }

    /// Checks a conditional node's bodies for a launch on `m`'s stream (as each operation's own
    /// request would be checked) and queues the node as one job of `lane`.
    pub(super) fn submit_conditional(
        &mut self,
        c: &Conditional,
        m: &msg::GraphLaunch,
        lane: &LaneSpec,
        values: &Arc<GraphConditionals>,
    ) -> Result<(), CuError> {
        let node = self.prepare(c, m)?;
        let control = Arc::new(RunControl::default());
        // The bodies' kernels have the device runtime a launch of theirs would have.
        let mut modules = Vec::new();
        node.modules(&mut modules);
        self.set_device_runtime(&control, modules.iter().map(|m| m.as_ref()))?;
        control.set_conditionals(Some(Arc::clone(values)));
        let work = ConditionalWork {
            node,
            values: Arc::clone(values),
            control,
            watchdog: self.device.watchdog,
            tenant: Arc::clone(&self.tenant),
        };
        let work = self.output.wrap(Box::new(work));
        self.engine.submit(lane, Job::Other(work));
        Ok(())
    }

    fn prepare(&self, c: &Conditional, m: &msg::GraphLaunch) -> Result<CondRun, CuError> {
        let mut bodies = Vec::with_capacity(c.bodies.len());
        for body in &c.bodies {
            let mut ops = Vec::with_capacity(body.len());
            for n in body {
                match n {
                    Node::Op(req, tail) => match on_stream(req, m.ctx, m.stream) {
                        Request::LaunchKernel(k) => {
                            ops.push(BodyOp::Kernel(self.check_launch(&k, tail, false)?));
                        }
                        Request::LaunchKernelPriority(p) => {
                            ops.push(BodyOp::Kernel(self.check_launch(
                                &p.launch(),
                                tail,
                                false,
                            )?));
                        }
                        Request::MemcpyDtoD(d) => {
                            self.allocs.check(d.src, d.len, "copy source")?;
                            self.allocs.check(d.dst, d.len, "copy destination")?;
                            ops.push(BodyOp::Copy {
                                dst: d.dst,
                                src: d.src,
                                len: d.len,
                            });
                        }
                        Request::Memset(f) => {
                            // Checked as the request would be; the fill it describes.
                            self.memset_job(&f)?;
                            ops.push(BodyOp::Fill {
                                dst: f.dst,
                                value: f.value,
                                elem_size: f.elem_size,
                                count: f.count,
                            });
                        }
                        other => {
                            return Err(CuError::invalid_value(format!(
                                "{} cannot be in a conditional body",
                                other.name()
                            )));
                        }
                    },
                    Node::Conditional(inner) => {
                        ops.push(BodyOp::Conditional(self.prepare(inner, m)?));
                    }
                    Node::Empty => {}
                    Node::MemAlloc { .. } | Node::MemFree { .. } => {
                        return Err(CuError::invalid_value(
                            "a conditional body cannot allocate or free graph memory",
                        ));
                    }
                }
            }
            bodies.push(ops);
        }
        Ok(CondRun {
            handle: c.handle,
            kind: c.kind,
            bodies,
        })
    }
}
