//! Texture and surface objects (`cuTexObjectCreate`, `cuSurfObjectCreate`, their destroy and
//! get-descriptor calls), over CUDA arrays ([`crate::arrays`]), pitched and linear memory.
//!
//! The shim checks what CUDA checks (resource type, alignment, the device's limits), describes
//! the texels to vgpud by address and layout, and keeps each object's descriptors to answer the
//! `Get` calls. vgpud checks the texels lie in one allocation of the process, and the device's
//! handle is what kernels receive. A mipmapped array's texture names its first level and the
//! chain's layout ([`vgpu_proto::cuda::mip`]). Resource views that reinterpret the texels are
//! `CUDA_ERROR_NOT_SUPPORTED`.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use vgpu_proto::cuda::{self, TextureDesc, attr};
use vgpu_proto::msg;

use crate::arrays::{self, flags};
use crate::driver::{self as drv, CuRes};
use crate::ffi::{CUresult, ffi};
use crate::out;

/// `CUresourcetype`.
pub(crate) mod restype {
    pub const ARRAY: u32 = 0;
    pub const MIPMAPPED_ARRAY: u32 = 1;
    pub const LINEAR: u32 = 2;
    pub const PITCH2D: u32 = 3;
}

/// Words of the `res` union of `CUDA_RESOURCE_DESC` (`int reserved[32]`).
const RES_WORDS: usize = 16;

/// `CUDA_RESOURCE_DESC`: the type, the union as words, the flags.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceDesc {
    pub res_type: u32,
    pub pad: u32,
    /// `array.hArray`; `linear`/`pitch2D`: `devPtr`, `format | numChannels << 32`,
    /// `sizeInBytes` or `width`, `height`, `pitchInBytes`.
    pub res: [u64; RES_WORDS],
    pub flags: u32,
    pub pad2: u32,
}

/// `CUDA_RESOURCE_VIEW_DESC`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceViewDesc {
    pub format: u32,
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub first_mipmap_level: u32,
    pub last_mipmap_level: u32,
    pub first_layer: u32,
    pub last_layer: u32,
    pub reserved: [u32; 16],
}

const _: () = {
    use std::mem::size_of;
    assert!(size_of::<ResourceDesc>() == 144);
    assert!(size_of::<ResourceViewDesc>() == 112);
};

/// The texels an object names, as vgpud takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Texels {
    base: u64,
    format: u32,
    channels: u32,
    dims: u32,
    width: u64,
    height: u64,
    depth: u64,
    layers: u64,
    pitch: u64,
    slice_pitch: u64,
}

#[derive(Debug, Clone, Copy)]
struct Object {
    ctx: u64,
    res: ResourceDesc,
    tex: Option<TextureDesc>,
    /// The resource view it was created with, if any.
    view: Option<ResourceViewDesc>,
    /// The array's memory, when the resource is an array.
    array_ptr: Option<u64>,
}

#[derive(Default)]
struct Registry {
    textures: HashMap<u64, Object>,
    surfaces: HashMap<u64, Object>,
}

fn registry() -> MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Whether a live texture or surface object names the array whose memory is at `ptr`.
pub fn names_array(ptr: u64) -> bool {
    let r = registry();
    r.textures
        .values()
        .chain(r.surfaces.values())
        .any(|o| o.array_ptr == Some(ptr))
}

/// Forgets the objects of a destroyed context (vgpud destroyed them with it).
pub fn context_gone(ctx: u64) {
    let mut r = registry();
    r.textures.retain(|_, o| o.ctx != ctx);
    r.surfaces.retain(|_, o| o.ctx != ctx);
}

/// The texels of array `a` as vgpud takes them.
fn array_texels(a: &arrays::Array) -> Texels {
    let dims = a.dims();
    Texels {
        base: a.ptr,
        format: a.desc.format,
        channels: a.desc.num_channels,
        dims,
        width: a.desc.width as u64,
        height: a.rows(),
        depth: if dims == 3 { a.slices() } else { 1 },
        layers: a.layers(),
        pitch: a.pitch,
        slice_pitch: a.slice_pitch(),
    }
}

