//! `mbarrier` objects in hand-written PTX: phases completed by the last arrival, states and
//! parities, `pending_count`, `arrive_drop`, `try_wait`, `cp.async.mbarrier.arrive`, warps that
//! wait on the block's other warps, `nanosleep` letting another warp run, refusals and faults.

use vgpu_ptx::testutils::*;
use vgpu_ptx::*;

/// A kernel of `threads` threads with a barrier object `bar` in shared memory, `%r1` its
/// thread index, `%rd1` the output pointer and `%rd2` the barrier's shared address.
fn kernel(body: &str) -> String {
    format!(
        ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k(.param .u64 out)\n{{\n\
         .shared .align 8 .b64 bar;\n.shared .align 4 .b32 flag;\n\
         .reg .b32 %r<40>;\n.reg .b64 %rd<20>;\n.reg .pred %p<8>;\n\
         ld.param.u64 %rd1, [out];\ncvta.to.global.u64 %rd1, %rd1;\nmov.u32 %r1, %tid.x;\n\
         mov.u64 %rd2, bar;\n{body}\nret;\n}}\n"
    )
}

/// Stores `%r{v}` at `out[tid]`.
fn store(v: u32) -> String {
    format!("mul.wide.u32 %rd3, %r1, 4;\nadd.u64 %rd4, %rd1, %rd3;\nst.global.u32 [%rd4], %r{v};\n")
}

#[test]
fn the_last_arrival_completes_a_phase_and_the_waiters_go_on() {
    // 128 threads; warp 0 writes the flag, then everyone arrives and waits (spinning on
    // test_wait) and reads it. Warp 0 runs first, so only waiting makes the others see 7.
    let body = format!(
        "setp.eq.u32 %p1, %r1, 0;\n@%p1 mbarrier.init.shared.b64 [bar], 128;\nbar.sync 0;\n\
         setp.lt.u32 %p2, %r1, 32;\n@%p2 st.shared.u32 [flag], 7;\n\
         mbarrier.arrive.shared.b64 %rd5, [bar];\n\
         WAIT:\nmbarrier.test_wait.shared.b64 %p3, [bar], %rd5;\n@!%p3 bra WAIT;\n\
         ld.shared.u32 %r2, [flag];\n\
         mbarrier.pending_count.b64 %r3, %rd5;\nmad.lo.u32 %r4, %r3, 1000, %r2;\n{}",
        store(4)
    );
    let got = try_run_out_kernel(&kernel(&body), 128, 128).unwrap();
    for (t, g) in got.iter().enumerate() {
        // The state records the arrivals still pending after this thread's.
        let pending = if t == 127 { 128 } else { 127 - t as u32 };
        assert_eq!(*g, pending * 1000 + 7, "thread {t}");
    }
}

#[test]
fn parities_try_wait_and_arrive_drop_over_phases() {
    // 64 threads, three phases. Phase 0: all arrive (parity wait on 0). Phase 1: warp 1 drops
    // out; try_wait on the state. Phase 2: warp 0 alone completes it (the expected count is 32).
    let body = format!(
        "setp.eq.u32 %p1, %r1, 0;\n@%p1 mbarrier.init.shared.b64 [bar], 64;\nbar.sync 0;\n\
         mov.u32 %r10, 0;\n\
         mbarrier.arrive.shared.b64 %rd5, [bar];\n\
         W0:\nmbarrier.test_wait.parity.shared.b64 %p3, [bar], %r10;\n@!%p3 bra W0;\n\
         setp.ge.u32 %p4, %r1, 32;\n@%p4 bra DROP;\n\
         mbarrier.arrive.shared.b64 %rd6, [bar];\n\
         W1:\nmbarrier.try_wait.shared.b64 %p3, [bar], %rd6, 1000;\n@!%p3 bra W1;\n\
         mbarrier.arrive.shared.b64 %rd7, [bar];\n\
         mov.u32 %r11, 0;\n\
         W2:\nmbarrier.try_wait.parity.shared.b64 %p3, [bar], %r11;\n@!%p3 bra W2;\n\
         mbarrier.pending_count.b64 %r2, %rd7;\nadd.u32 %r2, %r2, 100;\nbra.uni OUT;\n\
         DROP:\nmbarrier.arrive_drop.shared.b64 %rd6, [bar];\nmov.u32 %r2, 5;\n\
         OUT:\n{}",
        store(2)
    );
    let got = try_run_out_kernel(&kernel(&body), 64, 64).unwrap();
    for (t, g) in got.iter().enumerate() {
        let want = if t >= 32 {
            5
        } else if t == 31 {
            // The last of phase 2's 32 arrivals: the count restarts at 32.
            132
        } else {
            100 + 31 - t as u32
        };
        assert_eq!(*g, want, "thread {t}");
    }
}

