//! Warp matrix instructions (`wmma.load`, `wmma.mma`, `wmma.store`, `cvt.rna.tf32.f32`) in
//! kernels compiled by nvcc 11.8 (`fixtures/mma.cu`, the CUDA C++ `wmma` API), against
//! products computed here: every supported type and shape, row- and column-major matrices,
//! strides wider than a matrix, fragments scaled element by element, shared memory, and a tiled
//! GEMM.

use vgpu_ptx::testutils::*;
use vgpu_ptx::*;

/// Architectures the fixture is compiled for (bf16 and tf32 fragments need compute_80).
pub(super) const ARCHS: [&str; 2] = ["compute_80", "compute_90"];

/// Small integers in [-3, 3], deterministic: products and sums stay exact in every type.
pub(super) fn small(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 7) as f32 - 3.0
        })
        .collect()
}

/// An `f32` as `f16` bits (exact for the small integers here).
pub(super) fn f16(v: f32) -> u16 {
    super::floatops::f16_bits(f64::from(v))
}

/// `f16` bits as an `f32`.
pub(super) fn from_f16(h: u16) -> f32 {
    super::half::f16_to_f64(h) as f32
}

/// An `f32` that `bf16` holds exactly, as `bf16` bits.
pub(super) fn bf16(v: f32) -> u16 {
    assert_eq!(v.to_bits() & 0xffff, 0, "{v} is not a bf16");
    (v.to_bits() >> 16) as u16
}

/// Element (`r`, `c`) of a matrix stored row- or column-major with stride `ld`.
fn at(m: &[f32], col: bool, ld: usize, r: usize, c: usize) -> f32 {
    if col { m[c * ld + r] } else { m[r * ld + c] }
}

/// D = A x B + C, row-major m x n, from A (m x k) and B (k x n) in their layouts.
#[allow(clippy::too_many_arguments)]
fn product(
    a: &[f32],
    a_col: bool,
    lda: usize,
    b: &[f32],
    b_col: bool,
    ldb: usize,
    c: impl Fn(usize, usize) -> f32,
    (m, n, k): (usize, usize, usize),
) -> Vec<f32> {
    let mut d = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            d[i * n + j] = c(i, j)
                + (0..k)
                    .map(|kk| at(a, a_col, lda, i, kk) * at(b, b_col, ldb, kk, j))
                    .sum::<f32>();
        }
    }
    d
}

pub(super) fn launch(m: &Module, mem: &TestMemory, kernel: &str, threads: u32, args: &[Arg]) {
    let g = alloc_globals(m, mem);
    run(m, kernel, &Config::linear(1, threads), args, mem, &g)
        .unwrap_or_else(|f| panic!("{kernel}: {f}"));
}

#[test]
fn f16_fragments_with_f32_accumulators_scaled_element_by_element() {
    let (a, b, c) = (small(256, 1), small(256, 2), small(256, 3));
    // D = A x B + 2 C; the kernel stores D column-major.
    let want = product(
        &a,
        false,
        16,
        &b,
        true,
        16,
        |i, j| 2.0 * c[i * 16 + j],
        (16, 16, 16),
    );
    for arch in ARCHS {
        let m = load_fixture("mma", arch);
        let mem = TestMemory::new();
        let da = mem.alloc_from(&a.iter().map(|&v| f16(v)).collect::<Vec<_>>());
        let db = mem.alloc_from(&b.iter().map(|&v| f16(v)).collect::<Vec<_>>());
        let dc = mem.alloc_from(&c);
        let dd = mem.alloc(256 * 4);
        launch(
            &m,
            &mem,
            "h16",
            32,
            &[Arg::U64(da), Arg::U64(db), Arg::U64(dc), Arg::U64(dd)],
        );
        let got = mem.read::<f32>(dd, 256);
        for i in 0..16 {
            for j in 0..16 {
                assert_eq!(got[j * 16 + i], want[i * 16 + j], "{arch} D[{i}][{j}]");
            }
        }
    }
}

#[test]
fn f16_accumulators_in_the_32x8x16_shape() {
    let (a, b) = (small(32 * 16, 4), small(16 * 8, 5));
    let want = product(&a, true, 32, &b, false, 8, |_, _| 0.0, (32, 8, 16));
    for arch in ARCHS {
        let m = load_fixture("mma", arch);
        let mem = TestMemory::new();
        let da = mem.alloc_from(&a.iter().map(|&v| f16(v)).collect::<Vec<_>>());
        let db = mem.alloc_from(&b.iter().map(|&v| f16(v)).collect::<Vec<_>>());
        let dd = mem.alloc(32 * 8 * 2);
        launch(
            &m,
            &mem,
            "h32x8",
            32,
            &[Arg::U64(da), Arg::U64(db), Arg::U64(dd)],
        );
        let got: Vec<f32> = mem.read::<u16>(dd, 256).into_iter().map(from_f16).collect();
        assert_eq!(got, want, "{arch}");
    }
}

