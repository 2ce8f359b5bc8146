//! Interprocess events (`cuIpcGetEventHandle`, `cuIpcOpenEventHandle`) between processes
//! of one VM.
//!
//! An export is a random 128-bit token naming one event created with
//! `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`. In CUDA the opened event *is* the
//! exported one, so any process holding it may record it. Each session numbers its own work,
//! so the event is followed through an [`IpcEvent`], a bounded record shared by the exporter and
//! every opener: the latest record of any of them (whose event recorded it, its sequence number
//! there, whether it ran), told by each event's [`EventClock`] through a [`Tap`] as it records
//! and runs. The latest record is the last one vgpud took, in any process. An event whose own
//! clock holds the latest record waits for it as any event of its session does; otherwise
//! (another process recorded last) a `cuStreamWaitEvent` stops its stream at a [`Gate`] that
//! the recorder's record opens when it runs, and `cuEventSynchronize` waits on such a gate too,
//! giving up when its client hangs up. Graphs replay their event nodes through the same
//! requests, so their record and wait nodes share the event the same way.
//!
//! When a recorder's event is gone with its record still pending (its process ended, so the
//! record was discarded), every wait for that record ends with `CUDA_ERROR_INVALID_HANDLE`, as
//! do queries while it is the latest: the work before the record never ran, so treating it as
//! run would let waiters go on past work that did not happen, and waiting would hang them.
//! Exports and openings are handles, counted against the VM's `handles` budget, and at most
//! [`MAX_WAITERS`] waits are pending on one event.
//!
//! [`EventClock`]: crate::engine::EventClock

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use vgpu_proto::cuda;

use super::super::super::{EVENT_DISABLE_TIMING, EVENT_INTERPROCESS, EventState, Session};
use super::super::tokens::TokenTable;
use crate::engine::{ClockListener, EventClock, Gate, GateState, HANGUP_POLL, Job, LaneSpec};
use crate::error::CuError;
use crate::tenant::Tenant;

/// Most waits (stream waits and synchronizations, of every process) pending on one
/// exported event; more are refused with `CUDA_ERROR_OUT_OF_MEMORY`.
pub const MAX_WAITERS: usize = 16384;

/// Ids of recorders (one per event of a process that shares an exported event).
static NEXT_RECORDER: AtomicU64 = AtomicU64::new(1);

/// A record of the shared event: which process's event recorded it, under which sequence
/// number of that process's engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rec {
    /// The recorder ([`Tap::recorder`]).
    recorder: u64,
    /// The record job's sequence number in the recorder's session.
    seq: u64,
}

/// Where the latest record stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stand {
    Pending,
    Ran,
    /// Its recorder's event went with it pending: it never runs.
    Lost,
}

/// The shared state of one exported event.
#[derive(Debug, Default)]
struct Shared {
    /// The latest record, of whichever process recorded last (in the order vgpud took the
    /// records); `None` = never recorded.
    last: Option<(Rec, Stand)>,
    /// The exporter destroyed the event: no new opening.
    destroyed: bool,
    /// Waits for a record to run.
    waiters: Vec<(Rec, Arc<Gate>)>,
}

/// One exported event, shared by the exporter's event and the events that opened it: any of
/// them records it (through its [`Tap`]), and all of them follow its latest record.
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
        "the process that recorded this IPC event last ended (or destroyed it) before its record ran",
    )
}

