//! The device proper: takes request chains off both queues, validates them, opens and closes
//! sessions and hands frames to the session threads; completes chains (from any thread) unless the
//! device was reset meanwhile.
//!
//! # Resets
//!
//! Every chain carries the device *generation* it was taken under. A reset (VMM gone,
//! `VHOST_USER_RESET_DEVICE`, or the VMM stopping the queues, which is how QEMU's generic
//! vhost-user device reports a guest driver reset or reboot) bumps the generation under the write
//! side of a lock whose read side is held for every access to guest memory on behalf of a request.
//! So once a reset returns, no request from before it touches guest memory or the rings again:
//! its completion is dropped, queued frames are never run, and the sessions end, releasing their
//! GPU memory.
//!
//! # Pauses
//!
//! QEMU stops the queues (`GET_VRING_BASE`) both when the guest driver goes away (reset, module
//! unload, reboot) and when the VM is paused (`stop`); vhost-user tells the two apart only when the
//! queues start again. So a stop with sessions open *pauses* the device: no request touches guest
//! memory or the rings (bulk copies wait, completions are parked), until the queues run again. If
//! they run again where they were (same ring addresses, the avail index vgpud returned), it was a
//! pause: parked completions are returned and everything goes on. If not (a new driver starts at
//! index 0), the device is reset: the old driver's sessions end and parked completions are
//! dropped. A VMM that disconnects resets it too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, RwLock};

use tracing::{debug, error, warn};
use vgpu_proto::frame::{FLAG_ASYNC, FLAG_OUTPUT, FLAG_REPLY, HEADER_LEN, Header};
use vgpu_seccomp::ThreadKind;
use vhost_user_backend::{VringRwLock, VringT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::eventfd::EventFd;

use super::chain::{GuestMem, ParsedChain, Refused, Segment, Segments, parse_chain};
use super::exec::VgpuService;
use super::session_thread::{self, SessionCore};
use super::shared::{
    BatchJob, CallJob, Completion, InFlight, Msg, Pause, RunHere, SessionEntry, Shared, queue_name,
};
use super::stats::VgpuDevStats;
use super::wire::{
    CTRL_QUEUE, MAX_BATCH_FRAMES, MAX_DATA, MAX_INLINE, MAX_REPLY, REQ_BATCH, REQ_CALL, REQ_CLOSE,
    REQ_HEADER_LEN, REQ_OPEN, RESP_HEADER_LEN, ReqHeader, RespHeader, S_BAD_REQUEST, S_BUSY,
    S_NO_SESSION, S_OK, SUBMIT_QUEUE,
};
use vgpu_vhost_user::{LogLimiter, Rearm, next_head, rearm, vring_ready};

/// Most sessions (open file descriptors of the device) per VM.
pub const MAX_SESSIONS: usize = 256;

/// Most bulk bytes (request and reply data together) of a synchronous frame the queue thread
/// runs itself ([`SessionState::try_run_here`](super::shared::SessionState::try_run_here)): a copy of this size holds up the VM's other
/// chains for well under a millisecond; larger ones go to the session thread, whose wake-up
/// they amortize.
pub const MAX_BULK_HERE: usize = 4 << 20;

/// The virtio-vgpu device state of one VM (one VMM connection).
pub struct VgpuDevice {
    service: Arc<dyn VgpuService>,
    shared: Arc<Shared>,
    mem: Option<GuestMemoryAtomic<GuestMem>>,
    event_idx: bool,
    /// The driver accepted the BATCH feature.
    batch: bool,
    /// The queues were handed to [`Shared`] (for pauses).
    rings_known: bool,
    /// Frames this thread answered itself since [`VgpuDevice::take_answered_here`].
    answered_here: usize,
}

impl std::fmt::Debug for VgpuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VgpuDevice")
            .field("vm", &self.shared.name)
            .field("sessions", &self.session_count())
            .finish_non_exhaustive()
    }
}

/// What to answer right away.
enum Action {
    /// Answer now with this status.
    Respond(u32),
}

impl VgpuDevice {
    /// A device for VM `name`, whose sessions `service` runs.
    pub fn new(name: &str, service: Arc<dyn VgpuService>, stats: Arc<VgpuDevStats>) -> Self {
        VgpuDevice {
            service,
            shared: Arc::new(Shared {
                gate: RwLock::new(0),
                sessions: Mutex::new(HashMap::new()),
                stats,
                limiter: Mutex::new(LogLimiter::new()),
                next_token: AtomicU64::new(1),
                name: name.to_string(),
                paused: AtomicBool::new(false),
                pause: Mutex::new(Pause::default()),
                resumed: Condvar::new(),
                in_flight: InFlight::new(),
            }),
            mem: None,
            event_idx: false,
            batch: false,
            rings_known: false,
            answered_here: 0,
        }
    }

    /// The event the device writes when it resumes after a pause: the queue thread must then
    /// look at both queues again, as after a kick (see [`RESCAN_EVENT`]). Set once.
    pub fn set_rescan_event(&self, event: EventFd) {
        self.shared.in_flight.set_rescan_event(event);
    }

    /// Descriptor chains the device holds now (taken from the rings, not yet returned).
    pub fn chains_in_flight(&self) -> usize {
        self.shared.in_flight.count()
    }

    /// Installs the guest memory (called on every memory-table change).
    pub fn set_memory(&mut self, mem: GuestMemoryAtomic<GuestMem>) {
        self.mem = Some(mem);
    }

    /// Records whether the driver accepted the BATCH feature ([`super::wire::F_BATCH`]).
    pub fn set_batch(&mut self, enabled: bool) {
        self.batch = enabled;
    }

    /// Records whether `VIRTIO_RING_F_EVENT_IDX` was negotiated.
    pub fn set_event_idx(&mut self, enabled: bool) {
        self.event_idx = enabled;
    }

    /// Open sessions.
    pub fn session_count(&self) -> usize {
        self.shared.sessions().len()
    }

    /// Ends every session and invalidates every chain taken so far (see the module docs). Waits
    /// only for requests that are touching guest memory right now.
    pub fn reset(&mut self, reason: &str) {
        self.shared.reset(reason);
    }

