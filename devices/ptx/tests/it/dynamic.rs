//! Dynamic parallelism: kernels launching kernels, as NVRTC compiles them (`fixtures/dynamic.cu`,
//! `-rdc=true`: CUDA 12's `__cudaCDP2*` calls), and parents waiting for them with CUDA 11's
//! device-side `cudaDeviceSynchronize`, as nvcc 11.8 compiles it (`fixtures/dynamic_sync.cu`).

use std::sync::Arc;

use vgpu_ptx::devlaunch::{CUDA_ERROR_SYNC_DEPTH_EXCEEDED, DeviceLaunches, MAX_DEPTH};
use vgpu_ptx::heap::{DeviceHeap, Heap};
use vgpu_ptx::testutils::*;
use vgpu_ptx::*;

struct Rig {
    m: Module,
    mem: TestMemory,
    globals: Vec<u64>,
    heap: Arc<Heap>,
    launches: Arc<DeviceLaunches>,
}

impl Rig {
    fn new(arch: &str) -> Rig {
        Rig::with("dynamic", arch, DeviceLaunches::new())
    }

    fn with(fixture: &str, arch: &str, launches: DeviceLaunches) -> Rig {
        let m = load_fixture(fixture, arch);
        let mem = TestMemory::new();
        let globals = alloc_globals(&m, &mem);
        let base = mem.alloc(1 << 20);
        Rig {
            heap: Arc::new(Heap::new(base, 1 << 20)),
            m,
            mem,
            globals,
            launches: Arc::new(launches),
        }
    }

    fn control(&self) -> LaunchControl {
        let c = LaunchControl::new();
        c.set_heap(Some(Arc::clone(&self.heap) as Arc<dyn DeviceHeap>));
        c.set_device_launches(Some(Arc::clone(&self.launches)));
        c
    }

    fn run_on(
        &self,
        kernel: &str,
        grid: u32,
        block: u32,
        args: &[Arg],
        control: &LaunchControl,
        start_block: u64,
    ) -> Result<Progress, Fault> {
        let params = pack_params(self.m.kernel(kernel).unwrap(), args);
        self.m.launch(&Launch {
            kernel,
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            dynamic_shared: 0,
            params: &params,
            globals: &self.globals,
            memory: &self.mem,
            start_block,
            workers: 3,
            control,
        })
    }

    fn run(&self, kernel: &str, grid: u32, block: u32, args: &[Arg]) -> Progress {
        self.run_on(kernel, grid, block, args, &self.control(), 0)
            .unwrap_or_else(|f| panic!("{kernel}: {f}"))
    }
}

#[test]
fn a_kernel_launches_a_child_grid_per_block() {
    for arch in ARCHS {
        let r = Rig::new(arch);
        assert!(r.m.launches_kernels() && r.m.uses_heap());
        let out = r.mem.alloc(4 * 128);
        r.mem.write(out, &[-1i32; 128]);
        r.run("parent", 4, 32, &[Arg::U64(out)]);
        let want: Vec<i32> = (0..128).map(|i| 2 * i).collect();
        assert_eq!(r.mem.read::<i32>(out, 128), want, "{arch}");
        assert_eq!(
            r.heap.free_bytes(),
            1 << 20,
            "{arch}: parameter buffers given back"
        );
        assert_eq!(r.launches.pending(), 0);
    }
}

#[test]
fn children_see_their_parents_writes_and_run_in_order() {
    let r = Rig::new("compute_80");
    let cell = r.mem.alloc(8);
    r.run("ordered", 1, 1, &[Arg::U64(cell)]);
    assert_eq!(r.mem.read::<i32>(cell, 2), [41, 42]);
}

/// Grids launched one after the other on one stream: the second starts once the first and its
/// descendants are done (`chained` launches `produce`, which launches `fill`, then `consume`,
/// which reads what `fill` wrote).
#[test]
fn a_later_launch_waits_for_an_earlier_ones_descendants() {
    for arch in ARCHS {
        let r = Rig::new(arch);
        let cells = r.mem.alloc(4 * 64);
        r.mem.write(cells, &[0i32; 64]);
        r.run("chained", 1, 1, &[Arg::U64(cells)]);
        let got = r.mem.read::<i32>(cells, 64);
        let want: Vec<i32> = (0..32)
            .map(|i| i + 1)
            .chain((0..32).map(|i| 2 * (i + 1)))
            .collect();
        assert_eq!(got, want, "{arch}");
    }
}

