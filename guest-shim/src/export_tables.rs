//! `cuGetExportTable`: the driver's private interface tables, which NVIDIA's
//! CUDA runtime (libcudart 11.8 to 13, static and shared) and the libraries
//! built on it fetch by UUID before their first call.
//!
//! The tables are undocumented. Each is an array of pointers; in most the
//! first entry holds the table's size in bytes. What every entry vgpu fills
//! does, and which protocol calls it makes, is listed in docs/runtime.md.
//! Entries vgpu leaves empty are never called by the runtimes we test; an
//! unknown UUID is answered with `CUDA_ERROR_NOT_FOUND` (logged with
//! `VGPU_LOG=debug`), which the runtime treats as an optional table missing.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_int, c_uint, c_void};

use vgpu_proto::cuda::{self, CuResult};

use crate::driver as drv;
use crate::exports::{CUdevice, CUhandle};
use crate::ffi::{CUresult, ffi};
use crate::{ctx_storage, integrity, out};

/// A table: pointer-sized entries the runtime reads directly.
#[repr(transparent)]
pub struct Table<const N: usize>([*const c_void; N]);

// SAFETY: the tables are immutable after compilation; they hold only function addresses and sizes.
unsafe impl<const N: usize> Sync for Table<N> {}

impl<const N: usize> Table<N> {
    /// The table's first entry: its size in bytes.
    const SIZE: *const c_void = size_word(N);

