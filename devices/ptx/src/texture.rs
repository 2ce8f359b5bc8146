//! Texture and surface objects as a kernel sees them.
//!
//! A kernel names a texture or surface object by a 64-bit handle (`cudaTextureObject_t`,
//! `cudaSurfaceObject_t`) that it receives as a parameter; the interpreter asks the tenant's
//! [`crate::GlobalMemory`] what the handle names ([`crate::GlobalMemory::texture`],
//! [`crate::GlobalMemory::surface`]) and reads or writes the texels through the same checked
//! global memory as `ld.global` and `st.global`. A handle the tenant does not own faults like an
//! illegal address.
//!
//! Texels are laid out linearly: texel `(x, y, z)` of layer `l` lives at
//! `base + (l + z) * slice_pitch + y * pitch + x * texel_bytes`, so CUDA arrays (which the
//! simulated GPU stores row by row), pitched 2-D memory and linear memory share one layout.
//!
//! A kernel may also name the object through a texture or surface *reference* (CUDA 11's
//! `texture<>`/`surface<>` templates: `.global .texref NAME;`, `.global .surfref NAME;`). Each
//! reference is an 8-byte module variable ([`crate::GlobalVar::reference`]) in which the driver
//! stores the handle of the object it is bound to (0 when unbound); `tex`, `tld4`, `txq`, `suld`,
//! `sust` and `suq` read the handle from there through checked global memory, then proceed as
//! with a handle in a register.

/// What a module-scope texture or surface reference variable names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReferenceKind {
    /// `.texref`: holds a texture object handle; `tex`, `tld4` and `txq` take it.
    Texture,
    /// `.surfref`: holds a surface object handle; `suld`, `sust` and `suq` take it.
    Surface,
}

impl ReferenceKind {
    /// Bytes of the variable that holds the bound handle.
    pub const HANDLE_BYTES: usize = 8;

    /// The kind a PTX variable type names (`texref`, `surfref`), if any.
    pub(crate) fn parse(ty: &str) -> Option<ReferenceKind> {
        match ty {
            "texref" => Some(ReferenceKind::Texture),
            "surfref" => Some(ReferenceKind::Surface),
            _ => None,
        }
    }

    /// The PTX spelling of the variable type.
    pub(crate) fn directive(self) -> &'static str {
        match self {
            ReferenceKind::Texture => ".texref",
            ReferenceKind::Surface => ".surfref",
        }
    }
}

/// The type of each channel of a texel (`CUarray_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChannelFormat {
    /// `CU_AD_FORMAT_UNSIGNED_INT8`.
    U8,
    /// `CU_AD_FORMAT_UNSIGNED_INT16`.
    U16,
    /// `CU_AD_FORMAT_UNSIGNED_INT32`.
    U32,
    /// `CU_AD_FORMAT_SIGNED_INT8`.
    S8,
    /// `CU_AD_FORMAT_SIGNED_INT16`.
    S16,
    /// `CU_AD_FORMAT_SIGNED_INT32`.
    S32,
    /// `CU_AD_FORMAT_HALF`.
    F16,
    /// `CU_AD_FORMAT_FLOAT`.
    F32,
}

impl ChannelFormat {
    /// Bytes of one channel.
    pub fn bytes(self) -> u64 {
        match self {
            ChannelFormat::U8 | ChannelFormat::S8 => 1,
            ChannelFormat::U16 | ChannelFormat::S16 | ChannelFormat::F16 => 2,
            ChannelFormat::U32 | ChannelFormat::S32 | ChannelFormat::F32 => 4,
        }
    }

    /// Whether the channel holds an integer (which a texture may read as a normalized float).
    pub fn is_integer(self) -> bool {
        !matches!(self, ChannelFormat::F16 | ChannelFormat::F32)
    }
}

/// Where the texels are and how they are arranged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Device address of texel (0, 0, 0) of layer 0.
    pub base: u64,
    /// Type of each channel.
    pub format: ChannelFormat,
    /// Channels per texel: 1, 2 or 4.
    pub channels: u8,
    /// Dimensions: 1, 2 or 3.
    pub dims: u8,
    /// Texels per row.
    pub width: u64,
    /// Rows per slice (1 for one-dimensional resources).
    pub height: u64,
    /// Slices (1 unless `dims` is 3).
    pub depth: u64,
    /// Layers of a layered 1-D or 2-D resource; 0 when not layered.
    pub layers: u64,
    /// Bytes from one row to the next.
    pub pitch: u64,
    /// Bytes from one slice (or layer) to the next.
    pub slice_pitch: u64,
}

impl Layout {
    /// Bytes of one texel.
    pub fn texel_bytes(&self) -> u64 {
        self.format.bytes() * u64::from(self.channels)
    }
}

/// How coordinates out of range are resolved (`CUaddress_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressMode {
    /// `CU_TR_ADDRESS_MODE_WRAP` (normalized coordinates only; clamp otherwise).
    Wrap,
    /// `CU_TR_ADDRESS_MODE_CLAMP`.
    Clamp,
    /// `CU_TR_ADDRESS_MODE_MIRROR` (normalized coordinates only; clamp otherwise).
    Mirror,
    /// `CU_TR_ADDRESS_MODE_BORDER`: the border colour outside.
    Border,
}

