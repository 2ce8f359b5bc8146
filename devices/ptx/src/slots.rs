//! The simulated GPU's execution units, shared by the launches running at
//! once (kernels of different streams): a worker thread of a launch holds a
//! slot while it runs thread blocks, so at most as many blocks run at a time
//! as there are slots, whatever the number of launches. A worker gives its
//! slot up between two blocks when a worker of another launch waits for one,
//! so concurrent launches share the units block by block, as concurrent
//! kernels share a GPU's SMs.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How often a worker waiting for a slot checks whether its launch was asked
/// to stop.
pub const SLOT_POLL: Duration = Duration::from_millis(1);

/// `first_waiting` when nobody waits.
const NO_WAITER: i32 = i32::MAX;

/// A device's execution slots.
///
/// Waiting workers are served by priority (CUDA's stream priorities: lower numbers first), then
/// in the order they came; a holder gives its slot up between two blocks only to a waiter of the
/// same or a higher priority, so a higher-priority kernel overtakes a running lower-priority
/// one block by block (as a GPU's block scheduler prefers high-priority streams' blocks), and
/// kernels of one priority share the units as before.
#[derive(Debug)]
pub struct WorkerSlots {
    state: Mutex<State>,
    cv: Condvar,
    total: usize,
    /// The priority of the first waiter (`i32::MAX`: none), kept with `state.waiting` so that a
    /// holder asks between two blocks without taking the lock.
    first_waiting: AtomicI32,
}

#[derive(Debug)]
struct State {
    free: usize,
    /// Waiting workers: (priority, ticket); the first one takes the next free slot.
    waiting: BTreeSet<(i32, u64)>,
    next_ticket: u64,
}

/// A held slot, given back on drop.
#[derive(Debug)]
pub struct Slot<'a> {
    slots: &'a WorkerSlots,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.slots.lock().free += 1;
        // Every waiter checks whether it is first: only one of them is.
        self.slots.cv.notify_all();
    }
}

impl WorkerSlots {
    /// `n` slots (at least one).
    pub fn new(n: usize) -> Self {
        Self {
            state: Mutex::new(State {
                free: n.max(1),
                waiting: BTreeSet::new(),
                next_ticket: 0,
            }),
            cv: Condvar::new(),
            total: n.max(1),
            first_waiting: AtomicI32::new(NO_WAITER),
        }
    }

    /// Number of slots.
    pub fn total(&self) -> usize {
        self.total
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a slot for a worker of a launch at `priority`, waiting while none is free or a
    /// worker of the same or a higher priority waits before it; `None` once `give_up` says the
    /// launch should stop (checked every [`SLOT_POLL`]).
    pub fn acquire(&self, priority: i32, give_up: impl Fn() -> bool) -> Option<Slot<'_>> {
        let mut st = self.lock();
        // Queue behind the workers already waiting, so a worker that just
        // gave its slot up does not take it straight back.
        if st.free > 0 && st.waiting.is_empty() {
            st.free -= 1;
            return Some(Slot { slots: self });
        }
        let me = (priority, st.next_ticket);
        st.next_ticket += 1;
        st.waiting.insert(me);
        self.note_first(&st);
        let slot = loop {
            if st.free > 0 && st.waiting.first() == Some(&me) {
                st.free -= 1;
                break Some(Slot { slots: self });
            }
            if give_up() {
                break None;
            }
            st = self
                .cv
                .wait_timeout(st, SLOT_POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        st.waiting.remove(&me);
        self.note_first(&st);
        drop(st);
        // The next waiter may be first now (a slot may still be free).
        self.cv.notify_all();
        slot
    }

    /// Whether a worker of the same or a higher priority than `priority` waits for a slot (a
    /// holder at `priority` should give its slot up between two blocks).
    pub fn contended(&self, priority: i32) -> bool {
        self.first_waiting.load(Ordering::Acquire) <= priority
    }

    /// Keeps `first_waiting` true to `st.waiting` (called with the lock held).
    fn note_first(&self, st: &State) {
        let first = st.waiting.first().map_or(NO_WAITER, |&(p, _)| p);
        self.first_waiting.store(first, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn slots_bound_concurrency_and_waiters_can_give_up() {
        let s = Arc::new(WorkerSlots::new(2));
        let a = s.acquire(0, || false).unwrap();
        let b = s.acquire(0, || false).unwrap();
        assert!(s.acquire(0, || true).is_none(), "no third slot");
        let s2 = Arc::clone(&s);
        let t = std::thread::spawn(move || s2.acquire(0, || false).is_some());
        while !s.contended(0) {
            std::thread::yield_now();
        }
        drop(a);
        assert!(t.join().unwrap());
        drop(b);
        assert!(!s.contended(0));
        assert_eq!(s.lock().free, 2);
    }

    /// Waiters are served by priority, then in order; a holder yields only to a waiter of its
    /// own or a higher priority.
    #[test]
    fn a_freed_slot_goes_to_the_highest_priority_waiter_first() {
        let s = Arc::new(WorkerSlots::new(1));
        let held = s.acquire(0, || false).unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        // Low priority first, then high, then low again.
        for (i, priority) in [(0, 0), (1, -5), (2, 0)] {
            let (s2, o) = (Arc::clone(&s), Arc::clone(&order));
            threads.push(std::thread::spawn(move || {
                let slot = s2.acquire(priority, || false).unwrap();
                o.lock().unwrap().push(i);
                drop(slot);
            }));
            while s.lock().waiting.len() < i + 1 {
                std::thread::yield_now();
            }
        }
        assert!(
            s.contended(0),
            "a waiter of the holder's priority or higher"
        );
        assert!(s.contended(-5), "the high-priority waiter");
        assert!(!s.contended(-6), "nobody above -5 waits");
        drop(held);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [1, 0, 2]);
        assert_eq!(s.lock().free, 1);
        assert!(s.lock().waiting.is_empty());
    }

    #[test]
    fn a_high_priority_holder_does_not_yield_to_a_lower_one() {
        let s = Arc::new(WorkerSlots::new(1));
        let held = s.acquire(-5, || false).unwrap();
        let s2 = Arc::clone(&s);
        let t = std::thread::spawn(move || s2.acquire(0, || false).is_some());
        while s.lock().waiting.is_empty() {
            std::thread::yield_now();
        }
        assert!(
            !s.contended(-5),
            "a lower-priority waiter does not take the slot"
        );
        assert!(s.contended(0));
        drop(held);
        assert!(t.join().unwrap());
    }
}
