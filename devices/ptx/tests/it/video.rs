//! Video instructions as nvcc, NVRTC and inline assembly write them: SIMD on bytes and
//! half-words with selectors, masks and accumulation, and the scalar ones with parts,
//! secondary operations, merges, shifts and `vmad`'s negations.

use vgpu_ptx::Module;
use vgpu_ptx::testutils::*;

/// Each line: an instruction writing `%r10`, then the value it must produce from
/// `%r1` = 0x807f0102, `%r2` = 0x01010304, `%r3` = 0x11223344, `%r4` = 7, `%r5` = 6,
/// `%r6` = 100, `%r7` = 200.
const CASES: &[(&str, u32)] = &[
    // __vsadu4 and __vabsdiffu4, as nvcc 11.8 writes them.
    ("vabsdiff4.u32.u32.u32.add %r10,%r1,%r2,%r3;", 0x1122_3445),
    ("vabsdiff4.u32.u32.u32 %r10,%r1,%r2,%r3;", 0x7f7e_0202),
    ("vadd4.s32.s32.s32.sat %r10, %r1, %r2, %r3;", 0x817f_0406),
    // Lane 1 only, a's lanes from b's half-words, b's from a's.
    (
        "vmax2.u32.u32.u32 %r10.h1, %r1.h32, %r2.h10, %r3;",
        0x807f_3344,
    ),
    ("vset4.u32.u32.gt %r10, %r1, %r2, %r3;", 0x0101_0000),
    ("vavrg4.s32.s32.s32 %r10, %r1, %r2, %r3;", 0xc040_0203),
    ("vmin2.s32.s32.s32.add %r10, %r1, %r2, %r3;", 0x1121_b4c5),
    ("vsub2.u32.u32.u32.sat %r10, %r2, %r1, %r3;", 0x0000_0202),
    ("vadd.u32.u32.u32.sat %r10, %r1, %r2;", 0x8180_0406),
    ("vsub.s32.s32.s32 %r10, %r1.b1, %r2.h1;", 0xffff_ff00),
    ("vabsdiff.s32.s32.s32.max %r10, %r4, %r5, %r6;", 100),
    (
        "vadd.u32.u32.u32.sat %r10.b2, %r1.b0, %r2.b0, %r3;",
        0x1106_3344,
    ),
    ("vmin.s32.s32.s32 %r10, %r1, %r2;", 0x807f_0102),
    ("vmax.u32.s32.s32.sat %r10, %r1, %r2;", 0x0101_0304),
    ("vshl.u32.u32.u32.wrap %r10, %r4, 40;", 0x700),
    ("vshl.u32.u32.u32.clamp.sat %r10, %r4, 40;", 0xffff_ffff),
    ("vshr.s32.s32.u32.clamp %r10, %r1, 4;", 0xf807_f010),
    ("vmad.s32.s32.s32 %r10, -%r4, %r5, %r6;", 58),
    ("vmad.s32.s32.s32 %r10, %r4, %r5, -%r6;", (-58i32) as u32),
    (
        "vmad.u32.u32.u32.po.shr7 %r10, %r7, %r7, 127;",
        (200 * 200 + 127 + 1) >> 7,
    ),
    ("vset.s32.s32.le.add %r10, %r1, %r2, %r3;", 0x1122_3345),
    ("vset.u32.u32.le %r10, %r1, %r2;", 0),
    ("vadd.u32.u32.u32 %r10, %r1, 5;", 0x807f_0107),
];

fn kernel(body: &str) -> String {
    format!(
        ".version 7.8\n.target sm_80\n.address_size 64\n\
         .visible .entry k(.param .u64 out) {{\n\
         .reg .b32 %r<12>; .reg .b64 %rd<2>;\n\
         ld.param.u64 %rd1, [out]; cvta.to.global.u64 %rd1, %rd1;\n\
         mov.u32 %r1, 0x807f0102; mov.u32 %r2, 0x01010304; mov.u32 %r3, 0x11223344;\n\
         mov.u32 %r4, 7; mov.u32 %r5, 6; mov.u32 %r6, 100; mov.u32 %r7, 200;\n\
         {body}\
         ret; }}\n"
    )
}

