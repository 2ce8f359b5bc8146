//! Device-side `malloc`, `free`, `__nv_aligned_device_malloc` and C++ `new`/`delete` on the
//! device heap, as NVRTC compiles them (`fixtures/heap.cu`).

use std::sync::Arc;

use vgpu_ptx::heap::{DeviceHeap, Heap};
use vgpu_ptx::testutils::*;
use vgpu_ptx::*;

fn launch(
    m: &Module,
    kernel: &str,
    cfg: &Config,
    args: &[Arg],
    mem: &TestMemory,
    heap: Option<Arc<Heap>>,
) -> Result<Progress, Fault> {
    let control = LaunchControl::new();
    control.set_heap(heap.map(|h| h as Arc<dyn DeviceHeap>));
    run_controlled(m, kernel, cfg, args, mem, &alloc_globals(m, mem), &control)
}

/// A heap of `size` bytes in `mem`.
fn heap(mem: &TestMemory, size: usize) -> Arc<Heap> {
    let base = mem.alloc(size);
    Arc::new(Heap::new(base, size as u64))
}

fn expected_sum(tid: i64, n: i64) -> i64 {
    (0..n).map(|i| tid + i).sum()
}

#[test]
fn threads_allocate_use_and_free_memory_that_outlives_the_launch() {
    const N: i64 = 10;
    for arch in ARCHS {
        let m = load_fixture("heap", arch);
        let mem = TestMemory::new();
        let h = heap(&mem, 1 << 20);
        let cfg = Config {
            workers: 4,
            ..Config::linear(4, 64)
        };
        let threads = 256;
        let ptrs = mem.alloc(threads * 8);
        let out = mem.alloc(threads * 8);
        launch(
            &m,
            "alloc_fill",
            &cfg,
            &[Arg::U64(ptrs), Arg::U64(out), Arg::I32(N as i32)],
            &mem,
            Some(Arc::clone(&h)),
        )
        .unwrap();
        let sums = mem.read::<i64>(out, threads);
        for (t, &s) in sums.iter().enumerate() {
            assert_eq!(s, expected_sum(t as i64, N), "{arch} thread {t}");
        }
        // Every thread got its own 16-byte aligned allocation (40 bytes, 48 with the rounding).
        let mut p = mem.read::<u64>(ptrs, threads);
        p.sort_unstable();
        assert!(p.windows(2).all(|w| w[1] >= w[0] + 40), "{arch} overlap");
        assert_eq!(h.free_bytes(), (1 << 20) - threads as u64 * 48, "{arch}");
        // A second launch finds the values and frees everything.
        mem.write(out, &vec![0u64; threads]);
        launch(
            &m,
            "read_free",
            &cfg,
            &[Arg::U64(ptrs), Arg::U64(out), Arg::I32(N as i32)],
            &mem,
            Some(Arc::clone(&h)),
        )
        .unwrap();
        let sums = mem.read::<i64>(out, threads);
        for (t, &s) in sums.iter().enumerate() {
            assert_eq!(
                s,
                expected_sum(t as i64, N),
                "{arch} thread {t} after the launch"
            );
        }
        assert_eq!(h.free_bytes(), 1 << 20, "{arch}: all freed");
        assert!(m.uses_heap() && !load_fixture("deviceio", arch).uses_heap());
    }
}

#[test]
fn malloc_answers_null_when_the_heap_is_full_or_missing() {
    let m = load_fixture("heap", "compute_80");
    let mem = TestMemory::new();
    // Room for 10 allocations of 64 bytes.
    let h = heap(&mem, 640);
    let ptrs = mem.alloc(32 * 8);
    let out = mem.alloc(32 * 8);
    let args = [Arg::U64(ptrs), Arg::U64(out), Arg::I32(16)];
    launch(
        &m,
        "alloc_fill",
        &Config::linear(1, 32),
        &args,
        &mem,
        Some(h),
    )
    .unwrap();
    let p = mem.read::<u64>(ptrs, 32);
    let sums = mem.read::<i64>(out, 32);
    assert_eq!(p.iter().filter(|&&p| p != 0).count(), 10);
    for t in 0..32 {
        let want = if p[t] == 0 {
            0
        } else {
            expected_sum(t as i64, 16)
        };
        assert_eq!(sums[t], want, "thread {t}");
    }
    // Lanes are served in order: the first ten got the room.
    assert!(p[..10].iter().all(|&p| p != 0) && p[10..].iter().all(|&p| p == 0));
    // No heap at all: every malloc answers NULL, and free(NULL) does nothing.
    launch(&m, "alloc_fill", &Config::linear(1, 32), &args, &mem, None).unwrap();
    assert!(mem.read::<u64>(ptrs, 32).iter().all(|&p| p == 0));
    launch(&m, "read_free", &Config::linear(1, 32), &args, &mem, None).unwrap();
}