impl AddressMode {
    /// The mode's `cudaTextureAddressMode` value (what `txq.addr_mode_N` returns).
    pub fn code(self) -> u32 {
        match self {
            AddressMode::Wrap => 0,
            AddressMode::Clamp => 1,
            AddressMode::Mirror => 2,
            AddressMode::Border => 3,
        }
    }
}

/// How a texel is chosen between texel centres (`CUfilter_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FilterMode {
    /// `CU_TR_FILTER_MODE_POINT`: the nearest texel.
    Point,
    /// `CU_TR_FILTER_MODE_LINEAR`: linear interpolation of the nearest 2, 4 or 8 texels, with
    /// 8 bits of fraction as on NVIDIA GPUs.
    Linear,
}

impl FilterMode {
    /// The mode's `cudaTextureFilterMode` value (what `txq.filter_mode` returns).
    pub fn code(self) -> u32 {
        match self {
            FilterMode::Point => 0,
            FilterMode::Linear => 1,
        }
    }
}

/// How a texture object samples its texels (`CUDA_TEXTURE_DESC`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// Address mode of each dimension.
    pub address: [AddressMode; 3],
    /// Filter mode.
    pub filter: FilterMode,
    /// `CU_TRSF_READ_AS_INTEGER`: integer channels are returned as they are; otherwise 8- and
    /// 16-bit integer channels are returned as floats normalized to [0, 1] (unsigned) or
    /// [-1, 1] (signed).
    pub read_as_integer: bool,
    /// `CU_TRSF_NORMALIZED_COORDINATES`: coordinates in [0, 1) span the resource.
    pub normalized_coords: bool,
    /// Border colour for [`AddressMode::Border`].
    pub border_color: [f32; 4],
    /// The mipmap levels and how a fetch chooses among them.
    pub mip: MipSampler,
}

/// How a fetch with a level of detail (`tex.level`, `tex.grad`) chooses among a mipmapped
/// texture's levels (`CUDA_TEXTURE_DESC`'s mipmap fields). Level 0 is the view's
/// [`Layout`]; the others come from [`crate::GlobalMemory::texture_level`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MipSampler {
    /// Levels of the resource: 1 when it is not mipmapped.
    pub levels: u32,
    /// Between two levels: the nearer one ([`FilterMode::Point`]) or both, blended.
    pub filter: FilterMode,
    /// Added to every level of detail.
    pub bias: f32,
    /// Lowest level of detail a fetch uses.
    pub min_clamp: f32,
    /// Highest level of detail a fetch uses.
    pub max_clamp: f32,
}

impl MipSampler {
    /// A resource of one level.
    pub const ONE_LEVEL: MipSampler = MipSampler {
        levels: 1,
        filter: FilterMode::Point,
        bias: 0.0,
        min_clamp: 0.0,
        max_clamp: 0.0,
    };
}

/// What a texture object handle names.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TextureView {
    /// The texels.
    pub layout: Layout,
    /// How they are sampled.
    pub sampler: Sampler,
}

/// What a surface object handle names: a CUDA array's texels, read and written by byte
/// coordinates (`suld`, `sust`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SurfaceView {
    /// The texels.
    pub layout: Layout,
}

// ---- sampling --------------------------------------------------------------------------------
//
// Pure functions: they read texels through a caller-supplied `read(address, bytes)` (the
// interpreter passes its checked global-memory load), so a texel outside the tenant's memory
// faults exactly like `ld.global`, and the unit tests below can sample a plain byte vector.

/// Bits of fraction of the linear-filtering weights: NVIDIA GPUs keep α, β, γ in 9-bit fixed
/// point with 8 fractional bits (CUDA programming guide, "Linear Filtering").
pub const FILTER_FRACTION_BITS: u32 = 8;
/// Steps of one texel of the quantized filtering weights (2^8).
const FILTER_STEPS: f32 = (1u32 << FILTER_FRACTION_BITS) as f32;
/// Largest extent of one axis the address arithmetic works with; larger extents are cut to it
/// (no tenant allocates a texture that large, and it keeps `2 * n` in range of `i64`).
const MAX_AXIS: u64 = 1 << 40;
/// Largest value of an unsigned 8-bit channel, the divisor of its normalized float.
const U8_MAX: f32 = u8::MAX as f32;
/// Largest value of an unsigned 16-bit channel.
const U16_MAX: f32 = u16::MAX as f32;
/// Largest value of a signed 8-bit channel.
const S8_MAX: f32 = i8::MAX as f32;
/// Largest value of a signed 16-bit channel.
const S16_MAX: f32 = i16::MAX as f32;
/// Index of the alpha channel, which reads 1 when the texel has none.
const ALPHA: usize = 3;
/// The four texels of a 2×2 bilinear footprint in the order `tld4` returns them, as offsets
/// from the upper-left texel `(i, j)`: counter-clockwise from the lower left, i.e.
/// `(i, j+1)`, `(i+1, j+1)`, `(i+1, j)`, `(i, j)` (PTX ISA, `tld4`).
pub const GATHER_ORDER: [(i64, i64); 4] = [(0, 1), (1, 1), (1, 0), (0, 0)];

