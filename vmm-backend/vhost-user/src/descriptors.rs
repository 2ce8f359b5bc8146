//! Walking a descriptor chain in guest memory, as the devices that read their descriptors
//! themselves do: the virtio-vgpu device for every request, the vsock device for every packet.

use virtio_bindings::bindings::virtio_ring::VRING_DESC_ALIGN_SIZE;
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, VolatileMemory, VolatileSlice};

use crate::{ChainHead, GuestMem};

/// Bytes of one descriptor in a table.
const DESC_LEN: usize = std::mem::size_of::<Descriptor>();

/// The descriptors of one chain, read from the queue's descriptor table or an indirect table.
///
/// It follows the rules of virtio-queue's `DescriptorChain`: the walk ends, silently, at a
/// loop (after as many descriptors as the table holds), an out-of-range `next` index, an
/// indirect table that is nested, misaligned or too large, a descriptor it cannot read, or
/// past 4 GiB in total; a device tells these from a proper end by the last descriptor's `NEXT`
/// flag. Unlike `DescriptorChain`, it looks the table up in guest memory once, not once
/// per descriptor: a chain of a thousand scattered pages costs a thousand small reads.
pub struct Descriptors<'m> {
    mem: &'m GuestMem,
    /// The table being walked, and all of it as one slice when it lies in one region.
    table: GuestAddress,
    slice: Option<VolatileSlice<'m, ()>>,
    size: u16,
    next: u16,
    /// Descriptors the table can still yield (a loop ends when it runs out).
    ttl: u16,
    indirect: bool,
    bytes: u32,
}

impl<'m> Descriptors<'m> {
    /// Starts the walk of the chain at `head`.
    pub fn new(head: ChainHead, mem: &'m GuestMem) -> Self {
        let mut d = Descriptors {
            mem,
            table: head.table,
            slice: None,
            size: 0,
            next: head.index,
            ttl: 0,
            indirect: false,
            bytes: 0,
        };
        d.walk_table(head.table, head.queue_size);
        d
    }

    /// Whether the walk has moved into an indirect table.
    pub fn in_indirect_table(&self) -> bool {
        self.indirect
    }

    /// How many more descriptors the table being walked can yield at most.
    pub fn remaining(&self) -> u16 {
        self.ttl
    }

    fn walk_table(&mut self, table: GuestAddress, size: u16) {
        self.table = table;
        self.size = size;
        self.ttl = size;
        self.slice = self.mem.get_slice(table, usize::from(size) * DESC_LEN).ok();
    }

    #[inline]
    fn read(&self, index: u16) -> Option<Descriptor> {
        let offset = usize::from(index) * DESC_LEN;
        match &self.slice {
            Some(slice) => slice.get_ref::<Descriptor>(offset).ok().map(|r| r.load()),
            // A table across regions (or not in memory at all): one descriptor at a time.
            None => self
                .mem
                .read_obj(GuestAddress(self.table.0.checked_add(offset as u64)?))
                .ok(),
        }
    }
}

impl Iterator for Descriptors<'_> {
    type Item = Descriptor;

    #[inline]
    fn next(&mut self) -> Option<Descriptor> {
        loop {
            if self.ttl == 0 || self.next >= self.size {
                return None;
            }
            let desc = self.read(self.next)?;
            if desc.refers_to_indirect_table() {
                // One level of indirection, a table of whole descriptors, at most 2^16 of them
                // (virtio 1.2, 2.7.5.3.1).
                let len = desc.len();
                if self.indirect || len % VRING_DESC_ALIGN_SIZE != 0 {
                    return None;
                }
                let size = u16::try_from(len / VRING_DESC_ALIGN_SIZE).ok()?;
                self.indirect = true;
                self.next = 0;
                self.walk_table(desc.addr(), size);
                continue;
            }
            // No chain is longer than 2^32 bytes (virtio 1.2, 2.7.5.2).
            self.bytes = self.bytes.checked_add(desc.len())?;
            if desc.has_next() {
                self.next = desc.next();
                self.ttl -= 1;
            } else {
                self.ttl = 0;
            }
            return Some(desc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_bindings::bindings::virtio_ring::{
        VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    };
    use virtio_queue::QueueOwnedT;
    use virtio_queue::desc::{RawDescriptor, split::Descriptor as SplitDescriptor};
    use virtio_queue::mock::MockSplitQueue;

    const MEM: u64 = 0x100_0000;
    const BUF: u64 = 0x10_0000;
    const NEXT: u16 = VRING_DESC_F_NEXT as u16;
    const WRITE: u16 = VRING_DESC_F_WRITE as u16;

    fn mem() -> GuestMem {
        GuestMem::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap()
    }

    fn d(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
    }

    /// The walk yields exactly what virtio-queue's `DescriptorChain` yields, for random tables
    /// with loops, out-of-range indices, nested, misaligned, oversized and unmapped indirect
    /// tables, and chains past 4 GiB.
    #[test]
    fn descriptors_are_walked_as_virtio_queue_walks_them() {
        const RING: u16 = 16;
        const INDIRECT: u16 = VRING_DESC_F_INDIRECT as u16;
        let m = mem();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut pick = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let flags = [0, NEXT, WRITE, NEXT | WRITE, INDIRECT, INDIRECT | NEXT];
        let tables = [BUF + 0x1000, BUF + 0x2000, MEM - 32, MEM + 0x1000];
        let table_lens = [0, 16, 24, 64, 128, 0x10_0000];
        let lens = [0, 32, 4096, 0x8000_0000, u32::MAX];
        let mut walked = 0;
        for trial in 0..3000 {
            let q = MockSplitQueue::create(&m, GuestAddress(0), RING);
            let random = |pick: &mut dyn FnMut(usize) -> usize| {
                let f = flags[pick(flags.len())];
                let (addr, len) = if f & INDIRECT != 0 {
                    (
                        tables[pick(tables.len())],
                        table_lens[pick(table_lens.len())],
                    )
                } else {
                    (BUF + 64 * pick(64) as u64, lens[pick(lens.len())])
                };
                d(addr, len, f, pick(usize::from(RING) + 2) as u16)
            };
            for i in 0..RING {
                q.desc_table().store(i, random(&mut pick)).unwrap();
            }
            for t in &tables[..2] {
                for i in 0..8u64 {
                    let r = random(&mut pick);
                    m.write_obj(r, GuestAddress(t + i * 16)).unwrap();
                }
            }
            let head = pick(usize::from(RING) + 2) as u16;
            q.avail().ring().ref_at(0).unwrap().store(head);
            q.avail().idx().store(1);
            let mut queue: virtio_queue::Queue = q.create_queue().unwrap();
            let theirs: Vec<_> = queue
                .iter(&m)
                .unwrap()
                .next()
                .unwrap()
                .map(|d| (d.addr(), d.len(), d.flags(), d.next()))
                .collect();
            let start = ChainHead {
                index: head,
                table: q.desc_table_addr(),
                queue_size: RING,
            };
            let ours: Vec<_> = Descriptors::new(start, &m)
                .map(|d| (d.addr(), d.len(), d.flags(), d.next()))
                .collect();
            assert_eq!(ours, theirs, "trial {trial}");
            walked += ours.len();
        }
        // The tables were varied enough to walk something.
        assert!(walked > 3000, "{walked} descriptors walked");
    }
}
