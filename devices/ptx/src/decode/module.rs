//! Module scope: variable sizes, alignments and initial images, parameter layouts, the
//! `decode` entry point, built-in declarations, kernel information and the call graph checks.

use super::*;

pub(super) fn align_up(v: u64, a: u64) -> u64 {
    if a <= 1 {
        v
    } else {
        v.div_ceil(a).saturating_mul(a)
    }
}

pub(super) fn var_elem(v: &VarDecl) -> Result<(Ty, u64), LoadError> {
    // Module-scope `.global` references are handled before sizes are asked for; anywhere else
    // (kernel or function parameters of reference type) they are not supported.
    if v.ty == "samplerref" || ReferenceKind::parse(&v.ty).is_some() {
        return Err(LoadError::unsupported(
            v.line,
            format!("`.{}` variable `{}` outside module scope", v.ty, v.name),
        ));
    }
    let ty = Ty::parse(&v.ty)
        .ok_or_else(|| LoadError::invalid(v.line, format!("unknown type `.{}`", v.ty)))?;
    Ok((ty, ty.bytes() as u64 * u64::from(v.vec)))
}

/// The kind of a texture or surface reference declaration (`.global .texref NAME;`,
/// `.global .surfref NAME;`), `None` for any other variable. References must be plain
/// module-scope `.global` scalars; `.samplerref` (independent samplers) is not supported.
pub(super) fn reference_kind(v: &VarDecl) -> Result<Option<ReferenceKind>, LoadError> {
    if v.ty == "samplerref" {
        return Err(LoadError::unsupported(
            v.line,
            format!("sampler reference `{}` (`.samplerref`)", v.name),
        ));
    }
    let Some(kind) = ReferenceKind::parse(&v.ty) else {
        return Ok(None);
    };
    if v.is_extern {
        return Err(LoadError::unsupported(
            v.line,
            format!("external reference `{}` (no linker)", v.name),
        ));
    }
    if v.space != VarSpace::Global || v.vec != 1 || !v.dims.is_empty() || v.init.is_some() {
        return Err(LoadError::invalid(
            v.line,
            format!(
                "`{}` must be declared as `.global {} {};`",
                v.name,
                kind.directive(),
                v.name
            ),
        ));
    }
    Ok(Some(kind))
}

pub(super) fn var_size(v: &VarDecl) -> Result<Option<u64>, LoadError> {
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

pub(super) fn var_align(v: &VarDecl) -> Result<u64, LoadError> {
    let (_, elem) = var_elem(v)?;
    let a = v.align.unwrap_or(elem.max(1));
    if !a.is_power_of_two() || a > 4096 {
        return Err(LoadError::invalid(v.line, format!("bad alignment {a}")));
    }
    Ok(a.max(1))
}

/// Flattens an initializer into element literals.
pub(super) fn flatten(init: &Init, out: &mut Vec<Lit>, line: usize) -> Result<(), LoadError> {
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

pub(super) fn lit_bits(l: &Lit, ty: Ty, line: usize) -> Result<u64, LoadError> {
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
                format!(
                    "address-valued initializers (`{name}+{off}`) of elements smaller than 8 bytes are not supported"
                ),
            ));
        }
    })
}

/// A variable's size, initial bytes, and the addresses in its initializer, unresolved
/// (relocation, name).
type GlobalImage = (usize, Vec<u8>, Vec<(Reloc, String)>);

/// Builds the initial bytes of a module variable.
pub(super) fn global_image(v: &VarDecl) -> Result<GlobalImage, LoadError> {
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
    let mut relocs = Vec::new();
    if !lits.is_empty() {
        init = vec![0u8; size as usize];
        for (i, l) in lits.iter().enumerate() {
            let at = i * ebytes as usize;
            if let (Lit::Sym(name, off), 8) = (l, ebytes) {
                // Filled in when the variables have addresses.
                let r = Reloc {
                    offset: at,
                    target: RelocTarget::Function(0),
                    addend: *off,
                };
                relocs.push((r, name.clone()));
                continue;
            }
            let bits = lit_bits(l, ty, v.line)?;
            init[at..at + ebytes as usize].copy_from_slice(&bits.to_le_bytes()[..ebytes as usize]);
        }
    }
    Ok((size as usize, init, relocs))
}

