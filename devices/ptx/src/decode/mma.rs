//! Warp matrix instructions: `wmma.load`, `wmma.store` and `wmma.mma` (the CUDA C++ `wmma`
//! API's fragments and `mma_sync`), `cvt.rna.tf32.f32`, and the instructions whose fragment
//! layouts the PTX ISA specifies: `mma.sync`, `ldmatrix`, `stmatrix` and `movmatrix`.
//!
//! A fragment is a warp's registers holding one matrix; PTX leaves which thread holds which
//! element unspecified, so the interpreter picks one ([`crate::exec`]: element `n` of the
//! row-major matrix is slot `n` of the warp's slots, lane after lane, repeated when a fragment
//! has more slots than the matrix elements). Supported: `.f16` A and B with `.f16` or `.f32`
//! accumulators and `.bf16` A and B with `.f32` ones in the shapes `.m16n16k16`, `.m32n8k16`
//! and `.m8n32k16`; `.tf32` in `.m16n16k8`; `.s8` and `.u8` with `.s32` accumulators in the
//! three 16-deep shapes; `.f64` in `.m8n8k4`. Sub-byte and single-bit types are refused at load.
//!
//! `mma.sync` (see [`sync_supported`]) and the 16-bit `.m8n8` matrices of `ldmatrix`,
//! `stmatrix` and `movmatrix` hold elements where the PTX ISA's fragment figures put them, so
//! programs that build fragments from registers themselves (CUTLASS, Triton) read and write the
//! right elements.

use super::*;

/// Lanes of a warp, which share a fragment.
const LANES: usize = crate::WARP_SIZE as usize;
/// Most registers of one fragment (`.f16` A and B fragments have 8).
const MAX_FRAGMENT_REGS: usize = 8;

fn shape_of(s: &str) -> Option<MmaShape> {
    let rest = s.strip_prefix('m')?;
    let (m, rest) = rest.split_once('n')?;
    let (n, k) = rest.split_once('k')?;
    Some(MmaShape {
        m: m.parse().ok()?,
        n: n.parse().ok()?,
        k: k.parse().ok()?,
    })
}

/// Whether A and B of type `ab` with accumulators of type `acc` are supported in `shape`.
fn supported(shape: MmaShape, ab: MmaTy, acc: MmaTy) -> bool {
    let sixteen_deep = matches!(
        (shape.m, shape.n, shape.k),
        (16, 16, 16) | (32, 8, 16) | (8, 32, 16)
    );
    match ab {
        MmaTy::F16 => sixteen_deep && matches!(acc, MmaTy::F16 | MmaTy::F32),
        MmaTy::Bf16 => sixteen_deep && acc == MmaTy::F32,
        MmaTy::Tf32 => (shape.m, shape.n, shape.k) == (16, 16, 8) && acc == MmaTy::F32,
        MmaTy::S8 | MmaTy::U8 => sixteen_deep && acc == MmaTy::S32,
        MmaTy::F64 => (shape.m, shape.n, shape.k) == (8, 8, 4) && acc == MmaTy::F64,
        MmaTy::F32 | MmaTy::S32 => false,
    }
}

/// The accumulator types a fragment of type `ty` may load or store as C or D, for A and B of
/// some type in `shape`.
fn accumulator_ok(shape: MmaShape, ty: MmaTy) -> bool {
    [MmaTy::F16, MmaTy::Bf16, MmaTy::Tf32, MmaTy::S8, MmaTy::F64]
        .iter()
        .any(|&ab| supported(shape, ab, ty))
}