#[test]
fn cp_async_arrivals_count_only_without_an_increment() {
    // Expected 2 arrivals per phase: one plain arrive and one cp.async .noinc arrive complete
    // it; the cp.async arrive without .noinc changes nothing.
    let body = format!(
        "setp.eq.u32 %p1, %r1, 0;\n@!%p1 bra END;\n\
         mbarrier.init.shared.b64 [bar], 2;\n\
         cp.async.mbarrier.arrive.shared.b64 [bar];\n\
         mbarrier.arrive.shared.b64 %rd5, [bar];\n\
         mbarrier.test_wait.shared.b64 %p2, [bar], %rd5;\nselp.u32 %r2, 1, 0, %p2;\n\
         cp.async.mbarrier.arrive.noinc.shared.b64 [bar];\n\
         mbarrier.test_wait.shared.b64 %p3, [bar], %rd5;\nselp.u32 %r3, 10, 0, %p3;\n\
         add.u32 %r2, %r2, %r3;\n{}END:\n",
        store(2)
    );
    let got = try_run_out_kernel(&kernel(&body), 1, 1).unwrap();
    assert_eq!(
        got[0], 10,
        "incomplete after one arrival, complete after the .noinc one"
    );
}

#[test]
fn a_warp_backing_off_with_nanosleep_lets_the_others_run() {
    // Warp 0 spins until warp 1 sets the flag.
    let body = format!(
        "setp.eq.u32 %p1, %r1, 0;\n@%p1 st.shared.u32 [flag], 0;\nbar.sync 0;\n\
         setp.lt.u32 %p2, %r1, 32;\n@!%p2 bra SET;\n\
         SPIN:\nld.volatile.shared.u32 %r2, [flag];\nsetp.eq.u32 %p3, %r2, 0;\n\
         @!%p3 bra DONE;\nnanosleep.u32 100;\nbra.uni SPIN;\n\
         SET:\nst.volatile.shared.u32 [flag], 9;\nmov.u32 %r2, 1;\n\
         DONE:\n{}",
        store(2)
    );
    let got = try_run_out_kernel(&kernel(&body), 64, 64).unwrap();
    assert!(got[..32].iter().all(|&v| v == 9), "{got:?}");
    assert!(got[32..].iter().all(|&v| v == 1), "{got:?}");
}

#[test]
fn barriers_at_bad_addresses_fault_and_cluster_forms_are_refused() {
    for (inst, kind) in [
        (
            "add.u64 %rd2, %rd2, 4;\nmbarrier.init.shared.b64 [%rd2], 1;",
            FaultKind::MisalignedAddress,
        ),
        (
            "mov.u64 %rd2, 1099511627776;\nmbarrier.arrive.shared.b64 %rd5, [%rd2];",
            FaultKind::IllegalAddress,
        ),
    ] {
        let f = try_run_out_kernel(&kernel(inst), 32, 1).unwrap_err();
        assert_eq!(f.kind, kind, "{inst}: {f}");
    }
    for inst in [
        "mbarrier.expect_tx.shared.b64 [bar], 16;",
        "mbarrier.arrive.expect_tx.shared.b64 %rd5, [bar], 16;",
        "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%rd2];",
    ] {
        let e = Module::load(&kernel(inst)).unwrap_err();
        assert_eq!(e.kind, LoadErrorKind::NotSupported, "{inst}: {e}");
    }
}

#[test]
fn a_wait_that_can_never_complete_ends_at_the_watchdog() {
    // Two warps wait on a barrier expecting three arrivals per thread: they take turns
    // forever, and the launch's deadline ends it.
    let body = "setp.eq.u32 %p1, %r1, 0;\n@%p1 mbarrier.init.shared.b64 [bar], 192;\nbar.sync 0;\n\
                mbarrier.arrive.shared.b64 %rd5, [bar];\n\
                WAIT:\nmbarrier.test_wait.shared.b64 %p3, [bar], %rd5;\n@!%p3 bra WAIT;\n";
    let m = Module::load(&kernel(body)).unwrap();
    let mem = TestMemory::new();
    let out = mem.alloc(4);
    let control = LaunchControl::new();
    let deadline = std::time::Duration::from_millis(100);
    control.set_timeout(deadline);
    let params = pack_params(m.kernel("k").unwrap(), &[Arg::U64(out)]);
    let start = std::time::Instant::now();
    let f = m
        .launch(&Launch {
            kernel: "k",
            grid: [1, 1, 1],
            block: [64, 1, 1],
            dynamic_shared: 0,
            params: &params,
            globals: &[],
            memory: &mem,
            start_block: 0,
            workers: 1,
            control: &control,
        })
        .unwrap_err();
    assert_eq!((f.kind, f.cuda_error()), (FaultKind::Timeout, 702), "{f}");
    assert!(start.elapsed() >= deadline);
}