/// Queues the addresses of variable `idx`'s initializer for [`resolve_relocs`].
pub(super) fn queue_relocs(m: &mut ModuleCtx, idx: u32, relocs: Vec<(Reloc, String)>, line: usize) {
    m.pending_relocs
        .extend(relocs.into_iter().map(|(r, n)| (idx, r, n, line)));
}

/// Resolves the names in variables' initializers to module variables and functions.
pub(super) fn resolve_relocs(m: &mut ModuleCtx) -> Result<(), LoadError> {
    for (idx, mut r, name, line) in std::mem::take(&mut m.pending_relocs) {
        r.target = match m.names.get(&name) {
            Some(&Name::Global(g)) => RelocTarget::Global(g as usize),
            Some(&Name::Func(f)) => {
                m.address_taken.push(f);
                RelocTarget::Function(FUNCTION_WINDOW + u64::from(f))
            }
            _ => {
                return Err(LoadError::invalid(
                    line,
                    format!(
                        "initializer names `{name}`, which is not a module variable or function"
                    ),
                ));
            }
        };
        m.globals[idx as usize].relocs.push(r);
    }
    Ok(())
}

/// (offset, size) per parameter, the driver-facing descriptions, and the total size.
type ParamLayout = (Vec<(u32, u32)>, Vec<ParamInfo>, u32);

