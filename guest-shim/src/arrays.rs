//! CUDA arrays (`cuArrayCreate`, `cuArray3DCreate`, their descriptors, `cuArrayDestroy`) and the
//! copies that name one (`cuMemcpyHtoA`, `AtoH`, `DtoA`, `AtoD`, `AtoA`, and the array sides of
//! `cuMemcpy2D`/`cuMemcpy3D`, which [`crate::copies`] runs).
//!
//! An array is device memory of its own allocation (charged to the slice like any other): rows
//! of `Width` texels, each row starting [`row_pitch`] bytes after the one before (the device's
//! texture pitch alignment), `Height` rows per slice and `Depth` slices or layers. CUDA leaves an
//! array's layout to the driver; this one lets texture and surface objects name an array's
//! texels by address ([`crate::textures`]) and pitched copies reach them. `CUarray` handles are
//! the shim's own tokens; a handle it did not hand out is `CUDA_ERROR_INVALID_HANDLE`.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard, OnceLock};

use vgpu_proto::cuda::{self, attr, mip};

use crate::driver::{self as drv, CuRes};
use crate::exports::{CUdeviceptr, CUhandle, h};
use crate::ffi::{CUresult, ffi};
use crate::out;

/// `CUDA_ARRAY3D_*` flags.
pub mod flags {
    /// `CUDA_ARRAY3D_LAYERED`: `Depth` counts layers.
    pub const LAYERED: u32 = 0x01;
    /// `CUDA_ARRAY3D_SURFACE_LDST`: surface objects may name the array.
    pub const SURFACE_LDST: u32 = 0x02;
    /// `CUDA_ARRAY3D_CUBEMAP`.
    pub const CUBEMAP: u32 = 0x04;
    /// `CUDA_ARRAY3D_TEXTURE_GATHER`.
    pub const TEXTURE_GATHER: u32 = 0x08;
    /// `CUDA_ARRAY3D_DEPTH_TEXTURE`.
    pub const DEPTH_TEXTURE: u32 = 0x10;
    /// `CUDA_ARRAY3D_COLOR_ATTACHMENT`.
    pub const COLOR_ATTACHMENT: u32 = 0x20;
    /// `CUDA_ARRAY3D_SPARSE`.
    pub const SPARSE: u32 = 0x40;
    /// `CUDA_ARRAY3D_DEFERRED_MAPPING`.
    pub const DEFERRED_MAPPING: u32 = 0x80;
    /// The flags vgpu's arrays honour.
    pub const SUPPORTED: u32 = LAYERED | SURFACE_LDST | CUBEMAP | TEXTURE_GATHER | COLOR_ATTACHMENT;
    /// Every flag CUDA 12 defines.
    pub const ALL: u32 = SUPPORTED | CUBEMAP | DEPTH_TEXTURE | SPARSE | DEFERRED_MAPPING;
}

/// The tag in every `CUarray` handle the shim hands out (the low bits count arrays).
const HANDLE_TAG: u64 = 0x0a77_a000_0000_0000;

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: u32,
    pub num_channels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Array3DDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: u32,
    pub num_channels: u32,
    pub flags: u32,
}

const _: () = {
    assert!(std::mem::size_of::<ArrayDescriptor>() == 24);
    assert!(std::mem::size_of::<Array3DDescriptor>() == 40);
};

/// A live array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Array {
    /// The context it was created in.
    pub ctx: u64,
    /// Its device memory.
    pub ptr: u64,
    /// As created (0 for unused dimensions).
    pub desc: Array3DDescriptor,
    /// Bytes from one row to the next.
    pub pitch: u64,
    /// The mipmapped array it is a level of (0: an array of its own, which `cuArrayDestroy`
    /// frees).
    pub level_of: u64,
}

impl Array {
    /// Bytes of one texel.
    pub fn texel_bytes(&self) -> u64 {
        cuda::channel_bytes(self.desc.format).unwrap_or(0) * u64::from(self.desc.num_channels)
    }

