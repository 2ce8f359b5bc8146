//! Texture and surface references (`.global .texref`/`.surfref`, CUDA 11's `texture<>` and
//! `surface<>` templates) in kernels compiled by nvcc 11.8 (`fixtures/texture/references.cu`):
//! each reference is an 8-byte global holding the bound object's handle.

use vgpu_ptx::testutils::*;
use vgpu_ptx::texture::*;
use vgpu_ptx::*;

/// The architectures the reference fixture is compiled for.
const REF_ARCHS: [&str; 3] = ["compute_52", "compute_70", "compute_90"];
/// Handles the tests register and store in the references (high bits set, so that a truncated
/// handle load would be caught).
const TEX: u64 = 0x7e11_0000_0000_0011;
const SURF: u64 = 0x5f11_0000_0000_0011;

fn module(arch: &str) -> Module {
    load_fixture("texture/references", arch)
}

/// A tightly packed layout (rows of `w` texels, slices of `h` rows, no layers).
fn layout(base: u64, format: ChannelFormat, channels: u8, dims: u8, w: u64, h: u64) -> Layout {
    let pitch = w * format.bytes() * u64::from(channels);
    Layout {
        base,
        format,
        channels,
        dims,
        width: w,
        height: h,
        depth: 1,
        layers: 0,
        pitch,
        slice_pitch: pitch * h,
    }
}

fn point() -> Sampler {
    Sampler {
        address: [AddressMode::Clamp; 3],
        filter: FilterMode::Point,
        read_as_integer: false,
        normalized_coords: false,
        border_color: [0.0; 4],
        mip: MipSampler::ONE_LEVEL,
    }
}

/// Allocates the module's globals and binds reference `name` to `handle` (stores the handle in
/// the reference's variable); returns the globals' addresses.
fn bind(m: &Module, mem: &TestMemory, name: &str, handle: u64) -> Vec<u64> {
    let g = alloc_globals(m, mem);
    let i = m
        .globals()
        .iter()
        .position(|v| v.name == name)
        .unwrap_or_else(|| panic!("no global `{name}`"));
    mem.write(g[i], &[handle]);
    g
}

fn grid(blocks: u32, threads: u32) -> Config {
    Config::linear(blocks, threads)
}

#[test]
fn globals_list_the_references_with_their_kind() {
    for arch in REF_ARCHS {
        let m = module(arch);
        let refs: Vec<(&str, Option<ReferenceKind>)> = m
            .globals()
            .iter()
            .map(|g| (g.name.as_str(), g.reference))
            .collect();
        let t = Some(ReferenceKind::Texture);
        assert_eq!(
            refs,
            [
                ("tex2", t),
                ("tex1", t),
                ("tex3", t),
                ("texl", t),
                ("surf", Some(ReferenceKind::Surface))
            ],
            "{arch}"
        );
        for g in m.globals() {
            assert_eq!(g.space, GlobalSpace::Global, "{arch} {}", g.name);
            assert_eq!((g.size, g.align), (8, 8), "{arch} {}", g.name);
            assert!(g.init.is_empty() && !g.managed, "{arch} {}", g.name);
        }
    }
    // Ordinary variables are no references.
    let m = Module::load(
        ".version 7.8\n.target sm_52\n.address_size 64\n.global .u64 h;\n.global .texref t;\n",
    )
    .unwrap();
    assert_eq!(m.globals()[0].reference, None);
    assert_eq!(m.globals()[1].reference, Some(ReferenceKind::Texture));
}

#[test]
fn tex2d_through_a_reference_reads_every_texel() {
    let (w, h) = (8usize, 6usize);
    let texels: Vec<f32> = (0..w * h * 4).map(|i| i as f32 * 0.75 - 3.0).collect();
    for arch in REF_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        let base = mem.alloc_from(&texels);
        mem.add_texture(
            TEX,
            TextureView {
                layout: layout(base, ChannelFormat::F32, 4, 2, w as u64, h as u64),
                sampler: point(),
            },
        );
        let out = mem.alloc(w * h * 16);
        let g = bind(&m, &mem, "tex2", TEX);
        run(
            &m,
            "ref_sample2d",
            &grid(h as u32, w as u32),
            &[Arg::U64(out), Arg::I32(w as i32)],
            &mem,
            &g,
        )
        .unwrap_or_else(|f| panic!("{arch}: {f}"));
        assert_eq!(mem.read::<f32>(out, w * h * 4), texels, "{arch}");
    }
}

#[test]
fn tex1dfetch_through_a_reference() {
    let data: Vec<i32> = (0..50).map(|i| i * 7 - 100).collect();
    for arch in REF_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        let base = mem.alloc_from(&data);
        mem.add_texture(
            TEX,
            TextureView {
                layout: layout(base, ChannelFormat::S32, 1, 1, 50, 1),
                sampler: point(),
            },
        );
        let out = mem.alloc(64 * 4);
        let g = bind(&m, &mem, "tex1", TEX);
        run(&m, "ref_fetch1d", &grid(1, 64), &[Arg::U64(out)], &mem, &g)
            .unwrap_or_else(|f| panic!("{arch}: {f}"));
        let got = mem.read::<i32>(out, 64);
        for (i, v) in got.iter().enumerate() {
            let idx = i as i64 - 2;
            let want = if (0..50).contains(&idx) {
                data[idx as usize]
            } else {
                0
            };
            assert_eq!(*v, want, "{arch} thread {i}");
        }
    }
}

