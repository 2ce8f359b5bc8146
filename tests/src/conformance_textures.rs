//! Texture and surface objects through the broker's protocol, on any device: a kernel samples
//! a pitched grid through a texture object; a surface object updates texels in place (where
//! the device has surfaces); a mipmapped texture reads each level by level of detail (where
//! the device has mipmapped textures); layouts outside the process's memory, values outside CUDA's enums
//! and forged handles are refused; another VM's handle reads nothing of the owner's; objects
//! go with their session and count against the VM's handle budget.

use vgpu_corpus::Arg;
use vgpu_proto::{cuda, msg};

use crate::conformance::{Code, Rig, Session, Target};

/// `tests/gpu/kernels/textures.cu`: `sample_grid` and `scale_surface`.
pub const TEXTURES_PTX: &str = include_str!("../gpu/kernels/textures.sm_52.ptx");

const MIB: u64 = 1 << 20;
/// Texels per row and rows of the grid.
const W: u64 = 32;
const H: u64 = 8;
/// Bytes between rows: a multiple of every GPU's texture pitch alignment.
const PITCH: u64 = 512;
/// `CU_AD_FORMAT_FLOAT`.
const FORMAT_FLOAT: u32 = 0x20;
/// `CU_TR_ADDRESS_MODE_CLAMP`.
const CLAMP: u32 = 1;

fn grid_value(x: u64, y: u64) -> f32 {
    (y * 1000 + x) as f32
}

fn grid_bytes() -> Vec<u8> {
    let mut b = vec![0u8; (PITCH * H) as usize];
    for y in 0..H {
        for x in 0..W {
            let at = (y * PITCH + x * 4) as usize;
            b[at..at + 4].copy_from_slice(&grid_value(x, y).to_le_bytes());
        }
    }
    b
}

fn texture(ctx: u64, base: u64) -> msg::TexObjectCreate {
    msg::TexObjectCreate {
        ctx,
        base,
        format: FORMAT_FLOAT,
        channels: 1,
        dims: 2,
        width: W,
        height: H,
        depth: 1,
        layers: 0,
        pitch: PITCH,
        slice_pitch: PITCH * H,
        address_0: CLAMP,
        address_1: CLAMP,
        address_2: CLAMP,
        ..Default::default()
    }
}

fn surface(ctx: u64, base: u64) -> msg::SurfObjectCreate {
    msg::SurfObjectCreate {
        ctx,
        base,
        format: FORMAT_FLOAT,
        channels: 1,
        dims: 2,
        width: W,
        height: H,
        depth: 1,
        layers: 0,
        pitch: PITCH,
        slice_pitch: PITCH * H,
    }
}

/// Runs `kernel` of the texture kernels over texture `tex` on a `w` x `h` grid (`h` blocks of
/// `w` threads, arguments: the texture, the output, `w`, then `more`); the floats it wrote, or
/// the launch's error.
fn run_sampler(
    s: &mut Session,
    kernel: &str,
    tex: u64,
    (w, h): (u64, u64),
    more: &[Arg],
) -> Result<Vec<f32>, Code> {
    let m = s
        .load(TEXTURES_PTX.as_bytes())
        .expect("loading the texture kernels");
    let k = s.kernel(m, kernel)?;
    let out = s.alloc(w * h * 4)?;
    let mut args = vec![Arg::U64(tex), Arg::Ptr(out), Arg::I32(w as i32)];
    args.extend_from_slice(more);
    s.launch(&k, [h as u32, 1, 1], [w as u32, 1, 1], 0, &args)?;
    let r = s.sync().and_then(|()| s.dtoh(out, (w * h * 4) as usize));
    s.free(out)?;
    Ok(r?
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect())
}

/// Runs `sample_grid` over texture `tex`; the grid it read, or the launch's error.
fn sample(s: &mut Session, tex: u64) -> Result<Vec<f32>, Code> {
    run_sampler(s, "sample_grid", tex, (W, H), &[])
}

fn want_grid() -> Vec<f32> {
    (0..H)
        .flat_map(|y| (0..W).map(move |x| grid_value(x, y)))
        .collect()
}

/// Runs `sample_level` over a `w` x `h` level at level of detail `lod`.
fn sample_level(s: &mut Session, tex: u64, w: u64, h: u64, lod: f32) -> Result<Vec<f32>, Code> {
    run_sampler(s, "sample_level", tex, (w, h), &[Arg::F32(lod)])
}

