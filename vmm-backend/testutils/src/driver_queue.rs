//! The driver side of one split virtqueue in shared guest memory, as a guest kernel drives it:
//! descriptors, the avail ring with Linux's kick rule, the used ring and `used_event`. Shared by
//! the in-process test frontends of the vsock device ([`crate::vsock`]) and the virtio-vgpu
//! device ([`crate::vgpu`]). Not part of the product.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{Ordering, fence};

use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_USED_F_NO_NOTIFY};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use vgpu_vhost_user::GuestMem;

/// Guest page size (the queue structures are page-aligned).
const PAGE: u64 = 4096;

fn align(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// Driver side of one split virtqueue.
#[derive(Debug)]
pub(crate) struct DriverQueue {
    size: u16,
    /// Guest-physical address of the descriptor table.
    pub(crate) desc: u64,
    /// Guest-physical address of the avail ring.
    pub(crate) avail: u64,
    /// Guest-physical address of the used ring.
    pub(crate) used: u64,
    free: Vec<u16>,
    /// Per head: the descriptors of the chain and the caller's token.
    chains: HashMap<u16, (Vec<u16>, u64)>,
    /// Per head: times it was placed on the avail ring again while the device had it
    /// ([`DriverQueue::repost`]); its descriptors are freed when the last one comes back.
    reposts: HashMap<u16, u64>,
    avail_idx: u16,
    published: u16,
    last_used: u16,
    /// `VIRTIO_RING_F_EVENT_IDX` is in use.
    pub(crate) event_idx: bool,
    /// The device's kick eventfd.
    pub(crate) kick: EventFd,
    /// Never kick: a guest that publishes chains without notifying the device.
    pub(crate) mute: bool,
    /// The device's interrupt eventfd.
    pub(crate) call: EventFd,
}

impl DriverQueue {
    /// A queue of `size` entries whose structures start at guest-physical `base`.
    pub(crate) fn new(base: u64, size: u16, event_idx: bool) -> io::Result<Self> {
        let n = u64::from(size);
        let avail = base + 16 * n;
        Ok(DriverQueue {
            size,
            desc: base,
            avail,
            used: align(avail + 6 + 2 * n, 4),
            free: (0..size).rev().collect(),
            chains: HashMap::new(),
            reposts: HashMap::new(),
            avail_idx: 0,
            published: 0,
            last_used: 0,
            event_idx,
            kick: EventFd::new(EFD_NONBLOCK)?,
            mute: false,
            call: EventFd::new(EFD_NONBLOCK)?,
        })
    }

    /// Bytes of guest memory the queue structures need.
    pub(crate) fn footprint(size: u16) -> u64 {
        let n = u64::from(size);
        align(align(16 * n + 6 + 2 * n, 4) + 6 + 8 * n, PAGE)
    }

    fn used_event_addr(&self) -> GuestAddress {
        GuestAddress(self.avail + 4 + 2 * u64::from(self.size))
    }

    fn avail_event_addr(&self) -> GuestAddress {
        GuestAddress(self.used + 4 + 8 * u64::from(self.size))
    }

    /// The 16 bytes of descriptor `(addr, len, flags, next)`.
    pub(crate) fn encode_desc(d: (u64, u32, u16, u16)) -> [u8; 16] {
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&d.0.to_le_bytes());
        raw[8..12].copy_from_slice(&d.1.to_le_bytes());
        raw[12..14].copy_from_slice(&d.2.to_le_bytes());
        raw[14..16].copy_from_slice(&d.3.to_le_bytes());
        raw
    }

    /// Writes one descriptor `(addr, len, flags, next)` at guest-physical `addr`.
    pub(crate) fn write_desc(mem: &GuestMem, addr: u64, d: (u64, u32, u16, u16)) {
        let _ = mem.write_slice(&Self::encode_desc(d), GuestAddress(addr));
    }

    /// Takes `n` free descriptor indexes; `None` when fewer are free.
    pub(crate) fn take(&mut self, n: usize) -> Option<Vec<u16>> {
        if n == 0 || self.free.len() < n {
            return None;
        }
        Some((0..n).filter_map(|_| self.free.pop()).collect())
    }

    /// Writes entry `id` of the descriptor table.
    pub(crate) fn write_table_entry(&self, mem: &GuestMem, id: u16, d: (u64, u32, u16, u16)) {
        Self::write_desc(mem, self.desc + 16 * u64::from(id), d);
    }

    /// Places the chain `ids` (written already, `ids[0]` its head) on the avail ring, not yet
    /// visible to the device ([`DriverQueue::publish`]); `token` comes back from
    /// [`DriverQueue::pop_used`]. Returns the head.
    pub(crate) fn push(&mut self, mem: &GuestMem, ids: Vec<u16>, token: u64) -> u16 {
        let head = ids[0];
        self.chains.insert(head, (ids, token));
        let slot = u64::from(self.avail_idx % self.size);
        let _ = mem.write_obj(head.to_le(), GuestAddress(self.avail + 4 + 2 * slot));
        self.avail_idx = self.avail_idx.wrapping_add(1);
        head
    }

    /// Adds a chain of `(addr, len, flags)` descriptors linked in order (not yet visible: see
    /// [`DriverQueue::publish`]); false when out of descriptors.
    pub(crate) fn add(&mut self, mem: &GuestMem, descs: &[(u64, u32, u16)], token: u64) -> bool {
        let Some(ids) = self.take(descs.len()) else {
            return false;
        };
        for (i, &(addr, len, flags)) in descs.iter().enumerate() {
            let (flags, next) = match ids.get(i + 1) {
                Some(&next) => (flags | VRING_DESC_F_NEXT as u16, next),
                None => (flags, 0),
            };
            self.write_table_entry(mem, ids[i], (addr, len, flags, next));
        }
        self.push(mem, ids, token);
        true
    }

    /// Places the chain of `token` (still with the device) on the avail ring again, at most
    /// `max` times and only as far as the ring allows: no more than `size` entries past the
    /// device's `avail_event` (where it last said it had read to, at or behind where it is), so
    /// the ring never claims more entries than it holds. A hostile driver: Linux never hands the
    /// device a chain it has not got back. Not yet visible ([`DriverQueue::publish`]). Returns
    /// how many it placed. Needs `VIRTIO_RING_F_EVENT_IDX` (without it, places none).
    pub(crate) fn repost(&mut self, mem: &GuestMem, token: u64, max: usize) -> usize {
        if !self.event_idx {
            return 0;
        }
        let Some(head) = self
            .chains
            .iter()
            .find_map(|(h, (_, t))| (*t == token).then_some(*h))
        else {
            return 0;
        };
        let read_to = u16::from_le(
            mem.load::<u16>(self.avail_event_addr(), Ordering::Acquire)
                .unwrap_or(0),
        );
        let ahead = usize::from(self.avail_idx.wrapping_sub(read_to));
        let n = max.min(usize::from(self.size).saturating_sub(ahead));
        for _ in 0..n {
            let slot = u64::from(self.avail_idx % self.size);
            let _ = mem.write_obj(head.to_le(), GuestAddress(self.avail + 4 + 2 * slot));
            self.avail_idx = self.avail_idx.wrapping_add(1);
        }
        *self.reposts.entry(head).or_default() += n as u64;
        n
    }

    /// Makes added chains visible to the device and kicks it as Linux does: with EVENT_IDX only
    /// when the device asked for it (its `avail_event` lies between the old and the new index),
    /// else unless it set `NO_NOTIFY`.
    pub(crate) fn publish(&mut self, mem: &GuestMem) {
        if self.published == self.avail_idx {
            return;
        }
        let old = self.published;
        let new = self.avail_idx;
        fence(Ordering::SeqCst);
        let _ = mem.store(new.to_le(), GuestAddress(self.avail + 2), Ordering::Release);
        self.published = new;
        fence(Ordering::SeqCst);
        let kick = if self.event_idx {
            let event = u16::from_le(
                mem.load::<u16>(self.avail_event_addr(), Ordering::Acquire)
                    .unwrap_or(0),
            );
            new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
        } else {
            let flags = u16::from_le(
                mem.load::<u16>(GuestAddress(self.used), Ordering::Acquire)
                    .unwrap_or(0),
            );
            flags & VRING_USED_F_NO_NOTIFY as u16 == 0
        };
        if kick && !self.mute {
            let _ = self.kick.write(1);
        }
    }

    fn used_idx(&self, mem: &GuestMem) -> u16 {
        u16::from_le(
            mem.load::<u16>(GuestAddress(self.used + 2), Ordering::Acquire)
                .unwrap_or(0),
        )
    }

    /// Whether the chain with head `head` is still with the device.
    pub(crate) fn in_flight(&self, head: u16) -> bool {
        self.chains.contains_key(&head)
    }

    /// Takes the next used element: (the token of its chain, `None` for an id that is no chain
    /// of ours, a device bug; the written length).
    pub(crate) fn pop_used(&mut self, mem: &GuestMem) -> Option<(Option<u64>, u32)> {
        if self.used_idx(mem) == self.last_used {
            return None;
        }
        fence(Ordering::Acquire);
        let slot = u64::from(self.last_used % self.size);
        let elem = GuestAddress(self.used + 4 + 8 * slot);
        let id: u32 = u32::from_le(mem.read_obj(elem).unwrap_or(u32::MAX));
        let len: u32 = u32::from_le(mem.read_obj(GuestAddress(elem.0 + 4)).unwrap_or(0));
        self.last_used = self.last_used.wrapping_add(1);
        let head = u16::try_from(id).unwrap_or(u16::MAX);
        if let Some(n) = self.reposts.get_mut(&head)
            && *n > 0
        {
            // One of several placings of a reposted chain: it stays with the device.
            *n -= 1;
            return Some((self.chains.get(&head).map(|c| c.1), len));
        }
        self.reposts.remove(&head);
        let token = self.chains.remove(&head).map(|(ids, token)| {
            self.free.extend(ids);
            token
        });
        Some((token, len))
    }

    /// Asks for an interrupt at the next used element (`used_event`); true if one is there
    /// already.
    pub(crate) fn rearm(&mut self, mem: &GuestMem) -> bool {
        if self.event_idx {
            let _ = mem.store(
                self.last_used.to_le(),
                self.used_event_addr(),
                Ordering::Release,
            );
        }
        fence(Ordering::SeqCst);
        self.used_idx(mem) != self.last_used
    }

    /// The queue's indexes as both sides see them, for a timeout's message: what the driver
    /// published and where the device said it reads to (`avail_event`), what the device used
    /// and how far the driver took it, and how many descriptors are free.
    pub(crate) fn describe(&self, mem: &GuestMem) -> String {
        let avail_event = u16::from_le(
            mem.load::<u16>(self.avail_event_addr(), Ordering::Acquire)
                .unwrap_or(0),
        );
        let used_event = u16::from_le(
            mem.load::<u16>(self.used_event_addr(), Ordering::Acquire)
                .unwrap_or(0),
        );
        let used_flags = u16::from_le(
            mem.load::<u16>(GuestAddress(self.used), Ordering::Acquire)
                .unwrap_or(0),
        );
        format!(
            "avail {} (added {}, device reads to {avail_event}), used {} (taken {}, \
             used_event {used_event}, flags {used_flags:#x}), {} of {} descriptors free, \
             kick pending {}, call pending {}",
            self.published,
            self.avail_idx,
            self.used_idx(mem),
            self.last_used,
            self.free.len(),
            self.size,
            eventfd_pending(&self.kick),
            eventfd_pending(&self.call),
        )
    }

    /// Clears a pending interrupt.
    pub(crate) fn drain_call(&self) {
        let _ = self.call.read();
    }
}

/// Whether a non-blocking eventfd holds a count, without taking it (a `poll` of its fd).
fn eventfd_pending(fd: &EventFd) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` is one valid pollfd for the call's duration; a zero timeout never blocks.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & libc::POLLIN != 0
}