    /// What the VMM's `GET_VRING_BASE` for `queue` does: see [`Shared::stop_queue`]. Callable
    /// without the device lock (a paused device may hold it while it waits).
    pub fn stopper(&self) -> impl Fn(usize) + Send + Sync + 'static {
        let shared = Arc::clone(&self.shared);
        move |queue| shared.stop_queue(queue)
    }

    /// Whether the device is paused (its queues stopped with sessions open).
    pub fn is_paused(&self) -> bool {
        self.shared.paused.load(Ordering::Acquire)
    }

    /// Tells the device its two queues (the vring worker calls this with every event; only the
    /// first call does anything).
    pub fn know_rings(&mut self, ctrl: &VringRwLock, submit: &VringRwLock) {
        if !self.rings_known {
            self.shared.know_rings(ctrl, submit);
            self.rings_known = true;
        }
    }

    /// How many synchronous frames this (the queue) thread answered itself since the last
    /// call: a guest waiting on such answers usually sends its next request at once.
    pub fn take_answered_here(&mut self) -> usize {
        std::mem::take(&mut self.answered_here)
    }

    /// The guest's memory, once the VMM shared it.
    pub fn memory(&self) -> Option<GuestMemoryAtomic<GuestMem>> {
        self.mem.clone()
    }

    /// Takes every chain the guest placed on queue `queue`.
    pub fn process_queue(&mut self, queue: usize, vring: &VringRwLock) {
        let Some(atomic) = self.mem.clone() else {
            return;
        };
        if !vring_ready(vring) {
            return;
        }
        if self.shared.paused.load(Ordering::Acquire) && self.shared.try_resolve_pause() {
            return;
        }
        let epoch = self.shared.generation();
        // Whether the last round found nothing although the ring claimed more ([`rearm`]).
        let mut rechecked = false;
        loop {
            if self.event_idx
                && let Err(e) = vring.disable_notification()
            {
                warn!(error = %e, "cannot disable queue notifications");
            }
            let mut popped = false;
            loop {
                if !self.shared.in_flight.has_room() {
                    // The rest stays in the ring until chains return (the rescan event).
                    self.shared.stats.add_throttle();
                    self.shared.log_guest(format_args!(
                        "the guest has {} requests in flight; taking no more until some return",
                        self.shared.in_flight.count()
                    ));
                    return;
                }
                let mem = atomic.memory();
                let chain = match next_head(vring, &mem) {
                    Ok(Some(c)) => c,
                    Ok(None) => break,
                    Err(e) => {
                        self.shared.log_guest(format_args!(
                            "{} ring is unusable ({e}); waiting for the next notification",
                            queue_name(queue)
                        ));
                        break;
                    }
                };
                popped = true;
                // Answers given here are signalled by `Completion::finish`; the rest by the
                // session threads.
                match parse_chain(chain, &mem) {
                    Ok(parsed) => self.handle_chain(queue, vring, &atomic, &mem, parsed, epoch),
                    Err(refused) => self.refuse_chain(queue, vring, &atomic, &refused, epoch),
                }
            }
            if !self.event_idx {
                break;
            }
            match rearm(vring, popped, &mut rechecked) {
                Rearm::Again => {}
                Rearm::Done => break,
                Rearm::Broken => {
                    self.shared.log_guest(format_args!(
                        "{} ring claims entries that cannot be read",
                        queue_name(queue)
                    ));
                    break;
                }
                Rearm::Failed(e) => {
                    warn!(error = %e, "cannot enable queue notifications");
                    break;
                }
            }
        }
    }

    fn refuse_chain(
        &self,
        queue: usize,
        vring: &VringRwLock,
        atomic: &GuestMemoryAtomic<GuestMem>,
        refused: &Refused,
        epoch: u64,
    ) {
        self.shared.stats.add_dropped_chain();
        self.shared.log_guest(format_args!(
            "refusing descriptor chain {} on the {} queue: {}",
            refused.head,
            queue_name(queue),
            refused.error
        ));
        let writable = refused
            .resp
            .map(|s| {
                Segments::new(vec![Segment {
                    addr: s.addr,
                    len: RESP_HEADER_LEN,
                }])
            })
            .unwrap_or_default();
        Completion {
            vring: vring.clone(),
            mem: atomic.clone(),
            head: refused.head,
            writable,
            reply_cap: 0,
            epoch,
            queue,
            _held: self.shared.in_flight.take(),
        }
        .finish(&self.shared, RespHeader::status(S_BAD_REQUEST), &[]);
    }

    /// Handles a validated chain: answers it now or hands it to its session thread.
    fn handle_chain(
        &mut self,
        queue: usize,
        vring: &VringRwLock,
        atomic: &GuestMemoryAtomic<GuestMem>,
        mem: &GuestMem,
        mut chain: ParsedChain,
        epoch: u64,
    ) {
        let mut hdr_bytes = [0u8; REQ_HEADER_LEN];
        let have = chain.readable.read_into(mem, &mut hdr_bytes).unwrap_or(0);
        let hdr = ReqHeader::from_bytes(&hdr_bytes);
        let reply_cap = if queue == CTRL_QUEUE && hdr.kind == REQ_CALL {
            (hdr.reply_cap as usize).min(chain.writable.len().saturating_sub(RESP_HEADER_LEN))
        } else {
            0
        };
        let short = have < REQ_HEADER_LEN || chain.writable.len() < RESP_HEADER_LEN;
        // Classified while the chain still holds its writable stream, which then moves into the
        // completion.
        let classified = (!short).then(|| self.classify(queue, &hdr, mem, &chain));
        let done = Completion {
            vring: vring.clone(),
            mem: atomic.clone(),
            head: chain.head,
            writable: std::mem::take(&mut chain.writable),
            reply_cap,
            epoch,
            queue,
            _held: self.shared.in_flight.take(),
        };
        let Some(classified) = classified else {
            self.shared.stats.add_dropped_chain();
            self.shared.log_guest(format_args!(
                "chain {} lacks room for the request or response header",
                chain.head
            ));
            done.finish(&self.shared, RespHeader::status(S_BAD_REQUEST), &[]);
            return;
        };
        let action = match classified {
            Err(why) => {
                self.shared.log_guest(format_args!(
                    "bad request on the {} queue (session {}): {why}",
                    queue_name(queue),
                    hdr.session
                ));
                if hdr.kind == REQ_CALL && hdr.seq != 0 {
                    // The session still counts the sequence number, or every later frame would
                    // wait for it: the refusal goes through the session thread, in order.
                    let job = Box::new(CallJob {
                        seq: hdr.seq,
                        header: Header {
                            opcode: 0,
                            flags: 0,
                            call_id: 0,
                            payload_len: 0,
                            status: 0,
                        },
                        inline: Vec::new(),
                        data: Segments::default(),
                        reply_data: Segments::default(),
                        done,
                        refused: true,
                    });
                    self.send_or_refuse(hdr.session, Msg::Call(job), S_BAD_REQUEST);
                    return;
                }
                Action::Respond(S_BAD_REQUEST)
            }
            Ok(Classified::Batch(split)) => {
                self.queue_batch(&hdr, split, done);
                return;
            }
            Ok(Classified::Open) => self.open(hdr.session),
            Ok(Classified::Close) => match self.shared.sessions().remove(&hdr.session) {
                Some(entry) => {
                    // A call still waiting for the session's work gives up (the process is gone).
                    entry.gone.store(true, Ordering::Release);
                    // The thread completes the chain once the session has released everything.
                    if let Err(Msg::Close(done)) = entry.send(Msg::Close(done)) {
                        done.finish(&self.shared, RespHeader::status(S_OK), &[]);
                    }
                    return;
                }
                None => Action::Respond(S_NO_SESSION),
            },
            Ok(Classified::Call(header, inline)) => {
                let data_start = REQ_HEADER_LEN + hdr.inline_len as usize;
                let job = Box::new(CallJob {
                    seq: hdr.seq,
                    header,
                    inline,
                    data: chain.readable.tail(data_start),
                    reply_data: done.writable.tail(RESP_HEADER_LEN + reply_cap),
                    done,
                    refused: false,
                });
                if queue == CTRL_QUEUE
                    && job.data.len() + job.reply_data.len() <= MAX_BULK_HERE
                    && vgpu_seccomp::vhost_may_run_session_calls()
                {
                    self.run_here_or_send(hdr.session, job);
                } else {
                    self.send_or_refuse(hdr.session, Msg::Call(job), S_NO_SESSION);
                }
                return;
            }
        };
        match action {
            Action::Respond(status) => {
                if status != S_OK {
                    self.shared.stats.add_refused();
                }
                done.finish(&self.shared, RespHeader::status(status), &[]);
            }
        }
    }

    /// Queues a `BATCH` request whose header passed [`VgpuDevice::classify`]: its frames go to
    /// their session thread as one job, run in sequence order and complete the chain once. A batch
    /// whose frames are malformed (`split`'s error) is refused in its places: the sequence numbers
    /// are spent either way, so the session's later frames do not wait for them.
    fn queue_batch(&self, hdr: &ReqHeader, split: Result<BatchFrames, String>, done: Completion) {
        let n = hdr.reply_cap as usize;
        self.shared.stats.add_batch();
        let (frames, bytes, refused) = match split {
            Ok((frames, bytes)) => (frames, bytes, false),
            Err(why) => {
                self.shared.log_guest(format_args!(
                    "bad batch (session {}, frames {}..{}): {why}",
                    hdr.session,
                    hdr.seq,
                    hdr.seq + n as u64
                ));
                (Vec::new(), Vec::new(), true)
            }
        };
        let batch = Box::new(BatchJob {
            seq: hdr.seq,
            count: n as u64,
            frames,
            bytes,
            done,
            refused,
        });
        self.send_or_refuse(hdr.session, Msg::Batch(batch), S_NO_SESSION);
    }

    /// Runs a synchronous frame with at most [`MAX_BULK_HERE`] bulk bytes on this thread when
    /// its session's thread is idle and the frame is answered at once (see
    /// [`SessionState::try_run_here`](super::shared::SessionState::try_run_here)); sends it to
    /// the session thread otherwise.
    fn run_here_or_send(&mut self, session: u32, job: Box<CallJob>) {
        let found = self
            .shared
            .sessions()
            .get(&session)
            .map(|e| (Arc::clone(&e.core), e.token));
        let Some((core, token)) = found else {
            self.send_or_refuse(session, Msg::Call(job), S_NO_SESSION);
            return;
        };
        match core.try_run_here(&self.shared, job) {
            RunHere::Ran => self.answered_here += 1,
            RunHere::Violation(why) => {
                warn!(session, "session closed: protocol violation: {why}");
                // The session thread, left without its channel, ends the session.
                let mut sessions = self.shared.sessions();
                if sessions.get(&session).is_some_and(|e| e.token == token)
                    && let Some(entry) = sessions.remove(&session)
                {
                    entry.gone.store(true, Ordering::Release);
                }
            }
            RunHere::Declined(job) => self.send_or_refuse(session, Msg::Call(job), S_NO_SESSION),
        }
    }

    /// Sends `msg` to session `session`'s thread; without such a session, completes its chain
    /// with `status` (a refusal).
    fn send_or_refuse(&self, session: u32, msg: Msg, status: u32) {
        let sent = match self.shared.sessions().get(&session) {
            Some(entry) => entry.send(msg),
            None => Err(msg),
        };
        if let Err(msg) = sent {
            self.shared.stats.add_refused();
            msg.done()
                .finish(&self.shared, RespHeader::status(status), &[]);
        }
    }

    fn open(&mut self, session: u32) -> Action {
        let mut sessions = self.shared.sessions();
        if sessions.contains_key(&session) {
            self.shared
                .log_guest(format_args!("session {session} is already open"));
            return Action::Respond(S_BUSY);
        }
        if sessions.len() >= MAX_SESSIONS {
            warn!(vm = %self.shared.name, "session limit {MAX_SESSIONS} reached");
            return Action::Respond(S_BUSY);
        }
        let gone = Arc::new(AtomicBool::new(false));
        let exec = match self.service.open(Arc::clone(&gone)) {
            Ok(e) => e,
            Err(why) => {
                warn!(vm = %self.shared.name, session, "cannot open a session: {why}");
                return Action::Respond(S_BUSY);
            }
        };
        let token = self.shared.next_token.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        let core = Arc::new(SessionCore::new(exec));
        let thread_core = Arc::clone(&core);
        let shared = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new()
            .name(format!("vgpu-dev-{}-{session}", self.shared.name))
            .spawn(move || {
                // The guest's requests are parsed only under the session allowlist.
                if let Err(e) = vgpu_seccomp::enter(ThreadKind::Session) {
                    error!(vm = %shared.name, error = %e, "session not started");
                    return;
                }
                session_thread::run(shared, session, token, thread_core, rx);
                vgpu_broker::release_freed_memory();
            });
        if let Err(e) = spawned {
            error!(vm = %self.shared.name, error = %e, "cannot start a session thread");
            return Action::Respond(S_BUSY);
        }
        sessions.insert(session, SessionEntry::new(token, tx, gone, core));
        self.shared.stats.session_opened();
        debug!(vm = %self.shared.name, session, "virtio-vgpu session opened");
        Action::Respond(S_OK)
    }

    /// Checks a request header and, for a call, its frame.
    fn classify(
        &self,
        queue: usize,
        hdr: &ReqHeader,
        mem: &GuestMem,
        chain: &ParsedChain,
    ) -> Result<Classified, String> {
        if hdr.reserved != 0 {
            return Err("reserved header bits are set".into());
        }
        if hdr.session == 0 {
            return Err("session id 0 is reserved".into());
        }
        match hdr.kind {
            REQ_OPEN | REQ_CLOSE if queue != CTRL_QUEUE => {
                Err("sessions are opened and closed on the control queue".into())
            }
            REQ_OPEN => Ok(Classified::Open),
            REQ_CLOSE => Ok(Classified::Close),
            REQ_CALL => self.classify_call(queue, hdr, mem, chain),
            REQ_BATCH => self.classify_batch(queue, hdr, mem, chain),
            other => Err(format!("unknown request type {other}")),
        }
    }

    /// A `BATCH` header is checked here (refused whole when it fails); its frames are split
    /// here too, but their faults are refused in place ([`VgpuDevice::queue_batch`]).
    fn classify_batch(
        &self,
        queue: usize,
        hdr: &ReqHeader,
        mem: &GuestMem,
        chain: &ParsedChain,
    ) -> Result<Classified, String> {
        let n = hdr.reply_cap as usize;
        if !self.batch {
            return Err("a BATCH request, but the driver did not accept the BATCH feature".into());
        }
        if queue != SUBMIT_QUEUE {
            return Err("batches go on the submission queue".into());
        }
        if !(1..=MAX_BATCH_FRAMES).contains(&n) {
            return Err(format!(
                "a batch carries 1..={MAX_BATCH_FRAMES} frames, not {n}"
            ));
        }
        if hdr.seq == 0 || hdr.seq.checked_add(n as u64).is_none() {
            return Err(format!("sequence number {} cannot start a batch", hdr.seq));
        }
        Ok(Classified::Batch(split_batch(hdr, mem, chain, n)))
    }

    fn classify_call(
        &self,
        queue: usize,
        hdr: &ReqHeader,
        mem: &GuestMem,
        chain: &ParsedChain,
    ) -> Result<Classified, String> {
        if hdr.seq == 0 {
            return Err("sequence numbers start at 1".into());
        }
        let mut inline = inline_bytes(hdr, mem, chain)?;
        let inline_len = inline.len();
        let data_len = chain.readable.len() - REQ_HEADER_LEN - inline_len;
        if data_len > MAX_DATA {
            return Err(format!("{data_len} data bytes exceed {MAX_DATA}"));
        }
        let mut hb = [0u8; HEADER_LEN];
        hb.copy_from_slice(&inline[..HEADER_LEN]);
        let header = Header::decode(&hb).map_err(|e| format!("bad frame header: {e}"))?;
        if header.flags & (FLAG_REPLY | FLAG_OUTPUT) != 0 {
            return Err("a request frame has the REPLY flag".into());
        }
        let is_async = header.flags & FLAG_ASYNC != 0;
        if is_async != (queue == SUBMIT_QUEUE) {
            return Err(if is_async {
                "an asynchronous frame on the control queue".into()
            } else {
                "a synchronous frame on the submission queue".into()
            });
        }
        let carried = inline_len - HEADER_LEN + data_len;
        if header.payload_len as usize != carried {
            return Err(format!(
                "the frame's payload_len {} does not match the {carried} payload bytes carried",
                header.payload_len
            ));
        }
        if !is_async {
            let cap = hdr.reply_cap as usize;
            if !(HEADER_LEN..=MAX_REPLY).contains(&cap) {
                return Err(format!(
                    "reply area of {cap} bytes is outside {HEADER_LEN}..={MAX_REPLY}"
                ));
            }
            if RESP_HEADER_LEN + cap > chain.writable.len() {
                return Err(format!(
                    "reply area of {cap} bytes exceeds the {} writable bytes after the response header",
                    chain.writable.len() - RESP_HEADER_LEN
                ));
            }
        }
        inline.drain(..HEADER_LEN);
        Ok(Classified::Call(header, inline))
    }
}

