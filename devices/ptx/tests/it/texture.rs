//! Texture and surface objects: `tex`, `tld4`, `txq`, `suld`, `sust` and `suq` in kernels
//! compiled by nvcc 11.8 (`fixtures/texture/textures.cu`), against references computed here.

use vgpu_ptx::testutils::*;
use vgpu_ptx::texture::*;
use vgpu_ptx::*;

/// The architectures the texture fixture is compiled for.
const TEX_ARCHS: [&str; 3] = ["compute_52", "compute_70", "compute_90"];
/// Handles the tests register (any 64-bit values do).
const TEX: u64 = 0x7e00_0001;
const TEX_B: u64 = 0x7e00_0002;
const SURF: u64 = 0x5f00_0001;
const SURF_B: u64 = 0x5f00_0002;
const SURF_C: u64 = 0x5f00_0003;

fn module(arch: &str) -> Module {
    load_fixture("texture/textures", arch)
}

/// A tightly packed layout (rows of `w` texels, slices of `h` rows).
#[allow(clippy::too_many_arguments)]
fn layout(
    base: u64,
    format: ChannelFormat,
    channels: u8,
    dims: u8,
    w: u64,
    h: u64,
    d: u64,
    layers: u64,
) -> Layout {
    let pitch = w * format.bytes() * u64::from(channels);
    Layout {
        base,
        format,
        channels,
        dims,
        width: w,
        height: h,
        depth: d,
        layers,
        pitch,
        slice_pitch: pitch * h,
    }
}

fn sampler(filter: FilterMode, normalized: bool, mode: AddressMode) -> Sampler {
    Sampler {
        address: [mode; 3],
        filter,
        read_as_integer: false,
        normalized_coords: normalized,
        border_color: [0.5, 0.25, 0.125, 1.0],
        mip: MipSampler::ONE_LEVEL,
    }
}

fn point() -> Sampler {
    sampler(FilterMode::Point, false, AddressMode::Clamp)
}

fn launch(m: &Module, mem: &TestMemory, kernel: &str, threads: u32, args: &[Arg]) {
    let g = alloc_globals(m, mem);
    run(m, kernel, &Config::linear(1, threads), args, mem, &g)
        .unwrap_or_else(|f| panic!("{kernel}: {f}"));
}

fn launch_err(m: &Module, mem: &TestMemory, kernel: &str, threads: u32, args: &[Arg]) -> Fault {
    let g = alloc_globals(m, mem);
    run(m, kernel, &Config::linear(1, threads), args, mem, &g).expect_err("the launch should fault")
}

/// The four channels of every texel of `out` (float4 results).
fn float4s(mem: &TestMemory, out: u64, n: usize) -> Vec<[f32; 4]> {
    mem.read::<f32>(out, n * 4)
        .chunks_exact(4)
        .map(|c| [c[0], c[1], c[2], c[3]])
        .collect()
}

/// Linear interpolation weight as the hardware computes it: the fraction of `x - 0.5` in steps
/// of 1/256.
fn weight(x: f32) -> (i64, f32) {
    let xb = x - 0.5;
    let i = xb.floor();
    (i as i64, ((xb - i) * 256.0).round() / 256.0)
}

#[test]
fn fetch_1d_by_index_from_linear_memory() {
    for arch in TEX_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        let data: Vec<f32> = (0..50).map(|i| i as f32 * 1.5 + 1.0).collect();
        let base = mem.alloc_from(&data);
        mem.add_texture(
            TEX,
            TextureView {
                layout: layout(base, ChannelFormat::F32, 1, 1, 50, 1, 1, 0),
                sampler: point(),
            },
        );
        let out = mem.alloc(64 * 4);
        // out[i] = tex1Dfetch(t, i - 2): indices -2 to 61, the ends out of range.
        launch(
            &m,
            &mem,
            "fetch1d",
            64,
            &[Arg::U64(TEX), Arg::U64(out), Arg::I32(50)],
        );
        let got = mem.read::<f32>(out, 64);
        for (i, g) in got.iter().enumerate() {
            let idx = i as i64 - 2;
            let want = if (0..50).contains(&idx) {
                data[idx as usize]
            } else {
                0.0
            };
            assert_eq!(*g, want, "{arch} thread {i}");
        }
    }
}

