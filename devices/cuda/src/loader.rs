//! Module loads the session does not wait for past their deadline.
//!
//! `cuModuleLoadDataEx` cannot be interrupted once the driver's JIT has started. So a load runs
//! on a loader thread of its own while the session waits for it until the load's deadline (the
//! device's watchdog) or until the client is gone. When the wait ends first, the session answers
//! the guest with the same deadline error as the simulated GPU gives, and the load is
//! *abandoned*: it finishes in the background and whatever it made is discarded there (the
//! module unloaded). A VM context runs one load at a time in the driver ([`DeadlineLoader`]), so
//! it has at most one abandoned load outstanding: a further load (of any of the VM's processes)
//! waits for the one in the driver, within its own deadline, and is refused with
//! [`LoadStop::Busy`] when that one still runs then. So a guest that sends slow images keeps at
//! most one JIT of its own running beyond the deadline, never a growing number.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use thiserror::Error;
use tracing::{debug, warn};

/// How often a waiting session asks whether its client is still there.
const CANCEL_POLL: Duration = Duration::from_millis(10);

/// The loader thread's name.
const THREAD_NAME: &str = "vgpu-module-load";

/// Why a load's result was not waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum LoadStop {
    /// The load's deadline passed while it ran; it goes on in the background and its result is
    /// discarded.
    #[error(
        "the module load ran past its deadline; the driver finishes it in the background and it is unloaded"
    )]
    Deadline,
    /// The client went away while the load ran; the load goes on in the background and its
    /// result is discarded.
    #[error("the module load was cancelled: the client disconnected")]
    Cancelled,
    /// Another load of this VM context (one abandoned earlier, or another process's) still
    /// ran in the driver at this load's deadline: this one was not started.
    #[error(
        "another module load of this VM (one stopped at its deadline, or another process's) still runs in the driver; this load was not started (retry later, or load smaller images)"
    )]
    Busy,
    /// The loader thread could not be started.
    #[error("cannot start a module loader thread; the module was not loaded")]
    Spawn,
}

/// The loads of one VM context: one at a time in the driver, so at most one abandoned load
/// outstanding.
#[derive(Debug, Default)]
pub struct DeadlineLoader {
    in_driver: Arc<InDriver>,
}

/// Whether a load (waited for or abandoned) runs in the driver, and a signal when it ends.
#[derive(Debug, Default)]
struct InDriver {
    running: Mutex<bool>,
    ended: Condvar,
}

/// Where one load's result meets its waiter.
enum Slot<T> {
    /// The load runs, its waiter waits.
    Running,
    /// The load finished before its waiter gave up.
    Done(T),
    /// The waiter gave up: the loader thread discards the result.
    Abandoned,
}

