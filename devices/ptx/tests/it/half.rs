//! Half-precision arithmetic (`add/sub/mul/fma/max/neg .f16/.f16x2`) and conversions.

use vgpu_ptx::testutils::*;

pub(crate) fn f16_to_f64(h: u16) -> f64 {
    let e = (h >> 10) & 0x1f;
    let m = f64::from(h & 0x3ff);
    let mag = match e {
        0x1f => {
            if m == 0.0 {
                f64::INFINITY
            } else {
                f64::NAN
            }
        }
        0 => m * 2f64.powi(-24),
        _ => (1.0 + m / 1024.0) * 2f64.powi(i32::from(e) - 15),
    };
    if h & 0x8000 != 0 { -mag } else { mag }
}

/// Round-to-nearest-even of an exact value to half precision.
fn f64_to_f16(x: f64) -> u16 {
    if x.is_nan() {
        return 0x7fff;
    }
    let sign = if x.is_sign_negative() { 0x8000u16 } else { 0 };
    let a = x.abs();
    if a >= 65520.0 {
        return sign | 0x7c00;
    }
    // Positive halves are ordered like their bit patterns: binary-search the neighbours, then
    // take the nearer one, ties to the even mantissa.
    let (mut lo, mut hi) = (0u16, 0x7bffu16);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if f16_to_f64(mid) < a {
            lo = mid + 1
        } else {
            hi = mid
        }
    }
    let above = lo;
    let below = above.saturating_sub(1);
    let (ea, eb) = ((f16_to_f64(above) - a).abs(), (a - f16_to_f64(below)).abs());
    let best = if eb < ea || (eb == ea && below & 1 == 0) {
        below
    } else {
        above
    };
    sign | best
}

#[test]
fn half_kernels_round_like_hardware() {
    let n = 300usize;
    let mut vals: Vec<u16> = (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 17) as u16 & 0x7bff | (((i & 1) as u16) << 15))
        .collect();
    vals[0] = 0x3c00;
    vals[1] = 0x0001;
    vals[2] = 0x7bff;
    let ys: Vec<u16> = (0..n as u32)
        .map(|i| (i.wrapping_mul(40503) % 0x5c00) as u16)
        .collect();
    let a = 1.7f32;
    let ah = f64_to_f16(f64::from(a));
    for arch in ["compute_80", "compute_90"] {
        let m = load_fixture("half", arch);
        let mem = TestMemory::new();
        let g = alloc_globals(&m, &mem);
        let (dx, dy) = (mem.alloc_from(&vals), mem.alloc_from(&ys));
        run(
            &m,
            "half_axpy",
            &Config::linear(3, 128),
            &[Arg::I32(n as i32), Arg::F32(a), Arg::U64(dx), Arg::U64(dy)],
            &mem,
            &g,
        )
        .unwrap();
        let got: Vec<u16> = mem.read(dy, n);
        for i in 0..n {
            let want = f64_to_f16(f16_to_f64(ah) * f16_to_f64(vals[i]) + f16_to_f64(ys[i]));
            assert_eq!(got[i], want, "{arch}: hfma element {i}");
        }

        let pairs = n / 2;
        let (du, dv, dout) = (
            mem.alloc_from(&vals),
            mem.alloc_from(&ys),
            mem.alloc(pairs * 16),
        );
        run(
            &m,
            "half2_ops",
            &Config::linear(2, 128),
            &[
                Arg::I32(pairs as i32),
                Arg::U64(du),
                Arg::U64(dv),
                Arg::U64(dout),
            ],
            &mem,
            &g,
        )
        .unwrap();
        let got: Vec<u16> = mem.read(dout, pairs * 8);
        for p in 0..pairs {
            for h in 0..2 {
                let (u, v) = (f16_to_f64(vals[2 * p + h]), f16_to_f64(ys[2 * p + h]));
                let nv = -v;
                let want = [
                    f64_to_f16(u + v),
                    f64_to_f16(u * v),
                    f64_to_f16(u - v),
                    f64_to_f16(if u > nv || (u == nv && nv.is_sign_negative()) {
                        u
                    } else {
                        nv
                    }),
                ];
                for (k, w) in want.iter().enumerate() {
                    let g = got[8 * p + 2 * k + h];
                    assert!(
                        g == *w,
                        "{arch}: pair {p} half {h} op {k}: got {g:#06x} want {w:#06x}"
                    );
                }
            }
        }
    }
}
