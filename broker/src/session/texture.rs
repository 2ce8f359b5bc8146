//! Texture and surface objects of a session: checked, created by the device, counted against
//! the VM's handle budget, and destroyed with their context or the session.

use std::collections::HashMap;

use vgpu_proto::msg::{self, Request};

use super::{Session, reply};
use crate::error::CuError;
use crate::handles::MAX_ENTRIES;
use crate::limits::HandleBudget;
use crate::texture::{MipChain, TexSampling, TexelLayout};
use vgpu_proto::cuda::mip;

/// Texture or surface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum ObjectKind {
    Texture,
    Surface,
}

impl ObjectKind {
    fn name(self) -> &'static str {
        match self {
            ObjectKind::Texture => "texture object",
            ObjectKind::Surface => "surface object",
        }
    }
}

/// The live objects, by kind and device handle, with the context each belongs to.
#[derive(Debug, Default)]
pub(super) struct TexObjects {
    live: HashMap<(ObjectKind, u64), u64>,
    budget: Option<HandleBudget>,
}

impl TexObjects {
    /// Counts objects against `budget` from now on.
    pub(super) fn set_budget(&mut self, budget: HandleBudget) {
        self.budget = Some(budget);
    }

    fn charge(&self) -> Result<(), CuError> {
        if self.live.len() >= MAX_ENTRIES {
            return Err(CuError::out_of_memory(format!(
                "too many texture and surface objects in this process (at most {MAX_ENTRIES})"
            )));
        }
        match &self.budget {
            Some(b) => b.use_.charge(b.budget, 1),
            None => Ok(()),
        }
    }

    fn refund(&self) {
        if let Some(b) = &self.budget {
            b.use_.refund(b.budget, 1);
        }
    }

    /// The objects of `ctx` (every object when `None`).
    pub(super) fn of(&self, ctx: Option<u64>) -> Vec<(ObjectKind, u64)> {
        self.live
            .iter()
            .filter(|(_, c)| ctx.is_none_or(|ctx| **c == ctx))
            .map(|(k, _)| *k)
            .collect()
    }
}

/// The texel layout a `TexObjectCreate` or `SurfObjectCreate` names.
macro_rules! layout_of {
    ($m:expr) => {
        TexelLayout {
            base: $m.base,
            format: $m.format,
            channels: $m.channels,
            dims: $m.dims,
            width: $m.width,
            height: $m.height,
            depth: $m.depth,
            layers: $m.layers,
            pitch: $m.pitch,
            slice_pitch: $m.slice_pitch,
        }
    };
}

/// How a `TexObjectCreate` samples, with the mipmap chain `mip`.
fn sampling_of(m: &msg::TexObjectCreate, mip: MipChain) -> TexSampling {
    TexSampling {
        address: [m.address_0, m.address_1, m.address_2],
        filter: m.filter,
        flags: m.flags,
        border: [m.border_r, m.border_g, m.border_b, m.border_a],
        mip,
    }
}

impl Session {
    /// Serves the texture and surface object ops; `None` for other requests.
    pub(super) fn dispatch_texture(
        &mut self,
        req: &Request,
        out: &mut Vec<u8>,
    ) -> Option<Result<(), CuError>> {
        use Request as R;
        Some(match req {
            R::TexObjectCreate(m) => {
                let sampling = sampling_of(m, MipChain::ONE_LEVEL);
                self.create_object(m.ctx, ObjectKind::Texture, layout_of!(m), Some(&sampling))
                    .and_then(|handle| reply(out, msg::Handle { handle }))
            }
            R::TexObjectCreateMipmapped(m) => {
                let first = m.first_level();
                let chain = MipChain {
                    levels: m.levels,
                    pitch_align: m.pitch_align,
                    level_align: m.level_align,
                    filter: m.mip_filter,
                    bias: m.level_bias,
                    min_clamp: m.min_level_clamp,
                    max_clamp: m.max_level_clamp,
                };
                let sampling = sampling_of(&first, chain);
                self.create_object(
                    m.ctx,
                    ObjectKind::Texture,
                    layout_of!(first),
                    Some(&sampling),
                )
                .and_then(|handle| reply(out, msg::Handle { handle }))
            }
            R::SurfObjectCreate(m) => self
                .create_object(m.ctx, ObjectKind::Surface, layout_of!(m), None)
                .and_then(|handle| reply(out, msg::Handle { handle })),
            R::TexObjectDestroy(m) => self
                .destroy_object(m.ctx, ObjectKind::Texture, m.handle)
                .and_then(|()| reply(out, msg::Empty {})),
            R::SurfObjectDestroy(m) => self
                .destroy_object(m.ctx, ObjectKind::Surface, m.handle)
                .and_then(|()| reply(out, msg::Empty {})),
            _ => return None,
        })
    }

