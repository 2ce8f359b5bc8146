//! `mma.sync`, `ldmatrix`, `stmatrix` and `movmatrix` in kernels compiled by NVRTC
//! (`fixtures/mma_sync.cu`), whose fragments the PTX ISA lays out: each kernel builds its
//! fragments from memory and writes its results back element by element where the ISA's figures
//! place them, so a wrong placement in the interpreter gives a wrong product here. Also the
//! matrix loads against the ISA's description, a tiled GEMM fed by `ldmatrix`, refusals and
//! faults.

use super::mma::{ARCHS, bf16, f16, from_f16, launch, small, tf32};
use vgpu_ptx::testutils::*;
use vgpu_ptx::*;

/// D = A x B + C over row-major matrices (A m x k, B k x n), in `f32` (exact for the small
/// integers of these tests).
fn matmul_f32(a: &[f32], b: &[f32], c: &[f32], (m, n, k): (usize, usize, usize)) -> Vec<f32> {
    (0..m * n)
        .map(|at| {
            let (i, j) = (at / n, at % n);
            c[at] + (0..k).map(|kk| a[i * k + kk] * b[kk * n + j]).sum::<f32>()
        })
        .collect()
}

fn halves(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| f16(x)).collect()
}

#[test]
fn f16_products_with_f32_and_f16_accumulators() {
    let (a, b, c) = (small(16 * 16, 21), small(16 * 8, 22), small(16 * 8, 23));
    let want = matmul_f32(&a, &b, &c, (16, 8, 16));
    for arch in ARCHS {
        let m = load_fixture("mma_sync", arch);
        let mem = TestMemory::new();
        let (da, db) = (mem.alloc_from(&halves(&a)), mem.alloc_from(&halves(&b)));
        let dc = mem.alloc_from(&c);
        let dd = mem.alloc(16 * 8 * 4);
        let args = [Arg::U64(da), Arg::U64(db), Arg::U64(dc), Arg::U64(dd)];
        launch(&m, &mem, "hmma16816", 32, &args);
        assert_eq!(mem.read::<f32>(dd, 128), want, "{arch} f32 accumulators");

        let dch = mem.alloc_from(&halves(&c));
        let ddh = mem.alloc(16 * 8 * 2);
        let args = [Arg::U64(da), Arg::U64(db), Arg::U64(dch), Arg::U64(ddh)];
        launch(&m, &mem, "hmma16816_f16acc", 32, &args);
        let got: Vec<f32> = mem
            .read::<u16>(ddh, 128)
            .into_iter()
            .map(from_f16)
            .collect();
        assert_eq!(got, want, "{arch} f16 accumulators");
    }
}

#[test]
fn f16_and_bf16_products_eight_deep() {
    let (a, b, c) = (small(16 * 8, 24), small(8 * 8, 25), small(16 * 8, 26));
    let want = matmul_f32(&a, &b, &c, (16, 8, 8));
    for arch in ARCHS {
        let m = load_fixture("mma_sync", arch);
        let mem = TestMemory::new();
        for (bf, conv) in [(0, f16 as fn(f32) -> u16), (1, bf16)] {
            let da = mem.alloc_from(&a.iter().map(|&x| conv(x)).collect::<Vec<_>>());
            let db = mem.alloc_from(&b.iter().map(|&x| conv(x)).collect::<Vec<_>>());
            let (dc, dd) = (mem.alloc_from(&c), mem.alloc(16 * 8 * 4));
            let args = [
                Arg::U64(da),
                Arg::U64(db),
                Arg::U64(dc),
                Arg::U64(dd),
                Arg::I32(bf),
            ];
            launch(&m, &mem, "mma1688", 32, &args);
            assert_eq!(mem.read::<f32>(dd, 128), want, "{arch} bf16 {bf}");
        }
    }
}

#[test]
fn bf16_products_sixteen_deep() {
    let (a, b) = (small(16 * 16, 27), small(16 * 8, 28));
    let want = matmul_f32(&a, &b, &[0.0; 128], (16, 8, 16));
    for arch in ARCHS {
        let m = load_fixture("mma_sync", arch);
        let mem = TestMemory::new();
        let da = mem.alloc_from(&a.iter().map(|&x| bf16(x)).collect::<Vec<_>>());
        let db = mem.alloc_from(&b.iter().map(|&x| bf16(x)).collect::<Vec<_>>());
        let dd = mem.alloc(16 * 8 * 4);
        launch(
            &m,
            &mem,
            "bmma16816",
            32,
            &[Arg::U64(da), Arg::U64(db), Arg::U64(dd)],
        );
        assert_eq!(mem.read::<f32>(dd, 128), want, "{arch}");
    }
}

