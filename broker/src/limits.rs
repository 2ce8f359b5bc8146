//! Per-VM budgets for what a guest can make vgpud hold besides device memory:
//! sessions, connections, loaded modules and their image bytes, handles
//! (streams, events and every other kind), bytes of queued asynchronous work,
//! bytes of executable graphs and host memory of interpreter state.
//!
//! Each has a safe default; a config's `[limits]` table changes the default
//! for every VM, and a VM's `[vm.limits]` table overrides it for that VM
//! (docs/admin.md). Past a budget the guest gets the CUDA error a real driver
//! gives for running out of that resource, and no other VM notices; past
//! `queued_bytes` its sessions wait instead (back-pressure), as a driver
//! whose queues are full blocks the caller.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use vgpu_config::limits::{Budget, VmLimits};
use vgpu_proto::cuda;

use crate::error::CuError;

/// Modules loaded by a VM's sessions.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ModuleUse {
    /// Modules loaded.
    pub count: u32,
    /// Bytes of their images.
    pub bytes: u64,
}

/// How long a session waiting for room in its VM's `queued_bytes` sleeps
/// before it looks again (it is woken earlier when queued work of the VM runs).
pub const QUEUE_ROOM_POLL: Duration = Duration::from_millis(100);

struct Held {
    limits: VmLimits,
    /// What the VM's sessions hold, by [`Budget`] (not kept for sessions and
    /// connections, which the tenant and the session hub count).
    used: [u64; Budget::ALL.len()],
}

/// What a VM's sessions hold against [`VmLimits`], and the limits themselves
/// (changed live by the admin API and reloads).
pub struct LimitUse {
    inner: Mutex<Held>,
    /// Signalled when queued bytes are returned (sessions waiting for room).
    room: Condvar,
    /// Refusals so far, by [`Budget`] (for `queued_bytes`: waits for room).
    refused: [AtomicU64; Budget::ALL.len()],
}

impl std::fmt::Debug for LimitUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.lock();
        f.debug_struct("LimitUse")
            .field("limits", &g.limits)
            .field("used", &g.used)
            .finish()
    }
}

impl Default for LimitUse {
    fn default() -> Self {
        Self::new(VmLimits::default())
    }
}

impl LimitUse {
    /// Budgets `limits`, nothing held.
    pub fn new(limits: VmLimits) -> Self {
        LimitUse {
            inner: Mutex::new(Held {
                limits,
                used: [0; Budget::ALL.len()],
            }),
            room: Condvar::new(),
            refused: Default::default(),
        }
    }

