//! Stream memory waits (`cuStreamWaitValue32/64`, the waits of `cuStreamBatchMemOp`): a wait is
//! a [`Gate`] in its stream's lane, and once the lane reaches it, a session's watcher thread
//! reads the word it watches and opens the gate when the word meets the wait's condition.
//!
//! The word changes when some job writes it (a `cuStreamWriteValue`, a kernel, a copy or a
//! memset of any stream of the process), so the watcher looks again after every job's end
//! ([`Engine::on_progress`](crate::engine::Engine::on_progress)); and, for writers it is not told
//! about (another process of the VM writing memory this one imported), every
//! [`MAX_POLL`] at the latest. A wait whose word can no longer be read (its memory was freed)
//! ends its lane with `CUDA_ERROR_ILLEGAL_ADDRESS`, as a GPU's wait on unmapped memory faults.
//!
//! A context's waits end with it (`cuCtxDestroy` does not wait for a word nobody will write):
//! [`MemWaits::end_context`].
//!
//! Bounds: only waits whose lane reached them are watched, at most one per lane; the thread
//! runs only while there are some, and ends with the session.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tracing::{debug, warn};
use vgpu_proto::cuda::{self, mem_op};

use crate::device::DeviceContext;
use crate::engine::{Gate, GateState};
use crate::error::CuError;

/// A newly reached wait is looked at at once; after a job's end the watcher looks again once
/// this long has passed since its last look (so a flood of jobs beside a wait that is not met
/// costs one look per `MIN_POLL`, not one per job); while nothing ends it looks after this long,
/// doubling up to [`MAX_POLL`].
pub const MIN_POLL: Duration = Duration::from_micros(50);
/// The longest the watcher sleeps while waits are reached.
pub const MAX_POLL: Duration = Duration::from_millis(2);
/// The lane the watcher reads words as ([`crate::device::current_lane`]): none of the guest's
/// (those are `ctx << 1` and odd stream handles), so that an executor with a queue per lane
/// does not put a read behind a guest stream's kernel, which may be waiting for the wait.
pub const WATCHER_LANE: u64 = u64::MAX - 1;

/// One wait: the word at `addr` (`width` bytes) against `value` under `condition`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueWait {
    /// Device address, aligned to `width`.
    pub addr: u64,
    /// 4 or 8.
    pub width: u32,
    /// One of `mem_op::WAIT_*`.
    pub condition: u32,
    /// The operand.
    pub value: u64,
}

struct Watched {
    ctx: u64,
    wait: ValueWait,
    gate: Weak<Gate>,
}

#[derive(Default)]
struct State {
    reached: Vec<Watched>,
    /// A job ended since the watcher last looked.
    kicked: bool,
    /// A wait was reached (or a context ended) since the watcher last looked.
    fresh: bool,
    /// The watcher thread is running.
    running: bool,
    /// The session ended.
    closed: bool,
    /// Contexts destroyed: their waits end when reached.
    ended: HashSet<u64>,
}

struct Inner {
    dev: Arc<dyn DeviceContext>,
    state: Mutex<State>,
    cv: Condvar,
    /// `state.reached.len()`, readable without the lock on every job's end.
    count: AtomicUsize,
    /// Rounds of looks the watcher made.
    looks: AtomicU64,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A job ended: the watcher looks again (nothing to do while no wait is reached).
    fn kick(&self) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut st = self.lock();
        if !st.kicked {
            st.kicked = true;
            self.cv.notify_one();
        }
    }
}

impl ValueWait {
    /// Whether the word meets the wait now (read from `dev` as the calling thread's lane).
    pub fn met(&self, dev: &dyn DeviceContext) -> Result<bool, crate::device::DeviceError> {
        let mut word = [0u8; 8];
        dev.read(self.addr, &mut word[..self.width as usize])?;
        Ok(mem_op::met(
            self.condition,
            self.width,
            u64::from_le_bytes(word),
            self.value,
        ))
    }
}

/// A session's memory waits and their watcher.
pub struct MemWaits {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for MemWaits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemWaits")
            .field("reached", &self.inner.count.load(Ordering::Relaxed))
            .field("looks", &self.inner.looks.load(Ordering::Relaxed))
            .finish()
    }
}

