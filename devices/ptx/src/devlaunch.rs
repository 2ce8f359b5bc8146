//! Dynamic parallelism: kernels launching kernels (`kernel<<<g, b>>>()` in device code).
//!
//! nvcc compiles a device-side launch into the device runtime's `cudaGetParameterBufferV2`
//! (a buffer for the child's parameters) and `cudaLaunchDeviceV2` (the launch), which
//! `libcudadevrt` implements with `cnpGetParameterBufferV2` and `cnpLaunchDeviceV2`, calls
//! NVIDIA's driver supplies. The interpreter supplies them: a parameter buffer comes from the
//! process's device heap, and a launch queues the child grid with a copy of its parameters. The
//! children run once their parent's blocks have all run, one after the other in the order they
//! were launched, each with all its descendants before the next (depth first): a grid is
//! complete when all its descendants are, as CUDA defines it, so a grid launched after another
//! on the same stream starts after that one's descendants are done, as stream order requires.
//! CUDA 12's tail launches (`cudaStreamTailLaunch`) run after all of their parent grid's other
//! children, and fire-and-forget ones (`cudaStreamFireAndForget`) as the others. A thread that calls CUDA 11's device-side `cudaDeviceSynchronize` waits
//! for the grids its block launched so far and their descendants: they run then, on the
//! calling thread, while its block waits (as a GPU swaps the block out), each with its own
//! descendants, in the block's launch order; the pending grids of other blocks stay queued.
//! (CUDA 12 removed that call, so no parent of a CUDA 12 kernel waits for its children.)
//!
//! Bounds, as CUDA's: at most [`MAX_PENDING_LAUNCHES`] launches waiting to run or holding a
//! parameter buffer (`cudaLimitDevRuntimePendingLaunchCount`, which a program may raise to
//! [`MAX_PENDING_LAUNCH_LIMIT`]; their parameters at most [`MAX_PENDING_PARAM_BYTES`] on the
//! host), and grids nested at most
//! [`MAX_DEPTH`] deep, with at most [`MAX_PARAM_BYTES`] of parameters; past them the launch
//! fails with CUDA's error and nothing is queued. `cudaDeviceSynchronize` from grids at depth
//! `cudaLimitDevRuntimeSyncDepth` (2 unless the program sets another) or deeper fails with
//! `cudaErrorSyncDepthExceeded`. A launch's descendants all run within its watchdog deadline.

use std::collections::{BTreeMap, HashMap};

use std::sync::Mutex;
use vgpu_proto::cuda::limit;

/// Device launches a launch may have pending unless the program sets another limit (CUDA's
/// default `cudaLimitDevRuntimePendingLaunchCount`).
pub const MAX_PENDING_LAUNCHES: usize = limit::DEFAULT_PENDING_LAUNCH_COUNT as usize;
/// The most a program may set the pending launch limit to: with the grids' bookkeeping (under
/// 100 bytes each beside their parameters) at most about 12 MiB of host memory per launch.
pub const MAX_PENDING_LAUNCH_LIMIT: usize = limit::MAX_PENDING_LAUNCH_COUNT as usize;
/// Parameter bytes a launch's pending grids may hold on the host, whatever the count limit.
pub const MAX_PENDING_PARAM_BYTES: usize = 16 << 20;
/// How deep grids may nest: a kernel at this depth (the host's launch is depth 0) cannot launch
/// (CUDA's hardware limit).
pub const MAX_DEPTH: u32 = limit::MAX_DEPTH;
/// CUDA's default `cudaLimitDevRuntimeSyncDepth`: grids at depth 0 and 1 may wait for their
/// children.
pub const DEFAULT_SYNC_DEPTH: u32 = limit::DEFAULT_SYNC_DEPTH;
/// `cudaStreamTailLaunch`: a grid launched into it runs after its parent grid and all the
/// parent's other work.
pub const STREAM_TAIL_LAUNCH: u64 = 0x3;
/// Device-side streams and events are handles above this (opaque to kernels).
const DEVICE_HANDLE_BASE: u64 = 0x5700_0000_0000;

/// A new device-side stream or event handle: distinct within the process (never 0, which is
/// the NULL stream). Nothing is kept for it: a launch's children run one after the other in
/// launch order, each with its descendants, which every stream and event order allows.
pub(crate) fn new_handle() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    DEVICE_HANDLE_BASE + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
/// Alignment of a parameter buffer.
pub const PARAM_BUFFER_ALIGN: u64 = 64;
/// The most parameter bytes a kernel launched from the device may take (CUDA's 4 KiB), which
/// bounds what pending launches hold on the host to 8 MiB per launch.
pub const MAX_PARAM_BYTES: usize = 4096;