    /// Counts a request refused for passing `budget`.
    pub fn note_refused(&self, budget: Budget) {
        self.refused[budget as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests refused so far for passing `budget` (for `queued_bytes`: the
    /// times a session waited for room).
    pub fn refused(&self, budget: Budget) -> u64 {
        self.refused[budget as usize].load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The budgets.
    pub fn limits(&self) -> VmLimits {
        self.lock().limits
    }

    /// Replaces the budgets; what is already held stays (new loads are refused
    /// until use falls below a lowered budget).
    pub fn set_limits(&self, limits: VmLimits) {
        self.lock().limits = limits;
        // A raised `queued_bytes` may let waiting sessions go on.
        self.room.notify_all();
    }

    /// What the VM's sessions hold against `budget` now (0 for sessions and
    /// connections, which are counted elsewhere).
    pub fn used(&self, budget: Budget) -> u64 {
        self.lock().used[budget as usize]
    }

    /// Modules held now.
    pub fn modules(&self) -> ModuleUse {
        let g = self.lock();
        ModuleUse {
            count: u32::try_from(g.used[Budget::Modules as usize]).unwrap_or(u32::MAX),
            bytes: g.used[Budget::ModuleBytes as usize],
        }
    }

    /// Charges `n` of `budget` (a count or bytes), or refuses with
    /// `CUDA_ERROR_OUT_OF_MEMORY` (what a driver out of room for the object
    /// says) when the VM would pass it. The refusal is counted.
    pub fn charge(&self, budget: Budget, n: u64) -> Result<(), CuError> {
        let mut g = self.lock();
        let limit = g.limits.get(budget);
        let held = g.used[budget as usize];
        let total = held.saturating_add(n);
        if total > limit {
            drop(g);
            self.note_refused(budget);
            return Err(CuError::new(
                cuda::CUDA_ERROR_OUT_OF_MEMORY,
                format!(
                    "the VM's processes hold {held} {}; {n} more would pass its limit of {limit} \
                     (limits.{}); release some first",
                    budget.what(),
                    budget.key()
                ),
            ));
        }
        g.used[budget as usize] = total;
        Ok(())
    }

    /// Charges `n` of `budget` without checking its limit (for what exists
    /// already, such as a table's live handles when it starts to be counted).
    pub fn force_charge(&self, budget: Budget, n: u64) {
        let mut g = self.lock();
        let u = &mut g.used[budget as usize];
        *u = u.saturating_add(n);
    }

    /// Returns `n` of `budget` charged by [`charge`](Self::charge).
    pub fn refund(&self, budget: Budget, n: u64) {
        let mut g = self.lock();
        let u = &mut g.used[budget as usize];
        *u = u.saturating_sub(n);
    }

    /// Charges a module of `bytes` image bytes, or says which budget it passes
    /// (`CUDA_ERROR_OUT_OF_MEMORY`, as a driver out of room for a module says).
    pub fn charge_module(&self, vm: &str, bytes: u64) -> Result<(), CuError> {
        let mut g = self.lock();
        let limits = g.limits;
        let count = g.used[Budget::Modules as usize];
        if count >= u64::from(limits.modules) {
            drop(g);
            self.note_refused(Budget::Modules);
            return Err(CuError::new(
                cuda::CUDA_ERROR_OUT_OF_MEMORY,
                format!(
                    "VM `{vm}` already has {count} modules loaded, its limit (limits.modules); unload one first"
                ),
            ));
        }
        let total = g.used[Budget::ModuleBytes as usize].saturating_add(bytes);
        if total > limits.module_bytes {
            drop(g);
            self.note_refused(Budget::ModuleBytes);
            return Err(CuError::new(
                cuda::CUDA_ERROR_OUT_OF_MEMORY,
                format!(
                    "a module of {bytes} bytes would bring VM `{vm}`'s loaded module images to \
                     {total} bytes, past its limit of {} (limits.module_bytes)",
                    limits.module_bytes
                ),
            ));
        }
        g.used[Budget::Modules as usize] = count + 1;
        g.used[Budget::ModuleBytes as usize] = total;
        Ok(())
    }

    /// Returns a module charged by [`charge_module`](Self::charge_module).
    pub fn refund_module(&self, bytes: u64) {
        self.refund(Budget::Modules, 1);
        self.refund(Budget::ModuleBytes, bytes);
    }

    /// Charges `bytes` of queued work if the VM's queued work leaves room for
    /// them, or if it has none queued at all (so that one item always goes
    /// through); `false` when the caller must wait ([`wait_queue_room`](Self::wait_queue_room)).
    pub fn try_queue(&self, bytes: u64) -> bool {
        let mut g = self.lock();
        let held = g.used[Budget::QueuedBytes as usize];
        if held > 0 && held.saturating_add(bytes) > g.limits.queued_bytes {
            return false;
        }
        g.used[Budget::QueuedBytes as usize] = held.saturating_add(bytes);
        true
    }

    /// Returns `bytes` of queued work charged by [`try_queue`](Self::try_queue)
    /// (it ran or was dropped) and wakes the sessions waiting for room.
    pub fn unqueue(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.refund(Budget::QueuedBytes, bytes);
        self.room.notify_all();
    }

    /// Waits until queued work of the VM is returned, or `timeout` passes.
    pub fn wait_queue_room(&self, bytes: u64, timeout: Duration) {
        let g = self.lock();
        let full = |g: &mut Held| {
            let held = g.used[Budget::QueuedBytes as usize];
            held > 0 && held.saturating_add(bytes) > g.limits.queued_bytes
        };
        let _ = self
            .room
            .wait_timeout_while(g, timeout, full)
            .unwrap_or_else(|p| p.into_inner());
    }
}

/// The VM's `interpreter_bytes`, as devices that keep launch state on the host take from it.
/// Each refused take is counted: a launch cut to fewer workers, a launch refused, a call frame
/// refused.
impl crate::device::HostStateBudget for LimitUse {
    fn take(&self, bytes: u64) -> bool {
        self.charge(Budget::InterpreterBytes, bytes).is_ok()
    }

    fn give_back(&self, bytes: u64) {
        self.refund(Budget::InterpreterBytes, bytes);
    }
}

/// A handle table's share of a VM's budget: charged for every live handle,
/// returned when the handle is removed or the table dropped.
#[derive(Debug, Clone)]
pub struct HandleBudget {
    /// The VM's budgets.
    pub use_: Arc<LimitUse>,
    /// The budget the table's handles count against.
    pub budget: Budget,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_are_charged_by_count_and_bytes_and_refunded() {
        let use_ = LimitUse::new(VmLimits {
            modules: 2,
            module_bytes: 100,
            ..VmLimits::default()
        });
        use_.charge_module("vm1", 60).unwrap();
        let e = use_.charge_module("vm1", 41).unwrap_err();
        assert_eq!(e.code, cuda::CUDA_ERROR_OUT_OF_MEMORY);
        assert!(e.message.contains("limits.module_bytes"), "{}", e.message);
        use_.charge_module("vm1", 40).unwrap();
        let e = use_.charge_module("vm1", 0).unwrap_err();
        assert!(e.message.contains("limits.modules"), "{}", e.message);
        use_.refund_module(60);
        assert_eq!(
            use_.modules(),
            ModuleUse {
                count: 1,
                bytes: 40
            }
        );
        use_.charge_module("vm1", 60).unwrap();
        // A lowered budget refuses new loads but keeps what is held.
        use_.set_limits(VmLimits {
            modules: 1,
            ..use_.limits()
        });
        assert!(use_.charge_module("vm1", 1).is_err());
        assert_eq!(use_.modules().count, 2);
    }

    #[test]
    fn counted_budgets_refuse_past_the_limit_count_refusals_and_take_refunds() {
        let use_ = LimitUse::new(VmLimits {
            streams: 2,
            ..VmLimits::default()
        });
        use_.charge(Budget::Streams, 1).unwrap();
        use_.charge(Budget::Streams, 1).unwrap();
        let e = use_.charge(Budget::Streams, 1).unwrap_err();
        assert_eq!(e.code, cuda::CUDA_ERROR_OUT_OF_MEMORY);
        assert!(e.message.contains("limits.streams"), "{}", e.message);
        assert_eq!(use_.refused(Budget::Streams), 1);
        assert_eq!(use_.refused(Budget::Events), 0);
        // Other budgets are independent.
        use_.charge(Budget::Events, 100).unwrap();
        use_.refund(Budget::Streams, 1);
        assert_eq!(use_.used(Budget::Streams), 1);
        use_.charge(Budget::Streams, 1).unwrap();
        // Refunds never go below zero.
        use_.refund(Budget::Streams, 10);
        assert_eq!(use_.used(Budget::Streams), 0);
    }

    #[test]
    fn interpreter_state_is_taken_from_interpreter_bytes_and_refusals_counted() {
        use crate::device::HostStateBudget;
        let use_ = LimitUse::new(VmLimits {
            interpreter_bytes: 100,
            ..VmLimits::default()
        });
        assert!(use_.take(60));
        assert!(!use_.take(41));
        assert!(use_.take(40));
        assert_eq!(use_.used(Budget::InterpreterBytes), 100);
        assert_eq!(use_.refused(Budget::InterpreterBytes), 1);
        use_.give_back(100);
        assert_eq!(use_.used(Budget::InterpreterBytes), 0);
        assert_eq!(use_.refused(Budget::QueuedBytes), 0);
    }

    #[test]
    fn queued_bytes_admit_one_item_when_empty_and_wait_for_room_otherwise() {
        let use_ = Arc::new(LimitUse::new(VmLimits {
            queued_bytes: 100,
            ..VmLimits::default()
        }));
        // Nothing queued: even an item past the budget goes (it cannot wait for anything).
        assert!(use_.try_queue(150));
        assert!(!use_.try_queue(1));
        use_.unqueue(150);
        assert!(use_.try_queue(60));
        assert!(use_.try_queue(40));
        assert!(!use_.try_queue(1));
        assert_eq!(use_.used(Budget::QueuedBytes), 100);
        // A waiter is woken when queued work is returned.
        let u2 = Arc::clone(&use_);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            u2.unqueue(60);
        });
        let start = std::time::Instant::now();
        use_.wait_queue_room(50, Duration::from_secs(10));
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(use_.try_queue(50));
        t.join().unwrap();
        // A raised budget lets waiters on.
        use_.set_limits(VmLimits {
            queued_bytes: 1000,
            ..use_.limits()
        });
        assert!(use_.try_queue(500));
    }
}
