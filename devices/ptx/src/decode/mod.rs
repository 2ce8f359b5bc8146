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
use crate::texture::ReferenceKind;
use crate::watch::Ticker;
use crate::{FUNCTION_WINDOW, GlobalSpace, GlobalVar, KernelInfo, ParamInfo, Reloc, RelocTarget};

/// Threads per block CUDA allows.
pub(crate) const MAX_THREADS_PER_BLOCK: u32 = 1024;
/// Threads of a warp, the unit blocks take registers in.
const WARP_THREADS: u32 = 32;
/// 32-bit registers of a multiprocessor (every architecture since sm_30).
const REGISTERS_PER_MULTIPROCESSOR: u32 = 65536;
/// Per-thread register counts ptxas allocates in.
const REGISTER_GRANULE: u32 = 8;
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
    /// The register unused results are written to.
    pub sink: Reg,
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
    /// A kernel (`.entry`).
    pub is_entry: bool,
    /// Its parameters' and return values' (offset, size) in its param area, as callers lay
    /// them out (an indirect call checks its prototype against them).
    pub formals: Vec<(u32, u32)>,
    pub rets: Vec<(u32, u32)>,
    /// Whether it calls through function addresses (its callees then include every function
    /// whose address the module takes).
    pub indirect: bool,
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
    /// Whether it declares the device heap's calls (`malloc`, `free`, and dynamic
    /// parallelism's parameter buffers, which come from the heap).
    pub uses_heap: bool,
    /// Whether its kernels may launch kernels (dynamic parallelism).
    pub launches_kernels: bool,
    /// The index in `kernels` of each function that is a kernel, by function id (`u32::MAX` for
    /// the others): how a device-side launch finds the kernel its address names.
    pub kernel_of_func: Vec<u32>,
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
    /// Addresses in variables' initializers, resolved once every name is known: (variable,
    /// relocation with its target unresolved, the name, the line).
    pending_relocs: Vec<(u32, Reloc, String, usize)>,
    /// Functions whose address the module takes (`mov r, f`, initializers): what an indirect
    /// call may reach.
    address_taken: Vec<u32>,
    /// Of those, the defined functions other than kernels: what an indirect call may reach.
    indirect_targets: Vec<u32>,
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

mod arith;
mod bits;
mod control;
mod func;
mod memory;
mod mma;
mod mods;
mod module;
mod regalloc;
mod select;
mod texture;
mod video;
mod warp;

use func::*;
use mods::*;
pub(crate) use module::decode;
use module::*;

type DResult<T> = Result<T, LoadError>;

/// A declared register range (by prefix): `prefix0` … `prefix{count-1}` are
/// registers (or predicates) `base` … `base + count - 1`.
#[derive(Debug, Clone, Copy)]
struct RegRange {
    base: u32,
    count: u32,
    pred: bool,
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
    /// Guard of the instruction being decoded (`NONE` when unguarded).
    guard: (Pred, bool),
    /// Call prototypes (`name: .callprototype ...`): (return values, parameters), laid out.
    prototypes: HashMap<String, (ParamOffsets, ParamOffsets)>,
    /// Whether it makes indirect calls.
    indirect: bool,
}

/// (offset, size) of each parameter or return value in a param area.
type ParamOffsets = Vec<(u32, u32)>;

/// A resolved memory operand.
enum Addr {
    Reg(Reg, i64),
    KParam(u32),
    FParam(u32),
}
