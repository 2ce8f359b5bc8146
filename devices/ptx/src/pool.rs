//! The persistent pool of interpreter worker threads shared by every launch of the process.
//!
//! A launch with `n` workers runs worker 0 on the calling thread and offers workers `1..n` to the
//! pool; idle pool threads take them in submission order. The caller never waits for an offered
//! worker that no pool thread took: once its own worker returns (every block claimed, a yield, a
//! fault or a cancellation) it withdraws the offer and waits only for the workers already
//! running. Progress therefore never depends on free pool threads, so any number of launches
//! (streams of any number of sessions) may submit at once without deadlock: a launch whose
//! helpers are all busy elsewhere simply runs its blocks on its own thread.
//!
//! Threads are started lazily, whenever an offer has more workers waiting to be taken than there
//! are idle threads (at most [`MAX_POOL_THREADS`] in all), and named `vgpu-ptx-worker-N`. So
//! every offered worker gets a thread even while the others run other launches' workers: a
//! high-priority kernel offered while a lower-priority one holds the pool still gets all its
//! workers, and they take the device's execution units from it block by block (`slots.rs`).
//! They block on a condition variable while idle and live as long as the process. A new thread
//! inherits the seccomp filter of the thread that starts it (the launch that needs it), which
//! must allow `clone`/`clone3`; vgpud's common allowlist does for every thread kind.
//!
//! A panic in a worker is caught where it runs (the launch turns it into a fault) and again by
//! the pool thread, which keeps serving.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

/// Most pool threads; a launch asking for more workers shares these.
pub const MAX_POOL_THREADS: usize = 256;

/// Prefix of a pool thread's name; the thread's index follows.
const THREAD_NAME_PREFIX: &str = "vgpu-ptx-worker-";

/// The work of one worker of a launch, by worker index.
type Task<'a> = dyn Fn(u32) + Sync + 'a;

/// One launch's offer of workers to the pool.
struct Job {
    /// The launch's worker body, its lifetime erased: see [`run`] for why it stays valid while
    /// a pool thread can reach it.
    task: &'static Task<'static>,
    /// Next worker index to hand out; the offer is withdrawn when it reaches `end`. Changed
    /// only under the pool lock (atomic for interior mutability).
    next: AtomicU32,
    /// One past the last worker index offered.
    end: u32,
    /// Pool threads running a worker of this job. Changed only under the pool lock.
    active: AtomicU32,
    /// The launch's priority (CUDA's: lower numbers first): idle threads serve the highest
    /// priority's offers first, then the oldest.
    priority: i32,
    /// Signalled (with the pool lock) when `active` drops to zero.
    done: Condvar,
}

#[derive(Default)]
struct State {
    /// Launches with workers not yet taken, oldest first (one entry per running launch at most).
    jobs: VecDeque<Arc<Job>>,
    /// Threads started (or being started).
    threads: usize,
    /// Threads waiting for an offer.
    idle: usize,
    /// Threads started that have not yet looked for an offer.
    starting: usize,
    /// Offered workers no thread has taken yet, over every job (`end - next` added up).
    untaken: usize,
}

#[derive(Default)]
struct Pool {
    state: Mutex<State>,
    /// Signalled when a job is offered.
    work: Condvar,
}

static POOL: OnceLock<Pool> = OnceLock::new();

/// Benchmarks only: start threads for every launch as before the pool.
static SPAWN_PER_LAUNCH: AtomicBool = AtomicBool::new(false);

/// Makes launches start (`true`) their helper threads for each launch with
/// `std::thread::scope`, as before the pool existed, or use the pool (`false`, the default).
/// For benchmarks comparing the two in one process.
#[doc(hidden)]
pub fn set_spawn_per_launch(on: bool) {
    SPAWN_PER_LAUNCH.store(on, Ordering::SeqCst);
}