/// Coordinates of a texture fetch as the instruction gives them (`tex`'s coordinate type).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Coords {
    /// `.f32` coordinates: sampled with the sampler's coordinate normalization, address modes
    /// and filter.
    Float([f32; 3]),
    /// `.s32` coordinates (`tex1Dfetch`): unnormalized texel indices, never filtered; a fetch
    /// outside the resource returns zeros.
    Int([i32; 3]),
}

/// What a fetch returns: four 32-bit channels, each an `f32` (`float`) or an integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Texel {
    /// Bits of each channel (r, g, b, a).
    pub bits: [u32; 4],
    /// Whether the channels are `f32` bits (float or normalized-integer textures) or integers.
    pub float: bool,
}

impl Texel {
    /// The channels as floats.
    pub fn floats(&self) -> [f32; 4] {
        self.bits.map(f32::from_bits)
    }

    /// A texel of four zeros.
    fn zero(float: bool) -> Texel {
        Texel {
            bits: [0; 4],
            float,
        }
    }
}

/// How `suld` and `sust` resolve coordinates outside the surface (the `.trap`, `.clamp` and
/// `.zero` modifiers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SurfaceClamp {
    /// Out of range faults.
    Trap,
    /// Out of range accesses the nearest location inside.
    Clamp,
    /// Out of range loads zeros and drops stores.
    Zero,
}

/// Where a surface access goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SurfaceAccess {
    /// The device address of the first byte.
    At(u64),
    /// Out of range under [`SurfaceClamp::Zero`]: load zeros, drop the store.
    Zero,
    /// Out of range under [`SurfaceClamp::Trap`] (or a surface too small for the access):
    /// fault.
    OutOfRange,
}

/// Whether fetches from `view` return floats: float channels always, 8- and 16-bit integer
/// channels unless read as integers; 32-bit integer channels are always returned as they are.
pub fn returns_float(view: &TextureView) -> bool {
    match view.layout.format {
        ChannelFormat::F16 | ChannelFormat::F32 => true,
        ChannelFormat::U8 | ChannelFormat::U16 | ChannelFormat::S8 | ChannelFormat::S16 => {
            !view.sampler.read_as_integer
        }
        ChannelFormat::U32 | ChannelFormat::S32 => false,
    }
}

/// The value of one channel read as `raw` (its little-endian bytes) from a texel of `format`:
/// `f32` bits when `normalize` (integer channels of 8 and 16 bits become floats in [0, 1] or
/// [-1, 1]; half floats are widened), the integer otherwise (signed channels sign-extended).
pub fn channel_value(format: ChannelFormat, raw: u64, normalize: bool) -> u32 {
    match format {
        ChannelFormat::U8 if normalize => (raw as u8 as f32 / U8_MAX).to_bits(),
        ChannelFormat::U16 if normalize => (raw as u16 as f32 / U16_MAX).to_bits(),
        ChannelFormat::S8 if normalize => (f32::from(raw as u8 as i8) / S8_MAX).max(-1.0).to_bits(),
        ChannelFormat::S16 if normalize => {
            (f32::from(raw as u16 as i16) / S16_MAX).max(-1.0).to_bits()
        }
        ChannelFormat::U8 => u32::from(raw as u8),
        ChannelFormat::U16 => u32::from(raw as u16),
        ChannelFormat::S8 => i32::from(raw as u8 as i8) as u32,
        ChannelFormat::S16 => i32::from(raw as u16 as i16) as u32,
        ChannelFormat::U32 | ChannelFormat::S32 | ChannelFormat::F32 => raw as u32,
        ChannelFormat::F16 => crate::float::f16_to_f32(raw as u16).to_bits(),
    }
}

/// Texels along each axis (width, height, depth); axes the resource lacks count 1.
fn extents(l: &Layout) -> [u64; 3] {
    let dims = axes(l);
    let e = [l.width, l.height, l.depth];
    std::array::from_fn(|a| if a < dims { e[a].clamp(1, MAX_AXIS) } else { 1 })
}

/// Axes of the resource: `dims` cut to 1..=3.
fn axes(l: &Layout) -> usize {
    usize::from(l.dims.clamp(1, 3))
}

/// The layer a layered fetch or access reads: `layer` clamped to the layers there are (0 for
/// a resource that is not layered).
pub fn layer_index(l: &Layout, layer: i32) -> u64 {
    let last = l.layers.saturating_sub(1);
    u64::try_from(layer).unwrap_or(0).min(last)
}

/// Device address of texel `idx` (x, y, z) of `layer` per the module's layout formula; `None`
/// when it does not fit 64 bits.
pub fn texel_address(l: &Layout, idx: [u64; 3], layer: u64) -> Option<u64> {
    let slice = layer.checked_add(idx[2])?.checked_mul(l.slice_pitch)?;
    let row = idx[1].checked_mul(l.pitch)?;
    let col = idx[0].checked_mul(l.texel_bytes())?;
    l.base
        .checked_add(slice)?
        .checked_add(row)?
        .checked_add(col)
}

