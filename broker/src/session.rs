//! A session: one guest process's connection. It owns the process's handle
//! tables and allocations, applies its requests to the tenant's device
//! context, and releases everything when it ends (however it ends).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tracing::debug;
use vgpu_proto::cuda::{self, attr, func_attr};
use vgpu_proto::frame::{Header, MAX_BULK_CHUNK};
use vgpu_proto::msg::{self, Message, Request};
use vgpu_proto::pagehash;

use crate::device::{
    ChainKernel, DeviceContext, DeviceError, DeviceInfo, DeviceModule, GlobalDesc, KernelDesc,
    LaunchDims, LaunchProgress, RunControl,
};
use crate::devio::{self, SessionOutput};
use crate::engine::{Engine, EventClock, Gate, Job, LaneKey, LaneKind, LaneSpec, Work};
use crate::error::CuError;
use crate::handles::{HandleKind, HandleTable};
use crate::host_gate::HostCopy;
use crate::hostshare::{Direction, SharedCopy};
use crate::limits::HandleBudget;
use crate::memory::{AllocKind, Allocation, Allocations};
use crate::scheduler::{KernelTicket, Outcome};
use crate::sync_ticket::SYNC_IN_PLACE_MAX;
use crate::tenant::{SessionInfo, Tenant};
use crate::texture::ReferenceKind;
use vgpu_config::limits::Budget;
use vgpu_proto::msg::{SYNC_DONE, SYNC_IDLE, SYNC_PENDING};

mod alloc_ext;
mod device_heap;
mod graph;
mod mem_op;
mod texture;
pub use alloc_ext::{
    ACCESS_READ, ACCESS_READWRITE, MAPPED_KIND_HOST_ALLOC, MAPPED_KIND_HOST_REGISTER,
    MAPPED_KIND_MANAGED, MIRROR_PAGE, guest_attributes, pool_attr, va_limit,
};

/// `CU_STREAM_LEGACY`.
pub const STREAM_LEGACY: u64 = 0x1;
/// `CU_STREAM_PER_THREAD`.
pub const STREAM_PER_THREAD: u64 = 0x2;
/// `CU_STREAM_NON_BLOCKING`.
pub const STREAM_NON_BLOCKING: u32 = 0x1;
/// `CU_EVENT_BLOCKING_SYNC`.
pub const EVENT_BLOCKING_SYNC: u32 = 0x1;
/// `CU_EVENT_DISABLE_TIMING`.
pub const EVENT_DISABLE_TIMING: u32 = 0x2;
/// `CU_EVENT_INTERPROCESS`.
pub const EVENT_INTERPROCESS: u32 = 0x4;
/// Stream priorities accepted: `[GREATEST_PRIORITY, 0]` (lower is higher priority).
pub const GREATEST_STREAM_PRIORITY: i32 = -5;
/// Longest a `HostFuncWait` waits before answering "not reached yet" (the
/// shim asks again), so a session thread is never held indefinitely.
pub const HOST_FUNC_MAX_WAIT_MS: u32 = 1000;
/// Pitch alignment of `cuMemAllocPitch`.
pub const PITCH_ALIGNMENT: u64 = 512;
/// The one device ordinal a tenant sees.
pub const DEVICE_ORDINAL: u32 = 0;

#[derive(Debug)]
struct CtxState {
    primary: bool,
    /// A green context's multiprocessors (`cuGreenCtxCreate`), or those of a context created
    /// with an execution affinity: its kernels run on at most this many of the device's at a
    /// time. `None`: all of them.
    sms: Option<u32>,
    /// A green context: it holds the primary context, whose memory and events it shares.
    green: bool,
}

#[derive(Debug)]
struct StreamState {
    ctx: u64,
    flags: u32,
    priority: i32,
}

#[derive(Debug)]
struct EventState {
    ctx: u64,
    flags: u32,
    clock: Arc<EventClock>,
    /// Its part in interprocess sharing (`cuIpcGetEventHandle`, `cuIpcOpenEventHandle`).
    ipc: Option<alloc_ext::ipc::event::EventLink>,
}

/// A module image arriving in parts: its context, its declared size and the bytes so far.
struct StagedImage {
    ctx: u64,
    total: u64,
    bytes: Vec<u8>,
}

struct ModuleState {
    ctx: u64,
    module: Arc<dyn DeviceModule>,
    functions: HashMap<String, u64>,
    /// Bytes of its image, charged to the VM's `limits.module_bytes`.
    image_bytes: u64,
}

#[derive(Debug)]
struct FunctionState {
    module: u64,
    kernel: usize,
    desc: KernelDesc,
    param_bytes: usize,
}

#[derive(Debug, Default)]
struct Primary {
    handle: Option<u64>,
    refs: u32,
    flags: u32,
}

/// What [`BulkSource::read`] calls with the bytes: `Send`, because a transport may call it on the
/// thread that receives them while the session's thread waits (vgpud's vsock device thread).
pub type ReadSlices<'a> = dyn FnMut(&[&[u8]]) -> Result<(), CuError> + Send + 'a;
/// What [`BulkSink::write`] calls with the room for the bytes.
pub type WriteSlices<'a> = dyn FnMut(&mut [&mut [u8]]) -> Result<(), CuError> + 'a;

/// Bulk bytes of a request that a transport lends without copying them, for
/// [`Session::handle_bulk`].
pub trait BulkSource {
    /// Total bytes.
    fn len(&self) -> u64;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Calls `f` with the bytes, in order: once with all of them as one or more slices, or, for
    /// a transport that receives them while they are used, once per run as it arrives. Stops at
    /// `f`'s first error and returns it; fails when the memory is no longer available (the
    /// transport was reset meanwhile). Called at most once per request.
    fn read(&self, f: &mut ReadSlices<'_>) -> Result<(), CuError>;
}

/// Where the bulk bytes of a reply go without a copy, for [`Session::handle_bulk`].
pub trait BulkSink {
    /// Bytes available.
    fn capacity(&self) -> u64;
    /// Calls `f` with the first `len` bytes as mutable slices, in order: `f` fills them with the
    /// reply's bulk data. Fails when `len` exceeds the capacity or the memory is gone.
    fn write(&mut self, len: u64, f: &mut WriteSlices<'_>) -> Result<(), CuError>;
}

/// The device memory a checked `MemcpyDtoH` reads, in order ([`Session::dtoh_lent`]).
pub struct DeviceSource {
    dev: Arc<dyn DeviceContext>,
    /// Device address of the next byte to read.
    next: u64,
    /// Device address past the last byte.
    end: u64,
}

impl std::fmt::Debug for DeviceSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSource")
            .field("next", &self.next)
            .field("end", &self.end)
            .finish()
    }
}

impl DeviceSource {
    /// Bytes left to read.
    pub fn left(&self) -> u64 {
        self.end - self.next
    }

    /// Reads the next bytes into `segs`, in order; fails past the copy's end or when the device
    /// fails.
    pub fn read(&mut self, segs: &mut [&mut [u8]]) -> Result<(), CuError> {
        let n: u64 = segs.iter().map(|s| s.len() as u64).sum();
        if n > self.left() {
            return Err(CuError::invalid_value(format!(
                "{n} bytes asked of a copy with {} left",
                self.left()
            )));
        }
        self.dev
            .read_scattered(self.next, segs)
            .map_err(CuError::from)?;
        self.next += n;
        Ok(())
    }
}

/// A source or sink with no bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoBulk;

impl BulkSource for NoBulk {
    fn len(&self) -> u64 {
        0
    }
    fn read(&self, f: &mut ReadSlices<'_>) -> Result<(), CuError> {
        f(&[])
    }
}

impl BulkSink for NoBulk {
    fn capacity(&self) -> u64 {
        0
    }
    fn write(&mut self, len: u64, f: &mut WriteSlices<'_>) -> Result<(), CuError> {
        if len > 0 {
            return Err(CuError::invalid_value(
                "the request provided no room for reply data",
            ));
        }
        f(&mut [])
    }
}

/// `inline` followed by `data`, in one buffer.
fn gather(inline: &[u8], data: &dyn BulkSource) -> Result<Vec<u8>, CuError> {
    let mut all = Vec::with_capacity(inline.len() + data.len() as usize);
    all.extend_from_slice(inline);
    data.read(&mut |segs| {
        for s in segs {
            all.extend_from_slice(s);
        }
        Ok(())
    })?;
    Ok(all)
}

/// Writes `inline` then `data` to device memory from `dst` on, as one scatter-gather copy per
/// run of `data`.
fn write_gathered(
    d: &dyn DeviceContext,
    dst: u64,
    inline: &[u8],
    data: &dyn BulkSource,
) -> Result<(), CuError> {
    let mut at = dst;
    let mut first = inline;
    data.read(&mut |segs| {
        let len: usize = first.len() + segs.iter().map(|s| s.len()).sum::<usize>();
        let r = if first.is_empty() {
            d.write_gathered(at, segs)
        } else {
            let pieces: Vec<&[u8]> = std::iter::once(std::mem::take(&mut first))
                .chain(segs.iter().copied())
                .collect();
            d.write_gathered(at, &pieces)
        };
        at += len as u64;
        r.map_err(CuError::from)
    })?;
    if !first.is_empty() {
        // `data` had no run to go with it.
        d.write(at, first).map_err(CuError::from)?;
    }
    Ok(())
}

/// What a synchronizing call waits for ([`Session::sync_point`]).
enum SyncPoint {
    /// Work of this session, and the context whose errors the call reports (none: a wait that
    /// reports nothing).
    Work(crate::engine::Until, Option<u64>),
    /// An event another process recorded last.
    IpcEvent(Arc<alloc_ext::ipc::event::IpcEvent>),
}

/// Synchronous requests whose handling waits for nothing but the session's own queued work and
/// does bounded work: with that work done they are answered at once
/// ([`Session::answers_at_once`]). Not here: allocations and frees (a movable placement may
/// demote another process's memory; a free may return gigabytes), module loads (a compile),
/// event synchronization (an IPC event waits for another process), host functions, and every
/// request that creates or destroys a context or stream.
const QUICK_OPS: &[u16] = &[
    <msg::Ping as msg::Op>::OPCODE,
    <msg::TakeOutput as msg::Op>::OPCODE,
    <msg::DeviceGetCount as msg::Op>::OPCODE,
    <msg::DeviceGetProperties as msg::Op>::OPCODE,
    <msg::DeviceTotalMem as msg::Op>::OPCODE,
    <msg::PrimaryCtxGetState as msg::Op>::OPCODE,
    <msg::CtxSynchronize as msg::Op>::OPCODE,
    <msg::MemGetInfo as msg::Op>::OPCODE,
    <msg::MemGetAddressRange as msg::Op>::OPCODE,
    <msg::MemcpyHtoD as msg::Op>::OPCODE,
    <msg::MemcpyDtoH as msg::Op>::OPCODE,
    <msg::StreamSynchronize as msg::Op>::OPCODE,
    <msg::SyncBegin as msg::Op>::OPCODE,
    <msg::SyncFinish as msg::Op>::OPCODE,
    <msg::StreamQuery as msg::Op>::OPCODE,
    <msg::EventQuery as msg::Op>::OPCODE,
    <msg::EventElapsedTime as msg::Op>::OPCODE,
    <msg::ModuleGetFunction as msg::Op>::OPCODE,
    <msg::ModuleGetGlobal as msg::Op>::OPCODE,
    <msg::FuncGetAttribute as msg::Op>::OPCODE,
];

/// What a host-to-device copy from borrowed bytes does when its stream is busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WhenBusy {
    /// Wait for the stream, then copy straight from the bytes (as CUDA's copies from pageable
    /// memory do): the bytes are the guest application's own pages.
    Wait,
    /// Queue a copy of the bytes and return: the bytes are the transport's, and an asynchronous
    /// copy must not hold up the requests behind it.
    Queue,
}

/// A posted call a transport hands over in a run ([`Session::handle_posted_run`]): the kinds
/// of asynchronous call a program sends many of in a row, whose work is short.
#[derive(Debug, Clone, PartialEq)]
pub enum PostedCall {
    /// `cuMemsetD*Async`.
    Memset(msg::Memset),
    /// `cuMemcpyHtoDAsync` of the bytes at this range of the run's bytes.
    MemcpyHtoD(msg::MemcpyHtoD, std::ops::Range<usize>),
}

impl PostedCall {
    /// The posted call the frame with header `h` and `payload` asks for, if it is one a run
    /// may hold: an asynchronous `Memset`, or `MemcpyHtoD` whose bytes follow its fields (the
    /// payload lies at `at` in the run's bytes). `None` for anything else (a synchronous frame,
    /// one with reply flags, another op), or a payload that does not decode: the transport
    /// serves that frame on its own, as any.
    pub fn decode(h: &Header, payload: &[u8], at: usize) -> Option<Self> {
        use msg::Op;
        if !h.is_async()
            || h.is_reply()
            || h.has_output()
            || (h.opcode != msg::Memset::OPCODE && h.opcode != msg::MemcpyHtoD::OPCODE)
        {
            return None;
        }
        match Request::decode(h.opcode, payload).ok()? {
            (Request::Memset(m), _) => Some(Self::Memset(m)),
            (Request::MemcpyHtoD(m), pos) => {
                Some(Self::MemcpyHtoD(m, at + pos..at + payload.len()))
            }
            _ => None,
        }
    }

