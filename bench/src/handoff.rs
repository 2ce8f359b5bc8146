//! A reference for every transport's call: the benchmark's calls handed to a broker session on
//! another thread through an in-process ring, with no encoding, no system call and no virtqueue.
//!
//! Every transport hands a guest's request from the CPU that wrote it to the vgpud thread that
//! serves it: the request's bytes move between CPUs, and the serving thread runs the broker's
//! call beside whatever else shares the machine's CPUs. This path does only that. Each request
//! is one 64-byte slot of a ring that the calling thread fills and a consumer thread, which owns
//! a [`Direct`] session, empties; posted calls are handed over `BATCH` at a time, as transports
//! send posted frames in batches. Both threads poll, as the benchmark's guests and vgpud's
//! session threads do; the consumer sleeps once it has found the ring empty for
//! `CONSUMER_SPIN`, and at once after a measurement (`settle`), so that it takes no
//! CPU time from the other paths' measurements.
//!
//! It is no strict floor: the ring's slots are reused, so each of their cache lines moves to the
//! consumer and back to the caller, where a socket's kernel copies move a batch's bytes one way,
//! in bulk. What it shows is the price of moving calls between this machine's two CPUs, and how
//! that price changes from run to run (docs/performance.md, "The hand-off alone").

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vgpu_proto::msg::{self, Request};
use vgpud::Daemon;

use crate::direct::{Direct, memset};
use crate::vhost::CallPath;

/// Slots in the ring: as many posted calls as a 64 KiB batch of frames holds.
const SLOTS: usize = 1024;
/// Posted calls handed over at once, as transports send posted frames in batches (the shim's
/// grow from 1 KiB to 64 KiB of frames): the consumer sees the ring's head move once per batch,
/// not once per call.
const BATCH: u64 = 512;
/// How long the consumer polls an empty ring before it sleeps.
const CONSUMER_SPIN: Duration = Duration::from_micros(200);
/// Polls of an empty ring between two readings of the clock.
const POLLS_PER_CLOCK: u32 = 64;
/// The caller's wait for a synchronization (the consumer is never that late unless broken).
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// What a slot asks for.
const OP_MEMSET: u64 = 1;
const OP_SYNCHRONIZE: u64 = 2;

/// One request: the fields of a posted `Memset`, or a synchronization. One cache line.
#[repr(align(64))]
#[derive(Default)]
struct Slot {
    op: AtomicU64,
    ctx: AtomicU64,
    dst: AtomicU64,
    count: AtomicU64,
    /// The fill value in the low 32 bits, the element size above them.
    value_and_size: AtomicU64,
}

/// A counter on a cache line of its own, so that the two threads' counters do not share one.
#[repr(align(64))]
#[derive(Default)]
struct Counter(AtomicU64);

/// The ring and the flags the two threads share.
struct Ring {
    slots: Box<[Slot]>,
    /// Slots filled (written by the caller).
    head: Counter,
    /// Slots served (written by the consumer).
    tail: Counter,
    /// Synchronizations served.
    synced: Counter,
    /// The consumer is asleep, or about to be: the caller wakes it after filling a slot.
    sleeping: AtomicBool,
    /// The measurement is over: the consumer sleeps as soon as the ring is empty, without
    /// polling first, so that it takes no CPU time from the next path's measurement.
    rest: AtomicBool,
    stop: AtomicBool,
    /// A call failed on the consumer since the last synchronization: `failure` holds it.
    failed: AtomicBool,
    /// The first call that failed on the consumer.
    failure: Mutex<Option<String>>,
}

/// The benchmark's calls made on a broker session of another thread.
pub struct Handoff {
    ring: Arc<Ring>,
    consumer: Option<JoinHandle<()>>,
    ctx: u64,
    ptr: u64,
    /// Slots filled so far, and the consumer's count of served ones as last read.
    head: u64,
    tail_seen: u64,
    /// Synchronizations asked for.
    syncs: u64,
}

impl Handoff {
    /// Opens a session of VM `vm` of `daemon` and starts the thread that serves it.
    pub fn open(daemon: &Daemon, vm: &str) -> Result<Handoff, String> {
        let direct = Direct::open(daemon, vm)?;
        let (ctx, ptr) = (direct.ctx, direct.ptr);
        let ring = Arc::new(Ring {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
            head: Counter::default(),
            tail: Counter::default(),
            synced: Counter::default(),
            sleeping: AtomicBool::new(false),
            rest: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
        });
        let served = Arc::clone(&ring);
        let consumer = std::thread::Builder::new()
            .name("handoff".into())
            .spawn(move || serve(&served, direct))
            .map_err(|e| format!("starting the hand-off thread: {e}"))?;
        Ok(Handoff {
            ring,
            consumer: Some(consumer),
            ctx,
            ptr,
            head: 0,
            tail_seen: 0,
            syncs: 0,
        })
    }

    /// Fills the next slot with `fill`; hands it over, with the slots filled before it, once
    /// `BATCH` are ready, the ring is full or `now`.
    fn push(&mut self, fill: impl FnOnce(&Slot), now: bool) {
        if self.head - self.tail_seen >= SLOTS as u64 {
            self.publish();
            while self.head - self.tail_seen >= SLOTS as u64 {
                std::hint::spin_loop();
                self.tail_seen = self.ring.tail.0.load(Ordering::Acquire);
            }
        }
        fill(&self.ring.slots[self.head as usize % SLOTS]);
        self.head += 1;
        if now || self.head.is_multiple_of(BATCH) {
            self.publish();
        }
    }

