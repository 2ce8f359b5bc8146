//! Warp-level semantics: shuffles, votes, activemask, divergence and reconvergence.
#![allow(clippy::needless_range_loop)]

use vgpu_ptx::testutils::*;

fn warp_reference(v: &[i32]) -> Vec<[i32; 16]> {
    let mut out = vec![[0i32; 16]; 32];
    let acc: Vec<i32> = (0..32)
        .map(|l| {
            if l % 2 == 1 {
                (0..(v[l] & 7))
                    .map(|k| k.wrapping_mul(v[l]))
                    .fold(0i32, |a, b| a.wrapping_add(b))
            } else {
                -v[l]
            }
        })
        .collect();
    let total = acc.iter().fold(0i32, |a, &b| a.wrapping_add(b));
    let all = v.iter().all(|&x| x > 0) as i32;
    let any = v.iter().any(|&x| x > 1000) as i32;
    let ballot = (0..32).fold(0u32, |m, l| m | (((v[l] & 1) as u32) << l)) as i32;
    let even_ballot = (0..32)
        .step_by(2)
        .fold(0u32, |m, l| m | ((((v[l] & 2) != 0) as u32) << l)) as i32;
    for l in 0..32usize {
        let o = &mut out[l];
        o[0] = v[(l * 7) & 31];
        o[1] = if l >= 3 { v[l - 3] } else { v[l] };
        o[2] = if l + 5 <= 31 { v[l + 5] } else { v[l] };
        o[3] = v[l ^ 9];
        o[4] = v[(l & !7) | ((l + 2) & 7)];
        o[5] = if l % 16 >= 1 { v[l - 1] } else { v[l] };
        o[6] = if l % 4 + 2 < 4 { v[l + 2] } else { v[l] };
        o[7] = all;
        o[8] = any;
        o[9] = ballot;
        o[10] = -1;
        o[11] = if l % 2 == 1 {
            0xaaaa_aaaau32 as i32
        } else {
            even_ballot
        };
        o[12] = total;
        o[13] = -1;
        o[14] = (v[31 - l] as f64 * 0.5) as i32;
        o[15] = if l < 31 { v[l + 1] } else { v[l] };
    }
    out
}

#[test]
fn shuffles_votes_and_reconvergence() {
    let nblocks = 3usize;
    let block = 64usize;
    let n = nblocks * block;
    let input: Vec<i32> = (0..n)
        .map(|i| {
            let w = i / 32;
            let base = ((i * 7919) % 2003) as i32;
            match w % 3 {
                0 => base + 1,
                1 => base - 40,
                _ => base % 900 + 1,
            }
        })
        .collect();
    for arch in ARCHS {
        let m = load_fixture("warp", arch);
        let mem = TestMemory::new();
        let (din, dout) = (mem.alloc_from(&input), mem.alloc(n * 16 * 4));
        run(
            &m,
            "warp_ops",
            &Config::linear(nblocks as u32, block as u32),
            &[Arg::U64(din), Arg::U64(dout)],
            &mem,
            &alloc_globals(&m, &mem),
        )
        .unwrap();
        let out: Vec<i32> = mem.read(dout, n * 16);
        for w in 0..n / 32 {
            let want = warp_reference(&input[w * 32..w * 32 + 32]);
            for l in 0..32 {
                for k in 0..16 {
                    assert_eq!(
                        out[(w * 32 + l) * 16 + k],
                        want[l][k],
                        "{arch}: warp {w} lane {l} output {k}"
                    );
                }
            }
        }
    }
}

#[test]
fn partial_warps_after_early_exit() {
    let n = 100usize;
    let input: Vec<i32> = (0..n as i32).map(|i| (i * 37) % 50).collect();
    for arch in ARCHS {
        let m = load_fixture("warp", arch);
        let mem = TestMemory::new();
        let (din, dout) = (mem.alloc_from(&input), mem.alloc(n * 3 * 4));
        run(
            &m,
            "warp_partial",
            &Config::linear(2, 64),
            &[Arg::U64(din), Arg::U64(dout), Arg::I32(n as i32)],
            &mem,
            &alloc_globals(&m, &mem),
        )
        .unwrap();
        let out: Vec<u32> = mem.read(dout, n * 3);
        for w in 0..n.div_ceil(32) {
            let first = w * 32;
            let active = (n - first).min(32);
            let mask: u32 = if active == 32 {
                u32::MAX
            } else {
                (1 << active) - 1
            };
            let ballot = (0..active).fold(0u32, |b, l| b | (((input[first + l] > 10) as u32) << l));
            let mut sums: Vec<i32> = (0..32)
                .map(|l| if l < active { input[first + l] } else { 0 })
                .collect();
            let mut off = 1;
            while off < 32 {
                let prev = sums.clone();
                for l in 0..active {
                    if (mask >> (l ^ off)) & 1 == 1 {
                        sums[l] = prev[l] + prev[l ^ off];
                    }
                }
                off <<= 1;
            }
            for l in 0..active {
                let t = first + l;
                assert_eq!(out[3 * t], mask, "{arch}: mask of thread {t}");
                assert_eq!(out[3 * t + 1], ballot, "{arch}: ballot of thread {t}");
                assert_eq!(out[3 * t + 2] as i32, sums[l], "{arch}: sum of thread {t}");
            }
        }
    }
}

#[test]
fn warp_sz_is_the_warp_size_wherever_an_immediate_is() {
    // nvcc writes `WARP_SZ` for warpSize (CUB's and thrust's warp arithmetic among others).
    let ptx = ".version 7.8\n.target sm_80\n.address_size 64\n\
        .visible .entry k(.param .u64 out) {\n\
        .reg .b32 %r<6>; .reg .b64 %rd<4>;\n\
        ld.param.u64 %rd1, [out]; cvta.to.global.u64 %rd1, %rd1;\n\
        mov.u32 %r1, %tid.x;\n\
        mov.u32 %r2, WARP_SZ;\n\
        rem.u32 %r3, %r1, WARP_SZ;\n\
        mad.lo.s32 %r4, %r2, 100, %r3;\n\
        mul.wide.u32 %rd2, %r1, 4; add.s64 %rd3, %rd1, %rd2;\n\
        st.global.u32 [%rd3], %r4;\n\
        ret; }\n";
    let want: Vec<u32> = (0..70).map(|t| 3200 + t % 32).collect();
    assert_eq!(run_out_kernel(ptx, 70, 70), want);
}
