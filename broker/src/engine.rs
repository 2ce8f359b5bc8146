//! Per-session ordered execution of device work.
//!
//! All work a session submits (copies, memsets, event records, launches) runs
//! in submission order, one job at a time. That satisfies every CUDA ordering
//! rule at once: per-stream order, the legacy default stream's
//! synchronisation with other streams, and `cuStreamWaitEvent` (the awaited
//! record always precedes the waiting work). A wait for a stream, an event
//! or a context is a wait for a prefix of the sequence.
//!
//! Errors are kept per context, as CUDA keeps them: the first error of a
//! context's asynchronous work is reported by its next synchronizing call,
//! and a sticky error (a kernel fault) poisons that context only — its later
//! work is skipped and every call in it fails — until it is destroyed.
//!
//! Quick jobs submitted while nothing is queued run inline on the session
//! thread (no hand-off); anything else goes to a worker thread, so the session
//! keeps answering queries while a kernel runs. The queue is bounded in jobs
//! and bytes: a client flooding asynchronous calls is slowed down by
//! back-pressure on its own connection, never by growing the daemon.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::debug;
use vgpu_proto::cuda;

use crate::device::{DeviceContext, DeviceError, RunControl};
use crate::error::CuError;

/// Most jobs queued per session before the submitter waits.
pub const MAX_QUEUED_JOBS: usize = 4096;
/// Most bytes of copy data queued per session before the submitter waits.
pub const MAX_QUEUED_BYTES: usize = 64 << 20;
/// How often a session waiting for its work checks that its client is
/// still connected ([`Engine::watch_hangup`]).
pub const HANGUP_POLL: Duration = Duration::from_millis(100);

/// Tells whether the session's client has gone (its connection closed).
pub type HangupProbe = Arc<dyn Fn() -> bool + Send + Sync>;

/// When an event's latest record completed.
#[derive(Debug, Default)]
pub struct EventClock {
    inner: Mutex<EventRecord>,
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

    fn set(&self, r: EventRecord) {
        *self.inner.lock().unwrap_or_else(|p| p.into_inner()) = r;
    }

    fn complete(&self, seq: u64) {
        let mut r = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if r.seq == seq {
            r.time = Some(Instant::now());
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
            Job::Other(_) => write!(f, "Work"),
        }
    }
}

/// Copies and fills up to this size count as quick (run inline when idle);
/// larger ones go to the worker so the session thread keeps decoding the
/// next requests while they run.
pub const QUICK_BYTES: u64 = 256 << 10;

impl Job {
    fn quick(&self) -> bool {
        match self {
            Job::Write { .. } | Job::Record(_) => true,
            Job::Copy { len, .. } => *len <= QUICK_BYTES,
            Job::Memset {
                count, elem_size, ..
            } => count.saturating_mul(u64::from(*elem_size)) <= QUICK_BYTES,
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
            Job::Other(w) => w.run(dev),
        }
    }
}

/// Key of errors that belong to no context (a malformed asynchronous request).
pub const NO_CONTEXT: u64 = 0;

#[derive(Default)]
struct State {
    queue: VecDeque<(u64, u64, Job)>,
    queued_bytes: usize,
    submitted: u64,
    completed: u64,
    running: bool,
    errors: BTreeMap<u64, CuError>,
    poisoned: BTreeMap<u64, CuError>,
    shutdown: bool,
    /// The client disconnected while the session waited: queued work was
    /// dropped, running work cancelled, and waits return at once.
    abandoned: bool,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    dev: Arc<dyn DeviceContext>,
    current: Mutex<Option<Arc<RunControl>>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn finish(&self, st: &mut State, seq: u64, ctx: u64, result: Result<(), CuError>) {
        st.running = false;
        st.completed = seq;
        if let Err(e) = result {
            debug!(error = %e, seq, ctx, "asynchronous work failed");
            if cuda::is_sticky(e.code) {
                st.poisoned.entry(ctx).or_insert_with(|| e.clone());
            }
            st.errors.entry(ctx).or_insert(e);
        }
        self.cv.notify_all();
    }
}

/// A session's ordered work queue.
pub struct Engine {
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
    /// Probe of the client's connection, checked while waiting.
    hangup: Option<HangupProbe>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.lock();
        f.debug_struct("Engine")
            .field("submitted", &st.submitted)
            .field("completed", &st.completed)
            .field("queued", &st.queue.len())
            .finish()
    }
}

