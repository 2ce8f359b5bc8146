//! Validated descriptor chains: the guest-physical ranges of one request, checked once against the
//! guest memory map, and zero-copy access to them.
//!
//! Nothing here trusts the guest. A chain is refused when a descriptor lies outside guest RAM,
//! wraps around the address space, is device-writable and overlaps another descriptor of the
//! chain (device-readable ones may overlap each other: see [`write_overlap`]), points the wrong way
//! (device-readable descriptors must all come before the device-writable ones), when the chain
//! does not terminate, holds more than [`MAX_SEGMENTS`] descriptors or more bytes than any request
//! can use. Because no writable range overlaps any other range, the device may hand out the
//! readable ranges as shared slices and the writable ones as exclusive slices at the same time.

use std::ops::ControlFlow;

use thiserror::Error;
use vm_memory::VolatileSlice;

use super::wire::{MAX_DATA, MAX_INLINE, MAX_REPLY, MAX_SEGMENTS, REQ_HEADER_LEN, RESP_HEADER_LEN};

/// Guest memory as seen by this device (the same map the vsock device uses).
pub use vgpu_vhost_user::GuestMem;
/// An available chain (its head and the descriptor table it indexes), and taking one from a
/// queue.
pub use vgpu_vhost_user::{ChainHead, take_head};
use vgpu_vhost_user::{Descriptors, for_each_slice_of_ranges, in_memory};

/// Most device-readable bytes a request can use.
pub const MAX_READABLE: usize = REQ_HEADER_LEN + MAX_INLINE + MAX_DATA;
/// Most device-writable bytes a request can use.
pub const MAX_WRITABLE: usize = RESP_HEADER_LEN + MAX_REPLY + MAX_DATA;
/// Past [`MAX_SEGMENTS`], a refused chain is walked this far at most to find where to report the
/// refusal (virtio-queue bounds a chain to its table anyway).
const MAX_WALK: usize = 4 * MAX_SEGMENTS;

/// Why a descriptor chain was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ChainError {
    /// No descriptor at all (bad head index or descriptor table outside guest memory).
    #[error("descriptor chain is empty (bad head index or descriptor table outside guest memory)")]
    Empty,
    /// The chain loops, has an out-of-range `next` index or a bad indirect table.
    #[error("descriptor chain does not terminate (loop, bad next index or bad indirect table)")]
    Unterminated,
    /// More descriptors than [`MAX_SEGMENTS`].
    #[error("descriptor chain has more than {MAX_SEGMENTS} descriptors")]
    TooManySegments,
    /// A device-readable descriptor after a device-writable one.
    #[error("descriptor {0} is device-readable but follows a device-writable one")]
    Misordered(usize),
    /// `addr + len` wraps around the 64-bit address space.
    #[error("descriptor {index} [{addr:#x}, +{len:#x}) wraps around the address space")]
    Wrapping {
        /// Position in the chain.
        index: usize,
        /// Guest-physical address.
        addr: u64,
        /// Length.
        len: u32,
    },
    /// A descriptor is not entirely inside guest RAM.
    #[error("descriptor {index} [{addr:#x}, +{len:#x}) is outside guest memory")]
    OutsideMemory {
        /// Position in the chain.
        index: usize,
        /// Guest-physical address.
        addr: u64,
        /// Length.
        len: u32,
    },
    /// Two descriptors of the chain cover the same guest memory.
    #[error("descriptors overlap at guest address {0:#x}")]
    Overlapping(u64),
    /// More bytes in one direction than any request uses.
    #[error(
        "descriptor chain holds {bytes} device-{dir} bytes, more than the {max} a request can use"
    )]
    TooLong {
        /// "readable" or "writable".
        dir: &'static str,
        /// Bytes in the chain.
        bytes: u64,
        /// The limit.
        max: usize,
    },
    /// The guest memory map changed and a range is no longer mapped.
    #[error("guest memory at {0:#x} is no longer mapped")]
    Unmapped(u64),
}

/// One guest-physical range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Guest-physical address.
    pub addr: u64,
    /// Length in bytes (non-zero).
    pub len: usize,
}

/// An ordered list of guest ranges read or written as one byte stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Segments {
    segs: Vec<Segment>,
    total: usize,
}

impl Segments {
    /// A stream made of `segs` (empty ones are dropped).
    pub fn new(mut segs: Vec<Segment>) -> Self {
        segs.retain(|s| s.len > 0);
        let total = segs.iter().map(|s| s.len).sum();
        Segments { segs, total }
    }

    /// Total bytes.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Whether the stream holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Number of ranges.
    pub fn count(&self) -> usize {
        self.segs.len()
    }

    /// The ranges.
    pub fn segments(&self) -> &[Segment] {
        &self.segs
    }

