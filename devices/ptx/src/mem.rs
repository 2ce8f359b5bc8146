//! Device-memory backing store: the only module of this crate with `unsafe` memory code.
//!
//! A [`Buffer`] is one zero-initialised, 256-byte aligned, fixed-length block of host memory
//! that backs one device allocation. Two kinds of code touch it:
//!
//! * **Kernels** (the interpreter's worker threads, possibly several at once, possibly racing on
//!   the same bytes because CUDA kernels may race) go through a [`KernelView`], whose accessors
//!   perform every access as a naturally aligned atomic operation. Racy kernels therefore get
//!   CUDA-like "some value that was written" results, never Rust undefined behaviour.
//! * **The host** (memcpy/memset/copy calls of the driver API) uses [`Buffer::read`],
//!   [`Buffer::write`], [`Buffer::fill`] and [`Buffer::copy_from`]. These use fast plain `ptr`
//!   copies when no kernel holds the buffer, and atomic byte-by-byte copies when one does. The
//!   choice is made under a tiny reader/writer protocol, so soundness never depends on the caller
//!   serialising host copies and kernels (the broker does, but this module does not trust it).
//!
//! The pin protocol: the `state` word counts pins in its low bits and has one `HOST_BULK` bit.
//! [`Buffer::kernel_view`] pins (waiting while `HOST_BULK` is set, which lasts one plain copy);
//! the view unpins on drop; each interpreter worker keeps the views it used until the launch ends
//! (or until they leave its 64-entry cache). A host bulk operation sets `HOST_BULK` only when the
//! state is zero and then copies plainly; when kernels hold pins it takes a pin itself and copies
//! with atomics. Nothing waits while holding the buffer, so the protocol cannot deadlock.
//!
//! Backing: buffers of at least [`HUGE_BACKING_MIN`] bytes are their own anonymous mappings
//! (`vgpu_hugemem::HugeMapping`),
//! aligned to 2 MiB and advised to use transparent huge pages (`MADV_HUGEPAGE`), as a GPU maps
//! large allocations with large pages. Host copies into and out of them then take a TLB miss per
//! 2 MiB instead of per 4 KiB: on the development machine a 16 MiB copy from huge-page guest RAM
//! through the virtio-vgpu device went from 89 % to 104 % of a plain memcpy (`vgpu-bench
//! vgpu-dev`, docs/vgpu-device.md). Pages are still faulted in on first touch, so an allocation
//! costs host memory only as it is used, as before. Where the host has THP disabled the advice
//! is ignored and the buffer simply uses 4 KiB pages. Smaller buffers come from the heap.

use std::alloc::{self, Layout};

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use vgpu_hugemem::HugeMapping;

/// Alignment of every buffer, like `cudaMalloc`'s 256-byte guarantee.
pub const BUFFER_ALIGN: usize = 256;

/// Buffers at least this large get their own huge-page-advised mapping (see the module
/// documentation); smaller ones come from the heap.
pub const HUGE_BACKING_MIN: usize = vgpu_hugemem::HUGE_PAGE;

/// Set in `Buffer::state` while a host bulk operation copies with plain (non-atomic) accesses.
const HOST_BULK: usize = 1 << (usize::BITS - 1);

/// Most bytes one `memcpy` call of a host copy moves; longer copies go in pieces of this size.
///
/// glibc's `memcpy` copies with `rep movsb` only below `rep_movsb_stop_threshold` (on AMD CPUs
/// the L2 cache's size, 1 MiB per core on the development machines), with a vector loop above
/// it and with non-temporal stores above `non_temporal_threshold`. On those machines (AMD EPYC,
/// glibc 2.36) both are slower than `rep movsb` in smaller pieces: copies in 256 KiB pieces ran
/// at 67 against 50 GB/s at 1 MiB, 45 against 36 at 16 MiB, 22 against 20 at 256 MiB and 1 GiB
/// (docs/performance.md, "Host copies in pieces"). A piece costs one more call (tens of
/// nanoseconds), under 1 % of the time it copies anywhere. `memset` is left whole: in pieces it
/// measured no faster, and slower at 256 MiB.
pub const COPY_PIECE: usize = 256 << 10;

/// Copies `src` into `dst`, which must be as long, in pieces of at most [`COPY_PIECE`] bytes.
///
/// # Panics
///
/// When the lengths differ, as `<[u8]>::copy_from_slice` does.
pub fn copy_in_pieces(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_in_pieces: lengths differ");
    for (d, s) in dst.chunks_mut(COPY_PIECE).zip(src.chunks(COPY_PIECE)) {
        d.copy_from_slice(s);
    }
}

