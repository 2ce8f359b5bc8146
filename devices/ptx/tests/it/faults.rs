//! Faults: out-of-bounds and misaligned accesses in every space, trap, watchdog, deadlock, and
//! PTX corner cases that must not panic.

use std::time::{Duration, Instant};

use vgpu_ptx::testutils::*;
use vgpu_ptx::*;

fn launch_one(
    m: &Module,
    kernel: &str,
    cfg: &Config,
    args: &[Arg],
    mem: &TestMemory,
    control: &LaunchControl,
) -> Result<Progress, Fault> {
    let g = alloc_globals(m, mem);
    let params = pack_params(m.kernel(kernel).unwrap(), args);
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
        control,
    })
}

#[test]
fn out_of_bounds_global_store_is_illegal_address() {
    for arch in ARCHS {
        let m = load_fixture("misc", arch);
        let mem = TestMemory::new();
        let g = alloc_globals(&m, &mem);
        let p = mem.alloc(64 * 4);
        // In bounds: fine.
        run(
            &m,
            "oob_store",
            &Config::linear(1, 32),
            &[Arg::U64(p), Arg::I64(63)],
            &mem,
            &g,
        )
        .unwrap();
        assert_eq!(mem.read::<i32>(p + 63 * 4, 1)[0], 1);
        for off in [64i64, 1000, -1, 1 << 40] {
            let f = run(
                &m,
                "oob_store",
                &Config::linear(2, 32),
                &[Arg::U64(p), Arg::I64(off)],
                &mem,
                &g,
            )
            .unwrap_err();
            assert_eq!(f.kind, FaultKind::IllegalAddress, "{arch} {off}: {f}");
            assert_eq!(f.cuda_error(), 700);
            let addr = format!("{:#x}", p.wrapping_add((off * 4) as u64));
            assert!(f.message.contains(&addr), "{f}");
            assert!(
                f.message.contains("oob_store")
                    && f.message.contains("PTX line")
                    && f.message.contains("thread (5, 0, 0)"),
                "{f}"
            );
        }
    }
}

#[test]
fn trap_misaligned_and_watchdog() {
    for arch in ARCHS {
        let m = load_fixture("misc", arch);
        let mem = TestMemory::new();
        let g = alloc_globals(&m, &mem);
        let p = mem.alloc(1024);
        let f = run(
            &m,
            "trap_kernel",
            &Config::linear(1, 64),
            &[Arg::U64(p)],
            &mem,
            &g,
        )
        .unwrap_err();
        assert_eq!((f.kind, f.cuda_error()), (FaultKind::Trap, 719), "{f}");
        assert!(f.message.contains("thread (3, 0, 0)"), "{f}");
        let f = run(
            &m,
            "misaligned",
            &Config::linear(1, 1),
            &[Arg::U64(p)],
            &mem,
            &g,
        )
        .unwrap_err();
        assert_eq!(
            (f.kind, f.cuda_error()),
            (FaultKind::MisalignedAddress, 716),
            "{f}"
        );

        let flag = mem.alloc(4);
        let control = LaunchControl::new();
        let deadline = Duration::from_millis(100);
        control.set_timeout(deadline);
        let start = Instant::now();
        let f = launch_one(
            &m,
            "spin",
            &Config {
                workers: 2,
                ..Config::linear(4, 64)
            },
            &[Arg::U64(flag)],
            &mem,
            &control,
        )
        .unwrap_err();
        let took = start.elapsed();
        assert_eq!((f.kind, f.cuda_error()), (FaultKind::Timeout, 702), "{f}");
        assert!(took >= deadline, "{took:?}");
        eprintln!("watchdog overshoot: {:?}", took - deadline);
        // Checked every 1024 warp-instructions: the overshoot is well under a millisecond even in
        // a debug build; the bound leaves room for a loaded CI machine descheduling the worker.
        assert!(
            took < deadline + Duration::from_millis(200),
            "watchdog fired after {took:?}"
        );
    }
}

#[test]
fn cancel_stops_a_running_launch() {
    let m = load_fixture("misc", "compute_80");
    let mem = TestMemory::new();
    let flag = mem.alloc(4);
    let control = LaunchControl::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(30));
            control.cancel();
        });
        let f = launch_one(
            &m,
            "spin",
            &Config::linear(1, 32),
            &[Arg::U64(flag)],
            &mem,
            &control,
        )
        .unwrap_err();
        assert_eq!(f.kind, FaultKind::Cancelled, "{f}");
    });
}

