//! Launch configuration checks, parallel workers, and yield/resume.

use std::time::Duration;

use vgpu_ptx::testutils::*;
use vgpu_ptx::*;

struct Setup {
    m: Module,
    mem: TestMemory,
    a: u64,
    b: u64,
    c: u64,
    n: usize,
}

fn matmul_setup(n: usize) -> Setup {
    let m = load_fixture("matmul", "compute_80");
    let mem = TestMemory::new();
    let a: Vec<f32> = (0..n * n)
        .map(|i| ((i * 7) % 13) as f32 * 0.5 - 3.0)
        .collect();
    let b: Vec<f32> = (0..n * n).map(|i| ((i * 5) % 11) as f32 * 0.25).collect();
    let (a, b, c) = (mem.alloc_from(&a), mem.alloc_from(&b), mem.alloc(n * n * 4));
    Setup { m, mem, a, b, c, n }
}

fn launch_at(
    s: &Setup,
    start_block: u64,
    workers: usize,
    control: &LaunchControl,
) -> Result<Progress, Fault> {
    let params = pack_params(
        s.m.kernel("matmul").unwrap(),
        &[
            Arg::U64(s.a),
            Arg::U64(s.b),
            Arg::U64(s.c),
            Arg::I32(s.n as i32),
        ],
    );
    let tiles = (s.n as u32).div_ceil(16);
    s.m.launch(&Launch {
        kernel: "matmul",
        grid: [tiles, tiles, 1],
        block: [16, 16, 1],
        dynamic_shared: 0,
        params: &params,
        globals: &[],
        memory: &s.mem,
        start_block,
        workers,
        control,
    })
}

#[test]
fn workers_give_identical_results() {
    let s = matmul_setup(64);
    launch_at(&s, 0, 1, &LaunchControl::new()).unwrap();
    let one: Vec<u32> = s.mem.read(s.c, 64 * 64);
    s.mem.write(s.c, &vec![0u32; 64 * 64]);
    let p = launch_at(&s, 0, 4, &LaunchControl::new()).unwrap();
    assert_eq!(p.stats().blocks, 16);
    let four: Vec<u32> = s.mem.read(s.c, 64 * 64);
    assert_eq!(one, four);
}

#[test]
fn yield_and_resume_match_an_uninterrupted_run() {
    let s = matmul_setup(96);
    let total = 36u64;
    launch_at(&s, 0, 2, &LaunchControl::new()).unwrap();
    let want: Vec<u32> = s.mem.read(s.c, 96 * 96);
    s.mem.write(s.c, &vec![0u32; 96 * 96]);

    // Yield requested before the launch starts: nothing runs.
    let control = LaunchControl::new();
    control.request_yield();
    assert_eq!(
        launch_at(&s, 0, 2, &control).unwrap(),
        Progress::Yielded {
            next_block: 0,
            stats: Stats::default()
        }
    );

    // Repeatedly interrupt from another thread until the grid completes. The interrupt is timed,
    // so a fast machine may finish a call first; shorter delays are tried until one yields.
    let mut interrupted = false;
    for delay_us in [3000u64, 1000, 300, 100, 30, 0] {
        s.mem.write(s.c, &vec![0u32; 96 * 96]);
        let mut start = 0u64;
        let mut yields = 0;
        let mut blocks = 0;
        loop {
            let control = LaunchControl::new();
            let p = std::thread::scope(|sc| {
                sc.spawn(|| {
                    std::thread::sleep(Duration::from_micros(delay_us));
                    control.request_yield();
                });
                launch_at(&s, start, 2, &control).unwrap()
            });
            blocks += p.stats().blocks;
            match p {
                Progress::Completed(_) => break,
                Progress::Yielded { next_block, stats } => {
                    assert_eq!(
                        next_block - start,
                        stats.blocks,
                        "every dispatched block finished"
                    );
                    start = next_block;
                    yields += 1;
                    assert!(yields < 10_000);
                }
            }
        }
        assert_eq!(blocks, total);
        let got: Vec<u32> = s.mem.read(s.c, 96 * 96);
        assert_eq!(got, want, "results after {yields} yields");
        if yields > 0 {
            interrupted = true;
            break;
        }
    }
    assert!(interrupted, "the launch was never interrupted");
}