impl MemWaits {
    /// Waits on the memory of `dev`.
    pub fn new(dev: Arc<dyn DeviceContext>) -> Self {
        Self {
            inner: Arc::new(Inner {
                dev,
                state: Mutex::new(State::default()),
                cv: Condvar::new(),
                count: AtomicUsize::new(0),
                looks: AtomicU64::new(0),
            }),
        }
    }

    /// What the session's engine calls after every job's end.
    pub fn progress_listener(&self) -> impl Fn() + Send + Sync + 'static {
        let inner = Arc::downgrade(&self.inner);
        move || {
            if let Some(i) = inner.upgrade() {
                i.kick();
            }
        }
    }

    /// Tells the watcher that a job ended now (one that ran where the engine does not see its
    /// end, as a session's own quick write).
    pub fn kick(&self) {
        self.inner.kick();
    }

    /// Context `ctx` is being destroyed: its waits end now and when reached, their lanes going
    /// on (the context's work is being released).
    pub fn end_context(&self, ctx: u64) {
        let mut st = self.inner.lock();
        st.ended.insert(ctx);
        st.fresh = true;
        self.inner.cv.notify_one();
    }

    /// Context `ctx` is gone and none of its waits is left (its destroy settled every lane):
    /// the watcher forgets it, so that a session creating and destroying contexts holds nothing
    /// per context.
    pub fn forget_context(&self, ctx: u64) {
        self.inner.lock().ended.remove(&ctx);
    }

    /// The gate to queue for `wait` of context `ctx`: watched from when its lane reaches it.
    pub fn gate(&self, ctx: u64, wait: ValueWait) -> Arc<Gate> {
        Arc::new_cyclic(|me: &Weak<Gate>| {
            let gate = me.clone();
            let inner = Arc::downgrade(&self.inner);
            Gate::on_reach(move || {
                if let Some(i) = inner.upgrade() {
                    watch(&i, Watched { ctx, wait, gate });
                }
            })
        })
    }
}

impl Drop for MemWaits {
    fn drop(&mut self) {
        let mut st = self.inner.lock();
        st.closed = true;
        st.reached.clear();
        self.inner.count.store(0, Ordering::Release);
        self.inner.cv.notify_all();
    }
}

/// A wait was reached (engine lock held): watch it, starting the thread if none runs.
fn watch(inner: &Arc<Inner>, w: Watched) {
    let mut st = inner.lock();
    if st.closed {
        return;
    }
    st.reached.push(w);
    inner.count.store(st.reached.len(), Ordering::Release);
    st.fresh = true;
    if st.running {
        inner.cv.notify_one();
        return;
    }
    let i = Arc::clone(inner);
    let spawned = std::thread::Builder::new()
        .name("vgpu-memwait".into())
        .spawn(move || watcher(&i));
    match spawned {
        Ok(_) => st.running = true,
        Err(e) => {
            // The gates stay reached until the session ends; the next reached wait tries again.
            warn!(error = %e, "could not start the memory wait watcher");
        }
    }
}

/// What became of one watched wait at a look.
enum Look {
    Waiting,
    Done,
}

fn look(dev: &dyn DeviceContext, w: &Watched, ended: bool) -> Look {
    let Some(gate) = w.gate.upgrade() else {
        return Look::Done;
    };
    match gate.state() {
        GateState::Reached => {}
        GateState::Pending => return Look::Waiting,
        GateState::Opened | GateState::Abandoned(_) => return Look::Done,
    }
    if ended {
        gate.open();
        return Look::Done;
    }
    let read = crate::device::with_lane(WATCHER_LANE, || w.wait.met(dev));
    match read {
        Ok(true) => {
            gate.open();
            Look::Done
        }
        Ok(false) => Look::Waiting,
        Err(e) => {
            let addr = w.wait.addr;
            debug!(addr, error = %e, "a stream memory wait's word is gone");
            gate.fail(CuError::new(
                cuda::CUDA_ERROR_ILLEGAL_ADDRESS,
                format!(
                    "a stream memory wait watches {addr:#x}, which is no longer device memory of this process"
                ),
            ));
            Look::Done
        }
    }
}

