//! Per-session execution of device work, one queue per stream.
//!
//! Each stream of a session is a *lane*: a queue whose jobs run one at a
//! time, in submission order. Lanes run concurrently with each other, on a
//! small pool of worker threads per session ([`DEFAULT_WORKERS`]), so two
//! streams of independent kernels share the device and a copy on one stream
//! proceeds while a kernel runs on another. Jobs of different lanes are
//! ordered only by dependencies, as CUDA orders streams:
//!
//! - an event record is a job of its lane; `cuStreamWaitEvent` adds a
//!   barrier job to the waiting lane that depends on the record job current
//!   at the time of the call;
//! - the legacy default stream of a context ([`LaneKind::Legacy`]) waits for
//!   the work submitted before on the context's blocking streams, and
//!   blocking streams ([`LaneKind::Blocking`], which includes per-thread
//!   default streams) wait for the work submitted before on the legacy
//!   stream; non-blocking streams ([`LaneKind::NonBlocking`]) do neither;
//! - a host function is a [`Gate`]: when its lane reaches it the lane stops
//!   until the guest has run the function and opened the gate; a stream memory
//!   wait is a gate too, opened by [`crate::mem_wait`] once the word it watches
//!   meets its condition (which any job's end may have changed:
//!   [`Engine::on_progress`]).
//!
//! Among lanes that are ready at the same time, the one with the highest
//! priority (the lowest number) starts first, then the oldest job. A lane's
//! priority is its stream's, unless the job at its front has a priority of
//! its own (a kernel launched with `CU_LAUNCH_ATTRIBUTE_PRIORITY`, or a graph
//! kernel node's priority: [`Engine::submit_with_priority`]); priorities never
//! reorder the jobs of one lane. Priorities order one session's lanes only: the share of the device
//! between VMs is the scheduler's ([`crate::scheduler`]), unchanged.
//!
//! Errors are kept per context, as CUDA keeps them: the first error of a
//! context's asynchronous work is reported by its next synchronizing call,
//! and a sticky error (a kernel fault) poisons that context only — its later
//! work is skipped and every call in it fails — until it is destroyed.
//!
//! Quick jobs submitted to an idle lane whose dependencies are done run
//! inline on the session thread (no hand-off); anything else goes to a
//! worker, so the session keeps answering queries while kernels run. The
//! queues are bounded in jobs and bytes (all lanes together): a client
//! flooding asynchronous calls is slowed down by back-pressure on its own
//! connection, never by growing the daemon. The bytes queued are also charged
//! to the VM's `limits.queued_bytes`, shared by its sessions
//! ([`Engine::with_budget`]): a session whose VM has spent it waits until
//! queued work of the VM runs (a VM with nothing queued always takes one job,
//! so a single job larger than the budget cannot wait forever).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::debug;
use vgpu_proto::cuda;

use crate::device::{DeviceContext, DeviceError, RunControl};
use crate::error::CuError;
use crate::limits::{LimitUse, QUEUE_ROOM_POLL};
use vgpu_config::limits::Budget;

/// Most jobs queued per session (all lanes) before the submitter waits.
pub const MAX_QUEUED_JOBS: usize = 4096;
/// Most bytes of copy data queued per session before the submitter waits.
pub const MAX_QUEUED_BYTES: usize = 64 << 20;
/// How often a session waiting for its work checks that its client is
/// still connected ([`Engine::watch_hangup`]).
pub const HANGUP_POLL: Duration = Duration::from_millis(100);
/// Worker threads a session's engine starts at most (lazily, one per lane
/// that is ready while the others are busy).
pub const DEFAULT_WORKERS: usize = 8;

/// Tells whether the session's client has gone (its connection closed).
pub type HangupProbe = Arc<dyn Fn() -> bool + Send + Sync>;

/// When an event's latest record completed.
#[derive(Debug, Default)]
pub struct EventClock {
    inner: Mutex<EventRecord>,
    /// Told of the event's records (an event exported to other processes).
    listener: OnceLock<Arc<dyn ClockListener>>,
}

/// Follows an event's records from outside its session (`cuIpcGetEventHandle`).
pub trait ClockListener: Send + Sync + std::fmt::Debug {
    /// A record job `seq` was submitted: it is the event's latest record now.
    fn recorded(&self, seq: u64);
    /// Record job `seq` ran.
    fn completed(&self, seq: u64);
    /// The event is gone and no record of it is pending: no record completes any more.
    fn ended(&self);
}

/// The latest record of an event.
#[derive(Debug, Default, Clone, Copy)]
pub struct EventRecord {
    /// Sequence number of the record job; 0 = never recorded.
    pub seq: u64,
    /// When it ran.
    pub time: Option<Instant>,
}

impl EventClock {
    /// The latest record.
    pub fn get(&self) -> EventRecord {
        *self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tells `l` of the event's records from now on; `false` when another listener
    /// follows it already.
    pub fn listen(&self, l: Arc<dyn ClockListener>) -> bool {
        self.listener.set(l).is_ok()
    }

    /// The listener following the event, if any.
    pub fn listener(&self) -> Option<&Arc<dyn ClockListener>> {
        self.listener.get()
    }

    fn set(&self, r: EventRecord) {
        *self.inner.lock().unwrap_or_else(|p| p.into_inner()) = r;
        if let Some(l) = self.listener.get() {
            l.recorded(r.seq);
        }
    }

    fn complete(&self, seq: u64) {
        {
            let mut r = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            if r.seq == seq {
                r.time = Some(Instant::now());
            }
        }
        if let Some(l) = self.listener.get() {
            l.completed(seq);
        }
    }
}

impl Drop for EventClock {
    fn drop(&mut self) {
        // The event and every pending record of it are gone.
        if let Some(l) = self.listener.get() {
            l.ended();
        }
    }
}

/// Which queue a job goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LaneKey {
    /// The legacy default stream of a context.
    Legacy(u64),
    /// A created stream (its handle).
    Stream(u64),
    /// A branch of graphs launched on a stream: `stream` is the launch lane's
    /// [`LaneKey::id`], `branch` (1 to [`MAX_GRAPH_BRANCHES`] - 1) the branch
    /// (branch 0 is the launch lane itself).
    Graph {
        /// The launch lane's id.
        stream: u64,
        /// The branch.
        branch: u32,
    },
    /// The records of a context's own events (`cuCtxRecordEvent`), each after all the context's
    /// work before it, and the barriers joining its waits (`cuCtxWaitEvent`).
    Context(u64),
}

/// Most lanes one graph launch uses (its launch lane included); a graph with
/// more independent branches shares them out, which costs overlap, never order.
pub const MAX_GRAPH_BRANCHES: u32 = 32;
/// Bit set in the lane ids of graph branches (ids of streams and contexts, from
/// handles, stay below it).
const GRAPH_LANE_BIT: u64 = 1 << 63;
/// Set in the ids of contexts' record lanes ([`LaneKey::Context`]).
const CONTEXT_LANE_BIT: u64 = 1 << 62;

/// How a lane synchronizes with the legacy default stream of its context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneKind {
    /// The legacy default stream itself.
    Legacy,
    /// A blocking stream (created without `CU_STREAM_NON_BLOCKING`, or a
    /// per-thread default stream).
    Blocking,
    /// A `CU_STREAM_NON_BLOCKING` stream.
    NonBlocking,
}

/// A lane: its key, context, kind and priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneSpec {
    /// Queue key.
    pub key: LaneKey,
    /// The context its work belongs to.
    pub ctx: u64,
    /// Synchronization with the legacy stream.
    pub kind: LaneKind,
    /// Stream priority: lower numbers start first among ready lanes.
    pub priority: i32,
}

impl LaneKey {
    /// A non-zero id of the lane for the device ([`crate::device::current_lane`]).
    pub fn id(self) -> u64 {
        match self {
            LaneKey::Legacy(ctx) => (ctx << 1).max(2),
            LaneKey::Stream(h) => (h << 1) | 1,
            LaneKey::Graph { stream, branch } => {
                GRAPH_LANE_BIT | (stream << 6) | u64::from(branch % MAX_GRAPH_BRANCHES)
            }
            LaneKey::Context(ctx) => {
                CONTEXT_LANE_BIT | (ctx & !(GRAPH_LANE_BIT | CONTEXT_LANE_BIT))
            }
        }
    }
}

impl LaneSpec {
    /// The lane of context `ctx`'s own records and waits ([`LaneKey::Context`]).
    fn context(ctx: u64) -> Self {
        Self {
            key: LaneKey::Context(ctx),
            ctx,
            kind: LaneKind::NonBlocking,
            priority: 0,
        }
    }

    /// The legacy default stream of context `ctx`.
    pub fn legacy(ctx: u64) -> Self {
        Self {
            key: LaneKey::Legacy(ctx),
            ctx,
            kind: LaneKind::Legacy,
            priority: 0,
        }
    }
}

/// Work executed by the engine.
pub trait Work: Send {
    /// Runs the work on the device.
    fn run(self: Box<Self>, dev: &dyn DeviceContext) -> Result<(), CuError>;
    /// Whether it is short enough to run inline on the session thread.
    fn quick(&self) -> bool {
        false
    }
    /// Bytes of data it holds (for the queue bound).
    fn bytes(&self) -> usize {
        0
    }
    /// The control of long-running work, cancelled when the session ends.
    fn control(&self) -> Option<Arc<RunControl>> {
        None
    }
}