#[test]
fn bad_configurations_are_rejected() {
    let s = matmul_setup(32);
    let info = s.m.kernel("matmul").unwrap();
    assert_eq!(info.param_bytes, 28);
    assert_eq!(info.static_shared_bytes, 2048);
    let params = vec![0u8; 28];
    let control = LaunchControl::new();
    let base = Launch {
        kernel: "matmul",
        grid: [1, 1, 1],
        block: [16, 16, 1],
        dynamic_shared: 0,
        params: &params,
        globals: &[],
        memory: &s.mem,
        start_block: 0,
        workers: 1,
        control: &control,
    };
    let short = vec![0u8; 20];
    let cases: Vec<Launch<'_>> = vec![
        Launch {
            block: [0, 1, 1],
            ..base
        },
        Launch {
            block: [1025, 1, 1],
            ..base
        },
        Launch {
            block: [32, 32, 2],
            ..base
        },
        Launch {
            block: [1, 1, 65],
            ..base
        },
        Launch {
            grid: [0, 1, 1],
            ..base
        },
        Launch {
            grid: [1, 65536, 1],
            ..base
        },
        Launch {
            dynamic_shared: 1 << 20,
            ..base
        },
        Launch {
            params: &short,
            ..base
        },
        Launch {
            kernel: "nope",
            ..base
        },
        Launch {
            start_block: 2,
            ..base
        },
        Launch {
            globals: &[1],
            ..base
        },
    ];
    for (i, l) in cases.iter().enumerate() {
        let f = s.m.launch(l).unwrap_err();
        assert_eq!(f.kind, FaultKind::InvalidConfig, "case {i}: {f}");
        assert!(!f.is_sticky());
        assert_eq!(f.cuda_error(), 1);
    }
    // Resuming at the end is a no-op.
    assert_eq!(
        s.m.launch(&Launch {
            start_block: 1,
            ..base
        })
        .unwrap(),
        Progress::Completed(Stats::default())
    );
}

/// The register bomb: a 40-byte declaration of a million 64-bit registers loads at once (the
/// range is not expanded into names) and, as it uses three of them, launches with a frame of a
/// few registers. A kernel whose registers are live at once is refused with
/// CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES before any register file is allocated, as is the bomb
/// when its control flow is too large for its registers to be packed.
#[test]
fn a_register_bomb_loads_cheaply_and_holds_only_the_registers_it_uses() {
    let ptx = r#"
.version 8.0
.target sm_80
.address_size 64
.visible .entry bomb(.param .u64 p)
{
    .reg .b64 %rd<1048000>;
    .reg .pred %p<1000>;
    ld.param.u64 %rd1047999, [p];
    cvta.to.global.u64 %rd5, %rd1047999;
    setp.eq.u64 %p999, %rd1047999, 0;
    st.global.u32 [%rd5], 9;
    ret;
}
"#;
    let t = std::time::Instant::now();
    let m = Module::load(ptx).unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let mem = TestMemory::new();
    let out = mem.alloc(4);
    let params = [Arg::U64(out)];
    run(&m, "bomb", &Config::linear(1, 1024), &params, &mem, &[]).unwrap();
    assert_eq!(mem.read::<u32>(out, 1), [9]);

    // 8200 registers live at once in 1024 threads: more than 64 MiB of registers.
    let (set, sum) = live_registers("r", 8200);
    let live = format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry live() {{\n{set}{sum}ret;\n}}\n"
    );
    let m = Module::load(&live).unwrap();
    let e = run(&m, "live", &Config::linear(1, 1024), &[], &mem, &[]).unwrap_err();
    assert_eq!(e.kind, FaultKind::OutOfResources, "{e}");
    assert_eq!(e.cuda_error(), 701);
    assert!(!e.is_sticky());
    assert!(e.message.contains("registers"), "{e}");
    run(&m, "live", &Config::linear(1, 256), &[], &mem, &[]).unwrap();

    // The bomb again, with more branches than its registers can be packed over.
    let mut branchy = String::from(
        ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry bomb()\n{\n.reg .b64 %rd<1048000>;\n.reg .pred %p<2>;\nmov.u64 %rd1047999, 0;\nsetp.eq.u64 %p1, %rd1047999, 0;\n",
    );
    for i in 0..300 {
        branchy.push_str(&format!("@%p1 bra L{i};\nL{i}:\n"));
    }
    branchy.push_str("ret;\n}\n");
    let t = std::time::Instant::now();
    let m = Module::load(&branchy).unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let e = run(&m, "bomb", &Config::linear(1, 1024), &[], &mem, &[]).unwrap_err();
    assert_eq!(e.kind, FaultKind::OutOfResources, "{e}");
}