#[test]
fn point_sampling_2d_unnormalized_reads_every_texel() {
    let (w, h) = (8usize, 6usize);
    let texels: Vec<f32> = (0..w * h * 4).map(|i| i as f32 + 0.25).collect();
    for arch in TEX_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        let base = mem.alloc_from(&texels);
        mem.add_texture(
            TEX,
            TextureView {
                layout: layout(base, ChannelFormat::F32, 4, 2, w as u64, h as u64, 1, 0),
                sampler: point(),
            },
        );
        let n = w * h;
        // Anywhere inside a texel selects it: floor of the coordinate.
        let xs: Vec<f32> = (0..n)
            .map(|i| (i % w) as f32 + 0.1 + 0.8 * (i % 3) as f32 / 2.0)
            .collect();
        let ys: Vec<f32> = (0..n)
            .map(|i| (i / w) as f32 + 0.99 * (i % 2) as f32)
            .collect();
        let (xa, ya) = (mem.alloc_from(&xs), mem.alloc_from(&ys));
        let out = mem.alloc(n * 16);
        launch(
            &m,
            &mem,
            "sample2d",
            n as u32,
            &[
                Arg::U64(TEX),
                Arg::U64(out),
                Arg::I32(w as i32),
                Arg::U64(xa),
                Arg::U64(ya),
            ],
        );
        for (i, t) in float4s(&mem, out, n).iter().enumerate() {
            let at = (i / w * w + i % w) * 4;
            assert_eq!(t, &texels[at..at + 4], "{arch} thread {i}");
        }
    }
}

#[test]
fn linear_filtering_2d_matches_reference_with_8_bit_weights() {
    let (w, h) = (5usize, 4usize);
    let texels: Vec<f32> = (0..w * h)
        .map(|i| ((i * 37) % 23) as f32 * 0.75 - 3.0)
        .collect();
    let at = |x: i64, y: i64| {
        texels[(y.clamp(0, h as i64 - 1) as usize) * w + x.clamp(0, w as i64 - 1) as usize]
    };
    let coords: Vec<(f32, f32)> = vec![
        (0.5, 0.5),
        (1.3, 2.2),
        (2.8, 1.0),
        (3.1, 3.7),
        (4.9, 0.1),
        (-0.7, 2.6),
        (1.77, 0.93),
        (2.0, 2.0),
    ];
    for arch in TEX_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        let base = mem.alloc_from(&texels);
        mem.add_texture(
            TEX,
            TextureView {
                layout: layout(base, ChannelFormat::F32, 1, 2, w as u64, h as u64, 1, 0),
                sampler: sampler(FilterMode::Linear, false, AddressMode::Clamp),
            },
        );
        let n = coords.len();
        let xa = mem.alloc_from(&coords.iter().map(|c| c.0).collect::<Vec<_>>());
        let ya = mem.alloc_from(&coords.iter().map(|c| c.1).collect::<Vec<_>>());
        let out = mem.alloc(n * 16);
        launch(
            &m,
            &mem,
            "sample2d",
            n as u32,
            &[
                Arg::U64(TEX),
                Arg::U64(out),
                Arg::I32(w as i32),
                Arg::U64(xa),
                Arg::U64(ya),
            ],
        );
        let got = float4s(&mem, out, n);
        for (k, &(x, y)) in coords.iter().enumerate() {
            let (i, a) = weight(x);
            let (j, b) = weight(y);
            let want = (1.0 - a) * (1.0 - b) * at(i, j)
                + a * (1.0 - b) * at(i + 1, j)
                + (1.0 - a) * b * at(i, j + 1)
                + a * b * at(i + 1, j + 1);
            assert!(
                (got[k][0] - want).abs() <= 1e-5,
                "{arch} ({x}, {y}): {} != {want}",
                got[k][0]
            );
            assert_eq!(&got[k][1..], &[0.0, 0.0, 1.0], "{arch}: missing channels");
        }
        // (1.3, 2.2): α = 0.8 and β = 0.7 are not multiples of 1/256; unquantized weights
        // would give a visibly different value.
        let exact = {
            let (a, b) = (0.8f32, 0.7f32);
            (1.0 - a) * (1.0 - b) * at(0, 1)
                + a * (1.0 - b) * at(1, 1)
                + (1.0 - a) * b * at(0, 2)
                + a * b * at(1, 2)
        };
        assert!(
            (got[1][0] - exact).abs() > 1e-4,
            "{arch}: weights were not quantized"
        );
    }
}

