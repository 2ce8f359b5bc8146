//! What the device's vring worker and its session threads share: the device generation and
//! pause state ([`Shared`], see `device.rs` on resets and pauses), how a request chain is
//! returned to the guest ([`Completion`]), and the messages a session thread receives ([`Msg`]).
//! The device (`device.rs`) and the session threads (`session_thread.rs`) both depend on this
//! module, not on each other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard};
use std::time::Duration;

use tracing::{debug, error, info, warn};
use vgpu_proto::frame::Header;
use vhost_user_backend::{VringRwLock, VringT};
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::eventfd::EventFd;

use super::chain::{GuestMem, Segments};
use super::stats::VgpuDevStats;
use super::wire::{CTRL_QUEUE, NUM_QUEUES, RESP_HEADER_LEN, RespHeader, S_OK, status_name};
use vgpu_vhost_user::{LogLimiter, signal, vring_ready};

pub(crate) struct SessionEntry {
    pub(crate) token: u64,
    tx: mpsc::Sender<Msg>,
    /// Set when the guest closed the session or the device was reset (see
    /// [`crate::exec::VgpuService::open`]).
    pub(crate) gone: Arc<AtomicBool>,
    /// The session's state, shared with its thread.
    pub(crate) core: Arc<dyn SessionState>,
}

/// What became of a frame offered to [`SessionState::try_run_here`].
pub(crate) enum RunHere {
    /// It ran and its chain was completed.
    Ran,
    /// It ran and broke the protocol: the session must end.
    Violation(String),
    /// It must go to the session thread.
    Declined(Box<CallJob>),
}

/// A session's state as the queue thread sees it (`session_thread::SessionCore`).
pub(crate) trait SessionState: Send + Sync {
    /// Counts a message about to be sent to the session thread.
    fn will_send(&self);
    /// Uncounts a message that could not be sent.
    fn unsent(&self);
    /// Runs the synchronous frame `job` on the calling (queue) thread if nothing can make it
    /// wait; never blocks.
    fn try_run_here(&self, shared: &Shared, job: Box<CallJob>) -> RunHere;
    /// Whether the session thread holds nothing and has nothing sent to it left: a frame
    /// offered now would not find the state taken (tests wait for this).
    #[cfg(test)]
    fn idle(&self) -> bool;
}

impl SessionEntry {
    pub(crate) fn new(
        token: u64,
        tx: mpsc::Sender<Msg>,
        gone: Arc<AtomicBool>,
        core: Arc<dyn SessionState>,
    ) -> SessionEntry {
        SessionEntry {
            token,
            tx,
            gone,
            core,
        }
    }

    /// Sends `msg` to the session thread; gives it back when the thread is gone.
    pub(crate) fn send(&self, msg: Msg) -> Result<(), Msg> {
        self.core.will_send();
        self.tx.send(msg).map_err(|e| {
            self.core.unsent();
            e.0
        })
    }
}

/// Device event id of the event a resumed device writes so that the vring worker looks at both
/// queues again: the first id after the queues' kicks (`0..NUM_QUEUES`) and vhost-user-backend's
/// exit event (`NUM_QUEUES`), the only ones it accepts for a listener of the backend's own.
pub(crate) const RESCAN_EVENT: u16 = NUM_QUEUES as u16 + 1;
const _: () = assert!(
    RESCAN_EVENT as usize > NUM_QUEUES,
    "ids up to NUM_QUEUES are taken"
);

/// Most descriptor chains the device holds at once (taken from the rings and not yet returned):
/// both queues full, which is all a guest playing by the rules can hand it. A guest that places
/// one chain in its avail ring again and again could otherwise hand it chains without end.
pub(crate) const MAX_IN_FLIGHT: usize = NUM_QUEUES * crate::DEFAULT_QUEUE_SIZE as usize;

/// The chains the device holds. Past the limit the queue thread takes no more from the rings;
/// the first chain returned after that asks it, through the rescan event, to look again.
#[derive(Debug)]
pub(crate) struct InFlight {
    count: AtomicUsize,
    limit: AtomicUsize,
    /// The queue thread stopped at the limit and waits for a rescan.
    throttled: AtomicBool,
    rescan: OnceLock<EventFd>,
}