/// Whether `mma.sync` of `shape` multiplies A of type `a` by B of type `b` into accumulators C
/// of type `c` and D of type `d`: `.f16` (`.f16` or `.f32` accumulators, each on its own) and
/// `.bf16` (`.f32`) in `.m16n8k8` and `.m16n8k16`; `.tf32` (`.f32`) in `.m16n8k4` and
/// `.m16n8k8`; `.s8` and `.u8`, mixed as they come (`.s32`), in `.m8n8k16`, `.m16n8k16` and
/// `.m16n8k32`; `.f64` in `.m8n8k4`.
fn sync_supported(shape: MmaShape, a: MmaTy, b: MmaTy, c: MmaTy, d: MmaTy) -> bool {
    let mnk = (shape.m, shape.n, shape.k);
    let floats = |acc: MmaTy| c == acc && d == acc;
    match (a, b) {
        (MmaTy::F16, MmaTy::F16) => {
            matches!(mnk, (16, 8, 8) | (16, 8, 16))
                && matches!(c, MmaTy::F16 | MmaTy::F32)
                && matches!(d, MmaTy::F16 | MmaTy::F32)
        }
        (MmaTy::Bf16, MmaTy::Bf16) => matches!(mnk, (16, 8, 8) | (16, 8, 16)) && floats(MmaTy::F32),
        (MmaTy::Tf32, MmaTy::Tf32) => matches!(mnk, (16, 8, 4) | (16, 8, 8)) && floats(MmaTy::F32),
        (MmaTy::S8 | MmaTy::U8, MmaTy::S8 | MmaTy::U8) => {
            matches!(mnk, (8, 8, 16) | (16, 8, 16) | (16, 8, 32)) && floats(MmaTy::S32)
        }
        (MmaTy::F64, MmaTy::F64) => mnk == (8, 8, 4) && floats(MmaTy::F64),
        _ => false,
    }
}

/// The `.xN` count of an `ldmatrix` or `stmatrix`.
fn matrix_count(s: &str) -> Option<usize> {
    match s {
        "x1" => Some(1),
        "x2" => Some(2),
        "x4" => Some(4),
        _ => None,
    }
}