#[test]
fn tf32_products_four_and_eight_deep() {
    // More mantissa bits than TF32 keeps: the kernel rounds with cvt.rna.tf32.f32 first.
    let frac = |v: Vec<f32>| -> Vec<f32> {
        v.iter()
            .enumerate()
            .map(|(i, x)| x + (i % 5) as f32 / 3.0 + (i % 2) as f32 * 2f32.powi(-11))
            .collect()
    };
    for k in [4, 8] {
        let (a, b, c) = (
            frac(small(16 * k, 29)),
            frac(small(k * 8, 30)),
            small(128, 31),
        );
        let ra: Vec<f32> = a.iter().map(|&x| tf32(x)).collect();
        let rb: Vec<f32> = b.iter().map(|&x| tf32(x)).collect();
        assert_ne!(ra, a, "the inputs need rounding");
        let want = matmul_f32(&ra, &rb, &c, (16, 8, k));
        // Sums of products may round in f32 in another order: allow an ulp of the largest term
        // per term.
        let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<f32>>();
        let scale = matmul_f32(&abs(&ra), &abs(&rb), &abs(&c), (16, 8, k));
        for arch in ARCHS {
            let m = load_fixture("mma_sync", arch);
            let mem = TestMemory::new();
            let (da, db, dc) = (mem.alloc_from(&a), mem.alloc_from(&b), mem.alloc_from(&c));
            let dd = mem.alloc(16 * 8 * 4);
            let args = [
                Arg::U64(da),
                Arg::U64(db),
                Arg::U64(dc),
                Arg::U64(dd),
                Arg::I32(i32::from(k == 4)),
            ];
            launch(&m, &mem, "tmma", 32, &args);
            let got = mem.read::<f32>(dd, 128);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= scale[i] * f32::EPSILON * (k + 1) as f32,
                    "{arch} k{k} D[{i}]: {g} against {w}"
                );
            }
        }
    }
}

/// D = A x B + C over row-major integer matrices, wrapped or saturated to `i32`.
fn matmul_int(
    a: impl Fn(usize, usize) -> i64,
    b: impl Fn(usize, usize) -> i64,
    c: impl Fn(usize, usize) -> i64,
    (m, n, k): (usize, usize, usize),
    sat: bool,
) -> (Vec<i32>, usize) {
    let mut past = 0;
    let d = (0..m * n)
        .map(|at| {
            let (i, j) = (at / n, at % n);
            let sum = c(i, j) + (0..k).map(|kk| a(i, kk) * b(kk, j)).sum::<i64>();
            past += usize::from(sum > i64::from(i32::MAX));
            if sat {
                sum.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
            } else {
                sum as i32
            }
        })
        .collect();
    (d, past)
}

#[test]
fn mixed_int8_products_wrap_or_saturate() {
    let a: Vec<i8> = small(16 * 32, 32)
        .into_iter()
        .map(|x| (x * 40.0) as i8)
        .collect();
    let b: Vec<u8> = small(32 * 8, 33)
        .into_iter()
        .map(|x| ((x + 3.0) * 40.0) as u8)
        .collect();
    let c: Vec<i32> = (0..128)
        .map(|i| {
            if i % 3 == 0 {
                i32::MAX - 2000
            } else {
                i * 11 - 700
            }
        })
        .collect();
    for arch in ARCHS {
        let m = load_fixture("mma_sync", arch);
        let mem = TestMemory::new();
        let (da, db, dc) = (mem.alloc_from(&a), mem.alloc_from(&b), mem.alloc_from(&c));
        let dd = mem.alloc(128 * 4);
        for sat in [false, true] {
            let args = [
                Arg::U64(da),
                Arg::U64(db),
                Arg::U64(dc),
                Arg::U64(dd),
                Arg::I32(i32::from(sat)),
            ];
            launch(&m, &mem, "imma16832", 32, &args);
            let (want, past) = matmul_int(
                |i, k| i64::from(a[i * 32 + k]),
                |k, j| i64::from(b[k * 8 + j]),
                |i, j| i64::from(c[i * 8 + j]),
                (16, 8, 32),
                sat,
            );
            assert!(past > 0, "some sums pass i32::MAX");
            assert_eq!(mem.read::<i32>(dd, 128), want, "{arch} satfinite {sat}");
        }
    }
}

