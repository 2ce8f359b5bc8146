//! Atomics, barriers, shared/local/generic addressing, calls, module variables.

use vgpu_ptx::testutils::*;

#[test]
fn global_atomics_under_many_threads() {
    let n = 2000usize;
    let input: Vec<i32> = (0..n as i32).map(|i| (i * 7919) % 1000 - 300).collect();
    for arch in ARCHS {
        for workers in [1, 3] {
            let m = load_fixture("atomics", arch);
            let mem = TestMemory::new();
            let ci_init = [0i32, i32::MAX, i32::MIN, 5];
            let ci = mem.alloc(4 * (16 + n));
            mem.write(ci, &ci_init);
            let cu = mem.alloc(4 * 8);
            mem.write(cu, &[u32::MAX, 0, 0, 0, 0, 0, 0]);
            let (cf, cd, cl) = (mem.alloc(4), mem.alloc(8), mem.alloc(16));
            let din = mem.alloc_from(&input);
            let cfg = Config {
                grid: [(n as u32).div_ceil(128), 1, 1],
                block: [128, 1, 1],
                dynamic_shared: 0,
                workers,
            };
            run(
                &m,
                "atomics_global",
                &cfg,
                &[
                    Arg::U64(ci),
                    Arg::U64(cu),
                    Arg::U64(cf),
                    Arg::U64(cd),
                    Arg::U64(cl),
                    Arg::U64(din),
                    Arg::I32(n as i32),
                ],
                &mem,
                &alloc_globals(&m, &mem),
            )
            .unwrap();
            let i: Vec<i32> = mem.read(ci, 16 + n);
            let u: Vec<u32> = mem.read(cu, 7);
            let sum: i32 = input.iter().sum();
            assert_eq!(i[0], sum, "{arch}: atomicAdd");
            assert_eq!(i[1], *input.iter().min().unwrap(), "{arch}: atomicMin");
            assert_eq!(i[2], *input.iter().max().unwrap(), "{arch}: atomicMax");
            assert_eq!(i[3], 5 + 2 * sum, "{arch}: CAS loop");
            assert_eq!(u[0], 0, "{arch}: atomicAnd clears every lane bit");
            assert_eq!(
                u[1],
                input.iter().fold(0u32, |a, &v| a | 1 << (v & 31)),
                "{arch}: atomicOr"
            );
            assert_eq!(
                u[2],
                input.iter().fold(0u32, |a, &v| a ^ v as u32),
                "{arch}: atomicXor"
            );
            assert_eq!(u[3], (n % 1001) as u32, "{arch}: atomicInc wraps at 1000");
            // atomicDec from 0 with limit 77: 0 -> 77, then counts down, wrapping every 78.
            assert_eq!(u[4], ((78 - (n % 78)) % 78) as u32, "{arch}: atomicDec");
            assert!(
                (u[5] as usize) < n,
                "{arch}: atomicExch leaves some thread id"
            );
            assert_eq!(u[6], n as u32, "{arch}: ticket counter");
            let mut tickets: Vec<i32> = i[16..16 + n].to_vec();
            tickets.sort_unstable();
            assert_eq!(
                tickets,
                (0..n as i32).collect::<Vec<_>>(),
                "{arch}: every ticket taken once"
            );
            assert_eq!(
                mem.read::<f32>(cf, 1)[0],
                0.5 * n as f32,
                "{arch}: float add"
            );
            assert_eq!(
                mem.read::<f64>(cd, 1)[0],
                0.25 * n as f64,
                "{arch}: double add"
            );
            let l: Vec<u64> = mem.read(cl, 2);
            assert_eq!(
                l[0],
                input
                    .iter()
                    .map(|&v| v as i64 as u64)
                    .fold(0u64, u64::wrapping_add),
                "{arch}: 64-bit add"
            );
            assert_eq!(
                l[1],
                input
                    .iter()
                    .map(|&v| (v as i64 as u64).wrapping_mul(3))
                    .max()
                    .unwrap(),
                "{arch}: 64-bit max"
            );
        }
    }
}