/// `ptr::copy` (`memmove`) of `len` bytes in pieces of at most [`COPY_PIECE`] bytes, walked in the
/// direction that keeps overlapping ranges right: upwards when `to` lies below `from`, else
/// downwards, so that no piece overwrites source bytes a later piece still reads.
///
/// # Safety
///
/// As for `ptr::copy`: `from` valid for reads and `to` valid for writes of `len` bytes.
unsafe fn move_in_pieces(from: *const u8, to: *mut u8, len: usize) {
    let piece = |at: usize| {
        let n = COPY_PIECE.min(len - at);
        // SAFETY: `at + n <= len`, so both pieces lie inside the ranges the caller vouched for;
        // `ptr::copy` allows them to overlap.
        unsafe { std::ptr::copy(from.wrapping_add(at), to.wrapping_add(at), n) };
    };
    if (to as usize) <= (from as usize) {
        (0..len).step_by(COPY_PIECE).for_each(piece);
    } else {
        (0..len).step_by(COPY_PIECE).rev().for_each(piece);
    }
}

/// A host allocation failed (the daemon keeps running and reports out-of-memory).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("cannot allocate {len} bytes of device memory backing")]
pub struct AllocError {
    /// The requested length.
    pub len: usize,
}

/// A host-side access reached outside the buffer.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("range {offset:#x}+{len:#x} is outside a buffer of {buf_len:#x} bytes")]
pub struct OutOfRange {
    /// Start of the rejected range.
    pub offset: usize,
    /// Length of the rejected range.
    pub len: usize,
    /// Length of the buffer.
    pub buf_len: usize,
}

/// Why a kernel access to a buffer was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessError {
    /// The access does not lie entirely inside the buffer.
    OutOfRange,
    /// The offset is not a multiple of the access size.
    Misaligned,
}

/// Width of one kernel access in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Width {
    /// 1 byte.
    B1 = 1,
    /// 2 bytes.
    B2 = 2,
    /// 4 bytes.
    B4 = 4,
    /// 8 bytes.
    B8 = 8,
}

impl Width {
    /// The width for a size in bytes, if it is 1, 2, 4 or 8.
    pub fn from_bytes(n: usize) -> Option<Width> {
        match n {
            1 => Some(Width::B1),
            2 => Some(Width::B2),
            4 => Some(Width::B4),
            8 => Some(Width::B8),
            _ => None,
        }
    }

    /// Size in bytes.
    pub fn bytes(self) -> usize {
        self as usize
    }
}

/// Device-memory backing: zero-initialised, aligned to [`BUFFER_ALIGN`], fixed length.
pub struct Buffer {
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes kernels may touch (at least `len`): an allocation rounded up to its alignment,
    /// whose slack kernels may overrun into as on a GPU; host copies stay within `len`.
    reach: usize,
    /// Where the bytes live, for `Drop`.
    backing: Backing,
    /// Kernel pin count plus the `HOST_BULK` bit (see the module documentation).
    state: AtomicUsize,
}

// SAFETY: the buffer owns its allocation; all shared mutation goes through atomics or through
// plain copies that the pin protocol makes exclusive, so it can move to and be shared by threads.
unsafe impl Send for Buffer {}
// SAFETY: see `Send`: concurrent `&Buffer` users only perform atomic accesses, except host bulk
// copies, which run non-atomically only while `HOST_BULK` excludes every kernel pin.
unsafe impl Sync for Buffer {}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer").field("len", &self.len).finish()
    }
}

impl Buffer {
    /// Allocates `len` zeroed bytes. Fails instead of aborting when the host is out of memory.
    pub fn new_zeroed(len: usize) -> Result<Buffer, AllocError> {
        Self::new_zeroed_reaching(len, len)
    }

    /// Allocates `reach` zeroed bytes (at least `len`), of which host copies use `len` and
    /// kernels all.
    pub fn new_zeroed_reaching(len: usize, reach: usize) -> Result<Buffer, AllocError> {
        let (len, reach) = (len, reach.max(len));
        if reach == 0 {
            // A well-aligned dangling pointer: no byte is ever accessed through it.
            let ptr = NonNull::new(BUFFER_ALIGN as *mut u8).ok_or(AllocError { len })?;
            return Ok(Buffer {
                ptr,
                len,
                reach,
                backing: Backing::None,
                state: AtomicUsize::new(0),
            });
        }
        let (ptr, backing) = if reach >= HUGE_BACKING_MIN {
            let m = HugeMapping::new(reach).map_err(|_| AllocError { len })?;
            (m.as_non_null(), Backing::Mapped { mapping: m })
        } else {
            let layout =
                Layout::from_size_align(reach, BUFFER_ALIGN).map_err(|_| AllocError { len })?;
            // SAFETY: `layout` has a non-zero size (checked above) and a valid power-of-two
            // alignment.
            let raw = unsafe { alloc::alloc_zeroed(layout) };
            (
                NonNull::new(raw).ok_or(AllocError { len })?,
                Backing::Heap(layout),
            )
        };
        Ok(Buffer {
            ptr,
            len,
            reach,
            backing,
            state: AtomicUsize::new(0),
        })
    }

