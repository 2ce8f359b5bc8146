//! Host buffers backed by transparent huge pages, for the benchmarks' second memcpy baseline:
//! the simulated GPU keeps large allocations in huge-page-advised mappings (`vgpu-ptx`'s
//! `Buffer`), so a copy into it is also compared with a memcpy between two such buffers, the
//! fastest plain copy this host offers.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// One x86-64 / arm64 huge page.
const HUGE_PAGE: usize = 2 << 20;

/// A zeroed, 2 MiB-aligned anonymous mapping advised to use transparent huge pages.
#[derive(Debug)]
pub struct HugeBuf {
    ptr: NonNull<u8>,
    len: usize,
    mapped: usize,
}

impl HugeBuf {
    /// Maps `len` bytes (`len` ≥ 1) and touches them all, so that the huge pages exist before
    /// anything is timed.
    pub fn new(len: usize) -> Result<HugeBuf, String> {
        let fail = || format!("cannot map {len} bytes of huge-page-advised memory");
        let mapped = len
            .max(1)
            .checked_next_multiple_of(HUGE_PAGE)
            .ok_or_else(fail)?;
        let reserve = mapped.checked_add(HUGE_PAGE).ok_or_else(fail)?;
        // SAFETY: a fresh private anonymous mapping at an address of the kernel's choosing.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(fail());
        }
        let base = raw as usize;
        let start = base.next_multiple_of(HUGE_PAGE);
        let (head, tail) = (start - base, reserve - (start - base) - mapped);
        if head > 0 {
            // SAFETY: the front slack of the mapping made above; nothing uses it.
            unsafe { libc::munmap(raw, head) };
        }
        if tail > 0 {
            // SAFETY: the back slack of the same mapping; nothing uses it.
            unsafe { libc::munmap((start + mapped) as *mut libc::c_void, tail) };
        }
        // SAFETY: our own mapping; advice changes no contents (ignored where THP is off).
        unsafe { libc::madvise(start as *mut libc::c_void, mapped, libc::MADV_HUGEPAGE) };
        let mut buf = HugeBuf {
            ptr: NonNull::new(start as *mut u8).ok_or_else(fail)?,
            len,
            mapped,
        };
        buf.fill(0x3c);
        Ok(buf)
    }
}

impl Deref for HugeBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` lies in our mapping, is initialised (anonymous pages read as
        // zero) and is only mutated through `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for HugeBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HugeBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made; no slice into it outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
    }
}

// SAFETY: the buffer owns its mapping exclusively, like a `Vec<u8>`.
unsafe impl Send for HugeBuf {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_buffer_is_aligned_filled_and_writable() {
        let mut b = HugeBuf::new(HUGE_PAGE + 5).unwrap();
        assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(b.len(), HUGE_PAGE + 5);
        assert!(b.iter().all(|&x| x == 0x3c));
        b[HUGE_PAGE + 4] = 9;
        assert_eq!(b[HUGE_PAGE + 4], 9);
    }
}