/// A built-in job.
pub enum Job {
    /// Host to device copy of owned data.
    Write {
        /// Destination.
        dst: u64,
        /// Data.
        data: Vec<u8>,
    },
    /// Device to device copy.
    Copy {
        /// Destination.
        dst: u64,
        /// Source.
        src: u64,
        /// Bytes.
        len: u64,
    },
    /// Fill.
    Memset {
        /// Destination.
        dst: u64,
        /// Value (low `elem_size` bytes).
        value: u32,
        /// 1, 2 or 4.
        elem_size: u32,
        /// Elements.
        count: u64,
    },
    /// Event record.
    Record(Arc<EventClock>),
    /// Nothing to run: holds its lane until its dependencies are done
    /// (`cuStreamWaitEvent`).
    Barrier,
    /// A host function: the lane stops here until the gate is opened.
    Gate(Arc<Gate>),
    /// Anything else (kernel launches).
    Other(Box<dyn Work>),
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Job::Write { dst, data } => write!(f, "Write({dst:#x}, {} bytes)", data.len()),
            Job::Copy { dst, src, len } => write!(f, "Copy({dst:#x} <- {src:#x}, {len})"),
            Job::Memset { dst, count, .. } => write!(f, "Memset({dst:#x}, {count})"),
            Job::Record(_) => write!(f, "Record"),
            Job::Barrier => write!(f, "Barrier"),
            Job::Gate(_) => write!(f, "Gate"),
            Job::Other(_) => write!(f, "Work"),
        }
    }
}

/// Copies and fills up to this size count as quick (run inline when idle);
/// larger ones go to a worker so the session thread keeps decoding the
/// next requests while they run.
pub const QUICK_BYTES: u64 = 256 << 10;

impl Job {
    /// Whether it is short enough to run inline on the session thread.
    pub(crate) fn quick(&self) -> bool {
        match self {
            Job::Write { .. } | Job::Record(_) | Job::Barrier => true,
            Job::Copy { len, .. } => *len <= QUICK_BYTES,
            Job::Memset {
                count, elem_size, ..
            } => count.saturating_mul(u64::from(*elem_size)) <= QUICK_BYTES,
            Job::Gate(_) => false,
            Job::Other(w) => w.quick(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Job::Write { data, .. } => data.len(),
            Job::Other(w) => w.bytes(),
            _ => 0,
        }
    }

    fn run(self, seq: u64, dev: &dyn DeviceContext) -> Result<(), CuError> {
        match self {
            Job::Write { dst, data } => dev.write(dst, &data).map_err(Into::into),
            Job::Copy { dst, src, len } => dev.copy(dst, src, len).map_err(Into::into),
            Job::Memset {
                dst,
                value,
                elem_size,
                count,
            } => dev.memset(dst, value, elem_size, count).map_err(Into::into),
            Job::Record(clock) => {
                clock.complete(seq);
                Ok(())
            }
            Job::Barrier | Job::Gate(_) => Ok(()),
            Job::Other(w) => w.run(dev),
        }
    }
}

/// Where a host function's lane stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateState {
    /// Earlier work of the lane is still pending.
    Pending,
    /// The lane reached the gate: the host function may run.
    Reached,
    /// The host function ran (or was given up): the lane goes on.
    Opened,
    /// The session ended (or its context failed) before the lane reached
    /// the gate: the host function must not run.
    Abandoned(String),
}

/// The link from a reached gate back to its engine.
struct GateLink {
    shared: Weak<Shared>,
    key: LaneKey,
    seq: u64,
    ctx: u64,
}

#[derive(Default)]
struct GateInner {
    state: Option<GateState>,
    link: Option<GateLink>,
    /// Opened before the lane reached it (a client that skipped the wait).
    opened_early: bool,
    /// Opened with an error ([`Gate::fail`]): the lane's context reports it.
    error: Option<CuError>,
    /// Called once when the lane reaches the gate ([`Gate::on_reach`]).
    on_reach: Option<Box<dyn FnOnce() + Send>>,
}

/// A host function's place in its lane (`cuLaunchHostFunc`): the lane stops
/// at the gate until [`Gate::open`]; [`Gate::wait_reached`] tells the guest
/// when to run the function.
#[derive(Default)]
pub struct Gate {
    inner: Mutex<GateInner>,
    cv: Condvar,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("state", &self.state())
            .finish()
    }
}

