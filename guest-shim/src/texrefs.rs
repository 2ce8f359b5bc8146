//! Texture and surface references (`cuModuleGetTexRef`, `cuTexRef*`, `cuModuleGetSurfRef`,
//! `cuSurfRef*`): CUDA 11's `texture<>` and `surface<>` templates, which NVIDIA's CUDA 11 runtime
//! binds with `cudaBindTexture`, `cudaBindTexture2D`, `cudaBindTextureToArray` and
//! `cudaBindSurfaceToArray` (CUDA 12 removed them from the runtime).
//!
//! A module's reference is an 8-byte slot among its globals (`.global .texref`), where the
//! simulated GPU's kernels find the handle of the texture or surface object the reference is
//! bound to ([`crate::textures`]). The shim keeps each reference's state (format, address
//! modes, filtering, flags, border colour, what it is bound to); binding it, or changing its
//! state while bound, makes a new object with the current state, writes its handle into the slot
//! (a synchronous copy, so kernels launched before keep what they were launched with, as in CUDA)
//! and destroys the object before. `cuTexRefCreate` makes a reference outside any module (the
//! launch API before CUDA 4.0), which keeps its state but which no kernel reads; mipmapped arrays
//! are not offered.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint};
use std::sync::{Mutex, MutexGuard, OnceLock};

use vgpu_proto::cuda::{self, TextureDesc, attr};

use crate::arrays::{self, ArrayDescriptor};
use crate::driver::{self as drv, CuRes};
use crate::exports::{CUdeviceptr, CUhandle, h};
use crate::ffi::{CUresult, ffi};
use crate::out;
use crate::textures::{self, ResourceDesc, restype};

/// The tag in every `CUtexref`/`CUsurfref` handle the shim hands out.
const HANDLE_TAG: u64 = 0x07e4_f000_0000_0000;
/// The slot of a reference outside any module (`cuTexRefCreate`).
const NO_SLOT: u64 = 0;
/// The module of a reference outside any module.
const NO_MODULE: u64 = 0;
/// `CU_TRSA_OVERRIDE_FORMAT`: the array's format replaces the reference's.
const TRSA_OVERRIDE_FORMAT: c_uint = 1;
/// `CU_PARAM_TR_DEFAULT`: the only texture unit `cuParamSetTexRef` takes.
const PARAM_TR_DEFAULT: c_int = -1;
/// `CU_TR_ADDRESS_MODE_CLAMP`.
const ADDRESS_CLAMP: u32 = 1;
/// `CUaddress_mode` values: wrap, clamp, mirror, border.
const ADDRESS_MODES: u32 = 4;
/// `CU_TR_FILTER_MODE_LINEAR`, the last filter mode.
const FILTER_LINEAR: u32 = 1;
/// `CU_AD_FORMAT_FLOAT`: a new reference's format.
const FORMAT_FLOAT: u32 = 0x20;

/// What a reference is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Binding {
    None,
    /// Linear memory from `base` (at the texture alignment), `bytes` long.
    Linear {
        base: u64,
        bytes: u64,
    },
    /// Pitched memory.
    Pitch2D {
        ptr: u64,
        width: u64,
        height: u64,
        pitch: u64,
    },
    /// A CUDA array (its handle).
    Array(u64),
    /// A mipmapped array (its handle).
    Mipmapped(u64),
}

/// One texture or surface reference.
#[derive(Debug, Clone, Copy)]
struct Reference {
    module: u64,
    surface: bool,
    /// Device address of its handle slot.
    slot: u64,
    format: u32,
    channels: u32,
    address: [u32; 3],
    filter: u32,
    flags: u32,
    border: [f32; 4],
    max_anisotropy: u32,
    mipmap_filter: u32,
    mipmap_bias: f32,
    mipmap_clamp: [f32; 2],
    binding: Binding,
    /// The object bound now (0: none).
    object: u64,
}

#[derive(Default)]
struct Registry {
    last: u64,
    refs: HashMap<u64, Reference>,
    /// (module, name, surface) → handle, so that a reference has one handle.
    by_name: HashMap<(u64, String, bool), u64>,
}

fn registry() -> MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn get(handle: u64, surface: bool) -> CuRes<Reference> {
    get_any(handle)
        .ok()
        .filter(|r| r.surface == surface)
        .ok_or(cuda::CUDA_ERROR_INVALID_HANDLE)
}

