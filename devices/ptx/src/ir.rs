//! The pre-decoded ("compiled") instruction form the interpreter executes.
//!
//! Every value operand is a register index: immediates and symbol addresses become hidden
//! registers that are initialised when a frame is set up, so the executor never looks at operand
//! kinds. Predicates live in their own file as one 32-bit lane mask per predicate register.

/// Register index in a frame's register file (one 32-lane row of `u64`).
pub(crate) type Reg = u32;
/// Predicate register index in a frame's predicate file (one lane mask).
pub(crate) type Pred = u32;
/// "No register" / "no predicate".
pub(crate) const NONE: u32 = u32::MAX;

/// PTX fundamental types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    U8,
    U16,
    U32,
    U64,
    S8,
    S16,
    S32,
    S64,
    B8,
    B16,
    B32,
    B64,
    B128,
    F16,
    F16x2,
    Bf16,
    Bf16x2,
    F32,
    F64,
    Pred,
}

impl Ty {
    pub(crate) fn parse(s: &str) -> Option<Ty> {
        Some(match s {
            "u8" => Ty::U8,
            "u16" => Ty::U16,
            "u32" => Ty::U32,
            "u64" => Ty::U64,
            "s8" => Ty::S8,
            "s16" => Ty::S16,
            "s32" => Ty::S32,
            "s64" => Ty::S64,
            "b8" => Ty::B8,
            "b16" => Ty::B16,
            "b32" => Ty::B32,
            "b64" => Ty::B64,
            "b128" => Ty::B128,
            "f16" => Ty::F16,
            "f16x2" => Ty::F16x2,
            "bf16" => Ty::Bf16,
            "bf16x2" => Ty::Bf16x2,
            "f32" => Ty::F32,
            "f64" => Ty::F64,
            "pred" => Ty::Pred,
            _ => return None,
        })
    }

    /// Size in bytes (predicates count as 1).
    pub(crate) fn bytes(self) -> usize {
        match self {
            Ty::U8 | Ty::S8 | Ty::B8 | Ty::Pred => 1,
            Ty::U16 | Ty::S16 | Ty::B16 | Ty::F16 | Ty::Bf16 => 2,
            Ty::U32 | Ty::S32 | Ty::B32 | Ty::F32 | Ty::F16x2 | Ty::Bf16x2 => 4,
            Ty::U64 | Ty::S64 | Ty::B64 | Ty::F64 => 8,
            Ty::B128 => 16,
        }
    }

    pub(crate) fn bits(self) -> u32 {
        (self.bytes() * 8) as u32
    }

    pub(crate) fn is_signed(self) -> bool {
        matches!(self, Ty::S8 | Ty::S16 | Ty::S32 | Ty::S64)
    }

    pub(crate) fn is_float(self) -> bool {
        matches!(
            self,
            Ty::F16 | Ty::F16x2 | Ty::Bf16 | Ty::Bf16x2 | Ty::F32 | Ty::F64
        )
    }

    pub(crate) fn is_int(self) -> bool {
        !self.is_float() && self != Ty::Pred && self != Ty::B128
    }
}

/// Memory state spaces as instructions see them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Space {
    Global,
    Const,
    Shared,
    Local,
    /// Kernel parameters addressed through a register.
    Param,
    Generic,
}

/// Rounding / conversion modifiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rnd {
    /// No modifier (round to nearest for arithmetic; exact or nearest for conversions).
    Default,
    Rn,
    Rz,
    Rm,
    Rp,
    Rna,
    Rni,
    Rzi,
    Rmi,
    Rpi,
}

/// Memory-ordering strength of a load or store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemOrd {
    Relaxed,
    Acquire,
    Release,
}

/// Integer binary operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IBin {
    Add,
    Sub,
    AddSat,
    SubSat,
    MulLo,
    MulHi,
    /// Result type is twice the operand type.
    MulWide,
    Mul24Lo,
    Mul24Hi,
    Div,
    Rem,
    Min,
    Max,
    And,
    Or,
    Xor,
    Shl,
    Shr,
    /// add.cc / addc / addc.cc / sub.cc / subc / subc.cc: (sub, use carry-in, write carry-out).
    AddCarry {
        sub: bool,
        cin: bool,
        cout: bool,
    },
    /// bmsk.clamp / bmsk.wrap.
    Bmsk {
        clamp: bool,
    },
}

