//! Calls, built-in calls and barriers.

use super::*;

impl FnCtx<'_> {
    pub(super) fn sel_call(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        m.has("uni");
        let o = &ins.operands;
        let mut i = 0;
        let mut ret_args: &[Operand] = &[];
        if let Some(Operand::List(l)) = o.first() {
            ret_args = l;
            i = 1;
        }
        let fname = match o.get(i) {
            Some(Operand::Name(n)) => n.clone(),
            _ => return Err(self.err("call needs a function name")),
        };
        let fid = match self.lookup(&fname) {
            Some(Name::Func(id)) => id,
            Some(Name::Reg(r)) => return self.indirect_call(ins, r, ret_args, &o[i + 1..]),
            _ => return Err(self.err(format!("`{fname}` is not a function"))),
        };
        i += 1;
        let mut args: &[Operand] = &[];
        if let Some(Operand::List(l)) = o.get(i) {
            args = l;
            i += 1;
        }
        if i != o.len() {
            return Err(LoadError::unsupported(
                ins.line,
                "indirect calls are not supported",
            ));
        }
        let sig = self.m.sigs[fid as usize].clone();
        if sig.is_entry {
            return Err(self.err("cannot call a kernel"));
        }
        // A caller may expect a result from a function that returns none, as numba's calls of
        // C-ABI `void` functions do (they declare the function `.extern` returning `.b64`):
        // NVIDIA's linker joins such units by name, and the result is undefined. Here it is
        // left as the caller's `.param` holds it.
        let void_callee = sig.rets.is_empty() && !self.m.builtins.contains_key(&fid);
        if args.len() != sig.formals.len() || (ret_args.len() != sig.rets.len() && !void_callee) {
            return Err(self.err(format!(
                "call to `{fname}` has the wrong number of arguments"
            )));
        }
        if let Some(&kind) = self.m.builtins.get(&fid) {
            return self.builtin_call(ins, kind, args, ret_args, &sig);
        }
        let mut info = CallInfo {
            func: fid,
            args: Vec::new(),
            rets: Vec::new(),
        };
        for (a, (off, size)) in args.iter().zip(&sig.formals) {
            match a {
                Operand::Name(n) => match self.lookup(n) {
                    Some(Name::FParam { off: src, size: s }) => {
                        info.args.push((src, *off, (*size).min(s)))
                    }
                    _ => {
                        return Err(LoadError::unsupported(
                            ins.line,
                            "call arguments must be .param variables",
                        ));
                    }
                },
                _ => {
                    return Err(LoadError::unsupported(
                        ins.line,
                        "call arguments must be .param variables",
                    ));
                }
            }
        }
        for (r, (off, size)) in ret_args.iter().zip(&sig.rets) {
            match r {
                Operand::Name(n) => match self.lookup(n) {
                    Some(Name::FParam { off: dst, size: s }) => {
                        info.rets.push((*off, dst, (*size).min(s)))
                    }
                    _ => {
                        return Err(LoadError::unsupported(
                            ins.line,
                            "call results must be .param variables",
                        ));
                    }
                },
                _ => {
                    return Err(LoadError::unsupported(
                        ins.line,
                        "call results must be .param variables",
                    ));
                }
            }
        }
        self.callees.push(fid);
        Ok(Op::Call(Box::new(info)))
    }

    /// `call (rets), %r, (args), prototype;`: a call through the address in `target`, with the
    /// signature of the prototype the last operand names.
    fn indirect_call(
        &mut self,
        ins: &Instr,
        target: Reg,
        ret_args: &[Operand],
        rest: &[Operand],
    ) -> DResult<Op> {
        let (args, proto) = match rest {
            [Operand::List(a), Operand::Name(p)] => (&a[..], p),
            [Operand::Name(p)] => (&[][..], p),
            _ => {
                return Err(LoadError::unsupported(
                    ins.line,
                    "an indirect call needs a .callprototype (.calltargets lists are not supported)",
                ));
            }
        };
        let Some((ret_layout, formals)) = self.prototypes.get(proto).cloned() else {
            return Err(self.err(format!(
                "`{proto}` is not a call prototype of this function"
            )));
        };
        if args.len() != formals.len() || ret_args.len() != ret_layout.len() {
            return Err(self.err(format!(
                "an indirect call through `{proto}` has the wrong number of arguments"
            )));
        }
        let param = |cx: &Self, o: &Operand| match o {
            Operand::Name(n) => match cx.lookup(n) {
                Some(Name::FParam { off, size }) => Ok((off, size)),
                _ => Err(LoadError::unsupported(
                    ins.line,
                    "call arguments must be .param variables",
                )),
            },
            _ => Err(LoadError::unsupported(
                ins.line,
                "call arguments must be .param variables",
            )),
        };
        let mut call = IndirectCall {
            target,
            args: Vec::with_capacity(args.len()),
            rets: Vec::with_capacity(ret_args.len()),
            formals: formals.clone(),
            ret_layout: ret_layout.clone(),
        };
        for (a, &(off, size)) in args.iter().zip(&formals) {
            let (src, s) = param(self, a)?;
            call.args.push((src, off, size.min(s)));
        }
        for (r, &(off, size)) in ret_args.iter().zip(&ret_layout) {
            let (dst, s) = param(self, r)?;
            call.rets.push((off, dst, size.min(s)));
        }
        self.indirect = true;
        Ok(Op::CallIndirect(Box::new(call)))
    }

    /// A call of a [`Builtin`] (`vprintf`, `__assertfail`, `malloc`, …): the
    /// argument and result `.param` variables of the caller, read and written by the
    /// interpreter.
    pub(super) fn builtin_call(
        &mut self,
        ins: &Instr,
        kind: Builtin,
        args: &[Operand],
        rets: &[Operand],
        sig: &Sig,
    ) -> DResult<Op> {
        let param = |o: &Operand, size: u32| match o {
            Operand::Name(n) => match self.lookup(n) {
                Some(Name::FParam { off, size: s }) if s >= size => Ok((off, size)),
                _ => Err(LoadError::unsupported(
                    ins.line,
                    format!("call arguments of `{kind:?}` must be .param variables of their size"),
                )),
            },
            _ => Err(LoadError::unsupported(
                ins.line,
                "call arguments must be .param variables",
            )),
        };
        let mut call = BuiltinCall {
            kind,
            args: Vec::with_capacity(args.len()),
            ret: None,
        };
        for (a, &(_, size)) in args.iter().zip(&sig.formals) {
            call.args.push(param(a, size)?);
        }
        if let (Some(r), Some(&(_, size))) = (rets.first(), sig.rets.first()) {
            call.ret = Some(param(r, size.min(8))?);
        }
        Ok(Op::CallBuiltin(Box::new(call)))
    }

    pub(super) fn sel_bar(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        if m.has("warp") {
            // bar.warp.sync: warps execute in lockstep here; nothing to wait for.
            m.has("sync");
            m.finish(ins)?;
            return Ok(Op::Nop);
        }
        if m.has("cluster") {
            return Err(unsupported(ins));
        }
        let k = if m.has("red") {
            match m.any(&["popc", "and", "or"]) {
                Some("popc") => BarKind::RedPopc,
                Some("and") => BarKind::RedAnd,
                Some("or") => BarKind::RedOr,
                _ => return Err(unsupported(ins)),
            }
        } else if m.has("arrive") {
            BarKind::Arrive
        } else {
            m.has("sync");
            BarKind::Sync
        };
        m.types();
        let o = &ins.operands;
        let (d, rest): (u32, &[Operand]) = match k {
            BarKind::RedPopc => (
                self.dst(
                    o.first()
                        .ok_or_else(|| self.err("bar.red needs operands"))?,
                )?,
                &o[1..],
            ),
            BarKind::RedAnd | BarKind::RedOr => (
                self.pred_dst(
                    o.first()
                        .ok_or_else(|| self.err("bar.red needs operands"))?,
                )?,
                &o[1..],
            ),
            _ => (NONE, &o[..]),
        };
        let is_red = matches!(k, BarKind::RedPopc | BarKind::RedAnd | BarKind::RedOr);
        let (vals, pred) = if is_red {
            match rest.split_last() {
                Some((p, v)) => (v, Some(p)),
                None => return Err(self.err("bar.red needs a predicate")),
            }
        } else {
            (rest, None)
        };
        let id = match vals.first() {
            Some(v) => self.val(v, Ty::U32)?,
            None if ins.opcode == "barrier" || k == BarKind::Sync => self.imm(0)?,
            None => return Err(self.err("barrier needs an id")),
        };
        let count = match vals.get(1) {
            Some(v) => self.val(v, Ty::U32)?,
            None => NONE,
        };
        if vals.len() > 2 {
            return Err(self.err("too many barrier operands"));
        }
        if k == BarKind::Arrive && count == NONE {
            return Err(self.err("bar.arrive needs a thread count"));
        }
        let (p, pneg) = match pred {
            Some(p) => self.pred_src(p)?,
            None => (NONE, false),
        };
        Ok(Op::Bar {
            k,
            id,
            count,
            p,
            pneg,
            d,
        })
    }
}
