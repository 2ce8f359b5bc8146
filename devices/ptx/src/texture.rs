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

/// How a texel is chosen between texel centres (`CUfilter_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FilterMode {
    /// `CU_TR_FILTER_MODE_POINT`: the nearest texel.
    Point,
    /// `CU_TR_FILTER_MODE_LINEAR`: linear interpolation of the nearest 2, 4 or 8 texels, with
    /// 8 bits of fraction as on NVIDIA GPUs.
    Linear,
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