/// `cudaStreamTailLaunch`: the tail grid runs after every other grid its parent launched,
/// whichever was launched first, and their descendants.
#[test]
fn a_tail_launch_runs_after_its_parents_other_work() {
    let r = Rig::new("compute_80");
    let cells = r.mem.alloc(4 * 4);
    r.mem.write(cells, &[0i32; 4]);
    r.run("tail_parent", 1, 2, &[Arg::U64(cells)]);
    // Thread 0 launched the tail grid before thread 1 launched `produce` (fill: cells[0..])
    // ... the tail saw everything.
    assert_eq!(r.mem.read::<i32>(cells, 4), [1, 2, 3, 6]);
}

#[test]
fn every_thread_launches_a_child_with_its_own_parameters() {
    let r = Rig::new("compute_52");
    let out = r.mem.alloc(4 * 512);
    r.run("fan_out", 8, 64, &[Arg::U64(out)]);
    let want: Vec<i32> = (0..512).map(|i| 2 * i).collect();
    assert_eq!(r.mem.read::<i32>(out, 512), want);
}

#[test]
fn grids_nest_to_cudas_depth_and_no_further() {
    for arch in ARCHS {
        let r = Rig::new(arch);
        let out = r.mem.alloc(4 * 64);
        let errs = r.mem.alloc(4 * 64);
        r.run(
            "nested",
            1,
            1,
            &[Arg::U64(out), Arg::U64(errs), Arg::I32(0), Arg::I32(10)],
        );
        let got = r.mem.read::<i32>(out, 10);
        assert_eq!(got, (1..=10).collect::<Vec<_>>(), "{arch}");
        assert!(r.mem.read::<i32>(errs, 9).iter().all(|&e| e == 0), "{arch}");
        // Depth 24 is the deepest a launch may start from; the launch from it fails with
        // cudaErrorLaunchMaxDepthExceeded (65).
        r.mem.write(out, &[0i32; 64]);
        r.run(
            "nested",
            1,
            1,
            &[Arg::U64(out), Arg::U64(errs), Arg::I32(0), Arg::I32(40)],
        );
        let depth = MAX_DEPTH as usize;
        let got = r.mem.read::<i32>(out, 40);
        assert!(
            got[..=depth]
                .iter()
                .enumerate()
                .all(|(d, &v)| v == d as i32 + 1),
            "{arch} {got:?}"
        );
        assert!(got[depth + 1..].iter().all(|&v| v == 0), "{arch} {got:?}");
        assert_eq!(r.mem.read::<i32>(errs, 64)[depth], 65, "{arch}");
        assert_eq!(r.heap.free_bytes(), 1 << 20, "{arch}");
    }
}

#[test]
fn a_bad_configuration_fails_the_launch_not_the_parent() {
    let r = Rig::new("compute_80");
    let out = r.mem.alloc(4 * 32);
    let err = r.mem.alloc(4);
    r.mem.write(out, &[-1i32; 32]);
    r.run("bad_config", 1, 1, &[Arg::U64(out), Arg::U64(err)]);
    assert_eq!(
        r.mem.read::<i32>(err, 1),
        [9],
        "cudaErrorInvalidConfiguration"
    );
    assert!(
        r.mem.read::<i32>(out, 32).iter().all(|&v| v == -1),
        "nothing ran"
    );
    assert_eq!(r.heap.free_bytes(), 1 << 20);
}

#[test]
fn without_a_heap_or_launch_state_device_launches_do_nothing() {
    let r = Rig::new("compute_80");
    let out = r.mem.alloc(4 * 128);
    r.mem.write(out, &[-1i32; 128]);
    let c = LaunchControl::new();
    r.run_on("parent", 4, 32, &[Arg::U64(out)], &c, 0).unwrap();
    assert!(r.mem.read::<i32>(out, 128).iter().all(|&v| v == -1));
}

