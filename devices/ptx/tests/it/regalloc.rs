//! Register packing (`decode/regalloc.rs`): values whose live ranges do not overlap share a
//! frame register, and nothing a thread can observe changes. The kernels here are laid out so
//! that a wrong packing would give some lanes another value's bits: lanes parked on a divergent
//! path, guarded writes that leave some lanes' values in place, loops whose values live across
//! the back edge, and a loop body placed after the function's exit.

use vgpu_ptx::testutils::*;
use vgpu_ptx::*;

/// Runs one warp of `kernel` in `ptx` and returns each lane's `u32` result.
fn lanes(ptx: &str, kernel: &str) -> Vec<u32> {
    let m = Module::load(ptx).unwrap_or_else(|e| panic!("{e}"));
    let mem = TestMemory::new();
    let out = mem.alloc(32 * 4);
    run(
        &m,
        kernel,
        &Config::linear(1, 32),
        &[Arg::U64(out)],
        &mem,
        &[],
    )
    .unwrap_or_else(|f| panic!("{kernel}: {f}"));
    mem.read::<u32>(out, 32)
}

/// A kernel that computes `%r3` per lane (`BODY`) and stores it at `out[tid]`.
fn kernel(name: &str, body: &str) -> String {
    format!(
        ".version 7.0\n.target sm_52\n.address_size 64\n.visible .entry {name}(.param .u64 out)\n{{\n\
         .reg .b32 %r<40>;\n.reg .b64 %rd<4>;\n.reg .pred %p<4>;\n\
         ld.param.u64 %rd1, [out];\ncvta.to.global.u64 %rd1, %rd1;\nmov.u32 %r1, %tid.x;\n\
         {body}\n\
         mul.wide.u32 %rd2, %r1, 4;\nadd.u64 %rd3, %rd1, %rd2;\nst.global.u32 [%rd3], %r3;\nret;\n}}\n"
    )
}

/// Temporaries `%r{from}`… chained from `%r1`, ending in `%r{from + n - 1}`.
fn temps(from: usize, n: usize) -> String {
    let mut s = format!("add.u32 %r{from}, %r1, 100;\n");
    for i in from + 1..from + n {
        s += &format!("mul.lo.u32 %r{i}, %r{}, 3;\n", i - 1);
    }
    s
}

/// The host's value of [`temps`]' last register for lane `t`.
fn temps_value(t: u32, n: usize) -> u32 {
    (1..n).fold(t + 100, |v, _| v.wrapping_mul(3))
}

#[test]
fn lanes_parked_on_one_path_keep_their_values_while_the_other_runs() {
    // Each path computes %r3; the even path's temporaries die before its %r3 is written, so
    // they may share %r3's register with the odd lanes' %r3 waiting at the join. Both layouts.
    for (first, second) in [("EVEN", "ODD"), ("ODD", "EVEN")] {
        let path = |name: &str| match name {
            "EVEN" => format!("{}add.u32 %r3, %r10, 1;\n", temps(4, 7)),
            _ => "mul.lo.u32 %r3, %r1, 1000;\n".to_string(),
        };
        let body = format!(
            "and.b32 %r2, %r1, 1;\nsetp.eq.u32 %p1, %r2, {};\n@%p1 bra {second};\n{first}:\n{}bra JOIN;\n{second}:\n{}JOIN:\n",
            if first == "EVEN" { 1 } else { 0 },
            path(first),
            path(second),
        );
        let got = lanes(&kernel("k", &body), "k");
        for (t, g) in got.iter().enumerate() {
            let t = t as u32;
            let want = if t.is_multiple_of(2) {
                temps_value(t, 7) + 1
            } else {
                t * 1000
            };
            assert_eq!(*g, want, "{first} first, lane {t}");
        }
    }
}

#[test]
fn a_guarded_write_leaves_the_other_lanes_values() {
    // %r3 is 5 everywhere, then 7 in odd lanes only; temporaries run in between. In the second
    // layout the code that sets 5 comes after the guarded write, so only the guarded write
    // counting as a read keeps the temporaries off %r3's register.
    let set = "mov.u32 %r3, 5;\nand.b32 %r2, %r1, 1;\nsetp.eq.u32 %p1, %r2, 1;\n";
    let guarded = format!(
        "{}add.u32 %r20, %r10, 0;\n@%p1 mov.u32 %r3, 7;\nadd.u32 %r3, %r3, %r20;\n",
        temps(4, 7)
    );
    for body in [
        format!("{set}{guarded}"),
        format!("bra.uni A;\nB:\n{guarded}bra.uni END;\nA:\n{set}bra.uni B;\nEND:\n"),
    ] {
        let got = lanes(&kernel("k", &body), "k");
        for (t, g) in got.iter().enumerate() {
            let t = t as u32;
            let base = if t % 2 == 1 { 7 } else { 5 };
            assert_eq!(*g, base + temps_value(t, 7), "lane {t}:\n{body}");
        }
    }
}

