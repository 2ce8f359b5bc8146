//! Texture and surface instructions of a worker: `tex`, `tld4`, `suld.b`, `sust.b`, `txq` and
//! `suq`. Handles are resolved through the tenant's [`GlobalMemory::texture`] and
//! [`GlobalMemory::surface`]; texels are read and written through the same checked global
//! accesses as `ld.global` and `st.global`, so a texel outside the tenant's memory faults as an
//! illegal address, and so does a handle the tenant does not own.

use super::*;
use crate::texture::{self, Coords, Layout, SurfaceAccess};

/// A texel access that failed: (address, bytes, why).
type TexelError = (u64, usize, AccessError);

impl<'a> Worker<'a> {
    /// Reads `bytes` little-endian bytes of a texel from global memory.
    fn texel_read(&mut self, addr: u64, bytes: u64) -> Result<u64, TexelError> {
        let size = bytes as usize;
        let w = Width::from_bytes(size).ok_or((addr, size, AccessError::Misaligned))?;
        self.gload(addr, w, Ordering::Relaxed)
            .map_err(|e| (addr, size, e))
    }

    /// The fault for a texture or surface handle the tenant does not own.
    fn unknown_handle(&self, w: WarpRef<'_>, lane: u32, line: u32, what: &str, h: u64) -> Fault {
        fault(
            FaultKind::IllegalAddress,
            format!(
                "unknown {what} object handle {h:#x} {}",
                self.where_(w, lane, line)
            ),
        )
    }

    /// `tex` and `tld4` for the lanes in `m`.
    pub(super) fn tex(
        &mut self,
        w: WarpRef<'_>,
        regs: &mut [[u64; 32]],
        m: u32,
        t: &TexOp,
        line: u32,
    ) -> Result<(), Fault> {
        let mut cached: Option<(u64, texture::TextureView)> = None;
        // Mipmap levels past the first looked up so far: (handle, level, layout).
        let mut levels: Vec<(u64, u32, Layout)> = Vec::new();
        let mut lanes = m;
        while lanes != 0 {
            let l = lanes.trailing_zeros() as usize;
            lanes &= lanes - 1;
            let h = regs[t.handle as usize][l];
            let view = match cached {
                Some((ch, v)) if ch == h => v,
                _ => {
                    let Some(v) = self.ctx.memory.texture(h) else {
                        return Err(self.unknown_handle(w, l as u32, line, "texture", h));
                    };
                    cached = Some((h, v));
                    v
                }
            };
            let raw: [u32; 3] =
                std::array::from_fn(|a| lane_value(regs, t.c[a], l).unwrap_or(0) as u32);
            let layer = lane_value(regs, t.layer, l).unwrap_or(0) as u32 as i32;
            let r = match t.gather {
                Some(comp) => texture::gather(
                    &view,
                    [f32::from_bits(raw[0]), f32::from_bits(raw[1])],
                    layer,
                    usize::from(comp),
                    &mut |a, b| self.texel_read(a, b),
                ),
                None => {
                    let mut coords = if t.int_coords {
                        Coords::Int(raw.map(|v| v as i32))
                    } else {
                        Coords::Float(raw.map(f32::from_bits))
                    };
                    let lod = self.lod(regs, t, &view, l);
                    let (view, layer) = if t.cube {
                        let d = raw.map(f32::from_bits);
                        let (face_view, face_layer, face) = texture::cube_fetch(&view, d, layer);
                        coords = face;
                        (face_view, face_layer)
                    } else {
                        (view, layer)
                    };
                    match lod {
                        None => {
                            texture::sample(&view, coords, layer, &mut |a, b| self.texel_read(a, b))
                        }
                        Some(lod) => {
                            let (a, b, wt) = texture::mip_levels(&view.sampler.mip, lod);
                            let mut level = |n: u32| {
                                if n == 0 {
                                    return Some(view.layout);
                                }
                                if let Some(&(.., found)) =
                                    levels.iter().find(|(lh, ln, _)| (*lh, *ln) == (h, n))
                                {
                                    return Some(found);
                                }
                                let found = self.ctx.memory.texture_level(h, n)?;
                                levels.push((h, n, found));
                                Some(found)
                            };
                            let (Some(la), Some(lb)) = (level(a), level(b)) else {
                                let what = "mipmapped texture without its level";
                                return Err(self.unknown_handle(w, l as u32, line, what, h));
                            };
                            let mut read = |a, b| self.texel_read(a, b);
                            texture::sample_level(&view, &la, a, coords, layer, &mut read).and_then(
                                |first| {
                                    if wt == 0.0 {
                                        return Ok(first);
                                    }
                                    texture::sample_level(&view, &lb, b, coords, layer, &mut read)
                                        .map(|second| texture::blend(first, second, wt))
                                },
                            )
                        }
                    }
                }
            };
            let texel =
                r.map_err(|(a, n, e)| self.mem_fault(w, l as u32, line, "texture fetch", a, n, e))?;
            for (d, bits) in t.d.iter().zip(texel.bits) {
                regs[*d as usize][l] = if t.signed {
                    i64::from(bits as i32) as u64
                } else {
                    u64::from(bits)
                };
            }
        }
        Ok(())
    }