/// Runs `fan_out` (8 blocks launching 512 children) while another thread asks it to yield every
/// 100 µs, resuming it after each yield as the broker does; returns the yields that came while
/// a child grid ran.
fn run_with_yields(r: &Rig, out: u64) -> usize {
    let c = r.control();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_micros(100));
                c.request_yield();
            }
        });
        let (mut start, mut yields, mut in_children) = (0, 0, 0);
        loop {
            c.clear_yield();
            match r
                .run_on("fan_out", 8, 64, &[Arg::U64(out)], &c, start)
                .unwrap()
            {
                Progress::Completed(_) => break,
                Progress::Yielded { next_block, .. } => {
                    yields += 1;
                    assert!(yields < 100_000, "no progress");
                    // Past the parent's 8 blocks: a child grid yielded.
                    in_children += usize::from(next_block == 8);
                    start = next_block;
                }
            }
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        in_children
    })
}

#[test]
fn a_yield_while_children_run_resumes_with_them() {
    let r = Rig::new("compute_80");
    let out = r.mem.alloc(4 * 512);
    let want: Vec<i32> = (0..512).map(|i| 2 * i).collect();
    // Until a yield lands while children run (timing decides where yields land).
    let mut hit = false;
    for _ in 0..20 {
        r.mem.write(out, &[-1i32; 512]);
        hit = run_with_yields(&r, out) > 0;
        assert_eq!(r.mem.read::<i32>(out, 512), want);
        assert_eq!(r.launches.pending(), 0);
        if hit {
            break;
        }
    }
    assert!(hit, "no yield came while children ran in 20 runs");
}