impl Engine {
    /// An engine running work on `dev`.
    pub fn new(dev: Arc<dyn DeviceContext>) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                cv: Condvar::new(),
                dev,
                current: Mutex::new(None),
            }),
            worker: None,
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

    /// Blocks on the engine's condition variable once; with a hangup probe,
    /// at most [`HANGUP_POLL`], abandoning the work when the client has gone.
    fn block<'a>(&self, st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        let Some(probe) = &self.hangup else {
            return self.shared.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        };
        let (mut st, _) = self
            .shared
            .cv
            .wait_timeout(st, HANGUP_POLL)
            .unwrap_or_else(|p| p.into_inner());
        if !st.abandoned && probe() {
            debug!(
                queued = st.queue.len(),
                "the client disconnected while its session waited; abandoning its work"
            );
            st.abandoned = true;
            st.queue.clear();
            st.queued_bytes = 0;
            if let Some(c) = self
                .shared
                .current
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
            {
                c.cancel();
            }
            self.shared.cv.notify_all();
        }
        st
    }

    /// Submits a job of context `ctx`; returns its sequence number. Blocks
    /// while the queue is full.
    pub fn submit(&mut self, ctx: u64, job: Job) -> u64 {
        let mut st = self.shared.lock();
        let seq = st.submitted + 1;
        if let Some(p) = st.poisoned.get(&ctx) {
            // A context with a sticky error runs nothing more.
            let e = p.clone();
            st.submitted = seq;
            self.shared.finish(&mut st, seq, ctx, Err(e));
            return seq;
        }
        if st.queue.is_empty() && !st.running && job.quick() {
            st.submitted = seq;
            st.running = true;
            drop(st);
            let r = job.run(seq, self.shared.dev.as_ref());
            let mut st = self.shared.lock();
            self.shared.finish(&mut st, seq, ctx, r);
            return seq;
        }
        let bytes = job.bytes();
        while !st.abandoned
            && !st.queue.is_empty()
            && (st.queue.len() >= MAX_QUEUED_JOBS || st.queued_bytes + bytes > MAX_QUEUED_BYTES)
        {
            st = self.block(st);
        }
        if st.abandoned {
            // The client is gone: nothing more runs for it.
            st.submitted = seq;
            return seq;
        }
        st.submitted = seq;
        st.queued_bytes += bytes;
        st.queue.push_back((seq, ctx, job));
        self.shared.cv.notify_all();
        drop(st);
        self.ensure_worker();
        seq
    }

    fn ensure_worker(&mut self) {
        if self.worker.is_some() {
            return;
        }
        let shared = Arc::clone(&self.shared);
        self.worker = Some(
            std::thread::Builder::new()
                .name("vgpu-engine".into())
                .spawn(move || worker_loop(&shared))
                .expect("spawning an engine thread"),
        );
    }

    /// Runs `f` inline as the next job if nothing is queued or running
    /// (avoiding a copy of borrowed data); `None` when the engine is busy and
    /// the caller must submit an owned job instead.
    pub fn try_inline(
        &mut self,
        ctx: u64,
        f: impl FnOnce(&dyn DeviceContext) -> Result<(), DeviceError>,
    ) -> Option<u64> {
        let mut st = self.shared.lock();
        if !st.queue.is_empty() || st.running || st.poisoned.contains_key(&ctx) {
            return None;
        }
        let seq = st.submitted + 1;
        st.submitted = seq;
        st.running = true;
        drop(st);
        let r = f(self.shared.dev.as_ref()).map_err(CuError::from);
        let mut st = self.shared.lock();
        self.shared.finish(&mut st, seq, ctx, r);
        Some(seq)
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
        st.errors.remove(&ctx);
        st.poisoned.remove(&ctx);
    }

    /// Sequence number of the last submitted job.
    pub fn submitted(&self) -> u64 {
        self.shared.lock().submitted
    }

    /// Whether job `seq` (and everything before it) has run.
    pub fn is_complete(&self, seq: u64) -> bool {
        self.shared.lock().completed >= seq
    }

    /// Waits until job `seq` (and everything before it) has run; an error
    /// when the client disconnected meanwhile ([`Engine::watch_hangup`]).
    pub fn wait(&self, seq: u64) -> Result<(), CuError> {
        let mut st = self.shared.lock();
        while st.completed < seq {
            if st.abandoned {
                return Err(CuError::new(
                    cuda::CUDA_ERROR_UNKNOWN,
                    "the client disconnected; its work was abandoned",
                ));
            }
            st = self.block(st);
        }
        Ok(())
    }

    /// Waits until nothing is queued or running, even for a client that
    /// disconnected (its cancelled work stops at the next point it can): for
    /// releasing what queued work could still touch.
    pub fn settle(&self) {
        let mut st = self.shared.lock();
        while st.running || !st.queue.is_empty() {
            st = self.shared.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Waits until everything submitted has run.
    pub fn drain(&self) -> Result<(), CuError> {
        let seq = self.submitted();
        self.wait(seq)
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
        self.shared.lock().poisoned.get(&ctx).cloned()
    }

    /// Records `clock` as an event record job of context `ctx`.
    pub fn record(&mut self, ctx: u64, clock: &Arc<EventClock>) -> u64 {
        let seq = self.submitted() + 1;
        clock.set(EventRecord { seq, time: None });
        let got = self.submit(ctx, Job::Record(Arc::clone(clock)));
        debug_assert_eq!(got, seq);
        got
    }
}

fn worker_loop(shared: &Shared) {
    loop {
        let mut st = shared.lock();
        while st.queue.is_empty() && !st.shutdown {
            st = shared.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        if st.shutdown {
            return;
        }
        let (seq, ctx, job) = st.queue.pop_front().expect("queue is not empty");
        st.queued_bytes -= job.bytes();
        st.running = true;
        let poisoned = st.poisoned.get(&ctx).cloned();
        let control = match &job {
            Job::Other(w) => w.control(),
            _ => None,
        };
        *shared.current.lock().unwrap_or_else(|p| p.into_inner()) = control;
        drop(st);
        let r = match poisoned {
            Some(p) => Err(p),
            None => job.run(seq, shared.dev.as_ref()),
        };
        *shared.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let mut st = shared.lock();
        shared.finish(&mut st, seq, ctx, r);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.shutdown = true;
            let dropped = st.queue.len();
            st.queue.clear();
            st.queued_bytes = 0;
            if dropped > 0 {
                debug!(dropped, "session ended with queued work; discarding it");
            }
            self.shared.cv.notify_all();
        }
        if let Some(c) = self
            .shared
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            c.cancel();
        }
        if let Some(w) = self.worker.take() {
            let _ = w.join();
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
        let seqs: Vec<u64> = (0..100).map(|i| e.submit(1, step(&log, i))).collect();
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
            1,
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
                e.submit(1, step(&l2, i));
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
        e.submit(1, Job::Other(Box::new(fault)));
        e.submit(1, step(&log, 1));
        let seq = e.submit(2, step(&log, 2));
        e.wait(seq).unwrap();
        // The job of the faulted context never ran; the other context's did.
        assert_eq!(*log.lock().unwrap(), vec![0, 2]);
        assert_eq!(e.take_error(1).unwrap().code, 700);
        assert_eq!(e.take_error(1).unwrap().code, 700);
        assert!(e.take_error(2).is_none());
        assert!(e.try_inline(1, |_| Ok(())).is_none());
        // Destroying the context clears it.
        e.clear_context(1);
        assert!(e.take_error(1).is_none());
        assert!(e.try_inline(1, |_| Ok(())).is_some());
    }

    #[test]
    fn non_sticky_errors_are_reported_once() {
        let mut e = engine();
        e.submit(
            1,
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
            1,
            Job::Other(Box::new(Step {
                log: Arc::clone(&log),
                id: 0,
                gate: Some(Arc::new(AtomicBool::new(false))),
                result: Ok(()),
                control: Some(Arc::clone(&control)),
            })),
        );
        e.submit(1, step(&log, 1));
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
            1,
            Job::Other(Box::new(Step {
                log: Arc::clone(&log),
                id: 0,
                gate: Some(Arc::new(AtomicBool::new(false))),
                result: Ok(()),
                control: Some(Arc::clone(&control)),
            })),
        );
        let last = e.submit(1, step(&log, 1));
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
        let seq = e.record(1, &clock);
        e.wait(seq).unwrap();
        let r = clock.get();
        assert_eq!(r.seq, seq);
        assert!(r.time.is_some());
    }
}
