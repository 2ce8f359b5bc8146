//! Texture and surface objects of one context: the views the interpreter samples, by handle.
//!
//! Handles count up from 1 and are never reused within a context, so a kernel holding a
//! destroyed object's handle faults instead of reading another object's texels.

use std::collections::HashMap;

use vgpu_broker::device::DeviceError;
use vgpu_broker::texture::{TexSampling, TexelLayout, format, trsf};
use vgpu_ptx::texture::{
    AddressMode, ChannelFormat, FilterMode, Layout, Sampler, SurfaceView, TextureView,
};

/// The live objects of a context.
#[derive(Debug, Default)]
pub(crate) struct Objects {
    last: u64,
    textures: HashMap<u64, TextureView>,
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

fn sampler(s: &TexSampling) -> Sampler {
    Sampler {
        address: s.address.map(address_mode),
        filter: if s.filter == 1 {
            FilterMode::Linear
        } else {
            FilterMode::Point
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
        let h = self.next();
        self.textures.insert(h, view);
        Ok(h)
    }

    pub(crate) fn create_surface(&mut self, l: &TexelLayout) -> Result<u64, DeviceError> {
        let view = SurfaceView { layout: layout(l)? };
        let h = self.next();
        self.surfaces.insert(h, view);
        Ok(h)
    }

    pub(crate) fn destroy_texture(&mut self, h: u64) -> Result<(), DeviceError> {
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

    pub(crate) fn surface(&self, h: u64) -> Option<SurfaceView> {
        self.surfaces.get(&h).copied()
    }
}