    /// The bytes `[start, start + len)` of the stream (clamped to its end) as a stream of their own.
    pub fn sub(&self, start: usize, len: usize) -> Segments {
        let len = len.min(self.total.saturating_sub(start));
        if len == 0 {
            return Segments::default();
        }
        // The first range holding byte `start`, and the offset of that byte in it.
        let (mut first, mut skip) = (0, start);
        while skip >= self.segs[first].len {
            skip -= self.segs[first].len;
            first += 1;
        }
        // The last range the part reaches.
        let (mut last, mut reach) = (first, self.segs[first].len - skip);
        while reach < len {
            last += 1;
            reach += self.segs[last].len;
        }
        let mut segs = self.segs[first..=last].to_vec();
        segs[0].addr += skip as u64;
        segs[0].len -= skip;
        if let Some(end) = segs.last_mut() {
            end.len -= reach - len;
        }
        // Every range is non-empty: the first starts inside its range and the last ends past
        // its start.
        Segments { segs, total: len }
    }

    /// Number of ranges holding the first `len` bytes (all of them past the end).
    pub fn count_in(&self, len: usize) -> usize {
        let mut reach = 0;
        self.segs
            .iter()
            .take_while(|s| {
                let before = reach;
                reach += s.len;
                before < len
            })
            .count()
    }

    /// The bytes from `start` to the end.
    pub fn tail(&self, start: usize) -> Segments {
        self.sub(start, self.total.saturating_sub(start))
    }

    /// Visits the stream as volatile slices, splitting at memory-region boundaries.
    ///
    /// A range inside the region of the range before it (guest RAM is one region or a few
    /// large ones) costs one bounds check, not a lookup: a request of a thousand scattered
    /// 4 KiB pages looks its region up once.
    fn for_each_slice<'m>(
        &self,
        mem: &'m GuestMem,
        f: impl FnMut(VolatileSlice<'m, ()>),
    ) -> Result<(), ChainError> {
        self.for_each_slice_in(mem, 0, self.total, f)
    }

    /// Like [`Segments::for_each_slice`], for bytes `start..start + len` of the stream only
    /// (clipped to its end), without building the part as a stream of its own.
    fn for_each_slice_in<'m>(
        &self,
        mem: &'m GuestMem,
        start: usize,
        len: usize,
        mut f: impl FnMut(VolatileSlice<'m, ()>),
    ) -> Result<(), ChainError> {
        let ranges = self.segs.iter().map(|s| (s.addr, s.len));
        let flow = for_each_slice_of_ranges(mem, ranges, start, len, |addr, slice| match slice {
            Ok(slice) => {
                f(slice);
                ControlFlow::Continue(())
            }
            Err(_) => ControlFlow::Break(ChainError::Unmapped(addr)),
        });
        match flow {
            ControlFlow::Break(e) => Err(e),
            ControlFlow::Continue(()) => Ok(()),
        }
    }

    /// Copies the first `buf.len()` bytes of the stream into `buf`; returns the bytes copied.
    pub fn read_into(&self, mem: &GuestMem, buf: &mut [u8]) -> Result<usize, ChainError> {
        self.read_at(mem, 0, buf)
    }

    /// Copies `buf.len()` bytes of the stream from byte `start` into `buf`; returns the bytes
    /// copied (fewer where the stream ends first).
    pub fn read_at(
        &self,
        mem: &GuestMem,
        start: usize,
        buf: &mut [u8],
    ) -> Result<usize, ChainError> {
        let mut pos = 0;
        self.for_each_slice_in(mem, start, buf.len(), |s| {
            pos += s.copy_to(&mut buf[pos..]);
        })?;
        Ok(pos)
    }

    /// Copies `data` to the start of the stream (truncated to its length); returns the bytes copied.
    pub fn write_from(&self, mem: &GuestMem, data: &[u8]) -> Result<usize, ChainError> {
        self.write_at(mem, 0, data)
    }

    /// Copies `data` into the stream from byte `start` (truncated where the stream ends);
    /// returns the bytes copied.
    pub fn write_at(&self, mem: &GuestMem, start: usize, data: &[u8]) -> Result<usize, ChainError> {
        let mut pos = 0;
        self.for_each_slice_in(mem, start, data.len(), |s| {
            let n = s.len();
            s.copy_from(&data[pos..pos + n]);
            pos += n;
        })?;
        Ok(pos)
    }

