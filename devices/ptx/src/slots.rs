//! The simulated GPU's execution units, shared by the launches running at
//! once (kernels of different streams): a worker thread of a launch holds a
//! slot while it runs thread blocks, so at most as many blocks run at a time
//! as there are slots, whatever the number of launches. A worker gives its
//! slot up between two blocks when a worker of another launch waits for one
//! (of a higher priority: at once; of the same priority: once it has held the
//! slot for [`SLOT_TURN`]), so concurrent launches share the units in turns, as
//! concurrent kernels share a GPU's SMs.
//!
//! A slot given back goes straight to the first waiter, and only that waiter's
//! thread is woken: with dozens of launches waiting, a hand-off costs one
//! wake-up, not one per waiter. A waiter's launch wakes its own waiters when they
//! should stop waiting (a yield, a cancellation, its last block claimed, a fault)
//! with [`WorkerSlots::wake`]; they also look every [`SLOT_POLL`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How often a worker waiting for a slot checks whether its launch was asked
/// to stop, besides being woken for it.
pub const SLOT_POLL: Duration = Duration::from_millis(20);

/// How long a worker keeps its slot while only workers of its own priority wait
/// (a higher-priority waiter gets it after the current block). Each hand-off
/// costs a thread's wake-up, which on a loaded machine can take milliseconds;
/// this bounds that cost to a small share of the time. (NVIDIA vGPU's default
/// time slice is 2 ms.)
pub const SLOT_TURN: Duration = Duration::from_millis(1);

/// `first_waiting` when nobody waits.
const NO_WAITER: i32 = i32::MAX;

/// A device's execution slots.
///
/// Waiting workers are served by priority (CUDA's stream priorities: lower numbers first), then
/// in the order they came; a holder gives its slot up between two blocks only to a waiter of the
/// same or a higher priority, so a higher-priority kernel overtakes a running lower-priority
/// one block by block (as a GPU's block scheduler prefers high-priority streams' blocks), and
/// kernels of one priority share the units in turns.
#[derive(Debug)]
pub struct WorkerSlots {
    state: Mutex<State>,
    total: usize,
    /// The priority of the first waiter (`i32::MAX`: none), kept with `state.waiting` so that a
    /// holder asks between two blocks without taking the lock.
    first_waiting: AtomicI32,
}

#[derive(Debug)]
struct State {
    /// Slots nobody holds. Never above 0 while a worker waits: a slot given back goes to the
    /// first waiter.
    free: usize,
    /// Waiting workers by (priority, ticket); the first one gets the next slot given back.
    waiting: BTreeMap<(i32, u64), Arc<Waiter>>,
    next_ticket: u64,
}

/// One waiting worker.
#[derive(Debug)]
struct Waiter {
    /// The launch it works for (see [`WorkerSlots::wake`]).
    group: u64,
    /// Set (under the state lock) when a slot was handed to it.
    granted: AtomicBool,
    /// Signalled, with the state lock, when it is granted a slot or woken.
    cv: Condvar,
}

/// How a device's slots are used at one moment ([`WorkerSlots::usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotUsage {
    /// Slots held by workers running blocks.
    pub held: usize,
    /// Workers waiting for a slot.
    pub waiting: usize,
}

/// A held slot, given back on drop.
#[derive(Debug)]
pub struct Slot<'a> {
    slots: &'a WorkerSlots,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.slots.give_back();
    }
}

impl WorkerSlots {
    /// `n` slots (at least one).
    pub fn new(n: usize) -> Self {
        Self {
            state: Mutex::new(State {
                free: n.max(1),
                waiting: BTreeMap::new(),
                next_ticket: 0,
            }),
            total: n.max(1),
            first_waiting: AtomicI32::new(NO_WAITER),
        }
    }

    /// Number of slots.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Slots nobody holds now.
    pub fn idle(&self) -> usize {
        self.lock().free
    }

