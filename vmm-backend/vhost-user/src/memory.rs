//! Finding guest memory for descriptor ranges: one region lookup per range, or none where the
//! range lies in the region of the range before it (a chain's buffers usually share a region).

use std::ops::ControlFlow;

use vm_memory::guest_memory::{Error as GuestMemoryError, Result as MemResult};
use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress, VolatileSlice,
};

use crate::GuestMem;

/// One region of [`GuestMem`].
pub type GuestRegion = <GuestMem as GuestMemoryBackend>::R;

/// Whether all of `[addr, addr + len)` is guest RAM: [`region_holding`], or else vm-memory's
/// check of a range across regions.
#[inline]
pub fn in_memory<'m>(
    mem: &'m GuestMem,
    last: &mut Option<&'m GuestRegion>,
    addr: u64,
    len: usize,
) -> bool {
    region_holding(mem, last, addr, len).is_some()
        || GuestMemoryBackend::check_range(mem, GuestAddress(addr), len)
}

/// Calls `f` with `[addr, addr + len)` as slices of guest memory, in order, until it breaks: one
/// slice of the region [`region_holding`] finds (the usual case, at most one lookup), else
/// vm-memory's split at region boundaries, whose slices fail where the range is not guest RAM.
#[inline]
fn for_each_slice<'m, B>(
    mem: &'m GuestMem,
    last: &mut Option<&'m GuestRegion>,
    addr: u64,
    len: usize,
    mut f: impl FnMut(MemResult<VolatileSlice<'m, ()>>) -> ControlFlow<B>,
) -> ControlFlow<B> {
    if let Some(r) = region_holding(mem, last, addr, len) {
        return f(r.get_slice(MemoryRegionAddress(addr - r.start_addr().0), len));
    }
    for slice in GuestMemoryBackend::get_slices(mem, GuestAddress(addr), len) {
        f(slice)?;
    }
    ControlFlow::Continue(())
}

/// Calls `f` with bytes `offset..offset + len` of the byte stream that `ranges` spell (each a
/// guest address and a length, in order; clipped where the stream ends) as slices of guest
/// memory, in order, until it breaks, without building that part as ranges of its own. `f` also
/// gets the guest address where the slice's part of its range starts. Ranges in the region of
/// the range before them cost no lookup ([`for_each_slice`]).
pub fn for_each_slice_of_ranges<'m, B>(
    mem: &'m GuestMem,
    ranges: impl IntoIterator<Item = (u64, usize)>,
    offset: usize,
    len: usize,
    mut f: impl FnMut(u64, MemResult<VolatileSlice<'m, ()>>) -> ControlFlow<B>,
) -> ControlFlow<B> {
    let mut last: Option<&'m GuestRegion> = None;
    let (mut skip, mut left) = (offset, len);
    for (addr, range_len) in ranges {
        if left == 0 {
            break;
        }
        if skip >= range_len {
            skip -= range_len;
            continue;
        }
        let n = (range_len - skip).min(left);
        let Some(start) = addr.checked_add(skip as u64) else {
            return f(
                addr,
                Err(GuestMemoryError::InvalidGuestAddress(GuestAddress(addr))),
            );
        };
        skip = 0;
        left -= n;
        for_each_slice(mem, &mut last, start, n, |slice| f(start, slice))?;
    }
    ControlFlow::Continue(())
}

/// The region holding all of `[addr, addr + len)`: `last` when it does (a bounds check), else a
/// lookup, which `last` then remembers. `None` when no one region holds it (across regions, or
/// unmapped).
#[inline]
pub fn region_holding<'m>(
    mem: &'m GuestMem,
    last: &mut Option<&'m GuestRegion>,
    addr: u64,
    len: usize,
) -> Option<&'m GuestRegion> {
    if let Some(r) = last.filter(|r| holds(r, addr, len)) {
        return Some(r);
    }
    let r = mem
        .find_region(GuestAddress(addr))
        .filter(|r| holds(r, addr, len))?;
    *last = Some(r);
    Some(r)
}

/// Writes `data` at guest address `addr` when one region holds all of it: one lookup and one
/// copy, without vm-memory's generic walk across regions. `None` when no one region holds it
/// (the caller falls back to a walk that splits or refuses the range).
pub fn write_in_one_region(mem: &GuestMem, addr: u64, data: &[u8]) -> Option<MemResult<()>> {
    let r = region_holding(mem, &mut None, addr, data.len())?;
    Some(r.write_slice(data, MemoryRegionAddress(addr - r.start_addr().0)))
}

/// Whether `[addr, addr + len)` lies wholly inside region `r`.
#[inline]
fn holds(r: &GuestRegion, addr: u64, len: usize) -> bool {
    addr.checked_sub(r.start_addr().0)
        .is_some_and(|offset| offset <= r.len() && len as u64 <= r.len() - offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_held_only_by_a_region_that_holds_all_of_it() {
        let mem =
            GuestMem::from_ranges(&[(GuestAddress(0), 0x1000), (GuestAddress(0x1000), 0x1000)])
                .unwrap();
        let mut last = None;
        let first = region_holding(&mem, &mut last, 0x10, 0x100).unwrap();
        assert_eq!(first.start_addr(), GuestAddress(0));
        assert!(last.is_some(), "remembered");
        assert_eq!(
            region_holding(&mem, &mut last, 0x1800, 0x800)
                .unwrap()
                .start_addr(),
            GuestAddress(0x1000),
            "the other region is looked up"
        );
        assert!(
            region_holding(&mem, &mut last, 0xf00, 0x200).is_none(),
            "across regions"
        );
        assert!(
            region_holding(&mem, &mut last, 0x2000, 1).is_none(),
            "unmapped"
        );
        assert!(
            region_holding(&mem, &mut last, u64::MAX, 2).is_none(),
            "past the end"
        );
        assert!(
            region_holding(&mem, &mut last, 0x1000, 0x1000).is_some(),
            "a whole region"
        );
    }

    #[test]
    fn ranges_across_regions_are_in_memory_and_split_into_slices() {
        let mem =
            GuestMem::from_ranges(&[(GuestAddress(0), 0x1000), (GuestAddress(0x1000), 0x1000)])
                .unwrap();
        let mut last = None;
        assert!(in_memory(&mem, &mut last, 0xf00, 0x200), "across regions");
        assert!(!in_memory(&mem, &mut last, 0x1f00, 0x200), "past the end");
        let lens = |addr, len| {
            let mut last = None;
            let mut lens = Vec::new();
            let flow = for_each_slice(&mem, &mut last, addr, len, |s| match s {
                Ok(s) => {
                    lens.push(s.len());
                    ControlFlow::Continue(())
                }
                Err(_) => ControlFlow::Break(()),
            });
            (lens, flow.is_break())
        };
        assert_eq!(lens(0x10, 0x100), (vec![0x100], false), "one region");
        assert_eq!(lens(0xf00, 0x200), (vec![0x100, 0x100], false), "split");
        assert!(lens(0x1f00, 0x200).1, "a range past the end fails");
    }
}