#[test]
fn normalized_coordinates_wrap_clamp_mirror_and_border() {
    let texels = [10f32, 20.0, 30.0, 40.0];
    let us = [-0.1f32, 1.1, 1.3, -0.3, 0.5, 0.99];
    // Texel-space x = 4u: -0.4, 4.4, 5.2, -1.2, 2.0, 3.96.
    let cases = [
        (AddressMode::Wrap, [40f32, 10.0, 20.0, 30.0, 30.0, 40.0]),
        (AddressMode::Clamp, [10.0, 40.0, 40.0, 10.0, 30.0, 40.0]),
        (AddressMode::Mirror, [10.0, 40.0, 30.0, 20.0, 30.0, 40.0]),
        (AddressMode::Border, [0.5, 0.5, 0.5, 0.5, 30.0, 40.0]),
    ];
    for arch in TEX_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        let base = mem.alloc_from(&texels);
        let xa = mem.alloc_from(&us);
        let out = mem.alloc(us.len() * 16);
        for (mode, want) in cases {
            mem.add_texture(
                TEX,
                TextureView {
                    layout: layout(base, ChannelFormat::F32, 1, 1, 4, 1, 1, 0),
                    sampler: sampler(FilterMode::Point, true, mode),
                },
            );
            launch(
                &m,
                &mem,
                "sample1d",
                us.len() as u32,
                &[Arg::U64(TEX), Arg::U64(out), Arg::U64(xa)],
            );
            let got = float4s(&mem, out, us.len());
            for (k, g) in got.iter().enumerate() {
                assert_eq!(g[0], want[k], "{arch} {mode:?} u = {}", us[k]);
                let rest = if mode == AddressMode::Border && want[k] == 0.5 {
                    [0.25, 0.125, 1.0]
                } else {
                    [0.0, 0.0, 1.0]
                };
                assert_eq!(g[1..], rest, "{arch} {mode:?} u = {}", us[k]);
            }
        }
        // Wrap with unnormalized coordinates acts as clamp.
        mem.add_texture(
            TEX,
            TextureView {
                layout: layout(base, ChannelFormat::F32, 1, 1, 4, 1, 1, 0),
                sampler: sampler(FilterMode::Point, false, AddressMode::Wrap),
            },
        );
        let xs = [-3.0f32, 5.5, 6.0, 1.5, 0.0, 3.9];
        let xa = mem.alloc_from(&xs);
        launch(
            &m,
            &mem,
            "sample1d",
            xs.len() as u32,
            &[Arg::U64(TEX), Arg::U64(out), Arg::U64(xa)],
        );
        let got: Vec<f32> = float4s(&mem, out, xs.len()).iter().map(|t| t[0]).collect();
        assert_eq!(got, [10.0, 40.0, 40.0, 20.0, 10.0, 40.0], "{arch}");
    }
}

#[test]
fn u8_channels_read_as_normalized_float_and_as_integer() {
    let (w, h) = (4usize, 2usize);
    let bytes: Vec<u8> = (0..w * h * 4).map(|i| (i * 29 % 256) as u8).collect();
    for arch in TEX_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        let base = mem.alloc_from(&bytes);
        let lay = layout(base, ChannelFormat::U8, 4, 2, w as u64, h as u64, 1, 0);
        let n = w * h;
        let xs: Vec<f32> = (0..n).map(|i| (i % w) as f32 + 0.5).collect();
        let ys: Vec<f32> = (0..n).map(|i| (i / w) as f32 + 0.5).collect();
        let (xa, ya) = (mem.alloc_from(&xs), mem.alloc_from(&ys));
        let out = mem.alloc(n * 16);
        mem.add_texture(
            TEX,
            TextureView {
                layout: lay,
                sampler: point(),
            },
        );
        launch(
            &m,
            &mem,
            "sample2d",
            n as u32,
            &[
                Arg::U64(TEX),
                Arg::U64(out),
                Arg::I32(w as i32),
                Arg::U64(xa),
                Arg::U64(ya),
            ],
        );
        for (i, t) in float4s(&mem, out, n).iter().enumerate() {
            let want: Vec<f32> = bytes[i * 4..i * 4 + 4]
                .iter()
                .map(|&b| f32::from(b) / 255.0)
                .collect();
            assert_eq!(&t[..], &want[..], "{arch} normalized texel {i}");
        }
        let mut s = point();
        s.read_as_integer = true;
        mem.add_texture(
            TEX,
            TextureView {
                layout: lay,
                sampler: s,
            },
        );
        launch(
            &m,
            &mem,
            "sample2d_int",
            n as u32,
            &[Arg::U64(TEX), Arg::U64(out), Arg::U64(xa), Arg::U64(ya)],
        );
        let got = mem.read::<u32>(out, n * 4);
        let want: Vec<u32> = bytes.iter().map(|&b| u32::from(b)).collect();
        assert_eq!(got, want, "{arch} integer texels");
    }
}