    /// Length in bytes (what host copies may use).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes kernels may touch (at least [`Buffer::len`]).
    pub fn reach(&self) -> usize {
        self.reach
    }

    /// A new buffer holding this one's bytes, made without copying them where this one is a
    /// mapping of its own: its pages move to the new buffer (`HugeMapping::take_pages`) and this
    /// one reads as zeros afterwards. `None`, changing nothing, for a heap-backed buffer, while
    /// a kernel or another host operation uses it, or where the kernel cannot move pages; the
    /// caller then copies. For moving an allocation's backing (the simulated GPU's demotion and
    /// promotion) when nothing else holds it.
    pub fn take_backing(&self) -> Option<Buffer> {
        let Backing::Mapped { mapping } = &self.backing else {
            return None;
        };
        let access = self.try_acquire_host()?;
        if access != HostAccess::Exclusive {
            self.release_host(access);
            return None;
        }
        // Exclusive: no kernel pin and no other host operation touches the bytes while the
        // pages move.
        let moved = mapping.take_pages();
        self.release_host(access);
        let m = moved.ok()?;
        Some(Buffer {
            ptr: m.as_non_null(),
            len: self.len,
            reach: self.reach,
            backing: Backing::Mapped { mapping: m },
            state: AtomicUsize::new(0),
        })
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), OutOfRange> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(OutOfRange {
                offset,
                len,
                buf_len: self.len,
            }),
        }
    }

    /// Takes the buffer for a host bulk operation: `Exclusive` (plain copies allowed) when nobody
    /// uses it, `Pinned` (atomic copies only) when kernels hold pins. Returns `None` while another
    /// host operation holds it exclusively (the caller retries; it never waits while holding).
    fn try_acquire_host(&self) -> Option<HostAccess> {
        let cur = self.state.load(Ordering::Relaxed);
        if cur & HOST_BULK != 0 {
            return None;
        }
        let (new, access) = if cur == 0 {
            (HOST_BULK, HostAccess::Exclusive)
        } else {
            (cur + 1, HostAccess::Pinned)
        };
        self.state
            .compare_exchange(cur, new, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| access)
    }

    fn acquire_host(&self) -> HostAccess {
        loop {
            if let Some(a) = self.try_acquire_host() {
                return a;
            }
            std::thread::yield_now();
        }
    }

    fn release_host(&self, access: HostAccess) {
        match access {
            HostAccess::Exclusive => self.state.fetch_and(!HOST_BULK, Ordering::Release),
            HostAccess::Pinned => self.state.fetch_sub(1, Ordering::Release),
        };
    }

    /// Pins the buffer for a running kernel and returns the view through which kernels access it.
    /// Waits (briefly) while a plain host bulk copy is in progress; the pin is released when the
    /// view is dropped. While pinned, host bulk operations copy with atomics.
    pub fn kernel_view(self: &std::sync::Arc<Self>) -> KernelView {
        loop {
            let cur = self.state.load(Ordering::Relaxed);
            if cur & HOST_BULK == 0
                && self
                    .state
                    .compare_exchange_weak(cur, cur + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return KernelView { buf: self.clone() };
            }
            std::thread::yield_now();
        }
    }

    /// Copies `src` into the buffer at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), OutOfRange> {
        self.write_gathered(offset, &[src])
    }

    /// Copies `pieces`, back to back, into the buffer from `offset`, as one host operation (one
    /// range check, one acquisition): a scatter-gather copy out of guest pages.
    pub fn write_gathered(&self, offset: usize, pieces: &[&[u8]]) -> Result<(), OutOfRange> {
        let total = self.check_pieces(offset, pieces.iter().map(|p| p.len()))?;
        if total == 0 {
            return Ok(());
        }
        let access = self.acquire_host();
        let mut at = offset;
        for src in pieces {
            if access == HostAccess::Exclusive {
                let dst = self.ptr.as_ptr().wrapping_add(at);
                // SAFETY: `at..at + len` is inside the allocation (all pieces checked together);
                // `HOST_BULK` guarantees that no kernel and no other host operation accesses the
                // buffer meanwhile, so this slice is its only user until it is dropped below;
                // `src` is a distinct Rust slice, so the two do not overlap.
                let dst = unsafe { std::slice::from_raw_parts_mut(dst, src.len()) };
                copy_in_pieces(dst, src);
            } else {
                for (i, b) in src.iter().enumerate() {
                    self.byte(at + i).store(*b, Ordering::Relaxed);
                }
            }
            at += src.len();
        }
        self.release_host(access);
        Ok(())
    }

    /// Copies bytes at `offset` into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), OutOfRange> {
        self.read_scattered(offset, &mut [dst])
    }

    /// Fills `pieces`, in order, with the buffer's bytes from `offset`, as one host operation.
    pub fn read_scattered(
        &self,
        offset: usize,
        pieces: &mut [&mut [u8]],
    ) -> Result<(), OutOfRange> {
        let total = self.check_pieces(offset, pieces.iter().map(|p| p.len()))?;
        if total == 0 {
            return Ok(());
        }
        let access = self.acquire_host();
        let mut at = offset;
        for dst in pieces.iter_mut() {
            if access == HostAccess::Exclusive {
                let from = self.ptr.as_ptr().wrapping_add(at).cast_const();
                // SAFETY: in range (all pieces checked together); `HOST_BULK` excludes kernels and
                // other host operations, so nothing writes these bytes while the slice lives;
                // `dst` is a distinct exclusive Rust slice.
                let src = unsafe { std::slice::from_raw_parts(from, dst.len()) };
                copy_in_pieces(dst, src);
            } else {
                for (i, b) in dst.iter_mut().enumerate() {
                    *b = self.byte(at + i).load(Ordering::Relaxed);
                }
            }
            at += dst.len();
        }
        self.release_host(access);
        Ok(())
    }

    /// Checks that pieces of these lengths fit back to back from `offset`; returns their total.
    fn check_pieces(
        &self,
        offset: usize,
        lens: impl Iterator<Item = usize>,
    ) -> Result<usize, OutOfRange> {
        let mut total = 0usize;
        for len in lens {
            total = total.checked_add(len).ok_or(OutOfRange {
                offset,
                len: usize::MAX,
                buf_len: self.len,
            })?;
        }
        self.check(offset, total)?;
        Ok(total)
    }

    /// Writes `count` copies of `pattern` (1, 2 or 4 bytes, like cuMemsetD8/16/32) from `offset`.
    pub fn fill(&self, offset: usize, pattern: &[u8], count: usize) -> Result<(), OutOfRange> {
        let total = count.checked_mul(pattern.len()).ok_or(OutOfRange {
            offset,
            len: usize::MAX,
            buf_len: self.len,
        })?;
        self.check(offset, total)?;
        if total == 0 {
            return Ok(());
        }
        let access = self.acquire_host();
        if access == HostAccess::Exclusive {
            // `[offset, offset + total)` is inside the allocation (checked) and `HOST_BULK` gives
            // this call exclusive access, so a temporary `&mut [u8]` over it is unique.
            let start = self.ptr.as_ptr().wrapping_add(offset);
            // SAFETY: see above: the range is in bounds and exclusively held.
            let dst = unsafe { std::slice::from_raw_parts_mut(start, total) };
            if pattern.len() == 1 {
                dst.fill(pattern[0]);
            } else {
                for chunk in dst.chunks_exact_mut(pattern.len()) {
                    chunk.copy_from_slice(pattern);
                }
            }
        } else {
            for i in 0..total {
                self.byte(offset + i)
                    .store(pattern[i % pattern.len()], Ordering::Relaxed);
            }
        }
        self.release_host(access);
        Ok(())
    }

    /// Copies `len` bytes from `src` at `src_offset` to this buffer at `offset`. `src` may be `self`;
    /// overlapping ranges behave like `memmove`.
    pub fn copy_from(
        &self,
        offset: usize,
        src: &Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<(), OutOfRange> {
        self.check(offset, len)?;
        src.check(src_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let same = std::ptr::eq(self, src);
        let (dst_access, src_access) = loop {
            let Some(d) = self.try_acquire_host() else {
                std::thread::yield_now();
                continue;
            };
            if same {
                break (d, d);
            }
            match src.try_acquire_host() {
                Some(s) => break (d, s),
                None => {
                    // Never wait while holding: let the other host operation finish first.
                    self.release_host(d);
                    std::thread::yield_now();
                }
            }
        };
        let release = || {
            if !same {
                src.release_host(src_access);
            }
            self.release_host(dst_access);
        };
        if dst_access == HostAccess::Exclusive && src_access == HostAccess::Exclusive {
            let (from, to) = (
                src.ptr.as_ptr().wrapping_add(src_offset),
                self.ptr.as_ptr().wrapping_add(offset),
            );
            // SAFETY: both ranges are inside their allocations (checked); both buffers are held
            // exclusively through `HOST_BULK`; `move_in_pieces` allows overlap (memmove).
            unsafe { move_in_pieces(from.cast_const(), to, len) };
            release();
            return Ok(());
        }
        // Atomic byte copy, in the direction that makes overlap behave like memmove.
        if same && offset > src_offset {
            for i in (0..len).rev() {
                let b = src.byte(src_offset + i).load(Ordering::Relaxed);
                self.byte(offset + i).store(b, Ordering::Relaxed);
            }
        } else {
            for i in 0..len {
                let b = src.byte(src_offset + i).load(Ordering::Relaxed);
                self.byte(offset + i).store(b, Ordering::Relaxed);
            }
        }
        release();
        Ok(())
    }

    /// The byte at `offset` as an atomic. The caller has checked `offset < len`.
    fn byte(&self, offset: usize) -> &AtomicU8 {
        debug_assert!(offset < self.len);
        // SAFETY: `offset < len`, so the pointer is inside the live allocation, which outlives
        // `&self`; every concurrent access to these bytes is atomic or excluded by `HOST_BULK`.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().wrapping_add(offset)) }
    }
}

/// How a host bulk operation holds a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HostAccess {
    /// No kernel and no other host operation uses it: plain copies are allowed.
    Exclusive,
    /// Kernels hold pins: copy with atomics.
    Pinned,
}