struct Meeting<T> {
    slot: Mutex<Slot<T>>,
    done: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl DeadlineLoader {
    /// A loader with nothing outstanding.
    pub fn new() -> DeadlineLoader {
        DeadlineLoader::default()
    }

    /// Whether a load runs in the driver (waited for, or abandoned earlier).
    pub fn busy(&self) -> bool {
        *lock(&self.in_driver.running)
    }

    /// Runs `load` on a loader thread and waits for its result until `deadline` (`None`: no
    /// deadline) or until `cancelled` says the client is gone (asked every [`CANCEL_POLL`]).
    /// When the wait ends first, the result is handed to `discard` on the loader thread once the
    /// load finishes. Waits first for a load already in the driver, within the same deadline.
    /// A result comes back only once the loader thread holds nothing `load` and `discard`
    /// captured.
    pub fn run<T, L, D>(
        &self,
        deadline: Option<Instant>,
        mut cancelled: impl FnMut() -> bool,
        load: L,
        discard: D,
    ) -> Result<T, LoadStop>
    where
        T: Send + 'static,
        L: FnOnce() -> T + Send + 'static,
        D: FnOnce(T) + Send + 'static,
    {
        self.take_driver(deadline, &mut cancelled)?;
        let meeting = Arc::new(Meeting {
            slot: Mutex::new(Slot::Running),
            done: Condvar::new(),
        });
        let theirs = Arc::clone(&meeting);
        let in_driver = Arc::clone(&self.in_driver);
        let spawned = std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || {
                let result = load();
                let mut slot = lock(&theirs.slot);
                if matches!(*slot, Slot::Abandoned) {
                    drop(slot);
                    // Before the driver is free for the next load: what the load made goes first.
                    discard(result);
                    debug!("an abandoned module load finished and was discarded");
                } else {
                    // Before the result is delivered: what the discard holds (the module's
                    // context generation, which a broken context is replaced only without) is
                    // the waiter's alone once it has the result.
                    drop(discard);
                    *slot = Slot::Done(result);
                    theirs.done.notify_all();
                    drop(slot);
                }
                *lock(&in_driver.running) = false;
                in_driver.ended.notify_all();
            });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start a module loader thread");
            *lock(&self.in_driver.running) = false;
            self.in_driver.ended.notify_all();
            return Err(LoadStop::Spawn);
        }
        let mut slot = lock(&meeting.slot);
        loop {
            if matches!(*slot, Slot::Done(_)) {
                let Slot::Done(result) = std::mem::replace(&mut *slot, Slot::Running) else {
                    unreachable!("matched just above");
                };
                return Ok(result);
            }
            let stop = if cancelled() {
                Some(LoadStop::Cancelled)
            } else if deadline.is_some_and(|d| Instant::now() >= d) {
                Some(LoadStop::Deadline)
            } else {
                None
            };
            if let Some(stop) = stop {
                // Marked under the slot's lock: the loader thread, which takes it to deliver,
                // then sees the load abandoned and discards the result itself.
                *slot = Slot::Abandoned;
                return Err(stop);
            }
            let wait = deadline.map_or(CANCEL_POLL, |d| {
                d.saturating_duration_since(Instant::now()).min(CANCEL_POLL)
            });
            slot = meeting
                .done
                .wait_timeout(slot, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Waits until no load runs in the driver, within `deadline`, and marks this one running.
    fn take_driver(
        &self,
        deadline: Option<Instant>,
        cancelled: &mut impl FnMut() -> bool,
    ) -> Result<(), LoadStop> {
        let mut running = lock(&self.in_driver.running);
        while *running {
            if cancelled() {
                return Err(LoadStop::Cancelled);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(LoadStop::Busy);
            }
            let wait = deadline.map_or(CANCEL_POLL, |d| {
                d.saturating_duration_since(Instant::now()).min(CANCEL_POLL)
            });
            running = self
                .in_driver
                .ended
                .wait_timeout(running, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        *running = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::mpsc;

    /// A load that blocks until released, as a JIT that takes long.
    fn gated(value: u32) -> (mpsc::Sender<()>, impl FnOnce() -> u32 + Send + 'static) {
        let (tx, rx) = mpsc::channel::<()>();
        (tx, move || {
            let _ = rx.recv();
            value
        })
    }

    fn soon(ms: u64) -> Option<Instant> {
        Some(Instant::now() + Duration::from_millis(ms))
    }

    /// Waits until the loader's last load has left the driver.
    fn wait_idle(l: &DeadlineLoader) {
        let t = Instant::now();
        while l.busy() {
            assert!(t.elapsed() < Duration::from_secs(30), "still busy");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_quick_load_returns_its_result_and_nothing_is_discarded() {
        let l = DeadlineLoader::new();
        let discarded = Arc::new(AtomicU32::new(0));
        let d = Arc::clone(&discarded);
        let r = l.run(
            soon(60_000),
            || false,
            || 7u32,
            move |_| {
                d.fetch_add(1, Ordering::SeqCst);
            },
        );
        assert_eq!(r, Ok(7));
        wait_idle(&l);
        assert_eq!(discarded.load(Ordering::SeqCst), 0);
    }

    /// What the closures captured is released before the result comes back: a broken CUDA
    /// context is replaced only once nothing else holds it, and the waiter's next call may come
    /// at once (a loaded machine's loader thread once still held it then).
    #[test]
    fn a_delivered_result_leaves_nothing_captured_on_the_loader_thread() {
        /// Lets go of its `Arc` only after a pause, as a descheduled loader thread would.
        struct SlowToLetGo(#[allow(dead_code)] Arc<()>);
        impl Drop for SlowToLetGo {
            fn drop(&mut self) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let l = DeadlineLoader::new();
        let (for_load, for_discard) = (Arc::new(()), Arc::new(()));
        let in_load = SlowToLetGo(Arc::clone(&for_load));
        let in_discard = SlowToLetGo(Arc::clone(&for_discard));
        let r = l.run(
            soon(60_000),
            || false,
            move || {
                let _held = &in_load;
                4u32
            },
            move |_| drop(in_discard),
        );
        assert_eq!(r, Ok(4));
        assert_eq!(Arc::strong_count(&for_load), 1, "the load's captures");
        assert_eq!(Arc::strong_count(&for_discard), 1, "the discard's captures");
        wait_idle(&l);
    }

    #[test]
    fn a_slow_load_is_abandoned_at_the_deadline_and_discarded_when_it_ends() {
        let l = DeadlineLoader::new();
        let (release, load) = gated(5);
        let (tx, discarded) = mpsc::channel();
        let start = Instant::now();
        let r = l.run(soon(50), || false, load, move |v| tx.send(v).unwrap());
        assert_eq!(r, Err(LoadStop::Deadline));
        // The waiter did not wait for the load (which has not ended yet).
        assert!(l.busy());
        assert!(discarded.try_recv().is_err());
        assert!(start.elapsed() < Duration::from_secs(30));
        release.send(()).unwrap();
        // The load's result reaches the discard, on the loader thread, and the slot frees.
        assert_eq!(discarded.recv_timeout(Duration::from_secs(30)), Ok(5));
        wait_idle(&l);
        assert_eq!(l.run(soon(60_000), || false, || 9u32, |_| {}), Ok(9));
    }

    #[test]
    fn a_departed_client_stops_the_wait() {
        let l = DeadlineLoader::new();
        let (release, load) = gated(1);
        let gone = Arc::new(AtomicBool::new(false));
        let g = Arc::clone(&gone);
        let setter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            g.store(true, Ordering::SeqCst);
        });
        let r = l.run(None, || gone.load(Ordering::SeqCst), load, |_| {});
        assert_eq!(r, Err(LoadStop::Cancelled));
        setter.join().unwrap();
        release.send(()).unwrap();
    }

    #[test]
    fn one_load_at_a_time_runs_a_further_load_waits_or_is_refused() {
        let l = DeadlineLoader::new();
        let started = Arc::new(AtomicU32::new(0));
        let (release, load) = gated(1);
        let s = Arc::clone(&started);
        let first = move || {
            s.fetch_add(1, Ordering::SeqCst);
            load()
        };
        assert_eq!(
            l.run(soon(20), || false, first, |_| {}),
            Err(LoadStop::Deadline)
        );
        // While it runs, a further load is refused at its own deadline without starting.
        let s = Arc::clone(&started);
        let second = move || {
            s.fetch_add(1, Ordering::SeqCst);
            2u32
        };
        assert_eq!(
            l.run(soon(20), || false, second, |_| {}),
            Err(LoadStop::Busy)
        );
        assert_eq!(started.load(Ordering::SeqCst), 1);
        // One that may wait longer starts once the abandoned load ends.
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            release.send(()).unwrap();
        });
        assert_eq!(l.run(soon(60_000), || false, || 3u32, |_| {}), Ok(3));
        releaser.join().unwrap();
        wait_idle(&l);
    }
}
