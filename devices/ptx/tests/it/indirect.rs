//! Calls through function addresses: C++ virtual functions, tables of function pointers,
//! recursion through a pointer, and lanes of one warp calling different functions at one call
//! (`fixtures/virtual.cu`, NVRTC).

use std::sync::Arc;

use vgpu_ptx::heap::{DeviceHeap, Heap};
use vgpu_ptx::testutils::*;
use vgpu_ptx::*;

/// A module with its globals in test memory.
struct Rig {
    m: Module,
    mem: TestMemory,
    g: Vec<u64>,
}

impl Rig {
    fn new(m: Module) -> Rig {
        let mem = TestMemory::new();
        let g = alloc_globals(&m, &mem);
        Rig { m, mem, g }
    }

    fn fixture(arch: &str) -> Rig {
        Rig::new(load_fixture("virtual", arch))
    }

    fn run(
        &self,
        kernel: &str,
        (grid, block): (u32, u32),
        args: &[Arg],
        heap: Option<Arc<Heap>>,
    ) -> Result<Progress, Fault> {
        let control = LaunchControl::new();
        control.set_heap(heap.map(|h| h as Arc<dyn DeviceHeap>));
        let cfg = Config {
            workers: 2,
            ..Config::linear(grid, block)
        };
        run_controlled(&self.m, kernel, &cfg, args, &self.mem, &self.g, &control)
    }
}

#[test]
fn virtual_functions_dispatch_per_lane() {
    for arch in ARCHS {
        let r = Rig::fixture(arch);
        let mem = &r.mem;
        let n = 96;
        let area = mem.alloc(4 * n);
        let sides = mem.alloc(4 * n);
        r.run("shapes", (3, 32), &[Arg::U64(area), Arg::U64(sides)], None)
            .unwrap_or_else(|f| panic!("{arch}: {f}"));
        let (a, s) = (mem.read::<f32>(area, n), mem.read::<i32>(sides, n));
        for t in 0..n {
            let x = t as f32;
            let (want_a, want_s) = match t % 3 {
                0 => (x * x, 4),
                1 => (3.0 * x * x, 0),
                _ => (0.5 * x * 2.0, 3),
            };
            assert_eq!((a[t], s[t]), (want_a, want_s), "{arch} lane {t}");
        }
    }
}

#[test]
fn objects_made_with_new_are_deleted_through_their_base() {
    let r = Rig::fixture("compute_80");
    let mem = &r.mem;
    let base = mem.alloc(1 << 16);
    let heap = Arc::new(Heap::new(base, 1 << 16));
    let area = mem.alloc(4 * 32);
    r.run(
        "heap_shapes",
        (1, 32),
        &[Arg::U64(area)],
        Some(Arc::clone(&heap)),
    )
    .unwrap();
    let a = mem.read::<f32>(area, 32);
    for (t, &got) in a.iter().enumerate() {
        let x = t as f32;
        assert_eq!(
            got,
            if t % 2 == 1 { x * x } else { 3.0 * x * x },
            "lane {t}"
        );
    }
    assert_eq!(heap.free_bytes(), 1 << 16, "every object deleted");
}

#[test]
fn a_table_of_function_pointers_with_recursion_through_it() {
    for arch in ARCHS {
        let r = Rig::fixture(arch);
        let mem = &r.mem;
        let sel: Vec<i32> = (0..32).map(|t| t % 4).collect();
        let a: Vec<i32> = (0..32).map(|t| t % 7 + 1).collect();
        let b: Vec<i32> = (0..32).map(|t| 3 - t % 5).collect();
        let (ds, da, db) = (mem.alloc_from(&sel), mem.alloc_from(&a), mem.alloc_from(&b));
        let out = mem.alloc(4 * 32);
        r.run(
            "table",
            (1, 32),
            &[Arg::U64(ds), Arg::U64(da), Arg::U64(db), Arg::U64(out)],
            None,
        )
        .unwrap_or_else(|f| panic!("{arch}: {f}"));
        let got = mem.read::<i32>(out, 32);
        for t in 0..32 {
            let want = match sel[t] {
                0 => a[t] + b[t],
                1 => a[t] - b[t],
                2 => a[t] * b[t],
                _ => (1..=a[t]).product(),
            };
            assert_eq!(got[t], want, "{arch} lane {t}");
        }
    }
}

#[test]
fn a_call_through_a_wild_pointer_faults() {
    let r = Rig::fixture("compute_80");
    let mem = &r.mem;
    let out = mem.alloc(4);
    // Not a function's address; a kernel's address; a data address.
    let kernel = FUNCTION_WINDOW
        + (0..4096u64)
            .find(|&i| {
                let p = mem.alloc_from(&[(FUNCTION_WINDOW + i) as i64]);
                r.run("wild", (1, 1), &[Arg::U64(p), Arg::U64(out)], None)
                    .is_err_and(|f| f.to_string().contains("a kernel"))
            })
            .expect("some function index is a kernel's");
    for (addr, kind) in [
        (FUNCTION_WINDOW + 100_000, FaultKind::IllegalAddress),
        (kernel, FaultKind::IllegalInstruction),
        (out, FaultKind::IllegalAddress),
        (0, FaultKind::IllegalAddress),
    ] {
        let p = mem.alloc_from(&[addr as i64]);
        let f = r
            .run("wild", (1, 1), &[Arg::U64(p), Arg::U64(out)], None)
            .unwrap_err();
        assert_eq!(f.kind, kind, "{addr:#x}: {f}");
    }
}

#[test]
fn a_call_through_a_prototype_of_another_signature_faults() {
    let ptx = |proto_param: &str| {
        format!(
            ".version 7.8\n.target sm_80\n.address_size 64\n\
             .func (.param .b32 r) one(.param .b32 a) {{ .reg .b32 %x; ld.param.b32 %x, [a]; add.s32 %x, %x, 1; st.param.b32 [r], %x; ret; }}\n\
             .visible .entry k(.param .u64 out) {{\n\
             .reg .b64 %f, %o; .reg .b32 %v;\n\
             ld.param.u64 %o, [out];\n\
             mov.u64 %f, one;\n\
             {{ .param {proto_param} p0; .param .b32 r0; st.param{} [p0], 41;\n\
             proto: .callprototype (.param .b32 _) _ (.param {proto_param} _);\n\
             call (r0), %f, (p0), proto; ld.param.b32 %v, [r0]; }}\n\
             st.global.u32 [%o], %v;\n\
             ret;\n}}\n",
            proto_param
        )
    };
    for (param, ok) in [(".b32", true), (".b64", false)] {
        let rig = Rig::new(Module::load(&ptx(param)).unwrap_or_else(|e| panic!("{param}: {e}")));
        let out = rig.mem.alloc(4);
        let r = rig.run("k", (1, 32), &[Arg::U64(out)], None);
        if ok {
            r.unwrap();
            assert_eq!(rig.mem.read::<u32>(out, 1), [42]);
        } else {
            let f = r.unwrap_err();
            assert_eq!(f.kind, FaultKind::IllegalInstruction, "{f}");
            assert!(f.to_string().contains("signature"), "{f}");
        }
    }
}
