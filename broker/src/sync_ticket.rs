//! Synchronizing calls that wait on a connection of their own.
//!
//! A process's threads share its connection, and a synchronizing call that waited on it for a
//! long kernel would stop every other thread's calls until it returned (in CUDA they go on),
//! and deadlock a program whose other thread releases the wait (a `cuStreamWriteValue32` that
//! a `cuStreamWaitValue32` waits for). So `SyncBegin` waits in place only briefly; when the
//! work is not done by then, it leaves a ticket here under a 128-bit token the shim chose, and
//! the shim's thread waits for it with `SyncWait` on a connection of its own, then ends the call
//! with `SyncFinish` on the process's connection (which reports the work's errors).
//!
//! Tickets are looked up in the VM's registry only: another VM's cannot be named. A ticket holds
//! the point its session's work must reach ([`Until`]), goes once a wait saw it done or gone,
//! and goes with its session.

use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use vgpu_proto::msg::{SYNC_DONE, SYNC_GONE, SYNC_PENDING};

use crate::engine::Until;
use crate::error::CuError;

/// Most synchronizing calls a VM may have waiting on tickets at once; past it, `SyncBegin`
/// waits in place as a plain synchronizing call does.
pub const MAX_SYNC_TICKETS: usize = 4096;
/// Longest a `SyncBegin` waits in place before it leaves a ticket.
pub const SYNC_IN_PLACE_MAX: Duration = Duration::from_millis(10);
/// Longest one `SyncWait` waits before answering "not yet".
pub const SYNC_WAIT_MAX: Duration = Duration::from_secs(1);

struct Ticket {
    /// The session whose work it waits for.
    owner: u64,
    until: Until,
}

/// A VM's pending synchronizing calls, by token.
#[derive(Default)]
pub struct SyncTickets {
    inner: Mutex<HashMap<(u64, u64), Ticket>>,
}

impl std::fmt::Debug for SyncTickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncTickets")
            .field("pending", &self.lock().len())
            .finish()
    }
}

impl SyncTickets {
    fn lock(&self) -> MutexGuard<'_, HashMap<(u64, u64), Ticket>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Leaves a ticket of session `owner` for `until` under the token: `Ok(false)` when the VM
    /// has [`MAX_SYNC_TICKETS`] already (the caller waits in place instead), an error for a
    /// token in use.
    pub fn register(&self, owner: u64, hi: u64, lo: u64, until: Until) -> Result<bool, CuError> {
        let mut map = self.lock();
        if map.len() >= MAX_SYNC_TICKETS {
            return Ok(false);
        }
        match map.entry((hi, lo)) {
            MapEntry::Occupied(_) => Err(CuError::invalid_value(
                "the synchronization token is already in use",
            )),
            MapEntry::Vacant(v) => {
                v.insert(Ticket { owner, until });
                Ok(true)
            }
        }
    }

    /// Waits at most `timeout` (capped at [`SYNC_WAIT_MAX`]) for the ticket's work:
    /// [`SYNC_DONE`], [`SYNC_PENDING`] or [`SYNC_GONE`]; the ticket goes once done or gone. An
    /// unknown token (another VM's, one already waited for, a forged one) is
    /// `CUDA_ERROR_INVALID_HANDLE`.
    pub fn wait(&self, hi: u64, lo: u64, timeout: Duration) -> Result<i32, CuError> {
        let until = match self.lock().get(&(hi, lo)) {
            Some(t) => t.until.clone(),
            None => {
                return Err(CuError::invalid_handle(
                    "no pending synchronization has this token",
                ));
            }
        };
        let state = match until.wait(timeout.min(SYNC_WAIT_MAX)) {
            Ok(true) => SYNC_DONE,
            Ok(false) => return Ok(SYNC_PENDING),
            Err(_) => SYNC_GONE,
        };
        self.lock().remove(&(hi, lo));
        Ok(state)
    }

    /// Forgets session `id`'s tickets (its session ended; a thread still waiting for one hears
    /// [`SYNC_GONE`] from its engine).
    pub fn end_session(&self, id: u64) {
        self.lock().retain(|_, t| t.owner != id);
    }

    /// Tickets pending.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {

    use vgpu_proto::cuda;

    use super::*;
    use crate::device::Device;
    use crate::engine::Engine;
    use crate::testutils::MemDevice;

    fn engine() -> Engine {
        let dev = MemDevice::new(1 << 20, Duration::ZERO);
        Engine::new(dev.open("vm").unwrap())
    }

    #[test]
    fn tickets_are_bounded_and_go_when_waited_for_or_with_their_session() {
        let e = engine();
        let t = SyncTickets::default();
        assert!(t.register(0, 1, 0, e.until_ctx(1)).unwrap());
        assert_eq!(
            t.register(1, 1, 0, e.until_ctx(1)).unwrap_err().code,
            cuda::CUDA_ERROR_INVALID_VALUE,
            "a token in use"
        );
        for i in 1..MAX_SYNC_TICKETS as u64 {
            assert!(t.register(i % 2, 1, i, e.until_ctx(1)).unwrap());
        }
        assert!(
            !t.register(0, 2, 0, e.until_ctx(1)).unwrap(),
            "past the VM's tickets the call waits in place"
        );
        // Nothing is pending on this engine: done at once, and the ticket goes.
        assert_eq!(t.wait(1, 0, Duration::from_secs(1)).unwrap(), SYNC_DONE);
        assert_eq!(t.len(), MAX_SYNC_TICKETS - 1);
        assert_eq!(
            t.wait(1, 0, Duration::ZERO).unwrap_err().code,
            cuda::CUDA_ERROR_INVALID_HANDLE
        );
        t.end_session(1);
        assert_eq!(t.len(), MAX_SYNC_TICKETS / 2 - 1);
        t.end_session(0);
        assert!(t.is_empty());
    }

    #[test]
    fn a_ticket_of_an_ended_session_is_gone() {
        let e = engine();
        let t = SyncTickets::default();
        let until = e.until_ctx(1);
        assert!(t.register(0, 1, 1, until).unwrap());
        drop(e);
        assert_eq!(t.wait(1, 1, Duration::from_secs(1)).unwrap(), SYNC_GONE);
        assert!(t.is_empty());
    }
}
