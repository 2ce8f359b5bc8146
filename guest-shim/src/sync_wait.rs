//! Synchronizing calls (`cuCtxSynchronize`, `cuStreamSynchronize`, `cuEventSynchronize`) that
//! do not hold the process's connection while they wait.
//!
//! A process's threads share one connection to vgpud, and a call holds it until its reply
//! comes. A thread waiting there for a long kernel would stop every other thread's CUDA calls
//! until the kernel ended (in CUDA they go on: a server thread launching requests while another
//! waits for the last batch), and a program whose other thread releases the wait (a
//! `cuStreamWriteValue32` that a `cuStreamWaitValue32` in the synchronized stream waits for)
//! would never end.
//!
//! So in a process where more than one thread has called CUDA ([`note_thread`]), a
//! synchronizing call asks vgpud to wait in place only briefly (`SyncBegin`,
//! [`IN_PLACE_US`]): most synchronizations end within it and cost one round trip, as before.
//! When the work is not done by then, vgpud keeps a ticket under a token the shim chose, and
//! the thread lets go of the process's connection and waits for the ticket (`SyncWait`) on a
//! connection of its own, from a pool ([`MAX_CONNECTIONS`], [`KEEP_IDLE`] kept between waits);
//! once the work is done it ends the call on the process's connection (`SyncFinish`), which
//! reports the work's errors as the plain call does. With no connection of its own to be had (the pool is in use,
//! or one cannot be opened) it waits on the process's connection, as before. A process whose
//! only CUDA thread is the caller has no other thread to stop, and makes the plain calls, as
//! does every process of a vgpud without tickets (`FEATURE_SYNC_TICKETS`). (A thread whose first
//! CUDA call comes while another thread waits in a plain call waits for it that once.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use vgpu_proto::cuda;
use vgpu_proto::msg::{self, SYNC_DONE, SYNC_GONE, SYNC_IDLE, SYNC_PENDING};

use crate::client::Client;
use crate::driver::{CuRes, Driver, driver};

/// How long vgpud waits in place before it leaves a ticket: the other threads' calls wait at
/// most this long behind a synchronization; a longer one costs two more round trips (a few
/// microseconds against at least a millisecond of waiting).
pub const IN_PLACE_US: u32 = 1000;
/// How long one `SyncWait` waits before vgpud answers "not yet" (and the shim asks again).
pub const WAIT_SLICE_MS: u32 = 1000;
/// Most connections of their own the process's waiting threads have open at once (each is a
/// session of the VM's session budget, `limits.sessions`). A thread finding all of them in use
/// waits on the process's connection.
pub const MAX_CONNECTIONS: usize = 64;
/// Idle connections kept for the next waits; one given back beyond them is closed.
pub const KEEP_IDLE: usize = 4;

/// Connections of waiting threads, not in use now.
static IDLE: Mutex<Vec<Client>> = Mutex::new(Vec::new());
/// Connections opened (in use or idle), at most [`MAX_CONNECTIONS`].
static OPENED: AtomicUsize = AtomicUsize::new(0);

/// Threads of the process that called a CUDA entry point and have not ended.
static CUDA_THREADS: AtomicUsize = AtomicUsize::new(0);

/// One of [`CUDA_THREADS`], for as long as its thread lives.
struct CudaThread;

impl Drop for CudaThread {
    fn drop(&mut self) {
        CUDA_THREADS.fetch_sub(1, Ordering::Relaxed);
    }
}

thread_local! {
    static THIS_THREAD: CudaThread = {
        CUDA_THREADS.fetch_add(1, Ordering::Relaxed);
        CudaThread
    };
}

/// Counts the calling thread among the process's CUDA threads (every entry point calls it; after
/// a thread's first call it costs a thread-local look). A call from a thread-local destructor
/// (NVIDIA's runtime cleans up as its threads end) after this one ran is not counted again.
pub fn note_thread() {
    let _ = THIS_THREAD.try_with(|_| {});
}

/// Whether another thread than the caller has called CUDA and not ended.
fn other_cuda_threads() -> bool {
    CUDA_THREADS.load(Ordering::Relaxed) > 1
}