/// A running kernel's pinned handle on a [`Buffer`]: every access is a naturally aligned atomic
/// operation, bounds- and alignment-checked. Dropping it releases the pin.
pub struct KernelView {
    buf: std::sync::Arc<Buffer>,
}

impl Drop for KernelView {
    fn drop(&mut self) {
        self.buf.state.fetch_sub(1, Ordering::Release);
    }
}

impl KernelView {
    /// Bytes of the pinned buffer kernels may touch ([`Buffer::reach`]).
    #[inline]
    pub fn reach(&self) -> usize {
        self.buf.reach
    }

    /// Checks that `[offset, offset + width)` lies inside the buffer and is naturally aligned.
    #[inline]
    fn check_access(&self, offset: u64, width: usize) -> Result<usize, AccessError> {
        let off = usize::try_from(offset).map_err(|_| AccessError::OutOfRange)?;
        if off >= self.buf.reach || self.buf.reach - off < width {
            return Err(AccessError::OutOfRange);
        }
        if off & (width - 1) != 0 {
            return Err(AccessError::Misaligned);
        }
        Ok(off)
    }

    /// The atomic views of the naturally aligned word at a checked offset. Each is the only
    /// way kernel code touches buffer bytes.
    fn a8(&self, off: usize) -> &AtomicU8 {
        let p = self.buf.ptr.as_ptr().wrapping_add(off);
        // SAFETY: `off` passed `check_access` (in bounds); the allocation outlives `&self` (the
        // view holds an `Arc`); all concurrent accesses are atomic or excluded by `HOST_BULK`,
        // which cannot be set while this view's pin is held.
        unsafe { AtomicU8::from_ptr(p) }
    }