impl InFlight {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(InFlight {
            count: AtomicUsize::new(0),
            limit: AtomicUsize::new(MAX_IN_FLIGHT),
            throttled: AtomicBool::new(false),
            rescan: OnceLock::new(),
        })
    }

    /// The event to write when the queue thread must look at the rings again. Set once.
    pub(crate) fn set_rescan_event(&self, event: EventFd) {
        let _ = self.rescan.set(event);
    }

    /// Asks the queue thread to look at both rings again (nothing before the event is set).
    pub(crate) fn request_rescan(&self) -> Result<(), std::io::Error> {
        match self.rescan.get() {
            Some(e) => e.write(1),
            None => Ok(()),
        }
    }

    /// Changes the limit (tests).
    #[cfg(test)]
    pub(crate) fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::SeqCst);
    }

    /// Chains held now.
    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Whether the device may take another chain. When it may not, the next chain returned asks
    /// the queue thread to look again.
    pub(crate) fn has_room(&self) -> bool {
        let limit = self.limit.load(Ordering::Relaxed);
        if self.count.load(Ordering::SeqCst) < limit {
            return true;
        }
        self.throttled.store(true, Ordering::SeqCst);
        // A chain returned between the check and the flag would not have asked: look again.
        self.count.load(Ordering::SeqCst) < limit
    }

    /// Counts one chain taken from a ring until the returned token is dropped.
    pub(crate) fn take(self: &Arc<Self>) -> Arc<InFlightToken> {
        self.count.fetch_add(1, Ordering::SeqCst);
        Arc::new(InFlightToken(Arc::clone(self)))
    }
}

/// One chain the device holds, shared by every copy of its [`Completion`]: dropped when the chain
/// is returned or abandoned (a reset), whichever way that happens.
#[derive(Debug)]
pub(crate) struct InFlightToken(Arc<InFlight>);

impl Drop for InFlightToken {
    fn drop(&mut self) {
        let f = &self.0;
        f.count.fetch_sub(1, Ordering::SeqCst);
        if f.throttled.swap(false, Ordering::SeqCst)
            && let Err(e) = f.request_rescan()
        {
            warn!(error = %e, "cannot ask the queue thread to take the chains it left in the rings");
        }
    }
}

/// How often a paused device looks whether its queues run again.
pub(crate) const PAUSE_POLL: Duration = Duration::from_millis(2);

/// Where a queue stood when the VMM stopped it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingState {
    pub(crate) desc: u64,
    pub(crate) avail: u64,
    pub(crate) used: u64,
    pub(crate) next_avail: u16,
}

impl RingState {
    pub(crate) fn of(vring: &VringRwLock) -> RingState {
        let state = vring.get_ref();
        let q = state.get_queue();
        RingState {
            desc: q.desc_table(),
            avail: q.avail_ring(),
            used: q.used_ring(),
            next_avail: q.next_avail(),
        }
    }
}

/// A completion that waits for the device to run again.
pub(crate) struct Parked {
    pub(crate) done: Completion,
    pub(crate) resp: RespHeader,
    pub(crate) reply: Vec<u8>,
}

/// A paused device (see the module docs).
#[derive(Default)]
pub(crate) struct Pause {
    /// The queues (known once the device took a chain).
    pub(crate) rings: Option<[VringRwLock; 2]>,
    /// Paused now.
    pub(crate) active: bool,
    /// Where each queue stood when stopped.
    pub(crate) saved: [Option<RingState>; 2],
    /// Completions to return when the device runs again.
    pub(crate) parked: Vec<Parked>,
}

/// State shared by the queue thread and the session threads.
pub(crate) struct Shared {
    /// The device generation; see the module docs.
    pub(crate) gate: RwLock<u64>,
    pub(crate) sessions: Mutex<HashMap<u32, SessionEntry>>,
    pub(crate) stats: Arc<VgpuDevStats>,
    pub(crate) limiter: Mutex<LogLimiter>,
    pub(crate) next_token: AtomicU64,
    pub(crate) name: String,
    /// True while paused; requests then wait to touch guest memory. Set under the gate's write
    /// lock (so no request is in guest memory once it is set), cleared under the pause lock.
    pub(crate) paused: AtomicBool,
    pub(crate) pause: Mutex<Pause>,
    pub(crate) resumed: Condvar,
    /// The chains the device holds, and the rescan event: written when the device resumes, so
    /// that the queue thread looks at both rings again (a kick that arrived while the device was
    /// still paused, the VMM restarting the queues one by one while the guest already runs,
    /// found nothing to do, and the guest will not kick again for the chains it made
    /// available), and when the first chain returns after the in-flight limit stopped it. The
    /// backend registers the event with the vring worker.
    pub(crate) in_flight: Arc<InFlight>,
}