#[test]
fn sample_3d_point_and_trilinear() {
    let (w, h, d) = (3usize, 3usize, 4usize);
    let texels: Vec<f32> = (0..w * h * d).map(|i| (i * i % 17) as f32).collect();
    let at = |x: i64, y: i64, z: i64| {
        let c = |v: i64, n: usize| v.clamp(0, n as i64 - 1) as usize;
        texels[(c(z, d) * h + c(y, h)) * w + c(x, w)]
    };
    let coords = [
        (0.5f32, 0.5f32, 0.5f32),
        (2.5, 1.5, 3.5),
        (1.2, 2.7, 1.9),
        (0.9, 0.3, 2.45),
    ];
    for arch in TEX_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        let base = mem.alloc_from(&texels);
        let lay = layout(
            base,
            ChannelFormat::F32,
            1,
            3,
            w as u64,
            h as u64,
            d as u64,
            0,
        );
        let xa = mem.alloc_from(&coords.map(|c| c.0));
        let ya = mem.alloc_from(&coords.map(|c| c.1));
        let za = mem.alloc_from(&coords.map(|c| c.2));
        let out = mem.alloc(coords.len() * 16);
        let args = [
            Arg::U64(TEX),
            Arg::U64(out),
            Arg::U64(xa),
            Arg::U64(ya),
            Arg::U64(za),
        ];
        mem.add_texture(
            TEX,
            TextureView {
                layout: lay,
                sampler: point(),
            },
        );
        launch(&m, &mem, "sample3d", coords.len() as u32, &args);
        for (k, t) in float4s(&mem, out, coords.len()).iter().enumerate() {
            let (x, y, z) = coords[k];
            assert_eq!(t[0], at(x as i64, y as i64, z as i64), "{arch} point {k}");
        }
        mem.add_texture(
            TEX,
            TextureView {
                layout: lay,
                sampler: sampler(FilterMode::Linear, false, AddressMode::Clamp),
            },
        );
        launch(&m, &mem, "sample3d", coords.len() as u32, &args);
        for (k, t) in float4s(&mem, out, coords.len()).iter().enumerate() {
            let (x, y, z) = coords[k];
            let ((i, a), (j, b), (l, c)) = (weight(x), weight(y), weight(z));
            let mut want = 0.0;
            for (dz, wz) in [(0, 1.0 - c), (1, c)] {
                for (dy, wy) in [(0, 1.0 - b), (1, b)] {
                    for (dx, wx) in [(0, 1.0 - a), (1, a)] {
                        want += wx * wy * wz * at(i + dx, j + dy, l + dz);
                    }
                }
            }
            assert!(
                (t[0] - want).abs() <= 1e-4,
                "{arch} linear {k}: {} != {want}",
                t[0]
            );
        }
    }
}

#[test]
fn layered_textures_select_and_clamp_the_layer() {
    let (w, h, layers) = (4usize, 3usize, 3usize);
    let texels: Vec<f32> = (0..w * h * layers).map(|i| i as f32).collect();
    let probes = [
        (0.5f32, 0.5f32, 0i32),
        (3.5, 2.5, 1),
        (1.5, 1.5, 2),
        (2.5, 0.5, 7),
        (0.5, 2.5, -1),
    ];
    for arch in TEX_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        let base = mem.alloc_from(&texels);
        mem.add_texture(
            TEX,
            TextureView {
                layout: layout(
                    base,
                    ChannelFormat::F32,
                    1,
                    2,
                    w as u64,
                    h as u64,
                    1,
                    layers as u64,
                ),
                sampler: point(),
            },
        );
        let xa = mem.alloc_from(&probes.map(|p| p.0));
        let ya = mem.alloc_from(&probes.map(|p| p.1));
        let la = mem.alloc_from(&probes.map(|p| p.2));
        let out = mem.alloc(probes.len() * 16);
        launch(
            &m,
            &mem,
            "layered2d",
            probes.len() as u32,
            &[
                Arg::U64(TEX),
                Arg::U64(out),
                Arg::U64(xa),
                Arg::U64(ya),
                Arg::U64(la),
            ],
        );
        for (k, t) in float4s(&mem, out, probes.len()).iter().enumerate() {
            let (x, y, l) = probes[k];
            let l = l.clamp(0, layers as i32 - 1) as usize;
            assert_eq!(
                t[0],
                texels[l * w * h + y as usize * w + x as usize],
                "{arch} probe {k}"
            );
        }
        // 1-D layered: layers of 4 texels.
        mem.add_texture(
            TEX,
            TextureView {
                layout: layout(base, ChannelFormat::F32, 1, 1, 4, 1, 1, 9),
                sampler: point(),
            },
        );
        let out1 = mem.alloc(probes.len() * 4);
        launch(
            &m,
            &mem,
            "layered1d",
            probes.len() as u32,
            &[Arg::U64(TEX), Arg::U64(out1), Arg::U64(xa), Arg::U64(la)],
        );
        let got = mem.read::<f32>(out1, probes.len());
        for (k, g) in got.iter().enumerate() {
            let (x, _, l) = probes[k];
            let l = l.clamp(0, 8) as usize;
            assert_eq!(
                *g,
                texels[l * 4 + x as usize],
                "{arch} 1-D layered probe {k}"
            );
        }
    }
}