    fn a16(&self, off: usize) -> &AtomicU16 {
        let p = self.buf.ptr.as_ptr().wrapping_add(off).cast::<u16>();
        // SAFETY: as in `a8`; `check_access` also verified 2-byte alignment (base 256-aligned).
        unsafe { AtomicU16::from_ptr(p) }
    }

    fn a32(&self, off: usize) -> &AtomicU32 {
        let p = self.buf.ptr.as_ptr().wrapping_add(off).cast::<u32>();
        // SAFETY: as in `a8`; `check_access` also verified 4-byte alignment (base 256-aligned).
        unsafe { AtomicU32::from_ptr(p) }
    }

    fn a64(&self, off: usize) -> &AtomicU64 {
        let p = self.buf.ptr.as_ptr().wrapping_add(off).cast::<u64>();
        // SAFETY: as in `a8`; `check_access` also verified 8-byte alignment (base 256-aligned).
        unsafe { AtomicU64::from_ptr(p) }
    }

    /// Atomic (relaxed unless `ord` says otherwise) load of `width` bytes, zero-extended.
    #[inline]
    pub fn kernel_load(
        &self,
        offset: u64,
        width: Width,
        ord: Ordering,
    ) -> Result<u64, AccessError> {
        let off = self.check_access(offset, width.bytes())?;
        let ord = load_order(ord);
        Ok(match width {
            Width::B1 => u64::from(self.a8(off).load(ord)),
            Width::B2 => u64::from(self.a16(off).load(ord)),
            Width::B4 => u64::from(self.a32(off).load(ord)),
            Width::B8 => self.a64(off).load(ord),
        })
    }

    /// Atomic store of the low `width` bytes of `value`.
    #[inline]
    pub fn kernel_store(
        &self,
        offset: u64,
        width: Width,
        value: u64,
        ord: Ordering,
    ) -> Result<(), AccessError> {
        let off = self.check_access(offset, width.bytes())?;
        let ord = store_order(ord);
        match width {
            Width::B1 => self.a8(off).store(value as u8, ord),
            Width::B2 => self.a16(off).store(value as u16, ord),
            Width::B4 => self.a32(off).store(value as u32, ord),
            Width::B8 => self.a64(off).store(value, ord),
        }
        Ok(())
    }

