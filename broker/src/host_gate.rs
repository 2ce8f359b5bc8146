//! Host functions (`cuLaunchHostFunc`, `cuStreamAddCallback`) of a VM's
//! processes: the gates their streams stop at, by the token the guest chose.
//!
//! A process's session puts a [`Gate`] in a stream's queue (`StreamHostFunc`)
//! under a 128-bit token. The shim's host-function thread, on a connection
//! (session) of its own, asks when the stream reached it (`HostFuncWait`),
//! runs the function in the guest process, and opens the gate
//! (`HostFuncDone`); the stream then goes on. The thread uses its own
//! connection so that it never waits behind another thread's call on the
//! process's connection.
//!
//! Tokens are looked up in the VM's registry only: another VM's gates cannot
//! be named. When the process's session ends its gates are abandoned; when
//! the waiting session ends first, the gates it was waiting for are opened,
//! so the process's streams never stay stopped for a thread that is gone.
//!
//! A graph's host copy (`StreamHostCopy`) is a gate too, with the device range
//! of the copy, checked against the process's allocations when it was queued.
//! When the stream reaches a copy to the guest, `HostFuncWaitRead` answers
//! with the device bytes read then (every earlier operation of the stream is
//! done, and the stream waits at the gate); a copy to the device is opened by
//! `HostFuncDoneWrite`, which writes the guest's bytes, read by the shim at
//! that moment, before the stream goes on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use vgpu_proto::cuda;

use crate::device::DeviceContext;
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
    /// For a graph's host copy: what it copies.
    copy: Option<HostCopy>,
}