    /// Workers waiting for a slot now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Slots held and workers waiting for one, read together.
    pub fn usage(&self) -> SlotUsage {
        let st = self.lock();
        SlotUsage {
            held: self.total - st.free,
            waiting: st.waiting.len(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a slot for a worker of launch `group` at `priority`, waiting while none is free or
    /// a worker of the same or a higher priority waits before it; `None` once `give_up` says
    /// the launch should stop (checked when [`WorkerSlots::wake`] wakes the group, and every
    /// [`SLOT_POLL`]).
    pub fn acquire(
        &self,
        priority: i32,
        group: u64,
        give_up: impl Fn() -> bool,
    ) -> Option<Slot<'_>> {
        let mut st = self.lock();
        // Queue behind the workers already waiting, so a worker that just
        // gave its slot up does not take it straight back.
        if st.free > 0 && st.waiting.is_empty() {
            st.free -= 1;
            return Some(Slot { slots: self });
        }
        let me = (priority, st.next_ticket);
        st.next_ticket += 1;
        let waiter = Arc::new(Waiter {
            group,
            granted: AtomicBool::new(false),
            cv: Condvar::new(),
        });
        st.waiting.insert(me, Arc::clone(&waiter));
        self.note_first(&st);
        loop {
            if waiter.granted.load(Ordering::Relaxed) {
                // The giver took it off the queue.
                return Some(Slot { slots: self });
            }
            if give_up() {
                st.waiting.remove(&me);
                self.note_first(&st);
                return None;
            }
            st = waiter
                .cv
                .wait_timeout(st, SLOT_POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Gives a slot back: to the first waiter if there is one, waking only it.
    fn give_back(&self) {
        let mut st = self.lock();
        match st.waiting.pop_first() {
            Some((_, next)) => {
                next.granted.store(true, Ordering::Relaxed);
                self.note_first(&st);
                next.cv.notify_one();
            }
            None => st.free += 1,
        }
    }

    /// Wakes the waiting workers of launch `group`, so that they ask their `give_up` again: call
    /// it after changing what that answers.
    pub fn wake(&self, group: u64) {
        let st = self.lock();
        for w in st.waiting.values().filter(|w| w.group == group) {
            w.cv.notify_one();
        }
    }

    /// Whether a worker of the same or a higher priority than `priority` waits for a slot (a
    /// holder at `priority` should give its slot up between two blocks, after its turn).
    pub fn contended(&self, priority: i32) -> bool {
        self.first_waiting.load(Ordering::Acquire) <= priority
    }

    /// Whether a worker of a higher priority than `priority` waits for a slot (a holder at
    /// `priority` should give its slot up after the current block).
    pub fn preempted(&self, priority: i32) -> bool {
        self.first_waiting.load(Ordering::Acquire) < priority
    }

    /// Keeps `first_waiting` true to `st.waiting` (called with the lock held).
    fn note_first(&self, st: &State) {
        let first = st
            .waiting
            .first_key_value()
            .map_or(NO_WAITER, |(&(p, _), _)| p);
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
        let a = s.acquire(0, 0, || false).unwrap();
        let b = s.acquire(0, 0, || false).unwrap();
        assert!(s.acquire(0, 0, || true).is_none(), "no third slot");
        assert_eq!(
            s.usage(),
            SlotUsage {
                held: 2,
                waiting: 0
            }
        );
        let s2 = Arc::clone(&s);
        let t = std::thread::spawn(move || s2.acquire(0, 0, || false).is_some());
        while !s.contended(0) {
            std::thread::yield_now();
        }
        assert_eq!(s.usage().waiting, 1);
        drop(a);
        assert!(t.join().unwrap());
        drop(b);
        assert!(!s.contended(0));
        assert_eq!(s.lock().free, 2);
        assert_eq!(
            s.usage(),
            SlotUsage {
                held: 0,
                waiting: 0
            }
        );
    }

    /// Waiters are served by priority, then in order; a holder yields only to a waiter of its
    /// own or a higher priority.
    #[test]
    fn a_freed_slot_goes_to_the_highest_priority_waiter_first() {
        let s = Arc::new(WorkerSlots::new(1));
        let held = s.acquire(0, 0, || false).unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        // Low priority first, then high, then low again.
        for (i, priority) in [(0, 0), (1, -5), (2, 0)] {
            let (s2, o) = (Arc::clone(&s), Arc::clone(&order));
            threads.push(std::thread::spawn(move || {
                let slot = s2.acquire(priority, 0, || false).unwrap();
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
        let held = s.acquire(-5, 0, || false).unwrap();
        let s2 = Arc::clone(&s);
        let t = std::thread::spawn(move || s2.acquire(0, 0, || false).is_some());
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

    /// Waiters sleep until they are handed a slot or woken: while one slot is held, 32 waiters
    /// ask `give_up` about once per [`SLOT_POLL`] each (not on every change of the queue), and
    /// passing the slot down the queue wakes one waiter per hand-off.
    #[test]
    fn waiters_sleep_and_each_hand_off_wakes_one() {
        use std::sync::atomic::AtomicUsize;
        use std::time::Instant;
        const WAITERS: usize = 32;
        let s = Arc::new(WorkerSlots::new(1));
        let asked = Arc::new(AtomicUsize::new(0));
        let held = s.acquire(0, 0, || false).unwrap();
        let threads: Vec<_> = (0..WAITERS)
            .map(|_| {
                let (s, asked) = (Arc::clone(&s), Arc::clone(&asked));
                std::thread::spawn(move || {
                    let slot = s.acquire(0, 0, || {
                        asked.fetch_add(1, Ordering::Relaxed);
                        false
                    });
                    assert!(slot.is_some());
                })
            })
            .collect();
        while s.waiting() < WAITERS {
            std::thread::yield_now();
        }
        // Each asks once as it queues, then once per poll.
        let polls = |since: Instant| {
            WAITERS * (since.elapsed().as_millis() as usize / SLOT_POLL.as_millis() as usize + 2)
        };
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(200));
        let during = asked.load(Ordering::Relaxed);
        assert!(
            during <= polls(t),
            "{during} questions while waiting {:?}",
            t.elapsed()
        );
        // Every waiter takes the slot and gives it back at once; waking every waiter at each
        // hand-off would ask about WAITERS² / 2 = 512 times.
        let t = Instant::now();
        drop(held);
        for h in threads {
            h.join().unwrap();
        }
        let after = asked.load(Ordering::Relaxed) - during;
        assert!(
            after <= polls(t),
            "{after} questions in {:?} of hand-offs",
            t.elapsed()
        );
        assert_eq!(s.idle(), 1);
        assert_eq!(s.waiting(), 0);
    }

    /// `wake` makes a group's waiters ask `give_up` again, and only that group's.
    #[test]
    fn wake_reaches_the_groups_waiters() {
        use std::sync::atomic::AtomicBool;
        let s = Arc::new(WorkerSlots::new(1));
        let held = s.acquire(0, 0, || false).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, stop2) = (Arc::clone(&s), Arc::clone(&stop));
        let stopping =
            std::thread::spawn(move || s2.acquire(0, 7, || stop2.load(Ordering::SeqCst)).is_none());
        let s3 = Arc::clone(&s);
        let staying = std::thread::spawn(move || s3.acquire(0, 8, || false).is_some());
        while s.waiting() < 2 {
            std::thread::yield_now();
        }
        stop.store(true, Ordering::SeqCst);
        s.wake(7);
        assert!(stopping.join().unwrap(), "the woken waiter gave up");
        assert_eq!(s.waiting(), 1);
        drop(held);
        assert!(staying.join().unwrap(), "the other one got the slot");
        assert_eq!(s.idle(), 1);
    }
}