    /// The context and stream it names.
    fn stream(&self) -> (u64, u64) {
        match self {
            Self::Memset(m) => (m.ctx, m.stream),
            Self::MemcpyHtoD(m, _) => (m.ctx, m.stream),
        }
    }

    /// The request and its bulk bytes, out of the run's `bytes`.
    fn request<'a>(&self, bytes: &'a [u8]) -> (Request, &'a [u8]) {
        match self {
            Self::Memset(m) => (Request::Memset(m.clone()), &[]),
            Self::MemcpyHtoD(m, data) => (
                Request::MemcpyHtoD(m.clone()),
                bytes.get(data.clone()).unwrap_or_default(),
            ),
        }
    }
}

/// The bytes `m` fills, once its element size is checked. Always inlined, as
/// [`Session::memset_job`].
#[inline(always)]
fn memset_bytes(m: &msg::Memset) -> Result<u64, CuError> {
    if !matches!(m.elem_size, 1 | 2 | 4) {
        return Err(CuError::invalid_value(
            "memset element size must be 1, 2 or 4",
        ));
    }
    m.count
        .checked_mul(u64::from(m.elem_size))
        .ok_or_else(|| CuError::invalid_value("memset size overflows"))
}

/// A checked call of a run ([`Session::handle_posted_run`]).
#[derive(Debug)]
enum RunItem {
    /// The fill a `Memset` asks for.
    Fill(msg::Memset),
    /// Write the run's bytes at `data` to `dst`.
    Write {
        dst: u64,
        data: std::ops::Range<usize>,
    },
}

impl RunItem {
    /// Does it on `dev` now (the run's bulk bytes are `bytes`).
    #[inline]
    fn run(&self, dev: &dyn DeviceContext, bytes: &[u8]) -> Result<(), CuError> {
        match self {
            RunItem::Fill(m) => dev.memset(m.dst, m.value, m.elem_size, m.count),
            RunItem::Write { dst, data } => dev.write(*dst, &bytes[data.clone()]),
        }
        .map_err(CuError::from)
    }

    /// The engine's job that does it later, its bytes copied out of `bytes`.
    fn job(&self, bytes: &[u8]) -> Job {
        match self {
            RunItem::Fill(m) => Job::Memset {
                dst: m.dst,
                value: m.value,
                elem_size: m.elem_size,
                count: m.count,
            },
            RunItem::Write { dst, data } => Job::Write {
                dst: *dst,
                data: bytes[data.clone()].to_vec(),
            },
        }
    }
}

/// One guest process's state on the host.
pub struct Session {
    info: Arc<SessionInfo>,
    tenant: Arc<Tenant>,
    device: DeviceInfo,
    dev: Arc<dyn DeviceContext>,
    contexts: HandleTable<CtxState>,
    /// Live contexts on part of the device's multiprocessors, green or with an execution
    /// affinity (most processes have none: launches then skip the lookup).
    greens: usize,
    primary: Primary,
    streams: HandleTable<StreamState>,
    events: HandleTable<EventState>,
    modules: HandleTable<ModuleState>,
    /// A module image arriving in parts ([`Session::load_module_part`]).
    staged_image: Option<StagedImage>,
    functions: HandleTable<FunctionState>,
    allocs: Allocations,
    engine: Engine,
    output: SessionOutput,
    ext: alloc_ext::AllocExt,
    graphs: graph::Graphs,
    shares: crate::hostshare::SharedRegions,
    /// The doorbell the socket's reader watches ([`Session::accept_bell`]).
    bell: Option<Arc<crate::doorbell::BellSlot>>,
    /// The checked calls of a run of posted calls ([`Session::handle_posted_run`]), kept for
    /// the next run.
    run_ready: Vec<RunItem>,
    /// Texture and surface objects.
    textures: texture::TexObjects,
    /// Stream memory waits, from the first one ([`Session::stream_mem_op`]).
    mem_waits: Option<crate::mem_wait::MemWaits>,
    /// What kernels' device runtime calls use (the heap of their `malloc`, device launches).
    device_runtime: device_heap::DeviceRuntime,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.info.id)
            .field("tenant", &self.tenant.name)
            .field("allocations", &self.allocs.len())
            .finish()
    }
}

fn round_up(v: u64, to: u64) -> Option<u64> {
    if to <= 1 {
        return Some(v);
    }
    v.checked_add(to - 1).map(|x| x / to * to)
}

/// Encodes a reply struct into `out`.
fn reply<M: Message>(out: &mut Vec<u8>, m: M) -> Result<(), CuError> {
    m.encode(out);
    Ok(())
}

impl Session {
    /// Makes the session's waits notice a client that disconnected
    /// ([`crate::engine::Engine::watch_hangup`]).
    pub fn watch_hangup(&mut self, probe: crate::engine::HangupProbe) {
        self.engine.watch_hangup(probe);
    }

    /// Lets the session map host memory the client shares (`HostShare`): the descriptors its
    /// transport received wait in `inbox`. Only unix-socket sessions have one; others refuse
    /// `HostShare` with `CUDA_ERROR_NOT_SUPPORTED`.
    pub fn accept_fds(&mut self, inbox: Arc<crate::hostshare::FdInbox>) {
        self.shares.set_inbox(inbox);
    }

    /// Lets the session take a doorbell page (`Doorbell`, [`crate::doorbell`]): `slot` is the
    /// one its socket's reader watches. Sessions without one refuse `Doorbell` with
    /// `CUDA_ERROR_NOT_SUPPORTED`.
    pub fn accept_bell(&mut self, slot: Arc<crate::doorbell::BellSlot>) {
        self.bell = Some(slot);
    }

    /// The session's doorbell, once `Doorbell` set its page.
    pub fn bell(&self) -> Option<&Arc<crate::doorbell::BellSlot>> {
        self.bell.as_ref().filter(|b| b.ready())
    }

    /// Whether the client sent more descriptors than the session queues (a protocol violation).
    pub fn fds_overflowed(&self) -> bool {
        self.shares.inbox().is_some_and(|i| i.overflowed())
    }

    /// Shared host regions held.
    pub fn shared_regions(&self) -> usize {
        self.shares.len()
    }

    /// Opens a session of `tenant`; `info` describes the peer.
    pub fn new(tenant: Arc<Tenant>, info: Arc<SessionInfo>) -> Result<Session, CuError> {
        let dev = tenant.context().map_err(CuError::from)?;
        let device = tenant.device().info().clone();
        tenant.add_session(Arc::clone(&info));
        let vm = Arc::clone(&tenant.limits);
        let budget = |budget| HandleBudget {
            use_: Arc::clone(&vm),
            budget,
        };
        let mut s = Session {
            info,
            engine: Engine::with_budget(Arc::clone(&dev), Arc::clone(&vm)),
            contexts: HandleTable::budgeted(HandleKind::Context, budget(Budget::Handles)),
            greens: 0,
            primary: Primary::default(),
            streams: HandleTable::budgeted(HandleKind::Stream, budget(Budget::Streams)),
            events: HandleTable::budgeted(HandleKind::Event, budget(Budget::Events)),
            // Modules have budgets of their own (`modules`, `module_bytes`).
            modules: HandleTable::new(HandleKind::Module),
            staged_image: None,
            functions: HandleTable::budgeted(HandleKind::Function, budget(Budget::Handles)),
            allocs: Allocations::default(),
            output: SessionOutput::default(),
            device_runtime: device_heap::DeviceRuntime::default(),
            ext: alloc_ext::AllocExt::default(),
            graphs: graph::Graphs::default(),
            shares: crate::hostshare::SharedRegions::default(),
            bell: None,
            run_ready: Vec::new(),
            textures: texture::TexObjects::default(),
            mem_waits: None,
            tenant,
            device,
            dev,
        };
        s.ext.set_budget(budget(Budget::Handles));
        s.graphs.set_budget(budget(Budget::Handles));
        s.shares.set_budget(budget(Budget::Handles));
        s.textures.set_budget(budget(Budget::Handles));
        Ok(s)
    }

    /// Session id.
    pub fn id(&self) -> u64 {
        self.info.id
    }

    /// What the session's peer said about itself, and its memory use.
    pub fn info(&self) -> &Arc<SessionInfo> {
        &self.info
    }

    /// The tenant.
    pub fn tenant(&self) -> &Arc<Tenant> {
        &self.tenant
    }

    /// Whether device output released by a synchronizing call waits for the client: its
    /// replies then carry `FLAG_OUTPUT` (see [`crate::devio`]).
    pub fn output_ready(&self) -> bool {
        self.output.ready()
    }

    /// Whether a synchronous request with `opcode` would be answered at once: its handling waits
    /// for nothing but this session's queued work, and none is queued or running. A transport may
    /// then run it on the thread that received it instead of handing it to the session's own.
    /// Which bulk bytes the request may carry is the transport's to bound.
    pub fn answers_at_once(&self, opcode: u16) -> bool {
        QUICK_OPS.contains(&opcode) && self.engine.idle()
    }

    /// Bytes of the slice this session holds.
    pub fn memory_charged(&self) -> u64 {
        self.allocs.charged()
    }

    /// Records the error of an asynchronous request that could not even be
    /// decoded: it surfaces at the next synchronizing call of any context.
    pub fn defer_error(&mut self, e: CuError) {
        self.tenant.stats.errors.fetch_add(1, Ordering::Relaxed);
        self.engine.defer_error(crate::engine::NO_CONTEXT, e);
    }

    /// The context a request's work belongs to (the stream's, for a stream of
    /// this session), or `NO_CONTEXT`: also for a context this session does not
    /// have, so that errors kept for later are keyed by real contexts only and
    /// a flood of forged values leaves nothing behind.
    fn req_ctx(&self, req: &Request) -> u64 {
        use Request as R;
        let (ctx, stream) = match req {
            R::MemcpyHtoD(m) => (m.ctx, m.stream),
            R::MemcpyDtoD(m) => (m.ctx, m.stream),
            R::Memset(m) => (m.ctx, m.stream),
            R::StreamWaitEvent(m) => (m.ctx, m.stream),
            R::EventRecord(m) => (m.ctx, m.stream),
            R::LaunchKernel(m) => (m.ctx, m.stream),
            R::LaunchCooperative(m) => (m.ctx, m.stream),
            R::LaunchKernelPriority(m) => (m.ctx, m.stream),
            R::GraphLaunch(m) => (m.ctx, m.stream),
            R::MemcpyHtoDShared(m) => (m.ctx, m.stream),
            R::MemcpyDtoHShared(m) => (m.ctx, m.stream),
            R::StreamMemOp(m) => (m.ctx, m.stream),
            _ => return crate::engine::NO_CONTEXT,
        };
        let ctx = self.streams.get(stream).map_or(ctx, |s| s.ctx);
        if self.contexts.get(ctx).is_some() {
            ctx
        } else {
            crate::engine::NO_CONTEXT
        }
    }

    /// The lane of a request's work, for a synchronous form to wait on.
    fn req_lane(&self, req: &Request) -> Option<LaneSpec> {
        use Request as R;
        let (ctx, stream) = match req {
            R::MemcpyHtoD(m) => (m.ctx, m.stream),
            R::MemcpyDtoD(m) => (m.ctx, m.stream),
            R::Memset(m) => (m.ctx, m.stream),
            R::StreamWaitEvent(m) => (m.ctx, m.stream),
            R::EventRecord(m) => (m.ctx, m.stream),
            R::LaunchKernel(m) => (m.ctx, m.stream),
            R::LaunchCooperative(m) => (m.ctx, m.stream),
            R::LaunchKernelPriority(m) => (m.ctx, m.stream),
            R::MemcpyHtoDShared(m) => (m.ctx, m.stream),
            R::MemcpyDtoHShared(m) => (m.ctx, m.stream),
            _ => return None,
        };
        self.lane(ctx, stream).ok()
    }

    /// Executes one request. On success the reply payload is in `out`.
    ///
    /// `sync` says whether the client waits for the reply. An op that may be
    /// asynchronous (a copy, a memset, a record) sent synchronously completes
    /// before the reply and reports the errors of earlier asynchronous work,
    /// as CUDA's synchronous forms do.
    pub fn handle(
        &mut self,
        req: &Request,
        tail: &[u8],
        out: &mut Vec<u8>,
        sync: bool,
    ) -> Result<(), CuError> {
        let r = match req {
            // Synchronous shared copies may run inline whatever their size.
            Request::MemcpyHtoDShared(_) | Request::MemcpyDtoHShared(_) if sync => {
                self.shared_request(req, true, out)
            }
            _ => self.dispatch(req, tail, out),
        };
        self.complete_call(req, r, sync)
    }