#[test]
fn values_live_across_a_loop_s_back_edge() {
    // %r3 accumulates, %r5 counts, %r6 (set before the loop) is read in every iteration, and
    // %r7 carries a value from the end of one iteration to the start of the next.
    let body = "mov.u32 %r3, 0;\nmov.u32 %r5, 0;\nadd.u32 %r6, %r1, 3;\nmov.u32 %r7, 1;\n\
                LOOP:\nadd.u32 %r8, %r5, %r6;\nmul.lo.u32 %r9, %r8, %r7;\nadd.u32 %r3, %r3, %r9;\n\
                add.u32 %r5, %r5, 1;\nadd.u32 %r7, %r7, %r5;\nsetp.lt.u32 %p1, %r5, 10;\n@%p1 bra LOOP;\n";
    let got = lanes(&kernel("k", body), "k");
    for (t, g) in got.iter().enumerate() {
        let (mut acc, mut carried) = (0u32, 1u32);
        for i in 0..10u32 {
            acc += (i + t as u32 + 3) * carried;
            carried += i + 1;
        }
        assert_eq!(*g, acc, "lane {t}");
    }
}

#[test]
fn a_loop_body_placed_after_the_exit() {
    // The loop runs a lane-dependent number of times; its body comes after the code that
    // leaves it, so values live in it span code they are not used in.
    let body = "mov.u32 %r3, 0;\nmov.u32 %r5, 0;\nand.b32 %r6, %r1, 7;\nbra.uni BODY;\n\
                DONE:\nadd.u32 %r3, %r3, %r6;\nbra.uni END;\n\
                BODY:\nadd.u32 %r9, %r5, %r1;\nadd.u32 %r3, %r3, %r9;\nadd.u32 %r5, %r5, 1;\n\
                setp.le.u32 %p1, %r5, %r6;\n@%p1 bra BODY;\nbra.uni DONE;\nEND:\n";
    let got = lanes(&kernel("k", body), "k");
    for (t, g) in got.iter().enumerate() {
        let t = t as u32;
        let n = t & 7;
        let want: u32 = (0..=n).map(|i| i + t).sum::<u32>() + n;
        assert_eq!(*g, want, "lane {t}");
    }
}

#[test]
fn a_kernel_reports_the_registers_it_holds_live_not_those_it_declares() {
    let body = format!("{}add.u32 %r3, %r10, 0;\n", temps(4, 7));
    let m = Module::load(&kernel("k", &body)).unwrap();
    let declared = 40 + 4;
    let regs = m.kernel("k").unwrap().num_regs;
    assert!(regs < declared / 2, "{regs} registers");
}

#[test]
fn control_flow_that_settles_slowly_keeps_the_registers_as_declared() {
    // A chain of 100 blocks, each jumping to the one laid out before it: liveness moves one
    // block per pass, past the analysis' bound, so the registers stay as declared and the
    // kernel still computes the same.
    let mut body = String::from("mov.u32 %r3, 0;\nadd.u32 %r5, %r1, 1;\nbra.uni B99;\n");
    for i in 0..100 {
        body += &format!("B{i}:\nadd.u32 %r3, %r3, %r5;\n");
        body += &if i == 0 {
            "bra.uni END;\n".to_string()
        } else {
            format!("bra.uni B{};\n", i - 1)
        };
    }
    body += "END:\n";
    let ptx = kernel("k", &body).replace(".reg .b32 %r<40>;", ".reg .b32 %r<5000>;");
    let got = lanes(&ptx, "k");
    for (t, g) in got.iter().enumerate() {
        assert_eq!(*g, 100 * (t as u32 + 1), "lane {t}");
    }
    let m = Module::load(&ptx).unwrap();
    assert!(m.kernel("k").unwrap().num_regs >= 5000);
    // The same blocks in control-flow order settle at once and pack.
    let mut body = String::from("mov.u32 %r3, 0;\nadd.u32 %r5, %r1, 1;\n");
    for i in (0..100).rev() {
        body += &format!("B{i}:\nadd.u32 %r3, %r3, %r5;\n");
    }
    let ptx = kernel("k", &body).replace(".reg .b32 %r<40>;", ".reg .b32 %r<5000>;");
    let got = lanes(&ptx, "k");
    assert_eq!(got[3], 400);
    assert!(Module::load(&ptx).unwrap().kernel("k").unwrap().num_regs < 16);
}
