//! Module variables whose initializers hold addresses (`.u64 p = generic(table)+8;`): tables of
//! strings and pointers, a pointer into `__constant__` memory and a table of kernels, as NVRTC
//! compiles them (`fixtures/tables.cu`).

use vgpu_ptx::testutils::*;
use vgpu_ptx::*;

#[test]
fn initializers_hold_the_addresses_of_variables() {
    for arch in ARCHS {
        let m = load_fixture("tables", arch);
        let mem = TestMemory::new();
        let g = alloc_globals(&m, &mem);
        let out = mem.alloc(8 * 4);
        let run = |kernel: &str, args: &[Arg]| {
            run(&m, kernel, &Config::linear(1, 1), args, &mem, &g)
                .unwrap_or_else(|f| panic!("{arch} {kernel}: {f}"));
        };
        run("read_tables", &[Arg::U64(out)]);
        let got = mem.read::<i32>(out, 8);
        assert_eq!(
            got,
            [
                i32::from(b'a'),
                i32::from(b'b'),
                i32::from(b'g'),
                40,
                10,
                30,
                2.5f32.to_bits() as i32,
                1
            ],
            "{arch}"
        );
        run("write_through", &[Arg::I32(-7)]);
        let values = m.globals().iter().position(|v| v.name == "values").unwrap();
        assert_eq!(mem.read::<i32>(g[values], 4), [-7, 20, 30, 40], "{arch}");
    }
}

#[test]
fn kernels_have_addresses_that_no_access_reaches() {
    let m = load_fixture("tables", "compute_80");
    let mem = TestMemory::new();
    let g = alloc_globals(&m, &mem);
    let out = mem.alloc(3 * 8);
    run(
        &m,
        "kernel_addresses",
        &Config::linear(1, 1),
        &[Arg::U64(out)],
        &mem,
        &g,
    )
    .unwrap();
    let a = mem.read::<u64>(out, 3);
    assert!(a.iter().all(|&v| v >= FUNCTION_WINDOW), "{a:x?}");
    assert_ne!(a[0], a[1], "each kernel its own address");
    assert_eq!(a[0], a[2], "the table holds what `mov` gives");
}

#[test]
fn initializers_naming_unknown_symbols_are_refused() {
    let ptx = ".version 7.8\n.target sm_80\n.address_size 64\n\
        .global .align 8 .u64 p = generic(nowhere);\n\
        .visible .entry k() { ret; }\n";
    let e = Module::load(ptx).unwrap_err();
    assert!(e.to_string().contains("nowhere"), "{e}");
    let ptx = ".version 7.8\n.target sm_80\n.address_size 64\n\
        .global .align 4 .b8 v[4];\n.global .align 4 .u32 p = generic(v);\n\
        .visible .entry k() { ret; }\n";
    let e = Module::load(ptx).unwrap_err();
    assert_eq!(e.kind, LoadErrorKind::NotSupported, "a 4-byte address: {e}");
}

#[test]
fn a_call_expecting_a_result_from_a_void_function_runs() {
    // numba declares a C-ABI `void` function `.extern` returning `.b64` and calls it so; its
    // definition (from NVRTC) returns nothing. The linked module runs, the result undefined.
    let ptx = ".version 7.8\n.target sm_80\n.address_size 64\n\
        .visible .func consume(.param .b32 consume_param_0) {\n\
        .reg .b32 %r<2>; ld.param.u32 %r1, [consume_param_0]; ret; }\n\
        .visible .entry k(.param .u64 out) {\n\
        .reg .b32 %r<3>; .reg .b64 %rd<3>;\n\
        ld.param.u64 %rd1, [out]; cvta.to.global.u64 %rd1, %rd1; mov.u32 %r1, 21;\n\
        { .param .b32 param0; st.param.b32 [param0+0], %r1; .param .b64 retval0;\n\
        call.uni (retval0), consume, (param0); ld.param.b64 %rd2, [retval0+0]; }\n\
        shl.b32 %r2, %r1, 1; st.global.u32 [%rd1], %r2; ret; }\n";
    assert_eq!(run_out_kernel(ptx, 1, 1), [42]);
    // Arguments must still match.
    let bad = ptx.replace(
        "call.uni (retval0), consume, (param0);",
        "call.uni (retval0), consume, ();",
    );
    assert!(Module::load(&bad).is_err());
}