impl Shared {
    pub(crate) fn sessions(&self) -> MutexGuard<'_, HashMap<u32, SessionEntry>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn generation(&self) -> u64 {
        *self.gate.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `epoch` is the current generation.
    pub(crate) fn is_current(&self, epoch: u64) -> bool {
        self.generation() == epoch
    }

    /// Holds off resets while a request of generation `epoch` touches guest memory; `None` if the
    /// device was reset since. Waits while the device is paused.
    pub(crate) fn enter(&self, epoch: u64) -> Option<RwLockReadGuard<'_, u64>> {
        loop {
            let g = self.gate.read().unwrap_or_else(|p| p.into_inner());
            if *g != epoch {
                return None;
            }
            if !self.paused.load(Ordering::Acquire) {
                return Some(g);
            }
            drop(g);
            let p = self.pause_state();
            if p.active {
                let _ = self
                    .resumed
                    .wait_timeout(p, PAUSE_POLL)
                    .unwrap_or_else(|e| e.into_inner());
            }
        }
    }

    /// Like [`Shared::enter`], without waiting: `Err(())` while paused.
    pub(crate) fn try_enter(&self, epoch: u64) -> Result<Option<RwLockReadGuard<'_, u64>>, ()> {
        let g = self.gate.read().unwrap_or_else(|p| p.into_inner());
        if *g != epoch {
            return Ok(None);
        }
        if self.paused.load(Ordering::Acquire) {
            return Err(());
        }
        Ok(Some(g))
    }

    pub(crate) fn pause_state(&self) -> MutexGuard<'_, Pause> {
        self.pause.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends every session and invalidates every chain taken so far (see the module docs). Waits
    /// only for requests that are touching guest memory right now.
    pub(crate) fn reset(&self, reason: &str) {
        let dropped = {
            let mut g = self.gate.write().unwrap_or_else(|p| p.into_inner());
            *g += 1;
            // Counted before anything the reset does can be seen, as a resume is.
            self.stats.add_device_reset();
            let mut p = self.pause_state();
            p.active = false;
            p.saved = [None, None];
            self.paused.store(false, Ordering::Release);
            std::mem::take(&mut p.parked).len()
        };
        self.resumed.notify_all();
        for _ in 0..dropped {
            self.stats.add_stale();
        }
        // Dropping the senders ends the session threads once their current call returns; the
        // sessions then release their memory.
        let n = {
            let mut s = self.sessions();
            let n = s.len();
            for e in s.values() {
                e.gone.store(true, Ordering::Release);
            }
            s.clear();
            n
        };
        info!(vm = %self.name, sessions = n, reason, "virtio-vgpu device reset");
    }

    /// Remembers the device's queues (for pauses).
    pub(crate) fn know_rings(&self, ctrl: &VringRwLock, submit: &VringRwLock) {
        self.pause_state().rings = Some([ctrl.clone(), submit.clone()]);
    }

    /// The VMM stopped queue `queue` (`GET_VRING_BASE`): a pause, decided when the queues start
    /// again, or (no session open, queues unknown) a reset at once.
    pub(crate) fn stop_queue(self: &Arc<Self>, queue: usize) {
        let mut p = self.pause_state();
        if !p.active {
            let pause = queue == CTRL_QUEUE && p.rings.is_some() && !self.sessions().is_empty();
            drop(p);
            if !pause {
                if queue == CTRL_QUEUE {
                    self.reset("the VMM stopped the queues");
                }
                return;
            }
            // From now on no request touches guest memory: wait for those that are.
            let g = self.gate.write().unwrap_or_else(|e| e.into_inner());
            p = self.pause_state();
            p.active = true;
            p.saved = [None, None];
            self.paused.store(true, Ordering::Release);
            drop(g);
            let shared = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name(format!("vgpu-dev-{}-pause", self.name))
                .spawn(move || shared.watch_pause());
            if let Err(e) = spawned {
                error!(vm = %self.name, error = %e, "cannot watch a paused device; resetting it");
                drop(p);
                self.reset("the VMM stopped the queues");
                return;
            }
            self.stats.add_pause();
            info!(vm = %self.name, sessions = self.sessions().len(), "virtio-vgpu device paused");
        }
        let state = p
            .rings
            .as_ref()
            .and_then(|r| r.get(queue))
            .map(RingState::of);
        if let Some(slot) = p.saved.get_mut(queue) {
            *slot = state;
        }
    }

    /// Waits, on its own thread, until a paused device's queues run again, then resumes or
    /// resets it.
    pub(crate) fn watch_pause(&self) {
        loop {
            std::thread::sleep(PAUSE_POLL);
            if !self.try_resolve_pause() {
                return;
            }
        }
    }

    /// Decides a pause once the queues run again: resumes the device if they run where they
    /// stopped, resets it if not. Returns whether it is still paused.
    pub(crate) fn try_resolve_pause(&self) -> bool {
        let mut p = self.pause_state();
        if !p.active {
            return false;
        }
        let Some(rings) = p.rings.clone() else {
            return true;
        };
        if !rings.iter().all(vring_ready) {
            return true;
        }
        let same = rings
            .iter()
            .zip(&p.saved)
            .all(|(r, saved)| saved.is_none_or(|s| s == RingState::of(r)));
        if !same {
            drop(p);
            self.reset("the guest driver started afresh");
            return false;
        }
        p.active = false;
        let parked = std::mem::take(&mut p.parked);
        // Counted before the device runs again, so that anything served after the resume (a
        // request the queue thread takes the moment `paused` clears) finds it counted.
        self.stats.add_resume();
        self.paused.store(false, Ordering::Release);
        drop(p);
        self.resumed.notify_all();
        for c in &parked {
            c.done.finish_quietly(self, c.resp, &c.reply);
        }
        // Unconditionally, whatever the guest's `used_event` says: a completion returned just
        // before the pause may have been signalled after QEMU detached its notifiers (the signal
        // is then lost), while the ring's suppression state counts it as delivered, and the guest
        // would wait for it forever. A spurious interrupt costs the guest one look at its rings.
        for (q, r) in rings.iter().enumerate() {
            if let Err(e) = r.signal_used_queue() {
                warn!(vm = %self.name, queue = queue_name(q), error = %e, "cannot interrupt the guest after a resume");
            }
        }
        if let Err(e) = self.in_flight.request_rescan() {
            warn!(vm = %self.name, error = %e, "cannot ask for the queues to be looked at again after a resume");
        }
        info!(vm = %self.name, returned = parked.len(), "virtio-vgpu device resumed");
        false
    }

    /// Forgets session `session` if it is still the one identified by `token`.
    pub(crate) fn remove_session(&self, session: u32, token: u64) {
        let mut s = self.sessions();
        if s.get(&session).is_some_and(|e| e.token == token) {
            s.remove(&session);
        }
    }

    /// Logs a guest-caused error, rate-limited.
    pub(crate) fn log_guest(&self, msg: std::fmt::Arguments<'_>) {
        let allowed = self
            .limiter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .allow();
        match allowed {
            Some(0) => error!(vm = %self.name, "{msg}"),
            Some(n) => {
                error!(vm = %self.name, suppressed = n, "{msg} (earlier similar errors suppressed)")
            }
            None => {}
        }
    }
}