/// Resolves texel index `i` of an axis of `n` texels under `mode`; `None` means the border.
/// Wrap and mirror apply to normalized coordinates only and act as clamp otherwise.
pub fn address_index(mode: AddressMode, normalized: bool, i: i64, n: u64) -> Option<u64> {
    let n = n.clamp(1, MAX_AXIS) as i64;
    let mode = match mode {
        AddressMode::Wrap | AddressMode::Mirror if !normalized => AddressMode::Clamp,
        m => m,
    };
    let r = match mode {
        AddressMode::Clamp => i.clamp(0, n - 1),
        AddressMode::Border => {
            if !(0..n).contains(&i) {
                return None;
            }
            i
        }
        AddressMode::Wrap => i.rem_euclid(n),
        AddressMode::Mirror => {
            let m = i.rem_euclid(2 * n);
            if m >= n { 2 * n - 1 - m } else { m }
        }
    };
    Some(r as u64)
}

/// A linear-filtering weight quantized to [`FILTER_FRACTION_BITS`] fractional bits (rounded to
/// the nearest 1/256).
pub fn quantize_weight(frac: f32) -> f32 {
    (frac * FILTER_STEPS).round() / FILTER_STEPS
}

/// The texel-space coordinate of `u` on an axis of `n` texels.
fn texel_space(u: f32, normalized: bool, n: u64) -> f32 {
    if normalized { u * n as f32 } else { u }
}

/// `floor(x)` as an index (saturating; NaN is 0).
fn floor_index(x: f32) -> i64 {
    x.floor() as i64
}

/// Reads the texel at resolved indices `idx` (`None`: the border colour) of `layer`. Channels
/// the texel lacks read 0, alpha 1.
fn fetch<E>(
    view: &TextureView,
    idx: Option<[u64; 3]>,
    layer: u64,
    float: bool,
    read: &mut dyn FnMut(u64, u64) -> Result<u64, E>,
) -> Result<[u32; 4], E> {
    let Some(idx) = idx else {
        return Ok(view
            .sampler
            .border_color
            .map(|c| if float { c.to_bits() } else { c as i32 as u32 }));
    };
    let l = &view.layout;
    let cb = l.format.bytes();
    // An address past 64 bits is no address: read it where nothing is owned.
    let at = texel_address(l, idx, layer).unwrap_or(u64::MAX);
    let mut out = [0u32; 4];
    for (c, o) in out.iter_mut().enumerate() {
        *o = if c < usize::from(l.channels) {
            let raw = read(at.wrapping_add(c as u64 * cb), cb)?;
            channel_value(l.format, raw, float)
        } else {
            match (c == ALPHA, float) {
                (true, true) => 1.0f32.to_bits(),
                (true, false) => 1,
                (false, true) => 0.0f32.to_bits(),
                (false, false) => 0,
            }
        };
    }
    Ok(out)
}

/// Resolves per-axis indices `i` under the sampler's address modes; `None` when any is on the
/// border.
fn resolve(view: &TextureView, i: [i64; 3]) -> Option<[u64; 3]> {
    let n = extents(&view.layout);
    let dims = axes(&view.layout);
    let mut out = [0u64; 3];
    for a in 0..dims {
        out[a] = address_index(
            view.sampler.address[a],
            view.sampler.normalized_coords,
            i[a],
            n[a],
        )?;
    }
    Some(out)
}

/// Fetches from `view` at `coords` in layer `layer` (clamped; ignored when not layered), as
/// `tex` does: integer coordinates index texels directly (zeros outside); float coordinates
/// are normalized, addressed and filtered per the sampler. Linear filtering applies to float
/// results only; a texture read as integers is point-sampled. Axes past the resource's `dims`
/// are ignored.
pub fn sample<E>(
    view: &TextureView,
    coords: Coords,
    layer: i32,
    read: &mut dyn FnMut(u64, u64) -> Result<u64, E>,
) -> Result<Texel, E> {
    let l = &view.layout;
    let float = returns_float(view);
    let layer = layer_index(l, layer);
    let n = extents(l);
    let dims = axes(l);
    match coords {
        Coords::Int(c) => {
            let mut idx = [0u64; 3];
            for a in 0..dims {
                match u64::try_from(c[a]) {
                    Ok(i) if i < n[a] => idx[a] = i,
                    _ => return Ok(Texel::zero(float)),
                }
            }
            let bits = fetch(view, Some(idx), layer, float, read)?;
            Ok(Texel { bits, float })
        }
        Coords::Float(u) => {
            let norm = view.sampler.normalized_coords;
            let x: [f32; 3] = std::array::from_fn(|a| texel_space(u[a], norm, n[a]));
            if view.sampler.filter == FilterMode::Point || !float {
                let i = x.map(floor_index);
                let bits = fetch(view, resolve(view, i), layer, float, read)?;
                return Ok(Texel { bits, float });
            }
            // Linear: x_B = x - 0.5, i = floor(x_B), α = frac(x_B) in 1/256 steps.
            let xb = x.map(|v| v - 0.5);
            let i0 = xb.map(floor_index);
            let w: [f32; 3] = std::array::from_fn(|a| quantize_weight(xb[a] - xb[a].floor()));
            let mut acc = [0f32; 4];
            for corner in 0..1usize << dims {
                let mut weight = 1f32;
                let mut i = i0;
                for a in 0..dims {
                    if corner >> a & 1 == 1 {
                        weight *= w[a];
                        i[a] += 1;
                    } else {
                        weight *= 1.0 - w[a];
                    }
                }
                let t = fetch(view, resolve(view, i), layer, float, read)?;
                for (s, b) in acc.iter_mut().zip(t) {
                    *s += weight * f32::from_bits(b);
                }
            }
            Ok(Texel {
                bits: acc.map(f32::to_bits),
                float,
            })
        }
    }
}