/// Lays out a parameter list.
pub(super) fn layout_params(list: &[VarDecl], start: u32) -> Result<ParamLayout, LoadError> {
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

pub(crate) fn decode(ast: &Ast, ticker: &mut Ticker<'_>) -> Result<Program, LoadError> {
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
        pending_relocs: Vec::new(),
        address_taken: Vec::new(),
        indirect_targets: Vec::new(),
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
        let stmts = f.body.as_ref().map_or(1, |b| b.len() as u64 + 1);
        ticker.tick(stmts, f.line)?;
        funcs.push(decode_func(&mut m, f, id as u32)?);
    }
    resolve_relocs(&mut m)?;
    // An indirect call may reach any function whose address the module takes (and is defined:
    // calling another faults at run time). The call graph gets one node past the functions for
    // them all, `indirect_targets`, which every function that calls indirectly calls: an edge
    // each, not one per pair.
    m.address_taken.sort_unstable();
    m.address_taken.dedup();
    m.indirect_targets = m
        .address_taken
        .iter()
        .copied()
        .filter(|&f| funcs[f as usize].defined && !funcs[f as usize].is_entry)
        .collect();
    let targets_node = funcs.len() as u32;
    for f in funcs.iter_mut().filter(|f| f.indirect) {
        f.callees.push(targets_node);
    }
    for f in &mut funcs {
        cfg::assign_reconvergence_watched(&mut f.code, ticker, f.line)?;
        regalloc::compact(f, ticker)?;
    }
    // Kernels and their layouts.
    let mut kernels = Vec::new();
    let mut layouts = Vec::new();
    for (id, f) in func_decls.iter().enumerate() {
        if !f.is_entry || f.body.is_none() {
            continue;
        }
        // Reachability and recursion walk the call graph once per kernel.
        ticker.tick(funcs.len() as u64, f.line)?;
        let (info, layout) = kernel_info(&m, &funcs, f, id as u32)?;
        kernels.push(info);
        layouts.push(layout);
    }
    for (id, f) in funcs.iter().enumerate() {
        for &c in &f.callees {
            if funcs.get(c as usize).is_some_and(|c| !c.defined) {
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
    let uses_heap = m.builtins.values().any(|b| {
        matches!(
            b,
            Builtin::Malloc | Builtin::AlignedMalloc | Builtin::Free | Builtin::GetParameterBuffer
        )
    });
    let mut kernel_of_func = vec![u32::MAX; funcs.len()];
    for (k, l) in layouts.iter().enumerate() {
        kernel_of_func[l.func as usize] = k as u32;
    }
    let launches_kernels = m
        .builtins
        .values()
        .any(|b| matches!(b, Builtin::LaunchDevice(_)));
    Ok(Program {
        funcs,
        globals: m.globals,
        kernels,
        kernel_of_func,
        layouts,
        uses_heap,
        launches_kernels,
    })
}

/// The built-in an undefined function declaration names, when its signature is the one nvcc
/// declares: `vprintf(.b64, .b64) -> .b32`, `__assertfail(.b64, .b64, .b32, .b64, .b64)`,
/// `cudaGraphSetConditional(.b64, .b32)`, `malloc(.b64) -> .b64`,
/// `__nv_aligned_device_malloc(.b64, .b64) -> .b64` (which NVRTC calls
/// `__cuda_syscall_aligned_malloc`), `free(.b64)`, and the device runtime's calls for dynamic
/// parallelism (CUDA 11's `libcudadevrt` calls them `cnp*`, CUDA 12's `__cuda_syscall_cnpv2*`):
/// `cnpGetParameterBufferV2(.b64, .b8[12], .b8[12], .b32) -> .b64`,
/// `cnpLaunchDeviceV2(.b64, .b64) -> .b32`, `cnpGetLastError() -> .b32`,
/// `cnpSetLastError(.b32)` and the others of [`Builtin`], and CUDA 11's device-side
/// `cudaDeviceSynchronize() -> .b32`. The device runtime's own names
/// (`cudaGetParameterBufferV2`, `cudaLaunchDeviceV2`, `cudaGetLastError`, …), which
/// `libcudadevrt` defines, serve a program's PTX that was not linked with it.
pub(super) fn builtin(f: &FuncDecl, sig: &Sig) -> Option<Builtin> {
    let sizes: Vec<u32> = sig.formals.iter().map(|&(_, s)| s).collect();
    let rets: Vec<u32> = sig.rets.iter().map(|&(_, s)| s).collect();
    match f.name.as_str() {
        "vprintf" if sizes == [8, 8] && sig.rets.len() <= 1 => Some(Builtin::Vprintf),
        "__assertfail" if sizes == [8, 8, 4, 8, 8] && sig.rets.is_empty() => {
            Some(Builtin::AssertFail)
        }
        "cudaGraphSetConditional" if sizes == [8, 4] && sig.rets.is_empty() => {
            Some(Builtin::SetConditional)
        }
        "malloc" if sizes == [8] && rets == [8] => Some(Builtin::Malloc),
        "__nv_aligned_device_malloc" | "__cuda_syscall_aligned_malloc"
            if sizes == [8, 8] && rets == [8] =>
        {
            Some(Builtin::AlignedMalloc)
        }
        "free" if sizes == [8] && sig.rets.is_empty() => Some(Builtin::Free),
        "cnpGetParameterBufferV2"
        | "__cuda_syscall_cnpv2GetParameterBufferV2"
        | "__cudaCDP2GetParameterBufferV2"
        | "cudaGetParameterBufferV2"
            if sizes == [8, 12, 12, 4] && rets == [8] =>
        {
            Some(Builtin::GetParameterBuffer)
        }
        "cnpLaunchDeviceV2" | "__cuda_syscall_cnpv2LaunchDeviceV2"
            if sizes == [8, 8] && rets == [4] =>
        {
            Some(Builtin::LaunchDevice(ErrorCodes::Cnp))
        }
        "__cudaCDP2LaunchDeviceV2" | "cudaLaunchDeviceV2" if sizes == [8, 8] && rets == [4] => {
            Some(Builtin::LaunchDevice(ErrorCodes::Cuda))
        }
        "cnpGetLastError"
        | "__cuda_syscall_cnpv2GetLastError"
        | "__cudaCDP2GetLastError"
        | "cudaGetLastError"
            if sizes.is_empty() && rets == [4] =>
        {
            Some(Builtin::GetLastError)
        }
        "cnpPeekAtLastError"
        | "__cuda_syscall_cnpv2PeekAtLastError"
        | "__cudaCDP2PeekAtLastError"
        | "cudaPeekAtLastError"
            if sizes.is_empty() && rets == [4] =>
        {
            Some(Builtin::PeekAtLastError)
        }
        "cnpStreamCreate"
        | "cnpEventCreate"
        | "__cuda_syscall_cnpv2StreamCreate"
        | "__cuda_syscall_cnpv2EventCreate"
            if sizes == [8, 4] && rets == [4] =>
        {
            Some(Builtin::DeviceObjectCreate)
        }
        "cnpStreamDestroy"
        | "cnpEventDestroy"
        | "__cuda_syscall_cnpv2StreamDestroy"
        | "__cuda_syscall_cnpv2EventDestroy"
            if sizes == [8] && rets == [4] =>
        {
            Some(Builtin::DeviceObjectNop)
        }
        "cnpEventRecord" | "__cuda_syscall_cnpv2EventRecord" if sizes == [8, 8] && rets == [4] => {
            Some(Builtin::DeviceObjectNop)
        }
        "cnpStreamWaitEvent" | "__cuda_syscall_cnpv2StreamWaitEvent"
            if sizes == [8, 8, 4] && rets == [4] =>
        {
            Some(Builtin::DeviceObjectNop)
        }
        "cnpGetDevice" | "__cuda_syscall_cnpv2GetDevice" if sizes == [8] && rets == [4] => {
            Some(Builtin::GetDevice)
        }
        "cnpGetDeviceCount" | "__cuda_syscall_cnpv2GetDeviceCount"
            if sizes == [8] && rets == [4] =>
        {
            Some(Builtin::GetDeviceCount)
        }
        "cnpDeviceGetAttribute" | "__cuda_syscall_cnpv2DeviceGetAttribute"
            if sizes == [8, 4, 4] && rets == [4] =>
        {
            Some(Builtin::DeviceGetAttribute)
        }
        "cnpGetLimit" | "__cuda_syscall_cnpv2GetLimit" if sizes == [8, 4] && rets == [4] => {
            Some(Builtin::GetLimit)
        }
        "cnpGetCacheConfig" | "__cuda_syscall_cnpv2GetCacheConfig"
            if sizes == [8] && rets == [4] =>
        {
            Some(Builtin::GetCacheConfig)
        }
        "cnpGetSharedMemConfig" | "__cuda_syscall_cnpv2GetSharedMemConfig"
            if sizes == [8] && rets == [4] =>
        {
            Some(Builtin::GetSharedMemConfig)
        }
        "cnpFuncGetAttribute" | "__cuda_syscall_cnpv2FuncGetAttribute"
            if sizes == [8, 4, 8] && rets == [4] =>
        {
            Some(Builtin::FuncGetAttribute)
        }
        "__cuda_syscall_cnpMaxActiveBlocksPerMultiprocessor"
        | "__cuda_syscall_cnpv2MaxActiveBlocksPerMultiprocessor"
            if sizes == [8, 8, 4, 8] && rets == [4] =>
        {
            Some(Builtin::MaxActiveBlocks)
        }
        "__cuda_syscall_cnpMaxActiveBlocksPerMultiprocessorWithFlags"
        | "__cuda_syscall_cnpv2MaxActiveBlocksPerMultiprocessorWithFlags"
            if sizes == [8, 8, 4, 8, 4] && rets == [4] =>
        {
            Some(Builtin::MaxActiveBlocks)
        }
        // CUDA 11's `libcudadevrt` has no PTX of it (its PTX is for sm_90, where the call is
        // gone): a program's own PTX calls it undefined.
        "cudaDeviceSynchronize" if sizes.is_empty() && rets == [4] => {
            Some(Builtin::DeviceSynchronize)
        }
        "cnpSetLastError" | "__cuda_syscall_cnpv2SetLastError"
            if sizes == [4] && rets.len() <= 1 =>
        {
            Some(Builtin::SetLastError)
        }
        _ => None,
    }
}

pub(super) fn add_module_var(m: &mut ModuleCtx, v: &VarDecl) -> Result<(), LoadError> {
    if m.names.contains_key(&v.name) {
        return Err(LoadError::invalid(
            v.line,
            format!("`{}` is already defined", v.name),
        ));
    }
    if let Some(kind) = reference_kind(v)? {
        let idx = m.globals.len() as u32;
        m.globals.push(GlobalVar {
            name: v.name.clone(),
            space: GlobalSpace::Global,
            size: ReferenceKind::HANDLE_BYTES,
            align: ReferenceKind::HANDLE_BYTES,
            init: Vec::new(),
            managed: false,
            reference: Some(kind),
            relocs: Vec::new(),
        });
        m.names.insert(v.name.clone(), Name::Global(idx));
        return Ok(());
    }
    match v.space {
        VarSpace::Global | VarSpace::Const => {
            if v.is_extern {
                return Err(LoadError::unsupported(
                    v.line,
                    format!("external variable `{}` (no linker)", v.name),
                ));
            }
            let (size, init, relocs) = global_image(v)?;
            let idx = m.globals.len() as u32;
            queue_relocs(m, idx, relocs, v.line);
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
                reference: None,
                relocs: Vec::new(),
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

pub(super) fn new_shared(m: &mut ModuleCtx, v: &VarDecl) -> Result<u32, LoadError> {
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

pub(super) fn kernel_info(
    m: &ModuleCtx,
    funcs: &[Func],
    f: &FuncDecl,
    id: u32,
) -> Result<(KernelInfo, KernelLayout), LoadError> {
    // Reachable functions and recursion.
    let targets = &m.indirect_targets[..];
    let mut reach = vec![false; funcs.len() + 1];
    let mut stack = vec![id];
    while let Some(x) = stack.pop() {
        if std::mem::replace(&mut reach[x as usize], true) {
            continue;
        }
        stack.extend(callees(funcs, targets, x).iter().copied());
    }
    reach.truncate(funcs.len());
    let recursive = has_cycle(funcs, targets, id);
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
        max_chain_local(funcs, targets, id, &mut HashMap::new())
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
    // What the kernel reports as its registers: those its frame holds live at once (the
    // packed count, see `regalloc`; NVVM declares a register per value), within `.maxnreg`
    // and within what its launch bounds leave, as ptxas fits a kernel's registers so that a
    // block of `.maxntid` threads (`.minnctapersm` blocks) fits a multiprocessor. Occupancy
    // queries (CUB sizes its grids by them) depend on it.
    let bound = (max_threads < MAX_THREADS_PER_BLOCK).then(|| {
        let threads = max_threads.div_ceil(WARP_THREADS) * WARP_THREADS;
        let blocks = min_blocks
            .and_then(|b| u32::try_from(b).ok())
            .filter(|&b| b > 0)
            .unwrap_or(1);
        let per_thread = REGISTERS_PER_MULTIPROCESSOR / threads.saturating_mul(blocks).max(1);
        (per_thread / REGISTER_GRANULE * REGISTER_GRANULE).max(REGISTER_GRANULE)
    });
    let func = &funcs[id as usize];
    let num_regs = func
        .declared_regs
        .min(func.nregs)
        .min(max_regs)
        .min(bound.unwrap_or(u32::MAX));
    let info = KernelInfo {
        name: f.name.clone(),
        params: sig.kparams.clone(),
        param_bytes: sig.param_bytes as usize,
        static_shared_bytes: static_shared as usize,
        local_bytes: funcs[id as usize].local_bytes as usize,
        max_threads_per_block: max_threads,
        reqntid,
        num_regs,
    };
    let layout = KernelLayout {
        func: id,
        shared_off,
        dyn_shared_base: dyn_base,
        local_per_thread,
    };
    Ok((info, layout))
}

/// The callees of node `x` of the call graph: function `x`'s, or, for the node past the
/// functions, `targets`, the functions an indirect call may reach.
fn callees<'f>(funcs: &'f [Func], targets: &'f [u32], x: u32) -> &'f [u32] {
    funcs.get(x as usize).map_or(targets, |f| &f.callees)
}

pub(super) fn has_cycle(funcs: &[Func], targets: &[u32], root: u32) -> bool {
    // Iterative DFS with colours: 0 white, 1 grey, 2 black.
    let mut colour = vec![0u8; funcs.len() + 1];
    let mut stack: Vec<(u32, usize)> = vec![(root, 0)];
    colour[root as usize] = 1;
    while let Some(&mut (node, ref mut i)) = stack.last_mut() {
        let callees = callees(funcs, targets, node);
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

pub(super) fn max_chain_local(
    funcs: &[Func],
    targets: &[u32],
    f: u32,
    memo: &mut HashMap<u32, u64>,
) -> u64 {
    // Only called for acyclic call graphs, so the recursion depth is bounded by the number of
    // functions; hostile modules with thousands of nested functions are still finite.
    if let Some(&v) = memo.get(&f) {
        return v;
    }
    let own = funcs.get(f as usize).map_or(0, |f| f.local_bytes);
    let mut best = 0u64;
    for &c in callees(funcs, targets, f) {
        best = best.max(max_chain_local(funcs, targets, c, memo));
    }
    let v = own.saturating_add(best);
    memo.insert(f, v);
    v
}
