//! Texture and surface objects: what a guest asks for (CUDA's enum values, checked here before a
//! device sees them) and where their texels are.
//!
//! The shim keeps a CUDA array as device memory of its own allocation, rows of texels one after
//! the other; a texture or surface object names texels in one allocation of the process by a
//! [`TexelLayout`], whichever resource (array, pitched or linear memory) the program gave.
//! The device returns the handle kernels receive ([`crate::device::DeviceContext::texture_create`]).

use vgpu_proto::cuda;
use vgpu_proto::cuda::mip;

use crate::error::CuError;

/// `CUarray_format` values the devices sample.
pub use vgpu_proto::cuda::array_format as format;
pub use vgpu_proto::cuda::{CHANNEL_COUNTS, channel_bytes};

/// A module's texture or surface reference (CUDA 11's `texture<>` and `surface<>`): a slot in
/// the module's globals holding the handle of the object it is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReferenceKind {
    /// `.global .texref`.
    Texture,
    /// `.global .surfref`.
    Surface,
}

/// `CUaddress_mode`: wrap, clamp, mirror, border.
pub const ADDRESS_MODES: u32 = 4;
/// `CUfilter_mode`: point, linear.
pub const FILTER_MODES: u32 = 2;

/// `CU_TRSF_*` flags of `CUDA_TEXTURE_DESC`.
pub mod trsf {
    /// `CU_TRSF_READ_AS_INTEGER`.
    pub const READ_AS_INTEGER: u32 = 0x01;
    /// `CU_TRSF_NORMALIZED_COORDINATES`.
    pub const NORMALIZED_COORDINATES: u32 = 0x02;
    /// `CU_TRSF_SRGB`.
    pub const SRGB: u32 = 0x10;
    /// `CU_TRSF_DISABLE_TRILINEAR_OPTIMIZATION`.
    pub const DISABLE_TRILINEAR_OPTIMIZATION: u32 = 0x20;
    /// `CU_TRSF_SEAMLESS_CUBEMAP`.
    pub const SEAMLESS_CUBEMAP: u32 = 0x40;
    /// Every flag CUDA 12 defines.
    pub const ALL: u32 = READ_AS_INTEGER
        | NORMALIZED_COORDINATES
        | SRGB
        | DISABLE_TRILINEAR_OPTIMIZATION
        | SEAMLESS_CUBEMAP;
}

/// Largest width, height, depth or layer count of a texture or surface: the largest any CUDA
/// device reports (`CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LINEAR_WIDTH`, 2^28 texels); the
/// shim checks the device's own, smaller, limits for each shape.
pub const MAX_EXTENT: u64 = 1 << 28;

/// Where a texture's or surface's texels are: texel `(x, y, z)` of layer `l` at
/// `base + (l + z) * slice_pitch + y * pitch + x * texel_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TexelLayout {
    /// Device address of the first texel.
    pub base: u64,
    /// `CUarray_format` ([`format`]).
    pub format: u32,
    /// Channels per texel: 1, 2 or 4.
    pub channels: u32,
    /// Dimensions: 1, 2 or 3.
    pub dims: u32,
    /// Texels per row.
    pub width: u64,
    /// Rows per slice.
    pub height: u64,
    /// Slices.
    pub depth: u64,
    /// Layers; 0 when not layered.
    pub layers: u64,
    /// Bytes between rows.
    pub pitch: u64,
    /// Bytes between slices or layers.
    pub slice_pitch: u64,
}

/// How a texture object samples its texels (`CUDA_TEXTURE_DESC`'s values).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TexSampling {
    /// `CUaddress_mode` of each dimension.
    pub address: [u32; 3],
    /// `CUfilter_mode`.
    pub filter: u32,
    /// `CU_TRSF_*` ([`trsf`]).
    pub flags: u32,
    /// Border colour (RGBA).
    pub border: [f32; 4],
    /// The levels of a mipmapped array and how fetches choose among them.
    pub mip: MipChain,
}

/// A mipmapped texture's levels (placed as [`mip::levels`] places them, from the texture's
/// first level) and how a fetch with a level of detail chooses among them
/// (`CUDA_TEXTURE_DESC`'s mipmap fields).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MipChain {
    /// Levels: 1 for a texture that is not mipmapped.
    pub levels: u32,
    /// Alignment of each level's rows, in bytes.
    pub pitch_align: u64,
    /// Alignment of each level's first byte from the first level's, in bytes.
    pub level_align: u64,
    /// `CUfilter_mode` between levels.
    pub filter: u32,
    /// Added to every level of detail.
    pub bias: f32,
    /// Lowest level of detail a fetch uses.
    pub min_clamp: f32,
    /// Highest level of detail a fetch uses.
    pub max_clamp: f32,
}