/// The levels a fetch at level of detail `lod` reads: (the first, the second, the second's
/// weight). The bias is added, then the sampler's clamps and the levels there are bound it;
/// point mipmap filtering takes the nearer level (weight 0), linear blends the two around it.
/// A texture of one level always reads level 0.
pub fn mip_levels(s: &MipSampler, lod: f32) -> (u32, u32, f32) {
    if s.levels <= 1 || lod.is_nan() {
        return (0, 0, 0.0);
    }
    let last = (s.levels - 1) as f32;
    // max/min rather than clamp: a program may set the clamps the wrong way round.
    let l = (lod + s.bias)
        .max(s.min_clamp)
        .min(s.max_clamp)
        .max(0.0)
        .min(last);
    if l.is_nan() {
        return (0, 0, 0.0);
    }
    match s.filter {
        FilterMode::Point => {
            let n = (l + 0.5).floor().min(last) as u32;
            (n, n, 0.0)
        }
        FilterMode::Linear => {
            let first = l.floor();
            let w = quantize_weight(l - first);
            let a = first as u32;
            (a, (a + 1).min(s.levels - 1), w)
        }
    }
}

/// The level of detail of a fetch whose coordinates change by `dx` and `dy` between
/// neighbouring threads (`tex.grad`): log2 of the longer gradient in level 0's texels
/// (isotropic: the anisotropy CUDA's `maxAnisotropy` allows is not used).
pub fn grad_lod(view: &TextureView, dx: [f32; 3], dy: [f32; 3]) -> f32 {
    let n = extents(&view.layout);
    let dims = axes(&view.layout);
    let scale = |a: usize| {
        if view.sampler.normalized_coords {
            n[a] as f32
        } else {
            1.0
        }
    };
    let len = |g: [f32; 3]| {
        (0..dims)
            .map(|a| (g[a] * scale(a)).powi(2))
            .sum::<f32>()
            .sqrt()
    };
    len(dx).max(len(dy)).log2()
}

/// Fetches from level `level` of a mipmapped `view`, whose texels are at `layout`, as
/// [`sample`] does: normalized coordinates span every level; unnormalized ones count level 0's
/// texels and are scaled to the level's.
pub fn sample_level<E>(
    view: &TextureView,
    layout: &Layout,
    level: u32,
    coords: Coords,
    layer: i32,
    read: &mut dyn FnMut(u64, u64) -> Result<u64, E>,
) -> Result<Texel, E> {
    let v = TextureView {
        layout: *layout,
        ..*view
    };
    let coords = match coords {
        Coords::Float(u) if !view.sampler.normalized_coords && level > 0 => {
            let k = 0.5f32.powi(level.min(i32::MAX as u32) as i32);
            Coords::Float(u.map(|x| x * k))
        }
        c => c,
    };
    sample(&v, coords, layer, read)
}

/// Faces of a cube map, the layers of its texture in CUDA's order: +x, −x, +y, −y, +z, −z.
pub const CUBE_FACES: i32 = 6;

/// The face a direction `(x, y, z)` points at and where on it: (face, s, t, major), with `s`
/// and `t` the face's coordinates in [−major, major] and `major` the largest component's size
/// (CUDA programming guide, "Cubemap Textures": the face of the major axis, +x before +y before
/// +z when two are equal).
pub fn cube_face(d: [f32; 3]) -> (i32, f32, f32, f32) {
    let [x, y, z] = d;
    let (ax, ay, az) = (x.abs(), y.abs(), z.abs());
    if ax >= ay && ax >= az {
        if x >= 0.0 {
            (0, -z, -y, ax)
        } else {
            (1, z, -y, ax)
        }
    } else if ay >= az {
        if y >= 0.0 {
            (2, x, z, ay)
        } else {
            (3, x, -z, ay)
        }
    } else if z >= 0.0 {
        (4, x, -y, az)
    } else {
        (5, -x, -y, az)
    }
}