    /// Bytes of one row's texels.
    pub fn row_bytes(&self) -> u64 {
        self.desc.width as u64 * self.texel_bytes()
    }

    /// Rows per slice.
    pub fn rows(&self) -> u64 {
        (self.desc.height as u64).max(1)
    }

    /// Slices (3-D) or layers.
    pub fn slices(&self) -> u64 {
        (self.desc.depth as u64).max(1)
    }

    /// Bytes from one slice (or layer) to the next.
    pub fn slice_pitch(&self) -> u64 {
        self.pitch * self.rows()
    }

    /// Whether its slices are layers (a layered array, or a cube map's faces).
    fn has_layers(&self) -> bool {
        self.desc.flags & (flags::LAYERED | flags::CUBEMAP) != 0
    }

    /// Dimensions of its texels as textures see them: 1, 2 or 3 (a cube map is a layered
    /// 2-D array of its faces).
    pub fn dims(&self) -> u32 {
        let layered = self.has_layers();
        match (self.desc.height, self.desc.depth) {
            (0, _) => 1,
            (_, 0) => 2,
            _ if layered => 2,
            _ => 3,
        }
    }

    /// Layers of a layered array (faces of a cube map); 0 otherwise.
    pub fn layers(&self) -> u64 {
        if self.has_layers() { self.slices() } else { 0 }
    }

    /// Device address of byte `offset` of the array's texels counted row after row without
    /// gaps (how `cuMemcpyHtoA` and its kin address an array), and how many bytes follow it
    /// in the same row.
    fn linear(&self, offset: u64) -> Option<(u64, u64)> {
        let row = self.row_bytes();
        let (r, x) = (offset / row, offset % row);
        (r < self.rows() * self.slices()).then(|| (self.ptr + r * self.pitch + x, row - x))
    }

    /// The device ranges holding bytes `[offset, offset + len)` of the gapless texel order.
    pub fn runs(&self, offset: u64, len: u64) -> CuRes<Vec<(u64, u64)>> {
        let total = self.row_bytes() * self.rows() * self.slices();
        if offset.checked_add(len).is_none_or(|end| end > total) {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let (addr, room) = self.linear(at).ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
            let n = room.min(offset + len - at);
            match out.last_mut() {
                Some((a, l)) if *a + *l == addr => *l += n,
                _ => out.push((addr, n)),
            }
            at += n;
        }
        Ok(out)
    }
}

/// A live mipmapped array: one allocation holding its levels, each also an [`Array`] (with
/// `level_of` set) that copies and surfaces reach as any array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mipmapped {
    /// The context it was created in.
    pub ctx: u64,
    /// Its device memory, the first level's first texel.
    pub ptr: u64,
    /// The first level's descriptor, as created.
    pub desc: Array3DDescriptor,
    /// The levels' array handles, the first level first.
    pub levels: Vec<u64>,
    /// Bytes of the whole chain.
    pub bytes: u64,
    /// The row alignment its levels were laid out with.
    pub pitch_align: u64,
    /// The alignment of each level's first byte.
    pub level_align: u64,
}

/// The tag in every `CUmipmappedArray` handle the shim hands out.
const MIPMAPPED_TAG: u64 = 0x0a77_b000_0000_0000;

#[derive(Default)]
struct Registry {
    last: u64,
    arrays: HashMap<u64, Array>,
    mipmapped: HashMap<u64, Mipmapped>,
}

fn registry() -> MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The live array `handle` names.
pub fn get(handle: u64) -> CuRes<Array> {
    if handle == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    registry()
        .arrays
        .get(&handle)
        .copied()
        .ok_or(cuda::CUDA_ERROR_INVALID_HANDLE)
}

/// Forgets the arrays of a destroyed context (the host freed their memory with it).
pub fn context_gone(ctx: u64) {
    let mut r = registry();
    r.arrays.retain(|_, a| a.ctx != ctx);
    r.mipmapped.retain(|_, m| m.ctx != ctx);
}

