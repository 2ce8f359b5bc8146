//! Interpreter state on a budget: call frames count against the block's limit and the tenant's
//! [`StateBudget`], a launch takes its blocks' state before it runs (on fewer workers when the
//! budget is tight, `CUDA_ERROR_OUT_OF_MEMORY` when no block fits), everything is given back,
//! and module loads stop when their watch says so.

use std::sync::Arc;

use vgpu_ptx::testutils::*;
use vgpu_ptx::*;

const MIB: u64 = 1 << 20;

/// 64-bit registers `rec_big` keeps live across its call: about 3 MiB per warp and frame.
const BIG_REGS: usize = 12_000;

/// `rec_big` holds [`BIG_REGS`] live 64-bit registers per frame; `rec_small` a handful. Both
/// return their argument, by recursing that deep. `local_blocks` gives each of 1024 threads
/// 64 KiB of local memory (64 MiB per block) and writes each block's index.
fn recursion() -> String {
    let (set, sum) = live_registers("big", BIG_REGS);
    RECURSION.replace("SET_BIG", &set).replace("SUM_BIG", &sum)
}

const RECURSION: &str = r#"
.version 7.0
.target sm_52
.address_size 64

.func (.param .b32 ret) rec_big(.param .b32 n)
{
    .reg .b32 %r<4>;
    .reg .pred %p<2>;
    ld.param.b32 %r1, [n];
    setp.eq.s32 %p1, %r1, 0;
    @%p1 bra DONE;
SET_BIG
    sub.s32 %r2, %r1, 1;
    {
    .param .b32 a;
    .param .b32 rv;
    st.param.b32 [a], %r2;
    call.uni (rv), rec_big, (a);
    ld.param.b32 %r3, [rv];
    }
SUM_BIG
    add.s32 %r1, %r3, 1;
DONE:
    st.param.b32 [ret], %r1;
    ret;
}

.func (.param .b32 ret) rec_small(.param .b32 n)
{
    .reg .b32 %r<4>;
    .reg .pred %p<2>;
    ld.param.b32 %r1, [n];
    setp.eq.s32 %p1, %r1, 0;
    @%p1 bra DONE;
    sub.s32 %r2, %r1, 1;
    {
    .param .b32 a;
    .param .b32 rv;
    st.param.b32 [a], %r2;
    call.uni (rv), rec_small, (a);
    ld.param.b32 %r3, [rv];
    }
    add.s32 %r1, %r3, 1;
DONE:
    st.param.b32 [ret], %r1;
    ret;
}

.visible .entry deep_big(.param .u64 out, .param .u32 depth)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [depth];
    {
    .param .b32 a;
    .param .b32 rv;
    st.param.b32 [a], %r1;
    call.uni (rv), rec_big, (a);
    ld.param.b32 %r2, [rv];
    }
    st.global.u32 [%rd1], %r2;
    ret;
}

.visible .entry deep_small(.param .u64 out, .param .u32 depth)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [depth];
    {
    .param .b32 a;
    .param .b32 rv;
    st.param.b32 [a], %r1;
    call.uni (rv), rec_small, (a);
    ld.param.b32 %r2, [rv];
    }
    st.global.u32 [%rd1], %r2;
    ret;
}

.visible .entry local_blocks(.param .u64 out)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<5>;
    .local .align 8 .b8 depot[65536];
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %ctaid.x;
    mov.u64 %rd2, depot;
    st.local.u32 [%rd2], %r1;
    ld.local.u32 %r2, [%rd2];
    mul.wide.u32 %rd3, %r1, 4;
    add.u64 %rd4, %rd1, %rd3;
    st.global.u32 [%rd4], %r2;
    ret;
}
"#;

fn launch(
    m: &Module,
    kernel: &str,
    cfg: &Config,
    args: &[Arg],
    mem: &TestMemory,
    budget: &Arc<CountingBudget>,
) -> Result<Progress, Fault> {
    let control = LaunchControl::new();
    control.set_state_budget(Some(Arc::clone(budget) as Arc<dyn StateBudget>));
    let params = pack_params(m.kernel(kernel).unwrap(), args);
    m.launch(&Launch {
        kernel,
        grid: cfg.grid,
        block: cfg.block,
        dynamic_shared: cfg.dynamic_shared,
        params: &params,
        globals: &[],
        memory: mem,
        start_block: 0,
        workers: cfg.workers,
        control: &control,
    })
}

#[test]
fn recursion_with_large_frames_stops_at_the_blocks_frame_limit() {
    let m = Module::load(&recursion()).unwrap();
    let mem = TestMemory::new();
    let out = mem.alloc(4);
    let budget = Arc::new(CountingBudget::new(64 << 30));
    // Two warps, 60 deep (within the call-depth limit of 64), about 3 MiB a frame per warp:
    // without a bound on frames this would hold 350 MiB (each warp alone 175 MiB).
    let f = launch(
        &m,
        "deep_big",
        &Config::linear(1, 64),
        &[Arg::U64(out), Arg::U32(60)],
        &mem,
        &budget,
    )
    .unwrap_err();
    assert_eq!(
        (f.kind, f.cuda_error()),
        (FaultKind::IllegalAddress, CUDA_ERROR_ILLEGAL_ADDRESS),
        "{f}"
    );
    assert!(f.is_sticky());
    assert!(
        f.message.contains("call stack overflow") && f.message.contains("rec_big"),
        "{f}"
    );
    assert!(
        budget.peak() <= MAX_BLOCK_FRAME_BYTES + MIB,
        "frames took {} MiB",
        budget.peak() / MIB
    );
    assert_eq!(budget.used(), 0, "everything is given back");
    assert_eq!(
        mem.read::<u32>(out, 1),
        vec![0],
        "the kernel did not finish"
    );
}

