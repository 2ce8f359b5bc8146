//! The simulated GPU's execution units, shared by the launches running at
//! once (kernels of different streams): a worker thread of a launch holds a
//! slot while it runs thread blocks, so at most as many blocks run at a time
//! as there are slots, whatever the number of launches. A worker gives its
//! slot up between two blocks when a worker of another launch waits for one,
//! so concurrent launches share the units block by block, as concurrent
//! kernels share a GPU's SMs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How often a worker waiting for a slot checks whether its launch was asked
/// to stop.
pub const SLOT_POLL: Duration = Duration::from_millis(1);

/// A device's execution slots.
#[derive(Debug)]
pub struct WorkerSlots {
    free: Mutex<usize>,
    cv: Condvar,
    waiting: AtomicUsize,
    total: usize,
}

/// A held slot, given back on drop.
#[derive(Debug)]
pub struct Slot<'a> {
    slots: &'a WorkerSlots,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.slots.lock() += 1;
        self.slots.cv.notify_one();
    }
}

impl WorkerSlots {
    /// `n` slots (at least one).
    pub fn new(n: usize) -> Self {
        Self {
            free: Mutex::new(n.max(1)),
            cv: Condvar::new(),
            waiting: AtomicUsize::new(0),
            total: n.max(1),
        }
    }

    /// Number of slots.
    pub fn total(&self) -> usize {
        self.total
    }

    fn lock(&self) -> MutexGuard<'_, usize> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a slot, waiting while none is free; `None` once `give_up` says
    /// the launch should stop (checked every [`SLOT_POLL`]).
    pub fn acquire(&self, give_up: impl Fn() -> bool) -> Option<Slot<'_>> {
        let mut free = self.lock();
        // Queue behind the workers already waiting, so a worker that just
        // gave its slot up does not take it straight back.
        if *free > 0 && self.waiting.load(Ordering::Acquire) == 0 {
            *free -= 1;
            return Some(Slot { slots: self });
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let slot = loop {
            if *free > 0 {
                *free -= 1;
                break Some(Slot { slots: self });
            }
            if give_up() {
                break None;
            }
            free = self
                .cv
                .wait_timeout(free, SLOT_POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        slot
    }

    /// Whether a worker waits for a slot (a holder should give its slot up
    /// between two blocks).
    pub fn contended(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn slots_bound_concurrency_and_waiters_can_give_up() {
        let s = Arc::new(WorkerSlots::new(2));
        let a = s.acquire(|| false).unwrap();
        let b = s.acquire(|| false).unwrap();
        assert!(s.acquire(|| true).is_none(), "no third slot");
        let s2 = Arc::clone(&s);
        let t = std::thread::spawn(move || s2.acquire(|| false).is_some());
        while !s.contended() {
            std::thread::yield_now();
        }
        drop(a);
        assert!(t.join().unwrap());
        drop(b);
        assert!(!s.contended());
        assert_eq!(*s.lock(), 2);
    }
}