    /// The stream as byte slices straight into guest memory, for reading.
    ///
    /// The guest may change these bytes while they are read (its own vCPUs race with its own
    /// transfer); that can only make it read different bytes, never break vgpud.
    pub fn slices<'m>(&self, mem: &'m GuestMem) -> Result<Vec<&'m [u8]>, ChainError> {
        let mut out = Vec::with_capacity(self.segs.len());
        self.for_each_slice(mem, |s| {
            let ptr = s.ptr_guard().as_ptr();
            // SAFETY: `ptr` and `s.len()` describe memory of a region of `mem` (get_slices
            // checked the range), which stays mapped for 'm. Every byte value is a valid u8;
            // concurrent guest writes only change which bytes are read.
            out.push(unsafe { std::slice::from_raw_parts(ptr, s.len()) });
        })?;
        Ok(out)
    }

    /// Calls `f` with the stream as mutable byte slices straight into guest memory, for
    /// writing.
    ///
    /// # Safety
    ///
    /// The ranges must alias nothing else while `f` runs: use it only for the writable part of a
    /// chain that [`parse_chain`] validated (its writable ranges overlap neither each other nor
    /// any other range of the chain), and never nested for the same chain.
    pub unsafe fn with_slices_mut<R>(
        &self,
        mem: &GuestMem,
        f: impl FnOnce(&mut [&mut [u8]]) -> R,
    ) -> Result<R, ChainError> {
        let mut out = Vec::with_capacity(self.segs.len());
        self.for_each_slice(mem, |s| {
            let ptr = s.ptr_guard_mut().as_ptr();
            // SAFETY: `ptr` and `s.len()` describe mapped memory of `mem`, which outlives this
            // call (as in `slices`); the caller guarantees that nothing else aliases these ranges
            // while `f` runs, and the slices do not outlive it.
            out.push(unsafe { std::slice::from_raw_parts_mut(ptr, s.len()) });
        })?;
        Ok(f(&mut out))
    }
}

/// The first guest address where a device-writable range overlaps another range of the chain.
///
/// Device-readable ranges may overlap each other: the same page legitimately appears several
/// times in a buffer that was never written (the kernel's shared zero page) or that the kernel
/// merged (KSM), and reading it twice is harmless. A range the device writes must alias nothing.
fn write_overlap(readable: &[Segment], writable: &[Segment]) -> Option<u64> {
    let span = |s: &Segment| (s.addr, s.addr + s.len as u64);
    // Sized up front: collecting through the filter would grow it a range at a time.
    let mut w: Vec<(u64, u64)> = Vec::with_capacity(writable.len());
    w.extend(writable.iter().filter(|s| s.len > 0).map(span));
    sort_by_start(&mut w);
    if let Some(p) = w.windows(2).find(|p| p[1].0 < p[0].1) {
        return Some(p[1].0);
    }
    // `w` is sorted and disjoint: a readable range overlaps one of them iff it overlaps the last
    // writable range starting before its end. Ranges outside the span of all writable ones (a
    // request's data pages, apart from its response header) need no search.
    let (Some(&(first, _)), Some(&(_, end))) = (w.first(), w.last()) else {
        return None;
    };
    readable
        .iter()
        .filter(|s| s.len > 0)
        .map(span)
        .filter(|&(a, b)| a < end && first < b)
        .find_map(|(a, b)| {
            let i = w.partition_point(|&(ws, _)| ws < b);
            (i > 0 && w[i - 1].1 > a).then(|| a.max(w[i - 1].0))
        })
}

/// Below this many ranges [`sort_by_start`] leaves the sort to the standard library.
const RADIX_MIN: usize = 32;
/// Bits of the start address one pass of [`sort_by_start`] sorts by.
const RADIX_BITS: u32 = 8;

/// Sorts `(start, end)` spans by start: a least-significant-digit radix sort over the bits in
/// which the starts differ, one pass per [`RADIX_BITS`] of them (three for the pages of a guest
/// of up to 16 GiB), so its cost grows with the number of spans, not with their logarithm as a
/// comparison sort's does: a device-to-host request of 992 scattered pages checked its ranges in
/// 7.2 µs more than a host-to-device one with the standard library's sort (docs/vgpu-device.md).
/// A hostile chain whose starts differ in every bit costs eight passes.
fn sort_by_start(spans: &mut Vec<(u64, u64)>) {
    if spans.len() < RADIX_MIN {
        spans.sort_unstable_by_key(|&(start, _)| start);
        return;
    }
    let (all, any) = spans.iter().fold((u64::MAX, 0), |(all, any), &(start, _)| {
        (all & start, any | start)
    });
    let differ = all ^ any;
    if differ == 0 {
        return;
    }
    let (mut shift, top) = (differ.trailing_zeros(), u64::BITS - differ.leading_zeros());
    let digit = |start: u64, shift: u32| ((start >> shift) & ((1 << RADIX_BITS) - 1)) as usize;
    let mut other = vec![(0, 0); spans.len()];
    while shift < top {
        let mut at = [0usize; 1 << RADIX_BITS];
        for &(start, _) in spans.iter() {
            at[digit(start, shift)] += 1;
        }
        let mut sum = 0;
        for slot in at.iter_mut() {
            (*slot, sum) = (sum, sum + *slot);
        }
        for &span in spans.iter() {
            let d = digit(span.0, shift);
            other[at[d]] = span;
            at[d] += 1;
        }
        std::mem::swap(spans, &mut other);
        shift += RADIX_BITS;
    }
}