#[test]
fn recursion_within_the_limits_runs_and_returns_its_state() {
    let m = Module::load(&recursion()).unwrap();
    let mem = TestMemory::new();
    let out = mem.alloc(4);
    let budget = Arc::new(CountingBudget::new(256 * MIB));
    launch(
        &m,
        "deep_small",
        &Config::linear(1, 64),
        &[Arg::U64(out), Arg::U32(50)],
        &mem,
        &budget,
    )
    .unwrap();
    assert_eq!(mem.read::<u32>(out, 1), vec![50]);
    // A few big frames fit the block limit too.
    launch(
        &m,
        "deep_big",
        &Config::linear(1, 32),
        &[Arg::U64(out), Arg::U32(3)],
        &mem,
        &budget,
    )
    .unwrap();
    assert_eq!(mem.read::<u32>(out, 1), vec![3]);
    assert!(
        budget.peak() >= 3 * BIG_REGS as u64 * 256,
        "peak {}",
        budget.peak()
    );
    assert_eq!(budget.used(), 0);
}

#[test]
fn frames_past_the_tenants_budget_fault_as_a_stack_overflow() {
    let m = Module::load(&recursion()).unwrap();
    let mem = TestMemory::new();
    let out = mem.alloc(4);
    // Room for the kernel's own frames, not for one 3 MiB callee frame.
    let budget = Arc::new(CountingBudget::new(MIB));
    let f = launch(
        &m,
        "deep_big",
        &Config::linear(1, 32),
        &[Arg::U64(out), Arg::U32(2)],
        &mem,
        &budget,
    )
    .unwrap_err();
    assert_eq!(f.kind, FaultKind::IllegalAddress, "{f}");
    assert!(f.message.contains("interpreter budget"), "{f}");
    assert!(budget.refused() >= 1);
    assert_eq!(budget.used(), 0);
}

#[test]
fn a_launch_with_no_room_for_one_block_gets_out_of_memory_and_runs_nothing() {
    let m = Module::load(&recursion()).unwrap();
    let mem = TestMemory::new();
    let out = mem.alloc(4 * 4);
    // 1024 threads × 64 KiB of local memory: 64 MiB a block.
    let budget = Arc::new(CountingBudget::new(32 * MIB));
    let f = launch(
        &m,
        "local_blocks",
        &Config {
            workers: 4,
            ..Config::linear(4, 1024)
        },
        &[Arg::U64(out)],
        &mem,
        &budget,
    )
    .unwrap_err();
    assert_eq!((f.kind, f.cuda_error()), (FaultKind::OutOfMemory, 2), "{f}");
    assert!(!f.is_sticky(), "nothing ran: the context goes on");
    assert!(f.message.contains("interpreter budget"), "{f}");
    assert_eq!(budget.used(), 0);
    assert_eq!(mem.read::<u32>(out, 4), vec![0; 4]);
}

#[test]
fn a_tight_budget_runs_a_launch_on_fewer_workers() {
    const BLOCKS: u32 = 8;
    let m = Module::load(&recursion()).unwrap();
    let mem = TestMemory::new();
    let out = mem.alloc(4 * BLOCKS as usize);
    mem.write(out, &[u32::MAX; BLOCKS as usize]);
    // Room for one block's state (64 MiB of local memory and its frames), not two.
    let budget = Arc::new(CountingBudget::new(100 * MIB));
    launch(
        &m,
        "local_blocks",
        &Config {
            workers: 4,
            ..Config::linear(BLOCKS, 1024)
        },
        &[Arg::U64(out)],
        &mem,
        &budget,
    )
    .unwrap();
    assert_eq!(
        mem.read::<u32>(out, BLOCKS as usize),
        (0..BLOCKS).collect::<Vec<_>>()
    );
    assert!(budget.peak() >= 64 * MIB && budget.peak() <= 100 * MIB);
    assert!(budget.refused() >= 1, "four workers did not fit");
    assert_eq!(budget.used(), 0);
}

/// A module with `n` small kernels.
fn many_kernels(n: usize) -> String {
    let mut s = String::from(".version 7.0\n.target sm_52\n.address_size 64\n");
    for i in 0..n {
        s.push_str(&format!(
            ".visible .entry k{i}(.param .u64 p)\n{{\n .reg .b32 %r<4>;\n add.s32 %r1, %r2, %r3;\n ret;\n}}\n"
        ));
    }
    s
}

#[test]
fn a_watched_load_stops_when_its_watch_says_so() {
    let ptx = many_kernels(2000);
    // A watch that never stops the load is asked along the way.
    let mut asked = 0;
    let m = Module::load_watched(&ptx, &mut || {
        asked += 1;
        None
    })
    .unwrap();
    assert_eq!(m.kernels().len(), 2000);
    assert!(asked >= 4, "asked {asked} times");
    // Stopped at the third question: past the deadline.
    let mut left = 2;
    let e = Module::load_watched(&ptx, &mut || {
        if left == 0 {
            return Some(LoadErrorKind::TimedOut);
        }
        left -= 1;
        None
    })
    .unwrap_err();
    assert_eq!(e.kind, LoadErrorKind::TimedOut, "{e}");
    assert!(e.message.contains("deadline"), "{e}");
    // Cancelled at once.
    let e = Module::load_watched(&ptx, &mut || Some(LoadErrorKind::Cancelled)).unwrap_err();
    assert_eq!(e.kind, LoadErrorKind::Cancelled, "{e}");
}