/// Hand-written kernels for the shared, local, param and generic spaces.
const SPACES: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.visible .entry shared_oob(.param .u32 idx)
{
    .reg .b32 %r<4>;
    .shared .align 4 .b8 buf[64];
    ld.param.u32 %r1, [idx];
    shl.b32 %r2, %r1, 2;
    mov.u32 %r3, buf;
    add.u32 %r3, %r3, %r2;
    st.shared.u32 [%r3], %r1;
    ret;
}

.visible .entry local_oob(.param .u32 idx)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<4>;
    .local .align 4 .b8 depot[16];
    ld.param.u32 %r1, [idx];
    mul.wide.u32 %rd1, %r1, 4;
    mov.u64 %rd2, depot;
    add.u64 %rd2, %rd2, %rd1;
    st.local.u32 [%rd2], %r1;
    ld.local.u32 %r2, [%rd2];
    ret;
}

.visible .entry generic_probe(.param .u64 addr, .param .u64 out)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [addr];
    ld.param.u64 %rd2, [out];
    ld.u32 %r1, [%rd1];
    st.global.u32 [%rd2], %r1;
    ret;
}

.visible .entry generic_windows(.param .u64 out)
{
    .reg .pred %p<4>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    .shared .align 4 .b8 sh[8];
    .local .align 4 .b8 lo[8];
    ld.param.u64 %rd1, [out];
    mov.u64 %rd2, sh;
    cvta.shared.u64 %rd3, %rd2;
    mov.u64 %rd4, lo;
    cvta.local.u64 %rd5, %rd4;
    st.u32 [%rd3+4], 11;
    st.u32 [%rd5+4], 22;
    ld.shared.u32 %r1, [sh+4];
    ld.local.u32 %r2, [lo+4];
    isspacep.shared %p1, %rd3;
    isspacep.local %p2, %rd5;
    isspacep.global %p3, %rd1;
    selp.u32 %r3, 1, 0, %p1;
    selp.u32 %r4, 2, 0, %p2;
    selp.u32 %r5, 4, 0, %p3;
    or.b32 %r3, %r3, %r4;
    or.b32 %r3, %r3, %r5;
    cvta.to.shared.u64 %rd6, %rd3;
    cvt.u32.u64 %r6, %rd6;
    mov.u32 %r7, sh;
    setp.eq.u32 %p1, %r6, %r7;
    @!%p1 trap;
    st.global.v4.u32 [%rd1], {%r1, %r2, %r3, %r6};
    ret;
}

.visible .entry corner_cases(.param .u64 out)
{
    .reg .b32 %r<16>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, 7;
    mov.u32 %r2, 0;
    div.u32 %r3, %r1, %r2;
    rem.u32 %r4, %r1, %r2;
    mov.u32 %r5, -2147483648;
    mov.u32 %r6, -1;
    div.s32 %r7, %r5, %r6;
    rem.s32 %r8, %r5, %r6;
    shl.b32 %r9, %r1, 40;
    shr.s32 %r10, %r5, 40;
    shr.u32 %r11, %r5, 33;
    div.s32 %r12, %r5, %r2;
    bfe.u32 %r13, %r5, 40, 8;
    clz.b32 %r14, %r2;
    st.global.v4.u32 [%rd1], {%r3, %r4, %r7, %r8};
    st.global.v4.u32 [%rd1+16], {%r9, %r10, %r11, %r12};
    st.global.v2.u32 [%rd1+32], {%r13, %r14};
    ret;
}

.visible .entry param_address(.param .u32 a, .param .u32 b, .param .u64 out)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<5>;
    mov.u64 %rd1, a;
    ld.param.u32 %r1, [%rd1+4];
    cvta.param.u64 %rd2, %rd1;
    ld.u32 %r2, [%rd2];
    ld.param.u64 %rd3, [out];
    st.global.v2.u32 [%rd3], {%r1, %r2};
    st.u32 [%rd2], %r2;
    ret;
}

.visible .entry divergent_barrier()
{
    .reg .pred %p<2>;
    .reg .b32 %r<2>;
    mov.u32 %r1, %tid.x;
    setp.lt.u32 %p1, %r1, 32;
    @%p1 bra DONE;
    bar.sync 0;
DONE:
    bar.sync 1;
    ret;
}
"#;