/// A mipmapped texture of two levels (the grid, and a grid half its size each way holding
/// other values) laid out as [`cuda::mip`] places them: `tex2DLod` reads each level where the
/// device has mipmapped textures; a device without them says `CUDA_ERROR_NOT_SUPPORTED`.
fn mipmapped(a: &mut Session) {
    /// Rows and levels aligned as the simulated GPU reports (`TEXTURE_PITCH_ALIGNMENT`,
    /// `TEXTURE_ALIGNMENT`).
    const PITCH_ALIGN: u64 = 32;
    const LEVEL_ALIGN: u64 = 512;
    /// `CU_TRSF_NORMALIZED_COORDINATES`.
    const NORMALIZED: u32 = 0x02;
    let shape = cuda::mip::Shape {
        width: W,
        height: H,
        depth: 0,
        layered: false,
        texel_bytes: 4,
    };
    let levels = cuda::mip::levels(&shape, 2, PITCH_ALIGN, LEVEL_ALIGN).unwrap();
    let level_value = |l: usize, x: u64, y: u64| grid_value(x, y) + 0.5 * l as f32;
    let mut bytes = vec![0u8; cuda::mip::chain_bytes(&levels) as usize];
    for (l, level) in levels.iter().enumerate() {
        for y in 0..level.height {
            for x in 0..level.width {
                let at = (level.offset + y * level.pitch + x * 4) as usize;
                bytes[at..at + 4].copy_from_slice(&level_value(l, x, y).to_le_bytes());
            }
        }
    }
    let chain = a.alloc(bytes.len() as u64).unwrap();
    a.htod(chain, &bytes).unwrap();
    let mipmapped = msg::TexObjectCreateMipmapped {
        max_level_clamp: 1.0,
        ..msg::TexObjectCreate {
            flags: NORMALIZED,
            ..texture(a.ctx, chain)
        }
        .mipmapped(2, PITCH_ALIGN, LEVEL_ALIGN)
    };
    let made = a.request(&mipmapped);
    match made {
        Ok(h) => {
            for (l, level) in levels.iter().enumerate() {
                let want: Vec<f32> = (0..level.height)
                    .flat_map(|y| (0..level.width).map(move |x| level_value(l, x, y)))
                    .collect();
                assert_eq!(
                    sample_level(a, h.handle, level.width, level.height, l as f32).unwrap(),
                    want,
                    "tex2DLod read every texel of level {l}"
                );
            }
            a.request(&msg::TexObjectDestroy {
                ctx: a.ctx,
                handle: h.handle,
            })
            .unwrap();
        }
        Err(e) => assert_eq!(e, cuda::CUDA_ERROR_NOT_SUPPORTED, "mipmapped textures: {e}"),
    }
    // A chain longer than its allocation is refused on every device.
    let past = a.request(&msg::TexObjectCreateMipmapped {
        base: chain + LEVEL_ALIGN,
        ..mipmapped
    });
    assert_eq!(past.unwrap_err(), cuda::CUDA_ERROR_INVALID_VALUE);
    a.free(chain).unwrap();
}