impl Gate {
    /// A gate that calls `f` when its lane reaches it, with the engine's lock held: `f` must
    /// only note that (it may take a lock of its own, never the engine's or the gate's).
    pub fn on_reach(f: impl FnOnce() + Send + 'static) -> Self {
        Self {
            inner: Mutex::new(GateInner {
                on_reach: Some(Box::new(f)),
                ..GateInner::default()
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, GateInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where the gate stands.
    pub fn state(&self) -> GateState {
        self.lock().state.clone().unwrap_or(GateState::Pending)
    }

    /// Waits until the lane reaches the gate (or the gate is opened or
    /// abandoned), at most `timeout`; returns the state then.
    pub fn wait_reached(&self, timeout: Duration) -> GateState {
        let deadline = Instant::now() + timeout;
        let mut g = self.lock();
        loop {
            match &g.state {
                None | Some(GateState::Pending) => {}
                Some(s) => return s.clone(),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return GateState::Pending;
            }
            g = self
                .cv
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The host function ran: the lane goes on.
    pub fn open(&self) {
        self.settle(Ok(()));
    }

    /// What the gate was opened with (`None` while it is not opened).
    pub fn outcome(&self) -> Option<Result<(), CuError>> {
        let g = self.lock();
        match g.state {
            Some(GateState::Opened) => Some(g.error.clone().map_or(Ok(()), Err)),
            _ => None,
        }
    }

    /// The lane goes on, its context reporting `e` (what it waited for can no longer
    /// happen, as when the exporter of an interprocess event ended).
    pub fn fail(&self, e: CuError) {
        self.settle(Err(e));
    }

    fn settle(&self, result: Result<(), CuError>) {
        let link = {
            let mut g = self.lock();
            match g.state {
                Some(GateState::Opened | GateState::Abandoned(_)) => return,
                Some(GateState::Reached) => {}
                _ => g.opened_early = true,
            }
            g.state = Some(GateState::Opened);
            g.error = result.clone().err();
            self.cv.notify_all();
            g.link.take()
        };
        if let Some(l) = link
            && let Some(shared) = l.shared.upgrade()
        {
            let mut st = shared.lock();
            if st.gated.remove(&l.seq).is_some() {
                shared.finish(&mut st, l.key, l.seq, l.ctx, result);
            }
        }
    }

    /// The lane will never reach the gate: the host function must not run.
    pub fn abandon(&self, why: &str) {
        let mut g = self.lock();
        if matches!(g.state, None | Some(GateState::Pending)) {
            g.state = Some(GateState::Abandoned(why.to_string()));
            g.link = None;
            self.cv.notify_all();
        }
    }

    /// The lane reached the gate (engine lock held): what it was opened with
    /// when it was already opened (or abandoned).
    fn reach(&self, link: GateLink) -> Option<Result<(), CuError>> {
        let mut g = self.lock();
        if g.opened_early || matches!(g.state, Some(GateState::Opened)) {
            return Some(g.error.clone().map_or(Ok(()), Err));
        }
        if matches!(g.state, Some(GateState::Abandoned(_))) {
            return Some(Ok(()));
        }
        g.state = Some(GateState::Reached);
        g.link = Some(link);
        self.cv.notify_all();
        let on_reach = g.on_reach.take();
        drop(g);
        if let Some(f) = on_reach {
            f();
        }
        None
    }
}

/// Key of errors that belong to no context (a malformed asynchronous request).
pub const NO_CONTEXT: u64 = 0;

struct Entry {
    seq: u64,
    ctx: u64,
    job: Job,
    deps: Vec<u64>,
    /// The job's own priority, over its lane's while it is at the front.
    priority: Option<i32>,
}

struct Lane {
    spec: LaneSpec,
    queue: VecDeque<Entry>,
    /// The job running (or the gate the lane is stopped at).
    running: Option<u64>,
    /// The last job submitted to the lane.
    last: u64,
    /// The stream was destroyed: the lane goes once idle.
    forgotten: bool,
}

impl Lane {
    fn new(spec: LaneSpec) -> Self {
        Self {
            spec,
            queue: VecDeque::new(),
            running: None,
            last: 0,
            forgotten: false,
        }
    }

    fn idle(&self) -> bool {
        self.running.is_none() && self.queue.is_empty()
    }
}

#[derive(Default)]
struct State {
    /// Keyed with a fast hasher: looked up at every submission and every job's end.
    lanes: HashMap<LaneKey, Lane, foldhash::fast::RandomState>,
    /// Jobs submitted and not finished, with their context.
    unfinished: BTreeMap<u64, u64>,
    queued: usize,
    queued_bytes: usize,
    submitted: u64,
    errors: BTreeMap<u64, CuError>,
    poisoned: BTreeMap<u64, CuError>,
    /// Controls of the jobs running, by sequence number.
    controls: BTreeMap<u64, Arc<RunControl>>,
    /// Lanes stopped at a gate, by the gate job's sequence number.
    gated: BTreeMap<u64, (LaneKey, Arc<Gate>)>,
    workers: usize,
    idle_workers: usize,
    max_workers: usize,
    shutdown: bool,
    /// The client disconnected while the session waited: queued work was
    /// dropped, running work cancelled, and waits return at once.
    abandoned: bool,
    /// The VM's budgets: `queued_bytes` is charged with every byte queued here.
    vm: Option<Arc<LimitUse>>,
    /// Threads waiting on the engine's condition variable ([`Shared::wait`]).
    waiting: usize,
    /// Per context, the job all of its work submitted from now on waits for (`cuCtxWaitEvent`;
    /// several waits are joined by a barrier, so one job stands for them all).
    ctx_waits: BTreeMap<u64, u64>,
}

impl State {
    fn is_done(&self, seq: u64) -> bool {
        seq == 0 || (seq <= self.submitted && !self.unfinished.contains_key(&seq))
    }

    /// Whether every job up to `seq` has finished.
    fn prefix_done(&self, seq: u64) -> bool {
        self.unfinished.keys().next().is_none_or(|&s| s > seq)
    }

    /// The jobs a new job of `spec` must wait for besides its lane's earlier
    /// jobs: the legacy stream's implicit synchronization, and what its context was made to
    /// wait for ([`Engine::ctx_wait_for`]).
    fn implicit_deps(&self, spec: &LaneSpec) -> Vec<u64> {
        let mut deps = self.stream_deps(spec);
        if let Some(&wait) = self.ctx_waits.get(&spec.ctx)
            && !self.is_done(wait)
        {
            deps.push(wait);
        }
        deps
    }

    /// The legacy stream's implicit synchronization of a job of `spec`.
    fn stream_deps(&self, spec: &LaneSpec) -> Vec<u64> {
        match spec.kind {
            LaneKind::NonBlocking => Vec::new(),
            LaneKind::Blocking => self
                .lanes
                .get(&LaneKey::Legacy(spec.ctx))
                .map(|l| l.last)
                .filter(|&s| !self.is_done(s))
                .into_iter()
                .collect(),
            LaneKind::Legacy => self
                .lanes
                .values()
                .filter(|l| l.spec.ctx == spec.ctx && l.spec.kind == LaneKind::Blocking)
                .map(|l| l.last)
                .filter(|&s| !self.is_done(s))
                .collect(),
        }
    }

    /// Everything a synchronize on `spec` waits for: the lane's last job and
    /// its implicit dependencies.
    fn lane_targets(&self, spec: &LaneSpec) -> Vec<u64> {
        let mut t = self.stream_deps(spec);
        if let Some(l) = self.lanes.get(&spec.key) {
            t.push(l.last);
        }
        t
    }

    fn ready(&self, lane: &Lane) -> bool {
        lane.running.is_none()
            && lane
                .queue
                .front()
                .is_some_and(|e| e.deps.iter().all(|&d| self.is_done(d)))
    }

    /// The lane to run next: ready, highest priority (its front job's own, else
    /// the lane's), oldest job first.
    fn pick(&self) -> Option<LaneKey> {
        self.lanes
            .values()
            .filter(|l| self.ready(l))
            .min_by_key(|l| {
                let front = l.queue.front();
                (
                    front.and_then(|e| e.priority).unwrap_or(l.spec.priority),
                    front.map_or(0, |e| e.seq),
                )
            })
            .map(|l| l.spec.key)
    }

    fn ready_lanes(&self) -> usize {
        self.lanes.values().filter(|l| self.ready(l)).count()
    }

    fn busy(&self) -> bool {
        self.lanes.values().any(|l| !l.idle())
    }

    /// Whether a job of lane `spec` would start at once: the lane is idle, the work it implicitly
    /// waits for is done and its context is not poisoned.
    fn ready_now(&self, spec: &LaneSpec) -> bool {
        !self.poisoned.contains_key(&spec.ctx)
            && self.lanes.get(&spec.key).is_none_or(Lane::idle)
            && self.implicit_deps(spec).is_empty()
    }

    /// Returns `bytes` of queued work to the VM's `queued_bytes`.
    fn unqueue(&self, bytes: usize) {
        if let Some(vm) = &self.vm {
            vm.unqueue(bytes as u64);
        }
    }

    /// Whether a job of lane `spec` that also waits for `after` would run
    /// inline now (see [`Engine::submit_after`]) rather than be queued.
    fn runs_inline(&self, spec: &LaneSpec, after: &[u64], quick: bool) -> bool {
        quick
            && self.lanes.get(&spec.key).is_none_or(Lane::idle)
            && self.implicit_deps(spec).is_empty()
            && after.iter().all(|&s| self.is_done(s))
    }

    /// Drops queued work and releases lanes stopped at gates (the client
    /// has gone or the session ends).
    /// Returns the jobs dropped, for the caller to drop once the engine's lock is released
    /// (a dropped event record may end an interprocess event, which wakes other sessions).
    fn discard(&mut self, why: &str) -> Vec<Job> {
        let mut dropped = Vec::new();
        for lane in self.lanes.values_mut() {
            for e in lane.queue.drain(..) {
                self.unfinished.remove(&e.seq);
                if let Job::Gate(g) = &e.job {
                    g.abandon(why);
                }
                dropped.push(e.job);
            }
        }
        for (seq, (key, g)) in std::mem::take(&mut self.gated) {
            g.abandon(why);
            self.unfinished.remove(&seq);
            if let Some(l) = self.lanes.get_mut(&key) {
                l.running = None;
            }
        }
        self.queued = 0;
        let bytes = std::mem::take(&mut self.queued_bytes);
        self.unqueue(bytes);
        for c in self.controls.values() {
            c.cancel();
        }
        dropped
    }
}

struct Shared {
    state: Mutex<State>,
    /// Whether `State::poisoned` has an entry (set and cleared under the state lock): lets
    /// [`Engine::poisoned`], asked at every request, answer the common case without the lock.
    any_poisoned: AtomicBool,
    cv: Condvar,
    dev: Arc<dyn DeviceContext>,
    handles: Mutex<Vec<JoinHandle<()>>>,
    /// Told after every job's end ([`Engine::on_progress`]).
    progress: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the threads waiting on the engine; `st` is the locked state. With none waiting,
    /// nothing is done: a condition variable's notification is a system call even then, and it
    /// would cost every asynchronous call (a job's submission and its end) one.
    fn wake(&self, st: &State) {
        if st.waiting > 0 {
            self.cv.notify_all();
        }
    }

    /// Waits on the engine's condition variable (at most `timeout`), counted in
    /// [`State::waiting`] so that [`Shared::wake`] knows to notify.
    fn wait<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        timeout: Option<Duration>,
    ) -> MutexGuard<'a, State> {
        st.waiting += 1;
        let mut st = match timeout {
            None => self.cv.wait(st).unwrap_or_else(|p| p.into_inner()),
            Some(t) => {
                self.cv
                    .wait_timeout(st, t)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
        };
        st.waiting -= 1;
        st
    }

    fn finish(
        &self,
        st: &mut State,
        key: LaneKey,
        seq: u64,
        ctx: u64,
        result: Result<(), CuError>,
    ) {
        st.unfinished.remove(&seq);
        if let Some(l) = st.lanes.get_mut(&key) {
            if l.running == Some(seq) {
                l.running = None;
            }
            if l.forgotten && l.idle() {
                st.lanes.remove(&key);
            }
        }
        if let Err(e) = result {
            self.keep_error(st, seq, ctx, e);
        }
        self.wake(st);
        self.progressed();
    }

    /// A job ended: tells the [`Engine::on_progress`] listener.
    #[inline(always)]
    fn progressed(&self) {
        if let Some(f) = self.progress.get() {
            f();
        }
    }

    /// Keeps the error of inline job `seq` of context `ctx` (the lock not held), waking whoever
    /// waits for the engine.
    fn keep_inline_error(&self, seq: u64, ctx: u64, e: CuError) {
        let mut st = self.lock();
        self.keep_error(&mut st, seq, ctx, e);
        self.wake(&st);
    }

    /// Keeps the error of job `seq` of context `ctx` for the context's next synchronizing call;
    /// a sticky one poisons the context.
    fn keep_error(&self, st: &mut State, seq: u64, ctx: u64, e: CuError) {
        debug!(error = %e, seq, ctx, "asynchronous work failed");
        if cuda::is_sticky(e.code) {
            st.poisoned.entry(ctx).or_insert_with(|| e.clone());
            self.any_poisoned.store(true, Ordering::Release);
        }
        st.errors.entry(ctx).or_insert(e);
    }
}

/// Starts a worker when more lanes are ready than workers are idle.
fn spawn_if_needed(shared: &Arc<Shared>, st: &mut State) {
    if st.shutdown || st.workers >= st.max_workers || st.ready_lanes() <= st.idle_workers {
        return;
    }
    let s = Arc::clone(shared);
    let spawned = std::thread::Builder::new()
        .name("vgpu-engine".into())
        .spawn(move || worker_loop(&s));
    match spawned {
        Ok(h) => {
            // Counted idle until it takes its first job, so that the next
            // submission does not start another one for the same work.
            st.workers += 1;
            st.idle_workers += 1;
            shared
                .handles
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(h);
        }
        Err(e) => {
            // The workers already running take the work in turn.
            tracing::warn!(error = %e, "cannot start an engine worker thread");
            if st.workers == 0 {
                panic!("no engine worker thread could be started: {e}");
            }
        }
    }
}

fn abandoned_error() -> CuError {
    CuError::new(
        cuda::CUDA_ERROR_UNKNOWN,
        "the client disconnected; its work was abandoned",
    )
}

/// What an [`Until`] waits for.
#[derive(Debug, Clone)]
enum UntilWhat {
    /// These jobs (and every earlier job of their lanes) have run.
    Jobs(Vec<u64>),
    /// No job of `ctx` up to `last` is unfinished.
    Ctx { ctx: u64, last: u64 },
    /// Every job up to this one has run.
    Prefix(u64),
}

impl UntilWhat {
    fn reached(&self, st: &State) -> bool {
        match self {
            UntilWhat::Jobs(seqs) => seqs.iter().all(|&s| st.is_done(s)),
            UntilWhat::Ctx { ctx, last } => st.unfinished.range(..=*last).all(|(_, c)| c != ctx),
            UntilWhat::Prefix(last) => st.prefix_done(*last),
        }
    }
}

/// A point in a session's work that a synchronizing call waits for, fixed when the call came
/// (what its stream, event or context held then). Another thread may wait for it
/// ([`Until::wait`]): a synchronizing call that waits on a connection of its own
/// ([`crate::sync_ticket`]).
#[derive(Clone)]
pub struct Until {
    shared: Arc<Shared>,
    what: UntilWhat,
}

impl std::fmt::Debug for Until {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Until").field("what", &self.what).finish()
    }
}

impl Until {
    /// Waits at most `timeout` on any thread: whether the point was reached; an error once the
    /// session's work was abandoned (its client went) or the session ended, when it never will
    /// be.
    pub fn wait(&self, timeout: Duration) -> Result<bool, CuError> {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        loop {
            if st.abandoned || st.shutdown {
                return Err(CuError::new(
                    cuda::CUDA_ERROR_UNKNOWN,
                    "the session ended; its work was abandoned",
                ));
            }
            if self.what.reached(&st) {
                return Ok(true);
            }
            match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => st = self.shared.wait(st, Some(left)),
                _ => return Ok(false),
            }
        }
    }
}

/// A session's work queues.
pub struct Engine {
    shared: Arc<Shared>,
    /// Probe of the client's connection, checked while waiting.
    hangup: Option<HangupProbe>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.lock();
        f.debug_struct("Engine")
            .field("submitted", &st.submitted)
            .field("unfinished", &st.unfinished.len())
            .field("lanes", &st.lanes.len())
            .finish()
    }
}

impl Engine {
    /// An engine running work on `dev` with up to [`DEFAULT_WORKERS`] workers.
    pub fn new(dev: Arc<dyn DeviceContext>) -> Self {
        Self::with_workers(dev, DEFAULT_WORKERS)
    }

    /// An engine whose queued bytes are charged to a VM's `queued_bytes`
    /// (shared with the VM's other sessions).
    pub fn with_budget(dev: Arc<dyn DeviceContext>, vm: Arc<LimitUse>) -> Self {
        Self::build(dev, DEFAULT_WORKERS, Some(vm))
    }

    /// An engine with at most `workers` worker threads (at least one).
    pub fn with_workers(dev: Arc<dyn DeviceContext>, workers: usize) -> Self {
        Self::build(dev, workers, None)
    }

    fn build(dev: Arc<dyn DeviceContext>, workers: usize, vm: Option<Arc<LimitUse>>) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    max_workers: workers.max(1),
                    vm,
                    ..State::default()
                }),
                any_poisoned: AtomicBool::new(false),
                cv: Condvar::new(),
                dev,
                handles: Mutex::new(Vec::new()),
                progress: OnceLock::new(),
            }),
            hangup: None,
        }
    }

    /// Makes waits for this session's work (synchronizing calls, and
    /// back-pressure on a full queue) notice a client that disconnected: they
    /// check `probe` every [`HANGUP_POLL`], and when it says the client has
    /// gone, queued work is dropped, running work is cancelled, and the wait
    /// returns an error, so the session ends and frees its slice promptly
    /// instead of after its kernels (or the watchdog).
    pub fn watch_hangup(&mut self, probe: HangupProbe) {
        self.hangup = Some(probe);
    }

    /// The probe given to [`Engine::watch_hangup`], for work the session runs on its own
    /// thread (a module load).
    pub fn hangup_probe(&self) -> Option<HangupProbe> {
        self.hangup.clone()
    }

    /// Blocks on the engine's condition variable once; with a hangup probe,
    /// at most [`HANGUP_POLL`], abandoning the work when the client has gone.
    fn block<'a>(&'a self, st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        let Some(probe) = &self.hangup else {
            return self.shared.wait(st, None);
        };
        let st = self.shared.wait(st, Some(HANGUP_POLL));
        self.check_hangup(st, probe)
    }

    /// Abandons the session's work if its client has gone.
    fn check_hangup<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        probe: &HangupProbe,
    ) -> MutexGuard<'a, State> {
        if !st.abandoned && probe() {
            debug!(
                queued = st.queued,
                "the client disconnected while its session waited; abandoning its work"
            );
            st.abandoned = true;
            let dropped = st.discard("the client disconnected");
            self.shared.wake(&st);
            drop(st);
            drop(dropped);
            return self.shared.lock();
        }
        st
    }

    /// Has `f` called after every job's end from now on (on the thread that ran it; with the
    /// engine's lock held where a worker ran it, so `f` must only take a lock of its own). The
    /// first listener stays: returns whether `f` is it.
    pub fn on_progress(&self, f: impl Fn() + Send + Sync + 'static) -> bool {
        self.shared.progress.set(Box::new(f)).is_ok()
    }

    /// Submits a job of lane `spec`; returns its sequence number. Blocks
    /// while the queues are full.
    pub fn submit(&mut self, spec: &LaneSpec, job: Job) -> u64 {
        self.submit_after(spec, job, &[])
    }

    /// Submits a job that also waits for the jobs `after` (sequence numbers
    /// already submitted).
    pub fn submit_after(&mut self, spec: &LaneSpec, job: Job, after: &[u64]) -> u64 {
        self.submit_full(spec, job, after, None)
    }

    /// Submits a job of lane `spec` that starts, once it is at the front of its
    /// lane, with `priority` instead of the lane's (lower numbers first among
    /// ready lanes; `None`: the lane's). The lane's order is unchanged.
    /// `after` as for [`Engine::submit_after`].
    pub fn submit_with_priority(
        &mut self,
        spec: &LaneSpec,
        job: Job,
        after: &[u64],
        priority: Option<i32>,
    ) -> u64 {
        self.submit_full(spec, job, after, priority)
    }

    fn submit_full(
        &mut self,
        spec: &LaneSpec,
        job: Job,
        after: &[u64],
        priority: Option<i32>,
    ) -> u64 {
        let ctx = spec.ctx;
        let mut st = self.shared.lock();
        if let Some(p) = st.poisoned.get(&ctx) {
            // A context with a sticky error runs nothing more.
            let e = p.clone();
            let seq = st.submitted + 1;
            st.submitted = seq;
            if let Job::Gate(g) = &job {
                g.abandon("the context has a sticky error");
            }
            self.shared.finish(&mut st, spec.key, seq, ctx, Err(e));
            return seq;
        }
        let bytes = job.bytes();
        let quick = job.quick();
        let mut charged = false;
        let mut waited = false;
        loop {
            while !st.abandoned
                && st.queued > 0
                && (st.queued >= MAX_QUEUED_JOBS || st.queued_bytes + bytes > MAX_QUEUED_BYTES)
            {
                st = self.block(st);
            }
            if st.abandoned || bytes == 0 || st.runs_inline(spec, after, quick) {
                break;
            }
            let Some(vm) = st.vm.clone() else { break };
            if vm.try_queue(bytes as u64) {
                charged = true;
                break;
            }
            // The VM's queued work is at its budget: wait for some of it to run.
            if !waited {
                waited = true;
                vm.note_refused(Budget::QueuedBytes);
                debug!(
                    bytes,
                    queued = vm.used(Budget::QueuedBytes),
                    "the VM's queued work is at its limit (limits.queued_bytes); the session waits"
                );
            }
            if st.queued > 0 {
                // Our own work running returns bytes too, and wakes us.
                st = self.block(st);
            } else {
                // Only other sessions of the VM hold queued bytes.
                drop(st);
                vm.wait_queue_room(bytes as u64, QUEUE_ROOM_POLL.min(HANGUP_POLL));
                st = self.shared.lock();
                if let Some(probe) = &self.hangup {
                    st = self.check_hangup(st, probe);
                }
            }
        }
        let seq = st.submitted + 1;
        st.submitted = seq;
        if st.abandoned {
            // The client is gone: nothing more runs for it.
            if charged {
                st.unqueue(bytes);
            }
            if let Job::Gate(g) = &job {
                g.abandon("the client disconnected");
            }
            return seq;
        }
        let mut deps = st.implicit_deps(spec);
        deps.extend(after.iter().copied().filter(|&s| !st.is_done(s)));
        let lane = st.lanes.entry(spec.key).or_insert_with(|| Lane::new(*spec));
        lane.spec.priority = spec.priority;
        lane.last = seq;
        let inline = lane.idle() && deps.is_empty() && job.quick();
        if inline {
            if charged {
                // Decided under the same lock as the charge: not expected, but then
                // nothing is queued.
                st.unqueue(bytes);
            }
            drop(st);
            let at = priority.unwrap_or(spec.priority);
            self.run_inline(spec, at, seq, |dev| job.run(seq, dev));
            return seq;
        }
        st.unfinished.insert(seq, ctx);
        st.queued += 1;
        st.queued_bytes += bytes;
        if let Some(l) = st.lanes.get_mut(&spec.key) {
            l.queue.push_back(Entry {
                seq,
                ctx,
                job,
                deps,
                priority,
            });
        }
        spawn_if_needed(&self.shared, &mut st);
        self.shared.wake(&st);
        seq
    }

    /// Runs `count` quick jobs of lane `spec` inline, in order (`f(i, dev)` runs the `i`th), as
    /// [`Engine::try_inline`] runs one, with one acquisition of the lock for them all: a
    /// transport hands a run of posted calls of one stream here at once. Returns the first's
    /// sequence number; `None`, running nothing, when the caller must submit them instead (the
    /// lane is busy or waits for other work, or the context is poisoned).
    ///
    /// Their sequence numbers are taken together, and they are done, in order, when this
    /// returns, as the calls one by one would leave them: a failure is kept for the context's
    /// next synchronizing call, and a job after the context was poisoned (by an earlier job of
    /// the run, or by another of its lanes meanwhile) ends with the poisoning error without
    /// running, as its submission would have been refused.
    pub fn try_inline_run(
        &mut self,
        spec: &LaneSpec,
        count: usize,
        mut f: impl FnMut(usize, &dyn DeviceContext) -> Result<(), CuError>,
    ) -> Option<u64> {
        let ctx = spec.ctx;
        if count == 0 {
            return None;
        }
        let first = self.reserve_inline(spec, count)?;
        let last = first + count as u64 - 1;
        let dev = self.shared.dev.as_ref();
        crate::device::with_lane_at(spec.key.id(), spec.priority, || {
            for (i, seq) in (first..=last).enumerate() {
                if self.shared.any_poisoned.load(Ordering::Acquire) {
                    let mut st = self.shared.lock();
                    if let Some(p) = st.poisoned.get(&ctx).cloned() {
                        self.shared.finish(&mut st, spec.key, seq, ctx, Err(p));
                        continue;
                    }
                }
                if let Err(e) = f(i, dev) {
                    self.shared.keep_inline_error(seq, ctx, e);
                }
            }
        });
        self.shared.progressed();
        Some(first)
    }

    /// Runs `f` inline as the next job of lane `spec` if the lane is idle and
    /// its implicit dependencies are done (avoiding a copy of borrowed data);
    /// `None` when the caller must wait ([`Engine::wait_lane`]) or submit an
    /// owned job instead.
    pub fn try_inline(
        &mut self,
        spec: &LaneSpec,
        f: impl FnOnce(&dyn DeviceContext) -> Result<(), DeviceError>,
    ) -> Option<u64> {
        let seq = self.reserve_inline(spec, 1)?;
        self.run_inline(spec, spec.priority, seq, |dev| {
            f(dev).map_err(CuError::from)
        });
        Some(seq)
    }

    /// Takes the next `count` sequence numbers for jobs of lane `spec` that run inline, if the
    /// lane is idle, waits for no other lane's work and its context is not poisoned; returns the
    /// first.
    fn reserve_inline(&self, spec: &LaneSpec, count: usize) -> Option<u64> {
        let mut st = self.shared.lock();
        if !st.ready_now(spec) {
            return None;
        }
        let first = st.submitted + 1;
        let last = st.submitted + count as u64;
        st.submitted = last;
        st.lanes
            .entry(spec.key)
            .or_insert_with(|| Lane::new(*spec))
            .last = last;
        Some(first)
    }

    /// Runs job `seq` of lane `spec` at `priority` on this thread, the engine's lock released;
    /// a failure is kept for the context's next synchronizing call.
    ///
    /// The job is done when this returns, and nothing else looks for it meanwhile: work is
    /// submitted, waited for and asked about by the session's own thread, this one, so nothing
    /// depends on the job and nobody waits for it, and a worker finds its lane idle with nothing
    /// queued. So it is neither entered as unfinished nor marked running, and the lock is taken
    /// again only when it fails: a posted call's bookkeeping is one acquisition of the lock.
    ///
    /// Always inlined: on every posted call, where a call to it cost 20 more instructions.
    #[inline(always)]
    fn run_inline(
        &self,
        spec: &LaneSpec,
        priority: i32,
        seq: u64,
        job: impl FnOnce(&dyn DeviceContext) -> Result<(), CuError>,
    ) {
        let r =
            crate::device::with_lane_at(spec.key.id(), priority, || job(self.shared.dev.as_ref()));
        if let Err(e) = r {
            self.shared.keep_inline_error(seq, spec.ctx, e);
        }
        self.shared.progressed();
    }

    /// Records the error of an asynchronous request of context `ctx` refused
    /// before it ran ([`NO_CONTEXT`] when it named none).
    pub fn defer_error(&self, ctx: u64, e: CuError) {
        let mut st = self.shared.lock();
        st.errors.entry(ctx).or_insert(e);
    }

    /// Forgets a context's errors and poisoning (it was destroyed or reset).
    pub fn clear_context(&self, ctx: u64) {
        let mut st = self.shared.lock();
        st.ctx_waits.remove(&ctx);
        st.errors.remove(&ctx);
        st.poisoned.remove(&ctx);
        self.shared
            .any_poisoned
            .store(!st.poisoned.is_empty(), Ordering::Release);
    }

    /// Forgets a lane (its stream was destroyed); its pending work still runs.
    pub fn forget_lane(&self, key: LaneKey) {
        let mut st = self.shared.lock();
        if let Some(l) = st.lanes.get_mut(&key) {
            l.forgotten = true;
            if l.idle() {
                st.lanes.remove(&key);
            }
        }
    }

    /// Sequence number of the last job submitted to lane `key` (0 when none
    /// is known: the lane is new or went idle after its stream was forgotten).
    pub fn lane_last(&self, key: LaneKey) -> u64 {
        self.shared.lock().lanes.get(&key).map_or(0, |l| l.last)
    }

    /// Whether nothing is queued or running: a wait for this session's work would return at
    /// once.
    pub fn idle(&self) -> bool {
        !self.shared.lock().busy()
    }

    /// Sequence number of the last submitted job.
    pub fn submitted(&self) -> u64 {
        self.shared.lock().submitted
    }

    /// Whether every job up to `seq` (of every lane) has run.
    pub fn is_complete(&self, seq: u64) -> bool {
        self.shared.lock().prefix_done(seq)
    }

    /// Whether job `seq` has run (and with it every earlier job of its lane).
    pub fn is_done(&self, seq: u64) -> bool {
        self.shared.lock().is_done(seq)
    }

    /// Whether a job of lane `spec` submitted now would start at once (a stream memory wait
    /// whose word already meets it then needs no gate).
    pub fn ready_now(&self, spec: &LaneSpec) -> bool {
        self.shared.lock().ready_now(spec)
    }

    /// Whether lane `spec` has nothing pending (for `cuStreamQuery`): its
    /// jobs, and for the legacy stream the blocking streams' earlier work.
    pub fn lane_idle(&self, spec: &LaneSpec) -> bool {
        let st = self.shared.lock();
        st.lane_targets(spec).iter().all(|&s| st.is_done(s))
    }

    /// Waits until every job up to `seq` (of every lane) has run; an error
    /// when the client disconnected meanwhile ([`Engine::watch_hangup`]).
    pub fn wait(&self, seq: u64) -> Result<(), CuError> {
        self.reach(&self.until(UntilWhat::Prefix(seq)), None)
            .map(drop)
    }

    /// Waits until job `seq` has run (and every earlier job of its lane).
    pub fn wait_job(&self, seq: u64) -> Result<(), CuError> {
        self.reach(&self.until_job(seq), None).map(drop)
    }

    /// Waits until lane `spec` has nothing pending (`cuStreamSynchronize`),
    /// see [`Engine::lane_idle`].
    pub fn wait_lane(&self, spec: &LaneSpec) -> Result<(), CuError> {
        self.reach(&self.until_lane(spec), None).map(drop)
    }

    /// Waits until no work of context `ctx` is pending (`cuCtxSynchronize`).
    pub fn wait_ctx(&self, ctx: u64) -> Result<(), CuError> {
        self.reach(&self.until_ctx(ctx), None).map(drop)
    }

    /// The point where job `seq` (and every earlier job of its lane) has run.
    pub fn until_job(&self, seq: u64) -> Until {
        self.until(UntilWhat::Jobs(vec![seq]))
    }

    /// The point where everything lane `spec` holds now has run (see [`Engine::lane_idle`]).
    pub fn until_lane(&self, spec: &LaneSpec) -> Until {
        let targets = self.shared.lock().lane_targets(spec);
        self.until(UntilWhat::Jobs(targets))
    }

    /// The point where every job submitted so far (of every lane) has run.
    pub fn until_all(&self) -> Until {
        let last = self.submitted();
        self.until(UntilWhat::Prefix(last))
    }

    /// The point where every job of context `ctx` submitted so far has run.
    pub fn until_ctx(&self, ctx: u64) -> Until {
        let last = self.submitted();
        self.until(UntilWhat::Ctx { ctx, last })
    }

    fn until(&self, what: UntilWhat) -> Until {
        Until {
            shared: Arc::clone(&self.shared),
            what,
        }
    }

    /// Waits until `until` is reached, at most `timeout` (`None`: as long as it takes),
    /// watching the client's hang-up as every wait of the session does: whether it was reached,
    /// an error when the client disconnected meanwhile.
    pub fn reach(&self, until: &Until, timeout: Option<Duration>) -> Result<bool, CuError> {
        // The clock is read only once the point is found not reached.
        let mut deadline = None;
        let mut st = self.shared.lock();
        loop {
            if st.abandoned {
                return Err(abandoned_error());
            }
            if until.what.reached(&st) {
                return Ok(true);
            }
            let left = match timeout {
                None => None,
                Some(t) => {
                    let d = *deadline.get_or_insert_with(|| Instant::now() + t);
                    match d.checked_duration_since(Instant::now()) {
                        Some(left) if !left.is_zero() => Some(left),
                        _ => return Ok(false),
                    }
                }
            };
            st = match (left, &self.hangup) {
                (None, _) => self.block(st),
                (Some(left), None) => self.shared.wait(st, Some(left)),
                (Some(left), Some(probe)) => {
                    let st = self.shared.wait(st, Some(left.min(HANGUP_POLL)));
                    self.check_hangup(st, probe)
                }
            };
        }
    }

    /// Waits until nothing is queued or running, even for a client that
    /// disconnected (its cancelled work stops at the next point it can): for
    /// releasing what queued work could still touch.
    pub fn settle(&self) {
        let mut st = self.shared.lock();
        while st.busy() {
            // Watching for a hang-up: a lane stopped at a gate nobody opens (a host function
            // that never returns) is released when the client goes.
            st = self.block(st);
        }
    }

    /// Waits until everything submitted has run.
    pub fn drain(&self) -> Result<(), CuError> {
        self.wait(self.submitted())
    }

    /// Takes the first error of context `ctx`'s asynchronous work (or of a
    /// malformed asynchronous request) since the last call. A sticky error
    /// stays.
    pub fn take_error(&self, ctx: u64) -> Option<CuError> {
        let mut st = self.shared.lock();
        if let Some(p) = st.poisoned.get(&ctx) {
            return Some(p.clone());
        }
        st.errors
            .remove(&ctx)
            .or_else(|| st.errors.remove(&NO_CONTEXT))
    }

    /// The sticky error that poisoned context `ctx`, if any.
    pub fn poisoned(&self, ctx: u64) -> Option<CuError> {
        if !self.shared.any_poisoned.load(Ordering::Acquire) {
            return None;
        }
        self.shared.lock().poisoned.get(&ctx).cloned()
    }

    /// Records `clock` as an event record job of lane `spec`.
    pub fn record(&mut self, spec: &LaneSpec, clock: &Arc<EventClock>) -> u64 {
        let seq = self.submitted() + 1;
        clock.set(EventRecord { seq, time: None });
        let got = self.submit(spec, Job::Record(Arc::clone(clock)));
        debug_assert_eq!(got, seq);
        got
    }

    /// Makes later work of lane `spec` wait for every job up to `seq` (of any
    /// lane); nothing when they are done. A pool block freed on one stream
    /// and reused on another waits so for the work before its free, as
    /// CUDA's internal dependencies of stream-ordered pools do.
    pub fn wait_for_prefix(&mut self, spec: &LaneSpec, seq: u64) -> Option<u64> {
        let deps: Vec<u64> = self
            .shared
            .lock()
            .unfinished
            .range(..=seq)
            .map(|(&s, _)| s)
            .collect();
        if deps.is_empty() {
            return None;
        }
        Some(self.submit_after(spec, Job::Barrier, &deps))
    }

    /// Makes later work of lane `spec` wait for job `seq` (an event's
    /// record, `cuStreamWaitEvent`); nothing when it is done already.
    pub fn wait_for(&mut self, spec: &LaneSpec, seq: u64) -> Option<u64> {
        if self.is_done(seq) {
            return None;
        }
        Some(self.submit_after(spec, Job::Barrier, &[seq]))
    }

    /// Records `clock` once every job of context `ctx` submitted so far has run
    /// (`cuCtxRecordEvent`), on the context's record lane; returns the record's sequence number.
    pub fn record_ctx(&mut self, ctx: u64, clock: &Arc<EventClock>) -> u64 {
        let spec = LaneSpec::context(ctx);
        let (seq, deps) = {
            let st = self.shared.lock();
            let deps: Vec<u64> = st
                .unfinished
                .iter()
                .filter(|&(_, &c)| c == ctx)
                .map(|(&s, _)| s)
                .collect();
            (st.submitted + 1, deps)
        };
        clock.set(EventRecord { seq, time: None });
        let got = self.submit_after(&spec, Job::Record(Arc::clone(clock)), &deps);
        debug_assert_eq!(got, seq);
        got
    }

    /// Makes every job of context `ctx` submitted from now on, on any of its lanes, wait for job
    /// `seq` (`cuCtxWaitEvent`); nothing when it is done.
    /// A context that already waits for an unfinished job gets a barrier on its record lane
    /// after both, which it waits for instead: one job per context, however many waits.
    pub fn ctx_wait_for(&mut self, ctx: u64, seq: u64) {
        let earlier = {
            let st = self.shared.lock();
            if st.is_done(seq) {
                return;
            }
            st.ctx_waits.get(&ctx).copied().filter(|&s| !st.is_done(s))
        };
        let wait = match earlier {
            // The barrier's lane is the context's, so it waits for `earlier` already.
            Some(_) => self.submit_after(&LaneSpec::context(ctx), Job::Barrier, &[seq]),
            None => seq,
        };
        self.shared.lock().ctx_waits.insert(ctx, wait);
    }
}