    /// Checks and makes an object over `layout` (for a mipmapped texture, its first level,
    /// whose pitches the chain decides).
    fn create_object(
        &mut self,
        ctx: u64,
        kind: ObjectKind,
        mut layout: TexelLayout,
        sampling: Option<&TexSampling>,
    ) -> Result<u64, CuError> {
        self.ctx(ctx)?;
        let chain = match sampling {
            Some(s) if s.mip.levels > 1 => Some(s.mip.levels_of(&layout)?),
            _ => None,
        };
        if let Some(first) = chain.as_ref().and_then(|c| c.first()) {
            (layout.pitch, layout.slice_pitch) = (first.pitch, first.slice_pitch);
        }
        let mut extent = layout.check()?;
        if let Some(s) = sampling {
            s.check()?;
        }
        if let Some(levels) = &chain {
            extent = mip::chain_bytes(levels);
        }
        self.allocs.check(layout.base, extent, kind.name())?;
        self.textures.charge()?;
        let made = match sampling {
            Some(s) => self.dev.texture_create(&layout, s),
            None => self.dev.surface_create(&layout),
        };
        match made {
            Ok(handle) => {
                self.textures.live.insert((kind, handle), ctx);
                Ok(handle)
            }
            Err(e) => {
                self.textures.refund();
                Err(e.into())
            }
        }
    }

    fn destroy_object(&mut self, ctx: u64, kind: ObjectKind, handle: u64) -> Result<(), CuError> {
        self.ctx(ctx)?;
        if !self.textures.live.contains_key(&(kind, handle)) {
            return Err(CuError::invalid_value(format!(
                "{handle:#x} is not a {} of this process",
                kind.name()
            )));
        }
        // Work already queued may still sample it (CUDA lets a program destroy an object
        // right after the launch that uses it): let that work finish first.
        self.engine.settle();
        self.release_object(kind, handle);
        Ok(())
    }

    /// Destroys one object on the device and returns it to the budget.
    pub(super) fn release_object(&mut self, kind: ObjectKind, handle: u64) {
        if self.textures.live.remove(&(kind, handle)).is_none() {
            return;
        }
        self.textures.refund();
        let gone = match kind {
            ObjectKind::Texture => self.dev.texture_destroy(handle),
            ObjectKind::Surface => self.dev.surface_destroy(handle),
        };
        if let Err(e) = gone {
            tracing::warn!(tenant = %self.tenant.name, error = %e, "device refused to destroy {} {handle:#x}", kind.name());
        }
    }