/// The device runtime's error codes (`CNPerror`), which `libcudadevrt` translates into
/// `cudaError_t` (`cnprtTranslateError`).
pub mod cnp {
    /// Success.
    pub const SUCCESS: u32 = 0;
    /// `cudaErrorInvalidValue`.
    pub const INVALID_VALUE: u32 = 1;
    /// `cudaErrorLaunchMaxDepthExceeded`.
    pub const MAX_DEPTH_EXCEEDED: u32 = 5;
    /// `cudaErrorInvalidConfiguration`.
    pub const INVALID_CONFIGURATION: u32 = 7;
    /// `cudaErrorLaunchPendingCountExceeded`.
    pub const PENDING_COUNT_EXCEEDED: u32 = 12;

    /// The `cudaError_t` of a device runtime error, as `libcudadevrt` translates it.
    pub fn to_cuda(e: u32) -> u32 {
        match e {
            SUCCESS => 0,
            INVALID_VALUE => 1,
            MAX_DEPTH_EXCEEDED => 65,
            INVALID_CONFIGURATION => 9,
            PENDING_COUNT_EXCEEDED => 69,
            // cudaErrorUnknown.
            _ => 999,
        }
    }
}

/// The block a grid was launched from: its grid's id and the block's linear index.
pub type Origin = (u64, u64);

/// `cudaErrorSyncDepthExceeded`, which device-side `cudaDeviceSynchronize` returns at a depth
/// past `cudaLimitDevRuntimeSyncDepth`.
pub const CUDA_ERROR_SYNC_DEPTH_EXCEEDED: u32 = 68;

/// A child grid: which kernel, its shape and its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildGrid {
    /// Its grid id (`%gridid`), given when it is launched, which its own children's
    /// [`ChildGrid::origin`] names.
    pub id: u64,
    /// The block that launched it.
    pub origin: Origin,
    /// Launched into `cudaStreamTailLaunch`: it runs after its parent's other children.
    pub tail: bool,
    /// Its kernel's index in the module.
    pub kernel: usize,
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory.
    pub shared: u32,
    /// Its depth (the host's launch is 0).
    pub depth: u32,
    /// Its parameters, copied at the launch.
    pub params: Vec<u8>,
    /// The next block to run (0 until it yields).
    pub next_block: u64,
}

/// The launch a parameter buffer was handed out for, not yet made.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    pub kernel: usize,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared: u32,
    pub depth: u32,
}

/// Where a queued grid is: its origin's grid, whether it is a tail launch (1), its origin's
/// block, then its launch number.
type QueueKey = (u64, u64, u64, u64);

#[derive(Debug, Default)]
struct State {
    buffers: HashMap<u64, Pending>,
    /// Grids waiting to run, by origin (grid, then block) and launch number: a block's
    /// launches in order, a grid's after one another, its tail launches last.
    queue: BTreeMap<QueueKey, ChildGrid>,
    /// The same grids in launch order, tail launches last (the launch's top level).
    order: BTreeMap<(u64, u64), Origin>,
    /// Grids that completed at the launch's top level and whose children run next (depth
    /// first), innermost last.
    done: Vec<u64>,
    /// The next launch number.
    seq: u64,
    /// Parameter bytes the queued grids hold.
    queued_bytes: usize,
    /// The child running at the launch's top level (kept across a yield).
    running: Option<ChildGrid>,
    /// The device runtime's last error (`cudaGetLastError` in device code), a `cudaError_t`.
    last_error: u32,
}

/// A launch's device-side launches: parameter buffers handed out, child grids waiting, and the
/// one running. Kept across the launch's yields (the device keeps it with the launch).
#[derive(Debug)]
pub struct DeviceLaunches {
    state: Mutex<State>,
    /// Launches that may be pending at once.
    limit: usize,
    /// Grids at this depth or deeper may not call `cudaDeviceSynchronize`.
    sync_depth: u32,
}

impl Default for DeviceLaunches {
    fn default() -> Self {
        DeviceLaunches::new()
    }
}

impl DeviceLaunches {
    /// No launches yet; CUDA's default pending limit.
    pub fn new() -> DeviceLaunches {
        DeviceLaunches::with_limit(MAX_PENDING_LAUNCHES)
    }