#[test]
fn int8_products_sixteen_deep_in_both_shapes() {
    let a: Vec<i8> = small(16 * 16, 34)
        .into_iter()
        .map(|x| (x * 30.0) as i8)
        .collect();
    let b: Vec<i8> = small(16 * 8, 35)
        .into_iter()
        .map(|x| (x * 30.0) as i8)
        .collect();
    let ua: Vec<u8> = a.iter().map(|&x| x as u8).collect();
    for arch in ARCHS {
        let m = load_fixture("mma_sync", arch);
        let mem = TestMemory::new();
        let (da, db) = (mem.alloc_from(&a), mem.alloc_from(&b));
        let dd = mem.alloc(128 * 4);
        launch(
            &m,
            &mem,
            "imma16816",
            32,
            &[Arg::U64(da), Arg::U64(db), Arg::U64(dd)],
        );
        let (want, _) = matmul_int(
            |i, k| i64::from(a[i * 16 + k]),
            |k, j| i64::from(b[k * 8 + j]),
            |_, _| 0,
            (16, 8, 16),
            false,
        );
        assert_eq!(mem.read::<i32>(dd, 128), want, "{arch} m16n8k16");

        // m8n8k16 reads A's first 8 rows as unsigned bytes, plus 1.
        let dd = mem.alloc(64 * 4);
        launch(
            &m,
            &mem,
            "imma8816",
            32,
            &[Arg::U64(da), Arg::U64(db), Arg::U64(dd)],
        );
        let (want, _) = matmul_int(
            |i, k| i64::from(ua[i * 16 + k]),
            |k, j| i64::from(b[k * 8 + j]),
            |_, _| 1,
            (8, 8, 16),
            false,
        );
        assert_eq!(mem.read::<i32>(dd, 64), want, "{arch} m8n8k16");
    }
}

#[test]
fn f64_products() {
    let a: Vec<f64> = (0..32).map(|i| f64::from(i) * 0.25 - 3.0).collect();
    let b: Vec<f64> = (0..32).map(|i| f64::from(i % 7) - 2.5).collect();
    let c: Vec<f64> = (0..64).map(|i| f64::from(i) / 8.0).collect();
    for arch in ARCHS {
        let m = load_fixture("mma_sync", arch);
        let mem = TestMemory::new();
        let (da, db, dc) = (mem.alloc_from(&a), mem.alloc_from(&b), mem.alloc_from(&c));
        let dd = mem.alloc(64 * 8);
        let args = [Arg::U64(da), Arg::U64(db), Arg::U64(dc), Arg::U64(dd)];
        launch(&m, &mem, "dmma884", 32, &args);
        let got = mem.read::<f64>(dd, 64);
        for i in 0..8 {
            for j in 0..8 {
                let want = c[i * 8 + j] + (0..4).map(|k| a[i * 4 + k] * b[k * 8 + j]).sum::<f64>();
                assert_eq!(got[i * 8 + j], want, "{arch} D[{i}][{j}]");
            }
        }
    }
}

/// A lane's register of an 8x8 matrix of 16-bit elements as the PTX ISA's `ldmatrix` figure
/// places it: lane `l` holds row `l / 4`, columns `2 (l % 4)` (low half) and `2 (l % 4) + 1`.
fn fragment_register(at: impl Fn(usize, usize) -> u16, lane: usize) -> u32 {
    let (row, col) = (lane / 4, 2 * (lane % 4));
    u32::from(at(row, col)) | (u32::from(at(row, col + 1)) << 16)
}

/// Rows of shared memory the lanes name in `ldsm` and `stsm`: lane `l` names row `perm[l]`.
fn permutation() -> Vec<i32> {
    (0..32).map(|l| (l * 5 + 3) % 32).collect()
}

