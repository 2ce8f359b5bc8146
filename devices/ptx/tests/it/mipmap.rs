//! Mipmapped textures: `tex.level`, `tex.grad` and `tex.base` in kernels compiled by nvcc 11.8
//! (`fixtures/texture/mipmaps.cu`), choosing and blending levels as the sampler says.

use vgpu_ptx::testutils::*;
use vgpu_ptx::texture::*;
use vgpu_ptx::*;

/// The architectures the fixture is compiled for.
const ARCHS: [&str; 3] = ["compute_52", "compute_70", "compute_90"];
/// Handles the tests register.
const TEX: u64 = 0x7e00_0001;
const TEX_3D: u64 = 0x7e00_0002;
const TEX_LAYERED: u64 = 0x7e00_0003;
/// Texels of the first level along each axis.
const SIDE: u64 = 8;
/// Levels of the chains: 8, 4, 2 and 1 texels along each axis.
const LEVELS: u32 = 4;

/// The value every texel of level `level` holds in channel 0 (channel 1 holds the level).
fn level_value(level: u32) -> f32 {
    (level * 100 + 7) as f32
}

/// A chain of `LEVELS` levels of float texels (`channels` of them, channel 0
/// [`level_value`], channel 1 the level) with `dims` dimensions and `layers` layers, each
/// level an allocation of its own; registered as `handle` with `mip`.
fn chain(mem: &TestMemory, handle: u64, channels: u8, dims: u8, layers: u64, mip: MipSampler) {
    let mut layouts = Vec::new();
    for level in 0..LEVELS {
        let n = SIDE >> level;
        let (h, d) = match dims {
            1 => (1, 1),
            2 => (n, 1),
            _ => (n, n),
        };
        let texels = n * h * d * layers.max(1);
        let data: Vec<f32> = (0..texels * u64::from(channels))
            .map(|i| match i % u64::from(channels) {
                0 => level_value(level),
                1 => level as f32,
                _ => 0.0,
            })
            .collect();
        let pitch = n * 4 * u64::from(channels);
        layouts.push(Layout {
            base: mem.alloc_from(&data),
            format: ChannelFormat::F32,
            channels,
            dims,
            width: n,
            height: h,
            depth: d,
            layers,
            pitch,
            slice_pitch: pitch * h,
        });
    }
    mem.add_texture(
        handle,
        TextureView {
            layout: layouts[0],
            sampler: Sampler {
                address: [AddressMode::Clamp; 3],
                filter: FilterMode::Point,
                read_as_integer: false,
                normalized_coords: true,
                border_color: [0.0; 4],
                mip,
            },
        },
    );
    mem.add_texture_levels(handle, layouts.split_off(1));
}

fn mip(filter: FilterMode) -> MipSampler {
    MipSampler {
        levels: LEVELS,
        filter,
        bias: 0.0,
        min_clamp: 0.0,
        max_clamp: (LEVELS - 1) as f32,
    }
}

fn launch(m: &Module, mem: &TestMemory, kernel: &str, threads: u32, args: &[Arg]) {
    let g = alloc_globals(m, mem);
    run(m, kernel, &Config::linear(1, threads), args, mem, &g)
        .unwrap_or_else(|f| panic!("{kernel}: {f}"));
}

/// Channel 0 of each float4 of `out`.
fn firsts(mem: &TestMemory, out: u64, n: usize) -> Vec<f32> {
    mem.read::<f32>(out, n * 4)
        .chunks_exact(4)
        .map(|c| c[0])
        .collect()
}

/// Runs `lod2d` at the centre of the texture for each level of detail.
fn at_lods(m: &Module, mem: &TestMemory, lods: &[f32]) -> Vec<f32> {
    let n = lods.len();
    let xs = mem.alloc_from(&vec![0.5f32; n]);
    let la = mem.alloc_from(lods);
    let out = mem.alloc(n * 16);
    let args = [
        Arg::U64(TEX),
        Arg::U64(out),
        Arg::U64(xs),
        Arg::U64(xs),
        Arg::U64(la),
    ];
    launch(m, mem, "lod2d", n as u32, &args);
    firsts(mem, out, n)
}

#[test]
fn point_mipmap_filtering_reads_the_nearest_level_within_the_clamps() {
    let lods = [
        -3.0,
        0.0,
        0.4,
        0.6,
        1.0,
        1.49,
        1.51,
        2.0,
        3.0,
        9.0,
        f32::NAN,
    ];
    let want = [0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 0].map(level_value);
    for arch in ARCHS {
        let m = load_fixture("texture/mipmaps", arch);
        let mem = TestMemory::new();
        chain(&mem, TEX, 4, 2, 0, mip(FilterMode::Point));
        assert_eq!(at_lods(&m, &mem, &lods), want, "{arch}");
        // A bias moves every fetch a level up; clamps bound the level of detail.
        let biased = MipSampler {
            bias: 1.0,
            min_clamp: 0.0,
            max_clamp: 2.0,
            ..mip(FilterMode::Point)
        };
        chain(&mem, TEX, 4, 2, 0, biased);
        let want = [0, 1, 1, 2, 2, 2, 2, 2, 2, 2, 0].map(level_value);
        assert_eq!(at_lods(&m, &mem, &lods), want, "{arch} biased");
        let clamped = MipSampler {
            min_clamp: 1.0,
            ..mip(FilterMode::Point)
        };
        chain(&mem, TEX, 4, 2, 0, clamped);
        assert_eq!(
            at_lods(&m, &mem, &[0.0, 2.0]),
            [1, 2].map(level_value),
            "{arch} clamped"
        );
    }
}