#[test]
fn tld4_gathers_the_bilinear_footprint() {
    let (w, h) = (4usize, 4usize);
    // Two channels: r = index, g = 100 + index.
    let texels: Vec<f32> = (0..w * h)
        .flat_map(|i| [i as f32, 100.0 + i as f32])
        .collect();
    let coords = [(1.6f32, 2.4f32), (0.2, 0.2), (3.9, 1.5)];
    for arch in TEX_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        let base = mem.alloc_from(&texels);
        mem.add_texture(
            TEX,
            TextureView {
                layout: layout(base, ChannelFormat::F32, 2, 2, w as u64, h as u64, 1, 0),
                sampler: point(),
            },
        );
        let xa = mem.alloc_from(&coords.map(|c| c.0));
        let ya = mem.alloc_from(&coords.map(|c| c.1));
        let out = mem.alloc(coords.len() * 16);
        for comp in [0, 1] {
            launch(
                &m,
                &mem,
                "gather",
                coords.len() as u32,
                &[
                    Arg::U64(TEX),
                    Arg::U64(out),
                    Arg::U64(xa),
                    Arg::U64(ya),
                    Arg::I32(comp),
                ],
            );
            for (k, t) in float4s(&mem, out, coords.len()).iter().enumerate() {
                let (x, y) = coords[k];
                let (i, j) = ((x - 0.5).floor() as i64, (y - 0.5).floor() as i64);
                let c = |x: i64, y: i64| {
                    let idx =
                        y.clamp(0, h as i64 - 1) as usize * w + x.clamp(0, w as i64 - 1) as usize;
                    texels[idx * 2 + comp as usize]
                };
                // Counter-clockwise from the lower left.
                let want = [c(i, j + 1), c(i + 1, j + 1), c(i + 1, j), c(i, j)];
                assert_eq!(t, &want, "{arch} comp {comp} at ({x}, {y})");
            }
        }
    }
}

/// A `w`×`h` surface of `i32` texels holding 0, 1, 2, … and its base.
fn int_surface(mem: &TestMemory, w: usize, h: usize) -> (u64, Vec<i32>) {
    let vals: Vec<i32> = (0..(w * h) as i32).map(|i| i * 3 + 1).collect();
    let base = mem.alloc_from(&vals);
    mem.add_surface(
        SURF,
        SurfaceView {
            layout: layout(base, ChannelFormat::S32, 1, 2, w as u64, h as u64, 1, 0),
        },
    );
    (base, vals)
}

#[test]
fn surf2d_read_modify_write_round_trip() {
    let (w, h) = (8usize, 4usize);
    for arch in TEX_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        let vals: Vec<f32> = (0..w * h).map(|i| i as f32 * 0.5 - 2.0).collect();
        let base = mem.alloc_from(&vals);
        mem.add_surface(
            SURF,
            SurfaceView {
                layout: layout(base, ChannelFormat::F32, 1, 2, w as u64, h as u64, 1, 0),
            },
        );
        let g = alloc_globals(&m, &mem);
        let cfg = Config {
            grid: [1, h as u32, 1],
            block: [w as u32, 1, 1],
            dynamic_shared: 0,
            workers: 1,
        };
        run(
            &m,
            "surf_rmw",
            &cfg,
            &[Arg::U64(SURF), Arg::I32(w as i32), Arg::I32(h as i32)],
            &mem,
            &g,
        )
        .unwrap_or_else(|f| panic!("{arch}: {f}"));
        let got = mem.read::<f32>(base, w * h);
        let want: Vec<f32> = vals.iter().map(|v| v * 2.0 + 1.0).collect();
        assert_eq!(got, want, "{arch}");
    }
}

#[test]
fn surface_trap_zero_and_clamp_out_of_range() {
    let (w, h) = (8usize, 4usize);
    for arch in TEX_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        let (base, vals) = int_surface(&mem, w, h);
        let out = mem.alloc(4);
        let args = |x: i32, y: i32| [Arg::U64(SURF), Arg::I32(x), Arg::I32(y), Arg::U64(out)];
        // `.trap`: in range reads (x in bytes), out of range faults.
        launch(&m, &mem, "surf_oob", 1, &args(28, 3));
        assert_eq!(mem.read::<i32>(out, 1)[0], vals[3 * w + 7], "{arch}");
        for (x, y) in [(32, 0), (0, 4), (-4, 0), (29, 0), (0, -1)] {
            let f = launch_err(&m, &mem, "surf_oob", 1, &args(x, y));
            assert_eq!(f.kind, FaultKind::IllegalAddress, "{arch} ({x}, {y}): {f}");
        }
        // `.zero`: out of range loads 0 and drops the store.
        mem.write(out, &[-1i32]);
        launch(&m, &mem, "surf_zero", 1, &args(-4, 1));
        assert_eq!(mem.read::<i32>(out, 1)[0], 0, "{arch}");
        assert_eq!(
            mem.read::<i32>(base, w * h),
            vals,
            "{arch}: a dropped store wrote"
        );
        launch(&m, &mem, "surf_zero", 1, &args(4, 1));
        assert_eq!(mem.read::<i32>(out, 1)[0], vals[w + 1], "{arch}");
        assert_eq!(
            mem.read::<i32>(base + (w as u64 + 1) * 4, 1)[0],
            7,
            "{arch}"
        );
        // `.clamp`: the nearest texel inside.
        let (base, vals) = int_surface(&mem, w, h);
        launch(&m, &mem, "surf_clamp", 1, &args(1000, 10));
        assert_eq!(mem.read::<i32>(out, 1)[0], vals[w * h - 1], "{arch}");
        assert_eq!(
            mem.read::<i32>(base + (w * h - 1) as u64 * 4, 1)[0],
            7,
            "{arch}"
        );
        launch(&m, &mem, "surf_clamp", 1, &args(-8, -3));
        assert_eq!(mem.read::<i32>(out, 1)[0], vals[0], "{arch}");
        assert_eq!(mem.read::<i32>(base, 1)[0], 7, "{arch}");
    }
}

