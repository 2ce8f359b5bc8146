//! End-to-end runs of NVRTC-compiled kernels against CPU references.

use vgpu_ptx::testutils::*;
use vgpu_ptx::*;

#[test]
fn saxpy_all_archs() {
    for arch in ARCHS {
        let m = load_fixture("saxpy", arch);
        let mem = TestMemory::new();
        let n = 1000usize;
        let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let y: Vec<f32> = (0..n).map(|i| 1000.0 - i as f32).collect();
        let (dx, dy) = (mem.alloc_from(&x), mem.alloc_from(&y));
        let g = alloc_globals(&m, &mem);
        let p = run(
            &m,
            "saxpy",
            &Config::linear(4, 256),
            &[
                Arg::I32(n as i32),
                Arg::F32(2.5),
                Arg::U64(dx),
                Arg::U64(dy),
            ],
            &mem,
            &g,
        )
        .unwrap();
        let out: Vec<f32> = mem.read(dy, n);
        for i in 0..n {
            assert_eq!(out[i], 2.5f32.mul_add(x[i], y[i]), "{arch} element {i}");
        }
        assert_eq!(p.stats().blocks, 4);
        assert!(p.stats().thread_instructions > 10 * n as u64);
    }
}

#[test]
fn matmul_all_archs() {
    let n = 48usize;
    let a: Vec<f32> = (0..n * n).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
    let b: Vec<f32> = (0..n * n).map(|i| ((i * 5) % 11) as f32 * 0.25).collect();
    let mut c = vec![0f32; n * n];
    for r in 0..n {
        for col in 0..n {
            let mut acc = 0f32;
            for k in 0..n {
                acc = a[r * n + k].mul_add(b[k * n + col], acc);
            }
            c[r * n + col] = acc;
        }
    }
    for arch in ARCHS {
        let m = load_fixture("matmul", arch);
        let mem = TestMemory::new();
        let (da, db, dc) = (mem.alloc_from(&a), mem.alloc_from(&b), mem.alloc(n * n * 4));
        let cfg = Config {
            grid: [3, 3, 1],
            block: [16, 16, 1],
            dynamic_shared: 0,
            workers: 2,
        };
        run(
            &m,
            "matmul",
            &cfg,
            &[Arg::U64(da), Arg::U64(db), Arg::U64(dc), Arg::I32(n as i32)],
            &mem,
            &alloc_globals(&m, &mem),
        )
        .unwrap();
        let out: Vec<f32> = mem.read(dc, n * n);
        assert_eq!(out, c, "{arch}");
    }
}

#[test]
fn every_fixture_loads() {
    let dir = format!("{}/fixtures", env!("CARGO_MANIFEST_DIR"));
    let mut count = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "ptx") {
            let text = std::fs::read_to_string(&p).unwrap();
            let m = Module::load(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            assert!(!m.kernels().is_empty());
            count += 1;
        }
    }
    assert!(count >= 30);
}

/// The shared kernel corpus (tests/kernels/ptx, maintained with the vgpu-corpus crate) must load.
#[test]
fn corpus_fixtures_load() {
    let dir = format!("{}/../../tests/kernels/ptx", env!("CARGO_MANIFEST_DIR"));
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("no corpus at {dir}; skipping");
        return;
    };
    let mut failures = Vec::new();
    for e in entries {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "ptx") {
            let text = std::fs::read_to_string(&p).unwrap();
            if let Err(e) = Module::load(&text) {
                failures.push(format!("{}: {e}", p.display()));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