/// Integer unary operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IUn {
    Abs,
    Neg,
    Not,
    Cnot,
    Popc,
    Clz,
    Brev,
    Bfind { shiftamt: bool },
}

/// Integer three-source operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ITern {
    MadLo,
    MadHi,
    MadWide,
    MadLoSat,
    Mad24Lo,
    Mad24Hi,
    /// mad.lo.cc / madc.lo / madc.hi ... (hi, carry-in, carry-out).
    MadCarry {
        hi: bool,
        cin: bool,
        cout: bool,
    },
    Sad,
    Bfe,
    /// dp4a.atype.btype (signed a, signed b).
    Dp4a {
        sa: bool,
        sb: bool,
    },
    Dp2a {
        sa: bool,
        sb: bool,
        hi: bool,
    },
    /// szext.mode (sign-extend?, clamp?).
    Szext {
        signed: bool,
        clamp: bool,
    },
    /// A video instruction (`vadd`, `vabsdiff4`, …).
    Video(crate::video::Video),
}

/// Float binary operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FBin {
    Add,
    Sub,
    Mul,
    Div,
    Min,
    Max,
    MinNaN,
    MaxNaN,
    /// copysign d, a, b: magnitude of b, sign of a.
    Copysign,
}

/// Float unary operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FUn {
    Abs,
    Neg,
    Sqrt,
    Rsqrt,
    Rcp,
    Sin,
    Cos,
    Lg2,
    Ex2,
    Tanh,
}

/// Comparison operators of setp/set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Lo,
    Ls,
    Hi,
    Hs,
    Equ,
    Neu,
    Ltu,
    Leu,
    Gtu,
    Geu,
    Num,
    Nan,
}

/// Boolean combining operators (setp's `.and/.or/.xor`, predicate logic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BoolOp {
    And,
    Or,
    Xor,
}

/// testp properties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TestP {
    Finite,
    Infinite,
    Number,
    NotANumber,
    Normal,
    Subnormal,
}

/// Atomic operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtomOp {
    Add,
    Min,
    Max,
    And,
    Or,
    Xor,
    Exch,
    Cas,
    Inc,
    Dec,
}

/// Shuffle modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShflMode {
    Up,
    Down,
    Bfly,
    Idx,
}

/// Vote modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VoteMode {
    All,
    Any,
    Uni,
    Ballot,
}

/// Barrier flavours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BarKind {
    Sync,
    Arrive,
    RedPopc,
    RedAnd,
    RedOr,
}

/// redux.sync operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReduxOp {
    Add,
    Min,
    Max,
    And,
    Or,
    Xor,
}

/// Special registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sreg {
    Tid(u8),
    Ntid(u8),
    Ctaid(u8),
    Nctaid(u8),
    LaneId,
    WarpId,
    NWarpId,
    SmId,
    NSmId,
    GridId,
    Clock,
    Clock64,
    GlobalTimer,
    GlobalTimerLo,
    GlobalTimerHi,
    LanemaskEq,
    LanemaskLe,
    LanemaskLt,
    LanemaskGe,
    LanemaskGt,
    DynamicSmemSize,
    TotalSmemSize,
    /// Cluster registers of a launch without clusters: ctaid within cluster etc.
    ClusterCtaId(u8),
    ClusterNCtaId(u8),
    ClusterCtaRank,
    ClusterNCtaRank,
    ClusterId(u8),
    NClusterId(u8),
    IsExplicitCluster,
    /// `%envreg<N>`: driver-defined; a cooperative launch's grid workspace is in 1 (high
    /// half) and 2 (low half), where cooperative groups' `grid.sync()` finds it.
    EnvReg(u8),
}