/// The check.
pub fn textures_and_surfaces(t: &Target) {
    let rig = Rig::new((t.make)(None), &[("a", 64 * MIB, 1), ("b", 64 * MIB, 1)]);
    let mut a = rig.session("a");
    let grid = a.alloc(PITCH * H).unwrap();
    a.htod(grid, &grid_bytes()).unwrap();
    let tex = a.request(&texture(a.ctx, grid)).unwrap().handle;
    assert_eq!(
        sample(&mut a, tex).unwrap(),
        want_grid(),
        "tex2D read every texel"
    );

    // A texture destroyed right after the launch that samples it, before any synchronization
    // (as CUDA programs may): the launch still reads it.
    {
        let early = a.request(&texture(a.ctx, grid)).unwrap().handle;
        let m = a.load(TEXTURES_PTX.as_bytes()).unwrap();
        let k = a.kernel(m, "sample_grid").unwrap();
        let out = a.alloc(W * H * 4).unwrap();
        a.launch(
            &k,
            [H as u32, 1, 1],
            [W as u32, 1, 1],
            0,
            &[Arg::U64(early), Arg::Ptr(out), Arg::I32(W as i32)],
        )
        .unwrap();
        a.request(&msg::TexObjectDestroy {
            ctx: a.ctx,
            handle: early,
        })
        .unwrap();
        a.sync().unwrap();
        let got: Vec<f32> = a
            .dtoh(out, (W * H * 4) as usize)
            .unwrap()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, want_grid(), "a launch before the destroy sampled it");
        a.free(out).unwrap();
    }

    // Texels outside the process's memory, values outside CUDA's enums, forged handles.
    let inval = Err(cuda::CUDA_ERROR_INVALID_VALUE);
    let refused = |s: &mut Session, req: msg::TexObjectCreate| s.request(&req).map(drop);
    let ctx = a.ctx;
    for (what, req) in [
        (
            "past the allocation",
            msg::TexObjectCreate {
                height: H + 1,
                ..texture(ctx, grid)
            },
        ),
        (
            "a pitch shorter than a row",
            msg::TexObjectCreate {
                pitch: 64,
                ..texture(ctx, grid)
            },
        ),
        ("three channels", {
            msg::TexObjectCreate {
                channels: 3,
                ..texture(ctx, grid)
            }
        }),
        (
            "address mode 9",
            msg::TexObjectCreate {
                address_1: 9,
                ..texture(ctx, grid)
            },
        ),
        (
            "filter mode 2",
            msg::TexObjectCreate {
                filter: 2,
                ..texture(ctx, grid)
            },
        ),
        (
            "extent overflow",
            msg::TexObjectCreate {
                dims: 3,
                depth: 1 << 27,
                slice_pitch: u64::MAX / 4,
                ..texture(ctx, grid)
            },
        ),
    ] {
        assert_eq!(refused(&mut a, req), inval, "{what}");
    }
    let mut b = rig.session("b");
    let theirs = texture(b.ctx, grid);
    assert_eq!(
        refused(&mut b, theirs),
        inval,
        "another VM's memory cannot back a texture"
    );
    assert_eq!(
        b.request(&msg::TexObjectDestroy {
            ctx: b.ctx,
            handle: tex,
        })
        .map(drop),
        inval,
        "another VM cannot destroy a texture"
    );
    // Another VM's kernel given the handle reads nothing of the owner's texels (where VMs
    // have GPU address spaces of their own; over the shim all are contexts of one VM).
    match sample(&mut b, tex) {
        _ if !t.address_spaces => {}
        Ok(got) => assert!(
            got != want_grid(),
            "another VM read the owner's texels through its handle"
        ),
        Err(e) => assert_eq!(e, cuda::CUDA_ERROR_ILLEGAL_ADDRESS),
    }
    assert_eq!(
        sample(&mut a, tex).unwrap(),
        want_grid(),
        "the owner is unaffected"
    );

    // Surfaces, where the device has them.
    match a.request(&surface(a.ctx, grid)) {
        Ok(h) => {
            let m = a.load(TEXTURES_PTX.as_bytes()).unwrap();
            let k = a.kernel(m, "scale_surface").unwrap();
            a.launch(
                &k,
                [H as u32, 1, 1],
                [W as u32, 1, 1],
                0,
                &[Arg::U64(h.handle), Arg::F32(3.0)],
            )
            .unwrap();
            a.sync().unwrap();
            let want: Vec<f32> = want_grid().iter().map(|v| v * 3.0).collect();
            assert_eq!(
                sample(&mut a, tex).unwrap(),
                want,
                "the surface kernel scaled every texel in place"
            );
            a.request(&msg::SurfObjectDestroy {
                ctx: a.ctx,
                handle: h.handle,
            })
            .unwrap();
        }
        Err(e) => assert_eq!(e, cuda::CUDA_ERROR_NOT_SUPPORTED, "surfaces: {e}"),
    }
    mipmapped(&mut a);

    a.request(&msg::TexObjectDestroy {
        ctx: a.ctx,
        handle: tex,
    })
    .unwrap();
    assert_eq!(
        a.request(&msg::TexObjectDestroy {
            ctx: a.ctx,
            handle: tex
        })
        .map(drop),
        inval,
        "a destroyed texture is stale"
    );

    if t.cuda_driver.is_none() {
        // Objects go with their session: a later session of the VM cannot use them.
        let left = a.request(&texture(a.ctx, grid)).unwrap().handle;
        a.close();
        let mut a2 = rig.session("a");
        assert_eq!(
            sample(&mut a2, left),
            Err(cuda::CUDA_ERROR_ILLEGAL_ADDRESS),
            "a closed session's texture is gone"
        );
        // The VM's handle budget bounds them; what is destroyed is given back (a fresh
        // session: the fault is sticky in a2's context, as in CUDA).
        a2.close();
        let mut a2 = rig.session("a");
        let g2 = a2.alloc(PITCH * H).unwrap();
        let mut made = Vec::new();
        let stop = loop {
            match a2.request(&texture(a2.ctx, g2)) {
                Ok(h) => made.push(h.handle),
                Err(e) => break e,
            }
            assert!(made.len() <= 1 << 17, "texture objects are unbounded");
        };
        assert_eq!(stop, cuda::CUDA_ERROR_OUT_OF_MEMORY);
        assert!(!made.is_empty());
        for h in made.drain(..) {
            a2.request(&msg::TexObjectDestroy {
                ctx: a2.ctx,
                handle: h,
            })
            .unwrap();
        }
        let again = a2.request(&texture(a2.ctx, g2)).unwrap().handle;
        a2.request(&msg::TexObjectDestroy {
            ctx: a2.ctx,
            handle: again,
        })
        .unwrap();
    }
}