#[test]
fn surface_vectors_1d_3d_and_layered() {
    for arch in TEX_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        // 1-D uchar4, 8 texels: each thread reverses its texel's bytes.
        let bytes: Vec<u8> = (0..32u8).collect();
        let b1 = mem.alloc_from(&bytes);
        mem.add_surface(
            SURF,
            SurfaceView {
                layout: layout(b1, ChannelFormat::U8, 4, 1, 8, 1, 1, 0),
            },
        );
        // 3-D short2, 8×2×2: threads swap the halves of row (y 1, z 1).
        let shorts: Vec<i16> = (0..64).map(|i| i as i16 * 11 - 300).collect();
        let b3 = mem.alloc_from(&shorts);
        mem.add_surface(
            SURF_B,
            SurfaceView {
                layout: layout(b3, ChannelFormat::S16, 2, 3, 8, 2, 2, 0),
            },
        );
        // 2-D layered float4, 8×1, 2 layers: layer 1 copied to layer 0.
        let floats: Vec<f32> = (0..64).map(|i| i as f32 + 0.5).collect();
        let bl = mem.alloc_from(&floats);
        mem.add_surface(
            SURF_C,
            SurfaceView {
                layout: layout(bl, ChannelFormat::F32, 4, 2, 8, 1, 1, 2),
            },
        );
        let out = mem.alloc(8 * 4);
        launch(
            &m,
            &mem,
            "surf_misc",
            8,
            &[
                Arg::U64(SURF),
                Arg::U64(SURF_B),
                Arg::U64(SURF_C),
                Arg::U64(out),
            ],
        );
        let want1: Vec<u8> = bytes
            .chunks(4)
            .flat_map(|c| [c[3], c[2], c[1], c[0]])
            .collect();
        assert_eq!(mem.read::<u8>(b1, 32), want1, "{arch} 1-D");
        assert_eq!(mem.read::<u8>(out, 32), bytes, "{arch} 1-D values read");
        let mut want3 = shorts.clone();
        let row = (8 * 2 + 8) * 2; // z 1, y 1, in shorts
        for t in 0..8 {
            want3.swap(row + t * 2, row + t * 2 + 1);
        }
        assert_eq!(mem.read::<i16>(b3, 64), want3, "{arch} 3-D");
        let mut wantl = floats.clone();
        wantl.copy_within(32..64, 0);
        assert_eq!(mem.read::<f32>(bl, 64), wantl, "{arch} layered");
    }
}

#[test]
fn unknown_handles_and_texels_outside_memory_fault() {
    for arch in TEX_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        let out = mem.alloc(64 * 4);
        let f = launch_err(
            &m,
            &mem,
            "fetch1d",
            32,
            &[Arg::U64(TEX_B), Arg::U64(out), Arg::I32(4)],
        );
        assert_eq!(f.kind, FaultKind::IllegalAddress, "{arch}: {f}");
        assert!(f.message.contains("texture object handle"), "{f}");
        let f = launch_err(
            &m,
            &mem,
            "surf_oob",
            1,
            &[Arg::U64(SURF_B), Arg::I32(0), Arg::I32(0), Arg::U64(out)],
        );
        assert_eq!(f.kind, FaultKind::IllegalAddress, "{arch}: {f}");
        // A view whose texels lie past its allocation.
        let small = mem.alloc(16);
        mem.add_texture(
            TEX,
            TextureView {
                layout: layout(small, ChannelFormat::F32, 1, 1, 64, 1, 1, 0),
                sampler: point(),
            },
        );
        let f = launch_err(
            &m,
            &mem,
            "fetch1d",
            32,
            &[Arg::U64(TEX), Arg::U64(out), Arg::I32(64)],
        );
        assert_eq!(f.kind, FaultKind::IllegalAddress, "{arch}: {f}");
        mem.add_surface(
            SURF,
            SurfaceView {
                layout: layout(small, ChannelFormat::S32, 1, 2, 8, 8, 1, 0),
            },
        );
        let f = launch_err(
            &m,
            &mem,
            "surf_oob",
            1,
            &[Arg::U64(SURF), Arg::I32(0), Arg::I32(5), Arg::U64(out)],
        );
        assert_eq!(f.kind, FaultKind::IllegalAddress, "{arch}: {f}");
    }
}