/// The watcher thread: looks at the reached waits when one is newly reached, after jobs end
/// (at most every [`MIN_POLL`]) and every poll interval, until none is left or the session ends.
fn watcher(inner: &Arc<Inner>) {
    let mut poll = MIN_POLL;
    let mut st = inner.lock();
    loop {
        if st.closed || st.reached.is_empty() {
            st.running = false;
            return;
        }
        let told = std::mem::take(&mut st.kicked) | std::mem::take(&mut st.fresh);
        let watched = std::mem::take(&mut st.reached);
        let ended: Vec<bool> = watched.iter().map(|w| st.ended.contains(&w.ctx)).collect();
        drop(st);
        inner.looks.fetch_add(1, Ordering::Relaxed);
        let mut kept = Vec::with_capacity(watched.len());
        for (w, ended) in watched.into_iter().zip(ended) {
            if let Look::Waiting = look(inner.dev.as_ref(), &w, ended) {
                kept.push(w);
            }
        }
        let looked = Instant::now();
        st = inner.lock();
        if st.closed {
            st.running = false;
            return;
        }
        // Waits reached while the lock was released were appended meanwhile.
        kept.append(&mut st.reached);
        st.reached = kept;
        inner.count.store(st.reached.len(), Ordering::Release);
        poll = if told {
            MIN_POLL
        } else {
            (poll * 2).min(MAX_POLL)
        };
        // Until the next look.
        while !st.closed && !st.fresh && !st.reached.is_empty() {
            let due = if st.kicked { MIN_POLL } else { poll };
            let since = looked.elapsed();
            if since >= due {
                break;
            }
            st = inner
                .cv
                .wait_timeout(st, due - since)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;
    use crate::engine::{Engine, Job, LaneKey, LaneKind, LaneSpec};
    use crate::testutils::MemDevice;

    const CTX: u64 = 1;
    const LIMIT: Duration = Duration::from_secs(20);

    fn lane(id: u64) -> LaneSpec {
        LaneSpec {
            key: LaneKey::Stream(id),
            ctx: CTX,
            kind: LaneKind::NonBlocking,
            priority: 0,
        }
    }

    fn rig() -> (Engine, MemWaits, Arc<dyn DeviceContext>, u64) {
        let d = MemDevice::new(1 << 20, Duration::ZERO);
        let dev = d.open("t").unwrap();
        let word = dev.alloc(4096).unwrap();
        dev.write(word, &[0; 16]).unwrap();
        let e = Engine::new(Arc::clone(&dev));
        let w = MemWaits::new(Arc::clone(&dev));
        assert!(e.on_progress(w.progress_listener()));
        (e, w, dev, word)
    }

    fn wait(addr: u64, condition: u32, value: u64) -> ValueWait {
        ValueWait {
            addr,
            width: 4,
            condition,
            value,
        }
    }

    fn done_within(e: &Engine, seq: u64) -> bool {
        let t0 = Instant::now();
        while !e.is_done(seq) {
            if t0.elapsed() > LIMIT {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    #[test]
    fn a_write_of_another_lane_releases_a_wait() {
        let (mut e, w, _dev, word) = rig();
        let (l1, l2) = (lane(0x10), lane(0x20));
        e.submit(&l1, Job::Gate(w.gate(CTX, wait(word, mem_op::WAIT_EQ, 3))));
        let after = e.submit(&l1, Job::Barrier);
        std::thread::sleep(Duration::from_millis(30));
        assert!(!e.is_done(after), "the wait holds its lane");
        e.submit(
            &l2,
            Job::Write {
                dst: word,
                data: 2u32.to_le_bytes().to_vec(),
            },
        );
        std::thread::sleep(Duration::from_millis(30));
        assert!(!e.is_done(after), "2 is not 3");
        e.submit(
            &l2,
            Job::Write {
                dst: word,
                data: 3u32.to_le_bytes().to_vec(),
            },
        );
        assert!(done_within(&e, after), "the write released the wait");
        assert_eq!(w.inner.count.load(Ordering::Acquire), 0, "nothing watched");
    }

    #[test]
    fn a_wait_already_met_goes_on_and_the_watcher_stops() {
        let (mut e, w, dev, word) = rig();
        dev.write(word, &7u32.to_le_bytes()).unwrap();
        e.submit(
            &lane(0x10),
            Job::Gate(w.gate(CTX, wait(word, mem_op::WAIT_GEQ, 7))),
        );
        let after = e.submit(&lane(0x10), Job::Barrier);
        assert!(done_within(&e, after));
        let t0 = Instant::now();
        while w.inner.lock().running {
            assert!(t0.elapsed() < LIMIT, "the watcher thread ended");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_word_written_behind_the_engines_back_is_seen_by_polling() {
        let (mut e, w, dev, word) = rig();
        e.submit(
            &lane(0x10),
            Job::Gate(w.gate(CTX, wait(word, mem_op::WAIT_AND, 0x10))),
        );
        let after = e.submit(&lane(0x10), Job::Barrier);
        std::thread::sleep(Duration::from_millis(30));
        dev.write(word, &0x30u32.to_le_bytes()).unwrap();
        assert!(done_within(&e, after), "the poll saw the word");
    }

    #[test]
    fn freed_memory_faults_the_lane_and_an_ended_context_opens_its_waits() {
        let (mut e, w, dev, word) = rig();
        let other = dev.alloc(4096).unwrap();
        dev.write(other, &[0; 4]).unwrap();
        let doomed = e.submit(
            &lane(0x10),
            Job::Gate(w.gate(CTX, wait(other, mem_op::WAIT_EQ, 1))),
        );
        std::thread::sleep(Duration::from_millis(30));
        dev.free(other).unwrap();
        assert!(done_within(&e, doomed));
        assert_eq!(
            e.take_error(CTX).map(|err| err.code),
            Some(cuda::CUDA_ERROR_ILLEGAL_ADDRESS)
        );

        // The fault is sticky: the context runs nothing more, as in CUDA.
        let skipped = e.submit(
            &lane(0x20),
            Job::Gate(w.gate(CTX, wait(word, mem_op::WAIT_EQ, 9))),
        );
        assert!(done_within(&e, skipped));

        // Another context's wait that nobody meets ends with its context.
        let other_ctx = LaneSpec {
            ctx: CTX + 1,
            ..lane(0x40)
        };
        let stuck = e.submit(
            &other_ctx,
            Job::Gate(w.gate(CTX + 1, wait(word, mem_op::WAIT_EQ, 9))),
        );
        std::thread::sleep(Duration::from_millis(30));
        assert!(!e.is_done(stuck));
        w.end_context(CTX + 1);
        assert!(
            done_within(&e, stuck),
            "an ended context's wait let its lane go"
        );
        // A wait of an ended context reached later does not hold its lane either.
        let late_lane = LaneSpec {
            key: LaneKey::Stream(0x50),
            ..other_ctx
        };
        let late = e.submit(
            &late_lane,
            Job::Gate(w.gate(CTX + 1, wait(word, mem_op::WAIT_EQ, 9))),
        );
        assert!(done_within(&e, late));
        assert_eq!(
            e.take_error(CTX + 1),
            None,
            "an ended context's waits are no error"
        );
        // Once forgotten, nothing of the context is kept.
        w.forget_context(CTX + 1);
        assert!(w.inner.lock().ended.is_empty());
    }

    #[test]
    fn a_flood_of_jobs_beside_an_unmet_wait_costs_one_look_per_interval() {
        let (mut e, w, _dev, word) = rig();
        e.submit(
            &lane(0x10),
            Job::Gate(w.gate(CTX, wait(word, mem_op::WAIT_EQ, 1))),
        );
        std::thread::sleep(Duration::from_millis(20));
        let before = w.inner.looks.load(Ordering::Relaxed);
        assert!(before >= 1, "the reached wait was looked at");
        let t0 = Instant::now();
        let jobs = 20_000;
        for _ in 0..jobs {
            // Quick jobs of an idle lane: each runs inline and ends at once.
            e.submit(&lane(0x20), Job::Barrier);
        }
        let took = t0.elapsed();
        let looks = w.inner.looks.load(Ordering::Relaxed) - before;
        let bound = (took.as_micros() / MIN_POLL.as_micros()) as u64 + 2;
        assert!(
            looks <= bound,
            "{looks} looks for {jobs} jobs in {took:?} (at most {bound})"
        );
    }

    #[test]
    fn an_ended_session_stops_the_watcher() {
        let (mut e, w, _dev, word) = rig();
        let g = w.gate(CTX, wait(word, mem_op::WAIT_EQ, 5));
        e.submit(&lane(0x10), Job::Gate(Arc::clone(&g)));
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(g.state(), GateState::Reached);
        let inner = Arc::downgrade(&w.inner);
        drop(w);
        drop(e);
        let t0 = Instant::now();
        while inner.upgrade().is_some() {
            assert!(
                t0.elapsed() < LIMIT,
                "the watcher let go of the session's state"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
