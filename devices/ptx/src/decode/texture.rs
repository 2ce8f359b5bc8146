//! Texture and surface instructions: `tex`, `tld4`, `txq`, `suld.b`, `sust.b` and `suq`.
//!
//! Supported geometries are `.1d`, `.2d`, `.3d`, `.a1d`, `.a2d`, and for `tex` `.cube` and
//! `.acube` (a cube map's faces are its texture's layers) (`tld4`: `.2d` and `.a2d`)
//! with texture object handles in registers or read from texture and surface references
//! (`.global .texref`/`.surfref` variables holding the bound handle: the instruction is preceded
//! by an 8-byte `ld.global` of the handle into a temporary register, under the same guard).
//! `tex.base`, `tex.level` and `tex.grad` choose a mipmapped texture's level (float
//! coordinates only; `txq.num_mipmap_levels` counts the levels, `txq.level` is not decoded).
//! Multisample textures, explicit samplers, the residency predicate and formatted `sust.p` are
//! refused at load as unsupported instructions.

use super::*;
use crate::texture::{ReferenceKind, SurfaceClamp};

/// Components `tld4` may gather, in channel order.
const GATHER_COMPONENTS: [&str; 4] = ["r", "g", "b", "a"];

impl FnCtx<'_> {
    /// The geometry modifier.
    fn geom(&self, ins: &Instr, m: &mut Mods) -> DResult<Geom> {
        m.any(&["1d", "2d", "3d", "a1d", "a2d", "cube", "acube"])
            .and_then(Geom::parse)
            .ok_or_else(|| unsupported(ins))
    }

    /// The register holding the object handle that `name` gives an instruction wanting a `kind`
    /// object: `name` itself when it is a register; for a reference of that kind, a temporary
    /// loaded from the reference's variable (`ld.global.u64`) just before the instruction.
    fn handle(&mut self, ins: &Instr, name: &str, kind: ReferenceKind) -> DResult<Reg> {
        let what = match kind {
            ReferenceKind::Texture => "texture",
            ReferenceKind::Surface => "surface",
        };
        let n = self.lookup(name);
        let reference = match n {
            Some(Name::Reg(r)) => return Ok(r),
            Some(Name::Global(idx)) => self.m.globals[idx as usize].reference,
            None => return Err(self.err(format!("undefined name `{name}`"))),
            Some(_) => None,
        };
        match (n, reference) {
            (Some(n), Some(k)) if k == kind => {
                let base = self.addr_of(n, 0, false, name)?;
                let t = self.new_reg()?;
                let sink = self.sink;
                let (guard, neg) = self.guard;
                self.push(
                    Op::Ld {
                        space: Space::Global,
                        bytes: ReferenceKind::HANDLE_BYTES as u8,
                        sext: false,
                        n: 1,
                        d: [t, sink, sink, sink],
                        base,
                        off: 0,
                        ord: MemOrd::Relaxed,
                    },
                    guard,
                    neg,
                );
                Ok(t)
            }
            (_, Some(k)) => Err(self.err(format!(
                "`{}` needs a {what} reference, but `{name}` is a `{}`",
                ins.opcode,
                k.directive()
            ))),
            (_, None) => Err(self.err(format!(
                "`{name}` is neither a register holding a {what} handle nor a `{}` variable",
                kind.directive()
            ))),
        }
    }

    /// The handle and coordinates of `[handle, {coords}]`: (handle, x/y/z, layer).
    fn tex_operand(
        &mut self,
        ins: &Instr,
        op: &Operand,
        geom: Geom,
        cty: Ty,
        kind: ReferenceKind,
    ) -> DResult<(Reg, [Reg; 3], Reg)> {
        let Operand::Tex(name, rest) = op else {
            return Err(self.err("expected a texture or surface operand `[handle, {...}]`"));
        };
        // `[handle, sampler, coords]` names a separate sampler (unified mode only).
        let [coords] = rest.as_slice() else {
            return Err(unsupported(ins));
        };
        let items: Vec<Operand> = match coords {
            Operand::Vec(items) => items.clone(),
            one => vec![one.clone()],
        };
        let first = usize::from(geom.layered());
        if items.len() < first + geom.axes() || items.len() > 4 {
            return Err(self.err("wrong number of coordinates for the geometry"));
        }
        let layer = if geom.layered() {
            self.val(&items[0], Ty::S32)?
        } else {
            NONE
        };
        let mut c = [NONE; 3];
        for (a, r) in c.iter_mut().enumerate().take(geom.axes()) {
            *r = self.val(&items[first + a], cty)?;
        }
        // Resolved last, so that the handle load directly precedes the instruction.
        let handle = self.handle(ins, name, kind)?;
        Ok((handle, c, layer))
    }

    /// A gradient of `tex.grad`: a vector of one `.f32` per axis of the geometry (four for
    /// `.3d`, the last unused).
    fn gradient(&mut self, op: &Operand, geom: Geom) -> DResult<[Reg; 3]> {
        let items: Vec<Operand> = match op {
            Operand::Vec(items) => items.clone(),
            one => vec![one.clone()],
        };
        if items.len() < geom.axes() || items.len() > 4 {
            return Err(self.err("wrong number of gradient components for the geometry"));
        }
        let mut g = [NONE; 3];
        for (a, r) in g.iter_mut().enumerate().take(geom.axes()) {
            *r = self.val(&items[a], Ty::F32)?;
        }
        Ok(g)
    }

    /// `tex{.base,.level,.grad}.geom.v4.dtype.ctype` and `tld4.comp.geom.v4.dtype.f32`.
    pub(super) fn sel_tex(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let mip = m.any(&["level", "grad", "base"]);
        let gather = if ins.opcode == "tld4" {
            let c = m.any(&GATHER_COMPONENTS).ok_or_else(|| unsupported(ins))?;
            GATHER_COMPONENTS
                .iter()
                .position(|x| *x == c)
                .map(|i| i as u8)
        } else {
            None
        };
        let geom = self.geom(ins, m)?;
        if gather.is_some() && (!matches!(geom, Geom::D2 | Geom::A2) || mip.is_some()) {
            return Err(unsupported(ins));
        }

        if !m.has("v4") {
            return Err(unsupported(ins));
        }
        let t = m.types();
        let [dty, cty] = t.as_slice() else {
            return Err(self.err(format!("`{}` needs two types", ins.full_name())));
        };
        if !matches!(dty, Ty::F32 | Ty::S32 | Ty::U32)
            || !matches!(cty, Ty::F32 | Ty::S32)
            || (gather.is_some() && *cty != Ty::F32)
        {
            return Err(unsupported(ins));
        }
        // A cube map is sampled by direction: float coordinates only.
        if geom.cube() && *cty != Ty::F32 {
            return Err(unsupported(ins));
        }
        // A level of detail or two gradients follow the coordinates (float coordinates only).
        let lod_operands = match mip {
            Some("level") => 1,
            Some("grad") => 2,
            _ => 0,
        };
        if lod_operands > 0 && *cty != Ty::F32 {
            return Err(unsupported(ins));
        }
        let o = self.ops(ins, 2 + lod_operands)?;
        let (n, d) = self.dst_list(&o[0])?;
        if n != 4 {
            return Err(self.err("vector size does not match the destination list"));
        }
        // Resolved before the coordinates, so that a reference's handle load stays last.
        let lod = match mip {
            Some("level") => TexLod::Level(self.val(&o[2], Ty::F32)?),
            Some("grad") => TexLod::Grad(self.gradient(&o[2], geom)?, self.gradient(&o[3], geom)?),
            _ => TexLod::Base,
        };
        let (handle, c, layer) =
            self.tex_operand(ins, &o[1], geom, *cty, ReferenceKind::Texture)?;
        Ok(Op::Tex(Box::new(TexOp {
            lod,
            cube: geom.cube(),
            gather,
            signed: *dty == Ty::S32,
            int_coords: *cty == Ty::S32,
            d,
            handle,
            c,
            layer,
        })))
    }

    /// `suld.b.geom{.vN}.bK{.clamp}` and `sust.b.geom{.vN}.bK{.clamp}`.
    pub(super) fn sel_surf(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let store = ins.opcode == "sust";
        if !m.has("b") {
            return Err(unsupported(ins));
        }
        let geom = self.geom(ins, m)?;
        // Cube map surfaces are addressed as layered 2-D surfaces (`surfCubemapread` is
        // `suld.b.a2d`); PTX has no cube surface geometry.
        if geom.cube() {
            return Err(unsupported(ins));
        }
        let n_vec = match m.any(&["v2", "v4"]) {
            Some("v2") => 2,
            Some("v4") => 4,
            _ => 1,
        };
        let clamp = match m.any(&["trap", "clamp", "zero"]) {
            Some("clamp") => SurfaceClamp::Clamp,
            Some("zero") => SurfaceClamp::Zero,
            _ => SurfaceClamp::Trap,
        };
        let ty = self.one_type(ins, m)?;
        if !matches!(ty, Ty::B8 | Ty::B16 | Ty::B32 | Ty::B64) {
            return Err(unsupported(ins));
        }
        let o = self.ops(ins, 2)?;
        let (data, at) = if store {
            (&o[1], &o[0])
        } else {
            (&o[0], &o[1])
        };
        let (n, v) = if store {
            self.src_list(data, ty)?
        } else {
            self.dst_list(data)?
        };
        if n != n_vec {
            return Err(self.err("vector size does not match the register list"));
        }
        let kind = ReferenceKind::Surface;
        let (handle, c, layer) = self.tex_operand(ins, at, geom, Ty::S32, kind)?;
        let s = Box::new(SurfOp {
            bytes: ty.bytes() as u8,
            n,
            clamp,
            v,
            handle,
            c,
            layer,
        });
        Ok(if store { Op::Sust(s) } else { Op::Suld(s) })
    }

    /// `txq.query.b32 d, [handle]` and `suq.query.b32 d, [handle]`.
    pub(super) fn sel_query(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let surface = ins.opcode == "suq";
        if m.has("level") {
            return Err(unsupported(ins));
        }
        let q = match m.any(&[
            "width",
            "height",
            "depth",
            "array_size",
            "normalized_coords",
            "filter_mode",
            "addr_mode_0",
            "addr_mode_1",
            "addr_mode_2",
            "num_mipmap_levels",
        ]) {
            Some("width") => ResQuery::Width,
            Some("height") => ResQuery::Height,
            Some("depth") => ResQuery::Depth,
            Some("array_size") => ResQuery::ArraySize,
            Some("normalized_coords") if !surface => ResQuery::NormalizedCoords,
            Some("filter_mode") if !surface => ResQuery::FilterMode,
            Some("addr_mode_0") if !surface => ResQuery::AddrMode(0),
            Some("addr_mode_1") if !surface => ResQuery::AddrMode(1),
            Some("addr_mode_2") if !surface => ResQuery::AddrMode(2),
            Some("num_mipmap_levels") if !surface => ResQuery::MipmapLevels,
            _ => return Err(unsupported(ins)),
        };
        let ty = self.one_type(ins, m)?;
        if ty.bytes() != 4 || !ty.is_int() {
            return Err(unsupported(ins));
        }
        let o = self.ops(ins, 2)?;
        let d = self.dst(&o[0])?;
        let kind = if surface {
            ReferenceKind::Surface
        } else {
            ReferenceKind::Texture
        };
        let handle = match &o[1] {
            Operand::Addr(Some(name), 0) => self.handle(ins, name, kind)?,
            Operand::Addr(..) => return Err(unsupported(ins)),
            _ => return Err(self.err("expected a texture or surface operand `[handle]`")),
        };
        Ok(Op::Txq {
            q,
            surface,
            d,
            handle,
        })
    }
}