    /// Atomic read-modify-write of a 4-byte word: stores `f(old)` and returns `old`.
    #[inline]
    pub fn kernel_update_u32(
        &self,
        offset: u64,
        mut f: impl FnMut(u32) -> u32,
    ) -> Result<u32, AccessError> {
        let off = self.check_access(offset, 4)?;
        let a = self.a32(off);
        Ok(
            match a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| Some(f(v))) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    /// Atomic read-modify-write of an 8-byte word: stores `f(old)` and returns `old`.
    #[inline]
    pub fn kernel_update_u64(
        &self,
        offset: u64,
        mut f: impl FnMut(u64) -> u64,
    ) -> Result<u64, AccessError> {
        let off = self.check_access(offset, 8)?;
        let a = self.a64(off);
        Ok(
            match a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| Some(f(v))) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    /// Atomic read-modify-write of a 2-byte word: stores `f(old)` and returns `old`.
    #[inline]
    pub fn kernel_update_u16(
        &self,
        offset: u64,
        mut f: impl FnMut(u16) -> u16,
    ) -> Result<u16, AccessError> {
        let off = self.check_access(offset, 2)?;
        let a = self.a16(off);
        Ok(
            match a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| Some(f(v))) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    /// Atomic fetch-add on a 4-byte word (the common atomic, done with one locked instruction).
    #[inline]
    pub fn kernel_fetch_add_u32(&self, offset: u64, v: u32) -> Result<u32, AccessError> {
        let off = self.check_access(offset, 4)?;
        let a = self.a32(off);
        Ok(a.fetch_add(v, Ordering::SeqCst))
    }

    /// Atomic fetch-add on an 8-byte word.
    #[inline]
    pub fn kernel_fetch_add_u64(&self, offset: u64, v: u64) -> Result<u64, AccessError> {
        let off = self.check_access(offset, 8)?;
        let a = self.a64(off);
        Ok(a.fetch_add(v, Ordering::SeqCst))
    }
}

fn load_order(ord: Ordering) -> Ordering {
    match ord {
        Ordering::Release | Ordering::AcqRel => Ordering::Acquire,
        o => o,
    }
}

fn store_order(ord: Ordering) -> Ordering {
    match ord {
        Ordering::Acquire | Ordering::AcqRel => Ordering::Release,
        o => o,
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Backing::Heap(layout) = self.backing {
            // SAFETY: `ptr` was returned by `alloc_zeroed` with this layout and is freed once.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
        // A `Mapped` backing unmaps itself when dropped, after this.
    }
}

/// Where a buffer's bytes live.
#[derive(Debug)]
enum Backing {
    /// Zero-length: nothing allocated.
    None,
    /// The global allocator, with this layout.
    Heap(Layout),
    /// A huge-page-advised mapping of its own, held for its `Drop` (which unmaps it) and for
    /// [`Buffer::take_backing`]. The buffer reaches its bytes only through its raw pointer
    /// (never through the mapping's slices), under the pin protocol.
    Mapped { mapping: HugeMapping },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn zeroed_aligned_and_bounds_checked() {
        let b = Buffer::new_zeroed(1000).unwrap();
        assert_eq!(b.len(), 1000);
        assert_eq!(b.ptr.as_ptr() as usize % BUFFER_ALIGN, 0);
        let mut out = vec![1u8; 1000];
        b.read(0, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 0));
        assert!(b.write(999, &[1, 2]).is_err());
        assert!(b.read(usize::MAX, &mut [0u8; 2]).is_err());
        assert!(b.fill(0, &[1, 2], usize::MAX).is_err());
        let z = Buffer::new_zeroed(0).unwrap();
        assert!(z.is_empty());
        z.write(0, &[]).unwrap();
        assert!(z.write(0, &[1]).is_err());
        let z = Arc::new(z).kernel_view();
        assert_eq!(
            z.kernel_load(0, Width::B1, Ordering::Relaxed),
            Err(AccessError::OutOfRange)
        );
    }

    #[test]
    fn a_mapped_backing_moves_without_a_copy_and_a_pinned_one_does_not() {
        let len = HUGE_BACKING_MIN + 4096;
        let b = std::sync::Arc::new(Buffer::new_zeroed(len).unwrap());
        b.fill(0, &[1, 2, 3, 4], len / 4).unwrap();
        let pinned = b.kernel_view();
        assert!(b.take_backing().is_none(), "a kernel holds it");
        drop(pinned);
        let Some(n) = b.take_backing() else {
            // A kernel before 5.7 (no MREMAP_DONTUNMAP): callers copy.
            return;
        };
        let mut out = vec![0u8; len];
        n.read(0, &mut out).unwrap();
        assert!(
            out.iter()
                .enumerate()
                .all(|(i, &x)| x == [1, 2, 3, 4][i % 4])
        );
        b.read(0, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 0), "the old backing is empty");
        let small = Buffer::new_zeroed(HUGE_BACKING_MIN - 1).unwrap();
        assert!(small.take_backing().is_none(), "heap buffers are copied");
    }

    #[test]
    fn large_buffers_are_their_own_huge_page_advised_mappings() {
        use vgpu_hugemem::HUGE_PAGE;
        use vgpu_hugemem::testutils::{advised_huge, range_of, smaps_entry};
        let len = 3 * HUGE_BACKING_MIN + 100;
        let b = Buffer::new_zeroed(len).unwrap();
        let addr = b.ptr.as_ptr() as usize;
        assert_eq!(addr % HUGE_PAGE, 0, "2 MiB aligned");
        // Zeroed, and every byte up to the end is usable.
        let mut out = vec![1u8; 4096];
        b.read(len - 4096, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 0));
        b.fill(0, &[7], len).unwrap();
        b.read(len - 4096, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 7));
        assert!(b.write(len, &[1]).is_err());
        // Its own mapping, rounded up to whole huge pages and advised for THP.
        let entry = smaps_entry(addr).expect("the buffer is a mapping of its own");
        assert_eq!(
            range_of(&entry),
            Some((addr, addr + 4 * HUGE_PAGE)),
            "{entry}"
        );
        assert!(advised_huge(&entry), "{entry}");
        drop(b);
        assert!(
            smaps_entry(addr).is_none_or(|e| range_of(&e) != Some((addr, addr + 4 * HUGE_PAGE))),
            "the mapping goes with the buffer"
        );
        // Below the threshold: the heap, as before.
        let small = Buffer::new_zeroed(HUGE_BACKING_MIN - 1).unwrap();
        assert!(matches!(small.backing, Backing::Heap(_)));
    }