    fn start(&self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

/// The first entry of a table that declares `entries` entries: its size in bytes.
const fn size_word(entries: usize) -> *const c_void {
    std::ptr::without_provenance(entries * size_of::<usize>())
}

/// Entries every table has in memory. A library that reads past the size a table declares
/// (cuBLAS calls entries 39 and 51 of the CUDA 13 tools table, which declares 16) gets an
/// [`unknown_entry`] that refuses with a warning naming the table and the entry, not whatever
/// follows the table in memory: cuBLAS's reductions used to land in the module-tools table there.
const PADDED_ENTRIES: usize = 64;

/// A table of [`PADDED_ENTRIES`] in memory.
type Padded = Table<PADDED_ENTRIES>;

/// Table `T`'s `declared` entries (the size word first, where the table has one), followed in
/// memory by [`unknown_entry`]s up to [`PADDED_ENTRIES`].
const fn padded<const T: u8>(declared: &[*const c_void]) -> Padded {
    let mut t = [NULL; PADDED_ENTRIES];
    fill_unknown::<T>(&mut t);
    let mut i = 0;
    while i < declared.len() {
        t[i] = declared[i];
        i += 1;
    }
    Table(t)
}

/// Runtime interface: module registration from fat binaries, primary contexts.
pub const CUDART_INTERFACE: [u8; 16] = [
    0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9,
];
/// Tools thread-local storage (no entries used).
pub const TOOLS_TLS: [u8; 16] = [
    0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc,
];
/// Tools runtime callback hooks: two buffers the runtime writes to.
pub const TOOLS_RUNTIME_CALLBACK_HOOKS: [u8; 16] = [
    0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66,
];
/// Context-local storage (interface version 3.1).
pub const CONTEXT_LOCAL_STORAGE: [u8; 16] = [
    0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93,
];
/// Context creation that bypasses the tools' callbacks.
pub const CTX_CREATE_BYPASS: [u8; 16] = [
    0x0c, 0xa5, 0x0b, 0x8c, 0x10, 0x04, 0x92, 0x9a, 0x89, 0xa7, 0xd0, 0xdf, 0x10, 0xe7, 0x72, 0x86,
];
/// Driver heap access (not provided: returns `CUDA_ERROR_NOT_SUPPORTED`).
pub const HEAP_ACCESS: [u8; 16] = [
    0x19, 0x5b, 0xcb, 0xf4, 0xd6, 0x7d, 0x02, 0x4a, 0xac, 0xc5, 0x1d, 0x29, 0xce, 0xa6, 0x31, 0xae,
];
/// Extended device queries of the runtime.
pub const DEVICE_EXTENDED_RT: [u8; 16] = [
    0xb1, 0x05, 0x41, 0xe1, 0xf7, 0xc7, 0xc7, 0x4a, 0x9f, 0x64, 0xf2, 0x23, 0xbe, 0x99, 0xf1, 0xe2,
];
/// The CUDA ≥ 12 runtime's integrity check.
pub const INTEGRITY_CHECK: [u8; 16] = [
    0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2,
];
/// A table the CUDA 13 runtime requires at start (without it every runtime
/// call fails with `cudaErrorSymbolNotFound`); its public symbol names call it
/// the tools' context table. Entry 4 answers a context's number
/// ([`context_number`]: cuBLAS and cuFFT ask it). What the others do is not
/// known: none is called by the programs vgpu tests; each answers
/// `CUDA_ERROR_NOT_SUPPORTED` and logs a warning naming itself, so a program
/// that needs one says so.
pub const RUNTIME_13_REQUIRED: [u8; 16] = [
    0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2,
];
/// Module tools (`CU_ETID_ToolsModule` in NVIDIA's symbol names): cuFFT
/// walks the kernels of each module it loads through entry 7.
pub const TOOLS_MODULE: [u8; 16] = [
    0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d, 0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1, 0x99, 0x1e,
];
/// The profiling interface CUPTI (`libcupti`: PyTorch's profiler, Nsight) drives a GPU's
/// counters and activity records through. vgpu offers none: every entry answers
/// `CUDA_ERROR_NOT_SUPPORTED`. Without the table CUPTI's first call recursed until the stack
/// ran out (it formats its own error by asking for the table again).
pub const CUPTI: [u8; 16] = [
    0x7c, 0xb6, 0x3f, 0x9b, 0x9c, 0xa4, 0x8e, 0x42, 0xa4, 0x84, 0xbe, 0xb6, 0x6e, 0x6a, 0xed, 0x7f,
];
/// Context checks of the CUDA ≥ 12 runtime.
pub const CONTEXT_CHECKS: [u8; 16] = [
    0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e,
];

const NULL: *const c_void = std::ptr::null();

macro_rules! entry {
    ($f:expr) => {
        $f as *const c_void
    };
}

static CUDART_INTERFACE_TABLE: Padded = padded::<CUDART_ID>(&[
    size_word(13),
    entry!(module_from_fatbin_wrapper as unsafe extern "C" fn(_, _) -> _),
    entry!(primary_context as unsafe extern "C" fn(_, _) -> _),
    NULL,
    NULL,
    NULL,
    entry!(module_from_fatbin_wrapper_ext as unsafe extern "C" fn(_, _, _, _, _) -> _),
    entry!(runtime_notice as extern "C" fn(_)),
    entry!(module_from_fatbin_ext as unsafe extern "C" fn(_, _, _, _, _) -> _),
    NULL,
    NULL,
    NULL,
    entry!(load_compilers as extern "C" fn() -> _),
]);

/// Tools TLS: cuBLAS and cuBLASLt call entry 2 with one out-pointer for the calling thread's
/// current context ([`thread_context`]), before dot products, matrix-vector and matrix
/// products; refused, they failed (`CUBLAS_STATUS_INTERNAL_ERROR`, `CUBLAS_STATUS_NOT_SUPPORTED`).
/// The other entries answer "unavailable" (a NULL entry crashed cuBLASLt: `cupy.matmul` on the
/// simulated GPU).
static TOOLS_TLS_TABLE: Padded = padded::<TOOLS_TLS_ID>(&[
    size_word(4),
    entry!(tools_tls_unavailable as extern "C" fn() -> _),
    entry!(thread_context as unsafe extern "C" fn(_) -> _),
    entry!(tools_tls_unavailable as extern "C" fn() -> _),
]);

static CALLBACK_HOOKS_TABLE: Padded = padded::<HOOKS_ID>(&[
    size_word(7),
    NULL,
    entry!(hooks_buffer_1 as unsafe extern "C" fn(_, _)),
    NULL,
    NULL,
    NULL,
    entry!(hooks_buffer_2 as unsafe extern "C" fn(_, _)),
]);

static CONTEXT_LOCAL_STORAGE_TABLE: Padded = padded::<STORAGE_ID>(&[
    entry!(cls_put as unsafe extern "C" fn(_, _, _, _) -> _),
    entry!(cls_delete as extern "C" fn(_, _) -> _),
    entry!(cls_get as unsafe extern "C" fn(_, _, _) -> _),
    NULL,
]);

static CTX_CREATE_BYPASS_TABLE: Padded = padded::<BYPASS_ID>(&[
    size_word(2),
    entry!(crate::exports::cuCtxCreate_v2 as unsafe extern "C" fn(_, _, _) -> _),
]);

static HEAP_ACCESS_TABLE: Padded = padded::<HEAP_ID>(&[
    size_word(3),
    entry!(heap_alloc as extern "C" fn(_, _, _) -> _),
    entry!(heap_free as extern "C" fn(_, _) -> _),
]);

static DEVICE_EXTENDED_RT_TABLE: Padded = {
    let mut t = [NULL; 26];
    t[0] = size_word(26);
    t[5] = entry!(device_attribute_ext as extern "C" fn(_, _, _, _) -> _);
    t[13] = entry!(device_flag as unsafe extern "C" fn(_, _) -> _);
    padded::<DEVICE_EXT_ID>(&t)
};

static INTEGRITY_CHECK_TABLE: Padded = padded::<INTEGRITY_ID>(&[
    size_word(3),
    entry!(integrity_token as unsafe extern "C" fn(_, _, _) -> _),
    NULL,
]);

static CONTEXT_CHECKS_TABLE: Padded = padded::<CHECKS_ID>(&[
    size_word(4),
    NULL,
    entry!(context_check as unsafe extern "C" fn(_, _, _) -> _),
    entry!(context_check_flags as extern "C" fn() -> _),
]);

/// Which table an [`unknown_entry`] belongs to, for its warning.
const RUNTIME_13: u8 = 0;
/// See [`RUNTIME_13`].
const MODULE_TOOLS: u8 = 1;
/// See [`RUNTIME_13`].
const CUPTI_ID: u8 = 2;
/// See [`RUNTIME_13`].
const CUDART_ID: u8 = 3;
/// See [`RUNTIME_13`].
const TOOLS_TLS_ID: u8 = 4;
/// See [`RUNTIME_13`].
const HOOKS_ID: u8 = 5;
/// See [`RUNTIME_13`].
const STORAGE_ID: u8 = 6;
/// See [`RUNTIME_13`].
const BYPASS_ID: u8 = 7;
/// See [`RUNTIME_13`].
const HEAP_ID: u8 = 8;
/// See [`RUNTIME_13`].
const DEVICE_EXT_ID: u8 = 9;
/// See [`RUNTIME_13`].
const INTEGRITY_ID: u8 = 10;
/// See [`RUNTIME_13`].
const CHECKS_ID: u8 = 11;

/// Entry `I` of table `T` (one of the ids above): what it does is not known and no tested
/// runtime or library calls it (or it lies past the size the table declares); it is refused
/// with a warning naming itself, so a program that needs it says so.
extern "C" fn unknown_entry<const T: u8, const I: usize>() -> CUresult {
    let table = match T {
        RUNTIME_13 => "21318c60",
        MODULE_TOOLS => "6e163fbe",
        CUDART_ID => "6bd5fb6c",
        TOOLS_TLS_ID => "42d85a81",
        HOOKS_ID => "a094798c",
        STORAGE_ID => "c693336e",
        BYPASS_ID => "0ca50b8c",
        HEAP_ID => "195bcbf4",
        DEVICE_EXT_ID => "b10541e1",
        INTEGRITY_ID => "d4082055",
        CHECKS_ID => "263e8860",
        _ => "7cb63f9b (CUPTI: profiling is not available through vgpu)",
    };
    crate::warn!(
        "entry {I} of the driver's export table {table} was called; vgpu does not implement it"
    );
    cuda::CUDA_ERROR_NOT_SUPPORTED
}

macro_rules! unknown {
    ($t:expr, $i:literal) => {
        entry!(unknown_entry::<{ $t }, $i> as extern "C" fn() -> _)
    };
}

/// Entries [`RUNTIME_13_REQUIRED`] declares (the CUDA 13 runtime accepts it so). cuBLAS calls
/// entries 39 and 51 regardless: with nothing past the declared end they read the module-tools
/// table that followed in memory (its entries 20 and 32), which refused them.
const RUNTIME_13_ENTRIES: usize = 16;

/// Entry of [`RUNTIME_13_REQUIRED`]: [`context_number`].
const CONTEXT_NUMBER: usize = 4;
/// Entry of [`RUNTIME_13_REQUIRED`]: [`stream_number`].
const STREAM_NUMBER: usize = 39;
/// Entry of [`RUNTIME_13_REQUIRED`]: [`context_stream`].
const CONTEXT_STREAM: usize = 51;

static RUNTIME_13_TABLE: Padded = {
    let mut t = [NULL; PADDED_ENTRIES];
    fill_unknown::<RUNTIME_13>(&mut t);
    t[0] = size_word(RUNTIME_13_ENTRIES);
    t[CONTEXT_NUMBER] = entry!(context_number as unsafe extern "C" fn(_, _) -> _);
    t[STREAM_NUMBER] = entry!(stream_number as unsafe extern "C" fn(_, _, _) -> _);
    t[CONTEXT_STREAM] = entry!(context_stream as unsafe extern "C" fn(_, _, _, _) -> _);
    Table(t)
};

/// Entries of [`TOOLS_MODULE`] vgpu fills, with the size (the table NVIDIA's
/// driver hands out is at least this long: its known entries reach 55).
const MODULE_TOOLS_ENTRIES: usize = 64;

static MODULE_TOOLS_TABLE: Table<MODULE_TOOLS_ENTRIES> = {
    let mut t = [NULL; MODULE_TOOLS_ENTRIES];
    t[0] = Table::<MODULE_TOOLS_ENTRIES>::SIZE;
    fill_unknown::<MODULE_TOOLS>(&mut t);
    t[MODULE_FOR_EACH_FUNCTION] =
        entry!(module_for_each_function as unsafe extern "C" fn(_, _, _, _) -> _);
    Table(t)
};

/// Entries of [`CUPTI`] vgpu answers (its known entries reach 60).
const CUPTI_ENTRIES: usize = 64;

static CUPTI_TABLE: Table<CUPTI_ENTRIES> = {
    let mut t = [NULL; CUPTI_ENTRIES];
    t[0] = Table::<CUPTI_ENTRIES>::SIZE;
    fill_unknown::<CUPTI_ID>(&mut t);
    Table(t)
};

/// Fills every entry after the size with [`unknown_entry`] of table `T`.
const fn fill_unknown<const T: u8>(t: &mut [*const c_void; 64]) {
    macro_rules! fill {
        ($($i:literal)*) => { $( t[$i] = unknown!(T, $i); )* };
    }
    fill!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
          32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60
          61 62 63);
}

/// The table for `id`, if vgpu provides it.
pub fn lookup(id: &[u8; 16]) -> Option<(&'static str, *const c_void)> {
    Some(match *id {
        CUDART_INTERFACE => ("runtime interface", CUDART_INTERFACE_TABLE.start()),
        TOOLS_TLS => ("tools TLS", TOOLS_TLS_TABLE.start()),
        TOOLS_RUNTIME_CALLBACK_HOOKS => ("tools callback hooks", CALLBACK_HOOKS_TABLE.start()),
        CONTEXT_LOCAL_STORAGE => ("context-local storage", CONTEXT_LOCAL_STORAGE_TABLE.start()),
        CTX_CREATE_BYPASS => ("context creation", CTX_CREATE_BYPASS_TABLE.start()),
        HEAP_ACCESS => ("heap access", HEAP_ACCESS_TABLE.start()),
        DEVICE_EXTENDED_RT => ("device extensions", DEVICE_EXTENDED_RT_TABLE.start()),
        INTEGRITY_CHECK => ("integrity check", INTEGRITY_CHECK_TABLE.start()),
        CONTEXT_CHECKS => ("context checks", CONTEXT_CHECKS_TABLE.start()),
        RUNTIME_13_REQUIRED => ("CUDA 13 runtime table", RUNTIME_13_TABLE.start()),
        TOOLS_MODULE => ("module tools", MODULE_TOOLS_TABLE.start()),
        CUPTI => ("CUPTI", CUPTI_TABLE.start()),
        _ => return None,
    })
}

/// Formats a UUID the way CUDA tools print them.
pub fn uuid_text(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

// ---- runtime interface ------------------------------------------------------

/// Loads the module of a `__fatBinC_Wrapper_t` (what `__cudaRegisterFatBinary` got).
unsafe extern "C" fn module_from_fatbin_wrapper(
    module: *mut CUhandle,
    wrapper: *const c_void,
) -> CUresult {
    // SAFETY: same contract as cuModuleLoadData: `wrapper` is the runtime's registered image.
    unsafe { crate::exports::cuModuleLoadData(module, wrapper) }
}

/// The same with options vgpu does not support (they must be absent).
unsafe extern "C" fn module_from_fatbin_wrapper_ext(
    module: *mut CUhandle,
    wrapper: *const c_void,
    options: *mut c_void,
    values: *mut c_void,
    count: c_uint,
) -> CUresult {
    if !options.is_null() || !values.is_null() || count != 0 {
        return drv::unsupported("module registration with JIT options");
    }
    // SAFETY: as for `module_from_fatbin_wrapper`.
    unsafe { module_from_fatbin_wrapper(module, wrapper) }
}

/// Loads a fat binary given by its header, with options that must be absent.
unsafe extern "C" fn module_from_fatbin_ext(
    fatbin: *const c_void,
    module: *mut CUhandle,
    options: *mut c_void,
    values: *mut c_void,
    count: c_uint,
) -> CUresult {
    // SAFETY: as for `module_from_fatbin_wrapper`, arguments in this entry's order.
    unsafe { module_from_fatbin_wrapper_ext(module, fatbin, options, values, count) }
}

/// The device's primary context, retained or not (the runtime retains it itself).
unsafe extern "C" fn primary_context(pctx: *mut CUhandle, dev: CUdevice) -> CUresult {
    ffi("cudart.primary_context", || {
        out!(pctx, drv::primary_handle(dev)? as CUhandle)
    })
}

/// A notice the runtime sends (its argument's meaning is not known); ignored.
extern "C" fn runtime_notice(_arg: usize) {}

/// The runtime asks the driver to load its JIT compilers; the host compiles.
extern "C" fn load_compilers() -> CUresult {
    cuda::CUDA_SUCCESS
}

// ---- tools callback hooks -------------------------------------------------------

/// Words in the first hooks buffer.
const HOOKS_BUFFER_1_WORDS: usize = 1024;
/// Words in the second hooks buffer.
const HOOKS_BUFFER_2_WORDS: usize = 14;

/// Zeroed memory the runtime may write tool-callback state into.
struct HooksBuffer<const N: usize>(std::cell::UnsafeCell<[u64; N]>);

// SAFETY: only the runtime touches the buffer, through the raw pointer it is handed.
unsafe impl<const N: usize> Sync for HooksBuffer<N> {}

static HOOKS_BUFFER_1: HooksBuffer<HOOKS_BUFFER_1_WORDS> =
    HooksBuffer(std::cell::UnsafeCell::new([0; HOOKS_BUFFER_1_WORDS]));
static HOOKS_BUFFER_2: HooksBuffer<HOOKS_BUFFER_2_WORDS> =
    HooksBuffer(std::cell::UnsafeCell::new([0; HOOKS_BUFFER_2_WORDS]));

unsafe extern "C" fn hooks_buffer_1(ptr: *mut *mut c_void, size: *mut usize) {
    let _ = out!(ptr, HOOKS_BUFFER_1.0.get().cast::<c_void>());
    let _ = out!(size, HOOKS_BUFFER_1_WORDS);
}

unsafe extern "C" fn hooks_buffer_2(ptr: *mut *mut c_void, size: *mut usize) {
    let _ = out!(ptr, HOOKS_BUFFER_2.0.get().cast::<c_void>());
    let _ = out!(size, HOOKS_BUFFER_2_WORDS);
}

// ---- context-local storage ------------------------------------------------------------

/// The context an entry names: NULL is the calling thread's current one.
fn context_or_current(ctx: CUhandle) -> drv::CuRes<u64> {
    match ctx as u64 {
        0 => drv::current_ctx().ok_or(cuda::CUDA_ERROR_INVALID_CONTEXT),
        c => Ok(c),
    }
}

unsafe extern "C" fn cls_put(
    ctx: CUhandle,
    key: *mut c_void,
    value: *mut c_void,
    destructor: Option<ctx_storage::Destructor>,
) -> CUresult {
    ffi("cudart.context_storage_put", || {
        let c = context_or_current(ctx)?;
        if ctx_storage::put(c, key as usize, value as usize, destructor) {
            Ok(())
        } else {
            Err(cuda::CUDA_ERROR_OUT_OF_MEMORY)
        }
    })
}

extern "C" fn cls_delete(ctx: CUhandle, key: *mut c_void) -> CUresult {
    ffi("cudart.context_storage_delete", || {
        let c = context_or_current(ctx)?;
        ctx_storage::delete(c, key as usize);
        Ok(())
    })
}

unsafe extern "C" fn cls_get(value: *mut *mut c_void, ctx: CUhandle, key: *mut c_void) -> CUresult {
    // Not traced: the runtime reads its state on every call.
    let r = (|| {
        let c = context_or_current(ctx)?;
        let v = ctx_storage::get(c, key as usize).ok_or(cuda::CUDA_ERROR_INVALID_HANDLE)?;
        out!(value, v as *mut c_void)
    })();
    r.err().unwrap_or(cuda::CUDA_SUCCESS)
}

// ---- heap, device extensions, checks ---------------------------------------------------

/// Entries 1 and 3 of the tools TLS table: no tools state (no profiler is attached to a vgpu
/// process). Takes no arguments: whatever the caller passes (an out-pointer) is left alone.
extern "C" fn tools_tls_unavailable() -> CUresult {
    drv::unsupported("the tools TLS table")
}

/// Entry 2 of the tools TLS table: the calling thread's current context (NULL without one), as
/// `cuCtxGetCurrent` answers.
unsafe extern "C" fn thread_context(out: *mut CUhandle) -> CUresult {
    ffi("tools.thread_context", || {
        out!(out, crate::exports::p(drv::ctx_get_current()?))
    })
}

extern "C" fn heap_alloc(_record: *mut *const c_void, _a: usize, _b: usize) -> CUresult {
    drv::unsupported("the driver heap table")
}

extern "C" fn heap_free(_record: *const c_void, _a: *mut usize) -> CUresult {
    drv::unsupported("the driver heap table")
}

extern "C" fn device_attribute_ext(
    _dev: CUdevice,
    _attribute: c_uint,
    _unknown: c_int,
    _result: *mut [usize; 2],
) -> CUresult {
    drv::unsupported("extended device attributes")
}

/// A per-device flag the runtime reads; a driver without it reports 0.
unsafe extern "C" fn device_flag(result: *mut u8, dev: CUdevice) -> CUresult {
    ffi("cudart.device_flag", || {
        drv::device_get(dev)?;
        out!(result, 0u8)
    })
}

unsafe extern "C" fn context_check(
    _ctx: CUhandle,
    result: *mut u32,
    _detail: *mut *const c_void,
) -> CUresult {
    ffi("cudart.context_check", || out!(result, 0u32))
}

extern "C" fn context_check_flags() -> u32 {
    0
}

/// The integrity token of the runtime's request (see [`integrity`]).
unsafe extern "C" fn integrity_token(
    request: u32,
    unix_seconds: u64,
    result: *mut [u64; 2],
) -> CUresult {
    ffi("cudart.integrity_check", || {
        let devices = (0..drv::device_count()?)
            .map(|dev| {
                let attr = |a: usize| drv::device_attribute(a as i32, dev);
                Ok(integrity::DeviceId {
                    uuid: drv::device_uuid(dev)?,
                    pci: [
                        attr(cuda::attr::PCI_DOMAIN_ID)?,
                        attr(cuda::attr::PCI_BUS_ID)?,
                        attr(cuda::attr::PCI_DEVICE_ID)?,
                    ],
                })
            })
            .collect::<Result<Vec<_>, CuResult>>()?;
        let caller = integrity::Caller {
            driver_version: drv::driver_version() as u32,
            request,
            pid: std::process::id(),
            thread: drv::thread_id_low(),
            cudart_table: CUDART_INTERFACE_TABLE.start() as u64,
            check_table: INTEGRITY_CHECK_TABLE.start() as u64,
            check_fn: INTEGRITY_CHECK_TABLE.0[1] as u64,
            unix_seconds,
        };
        out!(result, integrity::token(&caller, &devices))
    })
}

// ---- module tools and the CUDA 13 table ---------------------------------------------

/// The entry of [`TOOLS_MODULE`] that walks a module's kernels.
const MODULE_FOR_EACH_FUNCTION: usize = 7;

/// What [`module_for_each_function`] calls for each kernel: the caller's
/// value, the kernel's function handle and its module.
type FunctionVisitor =
    unsafe extern "C" fn(user: *mut c_void, function: CUhandle, module: CUhandle);

/// Calls `visit` for each kernel of `module` (in `ctx`, or the current
/// context when NULL) and returns how many it visited; 0 when the module or
/// context is not valid. cuFFT 11.4 calls it after loading each of its
/// modules and keeps the handles it is given, then launches them: it treats
/// a return of 0 as a failure (every cuFFT module holds at least one kernel).
unsafe extern "C" fn module_for_each_function(
    ctx: CUhandle,
    module: CUhandle,
    visit: Option<FunctionVisitor>,
    user: *mut c_void,
) -> c_uint {
    let Some(visit) = visit else {
        return 0;
    };
    let functions = drv::in_context(ctx as u64, || {
        crate::library::module_functions(module as u64, usize::MAX)
    });
    crate::debug!(
        "cudart.module_for_each_function({module:?}) -> {:?}",
        functions.as_ref().map(Vec::len)
    );
    let Ok(functions) = functions else {
        return 0;
    };
    for &f in &functions {
        // SAFETY: `visit` is the caller's function of this signature; the
        // handles are valid while the module is loaded.
        unsafe { visit(user, f as CUhandle, module) };
    }
    c_uint::try_from(functions.len()).unwrap_or(c_uint::MAX)
}

/// Entry 4 of [`RUNTIME_13_REQUIRED`]: the number of a context (`ctx`, or the calling thread's
/// current one for NULL), as `cuCtxGetId` answers (the context's handle, unique among the
/// process's live contexts). cuBLAS asks it for every matrix product, and its heuristics find no
/// kernel when it is refused (`CUBLAS_STATUS_NOT_SUPPORTED`); cuFFT 11.4 asks after loading a
/// module.
unsafe extern "C" fn context_number(ctx: CUhandle, number: *mut u64) -> CUresult {
    ffi("cudart13.context_number", || {
        let c = if ctx.is_null() {
            drv::ctx()?
        } else {
            ctx as u64
        };
        out!(number, c)
    })
}

/// Entry 51 of [`RUNTIME_13_REQUIRED`]: the stream that handle `stream` names in context `ctx`
/// (NULL: the calling thread's current one), for entry 39. cuBLAS's reductions (`cublasSdot`,
/// `cublasSnrm2`, `cublasSasum`, `cublasIsamax`, … in either pointer mode) pass the stream they
/// were given (0 for the legacy default stream, `CU_STREAM_PER_THREAD` with `per_thread` set) and
/// keep a pool of result buffers per stream, keyed by what entry 39 answers; refused, every one
/// of them failed with `CUBLAS_STATUS_INTERNAL_ERROR`. vgpu's streams are their handles: the
/// handle comes back, once checked (a handle of no stream is `CUDA_ERROR_INVALID_HANDLE`).
unsafe extern "C" fn context_stream(
    _ctx: CUhandle,
    stream: CUhandle,
    out: *mut CUhandle,
    per_thread: c_int,
) -> CUresult {
    ffi("cudart13.context_stream", || {
        let s = if per_thread != 0 {
            drv::STREAM_PER_THREAD
        } else {
            stream as u64
        };
        drv::stream_params(s)?;
        out!(out, s as CUhandle)
    })
}

/// Entry 39 of [`RUNTIME_13_REQUIRED`]: the number of a stream that entry 51 answered, as
/// `cuStreamGetId` answers (unique among the process's live streams); see [`context_stream`].
unsafe extern "C" fn stream_number(_ctx: CUhandle, stream: CUhandle, number: *mut u64) -> CUresult {
    ffi("cudart13.stream_number", || {
        out!(number, drv::stream_id(stream as u64)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every table vgpu provides whose first entry is its size (all but context-local storage).
    const SIZED: [[u8; 16]; 11] = [
        CUDART_INTERFACE,
        TOOLS_TLS,
        TOOLS_RUNTIME_CALLBACK_HOOKS,
        CTX_CREATE_BYPASS,
        HEAP_ACCESS,
        DEVICE_EXTENDED_RT,
        INTEGRITY_CHECK,
        CONTEXT_CHECKS,
        RUNTIME_13_REQUIRED,
        TOOLS_MODULE,
        CUPTI,
    ];

    #[test]
    fn sized_tables_start_with_their_size_in_bytes() {
        for id in SIZED {
            let (name, t) = lookup(&id).expect("known table");
            // SAFETY: `t` is the start of one of the static tables above.
            let size = unsafe { *t.cast::<usize>() };
            assert!(
                size >= 2 * size_of::<usize>() && size % 8 == 0,
                "{name}: {size}"
            );
        }
        assert_eq!(CUDART_INTERFACE_TABLE.0[0] as usize, 13 * 8);
        assert_eq!(DEVICE_EXTENDED_RT_TABLE.0[0] as usize, 26 * 8);
    }

    #[test]
    fn every_table_refuses_past_its_declared_end() {
        for id in SIZED.into_iter().chain([CONTEXT_LOCAL_STORAGE]) {
            let (name, t) = lookup(&id).expect("known table");
            let entries = t.cast::<*const c_void>();
            // Context-local storage has no size word: its three functions and a NULL.
            let declared = if id == CONTEXT_LOCAL_STORAGE {
                4
            } else {
                // SAFETY: `t` is the start of one of the static tables above.
                let bytes = unsafe { *t.cast::<usize>() };
                bytes / size_of::<usize>()
            };
            for i in declared..PADDED_ENTRIES {
                if id == RUNTIME_13_REQUIRED && (i == STREAM_NUMBER || i == CONTEXT_STREAM) {
                    continue;
                }
                let e = entries.wrapping_add(i);
                // SAFETY: every table is `PADDED_ENTRIES` long in memory, so `e` is in one.
                let e = unsafe { *e };
                assert!(!e.is_null(), "{name}: entry {i}");
                // SAFETY: past the declared end every other entry is an `unknown_entry`, which
                // takes nothing.
                let f: extern "C" fn() -> CUresult = unsafe { std::mem::transmute(e) };
                assert_eq!(f(), cuda::CUDA_ERROR_NOT_SUPPORTED, "{name}: entry {i}");
            }
        }
    }

    #[test]
    fn every_cupti_entry_refuses() {
        for (i, e) in CUPTI_TABLE.0.iter().enumerate().skip(1) {
            assert!(!e.is_null(), "entry {i}");
            // SAFETY: every entry after the size is an `unknown_entry`, which takes nothing.
            let f: extern "C" fn() -> CUresult = unsafe { std::mem::transmute(*e) };
            assert_eq!(f(), cuda::CUDA_ERROR_NOT_SUPPORTED, "entry {i}");
        }
    }

    #[test]
    fn unknown_tables_are_not_found() {
        assert!(lookup(&[0; 16]).is_none());
        assert_eq!(uuid_text(&TOOLS_TLS), "42d85a8123f6cb478298f6e78a3aecdc");
    }

    #[test]
    fn storage_of_a_named_context_works_without_a_driver() {
        let ctx = 0x7fff_0000_1000usize as CUhandle;
        let key = 0x55usize as *mut c_void;
        // SAFETY: plain values; no destructor.
        assert_eq!(unsafe { cls_put(ctx, key, 0x1234 as *mut c_void, None) }, 0);
        let mut v = std::ptr::null_mut();
        // SAFETY: `v` is a valid out-pointer.
        assert_eq!(unsafe { cls_get(&mut v, ctx, key) }, 0);
        assert_eq!(v as usize, 0x1234);
        assert_eq!(cls_delete(ctx, key), 0);
        // SAFETY: as above.
        let gone = unsafe { cls_get(&mut v, ctx, key) };
        assert_eq!(gone, cuda::CUDA_ERROR_INVALID_HANDLE);
    }
}