/// The live mipmapped array `handle` names.
pub fn mipmapped(handle: u64) -> CuRes<Mipmapped> {
    if handle == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    registry()
        .mipmapped
        .get(&handle)
        .cloned()
        .ok_or(cuda::CUDA_ERROR_INVALID_HANDLE)
}

/// The geometry [`cuda::mip::levels`] takes for an array of descriptor `d`.
fn mip_shape(d: &Array3DDescriptor) -> mip::Shape {
    mip::Shape {
        width: d.width as u64,
        height: d.height as u64,
        depth: d.depth as u64,
        // A cube map's faces are layers: every level keeps them.
        layered: d.flags & (flags::LAYERED | flags::CUBEMAP) != 0,
        texel_bytes: cuda::channel_bytes(d.format).unwrap_or(0) * u64::from(d.num_channels),
    }
}

/// `cuMipmappedArrayCreate`: a chain of `count` levels (clamped to those the extents halve
/// into), each half the one before along every axis (layers aside), in one allocation.
pub fn create_mipmapped(d: &Array3DDescriptor, count: u32) -> CuRes<u64> {
    check(d)?;
    if d.flags & flags::TEXTURE_GATHER != 0 {
        // CUDA gathers from arrays of one level only.
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    // One- and two-dimensional mipmapped arrays have limits of their own.
    let surface = d.flags & flags::SURFACE_LDST != 0;
    let limits: &[(usize, usize)] = match (d.height, d.depth, d.flags & flags::LAYERED != 0) {
        _ if surface => &[],
        (0, 0, false) => &[(d.width, attr::MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH)],
        (_, 0, false) => &[
            (d.width, attr::MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH),
            (d.height, attr::MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT),
        ],
        _ => &[],
    };
    for &(n, a) in limits {
        if n as u64 > drv::device_limit(a)? {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
    }
    let ctx = drv::current_ctx().ok_or(cuda::CUDA_ERROR_INVALID_CONTEXT)?;
    let pitch_align = drv::device_limit(attr::TEXTURE_PITCH_ALIGNMENT)?.max(1);
    let level_align = drv::device_limit(attr::TEXTURE_ALIGNMENT)?.max(1);
    // CUDA clamps the count to the levels the extents halve into.
    let shape = mip_shape(d);
    let count = count.clamp(1, mip::max_levels(&shape).min(mip::MAX_LEVELS));
    let levels = mip::levels(&shape, count, pitch_align, level_align)
        .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    let bytes = mip::chain_bytes(&levels);
    let ptr = drv::mem_alloc(bytes)?;
    let mut r = registry();
    r.last += 1;
    let handle = MIPMAPPED_TAG | r.last;
    let mut handles = Vec::with_capacity(levels.len());
    for l in &levels {
        r.last += 1;
        let level = HANDLE_TAG | r.last;
        let as_created = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        r.arrays.insert(
            level,
            Array {
                ctx,
                ptr: ptr + l.offset,
                desc: Array3DDescriptor {
                    width: as_created(l.width),
                    height: as_created(l.height),
                    depth: as_created(l.depth),
                    ..*d
                },
                pitch: l.pitch,
                level_of: handle,
            },
        );
        handles.push(level);
    }
    r.mipmapped.insert(
        handle,
        Mipmapped {
            ctx,
            ptr,
            desc: *d,
            levels: handles,
            bytes,
            pitch_align,
            level_align,
        },
    );
    Ok(handle)
}

/// `cuMipmappedArrayDestroy`.
pub fn destroy_mipmapped(handle: u64) -> CuRes<()> {
    let m = mipmapped(handle)?;
    let in_use = {
        let r = registry();
        m.levels
            .iter()
            .filter_map(|l| r.arrays.get(l).map(|a| a.ptr))
            .collect::<Vec<_>>()
    };
    if in_use.into_iter().any(crate::textures::names_array) {
        // As for an array: not while a texture or surface object names it or a level.
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    drv::mem_free(m.ptr)?;
    let mut r = registry();
    for l in &m.levels {
        r.arrays.remove(l);
    }
    r.mipmapped.remove(&handle);
    Ok(())
}

/// Checks a descriptor against CUDA's rules and the device's limits.
fn check(d: &Array3DDescriptor) -> CuRes<()> {
    if d.flags & !flags::ALL != 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    if d.flags & !flags::SUPPORTED != 0 {
        return Err(drv::unsupported(
            "depth, sparse and deferred-mapping arrays",
        ));
    }
    if cuda::channel_bytes(d.format).is_none() {
        return Err(if d.format == 0 {
            cuda::CUDA_ERROR_INVALID_VALUE
        } else {
            drv::unsupported("arrays of packed, block-compressed or video formats")
        });
    }
    if !cuda::CHANNEL_COUNTS.contains(&d.num_channels) || d.width == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let layered = d.flags & flags::LAYERED != 0;
    let surface = d.flags & flags::SURFACE_LDST != 0;
    let (w, h, depth) = (d.width as u64, d.height as u64, d.depth as u64);
    if d.flags & flags::CUBEMAP != 0 {
        return check_cubemap(w, h, depth, layered, surface);
    }
    // (limit on width, on height, on depth or layers), as attributes.
    let limits: [(u64, usize); 3] = match (h, depth, layered, surface) {
        (0, 0, false, false) => [(w, attr::MAXIMUM_TEXTURE1D_WIDTH), (0, 0), (0, 0)],
        (0, 0, false, true) => [(w, attr::MAXIMUM_SURFACE1D_WIDTH), (0, 0), (0, 0)],
        (0, _, true, false) => [
            (w, attr::MAXIMUM_TEXTURE1D_LAYERED_WIDTH),
            (0, 0),
            (depth, attr::MAXIMUM_TEXTURE1D_LAYERED_LAYERS),
        ],
        (0, _, true, true) => [
            (w, attr::MAXIMUM_SURFACE1D_LAYERED_WIDTH),
            (0, 0),
            (depth, attr::MAXIMUM_SURFACE1D_LAYERED_LAYERS),
        ],
        (_, 0, false, false) => [
            (w, attr::MAXIMUM_TEXTURE2D_WIDTH),
            (h, attr::MAXIMUM_TEXTURE2D_HEIGHT),
            (0, 0),
        ],
        (_, 0, false, true) => [
            (w, attr::MAXIMUM_SURFACE2D_WIDTH),
            (h, attr::MAXIMUM_SURFACE2D_HEIGHT),
            (0, 0),
        ],
        (_, _, true, false) if h > 0 => [
            (w, attr::MAXIMUM_TEXTURE2D_LAYERED_WIDTH),
            (h, attr::MAXIMUM_TEXTURE2D_LAYERED_HEIGHT),
            (depth, attr::MAXIMUM_TEXTURE2D_LAYERED_LAYERS),
        ],
        (_, _, true, true) if h > 0 => [
            (w, attr::MAXIMUM_SURFACE2D_LAYERED_WIDTH),
            (h, attr::MAXIMUM_SURFACE2D_LAYERED_HEIGHT),
            (depth, attr::MAXIMUM_SURFACE2D_LAYERED_LAYERS),
        ],
        (0, _, false, _) => return Err(cuda::CUDA_ERROR_INVALID_VALUE),
        (_, _, _, false) => [
            (w, attr::MAXIMUM_TEXTURE3D_WIDTH),
            (h, attr::MAXIMUM_TEXTURE3D_HEIGHT),
            (depth, attr::MAXIMUM_TEXTURE3D_DEPTH),
        ],
        (_, _, _, true) => [
            (w, attr::MAXIMUM_SURFACE3D_WIDTH),
            (h, attr::MAXIMUM_SURFACE3D_HEIGHT),
            (depth, attr::MAXIMUM_SURFACE3D_DEPTH),
        ],
    };
    if layered && depth == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    for (n, a) in limits {
        if a != 0 && n > drv::device_limit(a)? {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
    }
    Ok(())
}

/// A cube map's extents: square faces, six of them (a multiple of six for a layered one), within
/// the device's cube map limits.
fn check_cubemap(w: u64, h: u64, faces: u64, layered: bool, surface: bool) -> CuRes<()> {
    let faces_ok = if layered {
        faces > 0 && faces.is_multiple_of(CUBE_FACES)
    } else {
        faces == CUBE_FACES
    };
    if w == 0 || w != h || !faces_ok {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let (width, layers) = match (layered, surface) {
        (false, false) => (attr::MAXIMUM_TEXTURECUBEMAP_WIDTH, None),
        (false, true) => (attr::MAXIMUM_SURFACECUBEMAP_WIDTH, None),
        (true, false) => (
            attr::MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH,
            Some(attr::MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS),
        ),
        (true, true) => (
            attr::MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH,
            Some(attr::MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS),
        ),
    };
    if w > drv::device_limit(width)? {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    if let Some(a) = layers
        && faces > drv::device_limit(a)?
    {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// Faces of a cube map.
const CUBE_FACES: u64 = 6;

/// Bytes from one row of an array to the next: the row's texels rounded up to the device's
/// texture pitch alignment, so a texture over the array is also valid pitched memory.
pub fn row_pitch(row_bytes: u64) -> CuRes<u64> {
    let align = drv::device_limit(attr::TEXTURE_PITCH_ALIGNMENT)?.max(1);
    row_bytes
        .checked_next_multiple_of(align)
        .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)
}

/// `cuArray3DCreate`: a new array's handle.
pub fn create(d: &Array3DDescriptor) -> CuRes<u64> {
    check(d)?;
    let ctx = drv::current_ctx().ok_or(cuda::CUDA_ERROR_INVALID_CONTEXT)?;
    let mut a = Array {
        ctx,
        ptr: 0,
        desc: *d,
        pitch: 0,
        level_of: 0,
    };
    a.pitch = row_pitch(a.row_bytes())?;
    let size = a
        .slice_pitch()
        .checked_mul(a.slices())
        .ok_or(cuda::CUDA_ERROR_OUT_OF_MEMORY)?;
    a.ptr = drv::mem_alloc(size)?;
    let mut r = registry();
    r.last += 1;
    let handle = HANDLE_TAG | r.last;
    r.arrays.insert(handle, a);
    Ok(handle)
}

/// `cuArrayDestroy`.
pub fn destroy(handle: u64) -> CuRes<()> {
    let a = get(handle)?;
    if a.level_of != 0 {
        // A level goes with its mipmapped array (`cuMipmappedArrayDestroy`).
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    if crate::textures::names_array(a.ptr) {
        // CUDA refuses to destroy an array a texture or surface object still names.
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    drv::mem_free(a.ptr)?;
    registry().arrays.remove(&handle);
    Ok(())
}

fn descriptor_2d(a: &Array) -> ArrayDescriptor {
    ArrayDescriptor {
        width: a.desc.width,
        height: a.desc.height,
        format: a.desc.format,
        num_channels: a.desc.num_channels,
    }
}

/// Copies `len` bytes between host memory and an array's gapless texel order.
fn host_copy(
    array: u64,
    offset: u64,
    host: u64,
    len: u64,
    to_array: bool,
    stream: u64,
    sync: bool,
) -> CuRes<()> {
    let a = get(array)?;
    if len == 0 {
        return Ok(());
    }
    if host == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    let runs = a.runs(offset, len)?;
    let n = runs.len();
    let mut at = host;
    for (i, (addr, l)) in runs.into_iter().enumerate() {
        let l_usize = usize::try_from(l).map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?;
        if to_array {
            // SAFETY: the caller's host buffer holds `len` readable bytes (CUDA contract), of
            // which this run is a part.
            let bytes = unsafe { std::slice::from_raw_parts(at as *const u8, l_usize) };
            drv::memcpy_htod(addr, bytes, stream, sync && i + 1 == n)?;
        } else {
            // SAFETY: the caller's host buffer holds `len` writable bytes (CUDA contract), of
            // which this run is a part.
            let bytes = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, l_usize) };
            drv::memcpy_dtoh(bytes, addr, stream)?;
        }
        at += l;
    }
    Ok(())
}

/// Copies `len` bytes between device memory and an array's gapless texel order.
fn device_copy(array: u64, offset: u64, dev: u64, len: u64, to_array: bool) -> CuRes<()> {
    let a = get(array)?;
    let runs = a.runs(offset, len)?;
    let n = runs.len();
    let mut at = dev;
    for (i, (addr, l)) in runs.into_iter().enumerate() {
        let (dst, src) = if to_array { (addr, at) } else { (at, addr) };
        drv::memcpy_dtod(dst, src, l, 0, i + 1 == n)?;
        at += l;
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(
    out: *mut CUhandle,
    desc: *const ArrayDescriptor,
) -> CUresult {
    ffi("cuArrayCreate_v2", || {
        // SAFETY: NULL or the caller's CUDA_ARRAY_DESCRIPTOR (CUDA contract).
        let d = unsafe { desc.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        if out.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = create(&Array3DDescriptor {
            width: d.width,
            height: d.height,
            depth: 0,
            format: d.format,
            num_channels: d.num_channels,
            flags: 0,
        })?;
        out!(out, handle as CUhandle)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    out: *mut CUhandle,
    desc: *const Array3DDescriptor,
) -> CUresult {
    ffi("cuArray3DCreate_v2", || {
        // SAFETY: NULL or the caller's CUDA_ARRAY3D_DESCRIPTOR (CUDA contract).
        let d = unsafe { desc.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        if out.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = create(d)?;
        out!(out, handle as CUhandle)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(array: CUhandle) -> CUresult {
    ffi("cuArrayDestroy", || destroy(h(array)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayGetDescriptor_v2(
    out: *mut ArrayDescriptor,
    array: CUhandle,
) -> CUresult {
    ffi("cuArrayGetDescriptor_v2", || {
        let a = get(h(array))?;
        out!(out, descriptor_2d(&a))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DGetDescriptor_v2(
    out: *mut Array3DDescriptor,
    array: CUhandle,
) -> CUresult {
    ffi("cuArray3DGetDescriptor_v2", || {
        let a = get(h(array))?;
        out!(out, a.desc)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoA_v2(
    dst: CUhandle,
    offset: usize,
    src: *const c_void,
    len: usize,
) -> CUresult {
    ffi("cuMemcpyHtoA_v2", || {
        host_copy(h(dst), offset as u64, src as u64, len as u64, true, 0, true)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoAAsync_v2(
    dst: CUhandle,
    offset: usize,
    src: *const c_void,
    len: usize,
    stream: CUhandle,
) -> CUresult {
    ffi("cuMemcpyHtoAAsync_v2", || {
        host_copy(
            h(dst),
            offset as u64,
            src as u64,
            len as u64,
            true,
            h(stream),
            false,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyAtoH_v2(
    dst: *mut c_void,
    src: CUhandle,
    offset: usize,
    len: usize,
) -> CUresult {
    ffi("cuMemcpyAtoH_v2", || {
        host_copy(
            h(src),
            offset as u64,
            dst as u64,
            len as u64,
            false,
            0,
            true,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyAtoHAsync_v2(
    dst: *mut c_void,
    src: CUhandle,
    offset: usize,
    len: usize,
    stream: CUhandle,
) -> CUresult {
    ffi("cuMemcpyAtoHAsync_v2", || {
        host_copy(
            h(src),
            offset as u64,
            dst as u64,
            len as u64,
            false,
            h(stream),
            false,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoA_v2(
    dst: CUhandle,
    offset: usize,
    src: CUdeviceptr,
    len: usize,
) -> CUresult {
    ffi("cuMemcpyDtoA_v2", || {
        device_copy(h(dst), offset as u64, src, len as u64, true)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyAtoD_v2(
    dst: CUdeviceptr,
    src: CUhandle,
    offset: usize,
    len: usize,
) -> CUresult {
    ffi("cuMemcpyAtoD_v2", || {
        device_copy(h(src), offset as u64, dst, len as u64, false)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyAtoA_v2(
    dst: CUhandle,
    dst_offset: usize,
    src: CUhandle,
    src_offset: usize,
    len: usize,
) -> CUresult {
    ffi("cuMemcpyAtoA_v2", || {
        let (d, s) = (get(h(dst))?, get(h(src))?);
        let (dst_runs, src_runs) = (
            d.runs(dst_offset as u64, len as u64)?,
            s.runs(src_offset as u64, len as u64)?,
        );
        // Walk both run lists together: each step copies what is left of the shorter run.
        let (mut di, mut si) = (dst_runs.into_iter(), src_runs.into_iter());
        let (mut dr, mut sr) = (di.next(), si.next());
        while let (Some((da, dl)), Some((sa, sl))) = (dr, sr) {
            let n = dl.min(sl);
            let last = dl == sl && di.len() == 0;
            drv::memcpy_dtod(da, sa, n, 0, last)?;
            dr = if dl > n {
                Some((da + n, dl - n))
            } else {
                di.next()
            };
            sr = if sl > n {
                Some((sa + n, sl - n))
            } else {
                si.next()
            };
        }
        Ok(())
    })
}

/// `CUDA_ARRAY_MEMORY_REQUIREMENTS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArrayMemoryRequirements {
    pub size: usize,
    pub alignment: usize,
    pub reserved: [u32; 4],
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayGetMemoryRequirements(
    out: *mut ArrayMemoryRequirements,
    array: CUhandle,
    device: i32,
) -> CUresult {
    ffi("cuArrayGetMemoryRequirements", || {
        let a = get(h(array))?;
        if device != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_DEVICE);
        }
        let size = a.slice_pitch() * a.slices();
        out!(
            out,
            ArrayMemoryRequirements {
                size: usize::try_from(size).map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?,
                alignment: usize::try_from(drv::device_limit(attr::TEXTURE_ALIGNMENT)?)
                    .map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?,
                reserved: [0; 4],
            }
        )
    })
}

/// `cuArrayGetPlane`: vgpu's arrays have one plane (no NV12 and other multi-planar formats),
/// so every call is `CUDA_ERROR_INVALID_VALUE`, as CUDA answers for single-plane arrays.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayGetPlane(
    _plane: *mut CUhandle,
    array: CUhandle,
    _index: u32,
) -> CUresult {
    ffi("cuArrayGetPlane", || {
        get(h(array))?;
        Err(cuda::CUDA_ERROR_INVALID_VALUE)
    })
}

/// `cuArrayGetSparseProperties`: vgpu's arrays are never sparse, so every call is
/// `CUDA_ERROR_INVALID_VALUE`, as CUDA answers for arrays made without `CUDA_ARRAY3D_SPARSE`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayGetSparseProperties(
    _props: *mut c_void,
    array: CUhandle,
) -> CUresult {
    ffi("cuArrayGetSparseProperties", || {
        get(h(array))?;
        Err(cuda::CUDA_ERROR_INVALID_VALUE)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    out: *mut CUhandle,
    desc: *const Array3DDescriptor,
    levels: u32,
) -> CUresult {
    ffi("cuMipmappedArrayCreate", || {
        // SAFETY: NULL or the caller's CUDA_ARRAY3D_DESCRIPTOR (CUDA contract).
        let d = unsafe { desc.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        if out.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let handle = create_mipmapped(d, levels)?;
        out!(out, handle as CUhandle)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(array: CUhandle) -> CUresult {
    ffi("cuMipmappedArrayDestroy", || destroy_mipmapped(h(array)))
}

/// `cuMipmappedArrayGetLevel`: the level's array, which copies and surface objects take as
/// any array (it goes with the mipmapped array).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayGetLevel(
    out: *mut CUhandle,
    array: CUhandle,
    level: u32,
) -> CUresult {
    ffi("cuMipmappedArrayGetLevel", || {
        let m = mipmapped(h(array))?;
        let l = usize::try_from(level)
            .ok()
            .and_then(|i| m.levels.get(i))
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        out!(out, *l as CUhandle)
    })
}

/// `cuMipmappedArrayGetMemoryRequirements`: the chain's bytes and the texture alignment.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayGetMemoryRequirements(
    out: *mut ArrayMemoryRequirements,
    array: CUhandle,
    device: i32,
) -> CUresult {
    ffi("cuMipmappedArrayGetMemoryRequirements", || {
        let m = mipmapped(h(array))?;
        if device != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_DEVICE);
        }
        out!(
            out,
            ArrayMemoryRequirements {
                size: usize::try_from(m.bytes).map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?,
                alignment: usize::try_from(m.level_align)
                    .map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?,
                reserved: [0; 4],
            }
        )
    })
}

/// `cuMipmappedArrayGetSparseProperties`: vgpu's mipmapped arrays are never sparse, so every
/// call is `CUDA_ERROR_INVALID_VALUE`, as for arrays.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayGetSparseProperties(
    _props: *mut c_void,
    array: CUhandle,
) -> CUresult {
    ffi("cuMipmappedArrayGetSparseProperties", || {
        mipmapped(h(array))?;
        Err(cuda::CUDA_ERROR_INVALID_VALUE)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array(width: usize, height: usize, depth: usize, pitch: u64) -> Array {
        Array {
            ctx: 1,
            ptr: 0x10_0000,
            desc: Array3DDescriptor {
                width,
                height,
                depth,
                format: 0x20,
                num_channels: 1,
                flags: 0,
            },
            pitch,
            level_of: 0,
        }
    }

    #[test]
    fn gapless_offsets_map_to_rows_with_their_pitch() {
        // 10 floats a row (40 bytes), rows 64 bytes apart, 3 rows.
        let a = array(10, 3, 0, 64);
        assert_eq!(a.runs(0, 40).unwrap(), vec![(0x10_0000, 40)]);
        assert_eq!(
            a.runs(36, 48).unwrap(),
            vec![
                (0x10_0000 + 36, 4),
                (0x10_0000 + 64, 40),
                (0x10_0000 + 128, 4)
            ]
        );
        assert_eq!(a.runs(119, 1).unwrap(), vec![(0x10_0000 + 128 + 39, 1)]);
        assert_eq!(a.runs(100, 21), Err(cuda::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(a.runs(u64::MAX, 2), Err(cuda::CUDA_ERROR_INVALID_VALUE));
        // Rows without padding merge into one range.
        let packed = array(16, 4, 2, 64);
        assert_eq!(packed.runs(10, 400).unwrap(), vec![(0x10_0000 + 10, 400)]);
    }

    #[test]
    fn dimensions_follow_cudas_descriptor_rules() {
        assert_eq!(array(8, 0, 0, 32).dims(), 1);
        assert_eq!(array(8, 4, 0, 32).dims(), 2);
        assert_eq!(array(8, 4, 3, 32).dims(), 3);
        let mut layered = array(8, 4, 3, 32);
        layered.desc.flags = flags::LAYERED;
        assert_eq!((layered.dims(), layered.layers()), (2, 3));
        layered.desc.height = 0;
        assert_eq!((layered.dims(), layered.layers()), (1, 3));
        assert_eq!(layered.slice_pitch(), 32);
    }
}