fn pool() -> &'static Pool {
    POOL.get_or_init(Pool::default)
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The threads to start so that every offered worker not yet taken has an idle or starting
    /// thread to take it (at most [`MAX_POOL_THREADS`] in all): `(first, n)`, counted as
    /// starting; [`Pool::start`] them once the lock is released.
    fn threads_wanted(st: &mut State) -> (usize, usize) {
        let n = st
            .untaken
            .saturating_sub(st.idle + st.starting)
            .min(MAX_POOL_THREADS.saturating_sub(st.threads));
        let first = st.threads;
        st.threads += n;
        st.starting += n;
        (first, n)
    }

    /// Starts the `n` threads from number `first` that [`Pool::threads_wanted`] counted.
    fn start(&'static self, (first, n): (usize, usize)) {
        if n == 0 {
            return;
        }
        for i in first..first + n {
            let spawned = std::thread::Builder::new()
                .name(format!("{THREAD_NAME_PREFIX}{i}"))
                .spawn(move || self.serve());
            if let Err(e) = spawned {
                // Launches still complete: their callers run the blocks no helper takes.
                tracing::warn!(error = %e, threads = i, "cannot start an interpreter worker thread");
                let mut st = self.lock();
                let missing = first + n - i;
                st.threads -= missing;
                st.starting -= missing;
                return;
            }
        }
        tracing::debug!(threads = first + n, "interpreter worker pool grown");
    }

    /// A pool thread: takes offered workers and runs them, forever.
    fn serve(&self) {
        let mut st = self.lock();
        st.starting -= 1;
        loop {
            // The highest priority's offer, the oldest among equals.
            let Some((at, job)) = st
                .jobs
                .iter()
                .enumerate()
                .min_by_key(|(i, j)| (j.priority, *i))
                .map(|(i, j)| (i, Arc::clone(j)))
            else {
                st.idle += 1;
                st = self.work.wait(st).unwrap_or_else(|p| p.into_inner());
                st.idle -= 1;
                continue;
            };
            let index = job.next.fetch_add(1, Ordering::Relaxed);
            st.untaken -= 1;
            if index + 1 >= job.end {
                st.jobs.remove(at);
            }
            job.active.fetch_add(1, Ordering::Relaxed);
            drop(st);
            // The task converts its own panics to faults; this keeps the thread alive anyway.
            if catch_unwind(AssertUnwindSafe(|| (job.task)(index))).is_err() {
                tracing::error!("an interpreter worker panicked outside its launch");
            }
            st = self.lock();
            if job.active.fetch_sub(1, Ordering::Relaxed) == 1 {
                job.done.notify_all();
            }
        }
    }
}