/// A function call: which function, and how parameter bytes move.
#[derive(Debug, Clone)]
pub(crate) struct CallInfo {
    pub func: u32,
    /// (caller param-area offset, callee param-area offset, size) per argument.
    pub args: Vec<(u32, u32, u32)>,
    /// (callee param-area offset, caller param-area offset, size) per return value.
    pub rets: Vec<(u32, u32, u32)>,
}

/// A call through a function's address ([`Op::CallIndirect`]): where the arguments and results
/// go, laid out by the call's prototype, which the target's signature must match.
#[derive(Debug, Clone)]
pub(crate) struct IndirectCall {
    /// The register holding the target's address.
    pub target: Reg,
    /// (caller param-area offset, callee param-area offset, size) per argument.
    pub args: Vec<(u32, u32, u32)>,
    /// (callee param-area offset, caller param-area offset, size) per return value.
    pub rets: Vec<(u32, u32, u32)>,
    /// The prototype's parameters and return values: (offset, size) each, as a function of that
    /// signature lays them out.
    pub formals: Vec<(u32, u32)>,
    pub ret_layout: Vec<(u32, u32)>,
}

/// A function the interpreter provides itself (CUDA's device runtime calls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Builtin {
    /// `vprintf(fmt, args)`: device-side `printf`.
    Vprintf,
    /// `__assertfail(message, file, line, function, charSize)`: a failed device `assert`.
    AssertFail,
    /// `cudaGraphSetConditional(handle, value)`: sets a conditional handle of the graph launch
    /// the kernel runs in.
    SetConditional,
    /// `malloc(size)`: device heap memory, 16-byte aligned, or `NULL`.
    Malloc,
    /// `__nv_aligned_device_malloc(size, align)`: `malloc` at a multiple of `align`.
    AlignedMalloc,
    /// `free(ptr)`: gives back what `malloc` returned (`NULL`: nothing).
    Free,
    /// `cnpGetParameterBufferV2(kernel, grid, block, shared)` (CUDA 11's `libcudadevrt`) or
    /// `__cudaCDP2GetParameterBufferV2` (what CUDA 12 compiles a device launch to): a
    /// parameter buffer for a device launch (dynamic parallelism).
    GetParameterBuffer,
    /// `cnpLaunchDeviceV2(buffer, stream)` or `__cudaCDP2LaunchDeviceV2`: launches the grid a
    /// parameter buffer was made for.
    LaunchDevice(ErrorCodes),
    /// `cnpGetLastError()` or `__cudaCDP2GetLastError()`: the device runtime's last error
    /// (a `cudaError_t` either way), reset.
    GetLastError,
    /// `cnpPeekAtLastError()` or `__cudaCDP2PeekAtLastError()`: the last error, kept.
    PeekAtLastError,
    /// `cnpSetLastError(error)`.
    SetLastError,
    /// `cnpStreamCreate(&stream, flags)`, `cnpEventCreate(&event, flags)`: device-side streams
    /// and events, a handle written where the first argument points.
    DeviceObjectCreate,
    /// `cnpGetDevice(&device)`: 0, the VM's one device.
    GetDevice,
    /// `cnpGetDeviceCount(&count)`: 1.
    GetDeviceCount,
    /// `cnpDeviceGetAttribute(&value, attribute, device)`: the device's attribute as the VM
    /// sees it ([`crate::LaunchControl::set_device_attributes`]).
    DeviceGetAttribute,
    /// `cnpGetLimit(&value, limit)`: the context's limit (`cudaDeviceGetLimit` in a kernel).
    GetLimit,
    /// `cnpGetCacheConfig(&config)`, `cnpGetSharedMemConfig(&config)`: the context's, which
    /// are CUDA's defaults (no preference; four-byte banks).
    GetCacheConfig,
    /// See [`Builtin::GetCacheConfig`].
    GetSharedMemConfig,
    /// `cnpFuncGetAttribute(&value, attribute, kernel)`: a kernel's attribute
    /// (`cudaFuncGetAttributes` in a kernel).
    FuncGetAttribute,
    /// `__cuda_syscall_cnpMaxActiveBlocksPerMultiprocessor(&blocks, kernel, block_size,
    /// dynamic_shared[, flags])`: occupancy, as the host's.
    MaxActiveBlocks,
    /// `cudaDeviceSynchronize()` in device code (CUDA 11, deprecated; removed in CUDA 12): the
    /// grids the calling block launched so far run to completion before the call returns.
    DeviceSynchronize,
    /// `cnpStreamDestroy`, `cnpEventDestroy`, `cnpEventRecord`, `cnpStreamWaitEvent`: nothing
    /// to do, since a launch's children run one after the other in launch order, which every
    /// stream and event order allows.
    DeviceObjectNop,
}