/// A cube map fetch as a fetch from its texture's faces: the view sampled with normalized
/// coordinates clamped to the face, the layer (`cube_layer` six faces in) and the face's
/// coordinates for [`sample`], from direction `d`.
pub fn cube_fetch(view: &TextureView, d: [f32; 3], cube_layer: i32) -> (TextureView, i32, Coords) {
    let (face, s, t, major) = cube_face(d);
    // A zero direction has no face: its centre of face 0, as any direction would be as good.
    let m = if major > 0.0 { major } else { 1.0 };
    let u = (s / m + 1.0) * 0.5;
    let v = (t / m + 1.0) * 0.5;
    let face_view = TextureView {
        sampler: Sampler {
            address: [AddressMode::Clamp; 3],
            normalized_coords: true,
            ..view.sampler
        },
        ..*view
    };
    let layer = cube_layer
        .max(0)
        .saturating_mul(CUBE_FACES)
        .saturating_add(face);
    (face_view, layer, Coords::Float([u, v, 0.0]))
}

/// The level of detail of a cube map fetch whose direction changes by `dx` and `dy`
/// (`tex.grad.cube`): as [`grad_lod`], the gradients projected on the face `d` points at.
pub fn cube_grad_lod(view: &TextureView, d: [f32; 3], dx: [f32; 3], dy: [f32; 3]) -> f32 {
    let (_, _, _, major) = cube_face(d);
    let texels = view.layout.width.clamp(1, MAX_AXIS) as f32;
    // A face spans 2 * major of the direction's units.
    let scale = if major > 0.0 {
        texels / (2.0 * major)
    } else {
        0.0
    };
    let len = |g: [f32; 3]| g.iter().map(|c| c * c).sum::<f32>().sqrt();
    (len(dx).max(len(dy)) * scale).log2()
}

/// Blends two fetches of float texels: `a` weighted `1 - w`, `b` weighted `w`.
pub fn blend(a: Texel, b: Texel, w: f32) -> Texel {
    if !a.float || w == 0.0 {
        return a;
    }
    let (fa, fb) = (a.floats(), b.floats());
    Texel {
        bits: std::array::from_fn(|c| (fa[c] * (1.0 - w) + fb[c] * w).to_bits()),
        float: true,
    }
}

/// Fetches channel `comp` (0 to 3: r, g, b, a) of the four texels of the bilinear footprint of
/// 2-D coordinates `u`, as `tld4` does, in [`GATHER_ORDER`].
pub fn gather<E>(
    view: &TextureView,
    u: [f32; 2],
    layer: i32,
    comp: usize,
    read: &mut dyn FnMut(u64, u64) -> Result<u64, E>,
) -> Result<Texel, E> {
    let l = &view.layout;
    let float = returns_float(view);
    let layer = layer_index(l, layer);
    let n = extents(l);
    let norm = view.sampler.normalized_coords;
    let i = floor_index(texel_space(u[0], norm, n[0]) - 0.5);
    let j = floor_index(texel_space(u[1], norm, n[1]) - 0.5);
    let mut bits = [0u32; 4];
    for (b, (di, dj)) in bits.iter_mut().zip(GATHER_ORDER) {
        let t = fetch(view, resolve(view, [i + di, j + dj, 0]), layer, float, read)?;
        *b = t[comp.min(ALPHA)];
    }
    Ok(Texel { bits, float })
}