#[test]
fn shared_and_generic_atomics() {
    let n = 1000usize;
    let input: Vec<i32> = (0..n as i32).map(|i| (i * 31) % 977).collect();
    for arch in ARCHS {
        let m = load_fixture("atomics", arch);
        let mem = TestMemory::new();
        let (din, dout) = (mem.alloc_from(&input), mem.alloc(4 * 20));
        let cfg = Config {
            grid: [8, 1, 1],
            block: [128, 1, 1],
            dynamic_shared: 0,
            workers: 2,
        };
        run(
            &m,
            "atomics_shared",
            &cfg,
            &[Arg::U64(din), Arg::U64(dout), Arg::I32(n as i32)],
            &mem,
            &alloc_globals(&m, &mem),
        )
        .unwrap();
        let out: Vec<i32> = mem.read(dout, 20);
        let mut hist = [0i32; 16];
        for &v in &input {
            hist[(v & 15) as usize] += 1;
        }
        assert_eq!(&out[..16], &hist, "{arch}: shared histogram");
        assert_eq!(
            f32::from_bits(out[16] as u32),
            n as f32,
            "{arch}: shared float add"
        );
        let lmax = u64::from(out[18] as u32) | (u64::from(out[19] as u32) << 32);
        assert_eq!(
            lmax,
            *input.iter().max().unwrap() as u64,
            "{arch}: shared 64-bit max"
        );

        let dout = mem.alloc(4 * 5);
        run(
            &m,
            "atomics_generic",
            &Config::linear(4, 96),
            &[Arg::U64(dout)],
            &mem,
            &alloc_globals(&m, &mem),
        )
        .unwrap();
        let out: Vec<i32> = mem.read(dout, 5);
        assert_eq!(out[0], 2 * 4 * 96, "{arch}: generic atomics on global");
        assert_eq!(&out[1..], &[96; 4], "{arch}: generic atomics on shared");
    }
}

#[test]
fn barriers_and_block_reductions() {
    for arch in ARCHS {
        let m = load_fixture("barriers", arch);
        let mem = TestMemory::new();
        // Dynamic shared memory reduction.
        let n = 5000usize;
        let input: Vec<f32> = (0..n).map(|i| (i % 17) as f32).collect();
        let block = 256u32;
        let grid = (n as u32).div_ceil(block * 2);
        let (din, dout) = (mem.alloc_from(&input), mem.alloc(4 * grid as usize));
        let cfg = Config {
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            dynamic_shared: block * 4,
            workers: 2,
        };
        run(
            &m,
            "block_reduce",
            &cfg,
            &[Arg::U64(din), Arg::U64(dout), Arg::I32(n as i32)],
            &mem,
            &alloc_globals(&m, &mem),
        )
        .unwrap();
        let partial: Vec<f32> = mem.read(dout, grid as usize);
        assert_eq!(
            partial.iter().sum::<f32>(),
            input.iter().sum::<f32>(),
            "{arch}"
        );
        for (b, &p) in partial.iter().enumerate() {
            let lo = b * 512;
            let want: f32 = input[lo..(lo + 512).min(n)].iter().sum();
            assert_eq!(p, want, "{arch}: block {b}");
        }
        // bar.red popc/and/or.
        let vals: Vec<i32> = (0..3 * 128)
            .map(|i| {
                if i < 128 {
                    i - 2
                } else if i < 256 {
                    42 * (i % 2)
                } else {
                    -(i % 7)
                }
            })
            .collect();
        let (dv, dr) = (mem.alloc_from(&vals), mem.alloc(4 * 9));
        run(
            &m,
            "bar_red",
            &Config::linear(3, 128),
            &[Arg::U64(dv), Arg::U64(dr)],
            &mem,
            &alloc_globals(&m, &mem),
        )
        .unwrap();
        let r: Vec<i32> = mem.read(dr, 9);
        for b in 0..3 {
            let s = &vals[b * 128..(b + 1) * 128];
            let want = [
                s.iter().filter(|&&v| v > 0).count() as i32,
                s.iter().all(|&v| v > -5) as i32,
                s.contains(&42) as i32,
            ];
            assert_eq!(&r[3 * b..3 * b + 3], &want, "{arch}: bar.red block {b}");
        }
        // 2-D block scan with 1024 threads.
        let vals: Vec<i32> = (0..2048).map(|i| (i % 13) - 6).collect();
        let (dv, dr) = (mem.alloc_from(&vals), mem.alloc(4 * 2048));
        let cfg = Config {
            grid: [2, 1, 1],
            block: [32, 32, 1],
            dynamic_shared: 0,
            workers: 2,
        };
        run(
            &m,
            "scan2d",
            &cfg,
            &[Arg::U64(dv), Arg::U64(dr)],
            &mem,
            &alloc_globals(&m, &mem),
        )
        .unwrap();
        let r: Vec<i32> = mem.read(dr, 2048);
        for b in 0..2 {
            let mut acc = 0;
            for t in 0..1024 {
                acc += vals[b * 1024 + t];
                assert_eq!(r[b * 1024 + t], acc, "{arch}: scan block {b} thread {t}");
            }
        }
    }
}

