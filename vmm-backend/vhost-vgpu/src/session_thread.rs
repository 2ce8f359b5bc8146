//! Session threads: each guest session (an open `/dev/vgpuN`) runs its frames in order on a
//! thread of its own, so a long call (a synchronize waiting for kernels) never holds up the queues
//! or other sessions. Bulk bytes move straight between guest pages and the GPU side through
//! [`GuestSource`] and [`GuestSink`].
//!
//! Frames may arrive out of order (synchronous ones on the control queue, asynchronous ones on the
//! submission queue); the per-session sequence number puts them back in order. A `BATCH` request
//! arrives as one job ([`BatchJob`]) that takes as many sequence numbers as it has frames.
//!
//! Completions of posted frames (the submission queue) are returned at once but signalled once per
//! burst: while more frames wait for the thread, the interrupt for a posted frame is held back
//! (nobody waits for it: the guest only reclaims its descriptors and pages), and it is sent before
//! the thread sleeps or runs a synchronous frame. On a machine where every wake-up crosses CPUs
//! this saves an interrupt and a guest wake-up per posted frame of a multi-chunk copy. A guest
//! that queued deeper than [`DEEP`] is also told once [`LOW_WATER`] messages are left, so that
//! one waiting for room refills the queue before the thread runs dry.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard, RwLockReadGuard};

use tracing::{debug, warn};
use vgpu_broker::CuError;
use vgpu_proto::cuda;
use vgpu_proto::frame::{FLAG_OUTPUT, FLAG_REPLY, HEADER_LEN, Header};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};

use super::chain::{GuestMem, Segments};
use super::exec::{BulkSink, BulkSource, Call, Reply, SessionExecutor};
use super::shared::{BatchJob, CallJob, Completion, Msg, RunHere, SessionState, Shared};
use super::wire::{
    CTRL_QUEUE, MAX_SEGMENTS, RespHeader, S_BAD_REQUEST, S_NO_SESSION, S_OK, S_PROTOCOL,
    S_REPLY_TOO_LARGE,
};

/// Most frames a session holds back while waiting for an earlier sequence number: every chain of
/// both queues at once.
pub const MAX_REORDER: u64 = 2 * MAX_SEGMENTS as u64;

/// Messages left for the session thread (see [`left`]) at which a held-back posted completion
/// is signalled, if more than [`DEEP`] were left since the last signal: a guest that filled a
/// deep window of posted requests sleeps until it is told of room, and so wakes while the thread
/// still has this much to run, not after the thread ran dry (in a stream of posted `BATCH`es the
/// thread sat idle a fifth of the time). Shallower bursts (a multi-chunk copy) are told once,
/// when the thread sleeps or runs a synchronous frame.
const LOW_WATER: u64 = 2;
/// Messages left for the session thread past which the guest counts as queueing deep.
const DEEP: u64 = 8;

/// Frames waiting for their turn.
enum Held {
    Call(Box<CallJob>),
    Batch(Box<BatchJob>),
}

impl Held {
    fn seq(&self) -> u64 {
        match self {
            Held::Call(j) => j.seq,
            Held::Batch(b) => b.seq,
        }
    }

    /// Sequence numbers it takes.
    fn count(&self) -> u64 {
        match self {
            Held::Call(_) => 1,
            Held::Batch(b) => b.count,
        }
    }

    fn done(&self) -> &Completion {
        match self {
            Held::Call(j) => &j.done,
            Held::Batch(b) => &b.done,
        }
    }
}

fn reset_error() -> CuError {
    CuError::new(
        cuda::CUDA_ERROR_DEVICE_UNAVAILABLE,
        "the virtio-vgpu device was reset during the call",
    )
}

/// Holds off resets while a request of generation `epoch` touches guest memory (see
/// [`Shared::enter`]), unless the caller holds that gate already (`entered`).
fn gate(
    shared: &Shared,
    entered: bool,
    epoch: u64,
) -> Result<Option<RwLockReadGuard<'_, u64>>, CuError> {
    if entered {
        return Ok(None);
    }
    shared.enter(epoch).map(Some).ok_or_else(reset_error)
}

