//! Executable graphs (`cuGraphInstantiate`, `cuGraphLaunch`): the shim uploads a graph's nodes
//! once, in a topological order ([`vgpu_proto::graph`]); a launch is then one request, and the
//! session replays the nodes on the launch stream, each through the same path as the ordinary
//! request it stands for. A replayed node is validated again (handles, pointers against the
//! process's allocations, sizes) exactly as that request would be, so a graph can do nothing its
//! nodes could not do one by one, and it keeps the stream semantics the engine gives them.
//!
//! Hostile input is bounded: a graph holds at most [`graph::MAX_GRAPH_NODES`] nodes, a session at
//! most [`MAX_GRAPH_EXECS`] executable graphs and [`MAX_GRAPH_BYTES`] bytes of them, and a VM's
//! sessions together their VM's `limits.handles` handles and `limits.graph_bytes` bytes.

use std::sync::Arc;

use vgpu_proto::graph::{self, MEM_ALLOC_NODE, MEM_FREE_NODE};
use vgpu_proto::msg::{self, Request};

use super::{ACCESS_READWRITE, Session, reply};
use crate::error::CuError;
use crate::handles::{HandleKind, HandleTable};
use crate::limits::{HandleBudget, LimitUse};
use vgpu_config::limits::Budget;

/// Most executable graphs one session may hold.
pub const MAX_GRAPH_EXECS: usize = 4096;
/// Most bytes one session's executable graphs may hold (decoded nodes and their bulk bytes).
pub const MAX_GRAPH_BYTES: usize = 64 << 20;

/// One node, decoded and checked at upload.
#[derive(Debug)]
enum Node {
    /// An ordinary stream request and its bulk tail.
    Op(Request, Vec<u8>),
    /// Map `size` bytes charged to the slice at `ptr`.
    MemAlloc { ptr: u64, size: u64 },
    /// Unmap the graph allocation at `ptr`.
    MemFree { ptr: u64 },
}

/// An uploaded executable graph.
#[derive(Debug)]
struct GraphExec {
    ctx: u64,
    nodes: Vec<Node>,
    bytes: usize,
}

/// A session's executable graphs.
#[derive(Debug)]
pub(super) struct Graphs {
    execs: HandleTable<Arc<GraphExec>>,
    bytes: usize,
    /// Graph allocations mapped now: address → size.
    mapped: std::collections::BTreeMap<u64, u64>,
    /// The VM's budgets, charged `bytes` (`limits.graph_bytes`).
    vm: Option<Arc<LimitUse>>,
}

impl Default for Graphs {
    fn default() -> Self {
        Self {
            execs: HandleTable::new(HandleKind::GraphExec),
            bytes: 0,
            mapped: Default::default(),
            vm: None,
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
        Request::MemcpyDtoD(m) => (m.ctx, m.stream) = (ctx, stream),
        Request::Memset(m) => (m.ctx, m.stream) = (ctx, stream),
        Request::EventRecord(m) => (m.ctx, m.stream) = (ctx, stream),
        Request::StreamWaitEvent(m) => (m.ctx, m.stream) = (ctx, stream),
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
        let list = graph::split_nodes(tail).map_err(|e| CuError::invalid_value(e.to_string()))?;
        let allocs: Vec<(u64, u64)> = list
            .iter()
            .filter(|n| n.opcode == MEM_ALLOC_NODE)
            .filter_map(|n| msg::decode_exact::<msg::GraphMemAllocNode>(n.payload, false).ok())
            .map(|(a, _)| (a.ptr, a.size))
            .collect();
        let mut nodes = Vec::with_capacity(list.len());
        for (i, n) in list.iter().enumerate() {
            let node = self
                .check_node(m.ctx, n, &allocs)
                .map_err(|e| CuError::new(e.code, format!("graph node {i}: {}", e.message)))?;
            nodes.push(node);
        }
        // What the graph holds in memory: its decoded nodes and their bulk bytes.
        let bytes = nodes.len() * std::mem::size_of::<Node>()
            + nodes
                .iter()
                .map(|n| match n {
                    Node::Op(_, t) => t.len(),
                    _ => 0,
                })
                .sum::<usize>();
        if self.graphs.bytes - old_bytes + bytes > MAX_GRAPH_BYTES {
            return Err(too_big(self.graphs.bytes - old_bytes + bytes));
        }
        let exec = Arc::new(GraphExec {
            ctx: m.ctx,
            nodes,
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
            MEM_FREE_NODE => {
                let (f, _) =
                    msg::decode_exact::<msg::GraphMemFreeNode>(n.payload, false).map_err(bad)?;
                return Ok(Node::MemFree { ptr: f.ptr });
            }
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
        match &req {
            Request::LaunchKernel(m) => {
                let f = self.function(m.function)?;
                if tail.len() != f.param_bytes {
                    return Err(CuError::invalid_value(format!(
                        "kernel `{}` takes {} bytes of parameters, got {}",
                        f.desc.name,
                        f.param_bytes,
                        tail.len()
                    )));
                }
            }
            Request::MemcpyDtoD(m) => {
                check(m.src, m.len, "copy source")?;
                check(m.dst, m.len, "copy destination")?;
            }
            Request::Memset(m) => {
                if !matches!(m.elem_size, 1 | 2 | 4) {
                    return Err(CuError::invalid_value(
                        "memset element size must be 1, 2 or 4",
                    ));
                }
                let bytes = m
                    .count
                    .checked_mul(u64::from(m.elem_size))
                    .ok_or_else(|| CuError::invalid_value("memset size overflows"))?;
                check(m.dst, bytes, "memset destination")?;
            }
            Request::EventRecord(m) => {
                self.event(m.event)?;
            }
            Request::StreamWaitEvent(m) => {
                self.event(m.event)?;
            }
            other => {
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
        let mut scratch = Vec::new();
        for n in &g.nodes {
            scratch.clear();
            match n {
                Node::Op(req, tail) => {
                    let r = on_stream(req, m.ctx, m.stream);
                    self.dispatch(&r, tail, &mut scratch)?;
                }
                Node::MemAlloc { ptr, size } => self.graph_map(m.ctx, *ptr, *size)?,
                Node::MemFree { ptr } => self.graph_free(*ptr)?,
            }
        }
        Ok(())
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
        Ok(())
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
        let (c, s) = UnixStream::pair().unwrap();
        let t = b.tenant("vm1").unwrap();
        std::thread::spawn(move || crate::session_loop::serve(&b, t, &s, &s, "test"));
        let mut c = TestClient::new(c);
        c.hello().unwrap();
        let ctx = c
            .call(
                &msg::CtxCreate {
                    device: 0,
                    flags: 0,
                },
                &[],
            )
            .unwrap()
            .0
            .handle;
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
        let per_graph = vgpu_proto::graph::MAX_GRAPH_NODES * std::mem::size_of::<Node>();
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