    /// No launches yet; at most `limit` pending (clamped to 1 ..= [`MAX_PENDING_LAUNCH_LIMIT`]).
    pub fn with_limit(limit: usize) -> DeviceLaunches {
        DeviceLaunches::with_limits(limit, DEFAULT_SYNC_DEPTH)
    }

    /// No launches yet; at most `limit` pending (clamped as [`DeviceLaunches::with_limit`]),
    /// and grids shallower than `sync_depth` (at most [`MAX_DEPTH`]) may wait for their
    /// children.
    pub fn with_limits(limit: usize, sync_depth: u32) -> DeviceLaunches {
        DeviceLaunches {
            state: Mutex::new(State::default()),
            limit: limit.clamp(1, MAX_PENDING_LAUNCH_LIMIT),
            sync_depth: sync_depth.min(MAX_DEPTH),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Launches pending: buffers handed out and grids waiting to run.
    pub fn pending(&self) -> usize {
        let s = self.state();
        s.buffers.len() + s.queue.len()
    }

    /// Whether a grid at `depth` may call `cudaDeviceSynchronize`.
    pub(crate) fn may_synchronize(&self, depth: u32) -> bool {
        depth < self.sync_depth
    }

    /// Records a parameter buffer at `addr` for a launch of `kernel` from a grid at
    /// `depth - 1`; the caller checked [`DeviceLaunches::admit`] first.
    pub(crate) fn hand_out(
        &self,
        addr: u64,
        kernel: usize,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        depth: u32,
    ) {
        let mut s = self.state();
        s.buffers.insert(
            addr,
            Pending {
                kernel,
                grid,
                block,
                shared,
                depth,
            },
        );
    }

    /// Whether a grid at `depth` may launch another: `Err` with the device runtime's error.
    pub(crate) fn admit(&self, depth: u32) -> Result<(), u32> {
        let s = self.state();
        if depth + 1 > MAX_DEPTH {
            return Err(cnp::MAX_DEPTH_EXCEEDED);
        }
        if s.buffers.len() + s.queue.len() >= self.limit {
            return Err(cnp::PENDING_COUNT_EXCEEDED);
        }
        Ok(())
    }

    /// The launch recorded for the buffer at `addr`, taken; `None` when no buffer was handed
    /// out there.
    pub(crate) fn take_buffer(&self, addr: u64) -> Option<Pending> {
        self.state().buffers.remove(&addr)
    }

    /// Queues a child grid; `Err` (the device runtime's error) when the queued grids' parameters
    /// would pass [`MAX_PENDING_PARAM_BYTES`].
    pub(crate) fn queue(&self, child: ChildGrid) -> Result<(), u32> {
        let mut s = self.state();
        let bytes = s.queued_bytes + child.params.len();
        if bytes > MAX_PENDING_PARAM_BYTES {
            return Err(cnp::PENDING_COUNT_EXCEEDED);
        }
        s.queued_bytes = bytes;
        let seq = s.seq;
        s.seq += 1;
        let tail = u64::from(child.tail);
        s.order.insert((tail, seq), child.origin);
        s.queue
            .insert((child.origin.0, tail, child.origin.1, seq), child);
        Ok(())
    }

    /// Takes the queued grid at `key` (if any).
    fn take(s: &mut State, key: Option<QueueKey>) -> Option<ChildGrid> {
        let key = key?;
        let c = s.queue.remove(&key)?;
        s.order.remove(&(key.1, key.3));
        s.queued_bytes -= c.params.len();
        Some(c)
    }

    /// The first queued grid that grid `id`'s blocks launched: block by block in launch order,
    /// tail launches last.
    fn first_of_grid(s: &State, id: u64) -> Option<QueueKey> {
        s.queue
            .range((id, 0, 0, 0)..=(id, 1, u64::MAX, u64::MAX))
            .next()
            .map(|(&k, _)| k)
    }

    /// The child grid to run next at the launch's top level, made the running one: the one
    /// that yielded; else one launched by the innermost grid that completed here and still has
    /// some waiting (depth first); else the first launched of those waiting (the launch's own
    /// children, tail launches last). `None` when none is left.
    pub(crate) fn next_child(&self) -> Option<ChildGrid> {
        let mut s = self.state();
        let c = match s.running.take() {
            Some(c) => c,
            None => loop {
                if let Some(&id) = s.done.last() {
                    match DeviceLaunches::first_of_grid(&s, id) {
                        Some(key) => break DeviceLaunches::take(&mut s, Some(key))?,
                        None => {
                            s.done.pop();
                            continue;
                        }
                    }
                }
                let key = s
                    .order
                    .first_key_value()
                    .map(|(&(t, q), &(g, b))| (g, t, b, q));
                break DeviceLaunches::take(&mut s, key)?;
            },
        };
        s.running = Some(c.clone());
        Some(c)
    }

    /// The first grid block `origin` launched that waits to run, taken (a block's
    /// `cudaDeviceSynchronize` runs them).
    pub(crate) fn take_launched_by_block(&self, origin: Origin) -> Option<ChildGrid> {
        let mut s = self.state();
        let (g, b) = origin;
        let key = s
            .queue
            .range((g, 0, b, 0)..=(g, 0, b, u64::MAX))
            .chain(s.queue.range((g, 1, b, 0)..=(g, 1, b, u64::MAX)))
            .next()
            .map(|(&k, _)| k);
        DeviceLaunches::take(&mut s, key)
    }

    /// A grid the blocks of grid `id` launched that waits to run, taken: each block's in its
    /// launch order, tail launches last (the grid's descendants run before a wait for it ends).
    pub(crate) fn take_launched_by_grid(&self, id: u64) -> Option<ChildGrid> {
        let mut s = self.state();
        let key = DeviceLaunches::first_of_grid(&s, id);
        DeviceLaunches::take(&mut s, key)
    }

    /// The running child stopped at a yield before `next_block`.
    pub(crate) fn child_yielded(&self, next_block: u64) {
        if let Some(c) = self.state().running.as_mut() {
            c.next_block = next_block;
        }
    }

    /// The running child completed: the grids it launched run next.
    pub(crate) fn child_done(&self) {
        let mut s = self.state();
        if let Some(c) = s.running.take() {
            s.done.push(c.id);
        }
    }

    /// The launch ended (completed or failed): what is left is dropped; returns the parameter
    /// buffers still handed out, for their memory to go back to the heap.
    pub(crate) fn finish(&self) -> Vec<u64> {
        let mut s = self.state();
        s.queue.clear();
        s.order.clear();
        s.done.clear();
        s.queued_bytes = 0;
        s.running = None;
        s.buffers.drain().map(|(a, _)| a).collect()
    }

    /// `cudaGetLastError` in device code: the last error, reset.
    pub(crate) fn take_error(&self) -> u32 {
        std::mem::take(&mut self.state().last_error)
    }

    /// `cudaPeekAtLastError` in device code: the last error, kept.
    pub(crate) fn last_error(&self) -> u32 {
        self.state().last_error
    }

    /// Records the device runtime's last error (a `cudaError_t`).
    pub(crate) fn set_error(&self, e: u32) {
        self.state().last_error = e;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn child(kernel: usize, depth: u32) -> ChildGrid {
        from(kernel, depth, (0, 0))
    }

    fn from(kernel: usize, depth: u32, origin: Origin) -> ChildGrid {
        ChildGrid {
            id: kernel as u64 + 100,
            origin,
            tail: false,
            kernel,
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared: 0,
            depth,
            params: Vec::new(),
            next_block: 0,
        }
    }

    #[test]
    fn children_run_in_launch_order_and_a_yielded_one_resumes_first() {
        let d = DeviceLaunches::new();
        d.queue(child(1, 1)).unwrap();
        d.queue(child(2, 1)).unwrap();
        let c = d.next_child().unwrap();
        assert_eq!((c.kernel, c.depth), (1, 1));
        d.child_yielded(7);
        let c = d.next_child().unwrap();
        assert_eq!(
            (c.kernel, c.next_block),
            (1, 7),
            "the yielded child goes on"
        );
        d.child_done();
        assert_eq!(d.next_child().unwrap().kernel, 2);
        d.child_done();
        assert!(d.next_child().is_none());
    }

    #[test]
    fn a_blocks_wait_takes_its_own_launches_in_order_and_a_grids_descendants_after() {
        let d = DeviceLaunches::new();
        d.queue(from(1, 1, (7, 0))).unwrap();
        d.queue(from(2, 1, (7, 1))).unwrap();
        d.queue(from(3, 1, (7, 0))).unwrap();
        d.queue(from(4, 2, (101, 5))).unwrap();
        assert_eq!(d.take_launched_by_block((7, 1)).unwrap().kernel, 2);
        assert!(
            d.take_launched_by_block((7, 1)).is_none(),
            "block 1 launched one"
        );
        assert_eq!(d.take_launched_by_block((7, 0)).unwrap().kernel, 1);
        assert_eq!(d.take_launched_by_grid(101).unwrap().kernel, 4);
        assert!(d.take_launched_by_grid(101).is_none());
        assert_eq!(d.pending(), 1);
        // What no wait took runs at the top level, in launch order.
        assert_eq!(d.next_child().unwrap().kernel, 3);
        d.child_done();
        assert!(d.next_child().is_none());
        assert!(DeviceLaunches::new().may_synchronize(1));
        assert!(!DeviceLaunches::new().may_synchronize(DEFAULT_SYNC_DEPTH));
        assert!(DeviceLaunches::with_limits(1, 100).may_synchronize(MAX_DEPTH - 1));
    }

    #[test]
    fn a_completed_grids_children_run_before_its_later_siblings_and_tail_launches_last() {
        let d = DeviceLaunches::new();
        let tail = |kernel, origin| ChildGrid {
            tail: true,
            ..from(kernel, 1, origin)
        };
        // The launch (grid 7) launches a tail grid, then kernels 1 and 2.
        d.queue(tail(9, (7, 0))).unwrap();
        d.queue(from(1, 1, (7, 0))).unwrap();
        d.queue(from(2, 1, (7, 1))).unwrap();
        let c = d.next_child().unwrap();
        assert_eq!(c.kernel, 1);
        // Kernel 1 (grid 101) launches 3 and a tail grid 8; 3 (grid 103) launches 4.
        d.queue(tail(8, (101, 0))).unwrap();
        d.queue(from(3, 2, (101, 0))).unwrap();
        d.child_done();
        assert_eq!(d.next_child().unwrap().kernel, 3);
        d.queue(from(4, 3, (103, 0))).unwrap();
        d.child_done();
        let order: Vec<usize> = std::iter::from_fn(|| {
            let c = d.next_child()?;
            d.child_done();
            Some(c.kernel)
        })
        .collect();
        assert_eq!(
            order,
            [4, 8, 2, 9],
            "depth first, tail launches after their siblings"
        );
    }

    #[test]
    fn pending_launches_and_depth_are_bounded() {
        let d = DeviceLaunches::new();
        for i in 0..MAX_PENDING_LAUNCHES as u64 {
            assert_eq!(d.admit(0), Ok(()));
            d.hand_out(i * 64, 0, [1; 3], [1; 3], 0, 1);
        }
        assert_eq!(d.admit(0), Err(cnp::PENDING_COUNT_EXCEEDED));
        assert!(d.take_buffer(64).is_some());
        assert!(d.take_buffer(64).is_none(), "a buffer launches once");
        assert_eq!(d.admit(0), Ok(()));
        assert_eq!(d.finish().len(), MAX_PENDING_LAUNCHES - 1);
        assert_eq!(d.admit(MAX_DEPTH - 1), Ok(()));
        assert_eq!(d.admit(MAX_DEPTH), Err(cnp::MAX_DEPTH_EXCEEDED));
    }

    #[test]
    fn a_program_may_raise_the_pending_limit_and_bytes_stay_bounded() {
        let d = DeviceLaunches::with_limit(5000);
        for i in 0..4999u64 {
            d.hand_out(i * 64, 0, [1; 3], [1; 3], 0, 1);
        }
        assert_eq!(d.admit(0), Ok(()));
        d.hand_out(1 << 40, 0, [1; 3], [1; 3], 0, 1);
        assert_eq!(d.admit(0), Err(cnp::PENDING_COUNT_EXCEEDED));
        assert_eq!(DeviceLaunches::with_limit(0).limit, 1);
        assert_eq!(
            DeviceLaunches::with_limit(usize::MAX).limit,
            MAX_PENDING_LAUNCH_LIMIT
        );
        let d = DeviceLaunches::with_limit(MAX_PENDING_LAUNCH_LIMIT);
        let big = |depth| ChildGrid {
            params: vec![0; 4096],
            ..child(0, depth)
        };
        for _ in 0..MAX_PENDING_PARAM_BYTES / 4096 {
            d.queue(big(1)).unwrap();
        }
        assert_eq!(
            d.queue(big(1)),
            Err(cnp::PENDING_COUNT_EXCEEDED),
            "16 MiB of parameters"
        );
        d.next_child().unwrap();
        d.child_done();
        assert_eq!(d.queue(big(1)), Ok(()), "room again once one ran");
    }
}