impl Rig {
    /// Runs `kernel` (one block of two threads, counting its threads in a `u64`) under a
    /// watchdog of `secs`: it must end at it (`Timeout`), soon after, having given back what it
    /// held. Returns the count.
    fn runs_until_the_watchdog(&self, kernel: &str, secs: u64) -> u64 {
        let count = self.mem.alloc(8);
        let c = self.control();
        let started = std::time::Instant::now();
        c.set_deadline(Some(started + std::time::Duration::from_secs(secs)));
        let f = self
            .run_on(kernel, 1, 2, &[Arg::U64(count)], &c, 0)
            .unwrap_err();
        assert_eq!(f.kind, FaultKind::Timeout, "{f}");
        // Every grid (and every level of waiting) stops at its next check once it passed.
        assert!(
            started.elapsed() < std::time::Duration::from_secs(secs + 8),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(self.launches.pending(), 0);
        assert_eq!(self.heap.free_bytes(), 1 << 20);
        self.mem.read::<u64>(count, 1)[0]
    }
}

#[test]
fn a_launch_bomb_ends_at_the_watchdog_and_gives_everything_back() {
    // Each grid's two threads launch two more: run depth first, few are pending at once (one
    // more per level), and the tree, 2^24 grids to the nesting limit, runs until the watchdog
    // stops it between two of its grids.
    let grids = Rig::new("compute_80").runs_until_the_watchdog("bomb", 2) / 2;
    assert!(grids > 2048, "{grids} grids ran");
}

#[test]
fn device_side_streams_get_distinct_handles() {
    let ptx = ".version 7.8\n.target sm_80\n.address_size 64\n\
        .extern .func (.param .b32 r) cnpStreamCreate(.param .b64 p, .param .b32 f);\n\
        .extern .func (.param .b32 r) cnpStreamDestroy(.param .b64 s);\n\
        .visible .entry k(.param .u64 out) {\n\
        .local .align 8 .b8 depot[16];\n\
        .reg .b64 %rd<8>; .reg .b32 %r<4>;\n\
        ld.param.u64 %rd1, [out];\n\
        mov.u64 %rd2, depot;\n\
        cvta.local.u64 %rd3, %rd2;\n\
        add.u64 %rd4, %rd3, 8;\n\
        { .param .b64 p; .param .b32 f; .param .b32 r; st.param.b64 [p], %rd3; st.param.b32 [f], 1;\n\
          call.uni (r), cnpStreamCreate, (p, f); ld.param.b32 %r1, [r]; }\n\
        { .param .b64 p; .param .b32 f; .param .b32 r; st.param.b64 [p], %rd4; st.param.b32 [f], 1;\n\
          call.uni (r), cnpStreamCreate, (p, f); ld.param.b32 %r2, [r]; }\n\
        ld.local.u64 %rd5, [%rd2];\n\
        ld.local.u64 %rd6, [%rd2+8];\n\
        { .param .b64 s; .param .b32 r; st.param.b64 [s], %rd5; call.uni (r), cnpStreamDestroy, (s); ld.param.b32 %r3, [r]; }\n\
        st.global.u64 [%rd1], %rd5;\n\
        st.global.u64 [%rd1+8], %rd6;\n\
        add.u32 %r1, %r1, %r2;\n\
        add.u32 %r1, %r1, %r3;\n\
        st.global.u32 [%rd1+16], %r1;\n\
        ret; }\n";
    let m = Module::load(ptx).unwrap();
    let mem = TestMemory::new();
    let g = alloc_globals(&m, &mem);
    let out = mem.alloc(24);
    let c = LaunchControl::new();
    c.set_device_launches(Some(Arc::new(DeviceLaunches::new())));
    run_controlled(
        &m,
        "k",
        &Config::linear(1, 1),
        &[Arg::U64(out)],
        &mem,
        &g,
        &c,
    )
    .unwrap();
    let h = mem.read::<u64>(out, 2);
    assert!(h[0] != 0 && h[1] != 0 && h[0] != h[1], "{h:x?}");
    assert_eq!(mem.read::<u32>(out + 16, 1), [0], "every call succeeded");
}

/// The architectures of `fixtures/dynamic_sync.cu` (nvcc 11.8 keeps the call from sm_90).
const SYNC_ARCHS: [&str; 2] = ["compute_52", "compute_80"];

/// A rig for `dynamic_sync` whose grids may wait down to `sync_depth`.
fn sync_rig(arch: &str, sync_depth: u32) -> Rig {
    Rig::with(
        "dynamic_sync",
        arch,
        DeviceLaunches::with_limits(devlaunch::MAX_PENDING_LAUNCHES, sync_depth),
    )
}

#[test]
fn a_block_waits_for_its_child_and_reads_what_it_wrote() {
    for arch in SYNC_ARCHS {
        let r = sync_rig(arch, 2);
        let (buf, out, err) = (
            r.mem.alloc(4 * 256),
            r.mem.alloc(4 * 256),
            r.mem.alloc(4 * 8),
        );
        r.mem.write(err, &[-1i32; 8]);
        r.run(
            "read_after_wait",
            8,
            32,
            &[Arg::U64(buf), Arg::U64(out), Arg::U64(err)],
        );
        let want: Vec<i32> = (1..=256).map(|i| i * 10).collect();
        assert_eq!(r.mem.read::<i32>(out, 256), want, "{arch}");
        assert_eq!(r.mem.read::<i32>(err, 8), [0; 8], "{arch}");
        assert_eq!(r.launches.pending(), 0);
        assert_eq!(r.heap.free_bytes(), 1 << 20, "{arch}");
    }
}

#[test]
fn a_recursive_sum_waits_at_every_level() {
    for arch in SYNC_ARCHS {
        let r = sync_rig(arch, 8);
        let n = 3000;
        let a: Vec<i32> = (0..n).map(|i| (i * 7 + 3) % 101).collect();
        let (da, out, err) = (r.mem.alloc(4 * n as usize), r.mem.alloc(4), r.mem.alloc(4));
        r.mem.write(da, &a);
        r.mem.write(err, &[0i32]);
        r.run(
            "sum",
            1,
            1,
            &[Arg::U64(da), Arg::I32(n), Arg::U64(out), Arg::U64(err)],
        );
        assert_eq!(r.mem.read::<i32>(err, 1), [0], "{arch}");
        assert_eq!(r.mem.read::<i32>(out, 1), [a.iter().sum::<i32>()], "{arch}");
        assert_eq!(
            r.heap.free_bytes(),
            1 << 20,
            "{arch}: the halves were freed"
        );
    }
}

#[test]
fn waits_past_the_sync_depth_fail_with_cudas_error() {
    for (limit, levels) in [(2u32, 6usize), (5, 6), (MAX_DEPTH, MAX_DEPTH as usize)] {
        let r = sync_rig("compute_80", limit);
        let errs = r.mem.alloc(4 * 32);
        r.mem.write(errs, &[-1i32; 32]);
        r.run(
            "chain",
            1,
            1,
            &[Arg::U64(errs), Arg::I32(0), Arg::I32(levels as i32)],
        );
        let got = r.mem.read::<i32>(errs, levels);
        let want: Vec<i32> = (0..levels)
            .map(|d| {
                if (d as u32) < limit {
                    0
                } else {
                    CUDA_ERROR_SYNC_DEPTH_EXCEEDED as i32
                }
            })
            .collect();
        assert_eq!(got, want, "sync depth {limit}");
    }
}

#[test]
fn a_wait_with_nothing_launched_returns_at_once() {
    let r = sync_rig("compute_52", 2);
    let err = r.mem.alloc(4);
    r.mem.write(err, &[-1i32]);
    r.run("idle_wait", 1, 32, &[Arg::U64(err)]);
    assert_eq!(r.mem.read::<i32>(err, 1), [0]);
}

#[test]
fn a_wait_covers_the_childs_descendants() {
    let r = sync_rig("compute_80", 2);
    let cell = r.mem.alloc(12);
    r.run("wait_for_descendants", 1, 1, &[Arg::U64(cell)]);
    assert_eq!(r.mem.read::<i32>(cell, 3), [7, 8, 16]);
}

#[test]
fn a_fault_in_a_waited_for_child_fails_the_launch() {
    let r = sync_rig("compute_80", 2);
    let p = r.mem.alloc(4);
    let f = r
        .run_on("wait_for_fault", 1, 1, &[Arg::U64(p)], &r.control(), 0)
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::IllegalAddress, "{f}");
    assert_eq!(r.launches.pending(), 0);
    assert_eq!(r.heap.free_bytes(), 1 << 20);
}