#[test]
fn ldmatrix_gives_each_lane_the_isa_s_elements() {
    let src: Vec<u16> = (0..256).map(|i| (i * 7 + 1) as u16).collect();
    let perm = permutation();
    // Element (r, c) of matrix j: row r of matrix j is the row lane 8j + r names.
    let elem = |j: usize, r: usize, c: usize| src[perm[8 * j + r] as usize * 8 + c];
    for arch in ARCHS {
        let m = load_fixture("mma_sync", arch);
        let mem = TestMemory::new();
        let (ds, dp) = (mem.alloc_from(&src), mem.alloc_from(&perm));
        let out = mem.alloc(352 * 4);
        launch(
            &m,
            &mem,
            "ldsm",
            32,
            &[Arg::U64(ds), Arg::U64(dp), Arg::U64(out)],
        );
        let got = mem.read::<u32>(out, 352);
        for l in 0..32 {
            for j in 0..4 {
                let want = fragment_register(|r, c| elem(j, r, c), l);
                assert_eq!(got[l * 4 + j], want, "{arch} .x4 lane {l} matrix {j}");
                let want = fragment_register(|r, c| elem(j, c, r), l);
                assert_eq!(
                    got[128 + l * 4 + j],
                    want,
                    "{arch} .x4.trans lane {l} matrix {j}"
                );
            }
            let want = fragment_register(|r, c| elem(0, r, c), l);
            assert_eq!(got[256 + l], want, "{arch} .x1 lane {l}");
            for j in 0..2 {
                let want = fragment_register(|r, c| elem(j, c, r), l);
                assert_eq!(
                    got[288 + l * 2 + j],
                    want,
                    "{arch} .x2.trans lane {l} matrix {j}"
                );
            }
        }
    }
}

#[test]
fn movmatrix_transposes_a_fragment() {
    let input: Vec<u32> = (0..32)
        .map(|l| 0x0101_0000 * l + 0x0003_0005 * (l + 1))
        .collect();
    // Element (r, c) of the input fragment.
    let elem = |r: usize, c: usize| (input[4 * r + c / 2] >> (16 * (c % 2))) as u16;
    for arch in ARCHS {
        let m = load_fixture("mma_sync", arch);
        let mem = TestMemory::new();
        let (di, out) = (mem.alloc_from(&input), mem.alloc(32 * 4));
        launch(&m, &mem, "movm", 32, &[Arg::U64(di), Arg::U64(out)]);
        let got = mem.read::<u32>(out, 32);
        for (l, g) in got.iter().enumerate() {
            assert_eq!(
                *g,
                fragment_register(|r, c| elem(c, r), l),
                "{arch} lane {l}"
            );
        }
    }
}

#[test]
fn stmatrix_stores_each_lane_s_elements_where_the_isa_says() {
    let input: Vec<u32> = (0..128)
        .map(|i| 0x0007_0000 * i + 0x0001_0003 * (i + 5))
        .collect();
    let perm = permutation();
    // Element (r, c) of matrix j of the fragments: lane 4r + c/2's register j.
    let elem =
        |j: usize, r: usize, c: usize| (input[4 * (4 * r + c / 2) + j] >> (16 * (c % 2))) as u16;
    // stmatrix needs sm_90.
    let m = load_fixture("mma_sync", "compute_90");
    let mem = TestMemory::new();
    let (di, dp) = (mem.alloc_from(&input), mem.alloc_from(&perm));
    let out = mem.alloc(512 * 2);
    launch(
        &m,
        &mem,
        "stsm",
        32,
        &[Arg::U64(di), Arg::U64(dp), Arg::U64(out)],
    );
    let got = mem.read::<u16>(out, 512);
    // Row perm[8j + r] of the shared rows holds row r of matrix j (.x4), or row r of its
    // transpose (.x2.trans, matrices 0 and 1 only; the other rows stay 0).
    let mut x2 = vec![0u16; 256];
    for (l, &row) in perm.iter().enumerate() {
        let (j, r, row) = (l / 8, l % 8, row as usize);
        for c in 0..8 {
            assert_eq!(
                got[row * 8 + c],
                elem(j, r, c),
                ".x4 matrix {j} row {r} col {c}"
            );
            if j < 2 {
                x2[row * 8 + c] = elem(j, c, r);
            }
        }
    }
    assert_eq!(&got[256..], &x2[..], ".x2.trans");
}

#[test]
fn a_gemm_fed_by_ldmatrix() {
    const N: usize = 128;
    let (a, b) = (small(N * N, 36), small(N * N, 37));
    let want = matmul_f32(&a, &b, &vec![0.0; N * N], (N, N, N));
    for arch in ARCHS {
        let m = load_fixture("mma_sync", arch);
        let mem = TestMemory::new();
        let (da, db) = (mem.alloc_from(&halves(&a)), mem.alloc_from(&halves(&b)));
        let dc = mem.alloc(N * N * 4);
        let g = alloc_globals(&m, &mem);
        // 2x2 tiles of 64x64, four warps each.
        let cfg = Config {
            grid: [2, 2, 1],
            block: [128, 1, 1],
            dynamic_shared: 0,
            workers: 1,
        };
        let args = [Arg::U64(da), Arg::U64(db), Arg::U64(dc), Arg::I32(N as i32)];
        run(&m, "gemm", &cfg, &args, &mem, &g).unwrap_or_else(|f| panic!("gemm: {f}"));
        assert_eq!(mem.read::<f32>(dc, N * N), want, "{arch}");
    }
}

