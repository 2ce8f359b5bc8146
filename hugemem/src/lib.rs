//! Zeroed anonymous memory in a mapping of its own, 2 MiB aligned and advised to use
//! transparent huge pages (`MADV_HUGEPAGE`).
//!
//! Two users: the simulated GPU keeps its allocations of 2 MiB and more in these, as a GPU maps
//! large allocations with large pages (copies between huge-page guest RAM and device memory
//! then take a TLB miss per 2 MiB instead of per 4 KiB); and the guest shim backs large
//! `cuMemHostAlloc` buffers with them, so that in a guest whose THP mode is `madvise` (Ubuntu's
//! default) an application's pinned buffers are physically contiguous 2 MiB runs, which the
//! virtio-vgpu module hands to the device as few, large descriptors.
//!
//! Pages are faulted in on first touch, in 2 MiB steps where the kernel grants huge pages; where
//! THP is off the advice is ignored and the memory simply uses 4 KiB pages.

use std::ptr::NonNull;

/// One x86-64 / arm64 huge page: the alignment and granularity of a mapping.
pub const HUGE_PAGE: usize = 2 << 20;

/// Where the kernel says whether it has transparent huge pages and in which mode.
pub const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// The selected mode in the text of [`THP_ENABLED`] (`always [madvise] never` → `madvise`).
pub fn thp_mode_of(text: &str) -> Option<&str> {
    let open = text.find('[')?;
    let close = text[open..].find(']')? + open;
    Some(&text[open + 1..close])
}

/// A mapping could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot map {len} bytes of huge-page-advised memory")]
pub struct MapError {
    /// The requested length.
    pub len: usize,
    /// What the kernel said, if it was asked.
    #[source]
    pub source: Option<std::io::Error>,
}

/// Zeroed anonymous memory of its own mapping (see the crate documentation).
#[derive(Debug)]
pub struct HugeMapping {
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes mapped: `len` rounded up to whole huge pages.
    mapped: usize,
}

// SAFETY: the mapping is owned exclusively, like a `Vec<u8>`; shared access is `&[u8]` only.
unsafe impl Send for HugeMapping {}
// SAFETY: as above: `&HugeMapping` gives out nothing but shared slices.
unsafe impl Sync for HugeMapping {}

impl HugeMapping {
    /// Maps `len` zeroed bytes (at least one).
    pub fn new(len: usize) -> Result<HugeMapping, MapError> {
        let fail = |source| MapError { len, source };
        let mapped = len
            .max(1)
            .checked_next_multiple_of(HUGE_PAGE)
            .ok_or_else(|| fail(None))?;
        // Over-map by one huge page so that an aligned start exists, then cut off the slack.
        let reserve = mapped.checked_add(HUGE_PAGE).ok_or_else(|| fail(None))?;
        // SAFETY: a fresh private anonymous mapping at an address of the kernel's choosing; it
        // aliases nothing.
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
            return Err(fail(Some(std::io::Error::last_os_error())));
        }
        let base = raw as usize;
        let start = base.next_multiple_of(HUGE_PAGE);
        let head = start - base;
        let tail = reserve - head - mapped;
        if head > 0 {
            // SAFETY: `base..start` is the front slack of the mapping made above, used by nobody.
            unsafe { libc::munmap(raw, head) };
        }
        if tail > 0 {
            // SAFETY: the `tail` bytes after `start + mapped` are the back slack of the same
            // mapping.
            unsafe { libc::munmap((start + mapped) as *mut libc::c_void, tail) };
        }
        // Advice only: without THP (or with it disabled) the memory works with 4 KiB pages.
        // SAFETY: `start..start + mapped` is our own mapping; the advice changes no contents.
        unsafe { libc::madvise(start as *mut libc::c_void, mapped, libc::MADV_HUGEPAGE) };
        let ptr = NonNull::new(start as *mut u8).ok_or_else(|| fail(None))?;
        Ok(HugeMapping { ptr, len, mapped })
    }

    /// The first byte, for owners that manage access to the memory themselves (and never
    /// through this mapping's slices at the same time).
    pub fn as_non_null(&self) -> NonNull<u8> {
        self.ptr
    }
}

impl std::ops::Deref for HugeMapping {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` lies in our mapping and is initialised (anonymous memory reads
        // as zero); it is mutated only through `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for HugeMapping {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HugeMapping {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr + mapped` is the mapping `new` made and nothing else; no slice into it
        // outlives `self`.
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
        debug_assert_eq!(rc, 0, "munmap of a mapping of our own");
    }
}

pub mod testutils;

#[cfg(test)]
mod tests {
    use super::testutils::{advised_huge, range_of, smaps_entry, thp_mode};
    use super::*;

    #[test]
    fn a_mapping_is_aligned_zeroed_advised_and_goes_when_dropped() {
        let len = 3 * HUGE_PAGE + 100;
        let mut m = HugeMapping::new(len).unwrap();
        let addr = m.as_ptr() as usize;
        assert_eq!(addr % HUGE_PAGE, 0, "2 MiB aligned");
        assert_eq!(m.len(), len);
        assert!(m.iter().all(|&x| x == 0));
        m[len - 1] = 9;
        assert_eq!(m[len - 1], 9);
        // Its own mapping, rounded up to whole huge pages, advised for THP; the kernel reports it
        // eligible unless the host has THP switched off.
        let entry = smaps_entry(addr).expect("the mapping is listed");
        assert_eq!(
            range_of(&entry),
            Some((addr, addr + 4 * HUGE_PAGE)),
            "{entry}"
        );
        assert!(advised_huge(&entry), "{entry}");
        if thp_mode().is_some_and(|m| m != "never") {
            let eligible = entry
                .lines()
                .find_map(|l| l.strip_prefix("THPeligible:"))
                .map(str::trim);
            assert_eq!(eligible, Some("1"), "{entry}");
        }
        drop(m);
        assert!(
            smaps_entry(addr).is_none_or(|e| range_of(&e) != Some((addr, addr + 4 * HUGE_PAGE))),
            "the mapping goes with the value"
        );
    }

    #[test]
    fn the_thp_mode_is_the_bracketed_word() {
        assert_eq!(thp_mode_of("always [madvise] never\n"), Some("madvise"));
        assert_eq!(thp_mode_of("[always] madvise never"), Some("always"));
        assert_eq!(thp_mode_of("madvise"), None);
    }

    #[test]
    fn absurd_lengths_fail_cleanly() {
        assert!(HugeMapping::new(usize::MAX - 4096).is_err());
        let e = HugeMapping::new(1 << 60).unwrap_err();
        assert!(e.source.is_some(), "the kernel refused it: {e}");
    }
}