/// Request bulk bytes in guest pages (the inline bytes reach the session separately).
pub struct GuestSource<'a> {
    shared: &'a Shared,
    /// The caller holds the gate of `epoch` for the whole call.
    entered: bool,
    epoch: u64,
    mem: &'a GuestMemoryAtomic<GuestMem>,
    segs: &'a Segments,
}

impl BulkSource for GuestSource<'_> {
    fn len(&self) -> u64 {
        self.segs.len() as u64
    }

    fn read(&self, f: &mut vgpu_broker::session::ReadSlices<'_>) -> Result<(), CuError> {
        let _gate = gate(self.shared, self.entered, self.epoch)?;
        let guard = self.mem.memory();
        let slices = self
            .segs
            .slices(&guard)
            .map_err(|e| CuError::invalid_value(e.to_string()))?;
        f(&slices)
    }
}

/// Reply bulk bytes, written straight into guest pages.
pub struct GuestSink<'a> {
    shared: &'a Shared,
    /// The caller holds the gate of `epoch` for the whole call.
    entered: bool,
    epoch: u64,
    mem: &'a GuestMemoryAtomic<GuestMem>,
    segs: &'a Segments,
    written: u64,
}

impl BulkSink for GuestSink<'_> {
    fn capacity(&self) -> u64 {
        self.segs.len() as u64
    }

    fn write(
        &mut self,
        len: u64,
        f: &mut vgpu_broker::session::WriteSlices<'_>,
    ) -> Result<(), CuError> {
        if len > self.capacity() {
            return Err(CuError::invalid_value(format!(
                "the reply carries {len} bytes but the request provided room for {}",
                self.capacity()
            )));
        }
        let _gate = gate(self.shared, self.entered, self.epoch)?;
        let guard = self.mem.memory();
        // The whole stream as it is, else a copy of its first ranges.
        let first;
        let part = if len as usize == self.segs.len() {
            self.segs
        } else {
            first = self.segs.sub(0, len as usize);
            &first
        };
        // SAFETY: `segs` is the reply data of a chain `parse_chain` validated, so its ranges
        // overlap no other range of the chain, and this sink is their only user while `f` runs
        // (one call at a time, `&mut self`).
        let r = unsafe { part.with_slices_mut(&guard, |slices| f(slices)) };
        r.map_err(|e| CuError::invalid_value(e.to_string()))??;
        self.written = len;
        Ok(())
    }
}

/// A session's frames in flight and its executor: the session thread's, and the queue thread's
/// while it runs a frame itself ([`SessionState::try_run_here`]).
pub(crate) struct SessionCore {
    state: Mutex<CoreState>,
    /// Messages sent to the session thread that it has not taken in yet (under `state`).
    queued: AtomicU64,
}

struct CoreState {
    /// `None` once the session thread ended the session.
    exec: Option<Box<dyn SessionExecutor>>,
    /// The sequence number that runs next.
    next: u64,
    /// Frames that arrived before their turn.
    held: BTreeMap<u64, Held>,
    /// The posted frame whose returned chain (and those before it) the guest has not been told
    /// of.
    owed: Option<Completion>,
}

