//! Syntax tree to pre-decoded program: name resolution, operand typing, instruction selection,
//! memory layouts. Everything that can be decided before a launch is decided here.

use std::collections::HashMap;

use crate::cfg;
use crate::error::LoadError;
use crate::float;
use crate::ir::*;
use crate::parser::{
    Ast, FuncDecl, Init, Instr, Item, Lit, Operand, RegName, Stmt, VarDecl, VarSpace,
};
use crate::{GlobalSpace, GlobalVar, KernelInfo, ParamInfo};

/// Threads per block CUDA allows.
pub(crate) const MAX_THREADS_PER_BLOCK: u32 = 1024;
/// Per-thread stack reserved for calls when the call graph is recursive (CUDA's default
/// `cudaLimitStackSize`).
pub(crate) const RECURSIVE_STACK_BYTES: u64 = 1024;
/// Deepest call nesting before the kernel faults (stack overflow).
pub(crate) const MAX_CALL_DEPTH: usize = 64;
/// Largest per-thread local memory a kernel may declare.
const MAX_LOCAL_BYTES: u64 = 512 * 1024;
/// Largest module variable (the lead allocates it in device memory).
const MAX_GLOBAL_VAR_BYTES: u64 = 1 << 30;
/// Largest static shared-memory declaration.
const MAX_SHARED_DECL_BYTES: u64 = 1 << 20;
/// Registers per function (keeps hostile PTX from asking for huge register files).
const MAX_REGS: u64 = 1 << 20;

/// How a hidden register is initialised when a frame is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum SymInit {
    Imm(u64),
    /// Device address of module variable `idx` plus `off`.
    Global {
        idx: u32,
        off: i64,
    },
    /// Shared-space offset of shared variable `var` in the running kernel's layout plus `off`
    /// (plus the shared window base when `generic`).
    Shared {
        var: u32,
        off: i64,
        generic: bool,
    },
    /// Local-space address: the frame's local base plus `off` (plus the local window when `generic`).
    Local {
        off: i64,
        generic: bool,
    },
    /// Generic address of a kernel parameter byte.
    KParam {
        off: i64,
    },
}

/// A decoded function or kernel.
#[derive(Debug)]
pub(crate) struct Func {
    pub name: String,
    pub code: Vec<Inst>,
    pub nregs: u32,
    pub npreds: u32,
    /// Hidden registers to initialise at frame setup.
    pub init_regs: Vec<(Reg, SymInit)>,
    /// Constant predicate registers.
    pub init_preds: Vec<(Pred, bool)>,
    /// Bytes of the per-lane `.param` area (formals, return values, call-site arguments).
    pub param_bytes: u32,
    /// This function's own `.local` bytes per thread.
    pub local_bytes: u64,
    pub callees: Vec<u32>,
    /// Shared variables this function references directly.
    pub shared_refs: Vec<u32>,
    /// Registers declared in the PTX (for cuFuncGetAttribute).
    pub declared_regs: u32,
    pub defined: bool,
    pub line: usize,
}

/// A `.shared` variable of the module or of a function.
#[derive(Debug, Clone)]
pub(crate) struct SharedVar {
    pub size: u64,
    pub align: u64,
    pub is_extern: bool,
}

/// Per-kernel memory layout.
#[derive(Debug, Clone)]
pub(crate) struct KernelLayout {
    pub func: u32,
    /// Shared offset of each shared variable (by id); `u64::MAX` if the kernel does not use it.
    pub shared_off: Vec<u64>,
    /// Offset where dynamic shared memory starts.
    pub dyn_shared_base: u64,
    /// Local bytes per thread including the deepest call chain.
    pub local_per_thread: u64,
}

/// The decoded module.
#[derive(Debug)]
pub(crate) struct Program {
    pub funcs: Vec<Func>,
    pub globals: Vec<GlobalVar>,
    pub kernels: Vec<KernelInfo>,
    pub layouts: Vec<KernelLayout>,
}

/// What a name refers to inside a function.
#[derive(Debug, Clone, Copy)]
enum Name {
    Reg(Reg),
    Pred(Pred),
    /// Frame param-area variable.
    FParam {
        off: u32,
        size: u32,
    },
    /// Kernel formal parameter (offset in the launch parameter buffer).
    KParam {
        off: u32,
        size: u32,
    },
    Local {
        off: u32,
    },
    Shared(u32),
    Global(u32),
    Func(u32),
}

struct ModuleCtx {
    names: HashMap<String, Name>,
    shared_vars: Vec<SharedVar>,
    globals: Vec<GlobalVar>,
    sigs: Vec<Sig>,
    /// `.extern` functions the interpreter runs itself, by function id.
    builtins: HashMap<u32, Builtin>,
}

/// A function's parameter interface as callers see it.
#[derive(Debug, Clone, Default)]
struct Sig {
    rets: Vec<(u32, u32)>,
    formals: Vec<(u32, u32)>,
    formal_names: Vec<String>,
    ret_names: Vec<String>,
    param_bytes: u32,
    is_entry: bool,
    kparams: Vec<ParamInfo>,
}

fn align_up(v: u64, a: u64) -> u64 {
    if a <= 1 {
        v
    } else {
        v.div_ceil(a).saturating_mul(a)
    }
}

fn var_elem(v: &VarDecl) -> Result<(Ty, u64), LoadError> {
    let ty = Ty::parse(&v.ty)
        .ok_or_else(|| LoadError::invalid(v.line, format!("unknown type `.{}`", v.ty)))?;
    Ok((ty, ty.bytes() as u64 * u64::from(v.vec)))
}

fn var_size(v: &VarDecl) -> Result<Option<u64>, LoadError> {
    let (_, elem) = var_elem(v)?;
    let mut n = elem;
    for d in &v.dims {
        match d {
            Some(k) => {
                n = n
                    .checked_mul(*k)
                    .ok_or_else(|| LoadError::invalid(v.line, "variable too large"))?
            }
            None => return Ok(None),
        }
    }
    Ok(Some(n))
}

fn var_align(v: &VarDecl) -> Result<u64, LoadError> {
    let (_, elem) = var_elem(v)?;
    let a = v.align.unwrap_or(elem.max(1));
    if !a.is_power_of_two() || a > 4096 {
        return Err(LoadError::invalid(v.line, format!("bad alignment {a}")));
    }
    Ok(a.max(1))
}

/// Flattens an initializer into element literals.
fn flatten(init: &Init, out: &mut Vec<Lit>, line: usize) -> Result<(), LoadError> {
    match init {
        Init::Scalar(l) => out.push(l.clone()),
        Init::List(items) => {
            for i in items {
                flatten(i, out, line)?;
                if out.len() > (1 << 26) {
                    return Err(LoadError::invalid(line, "initializer too large"));
                }
            }
        }
    }
    Ok(())
}

fn lit_bits(l: &Lit, ty: Ty, line: usize) -> Result<u64, LoadError> {
    Ok(match (l, ty) {
        (Lit::Int(v), Ty::F32) => u64::from((*v as i64 as f32).to_bits()),
        (Lit::Int(v), Ty::F64) => (*v as i64 as f64).to_bits(),
        (Lit::Int(v), Ty::F16) => u64::from(float::f32_to_f16(*v as i64 as f32, Rnd::Rn)),
        (Lit::Int(v), _) => *v,
        (Lit::F32(b), Ty::F64) => (f64::from(f32::from_bits(*b))).to_bits(),
        (Lit::F32(b), Ty::F16) => u64::from(float::f32_to_f16(f32::from_bits(*b), Rnd::Rn)),
        (Lit::F32(b), _) => u64::from(*b),
        (Lit::F64(b), Ty::F32) => u64::from((f64::from_bits(*b) as f32).to_bits()),
        (Lit::F64(b), Ty::F16) => u64::from(float::f32_to_f16(f64::from_bits(*b) as f32, Rnd::Rn)),
        (Lit::F64(b), _) => *b,
        (Lit::Sym(name, off), _) => {
            return Err(LoadError::unsupported(
                line,
                format!("address-valued variable initializers (`{name}+{off}`) are not supported"),
            ));
        }
    })
}

/// Builds the initial bytes of a module variable.
fn global_image(v: &VarDecl) -> Result<(usize, Vec<u8>), LoadError> {
    let (ty, elem) = var_elem(v)?;
    let mut lits = Vec::new();
    if let Some(init) = &v.init {
        flatten(init, &mut lits, v.line)?;
    }
    let ebytes = ty.bytes() as u64;
    let size = match var_size(v)? {
        Some(s) => s,
        None => ebytes.saturating_mul(lits.len() as u64).max(elem),
    };
    if size > MAX_GLOBAL_VAR_BYTES {
        return Err(LoadError::unsupported(
            v.line,
            format!("variable `{}` is too large", v.name),
        ));
    }
    if (lits.len() as u64).saturating_mul(ebytes) > size {
        return Err(LoadError::invalid(
            v.line,
            format!("too many initializers for `{}`", v.name),
        ));
    }
    let mut init = Vec::new();
    if !lits.is_empty() {
        init = vec![0u8; size as usize];
        for (i, l) in lits.iter().enumerate() {
            let bits = lit_bits(l, ty, v.line)?;
            let at = i * ebytes as usize;
            init[at..at + ebytes as usize].copy_from_slice(&bits.to_le_bytes()[..ebytes as usize]);
        }
    }
    Ok((size as usize, init))
}

/// (offset, size) per parameter, the driver-facing descriptions, and the total size.
type ParamLayout = (Vec<(u32, u32)>, Vec<ParamInfo>, u32);

