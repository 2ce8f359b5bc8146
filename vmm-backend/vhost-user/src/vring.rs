//! Helpers every vhost-user device of vgpud uses on its vring worker threads: the features
//! offered, taking chains off a queue, signalling the guest, the worker exit events and a log
//! limiter for guest-triggered messages.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tracing::warn;
use vgpu_proto::spin::{AdaptiveSpin, Poll};
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_user_backend::{VringRwLock, VringT};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use virtio_queue::{Queue, QueueT};
use vm_memory::{
    Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryLoadGuard,
    GuestMemoryRegion, MemoryRegionAddress,
};
use vmm_sys_util::event::{
    EventConsumer, EventFlag, EventNotifier, new_event_consumer_and_notifier,
};

use crate::GuestMem;

/// Virtio features offered to the driver.
pub const VIRTIO_FEATURES: u64 =
    (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_RING_F_EVENT_IDX) | (1 << VIRTIO_RING_F_INDIRECT_DESC);

/// vhost-user protocol features offered to the frontend.
pub fn protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::CONFIG
        | VhostUserProtocolFeatures::RESET_DEVICE
        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
}

/// A backend's vring-worker exit event. vhost-user-backend turns each consumer
/// it is handed into a raw fd and never closes it; [`ExitEvents::reclaim`]
/// does, once the workers have exited.
#[derive(Debug)]
pub struct ExitEvents {
    exit: (EventConsumer, EventNotifier),
    handed_out: Mutex<Vec<RawFd>>,
}