impl Builtin {
    /// A device runtime query that writes one answer where its first argument points
    /// (`cudaGetDevice`, `cudaDeviceGetAttribute`, `cudaDeviceGetLimit`, `cudaFuncGetAttributes`,
    /// occupancy, …).
    pub(crate) fn is_query(self) -> bool {
        matches!(
            self,
            Builtin::GetDevice
                | Builtin::GetDeviceCount
                | Builtin::DeviceGetAttribute
                | Builtin::GetLimit
                | Builtin::GetCacheConfig
                | Builtin::GetSharedMemConfig
                | Builtin::FuncGetAttribute
                | Builtin::MaxActiveBlocks
        )
    }
}

/// Which codes a device-runtime builtin answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorCodes {
    /// The device runtime's `CNPerror`, which CUDA 11's `libcudadevrt` translates.
    Cnp,
    /// `cudaError_t` (CUDA 12's `__cudaCDP2*` calls).
    Cuda,
}

/// A call of a [`Builtin`].
#[derive(Debug, Clone)]
pub(crate) struct BuiltinCall {
    pub kind: Builtin,
    /// (caller param-area offset, size) per argument.
    pub args: Vec<(u32, u32)>,
    /// (caller param-area offset, size) of the return value.
    pub ret: Option<(u32, u32)>,
}

/// Geometry of a texture or surface instruction (`.1d`, `.2d`, `.3d`, `.a1d`, `.a2d`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Geom {
    D1,
    D2,
    D3,
    A1,
    A2,
    /// `.cube`: a direction (x, y, z) picks a face of a cube map and a texel on it.
    Cube,
    /// `.acube`: a layer of cube maps, then a direction.
    ACube,
}

impl Geom {
    pub(crate) fn parse(s: &str) -> Option<Geom> {
        Some(match s {
            "1d" => Geom::D1,
            "2d" => Geom::D2,
            "3d" => Geom::D3,
            "a1d" => Geom::A1,
            "a2d" => Geom::A2,
            "cube" => Geom::Cube,
            "acube" => Geom::ACube,
            _ => return None,
        })
    }

    /// Coordinates besides the layer.
    pub(crate) fn axes(self) -> usize {
        match self {
            Geom::D1 | Geom::A1 => 1,
            Geom::D2 | Geom::A2 => 2,
            Geom::D3 | Geom::Cube | Geom::ACube => 3,
        }
    }

    /// Whether the first coordinate is a layer index.
    pub(crate) fn layered(self) -> bool {
        matches!(self, Geom::A1 | Geom::A2 | Geom::ACube)
    }

    /// Whether the coordinates are a direction into a cube map.
    pub(crate) fn cube(self) -> bool {
        matches!(self, Geom::Cube | Geom::ACube)
    }
}

/// `tex` or `tld4`.
#[derive(Debug, Clone)]
pub(crate) struct TexOp {
    /// `tld4`'s component (0 to 3: r, g, b, a); `None` for `tex`.
    pub gather: Option<u8>,
    /// Results are `.s32` (sign-extended into the registers).
    pub signed: bool,
    /// `.s32` coordinates (texel indices) instead of `.f32`.
    pub int_coords: bool,
    pub d: [Reg; 4],
    pub handle: Reg,
    /// x, y, z (`NONE` past the geometry's axes: 0).
    pub c: [Reg; 3],
    /// The layer (`NONE` when not layered).
    pub layer: Reg,
    /// The mipmap level a fetch reads.
    pub lod: TexLod,
    /// `.cube` or `.acube`: the coordinates are a direction into a cube map (or a layer of
    /// them), whose six faces are the texture's layers.
    pub cube: bool,
}