#[test]
fn a_thread_frees_what_another_allocated() {
    let m = load_fixture("heap", "compute_52");
    let mem = TestMemory::new();
    let h = heap(&mem, 1 << 16);
    let ptrs = mem.alloc(64 * 8);
    let out = mem.alloc(64 * 8);
    let cfg = Config {
        workers: 2,
        ..Config::linear(2, 32)
    };
    let args = [Arg::U64(ptrs), Arg::U64(out), Arg::I32(4)];
    launch(&m, "alloc_fill", &cfg, &args, &mem, Some(Arc::clone(&h))).unwrap();
    assert!(h.free_bytes() < 1 << 16);
    launch(
        &m,
        "free_from_other",
        &cfg,
        &[Arg::U64(ptrs)],
        &mem,
        Some(Arc::clone(&h)),
    )
    .unwrap();
    assert_eq!(h.free_bytes(), 1 << 16);
}

#[test]
fn new_and_delete_build_and_free_a_linked_list() {
    for arch in ARCHS {
        let m = load_fixture("heap", arch);
        let mem = TestMemory::new();
        let h = heap(&mem, 1 << 16);
        let out = mem.alloc(32 * 8);
        launch(
            &m,
            "linked_list",
            &Config::linear(1, 32),
            &[Arg::I32(20), Arg::U64(out)],
            &mem,
            Some(Arc::clone(&h)),
        )
        .unwrap();
        // 20 nodes of 7 + i, and the array's fourth node's 7.
        let want: i64 = (0..20).map(|i| 7 + i).sum::<i64>() + 7;
        assert!(
            mem.read::<i64>(out, 32).iter().all(|&s| s == want),
            "{arch}"
        );
        assert_eq!(h.free_bytes(), 1 << 16, "{arch}: every node deleted");
    }
}

#[test]
fn aligned_device_malloc_honours_its_alignment() {
    for arch in ARCHS {
        let m = load_fixture("heap", arch);
        let mem = TestMemory::new();
        let h = heap(&mem, 1 << 20);
        let out = mem.alloc(32 * 8);
        for align in [16u64, 128, 4096] {
            launch(
                &m,
                "aligned",
                &Config::linear(1, 32),
                &[Arg::U64(align), Arg::U64(out)],
                &mem,
                Some(Arc::clone(&h)),
            )
            .unwrap();
            assert!(
                mem.read::<u64>(out, 32).iter().all(|&r| r == 0),
                "{arch} {align}"
            );
        }
        // Not a power of two: NULL.
        launch(
            &m,
            "aligned",
            &Config::linear(1, 32),
            &[Arg::U64(24), Arg::U64(out)],
            &mem,
            Some(Arc::clone(&h)),
        )
        .unwrap();
        assert!(
            mem.read::<u64>(out, 32).iter().all(|&r| r == u64::MAX),
            "{arch}"
        );
        assert_eq!(h.free_bytes(), 1 << 20, "{arch}");
    }
}

#[test]
fn freeing_a_pointer_malloc_did_not_return_faults() {
    let m = load_fixture("heap", "compute_80");
    let mem = TestMemory::new();
    let h = heap(&mem, 1 << 12);
    let p = h.malloc(64, 16);
    for heap in [Some(Arc::clone(&h)), None] {
        let f = launch(
            &m,
            "bad_free",
            &Config::linear(1, 1),
            &[Arg::U64(p)],
            &mem,
            heap,
        )
        .unwrap_err();
        assert_eq!(f.kind, FaultKind::IllegalAddress, "{f}");
        assert!(f.to_string().contains("free("), "{f}");
    }
    assert_eq!(h.free_bytes(), (1 << 12) - 64, "the real allocation stays");
}