/// A kernel of one instruction after `%rd1` (a parameter) and `%r1`..`%r11` are declared.
fn kernel(inst: &str) -> String {
    format!(
        ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k(.param .u64 p)\n{{\n\
         .reg .b32 %r<12>;\n.reg .b64 %rd<3>;\n.reg .f64 %fd<4>;\nld.param.u64 %rd1, [p];\n\
         cvt.u32.u64 %r1, %rd1;\n{inst}\nret;\n}}\n"
    )
}

#[test]
fn unsupported_forms_are_refused_at_load_and_wrong_ones_are_errors() {
    for inst in [
        // Volta's quad-pair shape, sparse A, sub-byte types, another layout.
        "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {%r1,%r2,%r3,%r4,%r5,%r6,%r7,%r8}, {%r1,%r2}, {%r1,%r2}, {%r1,%r2,%r3,%r4,%r5,%r6,%r7,%r8};",
        "mma.sp.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%r1,%r2,%r3,%r4}, {%r1,%r2}, {%r1,%r2}, {%r1,%r2,%r3,%r4}, %r5, 0;",
        "mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32 {%r1,%r2,%r3,%r4}, {%r1,%r2,%r3,%r4}, {%r1,%r2}, {%r1,%r2,%r3,%r4};",
        "mma.sync.aligned.m16n8k16.col.row.f32.f16.f16.f32 {%r1,%r2,%r3,%r4}, {%r1,%r2,%r3,%r4}, {%r1,%r2}, {%r1,%r2,%r3,%r4};",
        // bf16 has no f16 accumulators; floats do not saturate here.
        "mma.sync.aligned.m16n8k16.row.col.f16.bf16.bf16.f16 {%r1,%r2}, {%r1,%r2,%r3,%r4}, {%r1,%r2}, {%r1,%r2};",
        "mma.sync.aligned.m16n8k16.row.col.satfinite.f32.f16.f16.f32 {%r1,%r2,%r3,%r4}, {%r1,%r2,%r3,%r4}, {%r1,%r2}, {%r1,%r2,%r3,%r4};",
        // 8-bit matrices of ldmatrix (sm_100).
        "ldmatrix.sync.aligned.m16n16.x1.trans.shared.b8 {%r1,%r2}, [%rd1];",
    ] {
        let e = Module::load(&kernel(inst)).unwrap_err();
        assert_eq!(e.kind, LoadErrorKind::NotSupported, "{inst}: {e}");
    }
    for inst in [
        // Three registers for A of m16n8k16 f16 (it has four); five for an .x4.
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%r1,%r2,%r3,%r4}, {%r1,%r2,%r3}, {%r1,%r2}, {%r1,%r2,%r3,%r4};",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1,%r2,%r3,%r4,%r5}, [%rd1];",
        "stmatrix.sync.aligned.m8n8.x2.shared.b16 [%rd1], {%r1};",
    ] {
        let e = Module::load(&kernel(inst)).unwrap_err();
        assert_ne!(e.kind, LoadErrorKind::NotSupported, "{inst}: {e}");
    }
}

#[test]
fn matrix_rows_at_bad_addresses_fault() {
    let cases = [
        // A row that is not 16-byte aligned.
        (
            "ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%r2}, [%rd1];",
            8u64,
            FaultKind::MisalignedAddress,
        ),
        (
            "stmatrix.sync.aligned.m8n8.x1.shared.b16 [%rd1], {%r2};",
            8,
            FaultKind::MisalignedAddress,
        ),
        // Rows far outside the block's shared memory.
        (
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%r2,%r3,%r4,%r5}, [%rd1];",
            1 << 40,
            FaultKind::IllegalAddress,
        ),
        (
            "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%rd1], {%r2,%r3,%r4,%r5};",
            1 << 40,
            FaultKind::IllegalAddress,
        ),
    ];
    for (inst, addr, kind) in cases {
        let m = Module::load(&kernel(inst)).unwrap_or_else(|e| panic!("{inst}: {e}"));
        let mem = TestMemory::new();
        let g = alloc_globals(&m, &mem);
        let f = run(&m, "k", &Config::linear(1, 32), &[Arg::U64(addr)], &mem, &g).expect_err(inst);
        assert_eq!(f.kind, kind, "{inst}: {f}");
    }
}