fn idle() -> MutexGuard<'static, Vec<Client>> {
    IDLE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits for the work a synchronizing call of `kind` (`msg::SYNC_CONTEXT` with context `ctx`,
/// `msg::SYNC_STREAM` with stream `handle` of `ctx`, `msg::SYNC_EVENT` with event `handle`)
/// names, and returns its errors.
pub(crate) fn synchronize(kind: u32, ctx: u64, handle: u64) -> CuRes<()> {
    let d = driver()?;
    if !d.sync_tickets || !other_cuda_threads() {
        return plain(d, kind, ctx, handle);
    }
    let (token_hi, token_lo) = crate::host_func::new_token();
    let begin = msg::SyncBegin {
        ctx,
        kind,
        handle,
        wait_us: IN_PLACE_US,
        token_hi,
        token_lo,
    };
    let (reply, enqueued) = d.call_counted(&begin)?;
    match reply.value {
        SYNC_DONE => return Ok(()),
        SYNC_IDLE => {
            d.idle_at.store(enqueued, Ordering::Relaxed);
            return Ok(());
        }
        SYNC_PENDING => {}
        other => {
            crate::warn!("vgpud answered a synchronization with {other}");
            return Err(cuda::CUDA_ERROR_UNKNOWN);
        }
    }
    let wait = msg::SyncWait {
        token_hi,
        token_lo,
        timeout_ms: WAIT_SLICE_MS,
    };
    let on_process = || settled(|| d.call(&wait, &[]).map(|r| r.value));
    let state = match take_connection() {
        Some(mut own) => match settled(|| own.call(&wait, &[]).map(|r| r.0.value)) {
            Ok(state) => {
                give_back(own);
                state
            }
            Err(e) => {
                // A connection that failed is closed; the wait goes on on the process's.
                drop(own);
                OPENED.fetch_sub(1, Ordering::Relaxed);
                crate::debug!(
                    "a synchronization's own connection failed ({}); waiting on the process's",
                    e.message
                );
                on_process()?
            }
        },
        None => on_process()?,
    };
    if state == SYNC_GONE {
        return Err(cuda::CUDA_ERROR_DEVICE_UNAVAILABLE);
    }
    d.call(&msg::SyncFinish { ctx, kind, handle }, &[])
        .map(drop)
}

/// Before a synchronous copy on `stream` (as the application names it) of a process with other
/// CUDA threads (`cuMemcpyDtoH`, `cuMemcpyHtoD`, which wait for their stream's earlier work, and
/// the synchronous fills and device-to-device copies, which vgpud answers once they are done):
/// waits for that work as [`synchronize`] does, so that the copy itself no longer waits on the
/// process's connection. Costs one round trip, unless vgpud said the session was idle and no
/// work was sent since ([`crate::client::Client::enqueued`]); nothing in a process with one CUDA
/// thread.
pub(crate) fn before_blocking_copy(stream: u64) -> CuRes<()> {
    before_blocking_copy_if(stream, || true)
}

/// [`before_blocking_copy`] for a copy that waits only when `needed` says so (a lookup the
/// caller makes only in a process that would wait: single-threaded processes skip it).
pub(crate) fn before_blocking_copy_if(stream: u64, needed: impl FnOnce() -> bool) -> CuRes<()> {
    if !waits_first() || !needed() {
        return Ok(());
    }
    let ctx = crate::driver::ctx()?;
    synchronize(msg::SYNC_STREAM, ctx, crate::driver::wire_stream(stream)?)
}

/// Before a call of context `ctx`, in a process with other CUDA threads, that vgpud runs only
/// once all of the process's earlier work is done, since that work may still use what the call
/// releases: `cuMemFree` (and `cuMemFreeAsync` of memory not from a pool), `cuMemFreeHost` of a
/// mapped buffer, `cuMemHostUnregister` of a mapped range, `cuMemUnmap`, `cuIpcCloseMemHandle`,
/// `cuMemPoolDestroy`, `cuModuleUnload`, texture and surface object destroys, primary context
/// releases and resets. That wait happens first, as [`synchronize`] waits (`msg::SYNC_ALL`,
/// reporting no errors), so the call finds nothing to wait for. As [`before_blocking_copy`],
/// skipped while vgpud last said the session was idle and no work was sent since.
pub(crate) fn before_settling(ctx: u64) -> CuRes<()> {
    before_settling_if(ctx, || true)
}

/// [`before_settling`] for a call that settles only when `needed` says so (a lookup the caller
/// makes only in a process that would wait: single-threaded processes skip it).
pub(crate) fn before_settling_if(ctx: u64, needed: impl FnOnce() -> bool) -> CuRes<()> {
    if !waits_first() || !needed() {
        return Ok(());
    }
    synchronize(msg::SYNC_ALL, ctx, 0)
}

/// Before `cuCtxDestroy` of `ctx` in a process with other CUDA threads: vgpud destroys once all
/// of the process's earlier work is done (its kernels may still use the context's memory), so
/// that wait happens first (`msg::SYNC_DESTROY`, which also ends the context's stream-memory
/// waits, as the destroy does). Its errors are not the destroy's: a context that cannot be
/// destroyed, or a vgpud that does not know the kind, is left to the destroy itself. Skipped as
/// [`before_blocking_copy`] is.
pub(crate) fn before_destroy(ctx: u64) {
    if !waits_first() {
        return;
    }
    if let Err(code) = synchronize(msg::SYNC_DESTROY, ctx, 0) {
        crate::debug!("cuCtxDestroy: the wait before it failed ({code}); the destroy waits itself");
    }
}

/// Whether a blocking call should wait for earlier work first: a process with other CUDA
/// threads, a vgpud with tickets, and work sent since vgpud last said the session was idle.
fn waits_first() -> bool {
    driver().is_ok_and(|d| {
        d.sync_tickets && other_cuda_threads() && d.enqueued() != d.idle_at.load(Ordering::Relaxed)
    })
}

/// The plain synchronizing call, waiting on the process's connection (nothing for
/// `msg::SYNC_ALL` and `msg::SYNC_DESTROY`: the free or destroy that follows waits itself).
fn plain(d: &Driver, kind: u32, ctx: u64, handle: u64) -> CuRes<()> {
    match kind {
        msg::SYNC_ALL | msg::SYNC_DESTROY => return Ok(()),
        msg::SYNC_STREAM => d.call(
            &msg::StreamSynchronize {
                ctx,
                stream: handle,
            },
            &[],
        ),
        msg::SYNC_EVENT => d.call(&msg::EventSynchronize { ctx, event: handle }, &[]),
        _ => d.call(&msg::CtxSynchronize { ctx }, &[]),
    }
    .map(drop)
}

/// Asks `wait` (a `SyncWait`) again until the ticket is done or gone.
fn settled<E>(mut wait: impl FnMut() -> Result<i32, E>) -> Result<i32, E> {
    loop {
        let state = wait()?;
        if state != SYNC_PENDING {
            return Ok(state);
        }
    }
}

/// An idle connection of the pool, or a new one while fewer than [`MAX_CONNECTIONS`] are
/// open; `None` otherwise or when none can be opened.
fn take_connection() -> Option<Client> {
    if let Some(c) = idle().pop() {
        return Some(c);
    }
    let opened = OPENED.fetch_add(1, Ordering::Relaxed);
    if opened >= MAX_CONNECTIONS {
        OPENED.fetch_sub(1, Ordering::Relaxed);
        return None;
    }
    match crate::host_func::connect("synchronization") {
        Ok(c) => Some(c),
        Err(m) => {
            OPENED.fetch_sub(1, Ordering::Relaxed);
            crate::debug!("no connection of its own for a synchronization: {m}");
            None
        }
    }
}

fn give_back(c: Client) {
    let mut idle = idle();
    if idle.len() < KEEP_IDLE {
        idle.push(c);
        return;
    }
    drop(idle);
    drop(c);
    OPENED.fetch_sub(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The count is the process's (other tests' threads may be in it too): this thread and a
    /// second one that called are both in it while they live.
    #[test]
    fn threads_count_from_their_first_call() {
        note_thread();
        note_thread();
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            note_thread();
            note_thread();
            tx.send(()).unwrap();
            done_rx.recv().unwrap();
        });
        rx.recv().unwrap();
        assert!(CUDA_THREADS.load(Ordering::Relaxed) >= 2);
        assert!(other_cuda_threads());
        done_tx.send(()).unwrap();
        t.join().unwrap();
    }
}