#[test]
fn maxnreg_caps_the_registers_a_kernel_reports() {
    let ptx = r#"
.version 8.0
.target sm_80
.address_size 64
.visible .entry limited() .maxnreg 16 { LIVE }
.visible .entry free() { LIVE }
.visible .entry bounded() .maxntid 384 { LIVE }
.visible .entry bounded_twice() .maxntid 256 .minnctapersm 2 { LIVE }
.visible .entry declared() { .reg .b32 %r<4000>; mov.u32 %r3999, 1; ret; }
.visible .entry bad() .maxnreg 0 { ret; }
"#;
    let (set, sum) = live_registers("r", 300);
    let ptx = ptx.replace("LIVE", &format!("{set}{sum}ret;"));
    let err = Module::load(&ptx).unwrap_err();
    assert!(err.to_string().contains(".maxnreg"), "{err}");
    let ptx = ptx.replace(".visible .entry bad() .maxnreg 0 { ret; }", "");
    let m = Module::load(&ptx).unwrap();
    let regs = |k: &str| m.kernel(k).unwrap().num_regs;
    assert_eq!(regs("limited"), 16);
    assert!(regs("free") >= 300, "{}", regs("free"));
    // A block of 384 threads fits 65536 registers at 170 each, allocated by 8: 168.
    assert_eq!(regs("bounded"), 168);
    assert_eq!(regs("bounded_twice"), 128);
    // Registers declared but never live at once are not reported.
    assert!(regs("declared") < 8, "{}", regs("declared"));
}

#[test]
fn reqntid_and_maxntid_are_enforced() {
    let ptx = r#"
.version 8.0
.target sm_80
.address_size 64
.visible .entry fixed() .reqntid 64, 2 { ret; }
.visible .entry capped() .maxntid 128 { ret; }
"#;
    let m = Module::load(ptx).unwrap();
    assert_eq!(m.kernel("fixed").unwrap().reqntid, Some([64, 2, 1]));
    assert_eq!(m.kernel("fixed").unwrap().max_threads_per_block, 128);
    assert_eq!(m.kernel("capped").unwrap().max_threads_per_block, 128);
    let mem = TestMemory::new();
    run(
        &m,
        "fixed",
        &Config {
            grid: [2, 1, 1],
            block: [64, 2, 1],
            dynamic_shared: 0,
            workers: 1,
        },
        &[],
        &mem,
        &[],
    )
    .unwrap();
    assert_eq!(
        run(&m, "fixed", &Config::linear(1, 128), &[], &mem, &[])
            .unwrap_err()
            .kind,
        FaultKind::InvalidConfig
    );
    run(&m, "capped", &Config::linear(1, 128), &[], &mem, &[]).unwrap();
    assert_eq!(
        run(&m, "capped", &Config::linear(1, 129), &[], &mem, &[])
            .unwrap_err()
            .kind,
        FaultKind::InvalidConfig
    );
}

#[test]
fn a_fault_in_one_worker_stops_the_launch() {
    let s = matmul_setup(64);
    let params = pack_params(
        s.m.kernel("matmul").unwrap(),
        &[
            Arg::U64(s.a),
            Arg::U64(s.b),
            Arg::U64(s.c),
            Arg::I32(1 << 20),
        ],
    );
    let control = LaunchControl::new();
    let f =
        s.m.launch(&Launch {
            kernel: "matmul",
            grid: [64, 64, 1],
            block: [16, 16, 1],
            dynamic_shared: 0,
            params: &params,
            globals: &[],
            memory: &s.mem,
            start_block: 0,
            workers: 3,
            control: &control,
        })
        .unwrap_err();
    assert_eq!(f.kind, FaultKind::IllegalAddress, "{f}");
    assert!(
        f.message.contains("block (0, 0, 0)"),
        "the lowest faulting block is reported: {f}"
    );
}