#[test]
fn shared_local_and_generic_bounds() {
    let m = Module::load(SPACES).unwrap();
    let mem = TestMemory::new();
    run(
        &m,
        "shared_oob",
        &Config::linear(1, 1),
        &[Arg::U32(15)],
        &mem,
        &[],
    )
    .unwrap();
    let f = run(
        &m,
        "shared_oob",
        &Config::linear(1, 1),
        &[Arg::U32(16)],
        &mem,
        &[],
    )
    .unwrap_err();
    assert_eq!(f.kind, FaultKind::IllegalAddress, "{f}");
    assert!(
        f.message.contains("shared_oob") && f.message.contains("line 14"),
        "{f}"
    );
    // Dynamic shared memory extends the window.
    let cfg = Config {
        dynamic_shared: 64,
        ..Config::linear(1, 1)
    };
    run(&m, "shared_oob", &cfg, &[Arg::U32(31)], &mem, &[]).unwrap();
    run(
        &m,
        "local_oob",
        &Config::linear(1, 32),
        &[Arg::U32(3)],
        &mem,
        &[],
    )
    .unwrap();
    let f = run(
        &m,
        "local_oob",
        &Config::linear(1, 32),
        &[Arg::U32(4)],
        &mem,
        &[],
    )
    .unwrap_err();
    assert_eq!(f.kind, FaultKind::IllegalAddress, "{f}");

    let out = mem.alloc(16);
    for bad in [
        0u64,
        5,
        0x1000,
        GLOBAL_BASE - 4,
        SHARED_WINDOW + (1 << 20),
        LOCAL_WINDOW + (1 << 20),
        0xffff_ffff_ffff_fff0,
    ] {
        let f = run(
            &m,
            "generic_probe",
            &Config::linear(1, 1),
            &[Arg::U64(bad), Arg::U64(out)],
            &mem,
            &[],
        )
        .unwrap_err();
        assert!(
            matches!(
                f.kind,
                FaultKind::IllegalAddress | FaultKind::MisalignedAddress
            ),
            "{bad:#x}: {f}"
        );
    }
    let owned = mem.alloc_from(&[99u32]);
    run(
        &m,
        "generic_probe",
        &Config::linear(1, 1),
        &[Arg::U64(owned), Arg::U64(out)],
        &mem,
        &[],
    )
    .unwrap();
    assert_eq!(mem.read::<u32>(out, 1)[0], 99);
    // A freed allocation is no longer reachable.
    mem.free(owned);
    let f = run(
        &m,
        "generic_probe",
        &Config::linear(1, 1),
        &[Arg::U64(owned), Arg::U64(out)],
        &mem,
        &[],
    )
    .unwrap_err();
    assert_eq!(f.kind, FaultKind::IllegalAddress);

    run(
        &m,
        "generic_windows",
        &Config::linear(1, 1),
        &[Arg::U64(out)],
        &mem,
        &[],
    )
    .unwrap();
    assert_eq!(mem.read::<u32>(out, 4), vec![11, 22, 7, 0]);
}

#[test]
fn parameter_addresses() {
    let m = Module::load(SPACES).unwrap();
    let mem = TestMemory::new();
    let out = mem.alloc(8);
    // Reading parameters through their address works; writing them faults.
    let f = run(
        &m,
        "param_address",
        &Config::linear(1, 1),
        &[Arg::U32(5), Arg::U32(9), Arg::U64(out)],
        &mem,
        &[],
    )
    .unwrap_err();
    assert_eq!(f.kind, FaultKind::IllegalAddress, "{f}");
    assert_eq!(mem.read::<u32>(out, 2), vec![9, 5]);
    let e = Module::load(&SPACES.replace("st.u32 [%rd2], %r2;", "st.const.u32 [%rd2], %r2;"))
        .unwrap_err();
    assert_eq!(e.kind, LoadErrorKind::InvalidPtx);
}

#[test]
fn integer_corner_cases_do_not_panic() {
    let m = Module::load(SPACES).unwrap();
    let mem = TestMemory::new();
    let out = mem.alloc(40);
    run(
        &m,
        "corner_cases",
        &Config::linear(1, 32),
        &[Arg::U64(out)],
        &mem,
        &[],
    )
    .unwrap();
    let r: Vec<u32> = mem.read(out, 10);
    assert_eq!(
        r,
        vec![u32::MAX, 7, 0x8000_0000, 0, 0, u32::MAX, 0, u32::MAX, 0, 32]
    );
}

#[test]
fn barrier_deadlock_is_reported() {
    let m = Module::load(SPACES).unwrap();
    let mem = TestMemory::new();
    // Warp 0 skips `bar.sync 0`, warp 1 waits there, warp 0 waits at barrier 1: nobody can finish.
    let f = run(
        &m,
        "divergent_barrier",
        &Config::linear(1, 64),
        &[],
        &mem,
        &[],
    )
    .unwrap_err();
    assert_eq!(f.kind, FaultKind::Timeout, "{f}");
    assert!(f.message.contains("deadlock"), "{f}");
}