/// The device side of a graph's host copy.
#[derive(Clone)]
pub struct HostCopy {
    /// The device of the process whose stream holds the gate.
    pub dev: Arc<dyn DeviceContext>,
    /// Device address (inside an allocation of that process when queued).
    pub addr: u64,
    /// Bytes (at most one bulk chunk).
    pub len: usize,
    /// Guest to device (`true`) or device to guest.
    pub to_device: bool,
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
        self.register_copy(owner, hi, lo, gate, None)
    }

    /// Registers the gate of session `owner` under a token, for a graph's
    /// host copy (`copy`) or a host function (`None`).
    pub fn register_copy(
        &self,
        owner: u64,
        hi: u64,
        lo: u64,
        gate: Arc<Gate>,
        copy: Option<HostCopy>,
    ) -> Result<(), CuError> {
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
                copy,
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

    /// [`HostGates::wait`] for a host copy: once the stream reached a copy to
    /// the guest, its device bytes are appended to `out` (read now: the
    /// stream's earlier work is done and the stream waits at the gate). A
    /// failed read opens the gate with the error, which the stream's context
    /// then reports.
    pub fn wait_read(
        &self,
        waiter: u64,
        hi: u64,
        lo: u64,
        timeout: Duration,
        out: &mut Vec<u8>,
    ) -> Result<i32, CuError> {
        let state = self.wait(waiter, hi, lo, timeout)?;
        if state != HOST_FUNC_REACHED {
            return Ok(state);
        }
        // The read happens under the registry's lock: the owner's session ends (and frees its
        // memory) only after `end_session` took that lock, so the bytes are read from memory
        // the process still holds, never from an address another VM may have been given since.
        let mut g = self.lock();
        let Some(copy) = g
            .get(&(hi, lo))
            .and_then(|e| e.copy.clone())
            .filter(|c| !c.to_device)
        else {
            return Ok(state);
        };
        let start = out.len();
        out.resize(start + copy.len, 0);
        if let Err(e) = copy.dev.read(copy.addr, &mut out[start..]) {
            out.truncate(start);
            let e = CuError::from(e);
            let entry = g.remove(&(hi, lo));
            drop(g);
            if let Some(entry) = entry {
                entry.gate.fail(e.clone());
            }
            return Err(e);
        }
        Ok(state)
    }

    /// A reached host copy to the device: writes `data` (exactly the copy's
    /// length) to its destination, then the stream goes on. A failed write
    /// opens the gate with the error.
    pub fn open_write(&self, hi: u64, lo: u64, data: &[u8]) -> Result<(), CuError> {
        let mut g = self.lock();
        let e = g.get(&(hi, lo)).ok_or_else(unknown)?;
        let copy = match &e.copy {
            Some(c) if c.to_device => c.clone(),
            _ => {
                return Err(CuError::invalid_value(
                    "that token does not name a pending copy to the device",
                ));
            }
        };
        if data.len() != copy.len {
            return Err(CuError::invalid_value(format!(
                "the host copy takes {} bytes, got {}",
                copy.len,
                data.len()
            )));
        }
        if e.gate.state() != GateState::Reached {
            return Err(CuError::invalid_value(
                "the stream has not reached that host copy yet",
            ));
        }
        let e = g.remove(&(hi, lo)).ok_or_else(unknown)?;
        // Written under the registry's lock, for the reason `wait_read` gives: the owner's
        // memory is freed only after its session's `end_session` took this lock.
        let written = copy.dev.write(copy.addr, data);
        drop(g);
        match written {
            Ok(()) => {
                e.gate.open();
                Ok(())
            }
            Err(err) => {
                let err = CuError::from(err);
                e.gate.fail(err.clone());
                Err(err)
            }
        }
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
    fn host_copies_move_bytes_only_at_their_gate_and_check_what_the_guest_sends() {
        use crate::device::Device;
        use crate::engine::{Engine, Job, LaneKey, LaneKind, LaneSpec};
        use crate::testutils::MemDevice;

        let dev = MemDevice::new(1 << 20, Duration::ZERO).open("t").unwrap();
        let p = dev.alloc(64).unwrap();
        dev.write(p, &[7; 8]).unwrap();
        let mut engine = Engine::new(Arc::clone(&dev));
        let lane = LaneSpec {
            key: LaneKey::Stream(0x10),
            ctx: 1,
            kind: LaneKind::NonBlocking,
            priority: 0,
        };
        let h = HostGates::default();
        let copy = |addr, to_device| HostCopy {
            dev: Arc::clone(&dev),
            addr,
            len: 8,
            to_device,
        };
        // Stream: [write 8 bytes at p] -> [read them back] -> [a host function].
        let (write, read, func) = (
            Arc::new(Gate::default()),
            Arc::new(Gate::default()),
            Arc::new(Gate::default()),
        );
        h.register_copy(1, 0, 1, Arc::clone(&write), Some(copy(p, true)))
            .unwrap();
        h.register_copy(1, 0, 2, Arc::clone(&read), Some(copy(p, false)))
            .unwrap();
        h.register(1, 0, 3, Arc::clone(&func)).unwrap();
        engine.submit(&lane, Job::Gate(Arc::clone(&write)));
        engine.submit(&lane, Job::Gate(Arc::clone(&read)));
        engine.submit(&lane, Job::Gate(Arc::clone(&func)));

        let mut out = Vec::new();
        // The read gate is not reached while the write holds the stream: no bytes.
        assert_eq!(
            h.wait_read(2, 0, 2, Duration::ZERO, &mut out).unwrap(),
            HOST_FUNC_PENDING
        );
        assert!(out.is_empty());
        assert!(
            h.open_write(0, 2, &[1; 8]).is_err(),
            "not a copy to the device"
        );
        assert!(h.open_write(0, 3, &[1; 8]).is_err(), "a host function");
        assert!(h.open_write(9, 9, &[1; 8]).is_err(), "unknown token");
        let long = Duration::from_secs(10);
        assert_eq!(h.wait(2, 0, 1, long).unwrap(), HOST_FUNC_REACHED);
        assert!(h.open_write(0, 1, &[1; 9]).is_err(), "wrong length");
        h.open_write(0, 1, &[5; 8]).unwrap();
        assert_eq!(write.state(), GateState::Opened);
        assert_eq!(
            h.wait_read(2, 0, 2, long, &mut out).unwrap(),
            HOST_FUNC_REACHED
        );
        assert_eq!(out, vec![5; 8], "the read sees the write before it");
        h.open(0, 2).unwrap();
        assert_eq!(h.wait(2, 0, 3, long).unwrap(), HOST_FUNC_REACHED);
        h.open(0, 3).unwrap();
        assert!(h.open_write(0, 1, &[5; 8]).is_err(), "a gate opens once");
    }

    #[test]
    fn a_failed_host_copy_opens_its_gate_with_the_error() {
        use crate::device::Device;
        use crate::engine::{Engine, Job, LaneKey, LaneKind, LaneSpec};
        use crate::testutils::MemDevice;

        let dev = MemDevice::new(1 << 20, Duration::ZERO).open("t").unwrap();
        let mut engine = Engine::new(Arc::clone(&dev));
        let lane = LaneSpec {
            key: LaneKey::Stream(0x10),
            ctx: 1,
            kind: LaneKind::NonBlocking,
            priority: 0,
        };
        let h = HostGates::default();
        let gate = Arc::new(Gate::default());
        // An address the device does not have (freed after the check, say).
        let copy = HostCopy {
            dev: Arc::clone(&dev),
            addr: 0xdead_0000,
            len: 8,
            to_device: false,
        };
        h.register_copy(1, 0, 1, Arc::clone(&gate), Some(copy))
            .unwrap();
        engine.submit(&lane, Job::Gate(Arc::clone(&gate)));
        let mut out = Vec::new();
        assert!(
            h.wait_read(2, 0, 1, Duration::from_secs(10), &mut out)
                .is_err()
        );
        assert!(out.is_empty());
        assert!(matches!(gate.outcome(), Some(Err(_))));
        assert!(h.open(0, 1).is_err(), "the entry is gone");
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