#[test]
fn yields_wait_until_a_waiting_block_is_done() {
    // Yields requested every 100 µs: a waiting block's children run to completion (a block
    // cannot be kept across a yield), and the launch resumes from the block after it.
    let r = sync_rig("compute_80", 2);
    let (buf, out, err) = (
        r.mem.alloc(4 * 2048),
        r.mem.alloc(4 * 2048),
        r.mem.alloc(4 * 64),
    );
    let args = [Arg::U64(buf), Arg::U64(out), Arg::U64(err)];
    let want: Vec<i32> = (1..=2048).map(|i| i * 10).collect();
    let c = r.control();
    let done = std::sync::atomic::AtomicBool::new(false);
    let yields = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_micros(100));
                c.request_yield();
            }
        });
        let mut yields = 0;
        // Until a yield lands (timing decides where yields land).
        for _ in 0..20 {
            r.mem.write(out, &[-1i32; 2048]);
            r.mem.write(err, &[-1i32; 64]);
            let mut start = 0;
            loop {
                c.clear_yield();
                match r
                    .run_on("read_after_wait", 64, 32, &args, &c, start)
                    .unwrap()
                {
                    Progress::Completed(_) => break,
                    Progress::Yielded { next_block, .. } => {
                        yields += 1;
                        assert!(yields < 100_000, "no progress");
                        start = next_block;
                    }
                }
            }
            assert_eq!(r.mem.read::<i32>(out, 2048), want);
            assert_eq!(r.mem.read::<i32>(err, 64), [0; 64]);
            assert_eq!(r.launches.pending(), 0);
            if yields > 0 {
                break;
            }
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        yields
    });
    assert!(yields > 0, "no yield landed in 20 runs");
}

#[test]
fn a_tree_of_waits_is_cut_by_the_watchdog_and_gives_everything_back() {
    let threads = sync_rig("compute_80", MAX_DEPTH).runs_until_the_watchdog("wait_bomb", 1);
    assert!(threads > 24, "the tree grew: {threads}");
}
