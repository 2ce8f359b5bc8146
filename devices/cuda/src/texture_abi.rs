//! `CUDA_RESOURCE_DESC` (cuda.h) and the `CUDA_TEXTURE_DESC` of a sampling, for texture objects over linear and
//! pitched memory on a real GPU.

use vgpu_broker::texture::{TexSampling, TexelLayout};
pub use vgpu_proto::cuda::TextureDesc;

/// `CU_RESOURCE_TYPE_LINEAR`.
pub const RESOURCE_TYPE_LINEAR: u32 = 2;
/// `CU_RESOURCE_TYPE_PITCH2D`.
pub const RESOURCE_TYPE_PITCH2D: u32 = 3;
/// Size of the `res` union of `CUDA_RESOURCE_DESC` (`int reserved[32]`).
const RESOURCE_UNION_BYTES: usize = 128;

/// `CUDA_RESOURCE_DESC`: the `pitch2D` member of its union, which starts with the `linear`
/// member's fields (a linear resource uses `devPtr`, `format`, `numChannels` and
/// `sizeInBytes`, the place of `width`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ResourceDesc {
    pub res_type: u32,
    pub dev_ptr: u64,
    pub format: u32,
    pub num_channels: u32,
    /// `width` (pitch2D) or `sizeInBytes` (linear).
    pub width: usize,
    pub height: usize,
    pub pitch_in_bytes: usize,
    pub rest: [u8; RESOURCE_UNION_BYTES - 40],
    pub flags: u32,
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<ResourceDesc>() == 144);
    assert!(offset_of!(ResourceDesc, dev_ptr) == 8);
    assert!(offset_of!(ResourceDesc, width) == 24);
    assert!(offset_of!(ResourceDesc, pitch_in_bytes) == 40);
    assert!(offset_of!(ResourceDesc, flags) == 136);
};

/// The resource a real GPU samples for `layout`: linear memory for a one-dimensional layout,
/// pitched memory for a two-dimensional one; `None` for three-dimensional and layered
/// layouts, which need CUDA arrays there.
pub fn resource(layout: &TexelLayout) -> Option<ResourceDesc> {
    let size = |n: u64| usize::try_from(n).ok();
    let (res_type, width, height, pitch) = match (layout.dims, layout.layers) {
        (1, 0) => (
            RESOURCE_TYPE_LINEAR,
            size(layout.width * layout.texel_bytes())?,
            0,
            0,
        ),
        (2, 0) => (
            RESOURCE_TYPE_PITCH2D,
            size(layout.width)?,
            size(layout.height)?,
            size(layout.pitch)?,
        ),
        _ => return None,
    };
    Some(ResourceDesc {
        res_type,
        dev_ptr: layout.base,
        format: layout.format,
        num_channels: layout.channels,
        width,
        height,
        pitch_in_bytes: pitch,
        rest: [0; RESOURCE_UNION_BYTES - 40],
        flags: 0,
    })
}

/// `CUDA_TEXTURE_DESC` of `sampling`.
pub fn texture(sampling: &TexSampling) -> TextureDesc {
    TextureDesc {
        address_mode: sampling.address,
        filter_mode: sampling.filter,
        flags: sampling.flags,
        max_anisotropy: 0,
        mipmap_filter_mode: 0,
        mipmap_level_bias: 0.0,
        min_mipmap_level_clamp: 0.0,
        max_mipmap_level_clamp: 0.0,
        border_color: sampling.border,
        reserved: [0; 12],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_broker::texture::format;

    fn layout(dims: u32, layers: u64) -> TexelLayout {
        TexelLayout {
            base: 0x7000_0000,
            format: format::F32,
            channels: 2,
            dims,
            width: 64,
            height: if dims == 1 { 1 } else { 8 },
            depth: 1,
            layers,
            pitch: 512,
            slice_pitch: 4096,
        }
    }

    #[test]
    fn linear_and_pitched_layouts_map_to_cuda_resources() {
        let r = resource(&layout(1, 0)).unwrap();
        assert_eq!(
            (r.res_type, r.dev_ptr, r.width),
            (RESOURCE_TYPE_LINEAR, 0x7000_0000, 64 * 8)
        );
        let r = resource(&layout(2, 0)).unwrap();
        assert_eq!(
            (r.res_type, r.width, r.height, r.pitch_in_bytes),
            (RESOURCE_TYPE_PITCH2D, 64, 8, 512)
        );
        assert!(resource(&layout(2, 3)).is_none());
        assert!(resource(&layout(3, 0)).is_none());
    }
}