impl ExitEvents {
    /// A fresh exit event.
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            exit: new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC)?,
            handed_out: Mutex::new(Vec::new()),
        })
    }

    /// A copy for `VhostUserBackend::exit_event`, remembered for [`ExitEvents::reclaim`].
    pub fn hand_out(&self) -> Option<(EventConsumer, EventNotifier)> {
        let consumer = self.exit.0.try_clone().ok()?;
        let notifier = self.exit.1.try_clone().ok()?;
        self.handed_out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(consumer.as_raw_fd());
        Some((consumer, notifier))
    }

    /// Closes the copies the library leaked. Call only after the daemon is
    /// dropped, when its vring workers have exited.
    ///
    /// A descriptor is closed only if it still refers to our own eventfd (same `eventfd-id` in
    /// `/proc/self/fdinfo`), so a library that closes it itself cannot make us close someone
    /// else's descriptor.
    pub fn reclaim(&self) {
        let Some(ours) = eventfd_id(self.exit.0.as_raw_fd()) else {
            return;
        };
        let fds = std::mem::take(&mut *self.handed_out.lock().unwrap_or_else(|p| p.into_inner()));
        for fd in fds {
            if fd != self.exit.0.as_raw_fd() && eventfd_id(fd) == Some(ours) {
                // SAFETY: `fd` is a duplicate of our exit eventfd (checked just above) that the
                // library converted into a raw fd and abandoned; nothing else owns it.
                drop(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
}

/// The bytes `[offset, offset + size)` of a read-only config space (empty,
/// with a warning, when the range is outside it).
pub fn read_config(space: &[u8], offset: u32, size: u32) -> Vec<u8> {
    let start = offset as usize;
    match start.checked_add(size as usize) {
        Some(end) if end <= space.len() => space[start..end].to_vec(),
        _ => {
            warn!(offset, size, "config space read out of range");
            Vec::new()
        }
    }
}

/// The kernel's id of the eventfd behind `fd` (`eventfd-id` in fdinfo), if `fd` is an eventfd.
pub fn eventfd_id(fd: RawFd) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("eventfd-id:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Rate limit for guest-triggered error logs.
const LOG_WINDOW: Duration = Duration::from_secs(1);
const LOG_BURST: u32 = 10;

/// Keeps a hostile guest from flooding the log.
#[derive(Debug)]
pub struct LogLimiter {
    window_start: Instant,
    in_window: u32,
    suppressed: u64,
}

impl Default for LogLimiter {
    fn default() -> Self {
        Self::new()
    }
}

impl LogLimiter {
    pub fn new() -> Self {
        LogLimiter {
            window_start: Instant::now(),
            in_window: 0,
            suppressed: 0,
        }
    }

    /// Whether to log now; also reports how many messages were suppressed before.
    pub fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        if now.duration_since(self.window_start) >= LOG_WINDOW {
            self.window_start = now;
            self.in_window = 0;
        }
        if self.in_window < LOG_BURST {
            self.in_window += 1;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

/// Returns chain `head` to the guest with `len` bytes written, as `VringRwLock::add_used` does,
/// but in `mem`, the guest memory the caller already holds, instead of loading the vring's own
/// copy of the map again for every chain.
pub fn add_used(
    vring: &VringRwLock,
    mem: &GuestMem,
    head: u16,
    len: u32,
) -> Result<(), virtio_queue::Error> {
    vring.get_mut().get_queue_mut().add_used(mem, head, len)
}

/// Chains returned to the guest in batches, for a queue that returns many small ones (the vsock
/// rx queue's 4 KiB buffers): each used entry is written straight into the region holding the
/// used ring, the used index is published once per batch, and whether the guest asked for an
/// interrupt (`used_event`, `VIRTIO_RING_F_EVENT_IDX`) is decided once for all the entries
/// published since the last decision, as Linux's `virtqueue_kick_prepare` does for its side.
///
/// virtio-queue's `add_used` costs a generic guest-memory write for the entry and a release
/// store of the index per chain (about 490 instructions per 4 KiB rx packet, a fifth of the
/// vsock device thread's work for one: docs/performance.md).
///
/// A queue whose chains go through a batch must return all of them through one while it lives:
/// virtio-queue's `add_used` and `needs_notification` keep a count of their own.
#[derive(Debug)]
pub struct UsedBatch {
    /// The queue's used ring, size and next used index when the batch began: if the frontend
    /// moves or resets the queue meanwhile, the entries are not published.
    used_ring: u64,
    size: u16,
    base: u16,
    /// Entries written past `base` and not published yet.
    pending: u16,
    /// The used index when whether to interrupt was last decided.
    decided: u16,
}

/// The used ring's `idx` field.
const USED_IDX_OFFSET: u64 = 2;

impl UsedBatch {
    /// A batch for `vring`'s queue, from its next used entry.
    pub fn new(vring: &VringRwLock) -> Self {
        Self::of(vring.get_ref().get_queue())
    }

    /// An empty batch for `q` as it stands.
    fn of(q: &Queue) -> Self {
        UsedBatch {
            used_ring: q.used_ring(),
            size: q.size(),
            base: q.next_used(),
            pending: 0,
            decided: q.next_used(),
        }
    }

    /// Writes the used entry returning chain `head` with `len` bytes written; it reaches the
    /// guest at the next [`UsedBatch::publish`] or [`UsedBatch::signal`].
    pub fn push(&mut self, mem: &GuestMem, head: u16, len: u32) -> Result<(), virtio_queue::Error> {
        if head >= self.size {
            return Err(virtio_queue::Error::InvalidDescriptorIndex);
        }
        if self.full() {
            // Only a guest that made chains available again before they were returned gets
            // here (a device publishes at least once per ring's worth).
            return Err(virtio_queue::Error::InvalidAvailRingIndex);
        }
        let slot = self.base.wrapping_add(self.pending) % self.size;
        let at = self
            .used_ring
            .checked_add(USED_RING_OFFSET + USED_ENTRY_LEN * u64::from(slot))
            .ok_or(virtio_queue::Error::AddressOverflow)?;
        let mut entry = [0u8; USED_ENTRY_LEN as usize];
        entry[..4].copy_from_slice(&u32::from(head).to_le_bytes());
        entry[4..].copy_from_slice(&len.to_le_bytes());
        // The entry is ordered before the guest can read it by the release store of the index in
        // `publish`; a plain write is enough.
        crate::write_in_one_region(mem, at, &entry)
            .unwrap_or_else(|| mem.write_slice(&entry, GuestAddress(at)))
            .map_err(virtio_queue::Error::GuestMemory)?;
        self.pending += 1;
        Ok(())
    }

    /// Whether a ring's worth of entries awaits publishing: [`UsedBatch::push`] refuses more.
    pub fn full(&self) -> bool {
        self.pending >= self.size
    }

    /// Entries written and not published yet.
    pub fn pending(&self) -> usize {
        usize::from(self.pending)
    }

    /// Makes the entries written so far visible to the guest (one release store of the used
    /// index). Returns the used index now; the entries are dropped, not published, when the
    /// frontend moved or reset the queue since the batch began.
    pub fn publish(
        &mut self,
        vring: &VringRwLock,
        mem: &GuestMem,
    ) -> Result<u16, virtio_queue::Error> {
        let mut state = vring.get_mut();
        let q = state.get_queue_mut();
        if (q.used_ring(), q.size(), q.next_used()) != (self.used_ring, self.size, self.base) {
            *self = Self::of(q);
            return Ok(self.base);
        }
        if self.pending == 0 {
            return Ok(self.base);
        }
        let next = self.base.wrapping_add(self.pending);
        let at = self
            .used_ring
            .checked_add(USED_IDX_OFFSET)
            .ok_or(virtio_queue::Error::AddressOverflow)?;
        mem.store(next.to_le(), GuestAddress(at), Ordering::Release)
            .map_err(virtio_queue::Error::GuestMemory)?;
        q.set_next_used(next);
        self.base = next;
        self.pending = 0;
        Ok(next)
    }

    /// Publishes the entries written so far and interrupts the guest if it asked to be told of
    /// any of the entries published since the last decision (always, without event indices).
    pub fn signal(&mut self, vring: &VringRwLock, mem: &GuestMem, name: &str) {
        let next = match self.publish(vring, mem) {
            Ok(next) => next,
            Err(e) => {
                warn!(queue = name, error = %e, "cannot return used chains to the guest");
                return;
            }
        };
        let old = std::mem::replace(&mut self.decided, next);
        if next == old {
            return;
        }
        // The index store above must be visible before `used_event` is read (the guest writes
        // `used_event`, then reads the index).
        std::sync::atomic::fence(Ordering::SeqCst);
        let needed = {
            let state = vring.get_ref();
            let q = state.get_queue();
            !q.event_idx_enabled()
                || used_event(q, mem).is_none_or(|event| {
                    next.wrapping_sub(event).wrapping_sub(1) < next.wrapping_sub(old)
                })
        };
        if needed && let Err(e) = vring.signal_used_queue() {
            warn!(queue = name, error = %e, "cannot signal the guest");
        }
    }
}

/// The driver's `used_event` field of `queue` (after the avail ring's entries), `None` when it
/// cannot be read.
fn used_event(queue: &Queue, mem: &GuestMem) -> Option<u16> {
    let at = queue
        .avail_ring()
        .checked_add(AVAIL_RING_OFFSET + AVAIL_ENTRY_LEN * u64::from(queue.size()))?;
    load_le_u16(mem, &mut None, at).ok()
}

/// An available chain as a device that reads its descriptors itself sees it: the head index and
/// the descriptor table it indexes. Nothing here was read from the table yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainHead {
    /// The head descriptor's index (what the used ring returns).
    pub index: u16,
    /// Guest-physical address of the queue's descriptor table.
    pub table: GuestAddress,
    /// Entries of that table (the queue size).
    pub queue_size: u16,
}

/// Takes the next available chain and returns where its descriptors are, for the device to walk
/// them itself ([`crate::Descriptors`]); an error means the available ring itself is corrupt
/// (for example an index more than a queue size ahead).
pub fn next_head(
    vring: &VringRwLock,
    mem: &GuestMemoryLoadGuard<GuestMem>,
) -> Result<Option<ChainHead>, virtio_queue::Error> {
    take_head(vring.get_mut().get_queue_mut(), mem)
}

/// Takes the next available chain of `queue` ([`next_head`] on a bare queue).
///
/// It does what virtio-queue's `queue.iter(mem)?.next()` does (a queue that is not ready, an
/// avail index that cannot be read or is more than a queue size ahead is an error; a ring entry
/// that cannot be read is no chain, and the queue does not move past it), reading the avail
/// index and the ring entry from the region that holds the ring instead of through vm-memory's
/// generic path, which looked the region up and built a slice for each.
pub fn take_head(
    queue: &mut Queue,
    mem: &GuestMem,
) -> Result<Option<ChainHead>, virtio_queue::Error> {
    let avail = queue.avail_ring();
    if !queue.ready() || avail == 0 {
        return Err(virtio_queue::Error::QueueNotReady);
    }
    let mut region = None;
    let idx = avail_idx(queue, mem, &mut region)?;
    let (next, size) = (queue.next_avail(), queue.size());
    if idx.wrapping_sub(next) > size {
        return Err(virtio_queue::Error::InvalidAvailRingIndex);
    }
    if idx == next {
        return Ok(None);
    }
    let Some(slot) = next.checked_rem(size) else {
        return Ok(None);
    };
    let entry = avail.checked_add(AVAIL_RING_OFFSET + AVAIL_ENTRY_LEN * u64::from(slot));
    let Some(Ok(index)) = entry.map(|at| load_le_u16(mem, &mut region, at)) else {
        return Ok(None);
    };
    queue.set_next_avail(next.wrapping_add(1));
    Ok(Some(ChainHead {
        index,
        table: GuestAddress(queue.desc_table()),
        queue_size: size,
    }))
}

/// Offset of the avail ring's `idx` field.
const AVAIL_IDX_OFFSET: u64 = 2;
/// Offset of the avail ring's first entry.
const AVAIL_RING_OFFSET: u64 = 4;
/// Bytes of one avail ring entry.
const AVAIL_ENTRY_LEN: u64 = 2;

/// The avail ring's `idx` field of `queue`, loaded with acquire ordering ([`load_le_u16`]).
fn avail_idx<'m>(
    queue: &Queue,
    mem: &'m GuestMem,
    region: &mut Option<&'m crate::GuestRegion>,
) -> Result<u16, virtio_queue::Error> {
    let at = queue
        .avail_ring()
        .checked_add(AVAIL_IDX_OFFSET)
        .ok_or(virtio_queue::Error::AddressOverflow)?;
    load_le_u16(mem, region, at).map_err(virtio_queue::Error::GuestMemory)
}

/// Loads the little-endian `u16` at guest address `addr` with acquire ordering: from `region`
/// when it holds it ([`crate::region_holding`]), else through vm-memory's generic path.
fn load_le_u16<'m>(
    mem: &'m GuestMem,
    region: &mut Option<&'m crate::GuestRegion>,
    addr: u64,
) -> Result<u16, vm_memory::GuestMemoryError> {
    let loaded = match crate::region_holding(mem, region, addr, std::mem::size_of::<u16>()) {
        Some(r) => r.load::<u16>(
            MemoryRegionAddress(addr - r.start_addr().0),
            Ordering::Acquire,
        ),
        None => mem.load::<u16>(GuestAddress(addr), Ordering::Acquire),
    };
    loaded.map(u16::from_le)
}

/// Whether the guest made chains available that the device has not taken yet (reads the
/// avail index only: cheap enough to poll).
pub fn has_available(vring: &VringRwLock, mem: &GuestMem) -> bool {
    let state = vring.get_ref();
    let q = state.get_queue();
    q.ready() && avail_idx(q, mem, &mut None).is_ok_and(|idx| idx != q.next_avail())
}

/// Watches `rings` for chains the guest makes available, for up to `spin`'s budget (a device
/// thread that just answered the guest, which often sends its next request within
/// microseconds); records the outcome in `spin` and returns whether one came.
pub fn watch_rings(
    spin: &Mutex<AdaptiveSpin>,
    mem: &GuestMemoryAtomic<GuestMem>,
    rings: &[&VringRwLock],
) -> bool {
    let lock = || spin.lock().unwrap_or_else(|p| p.into_inner());
    let budget = lock().budget();
    if budget.is_zero() {
        return false;
    }
    let guard = mem.memory();
    let mut poll = Poll::new(budget);
    let mut caught = false;
    while poll.again() {
        if rings.iter().any(|r| has_available(r, &guard)) {
            caught = true;
            break;
        }
    }
    lock().record(caught);
    caught
}

/// Offset of the used ring's first entry; `avail_event` follows the entries.
const USED_RING_OFFSET: u64 = 4;
/// Bytes of one used ring entry.
const USED_ENTRY_LEN: u64 = 8;

/// Where a queue stands as the device sees it, for logs: the next chain it takes, the guest's
/// avail index, the `avail_event` it last wrote (where it asked for the next kick, with
/// `VIRTIO_RING_F_EVENT_IDX`), and the next used entry it fills.
pub fn describe_ring(vring: &VringRwLock, mem: &GuestMem) -> String {
    let state = vring.get_ref();
    let q = state.get_queue();
    let avail = avail_idx(q, mem, &mut None).map_or_else(|e| e.to_string(), |i| i.to_string());
    let event = q
        .used_ring()
        .checked_add(USED_RING_OFFSET + USED_ENTRY_LEN * u64::from(q.size()))
        .map(|at| load_le_u16(mem, &mut None, at))
        .map_or_else(
            || "unaddressable".into(),
            |r| r.map_or_else(|e| e.to_string(), |v| v.to_string()),
        );
    format!(
        "next avail {}, avail idx {avail}, avail_event {event}, next used {}",
        q.next_avail(),
        q.next_used()
    )
}

/// Whether `fd` holds a notification nobody has read yet (an eventfd with a count, a readable
/// stream): a poll that does not wait.
pub fn fd_readable(fd: RawFd) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` is a valid pollfd; nfds is 1 and the timeout zero, so the call only reads
    // the descriptor's state (an fd that is not open reports POLLNVAL, not POLLIN).
    let ret = unsafe { libc::poll(&mut pfd, 1, 0) };
    ret > 0 && pfd.revents & libc::POLLIN != 0
}

/// Whether the guest's kick of `vring` waits unread: the vring worker reads a kick just before
/// it hands the queue's event to the backend, so one seen here is still on its way.
pub fn kick_pending(vring: &VringRwLock) -> bool {
    vring
        .get_ref()
        .get_kick()
        .as_ref()
        .is_some_and(|k| fd_readable(k.as_raw_fd()))
}

/// What a queue's drain loop does after a round, once notifications are on again
/// ([`rearm`]).
#[derive(Debug)]
pub enum Rearm {
    /// Chains were published meanwhile: take them now (the guest may not kick for them).
    Again,
    /// Nothing more: the next kick brings the next chain.
    Done,
    /// Twice in a row a round found no chain although the ring claims some: an entry that
    /// cannot be read. Looping would spin; wait for the next notification.
    Broken,
    /// Notifications could not be turned back on.
    Failed(virtio_queue::Error),
}

/// Turns kicks back on after a drain round that took chains or not (`popped`) and tells the
/// loop what to do. With `VIRTIO_RING_F_EVENT_IDX` the device writes `avail_event` and reads the
/// avail index again: a chain published in between may come without a kick, so it is taken at
/// once; only a second empty round in a row (`rechecked`, kept by the caller) calls the ring
/// broken — one empty round followed by more chains is that race, not a broken ring.
pub fn rearm(vring: &VringRwLock, popped: bool, rechecked: &mut bool) -> Rearm {
    match vring.enable_notification() {
        Ok(true) if popped || !*rechecked => {
            *rechecked = !popped;
            Rearm::Again
        }
        Ok(true) => Rearm::Broken,
        Ok(false) => Rearm::Done,
        Err(e) => Rearm::Failed(e),
    }
}

/// Whether a vring may be used: started by the frontend and enabled.
pub fn vring_ready(vring: &VringRwLock) -> bool {
    let state = vring.get_ref();
    state.get_queue().ready() && state.is_enabled()
}

/// Interrupts the guest for `vring` if it asked to be told of the chains returned since the last
/// decision (virtio-queue's `add_used` counts them).
pub fn signal(vring: &VringRwLock, name: &str) {
    let needed = match vring.needs_notification() {
        Ok(n) => n,
        Err(e) => {
            warn!(queue = name, error = %e, "cannot check notification suppression");
            true
        }
    };
    if needed && let Err(e) = vring.signal_used_queue() {
        warn!(queue = name, error = %e, "cannot signal the guest");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the batch tests' queue lives.
    const DESC: u64 = 0x1000;
    const AVAIL: u64 = 0x2000;
    const USED: u64 = 0x3000;
    const SIZE: u16 = 8;

    /// A ready queue of [`SIZE`] entries in fresh guest memory, with event indices as asked, and
    /// the eventfd its interrupts go to.
    fn batch_rig(event_idx: bool) -> (GuestMem, VringRwLock, vmm_sys_util::eventfd::EventFd) {
        let mem = GuestMem::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let vring = VringRwLock::new(GuestMemoryAtomic::new(mem.clone()), SIZE).unwrap();
        vring.set_queue_size(SIZE);
        vring.set_queue_info(DESC, AVAIL, USED).unwrap();
        vring.set_queue_event_idx(event_idx);
        vring.set_queue_ready(true);
        let call =
            vmm_sys_util::eventfd::EventFd::new(vmm_sys_util::eventfd::EFD_NONBLOCK).unwrap();
        // SAFETY: `call` owns this open eventfd and outlives the borrow, which is only duplicated.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(call.as_raw_fd()) };
        vring.set_call(Some(std::fs::File::from(fd.try_clone_to_owned().unwrap())));
        (mem, vring, call)
    }

    fn interrupts(call: &vmm_sys_util::eventfd::EventFd) -> u64 {
        call.read().unwrap_or(0)
    }

    fn used_idx(mem: &GuestMem) -> u16 {
        mem.read_obj::<u16>(GuestAddress(USED + USED_IDX_OFFSET))
            .unwrap()
    }

    fn used_entry(mem: &GuestMem, slot: u64) -> (u32, u32) {
        let at = USED + USED_RING_OFFSET + USED_ENTRY_LEN * slot;
        (
            mem.read_obj(GuestAddress(at)).unwrap(),
            mem.read_obj(GuestAddress(at + 4)).unwrap(),
        )
    }

    #[test]
    fn batched_entries_reach_the_guest_when_published() {
        let (mem, vring, call) = batch_rig(false);
        let mut batch = UsedBatch::new(&vring);
        for (head, len) in [(5, 10), (6, 20), (7, 30)] {
            batch.push(&mem, head, len).unwrap();
        }
        assert_eq!(used_idx(&mem), 0, "nothing is visible before publishing");
        assert_eq!(batch.publish(&vring, &mem).unwrap(), 3);
        assert_eq!(used_idx(&mem), 3);
        assert_eq!(vring.get_ref().get_queue().next_used(), 3);
        assert_eq!(
            [
                used_entry(&mem, 0),
                used_entry(&mem, 1),
                used_entry(&mem, 2)
            ],
            [(5, 10), (6, 20), (7, 30)]
        );
        // Without event indices every signal with new entries interrupts, and only those.
        batch.signal(&vring, &mem, "test");
        assert_eq!(interrupts(&call), 1);
        batch.signal(&vring, &mem, "test");
        assert_eq!(interrupts(&call), 0);
        // The ring wraps.
        for head in 0..SIZE {
            batch.push(&mem, head, 1).unwrap();
        }
        assert!(batch.full());
        assert!(
            batch.push(&mem, 0, 1).is_err(),
            "more than a ring's worth unpublished"
        );
        assert!(
            batch.push(&mem, SIZE, 1).is_err(),
            "a head outside the table"
        );
        batch.signal(&vring, &mem, "test");
        assert_eq!(used_idx(&mem), 3 + SIZE);
        assert_eq!(used_entry(&mem, 2), (SIZE as u32 - 1, 1));
        assert_eq!(interrupts(&call), 1);
    }

    #[test]
    fn batches_interrupt_only_where_the_guest_asked() {
        let (mem, vring, call) = batch_rig(true);
        let used_event = AVAIL + AVAIL_RING_OFFSET + AVAIL_ENTRY_LEN * u64::from(SIZE);
        // The guest wants to hear once the entry at index 4 is used (used index past 4).
        mem.write_obj(4u16, GuestAddress(used_event)).unwrap();
        let mut batch = UsedBatch::new(&vring);
        for head in 0..3 {
            batch.push(&mem, head, 1).unwrap();
        }
        batch.signal(&vring, &mem, "test");
        assert_eq!((used_idx(&mem), interrupts(&call)), (3, 0));
        for head in 3..5 {
            batch.push(&mem, head, 1).unwrap();
        }
        batch.signal(&vring, &mem, "test");
        assert_eq!(
            (used_idx(&mem), interrupts(&call)),
            (5, 1),
            "index 4 was in this batch"
        );
        batch.push(&mem, 5, 1).unwrap();
        batch.signal(&vring, &mem, "test");
        assert_eq!(interrupts(&call), 0, "already told past 4");
    }

    #[test]
    fn a_batch_of_a_queue_the_frontend_reset_is_dropped() {
        let (mem, vring, call) = batch_rig(false);
        let mut batch = UsedBatch::new(&vring);
        batch.push(&mem, 1, 1).unwrap();
        // The frontend moves the used ring (a driver reset) before the batch is published.
        vring.set_queue_info(DESC, AVAIL, USED + 0x800).unwrap();
        assert_eq!(batch.publish(&vring, &mem).unwrap(), 0);
        assert_eq!(used_idx(&mem), 0);
        assert_eq!(vring.get_ref().get_queue().next_used(), 0);
        batch.signal(&vring, &mem, "test");
        assert_eq!(interrupts(&call), 0);
        // The batch now follows the queue where it is.
        batch.push(&mem, 2, 7).unwrap();
        batch.signal(&vring, &mem, "test");
        let moved: u16 = mem
            .read_obj(GuestAddress(USED + 0x800 + USED_IDX_OFFSET))
            .unwrap();
        assert_eq!((moved, interrupts(&call)), (1, 1));
    }

    #[test]
    fn abandoned_exit_fds_are_reclaimed_but_foreign_fds_are_not() {
        use std::os::fd::IntoRawFd;
        let exit = ExitEvents::new().unwrap();
        // What vhost-user-backend does with the consumer.
        let (consumer, _notifier) = exit.hand_out().unwrap();
        let fd = consumer.into_raw_fd();
        assert!(eventfd_id(fd).is_some());
        // A number the library closed and that now belongs to an unrelated eventfd.
        let stranger = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        exit.handed_out.lock().unwrap().push(stranger.as_raw_fd());
        exit.reclaim();
        assert!(eventfd_id(fd).is_none(), "abandoned duplicate closed");
        assert!(
            eventfd_id(stranger.as_raw_fd()).is_some(),
            "unrelated eventfd untouched"
        );
    }

    /// `take_head` takes what virtio-queue's avail iterator takes, fails where it fails and
    /// leaves the queue where it leaves it: random avail indices (behind, equal, ahead, too far
    /// ahead), positions, ring entries, and avail rings partly or wholly outside guest memory.
    #[test]
    fn chains_are_taken_as_virtio_queue_takes_them() {
        use virtio_queue::QueueOwnedT;
        use virtio_queue::mock::MockSplitQueue;
        const MEM: u64 = 0x10_0000;
        let mem = GuestMem::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut pick = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let (mut taken, mut refused) = (0, 0);
        for trial in 0..4000 {
            let size = [1u16, 2, 16, 256][pick(4) as usize];
            let mock = MockSplitQueue::create(&mem, GuestAddress(0x1000), size);
            for i in 0..size {
                let entry = pick(1 << 16) as u16;
                mock.avail()
                    .ring()
                    .ref_at(usize::from(i))
                    .unwrap()
                    .store(entry);
            }
            let next = pick(1 << 16) as u16;
            let idx = match pick(4) {
                0 => next,
                1 => next.wrapping_add(pick(u64::from(size) + 1) as u16),
                2 => next.wrapping_sub(1 + pick(4) as u16),
                _ => pick(1 << 16) as u16,
            };
            mock.avail().idx().store(idx);
            let avail = match pick(10) {
                // The ring's index readable, its entries past the end of memory.
                0 => Some(MEM - 4),
                // None of it in memory.
                1 => Some(MEM + 0x1000),
                // Its index past the end of the address space.
                2 => Some(u64::MAX - 1),
                _ => None,
            };
            let queue_of = || {
                let mut q: Queue = mock.create_queue().unwrap();
                q.set_next_avail(next);
                if let Some(a) = avail {
                    q.set_avail_ring_address(Some(a as u32), Some((a >> 32) as u32));
                }
                q
            };
            let (mut queue, mut theirs_q) = (queue_of(), queue_of());
            let theirs = theirs_q
                .iter(&mem)
                .map(|mut it| it.next().map(|c| c.head_index()));
            let ours = take_head(&mut queue, &mem).map(|h| {
                h.map(|h| {
                    assert_eq!(h.table, GuestAddress(queue.desc_table()));
                    assert_eq!(h.queue_size, size);
                    h.index
                })
            });
            assert_eq!(format!("{ours:?}"), format!("{theirs:?}"), "trial {trial}");
            assert_eq!(queue.next_avail(), theirs_q.next_avail(), "trial {trial}");
            match ours {
                Ok(Some(_)) => taken += 1,
                Err(_) => refused += 1,
                Ok(None) => {}
            }
        }
        // The states were varied enough to take chains and to refuse rings.
        assert!(
            taken > 500 && refused > 500,
            "{taken} taken, {refused} refused"
        );
    }

    #[test]
    fn config_reads_are_bounds_checked() {
        let space = [1u8, 2, 3, 4];
        assert_eq!(read_config(&space, 1, 2), vec![2, 3]);
        assert!(read_config(&space, 2, 4).is_empty());
        assert!(read_config(&space, u32::MAX, 2).is_empty());
    }
}