    /// Like [`Session::handle`], for a transport that leaves bulk bytes where the client put
    /// them (the virtio-vgpu device: the guest application's pinned pages). The request's bulk
    /// bytes are `inline` (those that came with the fields) followed by `data`; a
    /// `MemcpyDtoH` writes its data into `sink` (`out` gets the reply struct only).
    ///
    /// `MemcpyHtoD` and `MemcpyDtoH` copy straight between those bytes and device memory, with no
    /// buffer in between: a host-to-device copy waits for the session's earlier work first (as
    /// CUDA's copies from pageable memory do), so that the bytes are read before the request
    /// returns. Other ops with bulk bytes get them gathered into one buffer.
    pub fn handle_bulk(
        &mut self,
        req: &Request,
        inline: &[u8],
        data: &dyn BulkSource,
        sink: &mut dyn BulkSink,
        out: &mut Vec<u8>,
        sync: bool,
    ) -> Result<(), CuError> {
        let r = match req {
            Request::MemcpyHtoD(m) => self.htod_from(m, inline, data, out, WhenBusy::Wait),
            Request::MemcpyDtoH(m) => self.dtoh_into(m, sink, out),
            _ if data.is_empty() => self.dispatch(req, inline, out),
            _ => gather(inline, data).and_then(|tail| self.dispatch(req, &tail, out)),
        };
        self.complete_call(req, r, sync)
    }

    /// Like [`Session::handle`], for a request whose bulk bytes a transport lends as they arrive
    /// (`data`, read at most once: [`crate::session_loop::serve_in_place`]). A `MemcpyHtoD` to
    /// an idle stream goes straight from them to device memory; to a busy stream, its bytes are
    /// queued as [`Session::handle`] queues them.
    pub fn handle_lent(
        &mut self,
        req: &Request,
        data: &dyn BulkSource,
        out: &mut Vec<u8>,
        sync: bool,
    ) -> Result<(), CuError> {
        let r = match req {
            Request::MemcpyHtoD(m) => self.htod_from(m, &[], data, out, WhenBusy::Queue),
            _ => gather(&[], data).and_then(|tail| self.dispatch(req, &tail, out)),
        };
        self.complete_call(req, r, sync)
    }

    /// What every call does after running: synchronous forms of asynchronous ops wait and report
    /// earlier errors; errors of asynchronous requests are kept for later; failures are counted.
    fn complete_call(
        &mut self,
        req: &Request,
        mut r: Result<(), CuError>,
        sync: bool,
    ) -> Result<(), CuError> {
        if req.flags() & msg::ASYNC_OK != 0 {
            let ctx = self.req_ctx(req);
            // A stream memory operation has no synchronous form: a call of one is answered once
            // it is checked and queued (a wait may be released only by later calls).
            let waits = !matches!(req, Request::StreamMemOp(_));
            if sync && waits && r.is_ok() {
                // The synchronous form waits for its stream (with the legacy
                // stream's implicit synchronization), not for other streams.
                match self.req_lane(req) {
                    Some(lane) => self.engine.wait_lane(&lane)?,
                    None => self.engine.drain()?,
                }
                r = self.surface_async_error(ctx);
            } else if let (false, Err(e)) = (sync, &r) {
                // No reply was wanted: the error surfaces at the next synchronizing call.
                self.engine.defer_error(ctx, e.clone());
            }
        }
        if sync && devio::synchronizes(req) {
            // CUDA prints device printf output at synchronizing calls.
            self.output.release();
        }
        if let Err(e) = &r
            && e.code != cuda::CUDA_ERROR_NOT_READY
        {
            self.tenant.stats.errors.fetch_add(1, Ordering::Relaxed);
            debug!(session = self.info.id, op = req.name(), error = %e, "call failed");
        }
        r
    }

    /// Serves posted calls (`calls`, in the order the client sent them; their bulk bytes are
    /// ranges of `bytes`) as [`Session::handle`] would one by one, without replies. The calls
    /// of a run on one stream are checked one by one and run inline together
    /// ([`Engine::try_inline_run`]), so that a transport that read many posted frames at once
    /// pays the engine's bookkeeping once for them; when the stream is busy they are queued as
    /// one by one. A call refused by its checks (or a fill too large to run inline) ends the
    /// run before it and is served alone, its error kept for the context's next synchronizing
    /// call; the run after it starts anew.
    pub fn handle_posted_run(&mut self, calls: &[PostedCall], bytes: &[u8], out: &mut Vec<u8>) {
        let mut ready = std::mem::take(&mut self.run_ready);
        let mut rest = calls;
        while let Some(first) = rest.first() {
            let stream = first.stream();
            ready.clear();
            let taken = match self.lane(stream.0, stream.1) {
                Ok(lane) => {
                    for call in rest.iter().take_while(|c| c.stream() == stream) {
                        match self.run_item(call, bytes) {
                            Some(item) => ready.push(item),
                            None => break,
                        }
                    }
                    if !ready.is_empty() {
                        self.run_items(&lane, &ready, bytes);
                    }
                    ready.len()
                }
                Err(_) => 0,
            };
            if taken == 0 {
                // Served alone, which keeps its error for the context's next synchronizing
                // call as for any posted call (so the result is not needed here).
                out.clear();
                let (req, tail) = first.request(bytes);
                let _ = self.handle(&req, tail, out, false);
            }
            rest = &rest[taken.max(1)..];
        }
        self.run_ready = ready;
    }

    /// What a posted call of a run does, checked as [`Session::dispatch`] checks it; `None`
    /// when it is refused or is not to run inline.
    fn run_item(&self, call: &PostedCall, bytes: &[u8]) -> Option<RunItem> {
        match call {
            PostedCall::Memset(m) => self
                .memset_job(m)
                .ok()
                .filter(Job::quick)
                .map(|_| RunItem::Fill(m.clone())),
            PostedCall::MemcpyHtoD(m, data) => {
                let len = bytes.get(data.clone())?.len() as u64;
                self.allocs.check(m.dst, len, "copy destination").ok()?;
                self.tenant
                    .stats
                    .bytes_htod
                    .fetch_add(len, Ordering::Relaxed);
                Some(RunItem::Write {
                    dst: m.dst,
                    data: data.clone(),
                })
            }
        }
    }

    /// Runs the checked `items` of lane `lane` inline together, or queues them one by one when
    /// the lane is busy.
    fn run_items(&mut self, lane: &LaneSpec, items: &[RunItem], bytes: &[u8]) {
        let ran = self
            .engine
            .try_inline_run(lane, items.len(), |i, dev| items[i].run(dev, bytes));
        if ran.is_none() {
            for item in items {
                self.engine.submit(lane, item.job(bytes));
            }
        }
    }

    /// The job of a `Memset` whose element size, length, alignment and destination are valid.
    ///
    /// Always inlined: a call to it cost every posted `Memset` 34 more instructions (its result
    /// returned through memory), 3 % of the direct call.
    #[inline(always)]
    fn memset_job(&self, m: &msg::Memset) -> Result<Job, CuError> {
        let bytes = memset_bytes(m)?;
        if !m.dst.is_multiple_of(u64::from(m.elem_size)) {
            return Err(CuError::invalid_value(format!(
                "memset destination {:#x} is not aligned to {} bytes",
                m.dst, m.elem_size
            )));
        }
        self.allocs.check(m.dst, bytes, "memset destination")?;
        Ok(Job::Memset {
            dst: m.dst,
            value: m.value,
            elem_size: m.elem_size,
            count: m.count,
        })
    }

    /// `MemcpyHtoD` straight from the client's bytes; see [`Session::handle_bulk`].
    fn htod_from(
        &mut self,
        m: &msg::MemcpyHtoD,
        inline: &[u8],
        data: &dyn BulkSource,
        out: &mut Vec<u8>,
        busy: WhenBusy,
    ) -> Result<(), CuError> {
        let lane = self.lane(m.ctx, m.stream)?;
        let ctx = lane.ctx;
        let len = inline.len() as u64 + data.len();
        self.allocs.check(m.dst, len, "copy destination")?;
        self.tenant
            .stats
            .bytes_htod
            .fetch_add(len, Ordering::Relaxed);
        let mut failed = None;
        let seq = loop {
            let copy = |d: &dyn DeviceContext| {
                if let Err(e) = write_gathered(d, m.dst, inline, data) {
                    failed = Some(e);
                }
                Ok(())
            };
            if let Some(seq) = self.engine.try_inline(&lane, copy) {
                break seq;
            }
            if self.engine.poisoned(ctx).is_some() {
                // Runs nothing: the context's sticky error is recorded for this copy.
                break self.engine.submit(
                    &lane,
                    Job::Write {
                        dst: m.dst,
                        data: Vec::new(),
                    },
                );
            }
            if busy == WhenBusy::Queue {
                let bytes = gather(inline, data)?;
                break self.engine.submit(
                    &lane,
                    Job::Write {
                        dst: m.dst,
                        data: bytes,
                    },
                );
            }
            // The bytes stay the client's only until this request returns: run after the
            // stream's earlier work, like a copy from pageable memory.
            self.engine.wait_lane(&lane)?;
        };
        let _ = seq;
        if let Some(e) = failed {
            return Err(e);
        }
        reply(out, msg::Empty {})
    }

    /// `MemcpyDtoH` straight into the client's bytes; see [`Session::handle_bulk`].
    fn dtoh_into(
        &mut self,
        m: &msg::MemcpyDtoH,
        sink: &mut dyn BulkSink,
        out: &mut Vec<u8>,
    ) -> Result<(), CuError> {
        if m.len > sink.capacity() {
            return Err(CuError::invalid_value(format!(
                "the copy is {} bytes but the destination holds {}",
                m.len,
                sink.capacity()
            )));
        }
        let mut source = self.dtoh_source(m)?;
        sink.write(m.len, &mut |segs| source.read(segs))?;
        reply(out, msg::Empty {})
    }

    /// The checks and waits of a `MemcpyDtoH` (its size, its source, its stream's earlier work
    /// and errors), counted in the tenant's statistics: what is left is reading `m.len` bytes
    /// from the returned source.
    fn dtoh_source(&mut self, m: &msg::MemcpyDtoH) -> Result<DeviceSource, CuError> {
        let lane = self.lane(m.ctx, m.stream)?;
        let ctx = lane.ctx;
        if m.len as usize > MAX_BULK_CHUNK {
            return Err(CuError::invalid_value(format!(
                "one device-to-host request carries at most {MAX_BULK_CHUNK} bytes"
            )));
        }
        self.allocs.check(m.src, m.len, "copy source")?;
        // A synchronous copy waits for its stream's earlier work and reports its errors.
        self.engine.wait_lane(&lane)?;
        self.surface_async_error(ctx)?;
        self.tenant
            .stats
            .bytes_dtoh
            .fetch_add(m.len, Ordering::Relaxed);
        Ok(DeviceSource {
            dev: Arc::clone(&self.dev),
            next: m.src,
            end: m.src + m.len,
        })
    }

    /// Runs a `MemcpyDtoH` but for reading its bytes, for a transport that has them read straight
    /// into its own buffer as it sends them ([`crate::session_loop`] on vgpud's vsock rings: the
    /// guest's rx buffers). Like [`Session::handle`], a failure is the call's error (and counted);
    /// on success the reply is an empty struct followed by the `m.len` bytes the returned source
    /// reads.
    pub fn dtoh_lent(&mut self, req: &Request) -> Result<DeviceSource, CuError> {
        let mut source = None;
        let r = match req {
            Request::MemcpyDtoH(m) => self.dtoh_source(m).map(|s| source = Some(s)),
            _ => Err(CuError::invalid_value(format!(
                "{} is not a device-to-host copy",
                req.name()
            ))),
        };
        self.complete_call(req, r, true)?;
        source.ok_or_else(|| CuError::invalid_value("the copy has no source"))
    }

    /// `MemcpyHtoDShared` / `MemcpyDtoHShared`: one copy between a shared region
    /// (`(region, offset, len)`) and device memory at `dev`, checked like any copy. It is queued
    /// on its stream holding the region (so an unshare cannot pull the mapping from under it)
    /// and no bytes (so it is not charged to `queued_bytes`: the data stays in the guest's
    /// memory). Sent synchronously to an idle stream it runs at once on the session thread,
    /// whatever its size: the client waits for it anyway, and a hand-off to a worker would
    /// only add a wake-up.
    /// A `MemcpyHtoDShared` or `MemcpyDtoHShared` request (`inline`: run now, on this thread).
    fn shared_request(
        &mut self,
        req: &Request,
        inline: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), CuError> {
        let (ctx, stream, range, dir, dev) = match req {
            Request::MemcpyHtoDShared(m) => (
                m.ctx,
                m.stream,
                (m.region, m.offset, m.len),
                Direction::ToDevice,
                m.dst,
            ),
            Request::MemcpyDtoHShared(m) => (
                m.ctx,
                m.stream,
                (m.region, m.offset, m.len),
                Direction::ToHost,
                m.src,
            ),
            _ => return Err(CuError::invalid_value("not a shared-memory copy")),
        };
        self.shared_copy(ctx, stream, range, dir, dev, inline)?;
        reply(out, msg::Empty {})
    }