/// Lays out a parameter list.
fn layout_params(list: &[VarDecl], start: u32) -> Result<ParamLayout, LoadError> {
    let mut off = u64::from(start);
    let mut out = Vec::new();
    let mut infos = Vec::new();
    for p in list {
        if p.space != VarSpace::Param {
            return Err(LoadError::unsupported(
                p.line,
                "only .param parameters are supported",
            ));
        }
        let size =
            var_size(p)?.ok_or_else(|| LoadError::invalid(p.line, "parameter without a size"))?;
        let align = var_align(p)?;
        off = align_up(off, align);
        if off + size > 64 * 1024 {
            return Err(LoadError::invalid(p.line, "parameters exceed 64 KiB"));
        }
        out.push((off as u32, size as u32));
        infos.push(ParamInfo {
            offset: off as usize,
            size: size as usize,
            align: align as usize,
        });
        off += size;
    }
    Ok((out, infos, off as u32))
}

pub(crate) fn decode(ast: &Ast) -> Result<Program, LoadError> {
    if ast.address_size != 64 {
        return Err(LoadError::unsupported(
            0,
            format!(
                ".address_size {} is not supported (only 64)",
                ast.address_size
            ),
        ));
    }
    if ast.version.0 == 0 {
        return Err(LoadError::invalid(1, "missing .version directive"));
    }
    if ast.target.is_empty() {
        return Err(LoadError::invalid(1, "missing .target directive"));
    }
    let mut m = ModuleCtx {
        names: HashMap::new(),
        shared_vars: Vec::new(),
        globals: Vec::new(),
        sigs: Vec::new(),
        builtins: HashMap::new(),
    };
    let mut func_decls: Vec<&FuncDecl> = Vec::new();
    let mut func_ids: HashMap<&str, u32> = HashMap::new();
    // Pass 1: module variables and function signatures.
    for item in &ast.items {
        match item {
            Item::Var(v) => add_module_var(&mut m, v)?,
            Item::Func(f) => {
                if let Some(&id) = func_ids.get(f.name.as_str()) {
                    // A prototype followed by the definition (or a duplicate definition).
                    let prev = func_decls[id as usize];
                    if prev.body.is_some() && f.body.is_some() {
                        return Err(LoadError::invalid(
                            f.line,
                            format!("function `{}` defined twice", f.name),
                        ));
                    }
                    if f.body.is_some() {
                        func_decls[id as usize] = f;
                    }
                    continue;
                }
                if m.names.contains_key(&f.name) {
                    return Err(LoadError::invalid(
                        f.line,
                        format!("`{}` is already defined", f.name),
                    ));
                }
                let id = func_decls.len() as u32;
                func_ids.insert(&f.name, id);
                func_decls.push(f);
                m.names.insert(f.name.clone(), Name::Func(id));
            }
        }
    }
    for f in &func_decls {
        let sig = if f.is_entry {
            let (formals, kparams, total) = layout_params(&f.params, 0)?;
            Sig {
                formals,
                formal_names: f.params.iter().map(|p| p.name.clone()).collect(),
                param_bytes: total,
                is_entry: true,
                kparams,
                ..Sig::default()
            }
        } else {
            let (rets, _, after) = layout_params(&f.rets, 0)?;
            let (formals, _, total) = layout_params(&f.params, after)?;
            Sig {
                rets,
                formals,
                formal_names: f.params.iter().map(|p| p.name.clone()).collect(),
                ret_names: f.rets.iter().map(|p| p.name.clone()).collect(),
                param_bytes: total,
                is_entry: false,
                kparams: Vec::new(),
            }
        };
        m.sigs.push(sig);
    }
    for (id, f) in func_decls.iter().enumerate() {
        if f.body.is_none()
            && let Some(b) = builtin(f, &m.sigs[id])
        {
            m.builtins.insert(id as u32, b);
        }
    }
    // Pass 2: bodies.
    let mut funcs = Vec::with_capacity(func_decls.len());
    for (id, f) in func_decls.iter().enumerate() {
        funcs.push(decode_func(&mut m, f, id as u32)?);
    }
    for f in &mut funcs {
        cfg::assign_reconvergence(&mut f.code);
    }
    // Kernels and their layouts.
    let mut kernels = Vec::new();
    let mut layouts = Vec::new();
    for (id, f) in func_decls.iter().enumerate() {
        if !f.is_entry || f.body.is_none() {
            continue;
        }
        let (info, layout) = kernel_info(&m, &funcs, f, id as u32)?;
        kernels.push(info);
        layouts.push(layout);
    }
    for (id, f) in funcs.iter().enumerate() {
        for &c in &f.callees {
            if !funcs[c as usize].defined {
                return Err(LoadError::unsupported(
                    funcs[id].line,
                    format!(
                        "call to external function `{}` (no definition in this module)",
                        funcs[c as usize].name
                    ),
                ));
            }
        }
    }
    Ok(Program {
        funcs,
        globals: m.globals,
        kernels,
        layouts,
    })
}

/// The built-in an undefined function declaration names, when its signature is the one nvcc
/// declares: `vprintf(.b64, .b64) -> .b32` and `__assertfail(.b64, .b64, .b32, .b64, .b64)`.
fn builtin(f: &FuncDecl, sig: &Sig) -> Option<Builtin> {
    let sizes: Vec<u32> = sig.formals.iter().map(|&(_, s)| s).collect();
    match f.name.as_str() {
        "vprintf" if sizes == [8, 8] && sig.rets.len() <= 1 => Some(Builtin::Vprintf),
        "__assertfail" if sizes == [8, 8, 4, 8, 8] && sig.rets.is_empty() => {
            Some(Builtin::AssertFail)
        }
        _ => None,
    }
}

fn add_module_var(m: &mut ModuleCtx, v: &VarDecl) -> Result<(), LoadError> {
    if m.names.contains_key(&v.name) {
        return Err(LoadError::invalid(
            v.line,
            format!("`{}` is already defined", v.name),
        ));
    }
    match v.space {
        VarSpace::Global | VarSpace::Const => {
            if v.is_extern {
                return Err(LoadError::unsupported(
                    v.line,
                    format!("external variable `{}` (no linker)", v.name),
                ));
            }
            let (size, init) = global_image(v)?;
            let idx = m.globals.len() as u32;
            m.globals.push(GlobalVar {
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
            });
            m.names.insert(v.name.clone(), Name::Global(idx));
        }
        VarSpace::Shared => {
            let id = new_shared(m, v)?;
            m.names.insert(v.name.clone(), Name::Shared(id));
        }
        _ => {
            return Err(LoadError::unsupported(
                v.line,
                "module-scope .local/.param variables are not supported",
            ));
        }
    }
    Ok(())
}

fn new_shared(m: &mut ModuleCtx, v: &VarDecl) -> Result<u32, LoadError> {
    if v.init.is_some() {
        return Err(LoadError::invalid(
            v.line,
            "shared variables cannot have initializers",
        ));
    }
    let size = var_size(v)?;
    let is_extern = v.is_extern || size.is_none();
    let size = size.unwrap_or(0);
    if size > MAX_SHARED_DECL_BYTES {
        return Err(LoadError::invalid(
            v.line,
            format!("shared variable `{}` is too large", v.name),
        ));
    }
    let id = m.shared_vars.len() as u32;
    m.shared_vars.push(SharedVar {
        size,
        align: var_align(v)?,
        is_extern,
    });
    Ok(id)
}