    /// The level of detail lane `l` fetches `view` at; `None` for level 0 (`tex.base`, or a
    /// texture of one level).
    fn lod(
        &self,
        regs: &[[u64; 32]],
        t: &TexOp,
        view: &texture::TextureView,
        l: usize,
    ) -> Option<f32> {
        if view.sampler.mip.levels <= 1 {
            return None;
        }
        let f = |r: Reg| f32::from_bits(lane_value(regs, r, l).unwrap_or(0) as u32);
        match &t.lod {
            TexLod::Base => None,
            TexLod::Level(r) => Some(f(*r)),
            TexLod::Grad(dx, dy) if t.cube => Some(texture::cube_grad_lod(
                view,
                t.c.map(f),
                dx.map(f),
                dy.map(f),
            )),
            TexLod::Grad(dx, dy) => Some(texture::grad_lod(view, dx.map(f), dy.map(f))),
        }
    }

    /// `suld.b` (`store` false) and `sust.b` for the lanes in `m`.
    pub(super) fn surf(
        &mut self,
        w: WarpRef<'_>,
        regs: &mut [[u64; 32]],
        m: u32,
        s: &SurfOp,
        store: bool,
        line: u32,
    ) -> Result<(), Fault> {
        let what = if store {
            "surface store"
        } else {
            "surface load"
        };
        let size = usize::from(s.bytes);
        let width = Width::from_bytes(size).unwrap_or(Width::B1);
        let access = u64::from(s.bytes) * u64::from(s.n);
        let mut lanes = m;
        while lanes != 0 {
            let l = lanes.trailing_zeros() as usize;
            lanes &= lanes - 1;
            let h = regs[s.handle as usize][l];
            let Some(view) = self.ctx.memory.surface(h) else {
                return Err(self.unknown_handle(w, l as u32, line, "surface", h));
            };
            let c: [i32; 3] =
                std::array::from_fn(|a| lane_value(regs, s.c[a], l).unwrap_or(0) as u32 as i32);
            let layer = lane_value(regs, s.layer, l).map(|v| v as u32 as i32);
            let at = match texture::surface_access(
                &view.layout,
                s.clamp,
                c[0],
                c[1],
                c[2],
                layer,
                access,
            ) {
                SurfaceAccess::At(a) => a,
                SurfaceAccess::Zero => {
                    if !store {
                        for d in &s.v[..usize::from(s.n)] {
                            regs[*d as usize][l] = 0;
                        }
                    }
                    continue;
                }
                SurfaceAccess::OutOfRange => {
                    return Err(fault(
                        FaultKind::IllegalAddress,
                        format!(
                            "{what} out of range at ({}, {}, {}{}) of a {}x{}x{} surface {}",
                            c[0],
                            c[1],
                            c[2],
                            layer.map_or(String::new(), |v| format!(", layer {v}")),
                            view.layout.width,
                            view.layout.height,
                            view.layout.depth,
                            self.where_(w, l as u32, line)
                        ),
                    ));
                }
            };
            for (i, r) in s.v[..usize::from(s.n)].iter().enumerate() {
                let a = at.wrapping_add((i * size) as u64);
                let res = if store {
                    self.gstore(a, width, regs[*r as usize][l], Ordering::Relaxed)
                } else {
                    self.gload(a, width, Ordering::Relaxed)
                        .map(|v| regs[*r as usize][l] = v)
                };
                if let Err(e) = res {
                    return Err(self.mem_fault(w, l as u32, line, what, a, size, e));
                }
            }
        }
        Ok(())
    }

    /// `txq` and `suq` for the lanes in `m`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn txq(
        &mut self,
        w: WarpRef<'_>,
        regs: &mut [[u64; 32]],
        m: u32,
        q: ResQuery,
        surface: bool,
        d: Reg,
        handle: Reg,
        line: u32,
    ) -> Result<(), Fault> {
        let mut lanes = m;
        while lanes != 0 {
            let l = lanes.trailing_zeros() as usize;
            lanes &= lanes - 1;
            let h = regs[handle as usize][l];
            let (layout, sampler): (Layout, Option<texture::Sampler>) = if surface {
                match self.ctx.memory.surface(h) {
                    Some(v) => (v.layout, None),
                    None => return Err(self.unknown_handle(w, l as u32, line, "surface", h)),
                }
            } else {
                match self.ctx.memory.texture(h) {
                    Some(v) => (v.layout, Some(v.sampler)),
                    None => return Err(self.unknown_handle(w, l as u32, line, "texture", h)),
                }
            };
            let v: u64 = match q {
                ResQuery::Width => layout.width,
                ResQuery::Height => layout.height,
                ResQuery::Depth => layout.depth,
                ResQuery::ArraySize => layout.layers,
                ResQuery::NormalizedCoords => {
                    u64::from(sampler.is_some_and(|s| s.normalized_coords))
                }
                ResQuery::FilterMode => sampler.map_or(0, |s| u64::from(s.filter.code())),
                ResQuery::AddrMode(i) => {
                    sampler.map_or(0, |s| u64::from(s.address[usize::from(i)].code()))
                }
                ResQuery::MipmapLevels => sampler.map_or(1, |s| u64::from(s.mip.levels)),
            };
            regs[d as usize][l] = v.min(u64::from(u32::MAX));
        }
        Ok(())
    }
}

/// Lane `l`'s value of register `r`, `None` when `r` is [`NONE`].
fn lane_value(regs: &[[u64; 32]], r: Reg, l: usize) -> Option<u64> {
    (r != NONE).then(|| regs[r as usize][l])
}
