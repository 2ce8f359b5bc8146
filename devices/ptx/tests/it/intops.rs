//! Integer instruction families against CPU references (NVRTC output for sm_52/80/90).

use vgpu_ptx::testutils::*;

/// Deterministic inputs with the usual corner cases first.
fn inputs(n: usize) -> (Vec<i32>, Vec<i32>) {
    let corners = [
        0,
        1,
        -1,
        2,
        -2,
        i32::MAX,
        i32::MIN,
        31,
        32,
        33,
        0x7f,
        0x80,
        0xff,
        0x1234_5678,
        -0x1234_5678,
    ];
    let mut a = Vec::new();
    let mut b = Vec::new();
    for &x in &corners {
        for &y in &corners {
            a.push(x);
            b.push(y);
        }
    }
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    while a.len() < n {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        a.push((s >> 32) as i32);
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let y = (s >> 32) as i32;
        b.push(if a.len() % 5 == 0 { y >> 20 } else { y });
    }
    a.truncate(n);
    b.truncate(n);
    (a, b)
}

fn byte_perm(x: u32, y: u32, s: u32) -> u32 {
    let bytes = ((y as u64) << 32) | x as u64;
    (0..4)
        .map(|i| (((bytes >> (8 * ((s >> (4 * i)) & 7))) & 0xff) as u32) << (8 * i))
        .fold(0, |a, b| a | b)
}

fn ffs64(v: i64) -> u32 {
    if v == 0 { 0 } else { v.trailing_zeros() + 1 }
}

fn sext24(v: i32) -> i64 {
    ((v << 8) >> 8) as i64
}

fn reference(x: i32, y: i32) -> Vec<u32> {
    let (ux, uy) = (x as u32, y as u32);
    let lx = (x as i64).wrapping_mul(0x12345).wrapping_add(y as i64);
    let ulx = lx as u64;
    let div_ok = y != 0 && !(x == i32::MIN && y == -1);
    vec![
        x.wrapping_add(y) as u32,
        x.wrapping_sub(y) as u32,
        x.wrapping_mul(y) as u32,
        ((x as i64 * y as i64) >> 32) as u32,
        ((ux as u64 * uy as u64) >> 32) as u32,
        if div_ok {
            (x / y) as u32
        } else if y == 0 {
            7
        } else {
            x.wrapping_div(y) as u32
        },
        if div_ok {
            (x % y) as u32
        } else if y == 0 {
            7
        } else {
            0
        },
        ux.checked_div(uy).unwrap_or(7),
        ux.checked_rem(uy).unwrap_or(7),
        x.min(y) as u32,
        ux.max(uy),
        x.wrapping_abs() as u32,
        x.wrapping_shl(uy & 31) as u32,
        (x >> (uy & 31)) as u32,
        ux >> (uy & 31),
        ux.count_ones(),
        x.leading_zeros(),
        ux.reverse_bits(),
        ffs64(x as i64),
        byte_perm(ux, uy, uy & 0x7777),
        ((x as i64 - y as i64).unsigned_abs() as u32).wrapping_add(5),
        ((((uy as u64) << 32 | ux as u64) << (uy & 31)) >> 32) as u32,
        ((((uy as u64) << 32 | ux as u64) >> (uy & 31)) & 0xffff_ffff) as u32,
        (ux >> (uy & 15)) & 0x1ff,
        (ux & !0xff00) | ((uy & 0xff) << 8),
        (lx >> 17) as u32,
        (ulx / (uy | 1) as u64) as u32,
        (lx % (y | 1) as i64) as u32,
        ulx.count_ones(),
        lx.leading_zeros(),
        ((ulx as u128 * (ulx.wrapping_mul(3).wrapping_add(1)) as u128) >> 64) as u64 as u32,
        ((lx as i128 * (lx.wrapping_neg().wrapping_add(5)) as i128) >> 64) as u64 as u32,
        (sext24(x) * sext24(y)) as u32,
        ((ux & 0xff_ffff) as u64 * (uy & 0xff_ffff) as u64) as u32,
        ((x ^ y) & (!x | y)) as u32,
        ((x as i8 as i32) as u32).wrapping_add(y as i16 as i32 as u32),
        (ux as u8 as u32) * (uy as u16 as u32),
        ((x as i64 + y as i64) >> 1) as u32,
        ((x as i64 + y as i64 + 1) >> 1) as u32,
        ffs64(lx),
    ]
}

#[test]
fn integer_ops_match_cpu() {
    const NOPS: usize = 40;
    let n = 500;
    let (a, b) = inputs(n);
    // Drop the one C-undefined pair (INT_MIN / -1) from the division checks.
    for arch in ARCHS {
        let m = load_fixture("intops", arch);
        let mem = TestMemory::new();
        let (da, db, dout) = (
            mem.alloc_from(&a),
            mem.alloc_from(&b),
            mem.alloc(n * NOPS * 4),
        );
        let cfg = Config::linear(n.div_ceil(128) as u32, 128);
        run(
            &m,
            "intops",
            &cfg,
            &[
                Arg::U64(da),
                Arg::U64(db),
                Arg::U64(dout),
                Arg::I32(n as i32),
            ],
            &mem,
            &alloc_globals(&m, &mem),
        )
        .unwrap();
        let out: Vec<u32> = mem.read(dout, n * NOPS);
        for i in 0..n {
            let want = reference(a[i], b[i]);
            for k in 0..NOPS {
                if (k == 5 || k == 6) && a[i] == i32::MIN && b[i] == -1 {
                    continue;
                }
                assert_eq!(
                    out[i * NOPS + k],
                    want[k],
                    "{arch}: op {k} of ({:#x}, {:#x})",
                    a[i],
                    b[i]
                );
            }
        }
    }
}

#[test]
fn dp4a_matches_cpu() {
    let n = 300;
    let (a, b) = inputs(n);
    for arch in ["compute_80", "compute_90"] {
        let m = load_fixture("intops", arch);
        let mem = TestMemory::new();
        let (da, db, dout) = (mem.alloc_from(&a), mem.alloc_from(&b), mem.alloc(n * 8));
        run(
            &m,
            "dp4a_kernel",
            &Config::linear(3, 128),
            &[
                Arg::U64(da),
                Arg::U64(db),
                Arg::U64(dout),
                Arg::I32(n as i32),
            ],
            &mem,
            &alloc_globals(&m, &mem),
        )
        .unwrap();
        let out: Vec<i32> = mem.read(dout, 2 * n);
        for i in 0..n {
            let (x, y) = (a[i].to_le_bytes(), b[i].to_le_bytes());
            let dp4: i32 = (0..4)
                .map(|k| x[k] as i8 as i32 * y[k] as i8 as i32)
                .sum::<i32>()
                + i as i32;
            let h = [a[i] as i16 as i32, (a[i] >> 16) as i16 as i32];
            let dp2 = h[0] * (y[0] as i8 as i32) + h[1] * (y[1] as i8 as i32) + i as i32;
            assert_eq!(out[2 * i], dp4, "{arch} dp4a {i}");
            assert_eq!(out[2 * i + 1], dp2, "{arch} dp2a {i}");
        }
    }
}