    fn shared_copy(
        &mut self,
        ctx: u64,
        stream: u64,
        (region, offset, len): (u64, u64, u64),
        dir: Direction,
        dev: u64,
        sync: bool,
    ) -> Result<(), CuError> {
        let lane = self.lane(ctx, stream)?;
        let what = match dir {
            Direction::ToDevice => "copy destination",
            Direction::ToHost => "copy source",
        };
        self.allocs.check(dev, len, what)?;
        let region = self.shares.get(region, offset, len)?;
        let counter = match dir {
            Direction::ToDevice => &self.tenant.stats.bytes_htod,
            Direction::ToHost => &self.tenant.stats.bytes_dtoh,
        };
        counter.fetch_add(len, Ordering::Relaxed);
        if len == 0 {
            return Ok(());
        }
        let copy = SharedCopy {
            region,
            dir,
            dev,
            offset,
            len,
        };
        if sync {
            let mut failed = None;
            let ran = self.engine.try_inline(&lane, |d| {
                let r = match copy.dir {
                    Direction::ToDevice => copy.region.copy_in(d, copy.dev, copy.offset, copy.len),
                    Direction::ToHost => copy.region.copy_out(d, copy.dev, copy.offset, copy.len),
                };
                failed = r.err();
                Ok(())
            });
            if ran.is_some() {
                return failed.map_or(Ok(()), Err);
            }
        }
        self.engine.submit(&lane, Job::Other(Box::new(copy)));
        Ok(())
    }