/// Launches from several threads at once share the persistent worker pool (and, here, a set of
/// slots): every one completes with the right result and a faulting one fails on its own.
#[test]
fn concurrent_launches_share_the_worker_pool() {
    const SUBMITTERS: usize = 4;
    const ROUNDS: usize = 5;
    const UNMAPPED: u64 = 0x1000;
    let slots = std::sync::Arc::new(WorkerSlots::new(3));
    let reference = matmul_setup(32);
    launch_at(&reference, 0, 1, &LaunchControl::new()).unwrap();
    let want: Vec<u32> = reference.mem.read(reference.c, 32 * 32);
    std::thread::scope(|scope| {
        for t in 0..SUBMITTERS {
            let (slots, want) = (&slots, &want);
            scope.spawn(move || {
                let mut s = matmul_setup(32);
                for _ in 0..ROUNDS {
                    let control = LaunchControl::new();
                    control.set_slots(Some(std::sync::Arc::clone(slots)));
                    if t == 0 {
                        // An unmapped input: every block faults, the lowest one is reported.
                        let a = std::mem::replace(&mut s.a, UNMAPPED);
                        let f = launch_at(&s, 0, 4, &control).unwrap_err();
                        assert_eq!(f.kind, FaultKind::IllegalAddress, "{f}");
                        assert!(f.message.contains("block (0, 0, 0)"), "{f}");
                        s.a = a;
                        continue;
                    }
                    s.mem.write(s.c, &vec![0u32; 32 * 32]);
                    let p = launch_at(&s, 0, 4, &control).unwrap();
                    assert_eq!(p.stats().blocks, 4);
                    assert_eq!(&s.mem.read::<u32>(s.c, 32 * 32), want);
                }
            });
        }
    });
}

/// Many launches at once share two slots while another thread asks random ones to yield or
/// cancels them: every launch ends (yielded ones resume where they stopped and complete with the
/// right result), and afterwards every slot is idle and nobody waits.
#[test]
fn slots_survive_yields_and_cancels_of_waiting_launches() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    const SUBMITTERS: usize = 16;
    const LAUNCHES: usize = 12;
    /// Every how many disturbances one is a cancellation (the others ask for a yield).
    const CANCEL_EVERY: u64 = 8;
    let slots = Arc::new(WorkerSlots::new(2));
    let reference = matmul_setup(64);
    launch_at(&reference, 0, 1, &LaunchControl::new()).unwrap();
    let want: Vec<u32> = reference.mem.read(reference.c, 64 * 64);
    let done = AtomicBool::new(false);
    let live: std::sync::Mutex<Vec<Arc<LaunchControl>>> = Default::default();
    std::thread::scope(|scope| {
        let submitters: Vec<_> = (0..SUBMITTERS)
            .map(|t| {
                let (slots, live, want) = (&slots, &live, &want);
                scope.spawn(move || {
                    let s = matmul_setup(64);
                    let mut completed = 0;
                    for _ in 0..LAUNCHES {
                        s.mem.write(s.c, &vec![0u32; 64 * 64]);
                        let mut start = 0;
                        loop {
                            let control = Arc::new(LaunchControl::new());
                            control.set_slots(Some(Arc::clone(slots)));
                            control.set_priority(if t % 4 == 0 { -1 } else { 0 });
                            live.lock().unwrap().push(Arc::clone(&control));
                            let r = launch_at(&s, start, 2, &control);
                            live.lock().unwrap().retain(|c| !Arc::ptr_eq(c, &control));
                            match r {
                                Ok(Progress::Yielded { next_block, .. }) => start = next_block,
                                Ok(Progress::Completed(_)) => {
                                    assert_eq!(&s.mem.read::<u32>(s.c, 64 * 64), want);
                                    completed += 1;
                                    break;
                                }
                                Err(f) => {
                                    assert_eq!(f.kind, FaultKind::Cancelled, "{f}");
                                    break;
                                }
                            }
                        }
                    }
                    completed
                })
            })
            .collect();
        let (done, live) = (&done, &live);
        scope.spawn(move || {
            let mut x = 0x1234_5678_9abc_def0u64;
            while !done.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                std::thread::sleep(Duration::from_micros(x % 400));
                let l = live.lock().unwrap();
                if let Some(c) = l.get((x >> 8) as usize % l.len().max(1)) {
                    if x.is_multiple_of(CANCEL_EVERY) {
                        c.cancel()
                    } else {
                        c.request_yield()
                    }
                }
            }
        });
        let completed: usize = submitters.into_iter().map(|h| h.join().unwrap()).sum();
        done.store(true, Ordering::Relaxed);
        assert!(completed > 0, "some launches complete");
    });
    assert_eq!(slots.idle(), 2, "every slot given back");
    assert_eq!(slots.waiting(), 0, "nobody left waiting");
}
