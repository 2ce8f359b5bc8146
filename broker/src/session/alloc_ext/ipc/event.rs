//! Interprocess events (`cuIpcGetEventHandle`, `cuIpcOpenEventHandle`) between processes
//! of one VM.
//!
//! An export is a random 128-bit token naming one event created with
//! `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`. Each session numbers its own work, so
//! the exporter's event is followed through an [`IpcEvent`], a bounded record shared with the
//! sessions that opened it: the sequence number of the event's latest record and whether it
//! completed, told by the exporter's [`EventClock`] as it records and runs. An importer's
//! `cuStreamWaitEvent` stops its stream at a [`Gate`] that the exporter's record opens when it
//! runs; `cuEventSynchronize` waits on such a gate too, giving up when its client hangs up.
//! When the exporter's event is gone with a record still pending (its process ended, or the
//! record was discarded), every wait ends with `CUDA_ERROR_INVALID_HANDLE`: nothing waits
//! for a record that can no longer run. Exports and openings are handles, counted against the
//! VM's `handles` budget. Recording an opened event is refused (`CUDA_ERROR_NOT_SUPPORTED`).
//!
//! [`EventClock`]: crate::engine::EventClock

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use vgpu_proto::cuda;

use super::super::super::{EVENT_DISABLE_TIMING, EVENT_INTERPROCESS, EventState, Session};
use crate::engine::{ClockListener, EventClock, Gate, GateState, HANGUP_POLL, Job, LaneSpec};
use crate::error::CuError;
use crate::tenant::Tenant;

/// Most waits (stream waits and synchronizations, of every importer) pending on one
/// exported event; more are refused with `CUDA_ERROR_OUT_OF_MEMORY`.
pub const MAX_WAITERS: usize = 16384;

/// The shared state of one exported event.
#[derive(Debug, Default)]
struct Shared {
    /// The exporter's latest record (its sequence number there); 0 = never recorded.
    last: u64,
    /// The latest record ran.
    last_done: bool,
    /// The exporter's event is gone and no record of it is pending.
    ended: bool,
    /// The exporter destroyed the event: no new opening.
    destroyed: bool,
    /// Waits for record `.0` to run.
    waiters: Vec<(u64, Arc<Gate>)>,
}

/// One exported event, shared by its exporter's clock and the sessions that opened it.
pub(in crate::session) struct IpcEvent {
    token: u128,
    /// The exporting session.
    owner: u64,
    tenant: Arc<Tenant>,
    shared: Mutex<Shared>,
}

impl std::fmt::Debug for IpcEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcEvent")
            .field("owner", &self.owner)
            .finish()
    }
}

/// What a wait for an exported event's latest record needs to do.
enum Wait {
    /// Nothing: it ran (or the event was never recorded).
    Done,
    /// Wait at this gate.
    Gate(Arc<Gate>),
}

fn gone() -> CuError {
    CuError::invalid_handle(
        "the process that exported this IPC event ended (or destroyed it) before its record ran",
    )
}

impl IpcEvent {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the latest record ran: `Err` when it never will.
    fn query(&self) -> Result<bool, CuError> {
        let s = self.lock();
        if s.last == 0 || s.last_done {
            Ok(true)
        } else if s.ended {
            Err(gone())
        } else {
            Ok(false)
        }
    }

    /// Registers a wait for the latest record.
    fn wait(&self) -> Result<Wait, CuError> {
        let mut s = self.lock();
        if s.last == 0 || s.last_done {
            return Ok(Wait::Done);
        }
        if s.ended {
            return Err(gone());
        }
        s.waiters
            .retain(|(_, g)| !matches!(g.state(), GateState::Opened | GateState::Abandoned(_)));
        if s.waiters.len() >= MAX_WAITERS {
            return Err(CuError::out_of_memory(format!(
                "more than {MAX_WAITERS} waits are pending on this IPC event"
            )));
        }
        let gate = Arc::new(Gate::default());
        let target = s.last;
        s.waiters.push((target, Arc::clone(&gate)));
        Ok(Wait::Gate(gate))
    }
}

impl ClockListener for IpcEvent {
    fn recorded(&self, seq: u64) {
        let mut s = self.lock();
        s.last = seq;
        s.last_done = false;
    }

    fn completed(&self, seq: u64) {
        let ready: Vec<Arc<Gate>> = {
            let mut s = self.lock();
            if s.last == seq {
                s.last_done = true;
            }
            let (ready, rest) = std::mem::take(&mut s.waiters)
                .into_iter()
                .partition(|(t, _)| *t == seq);
            s.waiters = rest;
            ready.into_iter().map(|(_, g)| g).collect()
        };
        // Outside the lock: opening a gate takes its session's engine lock.
        for g in ready {
            g.open();
        }
    }

    fn ended(&self) {
        let waiters = {
            let mut s = self.lock();
            s.ended = true;
            std::mem::take(&mut s.waiters)
        };
        for (_, g) in waiters {
            g.fail(gone());
        }
    }
}

impl Drop for IpcEvent {
    fn drop(&mut self) {
        forget_token(self.token);
    }
}

/// Exported events of every VM by token (each checked against the VM that opens it).
type Exports = HashMap<u128, Weak<IpcEvent>>;

fn exports() -> MutexGuard<'static, Exports> {
    static E: OnceLock<Mutex<Exports>> = OnceLock::new();
    E.get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn forget_token(token: u128) {
    exports().remove(&token);
}

/// A token no other exported event holds.
fn fresh_token() -> u128 {
    loop {
        let t = super::super::vmm::random_token();
        if t != 0 && !exports().contains_key(&t) {
            return t;
        }
    }
}