impl FnCtx<'_> {
    /// The registers of a fragment operand `{r0, r1, ...}` (a single register without braces).
    fn fragment(&mut self, op: &Operand, dst: bool, ty: MmaTy) -> DResult<Vec<Reg>> {
        let items: Vec<Operand> = match op {
            Operand::Vec(items) => items.clone(),
            one => vec![one.clone()],
        };
        if items.is_empty() || items.len() > MAX_FRAGMENT_REGS {
            return Err(self.err("a fragment has 1 to 8 registers"));
        }
        let reg_ty = if ty == MmaTy::F64 { Ty::B64 } else { Ty::B32 };
        items
            .iter()
            .map(|it| {
                if dst {
                    self.dst(it)
                } else {
                    self.val(it, reg_ty)
                }
            })
            .collect()
    }

    /// Checks `regs` registers of `ty` hold fragment `f` of `shape`: each element at least
    /// once, each as often as the others.
    fn check_fragment(&self, shape: MmaShape, f: MmaFrag, ty: MmaTy, regs: usize) -> DResult<()> {
        let (rows, cols) = shape.dims(f);
        let slots = regs * ty.per_reg() * LANES;
        if slots < rows * cols || !slots.is_multiple_of(rows * cols) {
            return Err(self.err(format!(
                "{regs} registers do not hold a {rows}x{cols} fragment of this type"
            )));
        }
        Ok(())
    }

    /// `wmma.load.{a,b,c}`, `wmma.store.d` and `wmma.mma`.
    pub(super) fn sel_wmma(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        if !m.has("sync") {
            return Err(unsupported(ins));
        }
        let kind = m
            .any(&["load", "store", "mma"])
            .ok_or_else(|| unsupported(ins))?;
        let shapes = m.take_all(shape_of);
        let [shape] = shapes.as_slice() else {
            return Err(unsupported(ins));
        };
        let shape = *shape;
        let layouts = m.take_all(|s| match s {
            "row" => Some(false),
            "col" => Some(true),
            _ => None,
        });
        let types = m.take_all(MmaTy::parse);
        match kind {
            "mma" => {
                let satfinite = m.has("satfinite");
                // `.rn` (f64) is the only rounding; the others are refused.
                m.has("rn");
                let (d, ab, c) = match types.as_slice() {
                    [d, c] => (*d, MmaTy::F16, *c),
                    [d, a, b, c] if a == b => (*d, *a, *c),
                    _ => return Err(unsupported(ins)),
                };
                if layouts.len() != 2 || !supported(shape, ab, c) || !supported(shape, ab, d) {
                    return Err(unsupported(ins));
                }
                let o = self.ops(ins, 4)?;
                // Layouts only say how the fragments were loaded: the interpreter's fragments
                // hold each matrix the same way whatever its layout in memory.
                let regs_d = self.fragment(&o[0], true, d)?;
                let regs_a = self.fragment(&o[1], false, ab)?;
                let regs_b = self.fragment(&o[2], false, ab)?;
                let regs_c = self.fragment(&o[3], false, c)?;
                self.check_fragment(shape, MmaFrag::C, d, regs_d.len())?;
                self.check_fragment(shape, MmaFrag::A, ab, regs_a.len())?;
                self.check_fragment(shape, MmaFrag::B, ab, regs_b.len())?;
                self.check_fragment(shape, MmaFrag::C, c, regs_c.len())?;
                Ok(Op::WmmaMma(Box::new(Mma {
                    shape,
                    a: ab,
                    b: ab,
                    c,
                    d,
                    satfinite,
                    regs_d,
                    regs_a,
                    regs_b,
                    regs_c,
                })))
            }
            _ => {
                let store = kind == "store";
                let frag = if store {
                    m.has("d").then_some(MmaFrag::C)
                } else {
                    match m.any(&["a", "b", "c"]) {
                        Some("a") => Some(MmaFrag::A),
                        Some("b") => Some(MmaFrag::B),
                        Some("c") => Some(MmaFrag::C),
                        _ => None,
                    }
                }
                .ok_or_else(|| unsupported(ins))?;
                let space = m.space();
                let ([col], [ty]) = (layouts.as_slice(), types.as_slice()) else {
                    return Err(unsupported(ins));
                };
                let ok = match frag {
                    MmaFrag::A | MmaFrag::B => {
                        [MmaTy::S32, MmaTy::F32]
                            .iter()
                            .any(|&acc| supported(shape, *ty, acc))
                            || supported(shape, *ty, MmaTy::F64)
                    }
                    MmaFrag::C => accumulator_ok(shape, *ty),
                };
                if !ok {
                    return Err(unsupported(ins));
                }
                let o = &ins.operands;
                if !(2..=3).contains(&o.len()) {
                    return Err(self.err(format!(
                        "`{}` expects 2 or 3 operands, found {}",
                        ins.full_name(),
                        o.len()
                    )));
                }
                let (frag_op, addr_op) = if store {
                    (&o[1], &o[0])
                } else {
                    (&o[0], &o[1])
                };
                let stride = match o.get(2) {
                    Some(s) => self.val(s, Ty::U32)?,
                    None => NONE,
                };
                let regs = self.fragment(frag_op, !store, *ty)?;
                self.check_fragment(shape, frag, *ty, regs.len())?;
                let Addr::Reg(base, off) = self.address(addr_op, space)? else {
                    return Err(unsupported(ins));
                };
                let mem = Box::new(WmmaMem {
                    frag,
                    col: *col,
                    shape,
                    ty: *ty,
                    space,
                    regs,
                    base,
                    off,
                    stride,
                });
                Ok(if store {
                    Op::WmmaStore(mem)
                } else {
                    Op::WmmaLoad(mem)
                })
            }
        }
    }

    /// Checks `regs` registers of `ty` hold exactly `mma.sync` fragment `f` of `shape`.
    fn check_sync_fragment(
        &self,
        shape: MmaShape,
        f: MmaFrag,
        ty: MmaTy,
        regs: usize,
    ) -> DResult<()> {
        let (rows, cols) = shape.dims(f);
        if regs * ty.per_reg() * LANES != rows * cols {
            return Err(self.err(format!(
                "`mma.sync` needs {} registers for a {rows}x{cols} fragment of this type, found {regs}",
                rows * cols / (ty.per_reg() * LANES)
            )));
        }
        Ok(())
    }

    /// `mma.sync.aligned.{shape}.row.col{.satfinite}.{dtype}.{atype}.{btype}.{ctype} d, a, b, c`.
    pub(super) fn sel_mma(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        if !m.has("sync") || m.has("sp") || m.has("sp::ordered_metadata") {
            return Err(unsupported(ins));
        }
        let shapes = m.take_all(shape_of);
        let layouts = m.take_all(|s| match s {
            "row" => Some(false),
            "col" => Some(true),
            _ => None,
        });
        let satfinite = m.has("satfinite");
        // `.rn`, the only rounding `.f64` has, may be written out.
        m.has("rn");
        let types = m.take_all(MmaTy::parse);
        let ([shape], [false, true], [d, a, b, c]) =
            (shapes.as_slice(), layouts.as_slice(), types.as_slice())
        else {
            return Err(unsupported(ins));
        };
        let (shape, a, b, c, d) = (*shape, *a, *b, *c, *d);
        if !sync_supported(shape, a, b, c, d) || (satfinite && d != MmaTy::S32) {
            return Err(unsupported(ins));
        }
        let o = self.ops(ins, 4)?;
        let regs_d = self.fragment(&o[0], true, d)?;
        let regs_a = self.fragment(&o[1], false, a)?;
        let regs_b = self.fragment(&o[2], false, b)?;
        let regs_c = self.fragment(&o[3], false, c)?;
        self.check_sync_fragment(shape, MmaFrag::C, d, regs_d.len())?;
        self.check_sync_fragment(shape, MmaFrag::A, a, regs_a.len())?;
        self.check_sync_fragment(shape, MmaFrag::B, b, regs_b.len())?;
        self.check_sync_fragment(shape, MmaFrag::C, c, regs_c.len())?;
        Ok(Op::MmaSync(Box::new(Mma {
            shape,
            a,
            b,
            c,
            d,
            satfinite,
            regs_d,
            regs_a,
            regs_b,
            regs_c,
        })))
    }

    /// `ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16 d, [a]` and
    /// `stmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16 [a], d`.
    pub(super) fn sel_matrix(&mut self, ins: &Instr, m: &mut Mods, store: bool) -> DResult<Op> {
        if !m.has("sync") || !m.has("m8n8") || !m.has("b16") {
            return Err(unsupported(ins));
        }
        let counts = m.take_all(matrix_count);
        let [count] = counts.as_slice() else {
            return Err(unsupported(ins));
        };
        let trans = m.has("trans");
        let space = m.space();
        let o = self.ops(ins, 2)?;
        let (regs_op, addr_op) = if store {
            (&o[1], &o[0])
        } else {
            (&o[0], &o[1])
        };
        let items: Vec<Operand> = match regs_op {
            Operand::Vec(items) => items.clone(),
            one => vec![one.clone()],
        };
        if items.len() != *count {
            return Err(self.err(format!(
                "`{}` needs {count} registers, found {}",
                ins.full_name(),
                items.len()
            )));
        }
        let regs = items
            .iter()
            .map(|it| {
                if store {
                    self.val(it, Ty::B32)
                } else {
                    self.dst(it)
                }
            })
            .collect::<DResult<Vec<Reg>>>()?;
        let Addr::Reg(base, off) = self.address(addr_op, space)? else {
            return Err(unsupported(ins));
        };
        let mem = Box::new(MatrixMem {
            trans,
            space,
            regs,
            base,
            off,
        });
        Ok(if store {
            Op::StMatrix(mem)
        } else {
            Op::LdMatrix(mem)
        })
    }

    /// `movmatrix.sync.aligned.m8n8.trans.b16 d, a`.
    pub(super) fn sel_movmatrix(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        if !m.has("sync") || !m.has("m8n8") || !m.has("trans") || !m.has("b16") {
            return Err(unsupported(ins));
        }
        let o = self.ops(ins, 2)?;
        Ok(Op::MovMatrix {
            d: self.dst(&o[0])?,
            a: self.val(&o[1], Ty::B32)?,
        })
    }
}