fn kernel_info(
    m: &ModuleCtx,
    funcs: &[Func],
    f: &FuncDecl,
    id: u32,
) -> Result<(KernelInfo, KernelLayout), LoadError> {
    // Reachable functions and recursion.
    let mut reach = vec![false; funcs.len()];
    let mut stack = vec![id];
    while let Some(x) = stack.pop() {
        if std::mem::replace(&mut reach[x as usize], true) {
            continue;
        }
        stack.extend(funcs[x as usize].callees.iter().copied());
    }
    let recursive = has_cycle(funcs, id);
    // Shared layout: every shared variable referenced by a reachable function.
    let mut shared_off = vec![u64::MAX; m.shared_vars.len()];
    let mut off = 0u64;
    let mut dyn_align = 16u64;
    for (fid, r) in reach.iter().enumerate() {
        if !*r {
            continue;
        }
        for &sv in &funcs[fid].shared_refs {
            let var = &m.shared_vars[sv as usize];
            if shared_off[sv as usize] != u64::MAX {
                continue;
            }
            if var.is_extern {
                dyn_align = dyn_align.max(var.align);
                continue;
            }
            off = align_up(off, var.align);
            shared_off[sv as usize] = off;
            off += var.size;
        }
    }
    let static_shared = off;
    let dyn_base = align_up(off, dyn_align);
    for (sv, var) in m.shared_vars.iter().enumerate() {
        if var.is_extern {
            shared_off[sv] = dyn_base;
        }
    }
    let local_per_thread = if recursive {
        funcs[id as usize].local_bytes + RECURSIVE_STACK_BYTES
    } else {
        max_chain_local(funcs, id, &mut HashMap::new())
    };
    if local_per_thread > MAX_LOCAL_BYTES {
        return Err(LoadError::unsupported(
            f.line,
            format!("kernel `{}` needs too much local memory", f.name),
        ));
    }
    let sig = &m.sigs[id as usize];
    let mut max_threads = MAX_THREADS_PER_BLOCK;
    let mut reqntid = None;
    let mut min_blocks = None;
    let mut max_regs = u32::MAX;
    for (d, nums) in &f.perf {
        let dims = || -> Result<[u32; 3], LoadError> {
            let mut v = [1u32; 3];
            if nums.is_empty() || nums.len() > 3 {
                return Err(LoadError::invalid(f.line, format!("bad .{d}")));
            }
            for (i, n) in nums.iter().enumerate() {
                v[i] = u32::try_from(*n)
                    .ok()
                    .filter(|&x| x > 0)
                    .ok_or_else(|| LoadError::invalid(f.line, format!("bad .{d}")))?;
            }
            Ok(v)
        };
        match d.as_str() {
            "maxntid" => {
                let v = dims()?;
                let prod = u64::from(v[0]) * u64::from(v[1]) * u64::from(v[2]);
                max_threads = max_threads.min(prod.min(u64::from(MAX_THREADS_PER_BLOCK)) as u32);
            }
            "reqntid" => {
                let v = dims()?;
                let prod = u64::from(v[0]) * u64::from(v[1]) * u64::from(v[2]);
                if prod > u64::from(MAX_THREADS_PER_BLOCK) {
                    return Err(LoadError::invalid(f.line, ".reqntid exceeds 1024 threads"));
                }
                max_threads = max_threads.min(prod as u32);
                reqntid = Some(v);
            }
            "minnctapersm" => min_blocks = nums.first().copied(),
            // The register budget a real compiler must fit in: what the
            // kernel reports as its register use (the interpreter has no
            // register file to allocate).
            "maxnreg" => {
                max_regs = nums
                    .first()
                    .and_then(|&n| u32::try_from(n).ok())
                    .filter(|&n| n > 0)
                    .ok_or_else(|| LoadError::invalid(f.line, "bad .maxnreg"))?;
            }
            "maxnctapersm" | "noreturn" | "explicitcluster" | "reqnctapercluster"
            | "maxclusterrank" | "blocksareclusters" => {}
            other => {
                return Err(LoadError::unsupported(
                    f.line,
                    format!("unsupported kernel directive `.{other}`"),
                ));
            }
        }
    }
    let _ = min_blocks;
    let info = KernelInfo {
        name: f.name.clone(),
        params: sig.kparams.clone(),
        param_bytes: sig.param_bytes as usize,
        static_shared_bytes: static_shared as usize,
        local_bytes: funcs[id as usize].local_bytes as usize,
        max_threads_per_block: max_threads,
        reqntid,
        num_regs: funcs[id as usize].declared_regs.min(max_regs),
    };
    let layout = KernelLayout {
        func: id,
        shared_off,
        dyn_shared_base: dyn_base,
        local_per_thread,
    };
    Ok((info, layout))
}

fn has_cycle(funcs: &[Func], root: u32) -> bool {
    // Iterative DFS with colours: 0 white, 1 grey, 2 black.
    let mut colour = vec![0u8; funcs.len()];
    let mut stack: Vec<(u32, usize)> = vec![(root, 0)];
    colour[root as usize] = 1;
    while let Some(&mut (node, ref mut i)) = stack.last_mut() {
        let callees = &funcs[node as usize].callees;
        if *i < callees.len() {
            let c = callees[*i];
            *i += 1;
            match colour[c as usize] {
                1 => return true,
                0 => {
                    colour[c as usize] = 1;
                    stack.push((c, 0));
                }
                _ => {}
            }
        } else {
            colour[node as usize] = 2;
            stack.pop();
        }
    }
    false
}

fn max_chain_local(funcs: &[Func], f: u32, memo: &mut HashMap<u32, u64>) -> u64 {
    // Only called for acyclic call graphs, so the recursion depth is bounded by the number of
    // functions; hostile modules with thousands of nested functions are still finite.
    if let Some(&v) = memo.get(&f) {
        return v;
    }
    let own = funcs[f as usize].local_bytes;
    let mut best = 0u64;
    for &c in &funcs[f as usize].callees {
        best = best.max(max_chain_local(funcs, c, memo));
    }
    let v = own.saturating_add(best);
    memo.insert(f, v);
    v
}

/// Per-instruction modifier bookkeeping: every modifier must be understood or explicitly ignored.
struct Mods<'a> {
    list: &'a [String],
    used: Vec<bool>,
}

/// Modifiers that do not change results in this interpreter (cache policy, memory-model scope,
/// alignment and convergence assertions).
fn ignorable(m: &str) -> bool {
    matches!(
        m,
        "ca" | "cg"
            | "cs"
            | "lu"
            | "cv"
            | "wb"
            | "wt"
            | "weak"
            | "relaxed"
            | "cta"
            | "gpu"
            | "sys"
            | "aligned"
            | "uni"
            | "approx"
            | "full"
            | "noftz"
            | "unified"
            | "sc"
            | "mmio"
    ) || m.starts_with("L1::")
        || m.starts_with("L2::")
        || m.starts_with("level::")
}

impl<'a> Mods<'a> {
    fn new(list: &'a [String]) -> Self {
        Mods {
            list,
            used: vec![false; list.len()],
        }
    }

    fn has(&mut self, s: &str) -> bool {
        let mut found = false;
        for (i, m) in self.list.iter().enumerate() {
            if m == s {
                self.used[i] = true;
                found = true;
            }
        }
        found
    }

    fn any(&mut self, opts: &[&'static str]) -> Option<&'static str> {
        for (i, m) in self.list.iter().enumerate() {
            if let Some(o) = opts.iter().find(|o| **o == m) {
                self.used[i] = true;
                return Some(o);
            }
        }
        None
    }

    fn types(&mut self) -> Vec<Ty> {
        let mut out = Vec::new();
        for (i, m) in self.list.iter().enumerate() {
            if let Some(t) = Ty::parse(m) {
                self.used[i] = true;
                out.push(t);
            }
        }
        out
    }

    fn rnd(&mut self) -> Rnd {
        match self.any(&["rn", "rz", "rm", "rp", "rna", "rni", "rzi", "rmi", "rpi"]) {
            Some("rn") => Rnd::Rn,
            Some("rz") => Rnd::Rz,
            Some("rm") => Rnd::Rm,
            Some("rp") => Rnd::Rp,
            Some("rna") => Rnd::Rna,
            Some("rni") => Rnd::Rni,
            Some("rzi") => Rnd::Rzi,
            Some("rmi") => Rnd::Rmi,
            Some("rpi") => Rnd::Rpi,
            _ => Rnd::Default,
        }
    }

    fn space(&mut self) -> Space {
        match self.any(&[
            "global",
            "shared",
            "shared::cta",
            "local",
            "const",
            "param",
            "param::entry",
            "param::func",
        ]) {
            Some("global") => Space::Global,
            Some("shared") | Some("shared::cta") => Space::Shared,
            Some("local") => Space::Local,
            Some("const") => Space::Const,
            Some("param") | Some("param::entry") | Some("param::func") => Space::Param,
            _ => Space::Generic,
        }
    }

    fn ord(&mut self) -> MemOrd {
        let acq = self.has("acquire");
        let rel = self.has("release");
        let vol = self.has("volatile");
        let _ = vol;
        let acq_rel = self.has("acq_rel");
        if acq || acq_rel {
            MemOrd::Acquire
        } else if rel {
            MemOrd::Release
        } else {
            MemOrd::Relaxed
        }
    }

    fn finish(&self, ins: &Instr) -> Result<(), LoadError> {
        for (i, m) in self.list.iter().enumerate() {
            if !self.used[i] && !ignorable(m) {
                return Err(unsupported(ins));
            }
        }
        Ok(())
    }
}

fn unsupported(ins: &Instr) -> LoadError {
    LoadError::unsupported(
        ins.line,
        format!("unsupported instruction `{}`", ins.full_name()),
    )
}

fn special_reg(name: &str) -> Option<Sreg> {
    let comp = |c: &str| match c {
        "x" => Some(0u8),
        "y" => Some(1),
        "z" => Some(2),
        _ => None,
    };
    if let Some((base, c)) = name.split_once('.') {
        let c = comp(c)?;
        return Some(match base {
            "%tid" => Sreg::Tid(c),
            "%ntid" => Sreg::Ntid(c),
            "%ctaid" => Sreg::Ctaid(c),
            "%nctaid" => Sreg::Nctaid(c),
            "%cluster_ctaid" => Sreg::ClusterCtaId(c),
            "%cluster_nctaid" => Sreg::ClusterNCtaId(c),
            "%clusterid" => Sreg::ClusterId(c),
            "%nclusterid" => Sreg::NClusterId(c),
            _ => return None,
        });
    }
    Some(match name {
        "%laneid" => Sreg::LaneId,
        "%warpid" => Sreg::WarpId,
        "%nwarpid" => Sreg::NWarpId,
        "%smid" => Sreg::SmId,
        "%nsmid" => Sreg::NSmId,
        "%gridid" => Sreg::GridId,
        "%clock" => Sreg::Clock,
        "%clock64" => Sreg::Clock64,
        "%globaltimer" => Sreg::GlobalTimer,
        "%globaltimer_lo" => Sreg::GlobalTimerLo,
        "%globaltimer_hi" => Sreg::GlobalTimerHi,
        "%lanemask_eq" => Sreg::LanemaskEq,
        "%lanemask_le" => Sreg::LanemaskLe,
        "%lanemask_lt" => Sreg::LanemaskLt,
        "%lanemask_ge" => Sreg::LanemaskGe,
        "%lanemask_gt" => Sreg::LanemaskGt,
        "%dynamic_smem_size" => Sreg::DynamicSmemSize,
        "%total_smem_size" => Sreg::TotalSmemSize,
        "%cluster_ctarank" => Sreg::ClusterCtaRank,
        "%cluster_nctarank" => Sreg::ClusterNCtaRank,
        "%is_explicit_cluster" => Sreg::IsExplicitCluster,
        "%tid" => Sreg::Tid(0),
        "%ntid" => Sreg::Ntid(0),
        "%ctaid" => Sreg::Ctaid(0),
        "%nctaid" => Sreg::Nctaid(0),
        _ => return None,
    })
}

struct FnCtx<'m> {
    m: &'m mut ModuleCtx,
    func_id: u32,
    is_entry: bool,
    scopes: Vec<HashMap<String, Name>>,
    /// Register ranges (`.reg .b32 %r<N>;`) of each scope, parallel to
    /// `scopes`: kept as ranges, never expanded into N names, so a
    /// declaration's cost does not grow with N.
    ranges: Vec<HashMap<String, RegRange>>,
    nregs: u32,
    npreds: u32,
    declared_regs: u32,
    code: Vec<Inst>,
    labels: HashMap<String, u32>,
    fixups: Vec<(usize, String, usize)>,
    syms: HashMap<SymInit, Reg>,
    init_regs: Vec<(Reg, SymInit)>,
    pconst: [Pred; 2],
    init_preds: Vec<(Pred, bool)>,
    param_bytes: u32,
    local_bytes: u64,
    callees: Vec<u32>,
    shared_refs: Vec<u32>,
    sink: Reg,
    line: usize,
}

fn decode_func(m: &mut ModuleCtx, f: &FuncDecl, id: u32) -> Result<Func, LoadError> {
    let sig = m.sigs[id as usize].clone();
    let Some(body) = &f.body else {
        return Ok(Func {
            name: f.name.clone(),
            code: Vec::new(),
            nregs: 0,
            npreds: 0,
            init_regs: Vec::new(),
            init_preds: Vec::new(),
            param_bytes: sig.param_bytes,
            local_bytes: 0,
            callees: Vec::new(),
            shared_refs: Vec::new(),
            declared_regs: 0,
            defined: false,
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
        init_regs: cx.init_regs,
        init_preds: cx.init_preds,
        param_bytes: cx.param_bytes,
        local_bytes: cx.local_bytes,
        callees: cx.callees,
        shared_refs: cx.shared_refs,
        declared_regs: cx.declared_regs,
        defined: true,
        line: f.line,
    })
}

type DResult<T> = Result<T, LoadError>;

/// A declared register range (by prefix): `prefix0` … `prefix{count-1}` are
/// registers (or predicates) `base` … `base + count - 1`.
#[derive(Debug, Clone, Copy)]
struct RegRange {
    base: u32,
    count: u32,
    pred: bool,
}

/// The register `name` names in a scope's `ranges`: `name` is a declared
/// prefix followed by a decimal index without leading zeros, below the
/// range's count. Every split of `name`'s trailing digits is tried (a prefix
/// may itself end in digits: `%r1<10>` declares `%r10` … `%r19`), at most
/// ten map lookups.
fn range_lookup(ranges: &HashMap<String, RegRange>, name: &str) -> Option<Name> {
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
    fn err(&self, msg: impl Into<String>) -> LoadError {
        LoadError::invalid(self.line, msg)
    }

    fn new_reg(&mut self) -> DResult<Reg> {
        if u64::from(self.nregs) >= MAX_REGS {
            return Err(LoadError::unsupported(self.line, "too many registers"));
        }
        self.nregs += 1;
        Ok(self.nregs - 1)
    }

    fn new_pred(&mut self) -> DResult<Pred> {
        if u64::from(self.npreds) >= MAX_REGS {
            return Err(LoadError::unsupported(
                self.line,
                "too many predicate registers",
            ));
        }
        self.npreds += 1;
        Ok(self.npreds - 1)
    }

    fn declare_reg(&mut self, name: &str, t: Ty) -> DResult<()> {
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

    fn declare_var(&mut self, v: &VarDecl) -> DResult<()> {
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
            VarSpace::Global | VarSpace::Const => {
                // Function-scope statics are module variables with function-local names.
                let (size, init) = global_image(v)?;
                let idx = self.m.globals.len() as u32;
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
                });
                self.bind(&v.name, Name::Global(idx));
            }
            VarSpace::Reg => return Err(self.err("unexpected .reg variable")),
        }
        Ok(())
    }