    #[test]
    fn gathered_and_scattered_copies_are_back_to_back_and_all_or_nothing() {
        let b = Arc::new(Buffer::new_zeroed(64).unwrap());
        let (x, y, z) = ([1u8, 2, 3], [], [4u8; 5]);
        b.write_gathered(10, &[&x, &y, &z]).unwrap();
        let mut out = [0u8; 10];
        b.read(9, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3, 4, 4, 4, 4, 4, 0]);
        // Scattered reads split the same bytes over pieces of any size, empty ones included.
        let (mut p, mut q, mut r) = ([0u8; 2], [0u8; 0], [0u8; 7]);
        b.read_scattered(10, &mut [&mut p, &mut q, &mut r]).unwrap();
        assert_eq!((p, r), ([1, 2], [3, 4, 4, 4, 4, 4, 0]));
        // Pieces that run past the end are refused whole: nothing is written.
        let e = b.write_gathered(60, &[&[9u8; 3], &[9u8; 3]]).unwrap_err();
        assert_eq!((e.offset, e.len, e.buf_len), (60, 6, 64));
        let mut tail = [1u8; 4];
        b.read(60, &mut tail).unwrap();
        assert_eq!(tail, [0; 4]);
        assert!(
            b.read_scattered(62, &mut [&mut [0u8; 1], &mut [0u8; 2]])
                .is_err()
        );
        // The same through the atomic path, while a "kernel" holds the buffer.
        let view = b.kernel_view();
        b.write_gathered(0, &[&[7u8; 2], &[8u8; 2]]).unwrap();
        let (mut c, mut d) = ([0u8; 3], [0u8; 1]);
        b.read_scattered(0, &mut [&mut c, &mut d]).unwrap();
        assert_eq!((c, d), ([7, 7, 8], [8]));
        drop(view);
    }

    #[test]
    fn huge_allocation_fails_cleanly() {
        assert!(Buffer::new_zeroed(usize::MAX - 4096).is_err());
        assert!(Buffer::new_zeroed(1 << 60).is_err());
    }

    #[test]
    fn copies_longer_than_a_piece_move_every_byte_and_overlap_like_memmove() {
        let len = 3 * COPY_PIECE + 4099;
        let pattern = |seed: usize| -> Vec<u8> {
            (0..len)
                .map(|i| (i.wrapping_mul(31).wrapping_add(seed * 7 + i / 251) % 253) as u8)
                .collect()
        };
        // Whole and in a gathered/scattered mix of piece-straddling parts.
        let b = Buffer::new_zeroed(len).unwrap();
        let data = pattern(1);
        let cut = [COPY_PIECE - 1, COPY_PIECE + 1, len - 2 * COPY_PIECE - 3];
        let (a, rest) = data.split_at(cut[0]);
        let (c, d) = rest.split_at(cut[1]);
        b.write_gathered(0, &[a, c, d]).unwrap();
        let mut whole = vec![0u8; len];
        b.read(0, &mut whole).unwrap();
        assert!(whole == data, "gathered write, whole read");
        let mut parts = [vec![0u8; cut[2]], vec![0u8; len - cut[2]]];
        let [p0, p1] = &mut parts;
        b.read_scattered(0, &mut [&mut p0[..], &mut p1[..]])
            .unwrap();
        assert!(parts.concat() == data, "scattered read");
        let mut direct = vec![0u8; len];
        copy_in_pieces(&mut direct, &data);
        assert!(direct == data, "copy_in_pieces");
        // Overlapping moves within one buffer, both ways, by less and more than a piece.
        for shift in [1, 4096, COPY_PIECE - 1, COPY_PIECE + 5] {
            let n = len - shift;
            for (src, dst) in [(0, shift), (shift, 0)] {
                b.write(0, &data).unwrap();
                b.copy_from(dst, &b, src, n).unwrap();
                let mut want = data.clone();
                want.copy_within(src..src + n, dst);
                b.read(0, &mut whole).unwrap();
                assert!(whole == want, "move {src} -> {dst} of {n} bytes");
            }
        }
        // Between two buffers.
        let other = Buffer::new_zeroed(len).unwrap();
        other.copy_from(0, &b, 0, len).unwrap();
        let mut back = vec![0u8; len];
        other.read(0, &mut back).unwrap();
        b.read(0, &mut whole).unwrap();
        assert!(back == whole, "buffer to buffer");
    }

    #[test]
    fn fill_patterns_and_memmove() {
        let b = Buffer::new_zeroed(64).unwrap();
        b.fill(2, &[0xab, 0xcd], 3).unwrap();
        let mut out = [0u8; 10];
        b.read(0, &mut out).unwrap();
        assert_eq!(out, [0, 0, 0xab, 0xcd, 0xab, 0xcd, 0xab, 0xcd, 0, 0]);
        b.write(0, &(0u8..16).collect::<Vec<_>>()).unwrap();
        b.copy_from(4, &b, 0, 8).unwrap();
        let mut out = [0u8; 12];
        b.read(0, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7]);
        b.copy_from(0, &b, 4, 8).unwrap();
        b.read(0, &mut out).unwrap();
        assert_eq!(&out[..8], &[0, 1, 2, 3, 4, 5, 6, 7]);
        // Same through the atomic path (buffer pinned by a "kernel").
        let b = Arc::new(b);
        let view = b.kernel_view();
        b.copy_from(2, &b, 0, 8).unwrap();
        b.read(0, &mut out).unwrap();
        assert_eq!(&out[..10], &[0, 1, 0, 1, 2, 3, 4, 5, 6, 7]);
        b.fill(0, &[9], 2).unwrap();
        assert_eq!(
            view.kernel_load(0, Width::B2, Ordering::Relaxed),
            Ok(0x0909)
        );
        drop(view);
        assert_eq!(b.state.load(Ordering::Relaxed), 0);
        b.read(0, &mut out[..2]).unwrap();
        assert_eq!(&out[..2], &[9, 9]);
    }

    #[test]
    fn kernel_accessors_check_alignment_and_range() {
        let b = Arc::new(Buffer::new_zeroed(16).unwrap()).kernel_view();
        b.kernel_store(8, Width::B8, 0x1122_3344_5566_7788, Ordering::Relaxed)
            .unwrap();
        assert_eq!(
            b.kernel_load(8, Width::B4, Ordering::Relaxed),
            Ok(0x5566_7788)
        );
        assert_eq!(b.kernel_load(14, Width::B2, Ordering::Relaxed), Ok(0x1122));
        assert_eq!(
            b.kernel_load(2, Width::B4, Ordering::Relaxed),
            Err(AccessError::Misaligned)
        );
        assert_eq!(
            b.kernel_load(16, Width::B4, Ordering::Relaxed),
            Err(AccessError::OutOfRange)
        );
        assert_eq!(
            b.kernel_load(u64::MAX - 1, Width::B2, Ordering::Relaxed),
            Err(AccessError::OutOfRange)
        );
        assert_eq!(b.kernel_fetch_add_u32(0, 5), Ok(0));
        assert_eq!(b.kernel_update_u32(0, |v| v * 3), Ok(5));
        assert_eq!(b.kernel_load(0, Width::B4, Ordering::Relaxed), Ok(15));
    }

    #[test]
    fn concurrent_atomics_and_host_copies_are_consistent() {
        let b = Arc::new(Buffer::new_zeroed(4096).unwrap());
        std::thread::scope(|s| {
            for _ in 0..2 {
                let b = &b;
                s.spawn(move || {
                    for _ in 0..10 {
                        let v = b.kernel_view();
                        for _ in 0..100 {
                            v.kernel_fetch_add_u32(0, 1).unwrap();
                        }
                    }
                });
            }
            let b = &b;
            s.spawn(move || {
                let mut tmp = vec![0u8; 1024];
                for _ in 0..100 {
                    b.read(1024, &mut tmp).unwrap();
                    b.write(2048, &tmp).unwrap();
                }
            });
        });
        assert_eq!(
            b.kernel_view().kernel_load(0, Width::B4, Ordering::Relaxed),
            Ok(2000)
        );
    }
}
