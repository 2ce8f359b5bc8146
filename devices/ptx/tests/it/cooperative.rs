//! Cooperative launches: every block at once, and cooperative groups' grid-wide barrier
//! (`grid.sync()`, which reads the grid workspace from `%envreg1`/`%envreg2`).

use vgpu_ptx::testutils::*;
use vgpu_ptx::*;

fn launch(
    m: &Module,
    kernel: &str,
    cfg: &Config,
    args: &[Arg],
    mem: &TestMemory,
    workspace: u64,
) -> Result<Progress, Fault> {
    let g = alloc_globals(m, mem);
    let params = pack_params(m.kernel(kernel).unwrap(), args);
    let control = LaunchControl::new();
    control.set_grid_workspace(workspace);
    control.set_timeout(std::time::Duration::from_secs(60));
    m.launch(&Launch {
        kernel,
        grid: cfg.grid,
        block: cfg.block,
        dynamic_shared: cfg.dynamic_shared,
        params: &params,
        globals: &g,
        memory: mem,
        start_block: 0,
        workers: cfg.workers,
        control: &control,
    })
}

/// Eight blocks pass a ring of values around five times, with a grid barrier between every
/// read and write: each value ends five blocks further on. On one worker, or with a broken
/// barrier, the launch would hang or the values would be wrong.
#[test]
fn grid_sync_orders_every_block() {
    const BLOCKS: u32 = 8;
    const THREADS: u32 = 32;
    const PHASES: i32 = 5;
    for arch in ["compute_80", "compute_90"] {
        let m = load_fixture("cooperative", arch);
        let mem = TestMemory::new();
        let n = (BLOCKS * THREADS) as usize;
        let data = mem.alloc(n * 4);
        let out = mem.alloc(n * 4);
        let ws = mem.alloc(GRID_WORKSPACE_BYTES as usize);
        let cfg = Config {
            workers: 1,
            ..Config::linear(BLOCKS, THREADS)
        };
        let p = launch(
            &m,
            "ring",
            &cfg,
            &[Arg::U64(data), Arg::U64(out), Arg::I32(PHASES)],
            &mem,
            ws,
        )
        .unwrap_or_else(|f| panic!("{arch}: {f}"));
        assert!(matches!(p, Progress::Completed(_)), "{arch}: {p:?}");
        let got: Vec<i32> = mem.read(out, n);
        for (i, &v) in got.iter().enumerate() {
            let want = (i + PHASES as usize * THREADS as usize) % n;
            assert_eq!(v, want as i32, "{arch}: element {i}");
        }
    }
}

#[test]
fn a_grid_is_valid_only_in_a_cooperative_launch() {
    let m = load_fixture("cooperative", "compute_80");
    let mem = TestMemory::new();
    let out = mem.alloc(4);
    let ws = mem.alloc(GRID_WORKSPACE_BYTES as usize);
    launch(
        &m,
        "is_valid",
        &Config::linear(2, 32),
        &[Arg::U64(out)],
        &mem,
        ws,
    )
    .unwrap();
    assert_eq!(mem.read::<i32>(out, 1), [1]);
    launch(
        &m,
        "is_valid",
        &Config::linear(2, 32),
        &[Arg::U64(out)],
        &mem,
        0,
    )
    .unwrap();
    assert_eq!(mem.read::<i32>(out, 1), [0]);
}

#[test]
fn too_many_blocks_are_refused_before_anything_runs() {
    let m = load_fixture("cooperative", "compute_80");
    let mem = TestMemory::new();
    let ws = mem.alloc(GRID_WORKSPACE_BYTES as usize);
    let out = mem.alloc(4);
    let f = launch(
        &m,
        "is_valid",
        &Config::linear(MAX_COOPERATIVE_BLOCKS as u32 + 1, 32),
        &[Arg::U64(out)],
        &mem,
        ws,
    )
    .unwrap_err();
    assert_eq!(f.kind, FaultKind::CooperativeTooLarge);
    assert_eq!(f.cuda_error(), 720);
    assert!(!f.is_sticky());
}

/// Every block of a cooperative launch holds its registers at once: a kernel that declares a
/// large register file cannot make the host hold it a thousand times over.
#[test]
fn a_cooperative_launch_is_bounded_by_its_register_memory() {
    let (set, sum) = live_registers("r", 7600);
    let ptx = format!(
        ".version 7.0\n.target sm_80\n.address_size 64\n.visible .entry fat() {{\n{set}{sum}ret;\n}}\n"
    );
    let m = Module::load(&ptx).unwrap();
    let mem = TestMemory::new();
    let ws = mem.alloc(GRID_WORKSPACE_BYTES as usize);
    // 7600 live registers x 1024 threads x 8 bytes: about 59 MiB per block.
    let f = launch(&m, "fat", &Config::linear(8, 1024), &[], &mem, ws).unwrap_err();
    assert_eq!(f.kind, FaultKind::CooperativeTooLarge, "{f}");
    assert!(f.message.contains("MiB of registers"), "{f}");
    // One block fits, cooperatively or not.
    launch(&m, "fat", &Config::linear(1, 1024), &[], &mem, ws).unwrap();
}