#[test]
fn generic_local_shared_and_calls() {
    let n = 120usize;
    let block = 64usize;
    let input: Vec<i32> = (0..n as i32).map(|i| (i * 13) % 97).collect();
    fn fib(n: i32) -> i32 {
        if n < 2 { n } else { fib(n - 1) + fib(n - 2) }
    }
    // The kernel's third sum reads a whole block of `in`, so the buffer covers both blocks.
    let mut padded = input.clone();
    padded.resize(2 * block, 0);
    for arch in ARCHS {
        let m = load_fixture("generic", arch);
        let mem = TestMemory::new();
        let (din, dout) = (mem.alloc_from(&padded), mem.alloc(n * 6 * 4));
        run(
            &m,
            "generic_mem",
            &Config::linear(2, block as u32),
            &[Arg::U64(din), Arg::U64(dout), Arg::I32(n as i32)],
            &mem,
            &alloc_globals(&m, &mem),
        )
        .unwrap();
        let out: Vec<i32> = mem.read(dout, n * 6);
        for tid in 0..n {
            let t = (tid % block) as i32;
            let v = input[tid];
            let mut local: Vec<i32> = (0..16).map(|k| v + k * t).collect();
            local[(v & 15) as usize] += 100;
            let b = tid / block;
            let sh: i32 = (0..block)
                .map(|j| input.get(b * block + j).copied().unwrap_or(0))
                .sum();
            let glob: i32 = padded[b * block..(b + 1) * block].iter().sum();
            let want = [
                local.iter().sum::<i32>(),
                sh,
                glob,
                v * 3 + (v as f32 * 0.5) as i32 + (v as f64 * 0.25) as i32,
                fib(v & 7),
                local[((v >> 3) & 15) as usize],
            ];
            for k in 0..6 {
                assert_eq!(out[6 * tid + k], want[k], "{arch}: thread {tid} output {k}");
            }
        }
    }
}