impl IpcEvent {
    fn new(token: u128, owner: u64, tenant: Arc<Tenant>) -> Self {
        Self {
            token,
            owner,
            tenant,
            shared: Mutex::new(Shared::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The recorder of the latest record, if any.
    fn last_recorder(&self) -> Option<u64> {
        self.lock().last.map(|(r, _)| r.recorder)
    }

    /// Whether the latest record ran: `Err` when it never will.
    fn query(&self) -> Result<bool, CuError> {
        match self.lock().last {
            None | Some((_, Stand::Ran)) => Ok(true),
            Some((_, Stand::Lost)) => Err(gone()),
            Some((_, Stand::Pending)) => Ok(false),
        }
    }

    /// Registers a wait for the latest record (the one current now, as CUDA's waits capture).
    fn wait(&self) -> Result<Wait, CuError> {
        let mut s = self.lock();
        let rec = match s.last {
            None | Some((_, Stand::Ran)) => return Ok(Wait::Done),
            Some((_, Stand::Lost)) => return Err(gone()),
            Some((r, Stand::Pending)) => r,
        };
        s.waiters
            .retain(|(_, g)| !matches!(g.state(), GateState::Opened | GateState::Abandoned(_)));
        if s.waiters.len() >= MAX_WAITERS {
            return Err(CuError::out_of_memory(format!(
                "more than {MAX_WAITERS} waits are pending on this IPC event"
            )));
        }
        let gate = Arc::new(Gate::default());
        s.waiters.push((rec, Arc::clone(&gate)));
        Ok(Wait::Gate(gate))
    }

    /// Drops the wait at `gate` (its waiter gave up).
    fn forget_waiter(&self, gate: &Arc<Gate>) {
        self.lock().waiters.retain(|(_, g)| !Arc::ptr_eq(g, gate));
    }

    /// `recorder` submitted record `seq`: the event's latest record now.
    fn recorded(&self, recorder: u64, seq: u64) {
        self.lock().last = Some((Rec { recorder, seq }, Stand::Pending));
    }

    /// `recorder`'s record `seq` ran: the waits for it go on.
    fn completed(&self, recorder: u64, seq: u64) {
        let rec = Rec { recorder, seq };
        let ready: Vec<Arc<Gate>> = {
            let mut s = self.lock();
            if let Some((r, st)) = &mut s.last
                && *r == rec
            {
                *st = Stand::Ran;
            }
            let (ready, rest) = std::mem::take(&mut s.waiters)
                .into_iter()
                .partition(|(r, _)| *r == rec);
            s.waiters = rest;
            ready.into_iter().map(|(_, g)| g).collect()
        };
        // Outside the lock: opening a gate takes its session's engine lock.
        for g in ready {
            g.open();
        }
    }

    /// `recorder`'s event is gone and none of its records is pending: those that did not run
    /// never will, and their waits end with an error.
    fn ended(&self, recorder: u64) {
        let lost = {
            let mut s = self.lock();
            if let Some((r, st)) = &mut s.last
                && r.recorder == recorder
                && *st == Stand::Pending
            {
                *st = Stand::Lost;
            }
            let (lost, rest) = std::mem::take(&mut s.waiters)
                .into_iter()
                .partition(|(r, _)| r.recorder == recorder);
            s.waiters = rest;
            lost
        };
        for (_, g) in lost {
            g.fail(gone());
        }
    }
}

/// One process's event sharing an exported event: told by that event's [`EventClock`] of its
/// records, which it makes the shared event's.
#[derive(Debug)]
struct Tap {
    ev: Arc<IpcEvent>,
    recorder: u64,
}

impl ClockListener for Tap {
    fn recorded(&self, seq: u64) {
        self.ev.recorded(self.recorder, seq);
    }

    fn completed(&self, seq: u64) {
        self.ev.completed(self.recorder, seq);
    }

    fn ended(&self) {
        self.ev.ended(self.recorder);
    }
}

impl Drop for IpcEvent {
    fn drop(&mut self) {
        EXPORTS.forget(self.token);
    }
}

/// Exported events of every VM by token (each checked against the VM that opens it).
static EXPORTS: TokenTable<Weak<IpcEvent>> = TokenTable::new();

/// An event's part in interprocess sharing.
#[derive(Debug)]
pub(in crate::session) struct EventLink {
    ev: Arc<IpcEvent>,
    /// Its handle in the session's budget table.
    handle: u64,
    /// Its recorder id: its records are the shared event's under this id.
    recorder: u64,
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
        let token = EXPORTS.fresh();
        let shared = Arc::new(IpcEvent::new(token, self.info.id, Arc::clone(&self.tenant)));
        let recorder = NEXT_RECORDER.fetch_add(1, Ordering::Relaxed);
        {
            // Held while the clock starts telling: a record running now waits for the
            // initial state before it marks itself done.
            let mut s = shared.lock();
            let tap: Arc<dyn ClockListener> = Arc::new(Tap {
                ev: Arc::clone(&shared),
                recorder,
            });
            if !clock.listen(tap) {
                drop(s);
                self.ext.ipc.events.remove(handle);
                return Err(CuError::invalid_handle("this event is exported already"));
            }
            let seq = clock.get().seq;
            if seq != 0 {
                let stand = if self.engine.is_done(seq) {
                    Stand::Ran
                } else {
                    Stand::Pending
                };
                s.last = Some((Rec { recorder, seq }, stand));
            }
        }
        EXPORTS.lock().insert(token, Arc::downgrade(&shared));
        if let Some(ev) = self.events.get_mut(event) {
            ev.ipc = Some(EventLink {
                ev: shared,
                handle,
                recorder,
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
        let found = EXPORTS.lock().get(&token).and_then(Weak::upgrade);
        let Some(ev) = found.filter(|e| !e.lock().destroyed) else {
            return Err(CuError::invalid_handle(
                "no event of this VM was exported under this IPC handle (or its exporter destroyed it)",
            ));
        };
        self.check_ipc_opener(&ev.tenant, ev.owner, "events")?;
        let handle = self.ext.ipc.events.insert(())?;
        let recorder = NEXT_RECORDER.fetch_add(1, Ordering::Relaxed);
        let clock = Arc::new(EventClock::default());
        // A new clock: nobody listens to it yet.
        let _ = clock.listen(Arc::new(Tap {
            ev: Arc::clone(&ev),
            recorder,
        }));
        let made = self.events.insert(EventState {
            ctx,
            flags: EVENT_INTERPROCESS | EVENT_DISABLE_TIMING,
            clock,
            ipc: Some(EventLink {
                ev,
                handle,
                recorder,
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
            EXPORTS.forget(l.ev.token);
        }
    }

    /// `cuStreamWaitEvent` on an event another process recorded last: later work of `lane`
    /// waits for that record.
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

    /// `cuEventQuery` on an event another process recorded last.
    pub(in crate::session) fn ipc_event_query(ev: &Arc<IpcEvent>) -> Result<(), CuError> {
        if ev.query()? {
            Ok(())
        } else {
            Err(CuError::not_ready())
        }
    }

    /// `cuEventSynchronize` on an event another process recorded last: waits for that
    /// record, giving up when this session's client hangs up.
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
                ev.forget_waiter(&g);
                return Err(CuError::new(
                    cuda::CUDA_ERROR_INVALID_HANDLE,
                    "the client disconnected while it waited for an IPC event",
                ));
            }
        }
    }
}

/// The shared event `state` follows when another process (or another handle) recorded it last:
/// then its waits, queries and synchronizations follow that record; `None` when its own clock
/// holds its latest record (or it is not shared).
pub(in crate::session) fn recorded_elsewhere(state: &EventState) -> Option<Arc<IpcEvent>> {
    let l = state.ipc.as_ref()?;
    let by = l.ev.last_recorder()?;
    (by != l.recorder).then(|| Arc::clone(&l.ev))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutils::{MemDevice, vm};

    /// An exported event of a VM of a broker on the in-memory device.
    fn shared_event() -> IpcEvent {
        let dev: Arc<dyn crate::device::Device> =
            Arc::new(MemDevice::new(1 << 30, std::time::Duration::ZERO));
        let b = crate::Broker::new(vec![("gpu0".into(), dev)]);
        b.add_tenant(&vm("vm1", 64 << 20)).unwrap();
        IpcEvent::new(1, 1, b.tenant("vm1").unwrap())
    }

    fn gate(w: Result<Wait, CuError>) -> Arc<Gate> {
        match w {
            Ok(Wait::Gate(g)) => g,
            Ok(Wait::Done) => panic!("the wait had nothing to wait for"),
            Err(e) => panic!("the wait was refused: {e}"),
        }
    }

    #[test]
    fn ipc_waiters_are_capped_and_pruned() {
        let ev = shared_event();
        // Recorder 7's record 3 is pending.
        ev.recorded(7, 3);
        let gates: Vec<Arc<Gate>> = (0..MAX_WAITERS).map(|_| gate(ev.wait())).collect();
        let e = ev.wait().err().expect("the 16385th wait is refused");
        assert_eq!(e.code, cuda::CUDA_ERROR_OUT_OF_MEMORY, "{e}");
        // A waiter that gave up (its client left) makes room.
        gates[5].abandon("the client disconnected");
        let extra = gate(ev.wait());
        assert!(ev.wait().is_err(), "full again");
        // One that dropped its wait on its own is gone too.
        ev.forget_waiter(&extra);
        let extra = gate(ev.wait());
        // The record runs: every wait for it opens and the list empties.
        ev.completed(7, 3);
        assert!(gates[0].outcome().is_some_and(|r| r.is_ok()));
        assert!(extra.outcome().is_some_and(|r| r.is_ok()));
        assert!(ev.lock().waiters.is_empty());
        assert!(matches!(ev.wait(), Ok(Wait::Done)));
    }

    #[test]
    fn waits_capture_the_latest_record_of_any_recorder() {
        let ev = shared_event();
        assert!(matches!(ev.wait(), Ok(Wait::Done)), "never recorded");
        ev.recorded(1, 10);
        let first = gate(ev.wait());
        // Another process records later: new waits follow its record.
        ev.recorded(2, 4);
        assert_eq!(ev.last_recorder(), Some(2));
        let second = gate(ev.wait());
        ev.completed(2, 4);
        assert!(second.outcome().is_some());
        assert!(
            first.outcome().is_none(),
            "it waits for the record it captured"
        );
        assert_eq!(ev.query().ok(), Some(true));
        // Recorder 1 ends with record 10 pending: its waiter fails, the latest stands.
        ev.ended(1);
        let failed = first.outcome().expect("the wait ended");
        assert_eq!(failed.unwrap_err().code, cuda::CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(ev.query().ok(), Some(true));
        // Recorder 2 records and ends with it pending: the latest is lost for everyone.
        ev.recorded(2, 9);
        ev.ended(2);
        assert_eq!(
            ev.query().unwrap_err().code,
            cuda::CUDA_ERROR_INVALID_HANDLE
        );
        assert!(ev.wait().is_err());
    }
}
