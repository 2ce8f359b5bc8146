//! Tensor-core instructions whose fragment layouts the PTX ISA specifies (`mma.sync`,
//! `ldmatrix`), through the broker's protocol: each kernel builds its fragments from memory
//! element by element where the ISA's figures place them, so on a real GPU this check shows the
//! layouts the simulated GPU uses are the hardware's, and on the simulated GPU that it keeps to
//! them. Products are checked against the host's.

use vgpu_corpus::Arg;
use vgpu_proto::cuda;

use crate::conformance::{Rig, Session, Target};

/// The kernels (`devices/ptx/fixtures/mma_sync.cu`, compiled by NVRTC for compute 8.0).
const MMA_SYNC_PTX: &str = include_str!("../../devices/ptx/fixtures/mma_sync.compute_80.ptx");

const MIB: u64 = 1 << 20;
/// Lanes of a warp: each kernel but the GEMM runs one warp.
const WARP: u32 = 32;

/// Small integers in [-3, 3], deterministic, so every product and sum is exact.
fn small(n: usize, seed: usize) -> Vec<i32> {
    (0..n)
        .map(|i| ((i * 7 + seed * 13) % 7) as i32 - 3)
        .collect()
}

/// A small integer's `f16` bits.
fn f16(v: i32) -> u16 {
    let mag = match v.unsigned_abs() {
        0 => 0,
        1 => 0x3c00,
        2 => 0x4000,
        3 => 0x4200,
        other => panic!("{other} is not a small integer"),
    };
    if v < 0 { mag | 0x8000 } else { mag }
}

fn bytes<T: Copy>(v: &[T], to: impl Fn(T) -> Vec<u8>) -> Vec<u8> {
    v.iter().flat_map(|&x| to(x)).collect()
}

/// Copies `data` to a new allocation.
fn upload(s: &mut Session, data: &[u8]) -> u64 {
    let p = s.alloc(data.len() as u64).expect("an allocation");
    s.htod(p, data).expect("a copy to the device");
    p
}

/// Runs one warp of `name`, waits, and returns `len` bytes of `out`.
fn run_warp(s: &mut Session, m: u64, name: &str, args: &[Arg], out: u64, len: usize) -> Vec<u8> {
    let k = s.kernel(m, name).expect("the kernel");
    s.launch(&k, [1, 1, 1], [WARP, 1, 1], 0, args)
        .and_then(|()| s.sync())
        .unwrap_or_else(|c| panic!("{name}: {c}"));
    s.dtoh(out, len).expect("a copy from the device")
}