#[test]
fn txq_and_suq_report_sizes() {
    for arch in TEX_ARCHS {
        let m = module(arch);
        let mem = TestMemory::new();
        let base = mem.alloc(4096);
        mem.add_texture(
            TEX,
            TextureView {
                layout: layout(base, ChannelFormat::F32, 1, 3, 7, 5, 3, 0),
                sampler: point(),
            },
        );
        mem.add_surface(
            SURF,
            SurfaceView {
                layout: layout(base, ChannelFormat::U8, 4, 2, 11, 9, 1, 0),
            },
        );
        let out = mem.alloc(5 * 4);
        launch(
            &m,
            &mem,
            "query",
            1,
            &[Arg::U64(TEX), Arg::U64(SURF), Arg::U64(out)],
        );
        assert_eq!(mem.read::<i32>(out, 5), [7, 5, 3, 11, 9], "{arch}");
    }
}

/// Hand-written PTX in nvcc's style for forms the C++ fixture does not produce.
const HAND_PTX: &str = r#"
.version 7.8
.target sm_70
.address_size 64

.visible .entry queries(.param .u64 t, .param .u64 s, .param .u64 out)
{
	.reg .b32 	%r<10>;
	.reg .b64 	%rd<5>;
	ld.param.u64 	%rd1, [t];
	ld.param.u64 	%rd2, [s];
	ld.param.u64 	%rd3, [out];
	cvta.to.global.u64 	%rd4, %rd3;
	txq.normalized_coords.b32 	%r1, [%rd1];
	txq.filter_mode.b32 	%r2, [%rd1];
	txq.addr_mode_0.b32 	%r3, [%rd1];
	txq.addr_mode_1.b32 	%r4, [%rd1];
	txq.addr_mode_2.b32 	%r5, [%rd1];
	txq.array_size.b32 	%r6, [%rd1];
	suq.depth.b32 	%r7, [%rd2];
	suq.array_size.b32 	%r8, [%rd2];
	st.global.v4.u32 	[%rd4], {%r1, %r2, %r3, %r4};
	st.global.v4.u32 	[%rd4+16], {%r5, %r6, %r7, %r8};
	ret;
}

.visible .entry int_coords(.param .u64 t, .param .u64 out, .param .u32 x, .param .u32 y)
{
	.reg .b32 	%r<10>;
	.reg .b64 	%rd<4>;
	ld.param.u64 	%rd1, [t];
	ld.param.u64 	%rd2, [out];
	ld.param.u32 	%r1, [x];
	ld.param.u32 	%r2, [y];
	cvta.to.global.u64 	%rd3, %rd2;
	tex.2d.v4.s32.s32 	{%r3, %r4, %r5, %r6}, [%rd1, {%r1, %r2}];
	st.global.v4.u32 	[%rd3], {%r3, %r4, %r5, %r6};
	ret;
}

.visible .entry gather_layered(.param .u64 t, .param .u64 out, .param .f32 x, .param .f32 y, .param .u32 l)
{
	.reg .f32 	%f<10>;
	.reg .b32 	%r<2>;
	.reg .b64 	%rd<4>;
	ld.param.u64 	%rd1, [t];
	ld.param.u64 	%rd2, [out];
	ld.param.f32 	%f1, [x];
	ld.param.f32 	%f2, [y];
	ld.param.u32 	%r1, [l];
	cvta.to.global.u64 	%rd3, %rd2;
	tld4.a.a2d.v4.f32.f32 	{%f3, %f4, %f5, %f6}, [%rd1, {%r1, %f1, %f2, %f2}];
	st.global.v4.f32 	[%rd3], {%f3, %f4, %f5, %f6};
	ret;
}
"#;