#[test]
fn surface_reference_read_modify_write_round_trip() {
    let (w, h) = (8usize, 4usize);
    for arch in REF_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        let vals: Vec<i32> = (0..(w * h) as i32).map(|i| i * 5 - 40).collect();
        let base = mem.alloc_from(&vals);
        mem.add_surface(
            SURF,
            SurfaceView {
                layout: layout(base, ChannelFormat::S32, 1, 2, w as u64, h as u64),
            },
        );
        let g = bind(&m, &mem, "surf", SURF);
        let cfg = Config {
            grid: [1, h as u32, 1],
            block: [w as u32, 1, 1],
            dynamic_shared: 0,
            workers: 1,
        };
        run(&m, "ref_surf_rmw", &cfg, &[Arg::I32(w as i32)], &mem, &g)
            .unwrap_or_else(|f| panic!("{arch}: {f}"));
        let want: Vec<i32> = vals.iter().map(|v| v * 3 - 1).collect();
        assert_eq!(mem.read::<i32>(base, w * h), want, "{arch}");
    }
}

#[test]
fn unbound_references_fault_with_an_illegal_address() {
    for arch in REF_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        // Registered objects, but the references hold 0 (unbound).
        let base = mem.alloc(4096);
        mem.add_texture(
            TEX,
            TextureView {
                layout: layout(base, ChannelFormat::S32, 1, 1, 50, 1),
                sampler: point(),
            },
        );
        mem.add_surface(
            SURF,
            SurfaceView {
                layout: layout(base, ChannelFormat::S32, 1, 2, 8, 4),
            },
        );
        let g = alloc_globals(&m, &mem);
        let out = mem.alloc(64 * 4);
        let f = run(&m, "ref_fetch1d", &grid(1, 32), &[Arg::U64(out)], &mem, &g)
            .expect_err("an unbound texture reference should fault");
        assert_eq!(f.kind, FaultKind::IllegalAddress, "{arch}: {f}");
        assert!(f.message.contains("texture object handle 0x0"), "{f}");
        let f = run(&m, "ref_surf_rmw", &grid(1, 8), &[Arg::I32(8)], &mem, &g)
            .expect_err("an unbound surface reference should fault");
        assert_eq!(f.kind, FaultKind::IllegalAddress, "{arch}: {f}");
        assert!(f.message.contains("surface object handle 0x0"), "{f}");
        // Bound to the other kind's handle: unknown as a texture.
        let g = bind(&m, &mem, "tex1", SURF);
        let f = run(&m, "ref_fetch1d", &grid(1, 32), &[Arg::U64(out)], &mem, &g)
            .expect_err("a surface handle in a texture reference should fault");
        assert_eq!(f.kind, FaultKind::IllegalAddress, "{arch}: {f}");
    }
}

/// A module with references `t` and `s`, an ordinary global `g`, and kernel `k` running `inst`.
fn with_refs(inst: &str) -> String {
    format!(
        ".version 7.8\n.target sm_52\n.address_size 64\n.global .texref t;\n.global .surfref s;\n.global .align 8 .u64 g;\n.visible .entry k(.param .u64 out)\n{{\n.reg .pred %p<2>;\n.reg .f32 %f<8>;\n.reg .b32 %r<8>;\n.reg .b64 %rd<4>;\nld.param.u64 %rd1, [out];\ncvta.to.global.u64 %rd2, %rd1;\n{inst}\nret;\n}}\n"
    )
}

#[test]
fn txq_suq_and_guarded_instructions_take_references() {
    let src = with_refs(
        "txq.width.b32 %r1, [t];\nsuq.height.b32 %r2, [s];\nst.global.v2.u32 [%rd2], {%r1, %r2};\nsetp.ne.s32 %p1, %r1, %r1;\n@%p1 tex.1d.v4.s32.s32 {%r3, %r4, %r5, %r6}, [t, {%r1}];\n@!%p1 suld.b.2d.b32.trap {%r3}, [s, {%r7, %r7}];\nst.global.u32 [%rd2+8], %r3;",
    );
    let m = Module::load(&src).unwrap();
    let mem = TestMemory::new();
    let base = mem.alloc_from(&(0..64).collect::<Vec<i32>>());
    mem.add_texture(
        TEX,
        TextureView {
            layout: layout(base, ChannelFormat::S32, 1, 1, 13, 1),
            sampler: point(),
        },
    );
    mem.add_surface(
        SURF,
        SurfaceView {
            layout: layout(base, ChannelFormat::S32, 1, 2, 8, 5),
        },
    );
    let g = alloc_globals(&m, &mem);
    mem.write(g[0], &[TEX]);
    mem.write(g[1], &[SURF]);
    let out = mem.alloc(12);
    // %r7 is 0: suld reads texel (0, 0); the tex guarded off reads nothing.
    mem.write(out, &[0i32, 0, -1]);
    run(&m, "k", &grid(1, 1), &[Arg::U64(out)], &mem, &g).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(mem.read::<i32>(out, 3), [13, 5, 0]);
}

