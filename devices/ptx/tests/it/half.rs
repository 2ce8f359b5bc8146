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

/// `set` with half-precision sources and destinations and `setp`/`set` on packed pairs, as
/// CUDA 12's `cuda_fp16.hpp` and `cuda_bf16.hpp` write their comparisons (`__heq`, `__hgt2`,
/// `__hbeq2`, …): before, a module using them failed to load.
#[test]
fn half_comparisons_set_halves_and_predicates() {
    // Each: instructions leaving the result in %r9, and what it must be.
    let cases: &[(&str, u32)] = &[
        (
            "set.eq.f16.f16 %h9, %h1, %h1;\ncvt.u32.u16 %r9, %h9;",
            0x3c00,
        ),
        ("set.lt.f16.f16 %h9, %h2, %h1;\ncvt.u32.u16 %r9, %h9;", 0),
        ("set.lt.s32.f16 %r9, %h1, %h2;", 0xffff_ffff),
        (
            "set.le.u16.f16 %h9, %h1, %h2;\ncvt.u32.u16 %r9, %h9;",
            0xffff,
        ),
        ("set.eq.f16x2.f16x2 %r9, %r1, %r2;", 0x0000_3c00),
        ("set.gt.u32.f16x2 %r9, %r1, %r2;", 0xffff_0000),
        ("set.nan.bf16x2.bf16x2 %r9, %r3, %r4;", 0x3f80_0000),
        (
            "set.ne.and.bf16.bf16 %h9, %h3, %h4, %p1;\ncvt.u32.u16 %r9, %h9;",
            0x3f80,
        ),
        (
            "set.ne.and.bf16.bf16 %h9, %h3, %h4, !%p1;\ncvt.u32.u16 %r9, %h9;",
            0,
        ),
        ("set.ge.or.f16x2.f16x2 %r9, %r2, %r1, %p2;", 0x0000_3c00),
        (
            "setp.gt.f16x2 %p3|%p4, %r1, %r2;\nselp.u32 %r8, 1, 0, %p3;\nselp.u32 %r9, 2, 0, %p4;\n\
             add.u32 %r9, %r9, %r8;",
            2,
        ),
        (
            "setp.ge.and.f16x2 %p3|%p4, %r1, %r2, %p1;\nselp.u32 %r8, 1, 0, %p3;\n\
             selp.u32 %r9, 2, 0, %p4;\nadd.u32 %r9, %r9, %r8;",
            3,
        ),
    ];
    let body: String = cases
        .iter()
        .enumerate()
        .map(|(i, (ins, _))| format!("{ins}\nst.global.u32 [%rd1+{}], %r9;\n", 4 * i))
        .collect();
    // %r1 = (2.0, 1.0) and %r2 = (1.0, 1.0) as f16x2 (high, low); %r3 = (NaN, 1.0) and
    // %r4 = 0 as bf16x2; %h1 = 1.0, %h2 = 2.0 (f16); %h3 = 1.0, %h4 = 2.0 (bf16).
    let ptx = format!(
        ".version 7.8\n.target sm_80\n.address_size 64\n\
         .visible .entry k(.param .u64 out) {{\n\
         .reg .b16 %h<10>; .reg .b32 %r<10>; .reg .b64 %rd<2>; .reg .pred %p<5>;\n\
         ld.param.u64 %rd1, [out]; cvta.to.global.u64 %rd1, %rd1;\n\
         mov.b32 %r1, 0x40003c00; mov.b32 %r2, 0x3c003c00; mov.b32 %r3, 0x7fc03f80;\n\
         mov.b32 %r4, 0;\n\
         mov.b16 %h1, 0x3c00; mov.b16 %h2, 0x4000; mov.b16 %h3, 0x3f80; mov.b16 %h4, 0x4000;\n\
         setp.eq.u32 %p1, 1, 1; setp.eq.u32 %p2, 1, 0;\n\
         {body}ret; }}\n"
    );
    let got = run_out_kernel(&ptx, 1, cases.len());
    for ((ins, want), got) in cases.iter().zip(got) {
        assert_eq!(got, *want, "{ins}: got {got:#010x}, want {want:#010x}");
    }
}