/// An event's part in interprocess sharing.
#[derive(Debug)]
pub(in crate::session) struct EventLink {
    ev: Arc<IpcEvent>,
    /// Its handle in the session's budget table.
    handle: u64,
    /// Opened from another process (not exported by this one).
    opened: bool,
}

impl Session {
    /// `cuIpcGetEventHandle`: the token naming `event` for other processes of the VM.
    pub(in crate::session) fn ipc_event_export(
        &mut self,
        ctx: u64,
        event: u64,
    ) -> Result<u128, CuError> {
        self.ctx(ctx)?;
        let ev = self.events.get(event).ok_or_else(|| {
            CuError::invalid_handle(format!("{event:#x} is not an event of this process"))
        })?;
        if let Some(l) = &ev.ipc {
            if l.opened {
                return Err(CuError::invalid_handle(
                    "an event opened with cuIpcOpenEventHandle cannot be exported again",
                ));
            }
            return Ok(l.ev.token);
        }
        if ev.flags & EVENT_INTERPROCESS == 0 || ev.flags & EVENT_DISABLE_TIMING == 0 {
            return Err(CuError::invalid_handle(
                "only events created with CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING can be exported",
            ));
        }
        let clock: Arc<EventClock> = Arc::clone(&ev.clock);
        // Budget first: a refused export leaves no token behind.
        let handle = self.ext.ipc.events.insert(())?;
        let token = fresh_token();
        let shared = Arc::new(IpcEvent {
            token,
            owner: self.info.id,
            tenant: Arc::clone(&self.tenant),
            shared: Mutex::new(Shared::default()),
        });
        {
            // Held while the clock starts telling: a record running now waits for the
            // initial state before it marks itself done.
            let mut s = shared.lock();
            let listener: Arc<dyn ClockListener> = Arc::clone(&shared) as _;
            if !clock.listen(listener) {
                drop(s);
                self.ext.ipc.events.remove(handle);
                return Err(CuError::invalid_handle("this event is exported already"));
            }
            s.last = clock.get().seq;
            s.last_done = self.engine.is_done(s.last);
        }
        exports().insert(token, Arc::downgrade(&shared));
        if let Some(ev) = self.events.get_mut(event) {
            ev.ipc = Some(EventLink {
                ev: shared,
                handle,
                opened: false,
            });
        }
        Ok(token)
    }

    /// `cuIpcOpenEventHandle`: an event of this process following the exported one.
    pub(in crate::session) fn ipc_event_open(
        &mut self,
        ctx: u64,
        token: u128,
    ) -> Result<u64, CuError> {
        self.ctx(ctx)?;
        let found = exports().get(&token).and_then(Weak::upgrade);
        let Some(ev) = found.filter(|e| !e.lock().destroyed) else {
            return Err(CuError::invalid_handle(
                "no event of this VM was exported under this IPC handle (or its exporter destroyed it)",
            ));
        };
        self.check_ipc_opener(&ev.tenant, ev.owner, "events")?;
        let handle = self.ext.ipc.events.insert(())?;
        let made = self.events.insert(EventState {
            ctx,
            flags: EVENT_INTERPROCESS | EVENT_DISABLE_TIMING,
            clock: Arc::new(EventClock::default()),
            ipc: Some(EventLink {
                ev,
                handle,
                opened: true,
            }),
        });
        if made.is_err() {
            self.ext.ipc.events.remove(handle);
        }
        made
    }

    /// An event of this process is gone (destroyed, or its context was): its export takes
    /// no new opening, and its budget handle is returned.
    pub(in crate::session) fn ipc_event_gone(&mut self, link: Option<EventLink>) {
        let Some(l) = link else { return };
        self.ext.ipc.events.remove(l.handle);
        if !l.opened {
            l.ev.lock().destroyed = true;
            forget_token(l.ev.token);
        }
    }

    /// `cuStreamWaitEvent` on an opened event: later work of `lane` waits for the exporter's
    /// latest record.
    pub(in crate::session) fn ipc_event_stream_wait(
        &mut self,
        lane: &LaneSpec,
        ev: &Arc<IpcEvent>,
    ) -> Result<(), CuError> {
        if let Wait::Gate(g) = ev.wait()? {
            self.engine.submit(lane, Job::Gate(g));
        }
        Ok(())
    }

    /// `cuEventQuery` on an opened event.
    pub(in crate::session) fn ipc_event_query(ev: &Arc<IpcEvent>) -> Result<(), CuError> {
        if ev.query()? {
            Ok(())
        } else {
            Err(CuError::not_ready())
        }
    }

    /// `cuEventSynchronize` on an opened event: waits for the exporter's latest record,
    /// giving up when this session's client hangs up.
    pub(in crate::session) fn ipc_event_synchronize(
        &self,
        ev: &Arc<IpcEvent>,
    ) -> Result<(), CuError> {
        let Wait::Gate(g) = ev.wait()? else {
            return Ok(());
        };
        let probe = self.engine.hangup_probe();
        loop {
            if let Some(r) = g.outcome() {
                return r;
            }
            if let GateState::Pending = g.wait_reached(HANGUP_POLL)
                && probe.as_ref().is_some_and(|p| p())
            {
                g.abandon("the client disconnected");
                return Err(CuError::new(
                    cuda::CUDA_ERROR_INVALID_HANDLE,
                    "the client disconnected while it waited for an IPC event",
                ));
            }
        }
    }
}

/// The opened event behind `state`, if it is one.
pub(in crate::session) fn opened(state: &EventState) -> Option<Arc<IpcEvent>> {
    state
        .ipc
        .as_ref()
        .filter(|l| l.opened)
        .map(|l| Arc::clone(&l.ev))
}