impl SessionCore {
    pub(crate) fn new(exec: Box<dyn SessionExecutor>) -> SessionCore {
        SessionCore {
            state: Mutex::new(CoreState {
                exec: Some(exec),
                next: 1,
                held: BTreeMap::new(),
                owed: None,
            }),
            queued: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CoreState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl SessionState for SessionCore {
    fn will_send(&self) {
        self.queued.fetch_add(1, Ordering::AcqRel);
    }

    fn unsent(&self) {
        self.queued.fetch_sub(1, Ordering::AcqRel);
    }

    fn try_run_here(&self, shared: &Shared, job: Box<CallJob>) -> RunHere {
        try_run_here(shared, self, job)
    }

    #[cfg(test)]
    fn idle(&self) -> bool {
        self.state.try_lock().is_ok() && self.queued.load(Ordering::Acquire) == 0
    }
}

/// Runs the synchronous frame `job` on the calling (queue) thread when that cannot wait: the
/// session thread is idle (nothing sent to it is left, nothing held back, `job` is next in
/// sequence), the device is not paused and the executor answers the frame at once. One thread
/// wake-up less per round trip. Never blocks: a session thread that holds the session, or a
/// pause, declines it.
///
/// The frame runs with the gate of its generation held throughout (taken once, never waited
/// for): a pause or reset that comes meanwhile waits for it, as for any access to guest memory,
/// so it never waits for a pause to end. That matters: the VMM's disconnect joins this thread
/// before it resets the device, which is what ends a pause the VM never resumes.
fn try_run_here(shared: &Shared, core: &SessionCore, job: Box<CallJob>) -> RunHere {
    let Ok(mut st) = core.state.try_lock() else {
        return RunHere::Declined(job);
    };
    if core.queued.load(Ordering::Acquire) != 0
        || st.next != job.seq
        || !st.held.is_empty()
        || job.refused
    {
        return RunHere::Declined(job);
    }
    let Ok(Some(_gate)) = shared.try_enter(job.done.epoch) else {
        // Paused, or reset since the chain was taken: the session thread deals with it.
        return RunHere::Declined(job);
    };
    let st = &mut *st;
    let Some(exec) = st.exec.as_mut() else {
        return RunHere::Declined(job);
    };
    if !exec.answers_at_once(&job.header) {
        return RunHere::Declined(job);
    }
    st.next += 1;
    if let Some(c) = st.owed.take() {
        c.notify();
    }
    shared.stats.add_call_on_queue_thread();
    match execute(shared, exec.as_mut(), *job, true) {
        Executed::Violation(why) => RunHere::Violation(why),
        Executed::Done | Executed::Owed(_) => RunHere::Ran,
    }
}

/// Messages the session thread has yet to run: sent and not taken in, or held for their turn.
fn left(core: &SessionCore, held: &BTreeMap<u64, Held>) -> u64 {
    core.queued.load(Ordering::Acquire) + held.len() as u64
}

/// Runs one session until it is closed, breaks the protocol or the device is reset (the channel
/// closes). The executor is dropped on return, releasing everything the session holds.
pub(crate) fn run(
    shared: Arc<Shared>,
    session: u32,
    token: u64,
    core: Arc<SessionCore>,
    rx: Receiver<Msg>,
) {
    let mut close_chain = None;
    // More than DEEP messages were left at some point since the guest was last told.
    let mut deep = false;
    // The first message is waited for as every later one is, without the session's state: until
    // the thread has work, the queue thread may run the session's first quick frame itself.
    let mut first = rx.recv().ok();
    // Held while there is work; let go only to sleep, so the queue thread can run a frame itself.
    let mut st = core.lock();
    'outer: loop {
        let msg = match first.take().map_or_else(|| rx.try_recv(), Ok) {
            Ok(m) => m,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {
                // Nothing more to run now: tell the guest before sleeping.
                if let Some(c) = st.owed.take() {
                    c.notify();
                }
                drop(st);
                let m = rx.recv();
                st = core.lock();
                match m {
                    Ok(m) => m,
                    Err(_) => break,
                }
            }
        };
        core.queued.fetch_sub(1, Ordering::AcqRel);
        let h = match msg {
            Msg::Close(done) => {
                close_chain = Some(done);
                break;
            }
            Msg::Call(job) => Held::Call(job),
            Msg::Batch(batch) => Held::Batch(batch),
        };
        let st = &mut *st;
        let seq = h.seq();
        if seq < st.next || st.held.contains_key(&seq) || seq > st.next + MAX_REORDER {
            shared.log_guest(format_args!(
                "session {session}: sequence number {seq} is stale, repeated or too far ahead (next {})",
                st.next
            ));
            shared.stats.add_refused();
            h.done()
                .finish(&shared, RespHeader::status(S_BAD_REQUEST), &[]);
            continue;
        }
        let Some(exec) = st.exec.as_mut() else {
            break;
        };
        st.held.insert(seq, h);
        deep |= left(&core, &st.held) > DEEP;
        while let Some(h) = st.held.remove(&st.next) {
            st.next += h.count();
            if !shared.is_current(h.done().epoch) {
                // Queued before a device reset: never run it.
                shared.stats.add_stale();
                continue;
            }
            let executed = match h {
                Held::Call(job) if job.refused => {
                    shared.stats.add_refused();
                    job.done
                        .finish(&shared, RespHeader::status(S_BAD_REQUEST), &[]);
                    continue;
                }
                Held::Call(job) => {
                    if job.done.queue() == CTRL_QUEUE
                        && let Some(c) = st.owed.take()
                    {
                        // A synchronous frame may run long: posted completions go first.
                        c.notify();
                    }
                    execute(&shared, exec.as_mut(), *job, false)
                }
                Held::Batch(batch) => execute_batch(&shared, exec.as_mut(), *batch),
            };
            match executed {
                Executed::Done => {}
                Executed::Owed(c) => {
                    if deep && left(&core, &st.held) <= LOW_WATER {
                        // Room for a guest that may be waiting for it, before the thread runs
                        // dry.
                        deep = false;
                        st.owed = None;
                        c.notify();
                    } else {
                        st.owed = Some(c);
                    }
                }
                Executed::Violation(why) => {
                    warn!(session, "session closed: protocol violation: {why}");
                    break 'outer;
                }
            }
        }
    }
    if let Some(c) = st.owed.take() {
        c.notify();
    }
    // Nothing reaches this thread once its entry is gone; answer what did.
    shared.remove_session(session, token);
    let exec = st.exec.take();
    let held = std::mem::take(&mut st.held);
    drop(st);
    drop(exec);
    shared.stats.session_closed();
    for h in held.into_values() {
        h.done()
            .finish(&shared, RespHeader::status(S_NO_SESSION), &[]);
    }
    for msg in rx.try_iter() {
        let status = match msg {
            Msg::Close(_) => S_OK,
            Msg::Call(_) | Msg::Batch(_) => S_NO_SESSION,
        };
        msg.done().finish(&shared, RespHeader::status(status), &[]);
    }
    if let Some(done) = close_chain {
        done.finish(&shared, RespHeader::status(S_OK), &[]);
    }
    debug!(session, "virtio-vgpu session ended");
}

/// What ends a message shortened to fit the reply area.
const TRUNCATED: &str = " […]";

/// Shortens the UTF-8 (or other) message `m` to at most `max` bytes, at a character boundary,
/// ending it with [`TRUNCATED`] when there is room for it.
fn truncate_message(m: &mut Vec<u8>, max: usize) {
    if m.len() <= max {
        return;
    }
    let marked = max >= TRUNCATED.len();
    let room = if marked { max - TRUNCATED.len() } else { max };
    // Back off to a character boundary (a UTF-8 character has at most 4 bytes).
    let cut = (room.saturating_sub(3)..=room)
        .rev()
        .find(|&c| std::str::from_utf8(&m[..c]).is_ok())
        .unwrap_or(room);
    m.truncate(cut);
    if marked {
        m.extend_from_slice(TRUNCATED.as_bytes());
    }
}

/// What became of a frame.
enum Executed {
    /// Its chain was returned and the guest told.
    Done,
    /// A posted frame: its chain was returned; the guest is owed a notification.
    Owed(Completion),
    /// The frame broke the protocol: the session must end (its chain was returned).
    Violation(String),
}

/// Executes the frames of a batch in order and completes its chain once: `OK` when they ran (their
/// errors, asynchronous ones, surface later as any), `BAD_REQUEST` when the device refused them,
/// `PROTOCOL` when one broke the protocol (the rest do not run; the session ends).
fn execute_batch(shared: &Shared, exec: &mut dyn SessionExecutor, batch: BatchJob) -> Executed {
    let BatchJob {
        count,
        frames,
        bytes,
        done,
        refused,
        ..
    } = batch;
    if refused {
        for _ in 0..count {
            shared.stats.add_refused();
        }
        done.finish(shared, RespHeader::status(S_BAD_REQUEST), &[]);
        return Executed::Done;
    }
    match exec.call_batch(&frames, &bytes) {
        Ok(()) => shared.stats.add_calls(frames.len()),
        Err((at, why)) => {
            shared.stats.add_calls(at + 1);
            shared.stats.add_refused();
            done.finish(shared, RespHeader::status(S_PROTOCOL), &[]);
            return Executed::Violation(why);
        }
    }
    if done.finish_quietly(shared, RespHeader::status(S_OK), &[]) {
        Executed::Owed(done)
    } else {
        Executed::Done
    }
}

/// Completes `done` through the gate, or with the gate held already (`entered`).
fn complete(shared: &Shared, done: &Completion, entered: bool, resp: RespHeader, reply: &[u8]) {
    if entered {
        done.finish_entered(shared, resp, reply);
    } else {
        done.finish(shared, resp, reply);
    }
}

/// Executes one frame and completes its chain. `entered`: the caller holds the gate of the
/// chain's generation for the whole call (the queue thread running a frame itself), so guest
/// memory is reached without taking it again.
fn execute(
    shared: &Shared,
    exec: &mut dyn SessionExecutor,
    job: CallJob,
    entered: bool,
) -> Executed {
    let CallJob {
        header,
        inline,
        data,
        reply_data,
        done,
        ..
    } = job;
    let source = GuestSource {
        shared,
        entered,
        epoch: done.epoch,
        mem: &done.mem,
        segs: &data,
    };
    let mut sink = GuestSink {
        shared,
        entered,
        epoch: done.epoch,
        mem: &done.mem,
        segs: &reply_data,
        written: 0,
    };
    shared.stats.add_call();
    let reply = exec.call(Call {
        header,
        inline: &inline,
        data: &source,
        reply_data: &mut sink,
    });
    shared
        .stats
        .add_from_guest(data.len() as u64, data.count() as u64);
    let written = sink.written;
    if written > 0 {
        let ranges = reply_data.count_in(usize::try_from(written).unwrap_or(usize::MAX));
        shared.stats.add_to_guest(written, ranges as u64);
    }
    match reply {
        Reply::None if done.queue() != CTRL_QUEUE && !entered => {
            if done.finish_quietly(shared, RespHeader::status(S_OK), &[]) {
                Executed::Owed(done)
            } else {
                Executed::Done
            }
        }
        Reply::None => {
            complete(shared, &done, entered, RespHeader::status(S_OK), &[]);
            Executed::Done
        }
        Reply::Frame {
            status,
            mut payload,
        } => {
            if status != 0 && HEADER_LEN + payload.len() > done.reply_cap {
                // An error reply is its code and a message: the code matters, the message is
                // shortened to fit rather than losing the reply.
                truncate_message(&mut payload, done.reply_cap.saturating_sub(HEADER_LEN));
            }
            let flags = if exec.output_ready() {
                FLAG_REPLY | FLAG_OUTPUT
            } else {
                FLAG_REPLY
            };
            let h = Header {
                opcode: header.opcode,
                flags,
                call_id: header.call_id,
                payload_len: payload.len() as u32,
                status,
            };
            let needed = HEADER_LEN + payload.len();
            if needed > done.reply_cap {
                shared.stats.add_refused();
                let resp = RespHeader {
                    status: S_REPLY_TOO_LARGE,
                    reply_len: needed as u32,
                    data_len: written,
                };
                complete(shared, &done, entered, resp, &[]);
                return Executed::Done;
            }
            let mut frame = Vec::with_capacity(needed);
            frame.extend_from_slice(&h.encode());
            frame.extend_from_slice(&payload);
            let resp = RespHeader {
                status: S_OK,
                reply_len: needed as u32,
                data_len: written,
            };
            complete(shared, &done, entered, resp, &frame);
            Executed::Done
        }
        Reply::Violation(why) => {
            shared.stats.add_refused();
            complete(shared, &done, entered, RespHeader::status(S_PROTOCOL), &[]);
            Executed::Violation(why)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_at_a_character_boundary_and_marked() {
        let mut m = "é".repeat(100).into_bytes();
        truncate_message(&mut m, 51);
        let text = String::from_utf8(m).expect("still UTF-8");
        assert!(text.ends_with(TRUNCATED), "{text}");
        assert!(text.len() <= 51, "{}", text.len());
        assert!(text.starts_with("éé"));
        let mut short = b"fits".to_vec();
        truncate_message(&mut short, 4);
        assert_eq!(short, b"fits");
        let mut tiny = b"no room for the mark".to_vec();
        truncate_message(&mut tiny, 3);
        assert_eq!(tiny, b"no ");
    }
}
