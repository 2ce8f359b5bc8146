//! Finding guest memory for descriptor ranges: one region lookup per range, or none where the
//! range lies in the region of the range before it (a chain's buffers usually share a region).

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::GuestMem;

/// One region of [`GuestMem`].
pub type GuestRegion = <GuestMem as GuestMemoryBackend>::R;

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
}
