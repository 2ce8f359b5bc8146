//! Function bodies: declarations, register ranges, operands and addresses, and the per-instruction
//! entry `decode_inst`.

use super::*;

pub(super) fn decode_func(m: &mut ModuleCtx, f: &FuncDecl, id: u32) -> Result<Func, LoadError> {
    let sig = m.sigs[id as usize].clone();
    let Some(body) = &f.body else {
        return Ok(Func {
            name: f.name.clone(),
            code: Vec::new(),
            nregs: 0,
            npreds: 0,
            sink: 0,
            init_regs: Vec::new(),
            init_preds: Vec::new(),
            param_bytes: sig.param_bytes,
            local_bytes: 0,
            callees: Vec::new(),
            shared_refs: Vec::new(),
            declared_regs: 0,
            defined: false,
            is_entry: f.is_entry,
            formals: sig.formals.clone(),
            rets: sig.rets.clone(),
            indirect: false,
            line: f.line,
        });
    };
    let mut top = HashMap::new();
    if f.is_entry {
        for (n, (off, size)) in sig.formal_names.iter().zip(&sig.formals) {
            top.insert(
                n.clone(),
                Name::KParam {
                    off: *off,
                    size: *size,
                },
            );
        }
    } else {
        for (n, (off, size)) in sig.formal_names.iter().zip(&sig.formals) {
            top.insert(
                n.clone(),
                Name::FParam {
                    off: *off,
                    size: *size,
                },
            );
        }
        for (n, (off, size)) in sig.ret_names.iter().zip(&sig.rets) {
            top.insert(
                n.clone(),
                Name::FParam {
                    off: *off,
                    size: *size,
                },
            );
        }
    }
    let mut cx = FnCtx {
        m,
        func_id: id,
        is_entry: f.is_entry,
        scopes: vec![top],
        ranges: vec![HashMap::new()],
        nregs: 0,
        npreds: 0,
        declared_regs: 0,
        code: Vec::new(),
        labels: HashMap::new(),
        fixups: Vec::new(),
        syms: HashMap::new(),
        init_regs: Vec::new(),
        pconst: [NONE; 2],
        init_preds: Vec::new(),
        param_bytes: if f.is_entry { 0 } else { sig.param_bytes },
        local_bytes: 0,
        callees: Vec::new(),
        shared_refs: Vec::new(),
        sink: 0,
        line: f.line,
        guard: (NONE, false),
        prototypes: HashMap::new(),
        indirect: false,
    };
    cx.sink = cx.new_reg()?;
    // Labels are function-wide: collect them first so that forward branches resolve.
    for s in body {
        if let Stmt::Label { line, name } = s
            && cx.labels.insert(name.clone(), u32::MAX).is_some()
        {
            return Err(LoadError::invalid(
                *line,
                format!("label `{name}` defined twice"),
            ));
        }
    }
    for s in body {
        match s {
            Stmt::Open => {
                cx.scopes.push(HashMap::new());
                cx.ranges.push(HashMap::new());
            }
            Stmt::Close => {
                if cx.scopes.len() > 1 {
                    cx.scopes.pop();
                    cx.ranges.pop();
                }
            }
            Stmt::Label { name, .. } => {
                let pc = cx.code.len() as u32;
                cx.labels.insert(name.clone(), pc);
            }
            Stmt::Reg { line, ty, names } => {
                cx.line = *line;
                let t = Ty::parse(ty).ok_or_else(|| {
                    LoadError::invalid(*line, format!("unknown register type `.{ty}`"))
                })?;
                for n in names {
                    match n {
                        RegName::One(name) => cx.declare_reg(name, t)?,
                        RegName::Range(prefix, count) => cx.declare_range(prefix, *count, t)?,
                    }
                }
            }
            Stmt::Var(v) => cx.declare_var(v)?,
            Stmt::Prototype {
                line,
                name,
                rets,
                params,
            } => {
                cx.line = *line;
                let (rets, _, after) = layout_params(rets, 0)?;
                let (formals, _, _) = layout_params(params, after)?;
                cx.prototypes.insert(name.clone(), (rets, formals));
            }
            Stmt::Inst(ins) => {
                cx.line = ins.line;
                cx.decode_inst(ins)?;
            }
        }
    }
    // Falling off the end of a function returns.
    let line = cx.code.last().map_or(f.line as u32, |i| i.line);
    let op = if f.is_entry { Op::Exit } else { Op::Ret };
    cx.code.push(Inst {
        op,
        guard: NONE,
        guard_neg: false,
        line,
    });
    for (at, label, line) in std::mem::take(&mut cx.fixups) {
        let target = *cx
            .labels
            .get(&label)
            .filter(|&&t| t != u32::MAX)
            .ok_or_else(|| LoadError::invalid(line, format!("undefined label `{label}`")))?;
        if let Op::Bra { target: t, .. } = &mut cx.code[at].op {
            *t = target;
        }
    }
    cx.callees.sort_unstable();
    cx.callees.dedup();
    cx.shared_refs.sort_unstable();
    cx.shared_refs.dedup();
    Ok(Func {
        name: f.name.clone(),
        code: cx.code,
        nregs: cx.nregs,
        npreds: cx.npreds,
        sink: cx.sink,
        init_regs: cx.init_regs,
        init_preds: cx.init_preds,
        param_bytes: cx.param_bytes,
        local_bytes: cx.local_bytes,
        callees: cx.callees,
        shared_refs: cx.shared_refs,
        declared_regs: cx.declared_regs,
        defined: true,
        is_entry: f.is_entry,
        formals: sig.formals.clone(),
        rets: sig.rets.clone(),
        indirect: cx.indirect,
        line: f.line,
    })
}