fn worker_loop(shared: &Arc<Shared>) {
    // Counted idle when it was started.
    let mut counted = true;
    loop {
        let mut st = shared.lock();
        if !counted {
            st.idle_workers += 1;
        }
        counted = false;
        let key = loop {
            if st.shutdown {
                st.idle_workers -= 1;
                st.workers -= 1;
                return;
            }
            if let Some(k) = st.pick() {
                break k;
            }
            st = shared.wait(st, None);
        };
        st.idle_workers -= 1;
        let Some((e, at)) = st.lanes.get_mut(&key).and_then(|l| {
            let e = l.queue.pop_front()?;
            l.running = Some(e.seq);
            let at = e.priority.unwrap_or(l.spec.priority);
            Some((e, at))
        }) else {
            continue;
        };
        st.queued -= 1;
        st.queued_bytes -= e.job.bytes();
        st.unqueue(e.job.bytes());
        let (seq, ctx) = (e.seq, e.ctx);
        let poisoned = st.poisoned.get(&ctx).cloned();
        if let Job::Gate(g) = &e.job {
            if let Some(p) = poisoned {
                g.abandon("the context has a sticky error");
                shared.finish(&mut st, key, seq, ctx, Err(p));
                continue;
            }
            let link = GateLink {
                shared: Arc::downgrade(shared),
                key,
                seq,
                ctx,
            };
            if let Some(r) = g.reach(link) {
                shared.finish(&mut st, key, seq, ctx, r);
            } else {
                st.gated.insert(seq, (key, Arc::clone(g)));
            }
            continue;
        }
        let control = match &e.job {
            Job::Other(w) => w.control(),
            _ => None,
        };
        if let Some(c) = &control {
            st.controls.insert(seq, Arc::clone(c));
        }
        // Other lanes may be ready too: they get a worker of their own.
        spawn_if_needed(shared, &mut st);
        drop(st);
        let r = match poisoned {
            Some(p) => Err(p),
            None => {
                crate::device::with_lane_at(key.id(), at, || e.job.run(seq, shared.dev.as_ref()))
            }
        };
        let mut st = shared.lock();
        st.controls.remove(&seq);
        shared.finish(&mut st, key, seq, ctx, r);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let dropped = {
            let mut st = self.shared.lock();
            st.shutdown = true;
            let dropped = st.discard("the session ended");
            if !dropped.is_empty() {
                debug!(
                    dropped = dropped.len(),
                    "session ended with queued work; discarding it"
                );
            }
            self.shared.wake(&st);
            dropped
        };
        drop(dropped);
        let handles = std::mem::take(
            &mut *self
                .shared
                .handles
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for h in handles {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    use std::time::Duration;

    use super::*;
    use crate::device::Device;
    use crate::testutils::MemDevice;

    const L1: LaneSpec = LaneSpec {
        key: LaneKey::Legacy(1),
        ctx: 1,
        kind: LaneKind::Legacy,
        priority: 0,
    };
    const L2: LaneSpec = LaneSpec {
        key: LaneKey::Legacy(2),
        ctx: 2,
        kind: LaneKind::Legacy,
        priority: 0,
    };

    fn stream(h: u64, kind: LaneKind, priority: i32) -> LaneSpec {
        LaneSpec {
            key: LaneKey::Stream(h),
            ctx: 1,
            kind,
            priority,
        }
    }

    fn engine() -> Engine {
        let d = MemDevice::new(1 << 20, Duration::ZERO);
        Engine::new(d.open("t").unwrap())
    }

    struct Step {
        log: Arc<Mutex<Vec<usize>>>,
        id: usize,
        gate: Option<Arc<AtomicBool>>,
        result: Result<(), CuError>,
        control: Option<Arc<RunControl>>,
    }

    impl Work for Step {
        fn run(self: Box<Self>, _dev: &dyn DeviceContext) -> Result<(), CuError> {
            if let Some(g) = &self.gate {
                while !g.load(std::sync::atomic::Ordering::Acquire) {
                    if self.control.as_ref().is_some_and(|c| c.cancelled()) {
                        return Err(CuError::new(cuda::CUDA_ERROR_LAUNCH_FAILED, "cancelled"));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            self.log.lock().unwrap().push(self.id);
            self.result
        }
        fn control(&self) -> Option<Arc<RunControl>> {
            self.control.clone()
        }
    }

    fn step(log: &Arc<Mutex<Vec<usize>>>, id: usize) -> Job {
        Job::Other(Box::new(Step {
            log: Arc::clone(log),
            id,
            gate: None,
            result: Ok(()),
            control: None,
        }))
    }

    #[test]
    fn jobs_run_in_submission_order() {
        let mut e = engine();
        let log = Arc::new(Mutex::new(Vec::new()));
        let seqs: Vec<u64> = (0..100).map(|i| e.submit(&L1, step(&log, i))).collect();
        e.wait(*seqs.last().unwrap()).unwrap();
        assert_eq!(*log.lock().unwrap(), (0..100).collect::<Vec<_>>());
        assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1));
    }

    #[test]
    fn a_full_queue_blocks_the_submitter_until_work_completes() {
        let mut e = engine();
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(AtomicBool::new(false));
        e.submit(
            &L1,
            Job::Other(Box::new(Step {
                log: Arc::clone(&log),
                id: 0,
                gate: Some(Arc::clone(&gate)),
                result: Ok(()),
                control: None,
            })),
        );
        let submitted = Arc::new(AtomicUsize::new(0));
        let (s2, l2) = (Arc::clone(&submitted), Arc::clone(&log));
        let t = std::thread::spawn(move || {
            for i in 1..=MAX_QUEUED_JOBS + 10 {
                e.submit(&L1, step(&l2, i));
                s2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            e
        });
        std::thread::sleep(Duration::from_millis(200));
        // The first job is still running: the queue holds at most MAX_QUEUED_JOBS.
        let n = submitted.load(std::sync::atomic::Ordering::SeqCst);
        assert!(n <= MAX_QUEUED_JOBS + 1, "{n} submitted past a full queue");
        gate.store(true, std::sync::atomic::Ordering::Release);
        let e = t.join().unwrap();
        e.drain().unwrap();
        assert_eq!(log.lock().unwrap().len(), MAX_QUEUED_JOBS + 11);
    }

    #[test]
    fn sticky_errors_poison_only_their_context() {
        let mut e = engine();
        let log = Arc::new(Mutex::new(Vec::new()));
        let fault = Step {
            log: Arc::clone(&log),
            id: 0,
            gate: None,
            result: Err(CuError::new(cuda::CUDA_ERROR_ILLEGAL_ADDRESS, "boom")),
            control: None,
        };
        e.submit(&L1, Job::Other(Box::new(fault)));
        e.submit(&L1, step(&log, 1));
        let seq = e.submit(&L2, step(&log, 2));
        e.wait(seq).unwrap();
        // The job of the faulted context never ran; the other context's did
        // (the contexts' legacy streams run concurrently: any order).
        let mut ran = log.lock().unwrap().clone();
        ran.sort_unstable();
        assert_eq!(ran, vec![0, 2]);
        assert_eq!(e.take_error(1).unwrap().code, 700);
        assert_eq!(e.take_error(1).unwrap().code, 700);
        assert!(e.take_error(2).is_none());
        assert!(e.try_inline(&L1, |_| Ok(())).is_none());
        // Destroying the context clears it.
        e.clear_context(1);
        assert!(e.take_error(1).is_none());
        assert!(e.try_inline(&L1, |_| Ok(())).is_some());
    }

    #[test]
    fn inline_jobs_are_done_when_submitted_and_their_errors_surface_later() {
        let mut e = engine();
        let log = Arc::new(Mutex::new(Vec::new()));
        // Quick jobs on an idle lane run on the submitting thread, before `submit` returns.
        let fill = || Job::Memset {
            dst: 0x1,
            value: 0,
            elem_size: 1,
            count: 1,
        };
        let a = e.submit(&L1, fill());
        let b = e
            .try_inline(&L1, |_| Ok(()))
            .expect("an idle lane runs inline");
        assert_eq!((a, b), (1, 2));
        assert!(e.is_done(a) && e.is_done(b) && e.is_complete(b));
        assert!(e.idle() && e.lane_idle(&L1));
        assert_eq!((e.lane_last(L1.key), e.submitted()), (b, b));
        // The failed fill is reported once, by the context's next synchronizing call.
        e.wait_ctx(1).unwrap();
        assert_eq!(
            e.take_error(1).unwrap().code,
            cuda::CUDA_ERROR_INVALID_VALUE
        );
        assert!(e.take_error(1).is_none());
        // Work submitted after them is numbered after them and waits for nothing.
        let c = e.submit(&L2, step(&log, 1));
        assert_eq!(c, b + 1);
        e.wait(c).unwrap();
        // A sticky failure of an inline job poisons its context: its later work does not run.
        let fault = e.try_inline(&L1, |_| {
            Err(DeviceError::Fault {
                code: cuda::CUDA_ERROR_ILLEGAL_ADDRESS,
                message: "boom".into(),
            })
        });
        assert!(fault.is_some());
        let d = e.submit(&L1, step(&log, 2));
        e.wait(d).unwrap();
        assert_eq!(*log.lock().unwrap(), vec![1]);
        assert_eq!(
            e.take_error(1).unwrap().code,
            cuda::CUDA_ERROR_ILLEGAL_ADDRESS
        );
        assert!(e.try_inline(&L1, |_| Ok(())).is_none());
        assert!(e.take_error(2).is_none());
    }

    #[test]
    fn a_run_of_inline_jobs_ends_as_one_submission_each_would_end() {
        let mut e = engine();
        let log = Arc::new(Mutex::new(Vec::new()));
        let invalid = CuError::new(cuda::CUDA_ERROR_INVALID_VALUE, "failed");
        let fault = CuError::new(cuda::CUDA_ERROR_ILLEGAL_ADDRESS, "failed");
        // Each job logs its id and returns its result.
        let run = |e: &mut Engine, spec: &LaneSpec, jobs: &[(usize, Option<&CuError>)]| {
            e.try_inline_run(spec, jobs.len(), |i, _| {
                let (id, err) = jobs[i];
                log.lock().unwrap().push(id);
                err.map_or(Ok(()), |e| Err(e.clone()))
            })
        };
        assert_eq!(run(&mut e, &L1, &[]), None, "an empty run takes no number");
        // On an idle lane they run before the call returns, a failure among them kept.
        let first = run(&mut e, &L1, &[(1, None), (2, Some(&invalid)), (3, None)]);
        assert_eq!(first, Some(1));
        assert_eq!((e.submitted(), e.lane_last(L1.key)), (3, 3));
        assert!(e.is_done(3) && e.idle());
        assert_eq!(*log.lock().unwrap(), [1, 2, 3]);
        // Work submitted after them is numbered after them.
        assert_eq!(e.submit(&L1, step(&log, 4)), 4);
        e.wait(4).unwrap();
        assert_eq!(
            e.take_error(1).unwrap().code,
            cuda::CUDA_ERROR_INVALID_VALUE
        );
        assert!(e.take_error(1).is_none());

        // A busy lane runs nothing of it: the caller submits.
        let gate = Arc::new(AtomicBool::new(false));
        let held = e.submit(&L1, gated(&log, 5, &gate));
        assert_eq!(run(&mut e, &L1, &[(6, None)]), None);
        assert_eq!(e.submitted(), held);
        gate.store(true, Ordering::Release);
        e.wait(held).unwrap();

        // A sticky failure poisons the context: the run's later jobs do not run, nor later
        // runs; another context runs its own.
        assert!(run(&mut e, &L1, &[(7, Some(&fault)), (8, None)]).is_some());
        assert!(e.is_done(e.submitted()));
        assert_eq!(run(&mut e, &L1, &[(9, None)]), None);
        assert!(run(&mut e, &L2, &[(10, None)]).is_some());
        assert_eq!(log.lock().unwrap()[4..], [5, 7, 10]);
        assert_eq!(
            e.take_error(1).unwrap().code,
            cuda::CUDA_ERROR_ILLEGAL_ADDRESS
        );
        assert!(e.take_error(2).is_none());
    }

    #[test]
    fn non_sticky_errors_are_reported_once() {
        let mut e = engine();
        e.submit(
            &L1,
            Job::Memset {
                dst: 0x1,
                value: 0,
                elem_size: 1,
                count: 1,
            },
        );
        assert!(e.take_error(2).is_none(), "errors belong to their context");
        assert_eq!(
            e.take_error(1).unwrap().code,
            cuda::CUDA_ERROR_INVALID_VALUE
        );
        assert!(e.take_error(1).is_none());
        e.defer_error(NO_CONTEXT, CuError::invalid_value("malformed"));
        assert_eq!(
            e.take_error(5).unwrap().code,
            cuda::CUDA_ERROR_INVALID_VALUE
        );
    }

    #[test]
    fn dropping_the_engine_cancels_running_work() {
        let mut e = engine();
        let log = Arc::new(Mutex::new(Vec::new()));
        let control = Arc::new(RunControl::default());
        e.submit(
            &L1,
            Job::Other(Box::new(Step {
                log: Arc::clone(&log),
                id: 0,
                gate: Some(Arc::new(AtomicBool::new(false))),
                result: Ok(()),
                control: Some(Arc::clone(&control)),
            })),
        );
        e.submit(&L1, step(&log, 1));
        std::thread::sleep(Duration::from_millis(20));
        drop(e);
        assert!(control.cancelled());
        assert!(log.lock().unwrap().is_empty());
    }

    #[test]
    fn a_wait_notices_a_client_that_hung_up_and_abandons_its_work() {
        let mut e = engine();
        let gone = Arc::new(AtomicBool::new(false));
        let probe = Arc::clone(&gone);
        e.watch_hangup(Arc::new(move || {
            probe.load(std::sync::atomic::Ordering::Acquire)
        }));
        let log = Arc::new(Mutex::new(Vec::new()));
        let control = Arc::new(RunControl::default());
        let first = e.submit(
            &L1,
            Job::Other(Box::new(Step {
                log: Arc::clone(&log),
                id: 0,
                gate: Some(Arc::new(AtomicBool::new(false))),
                result: Ok(()),
                control: Some(Arc::clone(&control)),
            })),
        );
        let last = e.submit(&L1, step(&log, 1));
        assert!(first < last);
        let hang_up = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            gone.store(true, std::sync::atomic::Ordering::Release);
        });
        let t = Instant::now();
        let r = e.wait(last);
        hang_up.join().unwrap();
        assert!(r.is_err(), "the wait ends with an error");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(control.cancelled(), "the running job was cancelled");
        e.settle();
        assert!(log.lock().unwrap().is_empty(), "the queued job never ran");
        // Later waits return at once.
        assert!(e.drain().is_err());
    }

    #[test]
    fn event_records_complete_in_order() {
        let mut e = engine();
        let clock = Arc::new(EventClock::default());
        assert_eq!(clock.get().seq, 0);
        let seq = e.record(&L1, &clock);
        e.wait(seq).unwrap();
        let r = clock.get();
        assert_eq!(r.seq, seq);
        assert!(r.time.is_some());
    }

    #[test]
    fn settling_behind_a_gate_nobody_opens_ends_when_the_client_hangs_up() {
        let mut e = engine();
        let gone = Arc::new(AtomicBool::new(false));
        let probe = Arc::clone(&gone);
        e.watch_hangup(Arc::new(move || {
            probe.load(std::sync::atomic::Ordering::Acquire)
        }));
        let g = Arc::new(Gate::default());
        e.submit(&L1, Job::Gate(Arc::clone(&g)));
        let hang_up = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            gone.store(true, std::sync::atomic::Ordering::Release);
        });
        let t = Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        let settler = std::thread::spawn(move || {
            e.settle();
            let _ = tx.send(t.elapsed());
            e
        });
        let took = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("settle returned once the client hung up");
        assert!(took >= Duration::from_millis(100), "it waited for the gate");
        let e = settler.join().unwrap();
        assert!(e.lane_idle(&L1), "the gate's lane was released");
        drop(g);
        hang_up.join().unwrap();
    }

    fn gated(log: &Arc<Mutex<Vec<usize>>>, id: usize, gate: &Arc<AtomicBool>) -> Job {
        Job::Other(Box::new(Step {
            log: Arc::clone(log),
            id,
            gate: Some(Arc::clone(gate)),
            result: Ok(()),
            control: None,
        }))
    }

    #[test]
    fn independent_lanes_do_not_wait_for_each_other() {
        let mut e = engine();
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(AtomicBool::new(false));
        let s1 = stream(0x10, LaneKind::NonBlocking, 0);
        let s2 = stream(0x20, LaneKind::NonBlocking, 0);
        let blocked = e.submit(&s1, gated(&log, 0, &gate));
        let after = e.submit(&s1, step(&log, 1));
        let other = e.submit(&s2, step(&log, 2));
        e.wait_job(other).unwrap();
        assert!(!e.is_done(blocked) && !e.is_done(after));
        assert!(!e.lane_idle(&s1) && e.lane_idle(&s2));
        assert!(
            !e.is_complete(other),
            "a prefix wait still covers the first lane"
        );
        gate.store(true, std::sync::atomic::Ordering::Release);
        e.wait_lane(&s1).unwrap();
        assert_eq!(*log.lock().unwrap(), vec![2, 0, 1]);
    }

    #[test]
    fn an_event_wait_orders_work_across_lanes() {
        let mut e = engine();
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(AtomicBool::new(false));
        let s1 = stream(0x10, LaneKind::NonBlocking, 0);
        let s2 = stream(0x20, LaneKind::NonBlocking, 0);
        e.submit(&s1, gated(&log, 0, &gate));
        let clock = Arc::new(EventClock::default());
        let rec = e.record(&s1, &clock);
        assert!(e.wait_for(&s2, rec).is_some());
        let waiting = e.submit(&s2, step(&log, 1));
        std::thread::sleep(Duration::from_millis(30));
        assert!(
            !e.is_done(waiting),
            "the waiting lane holds until the record"
        );
        gate.store(true, std::sync::atomic::Ordering::Release);
        e.wait_job(waiting).unwrap();
        assert_eq!(*log.lock().unwrap(), vec![0, 1]);
        // Waiting for a record that is done adds nothing.
        assert!(e.wait_for(&s2, rec).is_none());
    }

    #[test]
    fn the_legacy_stream_synchronizes_with_blocking_streams_only() {
        let mut e = engine();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (g_block, g_nonblock) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let blocking = stream(0x10, LaneKind::Blocking, 0);
        let nonblocking = stream(0x20, LaneKind::NonBlocking, 0);
        e.submit(&nonblocking, gated(&log, 0, &g_nonblock));
        e.submit(&blocking, gated(&log, 1, &g_block));
        let legacy = e.submit(&L1, step(&log, 2));
        // Blocking work submitted after the legacy job waits for it.
        let later = e.submit(&blocking, step(&log, 3));
        std::thread::sleep(Duration::from_millis(30));
        assert!(!e.is_done(legacy));
        g_block.store(true, std::sync::atomic::Ordering::Release);
        e.wait_job(later).unwrap();
        assert!(
            !e.lane_idle(&nonblocking),
            "the non-blocking stream still runs"
        );
        g_nonblock.store(true, std::sync::atomic::Ordering::Release);
        e.drain().unwrap();
        assert_eq!(*log.lock().unwrap(), vec![1, 2, 3, 0]);
    }

    #[test]
    fn higher_priority_lanes_start_first() {
        let d = MemDevice::new(1 << 20, Duration::ZERO);
        let mut e = Engine::with_workers(d.open("t").unwrap(), 1);
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(AtomicBool::new(false));
        let busy = stream(0x10, LaneKind::NonBlocking, 0);
        let low = stream(0x20, LaneKind::NonBlocking, 0);
        let high = stream(0x30, LaneKind::NonBlocking, -2);
        e.submit(&busy, gated(&log, 0, &gate));
        std::thread::sleep(Duration::from_millis(20));
        e.submit(&low, step(&log, 1));
        e.submit(&high, step(&log, 2));
        gate.store(true, std::sync::atomic::Ordering::Release);
        e.drain().unwrap();
        assert_eq!(*log.lock().unwrap(), vec![0, 2, 1]);
    }

    #[test]
    fn a_job_priority_overrides_its_lanes_and_never_reorders_it() {
        let d = MemDevice::new(1 << 20, Duration::ZERO);
        let mut e = Engine::with_workers(d.open("t").unwrap(), 1);
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(AtomicBool::new(false));
        let busy = stream(0x10, LaneKind::NonBlocking, 0);
        let a = stream(0x20, LaneKind::NonBlocking, 0);
        let b = stream(0x30, LaneKind::NonBlocking, 0);
        let c = stream(0x40, LaneKind::NonBlocking, -5);
        e.submit(&busy, gated(&log, 0, &gate));
        std::thread::sleep(Duration::from_millis(20));
        // Equal priorities: the older job first.
        e.submit_with_priority(&a, step(&log, 1), &[], Some(-1));
        // A job with a high priority of its own, behind an ordinary job of its lane:
        // the lane's order holds (2 before 3), and 3 then goes before the older 4.
        e.submit(&b, step(&log, 2));
        e.submit_with_priority(&b, step(&log, 3), &[], Some(-4));
        e.submit_with_priority(&a, step(&log, 4), &[], Some(-1));
        // A job of a high-priority stream lowered below every other.
        e.submit_with_priority(&c, step(&log, 5), &[], Some(0));
        e.submit_with_priority(&a, step(&log, 6), &[], Some(-2));
        gate.store(true, std::sync::atomic::Ordering::Release);
        e.drain().unwrap();
        // Ready after the busy job: a(1,-1) b(2,0) c(5,0) -> 1; then a(4,-1) b(2,0) c(5,0) -> 4;
        // then a(6,-2) -> 6; then b(2,0) c(5,0): older first -> 2; then b(3,-4) -> 3; then 5.
        assert_eq!(*log.lock().unwrap(), vec![0, 1, 4, 6, 2, 3, 5]);
    }

    #[test]
    fn a_gate_holds_its_lane_until_opened() {
        let mut e = engine();
        let log = Arc::new(Mutex::new(Vec::new()));
        let s1 = stream(0x10, LaneKind::NonBlocking, 0);
        let g = Arc::new(Gate::default());
        let gate_seq = e.submit(&s1, Job::Gate(Arc::clone(&g)));
        let after = e.submit(&s1, step(&log, 1));
        assert_eq!(g.wait_reached(Duration::from_secs(10)), GateState::Reached);
        std::thread::sleep(Duration::from_millis(20));
        assert!(!e.is_done(gate_seq) && !e.is_done(after));
        assert!(log.lock().unwrap().is_empty());
        g.open();
        e.wait_job(after).unwrap();
        assert_eq!(*log.lock().unwrap(), vec![1]);
        assert_eq!(g.state(), GateState::Opened);
    }

    /// Many context waits cost one job per wait and hold later work until every awaited job is
    /// done, however many there are.
    #[test]
    fn a_contexts_waits_are_joined_and_hold_its_later_work() {
        let mut e = engine();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (s1, s2, s3) = (
            stream(0x10, LaneKind::NonBlocking, 0),
            stream(0x20, LaneKind::NonBlocking, 0),
            stream(0x30, LaneKind::NonBlocking, 0),
        );
        let (g1, g2) = (Arc::new(Gate::default()), Arc::new(Gate::default()));
        let w1 = e.submit(&s1, Job::Gate(Arc::clone(&g1)));
        let w2 = e.submit(&s2, Job::Gate(Arc::clone(&g2)));
        for _ in 0..100 {
            e.ctx_wait_for(1, w1);
            e.ctx_wait_for(1, w2);
        }
        assert_eq!(
            e.shared.lock().ctx_waits.len(),
            1,
            "one job stands for every wait"
        );
        let later = e.submit(&s3, step(&log, 1));
        g1.open();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!e.is_done(later), "still waiting for the second");
        g2.open();
        e.wait_job(later).unwrap();
        assert_eq!(*log.lock().unwrap(), vec![1]);
        assert!(
            e.shared.lock().unfinished.is_empty(),
            "the joining barriers ran"
        );
    }

    #[test]
    fn dropping_the_engine_abandons_unreached_gates() {
        let mut e = engine();
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(AtomicBool::new(false));
        let control = Arc::new(RunControl::default());
        let s1 = stream(0x10, LaneKind::NonBlocking, 0);
        e.submit(
            &s1,
            Job::Other(Box::new(Step {
                log: Arc::clone(&log),
                id: 0,
                gate: Some(gate),
                result: Ok(()),
                control: Some(Arc::clone(&control)),
            })),
        );
        let g = Arc::new(Gate::default());
        e.submit(&s1, Job::Gate(Arc::clone(&g)));
        drop(e);
        assert!(matches!(g.state(), GateState::Abandoned(_)));
    }
}