    /// Destroys the objects of `ctx` (all of them when `None`).
    pub(super) fn release_objects(&mut self, ctx: Option<u64>) {
        for (kind, handle) in self.textures.of(ctx) {
            self.release_object(kind, handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use vgpu_proto::cuda;
    use vgpu_proto::msg;

    use crate::testutils::{MemDevice, TestClient, serve_session, vm};

    const GRID: u64 = 4096;

    fn broker(handles: u32) -> (Arc<crate::Broker>, Arc<MemDevice>) {
        let dev = Arc::new(MemDevice::new(1 << 30, Duration::ZERO));
        let b = Arc::new(crate::Broker::new(vec![(
            "gpu0".into(),
            Arc::clone(&dev) as Arc<dyn crate::device::Device>,
        )]));
        let mut v = vm("vm1", 16 << 20);
        v.limits.handles = handles;
        b.add_tenant(&v).unwrap();
        (b, dev)
    }

    fn texture(ctx: u64, base: u64) -> msg::TexObjectCreate {
        msg::TexObjectCreate {
            ctx,
            base,
            format: crate::texture::format::F32,
            channels: 1,
            dims: 1,
            width: GRID / 4,
            height: 1,
            depth: 1,
            ..Default::default()
        }
    }

    fn alloc(c: &mut TestClient<UnixStream>, ctx: u64) -> u64 {
        c.call(&msg::MemAlloc { ctx, size: GRID }, &[])
            .unwrap()
            .0
            .ptr
    }

    fn wait_for(dev: &MemDevice, live: usize) {
        let end = Instant::now() + Duration::from_secs(5);
        while dev.live_objects() != live && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(dev.live_objects(), live);
    }

    #[test]
    fn objects_go_with_their_context_and_their_session() {
        let (b, dev) = broker(64);
        let (mut c, ctx) = serve_session(&b, "vm1");
        let p = alloc(&mut c, ctx);
        c.call(&texture(ctx, p), &[]).unwrap();
        let other = c
            .call(
                &msg::CtxCreate {
                    device: 0,
                    flags: 0,
                },
                &[],
            )
            .unwrap()
            .0
            .handle;
        let q = alloc(&mut c, other);
        c.call(&texture(other, q), &[]).unwrap();
        c.call(
            &msg::SurfObjectCreate {
                ctx: other,
                base: q,
                format: crate::texture::format::U8,
                channels: 4,
                dims: 1,
                width: GRID / 4,
                height: 1,
                depth: 1,
                ..Default::default()
            },
            &[],
        )
        .unwrap();
        assert_eq!(dev.live_objects(), 3);
        c.call(&msg::CtxDestroy { ctx: other }, &[]).unwrap();
        assert_eq!(dev.live_objects(), 1, "the context's two went with it");
        drop(c);
        wait_for(&dev, 0);
    }

    #[test]
    fn the_handle_budget_bounds_objects_and_gets_them_back() {
        let (b, dev) = broker(8);
        let (mut c, ctx) = serve_session(&b, "vm1");
        let p = alloc(&mut c, ctx);
        let mut made = Vec::new();
        let refused = loop {
            match c.call(&texture(ctx, p), &[]) {
                Ok((h, _)) => made.push(h.handle),
                Err(e) => break e.0,
            }
            assert!(made.len() <= 8, "past the VM's budget of 8 handles");
        };
        assert_eq!(refused, cuda::CUDA_ERROR_OUT_OF_MEMORY);
        // The context holds one handle of the budget.
        assert_eq!(made.len(), 7);
        for h in made {
            c.call(&msg::TexObjectDestroy { ctx, handle: h }, &[])
                .unwrap();
        }
        assert_eq!(dev.live_objects(), 0);
        c.call(&texture(ctx, p), &[]).unwrap();
        // Refusals hold no handle: texels past the allocation, a forged context.
        assert_eq!(
            c.call(&texture(ctx, p + GRID), &[]).unwrap_err().0,
            cuda::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            c.call(&texture(ctx ^ 1, p), &[]).unwrap_err().0,
            cuda::CUDA_ERROR_INVALID_CONTEXT
        );
        assert_eq!(dev.live_objects(), 1);
    }

    #[test]
    fn a_mipmapped_chain_must_lie_in_one_allocation_of_the_process() {
        let (b, dev) = broker(64);
        let (mut c, ctx) = serve_session(&b, "vm1");
        const SIZE: u64 = 4 * GRID;
        let p = c
            .call(&msg::MemAlloc { ctx, size: SIZE }, &[])
            .unwrap()
            .0
            .ptr;
        // 32x32 floats: levels of 32x32, 16x16, 8x8, 4x4, 2x2 and 1x1 texels, rows of at
        // least 32 bytes, each level at a multiple of 512 bytes: 4096, 1024, 256, 128, 64 and
        // 32 bytes at offsets 0, 4096, 5120, 5632, 6144 and 6656; the chain ends at 6688.
        const CHAIN: u64 = 6688;
        let chain = |base: u64, levels: u32| msg::TexObjectCreateMipmapped {
            ctx,
            base,
            format: crate::texture::format::F32,
            channels: 1,
            dims: 2,
            width: 32,
            height: 32,
            depth: 1,
            levels,
            pitch_align: 32,
            level_align: 512,
            max_level_clamp: 5.0,
            ..Default::default()
        };
        c.call(&chain(p, 6), &[]).unwrap();
        c.call(&chain(p + SIZE - CHAIN, 6), &[]).unwrap();
        // Five levels fit where six do not.
        c.call(&chain(p + SIZE - CHAIN + 32, 5), &[]).unwrap();
        let code = |m: msg::TexObjectCreateMipmapped, c: &mut TestClient<UnixStream>| {
            c.call(&m, &[]).unwrap_err().0
        };
        for (why, m) in [
            (
                "the last level past the allocation",
                chain(p + SIZE - CHAIN + 32, 6),
            ),
            ("no levels", chain(p, 0)),
            ("more levels than 32 texels halve into", chain(p, 7)),
            ("levels past any texture", chain(p, u32::MAX)),
            (
                "rows aligned to 48 bytes",
                msg::TexObjectCreateMipmapped {
                    pitch_align: 48,
                    ..chain(p, 2)
                },
            ),
            (
                "levels aligned past 64 KiB",
                msg::TexObjectCreateMipmapped {
                    level_align: 1 << 40,
                    ..chain(p, 2)
                },
            ),
            (
                "a mipmap filter CUDA does not have",
                msg::TexObjectCreateMipmapped {
                    mip_filter: 9,
                    ..chain(p, 2)
                },
            ),
            (
                "a width past 64 bits of bytes",
                msg::TexObjectCreateMipmapped {
                    width: u64::MAX / 2,
                    ..chain(p, 2)
                },
            ),
        ] {
            assert_eq!(code(m, &mut c), cuda::CUDA_ERROR_INVALID_VALUE, "{why}");
        }
        assert_eq!(dev.live_objects(), 3, "refusals make no object");
    }
}