/// The register `name` names in a scope's `ranges`: `name` is a declared
/// prefix followed by a decimal index without leading zeros, below the
/// range's count. Every split of `name`'s trailing digits is tried (a prefix
/// may itself end in digits: `%r1<10>` declares `%r10` … `%r19`), at most
/// ten map lookups.
pub(super) fn range_lookup(ranges: &HashMap<String, RegRange>, name: &str) -> Option<Name> {
    if ranges.is_empty() {
        return None;
    }
    let digits = name.bytes().rev().take_while(u8::is_ascii_digit).count();
    for d in 1..=digits.min(10) {
        let (prefix, index) = name.split_at(name.len() - d);
        if index.len() > 1 && index.starts_with('0') {
            continue;
        }
        let Some(r) = ranges.get(prefix) else {
            continue;
        };
        let Ok(index) = index.parse::<u32>() else {
            continue;
        };
        if index < r.count {
            return Some(if r.pred {
                Name::Pred(r.base + index)
            } else {
                Name::Reg(r.base + index)
            });
        }
    }
    None
}

impl FnCtx<'_> {
    pub(super) fn err(&self, msg: impl Into<String>) -> LoadError {
        LoadError::invalid(self.line, msg)
    }

    pub(super) fn new_reg(&mut self) -> DResult<Reg> {
        if u64::from(self.nregs) >= MAX_REGS {
            return Err(LoadError::unsupported(self.line, "too many registers"));
        }
        self.nregs += 1;
        Ok(self.nregs - 1)
    }

    pub(super) fn new_pred(&mut self) -> DResult<Pred> {
        if u64::from(self.npreds) >= MAX_REGS {
            return Err(LoadError::unsupported(
                self.line,
                "too many predicate registers",
            ));
        }
        self.npreds += 1;
        Ok(self.npreds - 1)
    }

    pub(super) fn declare_reg(&mut self, name: &str, t: Ty) -> DResult<()> {
        let n = if t == Ty::Pred {
            Name::Pred(self.new_pred()?)
        } else {
            if t == Ty::B128 {
                return Err(LoadError::unsupported(
                    self.line,
                    ".b128 registers are not supported",
                ));
            }
            self.declared_regs =
                self.declared_regs
                    .saturating_add(if t.bytes() == 8 { 2 } else { 1 });
            Name::Reg(self.new_reg()?)
        };
        if let Some(scope) = self.scopes.last_mut() {
            scope.insert(name.to_string(), n);
        }
        Ok(())
    }

    pub(super) fn declare_var(&mut self, v: &VarDecl) -> DResult<()> {
        self.line = v.line;
        match v.space {
            VarSpace::Param => {
                let size = var_size(v)?.ok_or_else(|| self.err("parameter without a size"))?;
                let align = var_align(v)?;
                let off = align_up(u64::from(self.param_bytes), align);
                if off + size > 1 << 20 {
                    return Err(self.err("too many call parameters"));
                }
                self.param_bytes = (off + size) as u32;
                self.bind(
                    &v.name,
                    Name::FParam {
                        off: off as u32,
                        size: size as u32,
                    },
                );
            }
            VarSpace::Local => {
                let size = var_size(v)?.ok_or_else(|| self.err("local variable without a size"))?;
                let off = align_up(self.local_bytes, var_align(v)?);
                self.local_bytes = off + size;
                if self.local_bytes > MAX_LOCAL_BYTES {
                    return Err(LoadError::unsupported(v.line, "too much local memory"));
                }
                self.bind(&v.name, Name::Local { off: off as u32 });
            }
            VarSpace::Shared => {
                let id = new_shared(self.m, v)?;
                self.bind(&v.name, Name::Shared(id));
            }
            _ if v.ty == "samplerref" || ReferenceKind::parse(&v.ty).is_some() => {
                return Err(LoadError::invalid(
                    v.line,
                    format!("reference `{}` declared inside a function", v.name),
                ));
            }
            VarSpace::Global | VarSpace::Const => {
                // Function-scope statics are module variables with function-local names.
                let (size, init, relocs) = global_image(v)?;
                let idx = self.m.globals.len() as u32;
                queue_relocs(self.m, idx, relocs, v.line);
                self.m.globals.push(GlobalVar {
                    name: v.name.clone(),
                    space: if v.space == VarSpace::Global {
                        GlobalSpace::Global
                    } else {
                        GlobalSpace::Const
                    },
                    size,
                    align: var_align(v)? as usize,
                    init,
                    managed: v.managed,
                    reference: None,
                    relocs: Vec::new(),
                });
                self.bind(&v.name, Name::Global(idx));
            }
            VarSpace::Reg => return Err(self.err("unexpected .reg variable")),
        }
        Ok(())
    }

    pub(super) fn bind(&mut self, name: &str, n: Name) {
        if let Some(scope) = self.scopes.last_mut() {
            scope.insert(name.to_string(), n);
        }
    }

    pub(super) fn lookup(&self, name: &str) -> Option<Name> {
        for (s, ranges) in self.scopes.iter().zip(&self.ranges).rev() {
            if let Some(n) = s.get(name) {
                return Some(*n);
            }
            if let Some(n) = range_lookup(ranges, name) {
                return Some(n);
            }
        }
        self.m.names.get(name).copied()
    }

    /// `.reg .T prefix<count>`: `count` consecutive registers, named lazily.
    pub(super) fn declare_range(&mut self, prefix: &str, count: u32, t: Ty) -> DResult<()> {
        if t == Ty::B128 {
            return Err(LoadError::unsupported(
                self.line,
                ".b128 registers are not supported",
            ));
        }
        let pred = t == Ty::Pred;
        let used = if pred { self.npreds } else { self.nregs };
        if u64::from(used) + u64::from(count) > MAX_REGS {
            return Err(LoadError::unsupported(self.line, "too many registers"));
        }
        if pred {
            self.npreds += count;
        } else {
            self.nregs += count;
            let per = if t.bytes() == 8 { 2 } else { 1 };
            self.declared_regs = self.declared_regs.saturating_add(count.saturating_mul(per));
        }
        if let Some(ranges) = self.ranges.last_mut() {
            ranges.insert(
                prefix.to_string(),
                RegRange {
                    base: used,
                    count,
                    pred,
                },
            );
        }
        Ok(())
    }

    pub(super) fn sym_reg(&mut self, init: SymInit) -> DResult<Reg> {
        if let Some(&r) = self.syms.get(&init) {
            return Ok(r);
        }
        let r = self.new_reg()?;
        self.syms.insert(init, r);
        self.init_regs.push((r, init));
        Ok(r)
    }

    pub(super) fn imm(&mut self, bits: u64) -> DResult<Reg> {
        self.sym_reg(SymInit::Imm(bits))
    }

    pub(super) fn const_pred(&mut self, v: bool) -> DResult<Pred> {
        let i = usize::from(v);
        if self.pconst[i] == NONE {
            let p = self.new_pred()?;
            self.pconst[i] = p;
            self.init_preds.push((p, v));
        }
        Ok(self.pconst[i])
    }

    /// Address (as a value) of a named variable plus `off`.
    pub(super) fn addr_of(&mut self, n: Name, off: i64, generic: bool, name: &str) -> DResult<Reg> {
        let init = match n {
            Name::Global(idx) => SymInit::Global { idx, off },
            Name::Shared(var) => {
                self.shared_refs.push(var);
                SymInit::Shared { var, off, generic }
            }
            Name::Local { off: o } => SymInit::Local {
                off: i64::from(o) + off,
                generic,
            },
            Name::KParam { off: o, .. } => SymInit::KParam {
                off: i64::from(o) + off,
            },
            Name::FParam { .. } => {
                return Err(LoadError::unsupported(
                    self.line,
                    format!("taking the address of function parameter `{name}`"),
                ));
            }
            // A kernel's or function's address: a value no memory access reaches, which
            // dynamic parallelism's launches name the kernel by (calls through it are refused).
            Name::Func(f) => {
                if off != 0 {
                    return Err(LoadError::unsupported(
                        self.line,
                        format!("an offset from function `{name}`'s address"),
                    ));
                }
                self.m.address_taken.push(f);
                return self.imm(FUNCTION_WINDOW + u64::from(f));
            }
            Name::Reg(_) | Name::Pred(_) => {
                return Err(self.err(format!("`{name}` is a register, not a variable")));
            }
        };
        self.sym_reg(init)
    }

    /// A value operand of type `ty` as a register.
    pub(super) fn val(&mut self, op: &Operand, ty: Ty) -> DResult<Reg> {
        match op {
            Operand::Name(n) => match self.lookup(n) {
                Some(Name::Reg(r)) => Ok(r),
                Some(Name::Pred(_)) => Err(self.err(format!("predicate `{n}` used as a value"))),
                Some(other) => self.addr_of(other, 0, false, n),
                None => {
                    if let Some(s) = special_reg(n) {
                        // A special register used directly as a source: read it into a temporary.
                        let t = self.new_reg()?;
                        self.push(Op::Special { d: t, s }, NONE, false);
                        Ok(t)
                    } else {
                        Err(self.err(format!("undefined name `{n}`")))
                    }
                }
            },
            Operand::SymOff(n, off) => {
                let k = self
                    .lookup(n)
                    .ok_or_else(|| self.err(format!("undefined name `{n}`")))?;
                self.addr_of(k, *off, false, n)
            }
            Operand::Int(v) => {
                let b = lit_bits(&Lit::Int(*v), ty, self.line)?;
                self.imm(b)
            }
            Operand::F32(v) => {
                let b = lit_bits(&Lit::F32(*v), ty, self.line)?;
                self.imm(b)
            }
            Operand::F64(v) => {
                let b = lit_bits(&Lit::F64(*v), ty, self.line)?;
                self.imm(b)
            }
            Operand::Sink => Ok(self.sink),
            _ => Err(self.err("expected a register or immediate operand")),
        }
    }

    /// A destination register.
    pub(super) fn dst(&mut self, op: &Operand) -> DResult<Reg> {
        match op {
            Operand::Name(n) => match self.lookup(n) {
                Some(Name::Reg(r)) => Ok(r),
                _ => Err(self.err(format!("`{n}` is not a register"))),
            },
            Operand::Sink => Ok(self.sink),
            _ => Err(self.err("expected a destination register")),
        }
    }

    /// A predicate source, possibly negated (`!p`) or constant.
    pub(super) fn pred_src(&mut self, op: &Operand) -> DResult<(Pred, bool)> {
        match op {
            Operand::Name(n) => match self.lookup(n) {
                Some(Name::Pred(p)) => Ok((p, false)),
                _ => Err(self.err(format!("`{n}` is not a predicate"))),
            },
            Operand::NotName(n) => match self.lookup(n) {
                Some(Name::Pred(p)) => Ok((p, true)),
                _ => Err(self.err(format!("`{n}` is not a predicate"))),
            },
            Operand::Int(v) => Ok((self.const_pred(*v != 0)?, false)),
            _ => Err(self.err("expected a predicate operand")),
        }
    }

    pub(super) fn pred_dst(&mut self, op: &Operand) -> DResult<Pred> {
        match op {
            Operand::Name(n) => match self.lookup(n) {
                Some(Name::Pred(p)) => Ok(p),
                _ => Err(self.err(format!("`{n}` is not a predicate"))),
            },
            Operand::Sink => self.new_pred(),
            _ => Err(self.err("expected a predicate destination")),
        }
    }

    pub(super) fn push(&mut self, op: Op, guard: Pred, guard_neg: bool) {
        self.code.push(Inst {
            op,
            guard,
            guard_neg,
            line: self.line.min(u32::MAX as usize) as u32,
        });
    }

    pub(super) fn ops<'a>(&self, ins: &'a Instr, n: usize) -> DResult<&'a [Operand]> {
        if ins.operands.len() != n {
            return Err(self.err(format!(
                "`{}` expects {n} operands, found {}",
                ins.full_name(),
                ins.operands.len()
            )));
        }
        Ok(&ins.operands)
    }

    pub(super) fn one_type(&self, ins: &Instr, m: &mut Mods) -> DResult<Ty> {
        let t = m.types();
        if t.len() != 1 {
            return Err(self.err(format!("`{}` needs exactly one type", ins.full_name())));
        }
        Ok(t[0])
    }

    /// Resolves `[base+off]` for a memory instruction in `space`.
    pub(super) fn address(&mut self, op: &Operand, space: Space) -> DResult<Addr> {
        let (base, off) = match op {
            Operand::Addr(b, o) => (b.clone(), *o),
            // `ld.param.u32 %r, param0;` is not valid, but `[...]` may be omitted in some asm.
            _ => return Err(self.err("expected an address operand `[...]`")),
        };
        let Some(name) = base else {
            return Ok(Addr::Reg(self.imm(off as u64)?, 0));
        };
        match self.lookup(&name) {
            Some(Name::Reg(r)) => Ok(Addr::Reg(r, off)),
            Some(Name::KParam { off: o, size }) if space == Space::Param => {
                let at = i64::from(o) + off;
                if at < 0 || at >= i64::from(o) + i64::from(size) {
                    return Err(self.err(format!("offset {off} is outside parameter `{name}`")));
                }
                Ok(Addr::KParam(at as u32))
            }
            Some(Name::FParam { off: o, size }) if space == Space::Param => {
                let at = i64::from(o) + off;
                if at < 0 || at >= i64::from(o) + i64::from(size) {
                    return Err(self.err(format!("offset {off} is outside parameter `{name}`")));
                }
                Ok(Addr::FParam(at as u32))
            }
            Some(
                n @ (Name::Global(_) | Name::Shared(_) | Name::Local { .. } | Name::KParam { .. }),
            ) => {
                let generic = space == Space::Generic;
                let r = self.addr_of(n, 0, generic, &name)?;
                Ok(Addr::Reg(r, off))
            }
            Some(_) => Err(self.err(format!("`{name}` cannot be used as an address"))),
            None => Err(self.err(format!("undefined name `{name}`"))),
        }
    }

    /// Destination list of a (vector) load.
    pub(super) fn dst_list(&mut self, op: &Operand) -> DResult<(u8, [Reg; 4])> {
        let mut out = [self.sink; 4];
        match op {
            Operand::Vec(items) => {
                if items.len() > 4 || items.is_empty() {
                    return Err(LoadError::unsupported(
                        self.line,
                        "vectors of more than 4 elements are not supported",
                    ));
                }
                for (i, it) in items.iter().enumerate() {
                    out[i] = self.dst(it)?;
                }
                Ok((items.len() as u8, out))
            }
            other => {
                out[0] = self.dst(other)?;
                Ok((1, out))
            }
        }
    }

    pub(super) fn src_list(&mut self, op: &Operand, ty: Ty) -> DResult<(u8, [Reg; 4])> {
        let mut out = [self.sink; 4];
        match op {
            Operand::Vec(items) => {
                if items.len() > 4 || items.is_empty() {
                    return Err(LoadError::unsupported(
                        self.line,
                        "vectors of more than 4 elements are not supported",
                    ));
                }
                for (i, it) in items.iter().enumerate() {
                    out[i] = self.val(it, ty)?;
                }
                Ok((items.len() as u8, out))
            }
            other => {
                out[0] = self.val(other, ty)?;
                Ok((1, out))
            }
        }
    }

    pub(super) fn decode_inst(&mut self, ins: &Instr) -> DResult<()> {
        let (guard, guard_neg) = match &ins.guard {
            None => (NONE, false),
            Some((neg, name)) => match self.lookup(name) {
                Some(Name::Pred(p)) => (p, *neg),
                _ => return Err(self.err(format!("guard `{name}` is not a predicate"))),
            },
        };
        // Helper instructions `select` pushes ahead of the selected one share its guard.
        self.guard = (guard, guard_neg);
        let op = self.select(ins)?;
        if let Some(op) = op {
            if let Op::Bra { .. } = op {
                let label = match ins.operands.first() {
                    Some(Operand::Name(l)) => l.clone(),
                    _ => return Err(self.err("bra needs a label")),
                };
                if !self.labels.contains_key(&label) {
                    return Err(self.err(format!("undefined label `{label}`")));
                }
                self.fixups.push((self.code.len(), label, ins.line));
            }
            self.push(op, guard, guard_neg);
        }
        Ok(())
    }
}