/// A validated chain: its head index and its two byte streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedChain {
    /// Head descriptor index (returned in the used ring).
    pub head: u16,
    /// Device-readable bytes.
    pub readable: Segments,
    /// Device-writable bytes.
    pub writable: Segments,
}

/// A refused chain: why, and the first writable descriptor if it was checked to be valid and can
/// hold a response header (the device reports the refusal there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Head descriptor index.
    pub head: u16,
    /// Why.
    pub error: ChainError,
    /// Where a response header can safely go.
    pub resp: Option<Segment>,
}

/// Walks and validates a chain (see the module docs for the rules).
pub fn parse_chain(start: ChainHead, mem: &GuestMem) -> Result<ParsedChain, Refused> {
    let head = start.index;
    let refuse = |error, resp| Refused { head, error, resp };
    // Every non-empty range, the readable ones first; `split` is where the writable ones begin.
    // Sized once the walk is in an indirect table, which Linux sizes to hold the whole chain.
    let mut ranges: Vec<Segment> = Vec::new();
    let mut split = 0;
    let mut resp = None;
    // The walk goes on after the first error (bounded by MAX_SEGMENTS) to find a safe place for
    // the response header, so that the driver learns its request was refused.
    let mut first_error = None;
    let mut count = 0usize;
    let mut terminated = false;
    let mut seen_writable = false;
    let (mut rbytes, mut wbytes) = (0u64, 0u64);
    let mut region = None;
    let mut descs = Descriptors::new(start, mem);
    while let Some(desc) = descs.next() {
        if count == 1 && descs.in_indirect_table() {
            ranges.reserve(usize::from(descs.remaining()).min(MAX_SEGMENTS));
        }
        if count >= MAX_SEGMENTS {
            first_error.get_or_insert(ChainError::TooManySegments);
            if resp.is_some() || count >= MAX_WALK {
                terminated = true;
                break;
            }
        }
        let index = count;
        count += 1;
        terminated = !desc.has_next();
        let (addr, len) = (desc.addr().0, desc.len());
        let writable_desc = desc.is_write_only();
        if !writable_desc && seen_writable {
            first_error.get_or_insert(ChainError::Misordered(index));
            continue;
        }
        if addr.checked_add(u64::from(len)).is_none() {
            first_error.get_or_insert(ChainError::Wrapping { index, addr, len });
            continue;
        }
        let seg = Segment {
            addr,
            len: len as usize,
        };
        // `region` is the region of the range checked before, which a chain's next range is
        // usually in too: then this costs a bounds check, no lookup.
        if len > 0 && !in_memory(mem, &mut region, seg.addr, seg.len) {
            first_error.get_or_insert(ChainError::OutsideMemory { index, addr, len });
            continue;
        }
        if count > MAX_SEGMENTS {
            // Only looking for a place to report the error.
            if writable_desc && !seen_writable && seg.len >= RESP_HEADER_LEN {
                resp = Some(seg);
            }
            seen_writable |= writable_desc;
            continue;
        }
        if writable_desc {
            if !seen_writable && seg.len >= RESP_HEADER_LEN {
                resp = Some(seg);
            }
            seen_writable = true;
            wbytes += u64::from(len);
        } else {
            rbytes += u64::from(len);
            split += usize::from(len > 0);
        }
        if len > 0 {
            ranges.push(seg);
        }
    }
    let writable = ranges.split_off(split);
    let readable = ranges;
    if count == 0 {
        return Err(refuse(ChainError::Empty, None));
    }
    if !terminated {
        // virtio-queue ends a chain silently at a loop, an out-of-range `next`, a bad indirect
        // table or past 4 GiB; a last descriptor that still asks for a successor tells.
        first_error.get_or_insert(ChainError::Unterminated);
    }
    for (dir, bytes, max) in [
        ("readable", rbytes, MAX_READABLE),
        ("writable", wbytes, MAX_WRITABLE),
    ] {
        if bytes > max as u64 {
            first_error.get_or_insert(ChainError::TooLong { dir, bytes, max });
        }
    }
    if let Some(at) = write_overlap(&readable, &writable) {
        // The response header descriptor itself may be one of the overlapping ones.
        let resp = resp.filter(|r| {
            let (s, e) = (r.addr, r.addr + r.len as u64);
            !readable.iter().chain(&writable).any(|x| {
                (x.addr, x.len) != (r.addr, r.len) && x.addr < e && s < x.addr + x.len as u64
            })
        });
        return Err(refuse(
            first_error.unwrap_or(ChainError::Overlapping(at)),
            resp,
        ));
    }
    if let Some(error) = first_error {
        return Err(refuse(error, resp));
    }
    // Within the limits checked above, so the totals fit a usize.
    Ok(ParsedChain {
        head,
        readable: Segments {
            segs: readable,
            total: rbytes as usize,
        },
        writable: Segments {
            segs: writable,
            total: wbytes as usize,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_bindings::bindings::virtio_ring::{
        VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    };
    use virtio_queue::desc::{RawDescriptor, split::Descriptor as SplitDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

    const MEM: u64 = 0x100_0000;
    const BUF: u64 = 0x10_0000;
    const NEXT: u16 = VRING_DESC_F_NEXT as u16;
    const WRITE: u16 = VRING_DESC_F_WRITE as u16;

    /// A chain as (address, length, device-writable) per descriptor.
    type Descs = Vec<(u64, u32, bool)>;

    fn mem() -> GuestMem {
        GuestMem::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap()
    }

    fn d(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
    }

    /// Builds a chain from `descs` (linked in order) and parses it.
    fn parse(m: &GuestMem, descs: &[(u64, u32, bool)]) -> Result<ParsedChain, Refused> {
        let q = MockSplitQueue::create(m, GuestAddress(0), 1024);
        let raw: Vec<RawDescriptor> = descs
            .iter()
            .enumerate()
            .map(|(i, &(a, l, w))| {
                let last = i + 1 == descs.len();
                let flags = if w { WRITE } else { 0 } | if last { 0 } else { NEXT };
                d(a, l, flags, if last { 0 } else { i as u16 + 1 })
            })
            .collect();
        q.add_desc_chains(&raw, 0).unwrap();
        parse_chain(first_head(&q, m), m)
    }

    /// The first available chain of `q`, as the device takes it.
    fn first_head(q: &MockSplitQueue<'_, GuestMem>, m: &GuestMem) -> ChainHead {
        let mut queue: virtio_queue::Queue = q.create_queue().unwrap();
        take_head(&mut queue, m).unwrap().unwrap()
    }

    #[test]
    fn a_good_chain_splits_into_readable_and_writable_streams() {
        let m = mem();
        let c = parse(
            &m,
            &[
                (BUF, 32, false),
                (BUF + 0x5000, 0, false),
                (BUF + 0x1000, 100, false),
                (BUF + 0x2000, 16, true),
                (BUF + 0x6000, 0, true),
                (BUF + 0x3000, 4096, true),
            ],
        )
        .unwrap();
        assert_eq!((c.readable.len(), c.writable.len()), (132, 4112));
        // Empty descriptors hold no bytes and leave no range behind.
        assert_eq!((c.readable.count(), c.writable.count()), (2, 2));
        let tail = c.readable.tail(40);
        assert_eq!(
            tail.segments(),
            &[Segment {
                addr: BUF + 0x1008,
                len: 92
            }]
        );
    }

    #[test]
    fn hostile_chains_are_refused_with_the_reason() {
        let m = mem();
        let cases: Vec<(Descs, ChainError)> = vec![
            (
                vec![(MEM - 8, 32, false), (BUF, 16, true)],
                ChainError::OutsideMemory {
                    index: 0,
                    addr: MEM - 8,
                    len: 32,
                },
            ),
            (
                vec![(BUF, 32, false), (u64::MAX - 4, 16, true)],
                ChainError::Wrapping {
                    index: 1,
                    addr: u64::MAX - 4,
                    len: 16,
                },
            ),
            (
                vec![(BUF, 32, false), (BUF + 16, 64, true)],
                ChainError::Overlapping(BUF + 16),
            ),
            (
                vec![(BUF, 16, true), (BUF + 0x1000, 32, false)],
                ChainError::Misordered(1),
            ),
            (
                vec![(BUF, 32, false), (BUF + 0x1000, 0x200_0000, true)],
                ChainError::OutsideMemory {
                    index: 1,
                    addr: BUF + 0x1000,
                    len: 0x200_0000,
                },
            ),
            // More than 2^32 bytes in one chain: virtio-queue stops the chain there.
            (
                vec![(BUF, 32, false), (BUF + 0x1000, u32::MAX, true)],
                ChainError::Unterminated,
            ),
        ];
        for (descs, want) in cases {
            let r = parse(&m, &descs).unwrap_err();
            assert_eq!(r.error, want, "{descs:x?}");
        }
        // Where the response header can go is reported only when it is safe.
        let r = parse(
            &m,
            &[(BUF, 32, false), (BUF + 0x1000, 16, true), (MEM, 8, true)],
        )
        .unwrap_err();
        assert_eq!(
            r.resp,
            Some(Segment {
                addr: BUF + 0x1000,
                len: 16
            })
        );
        let r = parse(&m, &[(BUF, 32, false), (BUF + 8, 16, true)]).unwrap_err();
        assert_eq!(r.resp, None, "the response header overlaps the request");
    }

    #[test]
    fn readable_ranges_may_repeat_but_writable_ones_alias_nothing() {
        let m = mem();
        // The same page twice in the data: a buffer of untouched memory (the zero page).
        let c = parse(
            &m,
            &[
                (BUF, 32, false),
                (BUF + 0x1000, 4096, false),
                (BUF + 0x1000, 4096, false),
                (BUF + 0x3000, 16, true),
            ],
        )
        .unwrap();
        assert_eq!(c.readable.len(), 32 + 8192);
        for (descs, at) in [
            (
                vec![
                    (BUF, 32, false),
                    (BUF + 0x3000, 16, true),
                    (BUF + 0x3008, 16, true),
                ],
                BUF + 0x3008,
            ),
            (
                vec![
                    (BUF, 32, false),
                    (BUF + 0x2000, 64, false),
                    (BUF + 0x1ff0, 32, true),
                ],
                BUF + 0x2000,
            ),
        ] {
            assert_eq!(
                parse(&m, &descs).unwrap_err().error,
                ChainError::Overlapping(at)
            );
        }
    }

    /// The radix sort orders spans as the standard library's sort does (starts may repeat, so
    /// only the starts are compared), for counts around its threshold and starts that differ in
    /// few bits, in page bits only, or in every bit (a hostile chain).
    #[test]
    fn spans_are_sorted_by_start_whatever_their_bits() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for trial in 0..400 {
            let n = [0, 1, 2, RADIX_MIN - 1, RADIX_MIN, RADIX_MIN + 1, 129, 993][trial % 8];
            let start = |r: u64| match trial % 4 {
                0 => 0x100_0000 + (r % 4096) * 4096,
                1 => r,
                2 => 0x4000 + (r % 3),
                _ => (r % 64) << 58 | (r & 0xfff),
            };
            let mut spans: Vec<(u64, u64)> = (0..n)
                .map(|i| {
                    let r = next();
                    (start(r), i as u64)
                })
                .collect();
            let mut want: Vec<u64> = spans.iter().map(|s| s.0).collect();
            want.sort_unstable();
            let before = {
                let mut v = spans.clone();
                v.sort_unstable();
                v
            };
            sort_by_start(&mut spans);
            let got: Vec<u64> = spans.iter().map(|s| s.0).collect();
            assert_eq!(got, want, "trial {trial}: {n} spans");
            let mut after = spans.clone();
            after.sort_unstable();
            assert_eq!(after, before, "trial {trial}: spans kept whole");
        }
    }

    /// `write_overlap` finds an overlap exactly when a pairwise comparison does, and reports an
    /// address inside one, for random chains of readable and writable ranges.
    #[test]
    fn write_overlaps_are_found_as_a_pairwise_check_finds_them() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let mut found = 0;
        for trial in 0..3000 {
            let nw = [1, 3, RADIX_MIN + 2, 140][trial % 4];
            let pages = [nw as u64 * 4, nw as u64 * 64][trial % 2];
            let mut seg = |page_only: bool| {
                let page = next(pages);
                if page_only || next(4) != 0 {
                    Segment {
                        addr: page * 4096,
                        len: 4096,
                    }
                } else {
                    Segment {
                        addr: page * 4096 + next(4096),
                        len: 1 + next(8192) as usize,
                    }
                }
            };
            let writable: Vec<Segment> = (0..nw).map(|_| seg(trial % 3 == 0)).collect();
            let nr = 1 + seg(false).addr % 3;
            let readable: Vec<Segment> = (0..nr).map(|_| seg(false)).collect();
            let ends = |s: &Segment| (s.addr, s.addr + s.len as u64);
            let touches = |a: &Segment, b: &Segment| {
                let ((a0, a1), (b0, b1)) = (ends(a), ends(b));
                a0 < b1 && b0 < a1
            };
            let pairwise = writable.iter().enumerate().any(|(i, w)| {
                writable[i + 1..].iter().any(|x| touches(w, x))
                    || readable.iter().any(|r| touches(w, r))
            });
            let got = write_overlap(&readable, &writable);
            assert_eq!(got.is_some(), pairwise, "trial {trial}");
            if let Some(at) = got {
                found += 1;
                // The address lies in a writable range and in one more range.
                let holders = writable
                    .iter()
                    .chain(&readable)
                    .filter(|s| ends(s).0 <= at && at < ends(s).1)
                    .count();
                assert!(
                    holders >= 2,
                    "trial {trial}: {at:#x} is in {holders} range(s)"
                );
            }
        }
        assert!((500..2500).contains(&found), "{found} overlapping chains");
    }

    #[test]
    fn absurd_lengths_and_counts_are_refused() {
        // 3 GiB of guest RAM so that the lengths themselves are in memory.
        let big = GuestMem::from_ranges(&[(GuestAddress(0), 3 << 30)]).unwrap();
        let r = parse(
            &big,
            &[
                (BUF, 32, false),
                (1 << 30, (1 << 30) + 7, false),
                (BUF + 0x1000, 16, true),
            ],
        )
        .unwrap_err();
        assert!(
            matches!(
                r.error,
                ChainError::TooLong {
                    dir: "readable",
                    ..
                }
            ),
            "{r:?}"
        );
        // One more descriptor than allowed, through an indirect table.
        let m = mem();
        let table = BUF + 0x80_0000;
        let n = MAX_SEGMENTS as u16 + 1;
        for i in 0..n {
            let last = i + 1 == n;
            let desc = SplitDescriptor::new(
                BUF + u64::from(i) * 64,
                32,
                if last { 0 } else { NEXT },
                if last { 0 } else { i + 1 },
            );
            m.write_obj(desc, GuestAddress(table + u64::from(i) * 16))
                .unwrap();
        }
        let q = MockSplitQueue::create(&m, GuestAddress(0), 16);
        q.add_desc_chains(
            &[d(table, u32::from(n) * 16, VRING_DESC_F_INDIRECT as u16, 0)],
            0,
        )
        .unwrap();
        let chain = first_head(&q, &m);
        assert_eq!(
            parse_chain(chain, &m).unwrap_err().error,
            ChainError::TooManySegments
        );
    }

    #[test]
    fn loops_and_bad_indirect_tables_do_not_terminate() {
        let m = mem();
        let q = MockSplitQueue::create(&m, GuestAddress(0), 16);
        q.add_desc_chains(&[d(BUF, 32, NEXT, 1), d(BUF + 64, 32, NEXT, 0)], 0)
            .unwrap();
        let chain = first_head(&q, &m);
        assert_eq!(
            parse_chain(chain, &m).unwrap_err().error,
            ChainError::Unterminated
        );
        // An indirect table whose length is not a multiple of 16.
        let q = MockSplitQueue::create(&m, GuestAddress(0x8000), 16);
        q.add_desc_chains(&[d(BUF, 24, VRING_DESC_F_INDIRECT as u16, 0)], 0)
            .unwrap();
        let chain = first_head(&q, &m);
        assert!(parse_chain(chain, &m).is_err());
    }

    /// A part of a stream holds exactly the guest bytes of that part, for every start and length
    /// (byte by byte against the stream spelled out).
    #[test]
    fn parts_of_a_stream_hold_exactly_their_bytes() {
        let s = Segments::new(vec![
            Segment {
                addr: 0x1000,
                len: 3,
            },
            Segment {
                addr: 0x9000,
                len: 0,
            },
            Segment {
                addr: 0x5000,
                len: 1,
            },
            Segment {
                addr: 0x7000,
                len: 5,
            },
            Segment {
                addr: 0x2000,
                len: 2,
            },
        ]);
        let bytes: Vec<u64> = s
            .segments()
            .iter()
            .flat_map(|g| (0..g.len as u64).map(move |i| g.addr + i))
            .collect();
        assert_eq!((s.len(), s.count()), (11, 4));
        for start in 0..=12 {
            for len in 0..=13 {
                let part = s.sub(start, len);
                let got: Vec<u64> = part
                    .segments()
                    .iter()
                    .inspect(|g| assert!(g.len > 0, "empty range in {part:?}"))
                    .flat_map(|g| (0..g.len as u64).map(move |i| g.addr + i))
                    .collect();
                let want = &bytes[start.min(11)..(start + len).min(11)];
                assert_eq!(got, want, "sub({start}, {len})");
                assert_eq!(part.len(), want.len(), "sub({start}, {len})");
                if start == 0 {
                    assert_eq!(s.count_in(len), part.count(), "count_in({len})");
                }
            }
        }
        assert_eq!(
            s.tail(4).segments()[0],
            Segment {
                addr: 0x7000,
                len: 5
            }
        );
    }

    /// Reads from any byte of a stream and writes to its start copy exactly the guest bytes the
    /// stream spells out there, across ranges and past its end.
    #[test]
    fn reads_and_writes_touch_exactly_the_streams_bytes() {
        let m = mem();
        let seg = |addr, len| Segment { addr, len };
        let s = Segments::new(vec![
            seg(0x1000, 3),
            seg(0x9000, 0),
            seg(0x5000, 1),
            seg(0x7000, 5),
            seg(0x2000, 2),
        ]);
        let addrs: Vec<u64> = s
            .segments()
            .iter()
            .flat_map(|g| (0..g.len as u64).map(move |i| g.addr + i))
            .collect();
        let pattern = |a: u64| (a % 251) as u8;
        for &a in &addrs {
            m.write_obj(pattern(a), GuestAddress(a)).unwrap();
        }
        for start in 0..=12 {
            for len in 0..=13 {
                let mut buf = vec![0u8; len];
                let n = s.read_at(&m, start, &mut buf).unwrap();
                let want: Vec<u8> = addrs[start.min(11)..(start + len).min(11)]
                    .iter()
                    .map(|&a| pattern(a))
                    .collect();
                assert_eq!(&buf[..n], &want[..], "read_at({start}, {len})");
            }
        }
        for len in 0..=13 {
            let data: Vec<u8> = (0..len as u8).map(|i| 200 + i).collect();
            assert_eq!(s.write_from(&m, &data).unwrap(), len.min(11));
            for (i, &a) in addrs.iter().enumerate() {
                let want = if i < len { 200 + i as u8 } else { pattern(a) };
                assert_eq!(m.read_obj::<u8>(GuestAddress(a)).unwrap(), want);
            }
            // Put the pattern back for the next length.
            for &a in &addrs {
                m.write_obj(pattern(a), GuestAddress(a)).unwrap();
            }
        }
    }

    #[test]
    fn indirect_tables_may_exceed_the_ring_but_not_the_segment_limit() {
        let m = mem();
        let table = BUF + 0x10_0000;
        let n = 600u16;
        for i in 0..n {
            let last = i + 1 == n;
            let desc = SplitDescriptor::new(
                BUF + u64::from(i) * 0x100,
                64,
                if last { WRITE } else { NEXT },
                if last { 0 } else { i + 1 },
            );
            m.write_obj(desc, GuestAddress(table + u64::from(i) * 16))
                .unwrap();
        }
        let q = MockSplitQueue::create(&m, GuestAddress(0), 16);
        q.add_desc_chains(
            &[d(table, u32::from(n) * 16, VRING_DESC_F_INDIRECT as u16, 0)],
            0,
        )
        .unwrap();
        let chain = first_head(&q, &m);
        let c = parse_chain(chain, &m).unwrap();
        assert_eq!((c.readable.count(), c.writable.count()), (599, 1));
        assert_eq!((c.readable.len(), c.writable.len()), (599 * 64, 64));
        assert_eq!(c.readable.segments()[598].addr, BUF + 598 * 0x100);
    }

    #[test]
    fn zero_copy_slices_see_guest_memory() {
        let m = mem();
        m.write_slice(b"hello", GuestAddress(BUF)).unwrap();
        m.write_slice(b" world", GuestAddress(BUF + 0x3000))
            .unwrap();
        let s = Segments::new(vec![
            Segment { addr: BUF, len: 5 },
            Segment {
                addr: BUF + 0x3000,
                len: 6,
            },
        ]);
        let joined: Vec<u8> = s.slices(&m).unwrap().concat();
        assert_eq!(joined, b"hello world");
        // SAFETY: the two ranges are disjoint and nothing else holds slices of them.
        let filled = unsafe {
            s.with_slices_mut(&m, |slices| {
                for sl in slices.iter_mut() {
                    sl.fill(b'x');
                }
                slices.len()
            })
        };
        assert_eq!(filled.unwrap(), 2);
        let mut back = [0u8; 11];
        assert_eq!(s.read_into(&m, &mut back).unwrap(), 11);
        assert_eq!(&back, b"xxxxxxxxxxx");
        assert_eq!(s.write_from(&m, b"0123456789ABCDEF").unwrap(), 11);
        s.read_into(&m, &mut back).unwrap();
        assert_eq!(&back, b"0123456789A");
        assert!(GuestMemoryBackend::address_in_range(&m, GuestAddress(BUF)));
    }

    #[test]
    fn streams_over_several_regions_read_each_byte_from_its_region() {
        // Two regions with a hole between them, as guest RAM below and above a PCI hole.
        const LOW: u64 = 0x10_0000;
        const HIGH: u64 = 0x30_0000;
        let m = GuestMem::from_ranges(&[
            (GuestAddress(0), LOW as usize),
            (GuestAddress(0x20_0000), (HIGH - 0x20_0000) as usize),
        ])
        .unwrap();
        let seg = |addr, len| Segment { addr, len };
        let at = |addr: u64| (addr % 251) as u8;
        for (addr, len) in [(LOW - 8, 8), (0x20_0000, 4), (0x1000, 4), (HIGH - 3, 3)] {
            let bytes: Vec<u8> = (addr..addr + len).map(at).collect();
            m.write_slice(&bytes, GuestAddress(addr)).unwrap();
        }
        // Low, high, low again, the high region's last bytes: each from where it lies.
        let s = Segments::new(vec![
            seg(LOW - 8, 8),
            seg(0x20_0000, 4),
            seg(0x1000, 4),
            seg(HIGH - 3, 3),
        ]);
        let want: Vec<u8> = s
            .segments()
            .iter()
            .flat_map(|g| (g.addr..g.addr + g.len as u64).map(at))
            .collect();
        assert_eq!(s.slices(&m).unwrap().concat(), want);
        // A range running past a region's end into the hole, or lying in it, is refused.
        for bad in [seg(LOW - 8, 9), seg(0x18_0000, 1), seg(HIGH - 3, 4)] {
            let s = Segments::new(vec![seg(0x1000, 4), bad]);
            assert_eq!(
                s.slices(&m).unwrap_err(),
                ChainError::Unmapped(bad.addr),
                "{bad:?}"
            );
        }
    }
}
