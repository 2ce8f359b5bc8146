//! Texture and surface objects of one context: the views the interpreter samples, by handle.
//!
//! Handles count up from 1 and are never reused within a context, so a kernel holding a
//! destroyed object's handle faults instead of reading another object's texels.

use std::collections::HashMap;

use vgpu_broker::device::DeviceError;
use vgpu_broker::texture::{TexSampling, TexelLayout, format, trsf};
use vgpu_ptx::texture::{
    AddressMode, ChannelFormat, FilterMode, Layout, MipSampler, Sampler, SurfaceView, TextureView,
};

/// The live objects of a context.
#[derive(Debug, Default)]
pub(crate) struct Objects {
    last: u64,
    textures: HashMap<u64, TextureView>,
    /// The levels past the first of mipmapped textures.
    levels: HashMap<u64, Vec<Layout>>,
    surfaces: HashMap<u64, SurfaceView>,
}

fn channel_format(f: u32) -> Result<ChannelFormat, DeviceError> {
    Ok(match f {
        format::U8 => ChannelFormat::U8,
        format::U16 => ChannelFormat::U16,
        format::U32 => ChannelFormat::U32,
        format::S8 => ChannelFormat::S8,
        format::S16 => ChannelFormat::S16,
        format::S32 => ChannelFormat::S32,
        format::F16 => ChannelFormat::F16,
        format::F32 => ChannelFormat::F32,
        other => {
            return Err(DeviceError::NotSupported(format!(
                "array format {other:#x} is not sampled by the simulated GPU"
            )));
        }
    })
}

fn layout(l: &TexelLayout) -> Result<Layout, DeviceError> {
    let small = |n: u32| {
        u8::try_from(n).map_err(|_| DeviceError::NotSupported(format!("{n} is out of range")))
    };
    Ok(Layout {
        base: l.base,
        format: channel_format(l.format)?,
        channels: small(l.channels)?,
        dims: small(l.dims)?,
        width: l.width,
        height: l.height,
        depth: l.depth,
        layers: l.layers,
        pitch: l.pitch,
        slice_pitch: l.slice_pitch,
    })
}

fn address_mode(m: u32) -> AddressMode {
    match m {
        0 => AddressMode::Wrap,
        2 => AddressMode::Mirror,
        3 => AddressMode::Border,
        _ => AddressMode::Clamp,
    }
}

fn filter_mode(f: u32) -> FilterMode {
    if f == 1 {
        FilterMode::Linear
    } else {
        FilterMode::Point
    }
}

fn sampler(s: &TexSampling) -> Sampler {
    Sampler {
        address: s.address.map(address_mode),
        filter: filter_mode(s.filter),
        mip: MipSampler {
            levels: s.mip.levels.max(1),
            filter: filter_mode(s.mip.filter),
            bias: s.mip.bias,
            min_clamp: s.mip.min_clamp,
            max_clamp: s.mip.max_clamp,
        },
        read_as_integer: s.flags & trsf::READ_AS_INTEGER != 0,
        normalized_coords: s.flags & trsf::NORMALIZED_COORDINATES != 0,
        border_color: s.border,
    }
}

impl Objects {
    fn next(&mut self) -> u64 {
        self.last += 1;
        self.last
    }

    pub(crate) fn create_texture(
        &mut self,
        l: &TexelLayout,
        s: &TexSampling,
    ) -> Result<u64, DeviceError> {
        let view = TextureView {
            layout: layout(l)?,
            sampler: sampler(s),
        };
        let levels = if s.mip.levels > 1 {
            let chain = s.mip.levels_of(l).map_err(|e| {
                DeviceError::NotSupported(format!("a mipmapped texture's levels: {}", e.message))
            })?;
            chain[1..]
                .iter()
                .map(|level| layout(&l.level(level)))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            Vec::new()
        };
        let h = self.next();
        self.textures.insert(h, view);
        if !levels.is_empty() {
            self.levels.insert(h, levels);
        }
        Ok(h)
    }

    pub(crate) fn create_surface(&mut self, l: &TexelLayout) -> Result<u64, DeviceError> {
        let view = SurfaceView { layout: layout(l)? };
        let h = self.next();
        self.surfaces.insert(h, view);
        Ok(h)
    }

    pub(crate) fn destroy_texture(&mut self, h: u64) -> Result<(), DeviceError> {
        self.levels.remove(&h);
        self.textures
            .remove(&h)
            .map(drop)
            .ok_or_else(|| DeviceError::NotSupported(format!("no texture object {h:#x}")))
    }

    pub(crate) fn destroy_surface(&mut self, h: u64) -> Result<(), DeviceError> {
        self.surfaces
            .remove(&h)
            .map(drop)
            .ok_or_else(|| DeviceError::NotSupported(format!("no surface object {h:#x}")))
    }

    pub(crate) fn texture(&self, h: u64) -> Option<TextureView> {
        self.textures.get(&h).copied()
    }

    /// Level `level` (1 and up) of mipmapped texture `h`.
    pub(crate) fn texture_level(&self, h: u64, level: u32) -> Option<Layout> {
        let i = usize::try_from(level).ok()?.checked_sub(1)?;
        self.levels.get(&h)?.get(i).copied()
    }

    pub(crate) fn surface(&self, h: u64) -> Option<SurfaceView> {
        self.surfaces.get(&h).copied()
    }
}