#[test]
fn txq_suq_sampler_queries_integer_fetches_and_layered_gather() {
    let m = Module::load(HAND_PTX).unwrap();
    let mem = TestMemory::new();
    // S16 channels read as integers: negative values sign-extend into .s32 results.
    let shorts: Vec<i16> = (0..24).map(|i| i as i16 * 1000 - 20000).collect();
    let base = mem.alloc_from(&shorts);
    let mut s = sampler(FilterMode::Linear, true, AddressMode::Mirror);
    s.address[1] = AddressMode::Border;
    s.read_as_integer = true;
    mem.add_texture(
        TEX,
        TextureView {
            layout: layout(base, ChannelFormat::S16, 2, 2, 3, 4, 1, 0),
            sampler: s,
        },
    );
    mem.add_surface(
        SURF,
        SurfaceView {
            layout: layout(base, ChannelFormat::U8, 1, 3, 4, 2, 3, 0),
        },
    );
    let out = mem.alloc(64);
    launch(
        &m,
        &mem,
        "queries",
        1,
        &[Arg::U64(TEX), Arg::U64(SURF), Arg::U64(out)],
    );
    // normalized, linear, mirror (2), border (3), mirror, not layered, depth 3, no layers.
    assert_eq!(mem.read::<u32>(out, 8), [1, 1, 2, 3, 2, 0, 3, 0]);
    launch(
        &m,
        &mem,
        "int_coords",
        1,
        &[Arg::U64(TEX), Arg::U64(out), Arg::U32(2), Arg::U32(1)],
    );
    let at = (3 + 2) * 2;
    let want = [i32::from(shorts[at]), i32::from(shorts[at + 1]), 0, 1];
    assert_eq!(mem.read::<i32>(out, 4), want);
    assert!(want[0] < 0, "the test should read a negative texel");
    launch(
        &m,
        &mem,
        "int_coords",
        1,
        &[Arg::U64(TEX), Arg::U64(out), Arg::U32(3), Arg::U32(0)],
    );
    assert_eq!(mem.read::<i32>(out, 4), [0; 4], "out of range: zeros");
    // tld4.a on a layered four-channel float texture: alpha of layer 1 (clamped from 5).
    let floats: Vec<f32> = (0..2 * 2 * 2 * 4).map(|i| i as f32).collect();
    let fb = mem.alloc_from(&floats);
    mem.add_texture(
        TEX_B,
        TextureView {
            layout: layout(fb, ChannelFormat::F32, 4, 2, 2, 2, 1, 2),
            sampler: point(),
        },
    );
    launch(
        &m,
        &mem,
        "gather_layered",
        1,
        &[
            Arg::U64(TEX_B),
            Arg::U64(out),
            Arg::F32(1.0),
            Arg::F32(1.0),
            Arg::U32(5),
        ],
    );
    let a = |x: usize, y: usize| floats[16 + (y * 2 + x) * 4 + 3];
    assert_eq!(
        mem.read::<f32>(out, 4),
        [a(0, 1), a(1, 1), a(1, 0), a(0, 0)]
    );
}

#[test]
fn unsupported_texture_forms_are_refused_at_load() {
    let body = |inst: &str| {
        format!(
            ".version 7.8\n.target sm_70\n.address_size 64\n.visible .entry k(.param .u64 t)\n{{\n.reg .f32 %f<8>;\n.reg .b32 %r<4>;\n.reg .b64 %rd<2>;\nld.param.u64 %rd1, [t];\n{inst}\nret;\n}}\n"
        )
    };
    for inst in [
        "tld4.r.cube.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd1, {%f5, %f6, %f7, %f7}];",
        "tex.cube.v4.f32.s32 {%f1, %f2, %f3, %f4}, [%rd1, {%r1, %r2, %r3, %r3}];",
        "tex.level.2d.v4.f32.s32 {%f1, %f2, %f3, %f4}, [%rd1, {%r1, %r2}], %f7;",
        "tex.2dms.v4.f32.s32 {%f1, %f2, %f3, %f4}, [%rd1, {%r1, %r2, %r3, %r3}];",
        "sust.p.2d.b32.trap [%rd1, {%r1, %r2}], {%r3};",
        "txq.channel_order.b32 %r1, [%rd1];",
    ] {
        let e = Module::load(&body(inst)).unwrap_err();
        assert_eq!(e.kind, LoadErrorKind::NotSupported, "{inst}: {e}");
        assert_eq!(e.line, 10, "{inst}");
    }
    // The supported forms of the same shape load.
    for inst in [
        "tex.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd1, {%f5, %f6}];",
        "tex.level.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd1, {%f5, %f6}], %f7;",
        "tex.cube.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd1, {%f5, %f6, %f7, %f7}];",
    ] {
        Module::load(&body(inst)).unwrap();
    }
    // A level or gradient operand missing or of the wrong shape is an error of the program.
    for inst in [
        "tex.level.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd1, {%f5, %f6}];",
        "tex.grad.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd1, {%f5, %f6}], {%f7}, {%f7};",
        "tex.grad.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [%rd1, {%f5, %f6}], {%f7, %f7};",
    ] {
        let e = Module::load(&body(inst)).unwrap_err();
        assert_ne!(e.kind, LoadErrorKind::NotSupported, "{inst}: {e}");
    }
}