/// Destroys the objects of an unloaded module's references and forgets them.
pub fn module_gone(module: u64) {
    let gone: Vec<Reference> = {
        let mut r = registry();
        let handles: Vec<u64> = r
            .refs
            .iter()
            .filter(|(_, x)| x.module == module)
            .map(|(h, _)| *h)
            .collect();
        r.by_name.retain(|(m, _, _), _| *m != module);
        handles
            .into_iter()
            .filter_map(|h| r.refs.remove(&h))
            .collect()
    };
    for x in gone.into_iter().filter(|x| x.object != 0) {
        let _ = textures::destroy(x.object, x.surface);
    }
}

/// A new texture reference's state: CUDA's defaults, unbound.
fn new_reference(module: u64, surface: bool, slot: u64) -> Reference {
    Reference {
        module,
        surface,
        slot,
        format: FORMAT_FLOAT,
        channels: 1,
        address: [ADDRESS_CLAMP; 3],
        filter: 0,
        flags: 0,
        border: [0.0; 4],
        max_anisotropy: 0,
        mipmap_filter: 0,
        mipmap_bias: 0.0,
        mipmap_clamp: [0.0; 2],
        binding: Binding::None,
        object: 0,
    }
}

/// Registers `x` under a new handle.
fn insert(r: &mut Registry, x: Reference) -> u64 {
    r.last += 1;
    let handle = HANDLE_TAG | r.last;
    r.refs.insert(handle, x);
    handle
}