#[test]
fn mismatched_and_non_reference_handles_are_refused_at_load() {
    for inst in [
        // A texture reference where a surface is expected, and the reverse.
        "suld.b.2d.b32.trap {%r1}, [t, {%r2, %r3}];",
        "sust.b.2d.b32.trap [t, {%r2, %r3}], {%r1};",
        "suq.width.b32 %r1, [t];",
        "tex.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [s, {%f5, %f6}];",
        "tld4.r.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [s, {%f5, %f6}];",
        "txq.width.b32 %r1, [s];",
        // An ordinary variable, a parameter and an undefined name.
        "tex.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [g, {%f5, %f6}];",
        "suld.b.2d.b32.trap {%r1}, [out, {%r2, %r3}];",
        "txq.width.b32 %r1, [nothing];",
        "tex.1d.v4.s32.s32 {%r1, %r2, %r3, %r4}, [nothing, {%r5}];",
    ] {
        let e = Module::load(&with_refs(inst)).unwrap_err();
        assert_eq!(e.kind, LoadErrorKind::InvalidPtx, "{inst}: {e}");
        assert_eq!(e.line, 15, "{inst}");
    }
    // The matching kinds load.
    for inst in [
        "suld.b.2d.b32.trap {%r1}, [s, {%r2, %r3}];",
        "tex.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [t, {%f5, %f6}];",
        "tld4.r.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [t, {%f5, %f6}];",
    ] {
        Module::load(&with_refs(inst)).unwrap_or_else(|e| panic!("{inst}: {e}"));
    }
}

#[test]
fn malformed_reference_declarations_are_refused() {
    let head = ".version 7.8\n.target sm_52\n.address_size 64\n";
    for (decl, kind) in [
        (".global .samplerref sm;", LoadErrorKind::NotSupported),
        (".extern .global .texref t;", LoadErrorKind::NotSupported),
        (".const .texref t;", LoadErrorKind::InvalidPtx),
        (".global .surfref s[2];", LoadErrorKind::InvalidPtx),
        (
            ".visible .entry k()\n{\n.global .texref t;\nret;\n}",
            LoadErrorKind::InvalidPtx,
        ),
        (".texref t;", LoadErrorKind::NotSupported),
        (".tex .u64 t;", LoadErrorKind::NotSupported),
        (
            ".visible .entry k(.param .texref t)\n{\nret;\n}",
            LoadErrorKind::NotSupported,
        ),
    ] {
        let e = Module::load(&format!("{head}{decl}\n")).unwrap_err();
        assert_eq!(e.kind, kind, "{decl}: {e}");
    }
}

#[test]
fn tex3d_and_layered_through_references() {
    let (w, h, d) = (4u64, 3u64, 2u64);
    let texels: Vec<f32> = (0..w * h * d).map(|i| i as f32 + 0.5).collect();
    for arch in REF_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        let base = mem.alloc_from(&texels);
        let mut cube = layout(base, ChannelFormat::F32, 1, 3, w, h);
        cube.depth = d;
        mem.add_texture(
            TEX,
            TextureView {
                layout: cube,
                sampler: point(),
            },
        );
        let mut layers = layout(base, ChannelFormat::F32, 1, 2, w, h);
        layers.layers = d;
        mem.add_texture(
            TEX + 1,
            TextureView {
                layout: layers,
                sampler: point(),
            },
        );
        let out = mem.alloc(8);
        let g = bind(&m, &mem, "tex3", TEX);
        let i = m.globals().iter().position(|v| v.name == "texl").unwrap();
        mem.write(g[i], &[TEX + 1]);
        let at = |x: u64, y: u64, z: u64| texels[(z * h * w + y * w + x) as usize];
        run(
            &m,
            "ref_sample3d",
            &grid(1, 1),
            &[Arg::U64(out), Arg::F32(2.5), Arg::F32(1.5), Arg::F32(1.5)],
            &mem,
            &g,
        )
        .unwrap_or_else(|f| panic!("{arch}: {f}"));
        assert_eq!(mem.read::<f32>(out, 1), [at(2, 1, 1)], "{arch}");
        run(
            &m,
            "ref_layered",
            &grid(1, 1),
            &[Arg::U64(out + 4), Arg::F32(3.5), Arg::F32(2.5), Arg::I32(1)],
            &mem,
            &g,
        )
        .unwrap_or_else(|f| panic!("{arch}: {f}"));
        assert_eq!(mem.read::<f32>(out + 4, 1), [at(3, 2, 1)], "{arch}");
    }
}