/// The mipmap level of a `tex` fetch.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TexLod {
    /// Level 0 (`tex`, `tex.base`, `tld4`).
    Base,
    /// `tex.level`: the level of detail in a register.
    Level(Reg),
    /// `tex.grad`: the coordinates' gradients along x and along y (`NONE` past the
    /// geometry's axes).
    Grad([Reg; 3], [Reg; 3]),
}

/// The element type of a warp matrix (`wmma`) fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MmaTy {
    F16,
    Bf16,
    /// TF32: an `f32` of which the tensor cores read 10 mantissa bits.
    Tf32,
    F32,
    F64,
    S8,
    U8,
    S32,
}

impl MmaTy {
    pub(crate) fn parse(s: &str) -> Option<MmaTy> {
        Some(match s {
            "f16" => MmaTy::F16,
            "bf16" => MmaTy::Bf16,
            "tf32" => MmaTy::Tf32,
            "f32" => MmaTy::F32,
            "f64" => MmaTy::F64,
            "s8" => MmaTy::S8,
            "u8" => MmaTy::U8,
            "s32" => MmaTy::S32,
            _ => return None,
        })
    }

    /// Bits of one element.
    pub(crate) fn bits(self) -> u32 {
        match self {
            MmaTy::S8 | MmaTy::U8 => 8,
            MmaTy::F16 | MmaTy::Bf16 => 16,
            MmaTy::Tf32 | MmaTy::F32 | MmaTy::S32 => 32,
            MmaTy::F64 => 64,
        }
    }

    /// Elements one fragment register holds (`.b32` registers; `.f64` ones for `F64`).
    pub(crate) fn per_reg(self) -> usize {
        let reg_bits = if self == MmaTy::F64 { 64 } else { 32 };
        (reg_bits / self.bits()) as usize
    }
}

/// Which matrix a warp matrix fragment holds: `a` (m x k), `b` (k x n), or an accumulator
/// `c`/`d` (m x n).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MmaFrag {
    A,
    B,
    C,
}

/// A `wmma` shape `.mMnNkK`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MmaShape {
    pub m: u8,
    pub n: u8,
    pub k: u8,
}

impl MmaShape {
    /// Rows and columns of fragment `f`'s matrix.
    pub(crate) fn dims(self, f: MmaFrag) -> (usize, usize) {
        let (m, n, k) = (
            usize::from(self.m),
            usize::from(self.n),
            usize::from(self.k),
        );
        match f {
            MmaFrag::A => (m, k),
            MmaFrag::B => (k, n),
            MmaFrag::C => (m, n),
        }
    }
}

/// `wmma.load` or `wmma.store`: a warp's fragment and a matrix in memory.
#[derive(Debug, Clone)]
pub(crate) struct WmmaMem {
    pub frag: MmaFrag,
    /// The matrix is column-major in memory (`.col`).
    pub col: bool,
    pub shape: MmaShape,
    pub ty: MmaTy,
    pub space: Space,
    /// The fragment's registers (destinations of a load, sources of a store).
    pub regs: Vec<Reg>,
    pub base: Reg,
    pub off: i64,
    /// Elements from one row (`.row`) or column (`.col`) to the next; `NONE`: the matrix's
    /// columns (rows).
    pub stride: Reg,
}

/// `wmma.mma` or `mma.sync`: D = A x B + C over a warp's fragments (laid out as the
/// interpreter chooses for `wmma`, as the PTX ISA specifies for `mma.sync`).
#[derive(Debug, Clone)]
pub(crate) struct Mma {
    pub shape: MmaShape,
    pub a: MmaTy,
    /// B's element type: A's, except that `mma.sync`'s `.s8` and `.u8` mix.
    pub b: MmaTy,
    pub c: MmaTy,
    pub d: MmaTy,
    /// `.satfinite`: integer results saturate instead of wrapping.
    pub satfinite: bool,
    pub regs_d: Vec<Reg>,
    pub regs_a: Vec<Reg>,
    pub regs_b: Vec<Reg>,
    pub regs_c: Vec<Reg>,
}

