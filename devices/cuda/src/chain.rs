//! Chains of kernels as CUDA graphs: the broker hands a run of a replayed graph's kernels to
//! [`DeviceContext::launch_chain`](vgpu_broker::device::DeviceContext::launch_chain); the
//! executor captures them into a `CUgraph` on a stream of its own (nothing else issues work
//! there), instantiates it once, keeps the executable graph in a per-context cache keyed by the
//! chain's content, and launches it with one `cuGraphLaunch` on the VM's lane stream between
//! two timing events, as it launches a single kernel.

use std::time::Duration;

use tracing::debug;
use vgpu_broker::device::{ChainKernel, DeviceError, RunControl};
use vgpu_proto::cuda;

use crate::context::{Generation, lock};
use crate::driver::{Driver, Function, Graph, GraphExec, Stream};
use crate::error::Op;
use crate::module::CudaModule;

/// Most executable graphs one context keeps (least recently used first out).
pub const MAX_CACHED_GRAPHS: usize = 64;
/// Most bytes of chain contents (parameters above all) one context's cached graphs are keyed
/// by; a chain larger than this alone is instantiated, launched and destroyed each time.
pub const MAX_CACHED_GRAPH_BYTES: usize = 1 << 20;

/// One kernel of a chain as the cache compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct KeyKernel {
    function: usize,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    params: Vec<u8>,
}

/// What a cached graph runs: its kernels and the priority they were captured at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChainKey {
    kernels: Vec<KeyKernel>,
    priority: i32,
}

impl ChainKey {
    fn bytes(&self) -> usize {
        self.kernels
            .iter()
            .map(|k| std::mem::size_of::<KeyKernel>() + k.params.len())
            .sum()
    }

    fn uses(&self, functions: &[Function]) -> bool {
        self.kernels
            .iter()
            .any(|k| functions.iter().any(|f| f.0 as usize == k.function))
    }
}

/// A captured graph and its executable form.
#[derive(Debug)]
struct Cached {
    key: ChainKey,
    graph: Graph,
    exec: GraphExec,
}

/// A context's executable graphs of chains, least recently used first.
#[derive(Debug, Default)]
pub(crate) struct GraphCache {
    entries: Vec<Cached>,
    bytes: usize,
    /// The stream chains are captured on, created on first use.
    capture: Option<Stream>,
}

impl GraphCache {
    /// Destroys every cached graph and the capture stream (the context is current).
    pub(crate) fn clear(&mut self, d: &Driver) {
        for c in self.entries.drain(..) {
            destroy(d, c.graph, c.exec);
        }
        self.bytes = 0;
        if let Some(s) = self.capture.take() {
            let _ = d.stream_destroy(s);
        }
    }

    /// Destroys the graphs that launch any of `functions` (their module is being unloaded; the
    /// context is current).
    pub(crate) fn forget(&mut self, d: &Driver, functions: &[Function]) {
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.entries)
            .into_iter()
            .partition(|c| c.key.uses(functions));
        self.entries = kept;
        for c in gone {
            self.bytes -= c.key.bytes();
            destroy(d, c.graph, c.exec);
        }
    }

    /// How many graphs are cached.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

fn destroy(d: &Driver, graph: Graph, exec: GraphExec) {
    if let Err(f) = d.graph_exec_destroy(exec) {
        debug!(
            call = f.call,
            code = f.code,
            "destroying a cached graph failed"
        );
    }
    let _ = d.graph_destroy(graph);
}