/// Where a surface access of `access` bytes at byte column `x` (surface x coordinates are in
/// bytes), row `y`, slice `z` and `layer` (`None`: not a layered access) goes under `clamp`.
/// Axes past the surface's `dims` must be 0 (under `.clamp` they are clamped to 0).
pub fn surface_access(
    l: &Layout,
    clamp: SurfaceClamp,
    x: i32,
    y: i32,
    z: i32,
    layer: Option<i32>,
    access: u64,
) -> SurfaceAccess {
    let n = extents(l);
    let row_bytes = n[0].saturating_mul(l.texel_bytes());
    let Some(last_x) = row_bytes.checked_sub(access) else {
        return match clamp {
            SurfaceClamp::Zero => SurfaceAccess::Zero,
            _ => SurfaceAccess::OutOfRange,
        };
    };
    let layers = l.layers.max(1);
    let pos = [
        i64::from(x),
        i64::from(y),
        i64::from(z),
        i64::from(layer.unwrap_or(0)),
    ];
    let last = [last_x, n[1] - 1, n[2] - 1, layers - 1];
    let mut at = [0u64; 4];
    for (k, (p, hi)) in pos.into_iter().zip(last).enumerate() {
        match u64::try_from(p) {
            Ok(v) if v <= hi => at[k] = v,
            _ => match clamp {
                SurfaceClamp::Trap => return SurfaceAccess::OutOfRange,
                SurfaceClamp::Zero => return SurfaceAccess::Zero,
                SurfaceClamp::Clamp => at[k] = u64::try_from(p).unwrap_or(0).min(hi),
            },
        }
    }
    let addr = at[3]
        .checked_add(at[2])
        .and_then(|s| s.checked_mul(l.slice_pitch))
        .and_then(|s| s.checked_add(at[1].checked_mul(l.pitch)?))
        .and_then(|s| s.checked_add(at[0]))
        .and_then(|s| s.checked_add(l.base));
    match addr {
        Some(a) => SurfaceAccess::At(a),
        None => SurfaceAccess::OutOfRange,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the test texels start.
    const BASE: u64 = 0x1000;

    fn layout(format: ChannelFormat, channels: u8, dims: u8, w: u64, h: u64, d: u64) -> Layout {
        let pitch = w * format.bytes() * u64::from(channels);
        Layout {
            base: BASE,
            format,
            channels,
            dims,
            width: w,
            height: h,
            depth: d,
            layers: 0,
            pitch,
            slice_pitch: pitch * h,
        }
    }

    fn view(l: Layout, filter: FilterMode, normalized: bool, mode: AddressMode) -> TextureView {
        TextureView {
            layout: l,
            sampler: Sampler {
                address: [mode; 3],
                filter,
                read_as_integer: false,
                normalized_coords: normalized,
                border_color: [9.0, 8.0, 7.0, 6.0],
                mip: MipSampler::ONE_LEVEL,
            },
        }
    }

    /// A reader over `bytes` at [`BASE`]; reading elsewhere fails with the address.
    fn reader(bytes: &[u8]) -> impl FnMut(u64, u64) -> Result<u64, u64> + '_ {
        move |a, n| {
            let off = a.checked_sub(BASE).ok_or(a)? as usize;
            let b = bytes.get(off..off + n as usize).ok_or(a)?;
            Ok(b.iter().rev().fold(0u64, |v, &x| v << 8 | u64::from(x)))
        }
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn channels_normalize_per_format() {
        let f = |fmt, raw| f32::from_bits(channel_value(fmt, raw, true));
        assert_eq!(f(ChannelFormat::U8, 255), 1.0);
        assert_eq!(f(ChannelFormat::U8, 51), 0.2);
        assert_eq!(f(ChannelFormat::U16, 65535), 1.0);
        assert_eq!(f(ChannelFormat::S8, 0x81), -1.0);
        assert_eq!(f(ChannelFormat::S8, 0x80), -1.0, "-128/127 clamps to -1");
        assert_eq!(f(ChannelFormat::S16, 0x8000), -1.0);
        assert_eq!(f(ChannelFormat::S16, 32767), 1.0);
        assert_eq!(f(ChannelFormat::F16, 0x3c00), 1.0);
        assert_eq!(f(ChannelFormat::F16, 0xc100), -2.5);
        assert_eq!(
            channel_value(ChannelFormat::S8, 0xfe, false),
            (-2i32) as u32
        );
        assert_eq!(channel_value(ChannelFormat::U16, 0xfffe, false), 0xfffe);
        assert_eq!(
            channel_value(ChannelFormat::S16, 0x8000, false),
            (-32768i32) as u32
        );
    }

    #[test]
    fn address_modes_resolve_indices() {
        let r = |m, norm, i| address_index(m, norm, i, 4);
        assert_eq!(r(AddressMode::Clamp, true, -3), Some(0));
        assert_eq!(r(AddressMode::Clamp, true, 9), Some(3));
        assert_eq!(r(AddressMode::Border, true, 4), None);
        assert_eq!(r(AddressMode::Border, false, -1), None);
        assert_eq!(r(AddressMode::Border, false, 2), Some(2));
        assert_eq!(r(AddressMode::Wrap, true, -1), Some(3));
        assert_eq!(r(AddressMode::Wrap, true, 9), Some(1));
        assert_eq!(
            r(AddressMode::Wrap, false, 9),
            Some(3),
            "wrap is clamp unnormalized"
        );
        let mirrored: Vec<_> = (-4..12)
            .map(|i| r(AddressMode::Mirror, true, i).unwrap())
            .collect();
        assert_eq!(mirrored, [3, 2, 1, 0, 0, 1, 2, 3, 3, 2, 1, 0, 0, 1, 2, 3]);
        assert_eq!(r(AddressMode::Mirror, false, -2), Some(0));
    }

    #[test]
    fn weights_are_quantized_to_256ths() {
        assert_eq!(quantize_weight(0.3), 77.0 / 256.0);
        assert_eq!(quantize_weight(0.5), 0.5);
        assert_eq!(quantize_weight(0.999), 1.0);
        assert_eq!(quantize_weight(0.001), 0.0);
    }

    #[test]
    fn linear_1d_interpolates_and_clamps() {
        let bytes = f32_bytes(&[0.0, 256.0, 512.0]);
        let v = view(
            layout(ChannelFormat::F32, 1, 1, 3, 1, 1),
            FilterMode::Linear,
            false,
            AddressMode::Clamp,
        );
        let s = |x: f32| {
            sample(&v, Coords::Float([x, 0.0, 0.0]), 0, &mut reader(&bytes))
                .unwrap()
                .floats()[0]
        };
        assert_eq!(s(0.5), 0.0);
        assert_eq!(s(1.0), 128.0);
        // x_B = 0.3: α quantizes to 77/256; x_B = 0.8: to 205/256.
        assert_eq!(s(0.8), 77.0);
        assert_eq!(s(1.3), 205.0);
        assert_eq!(s(2.9), 512.0, "clamped past the last texel");
        assert_eq!(s(-5.0), 0.0);
    }

    #[test]
    fn border_colour_blends_into_linear_filtering() {
        let bytes = f32_bytes(&[1.0]);
        let v = view(
            layout(ChannelFormat::F32, 1, 1, 1, 1, 1),
            FilterMode::Linear,
            false,
            AddressMode::Border,
        );
        // Halfway between texel 0 (1.0) and the border (9.0).
        let t = sample(&v, Coords::Float([1.0, 0.0, 0.0]), 0, &mut reader(&bytes)).unwrap();
        assert_eq!(t.floats(), [5.0, 4.0, 3.5, 3.5]);
    }

    #[test]
    fn integer_coordinates_index_and_return_zero_outside() {
        let bytes = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
        let v = view(
            layout(ChannelFormat::F32, 2, 1, 2, 1, 1),
            FilterMode::Linear,
            true,
            AddressMode::Wrap,
        );
        let s = |i| sample(&v, Coords::Int([i, 0, 0]), 0, &mut reader(&bytes)).unwrap();
        assert_eq!(s(1).floats(), [3.0, 4.0, 0.0, 1.0]);
        assert_eq!(s(2).bits, [0; 4]);
        assert_eq!(s(-1).bits, [0; 4]);
    }

    #[test]
    fn integer_textures_are_point_sampled_with_integer_alpha() {
        let bytes = [5u8, 250, 7, 9];
        let mut v = view(
            layout(ChannelFormat::U8, 2, 1, 2, 1, 1),
            FilterMode::Linear,
            false,
            AddressMode::Clamp,
        );
        v.sampler.read_as_integer = true;
        let t = sample(&v, Coords::Float([1.2, 0.0, 0.0]), 0, &mut reader(&bytes)).unwrap();
        assert_eq!(
            t,
            Texel {
                bits: [7, 9, 0, 1],
                float: false
            }
        );
    }

    #[test]
    fn reads_outside_fail_with_the_address() {
        let bytes = f32_bytes(&[1.0]);
        let v = view(
            layout(ChannelFormat::F32, 1, 2, 4, 4, 1),
            FilterMode::Point,
            false,
            AddressMode::Clamp,
        );
        let e = sample(&v, Coords::Float([0.5, 1.5, 0.0]), 0, &mut reader(&bytes)).unwrap_err();
        assert_eq!(e, BASE + 16);
    }

    #[test]
    fn gather_returns_counter_clockwise_from_lower_left() {
        let bytes = f32_bytes(&[0.0, 1.0, 2.0, 3.0]);
        let v = view(
            layout(ChannelFormat::F32, 1, 2, 2, 2, 1),
            FilterMode::Point,
            false,
            AddressMode::Clamp,
        );
        let t = gather(&v, [1.0, 1.0], 0, 0, &mut reader(&bytes)).unwrap();
        // (0,1), (1,1), (1,0), (0,0).
        assert_eq!(t.floats(), [2.0, 3.0, 1.0, 0.0]);
        // Gathering alpha of a one-channel texture: all ones.
        let t = gather(&v, [1.0, 1.0], 0, 3, &mut reader(&bytes)).unwrap();
        assert_eq!(t.floats(), [1.0; 4]);
    }

    #[test]
    fn layers_and_slices_follow_the_layout_formula() {
        let mut l = layout(ChannelFormat::U16, 2, 2, 3, 2, 1);
        l.layers = 4;
        assert_eq!(layer_index(&l, 9), 3);
        assert_eq!(layer_index(&l, -2), 0);
        assert_eq!(
            texel_address(&l, [2, 1, 0], 3),
            Some(BASE + 3 * 24 + 12 + 8)
        );
        assert_eq!(texel_address(&l, [0, u64::MAX, 0], 0), None);
    }

    #[test]
    fn surface_access_trap_clamp_zero() {
        // 4 texels of 8 bytes per row, 3 rows.
        let l = layout(ChannelFormat::U32, 2, 2, 4, 3, 1);
        let acc = |c, x, y| surface_access(&l, c, x, y, 0, None, 4);
        assert_eq!(
            acc(SurfaceClamp::Trap, 28, 2),
            SurfaceAccess::At(BASE + 64 + 28)
        );
        assert_eq!(acc(SurfaceClamp::Trap, 29, 2), SurfaceAccess::OutOfRange);
        assert_eq!(acc(SurfaceClamp::Trap, 0, 3), SurfaceAccess::OutOfRange);
        assert_eq!(acc(SurfaceClamp::Zero, -4, 0), SurfaceAccess::Zero);
        assert_eq!(
            acc(SurfaceClamp::Clamp, 100, -1),
            SurfaceAccess::At(BASE + 28)
        );
        assert_eq!(
            surface_access(&l, SurfaceClamp::Trap, 0, 0, 0, None, 64),
            SurfaceAccess::OutOfRange,
            "an access wider than a row"
        );
        let mut a = l;
        a.layers = 2;
        assert_eq!(
            surface_access(&a, SurfaceClamp::Trap, 0, 0, 0, Some(1), 8),
            SurfaceAccess::At(BASE + 96)
        );
        assert_eq!(
            surface_access(&a, SurfaceClamp::Trap, 0, 0, 0, Some(2), 8),
            SurfaceAccess::OutOfRange
        );
    }
}
