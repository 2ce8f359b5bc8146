//! Cube maps: `tex.cube`, `tex.acube` and `tex.level.cube` in kernels compiled by nvcc 11.8
//! (`fixtures/texture/cubemaps.cu`): a direction picks a face (the texture's layers, in CUDA's
//! order) and a texel on it, per the CUDA programming guide's cube map table, computed here
//! independently.

use vgpu_ptx::testutils::*;
use vgpu_ptx::texture::*;
use vgpu_ptx::*;

const ARCHS: [&str; 3] = ["compute_52", "compute_70", "compute_90"];
const TEX: u64 = 0x7e00_0001;
/// Texels along a face's side.
const SIDE: u64 = 4;

/// Texel (x, y) of face `face` (counting on through the layers of a layered cube map) of
/// level `level`.
fn texel(level: u64, face: u64, x: u64, y: u64) -> f32 {
    (level * 10_000 + face * 100 + y * 10 + x) as f32
}

/// A cube map of `cubes` cubes (6 faces each) and `levels` levels of `SIDE`, `SIDE / 2`, ...
/// texels, registered as `TEX`.
fn cube_map(mem: &TestMemory, cubes: u64, levels: u32) {
    let mut layouts = Vec::new();
    for level in 0..u64::from(levels) {
        let n = SIDE >> level;
        let data: Vec<f32> = (0..6 * cubes)
            .flat_map(|f| (0..n).flat_map(move |y| (0..n).map(move |x| texel(level, f, x, y))))
            .collect();
        layouts.push(Layout {
            base: mem.alloc_from(&data),
            format: ChannelFormat::F32,
            channels: 1,
            dims: 2,
            width: n,
            height: n,
            depth: 1,
            layers: 6 * cubes,
            pitch: n * 4,
            slice_pitch: n * n * 4,
        });
    }
    mem.add_texture(
        TEX,
        TextureView {
            layout: layouts[0],
            sampler: Sampler {
                // Cube maps are sampled with normalized coordinates and clamped to each face
                // whatever the sampler says.
                address: [AddressMode::Wrap; 3],
                filter: FilterMode::Point,
                read_as_integer: false,
                normalized_coords: false,
                border_color: [0.0; 4],
                mip: MipSampler {
                    levels,
                    max_clamp: (levels - 1) as f32,
                    ..MipSampler::ONE_LEVEL
                },
            },
        },
    );
    mem.add_texture_levels(TEX, layouts.split_off(1));
}

/// The face and texel a direction reads on a face of `n` texels (the guide's table).
fn reference(d: [f32; 3], n: u64) -> (u64, u64, u64) {
    let [x, y, z] = d;
    let (face, s, t, m) = if x.abs() >= y.abs() && x.abs() >= z.abs() {
        if x >= 0.0 {
            (0, -z, -y, x)
        } else {
            (1, z, -y, -x)
        }
    } else if y.abs() >= z.abs() {
        if y >= 0.0 {
            (2, x, z, y)
        } else {
            (3, x, -z, -y)
        }
    } else if z >= 0.0 {
        (4, x, -y, z)
    } else {
        (5, -x, -y, -z)
    };
    let at =
        |c: f32| (((c / m + 1.0) / 2.0 * n as f32).floor() as i64).clamp(0, n as i64 - 1) as u64;
    (face, at(s), at(t))
}

/// Directions: each axis both ways, and off-centre ones onto every face.
fn directions() -> Vec<[f32; 3]> {
    let mut d = vec![
        [1.0, 0.0, 0.0],
        [-1.0, 0.0, 0.0],
        [0.0, 1.0, 0.0],
        [0.0, -1.0, 0.0],
        [0.0, 0.0, 1.0],
        [0.0, 0.0, -1.0],
    ];
    for (a, b) in [(0.3, -0.7), (-0.9, 0.2), (0.6, 0.6), (-0.45, -0.95)] {
        d.extend([
            [2.0, a, b],
            [-2.0, a, b],
            [a, 3.0, b],
            [a, -3.0, b],
            [a, b, 1.5],
            [a, b, -1.5],
        ]);
    }
    d
}

fn run_kernel(
    m: &Module,
    mem: &TestMemory,
    kernel: &str,
    dirs: &[[f32; 3]],
    last: Option<Arg>,
) -> Vec<f32> {
    let flat: Vec<f32> = dirs.iter().flatten().copied().collect();
    let da = mem.alloc_from(&flat);
    let out = mem.alloc(dirs.len() * 4);
    let g = alloc_globals(m, mem);
    let mut args = vec![Arg::U64(TEX), Arg::U64(out), Arg::U64(da)];
    args.extend(last);
    run(
        m,
        kernel,
        &Config::linear(1, dirs.len() as u32),
        &args,
        mem,
        &g,
    )
    .unwrap_or_else(|f| panic!("{kernel}: {f}"));
    mem.read::<f32>(out, dirs.len())
}

#[test]
fn a_direction_reads_the_texel_it_points_at_on_its_face() {
    let dirs = directions();
    for arch in ARCHS {
        let m = load_fixture("texture/cubemaps", arch);
        let mem = TestMemory::new();
        cube_map(&mem, 1, 1);
        let got = run_kernel(&m, &mem, "cube", &dirs, None);
        for (d, g) in dirs.iter().zip(&got) {
            let (f, x, y) = reference(*d, SIDE);
            assert_eq!(*g, texel(0, f, x, y), "{arch} direction {d:?}");
        }
    }
}

#[test]
fn a_layered_cube_map_reads_the_faces_of_its_layer() {
    let dirs = directions();
    for arch in ARCHS {
        let m = load_fixture("texture/cubemaps", arch);
        let mem = TestMemory::new();
        cube_map(&mem, 3, 1);
        for layer in 0..3u64 {
            let got = run_kernel(
                &m,
                &mem,
                "cube_layered",
                &dirs,
                Some(Arg::I32(layer as i32)),
            );
            for (d, g) in dirs.iter().zip(&got) {
                let (f, x, y) = reference(*d, SIDE);
                assert_eq!(
                    *g,
                    texel(0, layer * 6 + f, x, y),
                    "{arch} layer {layer} {d:?}"
                );
            }
        }
    }
}

#[test]
fn a_mipmapped_cube_map_reads_the_level_of_detail() {
    let dirs = directions();
    for arch in ARCHS {
        let m = load_fixture("texture/cubemaps", arch);
        let mem = TestMemory::new();
        cube_map(&mem, 1, 3);
        for level in 0..3u64 {
            let got = run_kernel(&m, &mem, "cube_lod", &dirs, Some(Arg::F32(level as f32)));
            for (d, g) in dirs.iter().zip(&got) {
                let (f, x, y) = reference(*d, SIDE >> level);
                assert_eq!(*g, texel(level, f, x, y), "{arch} level {level} {d:?}");
            }
        }
    }
}