#[test]
fn linear_mipmap_filtering_blends_two_levels_with_8_bit_weights() {
    let lods = [0.0, 0.25, 0.5, 1.75, 2.9, 3.0, 7.0];
    for arch in ARCHS {
        let m = load_fixture("texture/mipmaps", arch);
        let mem = TestMemory::new();
        chain(&mem, TEX, 4, 2, 0, mip(FilterMode::Linear));
        let got = at_lods(&m, &mem, &lods);
        for (lod, g) in lods.iter().zip(got) {
            let l = lod.min((LEVELS - 1) as f32);
            let first = l.floor() as u32;
            let w = ((l - l.floor()) * 256.0).round() / 256.0;
            let second = (first + 1).min(LEVELS - 1);
            let want = level_value(first) * (1.0 - w) + level_value(second) * w;
            assert!(
                (g - want).abs() < 1e-3,
                "{arch} lod {lod}: {g} against {want}"
            );
        }
    }
}

#[test]
fn gradients_choose_the_level_whose_texels_they_span() {
    // A gradient of one level-0 texel is level 0, of two texels level 1, of four level 2.
    let grads: [f32; 6] = [1.0 / 8.0, 2.0 / 8.0, 4.0 / 8.0, 8.0 / 8.0, 0.0, 1.5 / 8.0];
    let want = [0, 1, 2, 3, 0, 1].map(level_value);
    for arch in ARCHS {
        let m = load_fixture("texture/mipmaps", arch);
        let mem = TestMemory::new();
        chain(&mem, TEX, 4, 2, 0, mip(FilterMode::Point));
        let n = grads.len();
        let xs = mem.alloc_from(&vec![0.3f32; n]);
        let ga = mem.alloc_from(&grads);
        let out = mem.alloc(n * 16);
        let args = [
            Arg::U64(TEX),
            Arg::U64(out),
            Arg::U64(xs),
            Arg::U64(xs),
            Arg::U64(ga),
        ];
        launch(&m, &mem, "grad2d", n as u32, &args);
        assert_eq!(firsts(&mem, out, n), want, "{arch}");
        // A plain fetch of a mipmapped texture reads the first level.
        launch(&m, &mem, "base2d", n as u32, &args[..4]);
        assert_eq!(firsts(&mem, out, n), [level_value(0); 6], "{arch} base");
    }
}

#[test]
fn one_three_dimensional_and_layered_chains_take_levels_too() {
    for arch in ARCHS {
        let m = load_fixture("texture/mipmaps", arch);
        let mem = TestMemory::new();
        chain(&mem, TEX, 1, 1, 0, mip(FilterMode::Point));
        chain(&mem, TEX_3D, 1, 3, 0, mip(FilterMode::Point));
        chain(&mem, TEX_LAYERED, 1, 2, 3, mip(FilterMode::Point));
        for level in 0..LEVELS {
            let out = mem.alloc(48 * 4);
            let args = [
                Arg::U64(TEX),
                Arg::U64(TEX_3D),
                Arg::U64(TEX_LAYERED),
                Arg::U64(out),
                Arg::F32(level as f32),
            ];
            launch(&m, &mem, "lod_misc", 8, &args);
            let got = mem.read::<f32>(out, 48);
            // tex1DLayeredLod reads a 2-D layered texture as one-dimensional: its first row.
            for (what, part) in ["1d", "3d", "layered", "1d grad", "3d grad", "1d layered"]
                .iter()
                .zip(got.chunks_exact(8))
            {
                assert_eq!(part, [level_value(level); 8], "{arch} {what} level {level}");
            }
        }
        let n = mem.alloc(4);
        launch(&m, &mem, "levels", 1, &[Arg::U64(TEX), Arg::U64(n)]);
        assert_eq!(
            mem.read::<i32>(n, 1),
            [LEVELS as i32],
            "{arch} txq.num_mipmap_levels"
        );
        // A texture of one level reads it whatever the level of detail.
        chain(&mem, TEX, 4, 2, 0, MipSampler::ONE_LEVEL);
        launch(&m, &mem, "levels", 1, &[Arg::U64(TEX), Arg::U64(n)]);
        assert_eq!(mem.read::<i32>(n, 1), [1], "{arch} one level");
        assert_eq!(
            at_lods(&m, &mem, &[0.0, 2.5]),
            [level_value(0); 2],
            "{arch}"
        );
    }
}