/// Launches `kernels` as one CUDA graph in generation `g` (see the module's doc) and waits for
/// it; returns its GPU time.
pub(crate) fn launch(
    g: &Generation,
    kernels: &[ChainKernel<'_>],
    control: &RunControl,
) -> Result<Duration, DeviceError> {
    let mut resolved = Vec::with_capacity(kernels.len());
    for k in kernels {
        let m = k
            .module
            .as_any()
            .downcast_ref::<CudaModule>()
            .ok_or_else(|| DeviceError::NotSupported("module of another device".into()))?;
        if k.dims.cooperative {
            return Err(DeviceError::NotSupported(
                "a cooperative launch cannot be part of a chain".into(),
            ));
        }
        let (f, name) = m.function(k.kernel)?;
        m.ensure_dynamic_shared(k.kernel, k.dims.shared_bytes)?;
        resolved.push((m, f, name));
    }
    let priority = vgpu_broker::device::current_priority();
    let key = ChainKey {
        kernels: kernels
            .iter()
            .zip(&resolved)
            .map(|(k, (_, f, _))| KeyKernel {
                function: f.0 as usize,
                grid: k.dims.grid,
                block: k.dims.block,
                shared: k.dims.shared_bytes,
                params: k.params.to_vec(),
            })
            .collect(),
        priority,
    };
    let names: Vec<&str> = resolved.iter().map(|(_, _, n)| *n).collect();
    let label = names.join("`, `");
    let (start, end) = g.take_event_pair()?;
    let stream = g.lane_stream();
    let issued = (|| {
        let _order = lock(&g.submit);
        let _c = g.enter()?;
        let d = g.driver();
        let mut cache = lock(&g.graphs);
        let at = match cache.entries.iter().position(|c| c.key == key) {
            Some(i) => {
                // Most recently used last.
                let c = cache.entries.remove(i);
                cache.entries.push(c);
                cache.entries.len() - 1
            }
            None => {
                let (graph, exec) = instantiate(g, &mut cache, kernels, &resolved, priority)?;
                let bytes = key.bytes();
                while !cache.entries.is_empty()
                    && (cache.entries.len() >= MAX_CACHED_GRAPHS
                        || cache.bytes + bytes > MAX_CACHED_GRAPH_BYTES)
                {
                    let old = cache.entries.remove(0);
                    cache.bytes -= old.key.bytes();
                    destroy(d, old.graph, old.exec);
                }
                cache.bytes += bytes;
                cache.entries.push(Cached {
                    key: key.clone(),
                    graph,
                    exec,
                });
                cache.entries.len() - 1
            }
        };
        let exec = cache.entries[at].exec;
        let launched = d
            .event_record(start, stream)
            .map_err(|f| g.fail(f, Op::Other))
            .and_then(|()| {
                d.graph_launch(exec, stream)
                    .map_err(|f| g.fail(f, Op::Launch))
            })
            .and_then(|()| {
                d.event_record(end, stream)
                    .map_err(|f| g.fail(f, Op::Other))
            });
        if cache.bytes > MAX_CACHED_GRAPH_BYTES {
            // A chain too large to keep: freed once its launch completes (CUDA defers it).
            let c = cache.entries.remove(at);
            cache.bytes -= c.key.bytes();
            destroy(d, c.graph, c.exec);
        }
        launched
    })();
    if let Err(e) = issued {
        g.abandon_launch(start, end);
        return Err(e);
    }
    let waited = g.wait(end, control.deadline(), Some((control, label.as_str())));
    let mut printed: Vec<crate::printf::PrintfBuffer> = Vec::new();
    for (m, _, _) in &resolved {
        if let Some(b) = m.printf_buffer()
            && !printed.contains(&b)
        {
            printed.push(b);
            if let Err(e) = g.take_printf(b, control) {
                debug!(kernels = %label, error = %e, "reading back a printf buffer failed");
            }
        }
    }
    g.launch_time(
        (start, end),
        waited,
        control,
        &format!("one of kernels `{label}` (one CUDA graph)"),
    )
}

/// Captures `kernels` on the cache's capture stream and instantiates the graph (the context is
/// current; the caller holds the submit lock).
fn instantiate(
    g: &Generation,
    cache: &mut GraphCache,
    kernels: &[ChainKernel<'_>],
    resolved: &[(&CudaModule, Function, &str)],
    priority: i32,
) -> Result<(Graph, GraphExec), DeviceError> {
    let d = g.driver();
    let s = match cache.capture {
        Some(s) => s,
        None => {
            let s = d
                .stream_create(crate::context::STREAM_NON_BLOCKING)
                .map_err(|f| g.fail(f, Op::Other))?;
            cache.capture = Some(s);
            s
        }
    };
    let graph = d
        .capture_graph(s, || {
            for (k, (_, f, _)) in kernels.iter().zip(resolved) {
                d.issue_launch(
                    *f,
                    k.dims.grid,
                    k.dims.block,
                    k.dims.shared_bytes,
                    s,
                    k.params,
                    priority,
                )
                .map(drop)?;
            }
            Ok(())
        })
        .map_err(|f| not_supported_or(g, f))?;
    match d.graph_instantiate(graph, priority != 0) {
        Ok(exec) => Ok((graph, exec)),
        Err(f) => {
            let _ = d.graph_destroy(graph);
            Err(not_supported_or(g, f))
        }
    }
}

/// A driver that refuses graphs (`CUDA_ERROR_NOT_SUPPORTED`, or capture unsupported) makes the
/// broker launch the chain's kernels one by one; other failures are launch failures.
fn not_supported_or(g: &Generation, f: crate::driver::Failed) -> DeviceError {
    match f.code {
        cuda::CUDA_ERROR_NOT_SUPPORTED | cuda::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => {
            DeviceError::NotSupported(format!("{} failed: the driver refuses graphs", f.call))
        }
        _ => g.fail(f, Op::Launch),
    }
}
