//! Stream capture: between `cuStreamBeginCapture` and `cuStreamEndCapture` the work an
//! application puts on a stream (launches, copies, memsets, event records and waits, graph
//! launches, stream-ordered allocations) becomes nodes of a graph instead of being sent.
//!
//! - Each capturing stream has the set of nodes its next node depends on. An event recorded on a
//!   capturing stream remembers that set; another stream that waits for the event joins the
//!   capture with it (a fork), and the origin stream waiting for an event recorded on a joined
//!   stream merges it back (a join). `cuStreamEndCapture` refuses a capture with unjoined work.
//! - Capture modes (`CUstreamCaptureMode`): while a `GLOBAL` capture runs anywhere, or a
//!   non-`RELAXED` one on this thread, "potentially unsafe" calls (`cuMemAlloc`, `cuMemFree`,
//!   synchronous copies and memsets, `cuCtxSynchronize`) fail with
//!   `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidate those captures; a thread's own mode
//!   (`cuThreadExchangeStreamCaptureMode`) relaxes that as CUDA's does. Synchronizing or
//!   querying a capturing stream fails the same way; work on the legacy stream while a blocking
//!   stream captures fails with `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`; waiting for an event from
//!   outside the capture fails with `_ISOLATION`, one from another capture with `_MERGE`. An
//!   invalidated capture refuses further work with `_INVALIDATED` and ends with that error.
//!
//! [`record`] runs the shim's ordinary entry points in recording mode: explicit graph nodes get
//! their operations that way, checked exactly as the calls they stand for.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread::ThreadId;

use vgpu_proto::cuda;

use crate::driver::{self as drv, CuRes};
use crate::exports::{CUhandle, h, p};
use crate::ffi::{CUresult, ffi};
use crate::graph::{self, CopyParams, KernelParams, MemsetParams, NodeKind, Op};
use crate::out;