/// What `res` names, checked as CUDA checks it; `surface` for a surface object.
fn texels(res: &ResourceDesc, surface: bool) -> CuRes<(Texels, Option<u64>)> {
    if res.flags != 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    if surface && res.res_type != restype::ARRAY {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let format_channels = |w: u64| -> CuRes<(u32, u32, u64)> {
        let (format, channels) = (w as u32, (w >> 32) as u32);
        let bytes = cuda::channel_bytes(format).ok_or_else(|| {
            if format == 0 {
                cuda::CUDA_ERROR_INVALID_VALUE
            } else {
                drv::unsupported("textures of packed, block-compressed or video formats")
            }
        })?;
        if !cuda::CHANNEL_COUNTS.contains(&channels) {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        Ok((format, channels, bytes * u64::from(channels)))
    };
    let aligned = |ptr: u64| -> CuRes<()> {
        let align = drv::device_limit(attr::TEXTURE_ALIGNMENT)?.max(1);
        if ptr == 0 || !ptr.is_multiple_of(align) {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    };
    match res.res_type {
        restype::ARRAY => {
            let a = arrays::get(res.res[0])?;
            if surface && a.desc.flags & flags::SURFACE_LDST == 0 {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
            Ok((array_texels(&a), Some(a.ptr)))
        }
        restype::MIPMAPPED_ARRAY => {
            // The first level's texels; vgpud finds the others from the chain's layout.
            let m = arrays::mipmapped(res.res[0])?;
            let first = arrays::get(m.levels[0])?;
            Ok((array_texels(&first), Some(m.ptr)))
        }
        restype::LINEAR => {
            let (format, channels, texel) = format_channels(res.res[1])?;
            aligned(res.res[0])?;
            let size = res.res[2];
            let width = size / texel;
            if width == 0 || width > drv::device_limit(attr::MAXIMUM_TEXTURE1D_LINEAR_WIDTH)? {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
            Ok((
                Texels {
                    base: res.res[0],
                    format,
                    channels,
                    dims: 1,
                    width,
                    height: 1,
                    depth: 1,
                    layers: 0,
                    pitch: width * texel,
                    slice_pitch: width * texel,
                },
                None,
            ))
        }
        restype::PITCH2D => {
            let (format, channels, texel) = format_channels(res.res[1])?;
            aligned(res.res[0])?;
            let (width, height, pitch) = (res.res[2], res.res[3], res.res[4]);
            let pitch_align = drv::device_limit(attr::TEXTURE_PITCH_ALIGNMENT)?.max(1);
            if width == 0
                || height == 0
                || width > drv::device_limit(attr::MAXIMUM_TEXTURE2D_LINEAR_WIDTH)?
                || height > drv::device_limit(attr::MAXIMUM_TEXTURE2D_LINEAR_HEIGHT)?
                || pitch > drv::device_limit(attr::MAXIMUM_TEXTURE2D_LINEAR_PITCH)?
                || pitch % pitch_align != 0
                || pitch < width.saturating_mul(texel)
            {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
            Ok((
                Texels {
                    base: res.res[0],
                    format,
                    channels,
                    dims: 2,
                    width,
                    height,
                    depth: 1,
                    layers: 0,
                    pitch,
                    slice_pitch: pitch * height,
                },
                None,
            ))
        }
        _ => Err(cuda::CUDA_ERROR_INVALID_VALUE),
    }
}

/// `CUresourceViewFormat` values: 0 keeps the resource's format, 0x01 to 0x18 are the
/// integer and float formats ([`view_format`]), from 0x19 the block-compressed ones.
const VIEW_FORMAT_FIRST_BC: u32 = 0x19;

/// The array format and channels a resource view format reads texels as; `None` for formats
/// CUDA does not define.
fn view_format(f: u32) -> Option<(u32, u32)> {
    use cuda::array_format::*;
    // UINT 8, SINT 8, UINT 16, SINT 16, UINT 32, SINT 32, FLOAT 16, FLOAT 32: 1, 2, 4 channels.
    const KINDS: [u32; 8] = [U8, S8, U16, S16, U32, S32, F16, F32];
    let i = usize::try_from(f.checked_sub(1)?).ok()?;
    let kind = *KINDS.get(i / 3)?;
    Some((kind, cuda::CHANNEL_COUNTS[i % 3]))
}

/// A mipmapped array's chain as vgpud takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Chain {
    levels: u32,
    pitch_align: u64,
    level_align: u64,
}

/// What a texture samples: its (first level's) texels, the array it names, the chain of a
/// mipmapped array, and whether the layers are a cube map's faces.
#[derive(Debug, Clone, Copy)]
struct Source {
    texels: Texels,
    array_ptr: Option<u64>,
    chain: Option<Chain>,
    /// The array's descriptor (the first level's, for a mipmapped array).
    desc: Option<arrays::Array3DDescriptor>,
}

/// Applies a resource view (`CUDA_RESOURCE_VIEW_DESC`) to what a texture samples: texels read
/// in another format of the same size, a range of a mipmapped array's levels, a range of a
/// layered array's layers (of a layered cube map's cubes). A view of nothing but zeros keeps
/// the resource as it is; the block-compressed formats are `CUDA_ERROR_NOT_SUPPORTED`.
fn apply_view(res: &ResourceDesc, v: &ResourceViewDesc, src: &mut Source) -> CuRes<()> {
    let trivial = v.format == 0
        && v.width == 0
        && v.height == 0
        && v.depth == 0
        && v.first_mipmap_level == 0
        && v.last_mipmap_level == 0
        && v.first_layer == 0
        && v.last_layer == 0;
    if trivial {
        return Ok(());
    }
    // Views apply to arrays and mipmapped arrays only.
    let Some(desc) = src.desc else {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    };
    if v.format >= VIEW_FORMAT_FIRST_BC {
        return Err(drv::unsupported("block-compressed texture views"));
    }
    if v.format != 0 {
        let (format, channels) = view_format(v.format).ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        let bytes = |f: u32, c: u32| cuda::channel_bytes(f).map(|b| b * u64::from(c));
        if bytes(format, channels) != bytes(src.texels.format, src.texels.channels) {
            // Other than for block-compressed views, CUDA keeps the width: the texel's size.
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        (src.texels.format, src.texels.channels) = (format, channels);
    }
    // The extents, when given, are the resource's.
    for (given, has) in [
        (v.width, desc.width),
        (v.height, desc.height),
        (v.depth, desc.depth),
    ] {
        if given != 0 && given != has {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
    }
    let (first, last) = (v.first_mipmap_level, v.last_mipmap_level);
    match (&mut src.chain, res.res_type) {
        (Some(chain), restype::MIPMAPPED_ARRAY) if first != 0 || last != chain.levels - 1 => {
            if first > last || last >= chain.levels {
                return Err(cuda::CUDA_ERROR_INVALID_VALUE);
            }
            // Level `first` becomes level 0: every level's offset is a multiple of the level
            // alignment, so the levels after it lie as a chain of their own would.
            let m = arrays::mipmapped(res.res[0])?;
            let level = arrays::get(m.levels[first as usize])?;
            src.texels = Texels {
                format: src.texels.format,
                channels: src.texels.channels,
                ..array_texels(&level)
            };
            chain.levels = last - first + 1;
        }
        (Some(_), _) => {}
        (None, _) if first != 0 || last != 0 => return Err(cuda::CUDA_ERROR_INVALID_VALUE),
        (None, _) => {}
    }
    let (first, last) = (v.first_layer, v.last_layer);
    if first != 0 || last != 0 {
        let t = &mut src.texels;
        // A layered cube map's layers are its cubes, six faces each.
        let per = if desc.flags & arrays::flags::CUBEMAP != 0 {
            6
        } else {
            1
        };
        let layers = t.layers / per;
        if t.layers == 0 || first > last || u64::from(last) >= layers {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        if src.chain.is_some_and(|c| c.levels > 1) {
            // The levels of a range of layers do not lie where vgpud's chain of that many
            // layers would.
            return Err(drv::unsupported("layer ranges of mipmapped arrays"));
        }
        t.base += u64::from(first) * per * t.slice_pitch;
        t.layers = u64::from(last - first + 1) * per;
    }
    Ok(())
}

/// `cuTexObjectCreate`.
fn tex_create(
    res: *const ResourceDesc,
    tex: *const TextureDesc,
    view: *const ResourceViewDesc,
) -> CuRes<u64> {
    // SAFETY: NULL or the caller's CUDA_RESOURCE_DESC (CUDA contract).
    let res = *unsafe { res.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: NULL or the caller's CUDA_TEXTURE_DESC (CUDA contract).
    let tex = *unsafe { tex.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: NULL or the caller's CUDA_RESOURCE_VIEW_DESC (CUDA contract).
    let view = unsafe { view.as_ref() }.copied();
    make_texture_viewed(res, tex, view, true)
}

/// Creates a texture object over `res` sampled as `tex`; `holds_array`: whether an array it
/// names may not be destroyed while it lives (a program's own object; not one made for a
/// texture reference, whose binding CUDA lets go stale).
pub(crate) fn make_texture(res: ResourceDesc, tex: TextureDesc, holds_array: bool) -> CuRes<u64> {
    make_texture_viewed(res, tex, None, holds_array)
}

/// [`make_texture`] through a resource view.
fn make_texture_viewed(
    res: ResourceDesc,
    tex: TextureDesc,
    view: Option<ResourceViewDesc>,
    holds_array: bool,
) -> CuRes<u64> {
    let (texels, array_ptr) = texels(&res, false)?;
    let mut src = Source {
        texels,
        array_ptr,
        chain: None,
        desc: None,
    };
    match res.res_type {
        restype::ARRAY => src.desc = Some(arrays::get(res.res[0])?.desc),
        restype::MIPMAPPED_ARRAY => {
            let m = arrays::mipmapped(res.res[0])?;
            src.desc = Some(m.desc);
            src.chain = Some(Chain {
                levels: u32::try_from(m.levels.len()).unwrap_or(u32::MAX),
                pitch_align: m.pitch_align,
                level_align: m.level_align,
            });
        }
        _ => {}
    }
    if let Some(v) = &view {
        apply_view(&res, v, &mut src)?;
    }
    let t = src.texels;
    let array_ptr = src.array_ptr.filter(|_| holds_array);
    let ctx = drv::current_ctx().ok_or(cuda::CUDA_ERROR_INVALID_CONTEXT)?;
    let plain = msg::TexObjectCreate {
        ctx,
        base: t.base,
        format: t.format,
        channels: t.channels,
        dims: t.dims,
        width: t.width,
        height: t.height,
        depth: t.depth,
        layers: t.layers,
        pitch: t.pitch,
        slice_pitch: t.slice_pitch,
        address_0: tex.address_mode[0],
        address_1: tex.address_mode[1],
        address_2: tex.address_mode[2],
        filter: tex.filter_mode,
        flags: tex.flags,
        border_r: tex.border_color[0],
        border_g: tex.border_color[1],
        border_b: tex.border_color[2],
        border_a: tex.border_color[3],
    };
    let d = drv::driver()?;
    let handle = match src.chain {
        Some(c) => {
            let mipmapped = msg::TexObjectCreateMipmapped {
                mip_filter: tex.mipmap_filter_mode,
                level_bias: tex.mipmap_level_bias,
                min_level_clamp: tex.min_mipmap_level_clamp,
                max_level_clamp: tex.max_mipmap_level_clamp,
                ..plain.mipmapped(c.levels, c.pitch_align, c.level_align)
            };
            d.call(&mipmapped, &[])?.handle
        }
        None => d.call(&plain, &[])?.handle,
    };
    registry().textures.insert(
        handle,
        Object {
            ctx,
            res,
            tex: Some(tex),
            view,
            array_ptr,
        },
    );
    Ok(handle)
}

/// `cuSurfObjectCreate`.
fn surf_create(res: *const ResourceDesc) -> CuRes<u64> {
    // SAFETY: NULL or the caller's descriptor (CUDA contract).
    let res = *unsafe { res.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    make_surface(res, true)
}

/// Creates a surface object over `res`; `holds_array` as for [`make_texture`].
pub(crate) fn make_surface(res: ResourceDesc, holds_array: bool) -> CuRes<u64> {
    let (t, array_ptr) = texels(&res, true)?;
    let array_ptr = array_ptr.filter(|_| holds_array);
    let ctx = drv::current_ctx().ok_or(cuda::CUDA_ERROR_INVALID_CONTEXT)?;
    let handle = drv::driver()?
        .call(
            &msg::SurfObjectCreate {
                ctx,
                base: t.base,
                format: t.format,
                channels: t.channels,
                dims: t.dims,
                width: t.width,
                height: t.height,
                depth: t.depth,
                layers: t.layers,
                pitch: t.pitch,
                slice_pitch: t.slice_pitch,
            },
            &[],
        )?
        .handle;
    registry().surfaces.insert(
        handle,
        Object {
            ctx,
            res,
            tex: None,
            view: None,
            array_ptr,
        },
    );
    Ok(handle)
}

fn object(handle: u64, surface: bool) -> CuRes<Object> {
    let r = registry();
    let table = if surface { &r.surfaces } else { &r.textures };
    table
        .get(&handle)
        .copied()
        .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)
}

/// Destroys a texture (or, `surface`, a surface) object.
pub(crate) fn destroy(handle: u64, surface: bool) -> CuRes<()> {
    let o = object(handle, surface)?;
    let d = drv::driver()?;
    // Work already queued may still use it: vgpud destroys it after that work.
    crate::sync_wait::before_settling(o.ctx)?;
    if surface {
        d.call(&msg::SurfObjectDestroy { ctx: o.ctx, handle }, &[])?;
        registry().surfaces.remove(&handle);
    } else {
        d.call(&msg::TexObjectDestroy { ctx: o.ctx, handle }, &[])?;
        registry().textures.remove(&handle);
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexObjectCreate(
    out: *mut u64,
    res: *const ResourceDesc,
    tex: *const TextureDesc,
    view: *const ResourceViewDesc,
) -> CUresult {
    ffi("cuTexObjectCreate", || {
        if out.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(out, tex_create(res, tex, view)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexObjectDestroy(handle: u64) -> CUresult {
    ffi("cuTexObjectDestroy", || destroy(handle, false))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexObjectGetResourceDesc(
    out: *mut ResourceDesc,
    handle: u64,
) -> CUresult {
    ffi("cuTexObjectGetResourceDesc", || {
        out!(out, object(handle, false)?.res)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexObjectGetTextureDesc(out: *mut TextureDesc, handle: u64) -> CUresult {
    ffi("cuTexObjectGetTextureDesc", || {
        let tex = object(handle, false)?
            .tex
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        out!(out, tex)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexObjectGetResourceViewDesc(
    out: *mut ResourceViewDesc,
    handle: u64,
) -> CUresult {
    ffi("cuTexObjectGetResourceViewDesc", || {
        // CUDA: `CUDA_ERROR_INVALID_VALUE` for an object made without a view.
        let view = object(handle, false)?
            .view
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        out!(out, view)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuSurfObjectCreate(out: *mut u64, res: *const ResourceDesc) -> CUresult {
    ffi("cuSurfObjectCreate", || {
        if out.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(out, surf_create(res)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuSurfObjectDestroy(handle: u64) -> CUresult {
    ffi("cuSurfObjectDestroy", || destroy(handle, true))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuSurfObjectGetResourceDesc(
    out: *mut ResourceDesc,
    handle: u64,
) -> CUresult {
    ffi("cuSurfObjectGetResourceDesc", || {
        out!(out, object(handle, true)?.res)
    })
}

/// `cuDeviceGetTexture1DLinearMaxWidth`: the widest one-dimensional texture over linear memory,
/// in texels, for a format and channel count (the device's
/// `MAXIMUM_TEXTURE1D_LINEAR_WIDTH`, whatever the texel's size).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetTexture1DLinearMaxWidth(
    out: *mut usize,
    format: u32,
    channels: u32,
    device: i32,
) -> CUresult {
    ffi("cuDeviceGetTexture1DLinearMaxWidth", || {
        if cuda::channel_bytes(format).is_none() || !cuda::CHANNEL_COUNTS.contains(&channels) {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let width = drv::device_attribute(attr::MAXIMUM_TEXTURE1D_LINEAR_WIDTH as i32, device)?;
        out!(
            out,
            usize::try_from(width).map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?
        )
    })
}