#[test]
fn bf16_fragments_from_a_wider_stride() {
    // A is 8x16 inside rows of 24 elements (the rest is not read).
    let a = small(8 * 24, 6);
    let b = small(16 * 32, 7);
    let want = product(&a, false, 24, &b, false, 32, |_, _| 1.0, (8, 32, 16));
    for arch in ARCHS {
        let m = load_fixture("mma", arch);
        let mem = TestMemory::new();
        let da = mem.alloc_from(&a.iter().map(|&v| bf16(v)).collect::<Vec<_>>());
        let db = mem.alloc_from(&b.iter().map(|&v| bf16(v)).collect::<Vec<_>>());
        let dd = mem.alloc(8 * 32 * 4);
        launch(
            &m,
            &mem,
            "bf8x32",
            32,
            &[Arg::U64(da), Arg::U64(db), Arg::U64(dd)],
        );
        assert_eq!(mem.read::<f32>(dd, 256), want, "{arch}");
    }
}

/// `cvt.rna.tf32.f32` as the PTX ISA defines it: 10 mantissa bits, ties away from zero.
pub(super) fn tf32(v: f32) -> f32 {
    let b = v.to_bits();
    f32::from_bits(b.wrapping_add(1 << 12) & !0x1fff)
}

#[test]
fn tf32_fragments_rounded_by_cvt_rna() {
    // Values with more mantissa bits than TF32 keeps, some exactly halfway.
    let frac = |v: Vec<f32>, s: f32| -> Vec<f32> {
        v.iter()
            .enumerate()
            .map(|(i, x)| x + s * (i % 5) as f32 / 3.0 + (i % 2) as f32 * 2f32.powi(-11))
            .collect()
    };
    let a = frac(small(16 * 8, 8), 1.0);
    let b = frac(small(8 * 16, 9), -1.0);
    let (ra, rb): (Vec<f32>, Vec<f32>) = (
        a.iter().map(|&x| tf32(x)).collect(),
        b.iter().map(|&x| tf32(x)).collect(),
    );
    assert_ne!(ra, a, "the inputs need rounding");
    let want = product(&ra, false, 8, &rb, true, 8, |_, _| 0.0, (16, 16, 8));
    for arch in ARCHS {
        let m = load_fixture("mma", arch);
        let mem = TestMemory::new();
        let (da, db) = (mem.alloc_from(&a), mem.alloc_from(&b));
        let dd = mem.alloc(256 * 4);
        launch(
            &m,
            &mem,
            "tf32",
            32,
            &[Arg::U64(da), Arg::U64(db), Arg::U64(dd)],
        );
        let got = mem.read::<f32>(dd, 256);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // Sums of eight products may round in f32 in another order.
            assert!(
                (g - w).abs() <= w.abs() * 1e-6,
                "{arch} D[{i}]: {g} against {w}"
            );
        }
    }
}

#[test]
fn int8_fragments_wrap_or_saturate() {
    let to_i8 = |v: Vec<f32>| v.into_iter().map(|x| (x * 40.0) as i8).collect::<Vec<i8>>();
    let (a, b) = (to_i8(small(256, 10)), to_i8(small(256, 11)));
    // Accumulators near the top of i32, so that some sums pass it.
    let c: Vec<i32> = (0..256)
        .map(|i| {
            if i % 3 == 0 {
                i32::MAX - 1000
            } else {
                i * 7 - 900
            }
        })
        .collect();
    for arch in ARCHS {
        let m = load_fixture("mma", arch);
        let mem = TestMemory::new();
        let (da, db, dc) = (mem.alloc_from(&a), mem.alloc_from(&b), mem.alloc_from(&c));
        let dd = mem.alloc(256 * 4);
        for sat in [0, 1] {
            let args = [
                Arg::U64(da),
                Arg::U64(db),
                Arg::U64(dc),
                Arg::U64(dd),
                Arg::I32(sat),
            ];
            launch(&m, &mem, "s8", 32, &args);
            let got = mem.read::<i32>(dd, 256);
            let mut saturated = 0;
            for i in 0..16 {
                for j in 0..16 {
                    let sum: i64 = i64::from(c[i * 16 + j])
                        + (0..16)
                            .map(|k| i64::from(a[i * 16 + k]) * i64::from(b[j * 16 + k]))
                            .sum::<i64>();
                    let want = if sat == 1 {
                        sum.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
                    } else {
                        sum as i32
                    };
                    saturated += usize::from(sum > i64::from(i32::MAX));
                    assert_eq!(got[i * 16 + j], want, "{arch} sat {sat} D[{i}][{j}]");
                }
            }
            assert!(saturated > 0, "some sums pass i32::MAX");
        }
    }
}

#[test]
fn uint8_fragments_from_shared_memory() {
    let a: Vec<u8> = small(32 * 16, 12)
        .into_iter()
        .map(|x| (x + 3.0) as u8 * 40)
        .collect();
    let b: Vec<u8> = small(16 * 8, 13)
        .into_iter()
        .map(|x| (x + 3.0) as u8 * 41)
        .collect();
    for arch in ARCHS {
        let m = load_fixture("mma", arch);
        let mem = TestMemory::new();
        let (da, db) = (mem.alloc_from(&a), mem.alloc_from(&b));
        let dd = mem.alloc(32 * 8 * 4);
        launch(
            &m,
            &mem,
            "u8",
            32,
            &[Arg::U64(da), Arg::U64(db), Arg::U64(dd)],
        );
        let got = mem.read::<i32>(dd, 256);
        for i in 0..32 {
            for j in 0..8 {
                let want: i32 = (0..16)
                    .map(|k| i32::from(a[i * 16 + k]) * i32::from(b[j * 16 + k]))
                    .sum();
                assert_eq!(got[i * 8 + j], want, "{arch} D[{i}][{j}]");
            }
        }
    }
}