    /// Hands over the slots filled so far.
    fn publish(&self) {
        // SeqCst with the load after it, against the consumer's store of `sleeping` and load
        // of `head`: one of the two threads sees the other's store.
        self.ring.head.0.store(self.head, Ordering::SeqCst);
        if self.ring.sleeping.load(Ordering::SeqCst)
            && let Some(c) = &self.consumer
        {
            c.thread().unpark();
        }
    }

    /// The failure of a call served since the last synchronization, taken.
    fn failure(&self) -> Option<String> {
        // Looked at without the lock, which would add to every round trip measured.
        if !self.ring.failed.swap(false, Ordering::Acquire) {
            return None;
        }
        self.ring.failure.lock().map_or_else(
            |_| Some("the hand-off thread panicked".into()),
            |mut f| f.take(),
        )
    }
}

impl CallPath for Handoff {
    fn synchronize(&mut self) -> Result<(), String> {
        self.ring.rest.store(false, Ordering::Relaxed);
        self.push(|s| s.op.store(OP_SYNCHRONIZE, Ordering::Relaxed), true);
        self.syncs += 1;
        let start = Instant::now();
        let mut polls = 0u32;
        while self.ring.synced.0.load(Ordering::Acquire) < self.syncs {
            std::hint::spin_loop();
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(POLLS_PER_CLOCK) && start.elapsed() > SYNC_TIMEOUT {
                return Err("the hand-off thread did not answer a CtxSynchronize".into());
            }
        }
        match self.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn settle(&mut self) -> Result<(), String> {
        self.ring.rest.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn memsets(&mut self, n: usize) -> Result<(), String> {
        self.ring.rest.store(false, Ordering::Relaxed);
        let m = memset(self.ctx, self.ptr);
        for _ in 0..n {
            self.push(
                |s| {
                    s.op.store(OP_MEMSET, Ordering::Relaxed);
                    s.ctx.store(m.ctx, Ordering::Relaxed);
                    s.dst.store(m.dst, Ordering::Relaxed);
                    s.count.store(m.count, Ordering::Relaxed);
                    s.value_and_size.store(
                        u64::from(m.value) | u64::from(m.elem_size) << u32::BITS,
                        Ordering::Relaxed,
                    );
                },
                false,
            );
        }
        self.synchronize()
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        self.ring.stop.store(true, Ordering::SeqCst);
        if let Some(c) = self.consumer.take() {
            c.thread().unpark();
            let _ = c.join();
        }
    }
}

/// The consumer: serves the ring's slots on `direct` until told to stop.
fn serve(ring: &Ring, mut direct: Direct) {
    let (mut tail, mut head, mut synced) = (0u64, 0u64, 0u64);
    let mut polls = 0u32;
    let mut idle_since: Option<Instant> = None;
    loop {
        // The caller's counter is read again only once the slots it last showed are served.
        if head == tail {
            head = ring.head.0.load(Ordering::Acquire);
        }
        if head == tail {
            if ring.stop.load(Ordering::Acquire) {
                return;
            }
            polls = polls.wrapping_add(1);
            if !polls.is_multiple_of(POLLS_PER_CLOCK) {
                std::hint::spin_loop();
                continue;
            }
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < CONSUMER_SPIN && !ring.rest.load(Ordering::Relaxed) {
                continue;
            }
            // Asleep until the caller hands something over or stops it (it unparks this thread
            // after either; a wake-up with neither is spurious). No timed naps: their wake-ups
            // would interrupt the other paths' measurements.
            ring.sleeping.store(true, Ordering::SeqCst);
            while ring.head.0.load(Ordering::SeqCst) == tail && !ring.stop.load(Ordering::SeqCst) {
                std::thread::park();
            }
            ring.sleeping.store(false, Ordering::Relaxed);
            idle_since = None;
            continue;
        }
        idle_since = None;
        let slot = &ring.slots[tail as usize % SLOTS];
        let op = slot.op.load(Ordering::Relaxed);
        let r = match op {
            OP_MEMSET => {
                let vs = slot.value_and_size.load(Ordering::Relaxed);
                direct.post(&Request::Memset(msg::Memset {
                    ctx: slot.ctx.load(Ordering::Relaxed),
                    stream: 0,
                    dst: slot.dst.load(Ordering::Relaxed),
                    value: vs as u32,
                    elem_size: (vs >> u32::BITS) as u32,
                    count: slot.count.load(Ordering::Relaxed),
                }))
            }
            OP_SYNCHRONIZE => direct.synchronize(),
            other => Err(format!("the hand-off ring holds an unknown op {other}")),
        };
        if let Err(e) = r
            && let Ok(mut f) = ring.failure.lock()
        {
            f.get_or_insert(e);
            ring.failed.store(true, Ordering::Release);
        }
        tail += 1;
        ring.tail.0.store(tail, Ordering::Release);
        if op == OP_SYNCHRONIZE {
            synced += 1;
            ring.synced.0.store(synced, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posted_memsets_reach_the_session_and_their_errors_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::vhost::config(dir.path()).unwrap();
        let daemon = Daemon::start(&config).unwrap();
        let mut h = Handoff::open(&daemon, crate::vhost::VM).unwrap();
        // More calls than slots: the caller waits for room.
        h.memsets(3 * SLOTS + 5).unwrap();
        h.synchronize().unwrap();
        // A fill past the allocation is refused when it is served, and the refusal comes back
        // at the next synchronization, as a transport's would; later calls go on.
        let ptr = h.ptr;
        h.ptr += crate::direct::BUFFER_BYTES;
        assert!(h.memsets(1).is_err());
        h.ptr = ptr;
        h.memsets(10).unwrap();
        drop(h);
        daemon.shutdown();
    }
}