/// Runs each case's instruction and checks the `%r10` it writes.
fn check_cases(cases: &[(&str, u32)]) {
    let body: String = cases
        .iter()
        .enumerate()
        .map(|(i, (ins, _))| format!("{ins}\nst.global.u32 [%rd1+{}], %r10;\n", 4 * i))
        .collect();
    let got = run_out_kernel(&kernel(&body), 1, cases.len());
    for ((ins, want), got) in cases.iter().zip(got) {
        assert_eq!(got, *want, "{ins}: got {got:#010x}, want {want:#010x}");
    }
}

/// Each instruction alone in a kernel fails to load.
fn refused_at_load(bad: &[&str]) {
    for bad in bad {
        let e = Module::load(&kernel(&format!("{bad}\n"))).err();
        assert!(e.is_some(), "`{bad}` loaded");
    }
}

#[test]
fn video_instructions_compute_what_the_isa_says() {
    check_cases(CASES);
}

#[test]
fn malformed_video_instructions_are_refused_at_load() {
    refused_at_load(&[
        "vshl.u32.u32.u32 %r10, %r1, %r2;",
        "vadd4.u32.u32.u32 %r10, %r1, %r2;",
        "vadd.u32.u32 %r10, %r1, %r2;",
        "vadd.u64.u32.u32 %r10, %r1, %r2;",
        "vadd4.u32.u32.u32 %r10.b4, %r1, %r2, %r3;",
        "vadd4.u32.u32.u32 %r10, %r1.b8000, %r2, %r3;",
        "vadd2.u32.u32.u32 %r10, %r1.b3210, %r2, %r3;",
        "vadd.u32.u32.u32 %r10, %r1.b4, %r2;",
        "vadd.u32.u32.u32 %r10, %r1, %r2, %r3;",
        "vadd.u32.u32.u32 %r10, -%r1, %r2;",
        "vmad.s32.s32.s32 %r10, -%r4, %r5, -%r6;",
        "vmad.s32.s32.s32.po %r10, -%r4, %r5, %r6;",
        "vshl4.u32.u32.u32.clamp %r10, %r1, %r2, %r3;",
        "vavrg.u32.u32.u32 %r10, %r1, %r2;",
        "vset.u32.u32 %r10, %r1, %r2;",
        "vabsdiff4.u32.u32.u32.add %r10, %r1, %r2;",
    ]);
}

/// `min` and `max` on packed half-words (PTX 8.0, which CUB's compute 10.0 PTX writes) and
/// `.relu`, which the simulated GPU runs as the video instructions they equal, from the
/// registers of [`CASES`].
const PACKED_MIN_MAX: &[(&str, u32)] = &[
    ("min.s16x2 %r10, %r1, %r2;", 0x807f_0102),
    ("min.u16x2 %r10, %r1, %r2;", 0x0101_0102),
    ("max.s16x2 %r10, %r1, %r2;", 0x0101_0304),
    ("max.u16x2 %r10, %r1, %r2;", 0x807f_0304),
    ("min.relu.s16x2 %r10, %r1, %r2;", 0x0000_0102),
    ("max.relu.s16x2 %r10, %r1, %r1;", 0x0000_0102),
    ("min.relu.s32 %r10, %r1, %r2;", 0),
    ("max.relu.s32 %r10, %r1, %r4;", 7),
    ("min.relu.s32 %r10, %r6, %r7;", 100),
    // The plain forms are untouched.
    ("min.s32 %r10, %r1, %r2;", 0x807f_0102),
    ("max.u32 %r10, %r1, %r2;", 0x807f_0102),
];

#[test]
fn packed_min_max_and_relu_compute_what_the_isa_says() {
    check_cases(PACKED_MIN_MAX);
    refused_at_load(&[
        "min.relu.u16x2 %r10, %r1, %r2;",
        "max.relu.u32 %r10, %r1, %r2;",
        "min.s16x2 %r10, %r1;",
        "div.relu.s32 %r10, %r1, %r2;",
    ]);
}