/// How to return one chain to the guest.
#[derive(Clone)]
pub(crate) struct Completion {
    pub(crate) vring: VringRwLock,
    pub(crate) mem: GuestMemoryAtomic<GuestMem>,
    pub(crate) head: u16,
    /// The chain's device-writable stream: the response header's place, then the reply area.
    pub(crate) writable: Segments,
    /// Bytes of the reply area, after the response header (0 when the stream cannot hold the
    /// header).
    pub(crate) reply_cap: usize,
    pub(crate) epoch: u64,
    pub(crate) queue: usize,
    /// Counts the chain as held until the last copy of this completion is dropped.
    pub(crate) _held: Arc<InFlightToken>,
}

impl Completion {
    /// Writes the response header and `reply` (which must fit the reply area) and returns the
    /// chain, unless the device was reset since the chain was taken; then tells the guest.
    pub(crate) fn finish(&self, shared: &Shared, resp: RespHeader, reply: &[u8]) {
        if self.finish_quietly(shared, resp, reply) {
            self.notify();
        }
    }

    /// Like [`Completion::finish`], without telling the guest: returns whether the guest is
    /// owed a [`Completion::notify`] (the chain was returned). A session thread that has more
    /// frames waiting returns the chains of several posted frames and tells the guest once.
    pub(crate) fn finish_quietly(&self, shared: &Shared, resp: RespHeader, reply: &[u8]) -> bool {
        let _gate = match shared.try_enter(self.epoch) {
            Ok(Some(g)) => g,
            Ok(None) => {
                shared.stats.add_stale();
                return false;
            }
            Err(()) => {
                // Paused: returned when the device runs again (or dropped by a reset).
                let mut p = shared.pause_state();
                if p.active {
                    p.parked.push(Parked {
                        done: self.clone(),
                        resp,
                        reply: reply.to_vec(),
                    });
                    return false;
                }
                drop(p);
                return self.finish_quietly(shared, resp, reply);
            }
        };
        self.return_chain(shared, resp, reply)
    }