impl MipChain {
    /// A texture of one level.
    pub const ONE_LEVEL: MipChain = MipChain {
        levels: 1,
        pitch_align: 1,
        level_align: 1,
        filter: 0,
        bias: 0.0,
        min_clamp: 0.0,
        max_clamp: 0.0,
    };

    /// The levels of the chain whose first level has `first`'s texels (its pitches are not
    /// read: the chain's alignments decide them).
    pub fn levels_of(&self, first: &TexelLayout) -> Result<Vec<mip::Level>, CuError> {
        let layered = first.layers > 0;
        let shape = mip::Shape {
            width: first.width,
            height: if first.dims >= 2 { first.height } else { 0 },
            depth: match first.dims {
                3 => first.depth,
                _ => first.layers,
            },
            layered,
            texel_bytes: first.texel_bytes(),
        };
        mip::levels(&shape, self.levels, self.pitch_align, self.level_align).ok_or_else(|| {
            CuError::invalid_value(format!(
                "{} levels of {}x{}x{} texels with rows aligned to {} and levels to {} bytes: \
                 more levels than the texels halve into, alignments that are not powers of \
                 two up to {}, or a size past 64 bits",
                self.levels,
                first.width,
                first.height,
                first.depth,
                self.pitch_align,
                self.level_align,
                mip::MAX_ALIGN
            ))
        })
    }
}

impl TexelLayout {
    /// The layout of mipmap level `level` of a chain whose first level is `self`.
    pub fn level(&self, level: &mip::Level) -> TexelLayout {
        TexelLayout {
            base: self.base.wrapping_add(level.offset),
            width: level.width,
            height: level.height.max(1),
            depth: if self.dims == 3 {
                level.depth.max(1)
            } else {
                1
            },
            pitch: level.pitch,
            slice_pitch: level.slice_pitch,
            ..*self
        }
    }
}

impl TexelLayout {
    /// Bytes of one texel (the format is checked).
    pub fn texel_bytes(&self) -> u64 {
        channel_bytes(self.format).unwrap_or(0) * u64::from(self.channels)
    }

    /// Checks the layout describes a resource CUDA can have, and returns the bytes from `base`
    /// to the end of its last texel.
    pub fn check(&self) -> Result<u64, CuError> {
        let bytes = channel_bytes(self.format).ok_or_else(|| {
            CuError::new(
                cuda::CUDA_ERROR_NOT_SUPPORTED,
                format!(
                    "array format {:#x} is not sampled by vgpu (8-, 16- and 32-bit integers, half and float are)",
                    self.format
                ),
            )
        })?;
        if !CHANNEL_COUNTS.contains(&self.channels) {
            return Err(CuError::invalid_value(format!(
                "{} channels: a texel has 1, 2 or 4",
                self.channels
            )));
        }
        let shape_ok = match self.dims {
            1 => self.height == 1 && self.depth == 1,
            2 => self.depth == 1,
            3 => self.layers == 0,
            _ => false,
        };
        if !shape_ok {
            return Err(CuError::invalid_value(format!(
                "a {}-dimensional resource of {}x{}x{} with {} layers",
                self.dims, self.width, self.height, self.depth, self.layers
            )));
        }
        for (what, n) in [
            ("width", self.width),
            ("height", self.height),
            ("depth", self.depth),
        ] {
            if n == 0 || n > MAX_EXTENT {
                return Err(CuError::invalid_value(format!(
                    "{what} {n} is outside 1..={MAX_EXTENT}"
                )));
            }
        }
        if self.layers > MAX_EXTENT {
            return Err(CuError::invalid_value(format!(
                "{} layers: at most {MAX_EXTENT}",
                self.layers
            )));
        }
        let texel = bytes * u64::from(self.channels);
        let row = self.width * texel;
        let slices = self.depth.max(self.layers).max(1);
        if self.height > 1 && self.pitch < row {
            return Err(CuError::invalid_value(format!(
                "a pitch of {} bytes is less than a row's {row}",
                self.pitch
            )));
        }
        if slices > 1 && self.slice_pitch < self.pitch.saturating_mul(self.height) {
            return Err(CuError::invalid_value(format!(
                "a slice pitch of {} bytes is less than {} rows of {}",
                self.slice_pitch, self.height, self.pitch
            )));
        }
        let overflow = || CuError::invalid_value("the resource's extent overflows");
        (slices - 1)
            .checked_mul(self.slice_pitch)
            .and_then(|s| {
                (self.height - 1)
                    .checked_mul(self.pitch)
                    .and_then(|r| r.checked_add(s))
            })
            .and_then(|o| o.checked_add(row))
            .ok_or_else(overflow)
    }
}

