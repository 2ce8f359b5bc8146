//! A small deterministic PRNG (SplitMix64) so every run sees the same inputs.

/// SplitMix64: tiny, fast, and good enough to make test data.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

impl Rng {
    /// A generator seeded from a name (FNV-1a), so each case has its own stream.
    pub(crate) fn for_case(name: &str) -> Rng {
        let mut h = FNV_OFFSET;
        for b in name.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(FNV_PRIME);
        }
        Rng(h)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in `0..n` (n > 0), by multiply-shift.
    pub(crate) fn below(&mut self, n: u32) -> u32 {
        ((u64::from(self.next_u32()) * u64::from(n)) >> 32) as u32
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn range_i32(&mut self, lo: i32, hi: i32) -> i32 {
        let span = (i64::from(hi) - i64::from(lo) + 1) as u64;
        (i64::from(lo) + (self.next_u64() % span) as i64) as i32
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub(crate) fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[lo, hi)`.
    pub(crate) fn range_f64(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit_f64()
    }

    /// Uniform in `[lo, hi)`, rounded to f32.
    pub(crate) fn range_f32(&mut self, lo: f32, hi: f32) -> f32 {
        self.range_f64(f64::from(lo), f64::from(hi)) as f32
    }

    /// A finite f32 with a random sign, a random 23-bit mantissa and a binary
    /// exponent uniform in `min_exp..=max_exp` (biased exponent 0 gives a denormal).
    pub(crate) fn f32_exp_range(&mut self, min_exp: i32, max_exp: i32) -> f32 {
        let e = self.range_i32(min_exp, max_exp);
        let biased = (e + 127).clamp(0, 254) as u32;
        let bits =
            (self.next_u32() & 0x8000_0000) | (biased << 23) | (self.next_u32() & 0x007f_ffff);
        f32::from_bits(bits)
    }

    /// Picks one element.
    pub(crate) fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u32) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_name_same_stream_different_names_differ() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = Rng::for_case("x");
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..4)
            .map({
                let mut r = Rng::for_case("x");
                move |_| r.next_u64()
            })
            .collect();
        let c = Rng::for_case("y").next_u64();
        assert_eq!(a, b);
        assert_ne!(a[0], c);
    }

    #[test]
    fn ranges_are_respected() {
        let mut r = Rng::for_case("ranges");
        for _ in 0..10_000 {
            let v = r.range_i32(-3, 5);
            assert!((-3..=5).contains(&v));
            assert!(r.below(7) < 7);
            let f = r.range_f64(-2.0, 3.0);
            assert!((-2.0..3.0).contains(&f));
            let g = r.f32_exp_range(-3, 4);
            assert!(g.is_finite() && g.abs() < 32.0 && g.abs() >= 0.125);
        }
        assert_eq!(r.range_i32(i32::MIN, i32::MIN), i32::MIN);
    }
}