/// `ldmatrix` or `stmatrix` (`.m8n8`, `.b16`): up to four 8x8 matrices of 16-bit elements
/// whose rows are at addresses the lanes give (lane `8 * j + i`: row `i` of matrix `j`),
/// register `j` of lane `4 * r + c` holding columns `2c` and `2c + 1` of row `r` of matrix `j`.
#[derive(Debug, Clone)]
pub(crate) struct MatrixMem {
    /// `.trans`: the matrices are transposed between registers and memory.
    pub trans: bool,
    pub space: Space,
    /// One register per matrix (destinations of `ldmatrix`, sources of `stmatrix`).
    pub regs: Vec<Reg>,
    pub base: Reg,
    pub off: i64,
}

/// An FP8 conversion (`cvt` with `.e4m3x2` or `.e5m2x2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fp8Cvt {
    /// `cvt.rn.satfinite{.relu}.{e4m3x2,e5m2x2}.f32 d, a, b`: `a` to the upper byte.
    FromF32,
    /// `cvt.rn.satfinite{.relu}.{e4m3x2,e5m2x2}.f16x2 d, a`.
    FromF16x2,
    /// `cvt.rn{.relu}.f16x2.{e4m3x2,e5m2x2} d, a`.
    ToF16x2,
}

/// What an `mbarrier` instruction does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MbarKind {
    /// `mbarrier.init [a], count`.
    Init,
    /// `mbarrier.inval [a]`.
    Inval,
    /// `mbarrier.arrive state, [a]{, count}`; `drop`: `arrive_drop`, which also lowers the
    /// arrivals the next phases expect.
    Arrive { drop: bool },
    /// `mbarrier.test_wait` and `try_wait`: whether the phase named by a state (or, with
    /// `.parity`, by its parity) has completed.
    TestWait { parity: bool },
    /// `mbarrier.pending_count count, state`.
    PendingCount,
}

/// An `mbarrier` instruction on the 8-byte barrier object at `[base + off]`.
#[derive(Debug, Clone)]
pub(crate) struct Mbarrier {
    pub kind: MbarKind,
    pub space: Space,
    pub base: Reg,
    pub off: i64,
    /// The state (`arrive`) or count (`pending_count`) written; `NONE` for the others.
    pub d: Reg,
    /// The completion predicate of `test_wait` and `try_wait`; `NONE` for the others.
    pub p: Pred,
    /// The count (`init`, `arrive`; `NONE`: 1), state or parity (`test_wait`), state
    /// (`pending_count`).
    pub a: Reg,
}

/// `suld.b` or `sust.b`.
#[derive(Debug, Clone)]
pub(crate) struct SurfOp {
    /// Bytes of each vector element (1, 2, 4 or 8).
    pub bytes: u8,
    /// Vector elements (1, 2 or 4).
    pub n: u8,
    pub clamp: crate::texture::SurfaceClamp,
    /// Destinations (`suld`) or sources (`sust`).
    pub v: [Reg; 4],
    pub handle: Reg,
    /// x (in bytes), y, z (`NONE` past the geometry's axes: 0).
    pub c: [Reg; 3],
    /// The layer (`NONE` when not layered).
    pub layer: Reg,
}

/// What `txq` or `suq` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResQuery {
    Width,
    Height,
    Depth,
    ArraySize,
    NormalizedCoords,
    FilterMode,
    AddrMode(u8),
    /// `txq.num_mipmap_levels`: 1 for a texture that is not mipmapped.
    MipmapLevels,
}