/// `CU_STREAM_CAPTURE_STATUS_NONE`.
pub const CAPTURE_STATUS_NONE: c_int = 0;
/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`.
pub const CAPTURE_STATUS_ACTIVE: c_int = 1;
/// `CU_STREAM_CAPTURE_STATUS_INVALIDATED`.
pub const CAPTURE_STATUS_INVALIDATED: c_int = 2;
/// `CU_STREAM_CAPTURE_MODE_GLOBAL`.
pub const MODE_GLOBAL: c_int = 0;
/// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`.
pub const MODE_THREAD_LOCAL: c_int = 1;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`: the largest capture mode value.
pub const MODE_RELAXED: c_int = 2;
/// `CU_EVENT_WAIT_EXTERNAL`.
pub const EVENT_WAIT_EXTERNAL: u32 = 0x1;
/// `CU_STREAM_ADD_CAPTURE_DEPENDENCIES`.
pub const ADD_CAPTURE_DEPENDENCIES: u32 = 0x0;
/// `CU_STREAM_SET_CAPTURE_DEPENDENCIES`.
pub const SET_CAPTURE_DEPENDENCIES: u32 = 0x1;
/// `CU_STREAM_NON_BLOCKING`.
const STREAM_NON_BLOCKING: u32 = 0x1;

thread_local! {
    /// This thread's `CUstreamCaptureMode` (`CU_STREAM_CAPTURE_MODE_GLOBAL` = 0 at start).
    static CAPTURE_MODE: Cell<c_int> = const { Cell::new(MODE_GLOBAL) };
    /// Operations collected by [`record`] on this thread.
    static RECORDING: RefCell<Option<Vec<Op>>> = const { RefCell::new(None) };
    /// The dependencies `cuStreamGetCaptureInfo_v2` last handed out on this thread.
    static DEPS_OUT: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Live captures (so that calls with none going on never take the lock).
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug)]
struct Capture {
    /// The graph nodes go into.
    graph: u64,
    /// The stream the capture began on.
    origin: u64,
    mode: c_int,
    thread: ThreadId,
    invalidated: bool,
    /// Each capturing stream's current dependencies (origin included).
    streams: HashMap<u64, Vec<u64>>,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    captures: HashMap<u64, Capture>,
    by_stream: HashMap<u64, u64>,
    /// Events last recorded in a capture: (capture, the recording stream's dependencies).
    events: HashMap<u64, (u64, Vec<u64>)>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn state() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut g = state();
    f(g.get_or_insert_with(State::default))
}

fn is_legacy(stream: u64) -> bool {
    stream == 0 || stream == 1
}

/// The key of `stream` in the capture state: the stream vgpud knows, so that the per-thread
/// default stream is one stream whether a call names it `CU_STREAM_PER_THREAD` or 0 in a `_ptsz`
/// entry point ([`drv::wire_stream`]); the stream itself where that fails (no context: the call
/// reports it).
fn key(stream: u64) -> u64 {
    drv::wire_stream(stream).unwrap_or(stream)
}

/// Runs `f` with the shim's stream operations collected instead of sent; returns them.
pub fn record(f: impl FnOnce() -> CuRes<()>) -> CuRes<Vec<Op>> {
    RECORDING.with(|r| *r.borrow_mut() = Some(Vec::new()));
    let res = f();
    let ops = RECORDING
        .with(|r| r.borrow_mut().take())
        .unwrap_or_default();
    res.map(|()| ops)
}

/// Whether this thread is recording (see [`record`]).
pub fn recording() -> bool {
    RECORDING.with(|r| r.borrow().is_some())
}

fn push_recorded(op: Op) -> bool {
    RECORDING.with(|r| match r.borrow_mut().as_mut() {
        Some(v) => {
            v.push(op);
            true
        }
        None => false,
    })
}

impl State {
    /// The captures that forbid a potentially unsafe call on this thread.
    fn prohibiting(&self) -> Vec<u64> {
        let mode = CAPTURE_MODE.with(Cell::get);
        let me = std::thread::current().id();
        self.captures
            .iter()
            .filter(|(_, c)| match mode {
                MODE_RELAXED => false,
                MODE_THREAD_LOCAL => c.thread == me && c.mode != MODE_RELAXED,
                _ => c.mode == MODE_GLOBAL || (c.thread == me && c.mode != MODE_RELAXED),
            })
            .map(|(id, _)| *id)
            .collect()
    }

    fn invalidate(&mut self, ids: &[u64]) {
        for id in ids {
            if let Some(c) = self.captures.get_mut(id) {
                c.invalidated = true;
            }
        }
    }

    /// Adds a node to the capture of `stream` after the stream's dependencies.
    fn add(&mut self, stream: u64, kind: NodeKind) -> CuRes<u64> {
        let id = self.by_stream[&stream];
        let cap = self.captures.get_mut(&id).expect("indexed capture");
        if cap.invalidated {
            return Err(cuda::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        let deps = cap.streams.get(&stream).cloned().unwrap_or_default();
        let node = graph::registry().add_node(cap.graph, kind, &deps);
        match node {
            Ok(n) => {
                cap.streams.insert(stream, vec![n]);
                Ok(n)
            }
            Err(e) => {
                cap.invalidated = true;
                Err(e)
            }
        }
    }

    /// Work on the legacy stream while a blocking stream captures: `_IMPLICIT`.
    fn implicit(&mut self, stream: u64) -> CuRes<()> {
        if !is_legacy(stream) {
            return Ok(());
        }
        let blocking: Vec<u64> = self
            .captures
            .iter()
            .filter(|(_, c)| {
                c.streams.keys().any(|s| {
                    drv::stream_params(*s).is_ok_and(|(f, _)| f & STREAM_NON_BLOCKING == 0)
                })
            })
            .map(|(id, _)| *id)
            .collect();
        if blocking.is_empty() {
            return Ok(());
        }
        self.invalidate(&blocking);
        Err(cuda::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    }
}

/// The node a captured operation becomes.
fn node_of(op: Op) -> NodeKind {
    match op {
        Op::Kernel {
            f,
            grid,
            block,
            shared,
            params,
            priority,
        } => {
            let mut k = KernelParams::new(f, grid, block, shared, params);
            k.priority = priority;
            NodeKind::Kernel(k)
        }
        Op::Memset {
            dst,
            value,
            elem,
            count,
        } => NodeKind::Memset(
            MemsetParams {
                dst,
                pitch: 0,
                value,
                elem,
                width: count as usize,
                height: 1,
            },
            vec![op],
        ),
        Op::DtoD { dst, src, len } => NodeKind::Memcpy(
            CopyParams(crate::copies::Memcpy3D::linear(
                (true, src),
                (true, dst),
                len as usize,
            )),
            vec![op],
        ),
        Op::HtoD { dst, src, len } => NodeKind::Memcpy(
            CopyParams(crate::copies::Memcpy3D::linear(
                (false, src as u64),
                (true, dst),
                len,
            )),
            vec![op],
        ),
        Op::DtoH { dst, src, len } => NodeKind::Memcpy(
            CopyParams(crate::copies::Memcpy3D::linear(
                (true, src),
                (false, dst as u64),
                len,
            )),
            vec![op],
        ),
        Op::Host { f, data } => NodeKind::Host { f, data },
        Op::EventRecord(e) => NodeKind::EventRecord(e),
        Op::EventWait(e) => NodeKind::EventWait(e),
        Op::MemAlloc { ptr, size } => NodeKind::MemAlloc {
            bytesize: size,
            ptr,
            reserved: size,
        },
        Op::MemFree { ptr } => NodeKind::MemFree(ptr),
        Op::MemOps(ops) => NodeKind::BatchMemOp(crate::mem_ops::BatchNode::captured(ops)),
        // Only an executable graph's plan holds conditional operations; no stream call makes
        // one, so none is ever captured.
        Op::Conditional { .. } => NodeKind::Empty,
    }
}

/// Called by the shim's stream operations before they send anything: in recording mode the
/// operation is collected; on a capturing stream it becomes a node; while captures forbid it
/// (`sync`: a synchronous call) or it would implicitly order the legacy stream after a
/// capturing stream, it fails. `None`: send it as usual.
pub fn intercept(stream: u64, sync: bool, op: impl FnOnce() -> Op) -> Option<CuRes<()>> {
    if RECORDING.with(|r| r.borrow().is_some()) {
        push_recorded(op());
        return Some(Ok(()));
    }
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return None;
    }
    let stream = key(stream);
    with_state(|st| {
        if sync {
            let ids = st.prohibiting();
            if !ids.is_empty() {
                st.invalidate(&ids);
                return Some(Err(cuda::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
            }
        }
        if st.by_stream.contains_key(&stream) {
            return Some(st.add(stream, node_of(op())).map(drop));
        }
        st.implicit(stream).err().map(Err)
    })
}

/// `cuEventRecord` on a capturing stream marks the event with the stream's position.
pub fn on_event_record(event: u64, stream: u64) -> Option<CuRes<()>> {
    if push_recorded(Op::EventRecord(event)) {
        return Some(Ok(()));
    }
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return None;
    }
    let stream = key(stream);
    with_state(|st| {
        let Some(&id) = st.by_stream.get(&stream) else {
            st.events.remove(&event);
            return st.implicit(stream).err().map(Err);
        };
        let cap = &st.captures[&id];
        if cap.invalidated {
            return Some(Err(cuda::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
        }
        let deps = cap.streams.get(&stream).cloned().unwrap_or_default();
        st.events.insert(event, (id, deps));
        Some(Ok(()))
    })
}

/// `cuStreamWaitEvent`: joins or merges captures through captured events.
pub fn on_stream_wait(stream: u64, event: u64, flags: u32) -> Option<CuRes<()>> {
    if push_recorded(Op::EventWait(event)) {
        return Some(Ok(()));
    }
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return None;
    }
    let stream = key(stream);
    with_state(|st| {
        let ev = st.events.get(&event).cloned();
        match (st.by_stream.get(&stream).copied(), ev) {
            (Some(id), Some((eid, deps))) if id == eid => {
                let cap = st.captures.get_mut(&id).expect("indexed capture");
                if cap.invalidated {
                    return Some(Err(cuda::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
                }
                let cur = cap.streams.entry(stream).or_default();
                for d in deps {
                    if !cur.contains(&d) {
                        cur.push(d);
                    }
                }
                Some(Ok(()))
            }
            (Some(id), Some((eid, _))) => {
                st.invalidate(&[id, eid]);
                Some(Err(cuda::CUDA_ERROR_STREAM_CAPTURE_MERGE))
            }
            (Some(_), None) if flags & EVENT_WAIT_EXTERNAL != 0 => {
                Some(st.add(stream, NodeKind::EventWait(event)).map(drop))
            }
            (Some(id), None) => {
                st.invalidate(&[id]);
                Some(Err(cuda::CUDA_ERROR_STREAM_CAPTURE_ISOLATION))
            }
            (None, Some((eid, deps))) => {
                if is_legacy(stream) {
                    st.invalidate(&[eid]);
                    return Some(Err(cuda::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT));
                }
                let cap = st.captures.get_mut(&eid).expect("indexed capture");
                if cap.invalidated {
                    return Some(Err(cuda::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
                }
                cap.streams.insert(stream, deps);
                st.by_stream.insert(stream, eid);
                Some(Ok(()))
            }
            (None, None) => None,
        }
    })
}

/// `cuStreamSynchronize`/`cuStreamQuery` of a capturing stream: `_UNSUPPORTED`, and the capture
/// is invalidated. The legacy stream synchronizes with every blocking stream: `_IMPLICIT`.
pub fn check_stream_sync(stream: u64) -> CuRes<()> {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    let stream = key(stream);
    with_state(|st| {
        if let Some(&id) = st.by_stream.get(&stream) {
            st.invalidate(&[id]);
            return Err(cuda::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        st.implicit(stream)
    })
}

/// A potentially unsafe call (`cuMemAlloc`, `cuMemFree`, `cuCtxSynchronize`, …): refused, and
/// the captures that forbid it invalidated, as described in the module documentation.
pub fn check_unsafe() -> CuRes<()> {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    with_state(|st| {
        let ids = st.prohibiting();
        if ids.is_empty() {
            return Ok(());
        }
        st.invalidate(&ids);
        Err(cuda::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    })
}

/// A call about all of a context's streams (`cuCtxRecordEvent`, `cuCtxWaitEvent`) while a
/// stream captures: refused, and every live capture invalidated (a process's captures are
/// those of its contexts).
pub fn check_context_wide() -> CuRes<()> {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    with_state(|st| {
        let ids: Vec<u64> = st.captures.keys().copied().collect();
        if ids.is_empty() {
            return Ok(());
        }
        st.invalidate(&ids);
        Err(cuda::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    })
}

/// `cuEventSynchronize`/`cuEventQuery` of an event recorded in a live capture.
pub fn check_event(event: u64) -> CuRes<()> {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    with_state(|st| match st.events.get(&event) {
        Some(_) => Err(cuda::CUDA_ERROR_CAPTURED_EVENT),
        None => Ok(()),
    })
}

/// `cuGraphLaunch` on a capturing stream: the executable graph's graph becomes a child node.
pub fn capture_graph_launch(exec: u64, stream: u64) -> Option<CuRes<()>> {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return None;
    }
    let stream = key(stream);
    with_state(|st| {
        if !st.by_stream.contains_key(&stream) {
            return st.implicit(stream).err().map(Err);
        }
        let child = match graph::exec::source_clone(exec) {
            Ok(c) => c,
            Err(e) => return Some(Err(e)),
        };
        Some(
            st.add(stream, NodeKind::Child(child))
                .map(drop)
                .inspect_err(|_| {
                    let _ = graph::registry().destroy_graph(child);
                }),
        )
    })
}

/// A host function launched on a capturing stream becomes a host node (for
/// `cuLaunchHostFunc`/`cuStreamAddCallback`).
pub fn capture_host(stream: u64, f: usize, data: usize) -> Option<CuRes<()>> {
    intercept(stream, false, || Op::Host { f, data })
}

/// Stream-ordered allocation on a capturing stream (`cuMemAllocAsync`): a graph allocation
/// node; returns its address.
pub fn capture_mem_alloc(stream: u64, size: u64) -> Option<CuRes<u64>> {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return None;
    }
    let stream = key(stream);
    if !with_state(|st| st.by_stream.contains_key(&stream)) {
        return None;
    }
    let r = graph::api::reserve(size).and_then(|(ptr, reserved)| {
        let kind = NodeKind::MemAlloc {
            bytesize: size,
            ptr,
            reserved,
        };
        with_state(|st| st.add(stream, kind)).map(|_| ptr)
    });
    Some(r)
}

/// `cuMemFreeAsync` of a graph allocation on a capturing stream: a free node.
pub fn capture_mem_free(stream: u64, ptr: u64) -> Option<CuRes<()>> {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return None;
    }
    let stream = key(stream);
    with_state(|st| {
        st.by_stream.contains_key(&stream).then(|| {
            if !graph::api::is_graph_alloc(ptr) {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
            st.add(stream, NodeKind::MemFree(ptr)).map(drop)
        })
    })
}

/// Begins a capture of `stream` into `graph` (a new graph when `None`) after `deps`.
fn begin(stream: u64, mode: c_int, into: Option<(u64, Vec<u64>)>) -> CuRes<()> {
    if !(MODE_GLOBAL..=MODE_RELAXED).contains(&mode) {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    // Checked as the application names it (the per-thread default stream is no stream the
    // application created).
    drv::stream_params(stream)?;
    let stream = drv::wire_stream(stream)?;
    if is_legacy(stream) {
        return Err(cuda::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    let mut g = state();
    let st = g.get_or_insert_with(State::default);
    if st.by_stream.contains_key(&stream) {
        return Err(cuda::CUDA_ERROR_ILLEGAL_STATE);
    }
    let (graph, deps) = match into {
        Some((graph, deps)) => {
            let reg = graph::registry();
            let g = reg.graph(graph)?;
            if deps.iter().any(|d| !g.nodes.contains_key(d)) {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
            (graph, deps)
        }
        None => (graph::registry().create_graph()?, Vec::new()),
    };
    st.next_id += 1;
    let id = st.next_id;
    st.captures.insert(
        id,
        Capture {
            graph,
            origin: stream,
            mode,
            thread: std::thread::current().id(),
            invalidated: false,
            streams: HashMap::from([(stream, deps)]),
        },
    );
    st.by_stream.insert(stream, id);
    ACTIVE.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// Nodes `deps` depend on, transitively, and `deps` themselves.
fn ancestors(deps: &[u64]) -> HashSet<u64> {
    let reg = graph::registry();
    let mut seen: HashSet<u64> = HashSet::new();
    let mut todo: Vec<u64> = deps.to_vec();
    while let Some(n) = todo.pop() {
        if seen.insert(n)
            && let Ok(node) = reg.node(n)
        {
            todo.extend(node.deps.iter().copied());
        }
    }
    seen
}

/// Ends the capture begun on `stream`; returns its graph.
fn end(stream: u64) -> CuRes<u64> {
    let stream = key(stream);
    let cap = with_state(|st| {
        let id = *st
            .by_stream
            .get(&stream)
            .ok_or(cuda::CUDA_ERROR_ILLEGAL_STATE)?;
        let cap = &st.captures[&id];
        if cap.origin != stream {
            st.invalidate(&[id]);
            return Err(cuda::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
        }
        if cap.mode != MODE_RELAXED && cap.thread != std::thread::current().id() {
            return Err(cuda::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
        }
        let cap = st.captures.remove(&id).expect("indexed capture");
        st.by_stream.retain(|_, c| *c != id);
        st.events.retain(|_, (c, _)| *c != id);
        ACTIVE.fetch_sub(1, Ordering::AcqRel);
        Ok(cap)
    })?;
    let fail = |e| {
        let _ = graph::registry().destroy_graph(cap.graph);
        Err(e)
    };
    if cap.invalidated {
        return fail(cuda::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    let joined = ancestors(&cap.streams[&stream]);
    let unjoined = cap
        .streams
        .iter()
        .filter(|(s, _)| **s != stream)
        .any(|(_, deps)| deps.iter().any(|d| !joined.contains(d)));
    if unjoined {
        return fail(cuda::CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
    }
    Ok(cap.graph)
}

/// (status, capture id, graph, dependencies) of `stream`.
fn info(stream: u64) -> CuRes<(c_int, u64, u64, Vec<u64>)> {
    // Checked as the application names it, then looked up by its key.
    drv::stream_params(stream)?;
    let stream = key(stream);
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return Ok((CAPTURE_STATUS_NONE, 0, 0, Vec::new()));
    }
    with_state(|st| {
        let Some(&id) = st.by_stream.get(&stream) else {
            return Ok((CAPTURE_STATUS_NONE, 0, 0, Vec::new()));
        };
        let cap = &st.captures[&id];
        let status = if cap.invalidated {
            CAPTURE_STATUS_INVALIDATED
        } else {
            CAPTURE_STATUS_ACTIVE
        };
        let deps = cap.streams.get(&stream).cloned().unwrap_or_default();
        Ok((status, id, cap.graph, deps))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture(stream: CUhandle) -> CUresult {
    ffi("cuStreamBeginCapture", || {
        begin(h(stream), MODE_GLOBAL, None)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture_v2(stream: CUhandle, mode: c_int) -> CUresult {
    ffi("cuStreamBeginCapture_v2", || begin(h(stream), mode, None))
}

/// Reads `n` node handles from a caller array.
///
/// `p` is NULL (only with `n` 0) or valid for reads of `n` handles (CUDA's contract).
pub(crate) fn node_list(p: *const CUhandle, n: usize) -> CuRes<Vec<u64>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() || n > graph::MAX_NODES {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: valid for `n` reads (this function's contract).
    let s = unsafe { std::slice::from_raw_parts(p, n) };
    Ok(s.iter().map(|&x| h(x)).collect())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph(
    stream: CUhandle,
    graph: CUhandle,
    deps: *const CUhandle,
    _edge_data: *const u8,
    num_deps: usize,
    mode: c_int,
) -> CUresult {
    ffi("cuStreamBeginCaptureToGraph", || {
        // SAFETY: `deps` holds `num_deps` nodes (CUDA contract).
        let deps = node_list(deps, num_deps)?;
        begin(h(stream), mode, Some((h(graph), deps)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture(stream: CUhandle, graph: *mut CUhandle) -> CUresult {
    ffi("cuStreamEndCapture", || {
        if graph.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let g = end(h(stream))?;
        out!(graph, p(g))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: CUhandle, st: *mut c_int) -> CUresult {
    ffi("cuStreamIsCapturing", || out!(st, info(h(stream))?.0))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo(
    stream: CUhandle,
    st: *mut c_int,
    id: *mut u64,
) -> CUresult {
    ffi("cuStreamGetCaptureInfo", || {
        let (status, cid, _, _) = info(h(stream))?;
        if !id.is_null() && status != CAPTURE_STATUS_NONE {
            out!(id, cid)?;
        }
        out!(st, status)
    })
}

/// Writes the optional outputs of `cuStreamGetCaptureInfo_v2/_v3`.
///
/// Each pointer is NULL or valid for a write of its type (CUDA's contract).
fn write_info(
    stream: CUhandle,
    st: *mut c_int,
    id: *mut u64,
    graph: *mut CUhandle,
    deps: *mut *const CUhandle,
    edges: *mut *const u8,
    num_deps: *mut usize,
) -> CuRes<()> {
    let (status, cid, g, d) = info(h(stream))?;
    out!(st, status)?;
    if status == CAPTURE_STATUS_NONE {
        return Ok(());
    }
    if !id.is_null() {
        out!(id, cid)?;
    }
    if !graph.is_null() {
        out!(graph, p(g))?;
    }
    let n = d.len();
    let ptr = DEPS_OUT.with(|o| {
        let mut o = o.borrow_mut();
        *o = d;
        o.as_ptr().cast::<CUhandle>()
    });
    if !deps.is_null() {
        out!(deps, ptr)?;
    }
    if !edges.is_null() {
        // Default edges only: CUDA hands out NULL for "all default".
        out!(edges, std::ptr::null())?;
    }
    if !num_deps.is_null() {
        out!(num_deps, n)?;
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    stream: CUhandle,
    st: *mut c_int,
    id: *mut u64,
    graph: *mut CUhandle,
    deps: *mut *const CUhandle,
    num_deps: *mut usize,
) -> CUresult {
    ffi("cuStreamGetCaptureInfo_v2", || {
        write_info(stream, st, id, graph, deps, std::ptr::null_mut(), num_deps)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3(
    stream: CUhandle,
    st: *mut c_int,
    id: *mut u64,
    graph: *mut CUhandle,
    deps: *mut *const CUhandle,
    edges: *mut *const u8,
    num_deps: *mut usize,
) -> CUresult {
    ffi("cuStreamGetCaptureInfo_v3", || {
        write_info(stream, st, id, graph, deps, edges, num_deps)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies(
    stream: CUhandle,
    deps: *const CUhandle,
    num_deps: usize,
    flags: u32,
) -> CUresult {
    ffi("cuStreamUpdateCaptureDependencies", || {
        // SAFETY: `deps` holds `num_deps` nodes (CUDA contract).
        let new = node_list(deps, num_deps)?;
        if flags > SET_CAPTURE_DEPENDENCIES {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let stream = key(h(stream));
        with_state(|st| {
            let id = *st
                .by_stream
                .get(&stream)
                .ok_or(cuda::CUDA_ERROR_ILLEGAL_STATE)?;
            let cap = st.captures.get_mut(&id).expect("indexed capture");
            if cap.invalidated {
                return Err(cuda::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
            }
            let reg = graph::registry();
            let g = reg.graph(cap.graph)?;
            if new.iter().any(|n| !g.nodes.contains_key(n)) {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
            let cur = cap.streams.entry(stream).or_default();
            if flags == SET_CAPTURE_DEPENDENCIES {
                cur.clear();
            }
            for n in new {
                if !cur.contains(&n) {
                    cur.push(n);
                }
            }
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies_v2(
    stream: CUhandle,
    deps: *const CUhandle,
    _edge_data: *const u8,
    num_deps: usize,
    flags: u32,
) -> CUresult {
    // SAFETY: same contract as the first version; edge data (types) is not kept.
    unsafe { cuStreamUpdateCaptureDependencies(stream, deps, num_deps, flags) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) -> CUresult {
    ffi("cuThreadExchangeStreamCaptureMode", || {
        if mode.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-NULL in/out pointer to a CUstreamCaptureMode (CUDA contract).
        let new = unsafe { mode.read_unaligned() };
        if !(MODE_GLOBAL..=MODE_RELAXED).contains(&new) {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(mode, CAPTURE_MODE.with(|m| m.replace(new)))
    })
}
