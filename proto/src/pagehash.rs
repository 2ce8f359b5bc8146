//! Page hashes for delta copies of mirrored memory (`MemcpyDtoHDelta`): the guest sends the
//! hash of each page of its copy, the host answers only the pages whose bytes differ. Both
//! sides must hash alike, so the function lives here.
//!
//! The hash detects changes; it is not a cryptographic digest. A collision only means that a
//! guest's own changed page is not copied: a guest that forges one harms nobody but itself.

/// Bytes per page of a delta copy.
pub const DELTA_PAGE: usize = 4096;

/// Multipliers of the four accumulation lanes and of the final mix (odd 64-bit constants).
const K: [u64; 4] = [
    0x9e37_79b9_7f4a_7c15,
    0xc2b2_ae3d_27d4_eb4f,
    0x1656_67b1_9e37_79f9,
    0x27d4_eb2f_1656_67c5,
];
/// Final mix multiplier.
const MIX: u64 = 0xff51_afd7_ed55_8ccd;
/// Rotation applied after each lane step.
const ROTATE: u32 = 31;

/// The hash of `bytes` (a page, or the last, shorter part of a range).
pub fn page_hash(bytes: &[u8]) -> u64 {
    let mut lanes = K;
    let mut blocks = bytes.chunks_exact(32);
    for b in &mut blocks {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let w = u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
            *lane = (*lane ^ w).wrapping_mul(K[i]).rotate_left(ROTATE);
        }
    }
    let mut h = bytes.len() as u64;
    for lane in lanes {
        h = (h ^ lane).wrapping_mul(MIX).rotate_left(ROTATE);
    }
    for (i, &b) in blocks.remainder().iter().enumerate() {
        h = (h ^ (u64::from(b) << ((i % 8) * 8))).wrapping_mul(K[i % 4]);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(MIX);
    h ^ (h >> 29)
}

/// The hashes of `bytes` page by page (the last page may be shorter).
pub fn page_hashes(bytes: &[u8]) -> Vec<u64> {
    bytes.chunks(DELTA_PAGE).map(page_hash).collect()
}

/// Pages in `len` bytes.
pub fn pages(len: usize) -> usize {
    len.div_ceil(DELTA_PAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_and_the_length_change_the_hash() {
        let page = vec![0u8; DELTA_PAGE];
        let h0 = page_hash(&page);
        for at in [0, 1, 7, 8, 31, 32, 2047, DELTA_PAGE - 1] {
            let mut p = page.clone();
            p[at] = 1;
            assert_ne!(page_hash(&p), h0, "a change at byte {at}");
        }
        assert_ne!(page_hash(&page[..100]), page_hash(&page[..101]));
        assert_eq!(page_hash(&page), h0, "deterministic");
        // Moved words hash differently (the lanes are not interchangeable).
        let mut a = vec![0u8; 64];
        let mut b = vec![0u8; 64];
        a[0] = 9;
        b[8] = 9;
        assert_ne!(page_hash(&a), page_hash(&b));
    }

    #[test]
    fn ranges_hash_page_by_page() {
        let data: Vec<u8> = (0..3 * DELTA_PAGE + 10).map(|i| i as u8).collect();
        let h = page_hashes(&data);
        assert_eq!(h.len(), 4);
        assert_eq!(pages(data.len()), 4);
        assert_eq!(h[3], page_hash(&data[3 * DELTA_PAGE..]));
    }
}
