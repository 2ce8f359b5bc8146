//! Host functions (`cuLaunchHostFunc`, `cuStreamAddCallback`) of a VM's
//! processes: the gates their streams stop at, by the token the guest chose.
//!
//! A process's session puts a [`Gate`] in a stream's queue (`StreamHostFunc`)
//! under a 128-bit token. The shim's host-function thread, on a connection
//! (session) of its own, asks when the stream reached it (`HostFuncWait`),
//! runs the function in the guest process, and opens the gate
//! (`HostFuncDone`); the stream then goes on. The thread uses its own
//! connection so that a synchronizing call of the process (which holds the
//! process's connection until its stream is done) never waits for it.
//!
//! Tokens are looked up in the VM's registry only: another VM's gates cannot
//! be named. When the process's session ends its gates are abandoned; when
//! the waiting session ends first, the gates it was waiting for are opened,
//! so the process's streams never stay stopped for a thread that is gone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use vgpu_proto::cuda;

use crate::engine::{Gate, GateState};
use crate::error::CuError;

/// Most host functions a VM may have pending (queued, or reached and not yet
/// done) at once.
pub const MAX_HOST_GATES: usize = 16384;
/// `HostFuncWait` reply: the stream has not reached the function yet.
pub const HOST_FUNC_PENDING: i32 = 0;
/// `HostFuncWait` reply: the stream reached the function; run it, then send
/// `HostFuncDone`.
pub const HOST_FUNC_REACHED: i32 = 1;
/// `HostFuncWait` reply: the function must not run (its session ended or its
/// context failed first).
pub const HOST_FUNC_GONE: i32 = 2;

struct Entry {
    /// The session whose stream holds the gate.
    owner: u64,
    /// The session that waited for it last, if any.
    waiter: Option<u64>,
    gate: Arc<Gate>,
}

/// A VM's pending host functions, by token.
#[derive(Default)]
pub struct HostGates {
    inner: Mutex<HashMap<(u64, u64), Entry>>,
}

impl std::fmt::Debug for HostGates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostGates")
            .field("pending", &self.lock().len())
            .finish()
    }
}

fn unknown() -> CuError {
    CuError::invalid_handle("no pending host function of this VM has that token")
}

impl HostGates {
    fn lock(&self) -> MutexGuard<'_, HashMap<(u64, u64), Entry>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers the gate of session `owner` under a token.
    pub fn register(&self, owner: u64, hi: u64, lo: u64, gate: Arc<Gate>) -> Result<(), CuError> {
        let mut g = self.lock();
        if g.len() >= MAX_HOST_GATES {
            return Err(CuError::new(
                cuda::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
                format!("the VM has {MAX_HOST_GATES} host functions pending; wait for some first"),
            ));
        }
        if g.contains_key(&(hi, lo)) {
            return Err(CuError::invalid_value(
                "a pending host function already has that token",
            ));
        }
        g.insert(
            (hi, lo),
            Entry {
                owner,
                waiter: None,
                gate,
            },
        );
        Ok(())
    }

    /// Waits (at most `timeout`) until the gate's stream reaches it, for
    /// session `waiter`; returns [`HOST_FUNC_PENDING`], [`HOST_FUNC_REACHED`]
    /// or [`HOST_FUNC_GONE`].
    pub fn wait(&self, waiter: u64, hi: u64, lo: u64, timeout: Duration) -> Result<i32, CuError> {
        let gate = {
            let mut g = self.lock();
            let e = g.get_mut(&(hi, lo)).ok_or_else(unknown)?;
            e.waiter = Some(waiter);
            Arc::clone(&e.gate)
        };
        Ok(match gate.wait_reached(timeout) {
            GateState::Pending => HOST_FUNC_PENDING,
            GateState::Reached => HOST_FUNC_REACHED,
            GateState::Opened | GateState::Abandoned(_) => {
                self.lock().remove(&(hi, lo));
                HOST_FUNC_GONE
            }
        })
    }

    /// The host function ran: its stream goes on.
    pub fn open(&self, hi: u64, lo: u64) -> Result<(), CuError> {
        let e = self.lock().remove(&(hi, lo)).ok_or_else(unknown)?;
        e.gate.open();
        Ok(())
    }

    /// Session `id` ended: its own gates are abandoned, and the gates it was
    /// waiting for are opened.
    pub fn end_session(&self, id: u64) {
        let gone: Vec<Entry> = {
            let mut g = self.lock();
            let keys: Vec<(u64, u64)> = g
                .iter()
                .filter(|(_, e)| e.owner == id || e.waiter == Some(id))
                .map(|(k, _)| *k)
                .collect();
            keys.iter().filter_map(|k| g.remove(k)).collect()
        };
        for e in gone {
            if e.owner == id {
                e.gate.abandon("the process's session ended");
            } else {
                e.gate.open();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_and_unknown_ones_are_refused() {
        let h = HostGates::default();
        h.register(1, 7, 8, Arc::new(Gate::default())).unwrap();
        assert!(h.register(1, 7, 8, Arc::new(Gate::default())).is_err());
        assert_eq!(
            h.wait(2, 9, 9, Duration::ZERO).unwrap_err().code,
            cuda::CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(h.wait(2, 7, 8, Duration::ZERO).unwrap(), HOST_FUNC_PENDING);
        assert!(h.open(9, 9).is_err());
    }

    #[test]
    fn ending_a_session_abandons_its_gates_and_opens_awaited_ones() {
        let h = HostGates::default();
        let own = Arc::new(Gate::default());
        let awaited = Arc::new(Gate::default());
        h.register(1, 0, 1, Arc::clone(&own)).unwrap();
        h.register(3, 0, 2, Arc::clone(&awaited)).unwrap();
        h.wait(1, 0, 2, Duration::ZERO).unwrap();
        h.end_session(1);
        assert!(matches!(own.state(), GateState::Abandoned(_)));
        assert_eq!(awaited.state(), GateState::Opened);
        assert!(h.open(0, 1).is_err(), "entries are gone");
    }
}