/// Withdraws a job's offer and waits for the pool threads running it, also when the caller's own
/// worker unwinds.
struct Withdraw<'a> {
    pool: &'static Pool,
    job: &'a Arc<Job>,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        let mut st = self.pool.lock();
        let next = self.job.next.swap(self.job.end, Ordering::Relaxed);
        st.untaken -= self.job.end.saturating_sub(next) as usize;
        st.jobs.retain(|j| !Arc::ptr_eq(j, self.job));
        while self.job.active.load(Ordering::Relaxed) > 0 {
            st = self.job.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Runs `task(0)` on the calling thread and offers `task(1)` … `task(workers - 1)` to the pool;
/// returns once `task(0)` has returned and every offered worker a pool thread took has returned.
/// Offered workers no pool thread took by then never run, so `task` must not need all of them
/// (the launch's workers share one block counter, so `task(0)` alone runs every block).
///
/// `priority` is the launch's (CUDA's: lower numbers first): idle pool threads take the offered
/// workers of the highest-priority launch first, so a high-priority kernel gets its helpers
/// before a lower-priority one that was offered earlier; threads are started for offered
/// workers no idle thread is there to take (see the module's documentation).
pub fn run(workers: u32, priority: i32, task: &Task<'_>) {
    if workers <= 1 {
        task(0);
        return;
    }
    if SPAWN_PER_LAUNCH.load(Ordering::Relaxed) {
        std::thread::scope(|s| {
            for i in 1..workers {
                s.spawn(move || task(i));
            }
            task(0);
        });
        return;
    }
    let pool = pool();
    // SAFETY: only the lifetime is changed (same fat-pointer layout). Pool threads call the task
    // only for a worker index they claim under the pool lock while the job is offered, and count
    // themselves in `active` before releasing the lock; `Withdraw::drop`, which runs before this
    // function returns or unwinds, withdraws the offer under that lock and waits until `active`
    // is zero. So no pool thread touches `task` after this function returns: the borrow outlives
    // every use.
    let task: &'static Task<'static> =
        unsafe { std::mem::transmute::<&Task<'_>, &'static Task<'static>>(task) };
    let job = Arc::new(Job {
        task,
        next: AtomicU32::new(1),
        end: workers,
        active: AtomicU32::new(0),
        priority,
        done: Condvar::new(),
    });
    let wanted = {
        let mut st = pool.lock();
        st.jobs.push_back(Arc::clone(&job));
        st.untaken += workers as usize - 1;
        let wake = (workers as usize - 1).min(st.idle);
        let wanted = Pool::threads_wanted(&mut st);
        drop(st);
        for _ in 0..wake {
            pool.work.notify_one();
        }
        wanted
    };
    let _withdraw = Withdraw { pool, job: &job };
    pool.start(wanted);
    task(0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_claimed_worker_runs_once_and_the_caller_always_runs() {
        for workers in [1u32, 2, 3, 8] {
            let seen: Vec<AtomicUsize> = (0..workers).map(|_| AtomicUsize::new(0)).collect();
            run(workers, 0, &|i| {
                seen[i as usize].fetch_add(1, Ordering::SeqCst);
            });
            assert_eq!(seen[0].load(Ordering::SeqCst), 1);
            assert!(seen.iter().all(|s| s.load(Ordering::SeqCst) <= 1));
        }
    }

    #[test]
    fn concurrent_submitters_all_finish() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..6 {
                s.spawn(|| {
                    for _ in 0..50 {
                        run(4, 0, &|_| {
                            total.fetch_add(1, Ordering::SeqCst);
                        });
                    }
                });
            }
        });
        // Each launch's caller ran its worker 0 at least.
        assert!(total.load(Ordering::SeqCst) >= 6 * 50);
    }

    #[test]
    fn an_offer_made_while_every_pool_thread_is_busy_gets_threads_of_its_own() {
        use std::time::{Duration, Instant};
        const PATIENCE: Duration = Duration::from_secs(20);
        let wait_until = |what: &str, done: &dyn Fn() -> bool| {
            let t = Instant::now();
            while !done() {
                assert!(t.elapsed() < PATIENCE, "{what}");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        // A launch whose workers all block keeps every pool thread there is busy (and more: the
        // pool grows for it as well).
        let busy = pool().lock().threads as u32 + 1;
        let (started, release) = (AtomicUsize::new(0), AtomicBool::new(false));
        std::thread::scope(|s| {
            s.spawn(|| {
                run(busy + 1, 0, &|_| {
                    started.fetch_add(1, Ordering::SeqCst);
                    while !release.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                });
            });
            wait_until("the blocking launch never had all its workers", &|| {
                started.load(Ordering::SeqCst) == busy as usize + 1
            });
            // Releases the blocking launch also when the check below fails.
            struct Release<'a>(&'a AtomicBool);
            impl Drop for Release<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::SeqCst);
                }
            }
            let _release = Release(&release);
            // A second launch whose caller's worker finishes only once a helper ran beside it.
            let helped = AtomicBool::new(false);
            run(2, 0, &|i| {
                if i == 0 {
                    wait_until("no pool thread took the offered worker", &|| {
                        helped.load(Ordering::SeqCst)
                    });
                } else {
                    helped.store(true, Ordering::SeqCst);
                }
            });
        });
    }

    #[test]
    fn a_panicking_worker_leaves_the_pool_serving() {
        // Pool threads catch the panic; the next launch still gets helpers or runs inline.
        run(3, 0, &|i| {
            if i != 0 {
                panic!("worker {i} fails on purpose");
            }
        });
        let ran = AtomicUsize::new(0);
        run(3, 0, &|_| {
            ran.fetch_add(1, Ordering::SeqCst);
        });
        assert!(ran.load(Ordering::SeqCst) >= 1);
    }
}