fn u32s(b: &[u8]) -> Vec<u32> {
    b.chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

pub fn tensor_core_fragments(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("a", 64 * MIB, 1)]);
    let mut s = rig.session("a");
    let m = match s.load(MMA_SYNC_PTX.as_bytes()) {
        Ok(m) => m,
        // A driver older than the PTX (ISA 8.8, CUDA 12.9) cannot load it.
        Err((code, why)) if code == cuda::CUDA_ERROR_UNSUPPORTED_PTX_VERSION => {
            println!(
                "conformance [{}]: the driver is older than the mma.sync kernels: {why}",
                t.name
            );
            return;
        }
        Err(e) => panic!("[{}] loading the mma.sync kernels: {e:?}", t.name),
    };

    // ldmatrix: lane l names row perm[l] of 32 rows of 8 elements; register j of lane 4r + c
    // holds columns 2c and 2c + 1 of row r of matrix j (of its transpose with .trans).
    let src: Vec<u16> = (0..256).map(|i| (i * 7 + 1) as u16).collect();
    let perm: Vec<i32> = (0..32).map(|l| (l * 5 + 3) % 32).collect();
    let (ds, dp) = (
        upload(&mut s, &bytes(&src, |x| x.to_le_bytes().to_vec())),
        upload(&mut s, &bytes(&perm, |x| x.to_le_bytes().to_vec())),
    );
    let out = s.alloc(352 * 4).unwrap();
    let got = u32s(&run_warp(
        &mut s,
        m,
        "ldsm",
        &[Arg::Ptr(ds), Arg::Ptr(dp), Arg::Ptr(out)],
        out,
        352 * 4,
    ));
    let elem = |j: usize, r: usize, c: usize| u32::from(src[perm[8 * j + r] as usize * 8 + c]);
    let reg = |at: &dyn Fn(usize, usize) -> u32, l: usize| {
        let (r, c) = (l / 4, 2 * (l % 4));
        at(r, c) | (at(r, c + 1) << 16)
    };
    for l in 0..32 {
        for j in 0..4 {
            assert_eq!(
                got[l * 4 + j],
                reg(&|r, c| elem(j, r, c), l),
                "[{}] ldmatrix.x4 lane {l} matrix {j}",
                t.name
            );
            assert_eq!(
                got[128 + l * 4 + j],
                reg(&|r, c| elem(j, c, r), l),
                "[{}] ldmatrix.x4.trans lane {l} matrix {j}",
                t.name
            );
        }
    }

    // mma.sync.m16n8k16 f16 with f32 accumulators: D = A B + C.
    let (a, b, c) = (small(256, 1), small(128, 2), small(128, 3));
    let da = upload(&mut s, &bytes(&a, |x| f16(x).to_le_bytes().to_vec()));
    let db = upload(&mut s, &bytes(&b, |x| f16(x).to_le_bytes().to_vec()));
    let dc = upload(&mut s, &bytes(&c, |x| (x as f32).to_le_bytes().to_vec()));
    let dd = s.alloc(128 * 4).unwrap();
    let got = u32s(&run_warp(
        &mut s,
        m,
        "hmma16816",
        &[Arg::Ptr(da), Arg::Ptr(db), Arg::Ptr(dc), Arg::Ptr(dd)],
        dd,
        128 * 4,
    ));
    for i in 0..16 {
        for j in 0..8 {
            let want = c[i * 8 + j] + (0..16).map(|k| a[i * 16 + k] * b[k * 8 + j]).sum::<i32>();
            assert_eq!(
                f32::from_bits(got[i * 8 + j]),
                want as f32,
                "[{}] f16 D[{i}][{j}]",
                t.name
            );
        }
    }

    // mma.sync.m16n8k32 s8 x u8 with s32 accumulators, wrapping past i32::MAX.
    let a8: Vec<i8> = small(16 * 32, 4).iter().map(|&x| (x * 40) as i8).collect();
    let b8: Vec<u8> = small(32 * 8, 5)
        .iter()
        .map(|&x| ((x + 3) * 40) as u8)
        .collect();
    let c32: Vec<i32> = (0..128)
        .map(|i| {
            if i % 3 == 0 {
                i32::MAX - 2000
            } else {
                i * 11 - 700
            }
        })
        .collect();
    let da = upload(&mut s, &bytes(&a8, |x| vec![x as u8]));
    let db = upload(&mut s, &b8);
    let dc = upload(&mut s, &bytes(&c32, |x| x.to_le_bytes().to_vec()));
    let got = u32s(&run_warp(
        &mut s,
        m,
        "imma16832",
        &[
            Arg::Ptr(da),
            Arg::Ptr(db),
            Arg::Ptr(dc),
            Arg::Ptr(dd),
            Arg::I32(0),
        ],
        dd,
        128 * 4,
    ));
    for i in 0..16 {
        for j in 0..8 {
            let sum = i64::from(c32[i * 8 + j])
                + (0..32)
                    .map(|k| i64::from(a8[i * 32 + k]) * i64::from(b8[k * 8 + j]))
                    .sum::<i64>();
            assert_eq!(
                got[i * 8 + j] as i32,
                sum as i32,
                "[{}] int8 D[{i}][{j}]",
                t.name
            );
        }
    }

    // A 64x64 GEMM of four warps fed by ldmatrix (.x4 for A, .x2.trans for B).
    const N: usize = 64;
    let (a, b) = (small(N * N, 6), small(N * N, 7));
    let da = upload(&mut s, &bytes(&a, |x| f16(x).to_le_bytes().to_vec()));
    let db = upload(&mut s, &bytes(&b, |x| f16(x).to_le_bytes().to_vec()));
    let dc = s.alloc((N * N * 4) as u64).unwrap();
    let k = s.kernel(m, "gemm").unwrap();
    s.launch(
        &k,
        [1, 1, 1],
        [4 * WARP, 1, 1],
        0,
        &[Arg::Ptr(da), Arg::Ptr(db), Arg::Ptr(dc), Arg::I32(N as i32)],
    )
    .and_then(|()| s.sync())
    .unwrap_or_else(|c| panic!("gemm: {c}"));
    let got = u32s(&s.dtoh(dc, N * N * 4).unwrap());
    for i in 0..N {
        for j in 0..N {
            let want = (0..N).map(|k| a[i * N + k] * b[k * N + j]).sum::<i32>();
            assert_eq!(
                f32::from_bits(got[i * N + j]),
                want as f32,
                "[{}] gemm C[{i}][{j}]",
                t.name
            );
        }
    }
    s.close();
    assert_eq!(rig.broker.tenant("a").unwrap().slice.used(), 0);
}