fn lookup(module: u64, name: *const c_char, surface: bool) -> CuRes<u64> {
    if name.is_null() || module == 0 {
        return Err(cuda::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: a NUL-terminated name (CUDA contract).
    let name = unsafe { CStr::from_ptr(name) }
        .to_str()
        .map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?
        .to_string();
    if let Some(&h) = registry().by_name.get(&(module, name.clone(), surface)) {
        return Ok(h);
    }
    let slot = drv::module_reference(module, &name, surface)?;
    let mut r = registry();
    let handle = insert(&mut r, new_reference(module, surface, slot));
    r.by_name.insert((module, name, surface), handle);
    Ok(handle)
}

/// The resource a reference's binding names.
fn resource(x: &Reference) -> Option<ResourceDesc> {
    let format_channels = u64::from(x.format) | u64::from(x.channels) << 32;
    let mut res = [0u64; 16];
    let res_type = match x.binding {
        Binding::None => return None,
        Binding::Linear { base, bytes } => {
            (res[0], res[1], res[2]) = (base, format_channels, bytes);
            restype::LINEAR
        }
        Binding::Pitch2D {
            ptr,
            width,
            height,
            pitch,
        } => {
            (res[0], res[1], res[2], res[3], res[4]) = (ptr, format_channels, width, height, pitch);
            restype::PITCH2D
        }
        Binding::Array(a) => {
            res[0] = a;
            restype::ARRAY
        }
        Binding::Mipmapped(m) => {
            res[0] = m;
            restype::MIPMAPPED_ARRAY
        }
    };
    Some(ResourceDesc {
        res_type,
        pad: 0,
        res,
        flags: 0,
        pad2: 0,
    })
}

/// Makes the object of `handle`'s current state (none when unbound), writes its handle into
/// the reference's slot, and destroys the object before.
fn rebind(handle: u64) -> CuRes<()> {
    let x = get_any(handle)?;
    if x.slot == NO_SLOT {
        // A reference of `cuTexRefCreate`: no kernel reads it, so it keeps its state only.
        return Ok(());
    }
    let object = match resource(&x) {
        None => 0,
        Some(res) if x.surface => textures::make_surface(res, false)?,
        Some(res) => textures::make_texture(
            res,
            TextureDesc {
                address_mode: x.address,
                filter_mode: x.filter,
                flags: x.flags,
                max_anisotropy: x.max_anisotropy,
                mipmap_filter_mode: x.mipmap_filter,
                mipmap_level_bias: x.mipmap_bias,
                min_mipmap_level_clamp: x.mipmap_clamp[0],
                max_mipmap_level_clamp: x.mipmap_clamp[1],
                border_color: x.border,
                reserved: [0; 12],
            },
            false,
        )?,
    };
    if let Err(e) = drv::memcpy_htod(x.slot, &object.to_le_bytes(), 0, true) {
        if object != 0 {
            let _ = textures::destroy(object, x.surface);
        }
        return Err(e);
    }
    let before = {
        let mut r = registry();
        let Some(entry) = r.refs.get_mut(&handle) else {
            return Err(cuda::CUDA_ERROR_INVALID_HANDLE);
        };
        std::mem::replace(&mut entry.object, object)
    };
    if before != 0 {
        let _ = textures::destroy(before, x.surface);
    }
    Ok(())
}

fn get_any(handle: u64) -> CuRes<Reference> {
    registry()
        .refs
        .get(&handle)
        .copied()
        .ok_or(cuda::CUDA_ERROR_INVALID_HANDLE)
}

/// Changes a texture reference's state with `f`, then rebinds it if it is bound.
fn update(handle: u64, f: impl FnOnce(&mut Reference) -> CuRes<()>) -> CuRes<()> {
    update_ref(handle, false, f)
}

/// Changes a texture (or, `surface`, a surface) reference's state with `f`, then rebinds it if
/// it is bound; a failed rebinding keeps the state before.
fn update_ref(
    handle: u64,
    surface: bool,
    f: impl FnOnce(&mut Reference) -> CuRes<()>,
) -> CuRes<()> {
    let (bound, old) = {
        let mut r = registry();
        let x = r
            .refs
            .get_mut(&handle)
            .filter(|x| x.surface == surface)
            .ok_or(cuda::CUDA_ERROR_INVALID_HANDLE)?;
        let old = *x;
        f(x)?;
        (x.binding != Binding::None, old)
    };
    if !bound {
        return Ok(());
    }
    rebind(handle).inspect_err(|_| {
        // The state the failed change asked for is not kept.
        if let Some(x) = registry().refs.get_mut(&handle) {
            let object = x.object;
            *x = Reference { object, ..old };
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetTexRef(
    out: *mut CUhandle,
    module: CUhandle,
    name: *const c_char,
) -> CUresult {
    ffi("cuModuleGetTexRef", || {
        if out.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(out, lookup(h(module), name, false)? as CUhandle)
    })
}

/// `cuTexRefCreate` (deprecated): a texture reference outside any module, for the launch API
/// before CUDA 4.0. Its state is kept and can be read back, bound and unbound; since no kernel
/// declares it, no kernel reads it (in CUDA a kernel reads a module's references).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefCreate(out: *mut CUhandle) -> CUresult {
    ffi("cuTexRefCreate", || {
        if out.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        drv::ctx()?;
        let handle = insert(&mut registry(), new_reference(NO_MODULE, false, NO_SLOT));
        out!(out, handle as CUhandle)
    })
}

/// `cuTexRefDestroy` (deprecated): a reference `cuTexRefCreate` made (a module's go with it).
#[unsafe(no_mangle)]
pub extern "C" fn cuTexRefDestroy(texref: CUhandle) -> CUresult {
    ffi("cuTexRefDestroy", || {
        let mut r = registry();
        match r.refs.get(&h(texref)) {
            Some(x) if x.module == NO_MODULE && !x.surface => {
                r.refs.remove(&h(texref));
                Ok(())
            }
            _ => Err(cuda::CUDA_ERROR_INVALID_HANDLE),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetSurfRef(
    out: *mut CUhandle,
    module: CUhandle,
    name: *const c_char,
) -> CUresult {
    ffi("cuModuleGetSurfRef", || {
        if out.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        out!(out, lookup(h(module), name, true)? as CUhandle)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefSetArray(
    texref: CUhandle,
    array: CUhandle,
    flags: c_uint,
) -> CUresult {
    ffi("cuTexRefSetArray", || {
        // CUDA documents `CU_TRSA_OVERRIDE_FORMAT`; its runtime passes 0. Either way the
        // array's texels are sampled in the array's format.
        if flags & !TRSA_OVERRIDE_FORMAT != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let a = arrays::get(h(array))?;
        update(h(texref), |x| {
            x.binding = Binding::Array(h(array));
            (x.format, x.channels) = (a.desc.format, a.desc.num_channels);
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefSetAddress_v2(
    offset: *mut usize,
    texref: CUhandle,
    ptr: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    ffi("cuTexRefSetAddress_v2", || {
        if ptr == 0 {
            // Unbinds: the slot holds 0 and the object goes.
            registry()
                .refs
                .get_mut(&h(texref))
                .filter(|x| !x.surface)
                .ok_or(cuda::CUDA_ERROR_INVALID_HANDLE)?
                .binding = Binding::None;
            return rebind(h(texref));
        }
        // Bind from the texture alignment below `ptr`; fetches add the offset, as in CUDA.
        let align = drv::device_limit(attr::TEXTURE_ALIGNMENT)?.max(1);
        let skew = ptr % align;
        update(h(texref), |x| {
            x.binding = Binding::Linear {
                base: ptr - skew,
                bytes: (bytes as u64).saturating_add(skew),
            };
            Ok(())
        })?;
        if !offset.is_null() {
            out!(offset, skew as usize)?;
        }
        Ok(())
    })
}

/// `cuTexRefSetAddress2D` (`_v2` and `_v3` share the signature).
fn set_address_2d(
    texref: CUhandle,
    desc: *const ArrayDescriptor,
    ptr: CUdeviceptr,
    pitch: usize,
) -> CuRes<()> {
    // SAFETY: NULL or the caller's CUDA_ARRAY_DESCRIPTOR (CUDA contract).
    let d = *unsafe { desc.as_ref() }.ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
    update(h(texref), |x| {
        x.binding = Binding::Pitch2D {
            ptr,
            width: d.width as u64,
            height: d.height as u64,
            pitch: pitch as u64,
        };
        (x.format, x.channels) = (d.format, d.num_channels);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefSetAddress2D_v3(
    texref: CUhandle,
    desc: *const ArrayDescriptor,
    ptr: CUdeviceptr,
    pitch: usize,
) -> CUresult {
    ffi("cuTexRefSetAddress2D_v3", || {
        set_address_2d(texref, desc, ptr, pitch)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefSetAddress2D_v2(
    texref: CUhandle,
    desc: *const ArrayDescriptor,
    ptr: CUdeviceptr,
    pitch: usize,
) -> CUresult {
    ffi("cuTexRefSetAddress2D_v2", || {
        set_address_2d(texref, desc, ptr, pitch)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuTexRefSetFormat(texref: CUhandle, format: u32, channels: c_int) -> CUresult {
    ffi("cuTexRefSetFormat", || {
        let channels = u32::try_from(channels).map_err(|_| cuda::CUDA_ERROR_INVALID_VALUE)?;
        if cuda::channel_bytes(format).is_none() || !cuda::CHANNEL_COUNTS.contains(&channels) {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        update(h(texref), |x| {
            (x.format, x.channels) = (format, channels);
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuTexRefSetAddressMode(texref: CUhandle, dim: c_int, mode: u32) -> CUresult {
    ffi("cuTexRefSetAddressMode", || {
        let dim = usize::try_from(dim)
            .ok()
            .filter(|&d| d < 3)
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        if mode >= ADDRESS_MODES {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        update(h(texref), |x| {
            x.address[dim] = mode;
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuTexRefSetFilterMode(texref: CUhandle, mode: u32) -> CUresult {
    ffi("cuTexRefSetFilterMode", || {
        if mode > FILTER_LINEAR {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        update(h(texref), |x| {
            x.filter = mode;
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuTexRefSetFlags(texref: CUhandle, flags: c_uint) -> CUresult {
    ffi("cuTexRefSetFlags", || {
        update(h(texref), |x| {
            x.flags = flags;
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefSetBorderColor(texref: CUhandle, color: *const f32) -> CUresult {
    ffi("cuTexRefSetBorderColor", || {
        if color.is_null() {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: four floats (CUDA contract).
        let c = unsafe { std::ptr::read_unaligned(color.cast::<[f32; 4]>()) };
        update(h(texref), |x| {
            x.border = c;
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuTexRefSetMaxAnisotropy(texref: CUhandle, max: c_uint) -> CUresult {
    ffi("cuTexRefSetMaxAnisotropy", || {
        update(h(texref), |x| {
            x.max_anisotropy = max;
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuTexRefSetMipmapFilterMode(texref: CUhandle, mode: u32) -> CUresult {
    ffi("cuTexRefSetMipmapFilterMode", || {
        update(h(texref), |x| {
            x.mipmap_filter = mode;
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuTexRefSetMipmapLevelBias(texref: CUhandle, bias: f32) -> CUresult {
    ffi("cuTexRefSetMipmapLevelBias", || {
        update(h(texref), |x| {
            x.mipmap_bias = bias;
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuTexRefSetMipmapLevelClamp(texref: CUhandle, min: f32, max: f32) -> CUresult {
    ffi("cuTexRefSetMipmapLevelClamp", || {
        update(h(texref), |x| {
            x.mipmap_clamp = [min, max];
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuTexRefSetMipmappedArray(
    texref: CUhandle,
    array: CUhandle,
    flags: c_uint,
) -> CUresult {
    ffi("cuTexRefSetMipmappedArray", || {
        // As `cuTexRefSetArray`: the texels are sampled in the array's format.
        if flags & !TRSA_OVERRIDE_FORMAT != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let m = arrays::mipmapped(h(array))?;
        update(h(texref), |x| {
            x.binding = Binding::Mipmapped(h(array));
            (x.format, x.channels) = (m.desc.format, m.desc.num_channels);
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefGetAddress_v2(
    out: *mut CUdeviceptr,
    texref: CUhandle,
) -> CUresult {
    ffi("cuTexRefGetAddress_v2", || {
        match get(h(texref), false)?.binding {
            Binding::Linear { base, .. } => out!(out, base),
            Binding::Pitch2D { ptr, .. } => out!(out, ptr),
            _ => Err(cuda::CUDA_ERROR_INVALID_VALUE),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefGetArray(out: *mut CUhandle, texref: CUhandle) -> CUresult {
    ffi("cuTexRefGetArray", || {
        match get(h(texref), false)?.binding {
            Binding::Array(a) => out!(out, a as CUhandle),
            _ => Err(cuda::CUDA_ERROR_INVALID_VALUE),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefGetMipmappedArray(
    out: *mut CUhandle,
    texref: CUhandle,
) -> CUresult {
    ffi("cuTexRefGetMipmappedArray", || {
        match get(h(texref), false)?.binding {
            Binding::Mipmapped(m) => out!(out, m as CUhandle),
            _ => Err(cuda::CUDA_ERROR_INVALID_VALUE),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefGetAddressMode(
    out: *mut u32,
    texref: CUhandle,
    dim: c_int,
) -> CUresult {
    ffi("cuTexRefGetAddressMode", || {
        let x = get(h(texref), false)?;
        let dim = usize::try_from(dim)
            .ok()
            .filter(|&d| d < 3)
            .ok_or(cuda::CUDA_ERROR_INVALID_VALUE)?;
        out!(out, x.address[dim])
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefGetFilterMode(out: *mut u32, texref: CUhandle) -> CUresult {
    ffi("cuTexRefGetFilterMode", || {
        out!(out, get(h(texref), false)?.filter)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefGetFormat(
    format: *mut u32,
    channels: *mut c_int,
    texref: CUhandle,
) -> CUresult {
    ffi("cuTexRefGetFormat", || {
        let x = get(h(texref), false)?;
        out!(format, x.format)?;
        if !channels.is_null() {
            out!(channels, x.channels as c_int)?;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefGetFlags(out: *mut c_uint, texref: CUhandle) -> CUresult {
    ffi("cuTexRefGetFlags", || {
        out!(out, get(h(texref), false)?.flags)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefGetBorderColor(out: *mut f32, texref: CUhandle) -> CUresult {
    ffi("cuTexRefGetBorderColor", || {
        let c = get(h(texref), false)?.border;
        out!(out.cast::<[f32; 4]>(), c)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefGetMaxAnisotropy(out: *mut c_int, texref: CUhandle) -> CUresult {
    ffi("cuTexRefGetMaxAnisotropy", || {
        out!(out, get(h(texref), false)?.max_anisotropy as c_int)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefGetMipmapFilterMode(out: *mut u32, texref: CUhandle) -> CUresult {
    ffi("cuTexRefGetMipmapFilterMode", || {
        out!(out, get(h(texref), false)?.mipmap_filter)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefGetMipmapLevelBias(out: *mut f32, texref: CUhandle) -> CUresult {
    ffi("cuTexRefGetMipmapLevelBias", || {
        out!(out, get(h(texref), false)?.mipmap_bias)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuTexRefGetMipmapLevelClamp(
    min: *mut f32,
    max: *mut f32,
    texref: CUhandle,
) -> CUresult {
    ffi("cuTexRefGetMipmapLevelClamp", || {
        let c = get(h(texref), false)?.mipmap_clamp;
        out!(min, c[0])?;
        out!(max, c[1])
    })
}

/// `cuParamSetTexRef` (the launch API before CUDA 4.0): a module's references reach its
/// kernels without it; only the default unit is taken, as in CUDA.
#[unsafe(no_mangle)]
pub extern "C" fn cuParamSetTexRef(_f: CUhandle, unit: c_int, texref: CUhandle) -> CUresult {
    ffi("cuParamSetTexRef", || {
        get(h(texref), false)?;
        if unit != PARAM_TR_DEFAULT {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuSurfRefSetArray(surfref: CUhandle, array: CUhandle, flags: c_uint) -> CUresult {
    ffi("cuSurfRefSetArray", || {
        if flags != 0 {
            return Err(cuda::CUDA_ERROR_INVALID_VALUE);
        }
        let a = arrays::get(h(array))?;
        update_ref(h(surfref), true, |x| {
            x.binding = Binding::Array(h(array));
            (x.format, x.channels) = (a.desc.format, a.desc.num_channels);
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuSurfRefGetArray(out: *mut CUhandle, surfref: CUhandle) -> CUresult {
    ffi("cuSurfRefGetArray", || {
        match get(h(surfref), true)?.binding {
            Binding::Array(a) => out!(out, a as CUhandle),
            _ => Err(cuda::CUDA_ERROR_INVALID_VALUE),
        }
    })
}