/// A request's inline bytes (`inline_len` of them after the request header, within limits and
/// within the readable bytes), read out of guest memory.
fn inline_bytes(hdr: &ReqHeader, mem: &GuestMem, chain: &ParsedChain) -> Result<Vec<u8>, String> {
    let inline_len = hdr.inline_len as usize;
    if !(HEADER_LEN..=MAX_INLINE).contains(&inline_len) {
        return Err(format!(
            "inline length {inline_len} is outside {HEADER_LEN}..={MAX_INLINE}"
        ));
    }
    let readable = chain.readable.len();
    if REQ_HEADER_LEN + inline_len > readable {
        return Err(format!(
            "inline length {inline_len} exceeds the {} readable bytes after the header",
            readable - REQ_HEADER_LEN
        ));
    }
    let mut inline = vec![0u8; inline_len];
    chain
        .readable
        .read_at(mem, REQ_HEADER_LEN, &mut inline)
        .map_err(|e| e.to_string())?;
    Ok(inline)
}

/// The `n` frames of a `BATCH` request, each a header (asynchronous, not a reply) and where its
/// whole payload lies in the returned bytes: back to back in the inline bytes, which are all the
/// request carries.
fn split_batch(
    hdr: &ReqHeader,
    mem: &GuestMem,
    chain: &ParsedChain,
    n: usize,
) -> Result<BatchFrames, String> {
    let bytes = inline_bytes(hdr, mem, chain)?;
    let inline_len = bytes.len();
    if chain.readable.len() != REQ_HEADER_LEN + inline_len {
        return Err(format!(
            "{} bytes of request data after the frames; a batch carries none",
            chain.readable.len() - REQ_HEADER_LEN - inline_len
        ));
    }
    let mut frames = Vec::with_capacity(n);
    let mut at = 0;
    for i in 0..n {
        let Some(hb) = bytes.get(at..at + HEADER_LEN) else {
            return Err(format!("frame {i} of {n} is cut short"));
        };
        let hb: &[u8; HEADER_LEN] = hb.try_into().map_err(|_| "a frame header".to_string())?;
        let header = Header::decode(hb).map_err(|e| format!("frame {i}: bad header: {e}"))?;
        if header.flags & (FLAG_REPLY | FLAG_OUTPUT) != 0 || header.flags & FLAG_ASYNC == 0 {
            return Err(format!("frame {i} is not an asynchronous request"));
        }
        let start = at + HEADER_LEN;
        let len = header.payload_len as usize;
        if len > inline_len - start {
            return Err(format!(
                "frame {i}: payload_len {len} exceeds the {} bytes left",
                inline_len - start
            ));
        }
        frames.push((header, start..start + len));
        at = start + len;
    }
    if at != inline_len {
        return Err(format!("{} bytes follow the last frame", inline_len - at));
    }
    Ok((frames, bytes))
}

/// A request header that passed its checks.
enum Classified {
    Open,
    Close,
    Call(Header, Vec<u8>),
    /// A batch's frames, or why they are malformed.
    Batch(Result<BatchFrames, String>),
}