#[test]
fn f64_fragments() {
    let a: Vec<f64> = small(32, 14)
        .into_iter()
        .map(|x| f64::from(x) * 0.25)
        .collect();
    let b: Vec<f64> = small(32, 15).into_iter().map(f64::from).collect();
    for arch in ARCHS {
        let m = load_fixture("mma", arch);
        let mem = TestMemory::new();
        let (da, db) = (mem.alloc_from(&a), mem.alloc_from(&b));
        let dd = mem.alloc(64 * 8);
        launch(
            &m,
            &mem,
            "f64",
            32,
            &[Arg::U64(da), Arg::U64(db), Arg::U64(dd)],
        );
        let got = mem.read::<f64>(dd, 64);
        for i in 0..8 {
            for j in 0..8 {
                let want = 0.5 + (0..4).map(|k| a[i * 4 + k] * b[k * 8 + j]).sum::<f64>();
                assert_eq!(got[i * 8 + j], want, "{arch} D[{i}][{j}]");
            }
        }
    }
}

#[test]
fn a_tiled_gemm_of_warps() {
    const N: usize = 64;
    let (a, b) = (small(N * N, 16), small(N * N, 17));
    let want = product(&a, false, N, &b, true, N, |_, _| 0.0, (N, N, N));
    for arch in ARCHS {
        let m = load_fixture("mma", arch);
        let mem = TestMemory::new();
        let da = mem.alloc_from(&a.iter().map(|&v| f16(v)).collect::<Vec<_>>());
        let db = mem.alloc_from(&b.iter().map(|&v| f16(v)).collect::<Vec<_>>());
        let dc = mem.alloc(N * N * 4);
        let g = alloc_globals(&m, &mem);
        // 16 tiles: 4 blocks of 4 warps.
        let cfg = Config::linear(4, 128);
        let args = [Arg::U64(da), Arg::U64(db), Arg::U64(dc), Arg::I32(N as i32)];
        run(&m, "gemm", &cfg, &args, &mem, &g).unwrap_or_else(|f| panic!("gemm: {f}"));
        assert_eq!(mem.read::<f32>(dc, N * N), want, "{arch}");
    }
}

#[test]
fn a_warp_whose_guard_holds_in_no_lane_skips_warp_matrix_instructions() {
    let regs = "{%r1, %r2, %r3, %r4, %r5, %r6, %r7, %r8}";
    let ptx = format!(
        ".version 7.8\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 p)\n{{\n\
         .reg .b32 %r<12>;\n.reg .b64 %rd<2>;\n.reg .pred %p<2>;\nld.param.u64 %rd1, [p];\n\
         setp.ne.u64 %p1, %rd1, %rd1;\n\
         @%p1 wmma.load.a.sync.aligned.row.m16n16k16.f16 {regs}, [%rd1], 16;\n\
         @%p1 wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32 {regs}, {regs}, {regs}, {regs};\n\
         @%p1 wmma.store.d.sync.aligned.row.m16n16k16.f32 [%rd1], {regs}, 16;\nret;\n}}\n"
    );
    let m = Module::load(&ptx).unwrap();
    let mem = TestMemory::new();
    // A null matrix pointer: any access would fault.
    launch(&m, &mem, "k", 32, &[Arg::U64(0)]);
}

#[test]
fn sub_byte_and_single_bit_fragments_are_refused_at_load() {
    let body = |inst: &str| {
        format!(
            ".version 7.8\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 p)\n{{\n.reg .b32 %r<12>;\n.reg .b64 %rd<2>;\nld.param.u64 %rd1, [p];\n{inst}\nret;\n}}\n"
        )
    };
    for inst in [
        "wmma.load.a.sync.aligned.row.m8n8k32.s4 {%r1}, [%rd1], %r2;",
        "wmma.load.a.sync.aligned.row.m8n8k128.b1 {%r1}, [%rd1], %r2;",
        "wmma.load.a.sync.aligned.row.m16n16k8.f16 {%r1, %r2, %r3, %r4}, [%rd1], %r2;",
    ] {
        let e = Module::load(&body(inst)).unwrap_err();
        assert_eq!(e.kind, LoadErrorKind::NotSupported, "{inst}: {e}");
    }
    // The wrong number of registers for a fragment is an error of the program.
    let e = Module::load(&body(
        "wmma.load.a.sync.aligned.row.m16n16k16.f16 {%r1, %r2, %r3}, [%rd1], %r2;",
    ))
    .unwrap_err();
    assert_ne!(e.kind, LoadErrorKind::NotSupported, "{e}");
}