/// One decoded operation.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Nop,
    Mov {
        d: Reg,
        a: Reg,
    },
    Special {
        d: Reg,
        s: Sreg,
    },
    /// mov.bN d, {parts...}: packs `n` parts of `bits` each (lowest first).
    Pack {
        d: Reg,
        parts: [Reg; 4],
        n: u8,
        bits: u8,
    },
    /// mov.bN {parts...}, a.
    Unpack {
        a: Reg,
        parts: [Reg; 4],
        n: u8,
        bits: u8,
    },
    Ld {
        space: Space,
        bytes: u8,
        sext: bool,
        n: u8,
        d: [Reg; 4],
        base: Reg,
        off: i64,
        ord: MemOrd,
    },
    St {
        space: Space,
        bytes: u8,
        n: u8,
        s: [Reg; 4],
        base: Reg,
        off: i64,
        ord: MemOrd,
    },
    /// ld.param of a kernel parameter at a static offset (the same for every lane).
    LdKParam {
        bytes: u8,
        sext: bool,
        n: u8,
        d: [Reg; 4],
        off: u32,
    },
    /// ld.param / st.param on the frame's per-lane parameter area at a static offset.
    LdFParam {
        bytes: u8,
        sext: bool,
        n: u8,
        d: [Reg; 4],
        off: u32,
    },
    StFParam {
        bytes: u8,
        n: u8,
        s: [Reg; 4],
        off: u32,
    },
    Cvta {
        d: Reg,
        a: Reg,
        space: Space,
        to: bool,
        narrow: bool,
    },
    Isspacep {
        d: Pred,
        a: Reg,
        space: Space,
    },
    Cvt {
        d: Reg,
        a: Reg,
        dty: Ty,
        sty: Ty,
        rnd: Rnd,
        sat: bool,
        ftz: bool,
    },
    /// cvt.rn.f16x2.f32 / cvt.rn.bf16x2.f32 d, a (high half), b (low half).
    CvtPack {
        d: Reg,
        a: Reg,
        b: Reg,
        bf: bool,
        rnd: Rnd,
        relu: bool,
    },
    IBin {
        k: IBin,
        ty: Ty,
        d: Reg,
        a: Reg,
        b: Reg,
    },
    IUn {
        k: IUn,
        ty: Ty,
        d: Reg,
        a: Reg,
    },
    ITern {
        k: ITern,
        ty: Ty,
        d: Reg,
        a: Reg,
        b: Reg,
        c: Reg,
    },
    Bfi {
        ty: Ty,
        d: Reg,
        a: Reg,
        b: Reg,
        c: Reg,
        e: Reg,
    },
    Prmt {
        mode: u8,
        d: Reg,
        a: Reg,
        b: Reg,
        c: Reg,
    },
    Lop3 {
        d: Reg,
        a: Reg,
        b: Reg,
        c: Reg,
        lut: u8,
    },
    Shf {
        left: bool,
        clamp: bool,
        d: Reg,
        a: Reg,
        b: Reg,
        c: Reg,
    },
    FBin {
        k: FBin,
        ty: Ty,
        rnd: Rnd,
        ftz: bool,
        sat: bool,
        d: Reg,
        a: Reg,
        b: Reg,
    },
    FUn {
        k: FUn,
        ty: Ty,
        rnd: Rnd,
        ftz: bool,
        sat: bool,
        d: Reg,
        a: Reg,
    },
    Fma {
        ty: Ty,
        rnd: Rnd,
        ftz: bool,
        sat: bool,
        relu: bool,
        d: Reg,
        a: Reg,
        b: Reg,
        c: Reg,
    },
    Setp {
        cmp: Cmp,
        ty: Ty,
        ftz: bool,
        bop: Option<BoolOp>,
        c: Pred,
        cneg: bool,
        p: Pred,
        q: Pred,
        a: Reg,
        b: Reg,
    },
    Set {
        cmp: Cmp,
        ty: Ty,
        dty: Ty,
        ftz: bool,
        bop: Option<BoolOp>,
        c: Pred,
        cneg: bool,
        d: Reg,
        a: Reg,
        b: Reg,
    },
    Selp {
        d: Reg,
        a: Reg,
        b: Reg,
        p: Pred,
    },
    Slct {
        float: bool,
        ftz: bool,
        d: Reg,
        a: Reg,
        b: Reg,
        c: Reg,
    },
    /// Predicate logic: d = (a ^ an) op (b ^ bn).
    PLogic {
        op: BoolOp,
        d: Pred,
        a: Pred,
        an: bool,
        b: Pred,
        bn: bool,
    },
    PNot {
        d: Pred,
        a: Pred,
    },
    PMov {
        d: Pred,
        a: Pred,
    },
    /// Integer register to predicate (mov.pred from a non-predicate) / predicate to register.
    Testp {
        k: TestP,
        ty: Ty,
        d: Pred,
        a: Reg,
    },
    Bra {
        target: u32,
        rpc: u32,
    },
    Call(Box<CallInfo>),
    /// A call through a function's address (`call (rets), %r, (args), prototype;`).
    CallIndirect(Box<IndirectCall>),
    /// A call of a [`Builtin`] (`vprintf`, `__assertfail`, `cudaGraphSetConditional`),
    /// declared `.extern` and run by the interpreter.
    CallBuiltin(Box<BuiltinCall>),
    Ret,
    Exit,
    Trap,
    Bar {
        k: BarKind,
        id: Reg,
        count: Reg,
        p: Pred,
        pneg: bool,
        d: u32,
    },
    Fence,
    Atom {
        space: Space,
        op: AtomOp,
        ty: Ty,
        d: Reg,
        base: Reg,
        off: i64,
        b: Reg,
        c: Reg,
    },
    Shfl {
        mode: ShflMode,
        d: Reg,
        p: Pred,
        a: Reg,
        b: Reg,
        c: Reg,
        mask: Reg,
    },
    Vote {
        mode: VoteMode,
        d: u32,
        a: Pred,
        aneg: bool,
        mask: Reg,
    },
    Activemask {
        d: Reg,
    },
    Redux {
        op: ReduxOp,
        signed: bool,
        d: Reg,
        a: Reg,
        mask: Reg,
    },
    Match {
        all: bool,
        wide: bool,
        d: Reg,
        p: Pred,
        a: Reg,
        mask: Reg,
    },
    Elect {
        d: Reg,
        p: Pred,
        mask: Reg,
    },
    /// cp.async: a synchronous copy of `size` bytes (zero-filled past `src_size` when given).
    CpAsync {
        dbase: Reg,
        doff: i64,
        sbase: Reg,
        soff: i64,
        size: u8,
        src_size: Reg,
    },
    Fns {
        d: Reg,
        mask: Reg,
        base: Reg,
        off: Reg,
    },
    Tex(Box<TexOp>),
    /// `wmma.load.{a,b,c}`.
    WmmaLoad(Box<WmmaMem>),
    /// `wmma.store.d`.
    WmmaStore(Box<WmmaMem>),
    /// `wmma.mma`.
    WmmaMma(Box<Mma>),
    /// `mma.sync`.
    MmaSync(Box<Mma>),
    /// `ldmatrix`.
    LdMatrix(Box<MatrixMem>),
    /// `stmatrix`.
    StMatrix(Box<MatrixMem>),
    /// An FP8 conversion of two values; `b` is `NONE` but for `Fp8Cvt::FromF32`.
    CvtFp8 {
        kind: Fp8Cvt,
        format: crate::float::Fp8,
        relu: bool,
        d: Reg,
        a: Reg,
        b: Reg,
    },
    /// `mbarrier.*` and `cp.async.mbarrier.arrive.noinc`.
    Mbarrier(Box<Mbarrier>),
    /// `nanosleep`: the warp lets the block's other warps run first (a spin loop that backs
    /// off with it waits on them).
    Yield,
    /// `movmatrix.sync.aligned.m8n8.trans.b16`: the transpose of an 8x8 matrix of 16-bit
    /// elements held as `ldmatrix` leaves one.
    MovMatrix {
        d: Reg,
        a: Reg,
    },
    /// `cvt.rna.tf32.f32`: an `f32` rounded to the 10 mantissa bits of TF32, ties away from zero.
    CvtTf32 {
        d: Reg,
        a: Reg,
    },
    Suld(Box<SurfOp>),
    Sust(Box<SurfOp>),
    /// `txq` (`surface` false) or `suq`.
    Txq {
        q: ResQuery,
        surface: bool,
        d: Reg,
        handle: Reg,
    },
}

/// An instruction: operation, guard predicate and PTX line.
#[derive(Debug, Clone)]
pub(crate) struct Inst {
    pub op: Op,
    /// Guard predicate (`NONE` for unguarded).
    pub guard: Pred,
    pub guard_neg: bool,
    pub line: u32,
}