#[test]
fn module_variables_and_dynamic_shared() {
    for arch in ARCHS {
        let m = load_fixture("misc", arch);
        let names: Vec<&str> = m.globals().iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["counter", "table", "coeffs", "dconst"], "{arch}");
        assert_eq!(m.globals()[1].init.len(), 32);
        assert_eq!(m.globals()[2].space, vgpu_ptx::GlobalSpace::Const);
        let mem = TestMemory::new();
        let g = alloc_globals(&m, &mem);
        let n = 300usize;
        let dout = mem.alloc(n * 4);
        run(
            &m,
            "module_vars",
            &Config::linear(3, 128),
            &[Arg::U64(dout), Arg::I32(n as i32)],
            &mem,
            &g,
        )
        .unwrap();
        let out: Vec<f32> = mem.read(dout, n);
        let coeffs = [0.5f32, 1.5, -2.0, 4.0];
        let table = [1, 2, 3, 5, 8, 13, 21, 34];
        for i in 0..n {
            assert_eq!(
                out[i],
                coeffs[i & 3] * table[i & 7] as f32 + 2.5,
                "{arch}: element {i}"
            );
        }
        assert_eq!(mem.read::<i32>(g[0], 1)[0], n as i32, "{arch}: counter");

        let vals: Vec<i32> = (0..512).collect();
        let (din, dout) = (mem.alloc_from(&vals), mem.alloc(512 * 4));
        let cfg = Config {
            grid: [4, 1, 1],
            block: [128, 1, 1],
            dynamic_shared: 128 * 4,
            workers: 1,
        };
        run(
            &m,
            "dyn_shared",
            &cfg,
            &[Arg::U64(din), Arg::U64(dout)],
            &mem,
            &g,
        )
        .unwrap();
        let out: Vec<i32> = mem.read(dout, 512);
        for b in 0..4 {
            for t in 0..128 {
                assert_eq!(out[b * 128 + t], (b * 128 + 127 - t) as i32, "{arch}");
            }
        }
    }
}

#[test]
fn three_d_geometry_and_special_registers() {
    for arch in ARCHS {
        let m = load_fixture("misc", arch);
        let mem = TestMemory::new();
        let g = alloc_globals(&m, &mem);
        let (grid, block) = ([3u32, 2, 2], [8u32, 4, 3]);
        let total = (3 * 2 * 2 * 8 * 4 * 3) as usize;
        let dout = mem.alloc(total * 8 * 4);
        let cfg = Config {
            grid,
            block,
            dynamic_shared: 0,
            workers: 2,
        };
        run(&m, "geometry", &cfg, &[Arg::U64(dout)], &mem, &g).unwrap();
        let out: Vec<u32> = mem.read(dout, total * 8);
        let mut seen = 0;
        for bz in 0..2 {
            for by in 0..2 {
                for bx in 0..3 {
                    for tz in 0..3 {
                        for ty in 0..4 {
                            for tx in 0..8 {
                                let b = bx + 3 * (by + 2 * bz);
                                let t = tx + 8 * (ty + 4 * tz);
                                let o = &out[(b * 96 + t) as usize * 8..][..8];
                                assert_eq!(o[0], tx | ty << 10 | tz << 20, "{arch}");
                                assert_eq!(o[1], bx | by << 10 | bz << 20, "{arch}");
                                assert_eq!(o[2], 8 | 4 << 10 | 3 << 20, "{arch}");
                                assert_eq!(o[3], 3 | 2 << 10 | 2 << 20, "{arch}");
                                let lane = t % 32;
                                assert_eq!(o[4], lane, "{arch}");
                                // lt ^ le leaves the own bit; ^ gt gives every bit at or above the lane.
                                assert_eq!(o[5], u32::MAX << lane, "{arch}: lanemask_lt ^ le ^ gt");
                                assert_eq!(o[6], 1, "{arch}");
                                assert_eq!(o[7], 1, "{arch}");
                                seen += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(seen, total);
    }
}

#[test]
fn managed_variables_are_marked() {
    let m = vgpu_ptx::Module::load(
        ".version 7.0\n.target sm_52\n.address_size 64\n\
         .global .attribute(.managed) .align 4 .u32 counter = 5;\n\
         .visible .global .attribute(.managed) .align 4 .b8 vals[16];\n\
         .global .align 4 .u32 plain;\n",
    )
    .expect("loads");
    let managed: Vec<(&str, bool)> = m
        .globals()
        .iter()
        .map(|g| (g.name.as_str(), g.managed))
        .collect();
    assert_eq!(
        managed,
        [("counter", true), ("vals", true), ("plain", false)]
    );
}