impl TexSampling {
    /// Checks every field holds a value CUDA defines.
    pub fn check(&self) -> Result<(), CuError> {
        if let Some(m) = self.address.iter().find(|&&m| m >= ADDRESS_MODES) {
            return Err(CuError::invalid_value(format!(
                "address mode {m} does not exist"
            )));
        }
        if self.filter >= FILTER_MODES {
            return Err(CuError::invalid_value(format!(
                "filter mode {} does not exist",
                self.filter
            )));
        }
        if self.flags & !trsf::ALL != 0 {
            return Err(CuError::invalid_value(format!(
                "texture flags {:#x} are not CU_TRSF_* flags",
                self.flags & !trsf::ALL
            )));
        }
        if self.mip.filter >= FILTER_MODES {
            return Err(CuError::invalid_value(format!(
                "mipmap filter mode {} does not exist",
                self.mip.filter
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> TexelLayout {
        TexelLayout {
            base: 0x1000,
            format: format::F32,
            channels: 4,
            dims: 2,
            width: 10,
            height: 3,
            depth: 1,
            layers: 0,
            pitch: 256,
            slice_pitch: 768,
        }
    }

    #[test]
    fn extent_ends_at_the_last_texel() {
        assert_eq!(layout().check().unwrap(), 2 * 256 + 10 * 16);
        let layered = TexelLayout {
            layers: 5,
            ..layout()
        };
        assert_eq!(layered.check().unwrap(), 4 * 768 + 2 * 256 + 160);
        let linear = TexelLayout {
            dims: 1,
            height: 1,
            pitch: 0,
            slice_pitch: 0,
            format: format::U8,
            channels: 1,
            width: 1000,
            ..layout()
        };
        assert_eq!(linear.check().unwrap(), 1000);
    }

    #[test]
    fn impossible_layouts_are_refused_with_cuda_codes() {
        let code = |l: TexelLayout| l.check().unwrap_err().code;
        assert_eq!(
            code(TexelLayout {
                format: 0xb0,
                ..layout()
            }),
            cuda::CUDA_ERROR_NOT_SUPPORTED
        );
        for bad in [
            TexelLayout {
                channels: 3,
                ..layout()
            },
            TexelLayout {
                dims: 1,
                ..layout()
            },
            TexelLayout {
                dims: 4,
                ..layout()
            },
            TexelLayout {
                pitch: 100,
                ..layout()
            },
            TexelLayout {
                layers: 2,
                slice_pitch: 10,
                ..layout()
            },
            TexelLayout {
                width: 0,
                ..layout()
            },
            TexelLayout {
                width: MAX_EXTENT + 1,
                ..layout()
            },
            TexelLayout {
                dims: 3,
                depth: MAX_EXTENT,
                slice_pitch: u64::MAX / 2,
                ..layout()
            },
        ] {
            assert_eq!(code(bad), cuda::CUDA_ERROR_INVALID_VALUE, "{bad:?}");
        }
    }

    #[test]
    fn a_mipmapped_chain_ends_past_its_last_level() {
        let chain = MipChain {
            levels: 3,
            pitch_align: 32,
            level_align: 512,
            ..MipChain::ONE_LEVEL
        };
        let first = TexelLayout {
            width: 16,
            height: 8,
            ..layout()
        };
        let levels = chain.levels_of(&first).unwrap();
        let last = first.level(&levels[2]);
        assert_eq!((last.width, last.height, last.pitch), (4, 2, 64));
        // 16x8, 8x4 and 4x2 texels of 16 bytes: 2048 and 512 bytes before the last.
        assert_eq!(last.base, first.base + 2048 + 512);
        assert_eq!(
            mip::chain_bytes(&levels),
            last.base - first.base + last.check().unwrap()
        );
        for bad in [
            MipChain { levels: 6, ..chain },
            MipChain {
                pitch_align: 48,
                ..chain
            },
            MipChain { levels: 0, ..chain },
        ] {
            assert_eq!(
                bad.levels_of(&first).unwrap_err().code,
                cuda::CUDA_ERROR_INVALID_VALUE
            );
        }
    }

    #[test]
    fn sampling_values_outside_cudas_enums_are_refused() {
        let ok = TexSampling {
            address: [0, 1, 3],
            filter: 1,
            flags: trsf::NORMALIZED_COORDINATES | trsf::READ_AS_INTEGER,
            border: [0.0; 4],
            mip: MipChain::ONE_LEVEL,
        };
        ok.check().unwrap();
        for bad in [
            TexSampling {
                address: [0, 4, 0],
                ..ok
            },
            TexSampling { filter: 2, ..ok },
            TexSampling { flags: 0x100, ..ok },
            TexSampling {
                mip: MipChain {
                    filter: 2,
                    ..MipChain::ONE_LEVEL
                },
                ..ok
            },
        ] {
            assert_eq!(
                bad.check().unwrap_err().code,
                cuda::CUDA_ERROR_INVALID_VALUE
            );
        }
    }
}