/// The frames of a batch (each header and where its payload lies in the bytes) and its bytes.
type BatchFrames = (Vec<(Header, std::ops::Range<usize>)>, Vec<u8>);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{Call, Reply, SessionExecutor};
    use crate::wire::{
        MAX_BATCH_FRAMES, REQ_BATCH, REQ_CALL, S_PROTOCOL, S_REPLY_TOO_LARGE, SUBMIT_QUEUE,
    };
    use std::sync::mpsc::{Receiver, Sender};
    use std::time::{Duration, Instant};
    use vgpu_broker::CuError;
    use vgpu_proto::frame::MAGIC;
    use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{RawDescriptor, split::Descriptor as SplitDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Address, Bytes, GuestAddress};

    /// The mock queue does not wrap its avail ring: room for every chain a test posts.
    const QSIZE: u16 = 512;
    const CTRL_BASE: u64 = 0x1000;
    const SUBMIT_BASE: u64 = 0x2_0000;
    const SLOTS: u64 = 0x10_0000;
    const SLOT: u64 = 0x1_0000;
    const MEM_SIZE: u64 = 0x200_0000;
    const WAIT: Duration = Duration::from_secs(10);

    /// Opcodes the fake executor understands.
    const OP_ECHO: u16 = 0x10;
    const OP_DTOH: u16 = 0x11;
    const OP_VIOLATE: u16 = 0x12;
    const OP_BLOCK: u16 = 0x13;
    const OP_BIG: u16 = 0x14;
    const OP_BIG_ERROR: u16 = 0x15;

    /// Frames with a call id from here up are ones the fake answers at once.
    const QUICK_CALLS: u64 = 1000;

    /// Echoes the payload, writes `inline[0]` × 1000 pattern bytes into the reply data, records
    /// the order of frames, and blocks when told to.
    struct Fake {
        seen: Sender<(u16, u64)>,
        gate: Option<Receiver<()>>,
    }

    impl SessionExecutor for Fake {
        fn answers_at_once(&self, header: &Header) -> bool {
            header.call_id >= QUICK_CALLS
        }

        fn call(&mut self, c: Call<'_>) -> Reply {
            let _ = self.seen.send((c.header.opcode, c.header.call_id));
            let mut payload = c.inline.to_vec();
            c.data
                .read(&mut |segs| {
                    for s in segs {
                        payload.extend_from_slice(s);
                    }
                    Ok(())
                })
                .unwrap();
            match c.header.opcode {
                OP_DTOH => {
                    let n = u64::from(c.inline[0]) * 1000;
                    let r = c.reply_data.write(n, &mut |segs| {
                        let mut i = 0u64;
                        for s in segs.iter_mut() {
                            for b in s.iter_mut() {
                                *b = (i % 251) as u8;
                                i += 1;
                            }
                        }
                        Ok(())
                    });
                    match r {
                        Ok(()) => Reply::Frame {
                            status: 0,
                            payload: Vec::new(),
                        },
                        Err(e) => Reply::Frame {
                            status: e.code,
                            payload: e.message.into_bytes(),
                        },
                    }
                }
                OP_VIOLATE => Reply::Violation("told to".into()),
                OP_BLOCK => {
                    if let Some(g) = &self.gate {
                        let _ = g.recv();
                    }
                    if c.header.flags & FLAG_ASYNC != 0 {
                        // A posted frame that ran long.
                        return Reply::None;
                    }
                    // Try to write guest memory after the gate opened.
                    let r = c.reply_data.write(8, &mut |segs| {
                        for s in segs.iter_mut() {
                            s.fill(0xee);
                        }
                        Ok(())
                    });
                    let status = r.err().map_or(0, |e: CuError| e.code);
                    Reply::Frame {
                        status,
                        payload: Vec::new(),
                    }
                }
                OP_BIG => Reply::Frame {
                    status: 0,
                    payload: vec![7; 5000],
                },
                OP_BIG_ERROR => Reply::Frame {
                    status: vgpu_proto::cuda::CUDA_ERROR_ILLEGAL_ADDRESS,
                    payload: format!("kernel fault: {}", "log line\n".repeat(1000)).into_bytes(),
                },
                _ if c.header.flags & FLAG_ASYNC != 0 => Reply::None,
                _ => Reply::Frame { status: 0, payload },
            }
        }
    }

    struct FakeService {
        seen: Mutex<Sender<(u16, u64)>>,
        gates: Mutex<Vec<Receiver<()>>>,
    }

    impl VgpuService for FakeService {
        fn open(&self, _gone: Arc<AtomicBool>) -> Result<Box<dyn SessionExecutor>, String> {
            Ok(Box::new(Fake {
                seen: self.seen.lock().unwrap().clone(),
                gate: self.gates.lock().unwrap().pop(),
            }))
        }
        fn slice_size(&self) -> u64 {
            1 << 30
        }
        fn gpu_name(&self) -> String {
            "fake".into()
        }
    }

    struct Rig {
        mem: GuestMemoryAtomic<GuestMem>,
        dev: VgpuDevice,
        stats: Arc<VgpuDevStats>,
        seen: Receiver<(u16, u64)>,
        ctrl: (VringRwLock, MockSplitQueue<'static, GuestMem>),
        submit: (VringRwLock, MockSplitQueue<'static, GuestMem>),
        next_desc: [u16; 2],
        gate_tx: Vec<Sender<()>>,
    }

    fn vring(
        mem: &GuestMemoryAtomic<GuestMem>,
        base: u64,
    ) -> (VringRwLock, MockSplitQueue<'static, GuestMem>) {
        // The mock needs a memory reference that outlives it; leak one snapshot for the test.
        let m: &'static GuestMem = Box::leak(Box::new(mem.memory().clone()));
        let q = MockSplitQueue::create(m, GuestAddress(base), QSIZE);
        let v = VringRwLock::new(mem.clone(), QSIZE).unwrap();
        v.set_queue_size(QSIZE);
        v.set_queue_info(
            q.desc_table_addr().raw_value(),
            q.avail_addr().raw_value(),
            q.used_addr().raw_value(),
        )
        .unwrap();
        v.set_queue_ready(true);
        v.set_enabled(true);
        (v, q)
    }

    fn rig_with_gates(gates: usize) -> Rig {
        let mem = GuestMemoryAtomic::new(
            GuestMem::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).unwrap(),
        );
        let (tx, seen) = mpsc::channel();
        let mut gate_tx = Vec::new();
        let mut gate_rx = Vec::new();
        for _ in 0..gates {
            let (t, r) = mpsc::channel();
            gate_tx.push(t);
            gate_rx.push(r);
        }
        let service = Arc::new(FakeService {
            seen: Mutex::new(tx),
            gates: Mutex::new(gate_rx),
        });
        let stats = Arc::new(VgpuDevStats::default());
        let mut dev = VgpuDevice::new("vm-test", service, stats.clone());
        dev.set_memory(mem.clone());
        let ctrl = vring(&mem, CTRL_BASE);
        let submit = vring(&mem, SUBMIT_BASE);
        Rig {
            mem,
            dev,
            stats,
            seen,
            ctrl,
            submit,
            next_desc: [0, 0],
            gate_tx,
        }
    }

    fn rig() -> Rig {
        rig_with_gates(0)
    }

    fn d(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
    }

    /// A request as the guest would build it: (address, length, device-writable) per descriptor.
    type Descs = Vec<(u64, u32, bool)>;

    fn frame(opcode: u16, flags: u16, call_id: u64, payload_len: usize, inline: &[u8]) -> Vec<u8> {
        let h = Header {
            opcode,
            flags,
            call_id,
            payload_len: payload_len as u32,
            status: 0,
        };
        let mut f = h.encode().to_vec();
        f.extend_from_slice(inline);
        f
    }

    impl Rig {
        fn slot(i: u64) -> u64 {
            SLOTS + i * SLOT
        }

        /// Writes a request header and inline bytes at slot `i` and returns the descriptors of a
        /// request with `data` bytes of request data, a reply area and `reply_data` bytes of room.
        fn request(
            &self,
            i: u64,
            hdr: ReqHeader,
            inline: &[u8],
            data: &[u8],
            reply_data: u32,
        ) -> Descs {
            let m = self.mem.memory();
            let base = Self::slot(i);
            m.write_slice(&hdr.to_bytes(), GuestAddress(base)).unwrap();
            m.write_slice(inline, GuestAddress(base + REQ_HEADER_LEN as u64))
                .unwrap();
            m.write_slice(data, GuestAddress(base + 0x2000)).unwrap();
            let mut v = vec![(base, (REQ_HEADER_LEN + inline.len()) as u32, false)];
            if !data.is_empty() {
                v.push((base + 0x2000, data.len() as u32, false));
            }
            v.push((base + 0x8000, RESP_HEADER_LEN as u32, true));
            if hdr.reply_cap > 0 {
                v.push((base + 0x8100, hdr.reply_cap, true));
            }
            if reply_data > 0 {
                v.push((base + 0xa000, reply_data, true));
            }
            v
        }

        fn push(&mut self, queue: usize, descs: &Descs) -> u16 {
            let first = self.next_desc[queue];
            let raw: Vec<RawDescriptor> = descs
                .iter()
                .enumerate()
                .map(|(i, &(a, l, w))| {
                    let last = i + 1 == descs.len();
                    let flags = if w { VRING_DESC_F_WRITE as u16 } else { 0 }
                        | if last { 0 } else { VRING_DESC_F_NEXT as u16 };
                    let next = if last { 0 } else { first + i as u16 + 1 };
                    d(a, l, flags, next)
                })
                .collect();
            let q = if queue == CTRL_QUEUE {
                &self.ctrl.1
            } else {
                &self.submit.1
            };
            q.add_desc_chains(&raw, first).unwrap();
            self.next_desc[queue] = (first + descs.len() as u16) % QSIZE;
            first
        }

        fn run(&mut self) {
            let (c, s) = (self.ctrl.0.clone(), self.submit.0.clone());
            self.dev.process_queue(SUBMIT_QUEUE, &s);
            self.dev.process_queue(CTRL_QUEUE, &c);
        }

        fn used_idx(&self, queue: usize) -> u16 {
            let q = if queue == CTRL_QUEUE {
                &self.ctrl.1
            } else {
                &self.submit.1
            };
            self.mem
                .memory()
                .read_obj(q.used_addr().unchecked_add(2))
                .unwrap()
        }

        /// Waits until session `session`'s thread is idle (it took in everything sent to it and
        /// let go of the session's state), so that the next quick frame is the queue thread's
        /// to run: on a loaded host that thread may still be finishing its last message.
        fn settle(&self, session: u32) {
            let deadline = Instant::now() + WAIT;
            while !self
                .dev
                .shared
                .sessions()
                .get(&session)
                .is_some_and(|e| e.core.idle())
            {
                assert!(Instant::now() < deadline, "session {session} stays busy");
                std::thread::sleep(Duration::from_millis(1));
            }
        }

        fn wait_used(&self, queue: usize, n: u16) {
            let deadline = Instant::now() + WAIT;
            while self.used_idx(queue) < n {
                assert!(
                    Instant::now() < deadline,
                    "queue {queue}: used {} < {n}",
                    self.used_idx(queue)
                );
                std::thread::sleep(Duration::from_millis(2));
            }
        }

        /// The (head, length) of used entry `i`.
        fn used(&self, queue: usize, i: u16) -> (u32, u32) {
            let q = if queue == CTRL_QUEUE {
                &self.ctrl.1
            } else {
                &self.submit.1
            };
            let m = self.mem.memory();
            let e = q.used_addr().unchecked_add(4 + 8 * u64::from(i));
            (
                m.read_obj(e).unwrap(),
                m.read_obj(e.unchecked_add(4)).unwrap(),
            )
        }

        fn resp(&self, i: u64) -> RespHeader {
            let mut b = [0u8; RESP_HEADER_LEN];
            self.mem
                .memory()
                .read_slice(&mut b, GuestAddress(Self::slot(i) + 0x8000))
                .unwrap();
            RespHeader::from_bytes(&b)
        }

        fn reply(&self, i: u64, len: usize) -> Vec<u8> {
            let mut b = vec![0u8; len];
            self.mem
                .memory()
                .read_slice(&mut b, GuestAddress(Self::slot(i) + 0x8100))
                .unwrap();
            b
        }

        fn reply_data(&self, i: u64, len: usize) -> Vec<u8> {
            let mut b = vec![0u8; len];
            self.mem
                .memory()
                .read_slice(&mut b, GuestAddress(Self::slot(i) + 0xa000))
                .unwrap();
            b
        }

        /// Sends a request on the control queue and waits for its completion.
        fn ctrl_sync(&mut self, i: u64, descs: &Descs) -> RespHeader {
            self.sync_on(CTRL_QUEUE, i, descs)
        }

        /// Sends a request on `queue` and waits for its completion.
        fn sync_on(&mut self, queue: usize, i: u64, descs: &Descs) -> RespHeader {
            let n = self.used_idx(queue);
            let m = self.mem.memory();
            m.write_slice(
                &[0xffu8; RESP_HEADER_LEN],
                GuestAddress(Self::slot(i) + 0x8000),
            )
            .unwrap();
            self.push(queue, descs);
            self.run();
            self.wait_used(queue, n + 1);
            self.resp(i)
        }

        /// Sends a synchronous request on the control queue and checks that it is not answered
        /// a while later (it waits for a frame ahead of it); returns the used index before it.
        fn push_unanswered(&mut self, descs: &Descs, why: &str) -> u16 {
            let n = self.used_idx(CTRL_QUEUE);
            self.push(CTRL_QUEUE, descs);
            self.run();
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(self.used_idx(CTRL_QUEUE), n, "{why}");
            n
        }

        /// An `OPEN` request for `session` at slot `i`.
        fn open_request(&self, i: u64, session: u32) -> Descs {
            let hdr = ReqHeader {
                kind: REQ_OPEN,
                session,
                ..Default::default()
            };
            self.request(i, hdr, &[], &[], 0)
        }

        fn open(&mut self, i: u64, session: u32) -> RespHeader {
            let d = self.open_request(i, session);
            self.ctrl_sync(i, &d)
        }

        /// Gives both queues a call eventfd (the guest's interrupts) and returns them, control
        /// queue first.
        fn call_events(&self) -> Vec<vmm_sys_util::eventfd::EventFd> {
            use std::os::fd::{FromRawFd, IntoRawFd};
            use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};
            [&self.ctrl.0, &self.submit.0]
                .iter()
                .map(|v| {
                    let e = EventFd::new(EFD_NONBLOCK).unwrap();
                    let fd = e.try_clone().unwrap().into_raw_fd();
                    // SAFETY: `fd` is a fresh duplicate of the eventfd that nothing else owns.
                    v.set_call(Some(unsafe { std::fs::File::from_raw_fd(fd) }));
                    e
                })
                .collect()
        }

        fn call_hdr(session: u32, seq: u64, inline: usize, reply_cap: u32) -> ReqHeader {
            ReqHeader {
                kind: REQ_CALL,
                session,
                seq,
                inline_len: inline as u32,
                reply_cap,
                reserved: 0,
            }
        }
    }

    /// QEMU restarts the queues of a paused VM one by one while the guest may already run: a
    /// request kicked on the first queue finds the device still paused (the second queue is not
    /// running yet) and is left in the ring. Once the device resumes it asks the queue thread to
    /// look again (the rescan event); then the request is taken, though the guest never kicked
    /// again.
    #[test]
    fn a_request_kicked_before_the_resume_is_taken_on_the_rescan() {
        use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};
        let mut r = rig();
        let rescan = EventFd::new(EFD_NONBLOCK).unwrap();
        r.dev.set_rescan_event(rescan.try_clone().unwrap());
        assert_eq!(r.open(0, 5).status, S_OK);
        r.dev.know_rings(&r.ctrl.0, &r.submit.0);
        // QEMU `stop`: both queues stopped with a session open (GET_VRING_BASE).
        let stop = r.dev.stopper();
        for (q, v) in [(CTRL_QUEUE, &r.ctrl.0), (SUBMIT_QUEUE, &r.submit.0)] {
            v.set_queue_ready(false);
            stop(q);
        }
        assert!(r.dev.is_paused());
        // `cont`, half-way: the control queue runs again and the guest kicks a request on it.
        r.ctrl.0.set_queue_ready(true);
        let f = frame(OP_ECHO, 0, 9, 8, b"abcdefgh");
        let d = r.request(1, Rig::call_hdr(5, 1, f.len(), 256), &f, &[], 0);
        let before = r.used_idx(CTRL_QUEUE);
        r.push(CTRL_QUEUE, &d);
        r.run();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(r.used_idx(CTRL_QUEUE), before, "taken while paused");
        assert!(
            rescan.read().is_err(),
            "no rescan before the device resumes"
        );
        // The second queue runs again: the watcher resumes the device and asks for a rescan.
        r.submit.0.set_queue_ready(true);
        let deadline = Instant::now() + WAIT;
        while rescan.read().is_err() {
            assert!(Instant::now() < deadline, "no rescan after the resume");
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(!r.dev.is_paused());
        assert_eq!(
            r.used_idx(CTRL_QUEUE),
            before,
            "nothing looked at the ring yet"
        );
        // What the vring worker does on the rescan event.
        r.run();
        r.wait_used(CTRL_QUEUE, before + 1);
        assert_eq!(r.resp(1).status, S_OK);
        let st = r.stats.snapshot();
        assert_eq!((st.pauses, st.resumes, st.device_resets), (1, 1, 0));
    }

    /// A completion returned just before a pause may be signalled while QEMU has detached its
    /// notifiers (the interrupt is lost) though the ring's suppression state (EVENT_IDX) counts it
    /// as delivered. The resume interrupts the guest on both queues whatever that state says, so a
    /// guest waiting for that completion is woken (seen once in CI: a paused VM's copies never
    /// went on after `cont`).
    #[test]
    fn a_resume_interrupts_the_guest_even_when_event_idx_says_it_was_told() {
        let mut r = rig();
        let calls = r.call_events();
        for v in [&r.ctrl.0, &r.submit.0] {
            v.set_queue_event_idx(true);
        }
        r.dev.set_event_idx(true);
        let signals = |q: usize| calls[q].read().unwrap_or(0);
        assert_eq!(r.open(0, 5).status, S_OK);
        r.dev.know_rings(&r.ctrl.0, &r.submit.0);
        assert_eq!(signals(CTRL_QUEUE), 1, "the open was signalled");
        // A posted frame completes and is signalled; the interrupt is lost (QEMU stopping).
        let f = frame(OP_ECHO, FLAG_ASYNC, 2, 0, b"");
        let d = r.request(1, Rig::call_hdr(5, 1, f.len(), 0), &f, &[], 0);
        r.push(SUBMIT_QUEUE, &d);
        r.run();
        r.wait_used(SUBMIT_QUEUE, 1);
        wait_signalled(&calls, SUBMIT_QUEUE, "the posted frame was never signalled");
        // `stop`, then `cont`.
        let stop = r.dev.stopper();
        for (q, v) in [(CTRL_QUEUE, &r.ctrl.0), (SUBMIT_QUEUE, &r.submit.0)] {
            v.set_queue_ready(false);
            stop(q);
        }
        assert!(r.dev.is_paused());
        r.ctrl.0.set_queue_ready(true);
        r.submit.0.set_queue_ready(true);
        let deadline = Instant::now() + WAIT;
        while r.dev.is_paused() {
            assert!(Instant::now() < deadline, "the device never resumed");
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(
            signals(SUBMIT_QUEUE),
            1,
            "no interrupt on the submit queue at the resume"
        );
        assert_eq!(
            signals(CTRL_QUEUE),
            1,
            "no interrupt on the control queue at the resume"
        );
        let st = r.stats.snapshot();
        assert_eq!((st.pauses, st.resumes, st.device_resets), (1, 1, 0));
    }

    #[test]
    fn open_call_close_and_calls_after_close() {
        let mut r = rig();
        assert_eq!(r.open(0, 5).status, S_OK);
        assert_eq!(r.open(1, 5).status, S_BUSY, "the id is in use");
        // Sync echo with 3 inline payload bytes and 5 bytes of request data.
        let f = frame(OP_ECHO, 0, 77, 8, b"abc");
        let d = r.request(2, Rig::call_hdr(5, 1, f.len(), 256), &f, b"defgh", 0);
        let resp = r.ctrl_sync(2, &d);
        assert_eq!((resp.status, resp.reply_len), (S_OK, 32));
        let reply = r.reply(2, 32);
        let h = Header::decode(reply[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(
            (h.opcode, h.call_id, h.flags, h.payload_len),
            (OP_ECHO, 77, FLAG_REPLY, 8)
        );
        assert_eq!(&reply[HEADER_LEN..], b"abcdefgh");
        // Async on the submission queue.
        let f = frame(OP_ECHO, FLAG_ASYNC, 78, 0, b"");
        let d = r.request(3, Rig::call_hdr(5, 2, f.len(), 0), &f, &[], 0);
        r.push(SUBMIT_QUEUE, &d);
        r.run();
        r.wait_used(SUBMIT_QUEUE, 1);
        assert_eq!(r.resp(3).status, S_OK);
        // Close, then a call of the closed session.
        let d = r.request(
            4,
            ReqHeader {
                kind: REQ_CLOSE,
                session: 5,
                ..Default::default()
            },
            &[],
            &[],
            0,
        );
        assert_eq!(r.ctrl_sync(4, &d).status, S_OK);
        let f = frame(OP_ECHO, 0, 79, 0, b"");
        let d = r.request(5, Rig::call_hdr(5, 3, f.len(), 256), &f, &[], 0);
        assert_eq!(r.ctrl_sync(5, &d).status, S_NO_SESSION);
        let s = r.stats.snapshot();
        assert_eq!((s.sessions_open, s.sessions_total, s.calls), (0, 1, 2));
        assert_eq!(s.bytes_from_guest, 5);
        assert_eq!(r.dev.session_count(), 0);
    }

    impl Rig {
        /// A `BATCH` request of `session` at slot `i`: `count` frames in `frames`, the first
        /// with sequence number `seq`.
        fn batch(&self, i: u64, session: u32, seq: u64, count: u32, frames: &[u8]) -> Descs {
            let hdr = ReqHeader {
                kind: REQ_BATCH,
                session,
                seq,
                inline_len: frames.len() as u32,
                reply_cap: count,
                reserved: 0,
            };
            // Built as a request without a reply area (`request` adds one for a non-zero
            // reply_cap), then given the batch's header.
            let d = self.request(
                i,
                ReqHeader {
                    reply_cap: 0,
                    ..hdr
                },
                frames,
                &[],
                0,
            );
            let m = self.mem.memory();
            m.write_slice(&hdr.to_bytes(), GuestAddress(Self::slot(i)))
                .unwrap();
            d
        }
    }

    /// `n` asynchronous `OP_ECHO` frames with call ids `first..`, back to back.
    fn echo_frames(first: u64, n: u64) -> Vec<u8> {
        (first..first + n)
            .flat_map(|id| frame(OP_ECHO, FLAG_ASYNC, id, 2, b"hi"))
            .collect()
    }

    #[test]
    fn a_batch_runs_its_frames_in_order_and_returns_its_chain_once() {
        let mut r = rig();
        r.dev.set_batch(true);
        r.open(0, 2);
        let d = r.batch(1, 2, 1, 3, &echo_frames(1, 3));
        r.push(SUBMIT_QUEUE, &d);
        // The synchronous frame after the batch runs after all of its frames.
        let f = frame(OP_ECHO, 0, 4, 0, b"");
        let d = r.request(2, Rig::call_hdr(2, 4, f.len(), 256), &f, &[], 0);
        assert_eq!(r.ctrl_sync(2, &d).status, S_OK);
        r.wait_used(SUBMIT_QUEUE, 1);
        assert_eq!(r.used_idx(SUBMIT_QUEUE), 1, "one chain for three frames");
        assert_eq!(r.resp(1).status, S_OK);
        assert_eq!(r.used(SUBMIT_QUEUE, 0).1, RESP_HEADER_LEN as u32);
        let order: Vec<u64> = r.seen.try_iter().map(|(_, id)| id).collect();
        assert_eq!(order, [1, 2, 3, 4]);
        let st = r.stats.snapshot();
        assert_eq!((st.batches, st.calls, st.refused_requests), (1, 4, 0));
    }

    #[test]
    fn bad_batches_are_refused_and_the_session_goes_on() {
        let mut r = rig();
        r.open(0, 3);
        let mut seq = 1;
        // Without the feature accepted: refused whole (no frame runs, no number spent).
        let d = r.batch(1, 3, seq, 1, &echo_frames(1, 1));
        assert_eq!(r.sync_on(SUBMIT_QUEUE, 1, &d).status, S_BAD_REQUEST);
        r.dev.set_batch(true);
        // Header-level faults: refused whole.
        for (i, count, q) in [
            (2, 0, SUBMIT_QUEUE),
            (3, (MAX_BATCH_FRAMES + 1) as u32, SUBMIT_QUEUE),
            (4, 1, CTRL_QUEUE),
        ] {
            let d = r.batch(i, 3, seq, count, &echo_frames(1, 1));
            assert_eq!(r.sync_on(q, i, &d).status, S_BAD_REQUEST, "case {i}");
        }
        // Frame-level faults: the batch's numbers are refused in place, later frames still run.
        let mut sync_frame = frame(OP_ECHO, 0, 9, 0, b"");
        sync_frame.extend(echo_frames(2, 1));
        let cases: Vec<(u32, Vec<u8>)> = vec![
            (2, echo_frames(1, 1)),                        // one frame short
            (1, [echo_frames(1, 1), vec![0; 3]].concat()), // bytes after the last frame
            (2, sync_frame),                               // a synchronous frame
            (1, {
                let mut f = echo_frames(1, 1);
                f[0] ^= 0xff; // bad magic
                f
            }),
        ];
        for (k, (count, bytes)) in cases.into_iter().enumerate() {
            let i = 10 + k as u64;
            let d = r.batch(i, 3, seq, count, &bytes);
            let status = r.sync_on(SUBMIT_QUEUE, i, &d).status;
            assert_eq!(status, S_BAD_REQUEST, "case {k}");
            seq += u64::from(count);
        }
        assert!(r.seen.try_recv().is_err(), "no frame of a bad batch ran");
        let f = frame(OP_ECHO, 0, 77, 0, b"");
        let d = r.request(20, Rig::call_hdr(3, seq, f.len(), 256), &f, &[], 0);
        assert_eq!(
            r.ctrl_sync(20, &d).status,
            S_OK,
            "the session did not stall"
        );
        assert_eq!(r.seen.try_recv().unwrap().1, 77);
        // A batch of a session that does not exist.
        let d = r.batch(21, 99, 1, 2, &echo_frames(1, 2));
        assert_eq!(r.sync_on(SUBMIT_QUEUE, 21, &d).status, S_NO_SESSION);
    }

    #[test]
    fn reply_data_goes_straight_into_the_guest_buffer() {
        let mut r = rig();
        r.open(0, 1);
        // 3000 bytes into a 4096-byte reply-data area split over two descriptors.
        let f = frame(OP_DTOH, 0, 1, 1, &[3]);
        let mut d = r.request(1, Rig::call_hdr(1, 1, f.len(), 64), &f, &[], 0);
        d.push((Rig::slot(1) + 0xa000, 1000, true));
        d.push((Rig::slot(1) + 0xc000, 3096, true));
        let resp = r.ctrl_sync(1, &d);
        assert_eq!((resp.status, resp.data_len), (S_OK, 3000));
        let first = r.reply_data(1, 1000);
        let mut second = vec![0u8; 2000];
        r.mem
            .memory()
            .read_slice(&mut second, GuestAddress(Rig::slot(1) + 0xc000))
            .unwrap();
        let all: Vec<u8> = first.into_iter().chain(second).collect();
        assert!(all.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        assert_eq!(r.stats.snapshot().bytes_to_guest, 3000);
        // Room for less than the reply needs: the executor's write fails, nothing is written.
        let f = frame(OP_DTOH, 0, 2, 1, &[5]);
        let d = r.request(2, Rig::call_hdr(1, 2, f.len(), 256), &f, &[], 4000);
        let resp = r.ctrl_sync(2, &d);
        assert_eq!((resp.status, resp.data_len), (S_OK, 0));
        let reply = r.reply(2, HEADER_LEN);
        let h = Header::decode(reply[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(h.status, vgpu_proto::cuda::CUDA_ERROR_INVALID_VALUE);
    }

    #[test]
    fn frames_run_in_sequence_order_across_both_queues() {
        let mut r = rig();
        r.open(0, 9);
        // seq 2 (sync) arrives before seq 1 (async).
        let f2 = frame(OP_ECHO, 0, 2, 0, b"");
        let d2 = r.request(2, Rig::call_hdr(9, 2, f2.len(), 64), &f2, &[], 0);
        r.push(CTRL_QUEUE, &d2);
        r.run();
        std::thread::sleep(Duration::from_millis(50));
        assert!(r.seen.try_recv().is_err(), "seq 2 waits for seq 1");
        let f1 = frame(OP_ECHO, FLAG_ASYNC, 1, 0, b"");
        let d1 = r.request(1, Rig::call_hdr(9, 1, f1.len(), 0), &f1, &[], 0);
        r.push(SUBMIT_QUEUE, &d1);
        r.run();
        r.wait_used(CTRL_QUEUE, 2);
        r.wait_used(SUBMIT_QUEUE, 1);
        let order: Vec<u64> = r.seen.try_iter().map(|(_, id)| id).collect();
        assert_eq!(order, vec![1, 2]);
        // A repeated sequence number is refused; the session goes on.
        let f = frame(OP_ECHO, 0, 3, 0, b"");
        let d = r.request(3, Rig::call_hdr(9, 2, f.len(), 64), &f, &[], 0);
        assert_eq!(r.ctrl_sync(3, &d).status, S_BAD_REQUEST);
        let d = r.request(4, Rig::call_hdr(9, 3, f.len(), 64), &f, &[], 0);
        assert_eq!(r.ctrl_sync(4, &d).status, S_OK);
    }

    /// A guest with more chains in flight than the device takes at once (a hostile guest reposting
    /// chains gets there; the limit is lowered here): the device stops taking them at the limit
    /// and leaves the rest in the ring; as chains return it is asked (the rescan event) to look
    /// again, and every request completes, in order.
    #[test]
    fn past_the_in_flight_limit_chains_wait_in_the_ring() {
        use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};
        const LIMIT: usize = 4;
        const CALLS: u64 = 10;
        let mut r = rig_with_gates(1);
        let rescan = EventFd::new(EFD_NONBLOCK).unwrap();
        r.dev.set_rescan_event(rescan.try_clone().unwrap());
        r.dev.shared.in_flight.set_limit(LIMIT);
        r.open(0, 1);
        // The first frame blocks its session until the gate opens; the others queue behind it.
        for seq in 1..=CALLS {
            let op = if seq == 1 { OP_BLOCK } else { OP_ECHO };
            let f = frame(op, FLAG_ASYNC, seq, 0, b"");
            let d = r.request(seq, Rig::call_hdr(1, seq, f.len(), 0), &f, &[], 0);
            r.push(SUBMIT_QUEUE, &d);
        }
        r.run();
        assert_eq!(r.dev.chains_in_flight(), LIMIT);
        assert_eq!(r.used_idx(SUBMIT_QUEUE), 0);
        assert!(r.stats.snapshot().in_flight_throttles >= 1);
        r.gate_tx[0].send(()).unwrap();
        // The test plays the vring worker: a rescan event means look at the rings again.
        let deadline = Instant::now() + WAIT;
        while r.used_idx(SUBMIT_QUEUE) < CALLS as u16 {
            assert!(
                Instant::now() < deadline,
                "{} of {CALLS} returned",
                r.used_idx(SUBMIT_QUEUE)
            );
            if rescan.read().is_ok() {
                r.run();
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let order: Vec<u64> = r.seen.try_iter().map(|(_, id)| id).collect();
        assert_eq!(order, (1..=CALLS).collect::<Vec<_>>());
        let deadline = Instant::now() + WAIT;
        while r.dev.chains_in_flight() != 0 {
            assert!(Instant::now() < deadline, "chains still counted as held");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Every kind of hostile request is refused for its own chain; the device keeps serving.
    #[test]
    fn hostile_requests_are_refused_and_the_device_goes_on() {
        let mut r = rig();
        r.open(0, 1);
        let good = frame(OP_ECHO, 0, 1, 0, b"");
        let hdr = |seq| Rig::call_hdr(1, seq, good.len(), 64);
        let base = |i| Rig::slot(i);
        // Refused calls of an open session still take their place in its sequence (1, 2, …);
        // requests refused before that (no session, no sequence number) do not.
        const NO_SEQ: u64 = 100;
        let mut cases: Vec<(&str, Descs)> = Vec::new();
        let mut plain = |i: u64, name: &'static str, h: ReqHeader, f: &[u8]| {
            let d = r.request(i, h, f, &[], 0);
            cases.push((name, d));
        };
        plain(
            1,
            "session 0",
            ReqHeader {
                session: 0,
                ..hdr(1)
            },
            &good,
        );
        plain(
            2,
            "reserved bits",
            ReqHeader {
                reserved: 1,
                ..hdr(1)
            },
            &good,
        );
        plain(
            3,
            "unknown type",
            ReqHeader {
                kind: 99,
                ..hdr(NO_SEQ)
            },
            &good,
        );
        plain(4, "sequence 0", hdr(0), &good);
        plain(
            5,
            "inline too short",
            ReqHeader {
                inline_len: 10,
                ..hdr(2)
            },
            &good,
        );
        plain(
            6,
            "inline beyond chain",
            ReqHeader {
                inline_len: 4000,
                ..hdr(3)
            },
            &good,
        );
        let mut bad_magic = good.clone();
        bad_magic[0] ^= 0xff;
        plain(7, "bad magic", hdr(4), &bad_magic);
        plain(
            8,
            "payload_len lies",
            hdr(5),
            &frame(OP_ECHO, 0, 1, 100, b""),
        );
        plain(
            9,
            "reply flag",
            hdr(6),
            &frame(OP_ECHO, FLAG_REPLY, 1, 0, b""),
        );
        plain(
            10,
            "async on ctrl",
            hdr(7),
            &frame(OP_ECHO, FLAG_ASYNC, 1, 0, b""),
        );
        plain(
            11,
            "reply area too small",
            ReqHeader {
                reply_cap: 8,
                ..hdr(8)
            },
            &good,
        );
        plain(12, "reply area beyond chain", hdr(9), &good);
        r.mem
            .memory()
            .write_slice(
                &ReqHeader {
                    reply_cap: 60000,
                    ..hdr(9)
                }
                .to_bytes(),
                GuestAddress(Rig::slot(12)),
            )
            .unwrap();
        let hdr = |_| Rig::call_hdr(1, NO_SEQ, good.len(), 64);
        // Chain-level: outside RAM, overlapping, wrapping, misordered, no room for headers.
        let mut d = r.request(13, hdr(1), &good, &[], 0);
        d.insert(1, (MEM_SIZE - 16, 64, false));
        cases.push(("outside RAM", d));
        let mut d = r.request(14, hdr(1), &good, &[], 0);
        d.push((base(14) + 8, 64, true));
        cases.push(("overlapping", d));
        let mut d = r.request(15, hdr(1), &good, &[], 0);
        d.push((u64::MAX - 100, 4096, true));
        cases.push(("wrapping", d));
        let mut d = r.request(16, hdr(1), &good, &[], 0);
        d.push((base(16) + 0x3000, 8, false));
        cases.push(("readable after writable", d));
        cases.push((
            "short request header",
            vec![(base(17), 16, false), (base(17) + 0x8000, 16, true)],
        ));
        for (i, (name, descs)) in cases.iter().enumerate() {
            let slot = (i + 1) as u64;
            let resp_at = descs.iter().find(|x| x.2).map(|x| x.0).unwrap_or(0);
            let m = r.mem.memory();
            m.write_slice(&[0xffu8; RESP_HEADER_LEN], GuestAddress(resp_at))
                .unwrap();
            let n = r.used_idx(CTRL_QUEUE);
            r.push(CTRL_QUEUE, descs);
            r.run();
            r.wait_used(CTRL_QUEUE, n + 1);
            let mut b = [0u8; RESP_HEADER_LEN];
            m.read_slice(&mut b, GuestAddress(resp_at)).unwrap();
            assert_eq!(
                RespHeader::from_bytes(&b).status,
                S_BAD_REQUEST,
                "{name} (slot {slot})"
            );
        }
        assert!(
            r.seen.try_recv().is_err(),
            "no hostile frame reached the session"
        );
        let s = r.stats.snapshot();
        assert_eq!(s.dropped_chains, 5, "{s:?}");
        // The session is intact: its next frame is number 10.
        let d = r.request(40, Rig::call_hdr(1, 10, good.len(), 64), &good, &[], 0);
        assert_eq!(r.ctrl_sync(40, &d).status, S_OK);
        // Open and close only on the control queue; calls of unknown sessions.
        let d = r.open_request(41, 2);
        r.push(SUBMIT_QUEUE, &d);
        r.run();
        r.wait_used(SUBMIT_QUEUE, 1);
        assert_eq!(r.resp(41).status, S_BAD_REQUEST);
        let d = r.request(42, Rig::call_hdr(3, 1, good.len(), 64), &good, &[], 0);
        assert_eq!(r.ctrl_sync(42, &d).status, S_NO_SESSION);
    }

    #[test]
    fn a_reply_too_large_for_the_area_says_how_large() {
        let mut r = rig();
        r.open(0, 1);
        let f = frame(OP_BIG, 0, 1, 0, b"");
        let d = r.request(1, Rig::call_hdr(1, 1, f.len(), 4096), &f, &[], 0);
        let resp = r.ctrl_sync(1, &d);
        assert_eq!((resp.status, resp.reply_len), (S_REPLY_TOO_LARGE, 5024));
    }

    /// An error reply too large for the reply area keeps its code: the message is shortened.
    #[test]
    fn an_error_reply_too_large_for_the_area_is_shortened() {
        let mut r = rig();
        r.open(0, 1);
        let f = frame(OP_BIG_ERROR, 0, 1, 0, b"");
        let d = r.request(1, Rig::call_hdr(1, 1, f.len(), 256), &f, &[], 0);
        let resp = r.ctrl_sync(1, &d);
        assert_eq!((resp.status, resp.reply_len), (S_OK, 256));
        let reply = r.reply(1, 256);
        let h = Header::decode(reply[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(h.status, vgpu_proto::cuda::CUDA_ERROR_ILLEGAL_ADDRESS);
        assert_eq!(HEADER_LEN + h.payload_len as usize, 256);
        let text = String::from_utf8(reply[HEADER_LEN..].to_vec()).unwrap();
        assert!(text.starts_with("kernel fault: "), "{text}");
        assert!(text.ends_with(" […]"), "{text}");
    }

    #[test]
    fn quick_frames_run_on_the_queue_thread_only_when_nothing_is_ahead_of_them() {
        let mut r = rig_with_gates(1);
        r.open(0, 1);
        let calls = |r: &Rig| r.stats.snapshot().calls_on_queue_thread;
        // Nothing ahead: the queue thread answers it (the rig runs the queues on this thread, so
        // the answer is there when `run` returns).
        r.settle(1);
        let f = frame(OP_ECHO, 0, QUICK_CALLS, 3, b"abc");
        let d = r.request(1, Rig::call_hdr(1, 1, f.len(), 64), &f, &[], 0);
        let n = r.used_idx(CTRL_QUEUE);
        r.push(CTRL_QUEUE, &d);
        r.run();
        assert_eq!(r.used_idx(CTRL_QUEUE), n + 1, "answered within run()");
        assert_eq!(r.resp(1).status, S_OK);
        assert_eq!(&r.reply(1, HEADER_LEN + 3)[HEADER_LEN..], b"abc");
        assert_eq!(calls(&r), 1);
        assert_eq!(
            r.dev.take_answered_here(),
            1,
            "the queue thread may poll for the next"
        );
        assert_eq!(r.dev.take_answered_here(), 0);
        // A frame that is not quick goes to the session thread.
        let f = frame(OP_ECHO, 0, 5, 0, b"");
        let d = r.request(2, Rig::call_hdr(1, 2, f.len(), 64), &f, &[], 0);
        assert_eq!(r.ctrl_sync(2, &d).status, S_OK);
        assert_eq!(calls(&r), 1);
        // Bulk bytes are read from and written to guest memory on the queue thread too.
        r.settle(1);
        let f = frame(OP_ECHO, 0, QUICK_CALLS + 1, 2, b"");
        let d = r.request(3, Rig::call_hdr(1, 3, f.len(), 64), &f, b"xy", 0);
        assert_eq!(r.ctrl_sync(3, &d).status, S_OK);
        assert_eq!(&r.reply(3, HEADER_LEN + 2)[HEADER_LEN..], b"xy");
        let f = frame(OP_DTOH, 0, QUICK_CALLS + 5, 1, &[2]);
        let d = r.request(9, Rig::call_hdr(1, 4, f.len(), 64), &f, &[], 2000);
        let resp = r.ctrl_sync(9, &d);
        assert_eq!((resp.status, resp.data_len), (S_OK, 2000));
        let want: Vec<u8> = (0..2000u64).map(|i| (i % 251) as u8).collect();
        assert!(
            r.reply_data(9, 2000) == want,
            "reply data written on the queue thread"
        );
        assert_eq!(calls(&r), 3);
        // A posted frame that blocks holds the session thread: a quick frame behind it waits
        // for it and is answered after it, in order.
        let f = frame(OP_BLOCK, FLAG_ASYNC, 6, 0, b"");
        let d = r.request(4, Rig::call_hdr(1, 5, f.len(), 0), &f, &[], 0);
        r.push(SUBMIT_QUEUE, &d);
        r.run();
        let deadline = Instant::now() + WAIT;
        let mut seen = Vec::new();
        while !seen.contains(&(OP_BLOCK, 6)) {
            assert!(Instant::now() < deadline, "the blocking frame never ran");
            if let Ok(s) = r.seen.recv_timeout(Duration::from_millis(10)) {
                seen.push(s);
            }
        }
        let f = frame(OP_ECHO, 0, QUICK_CALLS + 2, 0, b"");
        let d = r.request(5, Rig::call_hdr(1, 6, f.len(), 64), &f, &[], 0);
        let n = r.push_unanswered(&d, "answered before the frame ahead of it ran");
        r.gate_tx[0].send(()).unwrap();
        r.wait_used(CTRL_QUEUE, n + 1);
        assert_eq!(r.resp(5).status, S_OK);
        assert_eq!(calls(&r), 3, "the session thread ran it");
        // A quick frame that arrives before its turn waits for the frame ahead of it.
        let f = frame(OP_ECHO, 0, QUICK_CALLS + 3, 0, b"");
        let d = r.request(6, Rig::call_hdr(1, 8, f.len(), 64), &f, &[], 0);
        let n = r.push_unanswered(&d, "ran before sequence number 7");
        let f = frame(OP_ECHO, FLAG_ASYNC, 7, 0, b"");
        let d = r.request(7, Rig::call_hdr(1, 7, f.len(), 0), &f, &[], 0);
        r.push(SUBMIT_QUEUE, &d);
        r.run();
        r.wait_used(CTRL_QUEUE, n + 1);
        assert_eq!(r.resp(6).status, S_OK);
        // Every frame ran once, in sequence order.
        let deadline = Instant::now() + WAIT;
        while seen.len() < 8 {
            assert!(Instant::now() < deadline, "frames seen: {seen:?}");
            if let Ok(s) = r.seen.recv_timeout(Duration::from_millis(10)) {
                seen.push(s);
            }
        }
        let ids: Vec<u64> = seen.iter().map(|&(_, id)| id).collect();
        assert_eq!(
            ids,
            [
                QUICK_CALLS,
                5,
                QUICK_CALLS + 1,
                QUICK_CALLS + 5,
                6,
                QUICK_CALLS + 2,
                7,
                QUICK_CALLS + 3
            ]
        );
        // Idle again: the next quick frame runs on the queue thread.
        r.settle(1);
        let f = frame(OP_ECHO, 0, QUICK_CALLS + 4, 0, b"");
        let d = r.request(8, Rig::call_hdr(1, 9, f.len(), 64), &f, &[], 0);
        assert_eq!(r.ctrl_sync(8, &d).status, S_OK);
        assert_eq!(calls(&r), 4);
    }

    #[test]
    fn has_available_sees_chains_not_yet_taken() {
        let mut r = rig();
        let mem = r.mem.memory();
        assert!(!vgpu_vhost_user::has_available(&r.ctrl.0, &mem));
        let d = r.open_request(0, 1);
        r.push(CTRL_QUEUE, &d);
        assert!(vgpu_vhost_user::has_available(&r.ctrl.0, &mem));
        assert!(!vgpu_vhost_user::has_available(&r.submit.0, &mem));
        r.run();
        assert!(!vgpu_vhost_user::has_available(&r.ctrl.0, &mem));
        assert_eq!(r.resp(0).status, S_OK);
    }

    #[test]
    fn a_protocol_violation_on_the_queue_thread_ends_only_that_session() {
        // The queue thread runs a frame only while its session's thread is idle; on a loaded
        // host that thread may still be finishing the open, and then the frame goes to it. So
        // violating sessions are opened until a violation ran on the queue thread; every one
        // must end only its own session, whichever thread ran it.
        const ATTEMPTS: u32 = 5;
        const BYSTANDER: u32 = 100;
        let mut r = rig();
        r.open(0, BYSTANDER);
        let on_queue_thread = |r: &Rig| r.stats.snapshot().calls_on_queue_thread;
        let mut ran_here = false;
        for attempt in 1..=ATTEMPTS {
            assert_eq!(r.open(1, attempt).status, S_OK);
            r.settle(attempt);
            let before = on_queue_thread(&r);
            let f = frame(OP_VIOLATE, 0, QUICK_CALLS, 0, b"");
            let d = r.request(2, Rig::call_hdr(attempt, 1, f.len(), 64), &f, &[], 0);
            assert_eq!(r.ctrl_sync(2, &d).status, S_PROTOCOL);
            ran_here = on_queue_thread(&r) > before;
            let f = frame(OP_ECHO, 0, QUICK_CALLS + 1, 0, b"");
            let d = r.request(3, Rig::call_hdr(attempt, 2, f.len(), 64), &f, &[], 0);
            assert_eq!(r.ctrl_sync(3, &d).status, S_NO_SESSION);
            let seq = u64::from(attempt);
            let d = r.request(4, Rig::call_hdr(BYSTANDER, seq, f.len(), 64), &f, &[], 0);
            assert_eq!(r.ctrl_sync(4, &d).status, S_OK);
            // The session thread ends the session and releases it.
            let deadline = Instant::now() + WAIT;
            while r.stats.snapshot().sessions_open != 1 {
                assert!(Instant::now() < deadline, "the session never ended");
                std::thread::sleep(Duration::from_millis(2));
            }
            assert_eq!(r.dev.session_count(), 1);
            if ran_here {
                break;
            }
        }
        assert!(
            ran_here,
            "no violation ran on the queue thread in {ATTEMPTS} attempts"
        );
        assert_eq!(r.open(5, 1).status, S_OK);
    }

    #[test]
    fn a_protocol_violation_ends_only_that_session() {
        let mut r = rig();
        r.open(0, 1);
        r.open(1, 2);
        let f = frame(OP_VIOLATE, 0, 1, 0, b"");
        let d = r.request(2, Rig::call_hdr(1, 1, f.len(), 64), &f, &[], 0);
        assert_eq!(r.ctrl_sync(2, &d).status, S_PROTOCOL);
        let f = frame(OP_ECHO, 0, 2, 0, b"");
        let d = r.request(3, Rig::call_hdr(1, 2, f.len(), 64), &f, &[], 0);
        assert_eq!(r.ctrl_sync(3, &d).status, S_NO_SESSION);
        let d = r.request(4, Rig::call_hdr(2, 1, f.len(), 64), &f, &[], 0);
        assert_eq!(r.ctrl_sync(4, &d).status, S_OK);
        assert_eq!(r.dev.session_count(), 1);
        // The id can be opened again.
        assert_eq!(r.open(5, 1).status, S_OK);
    }

    /// After a reset, a call that was running does not touch guest memory or the ring, queued
    /// frames never run, and the old sessions are gone.
    #[test]
    fn a_reset_invalidates_running_and_queued_requests() {
        let mut r = rig_with_gates(1);
        r.dev.set_batch(true);
        r.open(0, 1);
        let f = frame(OP_BLOCK, 0, 1, 0, b"");
        let d = r.request(1, Rig::call_hdr(1, 1, f.len(), 64), &f, &[], 8);
        r.mem
            .memory()
            .write_slice(&[0u8; 8], GuestAddress(Rig::slot(1) + 0xa000))
            .unwrap();
        r.push(CTRL_QUEUE, &d);
        // Queued behind the blocked call.
        let f2 = frame(OP_ECHO, FLAG_ASYNC, 2, 0, b"");
        let d2 = r.request(2, Rig::call_hdr(1, 2, f2.len(), 0), &f2, &[], 0);
        r.push(SUBMIT_QUEUE, &d2);
        // And a batch behind both.
        let d3 = r.batch(5, 1, 3, 2, &echo_frames(3, 2));
        r.push(SUBMIT_QUEUE, &d3);
        r.run();
        let deadline = Instant::now() + WAIT;
        while r.seen.try_recv().is_err() {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(2));
        }
        let used_before = (r.used_idx(CTRL_QUEUE), r.used_idx(SUBMIT_QUEUE));
        r.dev.reset("test");
        r.gate_tx[0].send(()).unwrap();
        // The session thread finishes and ends.
        let deadline = Instant::now() + WAIT;
        while r.stats.snapshot().sessions_open != 0 {
            assert!(Instant::now() < deadline, "session did not end");
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(
            (r.used_idx(CTRL_QUEUE), r.used_idx(SUBMIT_QUEUE)),
            used_before
        );
        assert_eq!(r.reply_data(1, 8), vec![0u8; 8], "no write after the reset");
        assert!(r.seen.try_recv().is_err(), "the queued frames never ran");
        assert!(r.stats.snapshot().stale_completions >= 2);
        // Requests of the old session are refused; new sessions work.
        let f = frame(OP_ECHO, 0, 3, 0, b"");
        let d = r.request(3, Rig::call_hdr(1, 5, f.len(), 64), &f, &[], 0);
        assert_eq!(r.ctrl_sync(3, &d).status, S_NO_SESSION);
        assert_eq!(r.open(4, 1).status, S_OK);
        assert_eq!(r.stats.snapshot().device_resets, 1);
    }

    #[test]
    fn the_session_limit_is_enforced() {
        let mut r = rig();
        for i in 0..MAX_SESSIONS as u32 {
            assert_eq!(r.open(0, i + 1).status, S_OK);
        }
        assert_eq!(r.dev.session_count(), MAX_SESSIONS);
        assert_eq!(r.open(1, 9999).status, S_BUSY);
        r.dev.reset("test");
        assert_eq!(r.dev.session_count(), 0);
    }

    /// An avail index far ahead makes virtio-queue refuse the ring: no spinning, no completions.
    #[test]
    fn a_corrupt_avail_index_does_not_spin() {
        let mut r = rig();
        r.dev.set_event_idx(true);
        r.ctrl.0.set_queue_event_idx(true);
        let m = r.mem.memory();
        m.write_obj(QSIZE * 3, r.ctrl.1.avail_addr().unchecked_add(2))
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let ctrl = r.ctrl.0.clone();
        let mut dev = r.dev;
        std::thread::spawn(move || {
            dev.process_queue(CTRL_QUEUE, &ctrl);
            tx.send(()).unwrap();
        });
        rx.recv_timeout(WAIT)
            .expect("queue processing spun on a corrupt ring");
        let used: u16 = m.read_obj(r.ctrl.1.used_addr().unchecked_add(2)).unwrap();
        assert_eq!(used, 0);
        let _ = MAGIC;
    }

    /// Posted frames that run back to back cost the guest one interrupt, sent before the session
    /// thread sleeps or runs a synchronous frame (which may block): never lost, never late.
    #[test]
    fn posted_completions_are_signalled_once_per_burst() {
        let mut r = rig_with_gates(1);
        let calls = r.call_events();
        let signals = |q: usize| calls[q].read().unwrap_or(0);
        r.open(0, 1);
        assert_eq!(signals(CTRL_QUEUE), 1, "the open was signalled");
        // seq 1 blocks the session thread (a synchronous frame); 2..=5 are posted behind it;
        // 6 is synchronous and blocks again.
        let block = |r: &Rig, i: u64, seq: u64| {
            let f = frame(OP_BLOCK, 0, seq, 0, b"");
            r.request(i, Rig::call_hdr(1, seq, f.len(), 64), &f, &[], 8)
        };
        let d = block(&r, 1, 1);
        r.push(CTRL_QUEUE, &d);
        for seq in 2..=5 {
            let f = frame(OP_ECHO, FLAG_ASYNC, seq, 0, b"");
            let d = r.request(seq, Rig::call_hdr(1, seq, f.len(), 0), &f, &[], 0);
            r.push(SUBMIT_QUEUE, &d);
        }
        let d = block(&r, 6, 6);
        r.push(CTRL_QUEUE, &d);
        r.run();
        r.gate_tx[0].send(()).unwrap();
        r.wait_used(SUBMIT_QUEUE, 4);
        // The four posted completions were returned and signalled once, before frame 6 blocked.
        let posted = wait_signalled(
            &calls,
            SUBMIT_QUEUE,
            "the posted frames were never signalled",
        );
        assert_eq!(posted, 1, "one interrupt for the burst");
        assert_eq!(r.used_idx(CTRL_QUEUE), 2, "frame 6 is still running");
        r.gate_tx[0].send(()).unwrap();
        r.wait_used(CTRL_QUEUE, 3);
        // A lone posted frame is signalled when the thread goes idle.
        let f = frame(OP_ECHO, FLAG_ASYNC, 7, 0, b"");
        let d = r.request(7, Rig::call_hdr(1, 7, f.len(), 0), &f, &[], 0);
        r.push(SUBMIT_QUEUE, &d);
        r.run();
        r.wait_used(SUBMIT_QUEUE, 5);
        wait_signalled(
            &calls,
            SUBMIT_QUEUE,
            "the lone posted frame was never signalled",
        );
    }

    /// A guest that queued many posted frames (and may sleep until told of room) is told while
    /// the session thread still has some to run, not only once it runs dry.
    #[test]
    fn a_deep_queue_of_posted_frames_is_signalled_before_it_runs_dry() {
        let mut r = rig_with_gates(1);
        let calls = r.call_events();
        r.open(0, 1);
        let _ = calls[CTRL_QUEUE].read();
        // seq 1 holds the session thread while 2..=12 queue up behind it, all posted: ten
        // echoes, then 11 runs long (the same gate), then an echo.
        let f = frame(OP_BLOCK, 0, 1, 0, b"");
        let d = r.request(1, Rig::call_hdr(1, 1, f.len(), 64), &f, &[], 8);
        r.push(CTRL_QUEUE, &d);
        for seq in 2..=12 {
            let op = if seq == 11 { OP_BLOCK } else { OP_ECHO };
            let f = frame(op, FLAG_ASYNC, seq, 0, b"");
            let d = r.request(seq, Rig::call_hdr(1, seq, f.len(), 0), &f, &[], 0);
            r.push(SUBMIT_QUEUE, &d);
        }
        r.run();
        r.gate_tx[0].send(()).unwrap();
        r.wait_used(SUBMIT_QUEUE, 9);
        wait_signalled(
            &calls,
            SUBMIT_QUEUE,
            "posted completions were held back while the guest may wait for room",
        );
        assert_eq!(r.used_idx(SUBMIT_QUEUE), 9, "frame 11 is still running");
        r.gate_tx[0].send(()).unwrap();
        r.wait_used(SUBMIT_QUEUE, 11);
        wait_signalled(&calls, SUBMIT_QUEUE, "the last ones were never signalled");
    }

    /// Waits until queue `q` was signalled (its call eventfd counts, and is reset by the read);
    /// returns the count, or fails with `never` after [`WAIT`].
    fn wait_signalled(calls: &[vmm_sys_util::eventfd::EventFd], q: usize, never: &str) -> u64 {
        let deadline = Instant::now() + WAIT;
        loop {
            let n = calls[q].read().unwrap_or(0);
            if n > 0 {
                return n;
            }
            assert!(Instant::now() < deadline, "{never}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn used_lengths_count_what_was_written() {
        let mut r = rig();
        r.open(0, 1);
        assert_eq!(r.used(CTRL_QUEUE, 0).1, RESP_HEADER_LEN as u32);
        let f = frame(OP_DTOH, 0, 1, 1, &[2]);
        let d = r.request(1, Rig::call_hdr(1, 1, f.len(), 64), &f, &[], 2000);
        r.ctrl_sync(1, &d);
        assert_eq!(
            r.used(CTRL_QUEUE, 1).1,
            (RESP_HEADER_LEN + HEADER_LEN + 2000) as u32
        );
    }
}