    fn dispatch(&mut self, req: &Request, tail: &[u8], out: &mut Vec<u8>) -> Result<(), CuError> {
        use Request as R;
        match req {
            R::Hello(_) => Err(CuError::invalid_value("the session is already open")),
            R::Goodbye(_) | R::Ping(_) => reply(out, msg::Empty {}),
            R::SetFeatures(m) => {
                let features = m.features & msg::FEATURES;
                if features & msg::FEATURE_DEVICE_OUTPUT != 0 {
                    self.output.enable();
                }
                reply(out, msg::FeatureSet { features })
            }
            R::TakeOutput(m) => {
                // A reply never exceeds what one frame carries.
                let max = (m.max_bytes as usize).min(MAX_BULK_CHUNK);
                let (stdout, stderr, more) = self.output.take(max);
                reply(
                    out,
                    msg::DeviceOutput {
                        stdout,
                        stderr,
                        more: u32::from(more),
                    },
                )
            }
            R::CtxSetLimit(m) => {
                self.ctx(m.ctx)?;
                match m.limit {
                    cuda::limit::PRINTF_FIFO_SIZE => self.output.set_fifo_size(m.value)?,
                    cuda::limit::MALLOC_HEAP_SIZE => self.set_heap_size(m.value)?,
                    cuda::limit::DEV_RUNTIME_PENDING_LAUNCH_COUNT => {
                        self.set_pending_launches(m.value)?
                    }
                    cuda::limit::DEV_RUNTIME_SYNC_DEPTH => self.set_sync_depth(m.value)?,
                    _ => return Err(devio::unsupported_limit(m.limit)),
                }
                self.device_runtime.limits = None;
                reply(out, msg::Empty {})
            }
            R::DeviceGetCount(_) => reply(out, msg::Count { count: 1 }),
            R::DeviceGetProperties(m) => {
                self.check_device(m.device)?;
                reply(
                    out,
                    msg::DeviceProperties {
                        name: self.device.name.clone(),
                        uuid: self.device.uuid,
                        total_mem: self.tenant.slice.limit(),
                        attributes: guest_attributes(&self.device.attributes),
                    },
                )
            }
            R::DeviceTotalMem(m) => {
                self.check_device(m.device)?;
                reply(
                    out,
                    msg::Bytes {
                        bytes: self.tenant.slice.limit(),
                    },
                )
            }

            R::CtxCreate(m) => {
                self.check_device(m.device)?;
                let h = self.new_context(false)?;
                self.note_contexts();
                reply(out, msg::Handle { handle: h })
            }
            R::GreenCtxCreate(m) => {
                self.check_device(m.device)?;
                self.check_sms(m.sm_count, cuda::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION)?;
                // A green context holds the primary context, whose memory it shares.
                self.retain_primary()?;
                let h = match self.contexts.insert(CtxState {
                    primary: false,
                    sms: Some(m.sm_count),
                    green: true,
                }) {
                    Ok(h) => h,
                    Err(e) => {
                        self.release_primary();
                        return Err(e);
                    }
                };
                self.greens += 1;
                self.note_contexts();
                reply(out, msg::Handle { handle: h })
            }
            R::CtxCreateAffinity(m) => {
                self.check_device(m.device)?;
                self.check_sms(m.sm_count, cuda::CUDA_ERROR_INVALID_VALUE)?;
                let h = self.contexts.insert(CtxState {
                    primary: false,
                    sms: Some(m.sm_count),
                    green: false,
                })?;
                self.greens += 1;
                self.note_contexts();
                reply(out, msg::Handle { handle: h })
            }
            R::CtxDestroy(m) => {
                self.destroyable(m.ctx)?;
                let (green, limited) = self
                    .contexts
                    .get(m.ctx)
                    .map_or((false, false), |c| (c.green, c.sms.is_some()));
                if green && let Some(primary) = self.primary.handle {
                    // Its memory is the primary context's (as CUDA's green contexts share it).
                    self.allocs.move_context(m.ctx, primary);
                }
                self.release_context_resources(m.ctx);
                self.contexts.remove(m.ctx);
                self.engine.clear_context(m.ctx);
                if limited {
                    self.greens -= 1;
                }
                if green {
                    self.release_primary();
                }
                self.note_contexts();
                reply(out, msg::Empty {})
            }
            R::CtxSynchronize(m) => {
                self.ctx(m.ctx)?;
                self.engine.wait_ctx(m.ctx)?;
                self.pools_after_sync();
                self.surface_async_error(m.ctx)?;
                reply(out, msg::Empty {})
            }
            R::PrimaryCtxRetain(m) => {
                self.check_device(m.device)?;
                let h = self.retain_primary()?;
                self.note_contexts();
                reply(out, msg::Handle { handle: h })
            }
            R::PrimaryCtxRelease(m) => {
                self.check_device(m.device)?;
                if self.primary.refs == 0 {
                    return Err(CuError::invalid_context(
                        "the primary context is not retained",
                    ));
                }
                self.release_primary();
                self.note_contexts();
                reply(out, msg::Empty {})
            }
            R::PrimaryCtxReset(m) => {
                self.check_device(m.device)?;
                self.reset_primary();
                reply(out, msg::Empty {})
            }
            R::PrimaryCtxGetState(m) => {
                self.check_device(m.device)?;
                reply(
                    out,
                    msg::PrimaryState {
                        flags: self.primary.flags,
                        active: u32::from(self.primary.refs > 0),
                    },
                )
            }
            R::PrimaryCtxSetFlags(m) => {
                self.check_device(m.device)?;
                self.primary.flags = m.flags;
                reply(out, msg::Empty {})
            }

            R::MemAlloc(m) => {
                self.ctx(m.ctx)?;
                let ptr = self.allocate(m.ctx, m.size)?;
                reply(out, msg::Ptr { ptr })
            }
            R::MemAllocPitch(m) => {
                self.ctx(m.ctx)?;
                if !matches!(m.elem_size, 4 | 8 | 16) || m.width == 0 || m.height == 0 {
                    return Err(CuError::invalid_value(
                        "cuMemAllocPitch needs width and height > 0 and an element size of 4, 8 or 16",
                    ));
                }
                let pitch = round_up(m.width, PITCH_ALIGNMENT)
                    .ok_or_else(|| CuError::invalid_value("width is too large"))?;
                let size = pitch
                    .checked_mul(m.height)
                    .ok_or_else(|| CuError::out_of_memory("pitched allocation size overflows"))?;
                let ptr = self.allocate(m.ctx, size)?;
                reply(out, msg::Pitched { ptr, pitch })
            }
            R::MemFree(m) => {
                self.ctx(m.ctx)?;
                if m.ptr == 0 {
                    return reply(out, msg::Empty {});
                }
                if let Some(r) = self.free_pool_block(m.ptr) {
                    r?;
                    return reply(out, msg::Empty {});
                }
                match self.allocs.find(m.ptr) {
                    Some((base, a))
                        if base == m.ptr
                            && matches!(
                                a.kind,
                                AllocKind::Device | AllocKind::Managed | AllocKind::MappedHost
                            ) => {}
                    Some((base, _)) if base != m.ptr => {
                        return Err(CuError::invalid_value(format!(
                            "{:#x} is inside the allocation at {base:#x}, not its start: pass the pointer cuMemAlloc returned",
                            m.ptr
                        )));
                    }
                    Some((_, a)) if a.kind == AllocKind::IpcImport => {
                        return Err(CuError::invalid_value(
                            "memory opened with cuIpcOpenMemHandle is closed with cuIpcCloseMemHandle, not freed",
                        ));
                    }
                    Some(_) => {
                        return Err(CuError::invalid_value(
                            "module globals are freed by unloading their module",
                        ));
                    }
                    None => {
                        return Err(CuError::invalid_value(format!(
                            "{:#x} is not a live allocation of this process",
                            m.ptr
                        )));
                    }
                }
                // cuMemFree synchronizes: pending work may still use the memory.
                self.engine.drain()?;
                self.free_allocation(m.ptr);
                reply(out, msg::Empty {})
            }
            R::MemGetInfo(m) => {
                self.ctx(m.ctx)?;
                let (free, total) = self.tenant.slice.info();
                reply(out, msg::MemInfo { free, total })
            }
            R::MemGetAddressRange(m) => {
                self.ctx(m.ctx)?;
                let (base, a) = self.allocs.find(m.ptr).ok_or_else(|| {
                    CuError::new(
                        cuda::CUDA_ERROR_NOT_FOUND,
                        format!("{:#x} is not inside an allocation of this process", m.ptr),
                    )
                })?;
                reply(out, msg::Range { base, size: a.size })
            }
            R::MemcpyHtoD(m) => {
                let lane = self.lane(m.ctx, m.stream)?;
                let len = tail.len() as u64;
                self.allocs.check(m.dst, len, "copy destination")?;
                self.tenant
                    .stats
                    .bytes_htod
                    .fetch_add(len, Ordering::Relaxed);
                if self
                    .engine
                    .try_inline(&lane, |d| d.write(m.dst, tail))
                    .is_none()
                {
                    self.engine.submit(
                        &lane,
                        Job::Write {
                            dst: m.dst,
                            data: tail.to_vec(),
                        },
                    );
                }
                reply(out, msg::Empty {})
            }
            R::MemcpyDtoH(m) => {
                let lane = self.lane(m.ctx, m.stream)?;
                let ctx = lane.ctx;
                if m.len as usize > MAX_BULK_CHUNK {
                    return Err(CuError::invalid_value(format!(
                        "one device-to-host request carries at most {MAX_BULK_CHUNK} bytes"
                    )));
                }
                self.allocs.check(m.src, m.len, "copy source")?;
                // A synchronous copy waits for its stream's earlier work and reports its errors.
                self.engine.wait_lane(&lane)?;
                self.surface_async_error(ctx)?;
                msg::Empty {}.encode(out);
                let start = out.len();
                out.resize(start + m.len as usize, 0);
                self.dev
                    .read(m.src, &mut out[start..])
                    .map_err(CuError::from)?;
                self.tenant
                    .stats
                    .bytes_dtoh
                    .fetch_add(m.len, Ordering::Relaxed);
                Ok(())
            }
            R::MemcpyDtoHDelta(m) => {
                let lane = self.lane(m.ctx, m.stream)?;
                let ctx = lane.ctx;
                if m.len as usize > MAX_BULK_CHUNK {
                    return Err(CuError::invalid_value(format!(
                        "one device-to-host request carries at most {MAX_BULK_CHUNK} bytes"
                    )));
                }
                let pages = pagehash::pages(m.len as usize);
                if tail.len() != pages * 8 {
                    return Err(CuError::invalid_value(format!(
                        "a delta copy of {} bytes takes {pages} page hashes, got {} bytes of them",
                        m.len,
                        tail.len()
                    )));
                }
                self.allocs.check(m.src, m.len, "copy source")?;
                self.engine.wait_lane(&lane)?;
                self.surface_async_error(ctx)?;
                let mut now = vec![0u8; m.len as usize];
                self.dev.read(m.src, &mut now).map_err(CuError::from)?;
                msg::Empty {}.encode(out);
                let bitmap_at = out.len();
                out.resize(bitmap_at + pages.div_ceil(8), 0);
                let mut sent = 0u64;
                for (i, (page, theirs)) in now
                    .chunks(pagehash::DELTA_PAGE)
                    .zip(tail.chunks_exact(8))
                    .enumerate()
                {
                    let theirs = u64::from_le_bytes(theirs.try_into().unwrap_or([0; 8]));
                    if pagehash::page_hash(page) != theirs {
                        out[bitmap_at + i / 8] |= 1 << (i % 8);
                        out.extend_from_slice(page);
                        sent += page.len() as u64;
                    }
                }
                self.tenant
                    .stats
                    .bytes_dtoh
                    .fetch_add(sent, Ordering::Relaxed);
                Ok(())
            }
            R::HostShare(m) => {
                let handle = self.shares.share(m.size)?;
                reply(out, msg::Handle { handle })
            }
            R::HostUnshare(m) => {
                self.shares.unshare(m.region)?;
                reply(out, msg::Empty {})
            }
            R::MemcpyHtoDShared(_) | R::MemcpyDtoHShared(_) => self.shared_request(req, false, out),
            R::Doorbell(m) => {
                let Some(slot) = &self.bell else {
                    return Err(CuError::new(
                        cuda::CUDA_ERROR_NOT_SUPPORTED,
                        "this transport has no doorbell page",
                    ));
                };
                slot.set(self.shares.get(m.region, 0, 0)?)?;
                reply(out, msg::Empty {})
            }
            // Its work is to have woken the session thread.
            R::Ring(_) => reply(out, msg::Empty {}),
            R::MemcpyDtoD(m) => {
                let lane = self.lane(m.ctx, m.stream)?;
                self.allocs.check(m.src, m.len, "copy source")?;
                self.allocs.check(m.dst, m.len, "copy destination")?;
                self.engine.submit(
                    &lane,
                    Job::Copy {
                        dst: m.dst,
                        src: m.src,
                        len: m.len,
                    },
                );
                reply(out, msg::Empty {})
            }
            R::Memset(m) => {
                let lane = self.lane(m.ctx, m.stream)?;
                let job = self.memset_job(m)?;
                self.engine.submit(&lane, job);
                reply(out, msg::Empty {})
            }
            R::StreamMemOp(m) => {
                self.stream_mem_op(m)?;
                reply(out, msg::Empty {})
            }

            R::StreamCreate(m) => {
                self.ctx(m.ctx)?;
                if m.flags & !STREAM_NON_BLOCKING != 0 {
                    return Err(CuError::invalid_value(format!(
                        "unknown stream flags {:#x}",
                        m.flags
                    )));
                }
                let h = self.streams.insert(StreamState {
                    ctx: m.ctx,
                    flags: m.flags,
                    priority: m.priority.clamp(GREATEST_STREAM_PRIORITY, 0),
                })?;
                reply(out, msg::Handle { handle: h })
            }
            R::StreamDestroy(m) => {
                self.stream_ctx(m.ctx, m.stream)?;
                if self.streams.remove(m.stream).is_none() {
                    return Err(CuError::invalid_handle(
                        "the default stream cannot be destroyed",
                    ));
                }
                // Its pending work still completes; the lane goes once idle.
                self.engine.forget_lane(LaneKey::Stream(m.stream));
                reply(out, msg::Empty {})
            }
            R::StreamSynchronize(m) => {
                let lane = self.lane(m.ctx, m.stream)?;
                self.engine.wait_lane(&lane)?;
                self.pools_after_sync();
                self.surface_async_error(lane.ctx)?;
                reply(out, msg::Empty {})
            }
            R::SyncBegin(m) => {
                let (until, ctx) = match self.sync_point(m.ctx, m.kind, m.handle)? {
                    SyncPoint::Work(until, ctx) => (until, ctx),
                    SyncPoint::IpcEvent(shared) => {
                        self.ipc_event_synchronize(&shared)?;
                        return reply(out, msg::Value { value: SYNC_DONE });
                    }
                };
                if m.kind == msg::SYNC_DESTROY
                    && let Some(w) = &self.mem_waits
                {
                    // As the destroy that follows: nothing settles while a word nobody writes
                    // holds one of the context's lanes.
                    w.end_context(m.ctx);
                }
                let in_place = Duration::from_micros(u64::from(m.wait_us)).min(SYNC_IN_PLACE_MAX);
                if !self.engine.reach(&until, Some(in_place))? {
                    let ticket = self.tenant.sync_tickets.register(
                        self.info.id,
                        m.token_hi,
                        m.token_lo,
                        until.clone(),
                    )?;
                    if ticket {
                        return reply(
                            out,
                            msg::Value {
                                value: SYNC_PENDING,
                            },
                        );
                    }
                    // The VM's tickets are all taken: wait here, as a plain call does.
                    self.engine.reach(&until, None)?;
                }
                if let Some(ctx) = ctx {
                    self.pools_after_sync();
                    self.surface_async_error(ctx)?;
                }
                let value = if self.engine.idle() {
                    SYNC_IDLE
                } else {
                    SYNC_DONE
                };
                reply(out, msg::Value { value })
            }
            R::SyncWait(m) => {
                let state = self.tenant.sync_tickets.wait(
                    m.token_hi,
                    m.token_lo,
                    Duration::from_millis(u64::from(m.timeout_ms)),
                )?;
                reply(out, msg::Value { value: state })
            }
            R::SyncFinish(m) => {
                if let SyncPoint::Work(_, Some(ctx)) = self.sync_point(m.ctx, m.kind, m.handle)? {
                    self.pools_after_sync();
                    self.surface_async_error(ctx)?;
                }
                reply(out, msg::Empty {})
            }
            R::StreamQuery(m) => {
                let lane = self.lane(m.ctx, m.stream)?;
                if !self.engine.lane_idle(&lane) {
                    return Err(CuError::not_ready());
                }
                self.surface_async_error(lane.ctx)?;
                reply(out, msg::Empty {})
            }
            R::StreamWaitEvent(m) => {
                let lane = self.lane(m.ctx, m.stream)?;
                let ev = self.event(m.event)?;
                if let Some(shared) = alloc_ext::ipc::event::recorded_elsewhere(ev) {
                    self.ipc_event_stream_wait(&lane, &shared)?;
                    return reply(out, msg::Empty {});
                }
                let rec = ev.clock.get();
                // Later work of the stream waits for the record current now (none: no wait).
                self.engine.wait_for(&lane, rec.seq);
                reply(out, msg::Empty {})
            }
            R::StreamHostFunc(m) => {
                let lane = self.lane(m.ctx, m.stream)?;
                let gate = Arc::new(Gate::default());
                self.tenant.host_gates.register(
                    self.info.id,
                    m.token_hi,
                    m.token_lo,
                    Arc::clone(&gate),
                )?;
                self.engine.submit(&lane, Job::Gate(gate));
                reply(out, msg::Empty {})
            }
            R::HostFuncWait(m) => {
                let state = self.tenant.host_gates.wait(
                    self.info.id,
                    m.token_hi,
                    m.token_lo,
                    Duration::from_millis(u64::from(m.timeout_ms.min(HOST_FUNC_MAX_WAIT_MS))),
                )?;
                reply(out, msg::Value { value: state })
            }
            R::HostFuncDone(m) => {
                self.tenant.host_gates.open(m.token_hi, m.token_lo)?;
                reply(out, msg::Empty {})
            }
            R::StreamHostCopy(m) => {
                let lane = self.lane(m.ctx, m.stream)?;
                if m.len == 0 || m.len as usize > MAX_BULK_CHUNK {
                    return Err(CuError::invalid_value(format!(
                        "one host copy gate carries 1 to {MAX_BULK_CHUNK} bytes, not {}",
                        m.len
                    )));
                }
                let to_device = match m.to_device {
                    0 => false,
                    1 => true,
                    other => {
                        return Err(CuError::invalid_value(format!(
                            "to_device is 0 or 1, not {other}"
                        )));
                    }
                };
                let what = if to_device {
                    "copy destination"
                } else {
                    "copy source"
                };
                self.allocs.check(m.dev, m.len, what)?;
                let gate = Arc::new(Gate::default());
                self.tenant.host_gates.register_copy(
                    self.info.id,
                    m.token_hi,
                    m.token_lo,
                    Arc::clone(&gate),
                    Some(HostCopy {
                        dev: Arc::clone(&self.dev),
                        addr: m.dev,
                        len: m.len as usize,
                        to_device,
                    }),
                )?;
                let counter = if to_device {
                    &self.tenant.stats.bytes_htod
                } else {
                    &self.tenant.stats.bytes_dtoh
                };
                counter.fetch_add(m.len, Ordering::Relaxed);
                self.engine.submit(&lane, Job::Gate(gate));
                reply(out, msg::Empty {})
            }
            R::HostFuncWaitRead(m) => {
                let mut bytes = Vec::new();
                let state = self.tenant.host_gates.wait_read(
                    self.info.id,
                    m.token_hi,
                    m.token_lo,
                    Duration::from_millis(u64::from(m.timeout_ms.min(HOST_FUNC_MAX_WAIT_MS))),
                    &mut bytes,
                )?;
                msg::Value { value: state }.encode(out);
                out.extend_from_slice(&bytes);
                Ok(())
            }
            R::HostFuncDoneWrite(m) => {
                self.tenant
                    .host_gates
                    .open_write(m.token_hi, m.token_lo, tail)?;
                reply(out, msg::Empty {})
            }

            R::EventCreate(m) => {
                self.ctx(m.ctx)?;
                let known = EVENT_BLOCKING_SYNC | EVENT_DISABLE_TIMING | EVENT_INTERPROCESS;
                if m.flags & !known != 0 {
                    return Err(CuError::invalid_value(format!(
                        "unknown event flags {:#x}",
                        m.flags
                    )));
                }
                if m.flags & EVENT_INTERPROCESS != 0 && m.flags & EVENT_DISABLE_TIMING == 0 {
                    return Err(CuError::invalid_value(
                        "CU_EVENT_INTERPROCESS requires CU_EVENT_DISABLE_TIMING",
                    ));
                }
                let h = self.events.insert(EventState {
                    ctx: m.ctx,
                    flags: m.flags,
                    clock: Arc::new(EventClock::default()),
                    ipc: None,
                })?;
                reply(out, msg::Handle { handle: h })
            }
            R::EventDestroy(m) => {
                let ev = self
                    .events
                    .remove(m.event)
                    .ok_or_else(|| CuError::invalid_handle("not an event of this process"))?;
                self.ipc_event_gone(ev.ipc);
                reply(out, msg::Empty {})
            }
            R::EventRecord(m) => {
                let lane = self.lane(m.ctx, m.stream)?;
                let ev = self.event(m.event)?;
                // An interprocess event (exported or opened) tells the shared event of its
                // record through its clock: the latest record of every process's event.
                let clock = Arc::clone(&ev.clock);
                self.engine.record(&lane, &clock);
                reply(out, msg::Empty {})
            }
            R::EventQuery(m) => {
                let ev = self.event(m.event)?;
                if let Some(shared) = alloc_ext::ipc::event::recorded_elsewhere(ev) {
                    Self::ipc_event_query(&shared)?;
                    return reply(out, msg::Empty {});
                }
                let (rec, ctx) = (ev.clock.get(), ev.ctx);
                if !self.engine.is_done(rec.seq) {
                    return Err(CuError::not_ready());
                }
                self.surface_async_error(ctx)?;
                reply(out, msg::Empty {})
            }
            R::EventSynchronize(m) => {
                let ev = self.event(m.event)?;
                if let Some(shared) = alloc_ext::ipc::event::recorded_elsewhere(ev) {
                    self.ipc_event_synchronize(&shared)?;
                    return reply(out, msg::Empty {});
                }
                let (rec, ctx) = (ev.clock.get(), ev.ctx);
                self.engine.wait_job(rec.seq)?;
                self.pools_after_sync();
                self.surface_async_error(ctx)?;
                reply(out, msg::Empty {})
            }
            R::CtxRecordEvent(m) => {
                self.ctx(m.ctx)?;
                let ev = self.event(m.event)?;
                if self.family(ev.ctx) != self.family(m.ctx) {
                    return Err(CuError::invalid_handle(
                        "cuCtxRecordEvent: the event is not of that context (or, for a green context, of its primary context)",
                    ));
                }
                if ev.ipc.is_some() {
                    return Err(CuError::new(
                        cuda::CUDA_ERROR_NOT_SUPPORTED,
                        "an interprocess event cannot record a context's work",
                    ));
                }
                let clock = Arc::clone(&ev.clock);
                self.engine.record_ctx(m.ctx, &clock);
                reply(out, msg::Empty {})
            }
            R::CtxWaitEvent(m) => {
                self.ctx(m.ctx)?;
                let ev = self.event(m.event)?;
                if alloc_ext::ipc::event::recorded_elsewhere(ev).is_some() {
                    return Err(CuError::new(
                        cuda::CUDA_ERROR_NOT_SUPPORTED,
                        "a context cannot wait for an event another process recorded",
                    ));
                }
                let rec = ev.clock.get();
                self.engine.ctx_wait_for(m.ctx, rec.seq);
                reply(out, msg::Empty {})
            }
            R::EventElapsedTime(m) => {
                let (s, e) = (self.event(m.start)?, self.event(m.end)?);
                if (s.flags | e.flags) & EVENT_DISABLE_TIMING != 0 {
                    return Err(CuError::invalid_handle(
                        "an event created with CU_EVENT_DISABLE_TIMING has no timestamp",
                    ));
                }
                let (rs, re) = (s.clock.get(), e.clock.get());
                if rs.seq == 0 || re.seq == 0 {
                    return Err(CuError::invalid_handle(
                        "both events must have been recorded",
                    ));
                }
                match (rs.time, re.time) {
                    (Some(ts), Some(te)) => {
                        let ms = if te >= ts {
                            (te - ts).as_secs_f64() * 1e3
                        } else {
                            -((ts - te).as_secs_f64() * 1e3)
                        };
                        reply(out, msg::Elapsed { ms: ms as f32 })
                    }
                    _ => Err(CuError::not_ready()),
                }
            }

            R::ModuleLoad(m) => {
                self.ctx(m.ctx)?;
                let h = self.load_module(m.ctx, tail)?;
                reply(out, msg::Handle { handle: h })
            }
            R::ModuleLoadPart(m) => {
                self.ctx(m.ctx)?;
                let h = self.load_module_part(m, tail)?;
                reply(
                    out,
                    msg::Handle {
                        handle: h.unwrap_or(0),
                    },
                )
            }
            R::ModuleUnload(m) => {
                self.ctx(m.ctx)?;
                if self.modules.get(m.module).is_none() {
                    return Err(CuError::invalid_handle("not a module of this process"));
                }
                self.unload_module(m.module);
                reply(out, msg::Empty {})
            }
            R::ModuleGetFunction(m) => {
                self.ctx(m.ctx)?;
                let h = self.get_function(m.module, &m.name)?;
                let f = self.functions.get(h).expect("function just looked up");
                let mut attributes = f.desc.attributes.clone();
                attributes.resize(func_attr::VGPU_NO_BINARY, 0);
                attributes.push(i32::from(!f.desc.runnable));
                reply(
                    out,
                    msg::Function {
                        function: h,
                        param_offsets: f.desc.param_offsets.clone(),
                        param_sizes: f.desc.param_sizes.clone(),
                        attributes,
                    },
                )
            }
            R::ModuleFunctionNames(m) => {
                self.ctx(m.ctx)?;
                let st = self
                    .modules
                    .get(m.module)
                    .ok_or_else(|| CuError::invalid_handle("not a module of this process"))?;
                let mut names = String::new();
                for k in st.module.kernels() {
                    names.push_str(&k.name);
                    names.push('\0');
                }
                reply(out, msg::Names { names })
            }
            R::ModuleGetGlobal(m) => {
                let g = self.module_global(m.ctx, m.module, &m.name)?;
                if g.reference.is_some() {
                    return Err(CuError::new(
                        cuda::CUDA_ERROR_NOT_FOUND,
                        format!(
                            "{} is a texture or surface reference, not a variable",
                            m.name
                        ),
                    ));
                }
                reply(
                    out,
                    msg::Range {
                        base: g.addr,
                        size: g.size,
                    },
                )
            }
            R::ModuleGetGlobalInfo(m) => {
                let g = self.module_global(m.ctx, m.module, &m.name)?;
                let flags = match (g.managed, g.reference) {
                    (true, _) => msg::GLOBAL_MANAGED,
                    (false, Some(ReferenceKind::Texture)) => msg::GLOBAL_TEXREF,
                    (false, Some(ReferenceKind::Surface)) => msg::GLOBAL_SURFREF,
                    (false, None) => 0,
                };
                reply(
                    out,
                    msg::GlobalInfo {
                        base: g.addr,
                        size: g.size,
                        flags,
                    },
                )
            }
            R::LaunchKernel(m) => {
                let lane = self.lane(m.ctx, m.stream)?;
                self.launch(&lane, m, tail, false, None)?;
                reply(out, msg::Empty {})
            }
            R::LaunchCooperative(c) => {
                let lane = self.lane(c.ctx, c.stream)?;
                self.launch(&lane, &c.launch(), tail, true, None)?;
                reply(out, msg::Empty {})
            }
            R::LaunchKernelPriority(p) => {
                let lane = self.lane(p.ctx, p.stream)?;
                let cooperative = match p.cooperative {
                    0 => false,
                    1 => true,
                    v => {
                        return Err(CuError::invalid_value(format!(
                            "cooperative must be 0 or 1, not {v}"
                        )));
                    }
                };
                let priority = p.priority.clamp(GREATEST_STREAM_PRIORITY, 0);
                self.launch(&lane, &p.launch(), tail, cooperative, Some(priority))?;
                reply(out, msg::Empty {})
            }
            R::FuncGetAttribute(m) => {
                self.ctx(m.ctx)?;
                let f = self.function(m.function)?;
                let v = usize::try_from(m.attribute)
                    .ok()
                    .and_then(|a| f.desc.attributes.get(a).copied())
                    .ok_or_else(|| {
                        CuError::invalid_value(format!(
                            "unknown function attribute {}",
                            m.attribute
                        ))
                    })?;
                reply(out, msg::Value { value: v })
            }
            R::FuncSetAttribute(m) => {
                self.ctx(m.ctx)?;
                let optin = self
                    .device
                    .attribute(attr::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
                let f = self
                    .functions
                    .get_mut(m.function)
                    .ok_or_else(|| CuError::invalid_handle("not a function of this process"))?;
                let static_shared = f.desc.attributes[func_attr::SHARED_SIZE_BYTES];
                match usize::try_from(m.attribute) {
                    Ok(func_attr::MAX_DYNAMIC_SHARED_SIZE_BYTES) => {
                        if m.value < 0 || m.value.saturating_add(static_shared) > optin {
                            return Err(CuError::invalid_value(format!(
                                "dynamic shared memory of {} bytes plus {static_shared} static exceeds the device's {optin}",
                                m.value
                            )));
                        }
                        f.desc.attributes[func_attr::MAX_DYNAMIC_SHARED_SIZE_BYTES] = m.value;
                    }
                    Ok(func_attr::PREFERRED_SHARED_MEMORY_CARVEOUT) => {
                        if !(-1..=100).contains(&m.value) {
                            return Err(CuError::invalid_value(
                                "the shared memory carveout is a percentage (or -1)",
                            ));
                        }
                        f.desc.attributes[func_attr::PREFERRED_SHARED_MEMORY_CARVEOUT] = m.value;
                    }
                    _ => {
                        return Err(CuError::invalid_value(format!(
                            "function attribute {} cannot be set",
                            m.attribute
                        )));
                    }
                }
                reply(out, msg::Empty {})
            }

            R::TenantInfo(_) => reply(
                out,
                msg::Json {
                    json: self.tenant_json(),
                },
            ),
            _ => match self.dispatch_graph(req, tail, out) {
                Some(r) => r,
                None => match self.dispatch_texture(req, out) {
                    Some(r) => r,
                    None => self.dispatch_alloc_ext(req, out),
                },
            },
        }
    }

    /// A cooperative launch's blocks must all fit on the device at once, as CUDA requires
    /// (`CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`), on a device that launches cooperatively.
    fn check_cooperative(
        &self,
        f: &FunctionState,
        grid: [u32; 3],
        threads: u64,
        shared_bytes: u32,
        sms: Option<u32>,
    ) -> Result<(), CuError> {
        if self.device.attribute(attr::COOPERATIVE_LAUNCH) == 0 {
            return Err(CuError::new(
                cuda::CUDA_ERROR_NOT_SUPPORTED,
                "the device does not launch cooperatively",
            ));
        }
        let dev = |a: usize| i64::from(self.device.attribute(a));
        let func = |a: usize| i64::from(f.desc.attributes.get(a).copied().unwrap_or(0));
        let per_sm = cuda::blocks_per_multiprocessor(
            &dev,
            &func,
            i64::try_from(threads).unwrap_or(i64::MAX),
            i64::from(shared_bytes),
        );
        let units = sms.map_or_else(|| dev(attr::MULTIPROCESSOR_COUNT), i64::from);
        let most = u64::try_from(per_sm.saturating_mul(units)).unwrap_or(0);
        let blocks = grid.iter().map(|&g| u64::from(g)).product::<u64>();
        if blocks > most {
            return Err(CuError::new(
                cuda::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
                format!(
                    "a cooperative launch of {blocks} blocks of kernel `{}`: at most {most} fit on the context's {units} multiprocessors at once ({per_sm} per multiprocessor)",
                    f.desc.name
                ),
            ));
        }
        Ok(())
    }

    /// The variable `name` of module `module` in context `ctx`.
    fn module_global(&self, ctx: u64, module: u64, name: &str) -> Result<GlobalDesc, CuError> {
        self.ctx(ctx)?;
        let st = self
            .modules
            .get(module)
            .ok_or_else(|| CuError::invalid_handle("not a module of this process"))?;
        st.module
            .globals()
            .iter()
            .find(|g| g.name == name)
            .cloned()
            .ok_or_else(|| {
                CuError::new(
                    cuda::CUDA_ERROR_NOT_FOUND,
                    format!("the module has no global named `{name}`"),
                )
            })
    }

    fn function(&self, h: u64) -> Result<&FunctionState, CuError> {
        self.functions.get(h).ok_or_else(|| {
            CuError::invalid_handle(format!("{h:#x} is not a function of this process"))
        })
    }

    /// Loads a module charged to the VM's module budgets (before it is parsed:
    /// a VM past its budget costs vgpud no parsing).
    fn load_module(&mut self, ctx: u64, image: &[u8]) -> Result<u64, CuError> {
        let bytes = image.len() as u64;
        self.tenant.limits.charge_module(&self.tenant.name, bytes)?;
        let loaded = self.load_module_image(ctx, image);
        if loaded.is_err() {
            self.tenant.limits.refund_module(bytes);
        }
        loaded
    }

    /// A part of a module image sent in parts ([`msg::ModuleLoadPart`]); the module's handle
    /// once the last part has come and the image loaded. The whole image is charged to the VM's
    /// module budgets at its first part, so the bytes held here are bounded as loaded images
    /// are; a part out of order or past the declared size drops the image.
    fn load_module_part(
        &mut self,
        m: &msg::ModuleLoadPart,
        part: &[u8],
    ) -> Result<Option<u64>, CuError> {
        if m.offset == 0 {
            self.drop_staged_image();
            if m.total == 0 {
                return Err(CuError::invalid_value("a module image of 0 bytes"));
            }
            self.tenant
                .limits
                .charge_module(&self.tenant.name, m.total)?;
            // The whole declared size at once (it is charged already): the parts are copied
            // once, not again at each growth, and a host out of memory refuses the image.
            let mut bytes = Vec::new();
            let reserved = usize::try_from(m.total)
                .ok()
                .is_some_and(|n| bytes.try_reserve_exact(n).is_ok());
            if !reserved {
                self.tenant.limits.refund_module(m.total);
                return Err(CuError::out_of_memory(
                    "the host has no memory for this module image",
                ));
            }
            self.staged_image = Some(StagedImage {
                ctx: m.ctx,
                total: m.total,
                bytes,
            });
        }
        let in_order = self.staged_image.as_ref().is_some_and(|s| {
            s.ctx == m.ctx
                && s.total == m.total
                && s.bytes.len() as u64 == m.offset
                && m.offset.checked_add(part.len() as u64) <= Some(s.total)
        });
        if !in_order {
            self.drop_staged_image();
            return Err(CuError::invalid_value(
                "a module image's parts must come in order, within its declared size",
            ));
        }
        let staged = self.staged_image.as_mut().expect("checked above");
        staged.bytes.extend_from_slice(part);
        if (staged.bytes.len() as u64) < staged.total {
            return Ok(None);
        }
        let StagedImage { ctx, total, bytes } = self.staged_image.take().expect("checked above");
        let loaded = self.load_module_image(ctx, &bytes);
        if loaded.is_err() {
            self.tenant.limits.refund_module(total);
        }
        loaded.map(Some)
    }

    /// Drops an image whose parts did not all come, returning its charge.
    fn drop_staged_image(&mut self) {
        if let Some(s) = self.staged_image.take() {
            self.tenant.limits.refund_module(s.total);
        }
    }

    fn load_module_image(&mut self, ctx: u64, image: &[u8]) -> Result<u64, CuError> {
        let (free, _) = self.tenant.slice.info();
        // Parsing runs on this session's thread: bounded by the device's watchdog like a
        // kernel, and stopped when the client disconnects.
        let watchdog = self.device.watchdog;
        let control =
            RunControl::with_deadline(watchdog.and_then(|w| Instant::now().checked_add(w)));
        control.watch_hangup(self.engine.hangup_probe());
        let module = self
            .dev
            .load_module(image, free, &control)
            .map_err(|e| match e {
                DeviceError::LoadStopped(why) if control.cancelled() => CuError::new(
                    cuda::CUDA_ERROR_INVALID_PTX,
                    format!("the module load was stopped: the client disconnected ({why})"),
                ),
                DeviceError::LoadStopped(why) => {
                    self.tenant
                        .stats
                        .module_loads_stopped
                        .fetch_add(1, Ordering::Relaxed);
                    CuError::new(
                    cuda::CUDA_ERROR_INVALID_PTX,
                    format!(
                        "loading the module took longer than the device's watchdog ({} ms) allows: {why}",
                        watchdog.map_or(0, |w| w.as_millis())
                    ),
                )
                }
                e => {
                    let e = CuError::from(e);
                    if e.code == cuda::CUDA_ERROR_OUT_OF_MEMORY {
                        CuError::out_of_memory("the module's globals do not fit the memory slice")
                    } else {
                        e
                    }
                }
            })?;
        let charges: Vec<(u64, u64, u64)> = module
            .globals()
            .iter()
            .map(|g| {
                (
                    g.addr,
                    g.size,
                    round_up(g.size.max(1), self.device.alloc_granularity).unwrap_or(g.size),
                )
            })
            .collect();
        let total: u64 = charges.iter().map(|c| c.2).sum();
        // Charged before the module becomes usable; on refusal the module is dropped (freed).
        self.tenant.slice.charge(total)?;
        let h = match self.modules.insert(ModuleState {
            ctx,
            module,
            functions: HashMap::new(),
            image_bytes: image.len() as u64,
        }) {
            Ok(h) => h,
            Err(e) => {
                self.tenant.slice.refund(total);
                return Err(e);
            }
        };
        for (addr, size, charged) in charges {
            self.allocs.insert(
                addr,
                Allocation {
                    size,
                    charged,
                    ctx,
                    kind: AllocKind::ModuleGlobal(h),
                },
            );
        }
        self.note_memory();
        Ok(h)
    }

    fn unload_module(&mut self, h: u64) {
        // Kernels of the module may still be queued or running.
        self.engine.settle();
        for base in self
            .allocs
            .bases_where(|a| a.kind == AllocKind::ModuleGlobal(h))
        {
            if let Some(a) = self.allocs.remove(base) {
                self.tenant.slice.refund(a.charged);
            }
        }
        if let Some(st) = self.modules.remove(h) {
            for f in st.functions.values() {
                self.functions.remove(*f);
            }
            self.tenant.limits.refund_module(st.image_bytes);
        }
        self.note_memory();
    }

    fn get_function(&mut self, module: u64, name: &str) -> Result<u64, CuError> {
        let st = self
            .modules
            .get(module)
            .ok_or_else(|| CuError::invalid_handle("not a module of this process"))?;
        if let Some(&h) = st.functions.get(name) {
            return Ok(h);
        }
        let (kernel, desc) = st
            .module
            .kernels()
            .iter()
            .enumerate()
            .find(|(_, k)| k.name == name)
            .map(|(i, k)| (i, k.clone()))
            .ok_or_else(|| {
                CuError::new(
                    cuda::CUDA_ERROR_NOT_FOUND,
                    format!("the module has no kernel named `{name}`"),
                )
            })?;
        let param_bytes = desc
            .param_offsets
            .iter()
            .zip(&desc.param_sizes)
            .map(|(o, s)| (o + s) as usize)
            .max()
            .unwrap_or(0);
        let h = self.functions.insert(FunctionState {
            module,
            kernel,
            desc,
            param_bytes,
        })?;
        if let Some(st) = self.modules.get_mut(module) {
            st.functions.insert(name.to_string(), h);
        }
        Ok(h)
    }

    fn launch(
        &mut self,
        lane: &LaneSpec,
        m: &msg::LaunchKernel,
        params: &[u8],
        cooperative: bool,
        priority: Option<i32>,
    ) -> Result<u64, CuError> {
        let run = self.check_launch(m, params, cooperative)?;
        let control = Arc::new(RunControl::default());
        self.set_device_runtime(&control, [run.module.as_ref()])?;
        // A kernel of a graph launch with conditional nodes may set their handles.
        if let Some(values) = &self.graphs.conditionals {
            control.set_conditionals(Some(Arc::clone(values)));
        }
        let work = LaunchWork {
            run,
            control,
            watchdog: self.device.watchdog,
            tenant: Arc::clone(&self.tenant),
            ticket: self.tenant.queue_kernel(),
        };
        let work = self.output.wrap(Box::new(work));
        Ok(self
            .engine
            .submit_with_priority(lane, Job::Other(work), &[], priority))
    }

    /// Checks a launch (function, dimensions, parameters, shared memory, a cooperative grid)
    /// and returns what runs it.
    fn check_launch(
        &self,
        m: &msg::LaunchKernel,
        params: &[u8],
        cooperative: bool,
    ) -> Result<KernelRun, CuError> {
        let f = self.function(m.function)?;
        let a = &f.desc.attributes;
        let grid = [m.grid_x, m.grid_y, m.grid_z];
        let block = [m.block_x, m.block_y, m.block_z];
        if params.len() != f.param_bytes {
            return Err(CuError::invalid_value(format!(
                "kernel `{}` takes {} bytes of parameters, got {}",
                f.desc.name,
                f.param_bytes,
                params.len()
            )));
        }
        let max_grid = [
            attr::MAX_GRID_DIM_X,
            attr::MAX_GRID_DIM_Y,
            attr::MAX_GRID_DIM_Z,
        ];
        let max_block = [
            attr::MAX_BLOCK_DIM_X,
            attr::MAX_BLOCK_DIM_Y,
            attr::MAX_BLOCK_DIM_Z,
        ];
        for i in 0..3 {
            let gmax = self.device.attribute(max_grid[i]).max(1) as u32;
            let bmax = self.device.attribute(max_block[i]).max(1) as u32;
            if grid[i] == 0 || grid[i] > gmax || block[i] == 0 || block[i] > bmax {
                return Err(CuError::invalid_value(format!(
                    "invalid launch dimensions: grid {grid:?}, block {block:?}"
                )));
            }
        }
        let threads = u64::from(block[0]) * u64::from(block[1]) * u64::from(block[2]);
        let max_threads = a[func_attr::MAX_THREADS_PER_BLOCK].max(1) as u64;
        if threads > max_threads {
            return Err(CuError::invalid_value(format!(
                "a block of {threads} threads exceeds kernel `{}`'s limit of {max_threads}",
                f.desc.name
            )));
        }
        let max_dyn = a[func_attr::MAX_DYNAMIC_SHARED_SIZE_BYTES].max(0) as u32;
        if m.shared_bytes > max_dyn {
            return Err(CuError::invalid_value(format!(
                "{} bytes of dynamic shared memory exceed kernel `{}`'s limit of {max_dyn} (raise it with cuFuncSetAttribute)",
                m.shared_bytes, f.desc.name
            )));
        }
        // A green context's kernels (those of its streams) run on its multiprocessors.
        let sms = if self.greens == 0 {
            None
        } else {
            self.stream_ctx(m.ctx, m.stream)
                .ok()
                .and_then(|c| self.context_sms(c))
        };
        if cooperative {
            self.check_cooperative(f, grid, threads, m.shared_bytes, sms)?;
        }
        let module = Arc::clone(
            &self
                .modules
                .get(f.module)
                .ok_or_else(|| CuError::invalid_handle("the function's module was unloaded"))?
                .module,
        );
        Ok(KernelRun {
            module,
            kernel: f.kernel,
            dims: LaunchDims {
                grid,
                block,
                shared_bytes: m.shared_bytes,
                cooperative,
                units: sms,
            },
            params: params.to_vec(),
        })
    }

    fn tenant_json(&self) -> String {
        let sessions: Vec<_> = self
            .tenant
            .sessions()
            .iter()
            .map(|s| {
                serde_json::json!({
                    "session": s.id,
                    "pid": s.pid,
                    "process": s.process_name,
                    "memory_used": s.memory.load(Ordering::Relaxed),
                    "contexts": s.contexts.load(Ordering::Relaxed),
                })
            })
            .collect();
        let st = &self.tenant.stats;
        serde_json::json!({
            "vm": self.tenant.name,
            "device": self.device.name,
            "device_kind": self.device.kind,
            "memory_total": self.tenant.slice.limit(),
            "memory_used": self.tenant.slice.used(),
            "memory_by_kind": self.tenant.usage.breakdown(self.tenant.slice.used()),
            "memory_placement": self.tenant.placement().map(|m| {
                let m = m.snapshot();
                serde_json::json!({
                    "device": m.device,
                    "host_overflow": m.host,
                    "reserved": m.policy.reserved,
                    "overflow": m.policy.overflow.as_str(),
                    "overflow_limit": m.policy.overflow_limit,
                })
            }),
            "kernels": st.kernels.load(Ordering::Relaxed),
            "share_1s": self.tenant.sched_stats().share_1s,
            "bytes_htod": st.bytes_htod.load(Ordering::Relaxed),
            "bytes_dtoh": st.bytes_dtoh.load(Ordering::Relaxed),
            "this_session": self.info.id,
            "sessions": sessions,
        })
        .to_string()
    }

    fn check_device(&self, device: u32) -> Result<(), CuError> {
        if device == DEVICE_ORDINAL {
            Ok(())
        } else {
            Err(CuError::new(
                cuda::CUDA_ERROR_INVALID_DEVICE,
                format!("device {device} does not exist: this VM has one GPU, device 0"),
            ))
        }
    }

    fn ctx(&self, ctx: u64) -> Result<&CtxState, CuError> {
        if let Some(p) = self.engine.poisoned(ctx) {
            return Err(p);
        }
        self.contexts.get(ctx).ok_or_else(|| {
            CuError::invalid_context(format!("{ctx:#x} is not a context of this process"))
        })
    }

    /// Validates a (context, stream) pair; returns the context the work belongs to.
    fn stream_ctx(&self, ctx: u64, stream: u64) -> Result<u64, CuError> {
        if stream == 0 || stream == STREAM_LEGACY || stream == STREAM_PER_THREAD {
            self.ctx(ctx)?;
            return Ok(ctx);
        }
        let owner = self.streams.get(stream).map(|s| s.ctx).ok_or_else(|| {
            CuError::invalid_handle(format!("{stream:#x} is not a stream of this process"))
        })?;
        match self.engine.poisoned(owner) {
            Some(p) => Err(p),
            None => Ok(owner),
        }
    }

    /// Whether `ctx` is a context `cuCtxDestroy` may destroy: one of this process's, not a
    /// primary context. A context poisoned by a kernel fault can still be destroyed: that is how
    /// a process recovers, as with CUDA.
    fn destroyable(&self, ctx: u64) -> Result<(), CuError> {
        let c = self.contexts.get(ctx).ok_or_else(|| {
            CuError::invalid_context(format!("{ctx:#x} is not a context of this process"))
        })?;
        if c.primary {
            return Err(CuError::invalid_context(
                "the primary context is released with cuDevicePrimaryCtxRelease, not destroyed",
            ));
        }
        Ok(())
    }

    /// What a synchronizing call of `kind` ([`msg::SYNC_CONTEXT`], [`msg::SYNC_STREAM`],
    /// [`msg::SYNC_EVENT`]) waits for, fixed now.
    fn sync_point(&self, ctx: u64, kind: u32, handle: u64) -> Result<SyncPoint, CuError> {
        match kind {
            msg::SYNC_CONTEXT => {
                self.ctx(ctx)?;
                Ok(SyncPoint::Work(self.engine.until_ctx(ctx), Some(ctx)))
            }
            msg::SYNC_STREAM => {
                let lane = self.lane(ctx, handle)?;
                Ok(SyncPoint::Work(
                    self.engine.until_lane(&lane),
                    Some(lane.ctx),
                ))
            }
            msg::SYNC_ALL => {
                self.ctx(ctx)?;
                Ok(SyncPoint::Work(self.engine.until_all(), None))
            }
            msg::SYNC_DESTROY => {
                self.destroyable(ctx)?;
                Ok(SyncPoint::Work(self.engine.until_all(), None))
            }
            msg::SYNC_EVENT => {
                let ev = self.event(handle)?;
                if let Some(shared) = alloc_ext::ipc::event::recorded_elsewhere(ev) {
                    return Ok(SyncPoint::IpcEvent(shared));
                }
                let (rec, ctx) = (ev.clock.get(), ev.ctx);
                Ok(SyncPoint::Work(self.engine.until_job(rec.seq), Some(ctx)))
            }
            other => Err(CuError::invalid_value(format!(
                "a synchronization is of a context (0), a stream (1), an event (2), all work (3) or all work before a context's destruction (4), not {other}"
            ))),
        }
    }

    /// Validates a (context, stream) pair; returns the stream's lane. The
    /// default stream (0, `CU_STREAM_LEGACY`, and `CU_STREAM_PER_THREAD`
    /// from a shim that does not map it to a stream of its own) is the
    /// context's legacy stream.
    fn lane(&self, ctx: u64, stream: u64) -> Result<LaneSpec, CuError> {
        let owner = self.stream_ctx(ctx, stream)?;
        if let Some(branch) = self.graphs.route {
            // A node of a graph launch: its branch's lane.
            return Ok(branch);
        }
        Ok(match self.streams.get(stream) {
            Some(s) => LaneSpec {
                key: LaneKey::Stream(stream),
                ctx: owner,
                kind: if s.flags & STREAM_NON_BLOCKING != 0 {
                    LaneKind::NonBlocking
                } else {
                    LaneKind::Blocking
                },
                priority: s.priority,
            },
            None => LaneSpec::legacy(owner),
        })
    }

    fn event(&self, event: u64) -> Result<&EventState, CuError> {
        self.events.get(event).ok_or_else(|| {
            CuError::invalid_handle(format!("{event:#x} is not an event of this process"))
        })
    }

    fn surface_async_error(&self, ctx: u64) -> Result<(), CuError> {
        match self.engine.take_error(ctx) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn new_context(&mut self, primary: bool) -> Result<u64, CuError> {
        self.contexts.insert(CtxState {
            primary,
            sms: None,
            green: false,
        })
    }

    /// Takes a reference to the primary context, creating it first if needed; returns it.
    fn retain_primary(&mut self) -> Result<u64, CuError> {
        let h = match self.primary.handle {
            Some(h) => h,
            None => {
                let h = self.new_context(true)?;
                self.primary.handle = Some(h);
                h
            }
        };
        self.primary.refs += 1;
        Ok(h)
    }

    /// Drops a reference to the primary context (the caller checked there is one); the last
    /// one resets it.
    fn release_primary(&mut self) {
        self.primary.refs = self.primary.refs.saturating_sub(1);
        if self.primary.refs == 0 {
            self.reset_primary();
        }
    }

    /// The context whose events context `ctx` records: the primary context for a green context
    /// (CUDA: a green context's events are of "the same primary context"), else `ctx` itself.
    fn family(&self, ctx: u64) -> u64 {
        let green = self.greens > 0 && self.contexts.get(ctx).is_some_and(|c| c.green);
        match self.primary.handle {
            Some(p) if green => p,
            _ => ctx,
        }
    }

    /// Checks the multiprocessors asked for a context: 1 up to the device's, else `code`.
    fn check_sms(&self, sm_count: u32, code: cuda::CuResult) -> Result<(), CuError> {
        let sms = u32::try_from(self.device.attribute(attr::MULTIPROCESSOR_COUNT)).unwrap_or(0);
        if sm_count == 0 || sm_count > sms {
            return Err(CuError::new(
                code,
                format!("a context on {sm_count} multiprocessors: the device has {sms}"),
            ));
        }
        Ok(())
    }

    /// The multiprocessors a kernel launched in context `ctx` may run on at a time: a green
    /// context's or an execution affinity's, or `None` (all of the device's).
    fn context_sms(&self, ctx: u64) -> Option<u32> {
        if self.greens == 0 {
            return None;
        }
        self.contexts.get(ctx).and_then(|c| c.sms)
    }

    /// Publishes how many contexts the session has in use (a primary context counts while it
    /// is retained): the tenant's view of which processes use the GPU.
    fn note_contexts(&self) {
        let idle_primary = self.primary.handle.is_some() && self.primary.refs == 0;
        let live = self.contexts.len() - usize::from(idle_primary);
        self.info.contexts.store(live as u64, Ordering::Relaxed);
    }

    fn allocate(&mut self, ctx: u64, size: u64) -> Result<u64, CuError> {
        if size == 0 {
            return Err(CuError::invalid_value("cannot allocate 0 bytes"));
        }
        let charged = round_up(size, self.device.alloc_granularity)
            .ok_or_else(|| CuError::out_of_memory("allocation size overflows"))?;
        let ptr = match self.tenant.placement().cloned() {
            Some(pm) => {
                crate::memory::movable::allocate(&pm, &self.tenant, &self.dev, size, charged)?
            }
            None => {
                self.tenant.slice.charge(charged)?;
                match self.dev.alloc(size) {
                    Ok(p) => p,
                    Err(e) => {
                        self.tenant.slice.refund(charged);
                        return Err(e.into());
                    }
                }
            }
        };
        self.allocs.insert(
            ptr,
            Allocation {
                size,
                charged,
                ctx,
                kind: AllocKind::Device,
            },
        );
        self.note_memory();
        Ok(ptr)
    }

    fn free_allocation(&mut self, base: u64) {
        // Memory shared with other processes of the VM outlives this process's use of it.
        if self.ipc_free(base) || self.pool_import_close(base) {
            return;
        }
        if let Some(a) = self.allocs.remove(base) {
            release_allocation(&self.tenant, self.dev.as_ref(), base, &a);
            self.note_memory();
        }
    }

    /// Frees everything a context owns (allocations, streams, events).
    fn release_context_resources(&mut self, ctx: u64) {
        // Its memory waits end: nothing settles while a word nobody writes holds a lane.
        if let Some(w) = &self.mem_waits {
            w.end_context(ctx);
        }
        self.engine.settle();
        if let Some(w) = &self.mem_waits {
            w.forget_context(ctx);
        }
        self.release_objects(Some(ctx));
        for base in self.allocs.bases_where(|a| a.ctx == ctx) {
            self.free_allocation(base);
        }
        for h in self.streams.handles_where(|s| s.ctx == ctx) {
            self.streams.remove(h);
            self.engine.forget_lane(LaneKey::Stream(h));
        }
        self.engine.forget_lane(LaneKey::Legacy(ctx));
        for h in self.events.handles_where(|e| e.ctx == ctx) {
            if let Some(ev) = self.events.remove(h) {
                self.ipc_event_gone(ev.ipc);
            }
        }
        for h in self.modules.handles_where(|m| m.ctx == ctx) {
            self.unload_module(h);
        }
    }

    fn reset_primary(&mut self) {
        if let Some(h) = self.primary.handle {
            self.release_context_resources(h);
            self.engine.clear_context(h);
        }
    }
}

/// Gives an allocation's device memory back to the device and its charge back to the VM.
fn release_allocation(tenant: &Tenant, dev: &dyn DeviceContext, base: u64, a: &Allocation) {
    if let Err(e) = dev.free(base) {
        tracing::warn!(tenant = %tenant.name, error = %e, "device refused to free {base:#x}");
    }
    match (a.kind, tenant.placement()) {
        (AllocKind::Device, Some(pm)) => {
            pm.untrack(base);
            tenant.slice.refund_unplaced(a.charged);
        }
        _ => tenant.slice.refund(a.charged),
    }
    if let Some(k) = a.kind.usage() {
        tenant.usage.sub(k, a.charged);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Discards queued work and cancels a running kernel; then frees every
        // allocation this process made and returns it to the slice.
        let n = self.allocs.len();
        let bytes = self.allocs.charged();
        let engine = std::mem::replace(&mut self.engine, Engine::new(Arc::clone(&self.dev)));
        drop(engine);
        self.tenant.host_gates.end_session(self.info.id);
        self.tenant.sync_tickets.end_session(self.info.id);
        self.release_alloc_ext();
        self.release_objects(None);
        for h in self.modules.handles_where(|_| true) {
            self.unload_module(h);
        }
        self.drop_staged_image();
        for base in self.allocs.bases_where(|_| true) {
            self.free_allocation(base);
        }
        self.release_heap();
        self.tenant.remove_session(self.info.id);
        debug!(
            session = self.info.id,
            tenant = %self.tenant.name,
            allocations = n,
            bytes,
            "session released its resources"
        );
    }
}

/// A checked kernel launch: what the device runs.
struct KernelRun {
    module: Arc<dyn DeviceModule>,
    kernel: usize,
    dims: LaunchDims,
    params: Vec<u8>,
}

impl KernelRun {
    fn name(&self) -> &str {
        self.module
            .kernels()
            .get(self.kernel)
            .map_or("?", |k| k.name.as_str())
    }
}

/// A kernel launch queued on the session's engine. It runs only while its
/// tenant holds the device (see [`crate::scheduler`]): when the scheduler
/// asks it to yield, it gives the device back and resumes from the next
/// thread block once granted again.
struct LaunchWork {
    run: KernelRun,
    control: Arc<RunControl>,
    watchdog: Option<std::time::Duration>,
    tenant: Arc<Tenant>,
    ticket: KernelTicket,
}

impl Work for LaunchWork {
    fn run(self: Box<Self>, dev: &dyn DeviceContext) -> Result<(), CuError> {
        let LaunchWork {
            run,
            control,
            watchdog,
            tenant,
            mut ticket,
        } = *self;
        // Host-side device state (the simulated GPU's interpreter) is the VM's.
        control.set_state_budget(Some(Arc::clone(&tenant.limits) as _));
        run_kernel(dev, &run, &control, watchdog, &tenant, &mut ticket)
    }

    fn bytes(&self) -> usize {
        self.run.params.len()
    }

    fn control(&self) -> Option<Arc<RunControl>> {
        Some(Arc::clone(&self.control))
    }
}

/// Runs one kernel under grants of `ticket`, from its first block to its end, yielding the
/// device when the scheduler asks (a device that can stop between thread blocks).
fn run_kernel(
    dev: &dyn DeviceContext,
    run: &KernelRun,
    control: &Arc<RunControl>,
    watchdog: Option<Duration>,
    tenant: &Tenant,
    ticket: &mut KernelTicket,
) -> Result<(), CuError> {
    let mut start = 0;
    // The watchdog counts the kernel's running time only, not its waits
    // for the device.
    let mut ran = Duration::ZERO;
    loop {
        let grant = ticket
            .acquire(control)
            .map_err(|e| CuError::new(cuda::CUDA_ERROR_LAUNCH_FAILED, e.to_string()))?;
        if let Some(limit) = watchdog {
            let Some(left) = limit.checked_sub(ran).filter(|d| !d.is_zero()) else {
                grant.finish(Outcome::Failed);
                return Err(CuError::new(
                    cuda::CUDA_ERROR_LAUNCH_TIMEOUT,
                    format!(
                        "watchdog: kernel `{}` ran longer than {} ms",
                        run.name(),
                        limit.as_millis()
                    ),
                ));
            };
            control.set_deadline(Instant::now().checked_add(left));
        }
        let t0 = Instant::now();
        let r = dev.launch(
            run.module.as_ref(),
            run.kernel,
            &run.dims,
            &run.params,
            start,
            control,
        );
        ran += t0.elapsed();
        match r {
            Err(e) => {
                grant.finish(Outcome::Failed);
                return Err(e.into());
            }
            Ok(LaunchProgress::Completed) => {
                grant.finish(Outcome::Completed);
                tenant.stats.kernels.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            Ok(LaunchProgress::Yielded { next_block }) => {
                grant.finish(Outcome::Yielded);
                if control.cancelled() {
                    return Err(CuError::new(
                        cuda::CUDA_ERROR_LAUNCH_FAILED,
                        "the launch was cancelled",
                    ));
                }
                start = next_block;
            }
        }
    }
}

/// Most kernels of a graph that run as one job, one device launch (a *chain*, see
/// `session/graph.rs`): the scheduler gates a real GPU at kernel boundaries, and a chain is one
/// boundary, so the bound keeps a VM's turn on the device short.
pub const MAX_GRAPH_CHAIN_KERNELS: usize = 16;

/// Consecutive kernels of one graph branch run as one job ([`DeviceContext::launch_chain`]):
/// one scheduler grant, one device launch, the watchdog over them all. A device that refuses
/// chains gets them one by one, and the session stops making chains (`refused`).
struct ChainWork {
    runs: Vec<KernelRun>,
    control: Arc<RunControl>,
    watchdog: Option<Duration>,
    tenant: Arc<Tenant>,
    ticket: KernelTicket,
    refused: Arc<AtomicBool>,
}

impl Work for ChainWork {
    fn run(self: Box<Self>, dev: &dyn DeviceContext) -> Result<(), CuError> {
        let ChainWork {
            runs,
            control,
            watchdog,
            tenant,
            mut ticket,
            refused,
        } = *self;
        control.set_state_budget(Some(Arc::clone(&tenant.limits) as _));
        if !refused.load(Ordering::Relaxed) {
            let grant = ticket
                .acquire(&control)
                .map_err(|e| CuError::new(cuda::CUDA_ERROR_LAUNCH_FAILED, e.to_string()))?;
            if let Some(limit) = watchdog {
                control.set_deadline(Instant::now().checked_add(limit));
            }
            let chain: Vec<ChainKernel<'_>> = runs
                .iter()
                .map(|r| ChainKernel {
                    module: r.module.as_ref(),
                    kernel: r.kernel,
                    dims: r.dims,
                    params: &r.params,
                })
                .collect();
            match dev.launch_chain(&chain, &control) {
                Ok(()) => {
                    grant.finish(Outcome::Completed);
                    tenant
                        .stats
                        .kernels
                        .fetch_add(runs.len() as u64, Ordering::Relaxed);
                    return Ok(());
                }
                Err(DeviceError::NotSupported(why)) => {
                    // Nothing ran: give the device back and go one by one from now on.
                    grant.finish(Outcome::Yielded);
                    debug!(tenant = %tenant.name, %why, "the device refuses chains of kernels");
                    refused.store(true, Ordering::Relaxed);
                }
                Err(e) => {
                    grant.finish(Outcome::Failed);
                    return Err(e.into());
                }
            }
        }
        for (i, run) in runs.iter().enumerate() {
            let mut own;
            let t = if i == 0 {
                &mut ticket
            } else {
                own = tenant.queue_kernel();
                &mut own
            };
            control.clear_yield();
            run_kernel(dev, run, &control, watchdog, &tenant, t)?;
        }
        Ok(())
    }

    fn bytes(&self) -> usize {
        self.runs.iter().map(|r| r.params.len()).sum()
    }

    fn control(&self) -> Option<Arc<RunControl>> {
        Some(Arc::clone(&self.control))
    }
}