    fn bind(&mut self, name: &str, n: Name) {
        if let Some(scope) = self.scopes.last_mut() {
            scope.insert(name.to_string(), n);
        }
    }

    fn lookup(&self, name: &str) -> Option<Name> {
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
    fn declare_range(&mut self, prefix: &str, count: u32, t: Ty) -> DResult<()> {
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

    fn sym_reg(&mut self, init: SymInit) -> DResult<Reg> {
        if let Some(&r) = self.syms.get(&init) {
            return Ok(r);
        }
        let r = self.new_reg()?;
        self.syms.insert(init, r);
        self.init_regs.push((r, init));
        Ok(r)
    }

    fn imm(&mut self, bits: u64) -> DResult<Reg> {
        self.sym_reg(SymInit::Imm(bits))
    }

    fn const_pred(&mut self, v: bool) -> DResult<Pred> {
        let i = usize::from(v);
        if self.pconst[i] == NONE {
            let p = self.new_pred()?;
            self.pconst[i] = p;
            self.init_preds.push((p, v));
        }
        Ok(self.pconst[i])
    }

    /// Address (as a value) of a named variable plus `off`.
    fn addr_of(&mut self, n: Name, off: i64, generic: bool, name: &str) -> DResult<Reg> {
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
            Name::Func(_) => {
                return Err(LoadError::unsupported(
                    self.line,
                    format!("function pointers (`{name}`) are not supported"),
                ));
            }
            Name::Reg(_) | Name::Pred(_) => {
                return Err(self.err(format!("`{name}` is a register, not a variable")));
            }
        };
        self.sym_reg(init)
    }

    /// A value operand of type `ty` as a register.
    fn val(&mut self, op: &Operand, ty: Ty) -> DResult<Reg> {
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
    fn dst(&mut self, op: &Operand) -> DResult<Reg> {
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
    fn pred_src(&mut self, op: &Operand) -> DResult<(Pred, bool)> {
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

    fn pred_dst(&mut self, op: &Operand) -> DResult<Pred> {
        match op {
            Operand::Name(n) => match self.lookup(n) {
                Some(Name::Pred(p)) => Ok(p),
                _ => Err(self.err(format!("`{n}` is not a predicate"))),
            },
            Operand::Sink => self.new_pred(),
            _ => Err(self.err("expected a predicate destination")),
        }
    }

    fn push(&mut self, op: Op, guard: Pred, guard_neg: bool) {
        self.code.push(Inst {
            op,
            guard,
            guard_neg,
            line: self.line.min(u32::MAX as usize) as u32,
        });
    }

    fn ops<'a>(&self, ins: &'a Instr, n: usize) -> DResult<&'a [Operand]> {
        if ins.operands.len() != n {
            return Err(self.err(format!(
                "`{}` expects {n} operands, found {}",
                ins.full_name(),
                ins.operands.len()
            )));
        }
        Ok(&ins.operands)
    }

    fn one_type(&self, ins: &Instr, m: &mut Mods) -> DResult<Ty> {
        let t = m.types();
        if t.len() != 1 {
            return Err(self.err(format!("`{}` needs exactly one type", ins.full_name())));
        }
        Ok(t[0])
    }

    /// Resolves `[base+off]` for a memory instruction in `space`.
    fn address(&mut self, op: &Operand, space: Space) -> DResult<Addr> {
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
    fn dst_list(&mut self, op: &Operand) -> DResult<(u8, [Reg; 4])> {
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

    fn src_list(&mut self, op: &Operand, ty: Ty) -> DResult<(u8, [Reg; 4])> {
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

    fn decode_inst(&mut self, ins: &Instr) -> DResult<()> {
        let (guard, guard_neg) = match &ins.guard {
            None => (NONE, false),
            Some((neg, name)) => match self.lookup(name) {
                Some(Name::Pred(p)) => (p, *neg),
                _ => return Err(self.err(format!("guard `{name}` is not a predicate"))),
            },
        };
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

    /// Instruction selection. Returns None when the instruction compiles to nothing.
    fn select(&mut self, ins: &Instr) -> DResult<Option<Op>> {
        let mut m = Mods::new(&ins.mods);
        let op = match ins.opcode.as_str() {
            "mov" => self.sel_mov(ins, &mut m)?,
            "ld" | "ldu" => self.sel_ld(ins, &mut m)?,
            "st" => self.sel_st(ins, &mut m)?,
            "cvta" => {
                let to = m.has("to");
                let space = m.space();
                let ty = self.one_type(ins, &mut m)?;
                let o = self.ops(ins, 2)?;
                if space == Space::Generic {
                    return Err(self.err("cvta needs a state space"));
                }
                let d = self.dst(&o[0])?;
                let a = self.val(&o[1], ty)?;
                Op::Cvta {
                    d,
                    a,
                    space,
                    to,
                    narrow: ty.bytes() == 4,
                }
            }
            "isspacep" => {
                let space = m.space();
                let o = self.ops(ins, 2)?;
                let d = self.pred_dst(&o[0])?;
                let a = self.val(&o[1], Ty::U64)?;
                Op::Isspacep { d, a, space }
            }
            "cvt" => self.sel_cvt(ins, &mut m)?,
            "add" | "sub" | "addc" | "subc" => self.sel_addsub(ins, &mut m)?,
            "mul" | "mul24" => self.sel_mul(ins, &mut m)?,
            "mad" | "mad24" | "madc" | "fma" => self.sel_mad(ins, &mut m)?,
            "div" | "rem" | "min" | "max" | "copysign" => self.sel_divminmax(ins, &mut m)?,
            "abs" | "neg" | "sqrt" | "rsqrt" | "rcp" | "sin" | "cos" | "lg2" | "ex2" | "tanh" => {
                self.sel_unary(ins, &mut m)?
            }
            "and" | "or" | "xor" | "not" | "cnot" | "shl" | "shr" | "popc" | "clz" | "brev"
            | "bfind" | "bmsk" => self.sel_bits(ins, &mut m)?,
            "bfe" | "bfi" | "prmt" | "lop3" | "shf" | "dp4a" | "dp2a" | "sad" | "szext" => {
                self.sel_bitfield(ins, &mut m)?
            }
            "setp" | "set" => self.sel_setp(ins, &mut m)?,
            "selp" => {
                let ty = self.one_type(ins, &mut m)?;
                let o = self.ops(ins, 4)?;
                let d = self.dst(&o[0])?;
                let a = self.val(&o[1], ty)?;
                let b = self.val(&o[2], ty)?;
                let (p, neg) = self.pred_src(&o[3])?;
                if neg {
                    Op::Selp { d, a: b, b: a, p }
                } else {
                    Op::Selp { d, a, b, p }
                }
            }
            "slct" => {
                let ftz = m.has("ftz");
                let t = m.types();
                if t.len() != 2 {
                    return Err(self.err("slct needs two types"));
                }
                let o = self.ops(ins, 4)?;
                let d = self.dst(&o[0])?;
                let a = self.val(&o[1], t[0])?;
                let b = self.val(&o[2], t[0])?;
                let c = self.val(&o[3], t[1])?;
                Op::Slct {
                    float: t[1] == Ty::F32,
                    ftz,
                    d,
                    a,
                    b,
                    c,
                }
            }
            "testp" => {
                let k = match m.any(&[
                    "finite",
                    "infinite",
                    "number",
                    "notanumber",
                    "normal",
                    "subnormal",
                ]) {
                    Some("finite") => TestP::Finite,
                    Some("infinite") => TestP::Infinite,
                    Some("number") => TestP::Number,
                    Some("notanumber") => TestP::NotANumber,
                    Some("normal") => TestP::Normal,
                    Some("subnormal") => TestP::Subnormal,
                    _ => return Err(unsupported(ins)),
                };
                let ty = self.one_type(ins, &mut m)?;
                let o = self.ops(ins, 2)?;
                let d = self.pred_dst(&o[0])?;
                let a = self.val(&o[1], ty)?;
                Op::Testp { k, ty, d, a }
            }
            "bra" => {
                self.ops(ins, 1)?;
                Op::Bra {
                    target: 0,
                    rpc: NONE,
                }
            }
            "brx" => return Err(unsupported(ins)),
            "call" => self.sel_call(ins, &mut m)?,
            "ret" => {
                self.ops(ins, 0)?;
                if self.is_entry { Op::Exit } else { Op::Ret }
            }
            "exit" => Op::Exit,
            "trap" => Op::Trap,
            "brkpt" | "pmevent" | "nanosleep" | "prefetch" | "prefetchu" | "griddepcontrol"
            | "discard" | "applypriority" | "setmaxnreg" => return Ok(None),
            "bar" | "barrier" => self.sel_bar(ins, &mut m)?,
            "membar" | "fence" => {
                return Ok(Some(Op::Fence));
            }
            "atom" | "red" => self.sel_atom(ins, &mut m)?,
            "shfl" => self.sel_shfl(ins, &mut m)?,
            "vote" => self.sel_vote(ins, &mut m)?,
            "activemask" => {
                m.types();
                let o = self.ops(ins, 1)?;
                Op::Activemask {
                    d: self.dst(&o[0])?,
                }
            }
            "redux" => {
                m.has("sync");
                let op = match m.any(&["add", "min", "max", "and", "or", "xor"]) {
                    Some("add") => ReduxOp::Add,
                    Some("min") => ReduxOp::Min,
                    Some("max") => ReduxOp::Max,
                    Some("and") => ReduxOp::And,
                    Some("or") => ReduxOp::Or,
                    Some("xor") => ReduxOp::Xor,
                    _ => return Err(unsupported(ins)),
                };
                let ty = self.one_type(ins, &mut m)?;
                if ty.bytes() != 4 || ty.is_float() {
                    return Err(unsupported(ins));
                }
                let o = self.ops(ins, 3)?;
                Op::Redux {
                    op,
                    signed: ty.is_signed(),
                    d: self.dst(&o[0])?,
                    a: self.val(&o[1], ty)?,
                    mask: self.val(&o[2], Ty::B32)?,
                }
            }
            "match" => {
                m.has("sync");
                let all = match m.any(&["any", "all"]) {
                    Some("all") => true,
                    Some(_) => false,
                    None => return Err(unsupported(ins)),
                };
                let ty = self.one_type(ins, &mut m)?;
                let o = self.ops(ins, 3)?;
                let (d, p) = match &o[0] {
                    Operand::Pair(d, p) if all => {
                        let d = self.dst(&Operand::Name(d.clone()))?;
                        (d, self.pred_dst(&Operand::Name(p.clone()))?)
                    }
                    other => (self.dst(other)?, NONE),
                };
                Op::Match {
                    all,
                    wide: ty.bytes() == 8,
                    d,
                    p,
                    a: self.val(&o[1], ty)?,
                    mask: self.val(&o[2], Ty::B32)?,
                }
            }
            "elect" => {
                m.has("sync");
                let o = self.ops(ins, 2)?;
                let (d, p) = match &o[0] {
                    Operand::Pair(d, p) => {
                        let d = if d == "_" {
                            self.sink
                        } else {
                            self.dst(&Operand::Name(d.clone()))?
                        };
                        (d, self.pred_dst(&Operand::Name(p.clone()))?)
                    }
                    _ => return Err(self.err("elect.sync needs `d|p`")),
                };
                Op::Elect {
                    d,
                    p,
                    mask: self.val(&o[1], Ty::B32)?,
                }
            }
            "fns" => {
                m.types();
                let o = self.ops(ins, 4)?;
                Op::Fns {
                    d: self.dst(&o[0])?,
                    mask: self.val(&o[1], Ty::B32)?,
                    base: self.val(&o[2], Ty::U32)?,
                    off: self.val(&o[3], Ty::S32)?,
                }
            }
            "cp" => self.sel_cp(ins, &mut m)?,
            _ => return Err(unsupported(ins)),
        };
        m.finish(ins)?;
        Ok(Some(op))
    }

    fn sel_mov(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let ty = self.one_type(ins, m)?;
        let o = self.ops(ins, 2)?;
        if ty == Ty::Pred {
            let d = self.pred_dst(&o[0])?;
            let (a, neg) = self.pred_src(&o[1])?;
            return Ok(if neg {
                Op::PNot { d, a }
            } else {
                Op::PMov { d, a }
            });
        }
        if let Operand::Vec(parts) = &o[0] {
            let n = parts.len();
            if !(2..=4).contains(&n) || ty.bits() % n as u32 != 0 {
                return Err(self.err("bad vector unpack"));
            }
            let a = self.val(&o[1], ty)?;
            let mut regs = [self.sink; 4];
            for (i, p) in parts.iter().enumerate() {
                regs[i] = self.dst(p)?;
            }
            return Ok(Op::Unpack {
                a,
                parts: regs,
                n: n as u8,
                bits: (ty.bits() / n as u32) as u8,
            });
        }
        let d = self.dst(&o[0])?;
        if let Operand::Vec(parts) = &o[1] {
            let n = parts.len();
            if !(2..=4).contains(&n) || ty.bits() % n as u32 != 0 {
                return Err(self.err("bad vector pack"));
            }
            let bits = ty.bits() / n as u32;
            let pty = match bits {
                8 => Ty::B8,
                16 => Ty::B16,
                32 => Ty::B32,
                _ => Ty::B64,
            };
            let mut regs = [self.sink; 4];
            for (i, p) in parts.iter().enumerate() {
                regs[i] = self.val(p, pty)?;
            }
            return Ok(Op::Pack {
                d,
                parts: regs,
                n: n as u8,
                bits: bits as u8,
            });
        }
        if let Operand::Name(n) = &o[1]
            && self.lookup(n).is_none()
        {
            if let Some(s) = special_reg(n) {
                return Ok(Op::Special { d, s });
            }
            if n.starts_with('%') {
                return Err(LoadError::unsupported(
                    ins.line,
                    format!("unsupported special register `{n}`"),
                ));
            }
        }
        let a = self.val(&o[1], ty)?;
        Ok(Op::Mov { d, a })
    }

    fn sel_ld(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let ord = m.ord();
        m.has("nc");
        let space = m.space();
        let n_vec = match m.any(&["v2", "v4", "v8"]) {
            Some("v2") => 2,
            Some("v4") => 4,
            Some(_) => return Err(unsupported(ins)),
            None => 1,
        };
        let ty = self.one_type(ins, m)?;
        if ty == Ty::B128 || ty == Ty::Pred {
            return Err(unsupported(ins));
        }
        let hint = m.has("L2::cache_hint");
        let want = if hint { 3 } else { 2 };
        let o = self.ops(ins, want)?;
        let (n, d) = self.dst_list(&o[0])?;
        if n != n_vec {
            return Err(self.err("vector size does not match the destination list"));
        }
        let bytes = ty.bytes() as u8;
        let sext = ty.is_signed();
        Ok(match self.address(&o[1], space)? {
            Addr::Reg(base, off) => Op::Ld {
                space,
                bytes,
                sext,
                n,
                d,
                base,
                off,
                ord,
            },
            Addr::KParam(off) => {
                if u32::from(bytes) * u32::from(n) + off
                    > self.m.sigs[self.func_id as usize].param_bytes
                {
                    return Err(self.err("load past the end of the kernel parameters"));
                }
                Op::LdKParam {
                    bytes,
                    sext,
                    n,
                    d,
                    off,
                }
            }
            Addr::FParam(off) => {
                if u32::from(bytes) * u32::from(n) + off > self.param_bytes {
                    return Err(self.err("load past the end of a parameter"));
                }
                Op::LdFParam {
                    bytes,
                    sext,
                    n,
                    d,
                    off,
                }
            }
        })
    }

    fn sel_st(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let ord = m.ord();
        let space = m.space();
        let n_vec = match m.any(&["v2", "v4", "v8"]) {
            Some("v2") => 2,
            Some("v4") => 4,
            Some(_) => return Err(unsupported(ins)),
            None => 1,
        };
        let ty = self.one_type(ins, m)?;
        if ty == Ty::B128 || ty == Ty::Pred {
            return Err(unsupported(ins));
        }
        if space == Space::Const {
            return Err(self.err("constant memory is read-only"));
        }
        let hint = m.has("L2::cache_hint");
        let want = if hint { 3 } else { 2 };
        let o = self.ops(ins, want)?;
        let (n, s) = self.src_list(&o[1], ty)?;
        if n != n_vec {
            return Err(self.err("vector size does not match the source list"));
        }
        let bytes = ty.bytes() as u8;
        Ok(match self.address(&o[0], space)? {
            Addr::Reg(base, off) => Op::St {
                space,
                bytes,
                n,
                s,
                base,
                off,
                ord,
            },
            Addr::KParam(_) => return Err(self.err("kernel parameters are read-only")),
            Addr::FParam(off) => {
                if u32::from(bytes) * u32::from(n) + off > self.param_bytes {
                    return Err(self.err("store past the end of a parameter"));
                }
                Op::StFParam { bytes, n, s, off }
            }
        })
    }

    fn sel_cvt(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let rnd = m.rnd();
        let ftz = m.has("ftz");
        let sat = m.has("sat");
        let relu = m.has("relu");
        let t = m.types();
        if t.len() != 2 {
            return Err(self.err("cvt needs two types"));
        }
        let (dty, sty) = (t[0], t[1]);
        if matches!(dty, Ty::F16x2 | Ty::Bf16x2) {
            if sty != Ty::F32 {
                return Err(unsupported(ins));
            }
            let o = self.ops(ins, 3)?;
            return Ok(Op::CvtPack {
                d: self.dst(&o[0])?,
                a: self.val(&o[1], Ty::F32)?,
                b: self.val(&o[2], Ty::F32)?,
                bf: dty == Ty::Bf16x2,
                rnd,
                relu,
            });
        }
        if relu
            || m.has("satfinite")
            || dty == Ty::Pred
            || sty == Ty::Pred
            || dty == Ty::B128
            || matches!(sty, Ty::F16x2 | Ty::Bf16x2)
        {
            return Err(unsupported(ins));
        }
        let o = self.ops(ins, 2)?;
        let d = self.dst(&o[0])?;
        let a = self.val(&o[1], sty)?;
        Ok(Op::Cvt {
            d,
            a,
            dty,
            sty,
            rnd,
            sat,
            ftz,
        })
    }

    fn float_mods(&self, m: &mut Mods) -> (Rnd, bool, bool) {
        (m.rnd(), m.has("ftz"), m.has("sat"))
    }

    fn sel_addsub(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let (rnd, ftz, sat) = self.float_mods(m);
        let cc = m.has("cc");
        let ty = self.one_type(ins, m)?;
        let o = self.ops(ins, 3)?;
        let d = self.dst(&o[0])?;
        let a = self.val(&o[1], ty)?;
        let b = self.val(&o[2], ty)?;
        let sub = ins.opcode.starts_with("sub");
        if ty.is_float() {
            if cc || ins.opcode.ends_with('c') {
                return Err(unsupported(ins));
            }
            let k = if sub { FBin::Sub } else { FBin::Add };
            return Ok(Op::FBin {
                k,
                ty,
                rnd,
                ftz,
                sat,
                d,
                a,
                b,
            });
        }
        if !ty.is_int() {
            return Err(unsupported(ins));
        }
        let cin = ins.opcode.ends_with('c');
        let k = if cc || cin {
            if ty.bytes() < 4 {
                return Err(unsupported(ins));
            }
            IBin::AddCarry { sub, cin, cout: cc }
        } else if sat {
            if ty != Ty::S32 {
                return Err(unsupported(ins));
            }
            if sub { IBin::SubSat } else { IBin::AddSat }
        } else if sub {
            IBin::Sub
        } else {
            IBin::Add
        };
        Ok(Op::IBin { k, ty, d, a, b })
    }

    fn sel_mul(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let (rnd, ftz, sat) = self.float_mods(m);
        let mode = m.any(&["lo", "hi", "wide"]);
        let ty = self.one_type(ins, m)?;
        let o = self.ops(ins, 3)?;
        let d = self.dst(&o[0])?;
        let a = self.val(&o[1], ty)?;
        let b = self.val(&o[2], ty)?;
        if ty.is_float() {
            return Ok(Op::FBin {
                k: FBin::Mul,
                ty,
                rnd,
                ftz,
                sat,
                d,
                a,
                b,
            });
        }
        if !ty.is_int() || sat {
            return Err(unsupported(ins));
        }
        let k = if ins.opcode == "mul24" {
            if ty.bytes() != 4 {
                return Err(unsupported(ins));
            }
            if mode == Some("hi") {
                IBin::Mul24Hi
            } else {
                IBin::Mul24Lo
            }
        } else {
            match mode {
                Some("hi") => IBin::MulHi,
                Some("wide") => {
                    if ty.bytes() == 8 {
                        return Err(unsupported(ins));
                    }
                    IBin::MulWide
                }
                _ => IBin::MulLo,
            }
        };
        Ok(Op::IBin { k, ty, d, a, b })
    }

    fn sel_mad(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let (rnd, ftz, sat) = self.float_mods(m);
        let relu = m.has("relu");
        let cc = m.has("cc");
        let mode = m.any(&["lo", "hi", "wide"]);
        let ty = self.one_type(ins, m)?;
        let o = self.ops(ins, 4)?;
        let d = self.dst(&o[0])?;
        let a = self.val(&o[1], ty)?;
        let b = self.val(&o[2], ty)?;
        if ty.is_float() {
            if ins.opcode != "fma" && ins.opcode != "mad" {
                return Err(unsupported(ins));
            }
            let c = self.val(&o[3], ty)?;
            return Ok(Op::Fma {
                ty,
                rnd,
                ftz,
                sat,
                relu,
                d,
                a,
                b,
                c,
            });
        }
        if !ty.is_int() || ins.opcode == "fma" || relu {
            return Err(unsupported(ins));
        }
        let cty = if mode == Some("wide") {
            match ty {
                Ty::U16 => Ty::U32,
                Ty::S16 => Ty::S32,
                Ty::U32 => Ty::U64,
                Ty::S32 => Ty::S64,
                _ => return Err(unsupported(ins)),
            }
        } else {
            ty
        };
        let c = self.val(&o[3], cty)?;
        let k = if ins.opcode == "mad24" {
            if ty.bytes() != 4 {
                return Err(unsupported(ins));
            }
            if mode == Some("hi") {
                ITern::Mad24Hi
            } else {
                ITern::Mad24Lo
            }
        } else if cc || ins.opcode == "madc" {
            if ty.bytes() < 4 {
                return Err(unsupported(ins));
            }
            ITern::MadCarry {
                hi: mode == Some("hi"),
                cin: ins.opcode == "madc",
                cout: cc,
            }
        } else {
            match mode {
                Some("hi") if sat => {
                    if ty != Ty::S32 {
                        return Err(unsupported(ins));
                    }
                    ITern::MadLoSat
                }
                Some("hi") => ITern::MadHi,
                Some("wide") => ITern::MadWide,
                _ => ITern::MadLo,
            }
        };
        Ok(Op::ITern { k, ty, d, a, b, c })
    }

    fn sel_divminmax(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let (rnd, ftz, sat) = self.float_mods(m);
        let nan = m.has("NaN");
        if m.has("xorsign") || m.has("relu") {
            return Err(unsupported(ins));
        }
        let ty = self.one_type(ins, m)?;
        let o = self.ops(ins, 3)?;
        let d = self.dst(&o[0])?;
        let a = self.val(&o[1], ty)?;
        let b = self.val(&o[2], ty)?;
        if ty.is_float() {
            let k = match ins.opcode.as_str() {
                "div" => FBin::Div,
                "min" if nan => FBin::MinNaN,
                "max" if nan => FBin::MaxNaN,
                "min" => FBin::Min,
                "max" => FBin::Max,
                "copysign" => FBin::Copysign,
                _ => return Err(unsupported(ins)),
            };
            if matches!(ty, Ty::F16 | Ty::F16x2 | Ty::Bf16 | Ty::Bf16x2) && k == FBin::Div {
                return Err(unsupported(ins));
            }
            return Ok(Op::FBin {
                k,
                ty,
                rnd,
                ftz,
                sat,
                d,
                a,
                b,
            });
        }
        if !ty.is_int() || nan || sat {
            return Err(unsupported(ins));
        }
        let k = match ins.opcode.as_str() {
            "div" => IBin::Div,
            "rem" => IBin::Rem,
            "min" => IBin::Min,
            "max" => IBin::Max,
            _ => return Err(unsupported(ins)),
        };
        Ok(Op::IBin { k, ty, d, a, b })
    }

    fn sel_unary(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let (rnd, ftz, sat) = self.float_mods(m);
        let ty = self.one_type(ins, m)?;
        let o = self.ops(ins, 2)?;
        let d = self.dst(&o[0])?;
        let a = self.val(&o[1], ty)?;
        if ty.is_float() {
            let k = match ins.opcode.as_str() {
                "abs" => FUn::Abs,
                "neg" => FUn::Neg,
                "sqrt" => FUn::Sqrt,
                "rsqrt" => FUn::Rsqrt,
                "rcp" => FUn::Rcp,
                "sin" => FUn::Sin,
                "cos" => FUn::Cos,
                "lg2" => FUn::Lg2,
                "ex2" => FUn::Ex2,
                "tanh" => FUn::Tanh,
                _ => return Err(unsupported(ins)),
            };
            return Ok(Op::FUn {
                k,
                ty,
                rnd,
                ftz,
                sat,
                d,
                a,
            });
        }
        if !ty.is_int() {
            return Err(unsupported(ins));
        }
        let k = match ins.opcode.as_str() {
            "abs" => IUn::Abs,
            "neg" => IUn::Neg,
            _ => return Err(unsupported(ins)),
        };
        Ok(Op::IUn { k, ty, d, a })
    }

    fn sel_bits(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let shiftamt = m.has("shiftamt");
        let clamp = m.any(&["clamp", "wrap"]);
        let ty = self.one_type(ins, m)?;
        let opc = ins.opcode.as_str();
        if ty == Ty::Pred {
            return match opc {
                "and" | "or" | "xor" => {
                    let o = self.ops(ins, 3)?;
                    let d = self.pred_dst(&o[0])?;
                    let (a, an) = self.pred_src(&o[1])?;
                    let (b, bn) = self.pred_src(&o[2])?;
                    let op = match opc {
                        "and" => BoolOp::And,
                        "or" => BoolOp::Or,
                        _ => BoolOp::Xor,
                    };
                    Ok(Op::PLogic {
                        op,
                        d,
                        a,
                        an,
                        b,
                        bn,
                    })
                }
                "not" => {
                    let o = self.ops(ins, 2)?;
                    let d = self.pred_dst(&o[0])?;
                    let (a, an) = self.pred_src(&o[1])?;
                    Ok(if an {
                        Op::PMov { d, a }
                    } else {
                        Op::PNot { d, a }
                    })
                }
                _ => Err(unsupported(ins)),
            };
        }
        if !ty.is_int() {
            return Err(unsupported(ins));
        }
        match opc {
            "and" | "or" | "xor" | "shl" | "shr" | "bmsk" => {
                let o = self.ops(ins, 3)?;
                let d = self.dst(&o[0])?;
                let a = self.val(&o[1], ty)?;
                let bty = if matches!(opc, "shl" | "shr" | "bmsk") {
                    Ty::U32
                } else {
                    ty
                };
                let b = self.val(&o[2], bty)?;
                let k = match opc {
                    "and" => IBin::And,
                    "or" => IBin::Or,
                    "xor" => IBin::Xor,
                    "shl" => IBin::Shl,
                    "shr" => IBin::Shr,
                    _ => IBin::Bmsk {
                        clamp: clamp == Some("clamp"),
                    },
                };
                Ok(Op::IBin { k, ty, d, a, b })
            }
            _ => {
                let o = self.ops(ins, 2)?;
                let d = self.dst(&o[0])?;
                let a = self.val(&o[1], ty)?;
                let k = match opc {
                    "not" => IUn::Not,
                    "cnot" => IUn::Cnot,
                    "popc" => IUn::Popc,
                    "clz" => IUn::Clz,
                    "brev" => IUn::Brev,
                    "bfind" => IUn::Bfind { shiftamt },
                    _ => return Err(unsupported(ins)),
                };
                Ok(Op::IUn { k, ty, d, a })
            }
        }
    }

    fn sel_bitfield(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        match ins.opcode.as_str() {
            "bfe" => {
                let ty = self.one_type(ins, m)?;
                let o = self.ops(ins, 4)?;
                Ok(Op::ITern {
                    k: ITern::Bfe,
                    ty,
                    d: self.dst(&o[0])?,
                    a: self.val(&o[1], ty)?,
                    b: self.val(&o[2], Ty::U32)?,
                    c: self.val(&o[3], Ty::U32)?,
                })
            }
            "bfi" => {
                let ty = self.one_type(ins, m)?;
                let o = self.ops(ins, 5)?;
                Ok(Op::Bfi {
                    ty,
                    d: self.dst(&o[0])?,
                    a: self.val(&o[1], ty)?,
                    b: self.val(&o[2], ty)?,
                    c: self.val(&o[3], Ty::U32)?,
                    e: self.val(&o[4], Ty::U32)?,
                })
            }
            "prmt" => {
                let mode = match m.any(&["f4e", "b4e", "rc8", "ecl", "ecr", "rc16"]) {
                    None => 0,
                    Some("f4e") => 1,
                    Some("b4e") => 2,
                    Some("rc8") => 3,
                    Some("ecl") => 4,
                    Some("ecr") => 5,
                    Some(_) => 6,
                };
                m.types();
                let o = self.ops(ins, 4)?;
                Ok(Op::Prmt {
                    mode,
                    d: self.dst(&o[0])?,
                    a: self.val(&o[1], Ty::B32)?,
                    b: self.val(&o[2], Ty::B32)?,
                    c: self.val(&o[3], Ty::B32)?,
                })
            }
            "lop3" => {
                m.types();
                let o = self.ops(ins, 5)?;
                let lut = match &o[4] {
                    Operand::Int(v) if *v <= 255 => *v as u8,
                    _ => return Err(self.err("lop3 needs an immediate lookup table")),
                };
                Ok(Op::Lop3 {
                    d: self.dst(&o[0])?,
                    a: self.val(&o[1], Ty::B32)?,
                    b: self.val(&o[2], Ty::B32)?,
                    c: self.val(&o[3], Ty::B32)?,
                    lut,
                })
            }
            "shf" => {
                let left = match m.any(&["l", "r"]) {
                    Some("l") => true,
                    Some(_) => false,
                    None => return Err(unsupported(ins)),
                };
                let clamp = m.any(&["clamp", "wrap"]) == Some("clamp");
                m.types();
                let o = self.ops(ins, 4)?;
                Ok(Op::Shf {
                    left,
                    clamp,
                    d: self.dst(&o[0])?,
                    a: self.val(&o[1], Ty::B32)?,
                    b: self.val(&o[2], Ty::B32)?,
                    c: self.val(&o[3], Ty::U32)?,
                })
            }
            "dp4a" | "dp2a" => {
                let hi = m.any(&["lo", "hi"]) == Some("hi");
                let t = m.types();
                if t.len() != 2 {
                    return Err(self.err("dp4a/dp2a need two types"));
                }
                let o = self.ops(ins, 4)?;
                let (sa, sb) = (t[0].is_signed(), t[1].is_signed());
                let k = if ins.opcode == "dp4a" {
                    ITern::Dp4a { sa, sb }
                } else {
                    ITern::Dp2a { sa, sb, hi }
                };
                let rty = if sa || sb { Ty::S32 } else { Ty::U32 };
                Ok(Op::ITern {
                    k,
                    ty: rty,
                    d: self.dst(&o[0])?,
                    a: self.val(&o[1], Ty::B32)?,
                    b: self.val(&o[2], Ty::B32)?,
                    c: self.val(&o[3], rty)?,
                })
            }
            "sad" => {
                let ty = self.one_type(ins, m)?;
                let o = self.ops(ins, 4)?;
                Ok(Op::ITern {
                    k: ITern::Sad,
                    ty,
                    d: self.dst(&o[0])?,
                    a: self.val(&o[1], ty)?,
                    b: self.val(&o[2], ty)?,
                    c: self.val(&o[3], ty)?,
                })
            }
            _ => {
                // szext.mode.type d, a, b
                let clamp = match m.any(&["clamp", "wrap"]) {
                    Some(c) => c == "clamp",
                    None => return Err(unsupported(ins)),
                };
                let ty = self.one_type(ins, m)?;
                let o = self.ops(ins, 3)?;
                let d = self.dst(&o[0])?;
                let a = self.val(&o[1], ty)?;
                let b = self.val(&o[2], Ty::U32)?;
                Ok(Op::ITern {
                    k: ITern::Szext {
                        signed: ty.is_signed(),
                        clamp,
                    },
                    ty,
                    d,
                    a,
                    b,
                    c: b,
                })
            }
        }
    }

    fn sel_setp(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let cmp = match m.any(&[
            "eq", "ne", "lt", "le", "gt", "ge", "lo", "ls", "hi", "hs", "equ", "neu", "ltu", "leu",
            "gtu", "geu", "num", "nan",
        ]) {
            Some("eq") => Cmp::Eq,
            Some("ne") => Cmp::Ne,
            Some("lt") => Cmp::Lt,
            Some("le") => Cmp::Le,
            Some("gt") => Cmp::Gt,
            Some("ge") => Cmp::Ge,
            Some("lo") => Cmp::Lo,
            Some("ls") => Cmp::Ls,
            Some("hi") => Cmp::Hi,
            Some("hs") => Cmp::Hs,
            Some("equ") => Cmp::Equ,
            Some("neu") => Cmp::Neu,
            Some("ltu") => Cmp::Ltu,
            Some("leu") => Cmp::Leu,
            Some("gtu") => Cmp::Gtu,
            Some("geu") => Cmp::Geu,
            Some("num") => Cmp::Num,
            Some("nan") => Cmp::Nan,
            _ => return Err(unsupported(ins)),
        };
        let bop = match m.any(&["and", "or", "xor"]) {
            Some("and") => Some(BoolOp::And),
            Some("or") => Some(BoolOp::Or),
            Some("xor") => Some(BoolOp::Xor),
            _ => None,
        };
        let ftz = m.has("ftz");
        let t = m.types();
        let setp = ins.opcode == "setp";
        let (dty, ty) = match (setp, t.as_slice()) {
            (true, [ty]) => (Ty::Pred, *ty),
            (false, [d, s]) => (*d, *s),
            _ => {
                return Err(self.err(format!(
                    "`{}` has the wrong number of types",
                    ins.full_name()
                )));
            }
        };
        if matches!(ty, Ty::F16x2 | Ty::Bf16x2) || ty == Ty::Pred || ty == Ty::B128 {
            return Err(unsupported(ins));
        }
        let n = ins.operands.len();
        let want = if bop.is_some() { 4 } else { 3 };
        if n != want {
            return Err(self.err(format!(
                "`{}` expects {want} operands, found {n}",
                ins.full_name()
            )));
        }
        let o = &ins.operands;
        let a = self.val(&o[1], ty)?;
        let b = self.val(&o[2], ty)?;
        let (c, cneg) = if bop.is_some() {
            self.pred_src(&o[3])?
        } else {
            (NONE, false)
        };
        if setp {
            let (p, q) = match &o[0] {
                Operand::Pair(p, q) => (
                    self.pred_dst(&Operand::Name(p.clone()))?,
                    self.pred_dst(&Operand::Name(q.clone()))?,
                ),
                other => (self.pred_dst(other)?, NONE),
            };
            Ok(Op::Setp {
                cmp,
                ty,
                ftz,
                bop,
                c,
                cneg,
                p,
                q,
                a,
                b,
            })
        } else {
            if !matches!(dty, Ty::U32 | Ty::S32 | Ty::F32 | Ty::B32) {
                return Err(unsupported(ins));
            }
            let d = self.dst(&o[0])?;
            Ok(Op::Set {
                cmp,
                ty,
                dty,
                ftz,
                bop,
                c,
                cneg,
                d,
                a,
                b,
            })
        }
    }

    fn sel_call(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
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
            Some(Name::Reg(_)) => {
                return Err(LoadError::unsupported(
                    ins.line,
                    "indirect calls are not supported",
                ));
            }
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
        if args.len() != sig.formals.len() || ret_args.len() != sig.rets.len() {
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

    /// A call of `vprintf` or `__assertfail`: the argument and result `.param` variables of the
    /// caller, read and written by the interpreter.
    fn builtin_call(
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
            call.ret = Some(param(r, size.min(4))?);
        }
        Ok(Op::CallBuiltin(Box::new(call)))
    }

    fn sel_bar(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
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

    fn sel_atom(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        m.ord();
        let space = m.space();
        let op = match m.any(&[
            "add", "min", "max", "and", "or", "xor", "exch", "cas", "inc", "dec",
        ]) {
            Some("add") => AtomOp::Add,
            Some("min") => AtomOp::Min,
            Some("max") => AtomOp::Max,
            Some("and") => AtomOp::And,
            Some("or") => AtomOp::Or,
            Some("xor") => AtomOp::Xor,
            Some("exch") => AtomOp::Exch,
            Some("cas") => AtomOp::Cas,
            Some("inc") => AtomOp::Inc,
            Some("dec") => AtomOp::Dec,
            _ => return Err(unsupported(ins)),
        };
        if m.any(&["v2", "v4", "v8"]).is_some() {
            return Err(unsupported(ins));
        }
        let ty = self.one_type(ins, m)?;
        let ok = match op {
            AtomOp::Add => matches!(
                ty,
                Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64 | Ty::F32 | Ty::F64
            ),
            AtomOp::Min | AtomOp::Max => matches!(ty, Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64),
            AtomOp::And | AtomOp::Or | AtomOp::Xor => matches!(
                ty,
                Ty::B32 | Ty::B64 | Ty::U32 | Ty::U64 | Ty::S32 | Ty::S64
            ),
            AtomOp::Exch => matches!(
                ty,
                Ty::B32 | Ty::B64 | Ty::U32 | Ty::U64 | Ty::S32 | Ty::S64 | Ty::F32 | Ty::F64
            ),
            AtomOp::Cas => matches!(
                ty,
                Ty::B16 | Ty::B32 | Ty::B64 | Ty::U32 | Ty::U64 | Ty::S32 | Ty::S64
            ),
            AtomOp::Inc | AtomOp::Dec => ty == Ty::U32,
        };
        if !ok {
            return Err(unsupported(ins));
        }
        let is_red = ins.opcode == "red";
        let hint = m.has("L2::cache_hint");
        let nsrc = if op == AtomOp::Cas { 2 } else { 1 };
        let want = usize::from(!is_red) + 1 + nsrc + usize::from(hint);
        let o = self.ops(ins, want)?;
        let (d, rest) = if is_red {
            (NONE, o)
        } else {
            (self.dst(&o[0])?, &o[1..])
        };
        let (base, off) = match self.address(&rest[0], space)? {
            Addr::Reg(b, off) => (b, off),
            _ => {
                return Err(LoadError::unsupported(
                    ins.line,
                    "atomics on parameters are not supported",
                ));
            }
        };
        let b = self.val(&rest[1], ty)?;
        let c = if op == AtomOp::Cas {
            self.val(&rest[2], ty)?
        } else {
            NONE
        };
        if space == Space::Const || space == Space::Param || space == Space::Local {
            return Err(unsupported(ins));
        }
        Ok(Op::Atom {
            space,
            op,
            ty,
            d,
            base,
            off,
            b,
            c,
        })
    }

    fn sel_shfl(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let sync = m.has("sync");
        let mode = match m.any(&["up", "down", "bfly", "idx"]) {
            Some("up") => ShflMode::Up,
            Some("down") => ShflMode::Down,
            Some("bfly") => ShflMode::Bfly,
            Some("idx") => ShflMode::Idx,
            _ => return Err(unsupported(ins)),
        };
        let ty = self.one_type(ins, m)?;
        if ty.bytes() != 4 {
            return Err(unsupported(ins));
        }
        let o = self.ops(ins, if sync { 5 } else { 4 })?;
        let (d, p) = match &o[0] {
            Operand::Pair(d, p) => (
                self.dst(&Operand::Name(d.clone()))?,
                self.pred_dst(&Operand::Name(p.clone()))?,
            ),
            other => (self.dst(other)?, NONE),
        };
        let a = self.val(&o[1], Ty::B32)?;
        let b = self.val(&o[2], Ty::B32)?;
        let c = self.val(&o[3], Ty::B32)?;
        let mask = if sync {
            self.val(&o[4], Ty::B32)?
        } else {
            self.imm(u64::from(u32::MAX))?
        };
        Ok(Op::Shfl {
            mode,
            d,
            p,
            a,
            b,
            c,
            mask,
        })
    }

    fn sel_vote(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        let sync = m.has("sync");
        let mode = match m.any(&["all", "any", "uni", "ballot"]) {
            Some("all") => VoteMode::All,
            Some("any") => VoteMode::Any,
            Some("uni") => VoteMode::Uni,
            Some("ballot") => VoteMode::Ballot,
            _ => return Err(unsupported(ins)),
        };
        m.types();
        let o = self.ops(ins, if sync { 3 } else { 2 })?;
        let d = if mode == VoteMode::Ballot {
            self.dst(&o[0])?
        } else {
            self.pred_dst(&o[0])?
        };
        let (a, aneg) = self.pred_src(&o[1])?;
        let mask = if sync {
            self.val(&o[2], Ty::B32)?
        } else {
            self.imm(u64::from(u32::MAX))?
        };
        Ok(Op::Vote {
            mode,
            d,
            a,
            aneg,
            mask,
        })
    }

    fn sel_cp(&mut self, ins: &Instr, m: &mut Mods) -> DResult<Op> {
        if !m.has("async") {
            return Err(unsupported(ins));
        }
        if m.has("commit_group") || m.has("wait_group") || m.has("wait_all") {
            m.finish(ins)?;
            return Ok(Op::Nop);
        }
        m.has("shared");
        m.has("shared::cta");
        m.has("global");
        let hint = m.has("L2::cache_hint");
        if m.has("bulk") || m.has("mbarrier") {
            return Err(unsupported(ins));
        }
        let o = &ins.operands;
        let n = o.len() - usize::from(hint);
        if !(3..=4).contains(&n) {
            return Err(self.err("cp.async expects 3 or 4 operands"));
        }
        let (dbase, doff) = match self.address(&o[0], Space::Shared)? {
            Addr::Reg(b, off) => (b, off),
            _ => return Err(self.err("bad cp.async destination")),
        };
        let (sbase, soff) = match self.address(&o[1], Space::Global)? {
            Addr::Reg(b, off) => (b, off),
            _ => return Err(self.err("bad cp.async source")),
        };
        let size = match &o[2] {
            Operand::Int(v @ (4 | 8 | 16)) => *v as u8,
            _ => return Err(self.err("cp.async size must be 4, 8 or 16")),
        };
        let src_size = if n == 4 {
            self.val(&o[3], Ty::U32)?
        } else {
            NONE
        };
        Ok(Op::CpAsync {
            dbase,
            doff,
            sbase,
            soff,
            size,
            src_size,
        })
    }
}

/// A resolved memory operand.
enum Addr {
    Reg(Reg, i64),
    KParam(u32),
    FParam(u32),
}