    /// Like [`Completion::finish`], for a caller that holds the gate of this chain's generation
    /// already ([`Shared::try_enter`]): the queue thread running a frame itself.
    pub(crate) fn finish_entered(&self, shared: &Shared, resp: RespHeader, reply: &[u8]) {
        if self.return_chain(shared, resp, reply) {
            self.notify();
        }
    }

    /// Writes the response and returns the chain; the caller holds the gate. Whether the guest
    /// is owed a [`Completion::notify`].
    fn return_chain(&self, shared: &Shared, resp: RespHeader, reply: &[u8]) -> bool {
        if resp.status != S_OK {
            debug!(
                head = self.head,
                status = status_name(resp.status),
                "request refused"
            );
        }
        let mem = self.mem.memory();
        let mut used = 0u32;
        if self.writable.len() >= RESP_HEADER_LEN {
            if let Err(e) = self.writable.write_at(&mem, 0, &resp.to_bytes()) {
                shared.log_guest(format_args!("cannot write a response header: {e}"));
            }
            used = RESP_HEADER_LEN as u32;
        }
        let reply = &reply[..reply.len().min(self.reply_cap)];
        if !reply.is_empty() {
            match self.writable.write_at(&mem, RESP_HEADER_LEN, reply) {
                Ok(n) => used += n as u32,
                Err(e) => shared.log_guest(format_args!("cannot write a reply: {e}")),
            }
        }
        used = used.saturating_add(u32::try_from(resp.data_len).unwrap_or(u32::MAX));
        if let Err(e) = vgpu_vhost_user::add_used(&self.vring, &mem, self.head, used) {
            shared.log_guest(format_args!("cannot return chain {}: {e}", self.head));
            return false;
        }
        true
    }

    /// Interrupts the guest for the chains returned on this chain's queue, unless the guest's
    /// `used_event` says it does not want one yet.
    pub(crate) fn notify(&self) {
        signal(&self.vring, queue_name(self.queue));
    }

    /// The queue the chain came from.
    pub(crate) fn queue(&self) -> usize {
        self.queue
    }
}

pub(crate) fn queue_name(q: usize) -> &'static str {
    if q == CTRL_QUEUE { "ctrl" } else { "submit" }
}

/// A frame for a session thread.
pub(crate) struct CallJob {
    /// Sequence number.
    pub seq: u64,
    /// The frame header.
    pub header: Header,
    /// Inline payload bytes (after the frame header).
    pub inline: Vec<u8>,
    /// Request data (the rest of the payload) in guest memory.
    pub data: Segments,
    /// Where reply data goes.
    pub reply_data: Segments,
    /// How to return the chain.
    pub done: Completion,
    /// The device refused the frame: it only takes its place in the sequence.
    pub refused: bool,
}

/// The frames of a `BATCH` request, for a session thread: they run one after the other in their
/// sequence numbers' place, and the chain is completed once, after the last.
pub(crate) struct BatchJob {
    /// Sequence number of the first frame.
    pub seq: u64,
    /// Frames (and sequence numbers) the batch takes.
    pub count: u64,
    /// Each frame's header and where its payload lies in `bytes`; empty when refused.
    pub frames: Vec<(Header, std::ops::Range<usize>)>,
    /// The frames' bytes, as the guest wrote them.
    pub bytes: Vec<u8>,
    /// How to return the chain.
    pub done: Completion,
    /// The device refused the batch's frames: they only take their places in the sequence.
    pub refused: bool,
}

/// What the device sends a session thread.
pub(crate) enum Msg {
    /// A frame.
    Call(Box<CallJob>),
    /// Several asynchronous frames.
    Batch(Box<BatchJob>),
    /// Close the session, then complete this chain.
    Close(Completion),
}

impl Msg {
    /// The chain the message completes.
    pub(crate) fn done(&self) -> &Completion {
        match self {
            Msg::Call(j) => &j.done,
            Msg::Batch(b) => &b.done,
            Msg::Close(c) => c,
        }
    }
}
